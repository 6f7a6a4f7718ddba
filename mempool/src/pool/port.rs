//! [`RingPort`]: the pool's free ring, usable through `&self` from any thread.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ptr;

use crate::ring::{AnyConsumer, AnyProducer, Ring, RingError, SyncType};

use super::ObjId;

/// The two handles of the pool's free ring, shared by every thread through `&Pool`.
///
/// Both sides have the pool's ring mode ([`PoolConfig::ring_sync`](super::PoolConfig)): Multi
/// (DPDK's default `ring_mp_mc` ops), RTS (`ring_mt_rts`) or HTS (`ring_mt_hts`), never Single
/// ([`RingPort::new`] refuses it), so both handles are of a *shared* mode.
///
/// Ring handles take `&mut self` because a handle is meant to be used by one thread, and shared
/// sides are shared by giving each thread a clone. Cloning per operation would add two atomic
/// read-modify-writes on the ring's keep-alive counter, a line every thread would then fight
/// over. Instead each cache-less operation works on a *borrowed clone*: a bitwise copy of the
/// stored handle, wrapped in `ManuallyDrop`, that lives only for the call.
///
/// A shared-mode handle is `Clone`, and its clone is exactly a bitwise copy plus one increment
/// of the keep-alive `Arc` (shared modes claim slots on the shared words; the per-handle
/// cursor only caches the opposite tail, and any copy of it is a valid cache). The copy made
/// here skips the increment and is never dropped, so it never decrements; it is valid because
/// the stored handle, which owns the reference it borrows, outlives it (the copy does not escape
/// the `&self` call). Any write the ring makes to the copy's own fields (the cache) stays in the
/// copy, so the stored handle's cache is the one loaded when the pool was made, forever. Such a
/// copy cannot be used as it is: the counters are `u32`s, and once the side has moved about 2^32
/// counters past it, a cache that old aliases to a plausible one (`head` within `capacity` of
/// it again) and the ring would trust it, letting a get claim slots that hold no object when
/// the ring is nearly empty. So every borrowed clone first reloads the opposite tail
/// (`refresh_opp_tail`), which is the one load per operation DPDK's rings make too;
/// [`PoolCache`](super::PoolCache)s own their handles and keep their caches. Multi rings
/// (the default) skip the reload: their cache is in the side's shared head word, which every
/// borrowed clone reads and updates, so the cache-less path of a Multi pool loads the opposite
/// tail only when the ring looks short, not once per operation.
pub(crate) struct RingPort {
    prod: AnyProducer<ObjId>,
    cons: AnyConsumer<ObjId>,
}

// SAFETY: `RingPort` is `!Sync` only because ring handles hold raw pointers to the ring region.
// Through `&RingPort` they are only (a) copied into borrowed clones, each then used by one
// thread exactly as a clone of a shared-mode handle may be (both handles are of a shared mode,
// checked in `new`), and (b) read by `&self` methods (`len`, `handles`) that touch immutable
// fields and atomics. No `&mut` to the stored handles is ever created after construction.
unsafe impl Sync for RingPort {}

impl fmt::Debug for RingPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingPort")
            .field("sync", &self.cons.sync_type())
            .field("capacity", &self.cons.capacity())
            .field("len", &self.cons.len())
            .finish()
    }
}

impl RingPort {
    /// A ring of mode `sync` (a shared mode) with room for `count` ids, filled with
    /// `0..count` tagged `tag`.
    ///
    /// # Panics
    ///
    /// If `sync` is [`SyncType::Single`]; `PoolConfig::validate` rejects that first.
    pub(crate) fn new(count: u32, tag: u32, sync: SyncType) -> Result<Self, RingError> {
        assert!(
            sync.is_shared(),
            "a pool's free ring is shared by every thread; {sync} is not a shared mode"
        );
        let capacity = ring_capacity(count, sync);
        let (mut prod, cons) = Ring::<ObjId>::with_sync(capacity, sync, sync)?;
        // In batches, so a pool of 2^31 objects needs no 8 GiB staging vector.
        const BATCH: u32 = 1024;
        let mut batch = Vec::with_capacity(BATCH as usize);
        for start in (0..count).step_by(BATCH as usize) {
            let end = count.min(start.saturating_add(BATCH));
            batch.clear();
            batch.extend((start..end).map(|i| ObjId::new(i, tag)));
            let sent = prod.enqueue_bulk(&batch);
            debug_assert_eq!(
                sent,
                batch.len(),
                "a fresh ring of {capacity} slots is full"
            );
        }
        Ok(Self { prod, cons })
    }

    /// The mode of both sides of the ring.
    pub(crate) fn sync_type(&self) -> SyncType {
        self.prod.sync_type()
    }

