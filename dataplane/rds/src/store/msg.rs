//! Message records (`struct rds_message` and `struct rds_incoming` in one) and the queues
//! they sit on.
//!
//! A record is a slot of a table sized once ([`MsgTable::new`]); a message is its
//! [`MsgId`]. Every queue is an intrusive doubly linked [`List`] through one of two link
//! lanes in the record: [`Lane::Conn`] for a path's send and retransmit queues,
//! [`Lane::Sock`] for a socket's list of unacked sends or its receive queue. A sent message
//! is on one queue of each lane at once, as in the kernel (`m_conn_item`, `m_sock_item`),
//! and [`MsgTable::remove`] takes it off either in O(1) (`RDS_CANCEL_SENT_TO`, close, ack).
//!
//! Ownership replaces the kernel's reference count: a sent message is freed when it is on
//! neither lane ([`Msg::ON_SOCK`], [`Msg::ON_CONN`] clear) and no transmitted frame still
//! points at its fragments ([`Msg::in_flight`] is 0, [`Msg::IN_XMIT`] clear); see `Store::release_if_unused`.

use lcore::time::Instant;

use super::frag::Chain;
use crate::addr::Addr;
use crate::wire::{EXT_SPACE, Flags};

const NIL: u32 = u32::MAX;

/// A message's index in its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId(pub u32);

/// The two link lanes of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// A path's send or retransmit queue.
    Conn = 0,
    /// A socket's unacked sends, or its receive queue.
    Sock = 1,
}

#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
};

/// The RDMA operation a message carries (`struct rm_rdma_op`), posted by the transport
/// before the message's first frame. Offsets are into the RDMA windows: `local` into ours
/// (checked when the message was sent), `remote` into the peer's (the peer's cookie offset
/// plus `remote_vec.addr`: hostile until the peer's provider checks it against `rkey`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaOp {
    /// The peer's remote key (the cookie's low half).
    pub rkey: u32,
    /// Byte offset in the peer's window.
    pub remote: u64,
    /// Byte offset in our window.
    pub local: u64,
    /// Bytes to move.
    pub len: u32,
    /// RDMA WRITE to the peer (`RDS_RDMA_READWRITE`), else RDMA READ from it.
    pub write: bool,
    /// `RDS_RDMA_FENCE`: the message's SEND waits for the operation.
    pub fence: bool,
    /// `RDS_RDMA_NOTIFY_ME`: an `RDS_CMSG_RDMA_STATUS` when the operation is done.
    pub notify: bool,
    /// `RDS_RECVERR` on the socket when sent: notify failures even without `notify`.
    pub recverr: bool,
    /// Returned in the notification.
    pub user_token: u64,
    /// The failure the transport reported (`RDS_RDMA_REMOTE_ERROR`, ...), if any.
    pub failed: Option<i32>,
    /// Reported done: every frame of the message completed, so the operation posted
    /// before them did (a reliable connection completes in order); the outcome was
    /// reported then, not again on ack or reset.
    pub done: bool,
}

/// One message.
#[derive(Clone, Debug)]
pub struct Msg {
    /// `h_sequence` (assigned when queued on a path).
    pub seq: u64,
    /// `h_len`: payload bytes.
    pub len: u32,
    /// `h_sport`.
    pub sport: u16,
    /// `h_dport`.
    pub dport: u16,
    /// Header flags: for a send, the ones it goes out with (set when first transmitted);
    /// for a receive, the ones it arrived with.
    pub flags: Flags,
    /// The extension-header area.
    pub ext: [u8; EXT_SPACE],
    /// State bits (`Msg::ON_SOCK`, ...).
    pub bits: u16,
    /// The payload.
    pub frags: Chain,
    /// Send: the owning socket's slot; receive: the socket it was queued to.
    pub sock: u32,
    /// Send: the destination address; receive: the source address.
    pub peer: Addr,
    /// The connection (engine index) it travels on.
    pub conn: u32,
    /// The path index within the connection.
    pub path: u8,
    /// Stream transports: the stream offset just past the message's last byte, once
    /// transmitted on the current connection ([`Msg::HAS_ACK_SEQ`]).
    pub ack_seq: u64,
    /// Frames handed to the transport that point at this message's fragments and have not
    /// completed.
    pub in_flight: u16,
    /// Receive: the `RDMA_DEST` cookie the message carried (0: none).
    pub rdma_cookie: u64,
    /// Receive: when it was queued to its socket.
    pub queued_at: Instant,
    /// Send: the RDMA operation it carries ([`Msg::RDMA`] is set with it).
    pub rdma: Option<RdmaOp>,
    links: [Link; 2],
}

