//! What the operator commands (`dpctl rds-info`, `rnbd-info`, `rtrs-info`) show of a running
//! stage, taken on the stage's own lcore when the telemetry thread asks.
//!
//! A stage's protocol state belongs to its lcore (`&mut`), so the telemetry thread never
//! touches it: it raises the request flag of the stage's [`InfoSlot`] and waits; the stage
//! sees the flag on its next poll (one relaxed load per poll when nobody asks), writes a
//! snapshot into the slot and lowers the flag. Building the snapshot allocates, on the lcore,
//! once per operator request: control path, not data path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::stats::StageStats;

/// What a stage's snapshots describe, for the telemetry command that lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoKind {
    /// An RDS node (`/rds`): connections, sockets, counters, congestion maps.
    Rds,
    /// An RNBD server (`/rnbd` and `/rtrs`): its snapshot holds an `rnbd` and an `rtrs` part.
    Rnbd,
}

/// The meeting point of one stage and the telemetry thread.
#[derive(Debug)]
pub struct InfoSlot {
    stats: Arc<StageStats>,
    kind: InfoKind,
    want: AtomicBool,
    /// With `want`: reset the stage's resettable counters before the snapshot.
    reset: AtomicBool,
    snap: Mutex<Option<Value>>,
}

impl InfoSlot {
    pub(crate) fn new(stats: Arc<StageStats>, kind: InfoKind) -> Arc<Self> {
        Arc::new(Self {
            stats,
            kind,
            want: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            snap: Mutex::new(None),
        })
    }

    /// The stage's name.
    pub fn stage(&self) -> &str {
        &self.stats.name
    }

    /// What the stage's snapshots describe.
    pub fn kind(&self) -> InfoKind {
        self.kind
    }

    /// Asks the stage for a snapshot and waits up to `timeout` for it. A stage that has
    /// finished is polled no more: its answer says so.
    pub fn query(&self, timeout: Duration) -> Value {
        if self.stats.is_finished() {
            return json!({ "stage": self.stage(), "error": "the stage has finished; it is no longer polled" });
        }
        *self.snap.lock().unwrap_or_else(PoisonError::into_inner) = None;
        // Release/Acquire: pairs with `publish`, which writes the snapshot before lowering
        // the flag.
        self.want.store(true, Ordering::Release);
        let t0 = Instant::now();
        while self.want.load(Ordering::Acquire) {
            if t0.elapsed() > timeout {
                self.want.store(false, Ordering::Relaxed);
                return json!({ "stage": self.stage(), "error": format!("no answer from the stage's lcore within {timeout:?}") });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.snap
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| json!({ "stage": self.stage(), "error": "no snapshot" }))
    }

    /// As [`Self::query`], asking the stage to reset its resettable counters first (an RNBD
    /// server: its RTRS paths' counters, as `stats/reset_all`).
    pub fn query_reset(&self, timeout: Duration) -> Value {
        // Relaxed: published by the Release store of `want` in `query`.
        self.reset.store(true, Ordering::Relaxed);
        let v = self.query(timeout);
        self.reset.store(false, Ordering::Relaxed);
        v
    }

    /// Whether the snapshot asked for (the stage saw [`Self::wanted`]) wants a reset first.
    pub(crate) fn take_reset(&self) -> bool {
        // Acquire fence: pairs with the Release store of `want` that the stage's relaxed
        // load in `wanted` read, so the `reset` stored before it is visible.
        std::sync::atomic::fence(Ordering::Acquire);
        self.reset.swap(false, Ordering::Relaxed)
    }

    /// Whether the telemetry thread is waiting for a snapshot.
    #[inline]
    pub(crate) fn wanted(&self) -> bool {
        // Relaxed: a hint checked every poll; `publish` orders the data.
        self.want.load(Ordering::Relaxed)
    }

    /// Hands `v` over to the waiting telemetry thread. Called from the stage's poll when
    /// [`Self::wanted`].
    pub(crate) fn publish(&self, v: Value) {
        *self.snap.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
        self.want.store(false, Ordering::Release);
    }
}
