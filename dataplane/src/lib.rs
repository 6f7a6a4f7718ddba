//! `dataplane`: fabric providers and the rsocket, RDS and RTRS protocols.
//!
//! Layers, bottom up:
//!
//! * [`fabric`]: the provider-neutral verbs model (devices, protection domains, memory
//!   regions, completion queues, RC/UD queue pairs, RDMA-CM-style connection management)
//!   and its providers: [`fabric::shm`] (software RDMA through shared memory) and `verbs`
//!   (rdma-core, feature `verbs`).
//!
//! Invariants: data-path calls (`post_send`, `post_recv`, `poll`) never allocate and never
//! make a system call; unsafe code lives only in the provider modules, and every unsafe block
//! states the invariant it relies on; protocol state machines take time and inputs as arguments
//! and perform no I/O.
#![deny(unsafe_code)]

pub mod fabric;
pub mod rsocket;
mod sync;
pub mod sys;
pub mod wire;
