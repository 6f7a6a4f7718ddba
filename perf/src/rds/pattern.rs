//! The payload patterns of the RDS perf commands, the way both ends of a run derive them:
//! `dp-perf rds-check`'s message schedule and pattern with the receiver's bookkeeping
//! (which messages came, which twice, which late, which wrong), and `dp-perf rds-echo`'s
//! stream (`EchoStream`).
//!
//! ## rds-check
//! Both ends compute the same schedule from `(count, seed)`, so a receiver knows every
//! message's size without being told. `scripts/rds-check-kernel.py` implements the same
//! three functions for the kernel's `AF_RDS` sockets; keep them in step.
//!
//! * Sizes: message 0..=9 are 0, 1, 47, 48, 4095, 4096, 4097, 65535, 65536 and 1 MiB (the
//!   header-sized and page-sized edges and the largest message); then xorshift64 draws,
//!   a quarter each below 128 B, 8 KiB, 128 KiB and up to 1 MiB inclusive.
//! * Payload of message `j` of `size` bytes: byte `k` is `(off + k) % 251` with
//!   `off = (j * 97 + size * 13) % 251`; a message of 8 bytes or more carries `j` (little
//!   endian) in its first 8 bytes instead. The period of 251 (a prime, not 256) makes a
//!   dropped, repeated or shifted byte anywhere in a message show.
//!
//! ## rds-echo
//!
//! A stream of 2 MiB, xorshift32 from `0x2545_f491` with each word little-endian; message
//! `i` of `n` bytes is the stream from offset `i × 7919 mod 1 MiB`. Its peer,
//! `scripts/kernel-lab/rds_echo_peer.py`, computes the same stream and checks every
//! message against it before it echoes it; keep them in step.

/// The largest RDS message.
pub(super) const MAX_MSG: usize = 1 << 20;

/// The fixed sizes the schedule starts with.
pub(super) const EDGE_SIZES: [usize; 10] = [0, 1, 47, 48, 4095, 4096, 4097, 65535, 65536, MAX_MSG];

/// The size of every message of a run of `count` messages with `seed`.
pub(super) fn schedule(count: u64, seed: u64) -> Vec<usize> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..count)
        .map(|j| match EDGE_SIZES.get(j as usize) {
            Some(&s) => s,
            None => {
                let class = next() % 4;
                let r = next();
                match class {
                    0 => (r % 128) as usize,
                    1 => (r % 8192) as usize,
                    2 => (r % 131_072) as usize,
                    _ => (r % (MAX_MSG as u64 + 1)) as usize,
                }
            }
        })
        .collect()
}

/// Writes the payload of message `j` into `buf` (its length is the message's size).
pub(super) fn fill(j: u64, buf: &mut [u8]) {
    let off = offset(j, buf.len());
    for (k, b) in buf.iter_mut().enumerate() {
        *b = ((off + k) % 251) as u8;
    }
    if buf.len() >= 8 {
        buf[..8].copy_from_slice(&j.to_le_bytes());
    }
}

fn offset(j: u64, size: usize) -> usize {
    ((j % 251) as usize * 97 + (size % 251) * 13) % 251
}

/// True if `data` is exactly message `j`'s payload.
fn matches(j: u64, data: &[u8]) -> bool {
    let off = offset(j, data.len());
    let start = if data.len() >= 8 {
        if data[..8] != j.to_le_bytes() {
            return false;
        }
        8
    } else {
        0
    };
    data[start..]
        .iter()
        .enumerate()
        .all(|(k, &b)| b == ((off + start + k) % 251) as u8)
}

/// Bytes of the echo stream: any message fits at any offset.
const ECHO_STREAM_LEN: usize = 2 * MAX_MSG;

/// `dp-perf rds-echo`'s payload stream (see the module's doc).
#[derive(Debug)]
pub(super) struct EchoStream(Vec<u8>);

impl EchoStream {
    /// The stream, computed once per run (2 MiB).
    pub(super) fn new() -> Self {
        let mut v = Vec::with_capacity(ECHO_STREAM_LEN);
        let mut x: u32 = 0x2545_f491;
        while v.len() < ECHO_STREAM_LEN {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            v.extend_from_slice(&x.to_le_bytes());
        }
        Self(v)
    }

    /// Message `i` of `len` bytes (at most [`MAX_MSG`]): the stream from offset
    /// `i × 7919 mod 1 MiB`.
    pub(super) fn message(&self, i: u64, len: usize) -> &[u8] {
        let off = (i.wrapping_mul(7919) % MAX_MSG as u64) as usize;
        &self.0[off..off + len]
    }
}

