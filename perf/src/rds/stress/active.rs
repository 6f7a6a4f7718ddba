//! The active side's loop: keeps `tasks × depth` requests outstanding round robin over
//! its sockets (or sends as fast as the sockets take them, one way), takes acks or RDMA
//! notifications, warms up, then measures for `-T` seconds with a row every second.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use dataplane::rds::uapi::{RDS_RDMA_NOTIFY_ME, RDS_RDMA_SUCCESS};
use dataplane::rds::{RdsError, Received, RecvFlags, SendFlags};
use dp_plot::PercentileSeries;
use hdrhistogram::Histogram;
use lcore::time::{Clock, Instant, RealClock};

use super::args::{MAX_MSG, REQ_HDR, StressArgs, WARMUP};
use super::report::{SecRow, StressReport};
use super::sides::{DONE, MEASURE, Readable, Shared, blocked, frags_for};
use crate::PerfError;
use crate::rds::rdma::{self, HELLO};
use crate::rds::{all_counters, node_with_window};

impl StressArgs {
    /// The active side.
    pub(super) fn active(
        &self,
        dir: Option<&std::path::Path>,
        addr: IpAddr,
        peer: IpAddr,
        sockets: u32,
        secs: u64,
        shared: &Shared,
    ) -> Result<StressReport, PerfError> {
        let r = self.active_inner(dir, addr, peer, sockets, secs, shared);
        // Relaxed: the passive side only needs to see it eventually.
        shared.phase.store(DONE, Ordering::Relaxed);
        r
    }

