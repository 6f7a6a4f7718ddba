//! What a `dp-perf blk` job does, in fio's vocabulary: the pattern (`--rw`), sizes with
//! fio's suffixes, and the offsets a job visits.

use std::fmt;
use std::str::FromStr;

/// fio's `--rw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RwMode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mix of reads and writes (`--rwmixread` percent reads).
    RandRw,
}

impl RwMode {
    /// fio's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
            Self::RandRw => "randrw",
        }
    }

    /// True if offsets are random.
    pub fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }

    /// True if the job writes.
    pub fn writes(self) -> bool {
        !matches!(self, Self::Read | Self::RandRead)
    }

    /// True if the job reads.
    pub fn reads(self) -> bool {
        !matches!(self, Self::Write | Self::RandWrite)
    }
}

impl FromStr for RwMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "randrw" => Self::RandRw,
            _ => {
                return Err(format!(
                    "unknown --rw '{s}': use read, write, randread, randwrite or randrw"
                ));
            }
        })
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A size with fio's suffixes: `512`, `4k`, `1m`, `2g` (powers of 1024, as fio's default
/// `kb_base=1024`), case-insensitive, with an optional `b`/`ib` (`4KiB`, `4kb`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, shift) = match t.as_bytes().last() {
        Some(b'k') => (&t[..t.len() - 1], 10),
        Some(b'm') => (&t[..t.len() - 1], 20),
        Some(b'g') => (&t[..t.len() - 1], 30),
        Some(b't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size: use a number with an optional k, m, g or t suffix (powers of 1024)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// The offsets one job visits: sequential (wrapping at the end of its range) or uniformly
/// random block-aligned offsets within it (fio's `norandommap`: blocks may repeat before
/// every block was visited).
#[derive(Clone, Debug)]
pub struct Offsets {
    base: u64,
    blocks: u64,
    bs: u64,
    next: u64,
    random: bool,
    rng: u64,
}

impl Offsets {
    /// Offsets of `bs`-byte blocks in `[base, base + len)`; `seed` picks the random
    /// sequence.
    pub fn new(base: u64, len: u64, bs: u64, random: bool, seed: u64) -> Self {
        Self {
            base,
            blocks: (len / bs).max(1),
            bs,
            next: 0,
            random,
            rng: seed | 1,
        }
    }

    /// Blocks in the range.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The next block's index in the range.
    pub fn next_block(&mut self) -> u64 {
        if self.random {
            self.rand() % self.blocks
        } else {
            let b = self.next;
            self.next = (self.next + 1) % self.blocks;
            b
        }
    }

    /// The byte offset of block `b`.
    pub fn offset(&self, b: u64) -> u64 {
        self.base + b * self.bs
    }

    /// A 64-bit xorshift* step: cheap, and good enough to spread IOs over a device.
    pub fn rand(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_fio_suffixes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("4x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn rw_names_round_trip() {
        for m in [
            RwMode::Read,
            RwMode::Write,
            RwMode::RandRead,
            RwMode::RandWrite,
            RwMode::RandRw,
        ] {
            assert_eq!(m.name().parse::<RwMode>(), Ok(m));
        }
        assert!("readwrite".parse::<RwMode>().is_err());
    }

    #[test]
    fn sequential_offsets_wrap_random_stay_in_range() {
        let mut o = Offsets::new(8192, 4 * 4096, 4096, false, 1);
        let seq: Vec<u64> = (0..6).map(|_| o.next_block()).collect();
        assert_eq!(seq, [0, 1, 2, 3, 0, 1]);
        assert_eq!(o.offset(3), 8192 + 3 * 4096);
        let mut r = Offsets::new(0, 1000 * 4096, 4096, true, 7);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let b = r.next_block();
            assert!(b < 1000);
            seen.insert(b);
        }
        assert!(
            seen.len() > 990,
            "random offsets cover the range ({} blocks)",
            seen.len()
        );
    }
}
