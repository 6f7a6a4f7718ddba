//! Connection set-up: connect requests and responses, the `first_conn` rule, sessions and
//! paths on the server, the info exchange and its chunk table (rtrs.md section 3).

mod common;

use std::time::Duration;

use common::*;
use dp_rtrs::clt::{ClientConfig, ClientEvent, ClientState};
use dp_rtrs::error::{PathError, Violation};
use dp_rtrs::sim::{Call, Recorder, Sim, SimConfig};
use dp_rtrs::srv::{Server, ServerEvent, ServerState};
use dp_rtrs::timer::Instant;
use dp_rtrs::wire::{
    Bad, ConnReq, ConnReqRepr, ConnRsp, ConnRspRepr, InfoReq, InfoReqRepr, InfoRsp, MSG_NEW_RKEY_F,
    PathName, SgDesc,
};
use dp_rtrs::work::{CmEvent, RecvBuf};

fn conn_req(c: &[u8; 56]) -> ConnReqRepr {
    ConnReqRepr::parse(&ConnReq::new_checked(&c[..]).unwrap()).unwrap()
}

fn rsp(c: &[u8; 56]) -> ConnRspRepr {
    ConnRspRepr::parse(&ConnRsp::new_checked(&c[..]).unwrap()).unwrap()
}

#[test]
fn test_connect_cids_one_by_one_with_conn_req() {
    let mut sc = Scripted::new(3);
    let a = accept(8, 4096, 4096, 0);
    for want in 0..4u16 {
        let cs = sc.connects();
        assert_eq!(cs.len(), 1, "one connection at a time");
        let (conn, pdata) = cs[0];
        let r = conn_req(&pdata);
        assert_eq!(
            (conn.cid, r.cid, r.cid_num, r.recon_cnt),
            (want, want, 4, 1)
        );
        assert_eq!(r.path_uuid, [9; 16]);
        assert_eq!(r.sess_uuid, [3; 16]);
        assert!(r.first_conn, "the first path of an open carries first_conn");
        sc.client.handle_cm(
            sc.now,
            conn,
            CmEvent::Established { private_data: &a },
            &mut sc.io,
        );
    }
    assert!(
        sc.connects().is_empty(),
        "then the info exchange, no more connects"
    );
}

#[test]
fn test_info_exchange_after_last_cid() {
    let mut sc = Scripted::new(2);
    let c0 = sc.accept_all(accept(8, 4096, 4096, 0));
    let calls = sc.io.take();
    let recv = calls.iter().find_map(|c| match c {
        Call::Recv(k, _, RecvBuf::InfoRsp(n)) if *k == c0 => Some(*n),
        _ => None,
    });
    assert_eq!(recv, Some(8 + 16 * 8), "a receive sized for qd descriptors");
    let sent = sc.io.sends(c0);
    let _ = sent;
    let info = calls
        .iter()
        .find_map(|c| match c {
            Call::Send(k, v) if *k == c0 => Some(v[0].bytes.clone()),
            _ => None,
        })
        .expect("info_req sent on cid 0");
    let r = InfoReqRepr::parse(&InfoReq::new_checked(&info[..]).unwrap()).unwrap();
    assert_eq!(r.pathname.as_bytes(), b"scripted");
    assert_eq!(sc.client.path_state(sc.path), Some(ClientState::Connecting));
    let table = sc.info_rsp();
    sc.deliver_info(c0, &table);
    assert_eq!(sc.client.path_state(sc.path), Some(ClientState::Connected));
    let ev = sc.events();
    assert!(ev.contains(&ClientEvent::Opened {
        queue_depth: 8,
        max_io_size: 4096
    }));
    // Every connection got its IO receives: 2 x 512 on cid 0, 2 x qd on the others.
    let n0 = sc.io.recvs.get(&c0).map_or(0, |q| q.len());
    assert_eq!(n0, 1024);
}

