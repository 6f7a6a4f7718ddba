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

/// Memory windows: the `check_mw_*` checks of the conformance suite, with type-2 rules (a
/// bound window is invalidated before it is bound again, IBA o10-37.2.30).
mod mw {
    use dp_fabric::conformance;

    use super::env;

    /// Soft-RoCE (`rxe`) devices check a window access against the bounds of the region
    /// the window is bound to, not the window's own range (`check_rkey` in the kernel's
    /// `rxe_resp.c`, 6.1): see [`rxe_window_range_is_not_enforced`].
    fn is_rxe(e: &conformance::Env<dp_verbs::Verbs>) -> bool {
        use dp_fabric::Device;
        e.b.attr().name.starts_with("rxe")
    }

    #[test]
    fn invalidate_and_rebind() {
        let Some(e) = env(300) else { return };
        conformance::check_mw_rebind(&e, false).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn limits() {
        let Some(e) = env(360) else { return };
        conformance::check_mw_limits(&e, !is_rxe(&e)).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The device fact behind [`is_rxe`]: on Soft-RoCE, a write just before a window's
    /// range, inside its region, succeeds. This test fails when a kernel fixes it, which
    /// is the cue to let `limits` check ranges on rxe too.
    #[test]
    fn rxe_window_range_is_not_enforced() {
        let Some(e) = env(370) else { return };
        if !is_rxe(&e) {
            eprintln!("skipped: not a Soft-RoCE device");
            return;
        }
        let err = conformance::check_mw_limits(&e, true)
            .expect_err("rxe enforced the window's range: enable range checks in `limits`");
        assert!(err.starts_with("before the window"), "{err}");
    }

    #[test]
    fn local_inv() {
        let Some(e) = env(310) else { return };
        conformance::check_mw_local_inv(&e).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn remote_inv() {
        let Some(e) = env(320) else { return };
        conformance::check_mw_remote_inv(&e).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn bad_remote_inv() {
        let Some(e) = env(330) else { return };
        // A key one consumer step past the bound one: no window is bound under it. The
        // receiver's side must hold everywhere. On Soft-RoCE the responder moves to the
        // error state without a NAK, and in the lab (Linux 6.1) the sender's queue pair saw
        // no error within a minute: only the heartbeats of the protocols above notice.
        match conformance::check_mw_bad_remote_inv(&e, |_, k| dp_fabric::inc_rkey(k)) {
            Ok(_) => {}
            Err(err) if is_rxe(&e) && err == "the sender's queue pair kept working" => {
                eprintln!("rxe: {err} (no NAK from a responder that failed an invalidation)");
            }
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn bind_refusals() {
        let Some(e) = env(340) else { return };
        conformance::check_mw_bind_refusals(&e).unwrap_or_else(|e| panic!("{e}"));
    }

    /// A window bound while it is still bound is refused by the device (type 2): the bind
    /// completes in error and the queue pair goes to the error state; the first key keeps
    /// working until then.
    #[test]
    fn rebind_without_invalidate_fails() {
        let Some(e) = env(350) else { return };
        let err = conformance::check_mw_rebind(&e, true)
            .expect_err("a type-2 window rebound without LOCAL_INV must fail on verbs");
        assert!(err.starts_with("bind:"), "{err}");
    }
}
