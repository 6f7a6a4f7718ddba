//! [`RnbdClient`]: an RNBD client session on an RTRS client session over a fabric provider.
//!
//! One lcore owns it. [`RnbdClient::poll`] moves the fabric, hands RTRS completions to the
//! RNBD session (with the answer bytes of session-info and open requests), follows the RTRS
//! session's paths (the session is told when its last path is lost and when one is back, so
//! it remaps its devices) and retries requests that waited for a permit.
//! [`RnbdClient::session`] gives the RNBD session with its transport for `map`, `read`,
//! `write`, `flush` and `discard`; their outcomes come from the session's `poll_event`.
//!
//! A request's permit is its RTRS chunk; the permit id also names the request's slot here
//! and its answer buffer, so nothing is allocated per IO.

use std::sync::Arc;

use dp_fabric::Provider;
use dp_rtrs::clt::{ClientEvent as RtrsEvent, ClientSession as RtrsSession, DataRef, Request};
use dp_rtrs::error::{IoError, PathError};
use dp_rtrs::fabric::ClientDriver;
use dp_rtrs::permit::{ConType, Permit, Permits, Wait};
use dp_rtrs::timer::Instant;
use dp_rtrs::work::Dir as RtrsDir;
use mempool::memory::{Region, RegionConfig};

use crate::client::{ClientSession, ClientTransport, Con, Payload, SubmitError};
use crate::server::Dir;

/// Room for one answer (session-info and open responses; the largest is 512 bytes).
pub const ANSWER_MAX: u32 = 512;

/// Why the binding could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The answer buffers could not be allocated or registered.
    #[error("answer buffers: {0}")]
    Memory(String),
}

/// A request in flight, in the slot of its permit.
#[derive(Debug)]
struct Slot {
    permit: Permit,
    tag: u64,
    answer: u32,
}

/// The state [`RtrsTransport`] works on (everything but the RNBD session).
struct Link<P: Provider> {
    drv: ClientDriver<P>,
    rtrs: RtrsSession,
    slots: Vec<Option<Slot>>,
    answers: Arc<Region>,
    answers_id: u32,
}

/// RNBD on an RTRS client session: the session, its transport, and their driver.
pub struct RnbdClient<P: Provider> {
    link: Link<P>,
    rnbd: ClientSession,
    paths_up: usize,
    down: bool,
    open_error: Option<PathError>,
    /// Where a completion's answer is copied (session-info and open answers; an IO's is
    /// empty): kept, not zeroed on the stack for every completion (only the answer's
    /// bytes are read).
    answer: [u8; ANSWER_MAX as usize],
}

/// The RNBD session's transport: requests go out as RTRS requests under a fresh permit.
pub struct RtrsTransport<'a, P: Provider> {
    link: &'a mut Link<P>,
    now: Instant,
}

impl<P: Provider> RnbdClient<P> {
    /// Binds an RNBD session to `rtrs`, driven by `drv` (made for at most `queue_depth`
    /// permits: its `ClientDriverConfig::max_queue_depth`). Open the RTRS session with
    /// [`RnbdClient::open`]; the RNBD session starts when RTRS reports it open.
    ///
    /// # Errors
    /// [`BindError`] if the answer buffers cannot be registered.
    pub fn new(
        mut drv: ClientDriver<P>,
        rtrs: RtrsSession,
        queue_depth: u16,
        max_io: u32,
    ) -> Result<Self, BindError> {
        // One answer slot per permit the driver can carry.
        let len = usize::from(queue_depth.max(1)) * ANSWER_MAX as usize;
        let answers = Region::new(
            &RegionConfig::new("rnbd-answers", len)
                .shareable(true)
                .quiet(),
        )
        .map_err(|e| BindError::Memory(e.to_string()))?;
        let answers = Arc::new(answers);
        let answers_id = drv
            .add_region(Arc::clone(&answers))
            .map_err(|e| BindError::Memory(e.to_string()))?;
        Ok(Self {
            link: Link {
                drv,
                rtrs,
                slots: Vec::new(),
                answers,
                answers_id,
            },
            rnbd: ClientSession::new(max_io),
            paths_up: 0,
            down: false,
            open_error: None,
            answer: [0; ANSWER_MAX as usize],
        })
    }

    /// Opens the RTRS session over one path per UUID (the driver's routes, in order).
    ///
    /// # Errors
    /// What RTRS refused.
    pub fn open(
        &mut self,
        now: Instant,
        paths: &[[u8; 16]],
    ) -> Result<(), dp_rtrs::error::RtrsError> {
        self.link
            .rtrs
            .open(now, paths, &mut self.link.drv)
            .map(|_| ())
    }

    /// Why the RTRS session failed to open, once it has (every path is closed then; make a
    /// new client to try again).
    pub fn open_error(&self) -> Option<PathError> {
        self.open_error
    }

    /// The RTRS session (paths, stats).
    pub fn rtrs(&self) -> &RtrsSession {
        &self.link.rtrs
    }

    /// The RTRS session, mutably (add or remove paths: pass [`RnbdClient::driver_mut`]).
    pub fn rtrs_mut(&mut self) -> (&mut RtrsSession, &mut ClientDriver<P>) {
        (&mut self.link.rtrs, &mut self.link.drv)
    }

