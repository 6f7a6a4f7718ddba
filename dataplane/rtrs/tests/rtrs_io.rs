//! The IO path: where a WRITE and a READ put their bytes, per-IO errors, the size rules,
//! permits, `NEED_INVAL` with one-shot client keys, `always_invalidate` with new-rkey
//! responses, the response chains, send-queue room on the server, and the multipath
//! policies (rtrs.md sections 4 and 5.1).

mod common;

use std::time::Duration;

use common::*;
use dp_rtrs::clt::{ClientEvent, DataRef, MpPolicy};
use dp_rtrs::error::{IoError, RtrsError};
use dp_rtrs::permit::{ConType, Wait};
use dp_rtrs::sim::{Call, ClientSide, Net, USR_LEN, check_pattern};
use dp_rtrs::srv::{Resp, ServerEvent};
use dp_rtrs::wire::{
    Geometry, Imm, ImmType, IoRsp, RdmaRead, RdmaReadRepr, RdmaWriteRepr, RkeyRspRepr,
};
use dp_rtrs::work::{Dir, RecvBuf};

fn rq(dir: Dir, usr: &[u8], data: Option<DataRef>, ctx: u64) -> dp_rtrs::clt::Request<'_> {
    dp_rtrs::clt::Request {
        dir,
        usr,
        data,
        ctx,
    }
}

#[test]
fn test_write_places_data_message_and_header_in_chunk() {
    let mut s = open_sim(30, |c| c.server.always_invalidate = false);
    s.handler.hold = true;
    let permits = s.client.permits().unwrap().clone();
    let p = permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
    let id = p.id();
    for (i, b) in s.net.data[..3000].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let usr = *b"user-message-of-24-bytes";
    let data = DataRef {
        region: 0,
        offset: 0,
        len: 3000,
    };
    s.client
        .request(
            s.now,
            &p,
            rq(Dir::Write, &usr, Some(data), 77),
            &mut ClientSide(&mut s.net),
        )
        .unwrap();
    s.run_for(Duration::from_micros(100));
    let sess = s.server.sessions().next().unwrap();
    let c = s.net.chunk(sess, id).unwrap();
    assert!(
        c[..3000]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8),
        "data at [0, 3000)"
    );
    assert_eq!(&c[3000..3024], &usr, "user message behind it");
    let mut hdr = [0u8; 4];
    RdmaWriteRepr { usr_len: 24 }.emit(&mut hdr);
    assert_eq!(&c[3024..3028], &hdr, "the RTRS header behind that");
    let reqs: Vec<_> = std::iter::from_fn(|| s.server.poll_event()).collect();
    let _ = reqs;
    permits.put(p);
}

#[test]
fn test_request_event_and_write_response() {
    let mut ss = ScriptedServer::new(false);
    let conns = ss.path(1, 1, 2, b"h", 1);
    let g = Geometry::new(8, 8192).unwrap();
    let mut hdr = [0u8; 4];
    RdmaWriteRepr { usr_len: 32 }.emit(&mut hdr);
    ss.write_chunk(5, 4096 + 32, &hdr);
    ss.imm(conns[1], Imm::io_req(g.encode(5, 4096 + 32).unwrap()).0);
    let ev = ss.events();
    let Some(ServerEvent::Request {
        op,
        chunk,
        dir,
        data_len,
        usr_len,
        read_len,
        ..
    }) = ev
        .iter()
        .copied()
        .find(|e| matches!(e, ServerEvent::Request { .. }))
    else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (chunk, dir, data_len, usr_len, read_len),
        (5, Dir::Write, 4096, 32, 0)
    );
    ss.io.take();
    assert_eq!(
        ss.server.resp_rdma(ss.now, op, 0, &mut ss.io),
        Ok(Resp::Sent)
    );
    let sent = ss.io.sends(conns[1]);
    assert_eq!(sent.len(), 1, "one RDMA WRITE with immediate, nothing else");
    assert_eq!(sent[0].kind, "WriteImmEmpty");
    let imm = Imm(sent[0].imm.unwrap());
    assert_eq!(imm.ty(), ImmType::IoRsp);
    assert_eq!(
        IoRsp::decode(imm.payload()),
        IoRsp {
            msg_id: 5,
            errno: 0
        }
    );
    let st = ss.server.path_stats(conns[0].path).unwrap();
    assert_eq!(st.rdma_sysfs().to_string(), "0 0 1 4128\n");
}

