//! [`Op`]: the calls of the [`Kv`](crate::Kv) contract by kind, named once — what a layer's
//! hook is told ([`Decorator::around`](crate::layer::Decorator::around)), what
//! [`FaultyKv`](crate::layer::FaultyKv) faults, what [`CountingKv`](crate::layer::CountingKv)
//! counts and [`MeteredKv`](crate::layer::MeteredKv) labels.

/// A call of the [`Kv`](crate::Kv) contract, by kind: one per method that reaches a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// [`Kv::get`](crate::Kv::get).
    Get,
    /// [`Kv::range`](crate::Kv::range).
    Range,
    /// [`Kv::put`](crate::Kv::put).
    Put,
    /// [`Kv::delete`](crate::Kv::delete).
    Delete,
    /// [`Kv::delete_prefix`](crate::Kv::delete_prefix).
    DeletePrefix,
    /// [`Kv::delete_prefix_limited`](crate::Kv::delete_prefix_limited).
    DeletePrefixLimited,
    /// [`Kv::lease_grant`](crate::Kv::lease_grant).
    LeaseGrant,
    /// [`Kv::lease_keep_alive`](crate::Kv::lease_keep_alive).
    LeaseKeepAlive,
    /// [`Kv::lease_keep_alive_many`](crate::Kv::lease_keep_alive_many): one call for a batch.
    LeaseKeepAliveMany,
    /// [`Kv::lease_revoke`](crate::Kv::lease_revoke).
    LeaseRevoke,
    /// [`Kv::watch`](crate::Kv::watch): until the watch is open.
    Watch,
    /// [`Kv::compact`](crate::Kv::compact).
    Compact,
    /// [`Kv::count_at_revision`](crate::Kv::count_at_revision).
    CountAtRevision,
    /// [`Kv::create_counted`](crate::Kv::create_counted).
    CreateCounted,
    /// [`Kv::increment`](crate::Kv::increment).
    Increment,
}

impl Op {
    /// Every kind, in declaration order.
    pub const ALL: [Op; 15] = [
        Op::Get,
        Op::Range,
        Op::Put,
        Op::Delete,
        Op::DeletePrefix,
        Op::DeletePrefixLimited,
        Op::LeaseGrant,
        Op::LeaseKeepAlive,
        Op::LeaseKeepAliveMany,
        Op::LeaseRevoke,
        Op::Watch,
        Op::Compact,
        Op::CountAtRevision,
        Op::CreateCounted,
        Op::Increment,
    ];

    /// The method's name (`"get"`, `"lease_keep_alive_many"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Range => "range",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::DeletePrefix => "delete_prefix",
            Op::DeletePrefixLimited => "delete_prefix_limited",
            Op::LeaseGrant => "lease_grant",
            Op::LeaseKeepAlive => "lease_keep_alive",
            Op::LeaseKeepAliveMany => "lease_keep_alive_many",
            Op::LeaseRevoke => "lease_revoke",
            Op::Watch => "watch",
            Op::Compact => "compact",
            Op::CountAtRevision => "count_at_revision",
            Op::CreateCounted => "create_counted",
            Op::Increment => "increment",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_under_its_own_name() {
        let names: std::collections::BTreeSet<_> = Op::ALL.iter().map(|op| op.name()).collect();
        assert_eq!(names.len(), Op::ALL.len());
        assert!(Op::ALL.windows(2).all(|w| w[0] < w[1]), "ALL is in declaration order");
    }
}
