//! A provider conformance suite, generic over [`Provider`].
//!
//! Each `check_*` function sets up what it needs on two devices (which may be the same
//! physical device) and returns `Err(description)` on the first deviation from verbs
//! semantics. [`conformance_tests!`](crate::conformance_tests) expands them into `#[test]`s
//! for one provider; the shm provider runs them always, the verbs provider when
//! `DP_TEST_DEVICE` names a device.
//!
//! All waits are bounded; nothing here depends on timing to pass.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mempool::memory::{Region, RegionConfig};

use crate::error::PostErrorKind;
use crate::traits::{
    CmChannel, CmEvent, CompletionQueue, ConnId, ConnRequest, Device, MemoryRegion, MemoryWindow,
    ProtectionDomain, Provider, QpInit, RcQueuePair, UdQueuePair, UdSendWr,
};
use crate::types::{
    Access, Completion, GRH_LEN, Payload, QpCaps, QpState, RecvWr, RemoteAddr, SendFlags, SendOp,
    SendWr, WcOpcode, WcStatus, inc_rkey,
};

/// How long any single wait may take before the check fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// The two devices and the address space a check may use.
#[derive(Debug)]
pub struct Env<P: Provider> {
    /// Active side's device.
    pub a: P::Device,
    /// Passive side's device.
    pub b: P::Device,
    /// Address the passive side listens on.
    pub ip: IpAddr,
    /// First port this check may use (it uses at most 4).
    pub port: u16,
}

/// Result of a check.
pub type Check = Result<(), String>;

macro_rules! ensure {
    ($c:expr, $($fmt:tt)*) => {
        if !$c {
            return Err(format!($($fmt)*));
        }
    };
}

fn fe<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// One connected endpoint with a registered buffer.
pub struct Side<P: Provider> {
    /// Protection domain.
    pub pd: P::Pd,
    /// Completion queue (send and receive).
    pub cq: P::Cq,
    /// CM channel.
    pub cm: P::Cm,
    /// Queue pair.
    pub qp: P::Qp,
    /// Its connection.
    pub conn: ConnId,
    /// Buffer memory (shareable).
    pub mem: Arc<Region>,
    /// Registration of all of `mem` with every right.
    pub mr: P::Mr,
}

impl<P: Provider> std::fmt::Debug for Side<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side").field("conn", &self.conn).finish()
    }
}

impl<P: Provider> Side<P> {
    /// Byte `i` of the buffer.
    pub fn byte(&self, i: usize) -> u8 {
        read_byte(&self.mem, i)
    }

    /// Fills `[off, off+len)` with `f(i)`.
    pub fn fill(&self, off: usize, len: usize, f: impl Fn(usize) -> u8) {
        for i in 0..len {
            write_byte(&self.mem, off + i, f(i));
        }
    }

    /// The remote address of `off` in this side's buffer.
    pub fn remote(&self, off: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.mr.addr() + off as u64,
            rkey: self.mr.rkey(),
        }
    }
}

fn read_byte(r: &Region, i: usize) -> u8 {
    r.load_u8(i)
}

fn write_byte(r: &Region, i: usize, v: u8) {
    r.store_u8(i, v);
}

/// A connected pair of queue pairs.
pub struct Pair<P: Provider> {
    /// Active side.
    pub a: Side<P>,
    /// Passive side.
    pub b: Side<P>,
}

impl<P: Provider> std::fmt::Debug for Pair<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("a", &self.a)
            .field("b", &self.b)
            .finish()
    }
}

/// Allocates a shareable buffer and registers it with every right.
pub fn buffer<P: Provider>(pd: &P::Pd, len: usize) -> Result<(Arc<Region>, P::Mr), String> {
    let mem = Arc::new(
        Region::new(
            &RegionConfig::new("conformance", len)
                .shareable(true)
                .no_huge()
                .quiet(),
        )
        .map_err(fe("allocating a buffer"))?,
    );
    let mr = pd
        .reg_region(&mem, 0, len, Access::ALL)
        .map_err(fe("registering a buffer"))?;
    Ok((mem, mr))
}

/// Waits for the next CM event on `cm`.
pub fn next_event<P: Provider>(cm: &mut P::Cm, what: &str) -> Result<CmEvent<P>, String> {
    cm.wait_event(Some(WAIT))
        .ok_or_else(|| format!("no CM event within {WAIT:?} while waiting for {what}"))
}

/// True if `got` is `sent` followed only by zeros: IB and RoCE deliver private data padded
/// to the CM message's fixed size, so receivers see the sender's bytes as a prefix.
pub fn padded_eq(got: &[u8], sent: &[u8]) -> bool {
    got.len() >= sent.len()
        && got[..sent.len()] == *sent
        && got[sent.len()..].iter().all(|b| *b == 0)
}

/// Connects a pair: `a` actively to `b`'s listener on `port`.
pub fn connect<P: Provider>(
    env: &Env<P>,
    port: u16,
    caps: QpCaps,
    req: &[u8],
    rep: &[u8],
) -> Result<Pair<P>, String> {
    let addr = SocketAddr::new(env.ip, port);
    let pd_a = env.a.alloc_pd().map_err(fe("alloc_pd a"))?;
    let pd_b = env.b.alloc_pd().map_err(fe("alloc_pd b"))?;
    let (mem_a, mr_a) = buffer::<P>(&pd_a, 1 << 20)?;
    let (mem_b, mr_b) = buffer::<P>(&pd_b, 1 << 20)?;
    let cq_a = env.a.create_cq(4096).map_err(fe("create_cq a"))?;
    let cq_b = env.b.create_cq(4096).map_err(fe("create_cq b"))?;
    let mut cm_a = env.a.create_cm_channel().map_err(fe("cm a"))?;
    let mut cm_b = env.b.create_cm_channel().map_err(fe("cm b"))?;
    let lid = cm_b.listen(addr, 16).map_err(fe("listen"))?;
    let (conn_a, qp_a) = cm_a
        .connect(
            addr,
            &QpInit {
                pd: &pd_a,
                send_cq: &cq_a,
                recv_cq: &cq_a,
                caps,
            },
            req,
        )
        .map_err(fe("connect"))?;
    let request = match next_event::<P>(&mut cm_b, "ConnectRequest")? {
        CmEvent::ConnectRequest { listener, request } => {
            ensure!(
                listener == lid,
                "request on listener {listener:?}, expected {lid:?}"
            );
            request
        }
        e => return Err(format!("expected ConnectRequest, got {e:?}")),
    };
    ensure!(
        padded_eq(request.private_data(), req),
        "REQ private data {:?} != {:?}",
        request.private_data(),
        req
    );
    let (conn_b, qp_b) = cm_b
        .accept(
            request,
            &QpInit {
                pd: &pd_b,
                send_cq: &cq_b,
                recv_cq: &cq_b,
                caps,
            },
            rep,
        )
        .map_err(fe("accept"))?;
    match next_event::<P>(&mut cm_a, "Established (active)")? {
        CmEvent::Established { conn, private_data } => {
            ensure!(conn == conn_a, "established {conn:?}, expected {conn_a:?}");
            ensure!(
                padded_eq(private_data.as_bytes(), rep),
                "REP private data mismatch"
            );
        }
        e => {
            return Err(format!(
                "expected Established on the active side, got {e:?}"
            ));
        }
    }
    match next_event::<P>(&mut cm_b, "Established (passive)")? {
        CmEvent::Established { conn, .. } => {
            ensure!(conn == conn_b, "passive established {conn:?}")
        }
        e => {
            return Err(format!(
                "expected Established on the passive side, got {e:?}"
            ));
        }
    }
    ensure!(
        qp_a.state() == QpState::Rts,
        "active QP in {:?}",
        qp_a.state()
    );
    ensure!(
        qp_b.state() == QpState::Rts,
        "passive QP in {:?}",
        qp_b.state()
    );
    Ok(Pair {
        a: Side {
            pd: pd_a,
            cq: cq_a,
            cm: cm_a,
            qp: qp_a,
            conn: conn_a,
            mem: mem_a,
            mr: mr_a,
        },
        b: Side {
            pd: pd_b,
            cq: cq_b,
            cm: cm_b,
            qp: qp_b,
            conn: conn_b,
            mem: mem_b,
            mr: mr_b,
        },
    })
}

