//! Synchronisation modes of a ring side: as types ([`Single`], [`Multi`], [`Rts`], [`Hts`]) for
//! the handles, and as a value ([`SyncType`]) for headers, errors and run-time selection.

use core::fmt;
use core::str::FromStr;

mod sealed {
    /// Keeps [`super::SyncMode`] closed: the ring code handles exactly these four modes.
    pub trait Sealed {}
    impl Sealed for super::Single {}
    impl Sealed for super::Multi {}
    impl Sealed for super::Rts {}
    impl Sealed for super::Hts {}
}

/// How the threads that share one side (producer or consumer) of a ring synchronise: DPDK's
/// `enum rte_ring_sync_type`, chosen per side like DPDK's ring flags.
///
/// | value | DPDK | threads | claim | publish | a thread preempted mid-operation |
/// |-------|------|---------|-------|---------|----------------------------------|
/// | [`Single`](SyncType::Single) | `RTE_RING_SYNC_ST` (`RING_F_SP_ENQ`/`RING_F_SC_DEQ`) | one | local head | store the tail | blocks nobody on its side |
/// | [`Multi`](SyncType::Multi) | `RTE_RING_SYNC_MT` (default) | any | CAS the head | wait for the tail to reach our start, store it | blocks every later claimant of the side |
/// | [`Rts`](SyncType::Rts) | `RTE_RING_SYNC_MT_RTS` (`RING_F_MP_RTS_ENQ`/`RING_F_MC_RTS_DEQ`) | any | CAS head and op count | CAS the tail's finish count; the last finisher moves the tail | lets the others go on until the head is `capacity / 8` ahead of the tail |
/// | [`Hts`](SyncType::Hts) | `RTE_RING_SYNC_MT_HTS` (`RING_F_MP_HTS_ENQ`/`RING_F_MC_HTS_DEQ`) | any | wait for head == tail, CAS both in one word | store both | blocks every other thread of the side |
///
/// The handles carry the mode as a type ([`SyncMode`]), so the choice costs nothing at run
/// time; [`AnyProducer`](super::AnyProducer) and [`AnyConsumer`](super::AnyConsumer) take it as
/// this value instead, for modes read from a configuration. The header of every ring records
/// the mode of each side, and attaching with another mode fails with
/// [`RingError::ModeMismatch`](super::RingError::ModeMismatch).
///
/// `FromStr` accepts the names (`single`, `multi`, `rts`, `hts`) and DPDK's (`st`, `mt`,
/// `mt_rts`, `mt_hts`).
///
/// ```
/// use mempool::ring::SyncType;
///
/// assert_eq!("rts".parse::<SyncType>(), Ok(SyncType::Rts));
/// assert_eq!("mt_hts".parse::<SyncType>(), Ok(SyncType::Hts));
/// assert_eq!(SyncType::Multi.to_string(), "multi");
/// assert!(SyncType::Hts.is_shared() && !SyncType::Single.is_shared());
/// let err = "mpmc".parse::<SyncType>().unwrap_err();
/// assert!(err.to_string().contains("single, multi, rts or hts"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyncType {
    /// One thread at a time ([`Single`]).
    Single,
    /// Any number of threads; claims by CAS, publication in claim order ([`Multi`]).
    Multi,
    /// Any number of threads; relaxed tail sync ([`Rts`]).
    Rts,
    /// Any number of threads; head/tail sync, one operation at a time ([`Hts`]).
    Hts,
}

impl SyncType {
    /// Every mode, in the order of the table above.
    pub const ALL: [Self; 4] = [Self::Single, Self::Multi, Self::Rts, Self::Hts];

    /// The lower-case name: `single`, `multi`, `rts` or `hts`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Multi => "multi",
            Self::Rts => "rts",
            Self::Hts => "hts",
        }
    }

    /// Whether several threads may use the side (every mode but [`SyncType::Single`]); handles
    /// of such sides are `Clone`.
    pub const fn is_shared(self) -> bool {
        !matches!(self, Self::Single)
    }

    /// The value stored in a ring header for this mode.
    pub(crate) const fn id(self) -> u32 {
        match self {
            Self::Single => 1,
            Self::Multi => 2,
            Self::Rts => 3,
            Self::Hts => 4,
        }
    }

    /// The mode stored as `id` in a header, if it is one.
    pub(crate) fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.id() == id)
    }
}

