//! The shm provider between processes: a data exchange in both directions, a peer that
//! dies (SIGKILL) seen by the survivor as a disconnect with flushed work, and a memory
//! window a peer writes through and invalidates remotely.
//!
//! Each test re-executes this test binary as the peer process (`DP_SHM_CHILD` selects the
//! role), so nothing outside the test harness is needed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dp_fabric::conformance::{WAIT, buffer};
use dp_fabric::{
    Access, CmChannel, CmEvent, Completion, CompletionQueue, ConnRequest, Device, MemoryRegion,
    MemoryWindow, ProtectionDomain, QpCaps, QpInit, RcQueuePair, RecvWr, RemoteAddr, SendOp,
    SendWr, WcOpcode, WcStatus, inc_rkey,
};
use dp_shm::{Shm, ShmConfig, ShmDevice};
use mempool::memory::Region;

const ROLE: &str = "DP_SHM_CHILD";
const N: u64 = 10_000;

fn dir() -> PathBuf {
    std::env::var_os("DP_SHM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dp-proc-{}", std::process::id())))
}

fn device() -> ShmDevice {
    ShmDevice::open(ShmConfig {
        dir: Some(dir()),
        ..ShmConfig::default()
    })
    .expect("open shm device")
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 9, 8, 7)), port)
}

fn spawn_child(test: &str, role: &str, port: u16) -> Child {
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("DP_SHM_TEST_DIR", dir())
        .env("DP_SHM_TEST_PORT", port.to_string())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        ..QpCaps::default()
    }
}

fn rkey_pdata(mr: &impl MemoryRegion) -> Vec<u8> {
    let mut v = mr.addr().to_le_bytes().to_vec();
    v.extend_from_slice(&mr.rkey().to_le_bytes());
    v
}

fn parse_rkey(p: &[u8]) -> RemoteAddr {
    RemoteAddr {
        addr: u64::from_le_bytes(p[..8].try_into().expect("8 bytes")),
        rkey: u32::from_le_bytes(p[8..12].try_into().expect("4 bytes")),
    }
}

fn read_u64(mem: &Region, off: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        // A volatile byte read inside the live region (off + 8 <= len asserted by callers).
        *x = volatile_read(mem, off + i);
    }
    u64::from_le_bytes(b)
}

fn volatile_read(mem: &Region, i: usize) -> u8 {
    mem.load_u8(i)
}

fn wait_event(cm: &mut <Shm as dp_fabric::Provider>::Cm) -> CmEvent<Shm> {
    cm.wait_event(Some(WAIT))
        .expect("CM event within the wait bound")
}

/// Child of `cross_process_exchange`: connects, then echoes every SEND back as a WRITE
/// with immediate into the parent's buffer.
fn echo_child() {
    let port: u16 = std::env::var("DP_SHM_TEST_PORT").unwrap().parse().unwrap();
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let (mem, mr) = buffer::<Shm>(&pd, 1 << 20).unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (_conn, mut qp) = cm.connect(addr(port), &init, &rkey_pdata(&mr)).unwrap();
    let peer = match wait_event(&mut cm) {
        CmEvent::Established { private_data, .. } => parse_rkey(private_data.as_bytes()),
        e => panic!("child: expected Established, got {e:?}"),
    };
    for i in 0..128u64 {
        let s = [mr.sge((i % 128) as usize * 8, 8)];
        qp.post_recv(&[RecvWr { wr_id: i, sgl: &s }]).unwrap();
    }
    let mut out = [Completion::default(); 32];
    let mut echoed = 0u64;
    let t0 = Instant::now();
    while echoed < N {
        let n = cq.poll(&mut out);
        for c in &out[..n] {
            assert!(c.is_ok(), "child completion {c:?}");
            if c.opcode != WcOpcode::Recv {
                continue;
            }
            let slot = (c.wr_id % 128) as usize;
            let v = read_u64(&mem, slot * 8);
            assert_eq!(v, echoed, "child: SEND {echoed} carried {v}");
            let s = [mr.sge(slot * 8, 8)];
            let dst = RemoteAddr {
                addr: peer.addr + (echoed % 1024) * 8,
                rkey: peer.rkey,
            };
            qp.post_send(&[SendWr::signaled(
                echoed,
                SendOp::WriteImm(dst, echoed as u32),
                &s,
            )])
            .unwrap();
            qp.post_recv(&[RecvWr {
                wr_id: c.wr_id,
                sgl: &s,
            }])
            .unwrap();
            echoed += 1;
        }
        assert!(t0.elapsed() < WAIT * 3, "child timed out at {echoed}");
    }
    // Drain our send completions, then wait for the parent's disconnect.
    loop {
        match cm.wait_event(Some(WAIT)) {
            Some(CmEvent::Disconnected { .. }) | None => break,
            Some(_) => {}
        }
        let _ = cq.poll(&mut out);
    }
    drop(mem);
}