/// Polls both completion queues until `want` completions arrived on `which` (0 = a,
/// 1 = b); completions on the other queue are returned too.
pub fn poll_n<P: Provider>(
    pair: &mut Pair<P>,
    want_a: usize,
    want_b: usize,
) -> Result<(Vec<Completion>, Vec<Completion>), String> {
    let mut ga = Vec::new();
    let mut gb = Vec::new();
    let mut buf = [Completion::default(); 32];
    let t0 = Instant::now();
    while ga.len() < want_a || gb.len() < want_b {
        let n = pair.a.cq.poll(&mut buf);
        ga.extend_from_slice(&buf[..n]);
        let n = pair.b.cq.poll(&mut buf);
        gb.extend_from_slice(&buf[..n]);
        if t0.elapsed() > WAIT {
            return Err(format!(
                "timed out: got {}/{want_a} completions on a, {}/{want_b} on b: {ga:?} {gb:?}",
                ga.len(),
                gb.len()
            ));
        }
        std::thread::yield_now();
    }
    Ok((ga, gb))
}

/// Polls both queues for a while and fails if anything arrives.
pub fn expect_quiet<P: Provider>(pair: &mut Pair<P>, polls: usize) -> Check {
    let mut buf = [Completion::default(); 8];
    for _ in 0..polls {
        let n = pair.a.cq.poll(&mut buf);
        ensure!(n == 0, "unexpected completion on a: {:?}", &buf[..n]);
        let n = pair.b.cq.poll(&mut buf);
        ensure!(n == 0, "unexpected completion on b: {:?}", &buf[..n]);
    }
    Ok(())
}

fn post_recv<P: Provider>(s: &mut Side<P>, wr_id: u64, off: usize, len: u32) -> Check {
    let sge = [s.mr.sge(off, len)];
    s.qp.post_recv(&[RecvWr {
        wr_id,
        sgl: if len == 0 { &[] } else { &sge },
    }])
    .map_err(fe("post_recv"))
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// Connection private data travels both ways; the active side learns the REP's.
pub fn check_connect_private_data<P: Provider>(env: &Env<P>) -> Check {
    let req: Vec<u8> = (0..40).collect();
    let rep: Vec<u8> = (0..56).map(|i| 255 - i).collect();
    connect(env, env.port, caps(), &req, &rep).map(|_| ())
}

/// Private data longer than the device's limits is refused with a clear error.
pub fn check_private_data_limits<P: Provider>(env: &Env<P>) -> Check {
    let attr = env.a.attr().clone();
    let pd = env.a.alloc_pd().map_err(fe("pd"))?;
    let cq = env.a.create_cq(16).map_err(fe("cq"))?;
    let mut cm = env.a.create_cm_channel().map_err(fe("cm"))?;
    let too_long = vec![0u8; attr.max_req_private_data + 1];
    let r = cm.connect(
        SocketAddr::new(env.ip, env.port),
        &QpInit {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps: caps(),
        },
        &too_long,
    );
    match r {
        Err(e) => ensure!(e.to_string().contains("private data"), "unclear error: {e}"),
        Ok(_) => return Err("connect accepted over-long private data".into()),
    }
    Ok(())
}

/// RDMA WRITE places data; the peer sees no completion.
pub fn check_write<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    p.a.fill(0, 4096, |i| (i * 7) as u8);
    let sge = [p.a.mr.sge(0, 4096)];
    p.a.qp
        .post_send(&[SendWr::signaled(1, SendOp::Write(p.b.remote(100)), &sge)])
        .map_err(fe("post write"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].wr_id == 1 && ca[0].is_ok(),
        "write completion {:?}",
        ca[0]
    );
    ensure!(
        ca[0].opcode == WcOpcode::RdmaWrite,
        "opcode {:?}",
        ca[0].opcode
    );
    for i in 0..4096 {
        ensure!(p.b.byte(100 + i) == (i * 7) as u8, "byte {i} not written");
    }
    expect_quiet(&mut p, 100)
}

/// WRITE with immediate, including zero length and small ones the provider may place at
/// poll time ([`SendFlags::PLACE_ON_POLL`]): data visible at completion, immediate
/// delivered, one receive consumed each.
pub fn check_write_imm<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    for i in 0..4 {
        post_recv(&mut p.b, 100 + i, 0, 0)?;
    }
    p.a.fill(0, 512, |i| i as u8 ^ 0x5A);
    let sge = [p.a.mr.sge(0, 512)];
    let small = [0xC3u8; 64];
    p.a.qp
        .post_send(&[
            SendWr::signaled(1, SendOp::WriteImm(p.b.remote(8192), 0xDEAD_BEEF), &sge),
            SendWr::signaled(2, SendOp::WriteImm(p.b.remote(0), 7), &[]),
            SendWr {
                flags: SendFlags::SIGNALED | SendFlags::PLACE_ON_POLL,
                ..SendWr::inline(3, SendOp::WriteImm(p.b.remote(4096), 9), &small)
            },
        ])
        .map_err(fe("post write_imm"))?;
    let (ca, cb) = poll_n(&mut p, 3, 3)?;
    ensure!(ca.iter().all(Completion::is_ok), "send side {ca:?}");
    ensure!(
        cb[0].wr_id == 100 && cb[0].imm == Some(0xDEAD_BEEF),
        "first receive {:?}",
        cb[0]
    );
    ensure!(
        cb[0].opcode == WcOpcode::RecvRdmaWithImm && cb[0].byte_len == 512,
        "{:?}",
        cb[0]
    );
    for i in 0..512 {
        ensure!(
            p.b.byte(8192 + i) == i as u8 ^ 0x5A,
            "data byte {i} not visible at completion"
        );
    }
    ensure!(
        cb[1].wr_id == 101 && cb[1].imm == Some(7) && cb[1].byte_len == 0,
        "zero-length {:?}",
        cb[1]
    );
    ensure!(
        cb[2].wr_id == 102 && cb[2].imm == Some(9) && cb[2].byte_len == 64,
        "placed on poll {:?}",
        cb[2]
    );
    ensure!(
        (0..64).all(|i| p.b.byte(4096 + i) == 0xC3),
        "data placed on poll not visible at completion"
    );
    Ok(())
}