/// Where `got` first differs from `want`: a sentence, or `None` if equal.
pub(super) fn difference(got: &[u8], want: &[u8]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} bytes, expected {}", got.len(), want.len()));
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b)?;
    Some(format!(
        "byte {at} is {:#04x}, expected {:#04x}",
        got[at], want[at]
    ))
}

/// What a receiver made of the messages of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Distinct messages received intact.
    pub received: u64,
    /// Messages received again after they had arrived intact.
    pub duplicated: u64,
    /// Messages that arrived after a later message of the same sender socket.
    pub out_of_order: u64,
    /// Messages that are none of the schedule's (wrong length, wrong bytes, unknown number).
    pub corrupt: u64,
    /// Payload bytes of the intact messages.
    pub bytes: u64,
}

/// The receiver's bookkeeping of one run.
#[derive(Debug)]
pub(super) struct Checker {
    sizes: Vec<usize>,
    got: Vec<bool>,
    /// Highest message number seen, per sender socket (its RDS port).
    highest: std::collections::HashMap<u16, u64>,
    /// The numbers of the short (< 8 bytes, unnumbered) messages, by size.
    short: [Vec<u64>; 8],
    tally: Tally,
}

impl Checker {
    /// Bookkeeping for a run of `count` messages with `seed`.
    pub(super) fn new(count: u64, seed: u64) -> Self {
        let sizes = schedule(count, seed);
        let mut short: [Vec<u64>; 8] = Default::default();
        for (j, &s) in sizes.iter().enumerate() {
            if s < 8 {
                short[s].push(j as u64);
            }
        }
        Self {
            sizes,
            got: vec![false; count as usize],
            highest: Default::default(),
            short,
            tally: Tally::default(),
        }
    }

    /// Messages of the run.
    pub(super) fn count(&self) -> u64 {
        self.got.len() as u64
    }

    /// True once every message arrived.
    pub(super) fn complete(&self) -> bool {
        self.tally.received == self.count()
    }

    /// The tally so far.
    pub(super) fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Messages not received (so far).
    pub(super) fn missing(&self) -> u64 {
        self.count() - self.tally.received
    }

    /// Takes one received message from sender socket `sport`.
    pub(super) fn take(&mut self, sport: u16, data: &[u8]) {
        let Some(j) = self.identify(data) else {
            self.tally.corrupt += 1;
            return;
        };
        if self.got[j as usize] {
            self.tally.duplicated += 1;
            return;
        }
        self.got[j as usize] = true;
        self.tally.received += 1;
        self.tally.bytes += data.len() as u64;
        let h = self.highest.entry(sport).or_insert(j);
        if j < *h {
            self.tally.out_of_order += 1;
        }
        *h = (*h).max(j);
    }

