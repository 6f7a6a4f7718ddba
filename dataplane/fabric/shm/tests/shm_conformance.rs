//! The provider conformance suite on the shm provider (always runs).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use dp_fabric::conformance::Env;
use dp_shm::{Shm, ShmConfig, ShmDevice};

/// A private rendezvous directory per test process, so parallel test runs never share
/// listener addresses.
fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("dp-conf-{}", std::process::id()))
}

fn env(port: u16) -> Option<Env<Shm>> {
    let cfg = ShmConfig {
        dir: Some(dir()),
        ..ShmConfig::default()
    };
    Some(Env {
        a: ShmDevice::open(cfg.clone()).expect("open shm device a"),
        b: ShmDevice::open(cfg).expect("open shm device b"),
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 20_000 + port,
    })
}

dp_fabric::conformance_tests!(Shm, |port| env(port));
