//! A fixed-capacity byte buffer for partial sends and receives, and frame encoding into it.

use crate::msg::{self, HEADER_LEN, Msg};
use crate::payload::{self, Payloads};

/// Bytes `[head, tail)` of a fixed allocation; compacts (moves the data to the front) only
/// when the free space at the end is too small.
pub(super) struct ByteBuf {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
}

impl ByteBuf {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            buf: vec![0; capacity].into_boxed_slice(),
            head: 0,
            tail: 0,
        }
    }

    /// The buffered bytes.
    pub(super) fn data(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    pub(super) fn len(&self) -> usize {
        self.tail - self.head
    }

    pub(super) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Free bytes, counting the room compaction would make.
    pub(super) fn free(&self) -> usize {
        self.buf.len() - self.len()
    }

    /// Drops `n` bytes from the front.
    pub(super) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.head += n;
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        }
    }

    /// At least `n` contiguous free bytes at the end (compacting if needed), or `None` if
    /// the buffer cannot hold `n` more.
    pub(super) fn reserve(&mut self, n: usize) -> Option<&mut [u8]> {
        if self.free() < n {
            return None;
        }
        if self.buf.len() - self.tail < n {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        Some(&mut self.buf[self.tail..])
    }

    /// All the free space at the end, compacting first when the front has more.
    pub(super) fn spare(&mut self) -> &mut [u8] {
        if self.head > self.buf.len() - self.tail {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        &mut self.buf[self.tail..]
    }

    /// Marks `n` bytes after the data (written through `reserve` or `spare`) as data.
    pub(super) fn commit(&mut self, n: usize) {
        debug_assert!(self.tail + n <= self.buf.len());
        self.tail += n;
    }
}

/// Encodes `m` as a frame at the end of `out` (which must have `m.len` free bytes): the
/// header, then the payload from its pool object (which is freed) or synthesized from the
/// pattern. Returns false if `out` had no room.
///
/// # Safety
///
/// If `m.pool != 0`, the caller owns `m`'s payload object (see [`crate::msg`]); it is given
/// back to its pool here.
pub(super) unsafe fn encode(m: &Msg, payloads: &mut Payloads, out: &mut ByteBuf) -> bool {
    let len = m.len as usize;
    let Some(dst) = out.reserve(len) else {
        return false;
    };
    let (hdr, body) = dst[..len].split_at_mut(HEADER_LEN);
    let hdr: &mut [u8; HEADER_LEN] = hdr.try_into().expect("split at HEADER_LEN");
    msg::encode_header(m, hdr);
    if m.pool != 0 {
        // SAFETY: the caller owns the payload (contract above); it is copied, then freed.
        unsafe {
            let src = payloads.bytes(m);
            body[..src.len()].copy_from_slice(src);
            body[src.len()..].fill(0);
            payloads.free(m);
        }
    } else {
        payload::fill(m.pattern, m.flow, m.seq, body);
    }
    out.commit(len);
    true
}

/// The next whole frame at the front of `data`: its descriptor (no pool payload) and its
/// payload bytes; `Ok(None)` if the frame is not complete yet.
pub(super) fn next_frame(data: &[u8]) -> Result<Option<(Msg, &[u8])>, msg::FrameError> {
    if data.len() < HEADER_LEN {
        return Ok(None);
    }
    let hdr: &[u8; HEADER_LEN] = data[..HEADER_LEN].try_into().expect("length checked");
    let m = msg::decode_header(hdr)?;
    let len = m.len as usize;
    if data.len() < len {
        return Ok(None);
    }
    Ok(Some((m, &data[HEADER_LEN..len])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Pattern;

    #[test]
    fn frames_survive_arbitrary_splits() {
        let mut p = Payloads::new(&[]);
        let mut b = ByteBuf::new(4096);
        let msgs: Vec<Msg> = (0..10u64)
            .map(|i| Msg {
                seq: i,
                len: 40 + (i as u32 * 37) % 300,
                pattern: Pattern::Random,
                flow: 2,
                ..Msg::default()
            })
            .collect();
        for m in &msgs {
            // SAFETY: no pool payloads.
            assert!(unsafe { encode(m, &mut p, &mut b) });
        }
        let wire = b.data().to_vec();
        // Feed the bytes through a small receive buffer in odd-sized pieces.
        let mut rx = ByteBuf::new(512);
        let mut got = Vec::new();
        for piece in wire.chunks(17) {
            let spare = rx
                .reserve(piece.len())
                .expect("frames are consumed as they complete");
            spare[..piece.len()].copy_from_slice(piece);
            rx.commit(piece.len());
            while let Some((m, body)) = next_frame(rx.data()).unwrap() {
                assert!(payload::check(m.pattern, m.flow, m.seq, body));
                got.push(m);
                rx.consume(m.len as usize);
            }
        }
        assert_eq!(got, msgs);
        assert!(rx.is_empty());
    }

    #[test]
    fn reserve_refuses_what_does_not_fit_and_compacts() {
        let mut b = ByteBuf::new(100);
        b.reserve(80).unwrap();
        b.commit(80);
        assert!(b.reserve(30).is_none());
        b.consume(50);
        assert_eq!(b.free(), 70);
        assert!(b.reserve(60).is_some(), "compaction makes room");
        assert_eq!(b.len(), 30);
    }
}
