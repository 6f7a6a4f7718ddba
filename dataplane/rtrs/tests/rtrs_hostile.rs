//! Hostile peers. Every value a peer sends is checked; a violation is counted (with what it
//! was) and costs only the path it came on: the client reconnects it and fails its IO
//! over, the server closes it. Never a panic, never another path's IO.

mod common;

use std::time::Duration;

use common::*;
use dp_fabric::{WcOpcode, WcStatus};
use dp_rtrs::clt::{ClientEvent, ClientState};
use dp_rtrs::error::{PathError, Violation};
use dp_rtrs::sim::Sim;
use dp_rtrs::srv::{ServerEvent, ServerState};
use dp_rtrs::wire::{Bad, Geometry, Imm, IoRsp, RdmaReadRepr, RdmaWriteRepr, RkeyRspRepr, SgDesc};
use dp_rtrs::work::{Conn, Wc};

// ---------------------------------------------------------------------------------------------
// A hostile server, against a client with two paths under load
// ---------------------------------------------------------------------------------------------

/// Opens two paths with IO in flight, then lets `evil` act on path 0's IO connection; checks
/// the violation was `want`, path 0 was reset and reconnected, and no IO failed.
fn hostile_server(seed: u64, new_rkey: bool, want: Violation, evil: impl FnOnce(&mut Sim, Conn)) {
    let mut s = open_sim(seed, |c| c.server.always_invalidate = new_rkey);
    s.app.target = 16;
    s.app.interval = Duration::from_micros(50);
    s.run_for(Duration::from_millis(2));
    let p = s.paths[0];
    let conn = s.net.client_conn(p, 1).expect("cid 1 of path 0");
    evil(&mut s, conn);
    s.run_for(Duration::from_millis(1));
    s.app.interval = Duration::from_millis(1);
    let st = *s.client.path_stats(p).unwrap();
    assert_eq!(st.protocol_errors, 1, "counted once");
    assert_eq!(st.last_violation, Some(want));
    let down = client_events(
        &s,
        |e| matches!(e, ClientEvent::PathDown { path, .. } if *path == p),
    );
    assert_eq!(down.len(), 1);
    assert!(
        matches!(down[0].1, ClientEvent::PathDown { error: PathError::Violation(v), .. } if v == want)
    );
    assert_eq!(
        s.client.path_state(s.paths[1]),
        Some(ClientState::Connected),
        "the other path is untouched"
    );
    s.run_for(Duration::from_secs(3));
    assert_eq!(
        s.client.path_state(p),
        Some(ClientState::Connected),
        "reconnected"
    );
    assert_eq!(s.app.failed, 0, "{:?}", s.app.errors);
    assert_eq!(s.app.verify_errors, 0);
    assert_eq!(s.app.spurious, 0);
    assert_eq!(s.handler.bad_requests, 0);
}

fn rdma_imm(imm: u32) -> Wc {
    Wc {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: 0,
        imm: Some(imm),
        invalidated: None,
    }
}

#[test]
fn test_hostile_rsp_chunk_out_of_range() {
    hostile_server(50, false, Violation::RspOutOfRange, |s, c| {
        assert!(
            s.inject_client_recv(
                c,
                rdma_imm(
                    IoRsp {
                        msg_id: 64,
                        errno: 0
                    }
                    .imm(false)
                    .0
                ),
                &[]
            )
        );
    });
}

#[test]
fn test_hostile_rsp_chunk_id_19_bits() {
    hostile_server(51, false, Violation::RspOutOfRange, |s, c| {
        assert!(
            s.inject_client_recv(
                c,
                rdma_imm(
                    IoRsp {
                        msg_id: 0x7FFFF,
                        errno: -5
                    }
                    .imm(false)
                    .0
                ),
                &[]
            )
        );
    });
}

#[test]
fn test_hostile_rsp_for_idle_chunk() {
    hostile_server(52, false, Violation::RspIdle, |s, c| {
        // Find a chunk with nothing in flight.
        let idle = (0..64u16)
            .find(|&i| s.client.request_path(i).is_none())
            .unwrap();
        assert!(
            s.inject_client_recv(
                c,
                rdma_imm(
                    IoRsp {
                        msg_id: u32::from(idle),
                        errno: 0
                    }
                    .imm(false)
                    .0
                ),
                &[]
            )
        );
    });
}

