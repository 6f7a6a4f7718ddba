//! The rsocket side: connections over dataplane rsockets on a fabric provider.

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::time::Duration;

use dataplane::fabric::Provider;
use dataplane::rsocket::{
    RecvFlags, RsConfig, RsContext, RsError, RsListener, RsStream, SendFlagsRs, SockOpt,
};

use super::conn::{Conn, ConnOpts, HangGuard, Listener, Transport, fabric_err, retry_refused};
use crate::PerfError;
use crate::harness::open_err;

struct RsConn<P: Provider> {
    s: RsStream<P>,
    blocking: bool,
}

impl<P: Provider> Conn for RsConn<P> {
    fn send_all(&mut self, b: &[u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        while off < b.len() {
            match self.s.send(
                &b[off..],
                SendFlagsRs {
                    dontwait: !self.blocking,
                },
            ) {
                Ok(n) => off += n,
                Err(RsError::WouldBlock) => {
                    guard.spin("peer stopped reading")?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn recv_all(&mut self, b: &mut [u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        let flags = RecvFlags {
            dontwait: !self.blocking,
            waitall: self.blocking,
            peek: false,
        };
        while off < b.len() {
            match self.s.recv(&mut b[off..], flags) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => off += n,
                Err(RsError::WouldBlock) => {
                    guard.spin("peer stopped sending")?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// rsockets on provider `P`: one context for the run.
pub(super) struct Rs<P: Provider>(RsContext<P>);

impl<P: Provider> Rs<P> {
    /// Opens the rsocket context on `dev`.
    pub(super) fn open(dev: P::Device, blocking: bool) -> Result<Self, PerfError> {
        let mut ctx = RsContext::with_config(dev, RsConfig::from_system()).map_err(open_err)?;
        if !blocking {
            // rstream spins (rpoll with timeout 0) in its default mode: poll just as long.
            ctx.set_polling_time(Duration::from_secs(1));
        }
        Ok(Self(ctx))
    }
}

fn rs_opts(opts: ConnOpts, inline: u32) -> [SockOpt; 4] {
    [
        SockOpt::SndBuf(opts.buffer),
        SockOpt::RcvBuf(opts.buffer),
        SockOpt::Inline(inline),
        SockOpt::NoDelay(true),
    ]
}

impl<P: Provider> Transport for Rs<P> {
    fn describe(&self) -> &'static str {
        P::NAME
    }

    fn listen(
        &self,
        bind: SocketAddr,
        opts: ConnOpts,
    ) -> Result<Box<dyn Listener + '_>, PerfError> {
        let l = RsListener::bind_with(
            &self.0,
            bind,
            &[SockOpt::SndBuf(opts.buffer), SockOpt::RcvBuf(opts.buffer)],
        )
        .map_err(|e| fabric_err(&format!("listening on {bind}"), e))?;
        Ok(Box::new(l))
    }

    fn connect(
        &self,
        addr: SocketAddr,
        opts: ConnOpts,
        inline: u32,
    ) -> Result<Box<dyn Conn>, PerfError> {
        let s = retry_refused(|| RsStream::connect_with(&self.0, addr, &rs_opts(opts, inline)))
            .map_err(|e| fabric_err(&format!("connecting to {addr}"), e))?;
        Ok(Box::new(RsConn {
            s,
            blocking: opts.blocking,
        }))
    }
}

impl<P: Provider> Listener for RsListener<P> {
    fn accept(&self, opts: ConnOpts, inline: u32) -> Result<Box<dyn Conn>, PerfError> {
        let (s, _) = Self::accept(self).map_err(|e| fabric_err("accepting", e))?;
        for o in rs_opts(opts, inline) {
            // Buffer sizes only apply before connecting; the rest apply now.
            let _ = s.set_option(o);
        }
        Ok(Box::new(RsConn {
            s,
            blocking: opts.blocking,
        }))
    }
}
