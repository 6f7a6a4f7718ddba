//! The built-in stages and the [`Stage`] trait they implement.
//!
//! A stage is a poller: the lcore hosting it calls [`Stage::poll`] every loop iteration
//! (several stages can share an lcore; they run in file order). `poll` does one bounded round
//! of work and returns how much it did (0 means idle, which lets a hybrid-mode lcore sleep).
//! It never blocks, with one documented exception: closing an rsocket stream waits for its
//! last sends to complete.
//!
//! # Stopping
//!
//! Stopping is two-phase and travels with the data:
//!
//! 1. [`StageIo::quiesce`] turns true (Ctrl-C, `--duration`, or a failed stage). Sources stop
//!    producing and close their outputs. Other stages ignore it.
//! 2. Each stage drains its input until end of stream (every producer closed and the ring
//!    empty, see [`crate::link`]), then closes its outputs and reports
//!    [`Stage::is_finished`]. rsocket clients flush and close their connection; servers see
//!    the peer's end of stream. When every stage of an lcore has finished, its loop returns.
//!
//! A stage that cannot drain (a peer that never closes) is cut off by the drain timeout of
//! `[eal]`, after which the lcores are stopped regardless.
//!
//! # Files
//!
//! `build.rs` builds the stages of a config ([`build`]) from the stage files; each stage file
//! is written against `env.rs` ([`Stage`], [`StageIo`], [`StartGate`], [`FabricDev`]), which
//! uses none of its siblings, and the stages the operator commands inspect answer through
//! `info.rs` ([`InfoSlot`]).

mod build;
mod env;
mod forward;
mod generator;
mod info;
mod rds;
mod rnbd;
mod rsocket;
mod sink;

pub use build::{Built, Resources, build};
pub use env::{FabricDev, Stage, StageIo, StartGate, stamp_now};
pub use forward::{Fanout, Forwarder};
pub use generator::Generator;
pub use info::{InfoKind, InfoSlot};
pub use rds::{END_OF_STREAM, RdsReceiver, RdsSender};
pub use rnbd::RnbdStage;
pub use rsocket::{RsClient, RsServer};
pub use sink::Sink;
