//! `apps`: `dpctl`, the way to run the framework without writing a `main`.
//!
//! DPDK has pipeline scripts (`dpdk-pipeline -s x.cli`) and SPDK has JSON configs
//! (`spdk_tgt -c f.json`); `dpctl` has TOML pipeline files: the lcores, the memory, the fabric
//! provider, and stages placed on lcores and connected by rings or fabric connections.
//!
//! | command | what it does |
//! |---|---|
//! | `dpctl run FILE` | runs a pipeline ([`run::run`]): a progress line a second, a clean stop on Ctrl-C or `--duration`, a summary (`--json`) |
//! | `dpctl run` | the market-data demo ([`demo`]): a feed fanned out over rsockets to consumers in a second process, with end-to-end latency |
//! | `dpctl check` | the preflight report ([`check`]): cores, hugepages, memlock, RDMA devices, rendezvous directory, and what to fix |
//! | `dpctl stats` | the per-lcore and per-stage counters of a running pipeline, over its telemetry socket ([`telemetry`]) |
//! | `dpctl rds-info` | the RDS nodes of a running pipeline with the sections of Linux `rds-info` ([`rdsinfo`]) |
//! | `dpctl rnbd-info` | the RNBD servers of a running pipeline: exports, sessions, paths, open devices and their IO counts, as RNBD's server sysfs ([`blkinfo`]) |
//! | `dpctl rtrs-info` | their RTRS server sessions and paths with the kernel's sysfs counters (`stats/rdma`) ([`blkinfo`]) |
//!
//! # Layers
//!
//! * [`config`]: the file format, deserialized into typed structs that reject unknown keys
//!   and name the file, line and key of every error;
//! * [`msg`], [`payload`], [`link`]: the message descriptor and its wire frame, payload
//!   patterns and pools, rings with end of stream;
//! * [`stage`]: the built-in stages (generator, forwarder, fanout, sink, rsocket server and
//!   client, RDS sender and receiver, RNBD server), each an lcore poller; what fails while they are built is a
//!   [`RunError`](run::RunError), defined below both the stages and the runner;
//! * [`run`]: building a pipeline, running its lcores, the control thread and the two-phase
//!   stop; [`monitor`] and [`summary`]: what it reports; [`telemetry`]: the control socket;
//! * [`demo`]: the two-process demo.
//!
//! # Invariants
//!
//! * Stages never block their lcore, except when closing an rsocket stream (bounded).
//! * A message descriptor with a pool payload owns its object; stages move descriptors and
//!   copy payloads when they duplicate a message ([`msg`]).
//! * A ring has one consumer; its end of stream is "every producer closed and the ring empty"
//!   ([`link`]). Stops travel with the data, so a stop loses nothing unless the drain times
//!   out, and the summary says when it did.
//! * Counters have one writer each and are read without stopping anyone ([`stats`]).

pub mod blkinfo;
pub mod check;
pub mod config;
pub mod demo;
mod error;
pub mod link;
pub mod monitor;
pub mod msg;
pub mod payload;
pub mod rdsinfo;
pub mod run;
pub mod stage;
pub mod stats;
pub mod summary;
pub mod telemetry;