    /// The fabric driver (stats, registrations).
    pub fn driver_mut(&mut self) -> &mut ClientDriver<P> {
        &mut self.link.drv
    }

    /// The RNBD session with its transport, for `map`, `read`, `write`, ...
    pub fn session(&mut self, now: Instant) -> (&mut ClientSession, RtrsTransport<'_, P>) {
        (
            &mut self.rnbd,
            RtrsTransport {
                link: &mut self.link,
                now,
            },
        )
    }

    /// The RNBD session, for its events and state.
    pub fn rnbd(&mut self) -> &mut ClientSession {
        &mut self.rnbd
    }

    /// One turn of the loop. Returns the work done (0: idle).
    pub fn poll(&mut self, now: Instant) -> usize {
        let mut work = self.link.drv.poll(now, &mut self.link.rtrs);
        while let Some(ev) = self.link.rtrs.poll_event() {
            work += 1;
            let mut t = RtrsTransport {
                link: &mut self.link,
                now,
            };
            match ev {
                RtrsEvent::Completed { id, ctx, result } => {
                    let Some(n) = t.release(id, ctx, &mut self.answer) else {
                        continue;
                    };
                    let status = result.map_or_else(IoError::errno, |()| 0);
                    self.rnbd.complete(ctx, status, &self.answer[..n], &mut t);
                }
                RtrsEvent::Opened { max_io_size, .. } => {
                    self.paths_up = self.paths_up.max(1);
                    self.rnbd.set_max_io(max_io_size);
                    // A failure leaves the session not ready; its event says why.
                    let _ = self.rnbd.start(&mut t);
                }
                RtrsEvent::OpenFailed { error, .. } => self.open_error = Some(error),
                RtrsEvent::PathUp { .. } => {
                    self.paths_up += 1;
                    if self.down {
                        self.down = false;
                        self.rnbd.link_up(&mut t);
                    }
                }
                RtrsEvent::PathDown { .. } => {
                    self.paths_up = self.paths_up.saturating_sub(1);
                    if self.paths_up == 0 && !self.down {
                        self.down = true;
                        self.rnbd.link_down();
                    }
                }
                _ => {}
            }
        }
        let mut t = RtrsTransport {
            link: &mut self.link,
            now,
        };
        self.rnbd.pump(&mut t);
        work
    }
}

impl<P: Provider> RtrsTransport<'_, P> {
    /// Frees the slot of permit `id` if it carries `tag`; copies its answer into `out` and
    /// returns the answer's length.
    fn release(&mut self, id: u16, tag: u64, out: &mut [u8]) -> Option<usize> {
        let l = &mut *self.link;
        let slot = l
            .slots
            .get_mut(usize::from(id))
            .and_then(|s| s.take_if(|s| s.tag == tag))?;
        let n = (slot.answer as usize).min(out.len());
        if n > 0 {
            let at = usize::from(id) * ANSWER_MAX as usize;
            l.answers.copy_out(at, &mut out[..n]);
        }
        if let Some(p) = l.rtrs.permits() {
            p.put(slot.permit);
        }
        Some(n)
    }
}

impl<P: Provider> ClientTransport for RtrsTransport<'_, P> {
    fn submit(
        &mut self,
        tag: u64,
        con: Con,
        dir: Dir,
        usr: &[u8],
        payload: Payload,
    ) -> Result<(), SubmitError> {
        let l = &mut *self.link;
        let permits: Arc<Permits> = Arc::clone(l.rtrs.permits().ok_or(SubmitError::NoPath)?);
        let con = match con {
            Con::Admin => ConType::Admin,
            Con::Io => ConType::Io,
        };
        let permit = permits.get(con, 0, Wait::NoWait).ok_or(SubmitError::Busy)?;
        let id = permit.id();
        let (data, answer) = match payload {
            Payload::None => (None, 0),
            Payload::Answer(n) if n > ANSWER_MAX => {
                permits.put(permit);
                return Err(SubmitError::TooLarge);
            }
            Payload::Answer(n) => (
                Some(DataRef {
                    region: l.answers_id,
                    offset: u64::from(id) * u64::from(ANSWER_MAX),
                    len: n,
                }),
                n,
            ),
            Payload::Data(b) => (
                Some(DataRef {
                    region: b.region,
                    offset: b.offset,
                    len: b.len,
                }),
                0,
            ),
        };
        let dir = match dir {
            Dir::Read => RtrsDir::Read,
            Dir::Write => RtrsDir::Write,
        };
        let req = Request {
            dir,
            usr,
            data,
            ctx: tag,
        };
        if let Err(e) = l.rtrs.request(self.now, &permit, req, &mut l.drv) {
            permits.put(permit);
            return Err(match e {
                IoError::MsgSize => SubmitError::TooLarge,
                IoError::Busy => SubmitError::Busy,
                _ => SubmitError::NoPath,
            });
        }
        let i = usize::from(id);
        if l.slots.len() <= i {
            l.slots.resize_with(i + 1, || None);
        }
        l.slots[i] = Some(Slot {
            permit,
            tag,
            answer,
        });
        Ok(())
    }
}

impl<P: Provider> core::fmt::Debug for RnbdClient<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RnbdClient")
            .field("rnbd", &self.rnbd)
            .field("paths_up", &self.paths_up)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl<P: Provider> core::fmt::Debug for RtrsTransport<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RtrsTransport")
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}
