//! From text to a validated [`Config`]: parse the document with spans, deserialize each
//! section on its own (so every error knows its section), then check that the pieces fit.
//!
//! Stage sections are dispatched on their `kind` key by hand rather than with an internally
//! tagged serde enum: serde buffers tagged content and loses the spans, and with them the line
//! of the offending key.

use std::ops::Range;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::raw::{
    RawClient, RawEal, RawFabric, RawFanout, RawForwarder, RawGenerator, RawMemory, RawPool,
    RawRing, RawServer, RawSink,
};
use super::{Config, ConfigError};

const STAGE_KINDS: &str = "generator, forwarder, fanout, sink, rsocket_server, rsocket_client";

/// The text being parsed, for turning spans into lines.
pub(super) struct Doc<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
}

/// A named sub-section (`[pool.NAME]`): its name, header span and value.
type Named<'i> = (String, Range<usize>, Spanned<DeValue<'i>>);

impl<'a> Doc<'a> {
    pub(super) fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    pub(super) fn invalid(
        &self,
        span: &Range<usize>,
        section: &str,
        key: &str,
        message: String,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            line: self.line(span.start),
            key: key.to_owned(),
            section: section.to_owned(),
            message,
        }
    }

    pub(super) fn bad_value(
        &self,
        span: &Range<usize>,
        section: &str,
        key: &str,
        message: String,
    ) -> ConfigError {
        ConfigError::BadValue {
            file: self.file.to_owned(),
            line: self.line(span.start),
            key: key.to_owned(),
            section: section.to_owned(),
            message,
        }
    }

    /// Deserializes one section, turning serde's errors into located ones.
    fn section<T: DeserializeOwned>(
        &self,
        section: &str,
        value: Spanned<DeValue<'a>>,
    ) -> Result<T, ConfigError> {
        let span = value.span();
        let keys: Vec<(String, Range<usize>)> = match value.get_ref() {
            DeValue::Table(t) => t
                .iter()
                .map(|(k, v)| (k.get_ref().to_string(), k.span().start..v.span().end))
                .collect(),
            other => {
                return Err(self.bad_value(
                    &span,
                    "top level",
                    section,
                    format!("expected a [{section}] table, found a {}", other.type_str()),
                ));
            }
        };
        T::deserialize(ValueDeserializer::from(value)).map_err(|e| {
            let msg = e.message();
            let at = e.span().unwrap_or_else(|| span.clone());
            if let Some(rest) = msg.strip_prefix("unknown field `") {
                let key = rest.split('`').next().unwrap_or(rest).to_owned();
                let expected = msg
                    .split_once(", expected ")
                    .map_or_else(|| "no keys here".to_owned(), |(_, x)| x.to_owned());
                ConfigError::UnknownKey {
                    file: self.file.to_owned(),
                    line: self.line(at.start),
                    key,
                    section: section.to_owned(),
                    expected,
                }
            } else if let Some(rest) = msg.strip_prefix("missing field `") {
                ConfigError::MissingKey {
                    file: self.file.to_owned(),
                    line: self.line(span.start),
                    key: rest.split('`').next().unwrap_or(rest).to_owned(),
                    section: section.to_owned(),
                }
            } else {
                let key = keys
                    .iter()
                    .find(|(_, r)| r.start <= at.start && at.start < r.end)
                    .map_or("?", |(k, _)| k.as_str());
                self.bad_value(&at, section, key, msg.to_owned())
            }
        })
    }

    /// The `[kind.NAME]` sub-sections of a table such as `pool`.
    fn named(
        &self,
        kind: &str,
        value: Spanned<DeValue<'a>>,
    ) -> Result<Vec<Named<'a>>, ConfigError> {
        let span = value.span();
        let DeValue::Table(t) = value.into_inner() else {
            return Err(self.bad_value(
                &span,
                "top level",
                kind,
                format!("expected [{kind}.NAME] sections"),
            ));
        };
        let mut out = Vec::new();
        for (k, v) in t {
            let name = k.get_ref().to_string();
            let kspan = k.span();
            if !v.get_ref().is_table() {
                return Err(self.bad_value(
                    &kspan,
                    kind,
                    &name,
                    format!(
                        "expected a [{kind}.{name}] table, found a {}",
                        v.get_ref().type_str()
                    ),
                ));
            }
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(self.invalid(
                    &kspan,
                    kind,
                    &name,
                    format!("`{name}` is not a valid name; use letters, digits, `_` and `-`"),
                ));
            }
            let header = v.span();
            out.push((name, header, v));
        }
        out.sort_by_key(|(_, s, _)| s.start);
        Ok(out)
    }
}

