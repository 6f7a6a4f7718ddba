//! rsocket defaults, configuration files and socket options.
//!
//! Defaults are librdmacm's (`shared/reference/rsocket.md` section 2): 128 KiB send and
//! receive buffers, 384-entry send and receive queues, 64 inline bytes, no iomap table,
//! 10 us of busy polling before sleeping. Like librdmacm, they can be overridden by files
//! holding one integer each in `${DP_RSOCKET_CONFIG_DIR:-/etc/rdma/rsocket}`:
//! `mem_default`, `wmem_default`, `sqsize_default`, `rqsize_default`, `inline_default`,
//! `iomap_size`, `polling_time`.
//!
//! One default differs: stream sockets get [`STREAM_BUF_DEFAULT`] (512 KiB) send and
//! receive rings where no `mem_default`/`wmem_default` file says otherwise. With
//! librdmacm's 128 KiB, the receiver grants 64 KiB halves, so a sender waits for the
//! receiver to copy out a whole half (and its credit update to come back) every 64 KiB; on a
//! loaded host, where either side can lose its CPU for a while, that stall sets iperf's
//! throughput through the preload (issue 17: 8.8 against 22 Gbit/s, medians of 4). The
//! wire is unchanged (a ring's size is the connection data's `data_buf` length, which any
//! librdmacm peer takes as it comes), the files and `SO_RCVBUF`/`SO_SNDBUF` still set the
//! sizes exactly as in librdmacm, and datagram sockets, whose slot counts are derived from
//! these sizes, keep librdmacm's 128 KiB.

use std::path::Path;
use std::time::Duration;

use crate::conn::{RS_QP_MAX_SIZE, RS_QP_MIN_SIZE, StreamConfig};
use crate::error::RsError;
use crate::wire::{MAX_RBUF_HALF, scale_round};

/// Send and receive ring bytes of a stream socket when no configuration file sets them
/// (librdmacm: 128 KiB; see the module docs).
pub const STREAM_BUF_DEFAULT: u32 = 512 << 10;

/// Process-wide defaults for new sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsConfig {
    /// Receive buffer bytes of datagram sockets (`mem_default`, else librdmacm's 128 KiB).
    pub rbuf: u32,
    /// Send buffer bytes of datagram sockets (`wmem_default`, else librdmacm's 128 KiB).
    pub sbuf: u32,
    /// Receive ring bytes of stream sockets (`mem_default`, else [`STREAM_BUF_DEFAULT`]).
    pub stream_rbuf: u32,
    /// Send ring bytes of stream sockets (`wmem_default`, else [`STREAM_BUF_DEFAULT`]).
    pub stream_sbuf: u32,
    /// Send queue entries (`sqsize_default`).
    pub sq_size: u32,
    /// Receive queue entries (`rqsize_default`).
    pub rq_size: u32,
    /// Inline bytes (`inline_default`).
    pub inline: u32,
    /// Iomap table entries (`iomap_size`), scale-rounded.
    pub iomap_size: u32,
    /// Busy polling before a blocking call starts yielding (`polling_time`, microseconds).
    pub polling_time: Duration,
    /// Keepalive period when `SO_KEEPALIVE` is set without `TCP_KEEPIDLE`
    /// (`/proc/sys/net/ipv4/tcp_keepalive_time`, else 7200 s).
    pub keepalive_time: Duration,
}

impl Default for RsConfig {
    fn default() -> Self {
        Self {
            rbuf: 128 << 10,
            sbuf: 128 << 10,
            stream_rbuf: STREAM_BUF_DEFAULT,
            stream_sbuf: STREAM_BUF_DEFAULT,
            sq_size: 384,
            rq_size: 384,
            inline: 64,
            iomap_size: 0,
            polling_time: Duration::from_micros(10),
            keepalive_time: Duration::from_secs(7200),
        }
    }
}

