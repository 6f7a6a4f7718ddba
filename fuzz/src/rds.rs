//! The RDS engine (`dp_rds`) against a hostile peer, over the simulator.
//!
//! Nodes A and B are honest engines on a message or stream transport; the fuzzer plays a
//! third party that can also inject anything at B's end of the A-B connection: whole
//! frames with any header (checksummed or not) and payload, raw stream bytes, connection
//! resets, and moves the clock. A's and B's applications send and receive.
//! Checked: no panic, no livelock (every simulator call is bounded), counters consistent
//! (every reset for a violation is counted as one), and at the end, after the attack
//! stops, neither engine is wedged: a bystander node C reaches B, and A reaches C. (A-B
//! itself may stay lossy: frames forged into A's own sequence space can make A's later
//! retransmissions look old, as in the kernel; only A, whose connection it is, pays.)
//!
//! RDMA: A and B have RDMA key tables ([`Keys`], as the fabric transport's window would
//! plug in). B's application registers and frees regions (some use-once), A's sends RDMA
//! operations with B's cookies or made-up ones, A's transport reports failed operations by
//! any token, and forged frames may carry `RDS_EXTHDR_RDMA` naming any key. Checked too:
//! the engine deregisters only live keys it registered, never one twice, and its count of
//! regions is the key table's.

use std::net::{IpAddr, SocketAddr};

use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use dp_rds::engine::{RdmaMemory, Registered};
use dp_rds::path::PathId;
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::store::FragConfig;
use dp_rds::uapi::{
    RDS_RDMA_NOTIFY_ME, RDS_RDMA_READWRITE, RDS_RDMA_REMOTE_ERROR, RDS_RDMA_USE_ONCE,
};
use dp_rds::wire::{Flags, HeaderRepr};
use dp_rds::{RdsConfig, RdsError, SendCmsg, SendFlags, TransportKind, TransportSpec};
use mempool::memory::HugePolicy;

/// One fuzz input.
#[derive(Arbitrary, Debug)]
pub struct Input {
    stream: bool,
    credits: bool,
    ops: Vec<Op>,
}

/// A header the fuzzer controls (small ranges where it matters, so checks are reached).
#[derive(Arbitrary, Debug)]
struct Hdr {
    seq: u8,
    ack: u8,
    len: u16,
    big_len: bool,
    sport: u8,
    dport: u8,
    flags: u8,
    credit: u8,
    ext: [u8; 16],
    csum: bool,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A frame at B's end of the A-B connection.
    Frame { h: Hdr, payload: u16 },
    /// Raw bytes as a frame (any length, any content).
    RawFrame(Vec<u8>),
    /// Stream bytes at B's end.
    Stream(Vec<u8>),
    /// A's application sends (size, port).
    Send { len: u16, port: u8 },
    /// B's application reads.
    Recv,
    /// Time passes (simulator steps).
    Steps(u8),
    /// The connection dies (seen from A's end).
    Reset,
    /// The connection dies (seen from B's end).
    ResetB,
    /// B's application registers a region (`RDS_GET_MR`).
    GetMr { off: u16, len: u16, flags: u8 },
    /// B's application frees one of its cookies, or a made-up one (`RDS_FREE_MR`).
    FreeMr(u8),
    /// A's application sends an RDMA WRITE/READ with one of B's cookies or a made-up one.
    SendRdma {
        pick: u8,
        port: u8,
        write: bool,
        len: u16,
    },
    /// A's transport reports the RDMA operation before frame `token` failed.
    RdmaFailed(u8),
}

/// Where the key tables pretend the windows are (nothing is read or written there).
const WIN: u64 = 0x10_0000_0000;
const WIN_LEN: u64 = 1 << 20;

/// A key table that checks the engine's use of it: only live keys are deregistered.
#[derive(Clone, Default)]
struct Keys(Arc<Mutex<(Vec<u32>, u32)>>);

impl Keys {
    fn live(&self) -> usize {
        self.0.lock().unwrap().0.len()
    }
}

impl RdmaMemory for Keys {
    fn register(&mut self, addr: u64, bytes: u64, _w: bool) -> Result<Registered, RdsError> {
        if addr < WIN || addr + bytes > WIN + WIN_LEN {
            return Err(RdsError::Fault("outside the window"));
        }
        let mut g = self.0.lock().unwrap();
        g.1 += 1;
        let k = g.1;
        g.0.push(k);
        Ok(Registered {
            rkey: k,
            offset: (addr - WIN) as u32,
        })
    }
    fn deregister(&mut self, rkey: u32) {
        let mut g = self.0.lock().unwrap();
        let before = g.0.len();
        g.0.retain(|&k| k != rkey);
        assert_eq!(
            g.0.len() + 1,
            before,
            "deregistered a key that is not live: {rkey}"
        );
    }
    fn window(&self) -> (u64, u64) {
        (WIN, WIN_LEN)
    }
}

