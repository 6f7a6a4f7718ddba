//! Prints `lcore::perf::measure` results. Needs two free CPUs (default 0 and 1):
//!
//! ```text
//! cargo run -p lcore --release --example lcore_perf -- [cpu_a cpu_b]
//! ```

use lcore::perf::{PerfConfig, measure};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let mut cfg = PerfConfig::default();
    if let [a, b] = args[..] {
        cfg.cpus = [a, b];
    }
    let r = measure(&cfg)?;
    println!("clock: {} ({:?} Hz)", r.clock, r.tsc_hz);
    println!(
        "loop overhead: {:.1} ns/iteration with {} idle pollers ({} iterations)",
        r.loop_ns_per_iter, r.idle_pollers, r.loop_iterations
    );
    println!(
        "message one-way latency: p50 {} ns, p99 {} ns, min {} ns ({} round trips)",
        r.latency_p50_ns, r.latency_p99_ns, r.latency_min_ns, r.latency_samples
    );
    println!(
        "message throughput: {:.1} Mmsg/s (burst {}, {} messages)",
        r.msgs_per_sec / 1e6,
        r.burst,
        r.throughput_messages
    );
    Ok(())
}
