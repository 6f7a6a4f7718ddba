//! Verbs-specific checks on real RDMA hardware, beyond the provider conformance suite:
//! hugepage and raw registrations, posting limits refused at post time, queue-pair teardown
//! as the peer sees it, raw private data as the IB CM delivers it, and UD between two
//! devices.
//!
//! Runs when `DP_TEST_DEVICE` names a device (`DP_TEST_IP` as in `verbs_conformance.rs`);
//! prints why and passes otherwise.
#![cfg(feature = "verbs")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use dp_fabric::conformance::{Env, Pair, buffer, connect, next_event, poll_n};
use dp_fabric::{
    Access, CmChannel, CmEvent, Completion, CompletionQueue, ConnRequest, Device, MemoryRegion,
    Payload, PostErrorKind, ProtectionDomain, QpCaps, QpInit, QpState, RcQueuePair, RemoteAddr,
    SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};
use dp_verbs::{PrivateDataFormat, Verbs, VerbsConfig, VerbsDevice};
use mempool::memory::{HugePolicy, Region, RegionConfig};

const PORT_BASE: u16 = 47_400;

fn device() -> Option<String> {
    match std::env::var("DP_TEST_DEVICE") {
        Ok(d) => Some(d),
        Err(_) => {
            eprintln!(
                "skipped: set DP_TEST_DEVICE to an RDMA device (e.g. rxe0) to run the verbs hardware tests"
            );
            None
        }
    }
}

fn ip_of(d: &VerbsDevice) -> IpAddr {
    if let Ok(s) = std::env::var("DP_TEST_IP") {
        return s.parse().expect("DP_TEST_IP");
    }
    d.ip_addrs()
        .ok()
        .and_then(|v| v.into_iter().find(IpAddr::is_ipv4))
        .unwrap_or(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)))
}

fn env_with(port: u16, cfg: VerbsConfig) -> Option<Env<Verbs>> {
    let name = device()?;
    let a = VerbsDevice::open_with(Some(&name), cfg).expect("open a");
    let b = VerbsDevice::open_with(Some(&name), cfg).expect("open b");
    let ip = ip_of(&a);
    Some(Env {
        a,
        b,
        ip,
        port: PORT_BASE + port,
    })
}

fn env(port: u16) -> Option<Env<Verbs>> {
    // Framed private data: these checks compare exact lengths between two ends of ours.
    env_with(
        port,
        VerbsConfig {
            private_data: PrivateDataFormat::Framed,
            ..VerbsConfig::default()
        },
    )
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn write_and_wait(p: &mut Pair<Verbs>, wr_id: u64, len: u32, to: RemoteAddr) -> Completion {
    let sge = [p.a.mr.sge(0, len)];
    p.a.qp
        .post_send(&[SendWr::signaled(wr_id, SendOp::Write(to), &sge)])
        .expect("post write");
    let (ca, _) = poll_n(p, 1, 0).expect("write completion");
    ca[0]
}

#[test]
fn device_attributes_are_sane() {
    let Some(name) = device() else { return };
    let d = VerbsDevice::open(Some(&name)).expect("open");
    let a = d.attr();
    eprintln!("{a:#?}");
    eprintln!("addresses: {:?}", d.ip_addrs());
    assert_eq!(a.name, name);
    assert_eq!(a.provider, "verbs");
    assert!(a.max_qp_wr > 0 && a.max_cqe > 0 && a.max_sge >= 1);
    assert!(a.mtu >= 256 && a.max_msg_size >= u64::from(a.mtu));
    // The default is raw private data, as librdmacm peers send it: the full CM fields.
    assert_eq!(
        (
            a.max_req_private_data,
            a.max_rep_private_data,
            a.max_rej_private_data
        ),
        (56, 196, 148)
    );
    let framed = VerbsDevice::open_with(
        Some(&name),
        VerbsConfig {
            private_data: PrivateDataFormat::Framed,
            ..VerbsConfig::default()
        },
    )
    .expect("open framed");
    let f = framed.attr();
    assert_eq!(
        (
            f.max_req_private_data,
            f.max_rep_private_data,
            f.max_rej_private_data
        ),
        (54, 194, 146)
    );
}

#[test]
fn hugepage_region_takes_rdma_writes() {
    let Some(env) = env(0) else { return };
    let mut p = connect(&env, env.port, caps(), &[], &[]).expect("connect");
    let huge = match Region::new(
        &RegionConfig::new("verbs-huge", 4 << 20)
            .huge(HugePolicy::Require)
            .quiet(),
    ) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprintln!("skipped: no hugepages here ({e})");
            return;
        }
    };
    assert!(huge.backend().is_huge());
    let mr =
        p.b.pd
            .reg_region(
                &huge,
                1 << 20,
                2 << 20,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .expect("register a hugepage range");
    assert_eq!(mr.addr(), huge.as_ptr() as u64 + (1 << 20));
    p.a.fill(0, 8192, |i| (i % 253) as u8);
    let to = RemoteAddr {
        addr: mr.addr() + 4096,
        rkey: mr.rkey(),
    };
    let c = write_and_wait(&mut p, 1, 8192, to);
    assert!(c.is_ok(), "{c:?}");
    for i in 0..8192 {
        assert_eq!(
            huge.load_u8((1 << 20) + 4096 + i),
            (i % 253) as u8,
            "byte {i}"
        );
    }
    // Out of range of the registration (not of the region): refused by the hardware.
    let past = RemoteAddr {
        addr: mr.addr() + mr.len() as u64 - 16,
        rkey: mr.rkey(),
    };
    let c = write_and_wait(&mut p, 2, 64, past);
    assert_eq!(c.status, WcStatus::RemAccessErr, "{c:?}");
    // Registrations outside the region are refused before reaching the device.
    let e =
        p.b.pd
            .reg_region(&huge, 3 << 20, 2 << 20, Access::LOCAL_WRITE)
            .unwrap_err();
    assert!(e.to_string().contains("outside"), "{e}");
}

