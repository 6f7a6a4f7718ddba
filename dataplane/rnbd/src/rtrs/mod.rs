//! RNBD on RTRS over a fabric provider: [`RnbdServer`] serves exports to RTRS client
//! sessions, [`RnbdClient`] maps remote devices over an RTRS client session. Both are
//! driven from one lcore's loop (`poll`) and make no system call on the data path beyond
//! what the provider and the backends do (the shm provider and the io_uring backend with
//! its polling kernel thread make none).
//!
//! The RTRS drivers run the registered-once mode (see `dp_rtrs::fabric`): the client's
//! data buffers are registered once per path, the server's chunks once per session.

pub mod client;
#[allow(unsafe_code)] // hands a request's chunk to a backend in place
pub mod server;

pub use client::{ANSWER_MAX, BindError, RnbdClient, RtrsTransport};
pub use server::{BindStats, MAX_USR, RnbdServer};
