//! Reading the replies of our script: a tagged array (`'ok'`, `'conflict'`, …) whose
//! payload is integers, byte strings and flat key records. Nothing here trusts the server:
//! a reply of the wrong shape is an error, never a panic.

use rdzv_core::kv::KeyValue;
use rdzv_core::{KvError, KvResult};
use redis::Value;

use crate::error::{bad_reply, corrupt, lost, rolled_back};
use crate::shared::HighWater;

/// What a script call returned, once the errors every operation can produce are handled.
pub(crate) struct Reply {
    /// `ok`, `conflict`, `missing`, `lease_not_found`, `future`.
    pub tag: String,
    /// The rest of the reply, front first.
    pub items: std::collections::VecDeque<Value>,
    operation: &'static str,
}

/// What the client needs to name errors: the endpoint and namespace.
pub(crate) struct Context<'a> {
    pub endpoint: &'a str,
    pub namespace: &'a str,
    /// Where a rollback is recorded.
    pub high: &'a HighWater,
}

impl Reply {
    /// Splits a raw reply; `corrupt`, `epoch` and `rollback` replies become errors (a
    /// rollback is also recorded in `ctx.high`, so every later call repeats it).
    pub fn parse(value: Value, operation: &'static str, ctx: &Context<'_>) -> KvResult<Reply> {
        let Value::Array(items) = value else {
            return Err(bad_reply(operation, format!("{value:?}")));
        };
        let mut items: std::collections::VecDeque<Value> = items.into();
        let tag = match items.pop_front() {
            Some(v) => text(&v).ok_or_else(|| bad_reply(operation, "no status"))?,
            None => return Err(bad_reply(operation, "empty reply")),
        };
        let mut reply = Reply { tag, items, operation };
        match reply.tag.as_str() {
            "corrupt" => {
                let key = reply.bytes()?;
                let message = reply.bytes()?;
                Err(corrupt(&key, &String::from_utf8_lossy(&message)))
            }
            "epoch" => {
                let found = reply.bytes()?;
                Err(lost(ctx.endpoint, ctx.namespace, &found))
            }
            "rollback" => {
                let (now, seen, lease, seen_lease) = (reply.int()?, reply.int()?, reply.int()?, reply.int()?);
                let evidence = if now < seen {
                    format!("its revision is {now}, but this client already saw revision {seen}")
                } else {
                    format!("its last lease id is {lease}, but this client already saw lease {seen_lease}")
                };
                Err(ctx.high.fail(rolled_back(ctx.endpoint, ctx.namespace, &evidence)))
            }
            _ => Ok(reply),
        }
    }

    /// Whether there is nothing more.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The next item as an integer.
    pub fn int(&mut self) -> KvResult<i64> {
        match self.items.pop_front() {
            Some(Value::Int(i)) => Ok(i),
            Some(Value::BulkString(b)) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad_reply(self.operation, "expected an integer")),
            other => Err(bad_reply(self.operation, format!("expected an integer, got {other:?}"))),
        }
    }

    /// The next item as bytes (a missing value reads as empty).
    pub fn bytes(&mut self) -> KvResult<Vec<u8>> {
        match self.items.pop_front() {
            Some(Value::BulkString(b)) => Ok(b),
            Some(Value::SimpleString(s)) => Ok(s.into_bytes()),
            Some(Value::Nil) => Ok(Vec::new()),
            other => Err(bad_reply(self.operation, format!("expected bytes, got {other:?}"))),
        }
    }

    /// The next item as a nested array, as its own `Reply`.
    pub fn nested(&mut self) -> KvResult<Reply> {
        match self.items.pop_front() {
            Some(Value::Array(items)) => {
                Ok(Reply { tag: String::new(), items: items.into(), operation: self.operation })
            }
            other => Err(bad_reply(self.operation, format!("expected an array, got {other:?}"))),
        }
    }

    /// The next six items as a key record.
    pub fn key_value(&mut self) -> KvResult<KeyValue> {
        let key = self.bytes()?;
        let value = self.bytes()?;
        let create_revision = self.int()?;
        let mod_revision = self.int()?;
        let version = self.int()?;
        let lease = self.int()?;
        Ok(KeyValue {
            key,
            value: value.into(),
            create_revision,
            mod_revision,
            version,
            lease: (lease != 0).then_some(lease),
        })
    }

    /// The next item, if any, as a nested key record (a conflict's current key).
    pub fn optional_key_value(&mut self) -> KvResult<Option<KeyValue>> {
        if self.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.nested()?.key_value()?))
    }

    /// An error for a tag this operation does not expect.
    pub fn unexpected(&self) -> KvError {
        bad_reply(self.operation, format!("status `{}`", self.tag))
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}