#[test]
fn cross_process_exchange() {
    if std::env::var(ROLE).as_deref() == Ok("echo") {
        echo_child();
        return;
    }
    let port = 7001;
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let (mem, mr) = buffer::<Shm>(&pd, 1 << 20).unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    cm.listen(addr(port), 8).unwrap();
    let mut child = spawn_child("cross_process_exchange", "echo", port);
    let req = match wait_event(&mut cm) {
        CmEvent::ConnectRequest { request, .. } => request,
        e => panic!("expected ConnectRequest, got {e:?}"),
    };
    let peer = parse_rkey(req.private_data());
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (conn, mut qp) = cm.accept(req, &init, &rkey_pdata(&mr)).unwrap();
    match wait_event(&mut cm) {
        CmEvent::Established { .. } => {}
        e => panic!("expected Established, got {e:?}"),
    }
    let _ = peer;
    for i in 0..128u64 {
        qp.post_recv(&[RecvWr { wr_id: i, sgl: &[] }]).unwrap();
    }
    let mut out = [Completion::default(); 32];
    let (mut sent, mut got) = (0u64, 0u64);
    let t0 = Instant::now();
    while got < N {
        while sent < N && sent < got + 64 {
            let v = sent.to_le_bytes();
            qp.post_send(&[SendWr::inline(u64::MAX, SendOp::Send, &v)])
                .unwrap();
            sent += 1;
        }
        let n = cq.poll(&mut out);
        for c in &out[..n] {
            assert!(c.is_ok(), "parent completion {c:?}");
            if c.opcode == WcOpcode::RecvRdmaWithImm {
                assert_eq!(c.imm, Some(got as u32), "echo out of order");
                let v = read_u64(&mem, (got % 1024) as usize * 8);
                assert_eq!(
                    v, got,
                    "echoed data for {got} not visible at its completion"
                );
                got += 1;
                qp.post_recv(&[RecvWr {
                    wr_id: c.wr_id,
                    sgl: &[],
                }])
                .unwrap();
            }
        }
        assert!(t0.elapsed() < WAIT * 3, "parent timed out at {got}/{N}");
    }
    cm.disconnect(conn).unwrap();
    let status = child.wait().expect("wait child");
    assert!(status.success(), "child failed: {status}");
    drop(Arc::new(()));
}