    /// The message `data` is: by its number (8 bytes or more), else the first message of
    /// its size with its bytes that has not been received (else the first received: a
    /// duplicate). Messages of one size differ in their bytes unless their numbers are
    /// equal modulo 251, so in runs of up to 251 messages a short one is always known.
    fn identify(&self, data: &[u8]) -> Option<u64> {
        let fits = |j: u64| self.sizes.get(j as usize) == Some(&data.len()) && matches(j, data);
        if data.len() >= 8 {
            let j = u64::from_le_bytes(data[..8].try_into().ok()?);
            return fits(j).then_some(j);
        }
        self.short[data.len()]
            .iter()
            .copied()
            .filter(|&j| fits(j))
            .min_by_key(|&j| self.got[j as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(sizes: &[usize], j: u64) -> Vec<u8> {
        let mut v = vec![0u8; sizes[j as usize]];
        fill(j, &mut v);
        v
    }

    #[test]
    fn test_schedule_starts_with_the_edges_and_stays_within_1mib() {
        let s = schedule(1000, 7);
        assert_eq!(s[..10], EDGE_SIZES);
        assert!(s.iter().all(|&x| x <= MAX_MSG));
        assert!(s[10..].iter().any(|&x| x > 131_072));
        assert_eq!(s, schedule(1000, 7));
        assert_ne!(s, schedule(1000, 8));
    }

    #[test]
    fn test_in_order_run_is_complete() {
        let mut c = Checker::new(200, 3);
        let sizes = schedule(200, 3);
        for j in 0..200 {
            c.take(4001, &msg(&sizes, j));
        }
        assert!(c.complete());
        assert_eq!(
            c.tally().duplicated + c.tally().out_of_order + c.tally().corrupt,
            0
        );
        assert_eq!(
            c.tally().bytes,
            sizes.iter().map(|&s| s as u64).sum::<u64>()
        );
    }

    #[test]
    fn test_missing_duplicate_reorder_and_corrupt_are_counted() {
        let sizes = schedule(40, 5);
        let mut c = Checker::new(40, 5);
        for j in [0, 1, 3, 2, 2, 5] {
            c.take(4001, &msg(&sizes, j));
        }
        // A byte changed deep inside the 1 MiB message.
        let mut m = msg(&sizes, 9);
        m[700_000] ^= 1;
        c.take(4001, &m);
        // A byte missing from a numbered message.
        let mut m = msg(&sizes, 6);
        m.remove(100);
        c.take(4001, &m);
        let t = c.tally();
        assert_eq!(
            (t.received, t.duplicated, t.out_of_order, t.corrupt),
            (5, 1, 1, 2)
        );
        assert_eq!(c.missing(), 35);
        assert!(!c.complete());
    }

    #[test]
    fn test_short_unnumbered_messages_are_told_apart() {
        let sizes = schedule(12, 1);
        let mut c = Checker::new(12, 1);
        // 0 and 1 byte messages (0 and 1), then 1 again: a duplicate, not corrupt.
        c.take(4001, &msg(&sizes, 0));
        c.take(4001, &msg(&sizes, 1));
        c.take(4001, &msg(&sizes, 1));
        // A 1-byte message with the wrong byte is corrupt.
        c.take(4001, &[200]);
        let t = c.tally();
        assert_eq!((t.received, t.duplicated, t.corrupt), (2, 1, 1));
    }

    #[test]
    fn test_a_short_message_far_ahead_is_known() {
        // Message 274 of seed 1 is 1 byte; with 8 sender sockets on 8 paths it may come
        // while message 9 (1 MiB) is still on its way.
        let sizes = schedule(300, 1);
        assert_eq!(sizes[274], 1);
        let mut c = Checker::new(300, 1);
        c.take(4003, &msg(&sizes, 274));
        assert_eq!((c.tally().received, c.tally().corrupt), (1, 0));
    }

    #[test]
    fn test_pattern_known_words() {
        // The peer script computes the same stream: its first words are these.
        let p = EchoStream::new();
        assert_eq!(p.0.len(), ECHO_STREAM_LEN);
        let w0 = u32::from_le_bytes(p.0[0..4].try_into().unwrap());
        let mut x: u32 = 0x2545_f491;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        assert_eq!(w0, x);
        assert_eq!(p.message(1, 4), &p.0[7919..7923]);
        assert_eq!(p.message(0, MAX_MSG).len(), MAX_MSG);
    }

    #[test]
    fn test_echo_stream_is_the_peer_scripts() {
        // Computed by scripts/kernel-lab/rds_echo_peer.py's pattern() and message().
        let p = EchoStream::new();
        let hex = |m: &[u8]| m.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(p.message(0, 8)), "3ab624e1ab749a8b");
        assert_eq!(hex(p.message(1, 8)), "d9b33f600df8055d");
        assert_eq!(hex(p.message(133, 8)), "6ac4e4b8f2546922");
        assert_eq!(
            p.message(1 << 40, 8),
            p.message(0, 8),
            "offsets wrap at 1 MiB"
        );
        // An echo of another message (one out of order) is told apart.
        assert_eq!(
            difference(p.message(4, 4097), p.message(3, 4097)).as_deref(),
            Some("byte 0 is 0x31, expected 0x95")
        );
    }

    #[test]
    fn test_difference_names_first_byte() {
        assert_eq!(difference(b"abc", b"abc"), None);
        assert_eq!(
            difference(b"abd", b"abc").as_deref(),
            Some("byte 2 is 0x64, expected 0x63")
        );
        assert_eq!(
            difference(b"ab", b"abc").as_deref(),
            Some("2 bytes, expected 3")
        );
    }

    #[test]
    fn test_order_is_per_sender_socket() {
        let sizes = schedule(20, 2);
        let mut c = Checker::new(20, 2);
        // Socket 4002 carries the odd messages, 4001 the even: 4002's 11 before 4001's 10
        // is not a reorder; 4001's 12 before its 10 is.
        c.take(4002, &msg(&sizes, 11));
        c.take(4001, &msg(&sizes, 12));
        c.take(4001, &msg(&sizes, 10));
        assert_eq!(c.tally().out_of_order, 1);
    }
}
