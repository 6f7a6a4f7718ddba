//! The provider conformance suite on the verbs provider.
//!
//! Runs on real RDMA hardware when `DP_TEST_DEVICE` names a device (for example `rxe0`, a
//! Soft-RoCE device: `rdma link add rxe0 type rxe netdev eth0`). Both sides of every check
//! open that device; the passive side listens on `DP_TEST_IP` (default: the device's first
//! IPv4 address, else 10.77.0.1 as in the rxe lab). Without `DP_TEST_DEVICE` every test
//! prints why it was skipped and passes.
//!
//! On slow Soft-RoCE setups run the checks one at a time (`--test-threads=1`); each check
//! uses its own ports, so parallel runs are correct too.
#![cfg(feature = "verbs")]

use std::net::{IpAddr, Ipv4Addr};

use dp_fabric::conformance::Env;
use dp_verbs::{Verbs, VerbsDevice};

/// First RDMA CM port the suite uses (each check takes up to 4 above its offset).
const PORT_BASE: u16 = 47_100;

fn env(port: u16) -> Option<Env<Verbs>> {
    let Ok(name) = std::env::var("DP_TEST_DEVICE") else {
        eprintln!(
            "skipped: set DP_TEST_DEVICE to an RDMA device (e.g. DP_TEST_DEVICE=rxe0) to run the verbs conformance suite"
        );
        return None;
    };
    let a = VerbsDevice::open(Some(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"));
    let b = VerbsDevice::open(Some(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"));
    let ip = match std::env::var("DP_TEST_IP") {
        Ok(s) => s.parse().unwrap_or_else(|e| panic!("DP_TEST_IP={s}: {e}")),
        Err(_) => a
            .ip_addrs()
            .ok()
            .and_then(|v| v.into_iter().find(IpAddr::is_ipv4))
            .unwrap_or(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1))),
    };
    Some(Env {
        a,
        b,
        ip,
        port: PORT_BASE + port,
    })
}

dp_fabric::conformance_tests!(Verbs, |port| env(port));
