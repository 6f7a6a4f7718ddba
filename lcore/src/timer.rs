//! Per-lcore timers: a binary min-heap of deadlines with O(1) cancel and no allocation after
//! construction.
//!
//! Timers are data, not callbacks: a timer is a [`TimerId`], a deadline and a caller-chosen
//! `u64` token. When a deadline passes, [`Timers::pop_expired`] hands back a [`TimerEvent`] and
//! the owner decides what to do; in a [`PollLoop`](crate::PollLoop) that is the loop's timer
//! handler. The poll loop checks timers once every
//! [`LoopConfig::timer_interval`](crate::LoopConfig::timer_interval) iterations, so a timer
//! fires at the first check at or after its deadline (DPDK's `rte_timer_manage` at a set
//! resolution).
//!
//! # Structure and invariants
//!
//! - `slots` is a fixed table (capacity chosen at construction). A slot is free or armed; a free
//!   slot sits on an intrusive free list. Each slot has a generation that is bumped whenever
//!   it is freed, so a stale [`TimerId`] never matches a reused slot.
//! - The heap holds `(deadline, seq, slot)` entries. An entry is *live* iff its slot is armed
//!   and the slot's `seq` equals the entry's; cancel and reset only change the slot, leaving a
//!   *stale* entry behind that `pop_expired`/`next_deadline` skip. `seq` is unique per push, so
//!   equal deadlines pop in arming order.
//! - The heap's capacity is twice the slot count. When a push finds it full, stale entries are
//!   removed in place (`retain`); at most `capacity` entries are live, so that frees at least
//!   half the heap, which bounds the amortised cost and means the heap never reallocates.
//!
//! ```
//! use std::time::Duration;
//! use lcore::Timers;
//! use lcore::time::Instant;
//!
//! let mut timers = Timers::with_capacity(16);
//! let rto = timers.arm(Instant::from_millis(5), 1)?;
//! timers.arm_periodic(Instant::from_millis(2), Duration::from_millis(2), 2)?;
//! assert!(timers.cancel(rto));
//! let due: Vec<u64> =
//!     std::iter::from_fn(|| timers.pop_expired(Instant::from_millis(4))).map(|e| e.token).collect();
//! assert_eq!(due, vec![2], "the periodic timer, once, reporting one overrun");
//! assert_eq!(timers.next_deadline(), Some(Instant::from_millis(6)));
//! # Ok::<(), lcore::TimerError>(())
//! ```

use std::collections::BinaryHeap;
use std::time::Duration;

use crate::time::{Instant, duration_to_nanos};

/// Identifies an armed timer. Stays valid across [`Timers::reset`] and periodic re-arming;
/// becomes stale when the timer is cancelled or a one-shot timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId {
    slot: u32,
    generation: u32,
}

/// A timer whose deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerEvent {
    /// The timer. For a one-shot timer it is already stale (the slot was freed before the event
    /// was returned, so the handler may arm new timers); a periodic timer stays armed.
    pub id: TimerId,
    /// The token given when arming.
    pub token: u64,
    /// The deadline that passed (not the time it was noticed).
    pub deadline: Instant,
    /// For periodic timers: how many further periods also elapsed before this check and were
    /// folded into this event (like `timerfd` overruns). Always 0 for one-shot timers.
    pub overruns: u64,
}

/// Why a timer could not be armed.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimerError {
    /// All slots are armed.
    #[error("all {capacity} timer slots are armed; raise LoopConfig::timer_capacity")]
    Full {
        /// The table's capacity.
        capacity: usize,
    },
    /// A periodic timer was given a zero period.
    #[error("a periodic timer needs a non-zero period")]
    ZeroPeriod,
}

