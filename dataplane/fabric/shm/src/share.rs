//! Memory shared with peers for remote access: one dedicated memfd per registered range.
//!
//! A peer that is sent a memfd can map *all* of it, whatever a key says, for as long as it
//! keeps the descriptor. So the memory a remote registration names must live in a memfd
//! that holds nothing else, and the memory must stop being that memfd when the
//! registration ends. [`share_region`] and [`share_raw`] do both:
//!
//! * **On registration** the page-aligned range is copied into a fresh memfd (sealed
//!   against resizing, so no peer can truncate it under us), which is then mapped
//!   `MAP_SHARED | MAP_FIXED` over the same addresses: the program keeps its pointers and
//!   its bytes, and peers that map the memfd reach exactly these pages. A registration
//!   that grants peers no write right gets a memfd sealed with `F_SEAL_FUTURE_WRITE`:
//!   peers can only map it read-only.
//! * **When the last registration of the range ends** ([`Share`] is dropped) the bytes are
//!   copied back into what backed the range before (the region's own memfd, or private
//!   anonymous memory) and that is mapped over the range again. From then on nothing a
//!   peer does with its old mapping or descriptor reaches the program's memory: a late
//!   write lands in pages nobody else maps. When the memory is about to be freed anyway
//!   (the registration held the last reference to its region) the copy is skipped
//!   ([`Share::skip_restore`]).
//!
//! Ranges are shared whole pages at a time (2 MiB pages for hugepage regions): a
//! registration exposes the rest of its first and last page too, and two registrations that
//! touch the same page share one memfd (and the weaker of their protections). A range that
//! overlaps a shared range without lying inside it is refused.
//!
//! # What it costs the program
//!
//! * Registering and deregistering copy the range. Other threads must not store into the
//!   range's pages meanwhile (a store between the copy and the remap is lost), nor unmap
//!   or remap them (which the registration contract forbids anyway).
//! * While registered, a range of a *shareable region* is backed by its own memfd: other
//!   processes that map the region through its own handle do not see changes to those
//!   pages until the registration ends (the bytes are then written back).
//! * While registered, `fork` shares the pages with the child instead of copying them, and
//!   `madvise(MADV_DONTNEED)` no longer zeroes them.
//! * Only private anonymous read-write memory (the heap, anonymous mappings) and the
//!   memory of mempool regions is shared. File mappings, stacks, shared anonymous memory
//!   and executable or read-only pages are refused.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use mempool::memory::{Region, registry};

use crate::util::lock;

/// Every share of this process (mappings belong to the process, not to a protection
/// domain), for finding the share of a range that is registered again.
///
/// An entry keeps the range and rights beside the `Weak`, so a lookup never has to take a
/// strong reference to a share it does not want: a transient reference taken by one
/// thread's lookup would turn it into the last holder when the registering thread
/// deregisters, and its drop would then copy the pages back after their region was
/// unmapped (a SIGSEGV seen in `rsocket_shm`), or over whatever reused the addresses.
///
/// An entry leaves the table only once its share has given the pages their memory back
/// ([`Share`]'s drop removes it), so a range whose entry is dead (no strong reference) is
/// being restored right now: a new registration of it waits for that to finish instead of
/// mapping a new memfd that the restore would then map over.
static SHARES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// One share in [`SHARES`].
#[derive(Debug)]
struct Entry {
    base: usize,
    len: usize,
    writable: bool,
    share: Weak<Share>,
}

/// What backed a range before it was shared, and is put back afterwards.
#[derive(Debug)]
enum Backing {
    /// Private anonymous memory.
    Anon,
    /// A mempool region's memfd, at `offset`. The region's base address finds the memfd
    /// in mempool's registry when it is needed (holding a descriptor per share would cost
    /// one per connection).
    File { region_base: usize, offset: u64 },
}

/// One range of process memory backed by a memfd of its own while it is registered for
/// remote access.
#[derive(Debug)]
pub(crate) struct Share {
    /// First byte (page aligned).
    pub base: usize,
    /// Bytes (a page multiple).
    pub len: usize,
    /// Page size of the memfd (the base page, or 2 MiB for hugepage regions).
    pub page: usize,
    /// The memfd backing the range, sealed against resizing; the one peers are sent.
    pub fd: OwnedFd,
    /// Whether peers may map it writable (otherwise it is sealed against new writable
    /// mappings).
    pub writable: bool,
    /// The memfd's inode: how its mapping is recognised in `/proc/self/maps`.
    ino: u64,
    backing: Backing,
    /// The original range was `mlock`ed (the replacement is locked too).
    locked: bool,
    /// Put the original backing back on drop.
    restore: AtomicBool,
    /// Raw process memory (not a mempool region's).
    raw: bool,
}

