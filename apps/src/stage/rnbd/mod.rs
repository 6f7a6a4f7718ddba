//! `kind = "rnbd_server"`: block devices served to RNBD clients (ours, `dp-perf blk
//! --client`, or Linux's `rnbd-client`) over RTRS over the configured provider.
//!
//! The stage is one [`RnbdServer`] driven from the stage's lcore: each poll is one
//! [`RnbdServer::poll`] (fabric completions and connection events, the RNBD requests they
//! deliver, the backends' completions), then the counters, then an operator's snapshot if
//! one is wanted (`info.rs`). The devices are made when the stage is built, before any lcore
//! runs: a memory device's region, a file's `io_uring` with its polling kernel thread.
//!
//! Counters: `in_msgs` are RNBD requests received, `out_msgs` requests answered,
//! `conns_opened`/`conns_closed` RTRS sessions that came and went, `dropped` requests
//! refused before RNBD saw them (a hostile or broken client). The server runs until the
//! pipeline stops; on the stop it closes every session's paths and finishes once they are
//! gone (bounded by `[eal] drain_timeout_ms`).
//!
//! `backend.rs` holds [`AnyBackend`], the device types of one server in one type; `info.rs`
//! the operator's snapshot.

mod backend;
mod info;

use std::sync::Arc;

use dataplane::fabric::{Device, Provider};
use dataplane::rnbd::backend::{MemBackend, NullBackend, UringBackend, UringConfig};
use dataplane::rnbd::export::{Exports, SearchPath};
use dataplane::rnbd::rtrs::RnbdServer;
use dataplane::rnbd::wire::AccessMode;
use dataplane::rtrs::fabric::ServerDriver;
use dataplane::rtrs::srv::{Server, ServerConfig};

pub use backend::AnyBackend;

use super::env::{FabricDev, Stage, StageIo};
use super::info::InfoSlot;
use crate::config::{ExportAccess, ExportBackend, RnbdServerDef};
use crate::error::RunError;
use crate::stats::StageStats;

/// The `rnbd_server` stage over provider `P`.
pub struct RnbdStage<P: Provider> {
    srv: RnbdServer<P, AnyBackend>,
    stats: Arc<StageStats>,
    info: Arc<InfoSlot>,
    /// What `info.rs` says of the server that the server does not know.
    about: info::About,
    /// The binding's counters as last published.
    published: (u64, u64, u64),
    sessions: usize,
    closing: bool,
    finished: bool,
}

impl<P: Provider> std::fmt::Debug for RnbdStage<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdStage")
            .field("stage", &self.stats.name)
            .field("server", &self.srv)
            .finish_non_exhaustive()
    }
}

/// Builds the stage on `fabric`: makes the devices and listens.
///
/// # Errors
///
/// [`RunError::Rnbd`] naming the export (file and line) whose device cannot be made, or
/// the listener that cannot be bound.
pub(super) fn server(
    fabric: &FabricDev,
    def: &RnbdServerDef,
    source: &str,
    stats: Arc<StageStats>,
    info: Arc<InfoSlot>,
) -> Result<Box<dyn Stage>, RunError> {
    match fabric {
        FabricDev::Shm(d) => {
            build::<dataplane::fabric::shm::Shm>(Arc::new(d.clone()), def, source, stats, info)
        }
        #[cfg(feature = "verbs")]
        FabricDev::Verbs(d) => {
            build::<dataplane::fabric::verbs::Verbs>(Arc::new(d.clone()), def, source, stats, info)
        }
    }
}

