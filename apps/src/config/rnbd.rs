//! The checks of the RNBD server stage, `rnbd_server`: methods of the same [`Checker`] as
//! every other stage, kept here so `validate.rs` stays readable.
//!
//! An `rnbd_server` exports devices as Linux's `rnbd-server` does: a client opens a device
//! by a name that the server resolves under its `dev_search_path` (names holding `..` are
//! refused, duplicate slashes squeezed), and each export says the most a client may open it
//! for (`ro`, `rw`, `migration`). The RTRS parameters must fit RTRS's 28-bit immediate; the
//! checker asks RTRS itself ([`ServerConfig::validate`]), so the rule is not written twice.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use dataplane::rnbd::export::{PATH_MAX, SearchPath};
use dataplane::rtrs::srv::ServerConfig;
use dataplane::rtrs::wire::{DEFAULT_MAX_HDR_SIZE, MIN_CHUNK_SIZE};
use toml::Spanned;

use super::error::ConfigError;
use super::raw::{RawAccess, RawBackend, RawExport, RawRnbdServer, RawSize};
use super::types::{ExportAccess, ExportBackend, ExportDef, RnbdServerDef};
use super::validate::Checker;

/// Default RTRS queue depth of an `rnbd_server` (IOs in flight per session).
const DEFAULT_QUEUE_DEPTH: u16 = 128;
/// Default largest IO (the kernel client's default `max_hw_sectors` is 128 KiB's worth).
const DEFAULT_MAX_IO: u64 = 128 << 10;
/// Most paths per session (the kernel client takes up to 6 `path=`; RTRS allows more).
const MAX_PATHS: u16 = 16;
/// Largest null or memory device (a memory device must also fit in RAM when it is made).
const MAX_DEV_SIZE: u64 = 1 << 50;

/// The RTRS chunk for IOs of up to `max_io` bytes: data plus header room, a power of two
/// of at least RTRS's minimum.
pub(crate) fn chunk_size(max_io: u32) -> u32 {
    (max_io + DEFAULT_MAX_HDR_SIZE)
        .next_power_of_two()
        .max(MIN_CHUNK_SIZE)
}

impl Checker<'_, '_> {
    pub(super) fn rnbd_server(
        &mut self,
        section: &str,
        r: &RawRnbdServer,
        listens: &mut HashMap<SocketAddr, String>,
        name: &str,
    ) -> Result<RnbdServerDef, ConfigError> {
        let first = self.addr(section, "listen", &r.listen)?;
        if first.port() == 0 {
            return Err(self.doc.bad_value(
                &r.listen.span(),
                section,
                "listen",
                "clients name the server's port (the kernel's `dest_port=`, dp-perf's \
                 `--client ADDR:PORT`): give a fixed one, for example \"10.0.0.1:1234\""
                    .to_owned(),
            ));
        }
        let paths = match &r.paths {
            Some(p) if !(1..=MAX_PATHS).contains(p.get_ref()) => {
                return Err(self.doc.bad_value(
                    &p.span(),
                    section,
                    "paths",
                    format!("{} is outside 1..={MAX_PATHS}", p.get_ref()),
                ));
            }
            Some(p) => *p.get_ref(),
            None => 1,
        };
        let mut listen = Vec::new();
        for k in 0..paths {
            let Some(port) = first.port().checked_add(k) else {
                return Err(self.doc.invalid(
                    &r.listen.span(),
                    section,
                    "listen",
                    format!(
                        "{paths} paths from port {} run past port 65535",
                        first.port()
                    ),
                ));
            };
            let a = SocketAddr::new(first.ip(), port);
            if let Some(other) = listens.insert(a, name.to_owned()) {
                return Err(self.doc.invalid(
                    &r.listen.span(),
                    section,
                    "listen",
                    format!(
                        "stage `{other}` already listens on {a} (path {} of this server listens \
                         on port {port}: each path takes the next port)",
                        k + 1
                    ),
                ));
            }
            listen.push(a);
        }
        let search = self.search_path(section, r.dev_search_path.as_ref())?;
        let queue_depth = match &r.queue_depth {
            Some(q) => *q.get_ref(),
            None => DEFAULT_QUEUE_DEPTH,
        };
        let max_io = match &r.max_io {
            Some(m) => {
                let v = self.size(section, "max_io", m)?;
                if !(4096..=1 << 20).contains(&v) || !v.is_multiple_of(4096) {
                    return Err(self.doc.bad_value(
                        &m.span(),
                        section,
                        "max_io",
                        format!("{v} is not a multiple of 4096 in 4096..=1048576 (1m)"),
                    ));
                }
                v as u32
            }
            None => DEFAULT_MAX_IO as u32,
        };
        let always_invalidate = r.always_invalidate.unwrap_or(false);
        let rtrs = ServerConfig {
            queue_depth,
            chunk_size: chunk_size(max_io),
            always_invalidate,
            ..ServerConfig::default()
        };
        if let Err(e) = rtrs.validate() {
            let (span, key) = match &r.queue_depth {
                Some(q) => (q.span(), "queue_depth"),
                None => (r.listen.span(), "max_io"),
            };
            return Err(self.doc.invalid(
                &span,
                section,
                key,
                format!(
                    "RTRS refuses queue_depth {queue_depth} with {} KiB chunks (max_io {max_io}): \
                     {e}; lower queue_depth or max_io",
                    rtrs.chunk_size >> 10
                ),
            ));
        }
        if r.export.is_empty() {
            return Err(self.doc.invalid(
                &r.listen.span(),
                section,
                "export",
                format!(
                    "an rnbd_server needs at least one device: add\n\n    \
                     [[{section}.export]]\n    name = \"mem0\"\n    backend = \"mem\"\n    \
                     size = \"64m\"\n"
                ),
            ));
        }
        let mut exports: Vec<ExportDef> = Vec::new();
        for e in &r.export {
            let def = self.export(section, &search, e)?;
            if let Some(other) = exports.iter().find(|o| o.path == def.path) {
                return Err(self.doc.invalid(
                    &e.name.span(),
                    section,
                    "name",
                    format!(
                        "`{}` resolves to {}, which export `{}` (line {}) already is; give each \
                         export its own name",
                        def.name,
                        def.path.display(),
                        other.name,
                        other.line
                    ),
                ));
            }
            exports.push(def);
        }
        Ok(RnbdServerDef {
            listen,
            dev_search_path: search.as_str().to_owned(),
            queue_depth,
            max_io,
            always_invalidate,
            exports,
        })
    }

