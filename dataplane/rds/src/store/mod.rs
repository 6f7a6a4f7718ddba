//! Where messages live: fragment buffers ([`frag`]) and message records with their queues
//! ([`msg`]), both sized once when the engine is made.
//!
//! Memory bound: `frags × 4 KiB` of payload plus `msgs` records (about 120 bytes each),
//! whatever the number of sockets and peers. Sends that find no room fail with `ENOMEM`
//! (and a blocking sender waits); received frames that find no room are refused back to
//! the transport, which keeps them and offers them again later, so a full pool slows the
//! peer down (its credits or its TCP window stop) and never drops a message.

pub mod frag;
pub mod msg;

pub use frag::{Chain, FragConfig, FragId, FragPool};
pub use msg::{Lane, List, Msg, MsgId, MsgTable, RdmaOp};

use mempool::memory::MemError;

/// Fragments and records together.
#[derive(Debug)]
pub struct Store {
    /// Payload buffers.
    pub frags: FragPool,
    /// Message records.
    pub msgs: MsgTable,
}

impl Store {
    /// A store of `msgs` records over the fragment pool `frags`.
    ///
    /// # Errors
    ///
    /// The fragment region could not be created.
    pub fn new(name: &str, frags: &FragConfig, msgs: u32) -> Result<Self, MemError> {
        Ok(Self {
            frags: FragPool::new(name, frags)?,
            msgs: MsgTable::new(msgs),
        })
    }

    /// Frees a message (its fragments and record) once nothing refers to it any more: on
    /// no socket list, on no path queue, no frame in flight. Returns true if freed.
    pub fn release_if_unused(&mut self, id: MsgId) -> bool {
        let m = self.msgs.get_mut(id);
        if m.bits & (Msg::ON_SOCK | Msg::ON_CONN | Msg::IN_XMIT) != 0 || m.in_flight != 0 {
            return false;
        }
        let mut chain = m.frags;
        m.frags = Chain::EMPTY;
        self.frags.free_chain(&mut chain);
        self.msgs.free(id);
        true
    }

    /// Frees a message that was never shared (a receive being dropped, a failed send).
    pub fn free_now(&mut self, id: MsgId) {
        let m = self.msgs.get_mut(id);
        m.bits &= !(Msg::ON_SOCK | Msg::ON_CONN | Msg::IN_XMIT);
        m.in_flight = 0;
        self.release_if_unused(id);
    }

    /// Copies up to `dst.len()` payload bytes of a message, from byte `skip`.
    pub fn read_payload(&self, id: MsgId, skip: usize, dst: &mut [u8]) {
        let m = self.msgs.get(id);
        self.frags.read_chain(&m.frags, skip, dst);
    }
}
