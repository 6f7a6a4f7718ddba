//! The RNBD server stage: its config checks, and the example `rnbd-server.toml` run through
//! the `dpctl` binary and used by an RNBD client over RTRS over shm (this test's process):
//! data written comes back byte-exact, the export rules answer with the kernel's errnos,
//! and `dpctl rnbd-info` / `rtrs-info` show the session while it is open.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apps::config::{Config, ExportAccess, ExportBackend, StageKind};
use apps::summary::StopCause;
use common::{TempDir, dpctl, err, heavy, info, key_of, run_json, stage, summary, wait_socket};
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rnbd::client::{BlkError, Buf, ClientEvent, DevId, WriteFlags};
use dataplane::rnbd::rtrs::RnbdClient;
use dataplane::rnbd::wire::AccessMode;
use dataplane::rtrs::clt::{ClientConfig, ClientSession};
use dataplane::rtrs::fabric::{ClientDriver, ClientDriverConfig};
use lcore::time::{Clock, RealClock};
use mempool::memory::{Region, RegionConfig};
use serde_json::Value;

const HEAD: &str = "[eal]\ncores = \"0\"\n\n[fabric]\nprovider = \"shm\"\n\n\
                    [stage.blk]\nkind = \"rnbd_server\"\nlcore = 0\n";

/// An `rnbd_server` with `server` keys and one export of `export` keys.
fn rnbd(server: &str, export: &str) -> String {
    format!("{HEAD}{server}\n\n[[stage.blk.export]]\n{export}\n")
}

const LISTEN: &str = "listen = \"10.0.0.1:1234\"";
const MEM: &str = "name = \"mem0\"\nbackend = \"mem\"\nsize = \"1m\"";

#[test]
fn rnbd_server_parses_with_its_defaults() {
    let c = Config::from_file(&common::example("rnbd-server.toml")).unwrap();
    let StageKind::RnbdServer(s) = &c.stages[0].kind else {
        panic!("{:?}", c.stages[0].kind)
    };
    assert_eq!(s.listen, ["10.0.0.1:1234".parse().unwrap()]);
    assert_eq!(s.dev_search_path, "/srv/rnbd");
    assert_eq!((s.queue_depth, s.max_io), (128, 128 << 10));
    assert!(!s.always_invalidate);
    let e = &s.exports;
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].name, "mem0");
    assert_eq!(e[0].path, Path::new("/srv/rnbd/mem0"));
    assert_eq!(e[0].backend, ExportBackend::Mem { size: 64 << 20 });
    assert_eq!(e[0].access, ExportAccess::Rw, "rw is the default");
    assert_eq!(e[1].access, ExportAccess::Ro);
    assert_eq!(e[2].backend, ExportBackend::Null { size: 1 << 30 });
    // Paths take consecutive ports; names are resolved as the kernel does.
    let c = Config::parse(
        &rnbd(
            &format!("{LISTEN}\npaths = 2"),
            "name = \"//dev//ram0\"\nbackend = \"file\"\npath = \"/dev/ram0\"",
        ),
        "t.toml",
    )
    .unwrap();
    let StageKind::RnbdServer(s) = &c.stages[0].kind else {
        panic!()
    };
    assert_eq!(
        s.listen,
        [
            "10.0.0.1:1234".parse().unwrap(),
            "10.0.0.1:1235".parse().unwrap()
        ]
    );
    assert_eq!(s.exports[0].path, Path::new("/dev/ram0"));
    assert_eq!(
        s.exports[0].backend,
        ExportBackend::File {
            path: "/dev/ram0".into()
        }
    );
}

