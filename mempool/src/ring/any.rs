//! Handles whose synchronisation mode is chosen at run time: [`AnyProducer`] and
//! [`AnyConsumer`], made by [`Ring::with_sync`](super::Ring::with_sync).
//!
//! DPDK picks a ring's modes with creation flags and every operation switches on the side's
//! `sync_type`. The typed handles make that choice at compile time; these enums make it at run
//! time (a mode read from a configuration file, a pool's ring), at the cost of one
//! well-predicted branch per operation. Each variant is the typed handle, so code that knows the
//! mode can match and keep the typed one.

use core::fmt;

use super::consumer::Consumer;
use super::mode::{Hts, Multi, Rts, Single, SyncMode, SyncType};
use super::producer::Producer;
use super::storage::RawRing;

/// A producer handle whose mode was chosen at run time ([`Ring::with_sync`](super::Ring::with_sync)).
///
/// Each operation matches on the mode (one well-predicted branch) and calls the typed
/// [`Producer`]; code that knows the mode can match on the variant and keep the typed handle.
pub enum AnyProducer<T> {
    /// A [`Single`] producer.
    Single(Producer<T, Single>),
    /// A [`Multi`] producer.
    Multi(Producer<T, Multi>),
    /// An [`Rts`] producer.
    Rts(Producer<T, Rts>),
    /// An [`Hts`] producer.
    Hts(Producer<T, Hts>),
}

/// A consumer handle whose mode was chosen at run time ([`Ring::with_sync`](super::Ring::with_sync)).
///
/// As [`AnyProducer`], for the [`Consumer`] side.
pub enum AnyConsumer<T> {
    /// A [`Single`] consumer.
    Single(Consumer<T, Single>),
    /// A [`Multi`] consumer.
    Multi(Consumer<T, Multi>),
    /// An [`Rts`] consumer.
    Rts(Consumer<T, Rts>),
    /// An [`Hts`] consumer.
    Hts(Consumer<T, Hts>),
}

/// Calls `$body` with `$h` bound to the typed handle inside `$any`.
macro_rules! each {
    ($enum:ident, $any:expr, |$h:ident| $body:expr) => {
        match $any {
            $enum::Single($h) => $body,
            $enum::Multi($h) => $body,
            $enum::Rts($h) => $body,
            $enum::Hts($h) => $body,
        }
    };
}

/// `Self::<mode>($make)`: the variant of run-time mode `$mode` holding the typed handle
/// `$make` builds (its mode is inferred from the variant).
macro_rules! by_mode {
    ($mode:expr, $make:expr) => {
        match $mode {
            SyncType::Single => Self::Single($make),
            SyncType::Multi => Self::Multi($make),
            SyncType::Rts => Self::Rts($make),
            SyncType::Hts => Self::Hts($make),
        }
    };
}

/// A clone of a shared side's handle in the same variant; `None` for a [`Single`] side.
macro_rules! clone_shared {
    ($any:expr) => {
        match $any {
            Self::Single(_) => None,
            Self::Multi(h) => Some(Self::Multi(h.clone())),
            Self::Rts(h) => Some(Self::Rts(h.clone())),
            Self::Hts(h) => Some(Self::Hts(h.clone())),
        }
    };
}

impl<T: Copy + Send> AnyProducer<T> {
    /// Reloads the handle's copy of the opposite side's tail (see `Cursor::refresh`).
    #[inline(always)]
    pub(crate) fn refresh_opp_tail(&mut self) {
        each!(Self, self, |h| h.refresh_opp_tail())
    }

    /// A producer of mode `mode` over a validated ring view.
    pub(crate) fn new(ring: RawRing<T>, mode: SyncType) -> Self {
        by_mode!(mode, Producer::new(ring))
    }

    /// The mode of this handle's side.
    pub fn sync_type(&self) -> SyncType {
        each!(Self, self, |h| mode_of(h))
    }

    /// Another handle on the same side for another thread, or `None` for a [`Single`] side
    /// (which has exactly one handle).
    pub fn try_clone(&self) -> Option<Self> {
        clone_shared!(self)
    }

    /// Number of slots in the ring.
    #[inline]
    pub fn capacity(&self) -> usize {
        each!(Self, self, |h| h.capacity())
    }

