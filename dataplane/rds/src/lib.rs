//! `dp-rds`: RDS, reliable datagram sockets (placeholder crate doc, rewritten below).
#![deny(unsafe_code)]

pub mod addr;
pub mod engine;
pub mod error;
pub mod path;
pub mod rng;
#[cfg(feature = "testing")]
pub mod sim;
pub mod stats;
pub mod store;
pub mod uapi;
pub mod wire;

pub use engine::{
    Accept, EngineError, Incoming, RdsConfig, RdsEngine, RdsSocket, Ready, Received, RecvFlags,
    Reject, SendCmsg, SendFlags, SocketEvent, TransportCmd, TransportKind, TransportSpec,
};
pub use error::{Block, RdsError};
pub use path::{Path, PathId};
pub use stats::Stats;
