//! The latency tests, both sides: `write-lat` and `send-lat` ping-pong one message at a time
//! (each sample is half the round trip), `read-lat` times one READ at a time (each sample
//! is the full READ, itself a round trip); and each size's summary from the samples.

use std::time::Instant;

use dataplane::fabric::{
    Completion, Payload, Provider, RcQueuePair, RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode,
};
use dp_plot::{PercentileSeries, fmt_bytes};
use hdrhistogram::Histogram;

use super::endpoint::{Endpoint, RECV_DEPTH, TIMEOUT, fail};
use super::report::LatRow;
use super::session::{Req, Test};
use crate::PerfError;
use crate::harness::Timer;

/// One size's latency result and its distribution (for `--plot`).
pub(super) type Measured = (LatRow, PercentileSeries);

fn lat_row(size: usize, samples: &[u64], halve: bool) -> Result<Measured, PerfError> {
    let div = if halve { 2.0 } else { 1.0 };
    let mut h = Histogram::<u64>::new(3).map_err(fail)?;
    for s in samples {
        // `record` resizes; `saturating_record` would clamp outliers (see harness::stats).
        h.record(if halve { s / 2 } else { *s }).map_err(fail)?;
    }
    // Extremes, mean and deviation exactly from the samples; percentiles from the histogram
    // (3 significant digits).
    let n = samples.len().max(1) as f64;
    let min = samples.iter().copied().min().unwrap_or(0) as f64 / div;
    let max = samples.iter().copied().max().unwrap_or(0) as f64 / div;
    let mean = samples.iter().map(|&s| s as f64 / div).sum::<f64>() / n;
    let var = samples
        .iter()
        .map(|&s| (s as f64 / div - mean).powi(2))
        .sum::<f64>()
        / n;
    let q = |p: f64| h.value_at_quantile(p) as f64;
    let dist = PercentileSeries::from_histogram(fmt_bytes(size as f64), &h, 1.0)
        .ok_or_else(|| fail("no latency samples"))?;
    let row = LatRow {
        size,
        iters: samples.len() as u64,
        min_ns: min,
        max_ns: max,
        p50_ns: q(0.5),
        mean_ns: mean,
        stdev_ns: var.sqrt(),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
    };
    Ok((row, dist))
}

fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Client side of `write-lat` and `send-lat`: `req.iters` ping-pongs, each timed from
/// posting our message to the server's answer.
pub(super) fn ping_pong<P: Provider>(
    ep: &mut Endpoint<P>,
    req: &Req,
    peer: RemoteAddr,
    inline: bool,
    timer: &Timer,
) -> Result<Measured, PerfError> {
    let n = req.iters;
    let size = req.size as usize;
    let mut out = [Completion::default(); 64];
    let mut samples = Vec::with_capacity(n as usize);
    let mut posted_recv = u64::from(RECV_DEPTH);
    let mut buf = vec![0u8; size];
    for i in 0..n {
        let m = marker(i);
        let t0 = timer.now_ns();
        let inline_buf = inline.then(|| {
            buf.iter_mut().for_each(|b| *b = 0);
            &mut buf[..]
        });
        send_marked(ep, req.test, peer, i, m, inline_buf, &mut out)?;
        await_marked(
            ep,
            req.test,
            m,
            &mut posted_recv,
            &mut out,
            "the server stopped answering",
        )?;
        samples.push(timer.now_ns() - t0);
    }
    lat_row(size, &samples, true)
}

/// Client side of `read-lat`: one signalled READ of the server's buffer at a time.
pub(super) fn read_lat<P: Provider>(
    ep: &mut Endpoint<P>,
    req: &Req,
    peer: RemoteAddr,
    timer: &Timer,
) -> Result<Measured, PerfError> {
    let n = req.iters;
    let size = req.size as usize;
    let mut out = [Completion::default(); 64];
    let mut samples = Vec::with_capacity(n as usize);
    let sge = ep.sge(0);
    for i in 0..n {
        let t0 = timer.now_ns();
        ep.qp
            .post_send(&[SendWr::signaled(i, SendOp::Read(peer), &sge)])
            .map_err(fail)?;
        let guard = Instant::now();
        while ep.poll(&mut out[..1])? == 0 {
            if guard.elapsed() > TIMEOUT {
                return Err(fail("read did not complete"));
            }
        }
        samples.push(timer.now_ns() - t0);
    }
    lat_row(size, &samples, false)
}