fn build<P: Provider>(
    dev: Arc<P::Device>,
    def: &RnbdServerDef,
    source: &str,
    stats: Arc<StageStats>,
    info: Arc<InfoSlot>,
) -> Result<Box<dyn Stage>, RunError> {
    let fail = |message: String| RunError::Rnbd {
        stage: stats.name.clone(),
        message,
    };
    let depth = usize::from(def.queue_depth);
    let search = SearchPath::new(def.dev_search_path.as_str())
        .map_err(|e| fail(format!("dev_search_path: {e}")))?;
    let mut exports = Exports::new(search);
    for (i, e) in def.exports.iter().enumerate() {
        let at = format!("{source}:{}: export `{}`", e.line, e.name);
        let backend = match &e.backend {
            ExportBackend::Null { size } => AnyBackend::Null(NullBackend::new(*size, depth)),
            ExportBackend::Mem { size } => {
                let region = format!("dpctl-rnbd-{}-{i}", stats.name);
                AnyBackend::Mem(MemBackend::new(&region, *size, depth).map_err(|err| {
                    fail(format!(
                        "{at}: a {size}-byte memory device: {err}; lower `size` or free memory"
                    ))
                })?)
            }
            ExportBackend::File { path } => {
                let cfg = UringConfig {
                    entries: u32::from(def.queue_depth).next_power_of_two().max(32),
                    read_only: e.access == ExportAccess::Ro,
                    ..UringConfig::default()
                };
                AnyBackend::File(UringBackend::open(path, &cfg).map_err(|err| {
                    fail(format!(
                        "{at}: serving {} through io_uring: {err} (the file must exist and be \
                         writable unless access = \"ro\"; a filesystem without O_DIRECT, such \
                         as tmpfs, cannot serve it)",
                        path.display()
                    ))
                })?)
            }
        };
        exports.add(e.path.clone(), backend);
        let id = exports.id_of(&e.path).expect("just added");
        if let Some(d) = exports.by_id_mut(id) {
            d.set_max_access(match e.access {
                ExportAccess::Ro => AccessMode::Ro,
                ExportAccess::Rw => AccessMode::Rw,
                ExportAccess::Migration => AccessMode::Migration,
            });
        }
    }
    let hca = dev.attr().name.clone();
    let drv = ServerDriver::<P>::new(dev, &def.listen).map_err(|err| {
        let addrs: Vec<String> = def.listen.iter().map(ToString::to_string).collect();
        fail(format!(
            "listening on {}: {err} (another server on these ports?)",
            addrs.join(", ")
        ))
    })?;
    let rtrs = Server::new(ServerConfig {
        queue_depth: def.queue_depth,
        chunk_size: crate::config::rnbd_chunk_size(def.max_io),
        always_invalidate: def.always_invalidate,
        ..ServerConfig::default()
    })
    .map_err(|err| fail(format!("the RTRS server: {err}")))?;
    let about = info::About {
        provider: P::NAME,
        hca,
        exports: def
            .exports
            .iter()
            .map(|e| (e.name.clone(), e.access.name()))
            .collect(),
    };
    Ok(Box::new(RnbdStage {
        srv: RnbdServer::new(drv, rtrs, exports),
        stats,
        info,
        about,
        published: (0, 0, 0),
        sessions: 0,
        closing: false,
        finished: false,
    }))
}

impl<P: Provider> RnbdStage<P> {
    /// Publishes the binding's counters; runs when the poll did work, so an idle server
    /// touches no shared cache line.
    fn publish(&mut self) {
        let b = self.srv.stats();
        let answered = b.answered_at_once + b.backend_done + b.bad_requests;
        let (req, ans, bad) = self.published;
        let c = &self.stats.counters;
        if b.requests != req {
            c.in_msgs.add(b.requests - req);
        }
        if answered != ans {
            c.out_msgs.add(answered - ans);
        }
        if b.bad_requests != bad {
            c.dropped.add(b.bad_requests - bad);
        }
        self.published = (b.requests, answered, b.bad_requests);
        let n = self.srv.rtrs().sessions().count();
        if n > self.sessions {
            c.conns_opened.add((n - self.sessions) as u64);
        } else if n < self.sessions {
            c.conns_closed.add((self.sessions - n) as u64);
        }
        self.sessions = n;
    }
}

impl<P: Provider> Stage for RnbdStage<P> {
    fn poll(&mut self, io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let work = self.srv.poll(io.now);
        if work > 0 {
            self.publish();
        }
        if self.info.wanted() {
            if self.info.take_reset() {
                self.srv.reset_rtrs_stats();
            }
            self.info.publish(info::snapshot(&self.srv, &self.about));
        }
        if io.quiesce {
            if !self.closing {
                self.closing = true;
                self.srv.close(io.now);
            }
            if self.srv.rtrs().paths().next().is_none() && self.srv.in_flight() == 0 {
                self.publish();
                self.finished = true;
                self.stats.set_finished();
            }
        }
        work
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}
