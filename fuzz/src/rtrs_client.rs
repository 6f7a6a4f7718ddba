//! The RTRS client session ([`ClientSession`](dp_rtrs::clt::ClientSession)) against a
//! hostile server and a failing fabric, over the simulator ([`Sim`]).
//!
//! An honest server and a verifying workload run on two paths; the fuzzer interleaves
//! time, load, faults (cut links, queue pairs in error, CM disconnects, a server that stops
//! polling or fails or holds requests), control operations (disconnect, reconnect, remove,
//! add a path, change the policy), and what a hostile server can make the client see: any
//! receive completion on any connection (any opcode, immediate, invalidated key, length,
//! status, payload), any CM event with any private data, garbage in its chunks.
//!
//! Checked after every input:
//!
//! * no panic, and no local access outside a buffer (the simulator counts them);
//! * every IO completes exactly once: once the faults stop and the load ends, within a
//!   bounded virtual time nothing is in flight and every permit is back, except the
//!   fenced chunks of a path the user disconnected or removed and did not reconnect (the
//!   old path's server may still work in them; they stay parked until that path connects
//!   again or the session closes, `clt/fence.rs`); no other fence outlives the reconnects;
//! * with no hostile operation in the input, every READ returned the last data written and
//!   every WRITE carried its data (faults alone never corrupt anything).

use std::time::Duration;

use arbitrary::Arbitrary;
use dp_fabric::{WcOpcode, WcStatus};
use dp_rtrs::clt::{ClientEvent, MpPolicy};
use dp_rtrs::sim::{ClientSide, Sim, SimConfig};
use dp_rtrs::work::{CmEvent, Wc};

/// One fuzz input: a few configuration bits, then the operations.
#[derive(Arbitrary, Debug)]
pub struct Input {
    knobs: u8,
    ops: Vec<Op>,
}

/// One step.
#[derive(Arbitrary, Debug)]
enum Op {
    /// Virtual time moves on by this many tens of microseconds.
    Run(u16),
    /// ... or by this many tens of milliseconds (mod 10).
    RunLong(u8),
    /// The workload keeps this many IOs in flight (mod 24).
    Load(u8),
    /// A link goes down or comes back.
    Link {
        path: bool,
        up: bool,
    },
    /// A path's queue pairs go to the error state.
    KillQps(bool),
    /// A path's connections are disconnected through the CM.
    CmDisconnect(bool),
    /// The server polls or stops polling.
    ServerPolling(bool),
    /// The handler fails every request with this errno, or answers normally.
    HandlerFail(Option<u8>),
    /// The handler holds requests (answers nothing) or not.
    HandlerHold(bool),
    /// A hostile completion of the next receive on a client connection.
    Inject {
        path: bool,
        cid: u8,
        rdma_imm: bool,
        imm: Option<u32>,
        invalidated: Option<u32>,
        byte_len: u16,
        status: u8,
        payload: Vec<u8>,
    },
    /// A hostile CM event on a client connection.
    Cm {
        path: bool,
        cid: u8,
        kind: u8,
        pdata: Vec<u8>,
    },
    /// Garbage into a chunk of the session.
    Scribble {
        chunk: u8,
        off: u16,
        len: u16,
        byte: u8,
    },
    /// Control operations.
    Disconnect(bool),
    Reconnect(bool),
    Remove(bool),
    Add,
    Policy(u8),
}

fn status(s: u8) -> WcStatus {
    if s < 192 {
        WcStatus::Success
    } else {
        WcStatus::from_raw(u32::from(s - 192))
    }
}

