//! The connection lifecycle driven by hand, with a transport that loses connection-manager
//! answers: no state but Up may last for ever. A dial that gets no answer and an accept
//! that is never established both time out, drop the path, and a new connection is made
//! (the passive side must not refuse its peer's redials as "racing" for ever).

mod common;

use std::time::Duration;

use common::*;
use dp_rds::path::{ConnState, PathConfig};
use dp_rds::{Accept, Incoming, RdsEngine, SendFlags, TransportCmd, TransportKind};
use lcore::time::Instant;

const CONNECT_TIMEOUT: Duration = match PathConfig::message().connect_timeout {
    Some(d) => d,
    None => panic!("message transports time out a connect by default"),
};

fn engine(name: &str, addr: &str) -> RdsEngine {
    let mut e = RdsEngine::new(engine_cfg(name, 7, ib())).unwrap();
    e.add_local_addr(ip(addr));
    e
}

/// Runs the engine's timers up to `until` and returns the transport commands they produced.
fn run_timers(e: &mut RdsEngine, until: Instant) -> Vec<TransportCmd> {
    let mut cmds = Vec::new();
    while let Some(at) = e.poll_timeout().filter(|&at| at <= until) {
        e.handle_timeout(at);
        while let Some(c) = e.poll_transport() {
            cmds.push(c);
        }
    }
    cmds
}

/// A queues a message to B: its path dials. Returns the engine and the time.
fn dialling() -> (RdsEngine, dp_rds::PathId, Instant) {
    let mut a = engine("a", A);
    let s = a.socket().unwrap();
    a.bind(s, sa(A, 4000)).unwrap();
    let t0 = Instant::from_millis(1000);
    a.send_to(t0, s, Some(sa(B, 4001)), b"queued", SendFlags::DONTWAIT)
        .unwrap();
    let cmds = run_timers(&mut a, t0);
    let [TransportCmd::Connect { path, .. }] = cmds[..] else {
        panic!("one dial expected: {cmds:?}")
    };
    assert_eq!(a.path_state(path), Some(ConnState::Connecting));
    (a, path, t0)
}

#[test]
fn test_connecting_dial_without_answer_times_out_and_redials() {
    let (mut a, path, t0) = dialling();
    // The transport never reports the dial's outcome (a lost reply or reject).
    let before = t0.saturating_add(CONNECT_TIMEOUT - Duration::from_millis(1));
    assert!(
        run_timers(&mut a, before).is_empty(),
        "no give-up before the timeout"
    );
    assert_eq!(a.path_state(path), Some(ConnState::Connecting));
    let cmds = run_timers(&mut a, t0.saturating_add(CONNECT_TIMEOUT));
    assert!(
        matches!(cmds[..], [TransportCmd::Disconnect { path: p }] if p == path),
        "the stuck connection is torn down: {cmds:?}"
    );
    assert_eq!(a.stats().conn_connect_timeout, 1);
    let now = t0.saturating_add(CONNECT_TIMEOUT);
    a.handle_transport_down(now, path);
    assert_eq!(a.path_state(path), Some(ConnState::Down));
    // The backoff brings the dial back (within the 1 s cap).
    let cmds = run_timers(&mut a, now.saturating_add(Duration::from_secs(1)));
    assert!(
        matches!(cmds[..], [TransportCmd::Connect { path: p, .. }] if p == path),
        "dialled again: {cmds:?}"
    );
}

#[test]
fn test_connecting_dial_answered_in_time_does_not_time_out() {
    let (mut a, path, t0) = dialling();
    a.handle_connected(t0.saturating_add(Duration::from_millis(5)), path, &[]);
    assert_eq!(a.path_state(path), Some(ConnState::Up));
    let cmds = run_timers(&mut a, t0.saturating_add(CONNECT_TIMEOUT * 3));
    assert!(
        !cmds
            .iter()
            .any(|c| matches!(c, TransportCmd::Disconnect { .. })),
        "{cmds:?}"
    );
    assert_eq!(a.path_state(path), Some(ConnState::Up));
    assert_eq!(a.stats().conn_connect_timeout, 0);
}

#[test]
fn test_connecting_accept_without_established_times_out_and_takes_redials() {
    // B's dial gives the request's private data.
    let (mut b, bpath, t0) = {
        let mut b = engine("b", B);
        let s = b.socket().unwrap();
        b.bind(s, sa(B, 4001)).unwrap();
        let t0 = Instant::from_millis(1000);
        b.send_to(t0, s, Some(sa(A, 4000)), b"x", SendFlags::DONTWAIT)
            .unwrap();
        let cmds = run_timers(&mut b, t0);
        let [TransportCmd::Connect { path, .. }] = cmds[..] else {
            panic!("{cmds:?}")
        };
        (b, path, t0)
    };
    b.handle_recv_posted(t0, bpath, 64);
    let (private, n) = b.connect_private(bpath).unwrap().to_bytes();
    let mut a = engine("a", A);
    let req = || Incoming {
        transport: TransportKind::Ib,
        laddr: ip(A),
        faddr: ip(B),
        tos: 0,
        path_index: 0,
        private: &private[..n],
    };
    let Accept::Yes { path, .. } = a.handle_incoming(t0, req()) else {
        panic!("a down path accepts")
    };
    assert_eq!(a.path_state(path), Some(ConnState::Connecting));
    // The established event never comes: redials are refused as racing meanwhile...
    let mid = t0.saturating_add(CONNECT_TIMEOUT / 2);
    assert!(run_timers(&mut a, mid).is_empty());
    assert!(matches!(a.handle_incoming(mid, req()), Accept::No(_)));
    // ...but only until the accept times out.
    let end = t0.saturating_add(CONNECT_TIMEOUT);
    let cmds = run_timers(&mut a, end);
    assert!(
        matches!(cmds[..], [TransportCmd::Disconnect { path: p }] if p == path),
        "{cmds:?}"
    );
    a.handle_transport_down(end, path);
    assert!(
        matches!(a.handle_incoming(end, req()), Accept::Yes { .. }),
        "the peer's next dial is accepted"
    );
}