/// Server side of `write-lat` and `send-lat`: waits for each of the client's messages and
/// answers it the same way.
pub(super) fn pong<P: Provider>(ep: &mut Endpoint<P>, req: &Req) -> Result<(), PerfError> {
    let size = req.size as usize;
    let mut out = [Completion::default(); 64];
    let inline = size <= req.inline_size as usize && size <= ep.qp.caps().max_inline_data as usize;
    let mut buf = vec![0u8; size];
    let mut posted_recv = u64::from(RECV_DEPTH);
    for i in 0..req.iters {
        let m = marker(i);
        await_marked(
            ep,
            req.test,
            m,
            &mut posted_recv,
            &mut out,
            "the client stopped sending",
        )?;
        let inline_buf = inline.then_some(&mut buf[..]);
        send_marked(ep, req.test, req.buf, i, m, inline_buf, &mut out)?;
    }
    Ok(())
}

/// Sends ping-pong message `i` with the marker `m` in its last byte: an RDMA WRITE into the
/// peer's receive half (`write-lat`) or a SEND (`send-lat`), inline from `inline` when given,
/// else from our send half. One in 16 is signalled; a full send queue is polled until the
/// message goes.
fn send_marked<P: Provider>(
    ep: &mut Endpoint<P>,
    test: Test,
    peer: RemoteAddr,
    i: u64,
    m: u8,
    inline: Option<&mut [u8]>,
    out: &mut [Completion],
) -> Result<(), PerfError> {
    let size = ep.size;
    let op = if test == Test::WriteLat {
        SendOp::Write(RemoteAddr {
            addr: peer.addr + ep.rx_off as u64,
            rkey: peer.rkey,
        })
    } else {
        SendOp::Send
    };
    let sge = ep.sge(0);
    let payload = match inline {
        Some(buf) => {
            buf[size - 1] = m;
            Payload::Inline(buf)
        }
        None => {
            ep.mem.store_u8(size - 1, m);
            Payload::Sgl(&sge)
        }
    };
    let wr = SendWr {
        wr_id: i,
        op,
        payload,
        flags: if i % 16 == 15 {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        },
    };
    while ep.qp.post_send(&[wr]).is_err() {
        let _ = ep.poll(out)?;
    }
    Ok(())
}

/// Waits for the peer's message with marker `m`: the marker in the last byte of our receive
/// half (`write-lat`), or a receive completion, whose receive is posted again (`send-lat`).
/// After [`TIMEOUT`] without it, fails with `stalled` and the test's name.
fn await_marked<P: Provider>(
    ep: &mut Endpoint<P>,
    test: Test,
    m: u8,
    posted_recv: &mut u64,
    out: &mut [Completion],
    stalled: &str,
) -> Result<(), PerfError> {
    let guard = Instant::now();
    if test == Test::WriteLat {
        while ep.mem.load_u8(ep.rx_off + ep.size - 1) != m {
            let _ = ep.poll(out)?;
            if guard.elapsed() > TIMEOUT {
                return Err(fail(format_args!("{stalled} (write-lat)")));
            }
        }
    } else {
        'wait: loop {
            let k = ep.poll(out)?;
            for c in &out[..k] {
                if c.opcode == WcOpcode::Recv {
                    ep.repost_recv(*posted_recv)?;
                    *posted_recv += 1;
                    break 'wait;
                }
            }
            if guard.elapsed() > TIMEOUT {
                return Err(fail(format_args!("{stalled} (send-lat)")));
            }
        }
    }
    Ok(())
}