/// RDMA READ copies the peer's memory into ours.
pub fn check_read<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    p.b.fill(4096, 3000, |i| (i % 251) as u8);
    let sge = [p.a.mr.sge(0, 1000), p.a.mr.sge(10_000, 2000)];
    p.a.qp
        .post_send(&[SendWr::signaled(9, SendOp::Read(p.b.remote(4096)), &sge)])
        .map_err(fe("post read"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].is_ok() && ca[0].opcode == WcOpcode::RdmaRead,
        "{:?}",
        ca[0]
    );
    ensure!(ca[0].byte_len == 3000, "byte_len {}", ca[0].byte_len);
    for i in 0..1000 {
        ensure!(p.a.byte(i) == (i % 251) as u8, "read byte {i}");
    }
    for i in 0..2000 {
        ensure!(
            p.a.byte(10_000 + i) == ((1000 + i) % 251) as u8,
            "read byte {}",
            1000 + i
        );
    }
    Ok(())
}

/// SEND and SEND with immediate land in posted receives, in order, with scatter.
pub fn check_send<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let rsge = [p.b.mr.sge(0, 100), p.b.mr.sge(1000, 1000)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 50,
            sgl: &rsge,
        }])
        .map_err(fe("post_recv"))?;
    post_recv(&mut p.b, 51, 4000, 64)?;
    p.a.fill(0, 600, |i| (i * 3) as u8);
    let sge = [p.a.mr.sge(0, 600)];
    p.a.qp
        .post_send(&[
            SendWr::signaled(1, SendOp::Send, &sge),
            SendWr::inline(2, SendOp::SendImm(42), b"hello, inline"),
        ])
        .map_err(fe("post send"))?;
    let (ca, cb) = poll_n(&mut p, 2, 2)?;
    ensure!(
        ca.iter().all(|c| c.is_ok() && c.opcode == WcOpcode::Send),
        "{ca:?}"
    );
    ensure!(
        cb[0].wr_id == 50 && cb[0].byte_len == 600 && cb[0].imm.is_none(),
        "{:?}",
        cb[0]
    );
    ensure!(cb[0].opcode == WcOpcode::Recv, "{:?}", cb[0]);
    for i in 0..100 {
        ensure!(p.b.byte(i) == (i * 3) as u8, "scatter byte {i}");
    }
    for i in 100..600 {
        ensure!(
            p.b.byte(1000 + i - 100) == (i * 3) as u8,
            "scatter byte {i}"
        );
    }
    ensure!(
        cb[1].wr_id == 51 && cb[1].imm == Some(42) && cb[1].byte_len == 13,
        "{:?}",
        cb[1]
    );
    for (i, b) in b"hello, inline".iter().enumerate() {
        ensure!(p.b.byte(4000 + i) == *b, "inline byte {i}");
    }
    Ok(())
}

/// A SEND that finds no receive waits (receiver not ready) and is delivered, in order,
/// once receives are posted; nothing is dropped.
pub fn check_rnr_wait<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    for i in 0..5u64 {
        p.a.fill(i as usize * 8, 8, |_| i as u8 + 1);
    }
    let sges: Vec<_> = (0..5).map(|i| [p.a.mr.sge(i * 8, 8)]).collect();
    let wrs: Vec<_> = (0..5)
        .map(|i| SendWr::signaled(i as u64, SendOp::Send, &sges[i]))
        .collect();
    p.a.qp.post_send(&wrs).map_err(fe("post sends"))?;
    // Nothing can complete on the receiver; the sender may complete nothing either.
    let mut buf = [Completion::default(); 8];
    for _ in 0..1000 {
        let n = p.b.cq.poll(&mut buf);
        ensure!(
            n == 0,
            "receive completion without a receive: {:?}",
            &buf[..n]
        );
        let _ = p.a.cq.poll(&mut buf);
    }
    for i in 0..5 {
        post_recv(&mut p.b, 200 + i, 64 * i as usize, 64)?;
    }
    let (_, cb) = poll_n(&mut p, 0, 5)?;
    for (i, c) in cb.iter().enumerate() {
        ensure!(
            c.wr_id == 200 + i as u64 && c.is_ok() && c.byte_len == 8,
            "receive {i}: {c:?}"
        );
        ensure!(p.b.byte(64 * i) == i as u8 + 1, "payload {i} out of order");
    }
    Ok(())
}

/// A bad remote key completes with a remote access error, and the queue pair then
/// flushes what follows.
pub fn check_remote_access_errors<P: Provider>(env: &Env<P>) -> Check {
    // Bad key.
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let sge = [p.a.mr.sge(0, 16)];
    let bad = RemoteAddr {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey() ^ 0x5A5A_0000,
    };
    p.a.qp
        .post_send(&[
            SendWr::signaled(1, SendOp::Write(bad), &sge),
            SendWr::signaled(2, SendOp::Write(p.b.remote(0)), &sge),
        ])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 2, 0)?;
    ensure!(
        ca[0].wr_id == 1 && ca[0].status == WcStatus::RemAccessErr,
        "bad key: {:?}",
        ca[0]
    );
    ensure!(
        ca[1].wr_id == 2 && ca[1].status == WcStatus::WrFlushErr,
        "after error: {:?}",
        ca[1]
    );
    ensure!(
        p.a.qp.state() == QpState::Error,
        "QP state {:?}",
        p.a.qp.state()
    );
    drop(p);

    // Out of bounds.
    let mut p = connect(env, env.port + 1, caps(), &[], &[])?;
    let sge = [p.a.mr.sge(0, 64)];
    let past = p.b.remote(p.b.mr.len() - 32);
    p.a.qp
        .post_send(&[SendWr::signaled(1, SendOp::Write(past), &sge)])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].status == WcStatus::RemAccessErr,
        "out of bounds: {:?}",
        ca[0]
    );
    drop(p);

    // Rights: a read-only registration refuses writes; a write-only one refuses reads.
    let mut p = connect(env, env.port + 2, caps(), &[], &[])?;
    let ro =
        p.b.pd
            .reg_region(&p.b.mem, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .map_err(fe("reg ro"))?;
    let wo =
        p.b.pd
            .reg_region(
                &p.b.mem,
                4096,
                4096,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .map_err(fe("reg wo"))?;
    let sge = [p.a.mr.sge(0, 16)];
    p.a.qp
        .post_send(&[SendWr::signaled(
            1,
            SendOp::Read(RemoteAddr {
                addr: ro.addr(),
                rkey: ro.rkey(),
            }),
            &sge,
        )])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].is_ok(),
        "read of a REMOTE_READ region failed: {:?}",
        ca[0]
    );
    p.a.qp
        .post_send(&[SendWr::signaled(
            2,
            SendOp::Read(RemoteAddr {
                addr: wo.addr(),
                rkey: wo.rkey(),
            }),
            &sge,
        )])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].status == WcStatus::RemAccessErr,
        "read of a write-only region: {:?}",
        ca[0]
    );
    drop(p);

    let mut p = connect(env, env.port + 3, caps(), &[], &[])?;
    let ro =
        p.b.pd
            .reg_region(&p.b.mem, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .map_err(fe("reg ro"))?;
    let sge = [p.a.mr.sge(0, 16)];
    p.a.qp
        .post_send(&[SendWr::signaled(
            3,
            SendOp::Write(RemoteAddr {
                addr: ro.addr(),
                rkey: ro.rkey(),
            }),
            &sge,
        )])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].status == WcStatus::RemAccessErr,
        "write to a read-only region: {:?}",
        ca[0]
    );
    Ok(())
}

