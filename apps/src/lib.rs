//! `apps`: the `dpctl` runner.
//!
//! `dpctl check` prints the preflight report a user needs before running a dataplane on a
//! machine: CPUs, hugepages, the memlock limit, the shm rendezvous directory, and what to
//! fix. Pipelines (`dpctl run`) and live telemetry (`dpctl stats`) build on the same crate.

pub mod check;
