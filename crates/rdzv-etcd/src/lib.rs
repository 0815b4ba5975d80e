//! rdzv-etcd
