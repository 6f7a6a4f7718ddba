//! Unreliable-datagram checks.

use super::*;

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
