//! rdzv-store
