//! Cross-section checks: references resolve, rings have one consumer and at least one
//! producer, values fit together; and the conversion into the validated types of [`super`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use lcore::{CoreList, PollMode};
use mempool::memory::HugePolicy;
use mempool::pool::{flush_threshold, max_cache_size};
use toml::Spanned;

use super::doc::Doc;
use super::error::ConfigError;
use super::raw::{
    RawGenerator, RawHuge, RawMode, RawOnFull, RawPattern, RawProvider, RawServerMode, RawStage,
    Sections,
};
use super::types::{
    ClientDef, Config, Eal, Fabric, FanoutDef, ForwarderDef, GeneratorDef, MAX_BURST, MAX_POOLS,
    Memory, OnFull, PoolDef, Provider, RingDef, ServerDef, ServerMode, SinkDef, StageDef,
    StageKind,
};
use crate::msg::{HEADER_LEN, MAX_MSG_LEN, MIN_MSG_LEN, Pattern};

const DEFAULT_RING_CAPACITY: usize = 1024;
const MAX_RING_CAPACITY: usize = 1 << 20;
const DEFAULT_BURST: usize = 32;
const DEFAULT_SPIN_US: u64 = 50;
const DEFAULT_SLEEP_US: u64 = 50;
const DEFAULT_DRAIN_MS: u64 = 5_000;
const MAX_TIMEOUT_MS: u64 = 600_000;
const DEFAULT_BOUNCE: u32 = 4096;
const DEFAULT_SYMBOLS: u32 = 16;
const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Who uses a ring, for the one-consumer rule.
#[derive(Default)]
struct RingUse {
    producers: Vec<String>,
    consumer: Option<String>,
}

/// Cross-section checks and the conversion to validated types.
pub(super) struct Checker<'d, 'a> {
    pub(super) doc: &'d Doc<'a>,
    s: Sections,
    cpus: Option<Vec<usize>>,
    ring_caps: HashMap<String, usize>,
    ring_spans: HashMap<String, Range<usize>>,
    uses: HashMap<String, RingUse>,
    /// `[fabric] bounce_bytes` as written, if it was.
    pub(super) bounce: Option<Spanned<u32>>,
}

impl<'d, 'a> Checker<'d, 'a> {
    pub(super) fn new(doc: &'d Doc<'a>, s: Sections) -> Self {
        Self {
            doc,
            s,
            cpus: None,
            ring_caps: HashMap::new(),
            ring_spans: HashMap::new(),
            uses: HashMap::new(),
            bounce: None,
        }
    }

    pub(super) fn check(mut self) -> Result<Config, ConfigError> {
        let eal = self.eal()?;
        let memory = Memory {
            hugepages: match self.s.memory.hugepages {
                RawHuge::Auto => HugePolicy::Auto,
                RawHuge::Never => HugePolicy::Never,
                RawHuge::Require => HugePolicy::Require,
            },
        };
        let pools = self.pools()?;
        let mut fabric = self.fabric()?;
        let mut rings = self.rings()?;
        let stages = self.stages(&pools, fabric.is_some())?;
        self.rds_bounce(&mut fabric, &stages)?;
        for r in &mut rings {
            let u = self.uses.remove(&r.name).unwrap_or_default();
            let span = self.ring_spans.get(&r.name).cloned().unwrap_or(0..0);
            if u.producers.is_empty() {
                return Err(self.doc.invalid(
                    &span,
                    &format!("ring.{}", r.name),
                    "capacity",
                    format!(
                        "ring `{}` has no producer; give a stage `output = \"{}\"` or remove the ring",
                        r.name, r.name
                    ),
                ));
            }
            let Some(consumer) = u.consumer else {
                return Err(self.doc.invalid(
                    &span,
                    &format!("ring.{}", r.name),
                    "capacity",
                    format!(
                        "ring `{}` has no consumer; give a stage `input = \"{}\"` or remove the ring",
                        r.name, r.name
                    ),
                ));
            };
            r.producers = u.producers;
            r.consumer = consumer;
        }
        let cfg = Config {
            source: self.doc.file.to_owned(),
            eal,
            memory,
            pools,
            fabric,
            rings,
            stages,
        };
        self.pool_sizes(&cfg)?;
        Ok(cfg)
    }

