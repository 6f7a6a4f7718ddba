//! The server: sessions of chunks, each reached by several paths of one client session
//! (`rtrs_srv_ctx`, `rtrs_srv_sess`, `rtrs_srv_path`), as a sans-IO state machine.
//!
//! # Method groups
//!
//! * inputs: [`Server::handle_connect_request`], [`handle_cm`](Server::handle_cm),
//!   [`handle_completion`](Server::handle_completion),
//!   [`handle_timeout`](Server::handle_timeout);
//! * the handler's answer: [`resp_rdma`](Server::resp_rdma);
//! * control: [`close_path`](Server::close_path) (sysfs `disconnect`),
//!   [`close`](Server::close);
//! * outputs: work goes to the [`ServerIo`] driver; [`poll_event`](Server::poll_event)
//!   drains [`ServerEvent`]s (requests for the handler, link and path events);
//!   [`poll_timeout`](Server::poll_timeout).
//!
//! # Sessions and paths
//!
//! A connect request names its session by UUID. A known session gains the path; an unknown
//! one is created only if the request carries `first_conn` (else `-ENXIO`: a path may not
//! resurrect a session the server dropped unless the client says it is the first, Linux's
//! 2021 fix). The session's `queue_depth` chunks are allocated once ([`ServerIo::create_session`])
//! and shared by all its paths, each path registering them on its own device
//! ([`ServerIo::map_chunks`]): chunk `i` is the same memory on every path, which is what lets
//! a client fail a request over with the same permit. The session is freed with its last
//! path.
//!
//! A path is CONNECTED after its `info_req` (whose path name may not be used by another
//! session); the first path of a session fires [`SrvLinkEv::Connected`], the last one down
//! [`SrvLinkEv::Disconnected`].

use std::collections::VecDeque;
use std::time::Duration;

use crate::error::{PathError, RtrsError};
use crate::stats::ServerPathStats;
use crate::timer::{HB_INTERVAL, HB_MISSED_MAX, Heartbeat, Instant};
use crate::wire::{
    ConnReq, ConnReqRepr, ConnRspRepr, DEFAULT_MAX_CHUNK_SIZE, DEFAULT_MAX_HDR_SIZE,
    DEFAULT_QUEUE_DEPTH, Geometry, MAX_PATHS, MIN_CHUNK_SIZE, MSG_NEW_RKEY_F, PROTO_VER, PathName,
};
use crate::work::{CmEvent, Conn, PathId, SrcRef, Wc};

mod io;
mod path;

pub use io::{CmToken, OpId, Resp, ServerEvent, ServerIo, SessId, SrvLinkEv};
pub use path::{ESTABLISH_TIMEOUT, ServerState};

use path::{Outcome, ServerPath};

/// The server's module parameters.
#[derive(Clone, Copy, Debug)]
pub struct ServerConfig {
    /// `sess_queue_depth`: chunks per session, `1..=65535` within the immediate budget.
    pub queue_depth: u16,
    /// `max_chunk_size`: a power of two, at least 8192.
    pub chunk_size: u32,
    /// `MAX_HDR_SIZE`: room for user message + RTRS header in a chunk; `max_io_size =
    /// chunk_size - max_hdr_size`.
    pub max_hdr_size: u32,
    /// `always_invalidate`: invalidate each chunk's key while its request is processed and
    /// re-register it under a new key for the response (`NEW_RKEY`). Linux's default is
    /// on; off saves two work requests per IO.
    pub always_invalidate: bool,
    /// Heartbeat interval (5 s).
    pub hb_interval: Duration,
    /// Heartbeat ticks without traffic before a path is closed (5).
    pub hb_missed_max: u32,
}

impl Default for ServerConfig {
    /// Linux's defaults: 512 chunks of 128 KiB, 4 KiB of header room, always_invalidate.
    fn default() -> Self {
        Self {
            queue_depth: DEFAULT_QUEUE_DEPTH,
            chunk_size: DEFAULT_MAX_CHUNK_SIZE,
            max_hdr_size: DEFAULT_MAX_HDR_SIZE,
            always_invalidate: true,
            hb_interval: HB_INTERVAL,
            hb_missed_max: HB_MISSED_MAX,
        }
    }
}

