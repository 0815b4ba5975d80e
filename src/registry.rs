//! The process-wide registry with the built-in backends registered.

use std::sync::{Arc, OnceLock};

use rdzv_core::Registry;

/// The registry used by [`connect`](crate::connect): `mem` always; `etcd`/`etcds` and
/// `redis`/`rediss` when their cargo features (`etcd`, `redis`, both on by default) are
/// enabled — otherwise those schemes fail with an error naming the feature. Register your
/// own backend here with [`Registry::register`].
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let registry = Registry::new();
        let builtin = |r: Result<(), rdzv_core::ConfigError>| {
            // Registering distinct built-in schemes into a fresh registry cannot conflict.
            debug_assert!(r.is_ok(), "{r:?}");
        };
        builtin(registry.register("mem", Arc::new(rdzv_mem::MemFactory)));
        #[cfg(feature = "etcd")]
        {
            let etcd = Arc::new(rdzv_etcd::EtcdFactory);
            builtin(registry.register("etcd", etcd.clone()));
            builtin(registry.register("etcds", etcd));
        }
        #[cfg(not(feature = "etcd"))]
        for scheme in ["etcd", "etcds"] {
            builtin(registry.register_disabled(scheme, "etcd"));
        }
        #[cfg(feature = "redis")]
        {
            let redis = Arc::new(rdzv_redis::RedisFactory);
            builtin(registry.register("redis", redis.clone()));
            builtin(registry.register("rediss", redis));
        }
        #[cfg(not(feature = "redis"))]
        for scheme in ["redis", "rediss"] {
            builtin(registry.register_disabled(scheme, "redis"));
        }
        registry
    })
}
