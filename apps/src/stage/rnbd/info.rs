//! What `dpctl rnbd-info` and `dpctl rtrs-info` show of a running `rnbd_server`: one
//! snapshot, taken on the stage's lcore, with an `rnbd` part (the layout of
//! `/sys/class/rnbd-server/ctl/devices/<dev>/sessions/<sess>/`, plus per-device IO counts) and
//! an `rtrs` part (the layout of `/sys/class/rtrs-server/<sess>/paths/<path>/`, with
//! `stats/rdma` as the kernel prints it).
//!
//! A path is named by its slot (`path<idx>`; the kernel names the directory after the
//! client's address), with `src_addr` and `dst_addr` (the server's and the client's
//! address of the path's first connection) as in the kernel's sysfs.

use dataplane::fabric::Provider;
use dataplane::rnbd::backend::Backend;
use dataplane::rnbd::rtrs::RnbdServer;
use dataplane::rnbd::wire::AccessMode;
use dataplane::rtrs::srv::{ServerState, SessId};
use dataplane::rtrs::work::PathId;
use serde_json::{Value, json};

use super::backend::AnyBackend;

/// What the snapshot says that the server does not know: the provider, the device (the
/// sysfs `hca_name`), and each export's name and access as the file gave them.
#[derive(Debug)]
pub(super) struct About {
    pub(super) provider: &'static str,
    pub(super) hca: String,
    pub(super) exports: Vec<(String, &'static str)>,
}

fn access(m: AccessMode) -> String {
    match m {
        AccessMode::Ro => "ro".to_owned(),
        AccessMode::Rw => "rw".to_owned(),
        AccessMode::Migration => "migration".to_owned(),
        AccessMode::Unknown(x) => format!("unknown({x})"),
    }
}

fn state(s: Option<ServerState>) -> &'static str {
    match s {
        Some(ServerState::Connecting) => "connecting",
        Some(ServerState::Connected) => "connected",
        Some(ServerState::Closing) => "closing",
        Some(ServerState::Closed) | None => "closed",
    }
}

fn path_name(p: PathId) -> String {
    format!("path{}", p.idx)
}