#[test]
fn test_hostile_unknown_imm_type() {
    hostile_server(53, false, Violation::ImmType(5), |s, c| {
        assert!(s.inject_client_recv(c, rdma_imm(Imm::new(5, 0).0), &[]));
    });
}

#[test]
fn test_hostile_io_req_imm_to_client() {
    hostile_server(54, false, Violation::ImmType(0), |s, c| {
        assert!(s.inject_client_recv(c, rdma_imm(Imm::io_req(12).0), &[]));
    });
}

#[test]
fn test_hostile_w_inv_without_send_with_inv() {
    hostile_server(55, false, Violation::UnexpectedSend, |s, c| {
        let busy = (0..64u16)
            .find(|&i| s.client.request_path(i) == Some(s.paths[0]))
            .expect("IO in flight on path 0");
        assert!(
            s.inject_client_recv(
                c,
                rdma_imm(
                    IoRsp {
                        msg_id: u32::from(busy),
                        errno: 0
                    }
                    .imm(true)
                    .0
                ),
                &[]
            )
        );
    });
}

#[test]
fn test_hostile_send_without_imm() {
    hostile_server(56, false, Violation::UnexpectedSend, |s, c| {
        let wc = Wc {
            opcode: WcOpcode::Recv,
            imm: None,
            ..rdma_imm(0)
        };
        assert!(s.inject_client_recv(c, wc, &[]));
    });
}

#[test]
fn test_hostile_rdma_imm_without_imm() {
    hostile_server(57, false, Violation::ImmType(0xFF), |s, c| {
        let wc = Wc {
            imm: None,
            ..rdma_imm(0)
        };
        assert!(s.inject_client_recv(c, wc, &[]));
    });
}

#[test]
fn test_hostile_rkey_rsp_wrong_buf_id() {
    hostile_server(58, true, Violation::Wire(Bad::BufId), |s, c| {
        let busy = (0..64u16)
            .find(|&i| s.client.request_path(i) == Some(s.paths[0]))
            .expect("IO in flight on path 0");
        let other = (busy + 1) % 64;
        let msg = RkeyRspRepr {
            buf_id: other,
            rkey: 0x1234,
        }
        .to_bytes();
        let wc = Wc {
            opcode: WcOpcode::Recv,
            byte_len: 8,
            imm: Some(
                IoRsp {
                    msg_id: u32::from(busy),
                    errno: 0,
                }
                .imm(false)
                .0,
            ),
            ..rdma_imm(0)
        };
        assert!(s.inject_client_recv(c, wc, &msg));
    });
}

#[test]
fn test_hostile_rkey_rsp_buf_id_out_of_range() {
    hostile_server(59, true, Violation::Wire(Bad::BufId), |s, c| {
        let msg = RkeyRspRepr {
            buf_id: 64,
            rkey: 1,
        }
        .to_bytes();
        let wc = Wc {
            opcode: WcOpcode::Recv,
            byte_len: 8,
            imm: Some(
                IoRsp {
                    msg_id: 64,
                    errno: 0,
                }
                .imm(false)
                .0,
            ),
            ..rdma_imm(0)
        };
        assert!(s.inject_client_recv(c, wc, &msg));
    });
}

#[test]
fn test_hostile_rkey_rsp_truncated() {
    hostile_server(60, true, Violation::Wire(Bad::Truncated), |s, c| {
        let wc = Wc {
            opcode: WcOpcode::Recv,
            byte_len: 4,
            imm: Some(
                IoRsp {
                    msg_id: 0,
                    errno: 0,
                }
                .imm(false)
                .0,
            ),
            ..rdma_imm(0)
        };
        assert!(s.inject_client_recv(c, wc, &[4, 0, 0, 0]));
    });
}

