//! `rsetsockopt`, `rgetsockopt` and `rfcntl`, with librdmacm's option set:
//!
//! | level | options |
//! |---|---|
//! | `SOL_SOCKET` | `SO_REUSEADDR`, `SO_RCVBUF`, `SO_SNDBUF` (stored doubled, effective before connecting), `SO_LINGER` (stored; close is always graceful), `SO_KEEPALIVE`, `SO_OOBINLINE`, `SO_ERROR` (get, clears), `SO_BROADCAST`, `SO_TYPE`/`SO_DOMAIN`/`SO_PROTOCOL` (get) |
//! | `IPPROTO_IP` | `IP_TOS` (stored) |
//! | `IPPROTO_TCP` | `TCP_NODELAY`, `TCP_KEEPIDLE`, `TCP_MAXSEG`/`TCP_CONGESTION` (accepted, ignored), `TCP_KEEPCNT`/`TCP_KEEPINTVL` (ignored, read as 1), `TCP_INFO` (get) |
//! | `IPPROTO_IPV6` | `IPV6_V6ONLY` (stored) |
//! | `SOL_RDMA` (0x10000) | `RDMA_SQSIZE`, `RDMA_RQSIZE`, `RDMA_INLINE`, `RDMA_IOMAPSIZE` (before connecting; set them on the listener for accepted sockets), `RDMA_ROUTE` (accepted and ignored: no fabric here takes IB path records) |
//!
//! Anything else fails with `EOPNOTSUPP`, as in librdmacm. Unlike librdmacm, `TCP_INFO`
//! reports `TCP_ESTABLISHED` for an established connection.

use dataplane::fabric::Provider;
use dataplane::rsocket::{SockOpt, SockOptName};
use libc::c_int;

use crate::engine::Engine;
use crate::errno::Errno;
use crate::handles::{Handle, Kind};

/// `SOL_RDMA` from `<rdma/rsocket.h>`.
pub(crate) const SOL_RDMA: c_int = 0x10000;
/// `RDMA_SQSIZE`.
pub(crate) const RDMA_SQSIZE: c_int = 0;
/// `RDMA_RQSIZE`.
pub(crate) const RDMA_RQSIZE: c_int = 1;
/// `RDMA_INLINE`.
pub(crate) const RDMA_INLINE: c_int = 2;
/// `RDMA_IOMAPSIZE`.
pub(crate) const RDMA_IOMAPSIZE: c_int = 3;
/// `RDMA_ROUTE`.
pub(crate) const RDMA_ROUTE: c_int = 4;

/// `TCP_ESTABLISHED` of `<netinet/tcp.h>` (`tcpi_state`).
const TCP_ESTABLISHED: u8 = 1;
/// `TCP_CLOSE`.
const TCP_CLOSE: u8 = 7;

/// An option value on its way back to C.
pub(crate) enum OptVal {
    Int(c_int),
    Linger(libc::linger),
    TcpInfo(Box<libc::tcp_info>),
}

impl OptVal {
    /// The bytes C sees.
    pub(crate) fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        fn bytes<T>(v: &T) -> &[u8] {
            // SAFETY: viewing a live plain-old-data value as its bytes.
            unsafe { std::slice::from_raw_parts((v as *const T).cast(), size_of::<T>()) }
        }
        match self {
            Self::Int(v) => f(bytes(v)),
            Self::Linger(v) => f(bytes(v)),
            Self::TcpInfo(v) => f(bytes(&**v)),
        }
    }
}

fn int_arg(v: &[u8]) -> Result<c_int, Errno> {
    let b: [u8; 4] = v
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(Errno(libc::EINVAL))?;
    Ok(c_int::from_ne_bytes(b))
}

fn uint_arg(v: &[u8]) -> Result<u32, Errno> {
    u32::try_from(int_arg(v)?).map_err(|_| Errno(libc::EINVAL))
}

fn linger_arg(v: &[u8]) -> Result<libc::linger, Errno> {
    if v.len() < size_of::<libc::linger>() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: v holds at least one linger (checked); unaligned read of plain data.
    Ok(unsafe { v.as_ptr().cast::<libc::linger>().read_unaligned() })
}

impl<P: Provider> Engine<P> {
    fn set_sock_opt(&self, h: &Handle<P>, o: SockOpt) -> Result<(), Errno> {
        match &h.kind {
            Kind::Stream(id) => self.ctx.set_option(*id, o)?,
            Kind::Dgram(d) => Handle::dgram(d).set_option(o)?,
        }
        Ok(())
    }

    fn sock_opt(&self, h: &Handle<P>, n: SockOptName) -> Result<SockOpt, Errno> {
        Ok(match &h.kind {
            Kind::Stream(id) => self.ctx.option(*id, n)?,
            Kind::Dgram(d) => Handle::dgram(d).option(n),
        })
    }