#[test]
fn raw_registration_is_read_remotely() {
    let Some(env) = env(10) else { return };
    let mut p = connect(&env, env.port, caps(), &[], &[]).expect("connect");
    let mut mem = vec![0u8; 16 << 10].into_boxed_slice();
    for (i, b) in mem.iter_mut().enumerate() {
        *b = (i * 31 % 256) as u8;
    }
    let ptr = mem.as_mut_ptr();
    // SAFETY: `mem` outlives the registration (dropped at the end of the test, after `mr`),
    // and no reference to it is used while the peer may read it.
    let mr = unsafe {
        p.b.pd
            .reg_raw(ptr, mem.len(), Access::LOCAL_WRITE | Access::REMOTE_READ)
    }
    .expect("reg_raw");
    let sge = [p.a.mr.sge(0, 5000)];
    let from = RemoteAddr {
        addr: mr.addr() + 100,
        rkey: mr.rkey(),
    };
    p.a.qp
        .post_send(&[SendWr::signaled(7, SendOp::Read(from), &sge)])
        .expect("post read");
    let (ca, _) = poll_n(&mut p, 1, 0).expect("read completion");
    assert!(
        ca[0].is_ok() && ca[0].opcode == WcOpcode::RdmaRead && ca[0].byte_len == 5000,
        "{:?}",
        ca[0]
    );
    for i in 0..5000 {
        assert_eq!(p.a.byte(i), ((i + 100) * 31 % 256) as u8, "byte {i}");
    }
    drop(mr);
    drop(mem);
    // Zero-length and REMOTE_WRITE-without-LOCAL_WRITE registrations are refused.
    let e =
        p.b.pd
            .reg_region(&p.b.mem, 0, 0, Access::LOCAL_WRITE)
            .unwrap_err();
    assert!(e.to_string().contains("zero bytes"), "{e}");
    let e =
        p.b.pd
            .reg_region(&p.b.mem, 0, 4096, Access::REMOTE_WRITE)
            .unwrap_err();
    assert!(e.to_string().contains("requires LOCAL_WRITE"), "{e}");
}

