//! `dp-rtrs`: RTRS, the multipath RDMA transport for block IO.
#![deny(unsafe_code)]

pub mod permit;
mod sync;
pub mod wire;
