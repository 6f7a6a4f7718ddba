//! Single-threaded unit tests: edge cases of the index arithmetic, flavours and layout.

use std::sync::Arc;

use super::*;

/// Runs `$body` once for each of the sixteen mode combinations, with counters starting at
/// `start` and `htd_max` of RTS handles left at its default.
macro_rules! for_all_modes {
    ($cap:expr, $start:expr, |$p:ident, $c:ident| $body:block) => {{
        for_all_modes!(@prod $cap, $start, |$p, $c| $body; Single Multi Rts Hts);
    }};
    (@prod $cap:expr, $start:expr, |$p:ident, $c:ident| $body:block; $($pm:ident)*) => {{
        $( for_all_modes!(@cons $cap, $start, |$p, $c| $body; $pm; Single Multi Rts Hts); )*
    }};
    (@cons $cap:expr, $start:expr, |$p:ident, $c:ident| $body:block; $pm:ident; $($cm:ident)*) => {{
        $({
            let (mut $p, mut $c) =
                Ring::<u64>::with_capacity_and_start::<$pm, $cm>($cap, $start).unwrap();
            $body
        })*
    }};
}

/// Counter start values: zero, and positions that make the counters cross `u32::MAX`
/// mid-test.
const STARTS: [u32; 4] = [0, u32::MAX - 2, u32::MAX - 7, u32::MAX];

#[test]
fn full_ring_holds_exactly_capacity() {
    for start in STARTS {
        for_all_modes!(8, start, |p, c| {
            assert_eq!(p.capacity(), 8);
            assert_eq!(c.capacity(), 8);
            assert!(c.is_empty());
            assert_eq!(p.free_count(), 8);
            for i in 0..8 {
                assert_eq!(p.enqueue(i), Ok(()), "start {start:#x}, element {i}");
            }
            assert_eq!(p.enqueue(99), Err(99));
            assert_eq!(p.free_count(), 0);
            assert_eq!(c.len(), 8);
            for i in 0..8 {
                assert_eq!(c.dequeue(), Some(i));
            }
            assert_eq!(c.dequeue(), None);
            assert!(c.is_empty());
            assert_eq!(p.free_count(), 8);
        });
    }
}

#[test]
fn wrap_around_keeps_fifo_order() {
    // Capacity 4 and a run of 3 per step makes both the slot index and the u32 counter wrap at
    // every possible offset.
    for start in STARTS {
        for_all_modes!(4, start, |p, c| {
            let mut next_in = 0u64;
            let mut next_out = 0u64;
            for _ in 0..40 {
                let batch = [next_in, next_in + 1, next_in + 2];
                assert_eq!(p.enqueue_bulk(&batch), 3, "start {start:#x}");
                next_in += 3;
                let mut out = [0u64; 3];
                assert_eq!(c.dequeue_bulk(&mut out), 3);
                assert_eq!(out, [next_out, next_out + 1, next_out + 2]);
                next_out += 3;
                assert!(c.is_empty());
            }
        });
    }
}

#[test]
fn counters_cross_u32_max() {
    let (mut p, mut c) =
        Ring::<u64>::with_capacity_and_start::<Single, Single>(4, u32::MAX - 1).unwrap();
    // Head goes MAX-1 -> MAX+2 (wraps to 1) while the consumer tail stays at MAX-1.
    assert_eq!(p.enqueue_bulk(&[1, 2, 3]), 3);
    assert_eq!(p.free_count(), 1);
    assert_eq!(c.len(), 3);
    assert_eq!(p.enqueue_bulk(&[4, 5]), 0, "only one slot left");
    assert_eq!(p.enqueue_burst(&[4, 5]), 1);
    assert_eq!(c.len(), 4);
    let mut out = [0; 4];
    assert_eq!(c.dequeue_burst(&mut out), 4);
    assert_eq!(out, [1, 2, 3, 4]);
}

