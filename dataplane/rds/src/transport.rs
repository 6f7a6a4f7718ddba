//! The plug-in point of transports: what a driver (an [`RdsNode`](crate::node::RdsNode)) asks
//! of each transport it runs beside an engine.
//!
//! A transport owns the connections of one [`TransportKind`] (`SO_RDS_TRANSPORT`): the
//! fabric transport ([`crate::fabric::FabricTransport`], RDS-IB's protocol over any
//! dp-fabric provider) answers [`TransportKind::Ib`]; an RDS-TCP transport answers
//! [`TransportKind::Tcp`] the same way, feeding bytes to
//! [`RdsEngine::handle_stream_bytes`] and acknowledgements to
//! [`RdsEngine::handle_stream_acked`]. The node hands each transport the engine's commands
//! and frames for the paths of its kind, and calls [`Transport::poll`] once per iteration
//! for its inputs. None of these calls may block, and on the data path (`poll` with no
//! connection event, `transmit`) none may allocate or make a system call.

use lcore::time::Instant;

use crate::engine::{RdsEngine, TransportCmd, TransportKind};
use crate::path::{PathId, TxFrame};

/// A transport driven by an [`RdsNode`](crate::node::RdsNode).
pub trait Transport {
    /// The `SO_RDS_TRANSPORT` kind whose paths this transport carries. The engine must list
    /// a [`TransportSpec`](crate::TransportSpec) of this kind.
    fn kind(&self) -> TransportKind;

    /// Starts accepting connections to `ip`, a new local address of the engine (listening
    /// on the transport's port). Control path.
    ///
    /// # Errors
    ///
    /// The transport could not listen there; the text says why and what to do.
    fn add_local_addr(&mut self, ip: std::net::IpAddr) -> std::io::Result<()>;

    /// Takes the transport's inputs (connection events, completions, received frames or
    /// bytes) into the engine's `handle_*` calls. Returns the work done (0 when idle).
    fn poll(&mut self, engine: &mut RdsEngine, now: Instant) -> usize;

    /// Carries out a command of the engine for one of this transport's paths.
    fn command(&mut self, engine: &mut RdsEngine, now: Instant, cmd: TransportCmd);

    /// Transmits a frame of [`RdsEngine::poll_transmit`] on `path`. The path's send depth
    /// bounds the frames in flight, so a transport sized for it always has room; a frame
    /// for a path with no live connection is dropped (the path is being reset and will
    /// retransmit).
    fn transmit(&mut self, engine: &mut RdsEngine, now: Instant, path: PathId, frame: TxFrame);

    /// Sends what [`transmit`](Self::transmit) took since the last call: a transport may
    /// stage frames (a post list per connection, one provider call for the frames of a
    /// turn) until this call, or until a frame it is given when the engine has no other
    /// listed ([`RdsEngine::may_transmit`] false): then it sends everything it staged, at
    /// once. The node calls this at the end of a [`flush`](crate::node::RdsNode::flush)
    /// for a transport whose last frame came while the engine had others listed (they
    /// turned out to have nothing to send). Does nothing by default (a transport that
    /// sends in `transmit`).
    fn flush_transmit(&mut self, engine: &mut RdsEngine, now: Instant) {
        let _ = (engine, now);
    }

    /// Kills every live connection as a network fault would (both ends see it go; the
    /// engine resets the paths, reconnects and retransmits). For fault tests and
    /// operators. Returns how many were killed.
    fn reset_all(&mut self) -> usize;

    /// Calls `f` with each of the transport's counters, name and value (for `rds-info`
    /// style listings next to the engine's [`Stats`](crate::Stats)).
    fn counters(&self, f: &mut dyn FnMut(&'static str, u64));

    /// The transport as [`Any`](std::any::Any), so a caller that knows its type can reach
    /// its own accessors (e.g. [`TcpTransport::connections`](crate::tcp::TcpTransport::connections)).
    /// `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}
