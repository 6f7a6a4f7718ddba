//! The driver: an [`RdsNode`] runs an engine and its transports in a run-to-completion
//! loop, an lcore poller ([`lcore::Poller`]) or the progress thread of a
//! [`BlockingNode`] for ordinary threads.
//!
//! One [`RdsNode::poll`] is one iteration of the call order of the crate documentation:
//! every transport's inputs (completions, received frames, connection events), the
//! engine's due timers, its commands (each to the transport of its path's kind), its
//! frames (each to its transport), in that order. With thousands of sockets on one lcore
//! the cost of an iteration grows with the connections (one per peer), not the sockets.
//! Nothing here allocates or makes a system call on the data path.
//!
//! Transports plug in by kind ([`Transport::kind`](crate::transport::Transport::kind), `SO_RDS_TRANSPORT`): the fabric
//! transport answers `Ib`; an RDS-TCP transport is added beside it with
//! [`RdsNode::add_transport`] and gets the `Tcp` paths.

mod blocking;
mod core;

pub use self::core::{NodeError, RdsNode};
pub use blocking::BlockingNode;
