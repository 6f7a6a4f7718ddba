//! Ring connections between stages, with end of stream.
//!
//! A ring of [`Msg`] descriptors has one consumer and one or more producers (SPSC or MPSC
//! `mempool` rings). On top of the ring, a link counts its open producers: a producer that
//! is done [`close`](Tx::close)s (or is dropped), and the consumer sees end of stream once
//! every producer has closed *and* the ring is empty. That is how a stop propagates through
//! a pipeline without losing what is in flight: sources stop and close, each stage drains its
//! input, then closes its outputs.
//!
//! Memory ordering: E1 (Release, in [`Tx::close`]) pairs with E2 (Acquire, in
//! [`Rx::at_eof`]). A producer's last enqueue happens before its E1; a consumer that sees the
//! count at zero with E2 therefore sees every enqueue (the ring's own Acquire on the tail
//! then finds them), so "count zero, then ring empty" really is the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mempool::ring::{Consumer, Multi, Producer, Ring, RingError, Single};

use crate::msg::Msg;

/// State shared by the ends of one link.
#[derive(Debug)]
struct LinkState {
    open_producers: AtomicUsize,
}

enum RingTx {
    Single(Producer<Msg, Single>),
    Multi(Producer<Msg, Multi>),
}

/// A producer end.
pub struct Tx {
    ring: RingTx,
    link: Arc<LinkState>,
    open: bool,
    name: Arc<str>,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("ring", &self.name)
            .field("open", &self.open)
            .finish()
    }
}

impl Tx {
    /// Enqueues as many of `msgs` as fit, in order; returns how many.
    #[inline]
    pub fn send_burst(&mut self, msgs: &[Msg]) -> usize {
        debug_assert!(self.open, "send on a closed link");
        match &mut self.ring {
            RingTx::Single(p) => p.enqueue_burst(msgs),
            RingTx::Multi(p) => p.enqueue_burst(msgs),
        }
    }

    /// Ends this producer's stream (idempotent).
    pub fn close(&mut self) {
        if self.open {
            self.open = false;
            // E1: Release, pairs with E2 in Rx::at_eof: publishes every enqueue before it.
            self.link.open_producers.fetch_sub(1, Ordering::Release);
        }
    }

    /// The ring's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        self.close();
    }
}

/// The consumer end.
pub struct Rx {
    ring: Consumer<Msg, Single>,
    link: Arc<LinkState>,
    name: Arc<str>,
}

impl std::fmt::Debug for Rx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rx").field("ring", &self.name).finish()
    }
}

impl Rx {
    /// Dequeues up to `out.len()` messages; returns how many.
    #[inline]
    pub fn recv_burst(&mut self, out: &mut [Msg]) -> usize {
        self.ring.dequeue_burst(out)
    }

    /// The next message, if any.
    #[inline]
    pub fn peek(&mut self) -> Option<&Msg> {
        self.ring.peek()
    }

    /// Whether every producer has closed and nothing is left to dequeue.
    #[inline]
    pub fn at_eof(&self) -> bool {
        // E2: Acquire, pairs with E1 in Tx::close: every producer's enqueues are visible
        // before the emptiness check below.
        self.link.open_producers.load(Ordering::Acquire) == 0 && self.ring.is_empty()
    }

    /// The ring's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Creates a link named `name` of `capacity` slots with `producers` producer ends: an SPSC
/// ring for one producer, MPSC otherwise.
///
/// # Errors
///
/// [`RingError`] for a capacity that is not a power of two, or allocation failure.
pub fn link(name: &str, capacity: usize, producers: usize) -> Result<(Vec<Tx>, Rx), RingError> {
    let state = Arc::new(LinkState {
        open_producers: AtomicUsize::new(producers),
    });
    let name: Arc<str> = name.into();
    let tx = |ring| Tx {
        ring,
        link: Arc::clone(&state),
        open: true,
        name: Arc::clone(&name),
    };
    let (txs, rx) = if producers <= 1 {
        let (p, c) = Ring::<Msg>::spsc(capacity)?;
        (vec![tx(RingTx::Single(p))], c)
    } else {
        let (p, c) = Ring::<Msg>::mpsc(capacity)?;
        let txs = (0..producers)
            .map(|_| tx(RingTx::Multi(p.clone())))
            .collect();
        (txs, c)
    };
    Ok((
        txs,
        Rx {
            ring: rx,
            link: state,
            name,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(seq: u64) -> Msg {
        Msg {
            seq,
            len: 64,
            ..Msg::default()
        }
    }

    #[test]
    fn eof_needs_every_producer_closed_and_the_ring_empty() {
        let (mut txs, mut rx) = link("r", 8, 2).unwrap();
        assert!(!rx.at_eof());
        assert_eq!(txs[0].send_burst(&[m(1), m(2)]), 2);
        txs[0].close();
        txs[0].close(); // idempotent
        assert!(!rx.at_eof(), "one producer still open");
        drop(txs.pop()); // dropping closes
        assert!(!rx.at_eof(), "two messages still queued");
        let mut out = [Msg::default(); 4];
        assert_eq!(rx.recv_burst(&mut out), 2);
        assert!(rx.at_eof());
    }

    #[test]
    fn single_producer_link_is_fifo_and_bounded() {
        let (mut txs, mut rx) = link("r", 4, 1).unwrap();
        let msgs: Vec<Msg> = (0..6).map(m).collect();
        assert_eq!(txs[0].send_burst(&msgs), 4);
        let mut out = [Msg::default(); 8];
        assert_eq!(rx.recv_burst(&mut out), 4);
        assert_eq!(
            out[..4].iter().map(|x| x.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(link("bad", 3, 1).is_err());
    }
}
