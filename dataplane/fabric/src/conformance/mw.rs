//! Memory-window checks (type 2): bind, rebind, range limits, local and remote invalidation,
//! refused binds.

use super::*;

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