/// Deregistering a memory region revokes its remote key at once.
pub fn check_dereg_revokes<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let extra =
        p.b.pd
            .reg_region(&p.b.mem, 0, 8192, Access::ALL)
            .map_err(fe("reg"))?;
    let target = RemoteAddr {
        addr: extra.addr(),
        rkey: extra.rkey(),
    };
    let sge = [p.a.mr.sge(0, 64)];
    p.a.qp
        .post_send(&[SendWr::signaled(1, SendOp::Write(target), &sge)])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(ca[0].is_ok(), "write with a live key failed: {:?}", ca[0]);
    drop(extra);
    p.a.qp
        .post_send(&[SendWr::signaled(2, SendOp::Write(target), &sge)])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].status == WcStatus::RemAccessErr,
        "write with a revoked key: {:?}",
        ca[0]
    );
    Ok(())
}

/// A local key violation fails the request locally: no byte reaches the peer, the
/// completion reports a local error, and the queue pair moves to the error state.
///
/// The IB specification's status is `LOC_PROT_ERR`, which the shm provider and NICs
/// report. Soft-RoCE (rxe) reports `LOC_QP_OP_ERR` instead: its `copy_data()` returns
/// `-EINVAL` for an unknown key and the requester maps only `-EFAULT` to a protection
/// error (`rxe_req.c`). Both are accepted; any other status fails the check.
pub fn check_local_protection<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    p.a.fill(0, 64, |_| 0xEE);
    p.b.fill(0, 64, |_| 0x11);
    let mut sge = [p.a.mr.sge(0, 64)];
    sge[0].lkey ^= 0x0077_0000;
    p.a.qp
        .post_send(&[SendWr::signaled(1, SendOp::Write(p.b.remote(0)), &sge)])
        .map_err(fe("post"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        matches!(ca[0].status, WcStatus::LocProtErr | WcStatus::LocQpOpErr),
        "bad lkey: {:?}",
        ca[0]
    );
    ensure!(
        (0..64).all(|i| p.b.byte(i) == 0x11),
        "bytes moved despite a bad lkey"
    );
    ensure!(
        p.a.qp.state() == QpState::Error,
        "QP state after a local error: {:?}",
        p.a.qp.state()
    );
    Ok(())
}

/// A queue pair in error flushes its posted receives; disconnect reaches both sides.
pub fn check_disconnect_flush<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    for i in 0..3 {
        post_recv(&mut p.b, 300 + i, 0, 64)?;
    }
    let conn_a = p.a.conn;
    p.a.cm.disconnect(conn_a).map_err(fe("disconnect"))?;
    match next_event::<P>(&mut p.a.cm, "Disconnected (local)")? {
        CmEvent::Disconnected { conn } => ensure!(conn == conn_a, "disconnected {conn:?}"),
        e => return Err(format!("expected Disconnected, got {e:?}")),
    }
    match next_event::<P>(&mut p.b.cm, "Disconnected (peer)")? {
        CmEvent::Disconnected { conn } => ensure!(conn == p.b.conn, "disconnected {conn:?}"),
        e => return Err(format!("expected Disconnected on the peer, got {e:?}")),
    }
    let (_, cb) = poll_n(&mut p, 0, 3)?;
    for (i, c) in cb.iter().enumerate() {
        ensure!(
            c.wr_id == 300 + i as u64 && c.status == WcStatus::WrFlushErr,
            "flush {i}: {c:?}"
        );
    }
    ensure!(
        p.a.qp.state() == QpState::Error && p.b.qp.state() == QpState::Error,
        "states after disconnect"
    );
    // Posting after the error flushes at once.
    let sge = [p.a.mr.sge(0, 8)];
    p.a.qp
        .post_send(&[SendWr::signaled(5, SendOp::Write(p.b.remote(0)), &sge)])
        .map_err(fe("post after error"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(
        ca[0].wr_id == 5 && ca[0].status == WcStatus::WrFlushErr,
        "{:?}",
        ca[0]
    );
    Ok(())
}

/// `move_to_error` flushes what is posted and what is posted after it, on that side only.
pub fn check_move_to_error<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    for i in 0..3 {
        post_recv(&mut p.b, 400 + i, 0, 64)?;
    }
    p.b.qp.move_to_error();
    p.b.qp.move_to_error();
    ensure!(
        p.b.qp.state() == QpState::Error,
        "state {:?}",
        p.b.qp.state()
    );
    let (_, cb) = poll_n(&mut p, 0, 3)?;
    for (i, c) in cb.iter().enumerate() {
        ensure!(
            c.wr_id == 400 + i as u64 && c.status == WcStatus::WrFlushErr,
            "flush {i}: {c:?}"
        );
    }
    let sge = [p.b.mr.sge(0, 8)];
    p.b.qp
        .post_send(&[SendWr::signaled(7, SendOp::Write(p.a.remote(0)), &sge)])
        .map_err(fe("post after move_to_error"))?;
    let (_, cb) = poll_n(&mut p, 0, 1)?;
    ensure!(
        cb[0].wr_id == 7 && cb[0].status == WcStatus::WrFlushErr,
        "{:?}",
        cb[0]
    );
    ensure!(
        p.a.qp.state() != QpState::Error,
        "the peer's queue pair is not moved by it"
    );
    Ok(())
}

