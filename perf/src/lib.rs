//! The dataplane perf lab: system-level measurements behind the `dp-perf` binary.
//!
//! Where `benches/` holds criterion micro-benchmarks, this crate measures the way DPDK's perf
//! autotests do, on the same grids, so that its numbers can be put next to DPDK's from the same
//! host (`scripts/bench-vs-dpdk.sh` does exactly that):
//!
//! | command | module | compares with |
//! |---------|--------|---------------|
//! | `dp-perf ring` | [`ring_perf`] | `ring_perf_autotest` |
//! | `dp-perf mempool` | [`pool_perf`] | `mempool_perf_autotest` |
//! | `dp-perf lcore` | [`lcore_perf`] | SPDK/DPDK poller and message costs |
//! | `dp-perf limit` | [`limit`] | the host: cache-line hand-off, memcpy |
//!
//! # Rules every measurement follows
//!
//! - Threads are pinned to the two CPUs given with `--cpus` (default `0,1`) before anything
//!   is timed; two-thread runs start together from a [`SpinBarrier`](harness::SpinBarrier).
//! - Time comes from [`Timer`](harness::Timer): the invariant TSC calibrated by
//!   [`lcore::time`], read without syscalls; cycle figures are TSC cycles, as DPDK prints.
//! - Waits spin with a bounded budget and then yield ([`Backoff`](harness::Backoff)), so an
//!   oversubscribed host is slow but never livelocks.
//! - Repetitions are cheap, so cases are repeated and the **median** is reported.
//! - Every Gb/s counts payload bytes only, times 8, over 10^9.
//!
//! Results are plain structs implementing [`Report`]: `to_json` for `--json` (one object per
//! command, keyed by the command name) and `write_table` for humans. The CLI is in [`cli`].

pub mod cli;
mod error;
pub mod harness;
pub mod lcore_perf;
pub mod limit;
pub mod pool_perf;
mod report;
pub mod ring_perf;

pub use error::PerfError;
pub use report::Report;