#[derive(Debug, Clone, Copy)]
enum SlotState {
    Free {
        next_free: u32,
    },
    Armed {
        deadline: Instant,
        period_ns: u64,
        token: u64,
        seq: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    generation: u32,
    state: SlotState,
}

/// Heap entry, ordered so that `BinaryHeap` (a max-heap) pops the earliest deadline first and,
/// among equal deadlines, the earliest armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    deadline: Instant,
    seq: u64,
    slot: u32,
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        (other.deadline, other.seq).cmp(&(self.deadline, self.seq))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

const NO_SLOT: u32 = u32::MAX;

/// A fixed-capacity timer table; see the [module docs](self).
#[derive(Debug)]
pub struct Timers {
    heap: BinaryHeap<Entry>,
    slots: Box<[Slot]>,
    free_head: u32,
    armed: usize,
    next_seq: u64,
}

impl Timers {
    /// A table for up to `capacity` armed timers (clamped to `1..=u32::MAX - 1`). Allocates
    /// everything it will ever use now.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, (NO_SLOT - 1) as usize);
        let slots = (0..capacity)
            .map(|i| Slot {
                generation: 0,
                state: SlotState::Free {
                    next_free: if i + 1 < capacity {
                        (i + 1) as u32
                    } else {
                        NO_SLOT
                    },
                },
            })
            .collect();
        Self {
            heap: BinaryHeap::with_capacity(capacity * 2),
            slots,
            free_head: 0,
            armed: 0,
            next_seq: 0,
        }
    }

    /// How many timers can be armed at once.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// How many timers are armed.
    pub fn len(&self) -> usize {
        self.armed
    }

    /// Whether no timer is armed.
    pub fn is_empty(&self) -> bool {
        self.armed == 0
    }

    /// Arms a one-shot timer for `deadline`.
    ///
    /// # Errors
    ///
    /// [`TimerError::Full`] if every slot is armed.
    pub fn arm(&mut self, deadline: Instant, token: u64) -> Result<TimerId, TimerError> {
        self.arm_inner(deadline, 0, token)
    }

    /// Arms a periodic timer that first fires at `first` and then every `period` after the
    /// previous deadline (no drift). If a check comes late by several periods, one event
    /// reports them as [`TimerEvent::overruns`] and the next deadline is the first one after the
    /// check.
    ///
    /// # Errors
    ///
    /// [`TimerError::ZeroPeriod`] for a zero period, [`TimerError::Full`] if every slot is armed.
    pub fn arm_periodic(
        &mut self,
        first: Instant,
        period: Duration,
        token: u64,
    ) -> Result<TimerId, TimerError> {
        let period_ns = duration_to_nanos(period);
        if period_ns == 0 {
            return Err(TimerError::ZeroPeriod);
        }
        self.arm_inner(first, period_ns, token)
    }

    fn arm_inner(
        &mut self,
        deadline: Instant,
        period_ns: u64,
        token: u64,
    ) -> Result<TimerId, TimerError> {
        if self.free_head == NO_SLOT {
            return Err(TimerError::Full {
                capacity: self.slots.len(),
            });
        }
        let slot = self.free_head;
        let SlotState::Free { next_free } = self.slots[slot as usize].state else {
            unreachable!("free list points at an armed slot");
        };
        self.free_head = next_free;
        let seq = self.push(deadline, slot);
        let s = &mut self.slots[slot as usize];
        s.state = SlotState::Armed {
            deadline,
            period_ns,
            token,
            seq,
        };
        self.armed += 1;
        Ok(TimerId {
            slot,
            generation: s.generation,
        })
    }

    /// Pushes a heap entry for `slot`, compacting first if the heap is full. Returns its seq.
    fn push(&mut self, deadline: Instant, slot: u32) -> u64 {
        if self.heap.len() == self.heap.capacity() {
            let slots = &self.slots;
            self.heap.retain(|e| Self::entry_is_live(slots, e));
            debug_assert!(self.heap.len() < self.heap.capacity());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry {
            deadline,
            seq,
            slot,
        });
        seq
    }

    fn entry_is_live(slots: &[Slot], e: &Entry) -> bool {
        matches!(slots[e.slot as usize].state, SlotState::Armed { seq, .. } if seq == e.seq)
    }

    fn armed_slot(&self, id: TimerId) -> Option<usize> {
        let s = self.slots.get(id.slot as usize)?;
        (s.generation == id.generation && matches!(s.state, SlotState::Armed { .. }))
            .then_some(id.slot as usize)
    }

