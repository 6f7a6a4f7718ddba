//! `dataplane`: fabric providers and the rsocket, RDS and RTRS protocols, as one dependency.
//!
//! This crate only re-exports the family of crates under `dataplane/`, bottom up:
//!
//! | module here | crate | folder | what it is |
//! |---|---|---|---|
//! | [`wire`] | `dp-wire` (+ each protocol's `wire`) | `dataplane/wire` | checked views over protocol bytes, open enums, `Copy` codec errors |
//! | [`fabric`] | `dp-fabric` | `dataplane/fabric` | the provider-neutral verbs traits and types |
//! | [`fabric::shm`] | `dp-shm` | `dataplane/fabric/shm` | software RDMA between processes through shared memory |
//! | `fabric::verbs` | `dp-verbs` | `dataplane/fabric/verbs` | real RDMA through rdma-core (feature `verbs`) |
//! | [`rsocket`] | `dp-rsocket` | `dataplane/rsocket` | the socket API over RDMA, wire-compatible with librdmacm |
//! | [`rtrs`] | `dp-rtrs` | `dataplane/rtrs` | RTRS, multipath RDMA transport for block IO (Linux RTRS 2.0), as sans-IO state machines |
//! | [`rnbd`] | `dp-rnbd` | `dataplane/rnbd` | the RNBD block service: wire format, server and client sessions, backends |
//! | [`rds`] | `dp-rds` | `dataplane/rds` | RDS: reliable datagram sockets, the sans-IO protocol core with Linux's socket semantics |
//!
//! Protocol crates depend on `dp-fabric`'s traits only, never on a provider. Test kits (the
//! provider conformance suite, protocol simulators) are compiled only with the feature
//! `testing`.
//!
//! Invariants: data-path calls (`post_send`, `post_recv`, `poll`) never allocate and never
//! make a system call; unsafe code lives only in the provider crates, in `dp-fabric`'s
//! `sync` and `sys` modules and in `dp-rnbd`'s block backends and request path (raw chunk
//! memory, io_uring), and every unsafe block states the invariant it relies on;
//! protocol state machines take time and inputs as arguments and perform no I/O.
#![forbid(unsafe_code)]

/// The provider-neutral verbs layer ([`dp_fabric`]) and its providers.
pub mod fabric {
    pub use dp_fabric::*;
    /// The shm provider ([`dp_shm`]).
    pub use dp_shm as shm;
    /// The verbs provider ([`dp_verbs`], feature `verbs`).
    #[cfg(feature = "verbs")]
    pub use dp_verbs as verbs;
}

/// Wire codecs: the shared toolkit ([`dp_wire`]) and each protocol's formats.
pub mod wire {
    /// RDS's wire formats ([`dp_rds::wire`]).
    pub use dp_rds::wire as rds;
    /// rsocket's wire formats ([`dp_rsocket::wire`]).
    /// RNBD's messages ([`dp_rnbd::wire`]).
    pub use dp_rnbd::wire as rnbd;
    pub use dp_rsocket::wire as rsocket;
    /// RTRS's wire formats ([`dp_rtrs::wire`]).
    pub use dp_rtrs::wire as rtrs;
    pub use dp_wire::*;
}

pub use dp_rds as rds;
pub use dp_rnbd as rnbd;
pub use dp_rsocket as rsocket;
pub use dp_rtrs as rtrs;

#[cfg(feature = "testing")]
pub use dp_fabric::conformance_tests;
