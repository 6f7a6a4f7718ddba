//! The rsocket side: connections over dataplane rsockets on a fabric provider.

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::time::Duration;

use dataplane::fabric::Provider;
use dataplane::rsocket::{
    RecvFlags, RsConfig, RsContext, RsError, RsListener, RsStream, SendFlagsRs, SockOpt,
};

use super::background::{Background, memory};
use super::conn::{
    BgReport, BgSpec, Conn, ConnOpts, HangGuard, Listener, Transport, fabric_err, retry_refused,
};
use crate::PerfError;
use crate::harness::open_err;

struct RsConn<P: Provider> {
    s: RsStream<P>,
    blocking: bool,
    /// `--sockets`: the other connections, served while this one waits.
    bg: Option<Background<P>>,
    /// What opening them cost: resident and virtual bytes per connection.
    bg_memory: Option<(u64, u64)>,
    spins: u32,
}

/// The measured connection is polled on every spin, a background connection on every
/// `BG_STRIDE`th: the loop's latency-critical queue first, as an lcore serving one
/// latency-critical flow among many bulk ones polls it. At the default rate this still
/// visits each background connection far more often than it carries a message (the
/// report shows the rate they achieved).
const BG_STRIDE: u32 = 32;

impl<P: Provider> RsConn<P> {
    /// One fruitless spin: background work, then the hang guard.
    #[inline]
    fn idle(&mut self, guard: &mut HangGuard, what: &'static str) -> io::Result<()> {
        if let Some(bg) = &mut self.bg {
            self.spins = self.spins.wrapping_add(1);
            if self.spins.is_multiple_of(BG_STRIDE) {
                bg.service()?;
            }
        }
        guard.spin(what)
    }
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
                Err(RsError::WouldBlock) => self.idle(&mut guard, "peer stopped reading")?,
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
                Err(RsError::WouldBlock) => self.idle(&mut guard, "peer stopped sending")?,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn background(&self) -> Option<BgReport> {
        let bg = self.bg.as_ref()?;
        let n = bg.len().max(1) as u64;
        Some(BgReport {
            count: bg.len(),
            rss_per_socket: self.bg_memory.map(|(r, _)| r / n),
            vm_per_socket: self.bg_memory.map(|(_, v)| v / n),
            sent: bg.stats.sent,
            received: bg.stats.received,
            secs: bg.elapsed_secs(),
        })
    }
}

/// Memory growth across `f` (resident, virtual), if /proc is readable.
fn growth<T>(f: impl FnOnce() -> T) -> (T, Option<(u64, u64)>) {
    let before = memory();
    let r = f();
    let after = memory();
    let d = before
        .zip(after)
        .map(|((r0, v0), (r1, v1))| (r1.saturating_sub(r0), v1.saturating_sub(v0)));
    (r, d)
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

/// A connection's options; `inline` none leaves the library's default inline size.
fn rs_opts(opts: ConnOpts, inline: Option<u32>) -> Vec<SockOpt> {
    let mut v = vec![
        SockOpt::SndBuf(opts.buffer),
        SockOpt::RcvBuf(opts.buffer),
        SockOpt::NoDelay(true),
    ];
    v.extend(inline.map(SockOpt::Inline));
    v
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
        inline: Option<u32>,
        bg: Option<BgSpec>,
    ) -> Result<Box<dyn Conn>, PerfError> {
        let one = || {
            retry_refused(|| RsStream::connect_with(&self.0, addr, &rs_opts(opts, inline)))
                .map_err(|e| fabric_err(&format!("connecting to {addr}"), e))
        };
        let s = one()?;
        let (bg, bg_memory) = match bg {
            None => (None, None),
            Some(spec) => {
                let (socks, mem) = growth(|| {
                    (0..spec.count)
                        .map(|_| one())
                        .collect::<Result<Vec<_>, PerfError>>()
                });
                let socks: Vec<RsStream<P>> = socks?;
                (
                    Some(Background::new(socks, true, spec.rate, spec.size)),
                    mem,
                )
            }
        };
        Ok(Box::new(RsConn {
            s,
            blocking: opts.blocking,
            bg,
            bg_memory,
            spins: 0,
        }))
    }
}

impl<P: Provider> Listener for RsListener<P> {
    fn accept(
        &self,
        opts: ConnOpts,
        inline: Option<u32>,
        bg: Option<BgSpec>,
    ) -> Result<Box<dyn Conn>, PerfError> {
        let one = || -> Result<RsStream<P>, PerfError> {
            let (s, _) = Self::accept(self).map_err(|e| fabric_err("accepting", e))?;
            for o in rs_opts(opts, inline) {
                // Buffer sizes only apply before connecting; the rest apply now.
                let _ = s.set_option(o);
            }
            Ok(s)
        };
        // The client connects the measured connection first, then the background ones:
        // the listener hands them out in that order.
        let s = one()?;
        let (bg, bg_memory) = match bg {
            None => (None, None),
            Some(spec) => {
                let (socks, mem) = growth(|| {
                    (0..spec.count)
                        .map(|_| one())
                        .collect::<Result<Vec<_>, PerfError>>()
                });
                let socks: Vec<RsStream<P>> = socks?;
                (
                    Some(Background::new(socks, false, spec.rate, spec.size)),
                    mem,
                )
            }
        };
        Ok(Box::new(RsConn {
            s,
            blocking: opts.blocking,
            bg,
            bg_memory,
            spins: 0,
        }))
    }
}