    /// [`Producer::enqueue`].
    ///
    /// # Errors
    ///
    /// `Err(value)` when no slot is free.
    #[inline]
    pub fn enqueue(&mut self, value: T) -> Result<(), T> {
        each!(Self, self, |h| h.enqueue(value))
    }

    /// [`Producer::enqueue_bulk`]: all of `values` or none.
    #[inline]
    #[must_use = "a bulk enqueue may enqueue nothing; check the count"]
    pub fn enqueue_bulk(&mut self, values: &[T]) -> usize {
        each!(Self, self, |h| h.enqueue_bulk(values))
    }

    /// [`Producer::enqueue_burst`]: as many as fit.
    #[inline]
    #[must_use = "a burst enqueue may enqueue only a prefix; check the count"]
    pub fn enqueue_burst(&mut self, values: &[T]) -> usize {
        each!(Self, self, |h| h.enqueue_burst(values))
    }

    /// [`Producer::free_count`].
    #[inline]
    pub fn free_count(&self) -> usize {
        each!(Self, self, |h| h.free_count())
    }
}

impl<T: Copy + Send> AnyConsumer<T> {
    /// Reloads the handle's copy of the opposite side's tail (see `Cursor::refresh`).
    #[inline(always)]
    pub(crate) fn refresh_opp_tail(&mut self) {
        each!(Self, self, |h| h.refresh_opp_tail())
    }

    /// Sets the handle's copy of the opposite side's tail `ahead` counters past the real
    /// one, as a copy 2^32 - `ahead` counters old reads (tests of stale copies).
    #[cfg(test)]
    pub(crate) fn alias_cached_opp_tail(&mut self, ahead: u32) {
        each!(Self, self, |h| h.alias_cached_opp_tail(ahead))
    }

    /// A consumer of mode `mode` over a validated ring view.
    pub(crate) fn new(ring: RawRing<T>, mode: SyncType) -> Self {
        by_mode!(mode, Consumer::new(ring))
    }

    /// The mode of this handle's side.
    pub fn sync_type(&self) -> SyncType {
        each!(Self, self, |h| mode_of(h))
    }

    /// Another handle on the same side for another thread, or `None` for a [`Single`] side.
    pub fn try_clone(&self) -> Option<Self> {
        clone_shared!(self)
    }

    /// Number of slots in the ring.
    #[inline]
    pub fn capacity(&self) -> usize {
        each!(Self, self, |h| h.capacity())
    }

    /// [`Consumer::dequeue`].
    #[inline]
    #[must_use = "a dequeued element is gone from the ring"]
    pub fn dequeue(&mut self) -> Option<T> {
        each!(Self, self, |h| h.dequeue())
    }

    /// [`Consumer::dequeue_bulk`]: all of `out` or nothing.
    #[inline]
    #[must_use = "a bulk dequeue may dequeue nothing; check the count"]
    pub fn dequeue_bulk(&mut self, out: &mut [T]) -> usize {
        each!(Self, self, |h| h.dequeue_bulk(out))
    }

    /// [`Consumer::dequeue_burst`]: as many as are available.
    #[inline]
    #[must_use = "the count says how much of `out` was filled"]
    pub fn dequeue_burst(&mut self, out: &mut [T]) -> usize {
        each!(Self, self, |h| h.dequeue_burst(out))
    }

    /// [`Consumer::len`].
    #[inline]
    pub fn len(&self) -> usize {
        each!(Self, self, |h| h.len())
    }

    /// [`Consumer::is_empty`].
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The mode of a typed handle, from its type.
fn mode_of<H: HasMode>(_: &H) -> SyncType {
    H::TYPE
}

/// Typed handles know their mode.
trait HasMode {
    const TYPE: SyncType;
}

impl<T, M: SyncMode> HasMode for Producer<T, M> {
    const TYPE: SyncType = M::TYPE;
}

impl<T, M: SyncMode> HasMode for Consumer<T, M> {
    const TYPE: SyncType = M::TYPE;
}

impl<T> fmt::Debug for AnyProducer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        each!(Self, self, |h| f
            .debug_tuple("AnyProducer")
            .field(h)
            .finish())
    }
}

impl<T> fmt::Debug for AnyConsumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        each!(Self, self, |h| f
            .debug_tuple("AnyConsumer")
            .field(h)
            .finish())
    }
}
