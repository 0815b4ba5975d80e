//! The one rule for identifiers that become part of backend keys: run ids and node ids.
//!
//! A run id names the run's key space (`<prefix>/run_<run_id>/…`) and a node id names a
//! worker's join and waiting keys (`…/join/<node_id>`), so an id holding a `/` could reach
//! into another run's or another worker's keys, and control characters would end up in
//! logs and terminals. Every entry point (the URL's path, [`RendezvousParams`], the command
//! line's `--run-id`/`--node-id`) checks ids with [`validate_id`].
//!
//! **The rule:** 1 to [`MAX_ID_LEN`] characters, each an ASCII letter or digit or one of
//! `-` `_` `.` `:` `@` `+`. That admits Slurm job ids (`12345678`,
//! array tasks `12345_7`, heterogeneous components `12345+0`), Kubernetes names
//! (`trainer-0.trainer.default`, up to 253 characters), UUIDs, `user@host:port`-like names
//! and the default node id `<host>-<pid>-<hex>`; it forbids `/`, spaces, control
//! characters, `%` and every non-ASCII character.
//!
//! [`RendezvousParams`]: crate::RendezvousParams

use crate::error::ConfigError;

/// The longest run id or node id, in characters (a Kubernetes object name's limit, and a
/// DNS name's).
pub const MAX_ID_LEN: usize = 253;

/// The characters besides ASCII letters and digits that an id may contain.
const ID_PUNCTUATION: &str = "-_.:@+";

/// The rule, in words, for error messages and help texts.
pub const ID_RULE: &str = "1 to 253 characters, each an ASCII letter, a digit, or one of - _ . : @ +";

/// 64 random bits for the random part of an id (the default node id's suffix, a member
/// list's pieces): the keys of a fresh `RandomState` are random per instance, and the time
/// is mixed in.
pub(crate) fn random_bits() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    hasher.finish()
}

/// Whether `c` may appear in a run id or node id.
pub fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || ID_PUNCTUATION.contains(c)
}

/// Checks a run id or node id against the rule of this module. `field` names the id in the
/// error (`run_id`, `node_id`, or a command-line flag such as `--run-id`); the error is a
/// [`ConfigError::InvalidValue`] that says which character (or length) breaks which rule.
///
/// ```
/// use rdzv_core::ids::validate_id;
/// assert!(validate_id("run_id", "12345678").is_ok());
/// assert!(validate_id("node_id", "trainer-0.trainer.default").is_ok());
/// assert!(validate_id("run_id", "a/rdzv/v_1/join/x").is_err());
/// assert!(validate_id("node_id", "").is_err());
/// ```
pub fn validate_id(field: &str, value: &str) -> Result<(), ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidValue {
        option: field.to_string(),
        value: printable(value),
        reason,
    };
    if value.is_empty() {
        return Err(invalid(format!("it must not be empty; it must be {ID_RULE}")));
    }
    if let Some((at, c)) = value.chars().enumerate().find(|(_, c)| !is_id_char(*c)) {
        let what = match c {
            '/' => "`/` (it would reach into other keys)".to_string(),
            c if c.is_whitespace() => format!("whitespace ({})", c.escape_unicode()),
            c if c.is_control() => format!("a control character ({})", c.escape_unicode()),
            c if !c.is_ascii() => format!("the non-ASCII character `{c}` ({})", c.escape_unicode()),
            c => format!("`{c}`"),
        };
        return Err(invalid(format!(
            "character {} is {what}, which is not allowed; it must be {ID_RULE}",
            at + 1
        )));
    }
    let len = value.chars().count();
    if len > MAX_ID_LEN {
        return Err(invalid(format!("it is {len} characters long; it must be {ID_RULE}")));
    }
    Ok(())
}

/// `value` with control characters escaped and cut to a readable length, so that an error
/// message about a bad id cannot itself garble a terminal or a log.
fn printable(value: &str) -> String {
    const SHOWN: usize = 80;
    let mut out: String = value.chars().take(SHOWN).flat_map(char::escape_debug).collect();
    if value.chars().count() > SHOWN {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(field: &str, value: &str) -> String {
        match validate_id(field, value) {
            Err(ConfigError::InvalidValue { option, reason, .. }) => {
                assert_eq!(option, field);
                reason
            }
            other => panic!("{value:?} should be rejected, got {other:?}"),
        }
    }

    #[test]
    fn common_ids_are_accepted() {
        for id in [
            "12345678",
            "0",
            "12345_7",
            "12345+0",
            "job-42",
            "trainer-0.trainer.default.svc",
            "host-1234-a1b2c3",
            "user@host:29500",
            "550e8400-e29b-41d4-a716-446655440000",
            &"x".repeat(MAX_ID_LEN),
        ] {
            assert_eq!(validate_id("run_id", id), Ok(()), "{id}");
        }
    }

    #[test]
    fn each_broken_rule_is_named() {
        assert!(reason("node_id", "").contains("must not be empty"));
        let r = reason("run_id", "a/rdzv/v_1/join/x");
        assert!(r.contains("character 2") && r.contains('/'), "{r}");
        assert!(reason("run_id", "a b").contains("whitespace"));
        assert!(reason("run_id", "a\u{1b}[31m").contains("control character"));
        assert!(reason("node_id", "héllo").contains("non-ASCII"));
        assert!(reason("node_id", "a%2F").contains("`%`"));
        assert!(reason("run_id", &"x".repeat(MAX_ID_LEN + 1)).contains("254 characters long"));
        for r in [reason("run_id", "a b"), reason("run_id", "")] {
            assert!(r.contains(ID_RULE), "{r}");
        }
    }

    #[test]
    fn errors_show_the_value_escaped_and_short() {
        let Err(ConfigError::InvalidValue { value, .. }) = validate_id("node_id", "a\nb\u{1b}") else {
            panic!("rejected")
        };
        assert_eq!(value, "a\\nb\\u{1b}");
        let Err(ConfigError::InvalidValue { value, .. }) = validate_id("node_id", &"y".repeat(1000)) else {
            panic!("rejected")
        };
        assert!(value.chars().count() <= 81, "{value}");
    }
}
