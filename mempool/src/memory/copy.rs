//! Bulk copies into and out of regions that do not depend on where the two buffers sit.
//!
//! `memcpy` of glibc 2.36 (Debian 12) copies lengths from a few KiB up with `rep movsb`.
//! On AMD Zen 3 that instruction slows down about fifteen-fold when the destination lies a
//! few bytes above the source modulo 4 KiB (`(dst - src) % 4096` in about `1..=32`: the
//! loads then alias the stores just made, "4K aliasing"). That is the everyday case for a
//! socket: `malloc` hands a program a 128 KiB buffer at a page plus 16 bytes, while ring
//! offsets are multiples of 2 KiB. Measured on an EPYC (family 25) guest, copying 64 KiB out
//! of a page-aligned buffer (cache-hot / from memory):
//!
//! | `(dst - src) % 4096` | `memcpy` | [`copy_bytes`] (SSE2 loop) |
//! |---|---|---|
//! | 0 | 27 / 18 GB/s | 34 / 13 GB/s |
//! | 8 | 2.3 / 2.2 GB/s | |
//! | 16 | 1.9 / 1.7 GB/s | 33 / 11 GB/s |
//! | 2064 | 34 / 14 GB/s | 37 / 15 GB/s |
//!
//! Through the preload, iperf's receiver spent 89% of its time in that `rep movsb`, copying
//! the receive ring out at 1.9 GB/s (issue 17). [`copy_bytes`] therefore copies lengths of
//! [`LOOP_MIN`] bytes and more with a loop of 16-byte vector loads and stores (SSE2 is part of
//! the x86_64 baseline: no feature detection), which runs at the same speed for every
//! distance, and leaves shorter copies, which glibc does with vector moves anyway, to
//! `memcpy`.

use core::ptr;

/// The shortest copy [`copy_bytes`] does with its own loop (below, glibc does not use
/// `rep movsb`).
pub const LOOP_MIN: usize = 2048;

/// Copies `len` bytes from `src` to `dst`, at a speed that does not depend on their
/// relative alignment (see the module docs).
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and the two ranges do not
/// overlap (as for [`ptr::copy_nonoverlapping`]).
#[inline]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= LOOP_MIN {
        // SAFETY: the caller's contract.
        unsafe { copy_loop(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(src, dst, len) }
}

/// The loop of [`copy_bytes`]: 64 bytes per round in four unaligned 16-byte loads and
/// stores, then the tail with `memcpy` (under 64 bytes: vector moves, never `rep movsb`).
///
/// # Safety
/// As [`copy_bytes`].
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy_loop(src: *const u8, dst: *mut u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    const ROUND: usize = 64;
    let mut i = 0;
    // SAFETY: every access lies inside `src..src + len` or `dst..dst + len` (the loop stops
    // a round short of `len` and the tail is what remains), which the caller vouches for;
    // the loads and stores are the unaligned kind.
    unsafe {
        while i + ROUND <= len {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
            let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_storeu_si128(d, a);
            _mm_storeu_si128(d.add(1), b);
            _mm_storeu_si128(d.add(2), c);
            _mm_storeu_si128(d.add(3), e);
            i += ROUND;
        }
        ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_distance_exactly() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; 20_000 + 4096 + 64];
        for len in [0usize, 1, 63, 64, 2047, 2048, 2049, 4096, 4159, 16_385] {
            for shift in [0usize, 1, 8, 16, 31, 4080] {
                for s_off in [0usize, 5] {
                    dst.fill(0xAA);
                    let s = &src[s_off..s_off + len];
                    // SAFETY: shift + len + 1 <= dst.len(); s is a live slice; distinct
                    // allocations.
                    unsafe { copy_bytes(s.as_ptr(), dst.as_mut_ptr().add(shift), len) };
                    assert!(dst[shift..shift + len] == *s, "len {len} shift {shift}");
                    assert!(dst[..shift].iter().all(|&b| b == 0xAA), "wrote before");
                    assert_eq!(
                        dst[shift + len],
                        0xAA,
                        "len {len} shift {shift}: wrote past"
                    );
                }
            }
        }
    }
}