#[test]
fn rnbd_mistakes_name_the_key_and_say_what_to_do() {
    let cases: &[(String, &str, &str)] = &[
        (
            rnbd(LISTEN, MEM).replace("[fabric]\nprovider = \"shm\"\n", ""),
            "kind",
            "need a [fabric] section",
        ),
        (
            rnbd(
                LISTEN,
                "name = \"../etc/passwd\"\nbackend = \"null\"\nsize = 4096",
            ),
            "name",
            "holds '..'",
        ),
        (
            rnbd(LISTEN, "name = \"\"\nbackend = \"null\"\nsize = 4096"),
            "name",
            "empty device name",
        ),
        (
            rnbd(LISTEN, "name = \"m\"\nbackend = \"mem\""),
            "size",
            "needs a `size`",
        ),
        (
            rnbd(LISTEN, "name = \"m\"\nbackend = \"mem\"\nsize = \"64q\""),
            "size",
            "not a size",
        ),
        (
            rnbd(LISTEN, "name = \"m\"\nbackend = \"mem\"\nsize = 1000"),
            "size",
            "multiple of 4096",
        ),
        (
            rnbd(LISTEN, &format!("{MEM}\npath = \"/tmp/x\"")),
            "path",
            "applies to backend = \"file\"",
        ),
        (
            rnbd(LISTEN, "name = \"f\"\nbackend = \"file\""),
            "path",
            "needs `path`",
        ),
        (
            rnbd(
                LISTEN,
                "name = \"f\"\nbackend = \"file\"\npath = \"/tmp/f\"\nsize = \"1m\"",
            ),
            "size",
            "as large as its file",
        ),
        (
            rnbd(LISTEN, &format!("{MEM}\naccess = \"rx\"")),
            "access",
            "unknown variant",
        ),
        (rnbd(LISTEN, &format!("{MEM}\nsise = 4096")), "sise", ""),
        (rnbd("listen = \"10.0.0.1:0\"", MEM), "listen", "fixed one"),
        (
            rnbd(&format!("{LISTEN}\npaths = 0"), MEM),
            "paths",
            "outside 1..=16",
        ),
        (
            rnbd(&format!("{LISTEN}\ndev_search_path = \"srv\""), MEM),
            "dev_search_path",
            "absolute",
        ),
        (
            rnbd(&format!("{LISTEN}\ndev_search_path = \"/srv/../etc\""), MEM),
            "dev_search_path",
            "`..`",
        ),
        (
            rnbd(
                &format!("{LISTEN}\ndev_search_path = \"/srv/%SESSNAME%\""),
                MEM,
            ),
            "dev_search_path",
            "%SESSNAME%",
        ),
        (
            rnbd(
                &format!("{LISTEN}\nqueue_depth = 65535\nmax_io = \"1m\""),
                MEM,
            ),
            "queue_depth",
            "28-bit immediate",
        ),
        (
            rnbd(&format!("{LISTEN}\nmax_io = 1000"), MEM),
            "max_io",
            "multiple of 4096",
        ),
        (
            format!("{}\n[[stage.blk.export]]\n{MEM}\n", rnbd(LISTEN, MEM)),
            "name",
            "already is",
        ),
        (format!("{HEAD}{LISTEN}\n"), "export", "at least one device"),
    ];
    for (body, key, says) in cases {
        let e = err(body);
        assert_eq!(key_of(&e), *key, "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert!(e.to_string().starts_with("t.toml:"), "names the file: {e}");
    }
}

/// An RNBD client in this process: one RTRS path over shm in `dir`, and 256 KiB of
/// registered buffers.
struct Blk {
    cl: RnbdClient<Shm>,
    clock: RealClock,
    bufs: Arc<Region>,
    region: u32,
}

/// Hang guard for every wait.
const PATIENCE: Duration = Duration::from_secs(20);

impl Blk {
    fn connect(dir: &Path, addr: &str) -> Self {
        let dev = ShmDevice::open(ShmConfig {
            dir: Some(dir.to_path_buf()),
            ..ShmConfig::default()
        })
        .unwrap();
        let mut drv =
            ClientDriver::<Shm>::new(Arc::new(dev), ClientDriverConfig::default()).unwrap();
        drv.add_route(addr.parse().unwrap());
        let bufs = Region::new(
            &RegionConfig::new("rnbd-test", 256 << 10)
                .shareable(true)
                .quiet(),
        )
        .unwrap();
        let bufs = Arc::new(bufs);
        let region = drv.add_region(Arc::clone(&bufs)).unwrap();
        let uuid: [u8; 16] = std::array::from_fn(|i| (std::process::id() >> (i % 4 * 8)) as u8);
        let cfg = ClientConfig::new(b"dpctl-test", uuid).unwrap();
        let sess = ClientSession::new(cfg).unwrap();
        let depth = ClientDriverConfig::default().max_queue_depth;
        let mut cl = RnbdClient::new(drv, sess, depth, 128 << 10).unwrap();
        let clock = RealClock::new();
        let path: [u8; 16] = std::array::from_fn(|i| uuid[i] ^ 0x5a);
        cl.open(clock.now(), &[path]).unwrap();
        let mut b = Self {
            cl,
            clock,
            bufs,
            region,
        };
        match b.event() {
            ClientEvent::SessionReady { .. } => b,
            other => panic!("the session did not open: {other:?}"),
        }
    }

    /// The next RNBD event (polling the client meanwhile).
    fn event(&mut self) -> ClientEvent {
        let t0 = Instant::now();
        loop {
            let work = self.cl.poll(self.clock.now());
            if let Some(ev) = self.cl.rnbd().poll_event() {
                return ev;
            }
            assert!(
                self.cl.open_error().is_none(),
                "RTRS: {:?}",
                self.cl.open_error()
            );
            assert!(t0.elapsed() < PATIENCE, "no RNBD event");
            if work == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Maps `name`: the device, or the server's errno.
    fn map(&mut self, name: &str, mode: AccessMode) -> Result<DevId, i32> {
        let (s, mut t) = self.cl.session(self.clock.now());
        let dev = s.map(name.as_bytes(), mode, &mut t).unwrap();
        match self.event() {
            ClientEvent::Mapped { dev: d, .. } if d == dev => Ok(dev),
            ClientEvent::MapFailed { errno, .. } => Err(errno),
            other => panic!("mapping {name}: {other:?}"),
        }
    }

    fn buf(&self, offset: u64, len: u32) -> Buf {
        Buf {
            region: self.region,
            offset,
            len,
        }
    }

    /// Bytes `at..at + len` of the buffers.
    fn bytes(&mut self, at: usize, len: usize) -> &mut [u8] {
        // SAFETY: the region is 256 KiB and the tests stay within it; no IO is in flight
        // while the test touches it (every call below waits for its completion).
        unsafe { std::slice::from_raw_parts_mut(self.bufs.as_ptr().add(at), len) }
    }

    /// The completion of the IO just submitted.
    fn done(&mut self) -> Result<(), i32> {
        match self.event() {
            ClientEvent::IoDone { result, .. } => result,
            other => panic!("IO: {other:?}"),
        }
    }

    fn write(&mut self, dev: DevId, sector: u64, at: u64, len: u32) -> Result<(), i32> {
        let buf = self.buf(at, len);
        let (s, mut t) = self.cl.session(self.clock.now());
        s.write(dev, sector, buf, WriteFlags::default(), 1, &mut t)
            .map_err(BlkError::errno)?;
        self.done()
    }

    fn read(&mut self, dev: DevId, sector: u64, at: u64, len: u32) -> Result<(), i32> {
        let buf = self.buf(at, len);
        let (s, mut t) = self.cl.session(self.clock.now());
        s.read(dev, sector, buf, 2, &mut t)
            .map_err(BlkError::errno)?;
        self.done()
    }

    /// Unmaps `devs` and closes the session.
    fn close(mut self, devs: &[DevId]) {
        for d in devs {
            let (s, mut t) = self.cl.session(self.clock.now());
            s.unmap(*d, &mut t).unwrap();
            match self.event() {
                ClientEvent::Unmapped { .. } => {}
                other => panic!("unmap: {other:?}"),
            }
        }
        let now = self.clock.now();
        let (sess, drv) = self.cl.rtrs_mut();
        sess.close(now, drv);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            self.cl.poll(self.clock.now());
            std::thread::yield_now();
        }
    }
}

fn json(out: &(bool, String, String)) -> Value {
    assert!(out.0, "failed: {}", out.2);
    serde_json::from_str(&out.1).unwrap_or_else(|e| panic!("not JSON ({e}): {}", out.1))
}

fn find<'a>(list: &'a Value, key: &str, want: &str) -> &'a Value {
    list.as_array()
        .and_then(|l| l.iter().find(|v| v[key] == want))
        .unwrap_or_else(|| panic!("no {key} = {want} in {list:#}"))
}

