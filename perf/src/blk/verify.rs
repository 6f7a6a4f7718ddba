//! `--verify`: every written block carries a pattern that names where it belongs and which
//! write put it there, so a read-back finds data that is wrong, misplaced or stale.
//!
//! Each 512-byte sector of a block starts with a 16-byte header (magic, the write's
//! generation, the sector's byte offset on the device) followed by 496 bytes derived from
//! the same three values. A sector from another offset, an older write, or garbage fails
//! the check, and the failure says which of the three it was.

use std::fmt;

const MAGIC: u32 = 0x6462_7670; // "pvbd" little-endian
const SECTOR: usize = 512;

/// The generation of the last completed write of each block (0: never written by this
/// run), which blocks have a write in flight (their content is undefined until it
/// completes), and how many reads each block has in flight.
///
/// A read is checked against the generation of the last write completed when the read
/// *completes*, so no write of a block may start while a read of it is in flight: the read
/// may have been served before the write landed and still complete after it (two paths, or
/// a server that answers out of order), and would then be reported stale although the
/// target did nothing wrong. Reads of a block run together; a write runs alone.
#[derive(Clone, Debug)]
pub struct BlockLog {
    gens: Vec<u32>,
    writing: Vec<bool>,
    reading: Vec<u16>,
    next_gen: u32,
}

impl BlockLog {
    /// A log of `blocks` blocks, none written.
    pub fn new(blocks: u64) -> Self {
        let n = usize::try_from(blocks).unwrap_or(usize::MAX);
        Self {
            gens: vec![0; n],
            writing: vec![false; n],
            reading: vec![0; n],
            next_gen: 1,
        }
    }

    /// True if block `b` has a write in flight.
    pub fn busy(&self, b: u64) -> bool {
        self.writing[b as usize]
    }

    /// True if an IO of kind `write` may not start on block `b` now: a write waits for every
    /// IO of the block, a read only for a write.
    pub fn blocked(&self, b: u64, write: bool) -> bool {
        self.writing[b as usize] || (write && self.reading[b as usize] != 0)
    }

    /// Starts a read of block `b`.
    pub fn begin_read(&mut self, b: u64) {
        let r = &mut self.reading[b as usize];
        *r = r.saturating_add(1);
    }

    /// A read of block `b` ended (completed, failed, or was never started).
    pub fn end_read(&mut self, b: u64) {
        let r = &mut self.reading[b as usize];
        *r = r.saturating_sub(1);
    }

    /// Starts a write of block `b`: its generation.
    pub fn begin_write(&mut self, b: u64) -> u32 {
        self.writing[b as usize] = true;
        let g = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        g
    }

    /// The write of block `b` with generation `g` completed (`ok`) or failed (the block's
    /// content is then unknown: nothing is expected of it until it is written again).
    pub fn end_write(&mut self, b: u64, g: u32, ok: bool) {
        self.writing[b as usize] = false;
        self.gens[b as usize] = if ok { g } else { 0 };
    }

    /// The generation a read of block `b` must find (0: not written by this run: any
    /// content is fine).
    pub fn expect(&self, b: u64) -> u32 {
        self.gens[b as usize]
    }

    /// Blocks with a completed write.
    pub fn written(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.gens
            .iter()
            .enumerate()
            .filter(|&(_, &g)| g != 0)
            .map(|(b, &g)| (b as u64, g))
    }
}

/// Fills `buf` (a block at device offset `off`) with the pattern of generation `generation`.
pub fn fill(buf: &mut [u8], off: u64, generation: u32) {
    for (i, s) in buf.chunks_mut(SECTOR).enumerate() {
        let so = off + (i * SECTOR) as u64;
        s[..4].copy_from_slice(&MAGIC.to_le_bytes());
        s[4..8].copy_from_slice(&generation.to_le_bytes());
        s[8..16].copy_from_slice(&so.to_le_bytes());
        let mut x = so ^ (u64::from(generation) << 40) ^ 0x9E37_79B9_7F4A_7C15;
        for w in s[16..].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = w.len();
            w.copy_from_slice(&x.to_le_bytes()[..n]);
        }
    }
}

