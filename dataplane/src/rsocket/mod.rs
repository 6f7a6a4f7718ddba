//! rsocket: the socket API over RDMA, wire-compatible with librdmacm's rsockets.
//!
//! Layers:
//!
//! * [`crate::wire::rsocket`]: the wire formats (connection data, immediates, SGE and iomap
//!   entries, datagram headers);
//! * [`conn`]: the stream protocol as a sans-IO state machine (credits, target SGL, sends
//!   and receives, shutdown, keepalive, iomap);
//! * [`sim`]: a deterministic simulated fabric for the state machine.
#![deny(unsafe_code)]

pub mod conn;
pub mod error;
pub mod sim;

pub use conn::{Ready, Shutdown, StreamConfig, StreamConn};
pub use error::RsError;