#[test]
fn test_read_response_chain_writes_data_then_imm() {
    let mut ss = ScriptedServer::new(false);
    let conns = ss.path(1, 1, 2, b"h", 1);
    let g = Geometry::new(8, 8192).unwrap();
    let r = RdmaReadRepr {
        usr_len: 16,
        need_inval: false,
        desc: Some(dp_rtrs::wire::SgDesc {
            addr: 0xAB00,
            key: 0x42,
            len: 4096,
        }),
    };
    let mut hdr = [0u8; 24];
    r.emit(&mut hdr);
    ss.write_chunk(2, 4096 + 16, &hdr);
    ss.imm(conns[1], Imm::io_req(g.encode(2, 4096 + 16).unwrap()).0);
    let Some(ServerEvent::Request { op, read_len, .. }) = ss
        .events()
        .into_iter()
        .find(|e| matches!(e, ServerEvent::Request { .. }))
    else {
        panic!()
    };
    assert_eq!(read_len, 4096);
    ss.io.take();
    ss.server.resp_rdma(ss.now, op, 0, &mut ss.io).unwrap();
    let sent = ss.io.sends(conns[1]);
    let kinds: Vec<_> = sent.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        ["WriteChunk", "WriteImmEmpty"],
        "data first, then the response"
    );
    assert_eq!(
        (sent[0].slot, sent[0].len, sent[0].addr, sent[0].key),
        (Some(2), Some(4096), Some(0xAB00), Some(0x42))
    );
    // A failed read moves no data.
    ss.write_chunk(3, 4096 + 16, &hdr);
    ss.imm(conns[1], Imm::io_req(g.encode(3, 4096 + 16).unwrap()).0);
    let Some(ServerEvent::Request { op, .. }) = ss
        .events()
        .into_iter()
        .find(|e| matches!(e, ServerEvent::Request { .. }))
    else {
        panic!()
    };
    ss.io.take();
    ss.server
        .resp_rdma(ss.now, op, -libc::EIO, &mut ss.io)
        .unwrap();
    let sent = ss.io.sends(conns[1]);
    assert_eq!(
        sent.iter().map(|p| p.kind).collect::<Vec<_>>(),
        ["WriteImmEmpty"]
    );
    assert_eq!(
        IoRsp::decode(Imm(sent[0].imm.unwrap()).payload()),
        IoRsp {
            msg_id: 3,
            errno: -libc::EIO
        }
    );
}

