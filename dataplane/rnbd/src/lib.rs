//! `dp-rnbd`: RNBD, the block service on RTRS, compatible with Linux's `rnbd-server` and
//! `rnbd-client` (protocol 2.x).
//!
//! Layers, bottom up:
//!
//! * [`wire`]: the messages (`SESS_INFO`, `OPEN`, `IO`, `CLOSE` and their responses) as
//!   parsed and emitted bytes, little-endian at the kernel's offsets;
//! * [`export`]: what a server exports and who may open it (the device search path with
//!   `%SESSNAME%` namespaces, `..` refused; read-only, read-write and migration access);
//! * [`backend`]: where the blocks live: a RAM disk in a mempool region, a null device, or
//!   a file or block device through `io_uring` with a kernel polling thread, so the data path
//!   makes no system call per IO.
//!
//! * [`client`]: one client session, sans-IO: devices mapped by name, block IO at sector
//!   granularity, and the remap after RTRS reconnects;
//! * [`server`]: one server session, sans-IO: requests in, answers (at once, or when the
//!   backend completes) out.
//!
//! * [`rtrs`]: both sessions on RTRS over a fabric provider, driven from an lcore.
//!
//! Unsafe code is allowed only in [`backend`] (memory and io_uring submissions) and
//! [`server`] (the RTRS chunk a request arrived in, as a raw pointer and length); every
//! block says what it relies on.
#![deny(unsafe_code)]

pub mod backend;
pub mod client;
pub mod export;
pub mod rtrs;
#[allow(unsafe_code)]
pub mod server;
pub mod wire;
