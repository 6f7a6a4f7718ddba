//! Memory for polled-mode dataplanes: hugepage-backed regions and lock-free rings.
//!
//! This crate is the bottom of the `dataplane` workspace, the counterpart of DPDK's EAL memory,
//! `rte_ring` and `rte_mempool`:
//!
//! - [`memory`]: page-aligned, resident regions (hugepages when available) that pools, rings and
//!   RDMA-registered buffers live in, shareable with a peer process.
//! - [`ring`]: fixed-capacity lock-free FIFO rings with DPDK semantics (each side single, multi,
//!   RTS or HTS; bulk and burst), usable on the heap or in memory shared between processes.
//!
//! Invariants that hold crate-wide: structures placed in shared memory are `#[repr(C)]` with
//! compile-time layout assertions and contain no pointers; all atomics used by lock-free code
//! come from the loom-switchable `sync` shim; every `unsafe` block states its invariant.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod memory;
pub mod pool;
pub mod ring;
mod sync;