impl Msg {
    /// On a socket's list (`RDS_MSG_ON_SOCK`).
    pub const ON_SOCK: u16 = 1 << 0;
    /// On a path's send or retransmit queue (`RDS_MSG_ON_CONN`).
    pub const ON_CONN: u16 = 1 << 1;
    /// `ack_seq` is valid (`RDS_MSG_HAS_ACK_SEQ`).
    pub const HAS_ACK_SEQ: u16 = 1 << 2;
    /// Ask the receiver for an ack (`RDS_MSG_ACK_REQUIRED`).
    pub const ACK_REQUIRED: u16 = 1 << 3;
    /// Sent again after a reset (`RDS_MSG_RETRANSMITTED`).
    pub const RETRANSMITTED: u16 = 1 << 4;
    /// The peer restarted: drop instead of resending (`RDS_MSG_FLUSH`).
    pub const FLUSH: u16 = 1 << 5;
    /// Carries an RDMA operation ([`Msg::rdma`]): never retransmitted.
    pub const RDMA: u16 = 1 << 6;
    /// A congestion-map update (not sequenced, on no queue).
    pub const CONG_MAP: u16 = 1 << 7;
    /// On a path's retransmit queue (else its send queue), when [`Msg::ON_CONN`].
    pub const ON_RETRANS: u16 = 1 << 8;
    /// Being transmitted: a path's cursor still has fragments of it to hand out.
    pub const IN_XMIT: u16 = 1 << 9;

    fn blank() -> Self {
        Self {
            seq: 0,
            len: 0,
            sport: 0,
            dport: 0,
            flags: Flags::empty(),
            ext: [0; EXT_SPACE],
            bits: 0,
            frags: Chain::EMPTY,
            sock: u32::MAX,
            peer: Addr::ANY,
            conn: u32::MAX,
            path: 0,
            ack_seq: 0,
            in_flight: 0,
            rdma_cookie: 0,
            queued_at: Instant::ZERO,
            rdma: None,
            links: [UNLINKED; 2],
        }
    }

    /// True if every bit of `b` is set.
    pub const fn has(&self, b: u16) -> bool {
        self.bits & b == b
    }
    /// Sets bits.
    pub fn set(&mut self, b: u16) {
        self.bits |= b;
    }
    /// Clears bits.
    pub fn clear(&mut self, b: u16) {
        self.bits &= !b;
    }
}

/// A queue of messages through one lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
    /// Number of messages.
    pub const fn len(&self) -> u32 {
        self.len
    }
    /// True if empty.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The first message.
    pub fn front(&self) -> Option<MsgId> {
        (self.head != NIL).then_some(MsgId(self.head))
    }
    /// The last message.
    pub fn back(&self) -> Option<MsgId> {
        (self.tail != NIL).then_some(MsgId(self.tail))
    }
}

impl Default for List {
    fn default() -> Self {
        Self::new()
    }
}

/// The table of message records.
#[derive(Debug)]
pub struct MsgTable {
    msgs: Vec<Msg>,
    free: Vec<u32>,
    low_water: u32,
    ctrl_reserve: u32,
}

/// Records that received and sent data leave free for the engine's own control messages
/// (congestion-map updates, pongs), at most a sixteenth of the table: a receiver whose
/// store filled must still be able to tell its peers that it is congested.
pub const CTRL_RESERVE_MSGS: u32 = 8;

impl MsgTable {
    /// A table of `cap` records, all free.
    pub fn new(cap: u32) -> Self {
        let cap = cap.max(1);
        Self {
            msgs: (0..cap).map(|_| Msg::blank()).collect(),
            free: (0..cap).rev().collect(),
            low_water: cap,
            ctrl_reserve: CTRL_RESERVE_MSGS.min(cap / 16),
        }
    }

    /// Records in the table.
    pub fn capacity(&self) -> u32 {
        self.msgs.len() as u32
    }

    /// True if a received or sent data message may take a record now: more than the
    /// control reserve ([`CTRL_RESERVE_MSGS`]) is free. Control messages use
    /// [`alloc`](Self::alloc) directly.
    pub fn can_take_data(&self) -> bool {
        self.available() > self.ctrl_reserve
    }

    /// Records free now.
    pub fn available(&self) -> u32 {
        self.free.len() as u32
    }

    /// The fewest records that were ever free at once.
    pub fn low_water(&self) -> u32 {
        self.low_water
    }

    /// Takes a blank record.
    pub fn alloc(&mut self) -> Option<MsgId> {
        let i = self.free.pop()?;
        self.msgs[i as usize] = Msg::blank();
        self.low_water = self.low_water.min(self.free.len() as u32);
        Some(MsgId(i))
    }

    /// Returns a record (its fragments must have been freed, and it must be on no list).
    pub fn free(&mut self, id: MsgId) {
        let m = &self.msgs[id.0 as usize];
        debug_assert!(m.frags.is_empty(), "record freed with fragments");
        debug_assert!(
            m.links[0].prev == NIL && m.links[0].next == NIL,
            "record freed while linked"
        );
        self.free.push(id.0);
    }