impl ServerConfig {
    /// `check_module_params`, plus the header room.
    ///
    /// # Errors
    /// [`RtrsError::Config`] naming the field and the rule.
    pub fn validate(&self) -> Result<Geometry, RtrsError> {
        if self.queue_depth == 0 {
            return Err(RtrsError::Config("queue_depth must be in 1..=65535"));
        }
        if self.chunk_size < MIN_CHUNK_SIZE || !self.chunk_size.is_power_of_two() {
            return Err(RtrsError::Config(
                "chunk_size must be a power of two of at least 8192",
            ));
        }
        if self.max_hdr_size < 24 || self.max_hdr_size >= self.chunk_size {
            return Err(RtrsError::Config("max_hdr_size must be in 24..chunk_size"));
        }
        if self.hb_interval.is_zero() {
            return Err(RtrsError::Config("hb_interval must be above 0"));
        }
        Geometry::new(self.queue_depth, self.chunk_size).map_err(|_| {
            RtrsError::Config(
                "queue_depth and chunk_size exceed the 28-bit immediate: bits(queue_depth) + bits(chunk_size) must be <= 28",
            )
        })
    }
}

/// Counters of the server as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connect requests whose private data was not a valid `conn_req`.
    pub malformed_conn_reqs: u64,
    /// Connect requests rejected for any reason.
    pub rejected: u64,
    /// Paths closed for a protocol violation.
    pub violation_closes: u64,
}

#[derive(Debug)]
struct SrvSess {
    uuid: [u8; 16],
    id: SessId,
    paths: Vec<usize>,
    paths_up: u32,
}

/// A server (see the module doc).
#[derive(Debug)]
pub struct Server {
    cfg: ServerConfig,
    geom: Geometry,
    sessions: Vec<Option<SrvSess>>,
    sess_gens: Vec<u16>,
    paths: Vec<Option<ServerPath>>,
    path_gens: Vec<u16>,
    events: VecDeque<ServerEvent>,
    stats: ServerStats,
}