#[test]
fn test_hostile_rkey_rsp_wrong_type() {
    hostile_server(61, true, Violation::Wire(Bad::MsgType), |s, c| {
        let mut msg = RkeyRspRepr { buf_id: 0, rkey: 1 }.to_bytes();
        msg[0] = 1;
        let wc = Wc {
            opcode: WcOpcode::Recv,
            byte_len: 8,
            imm: Some(
                IoRsp {
                    msg_id: 0,
                    errno: 0,
                }
                .imm(false)
                .0,
            ),
            ..rdma_imm(0)
        };
        assert!(s.inject_client_recv(c, wc, &msg));
    });
}

#[test]
fn test_hostile_error_completion_resets_path_only() {
    let mut s = open_sim(62, |_| {});
    s.app.target = 16;
    s.app.interval = Duration::from_micros(50);
    s.run_for(Duration::from_millis(2));
    let c = s.net.client_conn(s.paths[0], 2).unwrap();
    let wc = Wc {
        status: WcStatus::RemAccessErr,
        ..rdma_imm(0)
    };
    assert!(s.inject_client_recv(c, wc, &[]));
    s.run_for(Duration::from_millis(1));
    s.app.interval = Duration::from_millis(1);
    s.run_for(Duration::from_secs(3));
    let st = s.client.path_stats(s.paths[0]).unwrap();
    assert_eq!(st.wc_errors, 1);
    assert_eq!(
        st.protocol_errors, 0,
        "an error status is not a protocol violation"
    );
    assert_eq!(s.app.failed, 0);
    assert_eq!(
        s.client.path_state(s.paths[0]),
        Some(ClientState::Connected)
    );
}

// ---------------------------------------------------------------------------------------------
// A hostile client, against a server with an honest session beside it
// ---------------------------------------------------------------------------------------------

/// A server with an honest session (two connections) and a hostile one; `evil` acts on the
/// hostile path's IO connection; checks the hostile path was closed for `want` and the
/// honest one still serves.
fn hostile_client(
    want: Violation,
    qd: u16,
    evil: impl FnOnce(&mut ScriptedServer, Conn, Geometry),
) {
    hostile_client_after(want, qd, 0, evil);
}

/// As [`hostile_client`], when `legit` valid requests precede the violation.
fn hostile_client_after(
    want: Violation,
    qd: u16,
    legit: usize,
    evil: impl FnOnce(&mut ScriptedServer, Conn, Geometry),
) {
    let mut ss = ScriptedServer::with_qd(false, qd);
    let good = ss.path(1, 1, 2, b"good", 1);
    let bad = ss.path(2, 2, 2, b"evil", 2);
    assert_eq!(
        ss.server.path_state(bad[0].path),
        Some(ServerState::Connected)
    );
    let g = Geometry::new(qd, 8192).unwrap();
    ss.events();
    evil(&mut ss, bad[1], g);
    let st = ss.server.path_stats(bad[0].path);
    // The path is closing (or gone if nothing was with the handler).
    assert!(
        st.is_none() || ss.server.path_state(bad[0].path) == Some(ServerState::Closing),
        "the hostile path is closed"
    );
    if let Some(st) = st {
        assert_eq!(st.last_violation, Some(want));
    }
    assert_eq!(ss.server.stats().violation_closes, 1);
    assert!(
        ss.io
            .calls
            .iter()
            .any(|c| matches!(c, dp_rtrs::sim::Call::ClosePath(p) if *p == bad[0].path))
    );
    let closed: Vec<_> = ss.events();
    assert_eq!(
        closed
            .iter()
            .filter(|e| matches!(e, ServerEvent::Request { .. }))
            .count(),
        legit,
        "only valid requests reached the handler: {closed:?}"
    );
    // The honest session is unaffected: a request on it still reaches the handler.
    let mut hdr = [0u8; 4];
    RdmaWriteRepr { usr_len: 0 }.emit(&mut hdr);
    ss.write_chunk_of(good[1], 0, 100, &hdr);
    ss.imm(good[1], Imm::io_req(g.encode(0, 100).unwrap()).0);
    assert!(
        ss.events()
            .iter()
            .any(|e| matches!(e, ServerEvent::Request { .. }))
    );
    assert_eq!(
        ss.server.path_state(good[0].path),
        Some(ServerState::Connected)
    );
}

