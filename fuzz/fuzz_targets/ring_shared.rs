//! A ring in memory shared with a peer process (`Ring::init_in`, `Ring::attach*`): the peer
//! may write any byte of the header, the layout description and the index words of every
//! mode, before we attach and between our operations.
//!
//! Input: the capacity (a power of two up to 64), the side modes the region is formatted
//! with, byte patches applied to the header before attaching, then operations on Single
//! handles interleaved with more patches. Checks: attaching never panics and fails unless the
//! header still describes a ring of `u32` with the asked modes; on a Single/Single attach every
//! operation runs without panic and returns counts within what was asked and the capacity, so
//! slot accesses (masked by the capacity copied at attach time) stay in the region whatever the
//! peer writes. Shared-mode sides are attached (validation) but not operated: their threads
//! wait for each other, so a peer that corrupts their words can stall them, which the ring
//! documents as the trust a shared side places in its peers.
#![no_main]
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mempool::ring::{Hts, KeepAlive, Multi, Ring, RingLayout, Rts, Single, SyncType};

#[derive(Arbitrary, Debug)]
enum Op {
    Enqueue(u32),
    EnqueueBulk(u8),
    EnqueueBurst(u8),
    Dequeue,
    DequeueBulk(u8),
    DequeueBurst(u8),
    Peek,
    Counts,
    /// The peer writes one byte of the header.
    Poke(u16, u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    capacity_shift: u8,
    prod: u8,
    cons: u8,
    patches: Vec<(u16, u8)>,
    ops: Vec<Op>,
}

#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct Line([u8; 128]);

fuzz_target!(|input: Input| {
    let capacity = 1usize << (input.capacity_shift % 7);
    let layout = RingLayout::new::<u32>(capacity).expect("a valid capacity");
    let header = layout.slots_offset();
    let region = vec![Line([0; 128]); layout.bytes().div_ceil(128)].into_boxed_slice();
    let region = Arc::new(region);
    let mem = region.as_ptr().cast::<u8>().cast_mut();
    let len = layout.bytes();
    let keep = || -> KeepAlive { region.clone() };
    let mode = |b: u8| SyncType::ALL[usize::from(b) % 4];
    let (prod, cons) = (mode(input.prod), mode(input.cons));
    // The peer writes header byte `off % header`.
    let poke = |off: u16, byte: u8| {
        // SAFETY: the offset is inside the header, which lies inside the region; this thread
        // is the only one touching the region, so the write races with nothing.
        unsafe { mem.add(usize::from(off) % header).write(byte) };
    };

    // SAFETY: `mem` is valid for `len` bytes while `region` lives, which every handle keeps
    // alive; nothing else uses the region.
    unsafe { format(mem, len, capacity, prod, cons) };
    for &(off, byte) in &input.patches {
        poke(off, byte);
    }
    // Every attach either fails or matches the header; only Single/Single handles run.
    // SAFETY: as above; handles of the shared modes are dropped at once.
    unsafe {
        let _ = Ring::<u32>::attach_producer::<Multi>(mem, len, keep());
        let _ = Ring::<u32>::attach_producer::<Rts>(mem, len, keep());
        let _ = Ring::<u32>::attach_consumer::<Hts>(mem, len, keep());
        let _ = Ring::<u64>::attach_consumer::<Single>(mem, len, keep());
    }
    // SAFETY: as above; these are the only Single handles of the region.
    let Ok((mut tx, mut rx)) = (unsafe { Ring::<u32>::attach::<Single, Single>(mem, len, keep()) })
    else {
        return;
    };
    let cap = tx.capacity();
    assert_eq!(cap, rx.capacity());
    let mut buf = [0u32; 80];
    for op in input.ops {
        match op {
            Op::Enqueue(v) => {
                let _ = tx.enqueue(v);
            }
            Op::EnqueueBulk(n) => {
                let n = usize::from(n) % buf.len();
                let k = tx.enqueue_bulk(&buf[..n]);
                assert!(k == 0 || (k == n && n <= cap), "bulk enqueued {k} of {n}");
            }
            Op::EnqueueBurst(n) => {
                let n = usize::from(n) % buf.len();
                assert!(tx.enqueue_burst(&buf[..n]) <= n.min(cap));
            }
            Op::Dequeue => {
                let _ = rx.dequeue();
            }
            Op::DequeueBulk(n) => {
                let n = usize::from(n) % buf.len();
                let k = rx.dequeue_bulk(&mut buf[..n]);
                assert!(k == 0 || (k == n && n <= cap), "bulk dequeued {k} of {n}");
            }
            Op::DequeueBurst(n) => {
                let n = usize::from(n) % buf.len();
                assert!(rx.dequeue_burst(&mut buf[..n]) <= n.min(cap));
            }
            Op::Peek => {
                let _ = rx.peek().copied();
            }
            Op::Counts => {
                assert!(rx.len() <= cap && tx.free_count() <= cap);
            }
            Op::Poke(off, byte) => poke(off, byte),
        }
    }
});

/// Formats `mem` with the side modes `prod` and `cons`.
///
/// # Safety
///
/// As for [`Ring::init_in`].
unsafe fn format(mem: *mut u8, len: usize, capacity: usize, prod: SyncType, cons: SyncType) {
    macro_rules! init {
        ($($p:ident)*) => {
            match prod {
                $(SyncType::$p => match cons {
                    SyncType::Single => Ring::<u32>::init_in::<$p, Single>(mem, len, capacity),
                    SyncType::Multi => Ring::<u32>::init_in::<$p, Multi>(mem, len, capacity),
                    SyncType::Rts => Ring::<u32>::init_in::<$p, Rts>(mem, len, capacity),
                    SyncType::Hts => Ring::<u32>::init_in::<$p, Hts>(mem, len, capacity),
                },)*
            }
        };
    }
    // SAFETY: forwarded caller contract.
    unsafe { init!(Single Multi Rts Hts) }.expect("a fresh region of the right size formats");
}