#[test]
fn bulk_is_all_or_nothing() {
    for start in STARTS {
        for_all_modes!(8, start, |p, c| {
            assert_eq!(p.enqueue_bulk(&[1, 2, 3, 4, 5, 6]), 6);
            // 2 free: a bulk of 3 must not move anything.
            assert_eq!(p.enqueue_bulk(&[7, 8, 9]), 0);
            assert_eq!(c.len(), 6);
            assert_eq!(p.enqueue_bulk(&[7, 8]), 2);
            assert_eq!(p.enqueue_bulk(&[9]), 0);

            let mut big = [0u64; 9];
            assert_eq!(c.dequeue_bulk(&mut big), 0, "larger than the ring");
            let mut out = [0u64; 5];
            assert_eq!(c.dequeue_bulk(&mut out), 5);
            assert_eq!(out, [1, 2, 3, 4, 5]);
            let mut out4 = [u64::MAX; 4];
            assert_eq!(c.dequeue_bulk(&mut out4), 0, "only 3 left");
            assert_eq!(out4, [u64::MAX; 4], "failed bulk must not write");
            assert_eq!(c.len(), 3);
            let mut out3 = [0u64; 3];
            assert_eq!(c.dequeue_bulk(&mut out3), 3);
            assert_eq!(out3, [6, 7, 8]);
        });
    }
}

#[test]
fn burst_moves_what_fits() {
    for start in STARTS {
        for_all_modes!(8, start, |p, c| {
            assert_eq!(p.enqueue_burst(&[0, 1, 2, 3, 4]), 5);
            assert_eq!(p.enqueue_burst(&[5, 6, 7, 8, 9]), 3);
            assert_eq!(p.enqueue_burst(&[10]), 0);
            let mut out = [0u64; 6];
            assert_eq!(c.dequeue_burst(&mut out), 6);
            assert_eq!(out, [0, 1, 2, 3, 4, 5]);
            let mut out = [0u64; 6];
            assert_eq!(c.dequeue_burst(&mut out), 2);
            assert_eq!(&out[..2], &[6, 7]);
            assert_eq!(c.dequeue_burst(&mut out), 0);
        });
    }
}

#[test]
fn oversized_and_empty_requests() {
    for_all_modes!(4, 0, |p, c| {
        let big: Vec<u64> = (0..10).collect();
        assert_eq!(
            p.enqueue_bulk(&big),
            0,
            "bulk larger than the capacity never fits"
        );
        assert_eq!(p.enqueue_bulk(&[]), 0);
        assert_eq!(p.enqueue_burst(&[]), 0);
        assert_eq!(p.enqueue_burst(&big), 4, "burst is clamped to the capacity");
        let mut none: [u64; 0] = [];
        assert_eq!(c.dequeue_bulk(&mut none), 0);
        assert_eq!(c.dequeue_burst(&mut none), 0);
        let mut out = vec![0u64; 10];
        assert_eq!(c.dequeue_burst(&mut out), 4);
        assert_eq!(&out[..4], &[0, 1, 2, 3]);
    });
}

#[test]
fn capacity_one() {
    for_all_modes!(1, u32::MAX, |p, c| {
        for i in 0..5 {
            assert_eq!(p.enqueue(i), Ok(()));
            assert_eq!(p.enqueue(i), Err(i));
            assert_eq!(c.dequeue(), Some(i));
            assert_eq!(c.dequeue(), None);
        }
    });
}

#[test]
fn single_producer_cache_refreshes_only_when_needed() {
    // The producer's cached consumer tail is stale after the consumer drains; the producer must
    // notice the freed space when its cache says "full".
    let (mut p, mut c) = Ring::<u64>::spsc(2).unwrap();
    assert_eq!(p.enqueue_bulk(&[1, 2]), 2);
    assert_eq!(c.dequeue(), Some(1));
    assert_eq!(c.dequeue(), Some(2));
    assert_eq!(p.enqueue_bulk(&[3, 4]), 2);
    assert_eq!(c.dequeue(), Some(3));
    assert_eq!(p.enqueue(5), Ok(()));
    assert_eq!(p.enqueue(6), Err(6));
}

#[test]
fn peek_does_not_consume() {
    let (mut p, mut c) =
        Ring::<u32>::with_capacity_and_start::<Multi, Single>(2, u32::MAX).unwrap();
    assert_eq!(c.peek(), None);
    assert_eq!(p.enqueue(7), Ok(()));
    assert_eq!(p.enqueue(8), Ok(()));
    assert_eq!(c.peek(), Some(&7));
    assert_eq!(c.peek(), Some(&7));
    assert_eq!(
        p.enqueue(9),
        Err(9),
        "a peeked element still occupies its slot"
    );
    assert_eq!(c.dequeue(), Some(7));
    assert_eq!(c.peek(), Some(&8));
}

