//! Inter-lcore messages: one MPSC inbox ring per lcore.
//!
//! Every lcore owns the single consumer of its inbox, a `mempool` ring in
//! [`Multi`]-producer / [`Single`]-consumer mode, and holds a producer clone for every lcore's
//! inbox (its own included). Non-lcore threads get a [`Sender`] from
//! [`Lcores::sender`](crate::Lcores::sender). Messages are a user type `M: Copy + Send`, copied
//! by value into ring slots, so sending allocates nothing.
//!
//! Sending never blocks: a full inbox is [`SendError::Full`], which hands the message back. The
//! owning loop drains its inbox in bursts of up to
//! [`LoopConfig::msg_batch`](crate::LoopConfig::msg_batch) messages per iteration, in FIFO order
//! per producer.
//!
//! # Syscalls
//!
//! Dequeuing and an uncontended enqueue are a few loads, a copy and a `Release` store. A
//! contended multi-producer enqueue waits for earlier producers to publish (DPDK's MP tail
//! wait); the `mempool` ring spins briefly and then *yields* (`sched_yield`) so that
//! overcommitted hosts make progress. A sender racing another sender on the same inbox can
//! therefore make a syscall when the other is preempted mid-enqueue; receiving never does.

use core::fmt;

use mempool::ring::{Consumer, Multi, Producer, Single};

use crate::id::LcoreId;

/// The consumer side of an lcore's inbox.
pub type Inbox<M> = Consumer<M, Single>;

/// A producer handle on an lcore's inbox.
pub(crate) type InboxProducer<M> = Producer<M, Multi>;

/// A message could not be sent; the message is handed back.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SendError<M> {
    /// The destination inbox is full. Retry later, drop, or apply back-pressure.
    Full(M),
    /// No lcore has this id, or this endpoint has no peers (a detached loop).
    NoSuchLcore(M),
}

impl<M> SendError<M> {
    /// The message that was not sent.
    pub fn into_inner(self) -> M {
        match self {
            Self::Full(m) | Self::NoSuchLcore(m) => m,
        }
    }
}

impl<M> fmt::Debug for SendError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("Full(..)"),
            Self::NoSuchLcore(_) => f.write_str("NoSuchLcore(..)"),
        }
    }
}

impl<M> fmt::Display for SendError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("the destination lcore's inbox is full; retry later"),
            Self::NoSuchLcore(_) => f.write_str("no such lcore to send to"),
        }
    }
}

impl<M> std::error::Error for SendError<M> {}

/// The sending half of a messaging endpoint: a producer for every lcore's inbox.
pub struct Outbox<M> {
    me: Option<LcoreId>,
    peers: Box<[InboxProducer<M>]>,
}

impl<M> fmt::Debug for Outbox<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("me", &self.me)
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl<M: Copy + Send + 'static> Outbox<M> {
    /// The lcore this endpoint belongs to (`None` for a detached loop).
    #[inline]
    pub fn me(&self) -> Option<LcoreId> {
        self.me
    }

    /// Number of lcores reachable.
    #[inline]
    pub fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Sends `msg` to `to`'s inbox without blocking.
    ///
    /// # Errors
    ///
    /// [`SendError::Full`] if the inbox is full, [`SendError::NoSuchLcore`] for an unknown id;
    /// both hand `msg` back.
    #[inline]
    pub fn send(&mut self, to: LcoreId, msg: M) -> Result<(), SendError<M>> {
        match self.peers.get_mut(usize::from(to.index())) {
            Some(p) => p.enqueue(msg).map_err(SendError::Full),
            None => Err(SendError::NoSuchLcore(msg)),
        }
    }

    /// Sends as many of `msgs` (from the front) as fit; returns how many were sent. Returns 0
    /// for an unknown id.
    #[inline]
    pub fn send_burst(&mut self, to: LcoreId, msgs: &[M]) -> usize {
        match self.peers.get_mut(usize::from(to.index())) {
            Some(p) => p.enqueue_burst(msgs),
            None => 0,
        }
    }
}

/// An lcore's messaging endpoint: its inbox plus producers for every lcore.
pub struct Port<M> {
    pub(crate) inbox: Option<Inbox<M>>,
    pub(crate) out: Outbox<M>,
}

impl<M> fmt::Debug for Port<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Port")
            .field("has_inbox", &self.inbox.is_some())
            .field("out", &self.out)
            .finish()
    }
}

impl<M: Copy + Send + 'static> Port<M> {
    pub(crate) fn new(me: LcoreId, inbox: Inbox<M>, peers: Box<[InboxProducer<M>]>) -> Self {
        Self {
            inbox: Some(inbox),
            out: Outbox {
                me: Some(me),
                peers,
            },
        }
    }

    /// An endpoint with no inbox and no peers, for loops that run outside an
    /// [`Lcores`](crate::Lcores) (unit tests, single-threaded tools). Every send fails with
    /// [`SendError::NoSuchLcore`].
    pub fn detached() -> Self {
        Self {
            inbox: None,
            out: Outbox {
                me: None,
                peers: Box::new([]),
            },
        }
    }

    /// The sending half.
    pub fn outbox(&mut self) -> &mut Outbox<M> {
        &mut self.out
    }

    /// The inbox, if this endpoint has one.
    pub fn inbox(&mut self) -> Option<&mut Inbox<M>> {
        self.inbox.as_mut()
    }

    /// Sends `msg` to `to`; see [`Outbox::send`].
    ///
    /// # Errors
    ///
    /// As for [`Outbox::send`].
    #[inline]
    pub fn send(&mut self, to: LcoreId, msg: M) -> Result<(), SendError<M>> {
        self.out.send(to, msg)
    }

    /// Takes one message from the inbox, outside a poll loop.
    #[inline]
    pub fn try_recv(&mut self) -> Option<M> {
        self.inbox.as_mut()?.dequeue()
    }
}

/// A handle for sending to one lcore's inbox from any thread (not only lcores).
///
/// Clone it to give each sending thread its own handle; methods take `&mut self`.
pub struct Sender<M> {
    to: LcoreId,
    producer: InboxProducer<M>,
}

impl<M> fmt::Debug for Sender<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("to", &self.to)
            .finish_non_exhaustive()
    }
}

impl<M> Clone for Sender<M> {
    fn clone(&self) -> Self {
        Self {
            to: self.to,
            producer: self.producer.clone(),
        }
    }
}

impl<M: Copy + Send + 'static> Sender<M> {
    pub(crate) fn new(to: LcoreId, producer: InboxProducer<M>) -> Self {
        Self { to, producer }
    }

    /// The destination lcore.
    pub fn destination(&self) -> LcoreId {
        self.to
    }

    /// Sends `msg` without blocking.
    ///
    /// # Errors
    ///
    /// [`SendError::Full`] with the message if the inbox is full.
    #[inline]
    pub fn send(&mut self, msg: M) -> Result<(), SendError<M>> {
        self.producer.enqueue(msg).map_err(SendError::Full)
    }

    /// Sends as many of `msgs` (from the front) as fit; returns how many were sent.
    #[inline]
    pub fn send_burst(&mut self, msgs: &[M]) -> usize {
        self.producer.enqueue_burst(msgs)
    }
}
