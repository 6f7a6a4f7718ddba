//! Plain process memory made shareable in place, for registrations with remote rights.
//!
//! # What it does
//!
//! [`share`] page-aligns the range, creates a memfd of that size, copies the range's
//! current bytes into it (`pwrite` from the range: the kernel reads them), and maps the
//! memfd `MAP_SHARED | MAP_FIXED` over the range. The program keeps its pointers and its
//! bytes; peers map the same memfd, so their RDMA WRITEs land in the program's memory.
//!
//! Shared ranges are remembered process-wide (a mapping belongs to the process, not to a
//! protection domain). A later registration inside one reuses its memfd. One that overlaps
//! ranges but extends past them converts the union (the overlapped ranges and the new pages)
//! into a new memfd, provided no registration still holds an overlapped range (its export
//! would silently stop backing the memory). Before every lookup the table is checked against
//! `/proc/self/maps`: ranges the program unmapped, moved (`mremap`, `realloc`) or mapped
//! over since are forgotten, never reused.
//!
//! # Consequences for the program
//!
//! These are the price of RDMA-style registration of ordinary memory; librdmacm's users meet
//! their own versions of them (`ibv_fork_init`, `RDMAV_FORK_SAFE`):
//!
//! * The pages stay shared memory after deregistration, until the program unmaps them.
//! * `fork` after the conversion is unsupported: the child shares the pages with its parent
//!   instead of getting copy-on-write copies.
//! * `madvise(MADV_DONTNEED)` and `MADV_FREE` no longer zero the pages: the bytes live in
//!   the memfd.
//! * The conversion is not atomic against *other threads* storing into the same pages: a
//!   store made between the copy and the remap is lost. Nor against other threads
//!   unmapping and remapping the pages in that window (which the registration contract
//!   already forbids for the registered range itself). Register buffers whose pages no
//!   other thread writes meanwhile; page-aligned allocations are safest (glibc serves large
//!   `malloc`s from mappings of their own).
//! * Only private, anonymous, readable and writable, non-executable memory (the heap,
//!   anonymous mappings) is converted. File mappings, shared anonymous memory, stacks and
//!   executable or read-only pages are refused: converting them would detach them from what
//!   backs them.
//! * Growing a converted mapping with `mremap` (glibc's `realloc` of a block it `mmap`ed,
//!   128 KiB and up by default) maps pages past the end of the memfd, and touching them
//!   raises `SIGBUS`: allocate a new buffer instead of growing a registered one. (The memfd
//!   cannot carry sparse room to grow into: peers check its size against the export.)
//! * Memfds replaced by a union stay exported (peers mapped them) until the protection
//!   domain is dropped, so growing one buffer step by step costs at most the sum of its
//!   sizes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::util::lock;

/// Export ids of in-place shares carry this bit, which mempool region ids (a counter
/// from 1) never reach, so the two never collide in a protection domain's export map.
const ID_BIT: u64 = 1 << 63;
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static SHARES: Mutex<Vec<Arc<Share>>> = Mutex::new(Vec::new());

/// One range of process memory shared in place.
#[derive(Debug)]
pub(crate) struct Share {
    /// First byte (page aligned).
    pub base: usize,
    /// Bytes (a page multiple).
    pub len: usize,
    /// The memfd now backing the range.
    pub fd: OwnedFd,
    /// Export id (never a mempool region id).
    pub id: u64,
    /// The memfd's inode: how its mappings are recognised in `/proc/self/maps`.
    ino: u64,
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// One line of `/proc/self/maps`.
#[derive(Debug)]
struct Vma {
    start: usize,
    end: usize,
    perms: [u8; 4],
    offset: u64,
    ino: u64,
    path: String,
}

fn parse_line(line: &str) -> Option<Vma> {
    // The first five fields are separated by single spaces; the path follows padding.
    let mut f = line.splitn(6, ' ');
    let (range, perms, offset, _dev, ino) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let path = f.next().unwrap_or("").trim_start().to_owned();
    let (s, e) = range.split_once('-')?;
    Some(Vma {
        start: usize::from_str_radix(s, 16).ok()?,
        end: usize::from_str_radix(e, 16).ok()?,
        perms: perms.as_bytes().try_into().ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        ino: ino.parse().ok()?,
        path,
    })
}

fn read_maps() -> Result<Vec<Vma>, String> {
    let text = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("reading /proc/self/maps: {e}"))?;
    Ok(text.lines().filter_map(parse_line).collect())
}

