//! The resource sections: `[eal]` (the lcores and how they poll), `[pool.NAME]`,
//! `[fabric]` and `[ring.NAME]`, each checked on its own and converted; and, once the
//! stages are known, the pools sized against the stages that hold their objects.

use std::time::Duration;

use lcore::{CoreList, PollMode};
use mempool::pool::{flush_threshold, max_cache_size};
use toml::Spanned;

use super::{Checker, MAX_TIMEOUT_MS};
use crate::config::error::ConfigError;
use crate::config::raw::{RawMode, RawProvider};
use crate::config::types::{Config, Eal, Fabric, MAX_POOLS, PoolDef, Provider, RingDef, StageKind};

const DEFAULT_RING_CAPACITY: usize = 1024;
const MAX_RING_CAPACITY: usize = 1 << 20;
const DEFAULT_SPIN_US: u64 = 50;
const DEFAULT_SLEEP_US: u64 = 50;
const DEFAULT_DRAIN_MS: u64 = 5_000;
const DEFAULT_BOUNCE: u32 = 4096;

impl Checker<'_, '_> {
    pub(super) fn eal(&mut self) -> Result<Eal, ConfigError> {
        let Some((raw, span)) = self.s.eal.take() else {
            return Err(ConfigError::Invalid {
                file: self.doc.file.to_owned(),
                line: 1,
                key: "cores".to_owned(),
                section: "eal".to_owned(),
                message: "missing section [eal]; add `[eal]` with `cores = \"0-1\"` (the CPUs to run lcores on)".to_owned(),
            });
        };
        let _ = span;
        let cspan = raw.cores.span();
        let cores = CoreList::parse(raw.cores.get_ref())
            .map_err(|e| self.doc.bad_value(&cspan, "eal", "cores", e.to_string()))?;
        if let CoreList::Cpus(c) = &cores {
            self.cpus = Some(c.clone());
        }
        let main = match &raw.main {
            Some(m) => {
                let cpu = *m.get_ref();
                if let Some(c) = &self.cpus
                    && !c.contains(&cpu)
                {
                    return Err(self.doc.invalid(
                        &m.span(),
                        "eal",
                        "main",
                        format!(
                            "CPU {cpu} is not in cores `{cores}`; add it there or pick one of them"
                        ),
                    ));
                }
                Some(cpu)
            }
            None => None,
        };
        let mode = match raw.mode {
            RawMode::Busy => {
                if raw.spin_us.is_some() || raw.sleep_us.is_some() {
                    return Err(self.doc.invalid(
                        &cspan,
                        "eal",
                        "mode",
                        "spin_us and sleep_us apply to mode = \"hybrid\" only; remove them or switch modes".to_owned(),
                    ));
                }
                PollMode::Busy
            }
            RawMode::Hybrid => PollMode::Hybrid {
                spin: Duration::from_micros(raw.spin_us.unwrap_or(DEFAULT_SPIN_US)),
                sleep: Duration::from_micros(raw.sleep_us.unwrap_or(DEFAULT_SLEEP_US)),
            },
        };
        let drain_ms = match &raw.drain_timeout_ms {
            Some(d) if *d.get_ref() == 0 || *d.get_ref() > MAX_TIMEOUT_MS => {
                return Err(self.doc.bad_value(
                    &d.span(),
                    "eal",
                    "drain_timeout_ms",
                    format!("{} is outside 1..={MAX_TIMEOUT_MS}", d.get_ref()),
                ));
            }
            Some(d) => *d.get_ref(),
            None => DEFAULT_DRAIN_MS,
        };
        Ok(Eal {
            cores,
            cores_line: self.doc.line(cspan.start),
            main,
            mode,
            drain_timeout: Duration::from_millis(drain_ms),
        })
    }

    pub(super) fn pools(&mut self) -> Result<Vec<PoolDef>, ConfigError> {
        let raw = std::mem::take(&mut self.s.pools);
        if raw.len() > MAX_POOLS {
            let (name, span, _) = &raw[MAX_POOLS];
            return Err(self.doc.invalid(
                span,
                &format!("pool.{name}"),
                "obj_size",
                format!("more than {MAX_POOLS} pools; share pools between stages"),
            ));
        }
        let mut out = Vec::new();
        for (name, span, p) in raw {
            let section = format!("pool.{name}");
            let size = *p.obj_size.get_ref();
            if size == 0 || size > 1 << 20 {
                return Err(self.doc.bad_value(
                    &p.obj_size.span(),
                    &section,
                    "obj_size",
                    format!("{size} is outside 1..=1048576 bytes"),
                ));
            }
            if *p.count.get_ref() == 0 {
                return Err(self.doc.bad_value(
                    &p.count.span(),
                    &section,
                    "count",
                    "a pool needs at least one object".to_owned(),
                ));
            }
            out.push(PoolDef {
                name,
                line: self.doc.line(span.start),
                obj_size: size,
                count: *p.count.get_ref(),
                cache: p.cache,
            });
        }
        Ok(out)
    }

