//! Congestion maps (`cong.c`): one 8 KiB map per address, local or remote, shared by every
//! connection that involves the address, kept for the engine's life.
//!
//! A local map has a bit set for every port whose socket's receive queue went above its
//! receive buffer (cleared again below half of it); a change queues an update on every
//! connection whose local address it is. A remote map is what the peer last sent; a sender
//! tests the destination port's bit before queueing.

use std::collections::HashMap;

use crate::addr::Addr;
use crate::wire::CongMap;

/// A map's index.
pub type MapIdx = u32;

#[derive(Debug)]
struct Entry {
    addr: Addr,
    map: Box<CongMap>,
    /// Connections whose local address this is (`m_conn_list`): they get the updates.
    conns: Vec<u32>,
}

/// Every map of an engine.
#[derive(Debug, Default)]
pub struct CongTable {
    maps: Vec<Entry>,
    by_addr: HashMap<Addr, MapIdx>,
    generation: u64,
}

impl CongTable {
    /// The map of `addr`, made on first use (`rds_cong_from_addr`).
    pub fn map_for(&mut self, addr: Addr) -> MapIdx {
        if let Some(&i) = self.by_addr.get(&addr) {
            return i;
        }
        let i = self.maps.len() as MapIdx;
        self.maps.push(Entry {
            addr,
            map: Box::new(CongMap::new()),
            conns: Vec::new(),
        });
        self.by_addr.insert(addr, i);
        i
    }

    /// The map of `addr`, if it has one.
    pub fn find(&self, addr: Addr) -> Option<MapIdx> {
        self.by_addr.get(&addr).copied()
    }

    /// Every map with the address it belongs to, in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = (Addr, &CongMap)> + '_ {
        self.maps.iter().map(|e| (e.addr, &*e.map))
    }

    /// The bitmap.
    pub fn map(&self, i: MapIdx) -> &CongMap {
        &self.maps[i as usize].map
    }

    /// The bitmap, mutably.
    pub fn map_mut(&mut self, i: MapIdx) -> &mut CongMap {
        &mut self.maps[i as usize].map
    }

    /// The address a map belongs to.
    pub fn addr(&self, i: MapIdx) -> Addr {
        self.maps[i as usize].addr
    }

    /// Registers connection `conn` as one whose local map is `i`.
    pub fn add_conn(&mut self, i: MapIdx, conn: u32) {
        self.maps[i as usize].conns.push(conn);
    }

    /// Connections whose local map is `i`.
    pub fn conns(&self, i: MapIdx) -> &[u32] {
        &self.maps[i as usize].conns
    }

    /// Records a received update of map `i`; returns the newly-uncongested port mask.
    /// Bumps the global congestion generation (`rds_cong_map_updated`).
    pub fn received(&mut self, i: MapIdx, bytes: &[u8]) -> Option<u64> {
        let mask = self.maps[i as usize].map.update_from_wire(bytes).ok()?;
        self.generation += 1;
        Some(mask)
    }

    /// A map changed without a wire update (a local change seen by loopback senders).
    pub fn bump(&mut self) {
        self.generation += 1;
    }

    /// The congestion generation (`rds_cong_generation`).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}
