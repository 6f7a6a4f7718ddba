//! The client: a session of several paths to one server (`rtrs_clt_sess`), as a sans-IO
//! state machine.
//!
//! # Method groups
//!
//! * control: [`ClientSession::open`], [`add_path`](ClientSession::add_path),
//!   [`remove_path`](ClientSession::remove_path),
//!   [`disconnect_path`](ClientSession::disconnect_path),
//!   [`reconnect_path`](ClientSession::reconnect_path), [`close`](ClientSession::close),
//!   [`set_policy`](ClientSession::set_policy),
//!   [`set_max_reconnect_attempts`](ClientSession::set_max_reconnect_attempts);
//! * IO: [`permits`](ClientSession::permits) (get and put permits from any lcore),
//!   [`request`](ClientSession::request);
//! * inputs: [`handle_cm`](ClientSession::handle_cm),
//!   [`handle_completion`](ClientSession::handle_completion),
//!   [`handle_timeout`](ClientSession::handle_timeout);
//! * outputs: work goes straight to the [`ClientIo`] driver passed to every call;
//!   [`poll_event`](ClientSession::poll_event) drains [`ClientEvent`]s (IO completions,
//!   path and link events); [`poll_timeout`](ClientSession::poll_timeout) says when to call
//!   `handle_timeout`;
//! * getters: [`query`](ClientSession::query), [`path_state`](ClientSession::path_state),
//!   [`path_stats`](ClientSession::path_stats), ...
//!
//! # Paths, failover, reconnect
//!
//! Each path walks the states of Linux's `rtrs_clt_change_state` ([`ClientState`]). When a
//! connected path fails (an error completion, a connection-manager disconnect, a
//! protocol violation, heartbeats unanswered for 30 to 35 s), it goes to RECONNECTING, its
//! connections are closed and drained by the driver, and every request in flight on it is
//! posted again on another connected path chosen by the policy, with the same permit and so
//! the same server chunk (`fail_all_outstanding_reqs`): the user sees no error while a path
//! lives. Then a reconnect is scheduled after `reconnect_delay` plus 0 to 7 ms of jitter,
//! and each attempt starts after a 1 s backoff, up to `max_reconnect_attempts` (-1: for
//! ever), after which the path is CLOSED.
//!
//! # Failover and the dead path's chunks
//!
//! A chunk is the same server memory on every path, and a path that died with requests in
//! flight may still have its server working in their chunks (a READ filling one, a WRITE
//! reading one out to the disk): the server learns late that the path is gone and drains
//! its operations before it lets the path reconnect. The failed-over copy of a request is
//! harmless there (same bytes, same block), but once it completes its chunk must not carry
//! *another* request while the dead path's operation may still touch it. So the session
//! fences the chunk of every request it takes off a dead path before its answer
//! ([`Permits::fence`]): the request completes normally, the permit's holder returns it, and
//! it stays out of use until the dead path has connected again (Linux's server refuses that
//! reconnect while its old path exists, and frees the old path only once its operations
//! are done) or the session is closed. A path that never comes back keeps its chunks
//! fenced: at most the requests it had in flight, out of `queue_depth`. A path that is
//! removed cannot come back, so its chunks are held for [`ClientConfig::fence_hold`]
//! instead and then return to use. Linux's client reuses the chunk at once
//! (`fail_all_outstanding_reqs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{IoError, PathError, RtrsError, Violation};
use crate::permit::{Permit, Permits};
use crate::stats::ClientPathStats;
use crate::timer::{HB_INTERVAL, HB_MISSED_MAX, Heartbeat, Instant, Jitter};
use crate::wire::{MAX_CONNS_PER_PATH, MAX_PATHS, PathName};
use crate::work::{CmEvent, Conn, Dir, PathId, Wc};

mod event;
mod fence;
mod io;
mod path;
pub mod policy;
mod req;
pub mod state;

pub use event::{ClientEvent, LinkEv};
pub use io::{ClientIo, DataRef, Mapped};
pub use path::{CONNECT_TIMEOUT, RECONNECT_BACKOFF, RECONNECT_JITTER_MS};
pub use policy::MpPolicy;
pub use state::ClientState;

use fence::Fences;
use path::{ClientPath, Origin, Outcome, SessCtx};
use policy::{PathIter, PathLoad};
use req::{Phase, Req};

/// `RTRS_MAX_SEGMENTS`: pages one request's data may span ("128 * 4k = 512k max IO").
pub const MAX_SEGMENTS: u32 = 128;

