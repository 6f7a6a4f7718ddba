//! Paths: the state machine of a client path in its life (error recovery, reconnect with
//! delay, jitter and backoff, `max_reconnect_attempts`, disconnect, reconnect, add and
//! remove), link events, heartbeats, and the server path's states (rtrs.md sections 5, 6).

mod common;

use std::time::Duration;

use common::*;
use dp_rtrs::clt::{ClientEvent, ClientState, LinkEv, RECONNECT_BACKOFF};
use dp_rtrs::error::PathError;
use dp_rtrs::sim::ClientSide;
use dp_rtrs::srv::{ServerEvent, ServerState, SrvLinkEv};
use dp_rtrs::timer::Instant;

fn state(s: &dp_rtrs::sim::Sim, k: usize) -> ClientState {
    s.client.path_state(s.paths[k]).unwrap()
}

#[test]
fn test_connected_error_reconnecting_then_reconnects_after_delay_jitter_backoff() {
    let mut s = open_sim(10, |_| {});
    let p = s.paths[0];
    let e0 = s.client.path_epoch(p).unwrap();
    let t0 = s.now;
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_millis(1));
    assert_eq!(state(&s, 0), ClientState::Reconnecting);
    let down = client_events(&s, |e| matches!(e, ClientEvent::PathDown { .. }));
    assert_eq!(down.len(), 1);
    assert!(matches!(
        down[0].1,
        ClientEvent::PathDown {
            error: PathError::Disconnected,
            ..
        }
    ));
    // reconnect_delay (1 s) + 0..7 ms of jitter, then the 1 s backoff, then the connect.
    s.run_until(t0.saturating_add(Duration::from_millis(1999)));
    assert_eq!(
        state(&s, 0),
        ClientState::Reconnecting,
        "still waiting out delay + backoff"
    );
    assert!(
        s.run_until_cond(Duration::from_millis(100), |s| s.client.path_state(p)
            == Some(ClientState::Connected))
    );
    let up = client_events(
        &s,
        |e| matches!(e, ClientEvent::PathUp { path } if *path == p),
    );
    let at = up.last().unwrap().0.nanos_since(t0);
    let min = (Duration::from_secs(1) + RECONNECT_BACKOFF).as_nanos() as u64;
    assert!(
        at >= min && at < min + 8_000_000 + 1_000_000,
        "reconnected {at} ns after the error"
    );
    assert_eq!(
        s.client.path_epoch(p).unwrap(),
        e0.wrapping_add(1),
        "a new recon_cnt"
    );
    let st = s.client.path_stats(p).unwrap();
    assert_eq!((st.reconnects_ok, st.reconnects_fail), (1, 0));
    assert_eq!(st.reconnects_sysfs().to_string(), "1 0\n");
}

#[test]
fn test_reconnect_jitter_varies_with_seed() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..12 {
        let mut s = open_sim(100 + seed, |_| {});
        let t0 = s.now;
        s.net.cm_disconnect(0);
        let p = s.paths[0];
        s.run_for(Duration::from_millis(1));
        s.run_until_cond(Duration::from_secs(3), |s| {
            s.client.path_state(p) == Some(ClientState::Connected)
        });
        let up = client_events(
            &s,
            |e| matches!(e, ClientEvent::PathUp { path } if *path == p),
        );
        let ms_after = up.last().unwrap().0.nanos_since(t0) / 1_000_000;
        assert!((2000..2009).contains(&ms_after), "{ms_after} ms");
        seen.insert(ms_after);
    }
    assert!(
        seen.len() > 2,
        "jitter of 0..7 ms spreads the reconnects: {seen:?}"
    );
}

#[test]
fn test_reconnect_failed_attempts_counted_then_closed_at_max() {
    let mut s = open_sim(11, |c| c.client.max_reconnect_attempts = 2);
    let p = s.paths[1];
    s.net.set_link(1, false);
    s.net.cm_disconnect(1);
    s.run_for(Duration::from_secs(30));
    // Two attempts, each failing (connect timeout of the simulated CM: 1 s), then closed.
    assert_eq!(s.client.path_state(p), Some(ClientState::Closed));
    let st = s.client.path_stats(p).unwrap();
    assert_eq!(st.reconnects_fail, 2);
    assert_eq!(
        client_events(&s, |e| matches!(e, ClientEvent::ReconnectFailed { .. })).len(),
        2
    );
    assert_eq!(
        client_events(
            &s,
            |e| matches!(e, ClientEvent::PathClosed { path } if *path == p)
        )
        .len(),
        1
    );
    assert_eq!(
        state(&s, 0),
        ClientState::Connected,
        "the other path is untouched"
    );
}

