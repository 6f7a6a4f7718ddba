//! The bandwidth tests, both sides: the client streams `write-bw`, `send-bw` and `read-bw`
//! with `--tx-depth` requests outstanding and one in `cq_mod` signalled, as perftest does;
//! the server only has work for `send-bw` (reposting receives).

use std::time::Instant;

use dataplane::fabric::{
    Completion, Payload, Provider, RcQueuePair, RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode,
};

use super::endpoint::{Endpoint, RECV_DEPTH, TIMEOUT, fail};
use super::report::BwRow;
use super::session::{Req, Test};
use crate::PerfError;
use crate::harness::Timer;

/// The streaming loop of the bandwidth tests.
pub(super) fn stream<P: Provider>(
    ep: &mut Endpoint<P>,
    req: &Req,
    peer: RemoteAddr,
    timer: &Timer,
) -> Result<BwRow, PerfError> {
    let n = req.iters;
    let size = req.size as usize;
    let depth = u64::from(req.tx_depth);
    let cq_mod = (depth / 2).clamp(1, 100);
    let sge = ep.sge(0);
    let op = match req.test {
        Test::WriteBw => SendOp::Write(peer),
        Test::ReadBw => SendOp::Read(peer),
        _ => SendOp::Send,
    };
    let mut out = [Completion::default(); 64];
    let (mut posted, mut completed) = (0u64, 0u64);
    // For perftest's BW peak: when each batch of cq_mod requests started to be posted, and
    // when each signalled completion (the end of a batch) was polled.
    let batches = (n / cq_mod + 2) as usize;
    let mut posted_at: Vec<u64> = Vec::with_capacity(batches);
    let mut completed_at: Vec<(u64, u64)> = Vec::with_capacity(batches);
    let start = timer.now_ns();
    let guard = Instant::now();
    while completed < n {
        while posted < n && posted - completed < depth {
            let signal = (posted + 1) % cq_mod == 0 || posted + 1 == n;
            let wr = SendWr {
                wr_id: posted,
                op,
                payload: Payload::Sgl(&sge),
                flags: if signal {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            };
            if posted % cq_mod == 0 {
                posted_at.push(timer.now_ns());
            }
            if ep.qp.post_send(&[wr]).is_err() {
                if posted % cq_mod == 0 {
                    posted_at.pop();
                }
                break;
            }
            posted += 1;
        }
        let k = ep.poll(&mut out)?;
        for c in &out[..k] {
            if c.opcode == WcOpcode::Recv || c.opcode == WcOpcode::RecvRdmaWithImm {
                continue;
            }
            completed = (c.wr_id + 1).max(completed);
            completed_at.push((c.wr_id, timer.now_ns()));
        }
        if guard.elapsed() > TIMEOUT * 4 {
            return Err(fail(format_args!(
                "bandwidth run stalled at {completed}/{n}"
            )));
        }
    }
    let end = timer.now_ns();
    let secs = (end - start) as f64 / 1e9;
    let bits = |msgs: u64| msgs as f64 * size as f64 * 8.0;
    // perftest's peak: the smallest time per request from posting request i to polling the
    // completion of a later request j, over every batch start i and signalled j >= i.
    let mut best_per_msg = f64::INFINITY;
    for (b, &tp) in posted_at.iter().enumerate() {
        let i = b as u64 * cq_mod;
        for &(j, tc) in completed_at.iter().filter(|(j, _)| *j >= i) {
            let per = tc.saturating_sub(tp) as f64 / (j - i + 1) as f64;
            if per > 0.0 && per < best_per_msg {
                best_per_msg = per;
            }
        }
    }
    let peak = if best_per_msg.is_finite() {
        bits(1) / best_per_msg
    } else {
        0.0
    };
    let gbps = bits(n) / secs / 1e9;
    Ok(BwRow {
        size,
        iters: n,
        peak_gbps: peak.max(gbps),
        gbps,
        mpps: n as f64 / secs / 1e6,
    })
}

/// Server side of `send-bw`: takes the client's `req.iters` messages, reposting a receive
/// for each.
pub(super) fn sink<P: Provider>(ep: &mut Endpoint<P>, req: &Req) -> Result<(), PerfError> {
    let mut out = [Completion::default(); 64];
    let mut got = 0u64;
    let mut posted_recv = u64::from(RECV_DEPTH);
    let guard = Instant::now();
    while got < req.iters {
        let k = ep.poll(&mut out)?;
        for c in &out[..k] {
            if c.opcode == WcOpcode::Recv {
                got += 1;
                ep.repost_recv(posted_recv)?;
                posted_recv += 1;
            }
        }
        if guard.elapsed() > TIMEOUT * 4 {
            return Err(fail(format_args!("send-bw server stalled at {got}")));
        }
    }
    Ok(())
}