fn read_num(dir: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl RsConfig {
    /// The defaults, overridden by the configuration directory and the kernel's TCP
    /// keepalive time, as librdmacm's `rs_configure` does.
    pub fn from_system() -> Self {
        let dir = std::env::var_os("DP_RSOCKET_CONFIG_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/etc/rdma/rsocket".into());
        Self::from_dir(&dir)
    }

    /// The defaults, overridden by the configuration files in `dir` and the kernel's TCP
    /// keepalive time.
    fn from_dir(dir: &Path) -> Self {
        let mut c = Self::default();
        if let Some(v) = read_num(dir, "mem_default") {
            c.rbuf = v.clamp(1, u64::from(u32::MAX / 2)) as u32;
            c.stream_rbuf = c.rbuf;
        }
        if let Some(v) = read_num(dir, "wmem_default") {
            c.sbuf = if v < 2048 {
                4096
            } else {
                v.min(u64::from(u32::MAX / 2)) as u32
            };
            c.stream_sbuf = c.sbuf;
        }
        if let Some(v) = read_num(dir, "sqsize_default") {
            c.sq_size = v.min(u64::from(RS_QP_MAX_SIZE)) as u32;
        }
        if let Some(v) = read_num(dir, "rqsize_default") {
            c.rq_size = v.min(u64::from(RS_QP_MAX_SIZE)) as u32;
        }
        if let Some(v) = read_num(dir, "inline_default") {
            c.inline = v.min(u64::from(RS_QP_MAX_SIZE)) as u32;
        }
        if let Some(v) = read_num(dir, "iomap_size") {
            c.iomap_size = scale_round(v.min(32512) as u32);
        }
        if let Some(v) = read_num(dir, "polling_time") {
            c.polling_time = Duration::from_micros(v);
        }
        if let Some(v) = read_num(Path::new("/proc/sys/net/ipv4"), "tcp_keepalive_time") {
            c.keepalive_time = Duration::from_secs(v.max(1));
        }
        c
    }
}

/// A socket option, as `rsetsockopt`/`rgetsockopt` name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockOpt {
    /// `SO_SNDBUF`: stored doubled (like Linux); effective only before the connection.
    SndBuf(u32),
    /// `SO_RCVBUF`: stored doubled; effective only before the connection.
    RcvBuf(u32),
    /// `SO_KEEPALIVE`.
    KeepAlive(bool),
    /// `SO_LINGER`: stored; close is always graceful, as in librdmacm.
    Linger(Option<Duration>),
    /// `TCP_NODELAY`: stored (there is no Nagle delay to disable).
    NoDelay(bool),
    /// `TCP_KEEPIDLE`: keepalive period in seconds (> 0).
    KeepIdle(u32),
    /// `RDMA_SQSIZE`: send queue entries, before connecting.
    SqSize(u32),
    /// `RDMA_RQSIZE`: receive queue entries, before connecting.
    RqSize(u32),
    /// `RDMA_INLINE`: inline bytes, before connecting.
    Inline(u32),
    /// `RDMA_IOMAPSIZE`: iomap entries (scale-rounded), before connecting.
    IomapSize(u32),
}

/// Which option to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockOptName {
    /// `SO_SNDBUF`.
    SndBuf,
    /// `SO_RCVBUF`.
    RcvBuf,
    /// `SO_KEEPALIVE`.
    KeepAlive,
    /// `SO_LINGER`.
    Linger,
    /// `TCP_NODELAY`.
    NoDelay,
    /// `TCP_KEEPIDLE`.
    KeepIdle,
    /// `RDMA_SQSIZE`.
    SqSize,
    /// `RDMA_RQSIZE`.
    RqSize,
    /// `RDMA_INLINE`.
    Inline,
    /// `RDMA_IOMAPSIZE`.
    IomapSize,
}

/// Per-socket option values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockOpts {
    /// Send buffer bytes.
    pub sbuf: u32,
    /// Receive buffer bytes.
    pub rbuf: u32,
    /// Send queue entries.
    pub sq_size: u32,
    /// Receive queue entries.
    pub rq_size: u32,
    /// Inline bytes.
    pub inline: u32,
    /// Iomap table entries.
    pub iomap_size: u32,
    /// `SO_KEEPALIVE`.
    pub keepalive: bool,
    /// Keepalive period.
    pub keepidle: Duration,
    /// `SO_LINGER`.
    pub linger: Option<Duration>,
    /// `TCP_NODELAY`.
    pub nodelay: bool,
}