#[test]
fn example_rnbd_server_serves_its_exports_to_an_rnbd_client() {
    let _g = heavy();
    let dir = TempDir::new("rnbd", "serve");
    let p = run_json(
        &mut dpctl(&dir.0),
        "rnbd-server.toml",
        &["--duration", "60"],
    );
    // The stage listens before the telemetry socket appears.
    wait_socket(&dir.0, p.id());
    let mut c = Blk::connect(&dir.0, "10.0.0.1:1234");

    // A pattern written comes back byte-exact, and where nothing was written reads zero.
    let mem = c.map("mem0", AccessMode::Rw).expect("mem0 maps read-write");
    let len = 64 << 10;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in c.bytes(0, len) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let pattern = c.bytes(0, len).to_vec();
    c.write(mem, 8, 0, len as u32).unwrap();
    c.bytes(len, len).fill(0xEE);
    c.read(mem, 8, len as u64, len as u32).unwrap();
    assert!(c.bytes(len, len) == pattern.as_slice(), "read back differs");
    c.read(mem, 1024, len as u64, 4096).unwrap();
    assert!(c.bytes(len, 4096).iter().all(|&b| b == 0));

    // The export rules, with the kernel's errnos: a read-only export refuses a read-write
    // open (EPERM) and opens read-only; an unknown name fails OPEN with ENOENT.
    assert_eq!(c.map("ro0", AccessMode::Rw), Err(libc::EPERM));
    assert_eq!(c.map("nope", AccessMode::Ro), Err(libc::ENOENT));
    let ro = c.map("ro0", AccessMode::Ro).expect("ro0 maps read-only");
    c.read(ro, 0, 0, 4096).unwrap();
    // (A write to a read-only mapping never leaves the client: EROFS, as a block device.)
    assert_eq!(c.write(ro, 0, 0, 4096), Err(libc::EROFS));

    // rnbd-info: the session, its path, and the devices it has open with their IO counts.
    let v = json(&info(&dir.0, "rnbd-info", p.id(), &["--json"]));
    let st = &v[0];
    assert_eq!(st["stage"], "blk");
    assert_eq!(st["dev_search_path"], "/srv/rnbd");
    let d = find(&st["devices"], "name", "mem0");
    assert_eq!(
        (d["open"].as_u64(), d["writers"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(find(&st["devices"], "name", "ro0")["access"], "ro");
    let sess = &st["sessions"][0];
    assert_eq!(sess["session"], "dpctl-test");
    assert_eq!(sess["paths"][0]["state"], "connected");
    let m = find(&sess["devices"], "name", "mem0");
    assert_eq!(m["mapping_path"], "/srv/rnbd/mem0");
    assert_eq!(m["access_mode"], "rw");
    assert_eq!(
        (m["writes"].as_u64(), m["write_sectors"].as_u64()),
        (Some(1), Some(128))
    );
    assert_eq!(
        (m["reads"].as_u64(), m["read_sectors"].as_u64()),
        (Some(2), Some(136))
    );
    let r = find(&sess["devices"], "name", "ro0");
    assert_eq!(
        (r["access_mode"].as_str(), r["read_only"].as_bool()),
        (Some("ro"), Some(true))
    );
    assert_eq!(
        (r["reads"].as_u64(), r["writes"].as_u64()),
        (Some(1), Some(0))
    );
    let (ok, text, e) = info(&dir.0, "rnbd-info", p.id(), &[]);
    assert!(ok, "{e}");
    assert!(
        text.contains("session dpctl-test: paths path0 (connected)"),
        "{text}"
    );
    assert!(text.contains("WriteSectors"), "{text}");
    assert!(text.contains("/srv/rnbd/mem0"), "{text}");

    // rtrs-info: the path with the kernel's stats/rdma counters.
    let v = json(&info(&dir.0, "rtrs-info", p.id(), &["--json"]));
    let path = &v[0]["sessions"][0]["paths"][0];
    assert_eq!(v[0]["sessions"][0]["session"], "dpctl-test");
    assert_eq!(path["state"], "connected");
    assert_eq!(path["src_addr"], "10.0.0.1:1234", "{path}");
    let dst = path["dst_addr"].as_str().unwrap_or_default();
    assert!(dst.parse::<std::net::SocketAddr>().is_ok(), "{path}");
    let rdma = &path["stats"]["rdma"];
    // RTRS READs: session info, 4 opens, 3 reads; WRITEs: the one write.
    assert_eq!(rdma["read_cnt"].as_u64(), Some(8), "{rdma}");
    assert_eq!(rdma["write_cnt"].as_u64(), Some(1), "{rdma}");
    assert!(rdma["write_bytes"].as_u64().unwrap() > len as u64, "{rdma}");
    let sysfs = format!(
        "{} {} {} {}",
        rdma["read_cnt"], rdma["read_bytes"], rdma["write_cnt"], rdma["write_bytes"]
    );
    assert_eq!(path["stats"]["rdma_sysfs"], sysfs.as_str());
    let (ok, text, e) = info(&dir.0, "rtrs-info", p.id(), &[]);
    assert!(ok, "{e}");
    assert!(
        text.contains("dpctl-test/paths/path0/stats/rdma") && text.contains(&sysfs),
        "{text}"
    );

    // rtrs-info --reset: the counters start again from zero, as after `echo 1 > reset_all`.
    let v = json(&info(&dir.0, "rtrs-info", p.id(), &["--reset", "--json"]));
    let rdma = &v[0]["sessions"][0]["paths"][0]["stats"]["rdma"];
    assert_eq!(rdma["read_cnt"].as_u64(), Some(0), "{rdma}");
    assert_eq!(rdma["write_bytes"].as_u64(), Some(0), "{rdma}");
    c.read(mem, 0, 0, 4096).unwrap();
    let v = json(&info(&dir.0, "rtrs-info", p.id(), &["--json"]));
    let rdma = &v[0]["sessions"][0]["paths"][0]["stats"]["rdma"];
    assert_eq!(
        (rdma["read_cnt"].as_u64(), rdma["write_cnt"].as_u64()),
        (Some(1), Some(0)),
        "{rdma}"
    );

    c.close(&[mem, ro]);
    p.interrupt();
    let s = summary(p, Duration::from_secs(30));
    assert_eq!(s.stopped_by, StopCause::Signal, "{s:#?}");
    let blk = stage(&s, "blk").counters;
    assert_eq!((blk.conns_opened, blk.conns_closed), (1, 1));
    // Those 9 requests, the read after the reset, and the 2 CLOSEs.
    assert_eq!(blk.in_msgs, 12, "{blk:?}");
    assert_eq!(blk.in_msgs, blk.out_msgs, "every request answered");
    assert_eq!(blk.dropped, 0);
}

#[test]
fn rnbd_info_says_when_a_pipeline_has_no_rnbd_server() {
    let _g = heavy();
    let dir = TempDir::new("rnbd", "none");
    let p = run_json(&mut dpctl(&dir.0), "pipeline.toml", &["--duration", "30"]);
    wait_socket(&dir.0, p.id());
    for cmd in ["rnbd-info", "rtrs-info"] {
        let (ok, _, e) = info(&dir.0, cmd, p.id(), &[]);
        assert!(!ok);
        assert!(e.contains("no RNBD server"), "{e}");
        let (ok, _, e) = info(&dir.0, cmd, p.id(), &["--stage", "gen"]);
        assert!(!ok);
        assert!(e.contains("no rnbd_server stage `gen`"), "{e}");
    }
    p.interrupt();
    let _ = summary(p, Duration::from_secs(30));
}

/// A file export: what a client writes lands in the file (read back from the filesystem),
/// and a read-only export of the same file serves it but refuses a read-write open.
#[test]
fn file_export_writes_through_io_uring_into_the_file() {
    let _g = heavy();
    let dir = TempDir::new("rnbd", "file");
    // On the build disk: tmpfs (often /tmp) has no O_DIRECT.
    let disk = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rnbd-file-{}.img", std::process::id()));
    std::fs::write(&disk, vec![0u8; 4 << 20]).unwrap();
    let _remove = RemoveOnDrop(disk.clone());
    let cfg = dir.0.join("file.toml");
    std::fs::write(
        &cfg,
        format!(
            "{HEAD}listen = \"10.0.0.1:1300\"\n\n\
             [[stage.blk.export]]\nname = \"disk0\"\nbackend = \"file\"\npath = \"{d}\"\n\n\
             [[stage.blk.export]]\nname = \"disk0ro\"\nbackend = \"file\"\npath = \"{d}\"\n\
             access = \"ro\"\n",
            d = disk.display()
        ),
    )
    .unwrap();
    let mut p = common::Proc(Some(
        dpctl(&dir.0)
            .arg("run")
            .arg(&cfg)
            .args(["--json", "--quiet", "--duration", "60"])
            .spawn()
            .unwrap(),
    ));
    // The devices are made before the telemetry socket appears; a kernel or filesystem
    // that cannot serve the file ends dpctl first, saying why.
    let sock = dir.0.join(format!("dpctl-{}.sock", p.id()));
    let t0 = Instant::now();
    while !sock.exists() {
        let child = p.0.as_mut().expect("running");
        if let Some(st) = child.try_wait().unwrap() {
            let out = p.0.take().expect("running").wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("io_uring"), "dpctl failed ({st}): {err}");
            eprintln!("skipped: the file backend cannot run here: {err}");
            return;
        }
        assert!(t0.elapsed() < PATIENCE, "no telemetry socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = Blk::connect(&dir.0, "10.0.0.1:1300");
    let dev = c
        .map("disk0", AccessMode::Rw)
        .expect("disk0 maps read-write");
    let len = 32 << 10;
    for (i, b) in c.bytes(0, len).iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let pattern = c.bytes(0, len).to_vec();
    c.write(dev, 16, 0, len as u32).unwrap();
    let on_disk = std::fs::read(&disk).unwrap();
    assert!(
        on_disk[16 * 512..16 * 512 + len] == pattern[..],
        "the file does not hold what was written"
    );
    assert_eq!(c.map("disk0ro", AccessMode::Rw), Err(libc::EPERM));
    let ro = c
        .map("disk0ro", AccessMode::Ro)
        .expect("disk0ro maps read-only");
    c.read(ro, 16, len as u64, len as u32).unwrap();
    assert!(c.bytes(len, len) == pattern.as_slice());
    c.close(&[dev, ro]);
    p.interrupt();
    let s = summary(p, Duration::from_secs(30));
    assert_eq!(stage(&s, "blk").counters.conns_opened, 1);
}

/// Removes a file when the test ends, passed or not.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