    /// The record.
    pub fn get(&self, id: MsgId) -> &Msg {
        &self.msgs[id.0 as usize]
    }

    /// The record, mutably.
    pub fn get_mut(&mut self, id: MsgId) -> &mut Msg {
        &mut self.msgs[id.0 as usize]
    }

    fn link(&mut self, i: u32, lane: Lane) -> &mut Link {
        &mut self.msgs[i as usize].links[lane as usize]
    }

    /// Appends `id` to `list` through `lane`.
    pub fn push_back(&mut self, list: &mut List, lane: Lane, id: MsgId) {
        *self.link(id.0, lane) = Link {
            prev: list.tail,
            next: NIL,
        };
        if list.tail == NIL {
            list.head = id.0;
        } else {
            self.link(list.tail, lane).next = id.0;
        }
        list.tail = id.0;
        list.len += 1;
    }

    /// Removes `id` from `list` (it must be on it, through `lane`).
    pub fn remove(&mut self, list: &mut List, lane: Lane, id: MsgId) {
        let Link { prev, next } = *self.link(id.0, lane);
        if prev == NIL {
            list.head = next;
        } else {
            self.link(prev, lane).next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.link(next, lane).prev = prev;
        }
        *self.link(id.0, lane) = UNLINKED;
        list.len -= 1;
    }

    /// Removes and returns the first message.
    pub fn pop_front(&mut self, list: &mut List, lane: Lane) -> Option<MsgId> {
        let id = list.front()?;
        self.remove(list, lane, id);
        Some(id)
    }

    /// The message after `id` on its list through `lane`.
    pub fn next(&self, lane: Lane, id: MsgId) -> Option<MsgId> {
        let n = self.msgs[id.0 as usize].links[lane as usize].next;
        (n != NIL).then_some(MsgId(n))
    }

    /// Moves all of `src` in front of `dst` (`list_splice_init`), keeping order.
    pub fn splice_front(&mut self, dst: &mut List, src: &mut List, lane: Lane) {
        if src.is_empty() {
            return;
        }
        if dst.is_empty() {
            *dst = *src;
        } else {
            self.link(src.tail, lane).next = dst.head;
            self.link(dst.head, lane).prev = src.tail;
            dst.head = src.head;
            dst.len += src.len;
        }
        *src = List::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(t: &MsgTable, l: &List, lane: Lane) -> Vec<u32> {
        let mut v = Vec::new();
        let mut at = l.front();
        while let Some(id) = at {
            v.push(id.0);
            at = t.next(lane, id);
        }
        v
    }

    #[test]
    fn test_msg_lists_two_lanes_remove_and_splice() {
        let mut t = MsgTable::new(8);
        let (mut send, mut retrans, mut sock) = (List::new(), List::new(), List::new());
        let m: Vec<MsgId> = (0..5).map(|_| t.alloc().unwrap()).collect();
        for &id in &m[..3] {
            t.push_back(&mut retrans, Lane::Conn, id);
        }
        for &id in &m[3..] {
            t.push_back(&mut send, Lane::Conn, id);
        }
        for &id in &m {
            t.push_back(&mut sock, Lane::Sock, id);
        }
        t.remove(&mut retrans, Lane::Conn, m[1]);
        t.remove(&mut sock, Lane::Sock, m[1]);
        t.splice_front(&mut send, &mut retrans, Lane::Conn);
        assert!(retrans.is_empty());
        assert_eq!(
            ids(&t, &send, Lane::Conn),
            vec![m[0].0, m[2].0, m[3].0, m[4].0]
        );
        assert_eq!(
            ids(&t, &sock, Lane::Sock),
            vec![m[0].0, m[2].0, m[3].0, m[4].0]
        );
        assert_eq!(send.len(), 4);
        assert_eq!(t.pop_front(&mut send, Lane::Conn), Some(m[0]));
        t.remove(&mut send, Lane::Conn, m[4]);
        assert_eq!(send.back(), Some(m[3]));
        assert_eq!(t.available(), 3);
        assert_eq!(t.low_water(), 3);
    }

    #[test]
    fn test_data_leaves_the_control_reserve_of_records() {
        let mut t = MsgTable::new(256);
        let mut taken = Vec::new();
        while t.can_take_data() {
            taken.push(t.alloc().unwrap());
        }
        assert_eq!(
            t.available(),
            CTRL_RESERVE_MSGS,
            "data stops at the reserve"
        );
        let pong = t.alloc().expect("a control message still gets a record");
        t.free(pong);
        for id in taken {
            t.free(id);
        }
        assert_eq!(t.available(), 256);
    }
}
