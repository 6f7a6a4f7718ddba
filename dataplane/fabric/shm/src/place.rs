//! How the bytes of an RDMA WRITE (or a SEND into the bounce buffer) land in the
//! responder's memory.
//!
//! A responder may learn that a WRITE has landed by polling the last byte of its buffer
//! (librdmacm's `riostream` does, and so does any program built on "the marker lands last"
//! placement). It then owns the buffer again and may store into it, typically its reply
//! marker in that same byte. RDMA hardware places every byte once, in order, so this works.
//! A plain `memcpy` does not promise either property: glibc copies a length equal to one of
//! its store widths (8, 16, 32, or 64 bytes with AVX-512) as two stores that both cover the
//! whole range (a head and a tail store that happen to coincide), loads first.
//! If the copying thread is preempted between the two, the responder sees the final byte,
//! stores its reply over it, and the second store puts the old value back: both sides then
//! wait for each other forever (issue 6). Larger copies may also use `rep movsb`, whose
//! stores become visible in no defined order.
//!
//! [`place`] therefore copies everything but the final byte with `memcpy` (any number and
//! order of stores: the responder must not touch the range before the final byte arrives),
//! then stores the final byte once, with Release ordering, after all the others. The copy
//! is [`copy_bytes`], which avoids glibc's `rep movsb` and its slow case (a destination a
//! few bytes above the source modulo 4 KiB, on AMD Zen 3: see its module).

use std::ptr;
use std::sync::atomic::{AtomicU8, Ordering};

use mempool::memory::copy::copy_bytes;