#[test]
fn test_max_reconnect_attempts_zero_never_reconnects() {
    let mut s = open_sim(12, |c| c.client.max_reconnect_attempts = 0);
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_secs(5));
    assert_eq!(state(&s, 0), ClientState::Closed);
    assert_eq!(s.client.path_stats(s.paths[0]).unwrap().reconnects_fail, 0);
}

#[test]
fn test_max_reconnect_attempts_forever_keeps_trying() {
    let mut s = open_sim(13, |c| c.client.max_reconnect_attempts = -1);
    s.net.set_link(0, false);
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_secs(60));
    assert!(matches!(
        state(&s, 0),
        ClientState::Reconnecting | ClientState::Connecting
    ));
    assert!(s.client.path_stats(s.paths[0]).unwrap().reconnects_fail > 10);
    s.net.set_link(0, true);
    s.run_for(Duration::from_secs(5));
    assert_eq!(
        state(&s, 0),
        ClientState::Connected,
        "back once the link is"
    );
}

#[test]
fn test_set_max_reconnect_attempts_range() {
    let mut s = open_sim(14, |_| {});
    assert!(s.client.set_max_reconnect_attempts(-2).is_err());
    assert!(s.client.set_max_reconnect_attempts(10_000).is_err());
    assert!(s.client.set_max_reconnect_attempts(9999).is_ok());
    assert_eq!(s.client.max_reconnect_attempts(), 9999);
}

#[test]
fn test_disconnect_path_closed_and_reconnect_path() {
    let mut s = open_sim(15, |_| {});
    let p = s.paths[0];
    load(&mut s, 16, Duration::from_millis(5));
    s.client
        .disconnect_path(s.now, p, &mut ClientSide(&mut s.net))
        .unwrap();
    assert_eq!(s.client.path_state(p), Some(ClientState::Closed));
    assert!(
        s.client
            .disconnect_path(s.now, p, &mut ClientSide(&mut s.net))
            .is_err(),
        "CLOSED -> CLOSING is not in the table"
    );
    load(&mut s, 16, Duration::from_secs(3));
    assert_eq!(
        s.client.path_state(p),
        Some(ClientState::Closed),
        "a closed path stays closed"
    );
    s.client
        .reconnect_path(s.now, p, &mut ClientSide(&mut s.net))
        .unwrap();
    assert_eq!(s.client.path_state(p), Some(ClientState::Reconnecting));
    s.run_for(RECONNECT_BACKOFF + Duration::from_millis(10));
    assert_eq!(s.client.path_state(p), Some(ClientState::Connected));
    let before = s.client.path_stats(p).unwrap().rdma.read_cnt
        + s.client.path_stats(p).unwrap().rdma.write_cnt;
    load(&mut s, 16, Duration::from_millis(10));
    let after = s.client.path_stats(p).unwrap().rdma.read_cnt
        + s.client.path_stats(p).unwrap().rdma.write_cnt;
    assert!(after > before, "it carries IO again");
}

#[test]
fn test_reconnect_path_busy_while_connecting() {
    let mut s = open_sim(16, |_| {});
    let p = s.paths[0];
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_millis(2005)); // delay + backoff: connecting now
    let st = s.client.path_state(p).unwrap();
    if st == ClientState::Connecting {
        assert!(
            s.client
                .reconnect_path(s.now, p, &mut ClientSide(&mut s.net))
                .is_err()
        );
    }
    // From RECONNECTING it is a no-op success.
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_millis(10));
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_millis(1));
    if s.client.path_state(p) == Some(ClientState::Reconnecting) {
        assert!(
            s.client
                .reconnect_path(s.now, p, &mut ClientSide(&mut s.net))
                .is_ok()
        );
    }
}

#[test]
fn test_remove_path_fails_over_and_is_dead() {
    let mut s = open_sim(17, |_| {});
    let p = s.paths[0];
    s.app.target = 32;
    s.run_for(Duration::from_millis(5));
    s.client
        .remove_path(s.now, p, &mut ClientSide(&mut s.net))
        .unwrap();
    assert_eq!(s.client.path_state(p), None, "gone (DEAD)");
    assert!(
        client_events(&s, |e| *e == ClientEvent::PathRemoved { path: p }).is_empty(),
        "logged at the next poll"
    );
    load(&mut s, 32, Duration::from_millis(20));
    assert_eq!(
        client_events(&s, |e| *e == ClientEvent::PathRemoved { path: p }).len(),
        1
    );
    assert!(
        s.client.path_stats(s.paths[1]).unwrap().failover_cnt > 0,
        "its IO went to the other path"
    );
    assert!(
        s.client
            .remove_path(s.now, p, &mut ClientSide(&mut s.net))
            .is_err(),
        "no such path now"
    );
    // The server closes its side when the client disconnects.
    assert_eq!(s.server.paths().count(), 1);
}

