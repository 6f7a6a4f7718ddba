//! `dp-rds`: RDS, reliable datagram sockets (placeholder crate doc, rewritten below).
#![deny(unsafe_code)]

pub mod addr;
pub mod path;
pub mod rng;
pub mod stats;
pub mod store;
pub mod wire;

pub use path::Path;
