//! A hostile peer process over the shm provider.
//!
//! The test process is the victim: an rsocket echo server. Two child processes connect to
//! it: an honest client that runs verified ping-pong for the whole test, and a hostile one
//! that, once connected, writes random bytes into every shared mapping it can write (the
//! victim's queue-pair segment with its inbound slots, bounce buffer and credits, the
//! victim's completion-queue doorbell, the pages of the victim's buffers exported to it)
//! while it keeps its own socket busy. The victim must not crash, hang or read out of
//! bounds: the honest client's every byte arrives intact and on time, and only the hostile
//! connection is reset.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rsocket::{RsConfig, RsContext, RsListener, RsStream};

const ROLE: &str = "DP_HOSTILE_ROLE";
const SECS: u64 = 4;

fn dir() -> PathBuf {
    std::env::var_os("DP_SHM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dp-hostile-{}", std::process::id())))
}

fn device() -> ShmDevice {
    ShmDevice::open(ShmConfig {
        dir: Some(dir()),
        bounce_bytes: 4096,
        ..ShmConfig::default()
    })
    .expect("shm device")
}

fn addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 9, 1)), 5300)
}

/// A small xorshift generator: the test needs no crate for random bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writable shared mappings of this process: `(start, len, name)`.
fn writable_shared_mappings() -> Vec<(usize, usize, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let name = f.nth(3).unwrap_or("").to_owned();
            if perms != "rw-s" || !name.starts_with("/memfd:") {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let a = usize::from_str_radix(a, 16).ok()?;
            let b = usize::from_str_radix(b, 16).ok()?;
            Some((a, b - a, name))
        })
        .collect()
}

fn honest() {
    let ctx: RsContext<Shm> =
        RsContext::with_config(device(), RsConfig::default()).expect("context");
    let mut s = RsStream::connect(&ctx, addr()).expect("connect");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut buf = vec![0u8; 1 << 16];
    let start = Instant::now();
    let mut rounds = 0u64;
    let mut worst = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(SECS + 1) {
        let n = 1 + (rng.next() % 20_000) as usize;
        let data: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let t = Instant::now();
        s.write_all(&data).expect("honest write");
        s.read_exact(&mut buf[..n]).expect("honest read");
        worst = worst.max(t.elapsed());
        assert!(
            buf[..n] == data[..],
            "round {rounds}: the echo came back corrupted"
        );
        rounds += 1;
    }
    println!("HONEST rounds={rounds} worst_ms={}", worst.as_millis());
}

fn hostile() {
    let dev = device();
    let ctx: RsContext<Shm> = RsContext::with_config(dev, RsConfig::default()).expect("context");
    let mut s = RsStream::connect(&ctx, addr()).expect("connect");
    s.write_all(b"hello").expect("first write");
    let mut rng = Rng(std::process::id() as u64 | 1);
    let start = Instant::now();
    let mut writes = 0u64;
    let mut buf = [0u8; 4096];
    let _ = s.set_nonblocking(true);
    while start.elapsed() < Duration::from_secs(SECS) {
        for (base, len, _name) in writable_shared_mappings() {
            for _ in 0..64 {
                let off = (rng.next() as usize) % len;
                let v = rng.next();
                // Eight bytes where they fit, else one: indexes, lengths, sequence numbers
                // and flags all get hit.
                if off + 8 <= len && off.is_multiple_of(8) {
                    // SAFETY: inside a writable mapping of this process (from
                    // /proc/self/maps), aligned; volatile, as the victim reads it
                    // concurrently. This is the attack.
                    unsafe { ((base + off) as *mut u64).write_volatile(v) };
                } else {
                    // SAFETY: as above, one byte.
                    unsafe { ((base + off) as *mut u8).write_volatile(v as u8) };
                }
                writes += 1;
            }
        }
        // Keep the victim processing this connection.
        let _ = s.write(&buf[..(rng.next() % 4096) as usize]);
        let _ = s.read(&mut buf);
    }
    println!("HOSTILE writes={writes}");
}

#[test]
fn hostile_peer_costs_only_its_own_connection() {
    match std::env::var(ROLE).as_deref() {
        Ok("honest") => return honest(),
        Ok("hostile") => return hostile(),
        _ => {}
    }
    let dev = device();
    let stats_dev = dev.clone();
    let ctx: RsContext<Shm> = RsContext::with_config(dev, RsConfig::default()).expect("context");
    let listener = RsListener::bind(&ctx, addr()).expect("bind");
    let served = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (served, ended, stop) = (served.clone(), ended.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut workers = Vec::new();
            while workers.len() < 2 && !stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else {
                    continue;
                };
                let (served, ended) = (served.clone(), ended.clone());
                workers.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                                served.fetch_add(n, Ordering::Relaxed);
                            }
                        }
                    }
                    ended.fetch_add(1, Ordering::Relaxed);
                }));
            }
            for w in workers {
                w.join().expect("an echo worker panicked");
            }
        })
    };
    let spawn = |role: &str| {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "hostile_peer_costs_only_its_own_connection",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .env("DP_SHM_TEST_DIR", dir())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let honest = spawn("honest");
    let hostile = spawn("hostile");
    let deadline = Instant::now() + Duration::from_secs(60);
    let wait = |mut c: std::process::Child, what: &str| {
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                let mut out = String::new();
                c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
                return (st, out);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("the {what} client hung: the victim stopped serving it");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let (hs, hout) = wait(honest, "honest");
    let (xs, xout) = wait(hostile, "hostile");
    println!("{hout}{xout}");
    assert!(hs.success(), "the honest client failed: {hout}");
    assert!(
        hout.contains("HONEST rounds="),
        "the honest client did not finish: {hout}"
    );
    assert!(xs.success(), "the hostile client failed: {xout}");
    // Both connections end: the hostile one was reset or died with its process, and the
    // honest one closed. The victim is still here, serving.
    let t = Instant::now();
    while ended.load(Ordering::Relaxed) < 2 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ended.load(Ordering::Relaxed), 2, "a victim connection hung");
    stop.store(true, Ordering::Relaxed);
    acceptor.join().expect("acceptor");
    let st = stats_dev.stats();
    println!(
        "victim: served {} bytes; shm peer violations {}, malformed control messages {}",
        served.load(Ordering::Relaxed),
        st.peer_violations.load(Ordering::Relaxed),
        st.malformed_cm_msgs.load(Ordering::Relaxed)
    );
    let _ = std::fs::remove_dir_all(dir());
}