/// `resp_rdma_from`: a READ answered from handler memory posts the same write from the
/// source, and what it refuses (an unknown or short source, a WRITE, a data-less READ)
/// leaves the request waiting for another answer.
#[test]
fn test_read_answered_from_a_source_and_its_refusals() {
    let mut ss = ScriptedServer::new(false);
    ss.io.sources = vec![8192];
    let conns = ss.path(1, 1, 2, b"h", 1);
    let g = Geometry::new(8, 8192).unwrap();
    let read = |len| RdmaReadRepr {
        usr_len: 16,
        need_inval: false,
        desc: (len > 0).then_some(dp_rtrs::wire::SgDesc {
            addr: 0xAB00,
            key: 0x42,
            len,
        }),
    };
    let request = |ss: &mut ScriptedServer, chunk: u16, r: RdmaReadRepr| {
        let mut hdr = [0u8; 24];
        r.emit(&mut hdr);
        ss.write_chunk(chunk, 4096 + 16, &hdr);
        ss.imm(conns[1], Imm::io_req(g.encode(chunk, 4096 + 16).unwrap()).0);
        let Some(ServerEvent::Request { op, .. }) = ss
            .events()
            .into_iter()
            .find(|e| matches!(e, ServerEvent::Request { .. }))
        else {
            panic!("no request")
        };
        ss.io.take();
        op
    };
    let src = |id, offset| dp_rtrs::work::SrcRef { id, offset };
    let op = request(&mut ss, 2, read(4096));
    let err = |ss: &mut ScriptedServer, op, s| ss.server.resp_rdma_from(ss.now, op, s, &mut ss.io);
    assert_eq!(
        err(&mut ss, op, src(1, 0)),
        Err(RtrsError::Source),
        "unknown source"
    );
    assert_eq!(
        err(&mut ss, op, src(0, 4097)),
        Err(RtrsError::Source),
        "too short"
    );
    assert_eq!(
        err(&mut ss, op, src(0, u64::MAX)),
        Err(RtrsError::Source),
        "offset overflow"
    );
    assert!(ss.io.sends(conns[1]).is_empty(), "a refusal posts nothing");
    assert_eq!(err(&mut ss, op, src(0, 4096)), Ok(Resp::Sent));
    let sent = ss.io.sends(conns[1]);
    assert_eq!(
        sent.iter().map(|p| p.kind).collect::<Vec<_>>(),
        ["WriteSource", "WriteImmEmpty"],
        "the data from the source, then the response"
    );
    assert_eq!(
        (sent[0].slot, sent[0].len, sent[0].addr, sent[0].key),
        (Some(0), Some(4096), Some(0xAB00), Some(0x42))
    );
    assert_eq!(
        IoRsp::decode(Imm(sent[1].imm.unwrap()).payload()),
        IoRsp {
            msg_id: 2,
            errno: 0
        }
    );
    assert_eq!(
        err(&mut ss, op, src(0, 0)),
        Err(RtrsError::StaleOp),
        "answered"
    );
    // A READ without data is no zero-copy answer; resp_rdma still answers it.
    let op = request(&mut ss, 3, read(0));
    assert_eq!(err(&mut ss, op, src(0, 0)), Err(RtrsError::NotARead));
    assert_eq!(
        ss.server.resp_rdma(ss.now, op, 0, &mut ss.io),
        Ok(Resp::Sent)
    );
}

#[test]
fn test_need_inval_and_always_invalidate_chains() {
    // NEED_INVAL with always_invalidate: data, REG_MR, SEND_WITH_INV, SEND_WITH_IMM(rkey_rsp)
    // whose immediate is IO_RSP_W_INV (rdma_write_sg).
    let mut ss = ScriptedServer::new(true);
    let conns = ss.path(1, 1, 2, b"h", 1);
    let g = Geometry::new(8, 8192).unwrap();
    let r = RdmaReadRepr {
        usr_len: 8,
        need_inval: true,
        desc: Some(dp_rtrs::wire::SgDesc {
            addr: 0xCD00,
            key: 0x7701,
            len: 512,
        }),
    };
    let mut hdr = [0u8; 24];
    r.emit(&mut hdr);
    ss.write_chunk(4, 600, &hdr);
    ss.io.take();
    ss.imm(conns[1], Imm::io_req(g.encode(4, 600).unwrap()).0);
    // always_invalidate: first the chunk's key is invalidated, the handler waits for it.
    let sent = ss.io.sends(conns[1]);
    assert_eq!(
        sent.iter().map(|p| p.kind).collect::<Vec<_>>(),
        ["LocalInv"]
    );
    let old_key = sent[0].key.unwrap();
    assert!(
        ss.events()
            .iter()
            .all(|e| !matches!(e, ServerEvent::Request { .. })),
        "not before the invalidation"
    );
    let wc = dp_rtrs::work::Wc {
        wr_id: sent[0].wr_id,
        status: dp_fabric::WcStatus::Success,
        opcode: dp_fabric::WcOpcode::Send,
        ..dp_rtrs::work::Wc::default()
    };
    ss.server
        .handle_completion(ss.now, conns[1], &wc, &[], &mut ss.io);
    let Some(ServerEvent::Request { op, .. }) = ss
        .events()
        .into_iter()
        .find(|e| matches!(e, ServerEvent::Request { .. }))
    else {
        panic!()
    };
    ss.io.take();
    ss.server.resp_rdma(ss.now, op, 0, &mut ss.io).unwrap();
    let sent = ss.io.sends(conns[1]);
    let kinds: Vec<_> = sent.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, ["WriteChunk", "RegChunk", "SendInv", "SendImmMsg"]);
    assert_eq!(sent[2].key, Some(0x7701), "invalidates the client's key");
    let new_key = sent[1].key.unwrap();
    assert_eq!(new_key, dp_rtrs::work::inc_rkey(old_key), "ib_inc_rkey");
    let rk = RkeyRspRepr::parse(&dp_rtrs::wire::RkeyRsp::new_checked(&sent[3].bytes[..]).unwrap())
        .unwrap();
    assert_eq!(
        rk,
        RkeyRspRepr {
            buf_id: 4,
            rkey: new_key
        }
    );
    assert_eq!(Imm(sent[3].imm.unwrap()).ty(), ImmType::IoRspWInv);
    // An error response with NEED_INVAL: SEND_WITH_INV, REG_MR, SEND_WITH_IMM
    // (send_io_resp_imm's order).
    ss.write_chunk(5, 600, &hdr);
    ss.imm(conns[1], Imm::io_req(g.encode(5, 600).unwrap()).0);
    let linv = ss.io.sends(conns[1]).last().unwrap().clone();
    let wc = dp_rtrs::work::Wc {
        wr_id: linv.wr_id,
        ..wc
    };
    ss.server
        .handle_completion(ss.now, conns[1], &wc, &[], &mut ss.io);
    let Some(ServerEvent::Request { op, .. }) = ss
        .events()
        .into_iter()
        .find(|e| matches!(e, ServerEvent::Request { .. }))
    else {
        panic!()
    };
    ss.io.take();
    ss.server
        .resp_rdma(ss.now, op, -libc::ENOSPC, &mut ss.io)
        .unwrap();
    let kinds: Vec<_> = ss.io.sends(conns[1]).iter().map(|p| p.kind).collect();
    assert_eq!(kinds, ["SendInv", "RegChunk", "SendImmMsg"]);
}

