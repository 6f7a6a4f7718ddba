//! `dpctl rds-info`: the answer of a running pipeline's `/rds` telemetry command, printed
//! with the sections and columns of Linux `rds-info` (rds-tools).
//!
//! | option | section | rds-info |
//! |---|---|---|
//! | `-n` | connections: LocalAddr RemoteAddr NextTX NextRX Flg (`s`ending, `c`onnecting, `C`onnected) | `-n` |
//! | `-k` | sockets: BoundAddr BPort ConnAddr CPort SndBuf RcvBuf, plus unacked and unread bytes | `-k` |
//! | `-c` | counters: CounterName Value (the engine's, with the kernel's names, then the transport's) | `-c` |
//! | `-g` | congestion maps: each address's congested ports (local: ours; remote: what the peer sent) | (none) |
//!
//! No option prints every section. Each RDS stage is a node of its own, so each has its
//! sections, headed by the stage's name and the node's addresses.

use std::fmt::Write as _;

use serde_json::Value;

/// Which sections to print.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sections {
    /// `-n`.
    pub connections: bool,
    /// `-k`.
    pub sockets: bool,
    /// `-c`.
    pub counters: bool,
    /// `-g`.
    pub congestion: bool,
}

impl Sections {
    /// Every section when none was chosen.
    pub fn or_all(self) -> Self {
        if self == Self::default() {
            Self {
                connections: true,
                sockets: true,
                counters: true,
                congestion: true,
            }
        } else {
            self
        }
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "0.0.0.0".to_owned(),
        other => other.to_string(),
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Renders the `/rds` answer (a list, one entry per RDS stage) as text.
///
/// # Errors
///
/// A message saying what is wrong if `answer` is not a list of stages (a pipeline without
/// RDS stages answers with an empty list, which is also reported).
pub fn render(answer: &Value, sections: Sections) -> Result<String, String> {
    let Some(stages) = answer.as_array() else {
        return Err(format!("unexpected answer from the pipeline: {answer}"));
    };
    if stages.is_empty() {
        return Err(
            "the pipeline has no RDS stages (kind = \"rds_sender\" or \"rds_receiver\")".to_owned(),
        );
    }
    let sec = sections.or_all();
    let mut o = String::new();
    for st in stages {
        let name = st.get("stage").map_or_else(String::new, s);
        if let Some(e) = st.get("error") {
            let _ = writeln!(o, "== stage {name}: {}\n", s(e));
            continue;
        }
        let addrs: Vec<String> = list(st, "local_addrs").iter().map(s).collect();
        let role = st.get("role").map_or_else(String::new, s);
        let _ = writeln!(
            o,
            "== stage {name} (RDS {role}, node {})\n",
            addrs.join(", ")
        );
        if sec.counters {
            let _ = writeln!(o, "Counters:\n{:>32} {:>16}", "CounterName", "Value");
            if let Some(c) = st.get("counters").and_then(Value::as_object) {
                for (k, v) in c {
                    let _ = writeln!(o, "{k:>32} {:>16}", n(v));
                }
            }
            o.push('\n');
        }
        if sec.sockets {
            let _ = writeln!(
                o,
                "RDS Sockets:\n{:>15} {:>5} {:>15} {:>5} {:>10} {:>10} {:>10} {:>10}",
                "BoundAddr", "BPort", "ConnAddr", "CPort", "SndBuf", "RcvBuf", "Unacked", "Unread"
            );
            for k in list(st, "sockets") {
                let _ = writeln!(
                    o,
                    "{:>15} {:>5} {:>15} {:>5} {:>10} {:>10} {:>10} {:>10}",
                    s(&k["bound_addr"]),
                    n(&k["bound_port"]),
                    s(&k["conn_addr"]),
                    n(&k["conn_port"]),
                    n(&k["sndbuf"]),
                    n(&k["rcvbuf"]),
                    n(&k["unacked_bytes"]),
                    n(&k["unread_bytes"]),
                );
            }
            o.push('\n');
        }
        if sec.connections {
            let _ = writeln!(
                o,
                "RDS Connections:\n{:>15} {:>15} {:>16} {:>16} {:>3} {:>10} {:>11}",
                "LocalAddr", "RemoteAddr", "NextTX", "NextRX", "Flg", "Transport", "State"
            );
            for c in list(st, "connections") {
                let _ = writeln!(
                    o,
                    "{:>15} {:>15} {:>16} {:>16} {:>3} {:>10} {:>11}",
                    s(&c["local_addr"]),
                    s(&c["remote_addr"]),
                    n(&c["next_tx_seq"]),
                    n(&c["next_rx_seq"]),
                    s(&c["flags"]),
                    s(&c["transport"]),
                    s(&c["state"]),
                );
            }
            o.push('\n');
        }
        if sec.congestion {
            let _ = writeln!(
                o,
                "Congestion maps:\n{:>15} {:>6} {:>9}  Ports",
                "Addr", "Local", "Congested"
            );
            for g in list(st, "congestion") {
                let ports: Vec<String> = list(g, "ports").iter().map(s).collect();
                let _ = writeln!(
                    o,
                    "{:>15} {:>6} {:>9}  {}",
                    s(&g["addr"]),
                    if g["local"].as_bool().unwrap_or(false) {
                        "yes"
                    } else {
                        "no"
                    },
                    n(&g["congested_ports"]),
                    if ports.is_empty() {
                        "-".to_owned()
                    } else {
                        ports.join(",")
                    },
                );
            }
            o.push('\n');
        }
    }
    Ok(o)
}
