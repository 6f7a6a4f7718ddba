//! The TCP side: the same connections over kernel TCP sockets (`--tcp`, `-T s`), for
//! comparison.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use super::conn::{
    BgSpec, Conn, ConnOpts, HangGuard, Listener, Transport, fabric_err, retry_refused,
};
use crate::PerfError;

struct TcpConn {
    s: TcpStream,
}

impl Conn for TcpConn {
    fn send_all(&mut self, b: &[u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        while off < b.len() {
            match self.s.write(&b[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    guard.spin("peer stopped reading")?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv_all(&mut self, b: &mut [u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        while off < b.len() {
            match self.s.read(&mut b[off..]) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    guard.spin("peer stopped sending")?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[allow(unsafe_code)]
mod sockopt {
    use std::os::fd::AsRawFd;

    /// Sets SO_SNDBUF and SO_RCVBUF on a kernel socket, as rstream `-B` does.
    pub(super) fn set_bufs(s: &impl AsRawFd, bytes: u32) -> std::io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: setsockopt on a live socket with a pointer to a c_int and its size.
            let r = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const v).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Kernel TCP.
pub(super) struct Tcp;

impl Transport for Tcp {
    fn describe(&self) -> &'static str {
        "tcp"
    }

    fn listen(
        &self,
        bind: SocketAddr,
        _opts: ConnOpts,
    ) -> Result<Box<dyn Listener + '_>, PerfError> {
        let l =
            TcpListener::bind(bind).map_err(|e| fabric_err(&format!("listening on {bind}"), e))?;
        Ok(Box::new(l))
    }

    fn connect(
        &self,
        addr: SocketAddr,
        opts: ConnOpts,
        _inline: Option<u32>,
        bg: Option<BgSpec>,
    ) -> Result<Box<dyn Conn>, PerfError> {
        no_background(bg)?;
        let s = retry_refused(|| TcpStream::connect(addr))
            .map_err(|e| fabric_err(&format!("connecting to {addr}"), e))?;
        tcp_setup(&s, opts.buffer, opts.blocking)?;
        Ok(Box::new(TcpConn { s }))
    }
}

impl Listener for TcpListener {
    fn accept(
        &self,
        opts: ConnOpts,
        _inline: Option<u32>,
        bg: Option<BgSpec>,
    ) -> Result<Box<dyn Conn>, PerfError> {
        no_background(bg)?;
        let (s, _) = Self::accept(self).map_err(|e| fabric_err("accepting", e))?;
        tcp_setup(&s, opts.buffer, opts.blocking)?;
        Ok(Box::new(TcpConn { s }))
    }
}

/// `--sockets` drives rsockets only (run.rs refuses it with --tcp first).
fn no_background(bg: Option<BgSpec>) -> Result<(), PerfError> {
    match bg {
        None => Ok(()),
        Some(_) => Err(PerfError::Usage(
            "--sockets runs over rsockets only; drop --tcp / -T s".into(),
        )),
    }
}

fn tcp_setup(s: &TcpStream, buffer: u32, blocking: bool) -> Result<(), PerfError> {
    let f = |e: io::Error| fabric_err("configuring a TCP socket", e);
    s.set_nodelay(true).map_err(f)?;
    s.set_nonblocking(!blocking).map_err(f)?;
    sockopt::set_bufs(s, buffer).map_err(f)
}