/// Rejection carries private data; connecting where nobody listens is reported.
pub fn check_reject_and_unreachable<P: Provider>(env: &Env<P>) -> Check {
    let pd = env.a.alloc_pd().map_err(fe("pd"))?;
    let cq = env.a.create_cq(16).map_err(fe("cq"))?;
    let mut cm_a = env.a.create_cm_channel().map_err(fe("cm a"))?;
    let mut cm_b = env.b.create_cm_channel().map_err(fe("cm b"))?;
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    // Nobody listens.
    let (c, _qp) = cm_a
        .connect(SocketAddr::new(env.ip, env.port + 1), &init, &[])
        .map_err(fe("connect"))?;
    match next_event::<P>(&mut cm_a, "Unreachable/Rejected")? {
        CmEvent::Unreachable { conn, .. } | CmEvent::Rejected { conn, .. } => {
            ensure!(conn == c, "{conn:?}")
        }
        e => return Err(format!("expected Unreachable, got {e:?}")),
    }
    // Rejected with data.
    let addr = SocketAddr::new(env.ip, env.port);
    cm_b.listen(addr, 4).map_err(fe("listen"))?;
    let (c, _qp2) = cm_a.connect(addr, &init, b"hi").map_err(fe("connect"))?;
    let req = match next_event::<P>(&mut cm_b, "ConnectRequest")? {
        CmEvent::ConnectRequest { request, .. } => request,
        e => return Err(format!("expected ConnectRequest, got {e:?}")),
    };
    cm_b.reject(req, b"go away").map_err(fe("reject"))?;
    match next_event::<P>(&mut cm_a, "Rejected")? {
        CmEvent::Rejected { conn, private_data } => {
            ensure!(conn == c, "{conn:?}");
            ensure!(
                padded_eq(private_data.as_bytes(), b"go away"),
                "REJ data {private_data:?}"
            );
        }
        e => return Err(format!("expected Rejected, got {e:?}")),
    }
    Ok(())
}

/// Unsignalled requests free their send-queue slots only with a later signalled
/// completion; a full send queue refuses more.
pub fn check_send_queue_accounting<P: Provider>(env: &Env<P>) -> Check {
    let c = QpCaps {
        max_send_wr: 8,
        ..caps()
    };
    let mut p = connect(env, env.port, c, &[], &[])?;
    let sge = [p.a.mr.sge(0, 8)];
    let unsig = SendWr {
        wr_id: 0,
        op: SendOp::Write(p.b.remote(0)),
        payload: Payload::Sgl(&sge),
        flags: SendFlags::NONE,
    };
    let granted = p.a.qp.caps().max_send_wr as usize;
    for i in 0..granted {
        p.a.qp
            .post_send(&[unsig])
            .map_err(|e| format!("unsignalled post {i}: {e}"))?;
    }
    match p.a.qp.post_send(&[unsig]) {
        Err(e) => ensure!(
            e.errno() == libc::ENOMEM,
            "full send queue: errno {}",
            e.errno()
        ),
        Ok(()) => {
            return Err("send queue accepted more than max_send_wr outstanding requests".into());
        }
    }
    expect_quiet(&mut p, 50)?;
    Ok(())
}

/// Many WRITEs with immediate arrive in order with their data, some placed at poll time.
pub fn check_ordering<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    const N: u64 = 2000;
    let mut recvd = 0u64;
    let mut sent = 0u64;
    let mut posted = 0u64;
    let mut buf = [Completion::default(); 32];
    let t0 = Instant::now();
    while recvd < N {
        while posted < N && posted - recvd < 32 {
            post_recv(&mut p.b, posted, 0, 0)?;
            posted += 1;
        }
        if sent < N && sent < recvd + 16 {
            let v = (sent as u32).to_le_bytes();
            p.a.qp
                .post_send(&[SendWr {
                    wr_id: sent,
                    op: SendOp::WriteImm(p.b.remote((sent % 64) as usize * 4), sent as u32),
                    payload: Payload::Inline(&v),
                    // Every third placed at poll time where the provider does that: the
                    // order holds across both kinds.
                    flags: if sent.is_multiple_of(3) {
                        SendFlags::PLACE_ON_POLL
                    } else {
                        SendFlags::NONE
                    },
                }])
                .map_err(fe("post"))?;
            sent += 1;
            if sent.is_multiple_of(8) {
                // Signal now and then so send slots are reclaimed.
                p.a.qp
                    .post_send(&[SendWr::signaled(
                        u64::MAX,
                        SendOp::Write(p.b.remote(512)),
                        &[],
                    )])
                    .map_err(fe("post signalled"))?;
            }
        }
        let _ = p.a.cq.poll(&mut buf);
        let n = p.b.cq.poll(&mut buf);
        for c in &buf[..n] {
            ensure!(c.is_ok(), "receive {c:?}");
            ensure!(
                c.imm == Some(recvd as u32),
                "out of order: got {:?}, expected {recvd}",
                c.imm
            );
            let off = (recvd % 64) as usize * 4;
            let got = u32::from_le_bytes([
                p.b.byte(off),
                p.b.byte(off + 1),
                p.b.byte(off + 2),
                p.b.byte(off + 3),
            ]);
            ensure!(
                got == recvd as u32,
                "data of message {recvd} not visible: {got}"
            );
            recvd += 1;
        }
        ensure!(t0.elapsed() < WAIT, "timed out at {recvd}/{N}");
    }
    Ok(())
}

/// Memory windows, the part every provider with them shares (not in
/// [`conformance_tests!`](crate::conformance_tests): a provider with windows calls the
/// `check_mw_*` functions from its own tests). `b` registers 64 KiB of its buffer with
/// `LOCAL_WRITE | MW_BIND` only, allocates a window, binds it to 8 KiB at offset 4096
/// under `inc_rkey` of its key, and returns (region, window, bound key, window address).
fn mw_setup<P: Provider>(
    p: &mut Pair<P>,
    access: Access,
) -> Result<(P::Mr, P::Mw, u32, u64), String> {
    let mr =
        p.b.pd
            .reg_region(&p.b.mem, 0, 65536, Access::LOCAL_WRITE | Access::MW_BIND)
            .map_err(fe("reg MW_BIND"))?;
    let mw = p.b.pd.alloc_mw().map_err(fe("alloc_mw"))?;
    let key = inc_rkey(mw.rkey());
    ensure!(
        key & !0xFF == mw.rkey() & !0xFF,
        "inc_rkey changed the window bits"
    );
    let addr = mr.addr() + 4096;
    bind::<P>(p, 100, key, &mr, addr, 8192, access)?;
    Ok((mr, mw, key, addr))
}

/// Binds (signalled) on `b` and waits for the bind's completion.
fn bind<P: Provider>(
    p: &mut Pair<P>,
    wr_id: u64,
    rkey: u32,
    mr: &P::Mr,
    addr: u64,
    len: u64,
    access: Access,
) -> Check {
    let op = SendOp::BindMw {
        rkey,
        lkey: mr.lkey(),
        access,
        addr,
        len,
    };
    p.b.qp
        .post_send(&[SendWr::signaled(wr_id, op, &[])])
        .map_err(fe("post bind"))?;
    let (_, cb) = poll_n(p, 0, 1)?;
    ensure!(
        cb[0].wr_id == wr_id && cb[0].is_ok() && cb[0].opcode == WcOpcode::BindMw,
        "bind: {:?}",
        cb[0]
    );
    Ok(())
}

/// `a` writes 64 bytes of pattern `seed` at `to`; returns the completion.
fn mw_write<P: Provider>(
    p: &mut Pair<P>,
    wr_id: u64,
    to: RemoteAddr,
    seed: u8,
) -> Result<Completion, String> {
    p.a.fill(0, 64, |i| (i as u8).wrapping_mul(7).wrapping_add(seed));
    let sge = [p.a.mr.sge(0, 64)];
    p.a.qp
        .post_send(&[SendWr::signaled(wr_id, SendOp::Write(to), &sge)])
        .map_err(fe("post write"))?;
    let (ca, _) = poll_n(p, 1, 0)?;
    ensure!(ca[0].wr_id == wr_id, "write completion: {:?}", ca[0]);
    Ok(ca[0])
}