#[test]
fn limits_are_refused_at_post_time() {
    let Some(env) = env(20) else { return };
    let mut p = connect(&env, env.port, caps(), &[], &[]).expect("connect");
    let granted = p.a.qp.caps();
    eprintln!("granted {granted:?}");
    assert!(
        granted.max_send_wr >= 32 && granted.max_inline_data >= 64,
        "{granted:?}"
    );
    let big = vec![0u8; granted.max_inline_data as usize + 1];
    let too_long = SendWr::inline(1, SendOp::Send, &big);
    let e = p.a.qp.post_send(&[too_long]).unwrap_err();
    assert_eq!((e.index, e.kind), (0, PostErrorKind::InlineTooLong));
    let sges = vec![p.a.mr.sge(0, 8); granted.max_send_sge as usize + 1];
    let ok = [p.a.mr.sge(0, 8)];
    let e =
        p.a.qp
            .post_send(&[
                SendWr::signaled(2, SendOp::Write(p.b.remote(0)), &ok),
                SendWr::signaled(3, SendOp::Write(p.b.remote(0)), &sges),
            ])
            .unwrap_err();
    assert_eq!((e.index, e.kind), (1, PostErrorKind::TooManySge));
    // The request before the refused one was posted and completes.
    let (ca, _) = poll_n(&mut p, 1, 0).expect("completion");
    assert!(ca[0].wr_id == 2 && ca[0].is_ok(), "{:?}", ca[0]);
    let e =
        p.a.qp
            .post_send(&[SendWr::inline(4, SendOp::Read(p.b.remote(0)), b"x")])
            .unwrap_err();
    assert_eq!(e.kind, PostErrorKind::Unsupported);
    let rs = vec![p.b.mr.sge(0, 8); granted.max_recv_sge as usize + 1];
    let e =
        p.b.qp
            .post_recv(&[dp_fabric::RecvWr { wr_id: 9, sgl: &rs }])
            .unwrap_err();
    assert_eq!(e.kind, PostErrorKind::TooManySge);
    assert_eq!(p.a.qp.hw_state().expect("query"), QpState::Rts);
}

#[test]
fn sends_before_established_are_refused_and_drop_disconnects_the_peer() {
    let Some(env) = env(30) else { return };
    let addr = SocketAddr::new(env.ip, env.port);
    let pd_a = env.a.alloc_pd().unwrap();
    let pd_b = env.b.alloc_pd().unwrap();
    let (_mem_a, mr_a) = buffer::<Verbs>(&pd_a, 1 << 16).unwrap();
    let cq_a = env.a.create_cq(64).unwrap();
    let mut cq_b = env.b.create_cq(64).unwrap();
    let mut cm_a = env.a.create_cm_channel().unwrap();
    let mut cm_b = env.b.create_cm_channel().unwrap();
    cm_b.listen(addr, 4).unwrap();
    let init_a = QpInit {
        pd: &pd_a,
        send_cq: &cq_a,
        recv_cq: &cq_a,
        caps: caps(),
    };
    let (conn_a, mut qp_a) = cm_a.connect(addr, &init_a, b"req").unwrap();
    // Receives may be posted at once; sends are refused until Established.
    let rsge = [mr_a.sge(0, 64)];
    qp_a.post_recv(&[dp_fabric::RecvWr {
        wr_id: 1,
        sgl: &rsge,
    }])
    .unwrap();
    let e = qp_a
        .post_send(&[SendWr::inline(2, SendOp::Send, b"early")])
        .unwrap_err();
    assert!(
        matches!(
            e.kind,
            PostErrorKind::BadState(QpState::Init | QpState::Rtr)
        ),
        "{e:?}"
    );
    let req = match next_event::<Verbs>(&mut cm_b, "request").unwrap() {
        CmEvent::ConnectRequest { request, .. } => request,
        e => panic!("{e:?}"),
    };
    assert_eq!(req.private_data(), b"req");
    assert_eq!(req.local_addr(), addr);
    assert_eq!(req.peer_addr().ip(), env.ip);
    let init_b = QpInit {
        pd: &pd_b,
        send_cq: &cq_b,
        recv_cq: &cq_b,
        caps: caps(),
    };
    let (conn_b, qp_b) = cm_b.accept(req, &init_b, b"rep").unwrap();
    // The passive side is ready to send as soon as accept returns (as after rdma_accept).
    assert_eq!(qp_b.state(), QpState::Rts);
    match next_event::<Verbs>(&mut cm_a, "established").unwrap() {
        CmEvent::Established { conn, private_data } => {
            assert_eq!(conn, conn_a);
            assert_eq!(private_data.as_bytes(), b"rep");
        }
        e => panic!("{e:?}"),
    }
    let (local, peer) = cm_a.conn_addrs(conn_a).unwrap();
    assert_eq!(peer, addr);
    assert_eq!(local.ip(), env.ip);
    assert!(matches!(
        next_event::<Verbs>(&mut cm_b, "established").unwrap(),
        CmEvent::Established { .. }
    ));
    // Dropping the active queue pair disconnects: the peer learns it, its QP flushes.
    drop(qp_a);
    match next_event::<Verbs>(&mut cm_b, "disconnected").unwrap() {
        CmEvent::Disconnected { conn } => assert_eq!(conn, conn_b),
        e => panic!("{e:?}"),
    }
    assert_eq!(qp_b.state(), QpState::Error);
    let mut out = [Completion::default(); 4];
    assert_eq!(cq_b.poll(&mut out), 0, "nothing was outstanding on b");
    assert!(
        cm_a.disconnect(conn_a).is_err(),
        "the connection went with its queue pair"
    );
}

