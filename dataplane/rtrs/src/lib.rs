//! `dp-rtrs`: RTRS, the multipath RDMA transport for block IO.
#![deny(unsafe_code)]

pub mod wire;