    fn active_inner(
        &self,
        dir: Option<&std::path::Path>,
        addr: IpAddr,
        peer: IpAddr,
        sockets: u32,
        secs: u64,
        shared: &Shared,
    ) -> Result<StressReport, PerfError> {
        let clock = RealClock::new();
        let inflight_max = u64::from(self.tasks * self.depth);
        let frags = frags_for(self.req.max(self.ack), self.tasks * self.depth);
        let win = self
            .rdma
            .then(|| rdma::window(&format!("dp-perf-rdma-{addr}"), 1, self.req, 0xa5))
            .transpose()?;
        let mut n = node_with_window(&self.fabric, dir, addr, 1, frags, sockets, win.clone())?;
        let t0 = clock.now();
        // --rdma: the passive side's cookie per socket, asked for with hellos.
        let mut cookies: Vec<Option<u64>> = vec![None; sockets as usize];
        let mut missing = if self.rdma { sockets as usize } else { 0 };
        let mut next_hello = t0;
        let rdma_flags = if self.one_way { RDS_RDMA_NOTIFY_ME } else { 0 };
        let (socks, index) = self.bind_all(&mut n, t0, addr, sockets)?;
        let dests: Vec<SocketAddr> = (0..sockets)
            .map(|k| SocketAddr::new(peer, self.port + 1 + k as u16))
            .collect();
        let mut ready = Readable::new(sockets as usize);
        let mut req = vec![0xa5u8; self.req];
        let mut buf = vec![0u8; MAX_MSG];
        let mut hist = Histogram::<u64>::new(3).map_err(|e| PerfError::Fabric(e.to_string()))?;
        let (mut tx, mut rx, mut inflight, mut seq) = (0u64, 0u64, 0u64, 0u64);
        let (mut send_ns, mut sends) = (0u64, 0u64);
        let mut rtt_sum = 0u64;
        let mut rr = 0usize;
        let mut waits = [0u64; 3];
        let mut rows = Vec::new();
        let mut measure_start: Option<(Instant, u64, u64)> = None;
        let mut tick = (t0, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        let connect_deadline = t0.saturating_add(Duration::from_secs(10));
        let mut connected = false;
        let (mut iters, mut iters0) = (0u64, 0u64);
        loop {
            iters += 1;
            let now = clock.now();
            n.poll(now);
            ready.take_events(&mut n, &index);
            while let Some(k) = ready.next() {
                loop {
                    match n
                        .engine_mut()
                        .recv_from(now, socks[k], &mut buf, RecvFlags::DONTWAIT)
                    {
                        Ok(Received::Data {
                            rdma_dest: Some(c), ..
                        }) if self.rdma => {
                            if cookies[k].replace(c).is_none() {
                                missing -= 1;
                            }
                        }
                        Ok(Received::RdmaStatus(st)) if self.rdma => {
                            if st.status != RDS_RDMA_SUCCESS {
                                return Err(PerfError::Fabric(format!(
                                    "RDMA operation {} failed: RDS_RDMA status {}",
                                    st.user_token, st.status
                                )));
                            }
                            inflight = inflight.saturating_sub(1);
                            // One way by RDMA, the notifications count the requests done
                            // (so a two-process run measures it too).
                            rx += 1;
                        }
                        Ok(Received::Data { len, .. }) if len >= REQ_HDR => {
                            rx += 1;
                            inflight = inflight.saturating_sub(1);
                            let sent = u64::from_le_bytes(buf[8..16].try_into().expect("8"));
                            let rtt = now.as_nanos().saturating_sub(sent);
                            rtt_sum += rtt;
                            if measure_start.is_some() {
                                let _ = hist.record(rtt.max(1));
                            }
                        }
                        Ok(_) => {}
                        Err(RdsError::WouldBlock) => break,
                        Err(e) => return Err(PerfError::Fabric(format!("recv: {e}"))),
                    }
                }
            }
            if missing > 0 && now >= next_hello {
                // --rdma: ask each socket's peer for its region (again until answered).
                next_hello = now.saturating_add(Duration::from_millis(50));
                for (k, c) in cookies.iter().enumerate() {
                    if c.is_none() {
                        let hello = [HELLO.to_le_bytes(), [0; 8]].concat();
                        match n.engine_mut().send_to(
                            now,
                            socks[k],
                            Some(dests[k]),
                            &hello,
                            SendFlags::DONTWAIT,
                        ) {
                            Ok(_) => {}
                            Err(e) if blocked(e) => {}
                            Err(e) => return Err(PerfError::Fabric(format!("hello: {e}"))),
                        }
                    }
                }
            }
            // Issue requests up to the window (one way: until the sockets push back; one
            // way by RDMA: up to the window of notified operations).
            let t_send = clock.now();
            let mut issued = 0u64;
            while missing == 0 && ((self.one_way && !self.rdma) || inflight < inflight_max) {
                let k = rr;
                let mut hdr = [0u8; REQ_HDR];
                hdr[..8].copy_from_slice(&seq.to_le_bytes());
                hdr[8..16].copy_from_slice(&t_send.as_nanos().to_le_bytes());
                if self.req >= REQ_HDR {
                    req[..REQ_HDR].copy_from_slice(&hdr);
                }
                let sent = match (&win, cookies[k]) {
                    (Some(w), Some(c)) => n.engine_mut().send_msg(
                        t_send,
                        socks[k],
                        Some(dests[k]),
                        &hdr,
                        &[rdma::write_args(w, self.req, c, seq, rdma_flags)],
                        SendFlags::DONTWAIT,
                    ),
                    _ => n.engine_mut().send_to(
                        t_send,
                        socks[k],
                        Some(dests[k]),
                        &req,
                        SendFlags::DONTWAIT,
                    ),
                };
                match sent {
                    Ok(_) => {
                        seq += 1;
                        tx += 1;
                        inflight += 1;
                        issued += 1;
                        rr = if rr + 1 == socks.len() { 0 } else { rr + 1 };
                    }
                    Err(e) if blocked(e) => {
                        if measure_start.is_some() {
                            waits[match e {
                                RdsError::WouldBlock => 0,
                                RdsError::Congested { .. } => 1,
                                _ => 2,
                            }] += 1;
                        }
                        break;
                    }
                    Err(e) => return Err(PerfError::Fabric(format!("send: {e}"))),
                }
            }
            if issued > 0 {
                send_ns += clock.now().nanos_since(t_send);
                sends += issued;
            }
            n.flush(now);
            // Warm-up ends once the first answer came back (the connection is up).
            let answered = if self.passive_counts() {
                // Relaxed: a statistic.
                shared.passive_rx.load(Ordering::Relaxed) > 0
            } else {
                rx > 0
            };
            if !connected {
                if answered {
                    connected = true;
                    tick.0 = now;
                } else if now > connect_deadline {
                    return Err(PerfError::Fabric(format!(
                        "no answer from {peer} within 10 s: is the passive side running (same --dir)?"
                    )));
                }
                continue;
            }
            let since_connect = now.nanos_since(tick.0.min(now));
            if measure_start.is_none() && since_connect >= WARMUP.as_nanos() as u64 {
                let prx = shared.passive_rx.load(Ordering::Relaxed);
                measure_start = Some((now, rx, prx));
                iters0 = iters;
                tick = (now, tx, rx, prx, send_ns, sends, rtt_sum);
                // Relaxed: see `active`.
                shared.phase.store(MEASURE, Ordering::Relaxed);
            }
            let Some((m0, rx0, prx0)) = measure_start else {
                continue;
            };
            let el = now.nanos_since(tick.0);
            if el >= 1_000_000_000 {
                let prx = shared.passive_rx.load(Ordering::Relaxed);
                rows.push(self.row(&tick, &(now, tx, rx, prx, send_ns, sends, rtt_sum)));
                tick = (now, tx, rx, prx, send_ns, sends, rtt_sum);
            }
            let total = now.nanos_since(m0);
            if total >= secs * 1_000_000_000 {
                let s = total as f64 / 1e9;
                let prx = shared.passive_rx.load(Ordering::Relaxed);
                let done = if self.passive_counts() {
                    prx - prx0
                } else {
                    rx - rx0
                };
                let rate = done as f64 / s;
                let rtt = (!self.one_way)
                    .then(|| PercentileSeries::from_histogram("round trip", &hist, 1.0))
                    .flatten();
                return Ok(StressReport {
                    rows,
                    rtt,
                    waits,
                    counters: all_counters(&mut n)
                        .into_iter()
                        .map(|(k, v)| (k, v, 0))
                        .collect(),
                    iterations: [iters - iters0, 0],
                    ..self.report(sockets, rate)
                });
            }
        }
    }

    /// Whether the passive side's count is the rate (one way without RDMA: nothing comes
    /// back to the active side; one way by RDMA, the notifications do).
    fn passive_counts(&self) -> bool {
        self.one_way && !self.rdma
    }

    /// One per-second row from two counter snapshots
    /// (time, tx, rx, passive rx, send ns, sends, rtt sum).
    fn row(
        &self,
        a: &(Instant, u64, u64, u64, u64, u64, u64),
        b: &(Instant, u64, u64, u64, u64, u64, u64),
    ) -> SecRow {
        let s = b.0.nanos_since(a.0).max(1) as f64 / 1e9;
        let tx = (b.1 - a.1) as f64;
        let rx = if self.passive_counts() {
            (b.3 - a.3) as f64
        } else {
            (b.2 - a.2) as f64
        };
        let bytes = if self.one_way {
            tx * self.req as f64
        } else {
            tx * self.req as f64 + rx * self.ack as f64
        };
        let sends = (b.5 - a.5).max(1) as f64;
        SecRow {
            tx: tx / s,
            rx: rx / s,
            kbytes: bytes / 1024.0 / s,
            tx_us: (b.4 - a.4) as f64 / sends / 1000.0,
            rtt_us: if self.one_way || rx == 0.0 {
                0.0
            } else {
                (b.6 - a.6) as f64 / rx / 1000.0
            },
        }
    }
}
