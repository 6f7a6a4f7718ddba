//! A provider conformance suite, generic over [`Provider`].
//!
//! Each `check_*` function sets up what it needs on two devices (which may be the same
//! physical device) and returns `Err(description)` on the first deviation from verbs
//! semantics. [`conformance_tests!`](crate::conformance_tests) expands them into `#[test]`s
//! for one provider; the shm provider runs them always, the verbs provider when
//! `DP_TEST_DEVICE` names a device.
//!
//! All waits are bounded; nothing here depends on timing to pass.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mempool::memory::{Region, RegionConfig};

use crate::error::PostErrorKind;
use crate::traits::{
    CmChannel, CmEvent, CompletionQueue, ConnId, ConnRequest, Device, MemoryRegion, MemoryWindow,
    ProtectionDomain, Provider, QpInit, RcQueuePair, UdQueuePair, UdSendWr,
};
use crate::types::{
    Access, Completion, GRH_LEN, Payload, QpCaps, QpState, RecvWr, RemoteAddr, SendFlags, SendOp,
    SendWr, WcOpcode, WcStatus, inc_rkey,
};

/// How long any single wait may take before the check fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// The two devices and the address space a check may use.
#[derive(Debug)]
pub struct Env<P: Provider> {
    /// Active side's device.
    pub a: P::Device,
    /// Passive side's device.
    pub b: P::Device,
    /// Address the passive side listens on.
    pub ip: IpAddr,
    /// First port this check may use (it uses at most 4).
    pub port: u16,
}

/// Result of a check.
pub type Check = Result<(), String>;

macro_rules! ensure {
    ($c:expr, $($fmt:tt)*) => {
        if !$c {
            return Err(format!($($fmt)*));
        }
    };
}

fn fe<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// One connected endpoint with a registered buffer.
pub struct Side<P: Provider> {
    /// Protection domain.
    pub pd: P::Pd,
    /// Completion queue (send and receive).
    pub cq: P::Cq,
    /// CM channel.
    pub cm: P::Cm,
    /// Queue pair.
    pub qp: P::Qp,
    /// Its connection.
    pub conn: ConnId,
    /// Buffer memory (shareable).
    pub mem: Arc<Region>,
    /// Registration of all of `mem` with every right.
    pub mr: P::Mr,
}

impl<P: Provider> std::fmt::Debug for Side<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side").field("conn", &self.conn).finish()
    }
}

impl<P: Provider> Side<P> {
    /// Byte `i` of the buffer.
    pub fn byte(&self, i: usize) -> u8 {
        read_byte(&self.mem, i)
    }

    /// Fills `[off, off+len)` with `f(i)`.
    pub fn fill(&self, off: usize, len: usize, f: impl Fn(usize) -> u8) {
        for i in 0..len {
            write_byte(&self.mem, off + i, f(i));
        }
    }

    /// The remote address of `off` in this side's buffer.
    pub fn remote(&self, off: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.mr.addr() + off as u64,
            rkey: self.mr.rkey(),
        }
    }
}

fn read_byte(r: &Region, i: usize) -> u8 {
    r.load_u8(i)
}

fn write_byte(r: &Region, i: usize, v: u8) {
    r.store_u8(i, v);
}

/// A connected pair of queue pairs.
pub struct Pair<P: Provider> {
    /// Active side.
    pub a: Side<P>,
    /// Passive side.
    pub b: Side<P>,
}

impl<P: Provider> std::fmt::Debug for Pair<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("a", &self.a)
            .field("b", &self.b)
            .finish()
    }
}

/// Allocates a shareable buffer and registers it with every right.
pub fn buffer<P: Provider>(pd: &P::Pd, len: usize) -> Result<(Arc<Region>, P::Mr), String> {
    let mem = Arc::new(
        Region::new(
            &RegionConfig::new("conformance", len)
                .shareable(true)
                .no_huge()
                .quiet(),
        )
        .map_err(fe("allocating a buffer"))?,
    );
    let mr = pd
        .reg_region(&mem, 0, len, Access::ALL)
        .map_err(fe("registering a buffer"))?;
    Ok((mem, mr))
}

/// Waits for the next CM event on `cm`.
pub fn next_event<P: Provider>(cm: &mut P::Cm, what: &str) -> Result<CmEvent<P>, String> {
    cm.wait_event(Some(WAIT))
        .ok_or_else(|| format!("no CM event within {WAIT:?} while waiting for {what}"))
}