#[test]
fn multi_handles_share_a_side() {
    let (p, c) = Ring::<u16>::mpmc(4).unwrap();
    let (mut p1, mut p2) = (p.clone(), p);
    let (mut c1, mut c2) = (c.clone(), c);
    assert_eq!(p1.enqueue(1), Ok(()));
    assert_eq!(p2.enqueue(2), Ok(()));
    assert_eq!(p1.enqueue_bulk(&[3, 4]), 2);
    assert_eq!(p2.enqueue(5), Err(5));
    assert_eq!(c2.dequeue(), Some(1));
    assert_eq!(c1.dequeue(), Some(2));
    assert_eq!(c2.len(), 2);
    let mut out = [0; 2];
    assert_eq!(c1.dequeue_bulk(&mut out), 2);
    assert_eq!(out, [3, 4]);
}

#[test]
fn elements_larger_than_a_word() {
    type Elem = [u64; 3];
    let (mut p, mut c) =
        Ring::<Elem>::with_capacity_and_start::<Single, Single>(4, u32::MAX - 1).unwrap();
    let items: Vec<Elem> = (0..4).map(|i| [i, i * 10, i * 100]).collect();
    assert_eq!(p.enqueue_bulk(&items), 4);
    let mut out = [[0; 3]; 4];
    assert_eq!(c.dequeue_bulk(&mut out), 4);
    assert_eq!(out.as_slice(), items.as_slice());
}

#[test]
fn zero_sized_elements() {
    let (mut p, mut c) = Ring::<()>::spsc(2).unwrap();
    assert_eq!(p.enqueue_bulk(&[(), ()]), 2);
    assert_eq!(p.enqueue(()), Err(()));
    assert_eq!(c.dequeue(), Some(()));
    assert_eq!(c.len(), 1);
}

#[test]
fn capacity_validation() {
    assert_eq!(Ring::<u64>::spsc(0).unwrap_err(), RingError::ZeroCapacity);
    assert_eq!(
        Ring::<u64>::mpmc(12).unwrap_err(),
        RingError::CapacityNotPowerOfTwo { requested: 12 }
    );
    let too_big = RingLayout::MAX_CAPACITY * 2;
    assert_eq!(
        Ring::<u8>::spmc(too_big).unwrap_err(),
        RingError::CapacityTooLarge {
            requested: too_big,
            max: RingLayout::MAX_CAPACITY,
        }
    );
    assert!(matches!(
        RingLayout::new::<[u8; 1 << 40]>(1 << 30),
        Err(RingError::SizeOverflow { .. })
    ));
    // The error messages say what to do.
    let msg = RingError::CapacityNotPowerOfTwo { requested: 12 }.to_string();
    assert!(msg.contains("next_power_of_two"), "{msg}");
}

#[test]
fn layout_numbers() {
    let l = RingLayout::new::<u64>(1024).unwrap();
    assert_eq!(l.capacity(), 1024);
    assert_eq!(l.slots_offset(), size_of::<layout::RingHeader>());
    assert_eq!(l.bytes(), l.slots_offset() + 1024 * 8);
    assert_eq!(l.align(), RingLayout::align_for::<u64>());
    assert_eq!(l.alloc_layout().size(), l.bytes());
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(l.slots_offset(), 640);
        assert_eq!(l.align(), 128);
    }
    // Over-aligned elements move the slot array.
    #[derive(Clone, Copy)]
    #[repr(C, align(256))]
    struct Wide([u8; 256]);
    let w = RingLayout::new::<Wide>(2).unwrap();
    assert_eq!(w.slots_offset() % 256, 0);
    assert_eq!(w.align(), 256);
}

/// A heap buffer aligned for rings, standing in for a shared mapping.
struct Region {
    ptr: *mut u8,
    layout: core::alloc::Layout,
}

