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

use std::net::{IpAddr, SocketAddr};

use arbitrary::Arbitrary;
use dp_rds::path::PathId;
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::store::FragConfig;
use dp_rds::wire::{Flags, HeaderRepr};
use dp_rds::{RdsConfig, SendFlags, TransportSpec};
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
    let (a, _) = net.socket(0, addr("10.0.0.1", 4000));
    let (b, _) = net.socket(1, addr("10.0.0.2", 4001));
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