/// [`check_mw_rebind`], then [`check_mw_limits`] with every case (ports `env.port` to
/// `env.port + 4`).
pub fn check_mw_bind_and_rebind<P: Provider>(env: &Env<P>, rebind_valid: bool) -> Check {
    check_mw_rebind(env, rebind_valid)?;
    check_mw_limits(env, true)
}

/// A peer writes and reads through a bound window; after a rebind under `inc_rkey` the
/// new key works and the old one fails with a remote access error (the queue pair then
/// goes to the error state, as for any bad key). With `rebind_valid` the window is bound
/// again while still bound (the shm provider allows it); without, it is invalidated first
/// (`LOCAL_INV`, unsignalled), as type-2 windows on verbs hardware require (IBA
/// o10-36.2.2).
pub fn check_mw_rebind<P: Provider>(env: &Env<P>, rebind_valid: bool) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let (mr, _mw, k1, addr) = mw_setup(&mut p, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let off = (addr - mr.addr()) as usize + 100;
    let c = mw_write(
        &mut p,
        1,
        RemoteAddr {
            addr: addr + 100,
            rkey: k1,
        },
        3,
    )?;
    ensure!(c.is_ok(), "write through the window: {c:?}");
    for i in 0..64 {
        ensure!(
            p.b.byte(off + i) == (i as u8).wrapping_mul(7).wrapping_add(3),
            "byte {i} of the window write"
        );
    }
    let sge = [p.a.mr.sge(4096, 64)];
    p.a.qp
        .post_send(&[SendWr::signaled(
            2,
            SendOp::Read(RemoteAddr {
                addr: addr + 100,
                rkey: k1,
            }),
            &sge,
        )])
        .map_err(fe("post read"))?;
    let (ca, _) = poll_n(&mut p, 1, 0)?;
    ensure!(ca[0].is_ok(), "read through the window: {:?}", ca[0]);
    ensure!(
        p.a.byte(4096 + 5) == 5u8.wrapping_mul(7).wrapping_add(3),
        "read data"
    );

    let k2 = inc_rkey(k1);
    if !rebind_valid {
        // Type-2 windows on verbs hardware must be invalidated before a rebind.
        let inv = SendWr {
            wr_id: 99,
            op: SendOp::LocalInv(k1),
            payload: Payload::Sgl(&[]),
            flags: SendFlags::NONE,
        };
        p.b.qp.post_send(&[inv]).map_err(fe("post local inv"))?;
    }
    bind::<P>(&mut p, 101, k2, &mr, addr, 8192, Access::REMOTE_WRITE)?;
    let c = mw_write(
        &mut p,
        3,
        RemoteAddr {
            addr: addr + 200,
            rkey: k2,
        },
        9,
    )?;
    ensure!(c.is_ok(), "write under the new key: {c:?}");
    let c = mw_write(
        &mut p,
        4,
        RemoteAddr {
            addr: addr + 200,
            rkey: k1,
        },
        11,
    )?;
    ensure!(
        c.status == WcStatus::RemAccessErr,
        "write under the old key: {c:?}"
    );
    ensure!(
        p.a.qp.state() == QpState::Error,
        "QP state after the old key: {:?}",
        p.a.qp.state()
    );
    Ok(())
}

/// What a bound window does not grant: a peer's access beyond the rights it grants, and
/// through the region's own key (which has no remote right), fails with a remote access
/// error; so, with `ranges`, does an access before or past the bound range inside the
/// region (Soft-RoCE checks only the region's bounds: see `dp-verbs`' crate docs). Uses
/// ports `env.port + 1` to `env.port + 4`.
pub fn check_mw_limits<P: Provider>(env: &Env<P>, ranges: bool) -> Check {
    for (i, (what, to_off, read, use_mr_key)) in [
        ("before the window", -64i64, false, false),
        ("past the window", 8192 - 32, false, false),
        ("a read of a write-only window", 0, true, false),
        ("the region's own key", 0, false, true),
    ]
    .into_iter()
    .enumerate()
    {
        if !ranges && i < 2 {
            continue;
        }
        let mut p = connect(env, env.port + 1 + i as u16, caps(), &[], &[])?;
        let (mr, _mw, k, addr) = mw_setup(&mut p, Access::REMOTE_WRITE)?;
        let to = RemoteAddr {
            addr: addr.wrapping_add_signed(to_off),
            rkey: if use_mr_key { mr.rkey() } else { k },
        };
        let c = if read {
            let sge = [p.a.mr.sge(0, 64)];
            p.a.qp
                .post_send(&[SendWr::signaled(5, SendOp::Read(to), &sge)])
                .map_err(fe("post read"))?;
            poll_n(&mut p, 1, 0)?.0[0]
        } else {
            mw_write(&mut p, 5, to, 1)?
        };
        ensure!(c.status == WcStatus::RemAccessErr, "{what}: {c:?}");
    }
    Ok(())
}

/// A local invalidation executes in order with the sends around it, signalled or not:
/// once the peer got the SEND posted after an unsignalled `LOCAL_INV`, the key fails.
pub fn check_mw_local_inv<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let (_mr, _mw, k, addr) = mw_setup(&mut p, Access::REMOTE_WRITE)?;
    let c = mw_write(&mut p, 1, RemoteAddr { addr, rkey: k }, 1)?;
    ensure!(c.is_ok(), "write before the invalidation: {c:?}");
    let rsge = [p.a.mr.sge(8192, 64)];
    p.a.qp
        .post_recv(&[RecvWr {
            wr_id: 50,
            sgl: &rsge,
        }])
        .map_err(fe("post recv"))?;
    let inv = SendWr {
        wr_id: 10,
        op: SendOp::LocalInv(k),
        payload: Payload::Sgl(&[]),
        flags: SendFlags::NONE,
    };
    p.b.qp
        .post_send(&[inv, SendWr::inline(11, SendOp::SendImm(77), &[1, 2, 3])])
        .map_err(fe("post local inv + send"))?;
    let (ca, cb) = poll_n(&mut p, 1, 1)?;
    ensure!(
        ca[0].wr_id == 50 && ca[0].is_ok() && ca[0].imm == Some(77),
        "the SEND after the invalidation: {:?}",
        ca[0]
    );
    ensure!(
        cb[0].wr_id == 11 && cb[0].is_ok(),
        "only the signalled SEND completes on b: {:?}",
        cb[0]
    );
    let c = mw_write(&mut p, 2, RemoteAddr { addr, rkey: k }, 2)?;
    ensure!(
        c.status == WcStatus::RemAccessErr,
        "write after LOCAL_INV: {c:?}"
    );
    drop(p);

    // Invalidating a key that is not the current key of a window fails the request.
    let mut p = connect(env, env.port + 1, caps(), &[], &[])?;
    let (_mr, _mw, k, _) = mw_setup(&mut p, Access::REMOTE_WRITE)?;
    p.b.qp
        .post_send(&[SendWr::signaled(12, SendOp::LocalInv(inc_rkey(k)), &[])])
        .map_err(fe("post local inv"))?;
    let (_, cb) = poll_n(&mut p, 0, 1)?;
    ensure!(
        cb[0].wr_id == 12 && !cb[0].is_ok(),
        "LOCAL_INV of a stale key: {:?}",
        cb[0]
    );
    Ok(())
}