// SAFETY: owned plain memory; the test synchronises access through ring handles.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    fn new(bytes: usize) -> Arc<Self> {
        let layout = core::alloc::Layout::from_size_align(bytes, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Arc::new(Self { ptr, layout })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[test]
fn init_then_attach_round_trip() {
    let bytes = RingLayout::bytes_for::<u64>(16).unwrap();
    let region = Region::new(bytes);
    let mem = region.ptr;
    // SAFETY: `mem` is valid for `bytes`, unshared.
    let layout = unsafe { Ring::<u64>::init_in::<Single, Multi>(mem, bytes, 16) }.unwrap();
    assert_eq!(layout.bytes(), bytes);
    {
        // SAFETY: formatted above in this thread; one producer handle at a time.
        let mut p =
            unsafe { Ring::<u64>::attach_producer::<Single>(mem, bytes, region.clone()) }.unwrap();
        assert_eq!(p.enqueue_bulk(&[1, 2, 3]), 3);
    }
    // A new producer handle continues where the old one stopped.
    // SAFETY: as above; the previous producer is dropped.
    let (mut p, mut c) =
        unsafe { Ring::<u64>::attach::<Single, Multi>(mem, bytes, region.clone()) }.unwrap();
    assert_eq!(p.enqueue(4), Ok(()));
    assert_eq!(c.len(), 4);
    let mut out = [0; 4];
    assert_eq!(c.dequeue_bulk(&mut out), 4);
    assert_eq!(out, [1, 2, 3, 4]);
    // The handles keep the region alive after the test's own reference is gone.
    drop(region);
    assert_eq!(p.enqueue(5), Ok(()));
    assert_eq!(c.dequeue(), Some(5));
}

#[test]
fn rts_and_hts_sides_attach_by_their_mode() {
    let bytes = RingLayout::bytes_for::<u64>(16).unwrap();
    let region = Region::new(bytes);
    let mem = region.ptr;
    let keep = || -> KeepAlive { region.clone() };
    // SAFETY: `mem` is valid for `bytes` bytes and only used through the handles below, in
    // this thread.
    unsafe {
        Ring::<u64>::init_in::<Rts, Hts>(mem, bytes, 16).unwrap();
        assert_eq!(
            Ring::<u64>::attach_producer::<Multi>(mem, bytes, keep()).unwrap_err(),
            RingError::ModeMismatch {
                side: Side::Producer,
                found: "rts",
                expected: "multi"
            }
        );
        assert_eq!(
            Ring::<u64>::attach_consumer::<Rts>(mem, bytes, keep()).unwrap_err(),
            RingError::ModeMismatch {
                side: Side::Consumer,
                found: "hts",
                expected: "rts"
            }
        );
        let (mut p, mut c) = Ring::<u64>::attach::<Rts, Hts>(mem, bytes, keep()).unwrap();
        let mut p2 = Ring::<u64>::attach_producer::<Rts>(mem, bytes, keep()).unwrap();
        assert_eq!(p.enqueue_bulk(&[1, 2, 3]), 3);
        assert_eq!(p2.enqueue(4), Ok(()));
        let mut out = [0; 4];
        assert_eq!(c.dequeue_bulk(&mut out), 4);
        assert_eq!(out, [1, 2, 3, 4]);
    }
}

#[test]
fn run_time_modes_dispatch_to_the_typed_paths() {
    for prod in SyncType::ALL {
        for cons in SyncType::ALL {
            let (mut p, mut c) = Ring::<u32>::with_sync(4, prod, cons).unwrap();
            assert_eq!((p.sync_type(), c.sync_type()), (prod, cons));
            assert_eq!(p.try_clone().is_some(), prod.is_shared());
            assert_eq!(c.try_clone().is_some(), cons.is_shared());
            assert_eq!(p.enqueue_bulk(&[1, 2, 3]), 3);
            assert_eq!(p.enqueue_burst(&[4, 5]), 1);
            assert_eq!(p.enqueue(6), Err(6));
            assert_eq!((p.free_count(), c.len(), p.capacity()), (0, 4, 4));
            assert_eq!(c.dequeue(), Some(1));
            let mut out = [0; 4];
            assert_eq!(c.dequeue_bulk(&mut out), 0);
            assert_eq!(c.dequeue_burst(&mut out), 3);
            assert_eq!(out[..3], [2, 3, 4]);
            assert!(c.is_empty());
            let s = format!("{p:?} {c:?}");
            assert!(s.contains(prod.name()) && s.contains(cons.name()), "{s}");
        }
    }
}

#[test]
fn rts_distance_limit_is_per_handle_and_clamped() {
    let (mut p, c) = Ring::<u8>::with_capacity::<Rts, Rts>(64).unwrap();
    assert_eq!((p.htd_max(), c.htd_max()), (8, 8));
    p.set_htd_max(1000);
    assert_eq!(p.htd_max(), 64);
    let p2 = p.clone();
    p.set_htd_max(0);
    assert_eq!((p.htd_max(), p2.htd_max()), (0, 64));
}

#[test]
fn attach_rejects_bad_regions() {
    let bytes = RingLayout::bytes_for::<u64>(16).unwrap();
    let region = Region::new(bytes + 4096);
    let mem = region.ptr;
    let keep = || -> KeepAlive { region.clone() };

    // SAFETY: for every call below, `mem` is valid for `bytes + 4096` bytes and unshared, and
    // handles are dropped immediately.
    unsafe {
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(mem, bytes, keep()).unwrap_err(),
            RingError::BadMagic { found: 0 }
        );
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(core::ptr::null_mut(), bytes, keep())
                .unwrap_err(),
            RingError::NullRegion
        );
        assert!(matches!(
            Ring::<u64>::init_in::<Single, Single>(mem.add(8), bytes, 16),
            Err(RingError::Misaligned { align, .. }) if align == RingLayout::align_for::<u64>()
        ));
        assert_eq!(
            Ring::<u64>::init_in::<Single, Single>(mem, bytes - 1, 16).unwrap_err(),
            RingError::RegionTooSmall {
                needed: bytes,
                len: bytes - 1
            }
        );
        assert_eq!(
            Ring::<u64>::init_in::<Single, Single>(mem, bytes, 15).unwrap_err(),
            RingError::CapacityNotPowerOfTwo { requested: 15 }
        );

        Ring::<u64>::init_in::<Multi, Single>(mem, bytes, 16).unwrap();
        assert!(Ring::<u64>::attach::<Multi, Single>(mem, bytes, keep()).is_ok());
        assert_eq!(
            Ring::<u64>::attach_producer::<Single>(mem, bytes, keep()).unwrap_err(),
            RingError::ModeMismatch {
                side: Side::Producer,
                found: "multi",
                expected: "single",
            }
        );
        assert_eq!(
            Ring::<u64>::attach_consumer::<Multi>(mem, bytes, keep()).unwrap_err(),
            RingError::ModeMismatch {
                side: Side::Consumer,
                found: "single",
                expected: "multi",
            }
        );
        assert_eq!(
            Ring::<u32>::attach_consumer::<Single>(mem, bytes, keep()).unwrap_err(),
            RingError::ElementMismatch {
                found_size: 8,
                found_align: 8,
                expected_size: 4,
                expected_align: 4,
            }
        );
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(mem, bytes - 8, keep()).unwrap_err(),
            RingError::RegionTooSmall {
                needed: bytes,
                len: bytes - 8
            }
        );
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(mem, 64, keep()).unwrap_err(),
            RingError::RegionTooSmall {
                needed: size_of::<layout::RingHeader>(),
                len: 64,
            }
        );

        // Corrupt individual header fields.
        let meta = mem.cast::<layout::RingMeta>();
        let good = core::ptr::read(meta);
        (*meta).version = 99;
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(mem, bytes, keep()).unwrap_err(),
            RingError::VersionMismatch {
                found: 99,
                expected: layout::VERSION
            }
        );
        core::ptr::write(meta, good);
        (*meta).mask = 3;
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(mem, bytes, keep()).unwrap_err(),
            RingError::CorruptHeader {
                capacity: 16,
                mask: 3
            }
        );
        core::ptr::write(meta, good);
        (*meta).capacity = 12;
        (*meta).mask = 11;
        assert_eq!(
            Ring::<u64>::attach_consumer::<Single>(mem, bytes, keep()).unwrap_err(),
            RingError::CorruptHeader {
                capacity: 12,
                mask: 11
            }
        );
        core::ptr::write(meta, good);
        (*meta).slots_offset = 64;
        assert!(matches!(
            Ring::<u64>::attach_consumer::<Single>(mem, bytes, keep()),
            Err(RingError::LayoutMismatch { found: 64, .. })
        ));
        core::ptr::write(meta, good);
        assert!(Ring::<u64>::attach_consumer::<Single>(mem, bytes, keep()).is_ok());
    }
}

#[test]
fn debug_output_names_the_mode() {
    let (p, c) = Ring::<u8>::mpsc(2).unwrap();
    let s = format!("{p:?} {c:?}");
    assert!(s.contains("multi") && s.contains("single"), "{s}");
}
