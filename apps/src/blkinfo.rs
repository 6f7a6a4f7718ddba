//! `dpctl rnbd-info` and `dpctl rtrs-info`: the answers of a running pipeline's `/rnbd` and
//! `/rtrs` telemetry commands (one entry per `rnbd_server` stage), printed as an operator
//! reads the kernel's sysfs.
//!
//! `rnbd-info` follows `/sys/class/rnbd-server/ctl/devices/<dev>/` (`block_dev`, and per
//! session `sessions/<sess>/{read_only, access_mode, mapping_path}`), as tables: the exports,
//! then each session with its paths and the devices it has open, with the IOs it submitted to
//! each (reads and writes with their 512-byte sectors, as `/sys/block/rnbdN/stat` counts them
//! on the client).
//!
//! `rtrs-info` prints `/sys/class/rtrs-server/<sess>/paths/<path>/` as `file value` lines:
//! `state`, `hca_name`, `src_addr`, `dst_addr`, and `stats/rdma` exactly as the kernel prints it
//! (`read-cnt read-bytes write-cnt write-bytes`), then the counters the kernel does not have
//! (heartbeats, protocol errors, completion errors, responses that waited for room).
//! `--reset` (`/rtrs-reset`) zeroes the paths' counters first, as `stats/reset_all`.

use std::fmt::Write as _;

