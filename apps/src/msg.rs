//! The message stages pass around, and its wire form on rsocket connections.
//!
//! # Descriptors and payloads
//!
//! A [`Msg`] is a 40-byte descriptor copied by value through rings, like DPDK's 8-byte mbuf
//! pointers but carrying the header itself: a per-flow sequence number, the time it was
//! generated, its length, and the pattern of its payload. The payload (the `len - 40` bytes
//! after the header) either lives in an object of a mempool pool (`pool != 0`) or is not
//! materialized at all and is synthesized from the pattern, the flow and the sequence number
//! where bytes are needed (on an rsocket connection). Either way a message "is" `len` bytes,
//! which is what the Gb/s figures count.
//!
//! **Ownership.** A descriptor with a pool payload owns its object exclusively. Stages move
//! descriptors (dequeue, enqueue) and never keep a copy of one they passed on; a fanout that
//! sends a message to several rings copies the payload into new objects. The stage that ends
//! a message's life (sink, rsocket client, or a drop) puts the object back.
//!
//! # Timestamps
//!
//! `stamp` is `CLOCK_MONOTONIC` in nanoseconds, read once per generated burst. It is the same
//! clock in every process of the host, so latency measured in another process (the demo's
//! consumers) needs no calibration; the TSC clock of [`lcore::time`] is calibrated per
//! process and could be microseconds apart after a few seconds.
//!
//! # Wire form
//!
//! On an rsocket stream each message is a frame: a 40-byte little-endian header followed by
//! `len - 40` payload bytes.
//!
//! ```text
//! offset  size  field
//!  0       2    magic 0xD9C7
//!  2       1    version (1)
//!  3       1    pattern (0 zeros, 1 counter, 2 random, 3 ticks)
//!  4       4    len: frame bytes, header included (40..=65536)
//!  8       8    seq
//! 16       8    stamp (CLOCK_MONOTONIC ns)
//! 24       8    word (ticks: price in cents | size << 32)
//! 32       4    aux (ticks: symbol id)
//! 36       2    flow
//! 38       2    reserved (0)
//! ```

use mempool::pool::ObjId;

/// Bytes of the message header, on the wire and counted in every message's length.
pub const HEADER_LEN: usize = 40;
/// First two bytes of every frame.
pub const MAGIC: u16 = 0xD9C7;
/// Frame format version.
pub const VERSION: u8 = 1;
/// Smallest message: the 40-byte header ([`HEADER_LEN`]).
pub const MIN_MSG_LEN: u32 = HEADER_LEN as u32;
/// Largest message, header included.
pub const MAX_MSG_LEN: u32 = 64 << 10;

/// What the payload bytes of a message are.
#[repr(u8)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// All zero.
    #[default]
    Zeros = 0,
    /// Byte `i` is `(seq + i) mod 256`.
    Counter = 1,
    /// A xorshift stream seeded by flow and sequence number.
    Random = 2,
    /// Market data: the tick is in the header (`aux` symbol, `word` price and size); the
    /// payload is zero padding.
    Ticks = 3,
}

impl Pattern {
    /// From the wire byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Zeros),
            1 => Some(Self::Counter),
            2 => Some(Self::Random),
            3 => Some(Self::Ticks),
            _ => None,
        }
    }

    /// The name used in config files.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Zeros => "zeros",
            Self::Counter => "counter",
            Self::Random => "random",
            Self::Ticks => "ticks",
        }
    }
}

/// A message descriptor (see the [module docs](self)).
///
/// In-process only (it holds a pool object id), so it has no fixed layout; it is 40 bytes,
/// 48 when mempool's `debug` feature tags object ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Msg {
    /// Sequence number within its flow, from 0, consecutive as generated.
    pub seq: u64,
    /// `CLOCK_MONOTONIC` nanoseconds at generation.
    pub stamp: u64,
    /// Pattern-specific word (ticks: price in cents, size in the high half).
    pub word: u64,
    /// Message bytes, header included.
    pub len: u32,
    /// Pattern-specific (ticks: symbol id).
    pub aux: u32,
    /// The generator it came from.
    pub flow: u16,
    /// Payload pattern.
    pub pattern: Pattern,
    /// 1 + index of the pool holding the payload; 0 when the payload is not materialized.
    pub pool: u8,
    /// The payload object when `pool != 0`.
    pub obj: ObjId,
}

const _: () = assert!(size_of::<Msg>() <= 48);

impl Msg {
    /// Payload bytes (`len - 40`).
    #[inline]
    pub fn payload_len(&self) -> usize {
        (self.len as usize).saturating_sub(HEADER_LEN)
    }
}

