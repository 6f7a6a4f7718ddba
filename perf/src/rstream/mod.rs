//! `dp-perf rstream`: librdmacm's `rstream` benchmark, over rsockets on a fabric provider or
//! over kernel TCP (`--tcp`) for comparison.
//!
//! Same sizes, options, defaults and columns as `rstream` (rdma-core `librdmacm/examples`,
//! described in `shared/reference/rsocket.md` section 8.1):
//!
//! * the size table of 33 sizes from 64 B to 6 MiB; by default only 64 B, 4 KiB, 64 KiB and
//!   1 MiB run, `-S all` runs every size, `-S N` one custom size;
//! * a latency sweep on one connection (`<size>_lat`: one transfer per iteration,
//!   `size_to_count(size)` iterations, inline `-i`), then a new connection for the bandwidth
//!   sweep (`<size>_bw`: one iteration of `size_to_count(size)` transfers, inline 0); a
//!   custom test (`-S N`, `-I`, `-C`) sets no inline size, so the library's default (64)
//!   applies, as in rstream;
//! * every iteration the client sends `xfers` messages and receives `xfers` back, the server
//!   mirrors; a 16-byte exchange brackets the timed part;
//! * `-B` sets SO_SNDBUF and SO_RCVBUF (default 512 KiB; rsockets double it);
//! * `-T b` blocks (MSG_WAITALL), the default spins with MSG_DONTWAIT, `-T v` verifies data;
//! * columns `name bytes xfers iters total time Gb/sec usec/xfer`, where total counts both
//!   directions, Gb/sec = total x 8 / elapsed, and usec/xfer = elapsed / iters / (2 x xfers),
//!   i.e. one-way time for latency runs.
//!
//! | file | what |
//! |------|------|
//! | `run` | the options, the roles and the run |
//! | `plan` | the tests a run makes, and one test on a connection (rstream's `run_test`) |
//! | `conn` | what a connection and a transport are to the test |
//! | `background` | `--sockets N`: the other N-1 connections, with traffic at a fixed rate |
//! | `rsocket` | connections over dataplane rsockets |
//! | `tcp` | connections over kernel TCP |
//! | `table` | the results, as rstream's table or JSON |

mod background;
mod conn;
mod plan;
mod rsocket;
mod run;
mod table;
mod tcp;

pub use conn::BgReport;
pub use plan::{TEST_SIZES, size_to_count};
pub use run::RstreamArgs;
pub use table::{Row, RstreamReport, Scale, cnt_str, size_str};