impl Server {
    /// A server with no session.
    ///
    /// # Errors
    /// What [`ServerConfig::validate`] finds.
    pub fn new(cfg: ServerConfig) -> Result<Self, RtrsError> {
        let geom = cfg.validate()?;
        Ok(Self {
            cfg,
            geom,
            sessions: Vec::new(),
            sess_gens: Vec::new(),
            paths: Vec::new(),
            path_gens: Vec::new(),
            events: VecDeque::with_capacity(usize::from(cfg.queue_depth) + 64),
            stats: ServerStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Server-wide counters.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    fn path_index(&self, id: PathId) -> Option<usize> {
        let i = usize::from(id.idx);
        match self.paths.get(i) {
            Some(Some(_)) if self.path_gens[i] == id.generation => Some(i),
            _ => None,
        }
    }

    fn sess_index(&self, id: SessId) -> Option<usize> {
        let i = usize::from(id.idx);
        match self.sessions.get(i) {
            Some(Some(_)) if self.sess_gens[i] == id.generation => Some(i),
            _ => None,
        }
    }

    fn accept_rsp(&self) -> ConnRspRepr {
        ConnRspRepr {
            version: PROTO_VER,
            errno: 0,
            queue_depth: self.cfg.queue_depth,
            max_io_size: self.cfg.chunk_size - self.cfg.max_hdr_size,
            max_hdr_size: self.cfg.max_hdr_size,
            flags: if self.cfg.always_invalidate {
                MSG_NEW_RKEY_F
            } else {
                0
            },
        }
    }

    fn reject(&mut self, token: CmToken, errno: i32, io: &mut impl ServerIo) {
        self.stats.rejected += 1;
        io.reject(
            token,
            &ConnRspRepr::reject(-(errno.unsigned_abs() as i16)).to_bytes(),
        );
    }

    /// `rtrs_rdma_connect`: a connect request with its private data; `addr` identifies its
    /// source and destination addresses (a second path of a session with the same addresses
    /// is refused). Answered through [`ServerIo::accept`] or [`ServerIo::reject`].
    pub fn handle_connect_request(
        &mut self,
        now: Instant,
        token: CmToken,
        addr: u128,
        private_data: &[u8],
        io: &mut impl ServerIo,
    ) {
        let Ok(req) = ConnReq::new_checked(private_data).and_then(|p| ConnReqRepr::parse(&p))
        else {
            self.stats.malformed_conn_reqs += 1;
            return self.reject(token, libc::ECONNRESET, io);
        };
        // get_or_create_srv
        let s = match self
            .sessions
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.uuid == req.sess_uuid))
        {
            Some(s) => s,
            None if !req.first_conn => return self.reject(token, libc::ENXIO, io),
            None => match self.create_session(req.sess_uuid, io) {
                Ok(s) => s,
                Err(e) => return self.reject(token, e, io),
            },
        };
        let found = self.sessions[s].as_ref().and_then(|ss| {
            ss.paths.iter().copied().find(|&p| {
                self.paths[p]
                    .as_ref()
                    .is_some_and(|x| x.uuid == req.path_uuid)
            })
        });
        let p = match found {
            Some(p) => {
                let path = self.paths[p].as_mut().expect("listed in its session");
                if path.state != ServerState::Connecting {
                    // Linux: "Session in wrong state", until its own heartbeat closes the old
                    // path (~30 s, rtrs.md 10.9). A different recon_cnt proves the client
                    // gave that incarnation up: close it now; the client retries shortly.
                    if path.recon_cnt != req.recon_cnt && path.state == ServerState::Connected {
                        self.close_idx(p, PathError::Disconnected, io);
                    }
                    return self.reject(token, libc::EBUSY, io);
                }
                if req.cid_num != path.cid_num || path.has_conn(req.cid) {
                    return self.reject(token, libc::ECONNRESET, io);
                }
                p
            }
            None => match self.alloc_path(s, &req, addr, io) {
                Ok(p) => p,
                Err(e) => {
                    self.put_session_if_empty(s, io);
                    return self.reject(token, e, io);
                }
            },
        };
        let path = self.paths[p].as_mut().expect("just found or made");
        let conn = Conn {
            path: path.id,
            cid: req.cid,
            epoch: 0,
        };
        let sizes = path::qp_sizes(req.cid, self.cfg.queue_depth, self.cfg.always_invalidate);
        let rsp = self.accept_rsp().to_bytes();
        if let Err(e) = io.accept(token, conn, sizes, &rsp) {
            self.stats.rejected += 1;
            io.reject(
                token,
                &ConnRspRepr::reject(-(e.unsigned_abs() as i16)).to_bytes(),
            );
            self.close_idx(
                p,
                PathError::Post(dp_fabric::PostErrorKind::Unsupported),
                io,
            );
            return;
        }
        let always = self.cfg.always_invalidate;
        let path = self.paths[p].as_mut().expect("just found or made");
        if let Err(e) = path.add_conn(now, req.cid, always, io) {
            self.close_idx(p, e, io);
        }
    }

    fn create_session(&mut self, uuid: [u8; 16], io: &mut impl ServerIo) -> Result<usize, i32> {
        let i = match self.sessions.iter().position(Option::is_none) {
            Some(i) => {
                self.sess_gens[i] = self.sess_gens[i].wrapping_add(1);
                i
            }
            None => {
                self.sessions.push(None);
                self.sess_gens.push(0);
                self.sessions.len() - 1
            }
        };
        let id = SessId {
            idx: i as u16,
            generation: self.sess_gens[i],
        };
        io.create_session(id, self.cfg.queue_depth, self.cfg.chunk_size)
            .map_err(|e| e.abs())?;
        self.sessions[i] = Some(SrvSess {
            uuid,
            id,
            paths: Vec::new(),
            paths_up: 0,
        });
        Ok(i)
    }

    fn put_session_if_empty(&mut self, s: usize, io: &mut impl ServerIo) {
        if self.sessions[s]
            .as_ref()
            .is_some_and(|ss| ss.paths.is_empty())
        {
            let ss = self.sessions[s].take().expect("checked");
            io.free_session(ss.id);
        }
    }

    /// `__alloc_path`: a new path of session `s`, its chunks mapped.
    fn alloc_path(
        &mut self,
        s: usize,
        req: &ConnReqRepr,
        addr: u128,
        io: &mut impl ServerIo,
    ) -> Result<usize, i32> {
        let ss = self.sessions[s].as_ref().expect("caller found it");
        if ss.paths.len() >= MAX_PATHS {
            return Err(libc::ECONNRESET);
        }
        if ss
            .paths
            .iter()
            .any(|&p| self.paths[p].as_ref().is_some_and(|x| x.addr == addr))
        {
            return Err(libc::EEXIST);
        }
        let sess = ss.id;
        let i = match self.paths.iter().position(Option::is_none) {
            Some(i) => {
                self.path_gens[i] = self.path_gens[i].wrapping_add(1);
                i
            }
            None => {
                self.paths.push(None);
                self.path_gens.push(0);
                self.paths.len() - 1
            }
        };
        let id = PathId {
            idx: i as u16,
            generation: self.path_gens[i],
        };
        let mut table = Vec::new();
        io.map_chunks(sess, id, self.cfg.always_invalidate, &mut table)
            .map_err(|e| e.abs())?;
        let hb = Heartbeat::new(self.cfg.hb_interval, self.cfg.hb_missed_max);
        let path = ServerPath::new(
            id,
            sess,
            req.path_uuid,
            addr,
            req.recon_cnt,
            req.cid_num,
            self.geom,
            self.cfg.always_invalidate,
            &table,
            hb,
        )
        .map_err(|_| {
            io.close_path(id);
            libc::EINVAL
        })?;
        self.paths[i] = Some(path);
        self.sessions[s]
            .as_mut()
            .expect("caller found it")
            .paths
            .push(i);
        Ok(i)
    }

    /// A connection-manager event of an accepted connection: anything but ESTABLISHED closes
    /// its path (`rtrs_srv_rdma_cm_handler`).
    pub fn handle_cm(&mut self, now: Instant, conn: Conn, ev: CmEvent<'_>, io: &mut impl ServerIo) {
        let _ = now;
        let Some(p) = self.path_index(conn.path) else {
            return;
        };
        match ev {
            CmEvent::Established { .. } => {}
            CmEvent::DeviceRemoval => self.close_idx(p, PathError::DeviceRemoval, io),
            _ => self.close_idx(p, PathError::Disconnected, io),
        }
    }

    /// One completion polled from `conn`'s completion queue, with the bytes a receive
    /// caught.
    pub fn handle_completion(
        &mut self,
        now: Instant,
        conn: Conn,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ServerIo,
    ) {
        let Some(p) = self.path_index(conn.path) else {
            return;
        };
        let Self { paths, events, .. } = self;
        let path = paths[p].as_mut().expect("checked");
        let o = path.handle_wc(conn.cid, wc, payload, io, events);
        self.apply(p, o, now, io);
    }

    /// Runs due heartbeats.
    pub fn handle_timeout(&mut self, now: Instant, io: &mut impl ServerIo) {
        for p in 0..self.paths.len() {
            let Some(path) = self.paths[p].as_mut() else {
                continue;
            };
            let o = path.handle_timeout(now, io);
            self.apply(p, o, now, io);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next needed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.paths
            .iter()
            .flatten()
            .filter_map(ServerPath::poll_timeout)
            .min()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// `rtrs_srv_resp_rdma`: the handler's answer to `op`: `status` 0, or a negative errno
    /// the client's request fails with. For a successful READ the first `read_len` bytes of
    /// the chunk go to the client first.
    ///
    /// # Errors
    /// [`RtrsError::StaleOp`] if `op` is not waiting for an answer (answered already, or its
    /// path is gone).
    pub fn resp_rdma(
        &mut self,
        now: Instant,
        op: OpId,
        status: i32,
        io: &mut impl ServerIo,
    ) -> Result<Resp, RtrsError> {
        self.answer(now, op, status, None, io)
    }

    /// A successful READ answered from handler memory instead of the chunk (zero copy): the
    /// `read_len` bytes of the request go to the client from `src`, a source the driver
    /// registered for local access (`ServerDriver::add_source`), then the response as
    /// [`resp_rdma`](Self::resp_rdma) sends it. The wire sees the same write. The handler
    /// must leave those bytes alone until the response is sent (with a hardware provider the
    /// NIC reads them after this call returns); a concurrent write of them is the overlapping
    /// IO a block device does not order either.
    ///
    /// # Errors
    /// [`RtrsError::StaleOp`] as [`resp_rdma`](Self::resp_rdma);
    /// [`RtrsError::NotARead`] if `op` is not a READ that asked for data;
    /// [`RtrsError::Source`] if `src` is not a registered source with `read_len` bytes at its
    /// offset. Both leave `op` waiting: answer it another way.
    pub fn resp_rdma_from(
        &mut self,
        now: Instant,
        op: OpId,
        src: SrcRef,
        io: &mut impl ServerIo,
    ) -> Result<Resp, RtrsError> {
        self.answer(now, op, 0, Some(src), io)
    }

    fn answer(
        &mut self,
        now: Instant,
        op: OpId,
        status: i32,
        src: Option<SrcRef>,
        io: &mut impl ServerIo,
    ) -> Result<Resp, RtrsError> {
        let _ = now;
        let p = self.path_index(op.path).ok_or(RtrsError::StaleOp)?;
        let path = self.paths[p].as_mut().expect("checked");
        if !path.op_waits(op) {
            return Err(RtrsError::StaleOp);
        }
        if let Some(src) = src {
            let len = path.read_len(op).ok_or(RtrsError::NotARead)?;
            if !io.source_fits(src, len) {
                return Err(RtrsError::Source);
            }
        }
        if path.state != ServerState::Connected {
            path.drop_op(op);
            self.finish_close_if_idle(p, io);
            return Ok(Resp::Dropped);
        }
        match path.respond(op, status, src, io) {
            Ok(true) => Ok(Resp::Sent),
            Ok(false) => Ok(Resp::Queued),
            Err(e) => {
                self.close_idx(p, e, io);
                Ok(Resp::Dropped)
            }
        }
    }

    /// Sysfs `disconnect` of a path.
    ///
    /// # Errors
    /// [`RtrsError::NoSuchPath`].
    pub fn close_path(
        &mut self,
        now: Instant,
        id: PathId,
        io: &mut impl ServerIo,
    ) -> Result<(), RtrsError> {
        let _ = now;
        let p = self.path_index(id).ok_or(RtrsError::NoSuchPath)?;
        self.close_idx(p, PathError::Closed, io);
        Ok(())
    }

    /// Closes every path (`rtrs_srv_close`).
    pub fn close(&mut self, now: Instant, io: &mut impl ServerIo) {
        let _ = now;
        for p in 0..self.paths.len() {
            if self.paths[p].is_some() {
                self.close_idx(p, PathError::Closed, io);
            }
        }
    }

    fn apply(&mut self, p: usize, o: Outcome, now: Instant, io: &mut impl ServerIo) {
        match o {
            Outcome::None => {}
            Outcome::Up => self.path_up(p),
            Outcome::Info(name) => {
                let sess = self.paths[p].as_ref().expect("caller checked").sess;
                // `exist_pathname`: the name may not be another session's (-EPERM).
                let taken = self
                    .paths
                    .iter()
                    .flatten()
                    .any(|x| x.sess != sess && x.name.as_ref() == Some(&*name));
                if taken {
                    self.close_idx(p, PathError::Rejected(-(libc::EPERM as i16)), io);
                    return;
                }
                let o = self.paths[p]
                    .as_mut()
                    .expect("caller checked")
                    .accept_info(now, *name, io);
                self.apply(p, o, now, io);
            }
            Outcome::Close(e) => {
                if matches!(e, PathError::Violation(_)) {
                    self.stats.violation_closes += 1;
                }
                self.close_idx(p, e, io);
            }
        }
    }

    /// `rtrs_srv_path_up`.
    fn path_up(&mut self, p: usize) {
        let path = self.paths[p].as_mut().expect("caller checked");
        path.established = true;
        let (id, sess) = (path.id, path.sess);
        let Some(s) = self.sess_index(sess) else {
            return;
        };
        let ss = self.sessions[s].as_mut().expect("checked");
        ss.paths_up += 1;
        if ss.paths_up == 1 {
            self.events.push_back(ServerEvent::Link {
                sess,
                ev: SrvLinkEv::Connected,
            });
        }
        self.events
            .push_back(ServerEvent::PathUp { path: id, sess });
    }

    /// `close_path`: CLOSING now; CLOSED once the handler has answered what it holds.
    fn close_idx(&mut self, p: usize, e: PathError, io: &mut impl ServerIo) {
        let Some(path) = self.paths[p].as_mut() else {
            return;
        };
        if path.start_close(io) {
            path.last_error = Some(e);
        }
        self.finish_close_if_idle(p, io);
    }

    /// The rest of `rtrs_srv_close_work` once no request is with the handler: path down,
    /// path gone, session freed with its last path.
    fn finish_close_if_idle(&mut self, p: usize, io: &mut impl ServerIo) {
        let Some(path) = self.paths[p].as_ref() else {
            return;
        };
        if path.state != ServerState::Closing || path.busy() != 0 {
            return;
        }
        let mut path = self.paths[p].take().expect("checked");
        path.state = ServerState::Closed;
        let Some(s) = self.sess_index(path.sess) else {
            return;
        };
        let ss = self.sessions[s].as_mut().expect("checked");
        ss.paths.retain(|&x| x != p);
        if path.established {
            ss.paths_up = ss.paths_up.saturating_sub(1);
            if ss.paths_up == 0 {
                self.events.push_back(ServerEvent::Link {
                    sess: path.sess,
                    ev: SrvLinkEv::Disconnected,
                });
            }
        }
        self.events.push_back(ServerEvent::PathClosed {
            path: path.id,
            sess: path.sess,
        });
        self.put_session_if_empty(s, io);
    }

    // ---------------------------------------------------------------------------------------
    // Getters
    // ---------------------------------------------------------------------------------------

    /// The paths, in table order.
    pub fn paths(&self) -> impl Iterator<Item = PathId> + '_ {
        self.paths.iter().flatten().map(|p| p.id)
    }

    /// The sessions.
    pub fn sessions(&self) -> impl Iterator<Item = SessId> + '_ {
        self.sessions.iter().flatten().map(|s| s.id)
    }

    /// A session's paths.
    pub fn session_paths(&self, sess: SessId) -> Vec<PathId> {
        self.sess_index(sess)
            .and_then(|s| self.sessions[s].as_ref())
            .map(|ss| {
                ss.paths
                    .iter()
                    .filter_map(|&p| self.paths[p].as_ref().map(|x| x.id))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A path's state.
    pub fn path_state(&self, id: PathId) -> Option<ServerState> {
        Some(self.paths[self.path_index(id)?].as_ref()?.state)
    }

    /// Resets every path's counters ([`ServerPathStats::reset_all`]).
    pub fn reset_path_stats(&mut self) {
        for p in self.paths.iter_mut().flatten() {
            p.stats.reset_all();
        }
    }

    /// A path's counters.
    pub fn path_stats(&self, id: PathId) -> Option<&ServerPathStats> {
        Some(&self.paths[self.path_index(id)?].as_ref()?.stats)
    }

    /// A path's name (from its `info_req`).
    pub fn path_name(&self, id: PathId) -> Option<PathName> {
        self.paths[self.path_index(id)?].as_ref()?.name
    }

    /// A path's session.
    pub fn path_session(&self, id: PathId) -> Option<SessId> {
        Some(self.paths[self.path_index(id)?].as_ref()?.sess)
    }

    /// Why a path is closing.
    pub fn path_error(&self, id: PathId) -> Option<PathError> {
        self.paths[self.path_index(id)?].as_ref()?.last_error
    }

    /// The current key of chunk `chunk` on path `id` (tests of always_invalidate).
    #[cfg(feature = "testing")]
    pub fn debug_chunk_key(&self, id: PathId, chunk: u16) -> Option<u32> {
        self.paths[self.path_index(id)?].as_ref()?.key(chunk)
    }
}
