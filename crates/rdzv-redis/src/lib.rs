//! rdzv-redis
