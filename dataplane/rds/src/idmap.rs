//! [`IdMap`]: the hash table of the data path's lookups, keyed by names this node chose
//! (bound addresses and ports, local addresses, path ids, the provider's connection ids).
//!
//! The standard library's SipHash is keyed per table so that a peer cannot choose keys
//! that collide. Here the entries are never a peer's choice: a socket is bound, an address
//! added and a path or queue pair made by this node, so however a peer picks the keys it
//! looks up (a frame's destination port, say), it probes a table whose layout only local
//! calls decide, and at most one probe sequence per lookup. SipHash bought nothing there
//! and cost about 200 instructions per lookup, three lookups per message (measured with
//! `dataplane/examples/rds_oneway_cost.rs`). Tables whose entries a peer creates (the
//! connections by peer address) keep SipHash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's mix (rustc's hasher): a rotate, an xor and a multiply per word.
#[derive(Clone, Copy, Default)]
pub(crate) struct IdHasher(u64);

/// The multiplier of FxHash (64-bit).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl IdHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in chunks.by_ref() {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes its 7-bit tag from the top bits and its bucket from the low
        // ones: the multiply leaves the low bits of a small key poor, so fold them.
        self.0 ^ (self.0 >> 32)
    }
}

/// A table keyed by this node's own names (see the module doc).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// An empty [`IdMap`] with room for `n` entries.
pub(crate) fn with_capacity<K, V>(n: usize) -> IdMap<K, V> {
    IdMap::with_capacity_and_hasher(n, BuildHasherDefault::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};
    use std::net::Ipv6Addr;

    fn hash<T: Hash + ?Sized>(v: &T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(v)
    }

    #[test]
    fn distinct_ports_and_addresses_hash_apart() {
        let a = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0x0a50, 0x0001);
        let b = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0x0a50, 0x0002);
        assert_ne!(hash(&(a, 4001u16)), hash(&(a, 4002u16)));
        assert_ne!(hash(&(a, 4001u16)), hash(&(b, 4001u16)));
        // The tail of a byte string counts.
        assert_ne!(
            hash(&[1u8; 9][..]),
            hash(&[1u8, 1, 1, 1, 1, 1, 1, 1, 2][..])
        );
    }

    #[test]
    fn a_map_of_many_ports_finds_each() {
        let a = Ipv6Addr::LOCALHOST;
        let mut m: IdMap<(Ipv6Addr, u16), u32> = with_capacity(16);
        for p in 0..5000u16 {
            m.insert((a, p), u32::from(p));
        }
        for p in 0..5000u16 {
            assert_eq!(m.get(&(a, p)), Some(&u32::from(p)));
        }
        assert_eq!(m.get(&(a, 6000)), None);
    }
}
