//! Failover under load: one path of two is torn down while IO runs (a CM disconnect, its
//! queue pairs moved to the error state, its link cut, a lossy link). While the other path
//! lives no IO may fail or be lost: the requests in flight on the dead path are posted again
//! on the live one (same permit, same chunk), every byte is checked end to end, and the dead
//! path reconnects and takes traffic again. Each test prints its numbers in virtual time.

mod common;

use std::time::Duration;

use common::*;
use dp_rtrs::clt::{ClientEvent, ClientState, MpPolicy};
use dp_rtrs::sim::{ClientSide, Sim, SimConfig};
use dp_rtrs::timer::Instant;
use dp_rtrs::work::PathId;

#[derive(Clone, Copy, Debug)]
enum Kill {
    CmDisconnect,
    QpError,
    LinkCut,
}

fn ios_on(s: &Sim, k: usize) -> u64 {
    let st = s.client.path_stats(s.paths[k]).unwrap();
    st.rdma.read_cnt + st.rdma.write_cnt
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn failover(kill: Kill, seed: u64, policy: MpPolicy, always_inv: bool) {
    failover_with(kill, seed, policy, always_inv, false);
}

fn failover_with(kill: Kill, seed: u64, policy: MpPolicy, always_inv: bool, per_io: bool) {
    let mut s = open_sim(seed, |c| {
        c.latency = Duration::from_micros(20);
        c.client.policy = policy;
        c.server.always_invalidate = always_inv;
        c.per_io_registration = per_io;
        c.links = 2;
    });
    s.handler.delay = Duration::from_micros(30);
    s.app.target = 48;
    s.app.track = true;
    // Full load: both paths carry IO.
    s.run_for(Duration::from_millis(5));
    assert!(ios_on(&s, 0) > 100, "the path we kill is loaded");
    if policy != MpPolicy::MinLatency {
        // (min-latency sends everything to the first path until heartbeats measure both)
        assert!(ios_on(&s, 1) > 100, "both paths loaded");
    }
    let p0 = s.paths[0];
    let on_p0: Vec<u64> = (0..64u16)
        .filter(|&i| s.client.request_path(i) == Some(p0))
        .filter_map(|i| s.app.seq_of(i))
        .collect();
    assert!(
        on_p0.len() >= 10,
        "IO in flight on the path we kill: {}",
        on_p0.len()
    );
    let t0 = s.now;
    match kill {
        Kill::CmDisconnect => s.net.cm_disconnect(0),
        Kill::QpError => s.net.kill_qps(0),
        Kill::LinkCut => s.net.set_link(0, false),
    }
    // Keep the load on, paced, so seconds of virtual time stay cheap.
    s.app.interval = Duration::from_micros(200);
    // Detection.
    assert!(
        s.run_until_cond(Duration::from_secs(40), |s| s.client.path_state(p0)
            != Some(ClientState::Connected))
    );
    let detect = s.now.nanos_since(t0);
    // The requests that were on the dead path finish on the live one.
    let done = s.run_until_cond(Duration::from_secs(1), |s| {
        on_p0.iter().all(|q| s.app.done.iter().any(|(_, d)| d == q))
    });
    assert!(done, "every request of the dead path completed");
    let drained = on_p0
        .iter()
        .map(|q| s.app.done.iter().find(|(_, d)| d == q).unwrap().0)
        .max()
        .unwrap()
        .nanos_since(t0);
    s.run_for(Duration::from_millis(5));
    if matches!(kill, Kill::LinkCut) {
        s.net.set_link(0, true);
    }
    // The reconnect takes 1 s of delay and 1 s of backoff: pace the load meanwhile.
    s.app.interval = Duration::from_micros(500);
    let back = s.run_until_cond(Duration::from_secs(10), |s| {
        s.client.path_state(p0) == Some(ClientState::Connected)
    });
    assert!(back, "the path came back: {:?}", s.client.path_error(p0));
    let back_at = s.now.nanos_since(t0);
    let before = ios_on(&s, 0);
    s.app.interval = Duration::ZERO;
    s.run_for(Duration::from_millis(5));
    let after = ios_on(&s, 0) - before;
    let failovered = s.client.path_stats(s.paths[1]).unwrap().failover_cnt;
    println!(
        "failover {kill:?} ({policy:?}, always_invalidate {always_inv}): {} IOs, {} failed, {} bad data, \
         {} in flight on the dead path, {failovered} failed over; detected after {:.1} us, last \
         failed-over IO done {:.1} us after the kill; path back after {:.3} s, then {after} IOs on it in 5 ms",
        s.app.ok + s.app.failed,
        s.app.failed,
        s.app.verify_errors,
        on_p0.len(),
        us(detect),
        us(drained),
        back_at as f64 / 1e9,
    );
    assert_eq!(
        s.app.failed,
        0,
        "{:?}",
        &s.app.errors[..s.app.errors.len().min(5)]
    );
    assert_eq!(s.app.submit_errors, 0);
    assert_eq!(s.app.verify_errors, 0);
    assert_eq!(s.app.spurious, 0, "every IO completed exactly once");
    assert_eq!(s.handler.bad_requests, 0);
    assert_eq!(
        s.net.rebind_faults, 0,
        "a window bound again under a live key"
    );
    assert!(failovered >= 1, "requests moved to the live path");
    assert!(after > 100, "the reconnected path takes traffic again");
    assert_eq!(
        client_events(&s, |e| matches!(e, ClientEvent::Link(_))).len(),
        0,
        "a path lived throughout"
    );
}

/// A path dies while its server is still slow over the requests it holds: their
/// failed-over copies complete on the other path first. The chunks of those requests are
/// the same memory on both paths, so none may carry another request until the dead path's
/// server is done with them (it is once the path has connected again); then they are back
/// in use.
#[test]
fn test_failover_dead_paths_chunks_fenced_until_reconnect() {
    let mut s = open_sim(72, |c| {
        c.latency = Duration::from_micros(20);
        c.links = 2;
    });
    s.handler.delay = Duration::from_micros(30);
    s.app.target = 48;
    s.app.track = true;
    s.run_for(Duration::from_millis(5));
    // What reaches the server now takes it 50 ms; then the first path dies.
    s.handler.delay = Duration::from_millis(50);
    s.run_for(Duration::from_millis(1));
    let p0 = s.paths[0];
    let held: Vec<u16> = (0..64u16)
        .filter(|&i| s.client.request_path(i) == Some(p0))
        .collect();
    assert!(
        held.len() >= 5,
        "requests in flight on the path we kill: {}",
        held.len()
    );
    s.net.kill_qps(0);
    s.handler.delay = Duration::from_micros(30);
    s.app.interval = Duration::from_micros(100);
    assert!(
        s.run_until_cond(Duration::from_secs(1), |s| s.client.path_state(p0)
            != Some(ClientState::Connected))
    );
    s.run_for(Duration::from_millis(40));
    assert_eq!(
        s.handler.chunk_reuses, 0,
        "a chunk the dead path's server still works in carried another request"
    );
    assert!(
        s.client.fenced_chunks() >= held.len(),
        "the dead path's chunks are fenced: {} of {}",
        s.client.fenced_chunks(),
        held.len()
    );
    let back = s.run_until_cond(Duration::from_secs(10), |s| {
        s.client.path_state(p0) == Some(ClientState::Connected)
    });
    assert!(back, "the path came back: {:?}", s.client.path_error(p0));
    assert_eq!(
        s.client.fenced_chunks(),
        0,
        "the reconnect lifts the fences"
    );
    let used_before = s.handler.requests;
    s.app.interval = Duration::ZERO;
    s.run_for(Duration::from_millis(5));
    assert!(s.handler.requests > used_before + 100, "IO goes on");
    let permits = s.client.permits().unwrap();
    assert_eq!(
        (0..64u16).filter(|&i| permits.is_fenced(i)).count(),
        0,
        "no chunk stays out of use"
    );
    assert_eq!(s.handler.chunk_reuses, 0);
    assert_eq!(
        s.app.failed,
        0,
        "{:?}",
        &s.app.errors[..s.app.errors.len().min(5)]
    );
    assert_eq!(s.app.verify_errors, 0);
    assert_eq!(s.app.spurious, 0, "every IO completed exactly once");
}

#[test]
fn test_failover_cm_disconnect_under_load() {
    failover(Kill::CmDisconnect, 70, MpPolicy::MinInflight, true);
}

#[test]
fn test_failover_qp_error_under_load() {
    failover(Kill::QpError, 71, MpPolicy::MinInflight, true);
}

#[test]
fn test_failover_link_cut_under_load() {
    failover(Kill::LinkCut, 72, MpPolicy::MinInflight, true);
}

#[test]
fn test_failover_round_robin_plain_keys() {
    failover(Kill::CmDisconnect, 73, MpPolicy::RoundRobin, false);
}

#[test]
fn test_failover_min_latency_qp_error() {
    failover(Kill::QpError, 74, MpPolicy::MinLatency, false);
}

/// Per-IO registration: the requests of the dead path bind the live path's windows of
/// their slots; a window is never bound again while its last key is valid (verbs refuses
/// that and errors the queue pair).
#[test]
fn test_failover_qp_error_per_io_registration() {
    failover_with(Kill::QpError, 76, MpPolicy::MinInflight, false, true);
}

#[test]
fn test_failover_cm_disconnect_per_io_registration() {
    failover_with(Kill::CmDisconnect, 77, MpPolicy::RoundRobin, false, true);
}

#[test]
fn test_failover_link_cut_per_io_registration() {
    failover_with(Kill::LinkCut, 78, MpPolicy::MinInflight, false, true);
}

#[test]
fn test_failover_repeated_kills_no_io_lost() {
    // Paths die one after the other, never both at once, while IO runs.
    let mut s = open_sim(75, |c| {
        c.latency = Duration::from_micros(20);
        c.links = 2;
        c.client.reconnect_delay = Duration::from_millis(200);
    });
    s.handler.delay = Duration::from_millis(1);
    s.app.target = 32;
    s.app.interval = Duration::from_micros(100);
    let mut kills = 0;
    for round in 0..6 {
        s.run_for(Duration::from_millis(1500));
        let k = round % 2;
        let other = s.paths[1 - k];
        if s.client.path_state(other) == Some(ClientState::Connected) {
            if round % 3 == 0 {
                s.net.kill_qps(k);
            } else {
                s.net.cm_disconnect(k);
            }
            kills += 1;
        }
    }
    s.run_for(Duration::from_secs(3));
    println!(
        "repeated kills: {kills} kills, {} IOs, {} failed, {} bad data, failed over {} + {}",
        s.app.ok,
        s.app.failed,
        s.app.verify_errors,
        s.client.path_stats(s.paths[0]).unwrap().failover_cnt,
        s.client.path_stats(s.paths[1]).unwrap().failover_cnt
    );
    assert!(kills >= 4);
    let moved = s.client.path_stats(s.paths[0]).unwrap().failover_cnt
        + s.client.path_stats(s.paths[1]).unwrap().failover_cnt;
    assert!(moved >= kills, "every kill caught IO in flight");
    assert_eq!(
        (s.app.failed, s.app.submit_errors, s.app.verify_errors),
        (0, 0, 0)
    );
    for p in s.paths.clone() {
        assert_eq!(s.client.path_state(p), Some(ClientState::Connected));
    }
}

#[test]
fn test_lossy_link_no_io_lost() {
    // Retransmissions on a lossy link; now and then seven in a row exhaust the retry count
    // and the queue pair fails: the path recovers and no IO is lost.
    let mut s = open_sim(76, |c| {
        c.latency = Duration::from_micros(20);
        c.links = 2;
        c.client.reconnect_delay = Duration::from_millis(100);
    });
    s.net.links[0].loss = 0.3;
    s.app.target = 32;
    s.app.interval = Duration::from_micros(100);
    s.run_for(Duration::from_secs(4));
    let st0 = *s.client.path_stats(s.paths[0]).unwrap();
    println!(
        "lossy link (30% of deliveries retransmitted): {} IOs, {} failed, {} bad data, path 0 errors {} \
         reconnects {:?}",
        s.app.ok,
        s.app.failed,
        s.app.verify_errors,
        st0.wc_errors,
        (st0.reconnects_ok, st0.reconnects_fail)
    );
    assert_eq!(
        (s.app.failed, s.app.submit_errors, s.app.verify_errors),
        (0, 0, 0)
    );
    let downs = client_events(
        &s,
        |e| matches!(e, ClientEvent::PathDown { path, .. } if *path == s.paths[0]),
    )
    .len();
    assert!(
        downs >= 1,
        "the retry count was exhausted at least once (on either side)"
    );
    s.net.links[0].loss = 0.0;
    s.run_for(Duration::from_secs(2));
    assert_eq!(
        s.client.path_state(s.paths[0]),
        Some(ClientState::Connected),
        "and the path recovered"
    );
    assert_eq!(
        (s.app.failed, s.app.submit_errors, s.app.verify_errors),
        (0, 0, 0)
    );
    let _ = Instant::ZERO;
}

/// Two paths with 48 tracked requests running (each served in 30 us): returns the simulator,
/// path 0 and how many requests are in flight on it (at least 5).
fn loaded_two_paths(seed: u64, tweak: impl FnOnce(&mut SimConfig)) -> (Sim, PathId, usize) {
    let mut s = open_sim(seed, |c| {
        c.latency = Duration::from_micros(20);
        c.links = 2;
        tweak(c);
    });
    s.handler.delay = Duration::from_micros(30);
    s.app.target = 48;
    s.app.track = true;
    s.run_for(Duration::from_millis(5));
    let p0 = s.paths[0];
    let held = (0..64u16)
        .filter(|&i| s.client.request_path(i) == Some(p0))
        .count();
    assert!(held >= 5, "requests in flight on the path: {held}");
    (s, p0, held)
}

/// A path the user disconnects under load fails its requests over as a dead one does, and
/// fences their chunks: the server may still work in them. The path stays closed (a user
/// disconnect does not reconnect), so the chunks stay parked, counted by `fenced_chunks`,
/// and no other permit is lost; the user's reconnect lifts them (found by the `rtrs_client`
/// fuzz target, whose invariant said every permit comes back).
#[test]
fn test_user_disconnect_keeps_fences_until_the_user_reconnects() {
    let (mut s, p0, held) = loaded_two_paths(182, |_| {});
    let now = s.now;
    s.client
        .disconnect_path(now, p0, &mut ClientSide(&mut s.net))
        .expect("disconnect");
    s.app.interval = Duration::from_micros(100);
    s.run_for(Duration::from_millis(200));
    assert_eq!(s.client.path_state(p0), Some(ClientState::Closed));
    let fenced = s.client.fenced_chunks();
    assert!(fenced >= held, "fenced {fenced} of {held}");
    // The load ends: what is still taken is exactly the fenced chunks.
    s.app.target = 0;
    s.run_for(Duration::from_millis(100));
    assert_eq!(s.app.inflight(), 0);
    let permits = s.client.permits().unwrap().clone();
    assert_eq!(
        permits.in_use() as usize,
        fenced,
        "only fenced permits are held"
    );
    assert_eq!(
        s.client.fenced_chunks(),
        fenced,
        "the fences outlive the drain"
    );
    // The user brings the path back: its fences lift and every permit is free.
    let now = s.now;
    s.client
        .reconnect_path(now, p0, &mut ClientSide(&mut s.net))
        .expect("reconnect");
    let back = s.run_until_cond(Duration::from_secs(10), |s| {
        s.client.path_state(p0) == Some(ClientState::Connected)
    });
    assert!(back, "the path came back: {:?}", s.client.path_error(p0));
    assert_eq!(
        s.client.fenced_chunks(),
        0,
        "the reconnect lifts the fences"
    );
    assert_eq!(permits.in_use(), 0, "every permit is back");
    assert_eq!(s.app.failed, 0);
    assert_eq!(s.app.verify_errors, 0);
    assert_eq!(s.app.spurious, 0);
    assert_eq!(s.handler.chunk_reuses, 0);
}

/// A removed path never connects again, so the chunks it left fenced are held for the
/// configured `fence_hold` and then return to use (before, they stayed out of use for the
/// session's life, and adding and removing paths under load drained the queue depth). A
/// new path that takes the removed one's index neither lifts the hold early nor inherits it.
#[test]
fn test_removed_path_holds_its_fences_for_fence_hold_then_frees_them() {
    let hold = Duration::from_secs(30);
    let (mut s, p0, held) = loaded_two_paths(183, |c| c.client.fence_hold = hold);
    let removed_at = s.now;
    s.client
        .remove_path(removed_at, p0, &mut ClientSide(&mut s.net))
        .expect("remove");
    s.app.interval = Duration::from_micros(100);
    s.run_for(Duration::from_millis(200));
    assert_eq!(s.client.path_state(p0), None, "removed");
    let fenced = s.client.fenced_chunks();
    assert!(fenced >= held, "held {fenced} of {held}");
    // A new path gets the removed one's index and link, and connects.
    s.net.next_link = Some(0);
    let now = s.now;
    let p2 = s
        .client
        .add_path(now, [0x77; 16], &mut ClientSide(&mut s.net))
        .expect("add");
    assert_eq!(p2.idx, p0.idx, "the index is reused");
    let up = s.run_until_cond(Duration::from_secs(10), |s| {
        s.client.path_state(p2) == Some(ClientState::Connected)
    });
    assert!(up, "the new path connected: {:?}", s.client.path_error(p2));
    assert_eq!(
        s.client.fenced_chunks(),
        fenced,
        "the new path lifted the hold"
    );
    // The load ends: what is still taken is exactly the held chunks, until the deadline.
    s.app.target = 0;
    s.run_for(Duration::from_millis(100));
    assert_eq!(s.app.inflight(), 0);
    let permits = s.client.permits().unwrap().clone();
    assert_eq!(
        permits.in_use() as usize,
        fenced,
        "only held permits are taken"
    );
    s.run_until(removed_at + hold - Duration::from_millis(1));
    assert_eq!(
        s.client.fenced_chunks(),
        fenced,
        "lifted before the deadline"
    );
    s.run_until(removed_at + hold + Duration::from_millis(1));
    assert_eq!(
        s.client.fenced_chunks(),
        0,
        "the hold lifts at its deadline"
    );
    assert_eq!(permits.in_use(), 0, "every permit is back");
    assert_eq!(s.app.failed, 0);
    assert_eq!(s.app.verify_errors, 0);
    assert_eq!(s.app.spurious, 0);
    assert_eq!(s.handler.chunk_reuses, 0);
}