/// True if `got` is `sent` followed only by zeros: IB and RoCE deliver private data padded
/// to the CM message's fixed size, so receivers see the sender's bytes as a prefix.
pub fn padded_eq(got: &[u8], sent: &[u8]) -> bool {
    got.len() >= sent.len()
        && got[..sent.len()] == *sent
        && got[sent.len()..].iter().all(|b| *b == 0)
}

/// Connects a pair: `a` actively to `b`'s listener on `port`.
pub fn connect<P: Provider>(
    env: &Env<P>,
    port: u16,
    caps: QpCaps,
    req: &[u8],
    rep: &[u8],
) -> Result<Pair<P>, String> {
    let addr = SocketAddr::new(env.ip, port);
    let pd_a = env.a.alloc_pd().map_err(fe("alloc_pd a"))?;
    let pd_b = env.b.alloc_pd().map_err(fe("alloc_pd b"))?;
    let (mem_a, mr_a) = buffer::<P>(&pd_a, 1 << 20)?;
    let (mem_b, mr_b) = buffer::<P>(&pd_b, 1 << 20)?;
    let cq_a = env.a.create_cq(4096).map_err(fe("create_cq a"))?;
    let cq_b = env.b.create_cq(4096).map_err(fe("create_cq b"))?;
    let mut cm_a = env.a.create_cm_channel().map_err(fe("cm a"))?;
    let mut cm_b = env.b.create_cm_channel().map_err(fe("cm b"))?;
    let lid = cm_b.listen(addr, 16).map_err(fe("listen"))?;
    let (conn_a, qp_a) = cm_a
        .connect(
            addr,
            &QpInit {
                pd: &pd_a,
                send_cq: &cq_a,
                recv_cq: &cq_a,
                caps,
            },
            req,
        )
        .map_err(fe("connect"))?;
    let request = match next_event::<P>(&mut cm_b, "ConnectRequest")? {
        CmEvent::ConnectRequest { listener, request } => {
            ensure!(
                listener == lid,
                "request on listener {listener:?}, expected {lid:?}"
            );
            request
        }
        e => return Err(format!("expected ConnectRequest, got {e:?}")),
    };
    ensure!(
        padded_eq(request.private_data(), req),
        "REQ private data {:?} != {:?}",
        request.private_data(),
        req
    );
    let (conn_b, qp_b) = cm_b
        .accept(
            request,
            &QpInit {
                pd: &pd_b,
                send_cq: &cq_b,
                recv_cq: &cq_b,
                caps,
            },
            rep,
        )
        .map_err(fe("accept"))?;
    match next_event::<P>(&mut cm_a, "Established (active)")? {
        CmEvent::Established { conn, private_data } => {
            ensure!(conn == conn_a, "established {conn:?}, expected {conn_a:?}");
            ensure!(
                padded_eq(private_data.as_bytes(), rep),
                "REP private data mismatch"
            );
        }
        e => {
            return Err(format!(
                "expected Established on the active side, got {e:?}"
            ));
        }
    }
    match next_event::<P>(&mut cm_b, "Established (passive)")? {
        CmEvent::Established { conn, .. } => {
            ensure!(conn == conn_b, "passive established {conn:?}")
        }
        e => {
            return Err(format!(
                "expected Established on the passive side, got {e:?}"
            ));
        }
    }
    ensure!(
        qp_a.state() == QpState::Rts,
        "active QP in {:?}",
        qp_a.state()
    );
    ensure!(
        qp_b.state() == QpState::Rts,
        "passive QP in {:?}",
        qp_b.state()
    );
    Ok(Pair {
        a: Side {
            pd: pd_a,
            cq: cq_a,
            cm: cm_a,
            qp: qp_a,
            conn: conn_a,
            mem: mem_a,
            mr: mr_a,
        },
        b: Side {
            pd: pd_b,
            cq: cq_b,
            cm: cm_b,
            qp: qp_b,
            conn: conn_b,
            mem: mem_b,
            mr: mr_b,
        },
    })
}