#[test]
fn test_info_rsp_bad_table_fails_open() {
    let mut sc = Scripted::new(1);
    let c0 = sc.accept_all(accept(8, 4096, 4096, 0));
    // 3 descriptors cannot divide a queue depth of 8.
    let d = SgDesc {
        addr: 0x1000,
        key: 1,
        len: 8192,
    };
    let mut b = vec![0u8; InfoRsp::<&[u8]>::len_for(3)];
    InfoRsp::new_unchecked(&mut b[..]).emit(&[d, d, d]);
    sc.deliver_info(c0, &b);
    let ev = sc.events();
    assert!(
        ev.iter().any(|e| matches!(
            e,
            ClientEvent::OpenFailed {
                error: PathError::Violation(Violation::Wire(Bad::SgCount)),
                ..
            }
        )),
        "{ev:?}"
    );
    let stats = sc.client.path_stats(sc.path);
    assert!(stats.is_none_or(|s| s.protocol_errors == 1));
}

#[test]
fn test_info_rsp_truncated_table_fails_open() {
    let mut sc = Scripted::new(1);
    let c0 = sc.accept_all(accept(8, 4096, 4096, 0));
    let mut b = sc.info_rsp();
    b.truncate(b.len() - 1); // sg_cnt announces one descriptor more than arrived
    sc.deliver_info(c0, &b);
    assert!(sc.events().iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Violation(Violation::Wire(Bad::Truncated)),
            ..
        }
    )));
}

#[test]
fn test_conn_rsp_bad_magic_or_major_fails() {
    let mut sc = Scripted::new(1);
    let cs = sc.connects();
    let mut a = accept(8, 4096, 4096, 0);
    a[3] = 3; // major 3
    sc.client.handle_cm(
        sc.now,
        cs[0].0,
        CmEvent::Established { private_data: &a },
        &mut sc.io,
    );
    assert!(sc.events().iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Violation(Violation::Wire(Bad::Version)),
            ..
        }
    )));
}

#[test]
fn test_conn_rsp_minor_version_ignored() {
    let mut sc = Scripted::new(1);
    let mut a = accept(8, 4096, 4096, 0);
    a[2] = 9; // version 2.9
    let c0 = sc.accept_all(a);
    let info = sc.info_rsp();
    sc.deliver_info(c0, &info);
    assert_eq!(sc.client.path_state(sc.path), Some(ClientState::Connected));
}

#[test]
fn test_conn_rsp_imm_budget_checked() {
    let mut sc = Scripted::new(1);
    // 4096 chunks of 128 KiB need 12 + 17 bits: more than the 28 of the immediate.
    let cs = sc.connects();
    let a = accept(4096, 126_976, 4096, 0);
    sc.client.handle_cm(
        sc.now,
        cs[0].0,
        CmEvent::Established { private_data: &a },
        &mut sc.io,
    );
    assert!(sc.events().iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Violation(Violation::Wire(Bad::ImmBudget)),
            ..
        }
    )));
}

#[test]
fn test_conn_rejected_with_errno() {
    let mut sc = Scripted::new(1);
    let cs = sc.connects();
    let r = ConnRspRepr::reject(-(libc::EBUSY as i16)).to_bytes();
    sc.client.handle_cm(
        sc.now,
        cs[0].0,
        CmEvent::Rejected { private_data: &r },
        &mut sc.io,
    );
    assert!(sc.events().iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Rejected(-16),
            ..
        }
    )));
}

#[test]
fn test_connect_timeout_30s() {
    let mut sc = Scripted::new(1);
    sc.client.handle_timeout(ms(29_900), &mut sc.io);
    assert!(sc.events().is_empty());
    assert_eq!(sc.client.poll_timeout(), Some(ms(30_000)));
    sc.client.handle_timeout(ms(30_000), &mut sc.io);
    assert!(sc.events().iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Timeout,
            ..
        }
    )));
}

#[test]
fn test_open_fails_if_any_path_fails() {
    let mut cfg = SimConfig::new(1);
    cfg.paths = 2;
    let mut s = Sim::new(cfg);
    s.net.set_link(1, false);
    s.run_for(Duration::from_secs(3));
    let failed = client_events(&s, |e| matches!(e, ClientEvent::OpenFailed { .. }));
    assert_eq!(failed.len(), 1);
    assert!(matches!(
        failed[0].1,
        ClientEvent::OpenFailed {
            error: PathError::Unreachable,
            ..
        }
    ));
    assert!(client_events(&s, |e| *e == ClientEvent::Closed).len() == 1);
    assert!(s.client.permits().is_none(), "no permits: the open failed");
    // The server drops the half-made session: path 0 was disconnected, and path 1 (which
    // starts once path 0 is up, as Linux opens paths one by one) never reached it.
    assert_eq!(s.server.sessions().count(), 0, "{:?}", s.server_log);
    s.run_for(dp_rtrs::srv::ESTABLISH_TIMEOUT);
    assert_eq!(s.server.sessions().count(), 0, "{:?}", s.server_log);
}