    fn free_slot(&mut self, idx: usize) {
        let s = &mut self.slots[idx];
        s.generation = s.generation.wrapping_add(1);
        s.state = SlotState::Free {
            next_free: self.free_head,
        };
        self.free_head = idx as u32;
        self.armed -= 1;
    }

    /// Whether `id` is armed.
    pub fn is_armed(&self, id: TimerId) -> bool {
        self.armed_slot(id).is_some()
    }

    /// The deadline of `id`, if armed.
    pub fn deadline(&self, id: TimerId) -> Option<Instant> {
        let idx = self.armed_slot(id)?;
        match self.slots[idx].state {
            SlotState::Armed { deadline, .. } => Some(deadline),
            SlotState::Free { .. } => None,
        }
    }

    /// Cancels `id`. Returns whether it was armed (false for stale ids, fired one-shots and
    /// double cancels).
    pub fn cancel(&mut self, id: TimerId) -> bool {
        match self.armed_slot(id) {
            Some(idx) => {
                self.free_slot(idx);
                true
            }
            None => false,
        }
    }

    /// Moves an armed timer's deadline to `deadline`, keeping its id, token and period. Returns
    /// whether it was armed.
    pub fn reset(&mut self, id: TimerId, deadline: Instant) -> bool {
        let Some(idx) = self.armed_slot(id) else {
            return false;
        };
        let new_seq = self.push(deadline, idx as u32);
        if let SlotState::Armed {
            deadline: d, seq, ..
        } = &mut self.slots[idx].state
        {
            *d = deadline;
            *seq = new_seq;
        }
        true
    }

    /// Drops stale entries from the top of the heap.
    fn skip_stale(&mut self) {
        while let Some(top) = self.heap.peek() {
            if Self::entry_is_live(&self.slots, top) {
                return;
            }
            self.heap.pop();
        }
    }

