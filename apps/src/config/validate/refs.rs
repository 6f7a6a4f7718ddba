//! What a stage names, resolved: the rings it reads (exactly one reader per ring) and
//! writes, the pools it takes payloads from, its addresses and its burst (no larger than
//! the rings it uses). The stages of `stages.rs`, `rds.rs` and `rnbd.rs` all go through
//! these, so every stage kind reports a bad reference the same way.

use std::net::SocketAddr;
use std::ops::Range;

use toml::Spanned;

use super::Checker;
use crate::config::error::ConfigError;
use crate::config::types::{MAX_BURST, PoolDef};

const DEFAULT_BURST: usize = 32;

impl Checker<'_, '_> {
    /// Records a stage reading `ring`, checking the ring exists and has no other reader.
    pub(in crate::config) fn consume(
        &mut self,
        stage: &str,
        ring: &Spanned<String>,
        key: &str,
    ) -> Result<String, ConfigError> {
        let section = format!("stage.{stage}");
        let name = ring.get_ref().clone();
        self.known_ring(&section, key, ring)?;
        let u = self.uses.entry(name.clone()).or_default();
        if let Some(other) = &u.consumer {
            return Err(self.doc.invalid(
                &ring.span(),
                &section,
                key,
                format!(
                    "ring `{name}` is already read by stage `{other}`; a ring has exactly one \
                     consumer (copy messages to several rings with a fanout stage)"
                ),
            ));
        }
        u.consumer = Some(stage.to_owned());
        Ok(name)
    }

    /// Records a stage writing `ring`.
    pub(in crate::config) fn produce(
        &mut self,
        stage: &str,
        ring: &Spanned<String>,
        key: &str,
    ) -> Result<String, ConfigError> {
        let section = format!("stage.{stage}");
        let name = ring.get_ref().clone();
        self.known_ring(&section, key, ring)?;
        let u = self.uses.entry(name.clone()).or_default();
        if u.producers.iter().any(|p| p == stage) {
            return Err(self.doc.invalid(
                &ring.span(),
                &section,
                key,
                format!("stage `{stage}` writes ring `{name}` twice"),
            ));
        }
        u.producers.push(stage.to_owned());
        Ok(name)
    }

    fn known_ring(
        &self,
        section: &str,
        key: &str,
        ring: &Spanned<String>,
    ) -> Result<(), ConfigError> {
        if self.ring_caps.contains_key(ring.get_ref()) {
            return Ok(());
        }
        let mut known: Vec<&str> = self.ring_caps.keys().map(String::as_str).collect();
        known.sort_unstable();
        let known = if known.is_empty() {
            "there are no [ring.NAME] sections".to_owned()
        } else {
            format!("the rings are {}", known.join(", "))
        };
        Err(self.doc.invalid(
            &ring.span(),
            section,
            key,
            format!(
                "no ring `{}`: declare [ring.{}]; {known}",
                ring.get_ref(),
                ring.get_ref()
            ),
        ))
    }

    pub(in crate::config) fn pool_ref(
        &self,
        pools: &[PoolDef],
        section: &str,
        p: &Spanned<String>,
    ) -> Result<String, ConfigError> {
        if pools.iter().any(|d| d.name == *p.get_ref()) {
            return Ok(p.get_ref().clone());
        }
        Err(self.doc.invalid(
            &p.span(),
            section,
            "pool",
            format!(
                "no pool `{}`: declare [pool.{}] with obj_size and count",
                p.get_ref(),
                p.get_ref()
            ),
        ))
    }

    pub(in crate::config) fn burst(
        &self,
        section: &str,
        b: Option<&Spanned<usize>>,
        rings: &[&str],
    ) -> Result<usize, ConfigError> {
        let Some(b) = b else {
            let cap = rings
                .iter()
                .filter_map(|r| self.ring_caps.get(*r))
                .min()
                .copied()
                .unwrap_or(DEFAULT_BURST);
            return Ok(DEFAULT_BURST.min(cap));
        };
        let v = *b.get_ref();
        if v == 0 || v > MAX_BURST {
            return Err(self.doc.bad_value(
                &b.span(),
                section,
                "burst",
                format!("{v} is outside 1..={MAX_BURST}"),
            ));
        }
        for r in rings {
            if let Some(&cap) = self.ring_caps.get(*r)
                && v > cap
            {
                return Err(self.doc.invalid(
                    &b.span(),
                    section,
                    "burst",
                    format!("burst {v} exceeds the capacity {cap} of ring `{r}`"),
                ));
            }
        }
        Ok(v)
    }

    pub(in crate::config) fn addr(
        &self,
        section: &str,
        key: &str,
        a: &Spanned<String>,
    ) -> Result<SocketAddr, ConfigError> {
        a.get_ref().parse().map_err(|_| {
            self.doc.bad_value(
                &a.span(),
                section,
                key,
                format!(
                    "`{}` is not an IP:port address (for example \"10.0.0.1:7000\"; with the shm \
                     provider any address works, it only names the service)",
                    a.get_ref()
                ),
            )
        })
    }

    pub(in crate::config) fn no_fabric(&self, span: &Range<usize>, section: &str) -> ConfigError {
        self.doc.invalid(
            span,
            section,
            "kind",
            "rsocket, RDS and RNBD stages need a [fabric] section; add `[fabric]` with `provider = \"shm\"`"
                .to_owned(),
        )
    }
}