/// The configuration of a client session (the arguments of `rtrs_clt_open`).
#[derive(Clone, Copy, Debug)]
pub struct ClientConfig {
    /// The session's name, sent to the server as the path name (`sessname`).
    pub name: PathName,
    /// The session's UUID (`paths_uuid`): generate it randomly once per session.
    pub sess_uuid: [u8; 16],
    /// IO connections per path (Linux: one per CPU); the path has one more, cid 0, for
    /// service messages. `1..=4095`.
    pub io_connections: u16,
    /// Delay before a failed path is reconnected (RNBD uses 30 s).
    pub reconnect_delay: Duration,
    /// Reconnect attempts before a path is closed: `-1..=9999`, -1 for ever (RNBD's
    /// default), 0 never.
    pub max_reconnect_attempts: i16,
    /// The multipath policy.
    pub policy: MpPolicy,
    /// Heartbeat interval (5 s).
    pub hb_interval: Duration,
    /// Heartbeat ticks without traffic before the path is declared dead (5).
    pub hb_missed_max: u32,
    /// `max_segments` reported by [`ClientSession::query`].
    pub max_segments: u32,
    /// Seed of the reconnect jitter.
    pub seed: u64,
    /// How long the chunks a *removed* path left fenced stay out of use (module doc,
    /// "Failover and the dead path's chunks"). A removed path never connects again, so
    /// the server's word that it drained the old path's operations never comes; this
    /// bound stands in for it. At least the heartbeat bound (`hb_interval` times
    /// `hb_missed_max`: the server may not notice the path is gone before that), plus the
    /// time the server's backend may take to finish a request. Default 60 s: the 25 s
    /// heartbeat bound and the block layer's 30 s request timeout.
    pub fence_hold: Duration,
}

impl ClientConfig {
    /// Linux's defaults with RNBD's reconnect settings: 1 IO connection, 30 s reconnect
    /// delay, reconnect for ever, min-inflight, 5 s heartbeats.
    ///
    /// # Errors
    /// [`RtrsError::PathName`] if `name` is not a valid path name.
    pub fn new(name: &[u8], sess_uuid: [u8; 16]) -> Result<Self, RtrsError> {
        Ok(Self {
            name: PathName::new(name).map_err(|_| RtrsError::PathName)?,
            sess_uuid,
            io_connections: 1,
            reconnect_delay: Duration::from_secs(30),
            max_reconnect_attempts: -1,
            policy: MpPolicy::MinInflight,
            hb_interval: HB_INTERVAL,
            hb_missed_max: HB_MISSED_MAX,
            max_segments: MAX_SEGMENTS,
            seed: u64::from_le_bytes([
                sess_uuid[0],
                sess_uuid[1],
                sess_uuid[2],
                sess_uuid[3],
                sess_uuid[4],
                sess_uuid[5],
                sess_uuid[6],
                sess_uuid[7],
            ]),
            fence_hold: Duration::from_secs(60),
        })
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`RtrsError::Config`] naming the field and its range.
    pub fn validate(&self) -> Result<(), RtrsError> {
        if self.io_connections == 0 || self.io_connections >= MAX_CONNS_PER_PATH {
            return Err(RtrsError::Config("io_connections must be in 1..=4095"));
        }
        if !(-1..=9999).contains(&self.max_reconnect_attempts) {
            return Err(RtrsError::Config(
                "max_reconnect_attempts must be in -1..=9999",
            ));
        }
        if self.hb_interval.is_zero() {
            return Err(RtrsError::Config("hb_interval must be above 0"));
        }
        if self.max_segments == 0 {
            return Err(RtrsError::Config("max_segments must be above 0"));
        }
        if self.fence_hold < self.hb_interval.saturating_mul(self.hb_missed_max) {
            return Err(RtrsError::Config(
                "fence_hold must be at least the heartbeat bound (hb_interval * hb_missed_max)",
            ));
        }
        Ok(())
    }
}

/// One IO request (the arguments of `rtrs_clt_request` besides the permit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// READ (the server writes `data`) or WRITE (the server receives `data`).
    pub dir: Dir,
    /// The user message, copied into the permit's header buffer (RNBD's `rnbd_msg_io`).
    pub usr: &'a [u8],
    /// The data: a WRITE's payload or a READ's destination; `None` moves no data.
    pub data: Option<DataRef>,
    /// The caller's cookie, returned with the completion.
    pub ctx: u64,
}

/// What `rtrs_clt_query` reports (`struct rtrs_attrs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// Permits (chunks) of the session.
    pub queue_depth: u16,
    /// The largest data length of one request: the smallest over the paths, capped by
    /// `max_segments` pages of 4 KiB.
    pub max_io_size: u32,
    /// Pages one request's data may span.
    pub max_segments: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SessState {
    Idle,
    Opening,
    Open,
    Closed,
}

