//! Entry points for the fuzz targets `shm_msg`, `shm_seg` and `shm_keytable` in `fuzz/`
//! (compiled only with `--cfg fuzzing`, which `cargo fuzz` sets). Each feeds bytes a peer
//! wrote to one of the provider's decoders, in ordinary process memory instead of a shared
//! segment, and checks the contract the provider relies on. Not an API.

use std::ptr::NonNull;

use crate::layout::{KeyTable, UD_MTU, UdSegHeader, UdSegView, key_table_len, ud_seg_len};
use crate::msg::{HDR_LEN, MAX_FDS, MAX_MSG, Msg};
use crate::qpseg::inbound_kind::{SEND, SEND_IMM, SEND_INV, WRITE_IMM_INLINE, is_inline_send};
use crate::qpseg::{InboundSlot, QpSegHeader, QpSegView, SLOT_INLINE};
use crate::rc::widen_credit;

/// A control message (`Msg::decode`, as the service thread calls it on every datagram a
/// peer sends): never panics; what it accepts asks for at most [`MAX_FDS`] descriptors and
/// encodes back to a message that decodes to the same value.
pub fn cm_msg(bytes: &[u8]) {
    let Ok(m) = Msg::decode(bytes) else {
        return;
    };
    assert!(m.fd_count() <= MAX_FDS, "{} descriptors", m.fd_count());
    let mut out = Vec::new();
    m.encode(&mut out);
    assert!(out.len() >= HDR_LEN && out.len() <= MAX_MSG);
    assert_eq!(Msg::decode(&out), Ok(m));
}

