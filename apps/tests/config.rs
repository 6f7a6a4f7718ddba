//! Pipeline config files: every example parses, and every class of mistake is rejected with
//! the file, the line and the key named.

use std::path::PathBuf;

use apps::config::{Config, ConfigError, OnFull, Provider, ServerMode, StageKind};
use apps::msg::Pattern;
use lcore::{CoreList, PollMode};

fn configs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("configs")
}

const HEAD: &str = "[eal]\ncores = \"0-1\"\n\n[ring.a]\ncapacity = 64\n\n";

fn parse(body: &str) -> Result<Config, ConfigError> {
    Config::parse(body, "t.toml")
}

fn err(body: &str) -> ConfigError {
    match parse(body) {
        Ok(c) => panic!("accepted a bad config: {c:#?}"),
        Err(e) => e,
    }
}

/// A generator and a sink around ring `a`, with `extra` appended to the generator.
fn pair(gen_extra: &str) -> String {
    format!(
        "{HEAD}[stage.gen]\nkind = \"generator\"\nlcore = 1\noutput = \"a\"\n{gen_extra}\n\n\
         [stage.sink]\nkind = \"sink\"\nlcore = 0\ninput = \"a\"\n"
    )
}

#[test]
fn every_example_parses() {
    let mut n = 0;
    for e in std::fs::read_dir(configs_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let c = Config::from_file(&p).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.stages.is_empty());
            n += 1;
        }
    }
    assert!(n >= 8, "found only {n} examples");
}

#[test]
fn example_pipeline_has_the_documented_shape() {
    let c = Config::from_file(&configs_dir().join("pipeline.toml")).unwrap();
    assert_eq!(c.eal.cores, CoreList::Cpus(vec![0, 1]));
    assert!(matches!(c.eal.mode, PollMode::Hybrid { .. }));
    assert_eq!(
        c.stages.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["gen", "fwd", "sink"]
    );
    assert_eq!(c.stages_on(0).count(), 2);
    let StageKind::Generator(g) = &c.stages[0].kind else {
        panic!()
    };
    assert_eq!(
        (g.rate, g.sizes.as_slice(), g.pattern),
        (Some(500_000), &[64][..], Pattern::Counter)
    );
    assert_eq!(g.on_full, OnFull::Wait);
    let a = c.rings.iter().find(|r| r.name == "a").unwrap();
    assert_eq!(
        (a.producers.as_slice(), a.consumer.as_str()),
        (&["gen".to_owned()][..], "fwd")
    );
    let perf = Config::from_file(&configs_dir().join("perf-busy.toml")).unwrap();
    assert_eq!(perf.eal.mode, PollMode::Busy);
    let srv = Config::from_file(&configs_dir().join("rsocket-server.toml")).unwrap();
    assert!(matches!(
        srv.fabric.unwrap().provider,
        Provider::Shm {
            bounce_bytes: 4096,
            ..
        }
    ));
    let StageKind::RsocketServer(s) = &srv.stages[0].kind else {
        panic!()
    };
    assert_eq!(
        (s.mode, s.connections, s.pool.as_deref()),
        (ServerMode::Sink, Some(1), Some("rxpool"))
    );
}

#[test]
fn defaults_fill_what_is_left_out() {
    let c = parse(&pair("")).unwrap();
    let StageKind::Generator(g) = &c.stages[0].kind else {
        panic!()
    };
    assert_eq!(
        (g.rate, g.sizes.as_slice(), g.burst, g.pattern),
        (None, &[64][..], 32, Pattern::Counter)
    );
    let StageKind::Sink(s) = &c.stages[1].kind else {
        panic!()
    };
    assert!(s.verify);
    assert!(
        matches!(c.eal.mode, PollMode::Hybrid { .. }),
        "hybrid is the default mode"
    );
}