/// A peer's SEND with invalidate: the receive completes with the key in `invalidated`,
/// the key fails from then on, and the window can be bound again under a new key.
pub fn check_mw_remote_inv<P: Provider>(env: &Env<P>) -> Check {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let (mr, mw, k, addr) = mw_setup(&mut p, Access::REMOTE_WRITE)?;
    let c = mw_write(&mut p, 1, RemoteAddr { addr, rkey: k }, 1)?;
    ensure!(c.is_ok(), "write before the invalidation: {c:?}");
    let rsge = [p.b.mr.sge(128 * 1024, 64)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 60,
            sgl: &rsge,
        }])
        .map_err(fe("post recv"))?;
    p.a.qp
        .post_send(&[SendWr::inline(2, SendOp::SendInv(k), &[9; 16])])
        .map_err(fe("post send with invalidate"))?;
    let (ca, cb) = poll_n(&mut p, 1, 1)?;
    ensure!(ca[0].is_ok(), "SEND with invalidate on a: {:?}", ca[0]);
    ensure!(
        cb[0].wr_id == 60
            && cb[0].is_ok()
            && cb[0].opcode == WcOpcode::Recv
            && cb[0].byte_len == 16
            && cb[0].invalidated == Some(k)
            && cb[0].imm.is_none(),
        "the receive of a SEND with invalidate: {:?}",
        cb[0]
    );
    let k2 = inc_rkey(k);
    ensure!(k2 & !0xFF == mw.rkey() & !0xFF, "inc_rkey");
    bind::<P>(&mut p, 102, k2, &mr, addr, 4096, Access::REMOTE_WRITE)?;
    let c = mw_write(&mut p, 3, RemoteAddr { addr, rkey: k2 }, 3)?;
    ensure!(
        c.is_ok(),
        "write under the key bound after the invalidation: {c:?}"
    );
    let c = mw_write(&mut p, 4, RemoteAddr { addr, rkey: k }, 4)?;
    ensure!(
        c.status == WcStatus::RemAccessErr,
        "write under the invalidated key: {c:?}"
    );
    Ok(())
}

/// What [`check_mw_bad_remote_inv`] leaves for its caller to inspect: the pair (both queue
/// pairs in the error state), the receiver's `MW_BIND` region and window, and the key the
/// window is bound under.
pub type BadInvOutcome<P> = (Pair<P>, <P as Provider>::Mr, <P as Provider>::Mw, u32);

/// A SEND with invalidate of a key that is not the current key of a window of the
/// receiving queue pair's domain (`bad(pair, window key)` picks it) fails that receive with
/// a remote invalid request error and moves both queue pairs to the error state; the
/// window keeps working for the domain's other connections (checked by the caller, which
/// can look at the key table).
pub fn check_mw_bad_remote_inv<P: Provider>(
    env: &Env<P>,
    bad: impl Fn(&Pair<P>, u32) -> u32,
) -> Result<BadInvOutcome<P>, String> {
    let mut p = connect(env, env.port, caps(), &[], &[])?;
    let (mr, mw, k, _) = mw_setup(&mut p, Access::REMOTE_WRITE)?;
    let rsge = [p.b.mr.sge(128 * 1024, 64)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 70,
            sgl: &rsge,
        }])
        .map_err(fe("post recv"))?;
    let key = bad(&p, k);
    p.a.qp
        .post_send(&[SendWr::inline(1, SendOp::SendInv(key), &[5; 8])])
        .map_err(fe("post send with invalidate"))?;
    let (_, cb) = poll_n(&mut p, 0, 1)?;
    ensure!(
        cb[0].wr_id == 70 && cb[0].status == WcStatus::RemInvReqErr && cb[0].invalidated.is_none(),
        "receive of a SEND invalidating {key:#x}: {:?}",
        cb[0]
    );
    ensure!(
        p.b.qp.state() == QpState::Error,
        "receiver QP state {:?}",
        p.b.qp.state()
    );
    // The sender's queue pair fails too (the responder's NAK).
    let t0 = Instant::now();
    let sge = [p.a.mr.sge(0, 8)];
    let mut seen_err = false;
    p.a.qp
        .post_send(&[SendWr::signaled(2, SendOp::Write(p.b.remote(0)), &sge)])
        .map_err(fe("post"))?;
    while t0.elapsed() < WAIT {
        let mut buf = [Completion::default(); 8];
        let n = p.a.cq.poll(&mut buf);
        if buf[..n].iter().any(|c| !c.is_ok()) || p.a.qp.state() == QpState::Error {
            seen_err = true;
            break;
        }
        std::thread::yield_now();
    }
    ensure!(seen_err, "the sender's queue pair kept working");
    Ok((p, mr, mw, k))
}

/// Binds the provider must refuse at post time: a range outside the region, a region
/// without `MW_BIND`, remote write on a region without local write, a key whose upper
/// bits are not the window's, and a bind carrying data.
pub fn check_mw_bind_refusals<P: Provider>(env: &Env<P>) -> Check {
    let p = connect(env, env.port, caps(), &[], &[])?;
    let mr =
        p.b.pd
            .reg_region(&p.b.mem, 0, 65536, Access::LOCAL_WRITE | Access::MW_BIND)
            .map_err(fe("reg MW_BIND"))?;
    let ro =
        p.b.pd
            .reg_region(&p.b.mem, 65536, 65536, Access::MW_BIND)
            .map_err(fe("reg MW_BIND read-only"))?;
    let plain =
        p.b.pd
            .reg_region(&p.b.mem, 131_072, 65536, Access::LOCAL_WRITE)
            .map_err(fe("reg"))?;
    let mw = p.b.pd.alloc_mw().map_err(fe("alloc_mw"))?;
    let k = inc_rkey(mw.rkey());
    let op = |rkey, mr: &P::Mr, addr: u64, len, access| SendOp::BindMw {
        rkey,
        lkey: mr.lkey(),
        access,
        addr,
        len,
    };
    let w = Access::REMOTE_WRITE;
    let data = [p.b.mr.sge(0, 8)];
    let mut qp = p.b.qp;
    for (what, op, payload) in [
        (
            "past the region",
            op(k, &mr, mr.addr() + 65536 - 100, 200, w),
            &[][..],
        ),
        (
            "before the region",
            op(k, &mr, mr.addr() - 8, 64, w),
            &[][..],
        ),
        (
            "a region without MW_BIND",
            op(k, &plain, plain.addr(), 64, w),
            &[][..],
        ),
        (
            "remote write without local write",
            op(k, &ro, ro.addr(), 64, w),
            &[][..],
        ),
        (
            "another window's key",
            op(k ^ 0x100, &mr, mr.addr(), 64, w),
            &[][..],
        ),
        ("a bind with data", op(k, &mr, mr.addr(), 64, w), &data[..]),
    ] {
        let r = qp.post_send(&[SendWr::signaled(1, op, payload)]);
        ensure!(
            r.is_err_and(|e| e.kind == PostErrorKind::BadBind && e.index == 0),
            "{what}: {r:?}"
        );
    }
    // A read-only window on a read-only region is fine.
    let r = qp.post_send(&[SendWr::signaled(
        2,
        op(k, &ro, ro.addr(), 64, Access::REMOTE_READ),
        &[],
    )]);
    ensure!(r.is_ok(), "a read-only bind: {r:?}");
    Ok(())
}

