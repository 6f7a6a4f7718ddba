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
//! | `dp-perf write-lat`, `write-bw`, `send-lat`, `send-bw`, `read-lat`, `read-bw` | [`fabric`] | perftest (`ib_write_lat`, ...) |
//! | `dp-perf rstream` | [`rstream`] | librdmacm's `rstream`, kernel TCP |
//! | `dp-perf blk` | [`blk`] | fio (`--rw`, `--bs`, `--iodepth`, ...; fio's summary and JSON) |
//! | `dp-perf rtrs` | [`rtrs`] | fio over RNBD (RTRS block IO, multipath failover) |
//! | `dp-perf rds-stress`, `rds-ping` | [`rds`] | rds-tools' `rds-stress`, `rds-ping` |
//! | `dp-perf rds-check` | [`rds::check`] | every message once, in order, byte-exact (the kernel lab's checks) |
//! | `dp-perf plot` | [`figures`] | draws `--plot FILE.json` data of several runs in one chart |
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
//! command, keyed by the command name; the fabric tests print one object per size and line)
//! and `write_table` for humans; `figure` for `--plot FILE` (`.svg`, `.png`, or `.json` data),
//! drawn by the `dp-plot` crate: latency tests draw an HdrHistogram-style percentile plot,
//! size sweeps draw bandwidth and latency against size. The CLI is in [`cli`].

pub mod blk;
pub mod cli;
mod common;
mod error;
pub mod fabric;
pub mod figures;
pub mod harness;
pub mod lcore_perf;
pub mod limit;
pub mod pool_perf;
pub mod rds;
mod report;
pub mod ring_perf;
pub mod rstream;
pub mod rtrs;

pub use error::PerfError;
pub use report::Report;