/// Child of `peer_death_is_seen`: connects, then waits to be killed.
fn victim_child() {
    let port: u16 = std::env::var("DP_SHM_TEST_PORT").unwrap().parse().unwrap();
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let (_mem, mr) = buffer::<Shm>(&pd, 1 << 16).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (_conn, _qp) = cm.connect(addr(port), &init, &rkey_pdata(&mr)).unwrap();
    let _ = wait_event(&mut cm);
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn peer_death_is_seen() {
    if std::env::var(ROLE).as_deref() == Ok("victim") {
        victim_child();
        return;
    }
    let port = 7002;
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let (_mem, mr) = buffer::<Shm>(&pd, 1 << 16).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    cm.listen(addr(port), 8).unwrap();
    let mut child = spawn_child("peer_death_is_seen", "victim", port);
    let req = match wait_event(&mut cm) {
        CmEvent::ConnectRequest { request, .. } => request,
        e => panic!("expected ConnectRequest, got {e:?}"),
    };
    let peer = parse_rkey(req.private_data());
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (conn, mut qp) = cm.accept(req, &init, &[]).unwrap();
    assert!(matches!(wait_event(&mut cm), CmEvent::Established { .. }));
    for i in 0..4 {
        qp.post_recv(&[RecvWr {
            wr_id: 10 + i,
            sgl: &[],
        }])
        .unwrap();
    }
    // The peer is alive: a WRITE into its memory succeeds.
    let s = [mr.sge(0, 8)];
    qp.post_send(&[SendWr::signaled(1, SendOp::Write(peer), &s)])
        .unwrap();
    let mut out = [Completion::default(); 8];
    let t0 = Instant::now();
    while cq.poll(&mut out[..1]) == 0 {
        assert!(t0.elapsed() < WAIT, "write to a live peer did not complete");
    }
    assert!(out[0].is_ok(), "write to a live peer: {:?}", out[0]);

    child.kill().expect("SIGKILL the peer");
    let killed = Instant::now();
    let _ = child.wait();
    match wait_event(&mut cm) {
        CmEvent::Disconnected { conn: c } => assert_eq!(c, conn),
        e => panic!("expected Disconnected after the peer died, got {e:?}"),
    }
    println!("peer death noticed {:?} after SIGKILL", killed.elapsed());
    assert!(
        dev.stats()
            .peer_deaths
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    // Everything outstanding is flushed, and new work fails.
    let mut flushed = Vec::new();
    qp.post_send(&[SendWr::signaled(2, SendOp::Write(peer), &s)])
        .unwrap();
    let t0 = Instant::now();
    while flushed.len() < 5 {
        let n = cq.poll(&mut out);
        flushed.extend_from_slice(&out[..n]);
        assert!(t0.elapsed() < WAIT, "flush incomplete: {flushed:?}");
    }
    for c in &flushed {
        assert!(
            matches!(c.status, WcStatus::WrFlushErr | WcStatus::RetryExcErr),
            "after peer death: {c:?}"
        );
    }
}

/// Child of `window_across_processes`: learns the parent's window (address and key) from
/// a SEND, writes through it, invalidates it with a SEND with invalidate, waits for the
/// parent's acknowledgement and then finds the key refused.
fn window_child() {
    let port: u16 = std::env::var("DP_SHM_TEST_PORT").unwrap().parse().unwrap();
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let (mem, mr) = buffer::<Shm>(&pd, 1 << 16).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (_conn, mut qp) = cm.connect(addr(port), &init, &[]).unwrap();
    assert!(matches!(wait_event(&mut cm), CmEvent::Established { .. }));
    let rs = [mr.sge(0, 12)];
    qp.post_recv(&[RecvWr { wr_id: 1, sgl: &rs }]).unwrap();
    qp.post_recv(&[RecvWr { wr_id: 2, sgl: &[] }]).unwrap();
    let mut out = [Completion::default(); 8];
    let mut next = |cq: &mut <Shm as dp_fabric::Provider>::Cq| -> Completion {
        let t0 = Instant::now();
        loop {
            if cq.poll(&mut out[..1]) == 1 {
                return out[0];
            }
            assert!(t0.elapsed() < WAIT, "child: no completion");
        }
    };
    let c = next(&mut cq);
    assert!(c.is_ok() && c.wr_id == 1, "child: window description {c:?}");
    let mut d = [0u8; 12];
    for (i, b) in d.iter_mut().enumerate() {
        *b = mem.load_u8(i);
    }
    let win = parse_rkey(&d);
    for i in 0..64 {
        mem.store_u8(1024 + i, (i as u8) ^ 0xA5);
    }
    let s = [mr.sge(1024, 64)];
    qp.post_send(&[SendWr::signaled(10, SendOp::WriteImm(win, 1), &s)])
        .unwrap();
    let c = next(&mut cq);
    assert!(
        c.is_ok() && c.wr_id == 10,
        "child: write through the window {c:?}"
    );
    qp.post_send(&[SendWr::inline(11, SendOp::SendInv(win.rkey), &[])])
        .unwrap();
    let c = next(&mut cq);
    assert!(
        c.is_ok() && c.wr_id == 11,
        "child: SEND with invalidate {c:?}"
    );
    let c = next(&mut cq);
    assert!(c.is_ok() && c.wr_id == 2, "child: acknowledgement {c:?}");
    qp.post_send(&[SendWr::signaled(12, SendOp::Write(win), &s)])
        .unwrap();
    let c = next(&mut cq);
    assert_eq!(
        (c.wr_id, c.status),
        (12, WcStatus::RemAccessErr),
        "child: write through the invalidated window"
    );
    loop {
        match cm.wait_event(Some(WAIT)) {
            Some(CmEvent::Disconnected { .. }) | None => break,
            Some(_) => {}
        }
    }
}

/// A memory window between two processes: the peer writes through it, invalidates it
/// remotely (our receive names the key), and then its key is refused.
#[test]
fn window_across_processes() {
    if std::env::var(ROLE).as_deref() == Ok("window") {
        window_child();
        return;
    }
    let port = 7003;
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let (mem, _mr) = buffer::<Shm>(&pd, 1 << 16).unwrap();
    let bind_mr = pd
        .reg_region(&mem, 0, 1 << 16, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();
    let mw = pd.alloc_mw().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut cm = dev.create_cm_channel().unwrap();
    cm.listen(addr(port), 8).unwrap();
    let mut child = spawn_child("window_across_processes", "window", port);
    let req = match wait_event(&mut cm) {
        CmEvent::ConnectRequest { request, .. } => request,
        e => panic!("expected ConnectRequest, got {e:?}"),
    };
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (conn, mut qp) = cm.accept(req, &init, &[]).unwrap();
    assert!(matches!(wait_event(&mut cm), CmEvent::Established { .. }));
    qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[] }]).unwrap();
    qp.post_recv(&[RecvWr { wr_id: 2, sgl: &[] }]).unwrap();
    let key = inc_rkey(mw.rkey());
    let win_addr = bind_mr.addr() + 8192;
    let bind = SendOp::BindMw {
        rkey: key,
        lkey: bind_mr.lkey(),
        access: Access::REMOTE_WRITE,
        addr: win_addr,
        len: 4096,
    };
    let mut desc = win_addr.to_le_bytes().to_vec();
    desc.extend_from_slice(&key.to_le_bytes());
    // The bind is unsignalled: the SEND after it completes only once it has executed.
    qp.post_send(&[
        SendWr {
            wr_id: 20,
            op: bind,
            payload: dp_fabric::Payload::Sgl(&[]),
            flags: dp_fabric::SendFlags::NONE,
        },
        SendWr::inline(21, SendOp::Send, &desc),
    ])
    .unwrap();
    let mut out = [Completion::default(); 8];
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < 3 {
        let n = cq.poll(&mut out);
        got.extend_from_slice(&out[..n]);
        assert!(t0.elapsed() < WAIT, "parent: got {got:?}");
    }
    let by = |id: u64| *got.iter().find(|c| c.wr_id == id).expect("completion");
    assert!(by(21).is_ok(), "{:?}", by(21));
    let w = by(1);
    assert_eq!(
        (w.status, w.opcode, w.imm),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm, Some(1))
    );
    for i in 0..64 {
        assert_eq!(mem.load_u8(8192 + i), (i as u8) ^ 0xA5, "byte {i}");
    }
    let inv = by(2);
    assert_eq!(
        (inv.status, inv.opcode, inv.invalidated),
        (WcStatus::Success, WcOpcode::Recv, Some(key)),
        "{inv:?}"
    );
    qp.post_send(&[SendWr::inline(22, SendOp::Send, &[])])
        .unwrap();
    let status = child.wait().expect("wait child");
    assert!(status.success(), "child failed: {status}");
    cm.disconnect(conn).unwrap();
}