/// A client session (see the module doc).
#[derive(Debug)]
pub struct ClientSession {
    cfg: ClientConfig,
    state: SessState,
    paths: Vec<Option<ClientPath>>,
    gens: Vec<u16>,
    permits: Option<Arc<Permits>>,
    queue_depth: Option<u16>,
    max_io_size: u32,
    rr: Option<usize>,
    paths_up: u32,
    opening: u32,
    events: VecDeque<ClientEvent>,
    jitter: Jitter,
    max_reconnect: u32,
    policy: MpPolicy,
    fences: Fences,
}

impl ClientSession {
    /// A session that has not connected yet.
    ///
    /// # Errors
    /// What [`ClientConfig::validate`] finds.
    pub fn new(cfg: ClientConfig) -> Result<Self, RtrsError> {
        cfg.validate()?;
        Ok(Self {
            state: SessState::Idle,
            paths: Vec::new(),
            gens: Vec::new(),
            permits: None,
            queue_depth: None,
            max_io_size: 0,
            rr: None,
            paths_up: 0,
            opening: 0,
            events: VecDeque::with_capacity(1024),
            jitter: Jitter::new(cfg.seed),
            max_reconnect: max_reconnect(cfg.max_reconnect_attempts),
            policy: cfg.policy,
            fences: Fences::default(),
            cfg,
        })
    }

    fn sess_ctx(&self) -> SessCtx {
        SessCtx {
            sess_uuid: self.cfg.sess_uuid,
            queue_depth: self.queue_depth,
            name: self.cfg.name,
        }
    }

    fn live_paths(&self) -> usize {
        self.paths.iter().filter(|p| p.is_some()).count()
    }

    fn index(&self, id: PathId) -> Option<usize> {
        let i = usize::from(id.idx);
        match self.paths.get(i) {
            Some(Some(_)) if self.gens[i] == id.generation => Some(i),
            _ => None,
        }
    }

    fn path_mut(&mut self, i: usize) -> &mut ClientPath {
        self.paths[i].as_mut().expect("index() checked the slot")
    }

    fn alloc_path(&mut self, uuid: [u8; 16], origin: Origin) -> Result<usize, RtrsError> {
        if self.live_paths() >= MAX_PATHS {
            return Err(RtrsError::TooManyPaths);
        }
        let hb = Heartbeat::new(self.cfg.hb_interval, self.cfg.hb_missed_max);
        let i = match self.paths.iter().position(Option::is_none) {
            Some(i) => {
                self.gens[i] = self.gens[i].wrapping_add(1);
                i
            }
            None => {
                self.paths.push(None);
                self.gens.push(0);
                self.paths.len() - 1
            }
        };
        let id = PathId {
            idx: i as u16,
            generation: self.gens[i],
        };
        self.paths[i] = Some(ClientPath::new(
            id,
            uuid,
            self.cfg.io_connections,
            hb,
            origin,
        ));
        Ok(i)
    }

    /// `rtrs_clt_open`: starts connecting one path per UUID (1 to 128; generate each
    /// randomly once, it names the path on the server across reconnects). The first path
    /// carries `first_conn`. [`ClientEvent::Opened`] follows once every path is connected,
    /// or [`ClientEvent::OpenFailed`] if one fails (then every path is closed).
    ///
    /// # Errors
    /// [`RtrsError::Config`] for no paths or more than 128, [`RtrsError::Busy`] if already
    /// opened.
    pub fn open(
        &mut self,
        now: Instant,
        path_uuids: &[[u8; 16]],
        io: &mut impl ClientIo,
    ) -> Result<Vec<PathId>, RtrsError> {
        if self.state != SessState::Idle {
            return Err(RtrsError::Busy);
        }
        if path_uuids.is_empty() || path_uuids.len() > MAX_PATHS {
            return Err(RtrsError::Config("a session opens with 1..=128 paths"));
        }
        self.state = SessState::Opening;
        let mut ids = Vec::with_capacity(path_uuids.len());
        for (k, u) in path_uuids.iter().enumerate() {
            let i = self.alloc_path(*u, Origin::Open)?;
            self.path_mut(i).for_new_clt = k == 0;
            ids.push(self.path_mut(i).id);
        }
        self.opening = path_uuids.len() as u32;
        // The first path alone: it carries `first_conn`, which creates the session on the
        // server, and a request of another path reaching the server before it would be
        // refused (`-ENXIO`). The others start once it is up (Linux opens them one by one).
        if let Some(i) = ids.first().and_then(|&id| self.index(id)) {
            let ctx = self.sess_ctx();
            let o = self.path_mut(i).start(now, io, &ctx);
            self.apply(i, o, now, io);
        }
        Ok(ids)
    }