const P0: PathId = PathId { conn: 0, index: 0 };

fn cfg(name: &str, seed: u64, t: TransportSpec) -> RdsConfig {
    RdsConfig {
        name: name.into(),
        transports: vec![t],
        frags: FragConfig {
            count: 96,
            rx_reserve: 16,
            huge: HugePolicy::Never,
            shareable: false,
        },
        msgs: 256,
        max_sockets: 8,
        max_conns: 4,
        seed,
        ..RdsConfig::default()
    }
}

fn addr(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(s.parse::<IpAddr>().unwrap(), port)
}

/// Runs one input.
pub fn run(input: &Input) {
    if std::env::var_os("RDS_FUZZ_DEBUG").is_some() {
        eprintln!("{input:#?}");
    }
    let mut t = if input.stream {
        TransportSpec::tcp()
    } else {
        TransportSpec::ib()
    };
    t.path.flow_control = input.credits;
    let mut net = SimNet::new(SimConfig::default());
    net.add_node(cfg("fz-a", 1, t), &["10.0.0.1".parse().unwrap()]);
    net.add_node(cfg("fz-b", 2, t), &["10.0.0.2".parse().unwrap()]);
    net.add_node(cfg("fz-c", 3, t), &["10.0.0.3".parse().unwrap()]);
    let keys = [Keys::default(), Keys::default()];
    if !input.stream {
        for (n, k) in keys.iter().enumerate() {
            net.engine(n)
                .set_rdma_memory(TransportKind::Ib, Box::new(k.clone()))
                .unwrap();
        }
    }
    let (a, _) = net.socket(0, addr("10.0.0.1", 4000));
    let (b, _) = net.socket(1, addr("10.0.0.2", 4001));
    let mut cookies: Vec<u64> = Vec::new();
    let _ = net.send_blocking(0, a, addr("10.0.0.2", 4001), b"hi", 10_000);
    for _ in 0..2000 {
        if !net.step() || net.recv(1, b).is_some() {
            break;
        }
    }
    for op in input.ops.iter().take(64) {
        let now = net.now;
        match op {
            Op::Frame { h, payload } => {
                let r = HeaderRepr {
                    sequence: u64::from(h.seq),
                    ack: u64::from(h.ack),
                    len: if h.big_len {
                        (1 << 20) + u32::from(h.len)
                    } else {
                        u32::from(h.len)
                    },
                    sport: u16::from(h.sport % 4),
                    dport: 4000 + u16::from(h.dport % 4),
                    flags: Flags(h.flags),
                    credit: h.credit,
                    ext: h.ext,
                };
                let bytes = r.to_bytes(h.csum);
                let p = vec![0x5a; usize::from(*payload) % 4200];
                if input.stream {
                    let _ = net.engine(1).handle_stream_bytes(now, P0, &bytes);
                    let _ = net.engine(1).handle_stream_bytes(now, P0, &p);
                } else {
                    let _ = net.engine(1).handle_frame(now, P0, &bytes, &p);
                }
            }
            Op::RawFrame(raw) => {
                let (h, p) = raw.split_at(raw.len().min(48));
                let _ = net.engine(1).handle_frame(now, P0, h, p);
            }
            Op::Stream(bytes) => {
                let _ = net.engine(1).handle_stream_bytes(now, P0, bytes);
            }
            Op::Send { len, port } => {
                let data = vec![7u8; usize::from(*len) % 20000];
                let _ = net.engine(0).send_to(
                    now,
                    a,
                    Some(addr("10.0.0.2", 4000 + u16::from(*port % 4))),
                    &data,
                    SendFlags::DONTWAIT,
                );
            }
            Op::Recv => while net.recv(1, b).is_some() {},
            Op::Steps(n) => {
                for _ in 0..*n {
                    if !net.step() {
                        break;
                    }
                }
            }
            Op::Reset => {
                net.reset_link(0, P0);
            }
            Op::ResetB => {
                net.reset_link(1, P0);
            }
            Op::GetMr { off, len, flags } => {
                let f = u64::from(*flags) & (RDS_RDMA_READWRITE | RDS_RDMA_USE_ONCE);
                let a = WIN + u64::from(*off) * 16;
                if let Ok(c) = net.engine(1).get_mr(b, a, u64::from(*len), f) {
                    cookies.push(c);
                }
            }
            Op::FreeMr(pick) => {
                let c = cookies
                    .get(usize::from(*pick))
                    .copied()
                    .unwrap_or(u64::from(*pick));
                let _ = net.engine(1).free_mr(b, c, 0);
            }
            Op::SendRdma {
                pick,
                port,
                write,
                len,
            } => {
                let c = cookies
                    .get(usize::from(*pick))
                    .copied()
                    .unwrap_or(u64::from(*pick) << 8);
                let n = u64::from(*len).max(1);
                let args = SendCmsg::RdmaArgs {
                    cookie: c,
                    remote_addr: 0,
                    remote_bytes: n,
                    nr_local: 1,
                    local_addr: WIN,
                    local_bytes: n,
                    flags: RDS_RDMA_NOTIFY_ME | if *write { RDS_RDMA_READWRITE } else { 0 },
                    user_token: u64::from(*pick),
                };
                let _ = net.engine(0).send_msg(
                    now,
                    a,
                    Some(addr("10.0.0.2", 4000 + u16::from(*port % 4))),
                    b"rdma",
                    &[args],
                    SendFlags::DONTWAIT,
                );
            }
            Op::RdmaFailed(token) => {
                net.engine(0)
                    .handle_rdma_failed(now, P0, u64::from(*token), RDS_RDMA_REMOTE_ERROR);
            }
        }
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(
                net.engine(n).mr_count(),
                k.live(),
                "the engine's regions are the key table's"
            );
        }
        let s = net.engine(1).stats();
        let kinds = s.recv_drop_truncated
            + s.recv_drop_bad_checksum
            + s.recv_drop_bad_len
            + s.recv_drop_frag_mismatch
            + s.recv_drop_bad_frag_len
            + s.recv_drop_bad_seq
            + s.recv_drop_bad_credit
            + s.recv_drop_bad_cong;
        assert_eq!(
            kinds, s.conn_violation,
            "every violation counted once, under its kind"
        );
    }
    // The attack stops: B and A still work, with a bystander.
    let (c, _) = net.socket(2, addr("10.0.0.3", 4001));
    let (cb, _) = net.socket(1, addr("10.0.0.2", 4002));
    let _ = net.send_blocking(2, c, addr("10.0.0.2", 4002), b"c->b", 50_000);
    let _ = net.send_blocking(0, a, addr("10.0.0.3", 4001), b"a->c", 50_000);
    let (mut to_b, mut to_c) = (false, false);
    for _ in 0..50_000 {
        while let Some((m, _)) = net.recv(1, cb) {
            to_b |= m == b"c->b";
        }
        while let Some((m, _)) = net.recv(2, c) {
            to_c |= m == b"a->c";
        }
        if to_b && to_c {
            break;
        }
        if !net.step() {
            break;
        }
    }
    assert!(
        to_b && to_c,
        "after the attack B and A still talk to a bystander"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RDMA operations reach the engine and its checks: registrations, frees, an RDMA
    /// send with a real cookie and a made-up one, a failure report, and a forged
    /// `RDS_EXTHDR_RDMA` naming B's first key (use-once) on a frame to B's socket.
    #[test]
    fn rdma_ops_reach_the_checks() {
        let mut ext = [0u8; 16];
        ext[0] = 2; // RDS_EXTHDR_RDMA
        ext[1..5].copy_from_slice(&1u32.to_be_bytes());
        let input = Input {
            stream: false,
            credits: true,
            ops: vec![
                Op::GetMr {
                    off: 0,
                    len: 4096,
                    flags: (RDS_RDMA_READWRITE | RDS_RDMA_USE_ONCE) as u8,
                },
                Op::GetMr {
                    off: 512,
                    len: 100,
                    flags: 0,
                },
                Op::FreeMr(1),
                Op::FreeMr(1),
                Op::SendRdma {
                    pick: 0,
                    port: 1,
                    write: true,
                    len: 64,
                },
                Op::SendRdma {
                    pick: 9,
                    port: 1,
                    write: false,
                    len: 64,
                },
                Op::RdmaFailed(3),
                Op::Steps(50),
                Op::Frame {
                    h: Hdr {
                        seq: 200,
                        ack: 0,
                        len: 0,
                        big_len: false,
                        sport: 0,
                        dport: 1,
                        flags: 0,
                        credit: 0,
                        ext,
                        csum: false,
                    },
                    payload: 0,
                },
                Op::Steps(50),
                Op::Recv,
            ],
        };
        run(&input);
    }
}