#[test]
fn test_add_path_at_run_time_takes_traffic() {
    let mut s = open_sim(18, |c| c.client.policy = dp_rtrs::clt::MpPolicy::RoundRobin);
    s.net.next_link = Some(2);
    let p = s
        .client
        .add_path(s.now, [0x99; 16], &mut ClientSide(&mut s.net))
        .unwrap();
    load(&mut s, 24, Duration::from_millis(20));
    assert_eq!(s.client.path_state(p), Some(ClientState::Connected));
    let st = s.client.path_stats(p).unwrap();
    assert!(
        st.rdma.read_cnt + st.rdma.write_cnt > 100,
        "round-robin sends it a third of the IO"
    );
    assert_eq!(s.server.paths().count(), 3);
    assert_eq!(s.server.sessions().count(), 1, "it joined the session");
}

#[test]
fn test_add_path_failure_removes_it() {
    let mut s = open_sim(19, |_| {});
    s.net.set_link(2, false);
    s.net.next_link = Some(2);
    let p = s
        .client
        .add_path(s.now, [0x98; 16], &mut ClientSide(&mut s.net))
        .unwrap();
    s.run_for(Duration::from_secs(2));
    assert_eq!(s.client.path_state(p), None);
    assert_eq!(
        client_events(
            &s,
            |e| matches!(e, ClientEvent::PathAddFailed { path, .. } if *path == p)
        )
        .len(),
        1
    );
    assert_eq!(s.client.paths().count(), 2);
}

#[test]
fn test_add_path_first_conn_when_session_has_no_paths() {
    let mut s = open_sim(20, |_| {});
    for p in s.paths.clone() {
        s.client
            .remove_path(s.now, p, &mut ClientSide(&mut s.net))
            .unwrap();
    }
    s.run_for(Duration::from_millis(5));
    assert_eq!(
        s.server.sessions().count(),
        0,
        "the server dropped the session with its last path"
    );
    s.net.next_link = Some(2);
    let p = s
        .client
        .add_path(s.now, [0x97; 16], &mut ClientSide(&mut s.net))
        .unwrap();
    s.run_for(Duration::from_millis(5));
    assert_eq!(
        s.client.path_state(p),
        Some(ClientState::Connected),
        "first_conn: the server made a new session"
    );
}

#[test]
fn test_link_events_last_path_down_and_first_back() {
    let mut s = open_sim(21, |_| {});
    s.net.cm_disconnect(0);
    s.run_for(Duration::from_millis(1));
    assert!(
        client_events(&s, |e| matches!(e, ClientEvent::Link(_))).is_empty(),
        "one path left"
    );
    s.net.cm_disconnect(1);
    s.run_for(Duration::from_millis(1));
    let l = client_events(&s, |e| matches!(e, ClientEvent::Link(_)));
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].1, ClientEvent::Link(LinkEv::Disconnected));
    s.run_for(Duration::from_secs(3));
    let l = client_events(&s, |e| matches!(e, ClientEvent::Link(_)));
    assert_eq!(l.len(), 2, "RECONNECTED once, for the first path back");
    assert_eq!(l[1].1, ClientEvent::Link(LinkEv::Reconnected));
    // The server: DISCONNECTED when its last path went, CONNECTED again.
    let sl = server_events(&s, |e| matches!(e, ServerEvent::Link { .. }));
    let evs: Vec<_> = sl
        .iter()
        .map(|(_, e)| match e {
            ServerEvent::Link { ev, .. } => *ev,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        evs,
        [
            SrvLinkEv::Connected,
            SrvLinkEv::Disconnected,
            SrvLinkEv::Connected
        ]
    );
}

#[test]
fn test_io_without_any_path_fails_aborted() {
    let mut s = open_sim(22, |c| c.client.max_reconnect_attempts = 0);
    s.net.cm_disconnect(0);
    s.net.cm_disconnect(1);
    s.run_for(Duration::from_millis(1));
    s.app.target = 4;
    s.run_for(Duration::from_millis(1));
    assert!(s.app.submit_errors > 0);
    assert_eq!(s.app.errors[0].1, dp_rtrs::error::IoError::Aborted);
    assert_eq!(
        s.client.query().unwrap_err(),
        dp_rtrs::error::RtrsError::NotConnected
    );
}