use serde_json::Value;

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Left-aligned columns: every cell padded to its column's widest.
fn table(out: &mut String, indent: &str, head: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |out: &mut String, cells: &[String]| {
        let mut l = String::from(indent);
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(l, "{c:<width$}  ", width = w[i]);
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(
        out,
        &head.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>(),
    );
    for r in rows {
        line(out, r);
    }
}

/// The stages of an answer, or what is wrong with it.
fn stages(answer: &Value) -> Result<&[Value], String> {
    let Some(stages) = answer.as_array() else {
        return Err(format!("unexpected answer from the pipeline: {answer}"));
    };
    if stages.is_empty() {
        return Err(
            "the pipeline has no RNBD server (a stage of kind = \"rnbd_server\")".to_owned(),
        );
    }
    Ok(stages)
}

/// Renders the `/rnbd` answer.
///
/// # Errors
///
/// A message saying what is wrong if `answer` is not a list of stages, or is empty (a
/// pipeline without an `rnbd_server`).
pub fn render_rnbd(answer: &Value) -> Result<String, String> {
    let mut out = String::new();
    for st in stages(answer)? {
        if let Some(e) = st.get("error") {
            let _ = writeln!(out, "rnbd_server {}: {}", s(&st["stage"]), s(e));
            continue;
        }
        let listen: Vec<String> = list(st, "listen").iter().map(s).collect();
        let _ = writeln!(
            out,
            "rnbd_server {} over {}, listening on {}, dev_search_path {}",
            s(&st["stage"]),
            s(&st["provider"]),
            listen.join(", "),
            s(&st["dev_search_path"])
        );
        let _ = writeln!(out, "\nDevices:");
        let rows: Vec<Vec<String>> = list(st, "devices")
            .iter()
            .map(|d| {
                [
                    "name",
                    "block_dev",
                    "backend",
                    "size_bytes",
                    "access",
                    "open",
                    "writers",
                ]
                .iter()
                .map(|k| s(&d[*k]))
                .collect()
            })
            .collect();
        table(
            &mut out,
            "  ",
            &[
                "Name", "BlockDev", "Backend", "Bytes", "Access", "Opens", "Writers",
            ],
            &rows,
        );
        let sessions = list(st, "sessions");
        let _ = writeln!(out, "\nSessions: {}", sessions.len());
        for se in sessions {
            let paths: Vec<String> = list(se, "paths")
                .iter()
                .map(|p| format!("{} ({})", s(&p["path"]), s(&p["state"])))
                .collect();
            let _ = writeln!(
                out,
                "  session {}: paths {}",
                s(&se["session"]),
                paths.join(", ")
            );
            let rows: Vec<Vec<String>> = list(se, "devices")
                .iter()
                .map(|d| {
                    let mut r: Vec<String> = ["device_id", "name", "mapping_path", "access_mode"]
                        .iter()
                        .map(|k| s(&d[*k]))
                        .collect();
                    r.push(if d["read_only"] == Value::Bool(true) {
                        "1".to_owned()
                    } else {
                        "0".to_owned()
                    });
                    for k in ["reads", "read_sectors", "writes", "write_sectors"] {
                        r.push(s(&d[k]));
                    }
                    r
                })
                .collect();
            if rows.is_empty() {
                let _ = writeln!(out, "    no devices open");
            } else {
                table(
                    &mut out,
                    "    ",
                    &[
                        "Id",
                        "Name",
                        "MappingPath",
                        "AccessMode",
                        "ReadOnly",
                        "Reads",
                        "ReadSectors",
                        "Writes",
                        "WriteSectors",
                    ],
                    &rows,
                );
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// Renders the `/rtrs` answer.
///
/// # Errors
///
/// As [`render_rnbd`].
pub fn render_rtrs(answer: &Value) -> Result<String, String> {
    let mut out = String::new();
    for st in stages(answer)? {
        if let Some(e) = st.get("error") {
            let _ = writeln!(out, "rtrs-server {}: {}", s(&st["stage"]), s(e));
            continue;
        }
        let listen: Vec<String> = list(st, "listen").iter().map(s).collect();
        let _ = writeln!(
            out,
            "rtrs-server {} over {} ({}), listening on {}: queue_depth {}, chunk_size {}, \
             max_io_size {}, always_invalidate {}",
            s(&st["stage"]),
            s(&st["provider"]),
            s(&st["hca_name"]),
            listen.join(", "),
            s(&st["queue_depth"]),
            s(&st["chunk_size"]),
            s(&st["max_io_size"]),
            s(&st["always_invalidate"]),
        );
        let mut rows = Vec::new();
        for se in list(st, "sessions") {
            let sess = s(&se["session"]);
            for p in list(se, "paths") {
                let dir = format!("{sess}/paths/{}", s(&p["path"]));
                let stats = &p["stats"];
                let mut add = |file: &str, v: String| rows.push(vec![format!("{dir}/{file}"), v]);
                add("state", s(&p["state"]));
                add("hca_name", s(&p["hca_name"]));
                add("src_addr", s(&p["src_addr"]));
                add("dst_addr", s(&p["dst_addr"]));
                add("stats/rdma", s(&stats["rdma_sysfs"]));
                for k in [
                    "hb_sent",
                    "queued_responses",
                    "protocol_errors",
                    "wc_errors",
                ] {
                    add(&format!("stats/{k}"), s(&stats[k]));
                }
                if let Some(v) = stats.get("last_violation") {
                    add("stats/last_violation", s(v));
                }
                if let Some(e) = p.get("error") {
                    add("error", s(e));
                }
            }
        }
        if rows.is_empty() {
            let _ = writeln!(out, "  no sessions");
        } else {
            table(&mut out, "  ", &["File", "Value"], &rows);
        }
        let c = &st["counters"];
        let _ = writeln!(
            out,
            "  server: {} connect requests rejected ({} malformed), {} paths closed for a \
             protocol violation",
            s(&c["rejected"]),
            s(&c["malformed_conn_reqs"]),
            s(&c["violation_closes"])
        );
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rtrs_prints_stats_rdma_as_the_kernel() {
        let a = json!([{
            "stage": "blk", "provider": "shm", "hca_name": "shm0", "listen": ["10.0.0.1:1234"],
            "queue_depth": 128, "chunk_size": 262144, "max_io_size": 258048,
            "always_invalidate": false,
            "sessions": [{ "session": "c1", "paths": [{
                "path": "path0", "state": "connected", "hca_name": "shm0",
                "src_addr": "10.0.0.1:1234", "dst_addr": "10.0.0.2:40000",
                "stats": { "rdma_sysfs": "3 12288 2 8256", "hb_sent": 0, "queued_responses": 0,
                           "protocol_errors": 0, "wc_errors": 0 }
            }]}],
            "counters": { "rejected": 0, "malformed_conn_reqs": 0, "violation_closes": 0 }
        }]);
        let t = render_rtrs(&a).unwrap();
        let has = |want: &[&str]| {
            t.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == want)
        };
        assert!(
            has(&["c1/paths/path0/stats/rdma", "3", "12288", "2", "8256"]),
            "{t}"
        );
        assert!(has(&["c1/paths/path0/state", "connected"]), "{t}");
        assert!(has(&["c1/paths/path0/hca_name", "shm0"]), "{t}");
        assert!(has(&["c1/paths/path0/dst_addr", "10.0.0.2:40000"]), "{t}");
        assert!(
            render_rtrs(&json!([]))
                .unwrap_err()
                .contains("no RNBD server")
        );
        assert!(render_rnbd(&json!({})).unwrap_err().contains("unexpected"));
    }
}
