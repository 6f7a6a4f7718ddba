//! [`RdsNode`]: an engine with its transports, one loop iteration at a time.

use std::net::IpAddr;

use lcore::time::Instant;

use crate::engine::{RdsEngine, TransportCmd, TransportKind};
use crate::transport::Transport;

/// Why a node could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Two transports of one kind.
    #[error("RDS node: a transport of kind {0:?} is already installed")]
    Duplicate(TransportKind),
    /// The engine does not list the transport's kind in `RdsConfig::transports`.
    #[error(
        "RDS node: the engine has no TransportSpec of kind {0:?}; list it in RdsConfig::transports"
    )]
    NotConfigured(TransportKind),
    /// A transport could not listen on a new address.
    #[error("RDS node: {0}")]
    Listen(#[from] std::io::Error),
}

/// An RDS node: an [`RdsEngine`] and the transports that carry its paths.
pub struct RdsNode {
    engine: RdsEngine,
    /// Indexed by [`slot`]: at most one transport per kind.
    transports: [Option<Box<dyn Transport + Send>>; 2],
}

impl core::fmt::Debug for RdsNode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RdsNode")
            .field("engine", &self.engine.config().name)
            .field(
                "transports",
                &self
                    .transports
                    .iter()
                    .flatten()
                    .map(|t| t.kind())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

const fn slot(kind: TransportKind) -> Option<usize> {
    match kind {
        TransportKind::Ib => Some(0),
        TransportKind::Tcp => Some(1),
        TransportKind::Loop => None,
    }
}

impl RdsNode {
    /// A node with no transport yet (only local delivery works until one is added).
    pub fn new(engine: RdsEngine) -> Self {
        Self {
            engine,
            transports: [None, None],
        }
    }

    /// Installs the transport for its kind.
    ///
    /// # Errors
    ///
    /// [`NodeError::Duplicate`] if one of that kind is installed;
    /// [`NodeError::NotConfigured`] if the engine does not offer that kind.
    pub fn add_transport(&mut self, t: Box<dyn Transport + Send>) -> Result<(), NodeError> {
        let kind = t.kind();
        let Some(i) = slot(kind) else {
            return Err(NodeError::NotConfigured(kind));
        };
        if !self
            .engine
            .config()
            .transports
            .iter()
            .any(|s| s.kind == kind)
        {
            return Err(NodeError::NotConfigured(kind));
        }
        if self.transports[i].is_some() {
            return Err(NodeError::Duplicate(kind));
        }
        self.transports[i] = Some(t);
        Ok(())
    }

    /// Adds a local address to the engine and has every transport listen on it.
    ///
    /// # Errors
    ///
    /// A transport could not listen there.
    pub fn add_local_addr(&mut self, ip: IpAddr) -> Result<(), NodeError> {
        self.engine.add_local_addr(ip);
        for t in self.transports.iter_mut().flatten() {
            t.add_local_addr(ip)?;
        }
        Ok(())
    }

    /// The engine (the socket API).
    pub fn engine(&self) -> &RdsEngine {
        &self.engine
    }

    /// The engine, mutably: sockets are created, bound, sent on and read through it.
    pub fn engine_mut(&mut self) -> &mut RdsEngine {
        &mut self.engine
    }

    /// The transport of `kind`, for its counters and controls.
    pub fn transport_mut(
        &mut self,
        kind: TransportKind,
    ) -> Option<&mut (dyn Transport + Send + 'static)> {
        match slot(kind) {
            Some(i) => self.transports[i].as_deref_mut(),
            None => None,
        }
    }

    /// One iteration: transport inputs, timers, commands, frames. Returns the work done
    /// (0 when idle). Socket readiness changes are left in the engine for the caller
    /// ([`RdsEngine::poll_event`]).
    pub fn poll(&mut self, now: Instant) -> usize {
        let mut work = 0;
        for t in self.transports.iter_mut().flatten() {
            work += t.poll(&mut self.engine, now);
        }
        if self.engine.poll_timeout().is_some_and(|at| at <= now) {
            self.engine.handle_timeout(now);
            work += 1;
        }
        work + self.flush(now)
    }

    /// The engine's commands and frames to their transports (after socket calls, so that
    /// a send leaves at once). Returns the work done.
    pub fn flush(&mut self, now: Instant) -> usize {
        let mut work = 0;
        while let Some(cmd) = self.engine.poll_transport() {
            work += 1;
            let path = match cmd {
                TransportCmd::Connect { path, .. } | TransportCmd::Disconnect { path } => path,
            };
            let kind = self.engine.path_transport(path);
            match kind
                .and_then(slot)
                .and_then(|i| self.transports[i].as_mut())
            {
                Some(t) => t.command(&mut self.engine, now, cmd),
                // No transport of that kind: nothing can connect; report at once so the
                // path backs off instead of waiting forever.
                None => match cmd {
                    TransportCmd::Connect { path, .. } => {
                        self.engine.handle_connect_failed(now, path)
                    }
                    TransportCmd::Disconnect { path } => {
                        self.engine.handle_transport_down(now, path)
                    }
                },
            }
        }
        // The transports (bits by slot) whose last frame came while the engine listed more
        // (see Transport::flush_transmit): told when the frames are all out.
        let mut fed = 0u8;
        while let Some((path, frame)) = self.engine.poll_transmit(now) {
            work += 1;
            let kind = self.engine.path_transport(path);
            if let Some(i) = kind.and_then(slot)
                && let Some(t) = self.transports[i].as_mut()
            {
                t.transmit(&mut self.engine, now, path, frame);
                if self.engine.may_transmit() {
                    fed |= 1 << i;
                } else {
                    fed &= !(1 << i);
                }
            }
        }
        while fed != 0 {
            let i = fed.trailing_zeros() as usize;
            fed &= fed - 1;
            if let Some(t) = self.transports[i].as_mut() {
                t.flush_transmit(&mut self.engine, now);
            }
        }
        work
    }
}

impl<M: Copy + Send + 'static> lcore::Poller<M> for RdsNode {
    fn poll(&mut self, ctx: &mut lcore::Ctx<'_, M>) -> usize {
        Self::poll(self, ctx.now())
    }
}
