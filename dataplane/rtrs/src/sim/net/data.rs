//! Posting and delivery on the simulated fabric: receives and sends posted by either side,
//! the gather of a request's local memory, and the delivery of a queue pair's head in virtual
//! time, with the key, bounds and rights checks of a remote write.

use dp_fabric::{PostError, PostErrorKind, QpState, WcOpcode, WcStatus};

use super::{
    CKey, CLIENT_DATA_AT, Ev, Flight, FlightOp, Net, SERVER_CHUNKS_AT, SKey, Side, mem_range,
};
use crate::srv::SessId;
use crate::timer::Instant;
use crate::work::{Conn, RecvBuf, Wc, Wr};

impl Net {
    // ---------------------------------------------------------------------------------------
    // Posting and delivery
    // ---------------------------------------------------------------------------------------

    pub(super) fn post_recv(
        &mut self,
        side: Side,
        conn: Conn,
        wr_id: u64,
        buf: RecvBuf,
    ) -> Result<(), PostError> {
        let Some(qp) = self.qp_of(side, conn) else {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::BadState(QpState::Error),
            });
        };
        let now = self.now;
        let e = self.qps[qp].end(side);
        if e.error {
            self.status_wc(side, conn, now, wr_id, WcStatus::WrFlushErr);
            return Ok(());
        }
        e.recvs.push_back((wr_id, buf));
        // A head waiting for a receive may go now.
        self.kick(qp, side.other());
        Ok(())
    }

    pub(super) fn kick(&mut self, qp: usize, side: Side) {
        let link = self.qps[qp].link;
        let e = self.qps[qp].end(side);
        if e.head_scheduled || e.out.is_empty() || e.error {
            return;
        }
        e.head_scheduled = true;
        let at = e.last_due.max(self.now);
        let _ = link;
        self.push(at, Ev::Deliver { qp, from: side });
    }

    pub(super) fn completion(
        &mut self,
        side: Side,
        conn: Conn,
        at: Instant,
        wc: Wc,
        payload: Vec<u8>,
    ) {
        self.push(
            at,
            Ev::Wc {
                side,
                conn,
                wc,
                payload,
            },
        );
    }

    /// A completion that carries only its request and status (a flush or a failure).
    pub(super) fn status_wc(
        &mut self,
        side: Side,
        conn: Conn,
        at: Instant,
        wr_id: u64,
        status: WcStatus,
    ) {
        let wc = Wc {
            wr_id,
            status,
            ..Wc::default()
        };
        self.completion(side, conn, at, wc, Vec::new());
    }

    pub(super) fn local_done(
        &mut self,
        side: Side,
        conn: Conn,
        wr_id: u64,
        signaled: bool,
        status: WcStatus,
    ) {
        if signaled || status != WcStatus::Success {
            let now = self.now;
            self.completion(
                side,
                conn,
                now,
                Wc {
                    wr_id,
                    status,
                    opcode: WcOpcode::Send,
                    ..Wc::default()
                },
                Vec::new(),
            );
        }
    }

    pub(super) fn post_send(
        &mut self,
        side: Side,
        conn: Conn,
        chain: &[Wr<'_>],
    ) -> Result<(), PostError> {
        let Some(qp) = self.qp_of(side, conn) else {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::BadState(QpState::Error),
            });
        };
        self.posted[side as usize] += chain.len() as u64;
        if side == Side::Server && self.record_server_chains {
            let names = chain
                .iter()
                .map(|w| {
                    format!("{w:?}")
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .collect();
            self.server_chains.push((conn, names));
        }
        let link = self.qps[qp].link;
        for w in chain {
            if self.qps[qp].end(side).error {
                self.local_done(side, conn, w.wr_id(), true, WcStatus::WrFlushErr);
                continue;
            }
            let flight = match self.gather(side, conn, link, w) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    self.local_done(side, conn, w.wr_id(), w.signaled(), WcStatus::Success);
                    continue;
                }
                Err(st) => {
                    let now = self.now;
                    self.local_done(side, conn, w.wr_id(), true, st);
                    self.fail_head(qp, side, now, WcStatus::WrFlushErr);
                    self.qps[qp].end(side).error = true;
                    continue;
                }
            };
            let lat = match self.latency(link) {
                Ok(d) if self.links[link].up => d,
                _ => {
                    // A cut link or a lossy one that exhausted the retries.
                    let at = self.now.saturating_add(self.transport_timeout);
                    let e = self.qps[qp].end(side);
                    e.out.push_back(flight);
                    self.fail_head(qp, side, at, WcStatus::RetryExcErr);
                    continue;
                }
            };
            let now = self.now;
            let e = self.qps[qp].end(side);
            e.last_due = e.last_due.max(now.saturating_add(lat));
            e.out.push_back(flight);
            self.kick(qp, side);
        }
        Ok(())
    }

    /// Executes a local work request, or gathers a remote one's payload.
    pub(super) fn gather(
        &mut self,
        side: Side,
        conn: Conn,
        link: usize,
        w: &Wr<'_>,
    ) -> Result<Option<Flight>, WcStatus> {
        let wr_id = w.wr_id();
        let signaled = w.signaled();
        let op = match *w {
            Wr::SendMsg { bytes, .. } => FlightOp::Send {
                bytes: bytes.to_vec(),
                imm: None,
                inv: None,
            },
            Wr::WriteImmEmpty { imm, .. } => FlightOp::WriteImm {
                addr: 0,
                rkey: 0,
                bytes: Vec::new(),
                imm,
            },
            Wr::IoRequest {
                remote,
                data,
                slot,
                iu_len,
                imm,
                ..
            } => {
                let mut bytes = Vec::new();
                if let Some(sge) = data {
                    let k = self.ckeys.get(&sge.lkey).ok_or(WcStatus::LocProtErr)?;
                    let end = sge
                        .addr
                        .checked_add(u64::from(sge.length))
                        .ok_or(WcStatus::LocProtErr)?;
                    if k.link != link || sge.addr < k.addr || end > k.addr + k.len {
                        return Err(WcStatus::LocProtErr);
                    }
                    let r = mem_range(
                        CLIENT_DATA_AT,
                        self.data.len(),
                        sge.addr,
                        u64::from(sge.length),
                    )
                    .ok_or(WcStatus::LocProtErr)?;
                    bytes.extend_from_slice(&self.data[r]);
                }
                let at = usize::from(slot) * self.iu_slot;
                if iu_len as usize > self.iu_slot || at + iu_len as usize > self.iu.len() {
                    return Err(WcStatus::LocProtErr);
                }
                bytes.extend_from_slice(&self.iu[at..at + iu_len as usize]);
                FlightOp::WriteImm {
                    addr: remote.addr,
                    rkey: remote.rkey,
                    bytes,
                    imm,
                }
            }
            Wr::Register { token, .. } => {
                let key = token as u32;
                let slot = (token >> 32) as u16;
                if let Some(old) = self.window_key.get(&(link, slot))
                    && self.ckeys.contains_key(old)
                {
                    self.rebind_faults += 1;
                    return Err(WcStatus::MwBindErr);
                }
                self.window_key.insert((link, slot), key);
                let len = self.data.len() as u64;
                self.ckeys.insert(
                    key,
                    CKey {
                        addr: CLIENT_DATA_AT,
                        len,
                        link,
                        remote: true,
                    },
                );
                return Ok(None);
            }
            Wr::LocalInv { key, .. } => {
                match side {
                    Side::Client => {
                        self.ckeys.remove(&key);
                    }
                    Side::Server => {
                        self.skeys.remove(&key);
                    }
                }
                return Ok(None);
            }
            Wr::WriteChunk {
                chunk, len, remote, ..
            } => {
                let sess = self.server_sess(conn).ok_or(WcStatus::LocProtErr)?;
                let cs = self.chunk_size as usize;
                if len as usize > cs {
                    return Err(WcStatus::LocProtErr);
                }
                let mem = self.chunks.get(&sess).ok_or(WcStatus::LocProtErr)?;
                let at = usize::from(chunk) * cs;
                let b = mem.get(at..at + len as usize).ok_or(WcStatus::LocProtErr)?;
                FlightOp::Write {
                    addr: remote.addr,
                    rkey: remote.rkey,
                    bytes: b.to_vec(),
                }
            }
            Wr::WriteSource {
                src, len, remote, ..
            } => {
                let b = self
                    .sources
                    .get(src.id as usize)
                    .and_then(|m| {
                        let at = usize::try_from(src.offset).ok()?;
                        m.get(at..at.checked_add(len as usize)?)
                    })
                    .ok_or(WcStatus::LocProtErr)?;
                FlightOp::Write {
                    addr: remote.addr,
                    rkey: remote.rkey,
                    bytes: b.to_vec(),
                }
            }
            Wr::SendInv { rkey, .. } => FlightOp::Send {
                bytes: Vec::new(),
                imm: None,
                inv: Some(rkey),
            },
            Wr::RegChunk { chunk, key, .. } => {
                let sess = self.server_sess(conn).ok_or(WcStatus::LocProtErr)?;
                let addr = SERVER_CHUNKS_AT
                    + (u64::from(sess.idx) << 36)
                    + u64::from(chunk) * u64::from(self.chunk_size);
                // The chunk's registration on this path now answers to `key` only.
                if let Some(old) = self.chunk_keys.insert((conn.path, addr), key) {
                    self.skeys.remove(&old);
                }
                self.skeys.insert(
                    key,
                    SKey {
                        path: conn.path,
                        addr,
                        len: u64::from(self.chunk_size),
                    },
                );
                return Ok(None);
            }
            Wr::SendImmMsg { bytes, imm, .. } => FlightOp::Send {
                bytes: bytes.to_vec(),
                imm: Some(imm),
                inv: None,
            },
        };
        Ok(Some(Flight {
            wr_id,
            signaled,
            op,
        }))
    }

    pub(super) fn server_sess(&self, conn: Conn) -> Option<SessId> {
        let qp = self.qp_of(Side::Server, conn)?;
        let _ = qp;
        self.path_sess.get(&conn.path).copied()
    }

    /// Delivers the head of `from`'s outbound queue of `qp` (called when it is due).
    pub(crate) fn deliver(&mut self, qp: usize, from: Side) {
        let to = from.other();
        self.qps[qp].end(from).head_scheduled = false;
        if self.qps[qp].end(from).error {
            return;
        }
        let link = self.qps[qp].link;
        if !self.links[link].up {
            let at = self.now.saturating_add(self.transport_timeout);
            self.fail_head(qp, from, at, WcStatus::RetryExcErr);
            return;
        }
        let Some(f) = self.qps[qp].end(from).out.front().cloned() else {
            return;
        };
        let (Some(from_conn), Some(to_conn)) =
            (self.qps[qp].end(from).conn, self.qps[qp].end(to).conn)
        else {
            return;
        };
        if self.qps[qp].end(to).error {
            // The peer's queue pair is gone: the request is never acknowledged.
            let at = self.now.saturating_add(self.transport_timeout);
            self.fail_head(qp, from, at, WcStatus::RetryExcErr);
            return;
        }
        let recv = if f.op.needs_recv() {
            match self.qps[qp].end(to).recvs.front().copied() {
                Some(r) => Some(r),
                None => {
                    // Receiver not ready: retry later (rnr_retry_count 7: for ever).
                    self.rnr_waits += 1;
                    let at = self.now.saturating_add(self.rnr_delay);
                    let e = self.qps[qp].end(from);
                    e.head_scheduled = true;
                    self.push(at, Ev::Deliver { qp, from });
                    return;
                }
            }
        } else {
            None
        };
        // Remote access checks, then placement.
        let placed = match &f.op {
            FlightOp::WriteImm {
                addr, rkey, bytes, ..
            }
            | FlightOp::Write { addr, rkey, bytes } => {
                if bytes.is_empty() {
                    Ok(())
                } else {
                    self.remote_write(to, to_conn, link, *addr, *rkey, bytes)
                }
            }
            FlightOp::Send { bytes, .. } => match recv {
                Some((_, buf)) if bytes.len() > buf.len() as usize => Err(WcStatus::RemInvReqErr),
                _ => Ok(()),
            },
        };
        if let Err(st) = placed {
            self.access_errors += 1;
            let now = self.now;
            self.fail_head(qp, from, now.saturating_add(self.links[link].latency), st);
            if st == WcStatus::RemInvReqErr
                && let Some((wr_id, _)) = self.qps[qp].end(to).recvs.pop_front()
            {
                self.status_wc(to, to_conn, now, wr_id, WcStatus::LocLenErr);
            }
            self.flush_end(qp, to);
            return;
        }
        self.qps[qp].end(from).out.pop_front();
        let now = self.now;
        if let Some((wr_id, _)) = recv {
            self.qps[qp].end(to).recvs.pop_front();
            let (wc, payload) = match f.op {
                FlightOp::Send { bytes, imm, inv } => {
                    if let Some(k) = inv {
                        self.invalidate(to, k);
                    }
                    (
                        Wc {
                            wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::Recv,
                            byte_len: bytes.len() as u32,
                            imm,
                            invalidated: inv,
                        },
                        bytes,
                    )
                }
                FlightOp::WriteImm { imm, bytes, .. } => (
                    Wc {
                        wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: bytes.len() as u32,
                        imm: Some(imm),
                        invalidated: None,
                    },
                    Vec::new(),
                ),
                FlightOp::Write { .. } => unreachable!("plain writes take no receive"),
            };
            self.completion(to, to_conn, now, wc, payload);
        }
        if f.signaled {
            let at = now.saturating_add(self.links[link].latency);
            self.completion(
                from,
                from_conn,
                at,
                Wc {
                    wr_id: f.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RdmaWrite,
                    ..Wc::default()
                },
                Vec::new(),
            );
        }
        // The next request of this direction.
        self.kick(qp, from);
    }

    pub(super) fn invalidate(&mut self, side: Side, key: u32) {
        match side {
            Side::Client => {
                self.ckeys.remove(&key);
            }
            Side::Server => {
                self.skeys.remove(&key);
            }
        }
    }

    pub(super) fn remote_write(
        &mut self,
        to: Side,
        to_conn: Conn,
        link: usize,
        addr: u64,
        rkey: u32,
        bytes: &[u8],
    ) -> Result<(), WcStatus> {
        let len = bytes.len() as u64;
        match to {
            Side::Server => {
                let k = *self.skeys.get(&rkey).ok_or(WcStatus::RemAccessErr)?;
                let end = addr.checked_add(len).ok_or(WcStatus::RemAccessErr)?;
                if k.path != to_conn.path || addr < k.addr || end > k.addr + k.len {
                    return Err(WcStatus::RemAccessErr);
                }
                let sess = self
                    .path_sess
                    .get(&to_conn.path)
                    .copied()
                    .ok_or(WcStatus::RemAccessErr)?;
                let base = SERVER_CHUNKS_AT + (u64::from(sess.idx) << 36);
                let mem = self.chunks.get_mut(&sess).ok_or(WcStatus::RemAccessErr)?;
                let r = mem_range(base, mem.len(), addr, len).ok_or(WcStatus::RemAccessErr)?;
                mem[r].copy_from_slice(bytes);
                Ok(())
            }
            Side::Client => {
                let k = *self.ckeys.get(&rkey).ok_or(WcStatus::RemAccessErr)?;
                let end = addr.checked_add(len).ok_or(WcStatus::RemAccessErr)?;
                if !k.remote || k.link != link || addr < k.addr || end > k.addr + k.len {
                    return Err(WcStatus::RemAccessErr);
                }
                let r = mem_range(CLIENT_DATA_AT, self.data.len(), addr, len)
                    .ok_or(WcStatus::RemAccessErr)?;
                self.data[r].copy_from_slice(bytes);
                Ok(())
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Server memory
    // ---------------------------------------------------------------------------------------

    /// The chunk size of the server's sessions.
    pub const fn chunk_size(&self) -> u32 {
        self.chunk_size
    }
}