#[test]
fn test_io_errno_from_handler_delivered() {
    let mut s = open_sim(31, |_| {});
    s.handler.fail_with = Some(-libc::EIO);
    s.app.target = 4;
    s.app.limit = Some(20);
    s.run_for(Duration::from_millis(5));
    assert_eq!(s.app.failed, 20);
    assert!(
        s.app
            .errors
            .iter()
            .all(|(_, e)| *e == IoError::Remote(libc::EIO))
    );
    assert_eq!(IoError::Remote(libc::EIO).errno(), libc::EIO);
}

#[test]
fn test_request_size_rules() {
    let mut s = open_sim(32, |_| {});
    let permits = s.client.permits().unwrap().clone();
    let p = permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
    let io = &mut ClientSide(&mut s.net);
    // User message + 24-byte read header beyond the 4096 bytes of header room.
    let big = vec![0u8; 4096 - 24 + 1];
    let d = DataRef {
        region: 0,
        offset: 0,
        len: 4096,
    };
    assert_eq!(
        s.client
            .request(s.now, &p, rq(Dir::Read, &big, Some(d), 1), io),
        Err(IoError::MsgSize)
    );
    assert!(
        s.client
            .request(s.now, &p, rq(Dir::Read, &big[1..], Some(d), 1), io)
            .is_ok()
    );
    let p2 = permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
    // Data beyond the chunk (16 KiB) with the header.
    let d = DataRef {
        region: 0,
        offset: 0,
        len: 16384 - 4,
    };
    assert_eq!(
        s.client
            .request(s.now, &p2, rq(Dir::Write, &[0; 1], Some(d), 2), io),
        Err(IoError::MsgSize),
        "header + data + message exceed the chunk"
    );
    assert!(
        s.client
            .request(s.now, &p2, rq(Dir::Write, &[], Some(d), 2), io)
            .is_ok()
    );
    permits.put(p);
    permits.put(p2);
}