#[test]
fn test_server_session_shared_by_paths() {
    let s = open_sim(2, |_| {});
    let sess: Vec<_> = s.server.sessions().collect();
    assert_eq!(sess.len(), 1, "both paths joined one session");
    assert_eq!(s.server.session_paths(sess[0]).len(), 2);
    assert_eq!(
        server_events(&s, |e| matches!(e, ServerEvent::Link { .. })).len(),
        1,
        "CONNECTED once, for the first path"
    );
    for p in s.server.paths() {
        assert_eq!(s.server.path_state(p), Some(ServerState::Connected));
        assert_eq!(s.server.path_name(p).unwrap().as_bytes(), b"simsess");
    }
}

/// A server driven by hand.
fn scripted_server(always_inv: bool) -> (Server, Recorder) {
    let ss = ScriptedServer::new(always_inv);
    (ss.server, ss.io)
}

fn req_bytes(cid: u16, cid_num: u16, first: bool, path: u8, sess: u8) -> [u8; 56] {
    ConnReqRepr {
        version: 0x0200,
        cid,
        cid_num,
        recon_cnt: 1,
        path_uuid: [path; 16],
        sess_uuid: [sess; 16],
        first_conn: first,
    }
    .to_bytes()
}

fn last_reply(io: &mut Recorder) -> Result<[u8; 56], [u8; 56]> {
    match io
        .take()
        .into_iter()
        .rev()
        .find(|c| matches!(c, Call::Accept(..) | Call::Reject(..)))
    {
        Some(Call::Accept(_, _, p)) => Ok(p),
        Some(Call::Reject(_, p)) => Err(p),
        _ => panic!("no answer"),
    }
}

#[test]
fn test_server_accept_carries_geometry_and_new_rkey() {
    let (mut srv, mut io) = scripted_server(true);
    srv.handle_connect_request(Instant::ZERO, 1, 1, &req_bytes(0, 2, true, 1, 1), &mut io);
    let r = rsp(&last_reply(&mut io).unwrap());
    assert_eq!(
        (r.errno, r.queue_depth, r.max_io_size, r.max_hdr_size),
        (0, 8, 4096, 4096)
    );
    assert_eq!(r.flags, MSG_NEW_RKEY_F);
    let (mut srv, mut io) = scripted_server(false);
    srv.handle_connect_request(Instant::ZERO, 1, 1, &req_bytes(0, 2, true, 1, 1), &mut io);
    assert_eq!(rsp(&last_reply(&mut io).unwrap()).flags, 0);
}

#[test]
fn test_server_rejects_unknown_session_without_first_conn() {
    let (mut srv, mut io) = scripted_server(false);
    srv.handle_connect_request(Instant::ZERO, 1, 1, &req_bytes(0, 2, false, 1, 1), &mut io);
    assert_eq!(
        rsp(&last_reply(&mut io).unwrap_err()).errno,
        -(libc::ENXIO as i16)
    );
    assert_eq!(srv.sessions().count(), 0);
}

#[test]
fn test_server_rejects_cid_num_above_4096() {
    let (mut srv, mut io) = scripted_server(false);
    srv.handle_connect_request(
        Instant::ZERO,
        1,
        1,
        &req_bytes(0, 4097, true, 1, 1),
        &mut io,
    );
    assert_eq!(
        rsp(&last_reply(&mut io).unwrap_err()).errno,
        -(libc::ECONNRESET as i16)
    );
    assert_eq!(srv.stats().malformed_conn_reqs, 1);
    assert_eq!(srv.sessions().count(), 0, "nothing allocated for it");
}

#[test]
fn test_server_rejects_bad_conn_req() {
    let (mut srv, mut io) = scripted_server(false);
    let mut b = req_bytes(0, 2, true, 1, 1);
    b[2] = 0; // magic
    srv.handle_connect_request(Instant::ZERO, 1, 1, &b, &mut io);
    assert!(last_reply(&mut io).is_err());
    srv.handle_connect_request(Instant::ZERO, 2, 1, &b[..40], &mut io);
    assert!(last_reply(&mut io).is_err(), "short private data");
    assert_eq!(srv.stats().malformed_conn_reqs, 2);
}

