//! RDS's RDMA over the fabric transport on the shm provider: memory registration
//! (`RDS_GET_MR`, `RDS_FREE_MR`) in a node's RDMA window, and RDMA operations between two
//! nodes in one process, each driven by a `BlockingNode` progress thread in hybrid mode.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rds::engine::{GetMrArgs, cookie_key, cookie_offset};
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::{BlockingNode, RdsNode};
use dataplane::rds::uapi::*;
use dataplane::rds::{RdsConfig, RdsEngine, RdsError, RdsSocket, TransportSpec};
use lcore::PollMode;
use mempool::memory::{Region, RegionConfig};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dp-rds-rdma-{}-{tag}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 79, 0, last))
}

fn device(dir: &Path) -> ShmDevice {
    ShmDevice::open(ShmConfig {
        dir: Some(dir.to_path_buf()),
        ..ShmConfig::default()
    })
    .expect("shm device")
}

fn engine(addr: IpAddr, seed: u64) -> RdsEngine {
    let cfg = RdsConfig {
        name: format!("rds-rdma-{addr}"),
        transports: vec![TransportSpec::ib()],
        seed,
        wmem_max: 16 << 20,
        rmem_max: 16 << 20,
        ..RdsConfig::default()
    };
    let mut e = RdsEngine::new(cfg).expect("engine");
    e.add_local_addr(addr);
    e
}

/// A window of `len` bytes (normal pages in tests).
fn window(tag: &str, len: usize) -> Arc<Region> {
    Arc::new(
        Region::new(&RegionConfig::new(format!("rdma-win-{tag}"), len).quiet()).expect("window"),
    )
}

/// A node with an RDMA window (when `win` is given).
fn node(dir: &Path, addr: IpAddr, seed: u64, win: Option<Arc<Region>>) -> BlockingNode {
    let mut e = engine(addr, seed);
    let mut t =
        FabricTransport::<Shm>::new(device(dir), &e, FabricConfig::default()).expect("transport");
    if let Some(w) = win {
        t.expose_window(&mut e, w).expect("window exposed");
    }
    let mut n = RdsNode::new(e);
    n.add_transport(Box::new(t)).expect("transport added");
    BlockingNode::spawn(n, PollMode::hybrid_default(), "rds-rdma").expect("progress thread")
}

fn sock(n: &BlockingNode, at: SocketAddr) -> RdsSocket {
    n.with(|n, now| {
        let e = n.engine_mut();
        let s = e.socket().expect("socket");
        e.bind(s, at).expect("bind");
        e.set_sndbuf(now, s, 4 << 20).expect("SO_SNDBUF");
        e.set_rcvbuf(now, s, 4 << 20).expect("SO_RCVBUF");
        s
    })
}

fn errno<T: std::fmt::Debug>(r: Result<T, RdsError>) -> i32 {
    r.expect_err("an error").errno()
}

#[test]
fn test_get_mr_cookie_names_the_window_offset_and_free_mr_frees() {
    let d = dir("getmr");
    let w = window("getmr", 1 << 20);
    let base = w.as_ptr() as u64;
    let a = node(&d, ip(1), 1, Some(w.clone()));
    let s = sock(&a, SocketAddr::new(ip(1), 5000));
    let other = sock(&a, SocketAddr::new(ip(1), 5001));
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
    let d = dir("errs");
    let w = window("errs", 4 << 20);
    let base = w.as_ptr() as u64;
    let a = node(&d, ip(3), 3, Some(w.clone()));
    let s = sock(&a, SocketAddr::new(ip(3), 5000));
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
    let d = dir("nowin");
    let a = node(&d, ip(5), 5, None);
    let s = sock(&a, SocketAddr::new(ip(5), 5000));
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
    let d = dir("close");
    let w = window("close", 1 << 20);
    let base = w.as_ptr() as u64;
    let a = node(&d, ip(7), 7, Some(w.clone()));
    let s = sock(&a, SocketAddr::new(ip(7), 5000));
    let keep = sock(&a, SocketAddr::new(ip(7), 5001));
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