    /// Enqueues all of `ids` or none; returns the count enqueued.
    #[inline(always)]
    pub(crate) fn enqueue_bulk(&self, ids: &[ObjId]) -> usize {
        // SAFETY: a borrowed clone (type docs): `self.prod` is of a shared mode and outlives
        // the copy, which is never dropped and does not escape this call.
        let mut prod = ManuallyDrop::new(unsafe { ptr::read(&self.prod) });
        // The stored cache is arbitrarily old (type docs).
        prod.refresh_opp_tail();
        prod.enqueue_bulk(ids)
    }

    /// Dequeues exactly `out.len()` ids or none; returns the count dequeued.
    #[inline(always)]
    pub(crate) fn dequeue_bulk(&self, out: &mut [ObjId]) -> usize {
        // SAFETY: a borrowed clone (type docs), as in `enqueue_bulk`.
        let mut cons = ManuallyDrop::new(unsafe { ptr::read(&self.cons) });
        // The stored cache is arbitrarily old (type docs).
        cons.refresh_opp_tail();
        cons.dequeue_bulk(out)
    }

    /// Ids in the ring at the time of the call.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.cons.len()
    }

    /// Owned clones of both handles, for a cache.
    pub(crate) fn handles(&self) -> (AnyProducer<ObjId>, AnyConsumer<ObjId>) {
        // Both sides are of a shared mode (`new`), so both clones exist.
        match (self.prod.try_clone(), self.cons.try_clone()) {
            (Some(p), Some(c)) => (p, c),
            _ => unreachable!("the pool ring's sides are of a shared mode"),
        }
    }
}

/// Slots of the free ring of a pool of `count` objects whose sides have mode `sync`.
///
/// A put can never find the ring full, which is what lets [`Pool::put`](super::Pool::put)
/// return nothing and treat a refused put as a double free:
///
/// - **Multi, HTS**: `count` rounded up to a power of two. A get returns only after its
///   consumer tail is published (Multi waits for its predecessors, HTS runs one operation at a
///   time), so an object outside the ring never still occupies its old slot, and the ring never
///   holds more than `count` ids.
/// - **RTS**: four times that. An RTS get returns as soon as its copy is done, and its slot is
///   released only when the last get in flight finishes; meanwhile the object may be put back,
///   so it occupies two slots. The slots claimed by gets and not yet released are at most the
///   consumer's head/tail distance limit plus one claim: `htd_max + count` with `htd_max =
///   capacity / 8`. So the producer needs `count + capacity / 8 + count <= capacity`, which
///   `capacity = 4 x next_power_of_two(count)` satisfies (2.5 x that power of two at most).
///   DPDK's `ring_mt_rts` mempool ops size the ring as for the default mode, so there a put can
///   fail in the same situation.
pub(crate) fn ring_capacity(count: u32, sync: SyncType) -> usize {
    let fit = (count as usize).next_power_of_two();
    match sync {
        SyncType::Rts => 4 * fit,
        SyncType::Single | SyncType::Multi | SyncType::Hts => fit,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::{Consumer, Hts, Multi, Producer, Rts, SyncMode};

    /// A port over an empty ring of 8 slots whose stored consumer holds a copy of the producer
    /// tail loaded 2^32 - 8 counters ago: congruent to 8 ahead of the truth, which reads as
    /// "8 objects available", as the frozen cache of a pool's port does once the consumer
    /// counters come back round to it.
    fn port_with_aliased_cache<M: SyncMode>(
        wrap: fn(Producer<ObjId, M>, Consumer<ObjId, M>) -> RingPort,
    ) -> RingPort {
        let (p, mut c) = Ring::<ObjId>::with_capacity_and_start::<M, M>(8, 0).unwrap();
        c.set_cached_opp_tail(8);
        wrap(p, c)
    }

    #[test]
    fn test_port_get_reloads_an_aliased_producer_tail() {
        let ports = [
            port_with_aliased_cache::<Multi>(|p, c| RingPort {
                prod: AnyProducer::Multi(p),
                cons: AnyConsumer::Multi(c),
            }),
            port_with_aliased_cache::<Rts>(|p, c| RingPort {
                prod: AnyProducer::Rts(p),
                cons: AnyConsumer::Rts(c),
            }),
            port_with_aliased_cache::<Hts>(|p, c| RingPort {
                prod: AnyProducer::Hts(p),
                cons: AnyConsumer::Hts(c),
            }),
        ];
        for port in ports {
            let mode = port.sync_type();
            let mut out = [ObjId::default(); 4];
            assert_eq!(port.dequeue_bulk(&mut out), 0, "{mode}: the ring is empty");
            let ids = [ObjId::new(1, 0), ObjId::new(2, 0)];
            assert_eq!(port.enqueue_bulk(&ids), 2, "{mode}");
            assert_eq!(port.dequeue_bulk(&mut out), 0, "{mode}: only 2 in the ring");
            assert_eq!(port.dequeue_bulk(&mut out[..2]), 2, "{mode}");
            assert_eq!(out[..2], ids, "{mode}");
        }
    }
}
