#!/usr/bin/env bash
# Runs DPDK's own perf autotests and dp-perf on the same two cores, then prints the results
# side by side with ratios and the two headline goals (PASS/FAIL).
#
#   scripts/bench-vs-dpdk.sh [--ring-only | --mempool-only] [--out DIR]
#                            [--dpdk-mempool-log FILE]
#
# Environment:
#   CPUS=0,1           the two CPUs (DPDK gets -l A,B; dp-perf gets --cpus A,B)
#   DPDK_TEST_BIN=...  dpdk-test binary (default: dpdk-test on PATH; installed with apt-get
#                      install dpdk when missing and running as root)
#   DPDK_MEM_MB=512    memory for DPDK's EAL (-m)
#   RING_ROUNDS=3      DPDK/dp-perf ring rounds (medians are compared)
#   CARGO_TARGET_DIR   where the release dp-perf is built (default: <repo>/target)
#
# What runs, in order (both cores must otherwise be idle; everything busy-polls):
#   1. dpdk-test ring_perf_autotest and dp-perf ring --json, alternated RING_ROUNDS (3) times;
#      each case is reported as the median over the rounds   (~1.5 min)
#   3. dpdk-test mempool_perf_autotest, stopped as soon as the cases compared here are out:
#      ~40 min. DPDK 22.11.11 runs every case for 5 s: get bulk x put bulk in {1,4,8,32}^2,
#      keep in {32,128,512}, plus a constant_n=1 replay of each equal-bulk case, i.e. 60
#      cases per core count, for cores 1, 2 and "all" (= 2 here), per pool variant; the
#      "with cache" variant comes third, after two cache-less ones. Nothing on its command
#      line narrows that. --dpdk-mempool-log FILE reuses the log of an earlier run instead
#      (then the pool comparison is no longer "in the same run").
#   4. dp-perf mempool --json --keep 128 --bulk 1,4,8,32  (~35 s)
#
# Units and definitions (verified against DPDK 22.11's output and test_ring_perf.c):
#   ring, DPDK prints TSC cycles. single: per enqueue+dequeue of one element.
#     burst/bulk on one core: per enqueue+dequeue CALL PAIR (22.11 divides by iterations
#     only; later versions divide by elements too), so the script divides by the batch size.
#     two cores: per element, producer's and consumer's per-element times SUMMED; dp-perf
#     reports the same sum. Cycles become ns with the TSC frequency DPDK logs in the same
#     run ("TSC frequency is ~N KHz", from --log-level=lib.eal:debug).
#   mempool, rate_persec = objects got and returned per second, summed over cores, for
#     n_get_bulk = n_put_bulk = bulk, n_keep = 128. DPDK 22.11.x prints each equal-bulk case
#     twice: constant_n=0 (bulk size known only at run time, like dp-perf's) and
#     constant_n=1 (compile-time constant). Ratios use constant_n=0; the n=const column is
#     shown for reference. When DPDK prints cores=2 twice (2 cores and "all" cores on a
#     two-core run) the first is used.
#
# Memory: hugepages when at least DPDK_MEM_MB of them are free, else --no-huge. dp-perf's
# pools use hugepages automatically under the same condition.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CPUS=${CPUS:-0,1}
DPDK_MEM_MB=${DPDK_MEM_MB:-512}
RING_TIMEOUT=${RING_TIMEOUT:-900}
RING_ROUNDS=${RING_ROUNDS:-3}
MEMPOOL_TIMEOUT=${MEMPOOL_TIMEOUT:-3600}
DO_RING=1
DO_MEMPOOL=1
OUT=""
DPDK_MEMPOOL_LOG=""

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --ring-only) DO_MEMPOOL=0 ;;
        --mempool-only) DO_RING=0 ;;
        --out)
            [ $# -ge 2 ] || usage
            OUT=$2
            shift
            ;;
        --dpdk-mempool-log)
            [ $# -ge 2 ] || usage
            DPDK_MEMPOOL_LOG=$2
            shift
            ;;
        -h | --help) usage ;;
        *)
            echo "bench-vs-dpdk: unknown argument '$1'" >&2
            usage
            ;;
    esac
    shift
done

if ! [[ $CPUS =~ ^[0-9]+,[0-9]+$ ]]; then
    echo "bench-vs-dpdk: CPUS must be two CPU numbers 'A,B', got '$CPUS'" >&2
    exit 2
fi

