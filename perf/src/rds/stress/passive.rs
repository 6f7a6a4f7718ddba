//! The passive side's loop: takes requests from its sockets and answers each with an ack
//! (acks that find a send buffer full wait, in order), offers its RDMA region to the
//! active side's hellos, and counts what arrived while measuring.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use dataplane::rds::{RdsError, Received, RecvFlags, SendCmsg, SendFlags};
use lcore::time::{Clock, RealClock};

use super::args::{MAX_MSG, REQ_HDR, StressArgs};
use super::sides::{DONE, MEASURE, Readable, Shared, WARM, blocked, frags_for};
use crate::PerfError;
use crate::rds::rdma::{self, HELLO};
use crate::rds::{all_counters, node_with_window};

/// What the passive side ends with: requests received while measuring, loop iterations
/// while measuring, and its node's counters.
pub(super) type PassiveResult = (u64, u64, Vec<(&'static str, u64)>);

impl StressArgs {
    /// The passive side: receive requests, answer each with an ack. Returns the requests
    /// received while measuring.
    pub(super) fn passive(
        &self,
        dir: Option<&std::path::Path>,
        addr: IpAddr,
        sockets: u32,
        shared: &Shared,
        limit: Option<Duration>,
    ) -> Result<PassiveResult, PerfError> {
        let clock = RealClock::new();
        let frags = frags_for(self.req.max(self.ack), self.tasks * self.depth);
        let win = self
            .rdma
            .then(|| {
                rdma::window(
                    &format!("dp-perf-rdma-{addr}"),
                    sockets as usize,
                    self.req,
                    0,
                )
            })
            .transpose()?;
        let mut n = node_with_window(&self.fabric, dir, addr, 2, frags, sockets, win.clone())?;
        let start = clock.now();
        let (socks, index) = self.bind_all(&mut n, start, addr, sockets)?;
        // --rdma: each socket's region, offered to the active side on its hello.
        let mut cookies = Vec::new();
        if let Some(w) = &win {
            for (k, &s) in socks.iter().enumerate() {
                cookies.push(rdma::register(&mut n, s, w, k, self.req)?);
            }
        }
        let mut ready = Readable::new(sockets as usize);
        let mut buf = vec![0u8; MAX_MSG];
        let mut ack = vec![0u8; self.ack.max(REQ_HDR)];
        // Acks that found the send buffer full: (socket, destination, request header).
        let mut backlog: std::collections::VecDeque<(usize, SocketAddr, [u8; REQ_HDR])> =
            std::collections::VecDeque::new();
        let (mut rx, mut rx_at_start) = (0u64, 0u64);
        let (mut iters, mut iters_at_start) = (0u64, 0u64);
        let mut seen = WARM;
        loop {
            iters += 1;
            let now = clock.now();
            // Relaxed: a flag read each iteration; nothing else is ordered by it.
            let phase = shared.phase.load(Ordering::Relaxed);
            if phase != seen {
                if phase == MEASURE {
                    rx_at_start = rx;
                    iters_at_start = iters;
                }
                if phase == DONE {
                    return Ok((
                        rx - rx_at_start,
                        iters - iters_at_start,
                        all_counters(&mut n),
                    ));
                }
                seen = phase;
            }
            if limit.is_some_and(|l| now.nanos_since(start) > l.as_nanos() as u64) {
                return Ok((
                    rx - rx_at_start,
                    iters - iters_at_start,
                    all_counters(&mut n),
                ));
            }
            n.poll(now);
            ready.take_events(&mut n, &index);
            // Old acks first, in order.
            while let Some(&(k, to, hdr)) = backlog.front() {
                ack[..REQ_HDR].copy_from_slice(&hdr);
                match n
                    .engine_mut()
                    .send_to(now, socks[k], Some(to), &ack, SendFlags::DONTWAIT)
                {
                    Ok(_) => {
                        backlog.pop_front();
                    }
                    Err(e) if blocked(e) => break,
                    Err(e) => return Err(PerfError::Fabric(format!("ack send: {e}"))),
                }
            }
            while let Some(k) = ready.next() {
                let s = socks[k];
                loop {
                    match n
                        .engine_mut()
                        .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
                    {
                        Ok(Received::Data { len, from, .. }) => {
                            if self.rdma && len >= 8 && buf[..8] == HELLO.to_le_bytes() {
                                // Offer the socket's region; a hello that finds the send
                                // buffer full is sent again by the active side.
                                let cm = [SendCmsg::RdmaDest(cookies[k])];
                                match n.engine_mut().send_msg(
                                    now,
                                    s,
                                    Some(from),
                                    &HELLO.to_le_bytes(),
                                    &cm,
                                    SendFlags::DONTWAIT,
                                ) {
                                    Ok(_) => {}
                                    Err(e) if blocked(e) => {}
                                    Err(e) => {
                                        return Err(PerfError::Fabric(format!(
                                            "RDMA_DEST answer: {e}"
                                        )));
                                    }
                                }
                                continue;
                            }
                            rx += 1;
                            if self.one_way {
                                continue;
                            }
                            let mut hdr = [0u8; REQ_HDR];
                            let h = len.min(REQ_HDR);
                            hdr[..h].copy_from_slice(&buf[..h]);
                            ack[..REQ_HDR].copy_from_slice(&hdr);
                            if !backlog.is_empty() {
                                backlog.push_back((k, from, hdr));
                                continue;
                            }
                            match n.engine_mut().send_to(
                                now,
                                s,
                                Some(from),
                                &ack,
                                SendFlags::DONTWAIT,
                            ) {
                                Ok(_) => {}
                                Err(e) if blocked(e) => backlog.push_back((k, from, hdr)),
                                Err(e) => {
                                    return Err(PerfError::Fabric(format!("ack send: {e}")));
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(RdsError::WouldBlock) => break,
                        Err(e) => return Err(PerfError::Fabric(format!("recv: {e}"))),
                    }
                }
            }
            n.flush(now);
            // Relaxed: a statistic the active side samples once a second.
            shared.passive_rx.store(rx, Ordering::Relaxed);
        }
    }
}
