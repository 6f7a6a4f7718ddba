//! [`RnbdServer`]: RNBD sessions served on an RTRS server over a fabric provider.
//!
//! One lcore owns it and calls [`RnbdServer::poll`] in its loop: the RTRS driver's
//! completions and connection events, the requests they deliver (each handed to the
//! [`ServerSession`] of its RTRS session, with the request's chunk as the IO buffer), and the
//! completions of every exported device's backend, each answered with `resp_rdma`.
//!
//! A request's chunk is handed to the backend in place (zero copy); the chunk's region is
//! held until the backend returns the IO, so a session that closes meanwhile cannot make the
//! backend write into unmapped memory. The client can write its chunk at any time: what the
//! backend then reads is garbage of that client's own making, never another session's data
//! (each session has its own chunks, registered only in its own paths' domains).

use std::sync::Arc;

use dp_fabric::Provider;
use dp_rtrs::fabric::ServerDriver;
use dp_rtrs::srv::{OpId, Server, ServerEvent, ServerIo, SessId, SrvLinkEv};
use dp_rtrs::timer::Instant;
use dp_rtrs::work::Dir as RtrsDir;
use mempool::memory::Region;

use crate::backend::{Backend, BlkDone};
use crate::export::Exports;
use crate::server::{Dir, ServerSession};

/// The longest RNBD message a request may carry (the largest, `OPEN`, is 264 bytes; RTRS
/// bounds every user message by its header room, 512 bytes by default).
pub const MAX_USR: usize = 512;

/// Counters of the binding (the sessions' own are in [`ServerSession::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindStats {
    /// Requests delivered by RTRS.
    pub requests: u64,
    /// Requests answered at once (admin messages, refusals).
    pub answered_at_once: u64,
    /// Backend completions answered.
    pub backend_done: u64,
    /// Requests refused before RNBD saw them (user message too long or outside its chunk).
    pub bad_requests: u64,
    /// Answers RTRS did not take (the path or session went away meanwhile).
    pub stale_answers: u64,
}

/// A request whose backend IO is in flight.
#[derive(Debug)]
struct Pending {
    op: OpId,
    sess: SessId,
    /// Keeps the chunk mapped until the backend is done with it.
    _mem: Arc<Region>,
    generation: u32,
}

/// The RNBD sessions by RTRS session: a table indexed by the session's slot in the RTRS
/// server's own table (`SessId::idx`, which our server assigns and bounds; a peer never
/// names it), the entry's id checked against the slot's generation. Two lookups per IO (the
/// request, the backend's completion), each an index and a compare instead of hashing the
/// id with SipHash (about 150 instructions a lookup, 300 per IO, in `rnbd_cost`).
#[derive(Debug, Default)]
struct Sessions {
    slots: Vec<Option<(SessId, ServerSession)>>,
    len: usize,
}

impl Sessions {
    fn get_mut(&mut self, id: SessId) -> Option<&mut ServerSession> {
        match self.slots.get_mut(usize::from(id.idx)) {
            Some(Some((k, s))) if *k == id => Some(s),
            _ => None,
        }
    }

    /// The session `id`, made by `make` if the slot holds none, or an older generation's
    /// (its RTRS session is gone): that one is replaced and returned beside, for its
    /// devices to be closed.
    fn get_or_insert_with(
        &mut self,
        id: SessId,
        make: impl FnOnce() -> ServerSession,
    ) -> (&mut ServerSession, Option<ServerSession>) {
        let i = usize::from(id.idx);
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        let slot = &mut self.slots[i];
        let mut old = None;
        if slot.as_ref().is_none_or(|(k, _)| *k != id) {
            match slot.replace((id, make())) {
                Some((_, s)) => old = Some(s),
                None => self.len += 1,
            }
        }
        (&mut slot.as_mut().expect("filled above").1, old)
    }

    fn remove(&mut self, id: SessId) -> Option<ServerSession> {
        let slot = self.slots.get_mut(usize::from(id.idx))?;
        let (_, s) = slot.take_if(|(k, _)| *k == id)?;
        self.len -= 1;
        Some(s)
    }