#[test]
fn test_server_rejects_duplicate_cid_and_cid_num_mismatch() {
    let (mut srv, mut io) = scripted_server(false);
    srv.handle_connect_request(Instant::ZERO, 1, 1, &req_bytes(0, 3, true, 1, 1), &mut io);
    assert!(last_reply(&mut io).is_ok());
    srv.handle_connect_request(Instant::ZERO, 2, 1, &req_bytes(0, 3, true, 1, 1), &mut io);
    assert!(last_reply(&mut io).is_err(), "cid 0 exists already");
    srv.handle_connect_request(Instant::ZERO, 3, 1, &req_bytes(1, 4, true, 1, 1), &mut io);
    assert!(
        last_reply(&mut io).is_err(),
        "cid_num differs from the path's"
    );
    srv.handle_connect_request(Instant::ZERO, 4, 1, &req_bytes(1, 3, false, 1, 1), &mut io);
    assert!(
        last_reply(&mut io).is_ok(),
        "a later cid of a known session needs no first_conn"
    );
}

#[test]
fn test_server_rejects_second_path_with_same_address() {
    let (mut srv, mut io) = scripted_server(false);
    srv.handle_connect_request(Instant::ZERO, 1, 7, &req_bytes(0, 1, true, 1, 1), &mut io);
    assert!(last_reply(&mut io).is_ok());
    srv.handle_connect_request(Instant::ZERO, 2, 7, &req_bytes(0, 1, true, 2, 1), &mut io);
    assert_eq!(
        rsp(&last_reply(&mut io).unwrap_err()).errno,
        -(libc::EEXIST as i16)
    );
    srv.handle_connect_request(Instant::ZERO, 3, 8, &req_bytes(0, 1, true, 2, 1), &mut io);
    assert!(
        last_reply(&mut io).is_ok(),
        "another address is another path"
    );
}

#[test]
fn test_server_pathname_rules() {
    // A name with '.' is refused: the path is closed.
    let (mut srv, mut io) = scripted_server(false);
    srv.handle_connect_request(Instant::ZERO, 1, 1, &req_bytes(0, 1, true, 1, 1), &mut io);
    let Some(Call::Accept(_, conn, _)) = io
        .take()
        .into_iter()
        .find(|c| matches!(c, Call::Accept(..)))
    else {
        panic!("accepted")
    };
    let (wr_id, _) = io.pop_recv(conn).unwrap();
    let mut b = [0u8; 272];
    b[2..6].copy_from_slice(b"a.b\0");
    let wc = dp_rtrs::work::Wc {
        wr_id,
        status: dp_fabric::WcStatus::Success,
        opcode: dp_fabric::WcOpcode::Recv,
        byte_len: 272,
        imm: None,
        invalidated: None,
    };
    srv.handle_completion(Instant::ZERO, conn, &wc, &b, &mut io);
    assert_eq!(srv.path_state(conn.path), None, "closed and gone");
    assert!(
        io.take()
            .iter()
            .any(|c| matches!(c, Call::ClosePath(p) if *p == conn.path))
    );
}

#[test]
fn test_server_pathname_of_another_session_eperm() {
    let mut ss = ScriptedServer::new(false);
    let a = ss.path(1, 1, 2, b"host-a", 1);
    assert_eq!(
        ss.server.path_state(a[0].path),
        Some(ServerState::Connected)
    );
    // Another session (another UUID) may not use the name: -EPERM, its path is closed.
    let b = ss.path(2, 2, 2, b"host-a", 2);
    assert_eq!(ss.server.path_state(b[0].path), None);
    assert_eq!(ss.server.sessions().count(), 1, "and its session freed");
    // A second path of the same session may (it is the same client).
    let c = ss.path(1, 3, 2, b"host-a", 3);
    assert_eq!(
        ss.server.path_state(c[0].path),
        Some(ServerState::Connected)
    );
}