    /// The earliest armed deadline.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        self.skip_stale();
        self.heap.peek().map(|e| e.deadline)
    }

    /// Removes and returns the earliest timer whose deadline is at or before `now`.
    ///
    /// A one-shot timer is disarmed before it is returned; a periodic timer is re-armed for its
    /// next deadline after `now`. Call repeatedly until `None` to fire everything due.
    pub fn pop_expired(&mut self, now: Instant) -> Option<TimerEvent> {
        self.skip_stale();
        let top = *self.heap.peek()?;
        if top.deadline > now {
            return None;
        }
        self.heap.pop();
        let idx = top.slot as usize;
        let SlotState::Armed {
            deadline,
            period_ns,
            token,
            ..
        } = self.slots[idx].state
        else {
            unreachable!("skip_stale left a stale entry on top");
        };
        let id = TimerId {
            slot: top.slot,
            generation: self.slots[idx].generation,
        };
        if period_ns == 0 {
            self.free_slot(idx);
            return Some(TimerEvent {
                id,
                token,
                deadline,
                overruns: 0,
            });
        }
        // Next deadline strictly after `now`, on the original grid.
        let late = now.nanos_since(deadline);
        let periods = late / period_ns + 1;
        let next = Instant::from_nanos(
            deadline
                .as_nanos()
                .saturating_add(periods.saturating_mul(period_ns)),
        );
        let seq = self.push(next, top.slot);
        if let SlotState::Armed {
            deadline: d,
            seq: s,
            ..
        } = &mut self.slots[idx].state
        {
            *d = next;
            *s = seq;
        }
        Some(TimerEvent {
            id,
            token,
            deadline,
            overruns: periods - 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    fn drain(timers: &mut Timers, now: Instant) -> Vec<u64> {
        std::iter::from_fn(|| timers.pop_expired(now))
            .map(|e| e.token)
            .collect()
    }

    #[test]
    fn fires_in_deadline_order_then_arming_order() {
        let mut tm = Timers::with_capacity(8);
        tm.arm(t(30), 3).unwrap();
        tm.arm(t(10), 1).unwrap();
        tm.arm(t(20), 2).unwrap();
        tm.arm(t(20), 22).unwrap();
        assert_eq!(tm.next_deadline(), Some(t(10)));
        assert_eq!(drain(&mut tm, t(9)), Vec::<u64>::new());
        assert_eq!(drain(&mut tm, t(20)), vec![1, 2, 22]);
        assert_eq!(drain(&mut tm, t(100)), vec![3]);
        assert!(tm.is_empty());
    }

    #[test]
    fn cancel_and_stale_ids() {
        let mut tm = Timers::with_capacity(2);
        let a = tm.arm(t(10), 1).unwrap();
        let b = tm.arm(t(20), 2).unwrap();
        assert_eq!(tm.arm(t(5), 3), Err(TimerError::Full { capacity: 2 }));
        assert!(tm.cancel(a));
        assert!(!tm.cancel(a), "double cancel");
        let c = tm.arm(t(15), 3).unwrap();
        assert_ne!(a, c, "reused slot gets a new generation");
        assert!(!tm.is_armed(a));
        assert_eq!(drain(&mut tm, t(100)), vec![3, 2]);
        assert!(!tm.cancel(b), "fired one-shot is stale");
    }

    #[test]
    fn reset_moves_deadline_and_keeps_id() {
        let mut tm = Timers::with_capacity(4);
        let a = tm.arm(t(10), 1).unwrap();
        tm.arm(t(20), 2).unwrap();
        assert!(tm.reset(a, t(30)));
        assert_eq!(tm.deadline(a), Some(t(30)));
        assert_eq!(drain(&mut tm, t(25)), vec![2]);
        assert_eq!(drain(&mut tm, t(30)), vec![1]);
    }

    #[test]
    fn periodic_keeps_grid_and_counts_overruns() {
        let mut tm = Timers::with_capacity(1);
        let p = tm.arm_periodic(t(10), Duration::from_nanos(10), 7).unwrap();
        let e = tm.pop_expired(t(10)).unwrap();
        assert_eq!((e.deadline, e.overruns), (t(10), 0));
        assert_eq!(tm.pop_expired(t(10)), None);
        assert_eq!(tm.deadline(p), Some(t(20)));
        let e = tm.pop_expired(t(45)).unwrap();
        assert_eq!((e.deadline, e.overruns), (t(20), 2));
        assert_eq!(tm.deadline(p), Some(t(50)));
        assert!(tm.cancel(p));
        assert_eq!(tm.pop_expired(t(1000)), None);
        assert_eq!(
            tm.arm_periodic(t(1), Duration::ZERO, 0),
            Err(TimerError::ZeroPeriod)
        );
    }

    #[test]
    fn churn_never_grows_the_heap() {
        let mut tm = Timers::with_capacity(16);
        let cap = tm.heap.capacity();
        let ids: Vec<_> = (0..16).map(|i| tm.arm(t(1_000 + i), i).unwrap()).collect();
        for round in 0..10_000u64 {
            let id = ids[(round % 16) as usize];
            assert!(tm.reset(id, t(2_000 + round)));
        }
        assert_eq!(tm.heap.capacity(), cap);
        assert_eq!(tm.len(), 16);
        assert_eq!(drain(&mut tm, Instant::MAX).len(), 16);
    }

    #[test]
    fn many_timers_fire_sorted() {
        let n = 10_000u64;
        let mut tm = Timers::with_capacity(n as usize);
        // A fixed permutation of deadlines (multiplicative hashing mod a prime).
        let mut ids = Vec::new();
        for i in 0..n {
            let d = (i * 7_919) % 10_007;
            ids.push(tm.arm(t(d), d).unwrap());
        }
        // Cancel every third timer.
        let mut cancelled = std::collections::HashSet::new();
        for (i, id) in ids.iter().enumerate() {
            if i % 3 == 0 {
                cancelled.insert(tm.deadline(*id).unwrap().as_nanos());
                assert!(tm.cancel(*id));
            }
        }
        let mut fired = Vec::new();
        let mut now = 0;
        while let Some(d) = tm.next_deadline() {
            now = now.max(d.as_nanos());
            while let Some(e) = tm.pop_expired(t(now)) {
                assert!(e.deadline.as_nanos() <= now);
                fired.push(e.token);
            }
        }
        assert_eq!(fired.len() as u64, n - n.div_ceil(3));
        assert!(fired.windows(2).all(|w| w[0] < w[1]));
        assert!(fired.iter().all(|d| !cancelled.contains(d)));
    }
}