    fn iter(&self) -> impl Iterator<Item = (SessId, &ServerSession)> {
        self.slots.iter().flatten().map(|(k, s)| (*k, s))
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// RNBD on an RTRS server: exports, sessions, and the driver that moves their bytes.
pub struct RnbdServer<P: Provider, B: Backend> {
    drv: ServerDriver<P>,
    srv: Server,
    exports: Exports<B>,
    sessions: Sessions,
    pending: Vec<Option<Pending>>,
    free: Vec<u32>,
    next_gen: u32,
    done: Vec<BlkDone>,
    finished: Vec<BlkDone>,
    stats: BindStats,
    /// Where a request's user message is copied from its chunk: kept, not zeroed on the
    /// stack for every request (only its first `usr_len` bytes, just copied, are read).
    usr: [u8; MAX_USR],
}

impl<P: Provider, B: Backend> RnbdServer<P, B> {
    /// Serves `exports` on `srv` through `drv` (the RTRS server and its fabric driver, made
    /// with the queue depth and chunk size the server offers).
    pub fn new(drv: ServerDriver<P>, srv: Server, exports: Exports<B>) -> Self {
        let depth = usize::from(srv.config().queue_depth);
        Self {
            drv,
            srv,
            exports,
            sessions: Sessions::default(),
            pending: Vec::with_capacity(depth),
            free: Vec::with_capacity(depth),
            next_gen: 0,
            done: vec![BlkDone::default(); depth.max(32)],
            finished: Vec::with_capacity(depth.max(32)),
            stats: BindStats::default(),
            usr: [0; MAX_USR],
        }
    }

    /// The RTRS server (stats, paths, sessions).
    pub fn rtrs(&self) -> &Server {
        &self.srv
    }

    /// The fabric driver (listen addresses, stats).
    pub fn driver(&self) -> &ServerDriver<P> {
        &self.drv
    }

    /// The exported devices.
    pub fn exports(&self) -> &Exports<B> {
        &self.exports
    }

    /// The RNBD sessions, by RTRS session.
    pub fn sessions(&self) -> impl Iterator<Item = (SessId, &ServerSession)> {
        self.sessions.iter()
    }

    /// The binding's counters.
    pub fn stats(&self) -> BindStats {
        self.stats
    }

    /// Resets the RTRS counters of every path (`stats/reset_all`).
    pub fn reset_rtrs_stats(&mut self) {
        self.srv.reset_path_stats();
    }

    /// Closes every path of every session (the server is going away): each session's
    /// devices are closed as its last path goes down, on later polls.
    pub fn close(&mut self, now: Instant) {
        self.srv.close(now, &mut self.drv);
    }

    /// Backend IOs in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len() - self.free.len()
    }

    /// One turn of the loop: fabric, RTRS events, backends. Returns the work done (0: idle).
    pub fn poll(&mut self, now: Instant) -> usize {
        let mut work = self.drv.poll(now, &mut self.srv);
        while let Some(ev) = self.srv.poll_event() {
            work += 1;
            match ev {
                ServerEvent::Request {
                    op,
                    sess,
                    chunk,
                    dir,
                    data_len,
                    usr_len,
                    read_len,
                } => self.request(now, op, sess, chunk, dir, data_len, usr_len, read_len),
                ServerEvent::Link {
                    sess,
                    ev: SrvLinkEv::Disconnected,
                } => self.session_gone(sess),
                _ => {}
            }
        }
        work + self.poll_backends(now)
    }

    #[allow(clippy::too_many_arguments)] // the fields of one ServerEvent::Request
    fn request(
        &mut self,
        now: Instant,
        op: OpId,
        sess: SessId,
        chunk: u16,
        dir: RtrsDir,
        data_len: u32,
        usr_len: u16,
        read_len: u32,
    ) {
        self.stats.requests += 1;
        let n = usize::from(usr_len);
        let mem = self.drv.chunk_mem(sess, chunk);
        let (Ok((mem, at, chunk_size)), true) = (mem, n <= MAX_USR) else {
            self.stats.bad_requests += 1;
            return self.answer(now, op, libc::EINVAL);
        };
        if self
            .drv
            .read_chunk(sess, chunk, data_len, &mut self.usr[..n])
            .is_err()
        {
            self.stats.bad_requests += 1;
            return self.answer(now, op, libc::EINVAL);
        }
        // The IO buffer is what the request carries: a WRITE's data, or the room the
        // client gave a READ's answer; both lie in the chunk (RTRS checked them).
        let (dir, len) = match dir {
            RtrsDir::Read => (Dir::Read, read_len as usize),
            RtrsDir::Write => (Dir::Write, data_len as usize),
        };
        let len = len.min(chunk_size);
        // The session's name (its `%SESSNAME%`) is read only when its first request makes
        // it: no allocation per request.
        let srv = &self.srv;
        let (session, old) = self.sessions.get_or_insert_with(sess, || {
            let name = srv
                .path_name(op.path)
                .map(|p| String::from_utf8_lossy(p.as_bytes()).into_owned())
                .unwrap_or_default();
            ServerSession::new(name)
        });
        if let Some(old) = old {
            for d in old.devices().values() {
                self.exports.close(&d.path, d.mode);
            }
        }
        let slot = match self.free.pop() {
            Some(s) => s as usize,
            None => {
                self.pending.push(None);
                self.pending.len() - 1
            }
        };
        self.next_gen = self.next_gen.wrapping_add(1);
        let generation = self.next_gen;
        let tag = (u64::from(generation) << 32) | slot as u64;
        // SAFETY: `at + len` lies within the chunk's region (chunk_mem's offset and the
        // chunk size bound it); the region stays mapped while `Pending` holds its Arc, which
        // lives until the backend returns this tag; RTRS hands a chunk to one request at a
        // time, and the answer goes out only after `complete`.
        let ptr = unsafe { mem.as_ptr().add(at) };
        self.pending[slot] = Some(Pending {
            op,
            sess,
            _mem: mem,
            generation,
        });
        // SAFETY: as above: `ptr` is valid for `len` bytes until the request is answered.
        let r = unsafe { session.handle(&mut self.exports, tag, dir, &self.usr[..n], ptr, len) };
        if let Some(errno) = r {
            self.pending[slot] = None;
            self.free.push(slot as u32);
            self.stats.answered_at_once += 1;
            self.answer(now, op, errno);
        }
    }

    fn poll_backends(&mut self, now: Instant) -> usize {
        let mut done = core::mem::take(&mut self.done);
        let mut finished = core::mem::take(&mut self.finished);
        for (_, dev) in self.exports.iter_mut() {
            loop {
                let n = dev.backend.poll(&mut done);
                finished.extend_from_slice(&done[..n]);
                if n < done.len() {
                    break;
                }
            }
        }
        let work = finished.len();
        for d in finished.drain(..) {
            self.backend_done(now, d);
        }
        self.done = done;
        self.finished = finished;
        work
    }

    fn backend_done(&mut self, now: Instant, d: BlkDone) {
        let slot = (d.tag & 0xFFFF_FFFF) as usize;
        let generation = (d.tag >> 32) as u32;
        let Some(p) = self
            .pending
            .get_mut(slot)
            .and_then(|p| p.take_if(|p| p.generation == generation))
        else {
            return;
        };
        self.free.push(slot as u32);
        self.stats.backend_done += 1;
        let errno = match self.sessions.get_mut(p.sess) {
            Some(s) => s.complete(d.result),
            None => -d.result.min(0),
        };
        self.answer(now, p.op, errno);
    }

    fn answer(&mut self, now: Instant, op: OpId, errno: i32) {
        if self.srv.resp_rdma(now, op, -errno, &mut self.drv).is_err() {
            self.stats.stale_answers += 1;
        }
    }

    /// The last path of `sess` went down: its devices are closed (requests still in a
    /// backend complete into their held chunks and their answers are dropped).
    fn session_gone(&mut self, sess: SessId) {
        if let Some(s) = self.sessions.remove(sess) {
            for d in s.devices().values() {
                self.exports.close(&d.path, d.mode);
            }
        }
    }
}

impl<P: Provider, B: Backend> core::fmt::Debug for RnbdServer<P, B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RnbdServer")
            .field("sessions", &self.sessions.len())
            .field("in_flight", &self.in_flight())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::{ServerSession, SessId, Sessions};

