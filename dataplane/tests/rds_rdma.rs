//! RDS's RDMA over the fabric transport on the shm provider: memory registration
//! (`RDS_GET_MR`, `RDS_FREE_MR`) in a node's RDMA window, and RDMA operations between two
//! nodes in one process, each driven by a `BlockingNode` progress thread in hybrid mode.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::rds::engine::RdmaNotify;
use dataplane::rds::engine::{GetMrArgs, cookie_key, cookie_offset};
use dataplane::rds::node::BlockingNode;
use dataplane::rds::uapi::*;
use dataplane::rds::{RdsError, RdsSocket, Received, SendCmsg, SendFlags};
use mempool::memory::{Region, RegionConfig};

mod common;
use common::rds::{Lab, sock};

/// Names `rds-rdma`, addresses in 10.79.0.0/24.
const LAB: Lab = Lab::new("rds-rdma", 79);

/// A window of `len` bytes (normal pages in tests).
fn window(tag: &str, len: usize) -> Arc<Region> {
    Arc::new(
        Region::new(&RegionConfig::new(format!("rdma-win-{tag}"), len).quiet()).expect("window"),
    )
}

fn errno<T: std::fmt::Debug>(r: Result<T, RdsError>) -> i32 {
    r.expect_err("an error").errno()
}

#[test]
fn test_get_mr_cookie_names_the_window_offset_and_free_mr_frees() {
    let d = LAB.dir("getmr");
    let w = window("getmr", 1 << 20);
    let base = w.as_ptr() as u64;
    let a = LAB.node_with_window(&d, LAB.ip(1), 1, w.clone());
    let s = sock(&a, SocketAddr::new(LAB.ip(1), 5000));
    let other = sock(&a, SocketAddr::new(LAB.ip(1), 5001));
    a.with(|n, now| {
        let e = n.engine_mut();
        // An unaligned start: the cookie's offset is the byte's offset in the window.
        let c = e
            .get_mr(s, base + 8192 + 100, 5000, RDS_RDMA_READWRITE)
            .expect("GET_MR inside the window");
        assert_eq!(cookie_offset(c), 8192 + 100);
        assert_ne!(cookie_key(c), 0);
        let c2 = e.get_mr(s, base + 65536, 4096, 0).expect("a second region");
        assert_ne!(cookie_key(c2), cookie_key(c), "each region has its own key");
        assert_eq!(e.mr_count(), 2);
        // Another socket cannot free it.
        assert_eq!(errno(e.free_mr(other, c, 0)), 22);
        // Cookie 0 flushes: nothing pending, success.
        assert_eq!(e.free_mr(s, 0, 0), Ok(()));
        assert_eq!(e.free_mr(s, c, RDS_RDMA_INVALIDATE), Ok(()));
        assert_eq!(errno(e.free_mr(s, c, 0)), 22, "freed twice: EINVAL");
        assert_eq!(e.mr_count(), 1);
        // Raw option bytes: exact lengths, and the cookie is returned (never written
        // through cookie_addr).
        let args = GetMrArgs {
            addr: base + 200_000,
            bytes: 64,
            cookie_addr: 0x1000,
            flags: 0,
        };
        let raw = args.to_bytes();
        assert_eq!(errno(e.get_mr_raw(s, RDS_GET_MR, &raw[..31])), 22);
        assert_eq!(
            errno(e.setsockopt_raw(now, s, SOL_RDS, RDS_GET_MR, &raw)),
            14,
            "cookie_addr is not written: EFAULT, nothing registered"
        );
        assert_eq!(e.mr_count(), 1);
        let (c3, at) = e.get_mr_raw(s, RDS_GET_MR, &raw).expect("raw GET_MR");
        assert_eq!((cookie_offset(c3), at), (200_000, 0x1000));
        let mut dest = [0u8; 160];
        dest[128..].copy_from_slice(&raw);
        let (c4, _) = e
            .get_mr_raw(s, RDS_GET_MR_FOR_DEST, &dest)
            .expect("GET_MR_FOR_DEST: the destination is ignored, as in Linux");
        assert_eq!(cookie_offset(c4), 200_000);
        assert_eq!(errno(e.get_mr_raw(s, RDS_GET_MR_FOR_DEST, &raw)), 22);
        let mut free = [0u8; 16];
        free[..8].copy_from_slice(&c3.to_ne_bytes());
        assert_eq!(errno(e.free_mr_raw(s, &free[..15])), 22);
        assert_eq!(e.free_mr_raw(s, &free), Ok(()));
        assert_eq!(e.mr_count(), 2);
    });
}

