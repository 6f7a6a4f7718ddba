//! Proof that the shm fast path (`post_send`, `post_recv`, `poll`) makes no system call.
//!
//! In a child process (see `lcore::seccomp::run_in_child`), two devices connect a queue
//! pair; then each side moves to its own data thread, which installs a seccomp filter that
//! traps every system call, and the two threads move at least 100k messages of every
//! operation kind in both directions: RDMA WRITE, WRITE with immediate, SEND (into posted
//! receives) and RDMA READ. The test passes only if no syscall was trapped and every
//! message arrived in order with its data.

#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dataplane::fabric::conformance::{Env, Pair, Side, connect};
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::fabric::{
    Completion, CompletionQueue, MemoryRegion, Payload, QpCaps, RcQueuePair, RecvWr, RemoteAddr,
    SendFlags, SendOp, SendWr, WcOpcode,
};
use lcore::seccomp;

/// Messages per operation kind and direction.
const N: u64 = 100_000;
const KINDS: usize = 4;
const WINDOW: u64 = 48;
const SLOTS: u64 = 128;
const SEND_AREA: usize = 0;
const RECV_AREA: usize = 64 << 10;
const WRITE_AREA: usize = 256 << 10;
const READ_AREA: usize = 512 << 10;
const MSG: usize = 64;

#[derive(Default)]
struct Shared {
    /// Per side: phases finished (Release), read by the other side (Acquire).
    done: [AtomicU64; 2],
    /// Per side: messages received per phase, and errors.
    received: [[AtomicU64; KINDS]; 2],
    sent: [[AtomicU64; KINDS]; 2],
    errors: [AtomicU64; 2],
    first_error: [AtomicU64; 2],
    filter_errno: [AtomicU64; 2],
}

fn kind(phase: usize) -> &'static str {
    ["write", "write_imm", "send", "read"][phase]
}

fn put_u64(side: &Side<Shm>, off: usize, v: u64) {
    for (i, b) in v.to_le_bytes().iter().enumerate() {
        side.fill(off + i, 1, |_| *b);
    }
}

fn get_u64(side: &Side<Shm>, off: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = side.byte(off + i);
    }
    u64::from_le_bytes(b)
}

/// One side's data thread body: returns (iterations used) or an error code.
fn run(
    side: &mut Side<Shm>,
    peer: RemoteAddr,
    me: usize,
    sh: &Shared,
    warmup: bool,
    posted: &mut u64,
) -> Result<(), u64> {
    let n = if warmup { 200 } else { N };
    let other = 1 - me;
    let mut out = [Completion::default(); 32];
    // Receives stay posted across phases: top up to SLOTS once.
    while *posted < SLOTS {
        let s = [side
            .mr
            .sge(RECV_AREA + (*posted % SLOTS) as usize * MSG, MSG as u32)];
        side.qp
            .post_recv(&[RecvWr {
                wr_id: *posted,
                sgl: &s,
            }])
            .map_err(|_| 1u64)?;
        *posted += 1;
    }
    for phase in 0..KINDS {
        let needs_recv = matches!(phase, 1 | 2);
        let mut received = 0u64;
        let mut sent = 0u64;
        let mut completed_signaled = 0u64;
        let mut expected_signaled = 0u64;
        let mut guard: u64 = 0;
        while sent < n || (needs_recv && received < n) || completed_signaled < expected_signaled {
            guard += 1;
            if guard > 400_000_000 {
                // Stalled: record where (phase, sent, received, signalled) for the report.
                return Err(2_000_000_000_000
                    + phase as u64 * 100_000_000_000
                    + sent.min(99_999) * 1_000_000
                    + received.min(99_999) * 10
                    + (completed_signaled < expected_signaled) as u64);
            }
            if sent < n && sent < completed_signaled * 16 + WINDOW {
                let slot = (sent % SLOTS) as usize * MSG;
                put_u64(side, SEND_AREA + slot, sent);
                let signal = sent % 16 == 15 || sent + 1 == n;
                let sge = [side.mr.sge(SEND_AREA + slot, MSG as u32)];
                let rsge = [side.mr.sge(READ_AREA + slot, MSG as u32)];
                let target = RemoteAddr {
                    addr: peer.addr + (WRITE_AREA + slot) as u64,
                    rkey: peer.rkey,
                };
                let src = RemoteAddr {
                    addr: peer.addr + (READ_AREA + slot) as u64,
                    rkey: peer.rkey,
                };
                let (op, payload) = match phase {
                    0 => (SendOp::Write(target), Payload::Sgl(&sge)),
                    1 => (SendOp::WriteImm(target, sent as u32), Payload::Sgl(&sge)),
                    2 => (SendOp::Send, Payload::Sgl(&sge)),
                    _ => (SendOp::Read(src), Payload::Sgl(&rsge)),
                };
                let wr = SendWr {
                    wr_id: sent,
                    op,
                    payload,
                    flags: if signal {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                };
                if side.qp.post_send(&[wr]).is_ok() {
                    sent += 1;
                    if signal {
                        expected_signaled += 1;
                    }
                }
            }
            let k = side.cq.poll(&mut out);
            for c in &out[..k] {
                if !c.is_ok() {
                    return Err(100 + c.status.to_raw() as u64);
                }
                match c.opcode {
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                        let slot = (c.wr_id % SLOTS) as usize * MSG;
                        let seq = if c.opcode == WcOpcode::Recv {
                            get_u64(side, RECV_AREA + slot)
                        } else {
                            if c.imm != Some(received as u32) {
                                return Err(3);
                            }
                            get_u64(side, WRITE_AREA + (received % SLOTS) as usize * MSG)
                        };
                        if seq != received {
                            return Err(4);
                        }
                        received += 1;
                        let s = [side
                            .mr
                            .sge(RECV_AREA + (*posted % SLOTS) as usize * MSG, MSG as u32)];
                        side.qp
                            .post_recv(&[RecvWr {
                                wr_id: *posted,
                                sgl: &s,
                            }])
                            .map_err(|_| 5u64)?;
                        *posted += 1;
                    }
                    _ => completed_signaled += 1,
                }
            }
        }
        if !warmup {
            sh.sent[me][phase].store(sent, Ordering::Relaxed);
            sh.received[me][phase].store(received, Ordering::Relaxed);
        }
        // Phase barrier: receives of the next phase must not catch this phase's messages.
        let target = if warmup {
            phase as u64 + 1
        } else {
            KINDS as u64 + phase as u64 + 1
        };
        // B1: Release, pairs with B2 on the other side.
        sh.done[me].store(target, Ordering::Release);
        // B2: Acquire, pairs with B1.
        // No polling here: completions that arrive now belong to the peer's next phase.
        // (The peer's sends need only our posted receives, not our polling.)
        while sh.done[other].load(Ordering::Acquire) < target {
            core::hint::spin_loop();
        }
    }
    Ok(())
}