/// The mappings covering `[start, end)` in address order, if they leave no gap.
fn covering(vmas: &[Vma], start: usize, end: usize) -> Option<Vec<&Vma>> {
    let mut at = start;
    let mut out = Vec::new();
    for v in vmas {
        if v.end <= at {
            continue;
        }
        if v.start > at {
            return None;
        }
        out.push(v);
        at = v.end;
        if at >= end {
            return Some(out);
        }
    }
    None
}

/// True while `s`'s memfd still backs all of its range, at the offsets it was mapped at.
fn still_mapped(s: &Share, vmas: &[Vma]) -> bool {
    covering(vmas, s.base, s.base + s.len).is_some_and(|vs| {
        vs.iter().all(|v| {
            v.ino == s.ino
                && v.perms[3] == b's'
                && v.start >= s.base
                && v.offset == (v.start - s.base) as u64
        })
    })
}

/// True for memory that may be converted: private, anonymous, read-write, not
/// executable.
fn convertible(v: &Vma) -> bool {
    let anonymous =
        v.ino == 0 && (v.path.is_empty() || v.path == "[heap]" || v.path.starts_with("[anon:"));
    anonymous && &v.perms == b"rw-p"
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Makes `[addr, addr + len)` (an empty range counts as one byte) shareable, or finds it
/// shared already. Returns the share and the offset of `addr` in its memfd.
///
/// # Errors
/// A description of why the range cannot be shared: not all mapped, not private
/// anonymous read-write memory, overlapping a share that is still registered, or a
/// failed system call.
pub(crate) fn share(addr: usize, len: usize) -> Result<(Arc<Share>, usize), String> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len.max(1))
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or("the range runs past the end of the address space")?;
    let mut table = lock(&SHARES);
    let vmas = read_maps()?;
    table.retain(|s| still_mapped(s, &vmas));
    if let Some(s) = table
        .iter()
        .find(|s| s.base <= start && end <= s.base + s.len)
    {
        return Ok((s.clone(), addr - s.base));
    }
    let overlapped: Vec<Arc<Share>> = table
        .iter()
        .filter(|s| s.base < end && start < s.base + s.len)
        .cloned()
        .collect();
    // The table holds one reference and `overlapped` another; more are registrations.
    if let Some(s) = overlapped.iter().find(|s| Arc::strong_count(s) > 2) {
        return Err(format!(
            "it overlaps pages {:#x}..{:#x}, shared in place and still registered; \
             deregister them first, or register a range inside them",
            s.base,
            s.base + s.len
        ));
    }
    let ustart = overlapped.iter().map(|s| s.base).fold(start, usize::min);
    let uend = overlapped
        .iter()
        .map(|s| s.base + s.len)
        .fold(end, usize::max);
    let vs = covering(&vmas, ustart, uend)
        .ok_or_else(|| format!("{ustart:#x}..{uend:#x} is not all mapped"))?;
    for v in vs {
        let ours = overlapped.iter().any(|s| s.ino == v.ino);
        if !ours && !convertible(v) {
            return Err(format!(
                "{:#x}..{:#x} is a {} mapping of '{}', not private anonymous read-write \
                 memory",
                v.start,
                v.end,
                String::from_utf8_lossy(&v.perms),
                v.path
            ));
        }
    }
    let ulen = uend - ustart;
    // Relaxed: the counter only has to hand out distinct values; nothing is published
    // through it.
    let id = ID_BIT | NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let fd = memfd(id, ulen)?;
    let mut done = 0usize;
    while done < ulen {
        // SAFETY: the kernel reads [ustart + done, uend), which /proc/self/maps showed
        // mapped and readable; if another thread unmapped it since, pwrite fails with
        // EFAULT (the kernel checks user pointers), nothing is read out of bounds.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                (ustart + done) as *const libc::c_void,
                ulen - done,
                done as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(os_err("copying the pages into the memfd"));
        }
        done += n as usize;
    }
    // SAFETY: replaces [ustart, uend), which holds only private anonymous memory or our
    // own earlier shares of it (checked above), with the memfd holding the same bytes: the
    // program keeps its addresses and contents. The range is page aligned and mapped.
    let p = unsafe {
        libc::mmap(
            ustart as *mut libc::c_void,
            ulen,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED || p as usize != ustart {
        return Err(os_err("mapping the memfd over the pages"));
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one stat into the buffer we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(os_err("fstat of the memfd"));
    }
    // SAFETY: fstat succeeded, so it initialised the buffer.
    let ino = unsafe { st.assume_init() }.st_ino;
    table.retain(|s| !overlapped.iter().any(|o| Arc::ptr_eq(o, s)));
    let s = Arc::new(Share {
        base: ustart,
        len: ulen,
        fd,
        id,
        ino,
    });
    table.push(s.clone());
    Ok((s, addr - ustart))
}

fn memfd(id: u64, len: usize) -> Result<OwnedFd, String> {
    let name = format!("dp-inplace-{}\0", id & !ID_BIT);
    // SAFETY: name is NUL-terminated and outlives the call.
    let raw = unsafe { libc::memfd_create(name.as_ptr().cast(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = libc::off_t::try_from(len).map_err(|_| "range too large".to_owned())?;
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(os_err("sizing the memfd"));
    }
    Ok(fd)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A private anonymous mapping of `pages` pages that no other test thread touches
    /// (heap pages could be written by other tests during a conversion).
    pub(crate) struct Anon {
        pub ptr: *mut u8,
        pub len: usize,
    }

    impl Anon {
        pub(crate) fn new(pages: usize) -> Self {
            let len = pages * page_size();
            // SAFETY: a fresh anonymous mapping; no address hint.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "mmap");
            Self { ptr: p.cast(), len }
        }

        pub(crate) fn get(&self, i: usize) -> u8 {
            assert!(i < self.len);
            // SAFETY: in bounds of our live mapping; volatile because peers and the
            // memfd write it behind the compiler's back.
            unsafe { self.ptr.add(i).read_volatile() }
        }

        pub(crate) fn set(&self, i: usize, v: u8) {
            assert!(i < self.len);
            // SAFETY: as in get.
            unsafe { self.ptr.add(i).write_volatile(v) }
        }
    }

    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: unmapping the mapping we made; nothing refers to it any more.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    fn backing_ino(addr: usize) -> Option<(u64, String)> {
        let vmas = read_maps().unwrap();
        let v = vmas.iter().find(|v| v.start <= addr && addr < v.end)?;
        Some((v.ino, v.path.clone()))
    }

    fn pread(fd: &OwnedFd, off: usize) -> u8 {
        let mut b = 0u8;
        // SAFETY: reading one byte into a live local.
        let n = unsafe { libc::pread(fd.as_raw_fd(), (&raw mut b).cast(), 1, off as libc::off_t) };
        assert_eq!(n, 1);
        b
    }

    #[test]
    fn keeps_address_and_bytes_and_reuses_ranges() {
        let page = page_size();
        let m = Anon::new(4);
        let base = m.ptr as usize;
        for i in 0..m.len {
            m.set(i, (i % 251) as u8);
        }
        let (s, off) = share(base + 100, 5000).unwrap();
        assert_eq!(
            (s.base, s.len, off),
            (base, 5000usize.div_ceil(page) * page, 100)
        );
        for i in 0..m.len {
            assert_eq!(m.get(i), (i % 251) as u8, "byte {i} changed");
        }
        let (ino, path) = backing_ino(base).unwrap();
        assert!(path.starts_with("/memfd:dp-inplace-"), "backed by {path}");
        assert_ne!(ino, 0);
        // The memory and the memfd are one: stores show through both ways.
        m.set(7, 0xAB);
        assert_eq!(pread(&s.fd, 7), 0xAB);
        let v = 0x5Au8;
        // SAFETY: writing one byte from a live local.
        let n = unsafe { libc::pwrite(s.fd.as_raw_fd(), (&raw const v).cast(), 1, 9) };
        assert_eq!(n, 1);
        assert_eq!(m.get(9), 0x5A);
        // A range inside is the same share.
        let (s2, off2) = share(base + 200, 10).unwrap();
        assert!(Arc::ptr_eq(&s, &s2));
        assert_eq!(off2, 200);
        drop(s2);

        // Growing past it while it is held (a live registration) is refused ...
        let held = s.clone();
        let e = share(base, 3 * page).unwrap_err();
        assert!(e.contains("still registered"), "{e}");
        drop(held);
        drop(s);
        // ... and converts the union once nothing holds it, keeping every byte.
        let (u, off) = share(base + page, 2 * page).unwrap();
        assert_eq!((u.base, u.len, off), (base, 3 * page, page));
        for i in 0..m.len {
            let want = match i {
                7 => 0xAB,
                9 => 0x5A,
                _ => (i % 251) as u8,
            };
            assert_eq!(m.get(i), want, "byte {i} after the union");
        }
        assert_eq!(pread(&u.fd, 9), 0x5A);
    }

    #[test]
    fn forgets_ranges_that_were_mapped_over() {
        let m = Anon::new(2);
        let (s, _) = share(m.ptr as usize, 10).unwrap();
        let first = s.id;
        drop(s);
        // The program maps fresh anonymous memory over the range (as free + malloc may).
        // SAFETY: replaces our own test mapping, which nothing else refers to.
        let p = unsafe {
            libc::mmap(
                m.ptr.cast(),
                m.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p.cast(), m.ptr);
        m.set(3, 42);
        let (s, _) = share(m.ptr as usize, 10).unwrap();
        assert_ne!(s.id, first, "a stale share was reused");
        assert_eq!(m.get(3), 42);
    }

    #[test]
    fn refuses_what_it_must_not_convert() {
        // A read-only mapping.
        let m = Anon::new(1);
        // SAFETY: changing the protection of our own mapping, which nothing writes.
        let rc = unsafe { libc::mprotect(m.ptr.cast(), m.len, libc::PROT_READ) };
        assert_eq!(rc, 0, "mprotect");
        let e = share(m.ptr as usize, 16).unwrap_err();
        assert!(e.contains("not private anonymous"), "{e}");
        // Shared anonymous memory.
        // SAFETY: a fresh shared anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let e = share(p as usize, 16).unwrap_err();
        assert!(e.contains("not private anonymous"), "{e}");
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(p, page_size()) };
    }

    #[test]
    fn parses_maps_and_finds_gaps() {
        let v = parse_line(
            "7f95f35bb000-7f95f35bd000 rw-s 00001000 00:01 93386                      \
             /memfd:dp-inplace-7 (deleted)",
        )
        .unwrap();
        assert_eq!(
            (v.start, v.end, v.offset, v.ino),
            (0x7f95f35bb000, 0x7f95f35bd000, 0x1000, 93386)
        );
        assert_eq!(
            (&v.perms, v.path.as_str()),
            (b"rw-s", "/memfd:dp-inplace-7 (deleted)")
        );
        let anon = parse_line("1000-3000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(convertible(&anon) && anon.path.is_empty());
        let vmas = [
            anon,
            parse_line("3000-4000 rw-p 00000000 00:00 0      [heap]").unwrap(),
            parse_line("5000-6000 rw-p 00000000 00:00 0").unwrap(),
        ];
        assert_eq!(covering(&vmas, 0x1000, 0x4000).map(|v| v.len()), Some(2));
        assert!(covering(&vmas, 0x2000, 0x5800).is_none(), "gap at 0x4000");
        assert!(
            covering(&vmas, 0x5000, 0x7000).is_none(),
            "runs past the end"
        );
    }
}