#[test]
fn test_close_session_completes_everything() {
    let mut s = open_sim(23, |c| c.server.always_invalidate = false);
    s.handler.hold = true;
    s.app.target = 16;
    s.run_for(Duration::from_millis(1));
    assert_eq!(s.app.inflight(), 16);
    s.app.target = 0;
    s.client.close(s.now, &mut ClientSide(&mut s.net));
    s.run_for(Duration::from_millis(1));
    assert_eq!(s.app.inflight(), 0, "every request completed");
    assert_eq!(s.app.failed, 16);
    assert!(
        s.app
            .errors
            .iter()
            .all(|(_, e)| *e == dp_rtrs::error::IoError::Aborted)
    );
    assert!(client_events(&s, |e| *e == ClientEvent::Closed).len() == 1);
    assert_eq!(
        s.client
            .paths()
            .filter(|&p| s.client.path_state(p) == Some(ClientState::Closed))
            .count(),
        2
    );
}

#[test]
fn test_heartbeat_every_interval_and_latency() {
    let mut s = open_sim(24, |_| {});
    s.run_for(Duration::from_secs(21));
    let st = s.client.path_stats(s.paths[0]).unwrap();
    assert_eq!(st.hb_sent, 4, "at 5, 10, 15 and 20 s");
    let lat = st.cur_latency.expect("the acks measured a round trip");
    assert_eq!(
        lat,
        Duration::from_micros(20),
        "two one-way latencies of 10 us"
    );
    assert_eq!(s.client.path_latency(s.paths[0]), Some(lat));
    for p in s.server.paths() {
        assert_eq!(
            s.server.path_stats(p).unwrap().hb_sent,
            4,
            "the server beats too"
        );
    }
}

#[test]
fn test_heartbeat_loss_detected_within_bound_and_path_closed() {
    // The server stops polling (a hung peer): nothing it sends, no acks, no CM.
    let mut s = open_sim(25, |c| c.paths = 1);
    s.run_for(Duration::from_millis(2500));
    let silent_from = s.now;
    s.server_polling = false;
    let p = s.paths[0];
    let ok = s.run_until_cond(Duration::from_secs(40), |s| {
        s.client.path_state(p) != Some(ClientState::Connected)
    });
    assert!(ok, "the client noticed");
    let took = s.now.nanos_since(silent_from);
    let (lo, hi) = (
        Duration::from_secs(30).as_nanos() as u64,
        Duration::from_secs(35).as_nanos() as u64,
    );
    assert!(
        (lo..=hi).contains(&took),
        "detected after {took} ns, the bound is 30..35 s"
    );
    assert_eq!(s.client.path_error(p), Some(PathError::Heartbeat));
    assert_eq!(
        s.client.path_state(p),
        Some(ClientState::Reconnecting),
        "closed and reconnecting"
    );
    println!(
        "heartbeat loss detected after {:.3} s (bound 35 s)",
        took as f64 / 1e9
    );
}

#[test]
fn test_heartbeat_loss_with_io_outstanding_fails_over() {
    // A peer that stops polling on one path (its NIC still takes our writes): the IO stuck
    // there moves to the other path when the heartbeat gives up.
    let mut s = open_sim(26, |_| {});
    s.app.target = 8;
    s.app.interval = Duration::from_millis(1);
    s.run_for(Duration::from_millis(10));
    // Cut link 0 silently: no CM, no errors until somebody sends (the client's IO does).
    s.net.transport_timeout = Duration::from_secs(3600);
    s.net.set_link(0, false);
    s.run_for(Duration::from_secs(40));
    assert_eq!(s.app.failed, 0, "{:?}", s.app.errors);
    assert_eq!(s.app.verify_errors, 0);
    let down = client_events(&s, |e| matches!(e, ClientEvent::PathDown { .. }));
    assert!(matches!(
        down[0].1,
        ClientEvent::PathDown {
            error: PathError::Heartbeat,
            ..
        }
    ));
    assert!(s.client.path_stats(s.paths[1]).unwrap().failover_cnt > 0);
}