    /// During the open: starts the paths of `open` that have not started yet (epoch 0),
    /// once the first is up.
    fn start_open_paths(&mut self, now: Instant, io: &mut impl ClientIo) {
        for i in 0..self.paths.len() {
            if self.state != SessState::Opening {
                break;
            }
            let Some(p) = self.paths[i].as_ref() else {
                continue;
            };
            if p.origin != Origin::Open || p.epoch() != 0 {
                continue;
            }
            let ctx = self.sess_ctx();
            let o = self.path_mut(i).start(now, io, &ctx);
            self.apply(i, o, now, io);
        }
    }

    /// `rtrs_clt_create_path_from_sysfs`: adds a path at run time and starts connecting it
    /// (it carries `first_conn` if the session has no other path). [`ClientEvent::PathUp`]
    /// or [`ClientEvent::PathAddFailed`] follows.
    ///
    /// # Errors
    /// [`RtrsError::Busy`] before the session is open, [`RtrsError::Closed`] after close,
    /// [`RtrsError::TooManyPaths`].
    pub fn add_path(
        &mut self,
        now: Instant,
        uuid: [u8; 16],
        io: &mut impl ClientIo,
    ) -> Result<PathId, RtrsError> {
        match self.state {
            SessState::Open => {}
            SessState::Closed => return Err(RtrsError::Closed),
            _ => return Err(RtrsError::Busy),
        }
        let first = self.live_paths() == 0;
        let i = self.alloc_path(uuid, Origin::Added)?;
        self.path_mut(i).for_new_clt = first;
        let id = self.path_mut(i).id;
        let ctx = self.sess_ctx();
        let o = self.path_mut(i).start(now, io, &ctx);
        self.apply(i, o, now, io);
        Ok(id)
    }

    /// `rtrs_clt_remove_path_from_sysfs`: closes the path (its requests fail over) and
    /// removes it (DEAD). [`ClientEvent::PathRemoved`] follows.
    ///
    /// # Errors
    /// [`RtrsError::NoSuchPath`].
    pub fn remove_path(
        &mut self,
        now: Instant,
        id: PathId,
        io: &mut impl ClientIo,
    ) -> Result<(), RtrsError> {
        let i = self.index(id).ok_or(RtrsError::NoSuchPath)?;
        self.close_path(i, now, io);
        self.remove(i, now);
        Ok(())
    }

    fn remove(&mut self, i: usize, now: Instant) {
        if self.path_mut(i).state() != ClientState::Closed {
            return;
        }
        // It never connects again: its fences lift after the hold instead.
        self.fences
            .hold(i, self.gens[i], now.saturating_add(self.cfg.fence_hold));
        let p = self.path_mut(i);
        p.change(ClientState::Dead);
        let id = p.id;
        self.paths[i] = None;
        self.events.push_back(ClientEvent::PathRemoved { path: id });
    }

    /// Sysfs `disconnect`: the path is CLOSED (its requests fail over) and stays listed;
    /// [`reconnect_path`](Self::reconnect_path) brings it back.
    ///
    /// # Errors
    /// [`RtrsError::NoSuchPath`], [`RtrsError::Busy`] if it is already closed.
    pub fn disconnect_path(
        &mut self,
        now: Instant,
        id: PathId,
        io: &mut impl ClientIo,
    ) -> Result<(), RtrsError> {
        let i = self.index(id).ok_or(RtrsError::NoSuchPath)?;
        if self.close_path(i, now, io) {
            Ok(())
        } else {
            Err(RtrsError::Busy)
        }
    }

    /// Sysfs `reconnect` (`rtrs_clt_reconnect_from_sysfs`): RECONNECTING from CONNECTED,
    /// CONNECTING_ERR or CLOSED, attempts reset, connections closed (requests fail over),
    /// and a reconnect at once (after the 1 s backoff). The outcome comes as
    /// [`ClientEvent::PathUp`] or [`ClientEvent::ReconnectFailed`].
    ///
    /// # Errors
    /// [`RtrsError::NoSuchPath`], [`RtrsError::Busy`] if the state does not allow it.
    pub fn reconnect_path(
        &mut self,
        now: Instant,
        id: PathId,
        io: &mut impl ClientIo,
    ) -> Result<(), RtrsError> {
        let i = self.index(id).ok_or(RtrsError::NoSuchPath)?;
        if self.state == SessState::Closed {
            return Err(RtrsError::Closed);
        }
        let old = self.path_mut(i).state();
        if self.path_mut(i).change(ClientState::Reconnecting) {
            let p = self.path_mut(i);
            p.attempts = 0;
            p.no_reconnect = false;
            self.stop_and_destroy(i, io);
            self.path_mut(i).schedule_reconnect(now);
            Ok(())
        } else if old == ClientState::Reconnecting {
            Ok(())
        } else {
            Err(RtrsError::Busy)
        }
    }