    /// `rsetsockopt`.
    ///
    /// # Errors
    /// `EBADF`, `EINVAL` (short value, bad value, RDMA option after connecting),
    /// `EOPNOTSUPP` (unknown option).
    pub(crate) fn setsockopt(
        &self,
        fd: c_int,
        level: c_int,
        name: c_int,
        v: &[u8],
    ) -> Result<(), Errno> {
        let h = self.handle(fd)?;
        let o = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
                h.extra().reuseaddr = int_arg(v)? != 0;
                return Ok(());
            }
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => {
                h.extra().oobinline = int_arg(v)? != 0;
                return Ok(());
            }
            (libc::SOL_SOCKET, libc::SO_BROADCAST) => {
                h.extra().broadcast = int_arg(v)? != 0;
                return Ok(());
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => SockOpt::RcvBuf(uint_arg(v)?),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => SockOpt::SndBuf(uint_arg(v)?),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => SockOpt::KeepAlive(int_arg(v)? != 0),
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let l = linger_arg(v)?;
                SockOpt::Linger((l.l_onoff != 0).then(|| {
                    std::time::Duration::from_secs(u64::try_from(l.l_linger).unwrap_or(0))
                }))
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                h.extra().tos = int_arg(v)?;
                return Ok(());
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                h.extra().v6only = int_arg(v)? != 0;
                return Ok(());
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => SockOpt::NoDelay(int_arg(v)? != 0),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                SockOpt::KeepIdle(u32::try_from(int_arg(v)?).map_err(|_| Errno(libc::EINVAL))?)
            }
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG | libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => {
                int_arg(v)?;
                return Ok(());
            }
            (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => return Ok(()),
            (SOL_RDMA, RDMA_SQSIZE) => SockOpt::SqSize(uint_arg(v)?),
            (SOL_RDMA, RDMA_RQSIZE) => SockOpt::RqSize(uint_arg(v)?),
            (SOL_RDMA, RDMA_INLINE) => SockOpt::Inline(uint_arg(v)?),
            (SOL_RDMA, RDMA_IOMAPSIZE) => SockOpt::IomapSize(uint_arg(v)?),
            (SOL_RDMA, RDMA_ROUTE) => return Ok(()),
            _ => return Err(Errno(libc::EOPNOTSUPP)),
        };
        self.set_sock_opt(&h, o)
    }

    /// `rgetsockopt`.
    ///
    /// # Errors
    /// `EBADF`, `EOPNOTSUPP` (unknown option).
    pub(crate) fn getsockopt(&self, fd: c_int, level: c_int, name: c_int) -> Result<OptVal, Errno> {
        let h = self.handle(fd)?;
        let flag = |b: bool| OptVal::Int(c_int::from(b));
        let int = |v: u32| OptVal::Int(c_int::try_from(v).unwrap_or(c_int::MAX));
        let stream = matches!(h.kind, Kind::Stream(_));
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => flag(h.extra().reuseaddr),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => flag(h.extra().oobinline),
            (libc::SOL_SOCKET, libc::SO_BROADCAST) => flag(h.extra().broadcast),
            (libc::SOL_SOCKET, libc::SO_TYPE) => OptVal::Int(if stream {
                libc::SOCK_STREAM
            } else {
                libc::SOCK_DGRAM
            }),
            (libc::SOL_SOCKET, libc::SO_DOMAIN) => OptVal::Int(h.family),
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) => OptVal::Int(if stream {
                libc::IPPROTO_TCP
            } else {
                libc::IPPROTO_UDP
            }),
            (libc::SOL_SOCKET, libc::SO_ERROR) => OptVal::Int(match h.kind {
                Kind::Stream(id) => self.ctx.take_error(id)?.map_or(0, |e| e.errno()),
                Kind::Dgram(_) => 0,
            }),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => match self.sock_opt(&h, SockOptName::RcvBuf)? {
                SockOpt::RcvBuf(v) => int(v),
                _ => int(0),
            },
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => match self.sock_opt(&h, SockOptName::SndBuf)? {
                SockOpt::SndBuf(v) => int(v),
                _ => int(0),
            },
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
                flag(self.sock_opt(&h, SockOptName::KeepAlive)? == SockOpt::KeepAlive(true))
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let l = match self.sock_opt(&h, SockOptName::Linger)? {
                    SockOpt::Linger(Some(d)) => libc::linger {
                        l_onoff: 1,
                        l_linger: c_int::try_from(d.as_secs()).unwrap_or(c_int::MAX),
                    },
                    _ => libc::linger {
                        l_onoff: 0,
                        l_linger: 0,
                    },
                };
                OptVal::Linger(l)
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => OptVal::Int(h.extra().tos),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => flag(h.extra().v6only),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
                flag(self.sock_opt(&h, SockOptName::NoDelay)? == SockOpt::NoDelay(true))
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                match self.sock_opt(&h, SockOptName::KeepIdle)? {
                    SockOpt::KeepIdle(s) => int(s),
                    _ => int(0),
                }
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => OptVal::Int(1),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => OptVal::Int(2048),
            (libc::IPPROTO_TCP, libc::TCP_INFO) => {
                // SAFETY: tcp_info is plain old data; all-zero is a valid value.
                let mut t: libc::tcp_info = unsafe { std::mem::zeroed() };
                let up = match h.kind {
                    Kind::Stream(id) => self.ctx.established(id)?,
                    Kind::Dgram(_) => false,
                };
                t.tcpi_state = if up { TCP_ESTABLISHED } else { TCP_CLOSE };
                if let SockOpt::SqSize(s) = self.sock_opt(&h, SockOptName::SqSize)? {
                    t.tcpi_snd_cwnd = s;
                }
                OptVal::TcpInfo(Box::new(t))
            }
            (SOL_RDMA, RDMA_SQSIZE) => match self.sock_opt(&h, SockOptName::SqSize)? {
                SockOpt::SqSize(v) => int(v),
                _ => int(0),
            },
            (SOL_RDMA, RDMA_RQSIZE) => match self.sock_opt(&h, SockOptName::RqSize)? {
                SockOpt::RqSize(v) => int(v),
                _ => int(0),
            },
            (SOL_RDMA, RDMA_INLINE) => match self.sock_opt(&h, SockOptName::Inline)? {
                SockOpt::Inline(v) => int(v),
                _ => int(0),
            },
            (SOL_RDMA, RDMA_IOMAPSIZE) => match self.sock_opt(&h, SockOptName::IomapSize)? {
                SockOpt::IomapSize(v) => int(v),
                _ => int(0),
            },
            _ => return Err(Errno(libc::EOPNOTSUPP)),
        })
    }

    /// `rfcntl` for `F_GETFL`/`F_SETFL` (only `O_NONBLOCK` acts; other flags are kept and
    /// reported back), `F_GETFD`/`F_SETFD` (applied to the descriptor naming the handle,
    /// so `FD_CLOEXEC` is real) and `F_GETOWN`/`F_SETOWN` (stored and reported back).
    ///
    /// librdmacm refuses `F_SETOWN`; programs that set an owner for `SIGURG` on their
    /// sockets as a matter of course (qperf's control connection) then fail through
    /// `librspreload.so`. rsockets have no urgent data and raise no `SIGIO`, so the owner
    /// is only remembered: no signal is ever sent to it, which is what Linux does for a
    /// TCP socket that never receives urgent data.
    ///
    /// # Errors
    /// `EBADF`, `EOPNOTSUPP` for other commands, as librdmacm.
    pub(crate) fn fcntl(&self, fd: c_int, cmd: c_int, arg: libc::c_long) -> Result<c_int, Errno> {
        let h = self.handle(fd)?;
        let nonblocking = || -> Result<bool, Errno> {
            Ok(match &h.kind {
                Kind::Stream(id) => self.ctx.is_nonblocking(*id)?,
                Kind::Dgram(d) => Handle::dgram(d).is_nonblocking(),
            })
        };
        match cmd {
            libc::F_GETFL => {
                let nb = if nonblocking()? { libc::O_NONBLOCK } else { 0 };
                Ok(libc::O_RDWR | h.extra().fl_flags | nb)
            }
            libc::F_SETFL => {
                // The flags argument is an int passed in a long register.
                let flags = arg as c_int;
                let on = flags & libc::O_NONBLOCK != 0;
                match &h.kind {
                    Kind::Stream(id) => self.ctx.set_nonblocking(*id, on)?,
                    Kind::Dgram(d) => Handle::dgram(d).set_nonblocking(on),
                }
                h.extra().fl_flags = flags & !(libc::O_NONBLOCK | libc::O_ACCMODE);
                Ok(0)
            }
            libc::F_GETFD | libc::F_SETFD => {
                // SAFETY: fcntl on the descriptor this handle owns; F_GETFD/F_SETFD take an
                // int argument and no pointers.
                let r = unsafe { libc::fcntl(h.number(), cmd, arg as c_int) };
                if r < 0 {
                    return Err(std::io::Error::last_os_error().into());
                }
                Ok(r)
            }
            libc::F_GETOWN => Ok(h.extra().owner),
            libc::F_SETOWN => {
                // A pid (or a negated process group) passed in a long register.
                h.extra().owner = arg as c_int;
                Ok(0)
            }
            _ => Err(Errno(libc::EOPNOTSUPP)),
        }
    }
}