/// Runs one input.
pub fn run(input: &Input) {
    let mut cfg = SimConfig::new(u64::from(input.knobs));
    cfg.server.queue_depth = 16;
    cfg.server.always_invalidate = input.knobs & 1 != 0;
    cfg.per_io_registration = input.knobs & 2 != 0;
    cfg.client.policy = match (input.knobs >> 2) % 3 {
        0 => MpPolicy::RoundRobin,
        1 => MpPolicy::MinInflight,
        _ => MpPolicy::MinLatency,
    };
    cfg.client.reconnect_delay = Duration::from_millis(20);
    cfg.client.hb_interval = Duration::from_millis(20);
    cfg.server.hb_interval = Duration::from_millis(20);
    cfg.links = 3;
    let mut s = Sim::new(cfg);
    s.open();
    s.app.interval = Duration::from_micros(200);
    let mut hostile = false;
    // A path closed by the user (disconnected or removed) and not reconnected keeps the
    // chunks of its unanswered requests fenced (`ClientSession::fenced_chunks`).
    let mut user_closed = false;
    for op in input.ops.iter().take(48) {
        match op {
            Op::Run(n) => s.run_for(Duration::from_micros(10 * u64::from(*n % 2000))),
            Op::RunLong(n) => s.run_for(Duration::from_millis(10 * u64::from(*n % 10))),
            Op::Load(n) => s.app.target = usize::from(*n % 24),
            Op::Link { path, up } => s.net.set_link(usize::from(*path), *up),
            Op::KillQps(p) => s.net.kill_qps(usize::from(*p)),
            Op::CmDisconnect(p) => s.net.cm_disconnect(usize::from(*p)),
            Op::ServerPolling(b) => s.server_polling = *b,
            Op::HandlerFail(e) => s.handler.fail_with = e.map(|e| -i32::from(e.max(1))),
            Op::HandlerHold(b) => s.handler.hold = *b,
            Op::Inject {
                path,
                cid,
                rdma_imm,
                imm,
                invalidated,
                byte_len,
                status: st,
                payload,
            } => {
                let Some(&p) = s.paths.get(usize::from(*path)) else {
                    continue;
                };
                let Some(conn) = s.net.client_conn(p, u16::from(*cid % 3)) else {
                    continue;
                };
                hostile = true;
                let wc = Wc {
                    wr_id: 0,
                    status: status(*st),
                    opcode: if *rdma_imm {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    },
                    byte_len: u32::from(*byte_len),
                    imm: *imm,
                    invalidated: *invalidated,
                };
                let n = payload.len().min(8200);
                s.inject_client_recv(conn, wc, &payload[..n]);
            }
            Op::Cm {
                path,
                cid,
                kind,
                pdata,
            } => {
                let Some(&p) = s.paths.get(usize::from(*path)) else {
                    continue;
                };
                let Some(conn) = s.net.client_conn(p, u16::from(*cid % 3)) else {
                    continue;
                };
                hostile = true;
                let ev = match kind % 6 {
                    0 => CmEvent::Established {
                        private_data: pdata,
                    },
                    1 => CmEvent::Rejected {
                        private_data: pdata,
                    },
                    2 => CmEvent::Unreachable,
                    3 => CmEvent::AddrError,
                    4 => CmEvent::Disconnected,
                    _ => CmEvent::DeviceRemoval,
                };
                let now = s.now;
                s.client
                    .handle_cm(now, conn, ev, &mut ClientSide(&mut s.net));
            }
            Op::Scribble {
                chunk,
                off,
                len,
                byte,
            } => {
                let Some(sess) = s.server.sessions().next() else {
                    continue;
                };
                hostile = true;
                let n = usize::from(*len % 512);
                s.server_chunk_write(
                    sess,
                    u16::from(*chunk % 16),
                    usize::from(*off),
                    &vec![*byte; n],
                );
            }
            Op::Disconnect(p) => {
                if let Some(&id) = s.paths.get(usize::from(*p)) {
                    let now = s.now;
                    user_closed |= s
                        .client
                        .disconnect_path(now, id, &mut ClientSide(&mut s.net))
                        .is_ok();
                }
            }
            Op::Reconnect(p) => {
                if let Some(&id) = s.paths.get(usize::from(*p)) {
                    let now = s.now;
                    let _ = s
                        .client
                        .reconnect_path(now, id, &mut ClientSide(&mut s.net));
                }
            }
            Op::Remove(p) => {
                if s.paths.len() > 1 && usize::from(*p) < s.paths.len() {
                    let id = s.paths.remove(usize::from(*p));
                    let now = s.now;
                    user_closed |= s
                        .client
                        .remove_path(now, id, &mut ClientSide(&mut s.net))
                        .is_ok();
                }
            }
            Op::Add => {
                if s.paths.len() < 2 {
                    s.net.next_link = Some(2);
                    let now = s.now;
                    let uuid = [0xA0 + s.paths.len() as u8; 16];
                    if let Ok(id) = s.client.add_path(now, uuid, &mut ClientSide(&mut s.net)) {
                        s.paths.push(id);
                    }
                }
            }
            Op::Policy(p) => s.client.set_policy(match p % 3 {
                0 => MpPolicy::RoundRobin,
                1 => MpPolicy::MinInflight,
                _ => MpPolicy::MinLatency,
            }),
        }
        assert_eq!(s.net.bounds_faults, 0, "a local access outside a buffer");
        assert_eq!(s.app.spurious, 0, "an IO completed twice, or for another");
    }
    // The faults stop; the load ends. Everything in flight must complete.
    for l in 0..s.net.links.len() {
        s.net.set_link(l, true);
        s.net.links[l].loss = 0.0;
    }
    s.server_polling = true;
    s.handler.hold = false;
    s.handler.fail_with = None;
    s.app.target = 0;
    let closed = s.client_log.iter().any(|l| l.ev == ClientEvent::Closed);
    s.run_for(Duration::from_secs(2));
    assert_eq!(
        s.app.inflight(),
        0,
        "IO lost: still in flight after the faults stopped"
    );
    if let Some(p) = s.client.permits() {
        let fenced = s.client.fenced_chunks();
        if user_closed {
            // Every permit still taken is a fenced chunk of a path the user closed.
            assert_eq!(
                p.in_use() as usize,
                fenced,
                "a permit was neither returned nor fenced"
            );
        } else {
            // Every path that died by a fault has reconnected, which lifts its fences.
            assert_eq!((p.in_use(), fenced), (0, 0), "a permit was not returned");
        }
    }
    assert_eq!(s.app.spurious, 0);
    assert_eq!(s.net.bounds_faults, 0);
    if !hostile && !closed {
        assert_eq!(s.app.verify_errors, 0, "faults alone corrupted data");
        assert_eq!(
            s.handler.bad_requests, 0,
            "faults alone corrupted a request"
        );
    }
}