OUT=${OUT:-$(mktemp -d /tmp/bench-vs-dpdk.XXXXXX)}
mkdir -p "$OUT"
log() { printf '[bench-vs-dpdk %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- dpdk-test -------------------------------------------------------------------------------
DPDK_TEST_BIN=${DPDK_TEST_BIN:-$(command -v dpdk-test || true)}
if [ -z "$DPDK_TEST_BIN" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        log "dpdk-test not found; installing the Debian 'dpdk' package"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpdk >&2
        DPDK_TEST_BIN=$(command -v dpdk-test)
    else
        echo "bench-vs-dpdk: dpdk-test not found; install the 'dpdk' package (as root)" >&2
        exit 1
    fi
fi
DPDK_VERSION=$(dpkg-query -W -f='${Version}' dpdk 2>/dev/null || echo unknown)

huge_free_kb=$(awk '/^HugePages_Free:/ {f=$2} /^Hugepagesize:/ {s=$2} END {print f*s}' /proc/meminfo)
if [ "${huge_free_kb:-0}" -ge $((DPDK_MEM_MB * 1024)) ]; then
    MEM_ARGS=(-m "$DPDK_MEM_MB")
    MEM_DESC="hugepages (${huge_free_kb} KiB free)"
else
    MEM_ARGS=(--no-huge -m "$DPDK_MEM_MB")
    MEM_DESC="--no-huge (${huge_free_kb:-0} KiB of hugepages free)"
fi
EAL_ARGS=(-l "$CPUS" "${MEM_ARGS[@]}" --no-pci --file-prefix "dpperf$$" --log-level=lib.eal:debug)
# EAL leaves its runtime directory (named after --file-prefix) behind.
trap 'rm -rf "/var/run/dpdk/dpperf$$" "${XDG_RUNTIME_DIR:-/nonexistent}/dpdk/dpperf$$"' EXIT

# Runs one autotest non-interactively (DPDK_TEST=<name>) with line-buffered stdout so that
# its log can be watched while it runs.
dpdk_autotest() { # name log timeout
    DPDK_TEST=$1 timeout --signal=INT --kill-after=10 "$3" \
        stdbuf -oL "$DPDK_TEST_BIN" "${EAL_ARGS[@]}" </dev/null >"$2" 2>&1
}

# --- dp-perf ---------------------------------------------------------------------------------
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
log "building dp-perf (release)"
(cd "$ROOT" && cargo build --release -q -p perf --bin dp-perf)
DP_PERF=$TARGET_DIR/release/dp-perf

log "dpdk-test: $DPDK_TEST_BIN (dpdk $DPDK_VERSION), EAL ${EAL_ARGS[*]}"
log "memory: $MEM_DESC; logs in $OUT"

# The host's cache-line hand-off latency between the two CPUs, before and after: on a VM it
# moves with the hypervisor's placement of the vCPUs (same core complex or not) and two-core
# numbers move with it, so the report prints it next to them.
"$DP_PERF" --cpus "$CPUS" limit --json --memcpy-mib 8 >"$OUT/limit-before.json"

# --- ring ------------------------------------------------------------------------------------
if [ "$DO_RING" -eq 1 ]; then
    # Alternate the two sides RING_ROUNDS times and compare medians: on a shared or
    # virtualised host the conditions drift within minutes, and a single DPDK-then-us pair
    # measures the drift as much as the rings.
    for round in $(seq 1 "$RING_ROUNDS"); do
        log "round $round/$RING_ROUNDS: DPDK ring_perf_autotest (timeout ${RING_TIMEOUT}s)"
        if ! dpdk_autotest ring_perf_autotest "$OUT/dpdk-ring-$round.log" "$RING_TIMEOUT" ||
            ! grep -q "Test OK" "$OUT/dpdk-ring-$round.log"; then
            echo "bench-vs-dpdk: ring_perf_autotest failed; see $OUT/dpdk-ring-$round.log" >&2
            tail -20 "$OUT/dpdk-ring-$round.log" >&2
            exit 1
        fi
        log "round $round/$RING_ROUNDS: dp-perf ring"
        "$DP_PERF" --cpus "$CPUS" ring --json >"$OUT/dp-ring-$round.json"
    done
fi

# --- mempool ---------------------------------------------------------------------------------
if [ "$DO_MEMPOOL" -eq 1 ] && [ -n "$DPDK_MEMPOOL_LOG" ]; then
    log "DPDK mempool: reusing $DPDK_MEMPOOL_LOG (not the same run)"
    cp "$DPDK_MEMPOOL_LOG" "$OUT/dpdk-mempool.log"
fi
last='cache=512 cores=2 n_get_bulk=32 n_put_bulk=32 n_keep=128 constant_n=1'
if [ "$DO_MEMPOOL" -eq 1 ]; then
    if [ -z "$DPDK_MEMPOOL_LOG" ]; then
        log "DPDK mempool_perf_autotest (5 s per case, ~40 min; stops once cache=512 cores=2 keep=128 is out)"
        # Started directly (not through a function) so that $! is timeout's own pid.
        DPDK_TEST=mempool_perf_autotest timeout --signal=INT --kill-after=10 "$MEMPOOL_TIMEOUT" \
            stdbuf -oL "$DPDK_TEST_BIN" "${EAL_ARGS[@]}" </dev/null >"$OUT/dpdk-mempool.log" 2>&1 &
        dpdk_pid=$!
        reported=0
        while kill -0 "$dpdk_pid" 2>/dev/null; do
            if grep -q "$last" "$OUT/dpdk-mempool.log" 2>/dev/null; then
                log "DPDK: the compared cases are done; stopping it"
                # timeout forwards SIGINT to dpdk-test, whose EAL then cleans up after itself.
                kill -INT "$dpdk_pid" 2>/dev/null || true
                break
            fi
            n=$(grep -c '^mempool_autotest' "$OUT/dpdk-mempool.log" 2>/dev/null || true)
            if [ "${n:-0}" -ge $((reported + 60)) ]; then
                reported=$n
                log "DPDK: $n of about 480 mempool cases done"
            fi
            sleep 2
        done
        wait "$dpdk_pid" 2>/dev/null || true
    fi
    if ! grep -q "$last" "$OUT/dpdk-mempool.log"; then
        echo "bench-vs-dpdk: mempool_perf_autotest did not reach the compared cases; see $OUT/dpdk-mempool.log" >&2
        tail -20 "$OUT/dpdk-mempool.log" >&2
        exit 1
    fi
    log "dp-perf mempool"
    "$DP_PERF" --cpus "$CPUS" mempool --json --keep 128 --bulk 1,4,8,32 >"$OUT/dp-mempool.json"
fi

"$DP_PERF" --cpus "$CPUS" limit --json --memcpy-mib 8 >"$OUT/limit-after.json"

# --- report ----------------------------------------------------------------------------------
python3 - "$OUT" "$DO_RING" "$DO_MEMPOOL" "$DPDK_VERSION" "$MEM_DESC" "$CPUS" <<'PY'
import json, re, sys

out, do_ring, do_mempool, version, mem, cpus = sys.argv[1:7]
do_ring, do_mempool = do_ring == "1", do_mempool == "1"
goals = []

def verdict(ok):
    return "PASS" if ok else "FAIL"

print(f"dataplane vs DPDK {version} on CPUs {cpus}, DPDK memory: {mem}")
lat = [json.load(open(f"{out}/limit-{w}.json"))["limit"]["cacheline_oneway_ns"]
       for w in ("before", "after")]
print(f"cache-line one-way hand-off between the CPUs: {lat[0]:.0f} ns before, {lat[1]:.0f} ns after"
      " (two-core results are only comparable between runs with similar values)")

if do_ring:
    import glob, statistics
    def parse_dpdk_ring(path):
        """(mode, op, batch, cores) -> cycles per element, legacy (pointer-sized) API only."""
        got, section = {}, None
        for l in open(path).read().splitlines():
            if l.startswith("###"):
                section = l
                continue
            m = re.match(r"legacy APIs: (SP/SC|MP/MC): (single|burst|bulk)(?: \(size: (\d+)\))?: ([\d.]+)", l)
            if not m or section is None:
                continue
            mode = "spsc" if m.group(1) == "SP/SC" else "mpmc"
            op, batch, cyc = m.group(2), int(m.group(3) or 1), float(m.group(4))
            if "single element" in section:
                got[(mode, "single", 1, 1)] = cyc
            elif "burst enq/deq" in section or "bulk enq/deq" in section:
                # Per call pair in 22.11: make it per element.
                got[(mode, op, batch, 1)] = cyc / batch
            elif "two physical cores" in section:
                got[(mode, "bulk", batch, 2)] = cyc
        return got
    logs = sorted(glob.glob(f"{out}/dpdk-ring-*.log"))
    text = open(logs[0]).read()
    m = re.search(r"TSC frequency is ~(\d+) KHz", text)
    if m is None:
        sys.exit("bench-vs-dpdk: DPDK did not log its TSC frequency")
    ghz = float(m.group(1)) / 1e6
    rounds = [parse_dpdk_ring(p) for p in logs]
    dpdk = {k: statistics.median(r[k] for r in rounds if k in r) for k in rounds[0]}
    ours_rounds = [{(r["mode"], r["op"], r["batch"], r["cores"]): r["ns_per_elem"]
                    for r in json.load(open(p))["ring"]}
                   for p in sorted(glob.glob(f"{out}/dp-ring-*.json"))]
    ours = {k: statistics.median(r[k] for r in ours_rounds if k in r) for k in ours_rounds[0]}
    print(f"\nRING: ns per element (lower is better), median of {len(rounds)} alternating rounds"
          f" per side; DPDK cycles / {ghz:.3f} GHz TSC")
    print("  one core: one enqueue + one dequeue per element; two cores: producer + consumer"
          " time per element (DPDK's sum)")
    hdr = f"  {'mode':<5} {'op':<6} {'batch':>5} {'cores':>5} {'DPDK cyc':>9} {'DPDK ns':>8} {'ours ns':>8} {'ours/DPDK':>9}"
    print(hdr)
    cases = []
    for mode in ("spsc", "mpmc"):
        cases.append((mode, "single", 1, 1))
        for op in ("burst", "bulk"):
            for b in (8, 32):
                cases.append((mode, op, b, 1))
        for b in (8, 32):
            cases.append((mode, "bulk", b, 2))
    for key in cases:
        d, o = dpdk.get(key), ours.get(key)
        if d is None or o is None:
            print(f"  {key[0]:<5} {key[1]:<6} {key[2]:>5} {key[3]:>5}   missing (DPDK {d}, ours {o})")
            continue
        dns = d / ghz
        print(f"  {key[0]:<5} {key[1]:<6} {key[2]:>5} {key[3]:>5} {d:>9.2f} {dns:>8.2f} {o:>8.2f} {o / dns:>9.2f}")
    key = ("spsc", "bulk", 32, 2)
    if key in dpdk and key in ours:
        dns, o = dpdk[key] / ghz, ours[key]
        goals.append(f"GOAL ring: SPSC bulk-32 two cores, ns/elem ours {o:.2f} vs DPDK {dns:.2f}: "
                     f"ratio ours/DPDK {o / dns:.2f} (<= 1 passes) -> {verdict(o <= dns)}")
    else:
        goals.append("GOAL ring: SPSC bulk-32 two cores -> FAIL (missing result)")

if do_mempool:
    log = open(f"{out}/dpdk-mempool.log").read().splitlines()
    dpdk = {}
    block = None
    for l in log:
        if l.startswith("start performance test"):
            block = {"start performance test (without cache)": "nocache",
                     "start performance test (with cache)": "cache"}.get(l.strip(), "other")
            continue
        m = re.match(r"mempool_autotest cache=(\d+) cores=(\d+) n_get_bulk=(\d+) n_put_bulk=(\d+) "
                     r"n_keep=(\d+)(?: constant_n=(\d))? rate_persec=(\d+)", l)
        if not m or block not in ("nocache", "cache"):
            continue
        cache, cores, g, p, keep = (int(m.group(i)) for i in range(1, 6))
        const = int(m.group(6) or 0)
        if g != p or keep != 128:
            continue
        dpdk.setdefault((cache, cores, g, const), int(m.group(7)))
    ours = {(r["cache"], r["cores"], r["bulk"]): r["ops_per_sec"]
            for r in json.load(open(f"{out}/dp-mempool.json"))["mempool"] if r.get("keep", 128) == 128}
    print("\nMEMPOOL: objects got+put per second, summed over cores, n_keep=128 (higher is better)")
    print(f"  {'cache':>5} {'cores':>5} {'bulk':>4} {'DPDK n=var':>14} {'DPDK n=const':>14} {'ours':>14} {'ours/DPDK':>9}")
    for cache in (0, 512):
        for cores in (1, 2):
            for bulk in (1, 4, 8, 32):
                d0 = dpdk.get((cache, cores, bulk, 0))
                d1 = dpdk.get((cache, cores, bulk, 1))
                o = ours.get((cache, cores, bulk))
                fmt = lambda v: f"{v:>14,.0f}" if v is not None else f"{'-':>14}"
                ratio = f"{o / d0:>9.2f}" if o and d0 else f"{'-':>9}"
                print(f"  {cache:>5} {cores:>5} {bulk:>4} {fmt(d0)} {fmt(d1)} {fmt(o)} {ratio}")
    parts, ok = [], True
    for cores in (1, 2):
        d0, d1, o = dpdk.get((512, cores, 32, 0)), dpdk.get((512, cores, 32, 1)), ours.get((512, cores, 32))
        if d0 is None or o is None:
            parts.append(f"{cores} core(s): missing")
            ok = False
            continue
        ok = ok and o >= d0
        extra = f", vs n=const {o / d1:.2f}" if d1 else ""
        parts.append(f"{cores} core(s) ours {o / 1e6:,.0f} M/s vs DPDK {d0 / 1e6:,.0f} M/s = {o / d0:.2f}{extra}")
    goals.append("GOAL pool: cache 512 bulk 32 ops/s, ratio ours/DPDK (>= 1 passes): "
                 + "; ".join(parts) + f" -> {verdict(ok)}")

print()
for g in goals:
    print(g)
PY