impl fmt::Display for SyncType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no [`SyncType`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown ring sync mode; use single, multi, rts or hts (or DPDK's st, mt, mt_rts, mt_hts)")]
pub struct ParseSyncTypeError;

impl FromStr for SyncType {
    type Err = ParseSyncTypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "single" | "st" => Self::Single,
            "multi" | "mt" => Self::Multi,
            "rts" | "mt_rts" => Self::Rts,
            "hts" | "mt_hts" => Self::Hts,
            _ => return Err(ParseSyncTypeError),
        })
    }
}

/// How many threads may use one side (producer or consumer) of a ring at once, and how they
/// synchronise: one of [`Single`], [`Multi`], [`Rts`] and [`Hts`] (see [`SyncType`] for the
/// comparison).
///
/// The mode is a type parameter of [`Producer`](super::Producer) and
/// [`Consumer`](super::Consumer), so the choice of path is made at compile time and costs
/// nothing at run time. It is also recorded in the ring header, and attaching with another mode
/// fails with [`RingError::ModeMismatch`](super::RingError::ModeMismatch).
pub trait SyncMode: sealed::Sealed + Send + Sync + 'static {
    /// The mode as a value.
    const TYPE: SyncType;
    /// `true` for the modes a side may be shared in ([`Multi`], [`Rts`], [`Hts`]).
    const MULTI: bool = Self::TYPE.is_shared();
    /// Value stored in the ring header for this mode.
    const ID: u32 = Self::TYPE.id();
    /// Human-readable name, used in errors and `Debug` output.
    const NAME: &'static str = Self::TYPE.name();
}

/// The modes whose handles may be cloned, one clone per thread: [`Multi`], [`Rts`], [`Hts`].
pub trait SharedMode: SyncMode {}

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
/// [module docs](super#multi-producer--multi-consumer-path)). Handles are `Clone`: give every
/// thread its own clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Multi {}

/// Any number of threads share this side with relaxed tail sync: DPDK's RTS
/// (`RING_F_MP_RTS_ENQ`/`RING_F_MC_RTS_DEQ`).
///
/// Head and tail each carry a count of operations next to the position. A thread claims by a
/// CAS of head and count; on finishing it increments the tail's count by a CAS, and the thread
/// whose increment makes the counts equal (the last one in flight) moves the tail position to
/// the head. Nobody waits for a predecessor to finish, so a thread preempted mid-operation only
/// delays publication; the others keep claiming until the head runs `capacity / 8` slots ahead
/// of the tail (DPDK's default `htd_max`). See the [module docs](super#rts-and-hts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rts {}

/// Any number of threads share this side with head/tail sync: DPDK's HTS
/// (`RING_F_MP_HTS_ENQ`/`RING_F_MC_HTS_DEQ`).
///
/// Head and tail share one 64-bit word; a thread claims only when the two are equal (no
/// operation in flight) by a CAS of the whole word, and publishes by storing it with head and
/// tail equal again. Operations on the side are fully serialised. See the
/// [module docs](super#rts-and-hts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hts {}

impl SyncMode for Single {
    const TYPE: SyncType = SyncType::Single;
}

impl SyncMode for Multi {
    const TYPE: SyncType = SyncType::Multi;
}

impl SyncMode for Rts {
    const TYPE: SyncType = SyncType::Rts;
}

impl SyncMode for Hts {
    const TYPE: SyncType = SyncType::Hts;
}

impl SharedMode for Multi {}
impl SharedMode for Rts {}
impl SharedMode for Hts {}

/// Name of the mode stored as `id` in a header, for error messages.
pub(crate) fn mode_name(id: u32) -> &'static str {
    SyncType::from_id(id).map_or("an unknown mode", SyncType::name)
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
