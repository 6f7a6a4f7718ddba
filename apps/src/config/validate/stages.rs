//! The stages: each `[stage.NAME]` on a CPU of `[eal]` cores, checked by kind and
//! converted (the RDS and RNBD kinds by `rds.rs` and `rnbd.rs`), with the rings, pools and
//! addresses it names resolved through `refs.rs`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::{Checker, MAX_TIMEOUT_MS};
use crate::config::error::ConfigError;
use crate::config::raw::{RawGenerator, RawOnFull, RawPattern, RawServerMode, RawStage};
use crate::config::types::{
    ClientDef, FanoutDef, ForwarderDef, GeneratorDef, OnFull, PoolDef, ServerDef, ServerMode,
    SinkDef, StageDef, StageKind,
};
use crate::msg::{HEADER_LEN, MAX_MSG_LEN, MIN_MSG_LEN, Pattern};

const DEFAULT_SYMBOLS: u32 = 16;
const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;

impl Checker<'_, '_> {
    pub(super) fn stages(
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
}

fn on_full(r: Option<RawOnFull>) -> OnFull {
    match r {
        Some(RawOnFull::Drop) => OnFull::Drop,
        Some(RawOnFull::Wait) | None => OnFull::Wait,
    }
}