    /// `rtrs_clt_close`: closes every path; requests still in flight complete with
    /// [`IoError::Aborted`]. [`ClientEvent::Closed`] follows.
    pub fn close(&mut self, now: Instant, io: &mut impl ClientIo) {
        if self.state == SessState::Closed {
            return;
        }
        self.state = SessState::Closed;
        for i in 0..self.paths.len() {
            if self.paths[i].is_some() {
                self.close_path(i, now, io);
            }
        }
        // No request goes out any more: nothing can land in a chunk a dead path's server
        // still works in.
        if let Some(p) = &self.permits {
            self.fences.lift_all(p);
        }
        self.events.push_back(ClientEvent::Closed);
    }

    /// The multipath policy.
    pub fn policy(&self) -> MpPolicy {
        self.policy
    }

    /// Sysfs `mpath_policy`: applies to requests from now on.
    pub fn set_policy(&mut self, p: MpPolicy) {
        self.policy = p;
    }

    /// Sysfs `max_reconnect_attempts` (-1 for ever).
    ///
    /// # Errors
    /// [`RtrsError::Config`] outside `-1..=9999`.
    pub fn set_max_reconnect_attempts(&mut self, n: i16) -> Result<(), RtrsError> {
        if !(-1..=9999).contains(&n) {
            return Err(RtrsError::Config(
                "max_reconnect_attempts must be in -1..=9999",
            ));
        }
        self.cfg.max_reconnect_attempts = n;
        self.max_reconnect = max_reconnect(n);
        Ok(())
    }

    /// The reconnect limit as set (-1 for ever).
    pub fn max_reconnect_attempts(&self) -> i16 {
        self.cfg.max_reconnect_attempts
    }

    /// The permits, once the session is open: get and put them from any lcore.
    pub fn permits(&self) -> Option<&Arc<Permits>> {
        self.permits.as_ref()
    }

    /// `rtrs_clt_query`.
    ///
    /// # Errors
    /// [`RtrsError::NotConnected`] if no path is connected.
    pub fn query(&self) -> Result<Attrs, RtrsError> {
        let connected = self.paths.iter().flatten().any(PathLoad::connected);
        match (connected, self.queue_depth) {
            (true, Some(queue_depth)) => Ok(Attrs {
                queue_depth,
                max_io_size: self
                    .max_io_size
                    .min(self.cfg.max_segments.saturating_mul(4096)),
                max_segments: self.cfg.max_segments,
            }),
            _ => Err(RtrsError::NotConnected),
        }
    }

