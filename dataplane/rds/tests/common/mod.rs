//! Shared set-up of the simulator tests.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

use dp_rds::path::PathConfig;
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::store::FragConfig;
use dp_rds::{RdsConfig, TransportKind, TransportSpec};
use mempool::memory::HugePolicy;

pub const A: &str = "10.0.0.1";
pub const B: &str = "10.0.0.2";
pub const C: &str = "10.0.0.3";

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn sa(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(s), port)
}

/// A small engine: 2048 fragments (8 MiB), 8192 records, 1 MiB socket buffers allowed.
pub fn engine_cfg(name: &str, seed: u64, t: TransportSpec) -> RdsConfig {
    RdsConfig {
        name: name.into(),
        transports: vec![t],
        frags: FragConfig {
            count: 2048,
            rx_reserve: 256,
            huge: HugePolicy::Never,
            shareable: false,
        },
        msgs: 8192,
        max_sockets: 256,
        max_conns: 16,
        seed,
        wmem_max: 4 << 20,
        rmem_max: 4 << 20,
        ..RdsConfig::default()
    }
}

pub fn ib() -> TransportSpec {
    TransportSpec::ib()
}

pub fn tcp() -> TransportSpec {
    TransportSpec::tcp()
}

/// RDS-IB rules without flow control (Linux's default).
pub fn ib_no_credits() -> TransportSpec {
    TransportSpec {
        path: PathConfig {
            flow_control: false,
            ..PathConfig::message()
        },
        ..TransportSpec::ib()
    }
}

/// Two nodes, A and B, on one transport.
pub fn pair(t: TransportSpec, sim: SimConfig) -> SimNet {
    let mut net = SimNet::new(sim);
    net.add_node(engine_cfg("rds-sim-a", 11, t), &[ip(A)]);
    net.add_node(engine_cfg("rds-sim-b", 22, t), &[ip(B)]);
    net
}

pub fn kind_name(t: &TransportSpec) -> &'static str {
    match t.kind {
        TransportKind::Ib => "ib",
        TransportKind::Tcp => "tcp",
        TransportKind::Loop => "loop",
    }
}

/// Deterministic payload for message `i` of `len` bytes.
pub fn payload(tag: u32, i: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = (u64::from(tag) << 40) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for _ in 0..len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}