fn body() -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("dp-nosys-{}", std::process::id()));
    let cfg = ShmConfig {
        dir: Some(dir),
        ..ShmConfig::default()
    };
    let env = Env::<Shm> {
        a: ShmDevice::open(cfg.clone()).map_err(|e| e.to_string())?,
        b: ShmDevice::open(cfg).map_err(|e| e.to_string())?,
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 9000,
    };
    let caps = QpCaps {
        max_send_wr: 128,
        max_recv_wr: SLOTS as u32,
        ..QpCaps::default()
    };
    let Pair { a, b } = connect(&env, 9000, caps, &[], &[])?;
    let ra = a.remote(0);
    let rb = b.remote(0);
    let sh = Arc::new(Shared::default());
    let mut handles = Vec::new();
    for (me, mut side, peer) in [(0usize, a, rb), (1usize, b, ra)] {
        let sh = sh.clone();
        handles.push(std::thread::spawn(move || {
            // Warm up unfiltered: first touches, lazy initialisation.
            let mut posted = 0u64;
            if let Err(code) = run(&mut side, peer, me, &sh, true, &mut posted) {
                sh.errors[me].store(1, Ordering::Relaxed);
                sh.first_error[me].store(code, Ordering::Relaxed);
                sh.done[me].store(u64::MAX, Ordering::Release);
                return;
            }
            if let Err(e) = seccomp::install_trap_filter() {
                sh.filter_errno[me].store(e.raw_os_error().unwrap_or(-1) as u64, Ordering::Relaxed);
            }
            if let Err(code) = run(&mut side, peer, me, &sh, false, &mut posted) {
                sh.errors[me].store(1, Ordering::Relaxed);
                sh.first_error[me].store(code, Ordering::Relaxed);
                sh.done[me].store(u64::MAX, Ordering::Release);
            }
            // Filtered: may never make another syscall, so never exit.
            seccomp::park_forever();
        }));
    }
    let t0 = Instant::now();
    let finished = 2 * KINDS as u64;
    while (0..2).any(|i| sh.done[i].load(Ordering::Acquire) < finished) {
        if t0.elapsed() > Duration::from_secs(150) {
            return Err(format!(
                "timed out: phases done {} / {}",
                sh.done[0].load(Ordering::Acquire),
                sh.done[1].load(Ordering::Acquire)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = t0.elapsed();
    for i in 0..2 {
        if sh.errors[i].load(Ordering::Relaxed) != 0 {
            return Err(format!(
                "side {i} failed with code {}",
                sh.first_error[i].load(Ordering::Relaxed)
            ));
        }
        if sh.filter_errno[i].load(Ordering::Relaxed) != 0 {
            return Err(format!("side {i}: installing the filter failed"));
        }
    }
    let mut report = format!("{:.2}s;", elapsed.as_secs_f64());
    for phase in 0..KINDS {
        for me in 0..2 {
            let s = sh.sent[me][phase].load(Ordering::Relaxed);
            let r = sh.received[1 - me][phase].load(Ordering::Relaxed);
            if s < N {
                return Err(format!("side {me} sent only {s} {} messages", kind(phase)));
            }
            if matches!(phase, 1 | 2) && r < N {
                return Err(format!(
                    "side {} received only {r} {} messages",
                    1 - me,
                    kind(phase)
                ));
            }
            report.push_str(&format!(" {}[{me}->{}]={s}", kind(phase), 1 - me));
        }
    }
    // Keep the threads' objects alive: they are parked holding them.
    std::mem::forget(handles);
    Ok(report)
}

#[test]
fn shm_fast_path_makes_no_syscalls() {
    let report = seccomp::run_in_child("shm_fast_path_makes_no_syscalls", body)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("child: {}", report.message);
    report.assert_ok_without_syscalls();
}
