//! rdzv-mem
