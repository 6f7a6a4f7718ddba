//! A peer that breaks the protocol through the memory it shares with us: each test connects
//! a pair, then has the active side (the "attacker") write impossible values into the
//! passive side's (the "victim's") queue-pair segment through its own mapping of it, as a
//! hostile or version-skewed process could. The victim must complete the affected receive
//! with an error and move the queue pair to the error state, never read outside its
//! segment, crash or hang.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;

use crate::qpseg::{Inbound, SLOT_INLINE, inbound_kind};
use crate::{Shm, ShmConfig, ShmDevice};
use dp_fabric::conformance::{self, Env, Pair};
use dp_fabric::{CompletionQueue, MemoryRegion, QpCaps, QpState, RcQueuePair, RecvWr, WcStatus};

pub(crate) fn pair(port: u16) -> (Pair<Shm>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("dp-hostile-{}-{port}", std::process::id()));
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
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let p = conformance::connect::<Shm>(&env, port, caps, &[], &[]).expect("connect");
    (p, dir)
}

/// Publishes `m` as inbound message `n` in the victim's segment, from the attacker's side,
/// and rings the victim's doorbell.
fn inject(p: &Pair<Shm>, n: u64, m: &Inbound) {
    let peer =
        p.a.qp
            .core
            .peer
            .get()
            .expect("attacker has the victim mapped");
    peer.view.push(n, m);
    // SAFETY: the doorbell mapping was validated when the peer was mapped.
    unsafe { &*peer.db_seg.as_ptr().cast::<crate::layout::Doorbell>() }.ring(peer.db_slot);
}

/// Posts one receive of the whole buffer on the victim and returns what polling its queue
/// yields for the injected message.
/// [`victim_completion`], for the other test modules.
pub(crate) fn victim_completion_pub(p: &mut Pair<Shm>, m: &Inbound) -> dp_fabric::Completion {
    victim_completion(p, m)
}

fn victim_completion(p: &mut Pair<Shm>, m: &Inbound) -> dp_fabric::Completion {
    let sge = [p.b.mr.sge(0, 8192)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sgl: &sge,
        }])
        .expect("post_recv");
    inject(p, 0, m);
    let mut out = [dp_fabric::Completion::default(); 4];
    for _ in 0..1_000_000 {
        let n = p.b.cq.poll(&mut out);
        if let Some(c) = out[..n].iter().find(|c| c.wr_id == 7) {
            return *c;
        }
    }
    panic!("the victim never completed the receive (a hang)");
}

fn assert_violation(p: &Pair<Shm>, c: &dp_fabric::Completion) {
    assert_eq!(c.status, WcStatus::LocQpOpErr, "{c:?}");
    assert_eq!(p.b.qp.state(), QpState::Error);
    // Relaxed: a statistic read after the completion that counted it.
    let malformed =
        p.b.qp
            .core
            .dev
            .stats
            .peer_violations
            .load(Ordering::Relaxed);
    assert!(malformed >= 1, "the violation was not counted");
}

