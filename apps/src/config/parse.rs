//! From text to a validated [`Config`]: parse the document with spans, deserialize each
//! section on its own (so every error knows its section), then check that the pieces fit.
//!
//! Stage sections are dispatched on their `kind` key by hand rather than with an internally
//! tagged serde enum: serde buffers tagged content and loses the spans, and with them the line
//! of the offending key.

use std::path::Path;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::doc::Doc;
use super::error::ConfigError;
use super::raw::{RawMemory, RawStage, Sections};
use super::types::Config;
use super::validate::Checker;

const STAGE_KINDS: &str = "generator, forwarder, fanout, sink, rsocket_server, rsocket_client, \
                           rds_sender, rds_receiver, rnbd_server";

impl Config {
    /// Reads and validates a file.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: unreadable file, TOML syntax, unknown sections or keys, bad values,
    /// inconsistent connections; each names the file and line.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Validates `text`, naming it `source` in errors.
    ///
    /// # Errors
    ///
    /// As for [`Config::from_file`], without the read error.
    pub fn parse(text: &str, source: &str) -> Result<Self, ConfigError> {
        from_text(text, source)
    }
}

fn from_text(text: &str, file: &str) -> Result<Config, ConfigError> {
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
    Checker::new(&doc, s).check()
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
        "rds_sender" => RawStage::RdsSender(doc.section(&section, rest)?),
        "rds_receiver" => RawStage::RdsReceiver(doc.section(&section, rest)?),
        "rnbd_server" => RawStage::RnbdServer(doc.section(&section, rest)?),
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