/// The session name of `sess`: the name its paths sent in their info request (the RTRS
/// session name, RNBD's `%SESSNAME%`).
fn sess_name<P: Provider>(srv: &RnbdServer<P, AnyBackend>, sess: SessId) -> String {
    srv.rtrs()
        .session_paths(sess)
        .into_iter()
        .find_map(|p| srv.rtrs().path_name(p))
        .map(|n| String::from_utf8_lossy(n.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// The snapshot: `{"rnbd": {...}, "rtrs": {...}}`.
pub(super) fn snapshot<P: Provider>(srv: &RnbdServer<P, AnyBackend>, about: &About) -> Value {
    let stage_listen: Vec<String> = srv
        .driver()
        .listen_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    json!({
        "rnbd": rnbd(srv, about, &stage_listen),
        "rtrs": rtrs(srv, about, &stage_listen),
    })
}

fn rnbd<P: Provider>(srv: &RnbdServer<P, AnyBackend>, about: &About, listen: &[String]) -> Value {
    let exports = srv.exports();
    let mut devices = Vec::new();
    for (i, (path, dev)) in exports.iter().enumerate() {
        let (name, acc) = about
            .exports
            .get(i)
            .map_or(("?", "?"), |(n, a)| (n.as_str(), *a));
        let g = dev.backend.geometry();
        devices.push(json!({
            "name": name,
            "block_dev": path.display().to_string(),
            "backend": dev.backend.kind(),
            "size_bytes": g.bytes,
            "access": acc,
            "open": dev.open_count(),
            "writers": dev.writers(),
        }));
    }
    let mut sessions = Vec::new();
    for sess in srv.rtrs().sessions() {
        let paths: Vec<Value> = srv
            .rtrs()
            .session_paths(sess)
            .into_iter()
            .map(|p| json!({ "path": path_name(p), "state": state(srv.rtrs().path_state(p)) }))
            .collect();
        let rs = srv.sessions().find(|(k, _)| *k == sess).map(|(_, s)| s);
        let mut devs: Vec<(u32, Value)> = rs
            .map(|s| {
                s.devices()
                    .iter()
                    .map(|(id, d)| {
                        let st = d.stats;
                        (
                            id,
                            json!({
                                "device_id": id,
                                "name": String::from_utf8_lossy(&d.name),
                                "mapping_path": d.path.display().to_string(),
                                "access_mode": access(d.mode),
                                "read_only": d.mode == AccessMode::Ro,
                                "reads": st.reads,
                                "read_sectors": st.read_sectors,
                                "writes": st.writes,
                                "write_sectors": st.write_sectors,
                                "flushes": st.flushes,
                                "discards": st.discards,
                            }),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        devs.sort_by_key(|(id, _)| *id);
        let counters = rs.map(|s| {
            let c = s.stats();
            json!({
                "ios": c.ios,
                "refused": c.refused,
                "malformed": c.malformed,
                "unknown_device": c.unknown_device,
            })
        });
        sessions.push(json!({
            "session": sess_name(srv, sess),
            "paths": paths,
            "devices": devs.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
            "counters": counters.unwrap_or_else(|| json!({})),
        }));
    }
    let b = srv.stats();
    json!({
        "provider": about.provider,
        "listen": listen,
        "dev_search_path": exports.search_path().as_str(),
        "devices": devices,
        "sessions": sessions,
        "counters": {
            "requests": b.requests,
            "answered_at_once": b.answered_at_once,
            "backend_done": b.backend_done,
            "bad_requests": b.bad_requests,
            "stale_answers": b.stale_answers,
            "in_flight": srv.in_flight(),
        },
    })
}

fn rtrs<P: Provider>(srv: &RnbdServer<P, AnyBackend>, about: &About, listen: &[String]) -> Value {
    let r = srv.rtrs();
    let cfg = r.config();
    let mut sessions = Vec::new();
    for sess in r.sessions() {
        let mut paths = Vec::new();
        for p in r.session_paths(sess) {
            let Some(st) = r.path_stats(p) else {
                continue;
            };
            let addrs = srv.driver().path_addrs(p);
            let mut v = json!({
                "path": path_name(p),
                "state": state(r.path_state(p)),
                "hca_name": about.hca,
                "src_addr": addrs.map(|a| a.0.to_string()),
                "dst_addr": addrs.map(|a| a.1.to_string()),
                "stats": {
                    "rdma": {
                        "read_cnt": st.rdma.read_cnt,
                        "read_bytes": st.rdma.read_bytes,
                        "write_cnt": st.rdma.write_cnt,
                        "write_bytes": st.rdma.write_bytes,
                    },
                    "rdma_sysfs": st.rdma_sysfs().to_string().trim_end(),
                    "queued_responses": st.queued_responses,
                    "hb_sent": st.hb_sent,
                    "protocol_errors": st.protocol_errors,
                    "wc_errors": st.wc_errors,
                },
            });
            if let Some(viol) = st.last_violation {
                v["stats"]["last_violation"] = json!(format!("{viol:?}"));
            }
            if let Some(e) = r.path_error(p) {
                v["error"] = json!(format!("{e:?}"));
            }
            paths.push(v);
        }
        sessions.push(json!({ "session": sess_name(srv, sess), "paths": paths }));
    }
    let s = r.stats();
    let d = srv.driver().stats();
    json!({
        "provider": about.provider,
        "hca_name": about.hca,
        "listen": listen,
        "queue_depth": cfg.queue_depth,
        "chunk_size": cfg.chunk_size,
        "max_io_size": cfg.chunk_size - cfg.max_hdr_size,
        "always_invalidate": cfg.always_invalidate,
        "sessions": sessions,
        "counters": {
            "malformed_conn_reqs": s.malformed_conn_reqs,
            "rejected": s.rejected,
            "violation_closes": s.violation_closes,
            "cm_events": d.cm_events,
            "completions": d.completions,
            "stale_cm_events": d.stale_cm_events,
        },
    })
}
