//! The checks of the RDS stages, `rds_sender` and `rds_receiver`: methods of the same
//! [`Checker`] as every other stage, kept here so `validate.rs` stays readable.
//!
//! Each RDS stage is an RDS node of its own: it owns the IP address of its `bind`, as a host
//! owns its addresses. Two nodes cannot own one address (they would answer for each other),
//! so two RDS stages of one file must bind different IPs; a sender's `dest` must be another
//! node's address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use toml::Spanned;

use super::error::ConfigError;
use super::raw::{RawRdsReceiver, RawRdsSender};
use super::types::{Fabric, PoolDef, Provider, RdsReceiverDef, RdsSenderDef, StageDef, StageKind};
use super::validate::Checker;

/// Default `SO_SNDBUF` / `SO_RCVBUF` of an RDS stage's socket.
pub(super) const DEFAULT_SOCK_BUF: u32 = 4 << 20;
/// The largest socket buffer an RDS stage may ask for (the node's `wmem_max`/`rmem_max`).
pub(super) const MAX_RDS_SOCK_BUF: u32 = 64 << 20;
/// The smallest: one largest message must fit.
const MIN_SOCK_BUF: u32 = 128 << 10;
/// The largest SEND of RDS over the fabric: a 48-byte header and a 4 KiB fragment.
const RDS_MAX_FRAME: u32 = 48 + 4096;
/// The shm bounce buffer of a file with RDS stages when `bounce_bytes` is not given.
const RDS_DEFAULT_BOUNCE: u32 = 64 << 10;

impl Checker<'_, '_> {
    pub(super) fn rds_sender(
        &mut self,
        name: &str,
        section: &str,
        r: &RawRdsSender,
    ) -> Result<RdsSenderDef, ConfigError> {
        let input = self.consume(name, &r.input, "input")?;
        let bind = self.addr(section, "bind", &r.bind)?;
        let dest = self.addr(section, "dest", &r.dest)?;
        if dest.port() == 0 {
            return Err(self.doc.bad_value(
                &r.dest.span(),
                section,
                "dest",
                format!(
                    "port 0 of {} is not a receiver's port; give the `bind` port of the \
                     rds_receiver that should get the messages",
                    dest.ip()
                ),
            ));
        }
        if dest.ip() == bind.ip() {
            return Err(self.doc.invalid(
                &r.dest.span(),
                section,
                "dest",
                format!(
                    "{} is this stage's own address (from `bind`); every RDS stage is a node \
                     of its own, so send to the `bind` address of an rds_receiver, which must \
                     own a different IP",
                    dest.ip()
                ),
            ));
        }
        let burst = self.burst(section, r.burst.as_ref(), &[&input])?;
        let sndbuf = self.sock_buf(section, "sndbuf", r.sndbuf.as_ref())?;
        Ok(RdsSenderDef {
            input,
            bind,
            dest,
            burst,
            sndbuf,
        })
    }

    pub(super) fn rds_receiver(
        &mut self,
        name: &str,
        section: &str,
        r: &RawRdsReceiver,
        pools: &[PoolDef],
    ) -> Result<RdsReceiverDef, ConfigError> {
        let bind = self.addr(section, "bind", &r.bind)?;
        if bind.port() == 0 {
            return Err(self.doc.bad_value(
                &r.bind.span(),
                section,
                "bind",
                "a receiver needs a fixed port for senders to name in `dest`; give one, for \
                 example \"10.0.0.2:4000\""
                    .to_owned(),
            ));
        }
        let output = self.produce(name, &r.output, "output")?;
        let pool = match &r.pool {
            Some(p) => Some(self.pool_ref(pools, section, p)?),
            None => None,
        };
        let senders = match &r.senders {
            Some(c) if *c.get_ref() == 0 => {
                return Err(self.doc.bad_value(
                    &c.span(),
                    section,
                    "senders",
                    "must be at least 1 (omit it to receive until stopped)".to_owned(),
                ));
            }
            Some(c) => Some(*c.get_ref()),
            None => None,
        };
        let burst = self.burst(section, r.burst.as_ref(), &[&output])?;
        let rcvbuf = self.sock_buf(section, "rcvbuf", r.rcvbuf.as_ref())?;
        Ok(RdsReceiverDef {
            bind,
            output,
            pool,
            senders,
            verify: r.verify.unwrap_or(true),
            burst,
            rcvbuf,
        })
    }

    fn sock_buf(
        &self,
        section: &str,
        key: &str,
        v: Option<&Spanned<u32>>,
    ) -> Result<u32, ConfigError> {
        match v {
            Some(b) if !(MIN_SOCK_BUF..=MAX_RDS_SOCK_BUF).contains(b.get_ref()) => {
                Err(self.doc.bad_value(
                    &b.span(),
                    section,
                    key,
                    format!(
                        "{} is outside {MIN_SOCK_BUF}..={MAX_RDS_SOCK_BUF} bytes",
                        b.get_ref()
                    ),
                ))
            }
            Some(b) => Ok(*b.get_ref()),
            None => Ok(DEFAULT_SOCK_BUF),
        }
    }

    /// RDS over shm SENDs whole frames of up to [`RDS_MAX_FRAME`] bytes through the bounce
    /// buffer: a file with RDS stages gets a larger default, and a smaller explicit value is
    /// an error.
    pub(super) fn rds_bounce(
        &self,
        fabric: &mut Option<Fabric>,
        stages: &[StageDef],
    ) -> Result<(), ConfigError> {
        let rds = stages
            .iter()
            .any(|s| matches!(s.kind, StageKind::RdsSender(_) | StageKind::RdsReceiver(_)));
        let Some(Fabric {
            provider: Provider::Shm { bounce_bytes, .. },
            ..
        }) = fabric
        else {
            return Ok(());
        };
        if !rds {
            return Ok(());
        }
        match &self.bounce {
            None => *bounce_bytes = RDS_DEFAULT_BOUNCE,
            Some(b) if *b.get_ref() < RDS_MAX_FRAME => {
                return Err(self.doc.invalid(
                    &b.span(),
                    "fabric",
                    "bounce_bytes",
                    format!(
                        "{} bytes cannot carry RDS: its frames are up to {RDS_MAX_FRAME} bytes \
                         (a 48-byte header and a 4 KiB fragment); raise it to at least \
                         {RDS_MAX_FRAME}, or remove it (files with RDS stages default to \
                         {RDS_DEFAULT_BOUNCE})",
                        b.get_ref()
                    ),
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Records that stage `name` is the RDS node owning `addr`'s IP; two nodes of one file
    /// cannot own the same IP.
    pub(super) fn rds_node(
        &self,
        nodes: &mut HashMap<IpAddr, String>,
        name: &str,
        section: &str,
        raw: &Spanned<String>,
        addr: SocketAddr,
    ) -> Result<(), ConfigError> {
        if let Some(other) = nodes.insert(addr.ip(), name.to_owned()) {
            return Err(self.doc.invalid(
                &raw.span(),
                section,
                "bind",
                format!(
                    "stage `{other}` already binds {}; every RDS stage is a node of its own and \
                     owns the IP of its `bind`, so give each RDS stage a different IP",
                    addr.ip()
                ),
            ));
        }
        Ok(())
    }
}