impl Share {
    /// The memory is being freed: do not copy it back on drop.
    pub(crate) fn skip_restore(&self) {
        // Relaxed: read by the drop of the last reference, which the Arc orders after this.
        self.restore.store(false, Ordering::Relaxed);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.give_back();
        // Only now may the range be shared again (see SHARES). Entries do not overlap, so
        // the base names this share's entry; the dead-weak check keeps a live entry of the
        // same base safe should one ever exist.
        let mut table = lock(&SHARES);
        if let Some(i) = table
            .iter()
            .position(|e| e.base == self.base && e.share.strong_count() == 0)
        {
            table.swap_remove(i);
        }
    }
}

impl Share {
    /// Puts the pages' original backing back, unless the memory is being freed or (raw
    /// memory) is no longer ours.
    fn give_back(&self) {
        // Relaxed: see skip_restore.
        if !self.restore.load(Ordering::Relaxed) {
            return;
        }
        // Raw memory: if the program unmapped or replaced the range meanwhile (breaking the
        // registration contract), it is not ours to touch. A region's range is mapped for
        // sure (the registration keeps the region), and the check would cost a read of
        // /proc/self/maps per deregistration, which is long in a process with many
        // connections.
        if self.raw {
            let Ok(vmas) = read_maps() else {
                return;
            };
            if !still_mapped(self, &vmas) {
                return;
            }
        }
        if let Err(e) = restore(self) {
            // Nothing safe is left to do: the range stays backed by the shared memfd.
            eprintln!(
                "dataplane shm: could not give {:#x}..{:#x} its own memory back after \
                 deregistration ({e}); it stays shared with the peers it was exported to",
                self.base,
                self.base + self.len
            );
        }
    }
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

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Shares `[off, off + len)` of `region` (an empty range counts as one byte) for remote
/// access, or finds it shared already. Returns the share and the offset of the first byte
/// in its memfd.
///
/// # Errors
/// Why the range cannot be shared (overlap with another shared range, a read-only share
/// asked to become writable, a failed system call).
pub(crate) fn share_region(
    region: &Region,
    off: usize,
    len: usize,
    writable: bool,
) -> Result<(Arc<Share>, usize), String> {
    let addr = region.as_ptr() as usize + off;
    let page = region.page_size();
    let backing = match region.share_handle() {
        Some(_) => Origin::Region(region.as_ptr() as usize),
        // A region without a memfd is private anonymous memory (normal or hugepages).
        None => Origin::Anon,
    };
    share_range(addr, len, page, backing, region.is_locked(), writable)
}

/// Shares raw process memory `[addr, addr + len)` for remote access (see [`share_region`]):
/// memory of a mempool region, or private anonymous read-write memory.
///
/// # Errors
/// As [`share_region`], and memory of any other kind.
pub(crate) fn share_raw(
    addr: usize,
    len: usize,
    writable: bool,
) -> Result<(Arc<Share>, usize), String> {
    if let Some(r) = registry::find(addr, len.max(1)) {
        return share_range(
            addr,
            len,
            r.page_size,
            Origin::Region(r.region_base),
            false,
            writable,
        );
    }
    share_range(addr, len, page_size(), Origin::Unknown, false, writable)
}

/// What a range to share is known to be.
enum Origin {
    /// In a region with a memfd (the region's base address).
    Region(usize),
    /// Private anonymous memory of a region.
    Anon,
    /// Raw memory: `/proc/self/maps` says.
    Unknown,
}

fn share_range(
    addr: usize,
    len: usize,
    page: usize,
    backing: Origin,
    locked: bool,
    writable: bool,
) -> Result<(Arc<Share>, usize), String> {
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len.max(1))
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or("the range runs past the end of the address space")?;
    let mut table = loop {
        let table = lock(&SHARES);
        let Some(e) = table
            .iter()
            .find(|e| e.base < end && start < e.base + e.len)
        else {
            break table;
        };
        let inside = e.base <= start && end <= e.base + e.len;
        let (base, top, shared_writable) = (e.base, e.base + e.len, e.writable);
        let Some(s) = e.share.upgrade() else {
            // Being given back by its last holder on another thread: wait for it to leave
            // the table (a deregistration's copy, a short wait on the control path).
            drop(table);
            std::thread::yield_now();
            continue;
        };
        // Never drop a share while holding the table: it may be the last reference now,
        // and its drop takes the table.
        drop(table);
        if !inside {
            return Err(format!(
                "it overlaps pages {base:#x}..{top:#x}, registered for remote access; register \
                 a range inside them or outside them, or deregister them first"
            ));
        }
        if writable && !shared_writable {
            return Err(format!(
                "pages {base:#x}..{top:#x} are registered read-only for remote access \
                 already; register them with the same rights, or deregister them first"
            ));
        }
        return Ok((s, addr - base));
    };
    let unknown = matches!(backing, Origin::Unknown);
    let backing = match backing {
        Origin::Region(region_base) => Backing::File {
            region_base,
            offset: (start - region_base) as u64,
        },
        Origin::Anon => Backing::Anon,
        Origin::Unknown => {
            let vmas = read_maps()?;
            let vs = covering(&vmas, start, end)
                .ok_or_else(|| format!("{start:#x}..{end:#x} is not all mapped"))?;
            if let Some(v) = vs.iter().find(|v| !convertible(v)) {
                return Err(format!(
                    "{:#x}..{:#x} is a {} mapping of '{}', not private anonymous read-write \
                     memory",
                    v.start,
                    v.end,
                    String::from_utf8_lossy(&v.perms),
                    v.path
                ));
            }
            Backing::Anon
        }
    };
    let raw = unknown;
    let s = Arc::new(convert(
        start,
        end - start,
        page,
        backing,
        locked,
        writable,
        raw,
    )?);
    table.push(Entry {
        base: s.base,
        len: s.len,
        writable: s.writable,
        share: Arc::downgrade(&s),
    });
    drop(table);
    Ok((s, addr - start))
}