#[test]
fn test_request_permit_rules() {
    let mut s = open_sim(33, |_| {});
    s.handler.hold = true;
    let permits = s.client.permits().unwrap().clone();
    let p = permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
    let io = &mut ClientSide(&mut s.net);
    assert!(
        s.client
            .request(s.now, &p, rq(Dir::Write, &[1; 16], None, 1), io)
            .is_ok()
    );
    assert_eq!(
        s.client
            .request(s.now, &p, rq(Dir::Write, &[1; 16], None, 1), io),
        Err(IoError::Busy),
        "one request per permit"
    );
    // A permit of another pool.
    let other = dp_rtrs::permit::Permits::new(64, 12345);
    let q = other.get(ConType::Io, 0, Wait::NoWait).unwrap();
    assert_eq!(
        s.client
            .request(s.now, &q, rq(Dir::Write, &[], None, 1), io),
        Err(IoError::BadPermit)
    );
    other.put(q);
    assert!(
        s.client.request_path(p.id()).is_some(),
        "in flight on a path"
    );
    permits.put(p);
}

#[test]
fn test_admin_permit_goes_on_cid_0_io_permit_by_lane() {
    let mut sc = Scripted::new(3);
    let c0 = sc.connect();
    let permits = sc.client.permits().unwrap().clone();
    let admin = permits.get(ConType::Admin, 5, Wait::NoWait).unwrap();
    sc.client
        .request(sc.now, &admin, rq(Dir::Read, &[0; 36], None, 1), &mut sc.io)
        .unwrap();
    assert!(
        sc.io.sends(c0).iter().any(|p| p.kind == "IoRequest"),
        "admin: connection 0"
    );
    let io5 = permits.get(ConType::Io, 5, Wait::NoWait).unwrap();
    sc.io.take();
    sc.client
        .request(sc.now, &io5, rq(Dir::Write, &[0; 8], None, 2), &mut sc.io)
        .unwrap();
    let cid = sc
        .io
        .calls
        .iter()
        .find_map(|c| match c {
            Call::Send(k, v) if v.iter().any(|p| p.kind == "IoRequest") => Some(k.cid),
            _ => None,
        })
        .unwrap();
    assert_eq!(cid, 5 % 3 + 1, "lane % io connections + 1");
}

#[test]
fn test_io_request_imm_and_remote_address() {
    let mut sc = Scripted::new(1);
    let _ = sc.connect();
    let permits = sc.client.permits().unwrap().clone();
    let p = permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
    sc.io.take();
    let d = DataRef {
        region: 0,
        offset: 0x100,
        len: 2048,
    };
    sc.client
        .request(sc.now, &p, rq(Dir::Read, &[9; 32], Some(d), 1), &mut sc.io)
        .unwrap();
    let io = sc
        .io
        .calls
        .iter()
        .find_map(|c| match c {
            Call::Send(_, v) => v.iter().find(|p| p.kind == "IoRequest").cloned(),
            _ => None,
        })
        .unwrap();
    let g = Geometry::new(8, 8192).unwrap();
    let id = p.id();
    assert_eq!(
        io.imm,
        Some(Imm::io_req(g.encode(id, 2048 + 32).unwrap()).0),
        "header offset: data + message"
    );
    assert_eq!(
        io.addr,
        Some(0x5000_0000 + u64::from(id) * 8192 + 2048),
        "a READ writes behind the data room"
    );
    assert_eq!(
        io.key,
        Some(0x100 + u32::from(id)),
        "the chunk's key from the info response"
    );
    assert_eq!(
        io.len,
        Some(32 + 24),
        "message + read header with one descriptor"
    );
    let iu = &sc.io.iu[&id];
    let hdr = RdmaReadRepr::parse(&RdmaRead::new_checked(&iu[32..56]).unwrap(), 8192).unwrap();
    assert_eq!(hdr.desc.unwrap().len, 2048);
    assert_eq!(hdr.desc.unwrap().addr, 0x7000_0000_0000 + 0x100);
    assert!(
        !hdr.need_inval,
        "a long-lived registration is not invalidated"
    );
    permits.put(p);
}

#[test]
fn test_need_inval_server_invalidates_client_key() {
    let mut s = open_sim(34, |c| {
        c.per_io_registration = true;
        c.server.always_invalidate = false;
        c.paths = 1;
    });
    s.app.target = 8;
    s.app.read_pct = 100;
    s.app.limit = Some(200);
    s.net.record_server_chains = true;
    s.run_for(Duration::from_millis(20));
    assert_eq!((s.app.ok, s.app.failed, s.app.verify_errors), (200, 0, 0));
    assert!(
        s.net
            .server_chains
            .iter()
            .any(|(_, k)| k.as_slice() == ["WriteChunk", "SendInv", "WriteImmEmpty"]),
        "the server answered with SEND_WITH_INV"
    );
    // Every one-shot key is dead after its completion.
    for slot in 0..64u16 {
        for rot in 1..=8u32 {
            let key = 0x8000_0000 | (u32::from(slot) << 8) | rot;
            assert!(!s.net.client_key_valid(key), "key {key:#x} still valid");
        }
    }
}