/// A SEND whose payload, as the peer describes it, runs past the end of the bounce area
/// (and of the segment). Before the fix the victim copied it from beyond its mapping.
#[test]
fn test_send_past_the_bounce_area_is_a_violation() {
    let (mut p, dir) = pair(22_000);
    let cap = u64::from(p.b.qp.core.view.layout.bounce_len);
    let m = Inbound {
        kind: inbound_kind::SEND,
        imm: None,
        len: 8192,
        bounce_end: cap + 4096,
        ..Inbound::default()
    };
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// A SEND longer than the whole bounce area.
#[test]
fn test_send_longer_than_the_bounce_area_is_a_violation() {
    let (mut p, dir) = pair(22_010);
    let m = Inbound {
        kind: inbound_kind::SEND,
        imm: None,
        len: u32::MAX,
        bounce_end: u64::MAX,
        ..Inbound::default()
    };
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// A SEND whose payload starts before what the victim released already (the peer replays
/// old bounce bytes, or lies to read them again).
#[test]
fn test_send_before_the_released_bytes_is_a_violation() {
    let (mut p, dir) = pair(22_020);
    let m = Inbound {
        kind: inbound_kind::SEND,
        imm: None,
        len: 16,
        bounce_end: 8,
        ..Inbound::default()
    };
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// An inbound message of a kind the protocol does not have.
#[test]
fn test_unknown_inbound_kind_is_a_violation() {
    let (mut p, dir) = pair(22_030);
    let m = Inbound {
        kind: 0xdead,
        imm: Some(1),
        len: 4,
        bounce_end: 0,
        ..Inbound::default()
    };
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// An inline WRITE with immediate (placed by the victim when it polls) as the peer describes
/// it: `len` payload bytes for `key` at `addr`. The victim must check all three.
fn inline_write(len: u32, key: u32, addr: u64) -> Inbound {
    Inbound {
        kind: inbound_kind::WRITE_IMM_INLINE,
        imm: Some(5),
        len,
        key,
        addr,
        ..Inbound::default()
    }
}

/// An inline payload longer than a slot holds: the victim would copy from the next slot
/// (or past the slot array).
#[test]
fn test_inline_payload_longer_than_a_slot_is_a_violation() {
    let (mut p, dir) = pair(22_080);
    let to = p.b.remote(0);
    let m = inline_write(SLOT_INLINE as u32 + 1, to.rkey, to.addr);
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// An inline payload for a key the victim never issued (a stale generation).
#[test]
fn test_inline_payload_for_an_unknown_key_is_a_violation() {
    let (mut p, dir) = pair(22_090);
    let to = p.b.remote(0);
    let m = inline_write(16, to.rkey.wrapping_add(1 << 20), to.addr);
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// An inline payload that runs past the end of the registration its key names.
#[test]
fn test_inline_payload_past_its_registration_is_a_violation() {
    let (mut p, dir) = pair(22_100);
    let to = p.b.remote(p.b.mem.len() - 8);
    let m = inline_write(16, to.rkey, to.addr);
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// An inline payload for a registration of the victim's without a remote write right: the
/// key is real, but only for local use.
#[test]
fn test_inline_payload_to_a_local_only_key_is_a_violation() {
    use dp_fabric::{Access, ProtectionDomain};
    let (mut p, dir) = pair(22_110);
    let local =
        p.b.pd
            .reg_region(&p.b.mem, 0, 4096, Access::LOCAL_WRITE)
            .expect("register locally");
    let m = inline_write(16, local.lkey(), local.addr());
    let c = victim_completion(&mut p, &m);
    assert_violation(&p, &c);
    drop(local);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// An owner that claims to have released bounce bytes it was never sent: the sender fails
/// its request instead of waiting for room forever. The sender reads the owner's counter
/// only when its own copy shows too little room, so the lie is found by the SEND that
/// needs room the first one took: two SENDs of over half the bounce area each.
#[test]
fn test_bounce_release_ahead_of_the_sender_fails_the_send() {
    let (mut p, dir) = pair(22_040);
    let half = p.b.qp.core.view.layout.bounce_len / 2 + 4096;
    // The "victim" here is the active side's view of the passive side's segment: the
    // passive side writes bounce_tail there.
    p.b.qp
        .core
        .view
        .header()
        .bounce_tail
        .store(1 << 40, Ordering::Release);
    for (i, off) in [0, half].into_iter().enumerate() {
        let sge = [p.b.mr.sge(off as usize, half)];
        p.b.qp
            .post_recv(&[RecvWr {
                wr_id: i as u64,
                sgl: &sge,
            }])
            .expect("post_recv");
    }
    let src = [p.a.mr.sge(0, half)];
    let mut got = Vec::new();
    for wr_id in [8, 9] {
        p.a.qp
            .post_send(&[dp_fabric::SendWr::signaled(
                wr_id,
                dp_fabric::SendOp::Send,
                &src,
            )])
            .expect("post_send");
        let mut out = [dp_fabric::Completion::default(); 4];
        for _ in 0..1_000_000 {
            let n = p.a.cq.poll(&mut out);
            if let Some(c) = out[..n].iter().find(|c| c.wr_id == wr_id) {
                got.push(*c);
                break;
            }
        }
    }
    assert_eq!(
        got.len(),
        2,
        "the second send waited forever for room the peer lied about: {got:?}"
    );
    assert!(got[0].is_ok(), "the first send had room: {:?}", got[0]);
    assert!(!got[1].is_ok(), "{:?}", got[1]);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// A SEND whose payload the peer says rides in the slot but is longer than a slot holds:
/// the victim would copy from the next slot (or past the slot array).
#[test]
fn test_inline_send_longer_than_a_slot_is_a_violation() {
    for (port, kind) in [
        (22_045, inbound_kind::SEND_INLINE),
        (22_046, inbound_kind::SEND_IMM_INLINE),
        (22_047, inbound_kind::SEND_INV_INLINE),
    ] {
        let (mut p, dir) = pair(port);
        let m = Inbound {
            kind,
            imm: Some(3),
            len: SLOT_INLINE as u32 + 1,
            ..Inbound::default()
        };
        let c = victim_completion(&mut p, &m);
        assert_violation(&p, &c);
        drop(p);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Mappings in this process whose backing file is the one behind `addr`.
fn mappings_of_backing(addr: usize) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let field = |l: &str, i: usize| l.split_whitespace().nth(i).map(str::to_owned);
    let range = |l: &str| {
        let r = field(l, 0)?;
        let (a, b) = r.split_once('-')?;
        Some((
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        ))
    };
    let ino = maps
        .lines()
        .find(|l| range(l).is_some_and(|(a, b)| a <= addr && addr < b))
        .and_then(|l| field(l, 4))
        .expect("addr is mapped");
    assert_ne!(ino, "0", "{addr:#x} is anonymous memory");
    maps.lines()
        .filter(|l| field(l, 4).as_deref() == Some(ino.as_str()))
        .count()
}

/// A peer is given exactly the pages a key of its own protection domain names: two
/// registrations in two pages of one region, in two protection domains, each reach only
/// the peer of their own domain. (Before, the whole region's memfd went to both.)
#[test]
fn test_a_peer_gets_only_the_pages_of_its_domain() {
    use dp_fabric::{Access, ProtectionDomain};
    let (px, dx) = pair(22_050);
    let (py, dy) = pair(22_060);
    let page = crate::share::page_size();
    let r = std::sync::Arc::new(
        mempool::memory::Region::new(
            &mempool::memory::RegionConfig::new("t-isolation", 2 * page)
                .shareable(true)
                .no_huge()
                .quiet(),
        )
        .expect("region"),
    );
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mx =
        px.b.pd
            .reg_region(&r, 0, page, rw)
            .expect("register page 0 in X's domain");
    let my =
        py.b.pd
            .reg_region(&r, page, page, rw)
            .expect("register page 1 in Y's domain");
    let base = r.as_ptr() as usize;
    // Page 1: mapped by its owner and by Y's peer only.
    assert_eq!(
        mappings_of_backing(base + page),
        2,
        "page 1 reached a peer outside its domain"
    );
    assert_eq!(
        mappings_of_backing(base),
        2,
        "page 0 reached a peer outside its domain"
    );
    drop((mx, my));
    drop((px, py));
    let _ = std::fs::remove_dir_all(dx);
    let _ = std::fs::remove_dir_all(dy);
}

/// Peers only read a protection domain's key table: its memfd is sealed so that they
/// cannot map it writable.
#[test]
fn test_the_key_table_is_read_only_for_peers() {
    use std::os::fd::AsRawFd;
    let (p, dir) = pair(22_070);
    let kt = &p.b.pd.inner.kt_seg;
    let h = kt.share_handle().expect("key table memfd");
    // SAFETY: a fresh shared mapping of a descriptor we hold, as a peer would try it.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            h.len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            h.fd.as_raw_fd(),
            0,
        )
    };
    assert_eq!(
        m,
        libc::MAP_FAILED,
        "a peer could map the key table writable"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
