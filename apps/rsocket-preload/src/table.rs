//! The descriptor table: what this library knows of each of the program's descriptors.
//!
//! One word per descriptor number below [`MAX_FD`] (higher numbers are never routed: they
//! stay kernel sockets), holding an [`Entry`]: the state of the descriptor, the program's
//! `O_NONBLOCK`, and the rsocket behind it once it moved. A state change is one
//! compare-and-swap, so threads sharing a descriptor agree on its state without a lock;
//! the one transition that does work (moving a connection to rsockets) first swaps the
//! state to [`Kind::Busy`], and other threads wait for it to finish.
//!
//! Every descriptor the program sees is a kernel descriptor: a TCP socket stays open behind
//! a descriptor whose connection moved to rsockets (its placeholder), so the number is
//! never reused while the program holds it, `getsockname`/`getpeername` tell the truth,
//! and `fcntl` flags other than `O_NONBLOCK` have somewhere to live.
//!
//! Several descriptors may name one rsocket after `dup`: [`Refs`] counts them, indexed by
//! the rsocket's handle (itself a descriptor number, so below [`MAX_FD`] too).

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Descriptors at or above this number are never routed.
pub(crate) const MAX_FD: usize = 1 << 16;

/// The state of one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A TCP socket (`AF_INET`/`AF_INET6`, `SOCK_STREAM`), neither connected nor listening.
    Socket = 1,
    /// A kernel TCP listener: what it accepts is routed.
    Listener = 2,
    /// Accepted; moves to rsockets on first use (this side offers).
    Passive = 3,
    /// Connected; moves to rsockets on first use (this side answers the offer).
    Active = 4,
    /// On rsockets: [`Entry::handle`] is the rsocket.
    Rs = 5,
    /// Moved to rsockets in another process before a fork: unusable here.
    Foreign = 6,
    /// Moving it to rsockets failed (a hostile or vanished peer): it only fails.
    Broken = 7,
    /// Being moved to rsockets by some thread.
    Busy = 8,
}

impl Kind {
    fn from_bits(v: u64) -> Option<Self> {
        Some(match v {
            1 => Self::Socket,
            2 => Self::Listener,
            3 => Self::Passive,
            4 => Self::Active,
            5 => Self::Rs,
            6 => Self::Foreign,
            7 => Self::Broken,
            8 => Self::Busy,
            _ => return None,
        })
    }

    /// True for the states whose descriptor is a placeholder kept blocking (its connection
    /// is, or will be, carried elsewhere), so the program's `O_NONBLOCK` is only recorded.
    pub(crate) fn is_placeholder(self) -> bool {
        !matches!(self, Self::Socket | Self::Listener)
    }
}

/// What the table says of one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Its state.
    pub kind: Kind,
    /// The program asked for `O_NONBLOCK`.
    pub nonblock: bool,
    /// The rsocket, for [`Kind::Rs`] (else 0).
    pub handle: i32,
}

impl Entry {
    /// An entry without an rsocket.
    pub(crate) fn new(kind: Kind, nonblock: bool) -> Self {
        Self {
            kind,
            nonblock,
            handle: 0,
        }
    }

    fn bits(self) -> u64 {
        (self.kind as u64) << 32 | u64::from(self.nonblock) << 40 | u64::from(self.handle as u32)
    }

    fn from_bits(v: u64) -> Option<Self> {
        Some(Self {
            kind: Kind::from_bits((v >> 32) & 0xff)?,
            nonblock: v >> 40 & 1 != 0,
            handle: v as u32 as i32,
        })
    }
}

static SLOTS: [AtomicU64; MAX_FD] = [const { AtomicU64::new(0) }; MAX_FD];
/// One past the highest descriptor ever entered (bounds the fork-time scan).
static HIGH: AtomicUsize = AtomicUsize::new(0);

fn slot(fd: i32) -> Option<&'static AtomicU64> {
    usize::try_from(fd).ok().and_then(|i| SLOTS.get(i))
}

/// The entry of `fd`, if it is routed at all.
pub(crate) fn get(fd: i32) -> Option<Entry> {
    // T1: Acquire pairs with the Release of T2/T3: an rsocket handle published by the
    // thread that moved the connection is complete (the rsocket library synchronizes its
    // own state; this orders the handle's creation before its use here).
    slot(fd).and_then(|s| Entry::from_bits(s.load(Ordering::Acquire)))
}

