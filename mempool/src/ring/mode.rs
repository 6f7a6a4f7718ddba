//! Type-level synchronisation modes of a ring side.

use core::fmt;

mod sealed {
    /// Keeps [`super::SyncMode`] closed: the ring code relies on there being exactly two modes.
    pub trait Sealed {}
    impl Sealed for super::Single {}
    impl Sealed for super::Multi {}
}

/// How many threads may use one side (producer or consumer) of a ring at once.
///
/// Implemented only by [`Single`] and [`Multi`]. The mode is a type parameter of
/// [`Producer`](super::Producer) and [`Consumer`](super::Consumer), so the choice between the
/// single-thread fast path and the CAS path is made at compile time and costs nothing at run time.
/// It is also recorded in the ring header, and attaching with the other mode fails with
/// [`RingError::ModeMismatch`](super::RingError::ModeMismatch).
pub trait SyncMode: sealed::Sealed + Send + Sync + 'static {
    /// `true` for [`Multi`].
    const MULTI: bool;
    /// Value stored in the ring header for this mode.
    const ID: u32;
    /// Human-readable name, used in errors and `Debug` output.
    const NAME: &'static str;
}

/// Exactly one thread (in one process) uses this side at a time: DPDK's SP/SC.
///
/// The handle owns its side's index outright. It keeps the index in a local field, keeps a cached
/// copy of the opposite side's tail, and touches shared memory only to publish its tail and,
/// when the cache says the ring may be full (or empty), to refresh the cached copy. Single-mode
/// handles are not `Clone`; move them to the thread that uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Single {}

/// Any number of threads (in any number of processes) share this side: DPDK's MP/MC.
///
/// Each thread claims a range of slots with a compare-and-swap on the side's head, copies, then
/// waits for earlier claimants to publish before moving the tail (see the
/// [module docs](super#multi-producer--multi-consumer-path)). Multi-mode handles are `Clone`:
/// give every thread its own clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Multi {}

impl SyncMode for Single {
    const MULTI: bool = false;
    const ID: u32 = 1;
    const NAME: &'static str = "single";
}

impl SyncMode for Multi {
    const MULTI: bool = true;
    const ID: u32 = 2;
    const NAME: &'static str = "multi";
}

/// Name of the mode stored as `id` in a header, for error messages.
pub(crate) fn mode_name(id: u32) -> &'static str {
    match id {
        Single::ID => Single::NAME,
        Multi::ID => Multi::NAME,
        _ => "an unknown mode",
    }
}

/// One side of a ring; used in [`RingError::ModeMismatch`](super::RingError::ModeMismatch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The enqueue side.
    Producer,
    /// The dequeue side.
    Consumer,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Producer => "producer",
            Self::Consumer => "consumer",
        })
    }
}