#[test]
fn toml_syntax_error_names_the_line() {
    let e = err("[eal]\ncores = \"0-1\"\n[stage.x\n");
    assert!(matches!(e, ConfigError::Syntax { line: 3, .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("t.toml:3: TOML syntax error"),
        "{e}"
    );
}

#[test]
fn unknown_section_is_rejected() {
    let e = err(&format!("{}\n[stages.gen]\nkind = \"sink\"\n", pair("")));
    assert!(
        matches!(&e, ConfigError::UnknownSection { section, .. } if section == "stages"),
        "{e:?}"
    );
    assert_eq!(e.line(), Some(18));
    assert!(
        e.to_string()
            .contains("t.toml:18: unknown section [stages]"),
        "{e}"
    );
}

#[test]
fn unknown_key_in_a_stage_is_rejected_with_file_line_key_and_section() {
    let e = err(&pair("rat = 5"));
    assert_eq!(e.key(), Some("rat"));
    assert_eq!(e.line(), Some(11));
    let s = e.to_string();
    assert!(
        s.starts_with("t.toml:11: unknown key `rat` in [stage.gen]"),
        "{s}"
    );
    assert!(s.contains("`rate`"), "the accepted keys are listed: {s}");
}

#[test]
fn unknown_key_of_another_kind_is_rejected() {
    // `verify` is a sink key, not a generator key.
    let e = err(&pair("verify = true"));
    assert!(
        matches!(&e, ConfigError::UnknownKey { key, section, .. } if key == "verify" && section == "stage.gen")
    );
}

#[test]
fn unknown_key_in_eal_is_rejected() {
    let e = err("[eal]\ncores = \"0\"\ncpus = 2\n");
    assert!(
        e.to_string()
            .starts_with("t.toml:3: unknown key `cpus` in [eal]"),
        "{e}"
    );
}

#[test]
fn missing_key_is_rejected() {
    let e = err(&format!(
        "{HEAD}[stage.gen]\nkind = \"generator\"\noutput = \"a\"\n"
    ));
    assert!(
        matches!(&e, ConfigError::MissingKey { key, section, line: 7, .. } if key == "lcore" && section == "stage.gen"),
        "{e:?}"
    );
    let e = err(&format!("{HEAD}[stage.gen]\nlcore = 0\n"));
    assert!(
        matches!(&e, ConfigError::MissingKey { key, .. } if key == "kind"),
        "{e:?}"
    );
}

#[test]
fn wrong_type_is_rejected_with_the_key() {
    let e = err(&pair("rate = \"fast\""));
    assert!(
        matches!(&e, ConfigError::BadValue { key, line: 11, .. } if key == "rate"),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("t.toml:11: bad value for `rate` in [stage.gen]"),
        "{e}"
    );
    let e = err(&pair("sizes = [64, \"big\"]"));
    assert_eq!(e.key(), Some("sizes"), "{e}");
}

#[test]
fn bad_enum_value_is_rejected() {
    let e = err("[eal]\ncores = \"0\"\nmode = \"spin\"\n");
    assert!(
        matches!(&e, ConfigError::BadValue { key, line: 3, .. } if key == "mode"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("busy"),
        "lists the accepted values: {e}"
    );
    let e = err(&pair("on_full = \"block\""));
    assert_eq!(e.key(), Some("on_full"));
}

#[test]
fn unknown_stage_kind_is_rejected() {
    let e = err(&format!("{HEAD}[stage.x]\nkind = \"router\"\nlcore = 0\n"));
    assert!(
        matches!(&e, ConfigError::BadValue { key, line: 8, .. } if key == "kind"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("generator, forwarder, fanout"),
        "{e}"
    );
}

#[test]
fn out_of_range_values_are_rejected() {
    let e = err(&pair("size = 20"));
    assert!(
        matches!(&e, ConfigError::BadValue { key, .. } if key == "size"),
        "{e:?}"
    );
    let e = err(&pair("burst = 0"));
    assert_eq!(e.key(), Some("burst"));
    let e = err(&pair("burst = 128"));
    assert!(
        e.to_string()
            .contains("exceeds the capacity 64 of ring `a`"),
        "{e}"
    );
    let e = err("[eal]\ncores = \"0\"\n[ring.a]\ncapacity = 1000\n");
    assert!(
        matches!(&e, ConfigError::BadValue { key, line: 4, .. } if key == "capacity"),
        "{e:?}"
    );
    let e = err("[eal]\ncores = \"3-1\"\n");
    assert!(
        e.to_string().contains("reversed"),
        "the core-list error comes through: {e}"
    );
}

#[test]
fn lcore_outside_the_core_list_is_rejected() {
    let body = pair("").replace("lcore = 1", "lcore = 5");
    let e = err(&body);
    assert!(
        matches!(&e, ConfigError::Invalid { key, line: 9, .. } if key == "lcore"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("CPU 5 is not one of the lcores"),
        "{e}"
    );
}

#[test]
fn ring_wiring_mistakes_are_rejected() {
    // Unknown ring.
    let e = err(&pair("").replace("input = \"a\"", "input = \"b\""));
    assert!(e.to_string().contains("no ring `b`"), "{e}");
    // Two consumers.
    let e = err(&format!(
        "{}\n[stage.sink2]\nkind = \"sink\"\nlcore = 0\ninput = \"a\"\n",
        pair("")
    ));
    assert!(
        matches!(&e, ConfigError::Invalid { key, line: 21, .. } if key == "input"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("already read by stage `sink`"),
        "{e}"
    );
    // No consumer.
    let e = err(&format!(
        "{HEAD}[stage.gen]\nkind = \"generator\"\nlcore = 1\noutput = \"a\"\n"
    ));
    assert!(matches!(&e, ConfigError::Invalid { line: 4, .. }), "{e:?}");
    assert!(e.to_string().contains("has no consumer"), "{e}");
}

#[test]
fn rsocket_stage_needs_a_fabric_and_an_address() {
    let body =
        format!("{HEAD}[stage.s]\nkind = \"rsocket_server\"\nlcore = 0\nlisten = \"10.0.0.1:1\"\n");
    let e = err(&body);
    assert!(e.to_string().contains("need a [fabric] section"), "{e}");
    let e = err(&format!(
        "[fabric]\nprovider = \"shm\"\n{}",
        body.replace("10.0.0.1:1", "nowhere")
    ));
    assert!(
        matches!(&e, ConfigError::BadValue { key, .. } if key == "listen"),
        "{e:?}"
    );
}

#[test]
fn payload_larger_than_the_pool_object_is_rejected() {
    let body = format!(
        "[pool.p]\nobj_size = 100\ncount = 4096\n\n{}",
        pair("pool = \"p\"\nsize = 1500")
    );
    let e = err(&body);
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "size"),
        "{e:?}"
    );
    assert!(e.to_string().contains("more than obj_size 100"), "{e}");
}

#[test]
fn pool_too_small_for_its_caches_is_rejected() {
    let body = format!(
        "[pool.p]\nobj_size = 64\ncount = 300\ncache = 128\n\n{}",
        pair("pool = \"p\"")
    );
    let e = err(&body);
    assert!(
        matches!(&e, ConfigError::Invalid { key, line: 1, .. } if key == "count"),
        "{e:?}"
    );
    assert!(e.to_string().contains("raise count to at least"), "{e}");
}

#[cfg(not(feature = "verbs"))]
#[test]
fn verbs_provider_without_the_feature_says_how_to_build_it() {
    let e = err(&format!("[fabric]\nprovider = \"verbs\"\n\n{}", pair("")));
    assert!(e.to_string().contains("--features verbs"), "{e}");
}

#[test]
fn read_error_names_the_path() {
    let e = Config::from_file(std::path::Path::new("/nonexistent/x.toml")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(e.to_string().contains("/nonexistent/x.toml"));
}
