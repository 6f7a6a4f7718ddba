//! The atomics of the crate's one lock-free structure, the permit bitmap ([`crate::permit`]).
//!
//! Under `RUSTFLAGS="--cfg loom"` they come from [loom](https://docs.rs/loom), which explores
//! thread interleavings and weak-memory reorderings (`tests/loom_permits.rs`); otherwise they
//! are `core`'s (the `primitive` shim pattern of crossbeam-utils, as in `mempool::sync`).

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use core::hint::spin_loop;
#[cfg(loom)]
pub(crate) use loom::hint::spin_loop;

#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;
