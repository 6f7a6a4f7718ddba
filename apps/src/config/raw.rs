//! The file format as serde sees it: one struct per section, unknown keys denied. Values
//! that later checks refer to are [`Spanned`] so those checks can name their line.
//! [`super::parse`] turns these into the validated types of [`super`]; [`Sections`] holds a
//! whole file in this form, before the cross-section checks.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

/// `[eal]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEal {
    pub cores: Spanned<String>,
    pub main: Option<Spanned<usize>>,
    #[serde(default)]
    pub mode: RawMode,
    pub spin_us: Option<u64>,
    pub sleep_us: Option<u64>,
    pub drain_timeout_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawMode {
    Busy,
    #[default]
    Hybrid,
}

/// `[memory]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMemory {
    #[serde(default)]
    pub hugepages: RawHuge,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawHuge {
    #[default]
    Auto,
    Never,
    Require,
}

/// `[pool.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub obj_size: Spanned<usize>,
    pub count: Spanned<u32>,
    pub cache: Option<u32>,
}

/// `[fabric]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFabric {
    pub provider: Spanned<RawProvider>,
    pub dir: Option<String>,
    pub bounce_bytes: Option<Spanned<u32>>,
    pub device: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawProvider {
    Shm,
    Verbs,
}

/// `[ring.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRing {
    pub capacity: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawOnFull {
    Wait,
    Drop,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawPattern {
    Zeros,
    Counter,
    Random,
    Ticks,
}

/// `kind = "generator"` (the `kind` key is taken out before deserializing).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGenerator {
    pub lcore: Spanned<usize>,
    pub output: Spanned<String>,
    pub rate: Option<Spanned<u64>>,
    pub size: Option<Spanned<u32>>,
    pub sizes: Option<Spanned<Vec<Spanned<u32>>>>,
    pub pattern: Option<RawPattern>,
    pub symbols: Option<Spanned<u32>>,
    pub pool: Option<Spanned<String>>,
    pub burst: Option<Spanned<usize>>,
    pub count: Option<Spanned<u64>>,
    pub on_full: Option<RawOnFull>,
}

/// `kind = "forwarder"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawForwarder {
    pub lcore: Spanned<usize>,
    pub input: Spanned<String>,
    pub output: Spanned<String>,
    pub burst: Option<Spanned<usize>>,
}

/// `kind = "fanout"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFanout {
    pub lcore: Spanned<usize>,
    pub input: Spanned<String>,
    pub outputs: Spanned<Vec<Spanned<String>>>,
    pub burst: Option<Spanned<usize>>,
    pub on_full: Option<RawOnFull>,
}

/// `kind = "sink"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSink {
    pub lcore: Spanned<usize>,
    pub input: Spanned<String>,
    pub burst: Option<Spanned<usize>>,
    pub verify: Option<bool>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawServerMode {
    Echo,
    Sink,
}

/// `kind = "rsocket_server"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub lcore: Spanned<usize>,
    pub listen: Spanned<String>,
    pub mode: Option<Spanned<RawServerMode>>,
    pub output: Option<Spanned<String>>,
    pub pool: Option<Spanned<String>>,
    pub connections: Option<Spanned<u32>>,
    pub verify: Option<bool>,
    pub burst: Option<Spanned<usize>>,
}

/// `kind = "rsocket_client"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    pub lcore: Spanned<usize>,
    pub input: Spanned<String>,
    pub connect: Spanned<String>,
    pub echo: Option<bool>,
    pub output: Option<Spanned<String>>,
    pub verify: Option<bool>,
    pub burst: Option<Spanned<usize>>,
    pub connect_timeout_ms: Option<Spanned<u64>>,
}

/// `kind = "rds_sender"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRdsSender {
    pub lcore: Spanned<usize>,
    pub input: Spanned<String>,
    pub bind: Spanned<String>,
    pub dest: Spanned<String>,
    pub burst: Option<Spanned<usize>>,
    pub sndbuf: Option<Spanned<u32>>,
}

/// `kind = "rds_receiver"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRdsReceiver {
    pub lcore: Spanned<usize>,
    pub bind: Spanned<String>,
    pub output: Spanned<String>,
    pub pool: Option<Spanned<String>>,
    pub senders: Option<Spanned<u32>>,
    pub verify: Option<bool>,
    pub burst: Option<Spanned<usize>>,
    pub rcvbuf: Option<Spanned<u32>>,
}

/// `kind = "rnbd_server"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRnbdServer {
    pub lcore: Spanned<usize>,
    pub listen: Spanned<String>,
    pub paths: Option<Spanned<u16>>,
    pub dev_search_path: Option<Spanned<String>>,
    pub queue_depth: Option<Spanned<u16>>,
    pub max_io: Option<Spanned<RawSize>>,
    pub always_invalidate: Option<bool>,
    #[serde(default)]
    pub export: Vec<RawExport>,
}

/// `[[stage.NAME.export]]`: one device of an `rnbd_server`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExport {
    pub name: Spanned<String>,
    pub backend: Spanned<RawBackend>,
    pub path: Option<Spanned<String>>,
    pub size: Option<Spanned<RawSize>>,
    pub access: Option<Spanned<RawAccess>>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawBackend {
    Null,
    Mem,
    File,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawAccess {
    Ro,
    Rw,
    Migration,
}

/// A size: bytes as an integer, or a string with a binary suffix (`"64m"`, `"1g"`,
/// `"128k"`, `"4096"`). `Err` holds what was wrong, reported with the key's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RawSize(pub Result<u64, String>);

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawSize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size: bytes, or a string such as \"64m\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawSize, E> {
                Ok(RawSize(
                    u64::try_from(v).map_err(|_| format!("{v} is negative")),
                ))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawSize, E> {
                Ok(RawSize(Ok(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize(parse_size(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `"64m"` and the like: a number with an optional `k`, `m`, `g` or `t` (powers of 1024,
/// an `i`/`ib`/`b` after it allowed: `64MiB`).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        Some('t') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let bad = || {
        format!("`{s}` is not a size; write bytes (4096) or a number with k, m, g or t (\"64m\")")
    };
    let n: u64 = num.trim().replace('_', "").parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
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
    RdsSender(RawRdsSender),
    RdsReceiver(RawRdsReceiver),
    RnbdServer(RawRnbdServer),
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
            Self::RdsSender(s) => &s.lcore,
            Self::RdsReceiver(s) => &s.lcore,
            Self::RnbdServer(s) => &s.lcore,
        }
    }
}
