//! Reliable-connected checks: connection set-up, RDMA WRITE/READ/SEND, receiver-not-ready,
//! access errors, revocation, flushes, error states, send-queue accounting and ordering.

use super::*;

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

/// An address is free again as soon as its listener stops (by `stop_listen` or with its
/// channel), on either device, and a connection to the new listener is set up: a process
/// that restarts at once must not be refused with `AddrInUse` by its own past, nor lose
/// its new listener to the old one's clean-up.
pub fn check_listen_again<P: Provider>(env: &Env<P>) -> Check {
    let addr = SocketAddr::new(env.ip, env.port);
    for round in 0..200u32 {
        let dev = if round % 2 == 0 { &env.a } else { &env.b };
        let mut cm = dev.create_cm_channel().map_err(fe("cm"))?;
        let id = cm.listen(addr, 4).map_err(|e| {
            format!("round {round}: listening on {addr} right after its last listener stopped: {e}")
        })?;
        if round % 4 < 2 {
            cm.stop_listen(id).map_err(fe("stop_listen"))?;
        }
    }
    connect(env, env.port, caps(), &[], &[]).map(|_| ())
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