fn write_hdr(usr_len: u16) -> [u8; 4] {
    let mut h = [0u8; 4];
    RdmaWriteRepr { usr_len }.emit(&mut h);
    h
}

#[test]
fn test_hostile_io_req_chunk_id_out_of_range() {
    // qd 6: three bits of chunk index, so 6 and 7 are encodable and out of range.
    hostile_client(Violation::ChunkOutOfRange, 6, |ss, c, g| {
        ss.imm(c, Imm::io_req((7 << g.mem_bits()) | 16).0);
    });
}

#[test]
fn test_hostile_io_req_offset_out_of_range() {
    hostile_client(Violation::ChunkOutOfRange, 8, |ss, c, _| {
        // Chunk 0, offset 8192: fits the offset bits, lies past the chunk.
        ss.imm(c, Imm::io_req(8192).0);
    });
}

#[test]
fn test_hostile_header_past_chunk_end() {
    hostile_client(Violation::HdrOutsideChunk, 8, |ss, c, g| {
        ss.imm(c, Imm::io_req(g.encode(1, 8190).unwrap()).0);
    });
}

#[test]
fn test_hostile_read_header_cut_by_chunk_end() {
    hostile_client(Violation::HdrOutsideChunk, 8, |ss, c, g| {
        let mut h = [0u8; 24];
        RdmaReadRepr {
            usr_len: 0,
            need_inval: false,
            desc: Some(SgDesc {
                addr: 1,
                key: 1,
                len: 16,
            }),
        }
        .emit(&mut h);
        ss.write_chunk_of(c, 1, 8192 - 12, &h[..12]);
        ss.imm(c, Imm::io_req(g.encode(1, 8192 - 12).unwrap()).0);
    });
}

#[test]
fn test_hostile_usr_len_beyond_offset() {
    hostile_client(Violation::Wire(Bad::UsrLen), 8, |ss, c, g| {
        ss.write_chunk_of(c, 2, 10, &write_hdr(11));
        ss.imm(c, Imm::io_req(g.encode(2, 10).unwrap()).0);
    });
}

#[test]
fn test_hostile_unknown_message_type() {
    hostile_client(Violation::Wire(Bad::MsgType), 8, |ss, c, g| {
        ss.write_chunk_of(c, 2, 10, &[9, 0, 0, 0]);
        ss.imm(c, Imm::io_req(g.encode(2, 10).unwrap()).0);
    });
}

#[test]
fn test_hostile_read_two_descriptors() {
    hostile_client(Violation::Wire(Bad::ReadSgCount), 8, |ss, c, g| {
        ss.write_chunk_of(c, 3, 0, &[3, 0, 0, 0, 0, 0, 2, 0]);
        ss.imm(c, Imm::io_req(g.encode(3, 0).unwrap()).0);
    });
}

#[test]
fn test_hostile_read_longer_than_chunk() {
    hostile_client(Violation::Wire(Bad::ReadLen), 8, |ss, c, g| {
        let mut h = [0u8; 24];
        RdmaReadRepr {
            usr_len: 0,
            need_inval: true,
            desc: Some(SgDesc {
                addr: 1,
                key: 1,
                len: 8193,
            }),
        }
        .emit(&mut h);
        ss.write_chunk_of(c, 3, 0, &h);
        ss.imm(c, Imm::io_req(g.encode(3, 0).unwrap()).0);
    });
}

#[test]
fn test_hostile_second_request_into_busy_chunk() {
    hostile_client_after(Violation::ChunkBusy, 8, 1, |ss, c, g| {
        ss.write_chunk_of(c, 4, 64, &write_hdr(0));
        ss.imm(c, Imm::io_req(g.encode(4, 64).unwrap()).0);
        // The handler holds the first; a second request into the same chunk is a lie.
        ss.imm(c, Imm::io_req(g.encode(4, 64).unwrap()).0);
    });
}

#[test]
fn test_hostile_send_after_info() {
    hostile_client(Violation::UnexpectedSend, 8, |ss, c, _| {
        ss.send(c, &[0u8; 8]);
    });
}

