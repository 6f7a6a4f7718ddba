//! Memory windows on the shm provider beyond the conformance checks: a peer's SEND with
//! invalidate naming a key that is not the current key of one of the receiver's windows
//! fails only that connection (another one between the same devices goes on) and touches
//! no key; hostile keys injected straight into the
//! receiver's inbound slots do the same; a window dies with its region.

use std::net::{IpAddr, Ipv4Addr};

use crate::qpseg::{Inbound, inbound_kind};
use crate::{Shm, ShmConfig, ShmDevice};
use dp_fabric::conformance::{self, Env};
use dp_fabric::{
    Access, MemoryRegion, MemoryWindow, ProtectionDomain, RcQueuePair, RemoteAddr, SendOp, SendWr,
    WcStatus, inc_rkey,
};

fn env(port: u16) -> (Env<Shm>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("dp-mw-{}-{port}", std::process::id()));
    let cfg = ShmConfig {
        dir: Some(dir.clone()),
        ..ShmConfig::default()
    };
    let env = Env {
        a: ShmDevice::open(cfg.clone()).expect("device a"),
        b: ShmDevice::open(cfg).expect("device b"),
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port,
    };
    (env, dir)
}

/// Keys a hostile or mistaken peer may ask us to invalidate, none of which is the current
/// key of a window of the receiving domain.
#[test]
fn send_with_invalidate_of_a_non_window_key_fails_only_that_connection() {
    type Pick = fn(&conformance::Pair<Shm>, u32, &crate::ShmPd) -> u32;
    let cases: [(&str, Pick); 6] = [
        ("the region's own key", |p, _, _| p.b.mr.rkey()),
        ("a stale consumer key", |_, k, _| inc_rkey(k)),
        ("an unknown key", |_, _, _| 0xFFFF_FF00),
        ("key 0", |_, _, _| 0),
        ("a window key of another domain", |_, _, other| {
            // Allocated and dropped: its key names nothing of the receiver's.
            other.alloc_mw().expect("alloc_mw").rkey()
        }),
        ("the sender's own region key", |p, _, _| p.a.mr.rkey()),
    ];
    for (i, (what, pick)) in cases.into_iter().enumerate() {
        let (env, dir) = env(23_000 + 10 * i as u16);
        let other = env.b.alloc_pd_with_slots(16).expect("other pd");
        // Another connection between the same devices, which must not notice.
        let mut bystander =
            conformance::connect::<Shm>(&env, env.port + 5, Default::default(), &[], &[])
                .expect("connect the bystander");
        let (p, mr, mw, k) = conformance::check_mw_bad_remote_inv(&env, |p, k| pick(p, k, &other))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Nothing of the receiver's was revoked: its window and regions still resolve.
        let kt = p.b.pd.inner.kt();
        assert!(kt.lookup(k).is_some(), "{what}: the window was revoked");
        assert!(
            kt.lookup(p.b.mr.rkey()).is_some(),
            "{what}: the region was revoked"
        );
        assert!(kt.lookup(mr.lkey()).is_some(), "{what}");
        assert_eq!(mw.rkey() & !0xFF, k & !0xFF);
        let sge = [bystander.a.mr.sge(0, 8)];
        let to = bystander.b.remote(0);
        bystander
            .a
            .qp
            .post_send(&[SendWr::signaled(9, SendOp::Write(to), &sge)])
            .expect("post on the bystander");
        let (ca, _) = conformance::poll_n(&mut bystander, 1, 0).expect("bystander completion");
        assert!(
            ca[0].is_ok(),
            "{what}: the bystander connection failed: {:?}",
            ca[0]
        );
        drop(p);
        drop(bystander);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The receiver's side of a SEND with invalidate, injected into its slots with hostile
/// keys: each fails the receive with a remote invalid request error, and no key changes.
#[test]
fn hostile_invalidate_keys_are_refused() {
    for (i, key) in [0u32, 1, 0xFF, 0x100, 0xFFFF_FFFF, 0x8000_0000]
        .into_iter()
        .enumerate()
    {
        let (env, dir) = env(23_100 + 10 * i as u16);
        let mut p = conformance::connect::<Shm>(&env, env.port, Default::default(), &[], &[])
            .expect("connect");
        let mr =
            p.b.pd
                .reg_region(&p.b.mem, 0, 65536, Access::LOCAL_WRITE | Access::MW_BIND)
                .expect("reg");
        let mw = p.b.pd.alloc_mw().expect("alloc_mw");
        let k = inc_rkey(mw.rkey());
        assert!(p.b.pd.inner.bind(&crate::pd::Bind {
            rkey: k,
            lkey: mr.lkey(),
            access: Access::REMOTE_WRITE,
            addr: mr.addr(),
            len: 4096,
        }));
        let key = if key == 0x100 { k ^ 0x100 } else { key };
        let c = crate::hostile_tests::victim_completion_pub(
            &mut p,
            &Inbound {
                kind: inbound_kind::SEND_INV,
                len: 0,
                bounce_end: 0,
                key,
                ..Inbound::default()
            },
        );
        assert_eq!(c.status, WcStatus::RemInvReqErr, "key {key:#x}: {c:?}");
        assert_eq!(c.invalidated, None);
        let kt = p.b.pd.inner.kt();
        assert!(kt.lookup(k).is_some(), "key {key:#x} revoked the window");
        assert!(kt.lookup(mr.lkey()).is_some());
        assert!(kt.lookup(p.b.mr.rkey()).is_some());
        drop(p);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Deregistering a region revokes the windows bound to it, and a dropped window's key
/// stops working.
#[test]
fn windows_die_with_their_region_and_when_dropped() {
    let (env, dir) = env(23_200);
    let mut p =
        conformance::connect::<Shm>(&env, env.port, Default::default(), &[], &[]).expect("connect");
    let mr =
        p.b.pd
            .reg_region(&p.b.mem, 0, 65536, Access::LOCAL_WRITE | Access::MW_BIND)
            .expect("reg");
    let mws: Vec<_> = (0..2)
        .map(|_| p.b.pd.alloc_mw().expect("alloc_mw"))
        .collect();
    let keys: Vec<u32> = mws.iter().map(|w| inc_rkey(w.rkey())).collect();
    for k in &keys {
        let op = SendOp::BindMw {
            rkey: *k,
            lkey: mr.lkey(),
            access: Access::REMOTE_WRITE,
            addr: mr.addr(),
            len: 4096,
        };
        p.b.qp
            .post_send(&[SendWr::signaled(1, op, &[])])
            .expect("bind");
        let (_, cb) = conformance::poll_n(&mut p, 0, 1).expect("bind completion");
        assert!(cb[0].is_ok(), "{:?}", cb[0]);
    }
    let kt = p.b.pd.inner.kt();
    assert!(keys.iter().all(|k| kt.lookup(*k).is_some()));
    let mut mws = mws;
    drop(mws.pop());
    assert!(
        kt.lookup(keys[1]).is_none(),
        "a dropped window's key still resolves"
    );
    assert!(kt.lookup(keys[0]).is_some());
    drop(mr);
    assert!(kt.lookup(keys[0]).is_none(), "a window outlived its region");
    // A write through it fails as any bad key does.
    let sge = [p.a.mr.sge(0, 8)];
    let to = RemoteAddr {
        addr: p.b.mem.as_ptr() as u64,
        rkey: keys[0],
    };
    p.a.qp
        .post_send(&[SendWr::signaled(2, SendOp::Write(to), &sge)])
        .expect("post");
    let (ca, _) = conformance::poll_n(&mut p, 1, 0).expect("write completion");
    assert_eq!(ca[0].status, WcStatus::RemAccessErr);
    drop(mws);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