/// Polls both completion queues until `want` completions arrived on `which` (0 = a,
/// 1 = b); completions on the other queue are returned too.
pub fn poll_n<P: Provider>(
    pair: &mut Pair<P>,
    want_a: usize,
    want_b: usize,
) -> Result<(Vec<Completion>, Vec<Completion>), String> {
    let mut ga = Vec::new();
    let mut gb = Vec::new();
    let mut buf = [Completion::default(); 32];
    let t0 = Instant::now();
    while ga.len() < want_a || gb.len() < want_b {
        let n = pair.a.cq.poll(&mut buf);
        ga.extend_from_slice(&buf[..n]);
        let n = pair.b.cq.poll(&mut buf);
        gb.extend_from_slice(&buf[..n]);
        if t0.elapsed() > WAIT {
            return Err(format!(
                "timed out: got {}/{want_a} completions on a, {}/{want_b} on b: {ga:?} {gb:?}",
                ga.len(),
                gb.len()
            ));
        }
        std::thread::yield_now();
    }
    Ok((ga, gb))
}

/// Polls both queues for a while and fails if anything arrives.
pub fn expect_quiet<P: Provider>(pair: &mut Pair<P>, polls: usize) -> Check {
    let mut buf = [Completion::default(); 8];
    for _ in 0..polls {
        let n = pair.a.cq.poll(&mut buf);
        ensure!(n == 0, "unexpected completion on a: {:?}", &buf[..n]);
        let n = pair.b.cq.poll(&mut buf);
        ensure!(n == 0, "unexpected completion on b: {:?}", &buf[..n]);
    }
    Ok(())
}

fn post_recv<P: Provider>(s: &mut Side<P>, wr_id: u64, off: usize, len: u32) -> Check {
    let sge = [s.mr.sge(off, len)];
    s.qp.post_recv(&[RecvWr {
        wr_id,
        sgl: if len == 0 { &[] } else { &sge },
    }])
    .map_err(fe("post_recv"))
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

mod mw;
mod rc;
mod ud;

pub use mw::*;
pub use rc::*;
pub use ud::*;

///
/// `$env` is an expression of type `Option<Env<P>>` evaluated with one `u16` port base
/// bound to `$port`; `None` skips (with a message printed by the expression).
#[macro_export]
macro_rules! conformance_tests {
    ($p:ty, |$port:ident| $env:expr) => {
        $crate::conformance_tests!(@one $p, $port, $env, connect_private_data, check_connect_private_data, 0);
        $crate::conformance_tests!(@one $p, $port, $env, private_data_limits, check_private_data_limits, 10);
        $crate::conformance_tests!(@one $p, $port, $env, write, check_write, 20);
        $crate::conformance_tests!(@one $p, $port, $env, write_imm, check_write_imm, 30);
        $crate::conformance_tests!(@one $p, $port, $env, read, check_read, 40);
        $crate::conformance_tests!(@one $p, $port, $env, send, check_send, 50);
        $crate::conformance_tests!(@one $p, $port, $env, rnr_wait, check_rnr_wait, 60);
        $crate::conformance_tests!(@one $p, $port, $env, remote_access_errors, check_remote_access_errors, 70);
        $crate::conformance_tests!(@one $p, $port, $env, dereg_revokes, check_dereg_revokes, 80);
        $crate::conformance_tests!(@one $p, $port, $env, local_protection, check_local_protection, 90);
        $crate::conformance_tests!(@one $p, $port, $env, disconnect_flush, check_disconnect_flush, 100);
        $crate::conformance_tests!(@one $p, $port, $env, reject_and_unreachable, check_reject_and_unreachable, 110);
        $crate::conformance_tests!(@one $p, $port, $env, send_queue_accounting, check_send_queue_accounting, 120);
        $crate::conformance_tests!(@one $p, $port, $env, ordering, check_ordering, 130);
        $crate::conformance_tests!(@one $p, $port, $env, ud, check_ud, 140);
        $crate::conformance_tests!(@one $p, $port, $env, move_to_error, check_move_to_error, 195);
        $crate::conformance_tests!(@one $p, $port, $env, listen_again, check_listen_again, 170);
    };
    (@one $p:ty, $port:ident, $env:expr, $name:ident, $check:ident, $off:expr) => {
        #[test]
        fn $name() {
            let $port: u16 = $off;
            let env: Option<$crate::conformance::Env<$p>> = $env;
            let Some(env) = env else { return };
            $crate::conformance::$check(&env).unwrap_or_else(|e| panic!("{}: {e}", stringify!($name)));
        }
    };
}
