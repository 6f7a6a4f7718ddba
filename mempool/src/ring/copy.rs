//! Inline element copies for the ring slots and the pool caches.
//!
//! # Why not `copy_nonoverlapping`
//!
//! The bulk operations move runs whose length is known only at run time. For those,
//! `ptr::copy_nonoverlapping` is a call into the C library's `memcpy` (on glibc with AVX-512,
//! `__memmove_avx512_unaligned_erms`), whose entry, size classification and return cost more
//! than the copy itself for the 1-128 element runs of the hot paths. Profiles of `dp-perf` on
//! the 2-vCPU AMD EPYC development box put 23 % of the samples of the two-core SP/SC bulk-32
//! ring benchmark, and 41.5 % of a cache-512 bulk-1 pool benchmark, inside that function. An
//! A/B of the same ring algorithm with the call replaced by the loop below went from 5.5 to
//! 3.1 ns per element (DPDK's summed two-core unit). DPDK's rings do the same: their
//! `__rte_ring_enqueue_elems_64` copies four elements per iteration, inline.
//!
//! # Keeping LLVM from turning the loop back into a call
//!
//! LLVM's loop-idiom pass rewrites a loop that stores `dst[i] = src[i]` with a stride equal to
//! the store size (or a loop of fixed-size `memcpy`s whose stride equals their size, which is
//! what a `read_unaligned` of a `[T; 4]` becomes) into one `memcpy` call of the whole run. The
//! main loop of [`copy_run`] therefore moves [`UNROLL`] elements per iteration with one typed
//! store per element: every store has a stride of `UNROLL` elements, not its own size, so the
//! idiom does not match, while the vectoriser is still free to widen the loads and stores. The
//! tail of up to `UNROLL - 1` elements is a `match`, not a loop.
//!
//! Whether the compiled hot paths are free of `memcpy`/`memmove` calls is not something a test
//! can observe; check it with `objdump -d` on a release build (the crate's performance notes
//! record how).

/// Elements moved per iteration of the main loop of [`copy_run`] (as DPDK's 64-bit ring copy).
pub(crate) const UNROLL: usize = 4;

/// Copies `n` elements from `src` to `dst` without calling the C library: [`UNROLL`] elements
/// per loop iteration, then a tail of up to `UNROLL - 1` (see the module docs for why the loop
/// has this shape).
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `n` elements, both aligned for `T`,
/// and the two runs must not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_run<T: Copy>(src: *const T, dst: *mut T, n: usize) {
    let mut i = 0;
    while n - i >= UNROLL {
        // SAFETY: `i + UNROLL <= n`, so elements `i .. i + UNROLL` are inside both runs
        // (caller); the runs do not overlap, so reading all four before writing is the same as
        // copying one by one.
        unsafe {
            let (s, d) = (src.add(i), dst.add(i));
            let (a, b, c, e) = (s.read(), s.add(1).read(), s.add(2).read(), s.add(3).read());
            d.write(a);
            d.add(1).write(b);
            d.add(2).write(c);
            d.add(3).write(e);
        }
        i += UNROLL;
    }
    // SAFETY: `n - i < UNROLL` elements are left, and each arm touches exactly that many,
    // starting at `i` (inside both runs, caller).
    unsafe {
        let (s, d) = (src.add(i), dst.add(i));
        match n - i {
            0 => {}
            1 => d.write(s.read()),
            2 => {
                let (a, b) = (s.read(), s.add(1).read());
                d.write(a);
                d.add(1).write(b);
            }
            _ => {
                let (a, b, c) = (s.read(), s.add(1).read(), s.add(2).read());
                d.write(a);
                d.add(1).write(b);
                d.add(2).write(c);
            }
        }
    }
}

const _: () = assert!(
    UNROLL == 4,
    "the loop body and the tail above are written out for 4"
);