#[test]
fn test_server_info_req_before_all_cids_closes() {
    let mut ss = ScriptedServer::new(false);
    let r = ConnReqRepr {
        version: 0x0200,
        cid: 0,
        cid_num: 3,
        recon_cnt: 1,
        path_uuid: [1; 16],
        sess_uuid: [1; 16],
        first_conn: true,
    };
    let c0 = ss.connect(&r, 1).unwrap();
    let mut b = [0u8; 272];
    b[2] = b'x';
    ss.send(c0, &b);
    assert_eq!(
        ss.server.path_state(c0.path),
        None,
        "closed: cids 1 and 2 are missing"
    );
    assert!(ss.io.calls.iter().any(|c| matches!(c, Call::ClosePath(_))));
}

#[test]
fn test_client_pathname_must_be_valid() {
    assert!(ClientConfig::new(b"a.b", [0; 16]).is_err());
    assert!(ClientConfig::new(b"a/b", [0; 16]).is_err());
    assert!(ClientConfig::new(b"", [0; 16]).is_err());
    assert!(PathName::new(&[b'x'; 255]).is_ok());
    assert!(PathName::new(&[b'x'; 256]).is_err());
}

#[test]
fn test_info_rsp_chunk_table_matches_server() {
    let s = open_sim(4, |c| c.server.always_invalidate = false);
    // Regions of 16 chunks (the sim's driver makes 4 regions for qd 64): the client sliced
    // them into one (address, key) per chunk.
    let p = s.paths[0];
    let (a0, k0) = s.client.debug_rbuf(p, 0).unwrap();
    let (a17, k17) = s.client.debug_rbuf(p, 17).unwrap();
    assert_eq!(a17 - a0, 17 * 16384, "one address per chunk, in order");
    assert_ne!(k0, k17, "chunk 17 is in the second region");
    let (_, k15) = s.client.debug_rbuf(p, 15).unwrap();
    assert_eq!(k0, k15);
    // The other path has its own registration of the same chunks.
    let (b0, l0) = s.client.debug_rbuf(s.paths[1], 0).unwrap();
    assert_eq!(a0, b0, "the same memory");
    assert_ne!(k0, l0, "another path, another key");
}

#[test]
fn test_first_conn_set_for_reconnect_on_any_path() {
    // After a path connected once, its reconnects carry first_conn (for_new_clt): a server
    // that rebooted and lost the session accepts them.
    let mut s = open_sim(5, |_| {});
    let p1 = s.paths[1];
    let epoch = s.client.path_epoch(p1).unwrap();
    // Reboot: the server forgets everything (new server, same fabric).
    let cfg = *s.server.config();
    s.server
        .close(s.now, &mut dp_rtrs::sim::ServerSide(&mut s.net));
    s.run_for(Duration::from_millis(1));
    s.server = Server::new(cfg).unwrap();
    let ok = s.run_until_cond(Duration::from_secs(10), |s| {
        s.client.path_epoch(p1).unwrap() > epoch
            && s.client.path_state(p1) == Some(ClientState::Connected)
    });
    assert!(
        ok,
        "path 1 reconnected to a fresh server: {:?}",
        s.client_log
    );
    assert_eq!(s.server.sessions().count(), 1);
}

#[test]
fn test_queue_depth_changed_stops_reconnect() {
    let mut sc = Scripted::new(1);
    let _c0 = sc.connect();
    let p = sc.path;
    sc.client.reconnect_path(sc.now, p, &mut sc.io).unwrap();
    sc.now = ms(2000);
    sc.client.handle_timeout(sc.now, &mut sc.io); // reconnect due
    sc.now = ms(3100);
    sc.client.handle_timeout(sc.now, &mut sc.io); // backoff over: connect
    let cs = sc.connects();
    assert_eq!(cs.len(), 1);
    assert_eq!(conn_req(&cs[0].1).recon_cnt, 2, "recon_cnt counts attempts");
    let a = accept(16, 4096, 4096, 0);
    sc.client.handle_cm(
        sc.now,
        cs[0].0,
        CmEvent::Established { private_data: &a },
        &mut sc.io,
    );
    let ev = sc.events();
    assert!(ev.iter().any(|e| matches!(
        e,
        ClientEvent::ReconnectFailed {
            error: PathError::Violation(Violation::QueueDepthChanged),
            ..
        }
    )));
    // No more reconnects: the next due one closes the path.
    sc.now = ms(10_000);
    sc.client.handle_timeout(sc.now, &mut sc.io);
    assert_eq!(sc.client.path_state(p), Some(ClientState::Closed));
}