#[test]
fn test_one_shot_write_key_invalidated_locally() {
    let mut sc = Scripted::new(1);
    sc.io.per_io_registration = true;
    let _c0 = sc.connect();
    let permits = sc.client.permits().unwrap().clone();
    let p = permits.get(ConType::Io, 0, Wait::NoWait).unwrap();
    let d = DataRef {
        region: 0,
        offset: 0,
        len: 100,
    };
    sc.io.take();
    sc.client
        .request(sc.now, &p, rq(Dir::Write, &[1; 8], Some(d), 9), &mut sc.io)
        .unwrap();
    let (conn, chain) = sc
        .io
        .calls
        .iter()
        .find_map(|c| match c {
            Call::Send(k, v) => Some((*k, v.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        chain.iter().map(|p| p.kind).collect::<Vec<_>>(),
        ["Register", "IoRequest"]
    );
    let key = chain[0].key.unwrap();
    sc.io.take();
    sc.imm(
        conn,
        IoRsp {
            msg_id: u32::from(p.id()),
            errno: 0,
        }
        .imm(false)
        .0,
    );
    assert!(sc.events().is_empty(), "not complete before our LOCAL_INV");
    let linv = sc
        .io
        .sends(conn)
        .into_iter()
        .find(|p| p.kind == "LocalInv")
        .unwrap();
    assert_eq!(linv.key, Some(key));
    let wc = dp_rtrs::work::Wc {
        wr_id: linv.wr_id,
        status: dp_fabric::WcStatus::Success,
        opcode: dp_fabric::WcOpcode::Send,
        ..dp_rtrs::work::Wc::default()
    };
    sc.client
        .handle_completion(sc.now, conn, &wc, &[], &mut sc.io);
    assert_eq!(
        sc.events(),
        [ClientEvent::Completed {
            id: p.id(),
            ctx: 9,
            result: Ok(())
        }]
    );
    permits.put(p);
}

#[test]
fn test_always_invalidate_rotates_chunk_keys() {
    let mut s = open_sim(35, |c| c.paths = 1);
    let sp = s.server.paths().next().unwrap();
    let cp = s.paths[0];
    let k0 = s.server.debug_chunk_key(sp, 0).unwrap();
    assert_eq!(s.client.debug_rbuf(cp, 0).unwrap().1, k0);
    s.app.target = 64;
    s.app.limit = Some(64 * 5);
    s.run_for(Duration::from_millis(20));
    assert_eq!((s.app.ok, s.app.failed, s.app.verify_errors), (320, 0, 0));
    let k = s.server.debug_chunk_key(sp, 0).unwrap();
    assert_ne!(k, k0, "rotated");
    assert_eq!(
        k & !0xFF,
        k0 & !0xFF,
        "the same registration, a new consumer key"
    );
    assert_eq!(
        s.client.debug_rbuf(cp, 0).unwrap().1,
        k,
        "the client learnt it from rkey_rsp"
    );
    assert!(!s.net.server_key_valid(k0), "the old key is dead");
    assert!(s.net.server_key_valid(k));
}

#[test]
fn test_always_invalidate_off_plain_responses() {
    let mut s = open_sim(36, |c| {
        c.server.always_invalidate = false;
        c.paths = 1;
    });
    s.net.record_server_chains = true;
    s.app.target = 8;
    s.app.limit = Some(100);
    s.run_for(Duration::from_millis(10));
    assert_eq!(s.app.ok, 100);
    let kinds: std::collections::BTreeSet<_> =
        s.net.server_chains.iter().map(|(_, k)| k.clone()).collect();
    for k in &kinds {
        assert!(
            !k.iter().any(|x| x == "RegChunk" || x == "SendImmMsg"),
            "{k:?}"
        );
    }
}

#[test]
fn test_server_response_waits_for_send_queue_room() {
    // A server path whose send queue never reports completions fills up; answers are queued
    // and go out, in order, as a signalled completion returns room.
    let mut ss = ScriptedServer::new(false);
    let conns = ss.path(1, 1, 2, b"h", 1);
    let g = Geometry::new(8, 8192).unwrap();
    let mut hdr = [0u8; 4];
    RdmaWriteRepr { usr_len: 0 }.emit(&mut hdr);
    // Queue size of an IO connection with qd 8, always_invalidate off: 8 * 3 + 1 = 25.
    let mut answered = 0u32;
    let mut queued = 0u32;
    let mut ops = Vec::new();
    for round in 0..40 {
        let chunk = (round % 8) as u16;
        ss.write_chunk(chunk, 64, &hdr);
        ss.imm(conns[1], Imm::io_req(g.encode(chunk, 64).unwrap()).0);
        let Some(ServerEvent::Request { op, .. }) = ss
            .events()
            .into_iter()
            .find(|e| matches!(e, ServerEvent::Request { .. }))
        else {
            panic!("round {round}")
        };
        match ss.server.resp_rdma(ss.now, op, 0, &mut ss.io).unwrap() {
            Resp::Sent => answered += 1,
            Resp::Queued => {
                queued += 1;
                ops.push(op);
                break;
            }
            Resp::Dropped => panic!(),
        }
    }
    assert!(
        queued == 1 && answered >= 21,
        "answered {answered} before the queue filled"
    );
    assert_eq!(
        ss.server
            .path_stats(conns[0].path)
            .unwrap()
            .queued_responses,
        1
    );
    // A signalled completion frees its batch: the queued answer goes out.
    let last_signalled = ss
        .io
        .sends(conns[1])
        .into_iter()
        .rfind(|p| p.signaled)
        .expect("signalled every interval");
    let before = ss.io.sends(conns[1]).len();
    let wc = dp_rtrs::work::Wc {
        wr_id: last_signalled.wr_id,
        status: dp_fabric::WcStatus::Success,
        opcode: dp_fabric::WcOpcode::RdmaWrite,
        ..dp_rtrs::work::Wc::default()
    };
    ss.server
        .handle_completion(ss.now, conns[1], &wc, &[], &mut ss.io);
    assert_eq!(
        ss.io.sends(conns[1]).len(),
        before + 1,
        "the queued response was posted"
    );
}

fn shares(s: &dp_rtrs::sim::Sim) -> (u64, u64) {
    let n = |k: usize| {
        let st = s.client.path_stats(s.paths[k]).unwrap();
        st.rdma.read_cnt + st.rdma.write_cnt
    };
    (n(0), n(1))
}

#[test]
fn test_policy_round_robin_alternates() {
    let mut s = open_sim(37, |c| c.client.policy = MpPolicy::RoundRobin);
    s.app.target = 1;
    s.app.limit = Some(100);
    s.run_for(Duration::from_millis(20));
    assert_eq!(shares(&s), (50, 50), "one each, in turn");
}

#[test]
fn test_policy_min_inflight_avoids_slow_path() {
    let mut s = open_sim(38, |c| c.client.policy = MpPolicy::MinInflight);
    s.net.links[1].latency = Duration::from_micros(200);
    load(&mut s, 16, Duration::from_millis(20));
    let (fast, slow) = shares(&s);
    assert!(fast > 5 * slow, "fast {fast}, slow {slow}");
}

#[test]
fn test_policy_min_latency_prefers_measured_fast_path() {
    let mut s = open_sim(39, |c| {
        c.client.policy = MpPolicy::MinLatency;
        c.client.hb_interval = Duration::from_millis(10);
    });
    s.net.links[0].latency = Duration::from_micros(300);
    s.run_for(Duration::from_millis(25)); // heartbeats measured both paths
    let l0 = s.client.path_latency(s.paths[0]).unwrap();
    let l1 = s.client.path_latency(s.paths[1]).unwrap();
    assert!(l0 > l1);
    s.app.target = 1;
    s.app.limit = Some(50);
    s.run_for(Duration::from_millis(20));
    let (slow, fast) = shares(&s);
    assert_eq!(
        (slow, fast),
        (0, 50),
        "every IO on the path with the smaller round trip"
    );
}

#[test]
fn test_policy_changes_at_run_time() {
    let mut s = open_sim(40, |c| c.client.policy = MpPolicy::MinLatency);
    assert_eq!(s.client.policy(), MpPolicy::MinLatency);
    s.client.set_policy(MpPolicy::RoundRobin);
    s.app.target = 1;
    s.app.limit = Some(10);
    s.run_for(Duration::from_millis(5));
    assert_eq!(shares(&s), (5, 5));
}

#[test]
fn test_query_attrs() {
    let s = open_sim(41, |_| {});
    let a = s.client.query().unwrap();
    assert_eq!(a.queue_depth, 64);
    assert_eq!(a.max_io_size, 12288, "min(max_io_size, 128 pages)");
    assert_eq!(a.max_segments, 128);
}

#[test]
fn test_stats_count_usr_and_data_bytes() {
    let mut s = open_sim(42, |c| c.paths = 1);
    s.app.target = 1;
    s.app.limit = Some(10);
    s.app.io_size = 1000;
    s.run_for(Duration::from_millis(5));
    let st = s.client.path_stats(s.paths[0]).unwrap();
    assert_eq!(st.rdma.read_cnt + st.rdma.write_cnt, 10);
    assert_eq!(
        st.rdma.read_bytes + st.rdma.write_bytes,
        10 * (1000 + USR_LEN as u64)
    );
    assert_eq!(st.inflight, 0);
}

#[test]
fn test_read_data_lands_in_client_buffer_and_is_checked() {
    let mut s = open_sim(43, |c| c.paths = 1);
    s.app.target = 4;
    s.app.read_pct = 0;
    s.app.limit = Some(64);
    s.run_for(Duration::from_millis(5));
    assert_eq!((s.app.ok, s.app.verify_errors), (64, 0));
    s.app.read_pct = 100;
    s.app.limit = Some(128);
    s.run_for(Duration::from_millis(5));
    assert_eq!(
        (s.app.ok, s.app.verify_errors),
        (128, 0),
        "reads return the last writes"
    );
    // The check can fail: a disk that lost its writes is noticed.
    for v in s.handler.disk.values_mut() {
        *v += 1000;
    }
    s.app.limit = Some(160);
    s.run_for(Duration::from_millis(5));
    assert!(s.app.verify_errors > 0);
    assert!(check_pattern(1, &{
        let mut b = [0u8; 64];
        dp_rtrs::sim::fill_pattern(1, &mut b);
        b
    }));
    let _ = (Net::data_addr(), RecvBuf::Empty);
}

/// READs answered from handler memory (`resp_rdma_from`) return the same bytes as READs
/// answered from the chunk, over the simulated fabric; the check fails when the source
/// holds the wrong data.
#[test]
fn test_reads_answered_from_a_source_land_and_are_checked() {
    let mut s = open_sim(44, |c| c.paths = 2);
    s.app.target = 8;
    s.app.read_pct = 0;
    s.app.limit = Some(64);
    s.run_for(Duration::from_millis(5));
    assert_eq!((s.app.ok, s.app.verify_errors), (64, 0));
    s.handler.from_source = true;
    s.net.record_server_chains = true;
    s.app.read_pct = 100;
    s.app.limit = Some(192);
    s.run_for(Duration::from_millis(5));
    assert_eq!(
        (s.app.ok, s.app.failed, s.app.verify_errors),
        (192, 0, 0),
        "reads from the source return the last writes"
    );
    let from_source = s
        .net
        .server_chains
        .iter()
        .filter(|(_, c)| c.iter().any(|w| w.starts_with("WriteSource")))
        .count();
    assert!(
        from_source >= 128,
        "{from_source} chains wrote from the source"
    );
    for v in s.handler.disk.values_mut() {
        *v += 1000;
    }
    s.app.limit = Some(224);
    s.run_for(Duration::from_millis(5));
    assert!(
        s.app.verify_errors > 0,
        "a source with the wrong data is noticed"
    );
}