#[test]
fn test_server_closes_path_of_silent_client() {
    let mut s = open_sim(27, |c| c.paths = 1);
    s.run_for(Duration::from_millis(1000));
    let t0 = s.now;
    s.client_polling = false;
    let p = s.server.paths().next().unwrap();
    let ok = s.run_until_cond(Duration::from_secs(40), |s| {
        s.server.path_state(p).is_none()
    });
    assert!(ok);
    let took = s.now.nanos_since(t0);
    assert!(took <= Duration::from_secs(35).as_nanos() as u64, "{took}");
    assert_eq!(
        server_events(&s, |e| matches!(e, ServerEvent::PathClosed { .. })).len(),
        1
    );
    assert_eq!(s.server.sessions().count(), 0);
}

#[test]
fn test_server_path_states() {
    let mut ss = ScriptedServer::new(false);
    let r = dp_rtrs::wire::ConnReqRepr {
        version: 0x0200,
        cid: 0,
        cid_num: 2,
        recon_cnt: 1,
        path_uuid: [1; 16],
        sess_uuid: [1; 16],
        first_conn: true,
    };
    let c0 = ss.connect(&r, 1).unwrap();
    assert_eq!(ss.server.path_state(c0.path), Some(ServerState::Connecting));
    let c1 = ss
        .connect(&dp_rtrs::wire::ConnReqRepr { cid: 1, ..r }, 1)
        .unwrap();
    let mut b = [0u8; 272];
    b[2] = b'n';
    ss.send(c0, &b);
    assert_eq!(ss.server.path_state(c0.path), Some(ServerState::Connected));
    // Hold a request, then disconnect: CLOSING until the handler answers, then gone.
    let g = dp_rtrs::wire::Geometry::new(8, 8192).unwrap();
    let mut hdr = [0u8; 4];
    dp_rtrs::wire::RdmaWriteRepr { usr_len: 0 }.emit(&mut hdr);
    ss.write_chunk(3, 100, &hdr);
    ss.imm(c1, dp_rtrs::wire::Imm::io_req(g.encode(3, 100).unwrap()).0);
    let op = match ss
        .events()
        .into_iter()
        .find(|e| matches!(e, ServerEvent::Request { .. }))
    {
        Some(ServerEvent::Request { op, data_len, .. }) => {
            assert_eq!(data_len, 100);
            op
        }
        _ => panic!("no request"),
    };
    ss.server
        .handle_cm(ss.now, c1, dp_rtrs::work::CmEvent::Disconnected, &mut ss.io);
    assert_eq!(ss.server.path_state(c0.path), Some(ServerState::Closing));
    assert_eq!(
        ss.server.resp_rdma(ss.now, op, 0, &mut ss.io),
        Ok(dp_rtrs::srv::Resp::Dropped)
    );
    assert_eq!(ss.server.path_state(c0.path), None, "CLOSED and removed");
    assert!(
        ss.events()
            .iter()
            .any(|e| matches!(e, ServerEvent::PathClosed { .. }))
    );
    assert_eq!(
        ss.server.resp_rdma(ss.now, op, 0, &mut ss.io),
        Err(dp_rtrs::error::RtrsError::StaleOp),
        "answered once"
    );
}

#[test]
fn test_server_stale_incarnation_closed_on_new_recon_cnt() {
    // Linux keeps a CONNECTED server path until its own heartbeat closes it (~30 s) and
    // rejects the client's reconnects meanwhile. A reconnect with a new recon_cnt proves the
    // client dropped that incarnation: we close it at once and reject with -EBUSY; the
    // next attempt gets through.
    let mut ss = ScriptedServer::new(false);
    let conns = ss.path(1, 1, 2, b"host", 1);
    let r = dp_rtrs::wire::ConnReqRepr {
        version: 0x0200,
        cid: 0,
        cid_num: 2,
        recon_cnt: 2,
        path_uuid: [1; 16],
        sess_uuid: [1; 16],
        first_conn: true,
    };
    assert_eq!(ss.connect(&r, 1), Err(-(libc::EBUSY as i16)));
    assert_eq!(
        ss.server.path_state(conns[0].path),
        None,
        "the stale incarnation is gone"
    );
    assert!(ss.connect(&r, 1).is_ok(), "the retry is accepted");
}

#[test]
fn test_spurious_timeouts_do_nothing() {
    let mut s = open_sim(28, |_| {});
    let before = s.client.path_stats(s.paths[0]).copied();
    for _ in 0..5 {
        s.client.handle_timeout(s.now, &mut ClientSide(&mut s.net));
        s.server
            .handle_timeout(s.now, &mut dp_rtrs::sim::ServerSide(&mut s.net));
    }
    assert_eq!(s.client.path_stats(s.paths[0]).copied(), before);
    let _ = Instant::ZERO;
}