/// Copies `[start, start + len)` into a fresh sealed memfd and maps it over the range.
fn convert(
    start: usize,
    len: usize,
    page: usize,
    backing: Backing,
    locked: bool,
    writable: bool,
    raw: bool,
) -> Result<Share, String> {
    let huge = page > page_size();
    let fd = memfd(start, len, huge)?;
    // Copy through a temporary mapping (hugetlbfs files take no write(2)).
    // SAFETY: no fixed address: a fresh mapping.
    let tmp = unsafe { map(None, len, &fd, 0, libc::MAP_SHARED) }?;
    // SAFETY: tmp is a fresh writable mapping of len bytes; [start, start + len) is mapped
    // and readable (the caller checked it, or it is a live region's memory).
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, tmp, len) };
    // SAFETY: replaces [start, start + len), which holds the caller's registered memory,
    // with the memfd now holding the same bytes: the program keeps its addresses and
    // contents. The range is page aligned and mapped.
    let placed = unsafe { map(Some(start), len, &fd, 0, libc::MAP_SHARED) };
    // SAFETY: unmapping the temporary mapping made above, used by nobody else.
    unsafe { libc::munmap(tmp.cast(), len) };
    placed?;
    if locked {
        // SAFETY: mlock of our own live mapping; failure only costs residency.
        unsafe { libc::mlock(start as *const libc::c_void, len) };
    }
    if !writable {
        seal(&fd, libc::F_SEAL_FUTURE_WRITE)?;
    }
    let ino = inode(&fd)?;
    Ok(Share {
        base: start,
        len,
        page,
        fd,
        writable,
        ino,
        backing,
        locked,
        restore: AtomicBool::new(true),
        raw,
    })
}