impl SockOpts {
    /// Options of a new stream socket: as [`new`](Self::new), with the stream ring sizes.
    pub fn stream(c: &RsConfig) -> Self {
        Self {
            sbuf: c.stream_sbuf,
            rbuf: c.stream_rbuf,
            ..Self::new(c)
        }
    }

    /// Options of a new datagram socket.
    pub fn new(c: &RsConfig) -> Self {
        Self {
            sbuf: c.sbuf,
            rbuf: c.rbuf,
            sq_size: c.sq_size,
            rq_size: c.rq_size,
            inline: c.inline,
            iomap_size: c.iomap_size,
            keepalive: false,
            keepidle: c.keepalive_time,
            linger: None,
            nodelay: false,
        }
    }

    /// Applies an option. `connected_or_opening` is true once the socket started
    /// connecting: RDMA-level options are refused then (`EINVAL`), buffer sizes are
    /// silently kept (as librdmacm does once buffers exist).
    ///
    /// # Errors
    /// [`RsError::Invalid`] for a zero keepalive period, RDMA options after connecting, or
    /// sizes above `RDMA_*` limits.
    pub fn set(&mut self, opt: SockOpt, connected_or_opening: bool) -> Result<(), RsError> {
        let rdma_level = matches!(
            opt,
            SockOpt::SqSize(_) | SockOpt::RqSize(_) | SockOpt::Inline(_) | SockOpt::IomapSize(_)
        );
        if rdma_level && connected_or_opening {
            return Err(RsError::Invalid);
        }
        match opt {
            SockOpt::SndBuf(v) => {
                if !connected_or_opening {
                    let v = v.saturating_mul(2);
                    self.sbuf = if v < 2048 { 4096 } else { v };
                }
            }
            SockOpt::RcvBuf(v) => {
                if !connected_or_opening {
                    self.rbuf = v.saturating_mul(2).max(2);
                }
            }
            SockOpt::KeepAlive(on) => self.keepalive = on,
            SockOpt::Linger(l) => self.linger = l,
            SockOpt::NoDelay(on) => self.nodelay = on,
            SockOpt::KeepIdle(s) => {
                if s == 0 {
                    return Err(RsError::Invalid);
                }
                self.keepidle = Duration::from_secs(u64::from(s));
            }
            SockOpt::SqSize(v) | SockOpt::RqSize(v) | SockOpt::Inline(v) if v > RS_QP_MAX_SIZE => {
                return Err(RsError::Invalid);
            }
            SockOpt::SqSize(v) => self.sq_size = v,
            SockOpt::RqSize(v) => self.rq_size = v,
            SockOpt::Inline(v) => self.inline = v,
            SockOpt::IomapSize(v) => self.iomap_size = scale_round(v.min(32512)),
        }
        Ok(())
    }

    /// Reads an option.
    pub fn get(&self, name: SockOptName) -> SockOpt {
        match name {
            SockOptName::SndBuf => SockOpt::SndBuf(self.sbuf),
            SockOptName::RcvBuf => SockOpt::RcvBuf(self.rbuf),
            SockOptName::KeepAlive => SockOpt::KeepAlive(self.keepalive),
            SockOptName::Linger => SockOpt::Linger(self.linger),
            SockOptName::NoDelay => SockOpt::NoDelay(self.nodelay),
            SockOptName::KeepIdle => {
                SockOpt::KeepIdle(self.keepidle.as_secs().min(u64::from(u32::MAX)) as u32)
            }
            SockOptName::SqSize => SockOpt::SqSize(self.sq_size),
            SockOptName::RqSize => SockOpt::RqSize(self.rq_size),
            SockOptName::Inline => SockOpt::Inline(self.inline),
            SockOptName::IomapSize => SockOpt::IomapSize(self.iomap_size),
        }
    }

