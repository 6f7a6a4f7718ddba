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
use std::hash::BuildHasherDefault;

/// The hasher of [`IdMap`]: FxHash from the `rustc-hash` crate (rustc's own table hasher, a
/// rotate, an xor and a multiply per word), already in the workspace's dependency tree.
pub(crate) type IdHasher = rustc_hash::FxHasher;

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