/// Copies the concatenation of `parts` (source pointer, length) to `dst`: every byte but
/// the last in any manner, then the last byte with one single-byte Release store, so a
/// reader that sees the final byte sees all the others, and no store of this copy follows
/// it.
///
/// # Safety
/// `dst` is valid for writes of the parts' total length; every part is valid for reads of
/// its length; the parts do not overlap the destination.
pub(crate) unsafe fn place(dst: *mut u8, parts: impl IntoIterator<Item = (*const u8, usize)>) {
    let mut at = dst;
    // The last byte of the previous non-empty part: held back until we know whether it is
    // the final byte of the whole copy.
    let mut held: Option<*const u8> = None;
    for (src, len) in parts.into_iter().filter(|&(_, len)| len > 0) {
        if let Some(b) = held.take() {
            // SAFETY: `b` is the last byte of an earlier part and `at` the next destination
            // byte, inside the total length (the caller's contract).
            unsafe {
                ptr::copy_nonoverlapping(b, at, 1);
                at = at.add(1);
            }
        }
        // SAFETY: `src` is readable for `len` bytes and `at..at + len` is inside the
        // destination (the caller's contract); `len > 0`, so `len - 1` does not wrap.
        unsafe {
            copy_bytes(src, at, len - 1);
            at = at.add(len - 1);
            held = Some(src.add(len - 1));
        }
    }
    if let Some(b) = held {
        // SAFETY: `b` is the last source byte; `at` is the last destination byte (valid,
        // and a u8 is always aligned). The responder only reads it meanwhile (it may store
        // there only after seeing this store), and this process touches it through no other
        // reference.
        unsafe {
            let v = ptr::read(b);
            // R-PL1: Release, pairs with the responder's read of the final byte (an
            // acquire poll, or on x86 any load): the bytes copied above are visible first.
            AtomicU8::from_ptr(at).store(v, Ordering::Release);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Counts user-space stores to one byte with a hardware write watchpoint
    /// (`perf_event_open`, `PERF_TYPE_BREAKPOINT`), for the calling thread.
    pub(crate) struct StoreCounter(std::os::fd::OwnedFd);

    /// `struct perf_event_attr` up to `bp_len` (`PERF_ATTR_SIZE_VER1`).
    #[repr(C)]
    #[derive(Default)]
    struct PerfEventAttr {
        type_: u32,
        size: u32,
        config: u64,
        sample_period: u64,
        sample_type: u64,
        read_format: u64,
        flags: u64,
        wakeup_events: u32,
        bp_type: u32,
        bp_addr: u64,
        bp_len: u64,
    }
    const _: () = assert!(size_of::<PerfEventAttr>() == 72);

    const PERF_TYPE_BREAKPOINT: u32 = 5;
    const HW_BREAKPOINT_W: u32 = 2;
    const HW_BREAKPOINT_LEN_1: u64 = 1;
    const EXCLUDE_KERNEL: u64 = 1 << 5;
    const EXCLUDE_HV: u64 = 1 << 6;

    impl StoreCounter {
        /// A counter on `addr`, or why the system offers none.
        pub(crate) fn new(addr: *const u8) -> Result<Self, std::io::Error> {
            use std::os::fd::FromRawFd;
            let attr = PerfEventAttr {
                type_: PERF_TYPE_BREAKPOINT,
                size: size_of::<PerfEventAttr>() as u32,
                flags: EXCLUDE_KERNEL | EXCLUDE_HV,
                bp_type: HW_BREAKPOINT_W,
                bp_addr: addr as u64,
                bp_len: HW_BREAKPOINT_LEN_1,
                ..PerfEventAttr::default()
            };
            // SAFETY: perf_event_open reads `size` bytes of a live attr; pid 0 and cpu -1
            // count this thread on any CPU; no group, no flags.
            let fd =
                unsafe { libc::syscall(libc::SYS_perf_event_open, &raw const attr, 0, -1, -1, 0) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a new descriptor that nothing else owns.
            Ok(Self(unsafe {
                std::os::fd::OwnedFd::from_raw_fd(fd as i32)
            }))
        }

        /// Stores counted so far.
        pub(crate) fn count(&self) -> u64 {
            use std::os::fd::AsRawFd;
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a u64 we own.
            let n = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
            assert_eq!(n, 8, "reading the watchpoint counter");
            v
        }
    }

    /// The ways a copy of `n` bytes arrives: one part, split in two everywhere, and split
    /// around empty parts.
    fn splits(n: usize) -> Vec<Vec<(usize, usize)>> {
        let mut v = vec![vec![(0, n)]];
        for k in 1..n.min(70) {
            v.push(vec![(0, k), (k, n - k)]);
        }
        v.push(vec![(0, 0), (0, n), (n, 0)]);
        if n >= 3 {
            v.push(vec![(0, 1), (1, 0), (1, n - 2), (n - 1, 1)]);
        }
        v
    }

    const SIZES: [usize; 10] = [1, 2, 7, 8, 16, 31, 32, 64, 65, 4096];

    #[test]
    fn copies_every_split_exactly() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in SIZES {
            for parts in splits(n) {
                let mut dst = vec![0xAAu8; n + 1];
                let ps = parts.iter().map(|&(o, l)| (src[o..].as_ptr(), l));
                // SAFETY: dst holds n + 1 bytes, the parts cover src[..n] in order.
                unsafe { place(dst.as_mut_ptr(), ps) };
                assert_eq!(&dst[..n], &src[..n], "{n} bytes as {parts:?}");
                assert_eq!(dst[n], 0xAA, "{n} bytes as {parts:?}: wrote past the end");
            }
        }
        let mut dst = [0x55u8; 1];
        // SAFETY: nothing is copied.
        unsafe { place(dst.as_mut_ptr(), [(src.as_ptr(), 0)]) };
        assert_eq!(dst, [0x55], "an empty copy stores nothing");
    }

    /// Issue 6: the final byte must be stored exactly once, or a responder's reply stored
    /// over it between two stores of the copy is undone. glibc's memcpy stores 8, 16, 32
    /// and 64 bytes twice (overlapping head and tail stores of the whole range).
    #[test]
    fn final_byte_is_stored_exactly_once() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
        // Page aligned, so every size starts at the same vector alignment as riostream's
        // buffers do.
        let mut dst = vec![0u8; 8192];
        let base = dst
            .as_mut_ptr()
            .wrapping_add(dst.as_ptr().align_offset(4096));
        for n in SIZES {
            let last = base.wrapping_add(n - 1);
            let counter = match StoreCounter::new(last) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!(
                        "final_byte_is_stored_exactly_once: no hardware watchpoint here \
                         ({e}); only the contents are checked"
                    );
                    return;
                }
            };
            for parts in splits(n) {
                let before = counter.count();
                let ps = parts.iter().map(|&(o, l)| (src[o..].as_ptr(), l));
                // SAFETY: base..base + 4096 lies inside dst; the parts cover src[..n].
                unsafe { place(base, ps) };
                let stores = counter.count() - before;
                assert_eq!(
                    stores, 1,
                    "{n} bytes as {parts:?}: the final byte was stored {stores} times"
                );
                // SAFETY: inside dst, which no one else references now.
                assert_eq!(unsafe { *last }, src[n - 1]);
            }
        }
    }
}