    /// The paths, in table order.
    pub fn paths(&self) -> impl Iterator<Item = PathId> + '_ {
        self.paths.iter().flatten().map(|p| p.id)
    }

    /// A path's state.
    pub fn path_state(&self, id: PathId) -> Option<ClientState> {
        Some(self.paths[self.index(id)?].as_ref()?.state())
    }

    /// A path's counters.
    pub fn path_stats(&self, id: PathId) -> Option<&ClientPathStats> {
        Some(&self.paths[self.index(id)?].as_ref()?.stats)
    }

    /// A path's counters, to reset them (sysfs `reset_all`).
    pub fn path_stats_mut(&mut self, id: PathId) -> Option<&mut ClientPathStats> {
        let i = self.index(id)?;
        Some(&mut self.path_mut(i).stats)
    }

    /// A path's last error.
    pub fn path_error(&self, id: PathId) -> Option<PathError> {
        self.paths[self.index(id)?].as_ref()?.last_error
    }

    /// A path's last heartbeat round trip (sysfs `cur_latency`).
    pub fn path_latency(&self, id: PathId) -> Option<Duration> {
        self.paths[self.index(id)?].as_ref()?.cur_latency()
    }

    /// The path a request of permit `id` is in flight on, if any.
    pub fn request_path(&self, id: u16) -> Option<PathId> {
        self.paths
            .iter()
            .flatten()
            .find(|p| p.has_req(id))
            .map(|p| p.id)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next needed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.paths
            .iter()
            .flatten()
            .filter_map(ClientPath::poll_timeout)
            .chain(self.fences.next_deadline())
            .min()
    }

    // ---------------------------------------------------------------------------------------
    // IO
    // ---------------------------------------------------------------------------------------

    /// `rtrs_clt_request`: sends `req` through the permit's chunk, on the first path the
    /// policy finds that takes it. `req.ctx` comes back with the [`ClientEvent::Completed`].
    ///
    /// # Errors
    /// [`IoError::Closed`], [`IoError::BadPermit`] (not this session's, or not taken),
    /// [`IoError::Busy`] (the permit already has a request in flight), [`IoError::MsgSize`]
    /// (message or data too large for the server), [`IoError::Aborted`] (no connected path
    /// took it). Nothing is in flight after an error.
    pub fn request(
        &mut self,
        now: Instant,
        permit: &Permit,
        req: Request<'_>,
        io: &mut impl ClientIo,
    ) -> Result<(), IoError> {
        let Request {
            dir,
            usr,
            data,
            ctx,
        } = req;
        let _ = now;
        if self.state == SessState::Closed {
            return Err(IoError::Closed);
        }
        let permits = self.permits.as_ref().ok_or(IoError::Aborted)?;
        let id = permit.id();
        if permit.pool() != permits.pool() || id >= permits.depth() || !permits.is_taken(id) {
            return Err(IoError::BadPermit);
        }
        if self.paths.iter().flatten().any(|p| p.has_req(id)) {
            return Err(IoError::Busy);
        }
        let usr_len = u16::try_from(usr.len()).map_err(|_| IoError::MsgSize)?;
        io.write_iu(id, 0, usr).map_err(|_| IoError::MsgSize)?;
        let q = Req {
            ctx,
            dir,
            usr_len,
            data,
            con: permit.con_type(),
            lane: permit.lane(),
            cid: 0,
            key: None,
            phase: Phase::Posted,
        };
        let mut it = PathIter::new(self.policy);
        let mut err = IoError::Aborted;
        while let Some(i) = it.next(&self.paths, &mut self.rr) {
            let p = self.path_mut(i);
            if !p.connected() {
                continue;
            }
            req::check_hdr_room(
                dir,
                usr_len,
                data.is_some_and(|d| d.len != 0),
                p.max_hdr_size(),
            )?;
            match p.post_req(io, id, q) {
                Ok(()) => return Ok(()),
                Err(e) => err = e,
            }
        }
        Err(err)
    }

    // ---------------------------------------------------------------------------------------
    // Inputs
    // ---------------------------------------------------------------------------------------

    /// A connection-manager event for `conn` (the handle given to
    /// [`ClientIo::connect`]).
    pub fn handle_cm(&mut self, now: Instant, conn: Conn, ev: CmEvent<'_>, io: &mut impl ClientIo) {
        let Some(i) = self.index(conn.path) else {
            return;
        };
        let ctx = self.sess_ctx();
        let o = self.path_mut(i).handle_cm(now, conn, ev, io, &ctx);
        self.apply(i, o, now, io);
    }

    /// One completion polled from `conn`'s completion queue, with the bytes a receive
    /// caught (empty for sends).
    pub fn handle_completion(
        &mut self,
        now: Instant,
        conn: Conn,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ClientIo,
    ) {
        let Some(i) = self.index(conn.path) else {
            return;
        };
        let Self { paths, events, .. } = self;
        let p = paths[i].as_mut().expect("index() checked the slot");
        let o = p.handle_wc(now, conn, wc, payload, io, events);
        self.apply(i, o, now, io);
    }

    /// Runs every due timer (heartbeats, connect timeouts, reconnects). Early or repeated
    /// calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant, io: &mut impl ClientIo) {
        if let Some(p) = &self.permits {
            self.fences.expire(now, p);
        }
        for i in 0..self.paths.len() {
            for _ in 0..8 {
                let Some(p) = self.paths[i].as_mut() else {
                    break;
                };
                let o = p.handle_timeout(now, io);
                if o == Outcome::None {
                    break;
                }
                self.apply(i, o, now, io);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // What the session does with a path's outcome
    // ---------------------------------------------------------------------------------------

    fn apply(&mut self, i: usize, o: Outcome, now: Instant, io: &mut impl ClientIo) {
        match o {
            Outcome::None => {}
            Outcome::Up => self.path_up(i, now, io),
            Outcome::Failed(error) => {
                let path = self.path_mut(i).id;
                self.events.push_back(ClientEvent::PathDown { path, error });
                self.err_recovery(i, now, io);
            }
            Outcome::ConnectFailed(error) => self.connect_failed(i, error, now, io),
            Outcome::ReconnectDue => {
                let limit = self.max_reconnect;
                let p = self.path_mut(i);
                if p.no_reconnect || p.attempts >= limit {
                    self.close_path(i, now, io);
                } else {
                    p.attempts += 1;
                    p.schedule_backoff(now.saturating_add(RECONNECT_BACKOFF));
                }
            }
            Outcome::BackoffDue => {
                if self.path_mut(i).change(ClientState::Connecting) {
                    let ctx = self.sess_ctx();
                    let o = self.path_mut(i).start(now, io, &ctx);
                    self.apply(i, o, now, io);
                }
            }
        }
    }

    /// `rtrs_clt_path_up` and the end of `rtrs_clt_open`.
    fn path_up(&mut self, i: usize, now: Instant, io: &mut impl ClientIo) {
        let p = self.path_mut(i);
        let (id, qd, mio) = (p.id, p.geometry().map(|g| g.queue_depth()), p.max_io_size());
        if let (Some(have), Some(got)) = (self.queue_depth, qd)
            && have != got
        {
            let p = self.path_mut(i);
            p.no_reconnect = true;
            p.stats.violation(Violation::QueueDepthChanged);
            let o = p.fail(PathError::Violation(Violation::QueueDepthChanged));
            self.apply(i, o, now, io);
            return;
        }
        if self.queue_depth.is_none() {
            self.queue_depth = qd;
        }
        self.max_io_size = if self.max_io_size == 0 {
            mio
        } else {
            self.max_io_size.min(mio)
        };
        self.lift_fences(i);
        let p = self.path_mut(i);
        p.established = true;
        let was = p.origin;
        p.origin = Origin::Running;
        self.paths_up += 1;
        self.events.push_back(ClientEvent::PathUp { path: id });
        match self.state {
            SessState::Open if self.paths_up == 1 => {
                self.events
                    .push_back(ClientEvent::Link(LinkEv::Reconnected));
            }
            SessState::Opening if was == Origin::Open => {
                self.opening -= 1;
                if self.opening == 0 {
                    self.opened();
                } else {
                    self.start_open_paths(now, io);
                }
            }
            _ => {}
        }
    }

    fn opened(&mut self) {
        let Some(qd) = self.queue_depth else { return };
        self.state = SessState::Open;
        let tag = u32::from_le_bytes([
            self.cfg.sess_uuid[0],
            self.cfg.sess_uuid[1],
            self.cfg.sess_uuid[2],
            self.cfg.sess_uuid[3],
        ]);
        self.permits = Some(Arc::new(Permits::new(qd, tag)));
        self.events.reserve(usize::from(qd));
        self.events.push_back(ClientEvent::Opened {
            queue_depth: qd,
            max_io_size: self.max_io_size,
        });
        if self.paths_up == 0 {
            self.events
                .push_back(ClientEvent::Link(LinkEv::Disconnected));
        }
    }

    /// Chunks kept out of use because a dead path may still work in them (module doc).
    pub fn fenced_chunks(&self) -> usize {
        self.fences.count()
    }

    /// Path `i` connected again: its server has dropped the old path and its operations.
    fn lift_fences(&mut self, i: usize) {
        if let Some(p) = &self.permits {
            self.fences.lift(i, self.gens[i], p);
        }
    }

    /// `rtrs_clt_path_down`.
    fn path_down(&mut self, i: usize) {
        let p = self.path_mut(i);
        if !p.established {
            return;
        }
        p.established = false;
        self.paths_up = self.paths_up.saturating_sub(1);
        if self.paths_up == 0 && self.state == SessState::Open {
            self.events
                .push_back(ClientEvent::Link(LinkEv::Disconnected));
        }
    }

    /// `rtrs_clt_stop_and_destroy_conns`: connections closed and drained, requests failed
    /// over, path down.
    fn stop_and_destroy(&mut self, i: usize, io: &mut impl ClientIo) {
        self.path_mut(i).destroy_conns(io);
        self.fail_over(i, io);
        self.path_down(i);
    }

    /// `rtrs_clt_err_recovery_work`: destroy, then reconnect after the delay plus jitter.
    fn err_recovery(&mut self, i: usize, now: Instant, io: &mut impl ClientIo) {
        self.stop_and_destroy(i, io);
        let jitter = Duration::from_millis(self.jitter.below(RECONNECT_JITTER_MS));
        let at = now.saturating_add(self.cfg.reconnect_delay + jitter);
        self.path_mut(i).schedule_reconnect(at);
    }

    /// A failed establishment: what it means depends on why the path was connecting.
    fn connect_failed(&mut self, i: usize, error: PathError, now: Instant, io: &mut impl ClientIo) {
        let p = self.path_mut(i);
        let id = p.id;
        match p.origin {
            Origin::Open => {
                self.events
                    .push_back(ClientEvent::OpenFailed { path: id, error });
                self.state = SessState::Closed;
                for k in 0..self.paths.len() {
                    if self.paths[k].is_some() {
                        self.close_path(k, now, io);
                    }
                }
                self.events.push_back(ClientEvent::Closed);
            }
            Origin::Added => {
                self.events
                    .push_back(ClientEvent::PathAddFailed { path: id, error });
                self.close_path(i, now, io);
                self.remove(i, now);
            }
            Origin::Running => {
                if p.change(ClientState::Reconnecting) {
                    p.stats.reconnects_fail += 1;
                    self.events
                        .push_back(ClientEvent::ReconnectFailed { path: id, error });
                    self.err_recovery(i, now, io);
                }
            }
        }
    }

    /// `rtrs_clt_close_conns` + `rtrs_clt_close_work`: CLOSING, destroy, CLOSED. Returns
    /// false if the state did not allow it.
    fn close_path(&mut self, i: usize, now: Instant, io: &mut impl ClientIo) -> bool {
        let _ = now;
        let p = self.path_mut(i);
        if !p.change(ClientState::Closing) {
            return false;
        }
        p.stop_timers();
        self.stop_and_destroy(i, io);
        let p = self.path_mut(i);
        p.change(ClientState::Closed);
        let id = p.id;
        self.events.push_back(ClientEvent::PathClosed { path: id });
        true
    }

    /// `fail_all_outstanding_reqs` + `rtrs_clt_failover_req`: every request of path `from`
    /// goes to another connected path, same permit, same chunk; if none takes it, it
    /// completes with the last error. Unanswered ones fence their chunk (module doc).
    fn fail_over(&mut self, from: usize, io: &mut impl ClientIo) {
        let slots = self.path_mut(from).slots();
        for s in 0..slots {
            let Some(q) = self.path_mut(from).take_req(s) else {
                continue;
            };
            if let Phase::Invalidating(result) = q.phase {
                // Answered already; its key dies with the path's registrations.
                self.events.push_back(ClientEvent::Completed {
                    id: s,
                    ctx: q.ctx,
                    result,
                });
                continue;
            }
            // Unanswered: the dead path's server may still work in the chunk.
            if let Some(p) = &self.permits {
                self.fences.fence(s, from, self.gens[from], p);
            }
            if self.state == SessState::Closed {
                self.events.push_back(ClientEvent::Completed {
                    id: s,
                    ctx: q.ctx,
                    result: Err(IoError::Aborted),
                });
                continue;
            }
            let mut it = PathIter::new(self.policy);
            let mut err = IoError::Aborted;
            let mut moved = false;
            while let Some(k) = it.next(&self.paths, &mut self.rr) {
                let p = self.path_mut(k);
                if k == from || !p.connected() {
                    continue;
                }
                match p.post_req(io, s, q) {
                    Ok(()) => {
                        p.stats.failover_cnt += 1;
                        moved = true;
                        break;
                    }
                    Err(e) => err = e,
                }
            }
            if !moved {
                self.events.push_back(ClientEvent::Completed {
                    id: s,
                    ctx: q.ctx,
                    result: Err(err),
                });
            }
        }
    }

    /// The request of permit `id` on the path carrying it (tests).
    #[cfg(feature = "testing")]
    pub fn debug_request_key(&self, id: u16) -> Option<Option<u32>> {
        self.paths
            .iter()
            .flatten()
            .find_map(|p| p.req(id).map(|q| q.key))
    }

    /// The (address, rkey) a path holds for chunk `id` (tests of `NEW_RKEY`).
    #[cfg(feature = "testing")]
    pub fn debug_rbuf(&self, path: PathId, id: u16) -> Option<(u64, u32)> {
        self.paths[self.index(path)?].as_ref()?.rbuf(id)
    }

    /// A path's connection epoch (its `recon_cnt`).
    pub fn path_epoch(&self, id: PathId) -> Option<u16> {
        Some(self.paths[self.index(id)?].as_ref()?.epoch())
    }

    /// Connections per path (cid 0 plus the IO connections).
    pub fn conns_per_path(&self) -> u16 {
        self.cfg.io_connections + 1
    }

    /// The number of connections of a path (equal to [`conns_per_path`](Self::conns_per_path)).
    pub fn path_conns(&self, id: PathId) -> Option<u16> {
        Some(self.paths[self.index(id)?].as_ref()?.cid_num())
    }
}

/// Linux stores `max_reconnect_attempts` unsigned: -1 becomes "for ever".
const fn max_reconnect(n: i16) -> u32 {
    if n < 0 { u32::MAX } else { n as u32 }
}