    /// The stream configuration these options give on a device whose queues hold at most
    /// `max_qp_wr` entries and that sends at most `max_inline` bytes inline.
    pub fn stream_config(&self, max_qp_wr: u32, max_inline: u32) -> StreamConfig {
        let qmax = max_qp_wr.clamp(RS_QP_MIN_SIZE, RS_QP_MAX_SIZE);
        StreamConfig {
            sq_size: self.sq_size.clamp(RS_QP_MIN_SIZE, qmax),
            rq_size: self.rq_size.clamp(RS_QP_MIN_SIZE, qmax),
            sbuf_size: self.sbuf.max(4096),
            // Even, and no larger than a peer accepts in connection data (halves up to
            // MAX_RBUF_HALF, as librdmacm's `int` sizes allow).
            rbuf_size: (self.rbuf.clamp(2, 2 * MAX_RBUF_HALF - 1) + 1) & !1,
            sq_inline: self.inline.min(max_inline),
            target_iomap_size: self.iomap_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_rings_default_larger_and_files_set_both() {
        let c = RsConfig::default();
        let (s, d) = (SockOpts::stream(&c), SockOpts::new(&c));
        assert_eq!((s.rbuf, s.sbuf), (512 << 10, 512 << 10), "stream default");
        assert_eq!(
            (d.rbuf, d.sbuf),
            (128 << 10, 128 << 10),
            "librdmacm's, for datagrams"
        );
        let dir = std::env::temp_dir().join(format!("dp-rsocket-opts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("mem_default"), "65536\n").unwrap();
        std::fs::write(dir.join("wmem_default"), "1000").unwrap();
        let c = RsConfig::from_dir(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            (c.rbuf, c.stream_rbuf),
            (65536, 65536),
            "mem_default sets both"
        );
        assert_eq!(
            (c.sbuf, c.stream_sbuf),
            (4096, 4096),
            "wmem_default as librdmacm"
        );
        let mut s = SockOpts::stream(&c);
        s.set(SockOpt::RcvBuf(1 << 20), false).unwrap();
        assert_eq!(s.rbuf, 2 << 20, "SO_RCVBUF still doubled over the default");
    }

    #[test]
    fn options_follow_librdmacm_rules() {
        let mut o = SockOpts::new(&RsConfig::default());
        o.set(SockOpt::SndBuf(1000), false).unwrap();
        assert_eq!(o.sbuf, 4096, "tiny send buffers become 4096");
        o.set(SockOpt::RcvBuf(1 << 19), false).unwrap();
        assert_eq!(o.rbuf, 1 << 20, "doubled like Linux");
        o.set(SockOpt::RcvBuf(64), true).unwrap();
        assert_eq!(o.rbuf, 1 << 20, "ignored once connecting");
        assert_eq!(o.set(SockOpt::SqSize(100), true), Err(RsError::Invalid));
        assert_eq!(
            o.set(SockOpt::Inline(0x1_0000), false),
            Err(RsError::Invalid)
        );
        assert_eq!(o.set(SockOpt::KeepIdle(0), false), Err(RsError::Invalid));
        o.set(SockOpt::IomapSize(300), false).unwrap();
        assert_eq!(o.get(SockOptName::IomapSize), SockOpt::IomapSize(256));
        let c = o.stream_config(16384, 64);
        assert_eq!((c.sq_size, c.rq_size, c.sq_inline), (384, 384, 64));
        o.set(SockOpt::SqSize(1), false).unwrap();
        assert_eq!(
            o.stream_config(16384, 64).sq_size,
            16,
            "clamped to RS_QP_MIN_SIZE"
        );
        o.set(SockOpt::RcvBuf(u32::MAX), false).unwrap();
        assert_eq!(
            o.stream_config(16384, 64).rbuf_size,
            2 * MAX_RBUF_HALF,
            "receive buffers end where a peer's connection data check does"
        );
        o.rbuf = 7;
        assert_eq!(o.stream_config(16384, 64).rbuf_size, 8, "even");
    }
}