/// Enters `fd` (replacing whatever a descriptor of that number was before).
pub(crate) fn set(fd: i32, e: Entry) {
    if let Some(s) = slot(fd) {
        // T2: Release pairs with T1.
        s.store(e.bits(), Ordering::Release);
        // Relaxed: HIGH only bounds a scan done in a single-threaded fork child.
        HIGH.fetch_max(fd as usize + 1, Ordering::Relaxed);
    }
}

/// Removes `fd`; returns what it was.
pub(crate) fn take(fd: i32) -> Option<Entry> {
    // T3: AcqRel: Acquire as T1 (the handle is used to close it), Release as T2.
    slot(fd).and_then(|s| Entry::from_bits(s.swap(0, Ordering::AcqRel)))
}

/// Swaps `fd` from `from` to `to`; false if it was no longer `from`.
pub(crate) fn swap(fd: i32, from: Entry, to: Entry) -> bool {
    // T3 again: AcqRel, pairs with T1/T2.
    slot(fd).is_some_and(|s| {
        s.compare_exchange(from.bits(), to.bits(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// Records the program's `O_NONBLOCK` for `fd`; false if `fd` is not routed.
pub(crate) fn set_nonblock(fd: i32, on: bool) -> bool {
    loop {
        let Some(e) = get(fd) else { return false };
        if swap(fd, e, Entry { nonblock: on, ..e }) {
            return true;
        }
    }
}

/// One past the highest descriptor ever entered.
pub(crate) fn high() -> i32 {
    // Relaxed: a bound for a scan; descriptors entered meanwhile are the caller's race.
    HIGH.load(Ordering::Relaxed).min(MAX_FD) as i32
}

/// In the child after fork(): connections that moved to rsockets belong to the parent.
pub(crate) fn fork_child() {
    // Relaxed: the child of fork() has one thread.
    for s in &SLOTS[..HIGH.load(Ordering::Relaxed).min(MAX_FD)] {
        let Some(e) = Entry::from_bits(s.load(Ordering::Relaxed)) else {
            continue;
        };
        let kind = match e.kind {
            Kind::Rs => Kind::Foreign,
            Kind::Busy => Kind::Broken,
            _ => continue,
        };
        s.store(Entry::new(kind, e.nonblock).bits(), Ordering::Relaxed);
    }
}

/// How many descriptors name each rsocket (indexed by handle).
pub(crate) struct Refs;

static REFS: [AtomicU32; MAX_FD] = [const { AtomicU32::new(0) }; MAX_FD];

impl Refs {
    /// A new rsocket named by one descriptor.
    pub(crate) fn init(h: i32) {
        if let Some(r) = usize::try_from(h).ok().and_then(|i| REFS.get(i)) {
            // Relaxed: a count; the rsocket itself is published through the table (T2).
            r.store(1, Ordering::Relaxed);
        }
    }

    /// One more descriptor names `h`.
    pub(crate) fn add(h: i32) {
        if let Some(r) = usize::try_from(h).ok().and_then(|i| REFS.get(i)) {
            // Relaxed: as in init.
            r.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One descriptor fewer names `h`; true if it was the last (close the rsocket).
    pub(crate) fn drop_one(h: i32) -> bool {
        usize::try_from(h)
            .ok()
            .and_then(|i| REFS.get(i))
            // AcqRel: the last one out sees every other closer's decrement first.
            .is_none_or(|r| r.fetch_sub(1, Ordering::AcqRel) <= 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trips_through_its_word() {
        for kind in [Kind::Socket, Kind::Rs, Kind::Busy] {
            for nonblock in [false, true] {
                let e = Entry {
                    kind,
                    nonblock,
                    handle: 65_535,
                };
                assert_eq!(Entry::from_bits(e.bits()), Some(e));
            }
        }
        assert_eq!(Entry::from_bits(0), None);
    }

    #[test]
    fn fork_child_turns_moved_connections_foreign_and_keeps_the_rest() {
        set(
            70,
            Entry {
                handle: 9,
                ..Entry::new(Kind::Rs, true)
            },
        );
        set(71, Entry::new(Kind::Passive, false));
        fork_child();
        assert_eq!(get(70), Some(Entry::new(Kind::Foreign, true)));
        assert_eq!(get(71), Some(Entry::new(Kind::Passive, false)));
        assert_eq!(get(1 << 20), None);
        take(70);
        take(71);
    }

    #[test]
    fn the_last_reference_closes() {
        Refs::init(80);
        Refs::add(80);
        assert!(!Refs::drop_one(80));
        assert!(Refs::drop_one(80));
    }
}
