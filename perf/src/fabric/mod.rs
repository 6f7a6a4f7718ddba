//! perftest-style fabric benchmarks: `write-lat`, `write-bw`, `send-lat`, `send-bw`,
//! `read-lat`, `read-bw`, over any fabric provider.
//!
//! Conventions follow perftest (`ib_write_lat` and friends), so numbers can be read side by
//! side with its output on the same device:
//!
//! * **Latency** tests ping-pong one message at a time and report, per size, `t_min`,
//!   `t_max`, `t_typical` (the median), `t_avg`, `t_stdev`, 99% and 99.9%, from an
//!   hdrhistogram of per-iteration samples. WRITE and SEND latency is **half the round
//!   trip** (one way), as perftest prints it; READ latency is the **full** time of one
//!   READ, which is itself a round trip (perftest's `rtt_factor` of 1 for READ).
//!   `write-lat` works like `ib_write_lat`: each side polls the last byte of its buffer
//!   for the peer's RDMA WRITE, no completion is involved on the receiving side.
//! * **Bandwidth** tests keep `--tx-depth` requests outstanding, signal one in
//!   `cq_mod = min(100, tx_depth / 2)`, and report `BW average` (payload bits over the time
//!   from the first post to the last completion), `BW peak` (the best window of
//!   `max(iters / 20, tx_depth)` consecutive requests) and `MsgRate` in Mpps. Every Gb/s is
//!   payload bits per second over 10^9.
//!
//! Roles: `--server` listens, `--client ADDR` connects, `--pair` runs the server as a child
//! process pinned to the second CPU and the client on the first. Each size is one
//! connection: the client's connect request carries the test, size and iteration count,
//! the server's accept carries its buffer's address and key.
//!
//! | file | what |
//! |------|------|
//! | `run` | the options, the roles, the client's size sweep and the server's loop |
//! | `session` | the [`Test`] and what the two sides send each other when connecting |
//! | `endpoint` | one side's resources for one size; connecting and accepting |
//! | `latency` | the latency tests, both sides |
//! | `bandwidth` | the bandwidth tests, both sides |
//! | `report` | the results, as perftest's tables or JSON |

mod bandwidth;
mod endpoint;
mod latency;
mod report;
mod run;
mod session;

pub use report::{BwRow, FabricReport, LatRow};
pub use run::FabricArgs;
pub use session::Test;

pub use crate::harness::ProviderKind;
