//! Setup and connection: one side's resources for one size (protection domain, buffer,
//! completion queue, queue pair), connecting them as the client or accepting as the server,
//! and the receives the SEND tests need in place.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::fabric::{
    CmChannel, CmEvent, Completion, CompletionQueue, ConnId, Device, FabricError, MemoryRegion,
    ProtectionDomain, Provider, QpCaps, QpInit, RcQueuePair, RecvWr, RemoteAddr,
};
use mempool::memory::{Region, RegionConfig};

use super::session::{Req, Test, decode_buf, encode_buf};
use crate::PerfError;

/// A fabric failure, described.
pub(super) fn fail(what: impl std::fmt::Display) -> PerfError {
    PerfError::Fabric(what.to_string())
}

// ------------------------------------------------------------------------------------------
// Endpoint: one side's resources for one size.
// ------------------------------------------------------------------------------------------

pub(super) const RECV_DEPTH: u32 = 512;
pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

/// One side's resources for one size: the buffer (send half, then receive half), its
/// registration, the completion queue and the connected queue pair.
pub(super) struct Endpoint<P: Provider> {
    pub(super) cq: P::Cq,
    pub(super) qp: P::Qp,
    pub(super) mem: Arc<Region>,
    pub(super) mr: P::Mr,
    /// Offset of the receive half (latency tests) in `mem`.
    pub(super) rx_off: usize,
    pub(super) size: usize,
    /// A failed completion not yet reported (see [`Endpoint::poll`]).
    failed: Option<Completion>,
}

impl<P: Provider> Endpoint<P> {
    pub(super) fn sge(&self, off: usize) -> [dataplane::fabric::Sge; 1] {
        [self.mr.sge(off, self.size as u32)]
    }

    /// Posts receive `wr_id` again into the receive half (the SEND tests, after each
    /// receive completion).
    pub(super) fn repost_recv(&mut self, wr_id: u64) -> Result<(), PerfError> {
        let s = self.sge(self.rx_off);
        self.qp
            .post_recv(&[RecvWr { wr_id, sgl: &s }])
            .map_err(fail)
    }

    /// Polls completions; a failed one is an error, but only after the successful ones
    /// polled with it have been returned: when the peer finishes and disconnects, the last
    /// messages and the flush of our spare receives can come in one batch, and the caller
    /// may need only the former.
    pub(super) fn poll(&mut self, out: &mut [Completion]) -> Result<usize, PerfError> {
        if let Some(c) = self.failed.take() {
            return Err(fail(format_args!(
                "completion failed: {} (wr_id {})",
                c.status, c.wr_id
            )));
        }
        let n = self.cq.poll(out);
        match out[..n].iter().position(|c| !c.is_ok()) {
            Some(i) => {
                self.failed = Some(out[i]);
                if i == 0 { self.poll(out) } else { Ok(i) }
            }
            None => Ok(n),
        }
    }
}

fn buffer<P: Provider>(pd: &P::Pd, size: usize) -> Result<(Arc<Region>, P::Mr, usize), PerfError> {
    let half = size.max(64).next_multiple_of(4096);
    let mem = Region::new(
        &RegionConfig::new("dp-perf", 2 * half)
            .shareable(true)
            .quiet(),
    )
    .map_err(|e| fail(format_args!("allocating the test buffer: {e}")))?;
    let mem = Arc::new(mem);
    let mr = pd
        .reg_region(&mem, 0, 2 * half, dataplane::fabric::Access::ALL)
        .map_err(|e| fail(format_args!("registering the test buffer: {e}")))?;
    Ok((mem, mr, half))
}

fn caps(test: Test, tx_depth: u32, inline_size: u32, max_inline: u32) -> QpCaps {
    QpCaps {
        max_send_wr: tx_depth.max(16),
        max_recv_wr: if matches!(test, Test::SendLat | Test::SendBw) {
            RECV_DEPTH
        } else {
            16
        },
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: inline_size.min(max_inline),
    }
}

fn wait_event<P: Provider>(cm: &mut P::Cm, what: &str) -> Result<CmEvent<P>, PerfError> {
    cm.wait_event(Some(TIMEOUT)).ok_or_else(|| {
        fail(format_args!(
            "no connection event within {TIMEOUT:?} while waiting for {what}"
        ))
    })
}

// ------------------------------------------------------------------------------------------
// Connecting (client) and accepting (server)
// ------------------------------------------------------------------------------------------

/// A connected client: its CM channel, protection domain, endpoint and the server's buffer.
pub(super) type Connected<P> = (
    <P as Provider>::Cm,
    <P as Provider>::Pd,
    Endpoint<P>,
    RemoteAddr,
);