#[test]
fn raw_private_data_arrives_padded_to_the_cm_field() {
    let cfg = VerbsConfig {
        private_data: PrivateDataFormat::Raw,
        ..VerbsConfig::default()
    };
    let Some(env) = env_with(40, cfg) else { return };
    let addr = SocketAddr::new(env.ip, env.port);
    let pd = env.a.alloc_pd().unwrap();
    let cq = env.a.create_cq(16).unwrap();
    let mut cm_a = env.a.create_cm_channel().unwrap();
    let mut cm_b = env.b.create_cm_channel().unwrap();
    cm_b.listen(addr, 4).unwrap();
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps: caps(),
    };
    let (_c, _qp) = cm_a.connect(addr, &init, b"hello").unwrap();
    let req = match next_event::<Verbs>(&mut cm_b, "request").unwrap() {
        CmEvent::ConnectRequest { request, .. } => request,
        e => panic!("{e:?}"),
    };
    let got = req.private_data();
    eprintln!("REQ private data as received: {} bytes", got.len());
    assert!(got.starts_with(b"hello"));
    assert_eq!(
        got.len(),
        56,
        "IB CM REQ private data field behind the RDMA CM header"
    );
    assert!(got[5..].iter().all(|&b| b == 0));
    cm_b.reject(req, b"no").unwrap();
    match next_event::<Verbs>(&mut cm_a, "rejected").unwrap() {
        CmEvent::Rejected { private_data, .. } => {
            eprintln!(
                "REJ private data as received: {} bytes",
                private_data.as_bytes().len()
            );
            assert!(private_data.as_bytes().starts_with(b"no"));
            assert_eq!(
                private_data.as_bytes().len(),
                148,
                "IB CM REJ private data field"
            );
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn bad_lkey_status_of_this_device() {
    // The conformance suite expects IBV_WC_LOC_PROT_ERR for an invalid local key (IB spec,
    // and what mlx5 reports). Print what this device reports, for the record.
    let Some(env) = env(50) else { return };
    let mut p = connect(&env, env.port, caps(), &[], &[]).expect("connect");
    let mut sge = [p.a.mr.sge(0, 64)];
    sge[0].lkey ^= 0x0077_0000;
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write(p.b.remote(0)),
        payload: Payload::Sgl(&sge),
        flags: SendFlags::SIGNALED,
    };
    p.a.qp.post_send(&[wr]).unwrap();
    let (ca, _) = poll_n(&mut p, 1, 0).unwrap();
    eprintln!(
        "{}: invalid lkey completes with {:?} (raw {})",
        env.a.name(),
        ca[0].status,
        ca[0].status.to_raw()
    );
    assert!(!ca[0].is_ok());
    assert_eq!(p.a.qp.state(), QpState::Error);
}
