//! The provider-neutral verbs layer that rsocket, RDS and RTRS run on.
//!
//! One trait family ([`Provider`] and the object traits in [`traits`]) describes the verbs
//! objects RDMA users know; two providers implement it:
//!
//! * [`shm`]: software RDMA between processes on one host, through shared memory;
//! * `verbs`: real RDMA hardware through rdma-core (feature `verbs`).
//!
//! Every provider module offers the same names: a device, protection domain, memory region,
//! completion queue, RC and UD queue pairs, datagram destination and CM channel. Nothing a
//! protocol needs may be expressible on `shm` only: the traits describe exactly what
//! libibverbs and librdmacm offer.
//!
//! The [`conformance`] module holds a test suite generic over the provider; it runs on
//! `shm` always and on `verbs` when a device is configured.

pub mod conformance;
pub mod error;
pub mod shm;
pub mod traits;
pub mod types;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use error::{FabricError, PostError, PostErrorKind};
pub use traits::{
    CmChannel, CmEvent, CompletionQueue, ConnId, ConnRequest, Device, ListenId, MAX_PRIVATE_DATA,
    MemoryRegion, PrepareQp, PrivateData, ProtectionDomain, Provider, QpInit, RcQueuePair,
    UdQueuePair, UdSendWr, UnreachableReason,
};
pub use types::{
    Access, Completion, DeviceAttr, GRH_LEN, Payload, QpCaps, QpState, RecvWr, RemoteAddr,
    SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