    fn eal(&mut self) -> Result<Eal, ConfigError> {
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

    fn pools(&mut self) -> Result<Vec<PoolDef>, ConfigError> {
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

    fn fabric(&mut self) -> Result<Option<Fabric>, ConfigError> {
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

    fn rings(&mut self) -> Result<Vec<RingDef>, ConfigError> {
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

    /// Records a stage reading `ring`, checking the ring exists and has no other reader.
    pub(super) fn consume(
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
    pub(super) fn produce(
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

    pub(super) fn pool_ref(
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

    pub(super) fn burst(
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

    pub(super) fn addr(
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

    fn stages(
        &mut self,
        pools: &[PoolDef],
        have_fabric: bool,
    ) -> Result<Vec<StageDef>, ConfigError> {
        let raw = std::mem::take(&mut self.s.stages);
        if raw.is_empty() {
            return Err(ConfigError::Invalid {
                file: self.doc.file.to_owned(),
                line: 1,
                key: "kind".to_owned(),
                section: "stage".to_owned(),
                message: "no stages; add [stage.NAME] sections (see apps/configs/)".to_owned(),
            });
        }
        let mut out = Vec::new();
        let mut listens: HashMap<SocketAddr, String> = HashMap::new();
        let mut rds_nodes: HashMap<std::net::IpAddr, String> = HashMap::new();
        for (name, span, st) in raw {
            let section = format!("stage.{name}");
            let lc = st.lcore();
            if let Some(cpus) = &self.cpus
                && !cpus.contains(lc.get_ref())
            {
                let list = cpus
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(self.doc.invalid(
                    &lc.span(),
                    &section,
                    "lcore",
                    format!(
                        "CPU {} is not one of the lcores in [eal] cores ({list}); add it there or pick one of those",
                        lc.get_ref()
                    ),
                ));
            }
            let lcore = *lc.get_ref();
            let kind = match st {
                RawStage::Generator(g) => {
                    StageKind::Generator(self.generator(&name, &section, &span, g, pools)?)
                }
                RawStage::Forwarder(f) => {
                    let input = self.consume(&name, &f.input, "input")?;
                    let output = self.produce(&name, &f.output, "output")?;
                    if input == output {
                        return Err(self.doc.invalid(
                            &f.output.span(),
                            &section,
                            "output",
                            "a forwarder cannot write the ring it reads".to_owned(),
                        ));
                    }
                    let burst = self.burst(&section, f.burst.as_ref(), &[&input, &output])?;
                    StageKind::Forwarder(ForwarderDef {
                        input,
                        output,
                        burst,
                    })
                }
                RawStage::Fanout(f) => {
                    let input = self.consume(&name, &f.input, "input")?;
                    if f.outputs.get_ref().is_empty() {
                        return Err(self.doc.bad_value(
                            &f.outputs.span(),
                            &section,
                            "outputs",
                            "a fanout needs at least one output ring".to_owned(),
                        ));
                    }
                    let mut outputs = Vec::new();
                    for o in f.outputs.get_ref() {
                        let o = self.produce(&name, o, "outputs")?;
                        if o == input {
                            return Err(self.doc.invalid(
                                &f.outputs.span(),
                                &section,
                                "outputs",
                                "a fanout cannot write the ring it reads".to_owned(),
                            ));
                        }
                        outputs.push(o);
                    }
                    let mut all: Vec<&str> = outputs.iter().map(String::as_str).collect();
                    all.push(&input);
                    let burst = self.burst(&section, f.burst.as_ref(), &all)?;
                    StageKind::Fanout(FanoutDef {
                        input,
                        outputs,
                        burst,
                        on_full: on_full(f.on_full),
                    })
                }
                RawStage::Sink(s) => {
                    let input = self.consume(&name, &s.input, "input")?;
                    let burst = self.burst(&section, s.burst.as_ref(), &[&input])?;
                    StageKind::Sink(SinkDef {
                        input,
                        burst,
                        verify: s.verify.unwrap_or(true),
                    })
                }
                RawStage::Server(s) => {
                    if !have_fabric {
                        return Err(self.no_fabric(&span, &section));
                    }
                    let listen = self.addr(&section, "listen", &s.listen)?;
                    if let Some(other) = listens.insert(listen, name.clone()) {
                        return Err(self.doc.invalid(
                            &s.listen.span(),
                            &section,
                            "listen",
                            format!("stage `{other}` already listens on {listen}"),
                        ));
                    }
                    let mode = match s.mode.as_ref().map(|m| *m.get_ref()) {
                        Some(RawServerMode::Echo) => ServerMode::Echo,
                        Some(RawServerMode::Sink) | None => ServerMode::Sink,
                    };
                    if mode == ServerMode::Echo
                        && let Some(o) = s.output.as_ref().or(s.pool.as_ref())
                    {
                        return Err(self.doc.invalid(
                            &o.span(),
                            &section,
                            if s.output.is_some() { "output" } else { "pool" },
                            "an echo server sends everything back; `output` and `pool` apply to mode = \"sink\"".to_owned(),
                        ));
                    }
                    let output = match &s.output {
                        Some(o) => Some(self.produce(&name, o, "output")?),
                        None => None,
                    };
                    let pool = match &s.pool {
                        Some(p) if output.is_none() => {
                            return Err(self.doc.invalid(
                                &p.span(),
                                &section,
                                "pool",
                                "`pool` holds payloads forwarded to `output`; set `output` or remove `pool`".to_owned(),
                            ));
                        }
                        Some(p) => Some(self.pool_ref(pools, &section, p)?),
                        None => None,
                    };
                    let connections = match &s.connections {
                        Some(c) if *c.get_ref() == 0 => {
                            return Err(self.doc.bad_value(
                                &c.span(),
                                &section,
                                "connections",
                                "must be at least 1 (omit it to serve until stopped)".to_owned(),
                            ));
                        }
                        Some(c) => Some(*c.get_ref()),
                        None => None,
                    };
                    let rings: Vec<&str> = output.iter().map(String::as_str).collect();
                    let burst = self.burst(&section, s.burst.as_ref(), &rings)?;
                    StageKind::RsocketServer(ServerDef {
                        listen,
                        mode,
                        output,
                        pool,
                        connections,
                        verify: s.verify.unwrap_or(true),
                        burst,
                    })
                }
                RawStage::Client(c) => {
                    if !have_fabric {
                        return Err(self.no_fabric(&span, &section));
                    }
                    let input = self.consume(&name, &c.input, "input")?;
                    let connect = self.addr(&section, "connect", &c.connect)?;
                    let echo = c.echo.unwrap_or(false);
                    let output = match &c.output {
                        Some(o) if !echo => {
                            return Err(self.doc.invalid(
                                &o.span(),
                                &section,
                                "output",
                                "`output` carries echoed messages; set `echo = true` (with an echo server) or remove it".to_owned(),
                            ));
                        }
                        Some(o) => Some(self.produce(&name, o, "output")?),
                        None => None,
                    };
                    let timeout = match &c.connect_timeout_ms {
                        Some(t) if *t.get_ref() == 0 || *t.get_ref() > MAX_TIMEOUT_MS => {
                            return Err(self.doc.bad_value(
                                &t.span(),
                                &section,
                                "connect_timeout_ms",
                                format!("{} is outside 1..={MAX_TIMEOUT_MS}", t.get_ref()),
                            ));
                        }
                        Some(t) => *t.get_ref(),
                        None => DEFAULT_CONNECT_TIMEOUT_MS,
                    };
                    let mut rings: Vec<&str> = vec![&input];
                    rings.extend(output.as_deref());
                    let burst = self.burst(&section, c.burst.as_ref(), &rings)?;
                    StageKind::RsocketClient(ClientDef {
                        input,
                        connect,
                        echo,
                        output,
                        verify: c.verify.unwrap_or(true),
                        burst,
                        connect_timeout: Duration::from_millis(timeout),
                    })
                }
                RawStage::RdsSender(r) => {
                    if !have_fabric {
                        return Err(self.no_fabric(&span, &section));
                    }
                    let def = self.rds_sender(&name, &section, &r)?;
                    self.rds_node(&mut rds_nodes, &name, &section, &r.bind, def.bind)?;
                    StageKind::RdsSender(def)
                }
                RawStage::RdsReceiver(r) => {
                    if !have_fabric {
                        return Err(self.no_fabric(&span, &section));
                    }
                    let def = self.rds_receiver(&name, &section, &r, pools)?;
                    self.rds_node(&mut rds_nodes, &name, &section, &r.bind, def.bind)?;
                    StageKind::RdsReceiver(def)
                }
                RawStage::RnbdServer(r) => {
                    if !have_fabric {
                        return Err(self.no_fabric(&span, &section));
                    }
                    StageKind::RnbdServer(self.rnbd_server(&section, &r, &mut listens, &name)?)
                }
            };
            out.push(StageDef {
                name,
                line: self.doc.line(span.start),
                lcore,
                kind,
            });
        }
        Ok(out)
    }

    pub(super) fn no_fabric(&self, span: &Range<usize>, section: &str) -> ConfigError {
        self.doc.invalid(
            span,
            section,
            "kind",
            "rsocket, RDS and RNBD stages need a [fabric] section; add `[fabric]` with `provider = \"shm\"`"
                .to_owned(),
        )
    }

    fn generator(
        &mut self,
        name: &str,
        section: &str,
        header: &Range<usize>,
        g: RawGenerator,
        pools: &[PoolDef],
    ) -> Result<GeneratorDef, ConfigError> {
        let output = self.produce(name, &g.output, "output")?;
        let pool = match &g.pool {
            Some(p) => Some(self.pool_ref(pools, section, p)?),
            None => None,
        };
        let obj_size = pool
            .as_ref()
            .and_then(|p| pools.iter().find(|d| d.name == *p))
            .map(|d| d.obj_size);
        let from_size = g.sizes.is_none();
        let sizes: Vec<Spanned<u32>> = match (g.size, g.sizes) {
            (Some(_), Some(s)) => {
                return Err(self.doc.invalid(
                    &s.span(),
                    section,
                    "sizes",
                    "give either `size` or `sizes`, not both".to_owned(),
                ));
            }
            (Some(s), None) => vec![s],
            (None, Some(s)) if s.get_ref().is_empty() => {
                return Err(self.doc.bad_value(
                    &s.span(),
                    section,
                    "sizes",
                    "the list is empty; give at least one size".to_owned(),
                ));
            }
            (None, Some(s)) => s.into_inner(),
            (None, None) => vec![Spanned::new(header.clone(), 64)],
        };
        let mut out_sizes = Vec::new();
        for s in &sizes {
            let v = *s.get_ref();
            let key = if from_size { "size" } else { "sizes" };
            if !(MIN_MSG_LEN..=MAX_MSG_LEN).contains(&v) {
                return Err(self.doc.bad_value(
                    &s.span(),
                    section,
                    key,
                    format!(
                        "{v} is outside {MIN_MSG_LEN}..={MAX_MSG_LEN} bytes (a message is a \
                         {HEADER_LEN}-byte header plus payload)"
                    ),
                ));
            }
            if let Some(obj) = obj_size
                && (v as usize - HEADER_LEN) > obj
            {
                return Err(self.doc.invalid(
                    &s.span(),
                    section,
                    key,
                    format!(
                        "a {v}-byte message has {} payload bytes, more than obj_size {obj} of pool `{}`",
                        v as usize - HEADER_LEN,
                        pool.as_deref().unwrap_or("")
                    ),
                ));
            }
            out_sizes.push(v);
        }
        let pattern = match g.pattern.unwrap_or(RawPattern::Counter) {
            RawPattern::Zeros => Pattern::Zeros,
            RawPattern::Counter => Pattern::Counter,
            RawPattern::Random => Pattern::Random,
            RawPattern::Ticks => Pattern::Ticks,
        };
        let symbols = match &g.symbols {
            Some(s) if pattern != Pattern::Ticks => {
                return Err(self.doc.invalid(
                    &s.span(),
                    section,
                    "symbols",
                    "`symbols` applies to pattern = \"ticks\" only".to_owned(),
                ));
            }
            Some(s) if *s.get_ref() == 0 || *s.get_ref() > 65_535 => {
                return Err(self.doc.bad_value(
                    &s.span(),
                    section,
                    "symbols",
                    format!("{} is outside 1..=65535", s.get_ref()),
                ));
            }
            Some(s) => *s.get_ref(),
            None => DEFAULT_SYMBOLS,
        };
        let count = match &g.count {
            Some(c) if *c.get_ref() == 0 => {
                return Err(self.doc.bad_value(
                    &c.span(),
                    section,
                    "count",
                    "must be at least 1 (omit it to run until stopped)".to_owned(),
                ));
            }
            Some(c) => Some(*c.get_ref()),
            None => None,
        };
        let burst = self.burst(section, g.burst.as_ref(), &[&output])?;
        Ok(GeneratorDef {
            output,
            rate: g.rate.map(Spanned::into_inner).filter(|&r| r > 0),
            sizes: out_sizes,
            pattern,
            symbols,
            pool,
            burst,
            count,
            on_full: on_full(g.on_full),
        })
    }

    /// Pools must hold more objects than their users' caches can strand (mempool docs).
    fn pool_sizes(&self, cfg: &Config) -> Result<(), ConfigError> {
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

fn on_full(r: Option<RawOnFull>) -> OnFull {
    match r {
        Some(RawOnFull::Drop) => OnFull::Drop,
        Some(RawOnFull::Wait) | None => OnFull::Wait,
    }
}