/// Puts the original backing back under `s`'s range, with the range's current bytes.
fn restore(s: &Share) -> Result<(), String> {
    let huge = s.page > page_size();
    match &s.backing {
        Backing::File {
            region_base,
            offset,
        } => {
            // The region's memfd, from mempool's registry (which lists it while it lives).
            let r = registry::find(*region_base, 1)
                .filter(|r| r.region_base == *region_base)
                .ok_or("the region is gone")?;
            let fd = &r.fd;
            // SAFETY: no fixed address: a fresh mapping.
            let tmp = unsafe { map(None, s.len, fd, *offset, libc::MAP_SHARED) }?;
            // SAFETY: tmp is a fresh writable mapping of len bytes of the region's memfd;
            // the source is our live mapping of the share.
            unsafe { std::ptr::copy_nonoverlapping(s.base as *const u8, tmp, s.len) };
            // SAFETY: unmapping the temporary mapping made above.
            unsafe { libc::munmap(tmp.cast(), s.len) };
            // SAFETY: maps the region's own memfd back at its own offset over the share's
            // range, which is ours (still mapped from our memfd, checked by the caller).
            unsafe { map(Some(s.base), s.len, fd, *offset, libc::MAP_SHARED) }.map(drop)?;
        }
        Backing::Anon => {
            let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            if huge {
                flags |= libc::MAP_HUGETLB;
            }
            // SAFETY: a fresh anonymous mapping, no address hint.
            let tmp = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    s.len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    -1,
                    0,
                )
            };
            if tmp == libc::MAP_FAILED {
                return Err(os_err(
                    "allocating private memory to copy the pages back into",
                ));
            }
            // SAFETY: tmp holds s.len fresh writable bytes; the source is our live share.
            unsafe { std::ptr::copy_nonoverlapping(s.base as *const u8, tmp.cast(), s.len) };
            // SAFETY: moves the private copy over the share's range, replacing it in one
            // step; both ranges are page aligned and s.len long.
            let p = unsafe {
                libc::mremap(
                    tmp,
                    s.len,
                    s.len,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    s.base as *mut libc::c_void,
                )
            };
            if p == libc::MAP_FAILED {
                let e = os_err("moving the private copy over the pages");
                // SAFETY: the copy was not moved; unmap it.
                unsafe { libc::munmap(tmp, s.len) };
                return Err(e);
            }
        }
    }
    if s.locked {
        // SAFETY: mlock of our own live mapping.
        unsafe { libc::mlock(s.base as *const libc::c_void, s.len) };
    }
    Ok(())
}

/// `mmap(at, len, RW, flags | (at ? MAP_FIXED : 0), fd, offset)`.
///
/// # Safety
/// With `at`, `[at, at + len)` must be memory of this process that the caller may replace:
/// whatever is mapped there now is gone.
unsafe fn map(
    at: Option<usize>,
    len: usize,
    fd: &OwnedFd,
    offset: u64,
    flags: libc::c_int,
) -> Result<*mut u8, String> {
    let off = libc::off_t::try_from(offset).map_err(|_| "offset too large".to_owned())?;
    let (hint, fixed) = match at {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: a mapping of a descriptor we hold; with MAP_FIXED the caller guarantees the
    // range is its own memory to replace (function contract).
    let p = unsafe {
        libc::mmap(
            hint,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | fixed,
            fd.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED || at.is_some_and(|a| p as usize != a) {
        return Err(os_err("mapping a memfd"));
    }
    Ok(p.cast())
}

fn seal(fd: &OwnedFd, seals: libc::c_int) -> Result<(), String> {
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_err("sealing the memfd"));
    }
    Ok(())
}

fn inode(fd: &OwnedFd) -> Result<u64, String> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one stat into the buffer we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(os_err("fstat of the memfd"));
    }
    // SAFETY: fstat succeeded, so it initialised the buffer.
    Ok(unsafe { st.assume_init() }.st_ino)
}

