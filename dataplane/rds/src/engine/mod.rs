//! The node: [`RdsEngine`], its sockets, connections and congestion maps.
//!
//! See the crate documentation for the model (one engine, one node), the two faces (the
//! socket API for applications, the transport API for a driver) and the call order.

mod config;
mod cong;
mod conn;
mod core;
mod mr;
mod rdma;
mod recv;
mod route;
mod send;
mod socket;
mod sockopt;

pub use self::core::{Accept, EngineError, Incoming, RdsEngine, Reject, SocketEvent, TransportCmd};
pub use config::{RdsConfig, TransportKind, TransportSpec};
pub use cong::{CongTable, MapIdx};
pub use conn::{ConnKey, jhash_1word, mpath_hash};
pub use mr::{
    PAGE_SIZE, RdmaMemory, Registered, check_mr_range, cookie_key, cookie_offset, make_cookie,
    pages_in_vec,
};
pub use rdma::GetMrArgs;
pub use socket::{RdmaNotify, RdsSocket, Ready, Received, RecvFlags, SendCmsg, SendFlags};
pub use sockopt::sockaddr_bytes;