    fn id(idx: u16, generation: u16) -> SessId {
        SessId { idx, generation }
    }

    #[test]
    fn test_sessions_by_slot_and_generation() {
        let mut t = Sessions::default();
        let (s, old) = t.get_or_insert_with(id(3, 1), || ServerSession::new("a"));
        assert_eq!(s.name(), "a");
        assert!(old.is_none());
        // The same id finds it, and `make` is not called.
        let (s, old) = t.get_or_insert_with(id(3, 1), || unreachable!("present"));
        assert_eq!(s.name(), "a");
        assert!(old.is_none());
        assert_eq!(t.len(), 1);
        // Another generation of the slot is another session.
        assert!(t.get_mut(id(3, 2)).is_none());
        assert!(t.remove(id(3, 2)).is_none());
        assert!(t.get_mut(id(4, 1)).is_none(), "past the table");
        assert_eq!(
            t.get_mut(id(3, 1)).map(|s| s.name().to_owned()),
            Some("a".into())
        );
        // A newer generation replaces the old one and hands it back.
        let (s, old) = t.get_or_insert_with(id(3, 2), || ServerSession::new("b"));
        assert_eq!(s.name(), "b");
        assert_eq!(old.map(|o| o.name().to_owned()), Some("a".into()));
        assert_eq!(t.len(), 1);
        assert!(t.get_mut(id(3, 1)).is_none(), "the old generation is gone");
        t.get_or_insert_with(id(0, 7), || ServerSession::new("c"));
        let ids: Vec<SessId> = t.iter().map(|(k, _)| k).collect();
        assert_eq!(ids, [id(0, 7), id(3, 2)]);
        assert_eq!(
            t.remove(id(3, 2)).map(|s| s.name().to_owned()),
            Some("b".into())
        );
        assert_eq!(t.len(), 1);
        assert!(t.get_mut(id(3, 2)).is_none());
    }
}