/// A memfd of `len` bytes, sealed against resizing.
fn memfd(start: usize, len: usize, huge: bool) -> Result<OwnedFd, String> {
    let name = format!("dp-shm-share-{start:x}\0");
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if huge {
        flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
    }
    // SAFETY: name is NUL-terminated and outlives the call.
    let raw = unsafe { libc::memfd_create(name.as_ptr().cast(), flags) };
    if raw < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len).map_err(|_| "range too large".to_owned())?;
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(os_err("sizing the memfd"));
    }
    seal(&fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
    Ok(fd)
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

#[cfg(test)]
pub(crate) mod tests {
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

    fn backing(addr: usize) -> Option<(u64, String)> {
        let vmas = read_maps().unwrap();
        let v = vmas.iter().find(|v| v.start <= addr && addr < v.end)?;
        Some((v.ino, v.path.clone()))
    }

    /// What a peer does with a memfd it was sent: maps all of it, writable if it can.
    fn peer_map(fd: &OwnedFd, len: usize, prot: libc::c_int) -> Option<*mut u8> {
        // SAFETY: a fresh shared mapping of a descriptor we hold.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(p.cast())
    }

    #[test]
    fn keeps_address_and_bytes_and_reuses_ranges() {
        let page = page_size();
        let m = Anon::new(4);
        let base = m.ptr as usize;
        for i in 0..m.len {
            m.set(i, (i % 251) as u8);
        }
        let (s, off) = share_raw(base + 100, 5000, true).unwrap();
        assert_eq!(
            (s.base, s.len, off),
            (base, 5000usize.div_ceil(page) * page, 100)
        );
        for i in 0..m.len {
            assert_eq!(m.get(i), (i % 251) as u8, "byte {i} changed");
        }
        let (ino, path) = backing(base).unwrap();
        assert!(path.starts_with("/memfd:dp-shm-share-"), "backed by {path}");
        assert_ne!(ino, 0);
        // The memory and the memfd are one: a peer's store shows through.
        let peer = peer_map(&s.fd, s.len, libc::PROT_READ | libc::PROT_WRITE).unwrap();
        // SAFETY: inside the peer mapping of s.len bytes.
        unsafe { peer.add(9).write_volatile(0x5A) };
        assert_eq!(m.get(9), 0x5A);
        // A range inside is the same share.
        let (s2, off2) = share_raw(base + 200, 10, true).unwrap();
        assert!(Arc::ptr_eq(&s, &s2));
        assert_eq!(off2, 200);
        // A range that overlaps without lying inside is refused.
        let e = share_raw(base + page, 3 * page, true).unwrap_err();
        assert!(e.contains("overlaps"), "{e}");
        drop(s2);
        // SAFETY: unmapping the peer mapping made above.
        unsafe { libc::munmap(peer.cast(), s.len) };
    }

    /// The rule the whole module exists for: once the registration ends, a peer that kept
    /// its mapping (or its descriptor) writes into pages the program no longer sees.
    #[test]
    fn a_write_after_deregistration_does_not_reach_the_memory() {
        let m = Anon::new(2);
        let base = m.ptr as usize;
        m.set(0, 1);
        let (s, _) = share_raw(base, 10, true).unwrap();
        let peer = peer_map(&s.fd, s.len, libc::PROT_READ | libc::PROT_WRITE).unwrap();
        // SAFETY: inside the peer mapping.
        unsafe { peer.write_volatile(2) };
        assert_eq!(m.get(0), 2, "a write during the registration was lost");
        let len = s.len;
        drop(s);
        assert_eq!(
            m.get(0),
            2,
            "the bytes were not kept when the memory was given back"
        );
        let (ino, path) = backing(base).unwrap();
        assert!(
            ino == 0 && !path.contains("memfd"),
            "still backed by {path}"
        );
        // SAFETY: inside the peer mapping, which the peer still holds.
        unsafe { peer.write_volatile(3) };
        m.set(1, 4);
        assert_eq!(m.get(0), 2, "a late write reached deregistered memory");
        // SAFETY: unmapping the peer mapping made above.
        unsafe { libc::munmap(peer.cast(), len) };
    }

    /// A mempool region's range goes back to the region's own memfd, with its bytes, so
    /// the region's other sharers see them again.
    #[test]
    fn a_region_range_goes_back_to_the_region() {
        let r = Region::new(
            &mempool::memory::RegionConfig::new("t-share-region", 4 * page_size())
                .shareable(true)
                .no_huge()
                .quiet(),
        )
        .unwrap();
        let other = Region::from_shared_quiet(
            r.share_handle().unwrap().fd.try_clone_to_owned().unwrap(),
            r.len(),
            r.page_size(),
            "t-share-other",
        )
        .unwrap();
        let (s, off) = share_region(&r, page_size(), 100, true).unwrap();
        assert_eq!(off, 0);
        r.store_u8(page_size() + 5, 77);
        assert_ne!(
            other.load_u8(page_size() + 5),
            77,
            "the range is still the region's"
        );
        let peer = peer_map(&s.fd, s.len, libc::PROT_READ | libc::PROT_WRITE).unwrap();
        let len = s.len;
        drop(s);
        assert_eq!(other.load_u8(page_size() + 5), 77, "bytes not written back");
        // SAFETY: inside the peer mapping.
        unsafe { peer.write_volatile(9) };
        assert_eq!(r.load_u8(page_size()), 0, "a late write reached the region");
        // SAFETY: unmapping the peer mapping made above.
        unsafe { libc::munmap(peer.cast(), len) };
    }

    /// Another thread's registrations, looking up the table while this thread deregisters,
    /// never hold this thread's share: when the last registration ends the pages are the
    /// region's own again at once, before the region is freed. (A lookup used to hold every
    /// live share for a moment; the deregistering thread's drop was then not the last, and
    /// the other thread copied the pages back later, after the region was unmapped: a
    /// SIGSEGV in `rsocket_shm` about one run in six.)
    #[test]
    fn other_threads_lookups_never_keep_a_share_alive() {
        let stop = AtomicBool::new(false);
        let region = |name| {
            Region::new(
                &mempool::memory::RegionConfig::new(name, 2 * page_size())
                    .shareable(true)
                    .no_huge()
                    .quiet(),
            )
            .unwrap()
        };
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let r = region("t-share-looker");
                // Relaxed: a stop flag, nothing is published through it.
                while !stop.load(Ordering::Relaxed) {
                    drop(share_region(&r, 0, 10, true).unwrap());
                }
            });
            /// Stops the looking thread however the loop below ends (a failed assertion
            /// must not leave the scope waiting for it).
            struct Stop<'a>(&'a AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    // Relaxed: a stop flag.
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = Stop(&stop);
            for i in 0..1500u32 {
                let r = region("t-share-owner");
                let own = backing(r.as_ptr() as usize).unwrap();
                let (s, _) = share_region(&r, 0, 10, true).unwrap();
                r.store_u8(3, i as u8);
                drop(s);
                assert_eq!(
                    backing(r.as_ptr() as usize).unwrap(),
                    own,
                    "round {i}: the registration ended but the pages are still shared"
                );
                assert_eq!(r.load_u8(3), i as u8, "round {i}: bytes not given back");
            }
        });
    }

    /// A registration peers may only read cannot be mapped writable by a peer.
    #[test]
    fn a_read_only_share_cannot_be_mapped_writable() {
        let m = Anon::new(1);
        let (s, _) = share_raw(m.ptr as usize, 10, false).unwrap();
        assert!(peer_map(&s.fd, s.len, libc::PROT_READ | libc::PROT_WRITE).is_none());
        let ro = peer_map(&s.fd, s.len, libc::PROT_READ).unwrap();
        m.set(3, 33);
        // SAFETY: inside the read-only peer mapping.
        assert_eq!(unsafe { ro.add(3).read_volatile() }, 33);
        let e = share_raw(m.ptr as usize, 10, true).unwrap_err();
        assert!(e.contains("read-only"), "{e}");
        // A peer cannot truncate it either.
        // SAFETY: ftruncate on a descriptor we hold.
        assert_ne!(unsafe { libc::ftruncate(s.fd.as_raw_fd(), 0) }, 0);
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(ro.cast(), s.len) };
    }

    #[test]
    fn refuses_what_it_must_not_convert() {
        // A read-only mapping.
        let m = Anon::new(1);
        // SAFETY: changing the protection of our own mapping, which nothing writes.
        let rc = unsafe { libc::mprotect(m.ptr.cast(), m.len, libc::PROT_READ) };
        assert_eq!(rc, 0, "mprotect");
        let e = share_raw(m.ptr as usize, 16, true).unwrap_err();
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
        let e = share_raw(p as usize, 16, true).unwrap_err();
        assert!(e.contains("not private anonymous"), "{e}");
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(p, page_size()) };
    }

    #[test]
    fn parses_maps_and_finds_gaps() {
        let v = parse_line(
            "7f95f35bb000-7f95f35bd000 rw-s 00001000 00:01 93386                      \
             /memfd:dp-shm-share-7 (deleted)",
        )
        .unwrap();
        assert_eq!(
            (v.start, v.end, v.offset, v.ino),
            (0x7f95f35bb000, 0x7f95f35bd000, 0x1000, 93386)
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
    }
}