/// Datagrams: delivered with a GRH area and the sender's QPN; dropped without a receive
/// or with the wrong Q_Key.
pub fn check_ud<P: Provider>(env: &Env<P>) -> Check {
    let pd_a = env.a.alloc_pd().map_err(fe("pd"))?;
    let pd_b = env.b.alloc_pd().map_err(fe("pd"))?;
    let (mem_b, mr_b) = buffer::<P>(&pd_b, 1 << 16)?;
    let (mem_a, mr_a) = buffer::<P>(&pd_a, 1 << 16)?;
    let mut cq_a = env.a.create_cq(64).map_err(fe("cq"))?;
    let mut cq_b = env.b.create_cq(64).map_err(fe("cq"))?;
    let init_a = QpInit {
        pd: &pd_a,
        send_cq: &cq_a,
        recv_cq: &cq_a,
        caps: caps(),
    };
    let init_b = QpInit {
        pd: &pd_b,
        send_cq: &cq_b,
        recv_cq: &cq_b,
        caps: caps(),
    };
    let mut ua = env
        .a
        .create_ud_qp(&init_a, env.ip, 0x1111)
        .map_err(fe("ud a"))?;
    let mut ub = env
        .b
        .create_ud_qp(&init_b, env.ip, 0x2222)
        .map_err(fe("ud b"))?;
    let dest = env
        .a
        .resolve_ud_dest(&pd_a, env.ip, env.ip, ub.qp_num(), 0x2222)
        .map_err(fe("resolve"))?;
    let wrong = env
        .a
        .resolve_ud_dest(&pd_a, env.ip, env.ip, ub.qp_num(), 0x3333)
        .map_err(fe("resolve"))?;
    let mut out = [Completion::default(); 16];
    let send = |ua: &mut P::UdQp, dest: &P::UdDest, id: u64, data: &[u8]| {
        ua.post_send(&[UdSendWr {
            wr_id: id,
            dest,
            payload: Payload::Inline(data),
            flags: SendFlags::SIGNALED,
            imm: Some(id as u32),
        }])
        .map_err(fe("ud post"))
    };
    // No receive posted: dropped.
    send(&mut ua, &dest, 1, b"lost")?;
    let sge = [mr_b.sge(0, 2048)];
    ub.post_recv(&[RecvWr {
        wr_id: 7,
        sgl: &sge,
    }])
    .map_err(fe("ud recv"))?;
    let mut ca = Vec::new();
    let mut cb = Vec::new();
    let t0 = Instant::now();
    // Wrong key: dropped; right key: delivered.
    send(&mut ua, &wrong, 2, b"wrong key")?;
    send(&mut ua, &dest, 3, b"datagram!")?;
    while ca.len() < 3 || cb.is_empty() {
        let n = cq_a.poll(&mut out);
        ca.extend_from_slice(&out[..n]);
        let n = cq_b.poll(&mut out);
        cb.extend_from_slice(&out[..n]);
        ensure!(t0.elapsed() < WAIT, "UD timed out: {ca:?} {cb:?}");
    }
    ensure!(ca.iter().all(Completion::is_ok), "UD sends: {ca:?}");
    ensure!(cb.len() == 1, "expected exactly one datagram, got {cb:?}");
    let c = cb[0];
    ensure!(
        c.wr_id == 7 && c.imm == Some(3) && c.src_qp == ua.qp_num(),
        "{c:?}"
    );
    ensure!(c.byte_len == GRH_LEN + 9, "byte_len {}", c.byte_len);
    for (i, b) in b"datagram!".iter().enumerate() {
        ensure!(
            read_byte(&mem_b, GRH_LEN as usize + i) == *b,
            "UD payload byte {i}"
        );
    }
    let _ = (&mem_a, &mr_a);
    Ok(())
}

/// Expands the conformance checks into `#[test]` functions.
///
/// `$env` is an expression of type `Option<Env<P>>` evaluated with one `u16` port base
/// bound to `$port`; `None` skips (with a message printed by the expression).
#[macro_export]
macro_rules! conformance_tests {
    ($p:ty, |$port:ident| $env:expr) => {
        $crate::conformance_tests!(@one $p, $port, $env, connect_private_data, check_connect_private_data, 0);
        $crate::conformance_tests!(@one $p, $port, $env, private_data_limits, check_private_data_limits, 10);
        $crate::conformance_tests!(@one $p, $port, $env, write, check_write, 20);
        $crate::conformance_tests!(@one $p, $port, $env, write_imm, check_write_imm, 30);
        $crate::conformance_tests!(@one $p, $port, $env, read, check_read, 40);
        $crate::conformance_tests!(@one $p, $port, $env, send, check_send, 50);
        $crate::conformance_tests!(@one $p, $port, $env, rnr_wait, check_rnr_wait, 60);
        $crate::conformance_tests!(@one $p, $port, $env, remote_access_errors, check_remote_access_errors, 70);
        $crate::conformance_tests!(@one $p, $port, $env, dereg_revokes, check_dereg_revokes, 80);
        $crate::conformance_tests!(@one $p, $port, $env, local_protection, check_local_protection, 90);
        $crate::conformance_tests!(@one $p, $port, $env, disconnect_flush, check_disconnect_flush, 100);
        $crate::conformance_tests!(@one $p, $port, $env, reject_and_unreachable, check_reject_and_unreachable, 110);
        $crate::conformance_tests!(@one $p, $port, $env, send_queue_accounting, check_send_queue_accounting, 120);
        $crate::conformance_tests!(@one $p, $port, $env, ordering, check_ordering, 130);
        $crate::conformance_tests!(@one $p, $port, $env, ud, check_ud, 140);
        $crate::conformance_tests!(@one $p, $port, $env, move_to_error, check_move_to_error, 195);
    };
    (@one $p:ty, $port:ident, $env:expr, $name:ident, $check:ident, $off:expr) => {
        #[test]
        fn $name() {
            let $port: u16 = $off;
            let env: Option<$crate::conformance::Env<$p>> = $env;
            let Some(env) = env else { return };
            $crate::conformance::$check(&env).unwrap_or_else(|e| panic!("{}: {e}", stringify!($name)));
        }
    };
}
