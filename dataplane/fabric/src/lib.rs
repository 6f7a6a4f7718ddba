//! `dp-fabric`: the provider-neutral verbs layer that rsocket, RDS and RTRS run on.
//!
//! One trait family ([`Provider`] and the object traits in [`traits`]) describes the verbs
//! objects RDMA users know. Providers live in their own crates, one folder each under
//! `dataplane/fabric/`, and implement it:
//!
//! * `dp-shm` (`dataplane/fabric/shm`): software RDMA between processes on one host, through
//!   shared memory;
//! * `dp-verbs` (`dataplane/fabric/verbs`): real RDMA hardware through rdma-core.
//!
//! Every provider offers the same names: a device, protection domain, memory region,
//! completion queue, RC and UD queue pairs, datagram destination and CM channel. Nothing a
//! protocol needs may be expressible on `shm` only: the traits describe exactly what
//! libibverbs and librdmacm offer. Protocol crates depend on this crate and never on a
//! provider, so a protocol builds and tests with no provider at all.
//!
//! Besides the traits this crate holds the two small pieces of machinery providers and
//! protocols share: [`sync::SpinLock`] (data-path state shared between a poster and a
//! poller) and [`sys`] (control-path descriptor waits and an eventfd).
//!
//! With the feature `testing`, `conformance` holds a test suite generic over the provider
//! (a test kit, not shipped code); it runs on `shm` always and on `verbs` when a device is
//! configured.
#![deny(unsafe_code)]

#[cfg(feature = "testing")]
pub mod conformance;
pub mod error;
pub mod sync;
pub mod sys;
pub mod traits;
pub mod types;

pub use error::{FabricError, PostError, PostErrorKind};
pub use traits::{
    CmChannel, CmEvent, CompletionQueue, ConnId, ConnRequest, CqNotify, Device, ListenId,
    MAX_PRIVATE_DATA, MemoryRegion, MemoryWindow, PrepareQp, PrivateData, ProtectionDomain,
    Provider, QpInit, RcQueuePair, UdQueuePair, UdSendWr, UnreachableReason,
};
pub use types::{
    Access, Completion, DeviceAttr, GRH_LEN, Payload, QpCaps, QpState, RecvWr, RemoteAddr,
    SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, inc_rkey,
};
