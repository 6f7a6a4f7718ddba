//! The congestion bitmap (`struct rds_cong_map`): 8192 bytes, one bit per 16-bit port.
//!
//! Port `p` is bit `p % 8` of byte `p / 8` (`set_bit_le`), so the 8192 bytes go on the wire
//! verbatim and mean the same on every host. Held here as 1024 little-endian 64-bit words:
//! word `p / 64`, bit `p % 64`. A congestion frame is a header with `h_flags` exactly
//! `CONG_BITMAP`, sequence 0, ports 0 and `h_len` 8192, followed by the bitmap.
//!
//! [`CongMap::update_from_wire`] replaces a peer's map with a received one and returns the
//! kernel's "newly uncongested" port mask (`rds_ib_cong_recv`): bit `j` is set if some port
//! `p` with `p % 64 == j` went from congested to clear.

use super::CONG_MAP_BYTES;

const WORDS: usize = CONG_MAP_BYTES / 8;

/// An 8 KiB congestion bitmap.
#[derive(Clone, PartialEq, Eq)]
pub struct CongMap {
    words: [u64; WORDS],
}

impl Default for CongMap {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for CongMap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let set = self.words.iter().map(|w| w.count_ones()).sum::<u32>();
        write!(f, "CongMap({set} ports congested)")
    }
}

/// The buffer given to [`CongMap::update_from_wire`] or [`CongMap::parse`] is not 8192
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadCongLen;

impl CongMap {
    /// An all-clear map.
    pub const fn new() -> Self {
        Self { words: [0; WORDS] }
    }

    /// Marks `port` congested.
    pub fn set(&mut self, port: u16) {
        self.words[usize::from(port) / 64] |= 1 << (port % 64);
    }

    /// Marks `port` clear.
    pub fn clear(&mut self, port: u16) {
        self.words[usize::from(port) / 64] &= !(1 << (port % 64));
    }

    /// True if `port` is congested.
    pub fn test(&self, port: u16) -> bool {
        self.words[usize::from(port) / 64] & (1 << (port % 64)) != 0
    }

    /// Number of congested ports.
    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Parses a received bitmap.
    ///
    /// # Errors
    ///
    /// [`BadCongLen`] unless `bytes` is exactly 8192 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, BadCongLen> {
        let mut m = Self::new();
        m.update_from_wire(bytes)?;
        Ok(m)
    }

    /// Replaces the map with the received `bytes` and returns the mask of ports that
    /// became clear, folded modulo 64 (see the module doc).
    ///
    /// # Errors
    ///
    /// [`BadCongLen`] unless `bytes` is exactly 8192 bytes (the map is left unchanged, as
    /// `rds_ib_cong_recv` ignores such a frame).
    pub fn update_from_wire(&mut self, bytes: &[u8]) -> Result<u64, BadCongLen> {
        if bytes.len() != CONG_MAP_BYTES {
            return Err(BadCongLen);
        }
        let mut uncongested = 0u64;
        for (w, chunk) in self.words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(chunk);
            let new = u64::from_le_bytes(a);
            uncongested |= *w & !new;
            *w = new;
        }
        Ok(uncongested)
    }

    /// Writes the map's 8192 wire bytes into `out`.
    ///
    /// # Panics
    ///
    /// If `out` is not exactly 8192 bytes (a caller bug).
    pub fn emit(&self, out: &mut [u8]) {
        assert_eq!(out.len(), CONG_MAP_BYTES, "a congestion map is 8192 bytes");
        for (w, chunk) in self.words.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
    }

    /// The map's 8192 wire bytes.
    pub fn to_bytes(&self) -> Box<[u8; CONG_MAP_BYTES]> {
        let mut b = Box::new([0u8; CONG_MAP_BYTES]);
        self.emit(&mut b[..]);
        b
    }
}

/// `RDS_CONG_MONITOR_MASK(port)`: the bit a congestion monitor mask uses for `port`.
pub const fn monitor_mask(port: u16) -> u64 {
    1 << (port % 64)
}