/// Why a frame header was rejected. Small and `Copy`: produced on the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes are not [`MAGIC`]: the peer is not speaking this format, or the
    /// stream lost its framing.
    #[error(
        "bad frame magic {0:#06x} (expected 0xd9c7); the peer does not speak the dpctl frame format"
    )]
    Magic(u16),
    /// An unknown format version.
    #[error("frame version {0} is not supported (expected 1)")]
    Version(u8),
    /// An unknown pattern byte.
    #[error("unknown payload pattern {0}")]
    Pattern(u8),
    /// A length outside `40..=65536`.
    #[error("frame length {0} is outside 40..=65536")]
    Len(u32),
}

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const PATTERN: usize = 3;
    pub const LEN: Range<usize> = 4..8;
    pub const SEQ: Range<usize> = 8..16;
    pub const STAMP: Range<usize> = 16..24;
    pub const WORD: Range<usize> = 24..32;
    pub const AUX: Range<usize> = 32..36;
    pub const FLOW: Range<usize> = 36..38;
    pub const RESERVED: Range<usize> = 38..40;
}

fn u16_at(b: &[u8; HEADER_LEN], r: core::ops::Range<usize>) -> u16 {
    let mut a = [0; 2];
    a.copy_from_slice(&b[r]);
    u16::from_le_bytes(a)
}

fn u32_at(b: &[u8; HEADER_LEN], r: core::ops::Range<usize>) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[r]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8; HEADER_LEN], r: core::ops::Range<usize>) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[r]);
    u64::from_le_bytes(a)
}

/// Writes `m`'s header in wire form.
pub fn encode_header(m: &Msg, out: &mut [u8; HEADER_LEN]) {
    out[field::MAGIC].copy_from_slice(&MAGIC.to_le_bytes());
    out[field::VERSION] = VERSION;
    out[field::PATTERN] = m.pattern as u8;
    out[field::LEN].copy_from_slice(&m.len.to_le_bytes());
    out[field::SEQ].copy_from_slice(&m.seq.to_le_bytes());
    out[field::STAMP].copy_from_slice(&m.stamp.to_le_bytes());
    out[field::WORD].copy_from_slice(&m.word.to_le_bytes());
    out[field::AUX].copy_from_slice(&m.aux.to_le_bytes());
    out[field::FLOW].copy_from_slice(&m.flow.to_le_bytes());
    out[field::RESERVED].copy_from_slice(&[0, 0]);
}

/// Reads a wire header into a descriptor without a pool payload.
///
/// # Errors
///
/// [`FrameError`] for a bad magic, version, pattern or length.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Msg, FrameError> {
    let magic = u16_at(b, field::MAGIC);
    if magic != MAGIC {
        return Err(FrameError::Magic(magic));
    }
    if b[field::VERSION] != VERSION {
        return Err(FrameError::Version(b[field::VERSION]));
    }
    let pattern =
        Pattern::from_u8(b[field::PATTERN]).ok_or(FrameError::Pattern(b[field::PATTERN]))?;
    let len = u32_at(b, field::LEN);
    if !(MIN_MSG_LEN..=MAX_MSG_LEN).contains(&len) {
        return Err(FrameError::Len(len));
    }
    Ok(Msg {
        seq: u64_at(b, field::SEQ),
        stamp: u64_at(b, field::STAMP),
        word: u64_at(b, field::WORD),
        len,
        aux: u32_at(b, field::AUX),
        flow: u16_at(b, field::FLOW),
        pattern,
        pool: 0,
        obj: ObjId::default(),
    })
}

/// The length of the frame starting at `b`, if at least the length field is there. Used to
/// wait for a whole frame before decoding.
pub fn peek_len(b: &[u8]) -> Option<u32> {
    let l = b.get(field::LEN)?;
    Some(u32::from_le_bytes([l[0], l[1], l[2], l[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let m = Msg {
            seq: 0x0102_0304_0506_0708,
            stamp: 99,
            word: u64::MAX - 1,
            len: 1500,
            aux: 7,
            flow: 3,
            pattern: Pattern::Random,
            ..Msg::default()
        };
        let mut b = [0u8; HEADER_LEN];
        encode_header(&m, &mut b);
        assert_eq!(peek_len(&b), Some(1500));
        assert_eq!(decode_header(&b), Ok(m));
    }

    #[test]
    fn header_rejects_garbage() {
        let mut b = [0u8; HEADER_LEN];
        encode_header(
            &Msg {
                len: 64,
                ..Msg::default()
            },
            &mut b,
        );
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(decode_header(&bad), Err(FrameError::Magic(_))));
        let mut bad = b;
        bad[2] = 9;
        assert_eq!(decode_header(&bad), Err(FrameError::Version(9)));
        let mut bad = b;
        bad[3] = 200;
        assert_eq!(decode_header(&bad), Err(FrameError::Pattern(200)));
        let mut bad = b;
        bad[4..8].copy_from_slice(&39u32.to_le_bytes());
        assert_eq!(decode_header(&bad), Err(FrameError::Len(39)));
    }
}