/// Client side: connects to `addr` for the test and size `req` names (filling in our buffer),
/// retrying while the server is not listening yet.
pub(super) fn connect_one<P: Provider>(
    dev: &P::Device,
    addr: SocketAddr,
    req: &mut Req,
) -> Result<Connected<P>, PerfError> {
    let pd = dev.alloc_pd().map_err(fail)?;
    let size = req.size as usize;
    let (mem, mr, half) = buffer::<P>(&pd, size)?;
    req.buf = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    let cq = dev
        .create_cq(RECV_DEPTH + req.tx_depth.max(16) + 64)
        .map_err(fail)?;
    let mut cm = dev.create_cm_channel().map_err(fail)?;
    let caps = caps(
        req.test,
        req.tx_depth,
        req.inline_size,
        dev.attr().max_inline_data,
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let init = QpInit {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        let (_conn, qp) = cm.connect(addr, &init, &req.encode()).map_err(fail)?;
        match wait_event::<P>(&mut cm, "the server's answer")? {
            CmEvent::Established { private_data, .. } => {
                let peer = decode_buf(private_data.as_bytes()).ok_or_else(|| {
                    fail("the server's accept did not carry a dp-perf buffer description")
                })?;
                let mut ep = Endpoint {
                    cq,
                    qp,
                    mem,
                    mr,
                    rx_off: half,
                    size,
                    failed: None,
                };
                post_initial_recvs(&mut ep, req.test)?;
                return Ok((cm, pd, ep, peer));
            }
            CmEvent::Unreachable { .. } | CmEvent::Rejected { .. } if Instant::now() < deadline => {
                // The server may not be listening yet (--pair start-up): retry.
                std::thread::sleep(Duration::from_millis(20));
            }
            e => return Err(fail(format_args!("connecting to {addr}: {e:?}"))),
        }
    }
}

fn post_initial_recvs<P: Provider>(ep: &mut Endpoint<P>, test: Test) -> Result<(), PerfError> {
    let s = ep.sge(ep.rx_off);
    post_recvs::<P>(&mut ep.qp, &s, test).map_err(|e| fail(format_args!("posting receives: {e}")))
}

/// The send tests' receives (all into the receive half).
fn post_recvs<P: Provider>(
    qp: &mut P::Qp,
    sgl: &[dataplane::fabric::Sge],
    test: Test,
) -> Result<(), FabricError> {
    if matches!(test, Test::SendLat | Test::SendBw) {
        for i in 0..u64::from(RECV_DEPTH) {
            qp.post_recv(&[RecvWr { wr_id: i, sgl }]).map_err(|e| {
                FabricError::InvalidArgument {
                    what: "receive work request",
                    why: e.to_string(),
                }
            })?;
        }
    }
    Ok(())
}

/// Server side: accepts `request` (already decoded into `req`) with a fresh endpoint whose
/// receives are posted before the reply leaves. Returns the connection, the protection
/// domain (keep it alive as long as the endpoint) and the endpoint.
pub(super) fn accept_one<P: Provider>(
    dev: &P::Device,
    cm: &mut P::Cm,
    request: P::ConnRequest,
    req: &Req,
) -> Result<(ConnId, P::Pd, Endpoint<P>), PerfError> {
    let pd = dev.alloc_pd().map_err(fail)?;
    let size = req.size as usize;
    let (mem, mr, half) = buffer::<P>(&pd, size)?;
    let cq = dev
        .create_cq(RECV_DEPTH + req.tx_depth.max(16) + 64)
        .map_err(fail)?;
    let caps = caps(
        req.test,
        req.tx_depth,
        req.inline_size,
        dev.attr().max_inline_data,
    );
    let init = QpInit {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        caps,
    };
    let mine = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    // Receives go in before the reply: the client may send the moment it has it.
    let rx = [mr.sge(half, size as u32)];
    let (conn, qp) = cm
        .accept_prepared(request, &init, &encode_buf(mine), &mut |qp| {
            post_recvs::<P>(qp, &rx, req.test)
        })
        .map_err(fail)?;
    let ep = Endpoint::<P> {
        cq,
        qp,
        mem,
        mr,
        rx_off: half,
        size,
        failed: None,
    };
    Ok((conn, pd, ep))
}

/// Server side, after the test: waits for the client to finish and disconnect, keeping our
/// queue polled.
pub(super) fn wait_disconnect<P: Provider>(
    ep: &mut Endpoint<P>,
    cm: &mut P::Cm,
) -> Result<(), PerfError> {
    let mut out = [Completion::default(); 64];
    let guard = Instant::now();
    loop {
        if let Some(CmEvent::Disconnected { .. }) = cm.poll_event() {
            return Ok(());
        }
        let _ = ep.cq.poll(&mut out);
        if guard.elapsed() > TIMEOUT * 4 {
            return Err(fail("the client did not disconnect"));
        }
        std::thread::yield_now();
    }
}