#[test]
fn test_get_mr_errors_as_linux() {
    let d = LAB.dir("errs");
    let w = window("errs", 4 << 20);
    let base = w.as_ptr() as u64;
    let a = LAB.node_with_window(&d, LAB.ip(3), 3, w.clone());
    let s = sock(&a, SocketAddr::new(LAB.ip(3), 5000));
    a.with(|n, _| {
        let e = n.engine_mut();
        let unbound = e.socket().unwrap();
        assert_eq!(
            errno(e.get_mr(unbound, base, 4096, 0)),
            107,
            "unbound: ENOTCONN"
        );
        assert_eq!(errno(e.get_mr(s, base, 0, 0)), 22, "empty: EINVAL");
        assert_eq!(errno(e.get_mr(s, u64::MAX - 8, 16, 0)), 22, "wraps: EINVAL");
        assert_eq!(
            errno(e.get_mr(s, base + 1, (1 << 20) + 4096, 0)),
            90,
            "258 pages: EMSGSIZE"
        );
        assert!(e.get_mr(s, base, (1 << 20) + 4096, 0).is_ok(), "257 pages");
        assert_eq!(
            errno(e.get_mr(s, base - 4096, 4096, 0)),
            14,
            "below the window: EFAULT"
        );
        assert_eq!(
            errno(e.get_mr(s, base + (4 << 20) - 10, 20, 0)),
            14,
            "across the window's end: EFAULT"
        );
        let heap = vec![0u8; 8192];
        assert_eq!(
            errno(e.get_mr(s, heap.as_ptr() as u64, 4096, 0)),
            14,
            "heap memory: EFAULT"
        );
    });
}

#[test]
fn test_get_mr_without_window_is_eopnotsupp() {
    let d = LAB.dir("nowin");
    let a = LAB.node(&d, LAB.ip(5), 5);
    let s = sock(&a, SocketAddr::new(LAB.ip(5), 5000));
    a.with(|n, _| {
        let e = n.engine_mut();
        assert_eq!(errno(e.get_mr(s, 4096, 4096, 0)), 95);
        assert_eq!(
            errno(e.free_mr(s, 0, 0)),
            22,
            "no transport to flush: EINVAL"
        );
    });
}

#[test]
fn test_close_frees_the_sockets_regions_and_revokes_their_keys() {
    let d = LAB.dir("close");
    let w = window("close", 1 << 20);
    let base = w.as_ptr() as u64;
    let a = LAB.node_with_window(&d, LAB.ip(7), 7, w.clone());
    let s = sock(&a, SocketAddr::new(LAB.ip(7), 5000));
    let keep = sock(&a, SocketAddr::new(LAB.ip(7), 5001));
    a.with(|n, now| {
        let e = n.engine_mut();
        e.get_mr(s, base, 4096, 0).unwrap();
        e.get_mr(s, base + 8192, 4096, RDS_RDMA_USE_ONCE).unwrap();
        let kept = e.get_mr(keep, base + 16384, 4096, 0).unwrap();
        assert_eq!(e.mr_count(), 3);
        e.close(now, s).unwrap();
        assert_eq!(e.mr_count(), 1, "the closed socket's regions are gone");
        assert_eq!(
            e.free_mr(keep, kept, 0),
            Ok(()),
            "the other socket's is intact"
        );
        assert_eq!(e.mr_count(), 0);
    });
}

/// Two nodes with windows of 4 MiB, and a socket on each.
struct Pair {
    a: BlockingNode,
    b: BlockingNode,
    wa: Arc<Region>,
    wb: Arc<Region>,
    sa: RdsSocket,
    sb: RdsSocket,
    at_a: SocketAddr,
    at_b: SocketAddr,
}