    pub(super) fn fabric(&mut self) -> Result<Option<Fabric>, ConfigError> {
        let Some((raw, span)) = self.s.fabric.take() else {
            return Ok(None);
        };
        let pspan = raw.provider.span();
        let provider = match raw.provider.get_ref() {
            RawProvider::Shm => {
                if let Some(d) = &raw.device {
                    return Err(self.doc.invalid(
                        &d.span(),
                        "fabric",
                        "device",
                        "`device` applies to provider = \"verbs\"; the shm provider needs no device".to_owned(),
                    ));
                }
                self.bounce.clone_from(&raw.bounce_bytes);
                let bounce = match &raw.bounce_bytes {
                    Some(b) if !(4096..=1 << 30).contains(b.get_ref()) => {
                        return Err(self.doc.bad_value(
                            &b.span(),
                            "fabric",
                            "bounce_bytes",
                            format!("{} is outside 4096..=1073741824", b.get_ref()),
                        ));
                    }
                    Some(b) => *b.get_ref(),
                    None => DEFAULT_BOUNCE,
                };
                Provider::Shm {
                    dir: raw.dir.map(Into::into),
                    bounce_bytes: bounce,
                }
            }
            RawProvider::Verbs => {
                if !cfg!(feature = "verbs") {
                    return Err(self.doc.invalid(
                        &pspan,
                        "fabric",
                        "provider",
                        "this dpctl was built without the verbs provider; rebuild with \
                         `cargo build --release -p apps --features verbs` (needs libibverbs-dev \
                         and librdmacm-dev), or use provider = \"shm\""
                            .to_owned(),
                    ));
                }
                if let Some(b) = &raw.bounce_bytes {
                    return Err(self.doc.invalid(
                        &b.span(),
                        "fabric",
                        "bounce_bytes",
                        "`bounce_bytes` applies to provider = \"shm\" only".to_owned(),
                    ));
                }
                if raw.dir.is_some() {
                    return Err(self.doc.invalid(
                        &pspan,
                        "fabric",
                        "dir",
                        "`dir` applies to provider = \"shm\" only".to_owned(),
                    ));
                }
                Provider::Verbs {
                    device: raw.device.map(Spanned::into_inner),
                }
            }
        };
        Ok(Some(Fabric {
            provider,
            line: self.doc.line(span.start),
        }))
    }

    pub(super) fn rings(&mut self) -> Result<Vec<RingDef>, ConfigError> {
        let mut out = Vec::new();
        for (name, span, r) in std::mem::take(&mut self.s.rings) {
            let cap = match &r.capacity {
                Some(c) => {
                    let v = *c.get_ref();
                    if !(2..=MAX_RING_CAPACITY).contains(&v) || !v.is_power_of_two() {
                        return Err(self.doc.bad_value(
                            &c.span(),
                            &format!("ring.{name}"),
                            "capacity",
                            format!("{v} is not a power of two in 2..={MAX_RING_CAPACITY}"),
                        ));
                    }
                    v
                }
                None => DEFAULT_RING_CAPACITY,
            };
            self.ring_caps.insert(name.clone(), cap);
            self.ring_spans.insert(name.clone(), span.clone());
            out.push(RingDef {
                name,
                line: self.doc.line(span.start),
                capacity: cap,
                producers: Vec::new(),
                consumer: String::new(),
            });
        }
        Ok(out)
    }

    /// Pools must hold more objects than their users' caches can strand (mempool docs).
    pub(super) fn pool_sizes(&self, cfg: &Config) -> Result<(), ConfigError> {
        // Stages that free or copy payloads hold a cache of every pool.
        let freeing = cfg
            .stages
            .iter()
            .filter(|s| {
                matches!(
                    s.kind,
                    StageKind::Sink(_)
                        | StageKind::Fanout(_)
                        | StageKind::RsocketClient(_)
                        | StageKind::RdsSender(_)
                )
            })
            .count() as u64;
        for p in &cfg.pools {
            let allocating = cfg
                .stages
                .iter()
                .filter(|s| match &s.kind {
                    StageKind::Generator(g) => g.pool.as_deref() == Some(&p.name),
                    StageKind::RsocketServer(v) => v.pool.as_deref() == Some(&p.name),
                    StageKind::RdsReceiver(r) => r.pool.as_deref() == Some(&p.name),
                    _ => false,
                })
                .count() as u64;
            let cache = p.cache.unwrap_or_else(|| 256.min(max_cache_size(p.count)));
            let users = freeing + allocating;
            let strand = users * u64::from(flush_threshold(cache));
            let need = strand.max(u64::from(flush_threshold(cache)));
            if allocating > 0 && u64::from(p.count) < need {
                return Err(ConfigError::Invalid {
                    file: cfg.source.clone(),
                    line: p.line,
                    key: "count".to_owned(),
                    section: format!("pool.{}", p.name),
                    message: format!(
                        "{} objects are too few: {users} stages keep a cache of up to {} objects \
                         each, so a stage can find the pool empty for good; raise count to at \
                         least {need} or lower cache",
                        p.count,
                        flush_threshold(cache)
                    ),
                });
            }
        }
        Ok(())
    }
}