/// What a read-back found wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Device offset of the first bad sector.
    pub offset: u64,
    /// The generation expected.
    pub want_gen: u32,
    /// What the sector's header held: magic, generation, offset.
    pub found: (u32, u32, u64),
    /// The header was right but the body was not.
    pub body: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (magic, generation, off) = self.found;
        if self.body {
            write!(
                f,
                "sector at offset {} has the right header (write {}) but wrong data",
                self.offset, self.want_gen
            )
        } else if magic != MAGIC {
            write!(
                f,
                "sector at offset {} holds no pattern (expected write {})",
                self.offset, self.want_gen
            )
        } else if off != self.offset {
            write!(
                f,
                "sector at offset {} holds the data of offset {off} (misplaced)",
                self.offset
            )
        } else {
            write!(
                f,
                "sector at offset {} holds write {generation}, expected write {} (stale or lost write)",
                self.offset, self.want_gen
            )
        }
    }
}

/// Checks `buf` (read from device offset `off`) against generation `generation`.
///
/// # Errors
/// The first sector that does not match.
pub fn check(buf: &[u8], off: u64, generation: u32, scratch: &mut [u8]) -> Result<(), Mismatch> {
    let want = &mut scratch[..buf.len()];
    fill(want, off, generation);
    for (i, (got, exp)) in buf.chunks(SECTOR).zip(want.chunks(SECTOR)).enumerate() {
        if got != exp {
            let so = off + (i * SECTOR) as u64;
            let le32 = |a: usize| u32::from_le_bytes([got[a], got[a + 1], got[a + 2], got[a + 3]]);
            let mut o = [0u8; 8];
            o.copy_from_slice(&got[8..16]);
            let found = (le32(0), le32(4), u64::from_le_bytes(o));
            return Err(Mismatch {
                offset: so,
                want_gen: generation,
                found,
                body: got[..16] == exp[..16],
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checks_and_names_the_fault() {
        let mut b = vec![0u8; 4096];
        let mut s = vec![0u8; 4096];
        fill(&mut b, 8192, 7);
        assert_eq!(check(&b, 8192, 7, &mut s), Ok(()));
        let e = check(&b, 8192, 8, &mut s).unwrap_err();
        assert!(e.to_string().contains("stale"), "{e}");
        let e = check(&b, 4096, 7, &mut s).unwrap_err();
        assert!(e.to_string().contains("misplaced"), "{e}");
        b[1000] ^= 1;
        let e = check(&b, 8192, 7, &mut s).unwrap_err();
        assert_eq!(e.offset, 8192 + 512);
        assert!(e.body);
        let z = vec![0u8; 4096];
        assert!(
            check(&z, 0, 1, &mut s)
                .unwrap_err()
                .to_string()
                .contains("no pattern")
        );
    }

    #[test]
    fn log_tracks_generations() {
        let mut l = BlockLog::new(4);
        let g = l.begin_write(2);
        assert!(l.busy(2));
        assert_eq!(l.expect(2), 0);
        l.end_write(2, g, true);
        assert_eq!(l.expect(2), g);
        let g2 = l.begin_write(2);
        l.end_write(2, g2, false);
        assert_eq!(
            l.expect(2),
            0,
            "after a failed write the content is unknown"
        );
        let g3 = l.begin_write(1);
        l.end_write(1, g3, true);
        assert_eq!(l.written().collect::<Vec<_>>(), vec![(1, g3)]);
    }

    #[test]
    fn test_write_waits_for_reads_in_flight() {
        let mut l = BlockLog::new(4);
        l.begin_read(3);
        l.begin_read(3);
        assert!(!l.blocked(3, false), "reads of a block run together");
        assert!(l.blocked(3, true), "a write waits for the reads in flight");
        l.end_read(3);
        assert!(l.blocked(3, true));
        l.end_read(3);
        assert!(!l.blocked(3, true));
        let g = l.begin_write(3);
        assert!(l.blocked(3, false), "a read waits for the write in flight");
        l.end_write(3, g, true);
        assert!(!l.blocked(3, false));
    }
}