/// Parsed sections before cross-checks.
pub(super) struct Sections {
    pub(super) eal: Option<(RawEal, Range<usize>)>,
    pub(super) memory: RawMemory,
    pub(super) fabric: Option<(RawFabric, Range<usize>)>,
    pub(super) pools: Vec<(String, Range<usize>, RawPool)>,
    pub(super) rings: Vec<(String, Range<usize>, RawRing)>,
    pub(super) stages: Vec<(String, Range<usize>, RawStage)>,
}

pub(super) enum RawStage {
    Generator(RawGenerator),
    Forwarder(RawForwarder),
    Fanout(RawFanout),
    Sink(RawSink),
    Server(RawServer),
    Client(RawClient),
}

impl RawStage {
    pub(super) fn lcore(&self) -> &Spanned<usize> {
        match self {
            Self::Generator(s) => &s.lcore,
            Self::Forwarder(s) => &s.lcore,
            Self::Fanout(s) => &s.lcore,
            Self::Sink(s) => &s.lcore,
            Self::Server(s) => &s.lcore,
            Self::Client(s) => &s.lcore,
        }
    }
}

pub(super) fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
    let doc = Doc { text, file };
    let root = DeTable::parse(text).map_err(|e| ConfigError::Syntax {
        file: file.to_owned(),
        line: doc.line(e.span().map_or(0, |s| s.start)),
        message: e.message().trim().to_owned(),
    })?;
    let mut entries: Vec<_> = root.into_inner().into_iter().collect();
    entries.sort_by_key(|(k, _)| k.span().start);
    let mut s = Sections {
        eal: None,
        memory: RawMemory::default(),
        fabric: None,
        pools: Vec::new(),
        rings: Vec::new(),
        stages: Vec::new(),
    };
    for (k, v) in entries {
        let span = v.span();
        match k.get_ref().as_ref() {
            "eal" => s.eal = Some((doc.section("eal", v)?, span)),
            "memory" => s.memory = doc.section("memory", v)?,
            "fabric" => s.fabric = Some((doc.section("fabric", v)?, span)),
            "pool" => {
                for (name, header, v) in doc.named("pool", v)? {
                    let p = doc.section(&format!("pool.{name}"), v)?;
                    s.pools.push((name, header, p));
                }
            }
            "ring" => {
                for (name, header, v) in doc.named("ring", v)? {
                    let r = doc.section(&format!("ring.{name}"), v)?;
                    s.rings.push((name, header, r));
                }
            }
            "stage" => {
                for (name, header, v) in doc.named("stage", v)? {
                    let st = stage(&doc, &name, v)?;
                    s.stages.push((name, header, st));
                }
            }
            other => {
                return Err(ConfigError::UnknownSection {
                    file: file.to_owned(),
                    line: doc.line(k.span().start),
                    section: other.to_owned(),
                });
            }
        }
    }
    super::validate::Checker::new(&doc, s).check()
}

/// Deserializes a `[stage.NAME]` table by its `kind`.
fn stage<'a>(doc: &Doc<'a>, name: &str, v: Spanned<DeValue<'a>>) -> Result<RawStage, ConfigError> {
    let section = format!("stage.{name}");
    let span = v.span();
    let DeValue::Table(mut t) = v.into_inner() else {
        unreachable!("Doc::named only returns tables")
    };
    let Some(kind) = t.remove("kind") else {
        return Err(ConfigError::MissingKey {
            file: doc.file.to_owned(),
            line: doc.line(span.start),
            key: "kind".to_owned(),
            section,
        });
    };
    let kspan = kind.span();
    let Some(kind) = kind.get_ref().as_str().map(str::to_owned) else {
        return Err(doc.bad_value(
            &kspan,
            &section,
            "kind",
            format!("expected a string, one of {STAGE_KINDS}"),
        ));
    };
    let rest = Spanned::new(span, DeValue::Table(t));
    Ok(match kind.as_str() {
        "generator" => RawStage::Generator(doc.section(&section, rest)?),
        "forwarder" => RawStage::Forwarder(doc.section(&section, rest)?),
        "fanout" => RawStage::Fanout(doc.section(&section, rest)?),
        "sink" => RawStage::Sink(doc.section(&section, rest)?),
        "rsocket_server" => RawStage::Server(doc.section(&section, rest)?),
        "rsocket_client" => RawStage::Client(doc.section(&section, rest)?),
        other => {
            return Err(doc.bad_value(
                &kspan,
                &section,
                "kind",
                format!("unknown stage kind `{other}`; expected one of {STAGE_KINDS}"),
            ));
        }
    })
}
