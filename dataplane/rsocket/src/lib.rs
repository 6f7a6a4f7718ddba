//! `dp-rsocket`: the socket API over RDMA, wire-compatible with librdmacm's rsockets.
//!
//! The crate depends on the fabric only through the `dp-fabric` traits: the state machine
//! and its simulator need no provider, and the socket layer runs on any provider the
//! application opens (`dp-shm`, `dp-verbs`).
//!
//! Layers:
//!
//! * [`crate::wire`]: the wire formats (connection data, immediates, SGE and iomap
//!   entries, datagram headers);
//! * [`conn`]: the stream protocol as a sans-IO state machine (credits, target SGL, sends
//!   and receives, shutdown, keepalive, iomap);
//! * `sim` (feature `testing`, a test kit): a deterministic simulated fabric for the state
//!   machine;
//! * [`poll`]: a level-triggered poll set over many sockets ([`RsPoll`]);
//! * [`ctx`]: the socket layer over any fabric provider ([`RsContext`], socket ids), and
//!   [`RsStream`]/[`RsListener`], its `std::net`-like face.
#![deny(unsafe_code)]

mod arena;
pub mod conn;
pub mod ctx;
pub mod dgram;
pub mod error;
pub mod opts;
pub mod poll;
#[cfg(feature = "testing")]
pub mod sim;
mod stream;
mod wait;
pub mod wire;

pub use conn::{Ready, Shutdown, StreamConfig, StreamConn};
pub use ctx::{RecvFlags, RsContext, SendFlagsRs, SockId};
pub use dgram::RsDatagram;
pub use error::RsError;
pub use opts::{RsConfig, STREAM_BUF_DEFAULT, SockOpt, SockOptName, SockOpts};
pub use poll::{Event, Interest, RsPoll, Source, Token};
pub use stream::{RsListener, RsStream};
