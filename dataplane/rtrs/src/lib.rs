//! `dp-rtrs`: RTRS, the multipath RDMA transport for block IO.
#![deny(unsafe_code)]

pub mod clt;
pub mod error;
pub mod permit;
#[cfg(feature = "testing")]
pub mod sim;
pub mod srv;
pub mod stats;
mod sync;
pub mod timer;
pub mod wire;
pub mod work;
