//! What a run does: the sequence of tests (rstream's size table and iteration counts, or one
//! custom test), and each test on an open connection (rstream's `run_test`), with `-T v`'s
//! data verification.

use std::io::{self, ErrorKind};

use super::conn::Conn;
use super::table::size_str;
use crate::PerfError;
use crate::harness::Timer;

/// rstream's size table: (size, runs by default).
pub const TEST_SIZES: [(usize, bool); 33] = [
    (64, true),
    (128, false),
    (192, false),
    (256, false),
    (384, false),
    (512, false),
    (768, false),
    (1 << 10, false),
    (3 << 9, false),
    (2 << 10, false),
    (3 << 10, false),
    (4 << 10, true),
    (6 << 10, false),
    (8 << 10, false),
    (12 << 10, false),
    (16 << 10, false),
    (24 << 10, false),
    (32 << 10, false),
    (48 << 10, false),
    (64 << 10, true),
    (96 << 10, false),
    (128 << 10, false),
    (192 << 10, false),
    (256 << 10, false),
    (384 << 10, false),
    (512 << 10, false),
    (768 << 10, false),
    (1 << 20, true),
    (3 << 19, false),
    (2 << 20, false),
    (3 << 20, false),
    (4 << 20, false),
    (6 << 20, false),
];

/// rstream's iteration count for a size.
pub const fn size_to_count(size: usize) -> u64 {
    if size >= 1 << 20 {
        100
    } else if size >= 1 << 16 {
        1000
    } else if size >= 1 << 10 {
        10000
    } else {
        100_000
    }
}

/// One test: `iters` rounds of `xfers` transfers of `size` bytes each way.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) size: usize,
    pub(super) xfers: u64,
    pub(super) iters: u64,
}

/// rstream's `-T v` data: each direction of the byte stream carries its running byte count
/// modulo 256, counted from the program's first transfer (sync messages included) and across
/// the latency and bandwidth connections, as rstream's `format_buf`/`verify_buf` do. So a
/// verifying run against librdmacm's own `rstream` checks every byte either way.
#[derive(Debug, Default)]
pub(super) struct Verify {
    on: bool,
    tx: u8,
    rx: u8,
    rx_total: u64,
}

impl Verify {
    /// Verification on (`-T v`) or off, both counts at zero.
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }

    fn format(&mut self, buf: &mut [u8]) {
        if self.on {
            for b in buf {
                *b = self.tx;
                self.tx = self.tx.wrapping_add(1);
            }
        }
    }

    fn check(&mut self, buf: &[u8]) -> io::Result<()> {
        if !self.on {
            return Ok(());
        }
        for &b in buf {
            if b != self.rx {
                return Err(io::Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "data verification failed at byte {} of the received stream: \
                         got {b:#04x}, expected {:#04x}",
                        self.rx_total, self.rx
                    ),
                ));
            }
            self.rx = self.rx.wrapping_add(1);
            self.rx_total += 1;
        }
        Ok(())
    }
}

fn send_xfer(c: &mut dyn Conn, buf: &mut [u8], v: &mut Verify) -> io::Result<()> {
    v.format(buf);
    c.send_all(buf)
}

fn recv_xfer(c: &mut dyn Conn, buf: &mut [u8], v: &mut Verify) -> io::Result<()> {
    c.recv_all(buf)?;
    v.check(buf)
}

/// One test on an open connection (rstream's `run_test`): a 16-byte exchange, then
/// `iters` rounds of `xfers` transfers out and `xfers` back. Returns the client's elapsed
/// seconds (the server returns 0). With `samples`, each round's one-way time per transfer
/// (the round's nanoseconds over `2 x xfers`) is pushed there too: for latency runs, one
/// one-way latency per round trip.
pub(super) fn run_test(
    c: &mut dyn Conn,
    client: bool,
    p: Plan,
    buf: &mut [u8],
    v: &mut Verify,
    timer: &Timer,
    mut samples: Option<&mut Vec<u64>>,
) -> io::Result<f64> {
    let mut sync = [0u8; 16];
    if client {
        send_xfer(c, &mut sync, v)?;
        recv_xfer(c, &mut sync, v)?;
    } else {
        recv_xfer(c, &mut sync, v)?;
        send_xfer(c, &mut sync, v)?;
    }
    let buf = &mut buf[..p.size];
    let start = timer.now_ns();
    let mut round = start;
    for _ in 0..p.iters {
        for _ in 0..p.xfers {
            if client {
                send_xfer(c, buf, v)?;
            } else {
                recv_xfer(c, buf, v)?;
            }
        }
        for _ in 0..p.xfers {
            if client {
                recv_xfer(c, buf, v)?;
            } else {
                send_xfer(c, buf, v)?;
            }
        }
        if let Some(s) = samples.as_deref_mut() {
            let now = timer.now_ns();
            s.push(now.saturating_sub(round) / (2 * p.xfers.max(1)));
            round = now;
        }
    }
    Ok(timer.now_ns().saturating_sub(start) as f64 / 1e9)
}