#[test]
fn test_hostile_rsp_imm_to_server() {
    hostile_client(Violation::ImmType(1), 8, |ss, c, _| {
        ss.imm(
            c,
            IoRsp {
                msg_id: 0,
                errno: 0,
            }
            .imm(false)
            .0,
        );
    });
}

#[test]
fn test_hostile_io_before_info_exchange() {
    let mut ss = ScriptedServer::new(false);
    let r = dp_rtrs::wire::ConnReqRepr {
        version: 0x0200,
        cid: 0,
        cid_num: 1,
        recon_cnt: 1,
        path_uuid: [5; 16],
        sess_uuid: [5; 16],
        first_conn: true,
    };
    let c0 = ss.connect(&r, 9).unwrap();
    // The only receive posted is the info request's; an RDMA WRITE with immediate into it
    // is not an info request.
    ss.imm(c0, Imm::io_req(0).0);
    assert_eq!(ss.server.path_state(c0.path), None);
    assert_eq!(ss.server.stats().violation_closes, 1);
}

#[test]
fn test_hostile_chunk_scribble_costs_only_that_path() {
    // Garbage lands over requests after they were written and before the server reads them
    // (a peer with a valid key can do that): the server closes the paths it finds garbage
    // on; the honest client fails its IO over, reconnects, and sees no error.
    let mut s = open_sim(63, |c| c.server.always_invalidate = false);
    s.app.target = 16;
    s.app.interval = Duration::from_micros(20);
    s.run_for(Duration::from_millis(1));
    let sess = s.server.sessions().next().unwrap();
    s.server_polling = false;
    s.run_for(Duration::from_micros(100)); // requests land; the server does not look yet
    // Only requests of path 0: path 1 lives, so nothing may fail.
    let mut hit = 0;
    for chunk in 0..64u16 {
        if s.client.request_path(chunk) == Some(s.paths[0]) {
            assert!(s.server_chunk_write(sess, chunk, 0, &[0xFF; 16384]));
            hit += 1;
        }
    }
    assert!(hit > 0);
    s.server_polling = true;
    s.app.interval = Duration::from_millis(1);
    s.run_for(Duration::from_secs(4));
    assert_eq!(
        s.server.stats().violation_closes,
        1,
        "the garbage was noticed, on path 0"
    );
    assert_eq!(
        s.app.failed,
        0,
        "{:?}",
        &s.app.errors[..s.app.errors.len().min(5)]
    );
    assert_eq!(s.app.verify_errors, 0);
    for p in s.paths.clone() {
        assert_eq!(s.client.path_state(p), Some(ClientState::Connected));
    }
}

#[test]
fn test_hostile_info_rsp_from_server_never_connects() {
    // A server that answers the info request with a table that covers too few chunks.
    let mut sc = Scripted::new(1);
    let c0 = sc.accept_all(accept(8, 4096, 4096, 0));
    let d = SgDesc {
        addr: 0x1000,
        key: 1,
        len: 8192 * 4,
    };
    let mut b = vec![0u8; dp_rtrs::wire::InfoRsp::<&[u8]>::len_for(2)];
    dp_rtrs::wire::InfoRsp::new_unchecked(&mut b[..]).emit(&[d, SgDesc { len: 8192 * 2, ..d }]);
    sc.deliver_info(c0, &b);
    let ev = sc.events();
    assert!(ev.iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Violation(Violation::Wire(Bad::SgTotal)),
            ..
        }
    )));
}

#[test]
fn test_hostile_conn_rsp_queue_depth_zero() {
    let mut sc = Scripted::new(1);
    let cs = sc.connects();
    let a = accept(0, 4096, 4096, 0);
    sc.client.handle_cm(
        sc.now,
        cs[0].0,
        dp_rtrs::work::CmEvent::Established { private_data: &a },
        &mut sc.io,
    );
    assert!(sc.events().iter().any(|e| matches!(
        e,
        ClientEvent::OpenFailed {
            error: PathError::Violation(Violation::Wire(Bad::QueueDepth)),
            ..
        }
    )));
}