/// Anonymous private memory standing in for a peer's segment: `len` bytes, page aligned,
/// reserved but not backed until touched (so a peer may claim up to a gigabyte cheaply).
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Self {
        let len = len.max(1);
        // SAFETY: an anonymous private mapping at an address the kernel picks; no existing
        // memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap of {len} bytes failed");
        Self {
            ptr: NonNull::new(p.cast()).expect("mmap never returns null on success"),
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped readable and writable, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn contains(&self, p: *const u8, n: usize) -> bool {
        let start = self.ptr.as_ptr() as usize;
        let p = p as usize;
        p >= start && p.checked_add(n).is_some_and(|e| e <= start + self.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, which nothing references now.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Largest segment a peer may claim here (a queue-pair segment at its limits is just over
/// 1 GiB).
const MAX_MAPPED: usize = (1 << 30) + (64 << 20);

/// A peer's queue-pair (`qp` true) or UD segment as `attach` validates it: `mapped` is the
/// length of the peer's memfd, `contents` the first bytes the peer wrote (header, then
/// whatever follows). Attaching never panics nor reads past `mapped`; an accepted layout
/// lies inside the mapping, and so does every slot and payload pointer the view hands out
/// for any message number `n`.
pub fn seg_attach(qp: bool, mapped: u32, n: u64, tail: u64, contents: &[u8]) {
    let mapped = (mapped as usize) % MAX_MAPPED;
    // Message numbers and datagram positions are this side's own counters from 0: they
    // never come near 2^64 (where `n + 1` would overflow).
    let n = n & ((1 << 48) - 1);
    let mut m = Mapping::new(mapped);
    let k = contents.len().min(m.len);
    m.bytes()[..k].copy_from_slice(&contents[..k]);
    let base = m.ptr.as_ptr();
    if qp {
        // SAFETY: `mapped` (at most m.len) bytes are mapped at `base`, page aligned, alive
        // until `m` drops at the end of this function.
        let Ok(v) = (unsafe { QpSegView::attach(base, mapped) }) else {
            return;
        };
        let l = v.layout;
        assert!(mapped >= size_of::<QpSegHeader>());
        assert!(l.total <= mapped, "layout {} > mapped {mapped}", l.total);
        assert!(l.rq_len_off + 4 * l.rq_cap as usize <= l.slots_off);
        let slot = size_of::<InboundSlot>();
        assert!(l.slots_off + slot * l.rq_cap as usize <= l.bounce_off);
        assert!(l.bounce_off + l.bounce_len as usize <= l.total);
        let inbound = v.pop(n);
        assert_eq!(v.has(n), inbound.is_some());
        if let Some(i) = inbound {
            // The slot's credit word (the peer's posted receives, low 32 bits) widened
            // against this side's count, here `tail`: it never goes back and never jumps
            // by 2^31 or more, whatever the peer wrote.
            let last = tail & ((1 << 48) - 1);
            let w = widen_credit(last, i.credit);
            assert!(
                w >= last && w - last < 1 << 31,
                "credit word {:#x} widened {last} to {w}",
                i.credit
            );
        }
        if let Some(i) = inbound.filter(|i| matches!(i.kind, SEND | SEND_IMM | SEND_INV)) {
            // `QpCore::land` copies a SEND's `len` bytes (a SEND with invalidate's too) from
            // what `bounce_payload` returns for it (given everything before `tail` was
            // released already): they must lie inside the bounce area.
            if let Some(p) = v.bounce_payload(tail, i.bounce_end, i.len) {
                let area = l.bounce_off..l.bounce_off + l.bounce_len as usize;
                let off = p as usize - base as usize;
                assert!(
                    off >= area.start && off + i.len as usize <= area.end,
                    "inbound SEND of {} bytes at bounce offset {} runs past the {}-byte \
                     bounce area",
                    i.len,
                    off - area.start,
                    l.bounce_len
                );
            }
        }
        if let Some(i) = inbound.filter(|i| i.kind == WRITE_IMM_INLINE || is_inline_send(i.kind)) {
            // `QpCore::land` copies an inline payload's `len` bytes (a placed WRITE's or a
            // small SEND's) from what `inline_src` returns for it: they must lie inside
            // message `n`'s own slot.
            if let Some(p) = v.inline_src(n, i.len) {
                let i_slot = (n & u64::from(l.rq_cap - 1)) as usize;
                let slot_at = l.slots_off + i_slot * slot;
                let off = p as usize - base as usize;
                assert!(
                    i.len as usize <= SLOT_INLINE
                        && off >= slot_at
                        && off + i.len as usize <= slot_at + slot,
                    "inline payload of {} bytes at {off} leaves slot {i_slot} at {slot_at}",
                    i.len
                );
            } else {
                assert!(i.len as usize > SLOT_INLINE, "{} bytes refused", i.len);
            }
        }
        assert!(m.contains(v.bounce_ptr(n), 0));
        let _ = v.peer_credit();
        let _ = v.recv_len(n);
    } else {
        // SAFETY: as above.
        let Ok(v) = (unsafe { UdSegView::attach(base, mapped) }) else {
            return;
        };
        assert!(mapped >= size_of::<UdSegHeader>());
        let nslots = v.header().nslots;
        assert!(ud_seg_len(nslots) <= mapped);
        let _ = v.recv(n, |src, meta| {
            assert!(
                meta.len as usize <= UD_MTU,
                "datagram of {} bytes",
                meta.len
            );
            assert!(
                m.contains(src, meta.len as usize),
                "payload outside the segment"
            );
        });
        let _ = v.reserved_unpublished(n);
    }
}

/// A peer's key table (`KeyTable::lookup`, then `KeySnap::covers`, as `RemotePd::translate`
/// uses them for every remote access): `entries` are raw 64-byte entries the peer wrote
/// from slot 0 on, `key`, `addr` and `len` what a remote access names. Never panics; a key
/// that resolves is the key asked for, and a range `covers` accepts lies inside the
/// registration in exact arithmetic (it may refuse one that only fits past 2^64).
pub fn key_table(header: &[u8], entries: &[u8], key: u32, addr: u64, len: u64) {
    let slots = 64;
    let mut m = Mapping::new(key_table_len(slots));
    let mapped = m.len;
    // The header as the peer wrote it (slot count included), then the entries.
    let h = header.len().min(64);
    m.bytes()[..h].copy_from_slice(&header[..h]);
    let room = m.len - 64;
    let k = entries.len().min(room);
    m.bytes()[64..64 + k].copy_from_slice(&entries[..k]);
    // SAFETY: `mapped` bytes are mapped at the pointer, page aligned, alive until `m`
    // drops; every field of the table is an integer or an atomic integer, valid for any
    // bit pattern.
    let Ok(kt) = (unsafe { KeyTable::attach(m.ptr.as_ptr(), mapped) }) else {
        return;
    };
    assert!(
        key_table_len(kt.slots()) <= mapped,
        "{} slots accepted",
        kt.slots()
    );
    if let Some(s) = kt.lookup(key) {
        assert_eq!(s.key, key);
        let exact = u128::from(addr) >= u128::from(s.base)
            && u128::from(addr) + u128::from(len) <= u128::from(s.base) + u128::from(s.len);
        assert!(
            !s.covers(addr, len) || exact,
            "covers({addr:#x}, {len}) of {s:?}"
        );
    }
}