/// The sequence of tests a run makes: the latency sweep (one connection) and the bandwidth
/// sweep (a second connection), or one custom test. `size`, `iterations` and `count` are
/// rstream's `-S`, `-I` and `-C`.
pub(super) fn plans(
    size: Option<&str>,
    iterations: Option<u64>,
    count: Option<u64>,
    quick: bool,
) -> Result<(Vec<Plan>, Vec<Plan>), PerfError> {
    let custom_size = match size {
        None | Some("all") => None,
        Some(s) => Some(
            s.parse::<usize>()
                .ok()
                .filter(|n| *n > 0 && *n <= 1 << 30)
                .ok_or_else(|| {
                    PerfError::Usage(format!(
                        "-S {s:?}: give a size in bytes (1 to 2^30) or `all`"
                    ))
                })?,
        ),
    };
    if custom_size.is_some() || iterations.is_some() || count.is_some() {
        // rstream: any of -S N, -I, -C makes a custom test of one connection.
        let p = Plan {
            size: custom_size.unwrap_or(1000),
            xfers: count.unwrap_or(1000),
            iters: iterations.unwrap_or(1),
        };
        return Ok((vec![], vec![p]));
    }
    let all = size == Some("all");
    let sizes: Vec<usize> = TEST_SIZES
        .iter()
        .filter(|(_, d)| all || *d)
        .map(|(s, _)| *s)
        .collect();
    let shrink = |n: u64| if quick { (n / 100).max(2) } else { n };
    let lat = sizes
        .iter()
        .map(|&s| Plan {
            size: s,
            xfers: 1,
            iters: shrink(size_to_count(s)),
        })
        .collect();
    let bw = sizes
        .iter()
        .map(|&s| Plan {
            size: s,
            xfers: shrink(size_to_count(s)),
            iters: 1,
        })
        .collect();
    Ok((lat, bw))
}

/// The inline size a test's connection asks for (rstream's `set_options`): `-i` for the
/// latency sweep (`opt_latency`), 0 for the bandwidth sweep (`opt_bandwidth`), and none
/// for a custom test (`opt_mixed`: the library's default, 64 bytes), so a custom
/// `-S 64 -C 1` test sends inline as librdmacm's rstream does.
pub(super) fn inline_size(lat: bool, custom: bool, inline: u32) -> Option<u32> {
    match (custom, lat) {
        (true, _) => None,
        (false, true) => Some(inline),
        (false, false) => Some(0),
    }
}

/// The row name: `64_lat`, `1m_bw`, or `custom`.
pub(super) fn name(p: &Plan, lat: bool, custom: bool) -> String {
    if custom {
        return "custom".into();
    }
    format!(
        "{}_{}",
        size_str(p.size as u64),
        if lat { "lat" } else { "bw" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_rstream() {
        assert_eq!(size_to_count(64), 100_000);
        assert_eq!(size_to_count(4096), 10_000);
        assert_eq!(size_to_count(65536), 1000);
        assert_eq!(size_to_count(1 << 20), 100);
        assert_eq!(TEST_SIZES.iter().filter(|(_, d)| *d).count(), 4);
    }

    #[test]
    fn inline_sizes_match_rstream() {
        assert_eq!(inline_size(true, false, 64), Some(64));
        assert_eq!(inline_size(false, false, 64), Some(0));
        // A custom test sets no inline size: the library's default applies.
        assert_eq!(inline_size(false, true, 64), None);
        assert_eq!(inline_size(true, true, 384), None);
    }

    #[test]
    fn verification_is_one_running_count_per_direction() {
        let mut tx = Verify {
            on: true,
            ..Verify::default()
        };
        let mut rx = Verify {
            on: true,
            ..Verify::default()
        };
        // Transfers of odd sizes: the count runs on across them and wraps at 256.
        for size in [16, 300, 7, 1000] {
            let mut b = vec![0u8; size];
            tx.format(&mut b);
            rx.check(&b).unwrap();
        }
        assert_eq!(tx.tx, ((16 + 300 + 7 + 1000) % 256) as u8);
        let mut b = vec![0u8; 64];
        tx.format(&mut b);
        b[40] ^= 1;
        let e = rx.check(&b).unwrap_err();
        assert!(e.to_string().contains("byte 1363"), "{e}");
    }
}
