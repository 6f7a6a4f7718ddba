//! The devices one session has open, by device id: a slot table indexed by the id.
//!
//! An IO names its device by the id the server gave in `OPEN_RSP`, so every IO looks it up.
//! A table indexed by the id makes that a bounds check and a load, where a hash map of `u32`
//! keys hashed every IO with SipHash (about a hundred instructions). Ids are allocated as
//! Linux's `rnbd-srv` allocates them (`xa_alloc` from 0: the lowest id not in use), so the
//! table is as long as the most devices the session ever had open at once, at most the
//! number of exports (a session reopening a name gets the device it has).

use std::ops::Index;

use super::SessDev;

/// The devices of a session, by id (the `device_id` of `OPEN_RSP`, `IO` and `CLOSE`).
#[derive(Debug, Default)]
pub struct SessDevs {
    slots: Vec<Option<SessDev>>,
    /// Devices open (the `Some` slots).
    len: usize,
}

impl SessDevs {
    /// No device open.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Devices open.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The device with id `id`, if open.
    #[inline]
    pub fn get(&self, id: &u32) -> Option<&SessDev> {
        self.slots.get(*id as usize)?.as_ref()
    }

    /// The device with id `id`, if open, for its counters.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: &u32) -> Option<&mut SessDev> {
        self.slots.get_mut(*id as usize)?.as_mut()
    }

    /// True if a device with id `id` is open.
    pub fn contains_key(&self, id: &u32) -> bool {
        self.get(id).is_some()
    }

    /// The open devices with their ids, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &SessDev)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, d)| Some((i as u32, d.as_ref()?)))
    }

    /// The ids of the open devices, in order.
    pub fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// The open devices, in id order.
    pub fn values(&self) -> impl Iterator<Item = &SessDev> + '_ {
        self.iter().map(|(_, d)| d)
    }

    /// Adds `dev` under the lowest free id and returns the id.
    pub(crate) fn insert(&mut self, dev: SessDev) -> u32 {
        let i = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[i] = Some(dev);
        self.len += 1;
        // A session has at most one device per export open, and a table of exports
        // indexed by `usize` ids; u32 ids are never exhausted by it.
        i as u32
    }

    /// Removes and returns the device with id `id`; its id becomes free.
    pub(crate) fn remove(&mut self, id: &u32) -> Option<SessDev> {
        let d = self.slots.get_mut(*id as usize)?.take()?;
        self.len -= 1;
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        Some(d)
    }
}

impl Index<&u32> for SessDevs {
    type Output = SessDev;

    /// The device with id `id`.
    ///
    /// # Panics
    /// If no device with that id is open (as `HashMap`'s index).
    fn index(&self, id: &u32) -> &SessDev {
        self.get(id).expect("no open device with this id")
    }
}
