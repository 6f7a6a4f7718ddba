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

/// Memory windows: the `check_mw_*` checks of the conformance suite.
mod mw {
    use dp_fabric::conformance;

    use super::env;

    #[test]
    fn bind_and_rebind() {
        let e = env(200).expect("env");
        conformance::check_mw_bind_and_rebind(&e, true).expect("check");
    }

    #[test]
    fn invalidate_and_rebind() {
        let e = env(240).expect("env");
        conformance::check_mw_bind_and_rebind(&e, false).expect("check");
    }

    #[test]
    fn local_inv() {
        let e = env(210).expect("env");
        conformance::check_mw_local_inv(&e).expect("check");
    }

    #[test]
    fn remote_inv() {
        let e = env(220).expect("env");
        conformance::check_mw_remote_inv(&e).expect("check");
    }

    #[test]
    fn bind_refusals() {
        let e = env(230).expect("env");
        conformance::check_mw_bind_refusals(&e).expect("check");
    }
}