fn pair(tag: &str, a_ip: u8, b_ip: u8) -> Pair {
    let d = LAB.dir(tag);
    let wa = window(&format!("{tag}-a"), 4 << 20);
    let wb = window(&format!("{tag}-b"), 4 << 20);
    let a = LAB.node_with_window(&d, LAB.ip(a_ip), u64::from(a_ip), wa.clone());
    let b = LAB.node_with_window(&d, LAB.ip(b_ip), u64::from(b_ip), wb.clone());
    let at_a = SocketAddr::new(LAB.ip(a_ip), 6000);
    let at_b = SocketAddr::new(LAB.ip(b_ip), 6001);
    let sa = sock(&a, at_a);
    let sb = sock(&b, at_b);
    Pair {
        a,
        b,
        wa,
        wb,
        sa,
        sb,
        at_a,
        at_b,
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn base(w: &Region) -> u64 {
    w.as_ptr() as u64
}

/// `RDS_CMSG_RDMA_ARGS` for `len` bytes at `local` (an offset in `w`) and the peer's
/// region `cookie`.
fn rdma_args(
    w: &Region,
    local: usize,
    len: usize,
    cookie: u64,
    flags: u64,
    token: u64,
) -> SendCmsg {
    SendCmsg::RdmaArgs {
        cookie,
        remote_addr: 0,
        remote_bytes: len as u64,
        nr_local: 1,
        local_addr: base(w) + local as u64,
        local_bytes: len as u64,
        flags,
        user_token: token,
    }
}

fn send(n: &BlockingNode, s: RdsSocket, to: SocketAddr, data: &[u8], cmsgs: &[SendCmsg]) {
    let r = n.with(|n, now| {
        n.engine_mut()
            .send_msg(now, s, Some(to), data, cmsgs, SendFlags::DONTWAIT)
    });
    assert_eq!(r, Ok(data.len()), "send_msg");
}

/// The next message (skipping nothing else: a notification here is a failure).
fn recv_data(n: &BlockingNode, s: RdsSocket) -> Vec<u8> {
    let mut buf = vec![0u8; 1 << 16];
    match n.recv_from(s, &mut buf, Some(Duration::from_secs(20))) {
        Ok(Received::Data { len, .. }) => buf[..len].to_vec(),
        other => panic!("expected a message, got {other:?}"),
    }
}

/// The next RDMA notification (messages before it are a failure).
fn recv_status(n: &BlockingNode, s: RdsSocket) -> RdmaNotify {
    let mut buf = [0u8; 64];
    match n.recv_from(s, &mut buf, Some(Duration::from_secs(20))) {
        Ok(Received::RdmaStatus(st)) => st,
        other => panic!("expected an RDMA notification, got {other:?}"),
    }
}

#[test]
fn test_rdma_write_lands_before_the_message_and_notifies_the_sender() {
    let p = pair("write", 11, 12);
    let len = 100_000;
    let (loff, roff) = (8192 + 7, 65536 + 3);
    let cookie = p.b.with(|n, _| {
        n.engine_mut()
            .get_mr(
                p.sb,
                base(&p.wb) + roff as u64,
                len as u64,
                RDS_RDMA_READWRITE,
            )
            .unwrap()
    });
    let data = pattern(5, len);
    p.wa.copy_in(loff, &data);
    let args = rdma_args(
        &p.wa,
        loff,
        len,
        cookie,
        RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
        77,
    );
    send(&p.a, p.sa, p.at_b, b"written", &[args]);
    // The header arrives after the data: when the message is here, so are the bytes.
    assert_eq!(recv_data(&p.b, p.sb), b"written");
    let mut got = vec![0u8; len];
    p.wb.copy_out(roff, &mut got);
    assert!(got == data, "the RDMA WRITE placed the sender's bytes");
    assert_eq!(
        recv_status(&p.a, p.sa),
        RdmaNotify {
            user_token: 77,
            status: RDS_RDMA_SUCCESS
        }
    );
    let st = p.a.with(|n, _| n.engine().stats().clone());
    assert_eq!((st.send_rdma, st.send_rdma_bytes), (1, len as u64));
    // No notification without NOTIFY_ME: the next receive is the peer's reply.
    let args = rdma_args(&p.wa, loff, 16, cookie, RDS_RDMA_READWRITE, 78);
    send(&p.a, p.sa, p.at_b, b"quiet", &[args]);
    assert_eq!(recv_data(&p.b, p.sb), b"quiet");
    send(&p.b, p.sb, p.at_a, b"reply", &[]);
    assert_eq!(recv_data(&p.a, p.sa), b"reply");
}

#[test]
fn test_rdma_read_fetches_the_peers_bytes() {
    let p = pair("read", 13, 14);
    let len = 5000;
    let data = pattern(9, len);
    p.wb.copy_in(300_000, &data);
    let cookie = p.b.with(|n, _| {
        n.engine_mut()
            .get_mr(p.sb, base(&p.wb) + 300_000, len as u64, 0)
            .unwrap()
    });
    // A READ (no READWRITE flag) of a read-only region into our window.
    let args = rdma_args(&p.wa, 1_000_000, len, cookie, RDS_RDMA_NOTIFY_ME, 5);
    send(&p.a, p.sa, p.at_b, b"", &[args]);
    assert_eq!(
        recv_data(&p.b, p.sb),
        b"",
        "a zero-length message carries the op"
    );
    assert_eq!(recv_status(&p.a, p.sa).status, RDS_RDMA_SUCCESS);
    let mut got = vec![0u8; len];
    p.wa.copy_out(1_000_000, &mut got);
    assert!(got == data, "the RDMA READ fetched the peer's bytes");
}

#[test]
fn test_use_once_region_is_freed_when_the_header_arrives() {
    let p = pair("once", 15, 16);
    let (c1, c2) = p.b.with(|n, _| {
        let e = n.engine_mut();
        let once = e
            .get_mr(
                p.sb,
                base(&p.wb),
                4096,
                RDS_RDMA_READWRITE | RDS_RDMA_USE_ONCE,
            )
            .unwrap();
        let kept = e
            .get_mr(p.sb, base(&p.wb) + 8192, 4096, RDS_RDMA_READWRITE)
            .unwrap();
        (once, kept)
    });
    let args = rdma_args(&p.wa, 0, 64, c1, RDS_RDMA_READWRITE, 1);
    send(&p.a, p.sa, p.at_b, b"once", &[args]);
    assert_eq!(recv_data(&p.b, p.sb), b"once");
    p.b.with(|n, _| {
        let e = n.engine_mut();
        assert_eq!(e.mr_count(), 1, "the use-once region is gone");
        assert_eq!(e.stats().rdma_use_once_freed, 1);
        assert_eq!(e.free_mr(p.sb, c1, 0).map_err(|e| e.errno()), Err(22));
        assert_eq!(e.free_mr(p.sb, c2, 0), Ok(()), "the other region stayed");
    });
}

#[test]
fn test_bad_cookie_costs_the_message_and_that_connection_only() {
    let p = pair("bad", 17, 18);
    let cookie = p.b.with(|n, _| {
        n.engine_mut()
            .get_mr(p.sb, base(&p.wb) + 4096, 4096, RDS_RDMA_READWRITE)
            .unwrap()
    });
    // Traffic first, so the connection is up and has history.
    send(&p.a, p.sa, p.at_b, b"before", &[]);
    assert_eq!(recv_data(&p.b, p.sb), b"before");
    // A key the peer never gave: the WRITE fails at the peer's memory.
    let forged = cookie ^ 0x00ff_0000;
    let args = rdma_args(
        &p.wa,
        0,
        128,
        forged,
        RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
        9,
    );
    send(&p.a, p.sa, p.at_b, b"forged", &[args]);
    send(&p.a, p.sa, p.at_b, b"after", &[]);
    assert_eq!(
        recv_status(&p.a, p.sa),
        RdmaNotify {
            user_token: 9,
            status: RDS_RDMA_REMOTE_ERROR
        }
    );
    // The connection was reset and came back: the next message arrives, the forged one
    // never does (RDMA messages are not retransmitted).
    assert_eq!(recv_data(&p.b, p.sb), b"after");
    // Past the region's end, and a write into a read-only region: refused the same way.
    let ro = p.b.with(|n, _| {
        n.engine_mut()
            .get_mr(p.sb, base(&p.wb) + 65536, 4096, 0)
            .unwrap()
    });
    for (c, off, tok) in [(cookie, 4096u64, 10u64), (ro, 0, 11)] {
        let mut args = rdma_args(
            &p.wa,
            0,
            128,
            c,
            RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
            tok,
        );
        if let SendCmsg::RdmaArgs { remote_addr, .. } = &mut args {
            *remote_addr = off;
        }
        send(&p.a, p.sa, p.at_b, b"refused", &[args]);
        assert_eq!(
            recv_status(&p.a, p.sa),
            RdmaNotify {
                user_token: tok,
                status: RDS_RDMA_REMOTE_ERROR
            }
        );
    }
    let st = p.a.with(|n, _| n.engine().stats().clone());
    assert_eq!(st.send_rdma_failed, 3);
    // The good cookie still works after all that.
    let args = rdma_args(
        &p.wa,
        0,
        128,
        cookie,
        RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
        12,
    );
    send(&p.a, p.sa, p.at_b, b"good", &[args]);
    assert_eq!(recv_status(&p.a, p.sa).status, RDS_RDMA_SUCCESS);
    loop {
        let m = recv_data(&p.b, p.sb);
        if m == b"good" {
            break;
        }
        assert_ne!(m, b"refused", "a failed RDMA message is never delivered");
    }
}

#[test]
fn test_rdma_args_checks_in_linux_order_and_cancel_notifies() {
    let d = LAB.dir("args");
    let w = window("args", 1 << 20);
    let a = LAB.node_with_window(&d, LAB.ip(21), 21, w.clone());
    let s = sock(&a, SocketAddr::new(LAB.ip(21), 6000));
    let _s2 = sock(&a, SocketAddr::new(LAB.ip(21), 6002));
    // Nobody serves 10.79.0.99: messages to it stay queued.
    let nowhere = SocketAddr::new(LAB.ip(99), 6001);
    let good = rdma_args(
        &w,
        0,
        4096,
        0x1234,
        RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
        42,
    );
    let with = |f: &dyn Fn(&mut SendCmsg)| {
        let mut c = good;
        f(&mut c);
        c
    };
    let try_send = |cmsgs: &[SendCmsg], to: SocketAddr| {
        a.with(|n, now| {
            n.engine_mut()
                .send_msg(now, s, Some(to), b"x", cmsgs, SendFlags::DONTWAIT)
                .map_err(|e| e.errno())
        })
    };
    let set = |c: &mut SendCmsg, nr: u64, laddr: Option<u64>, lbytes: Option<u64>| {
        if let SendCmsg::RdmaArgs {
            nr_local,
            local_addr,
            local_bytes,
            ..
        } = c
        {
            *nr_local = nr;
            if let Some(x) = laddr {
                *local_addr = x;
            }
            if let Some(x) = lbytes {
                *local_bytes = x;
            }
        }
    };
    assert_eq!(try_send(&[good, good], nowhere), Err(22), "two RDMA_ARGS");
    assert_eq!(
        try_send(&[with(&|c| set(c, 1025, None, None))], nowhere),
        Err(90),
        "nr_local above UIO_MAXIOV: EMSGSIZE"
    );
    assert_eq!(
        try_send(&[with(&|c| set(c, 0, None, None))], nowhere),
        Err(22)
    );
    assert_eq!(
        try_send(&[with(&|c| set(c, 2, None, None))], nowhere),
        Err(22)
    );
    assert_eq!(
        try_send(&[with(&|c| set(c, 1, None, Some(0)))], nowhere),
        Err(22),
        "empty local range"
    );
    assert_eq!(
        try_send(
            &[with(&|c| set(c, 1, Some(base(&w) + (1 << 20) - 100), None))],
            nowhere
        ),
        Err(14),
        "local range past the window: EFAULT"
    );
    let heap = vec![0u8; 4096];
    assert_eq!(
        try_send(
            &[with(&|c| set(c, 1, Some(heap.as_ptr() as u64), None))],
            nowhere
        ),
        Err(14),
        "local range on the heap: EFAULT"
    );
    let mut longer = good;
    if let SendCmsg::RdmaArgs { remote_bytes, .. } = &mut longer {
        *remote_bytes = 100;
    }
    assert_eq!(
        try_send(&[longer], nowhere),
        Err(22),
        "local longer than remote"
    );
    assert_eq!(
        try_send(&[SendCmsg::Atomic(RDS_CMSG_ATOMIC_FADD)], nowhere),
        Err(95),
        "no atomics in the fabric"
    );
    assert_eq!(
        try_send(&[good], SocketAddr::new(LAB.ip(21), 6002)),
        Err(95),
        "RDMA to an address of this node"
    );
    // Accepted, queued (nobody answers), then cancelled: RDS_RDMA_CANCELED.
    assert_eq!(try_send(&[good], nowhere), Ok(1));
    a.with(|n, now| n.engine_mut().cancel_sent_to(now, s, nowhere))
        .unwrap();
    assert_eq!(
        recv_status(&a, s),
        RdmaNotify {
            user_token: 42,
            status: RDS_RDMA_CANCELED
        }
    );
}

#[test]
fn test_rdma_dest_and_map_offer_a_region_the_peer_then_writes() {
    let p = pair("dest", 23, 24);
    // B offers a region it registered (RDMA_DEST), then one mapped on the fly (RDMA_MAP).
    let c = p.b.with(|n, _| {
        n.engine_mut()
            .get_mr(p.sb, base(&p.wb) + 40_000, 1000, RDS_RDMA_READWRITE)
            .unwrap()
    });
    send(&p.b, p.sb, p.at_a, b"dest", &[SendCmsg::RdmaDest(c)]);
    let map = SendCmsg::RdmaMap {
        addr: base(&p.wb) + 200_000,
        bytes: 512,
        flags: RDS_RDMA_READWRITE | RDS_RDMA_USE_ONCE,
    };
    send(&p.b, p.sb, p.at_a, b"map", &[map]);
    assert_eq!(p.b.with(|n, _| n.engine().mr_count()), 2, "MAP registered");
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while got.len() < 2 {
        match p.a.recv_from(p.sa, &mut buf, Some(Duration::from_secs(20))) {
            Ok(Received::Data { len, rdma_dest, .. }) => got.push((buf[..len].to_vec(), rdma_dest)),
            other => panic!("expected a message, got {other:?}"),
        }
    }
    assert_eq!(got[0], (b"dest".to_vec(), Some(c)), "RDS_CMSG_RDMA_DEST");
    let mapped = got[1].1.expect("the mapped region's cookie");
    assert_eq!(got[1].0, b"map");
    assert_eq!(cookie_offset(mapped), 200_000);
    // A uses both cookies.
    let data = pattern(3, 512);
    p.wa.copy_in(0, &data);
    for (ck, tok) in [(c, 1u64), (mapped, 2)] {
        let args = rdma_args(
            &p.wa,
            0,
            512,
            ck,
            RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
            tok,
        );
        send(&p.a, p.sa, p.at_b, b"w", &[args]);
        assert_eq!(recv_status(&p.a, p.sa).status, RDS_RDMA_SUCCESS);
        assert_eq!(recv_data(&p.b, p.sb), b"w");
    }
    let mut back = vec![0u8; 512];
    p.wb.copy_out(200_000, &mut back);
    assert!(back == data);
    p.wb.copy_out(40_000, &mut back);
    assert!(back == data);
    // The use-once mapped region went with A's header; the DEST one stays.
    assert_eq!(p.b.with(|n, _| n.engine().mr_count()), 1);
    // Errors: a cookie the socket does not own, two offers in one message.
    let r = p.b.with(|n, now| {
        let e = n.engine_mut();
        let foreign = e.send_msg(
            now,
            p.sb,
            Some(p.at_a),
            b"x",
            &[SendCmsg::RdmaDest(c ^ 0x0100)],
            SendFlags::DONTWAIT,
        );
        let twice = e.send_msg(
            now,
            p.sb,
            Some(p.at_a),
            b"x",
            &[SendCmsg::RdmaDest(c), SendCmsg::RdmaDest(c)],
            SendFlags::DONTWAIT,
        );
        (foreign.map_err(|e| e.errno()), twice.map_err(|e| e.errno()))
    });
    assert_eq!(r, (Err(22), Err(22)));
}