    fn search_path(
        &self,
        section: &str,
        raw: Option<&Spanned<String>>,
    ) -> Result<SearchPath, ConfigError> {
        let Some(raw) = raw else {
            return Ok(SearchPath::default());
        };
        let p = raw.get_ref();
        let bad = |why: &str| {
            self.doc
                .bad_value(&raw.span(), section, "dev_search_path", why.to_owned())
        };
        if !p.starts_with('/') {
            return Err(bad(
                "must be an absolute path (the kernel's default is \"/\"), for example \"/srv/rnbd\"",
            ));
        }
        if p.contains("..") {
            return Err(bad(
                "must not hold `..`: the search path bounds what clients can name",
            ));
        }
        if p.contains("%SESSNAME%") {
            return Err(bad(
                "`%SESSNAME%` (a namespace per client session) is not supported by dpctl's \
                 exports, which are fixed in the file; use a fixed directory",
            ));
        }
        SearchPath::new(p.as_str())
            .map_err(|_| bad(&format!("is {} bytes, PATH_MAX is {PATH_MAX}", p.len())))
    }

    fn export(
        &self,
        section: &str,
        search: &SearchPath,
        e: &RawExport,
    ) -> Result<ExportDef, ConfigError> {
        let name = e.name.get_ref();
        // The kernel's rules: the same resolver the server runs at OPEN time, so a name
        // accepted here is one a client can open.
        let path = search.resolve("", name.as_bytes()).map_err(|err| {
            self.doc.bad_value(
                &e.name.span(),
                section,
                "name",
                format!(
                    "`{name}`: {err}; give the device name clients open, relative to \
                     dev_search_path `{}`",
                    search.as_str()
                ),
            )
        })?;
        let size = match &e.size {
            Some(s) => Some((self.size(section, "size", s)?, s.span())),
            None => None,
        };
        let backend = match e.backend.get_ref() {
            RawBackend::Null | RawBackend::Mem => {
                if let Some(p) = &e.path {
                    return Err(self.doc.invalid(
                        &p.span(),
                        section,
                        "path",
                        "`path` applies to backend = \"file\"; null and mem devices live in \
                         memory and need a `size`"
                            .to_owned(),
                    ));
                }
                let Some((size, span)) = size else {
                    return Err(self.doc.invalid(
                        &e.backend.span(),
                        section,
                        "size",
                        format!(
                            "export `{name}`: a {} device needs a `size`, for example size = \"64m\"",
                            if *e.backend.get_ref() == RawBackend::Null {
                                "null"
                            } else {
                                "mem"
                            }
                        ),
                    ));
                };
                if size == 0 || !size.is_multiple_of(4096) || size > MAX_DEV_SIZE {
                    return Err(self.doc.bad_value(
                        &span,
                        section,
                        "size",
                        format!(
                            "{size} is not a positive multiple of 4096 bytes up to 1p \
                             (devices have 512-byte sectors and 4 KiB physical blocks)"
                        ),
                    ));
                }
                if *e.backend.get_ref() == RawBackend::Null {
                    ExportBackend::Null { size }
                } else {
                    ExportBackend::Mem { size }
                }
            }
            RawBackend::File => {
                let Some(p) = &e.path else {
                    return Err(self.doc.invalid(
                        &e.backend.span(),
                        section,
                        "path",
                        format!(
                            "export `{name}`: backend = \"file\" needs `path`, the file or block \
                             device to serve"
                        ),
                    ));
                };
                if let Some((_, span)) = size {
                    return Err(self.doc.invalid(
                        &span,
                        section,
                        "size",
                        "a file device is as large as its file or block device; remove `size` \
                         (truncate the file to resize it)"
                            .to_owned(),
                    ));
                }
                if p.get_ref().is_empty() {
                    return Err(self.doc.bad_value(
                        &p.span(),
                        section,
                        "path",
                        "the path is empty".to_owned(),
                    ));
                }
                ExportBackend::File {
                    path: PathBuf::from(p.get_ref()),
                }
            }
        };
        let access = match e.access.as_ref().map(|a| *a.get_ref()) {
            Some(RawAccess::Ro) => ExportAccess::Ro,
            Some(RawAccess::Rw) | None => ExportAccess::Rw,
            Some(RawAccess::Migration) => ExportAccess::Migration,
        };
        Ok(ExportDef {
            name: name.clone(),
            path,
            backend,
            access,
            line: self.doc.line(e.name.span().start),
        })
    }

    fn size(&self, section: &str, key: &str, s: &Spanned<RawSize>) -> Result<u64, ConfigError> {
        s.get_ref()
            .0
            .clone()
            .map_err(|m| self.doc.bad_value(&s.span(), section, key, m))
    }
}
