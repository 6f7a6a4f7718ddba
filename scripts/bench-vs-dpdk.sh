#!/usr/bin/env bash
# Runs DPDK's rings and pools and dp-perf's on the same two cores, then prints the results
# side by side with ratios, the spread over repeated rounds, and the goals (PASS/FAIL).
#
#   scripts/bench-vs-dpdk.sh [--contended | --ring-only | --mempool-only] [--rounds N]
#                            [--quick] [--out DIR] [--dpdk-mempool-log FILE]
#
#   --contended   only the cases where two cores share one ring (about 8 min): the cache-less
#                 pool on two cores (Multi, RTS, HTS rings) and the two-core ring cases of
#                 every mode, DPDK and dp-perf alternated --rounds times. Take the final
#                 numbers with this on otherwise idle CPUs.
#   --rounds N    alternated rounds of the ring and contended comparisons (default 3, at least 3
#                 for a median with a spread; env ROUNDS, or RING_ROUNDS as before)
#   --quick       short passes on both sides (dp-perf --quick, small harness runs): checks that
#                 the machinery works in a minute or two; the numbers mean nothing
#
# Environment:
#   CPUS=0,1           the two CPUs (DPDK gets -l A,B; dp-perf gets --cpus A,B)
#   DPDK_TEST_BIN=...  dpdk-test binary (default: dpdk-test on PATH; the Debian packages dpdk
#                      and dpdk-dev are installed when missing and running as root)
#   DPDK_MEM_MB=512    memory for DPDK's EAL (-m)
#   SECONDS_PER_CASE=2 seconds per pool case in the contended rounds (both sides)
#   TWO_CORE_ELEMS     elements per two-core ring pass, both sides (default 67108864 = 2^26;
#                      smaller keeps a run on a loaded host short, at the cost of noise)
#   CARGO_TARGET_DIR   where the release dp-perf and the DPDK harness are built
#                      (default: <repo>/target)
#
# What runs (both cores must otherwise be idle; everything busy-polls):
#   ring (default and --ring-only), alternated ROUNDS times:            (~3 min per round)
#     dpdk-test ring_perf_autotest (SP/SC and MP/MC);
#     perf/dpdk/dpdk-ring-mempool ring --modes rts,hts: DPDK 22.11's autotest has no RTS or
#       HTS cases, so the harness runs its loops on RTS and HTS rings;
#     dp-perf ring --json (SP/SC, MP/MC, RTS, HTS).
#     Two-core passes are the autotest's length here (2^15 calls per side: dp-perf
#     --two-core-calls, the harness's --calls), so both sides see the host the same way.
#   mempool (default and --mempool-only):
#     dpdk-test mempool_perf_autotest, stopped once the compared cases are out (~40 min; it
#       runs every case for 5 s and cannot be narrowed; --dpdk-mempool-log FILE reuses the log
#       of an earlier run, which is then no longer "the same run"), then
#     dp-perf mempool --json --keep 128 --bulk 1,4,8,32 (~35 s).
#   contended (default and --contended), alternated ROUNDS times:       (~2.5 min per round)
#     dpdk-ring-mempool mempool --caches 0 --cores 2 --rings multi,rts,hts --bulks 1,4,8,32
#       (DPDK's pools with ops ring_mp_mc, ring_mt_rts, ring_mt_hts) and the same cases of
#       dp-perf mempool --ring-sync multi,rts,hts;
#     dpdk-ring-mempool ring --cores 2 (every mode) and dp-perf ring --cores 2.
#   Before and after: dp-perf limit, the cache-line hand-off between the two CPUs.
#   Within each ring and contended round, the same hand-off (dp-perf limit --quick) at every
#     boundary between the two sides' blocks. The host's hand-off moves between modes (35-75
#     and 200-215 ns on the 2-vCPU box, within minutes), and a round in which it changed
#     compares the sides in different modes: the report counts only rounds whose samples lie
#     within 2x of each other, lists the others, and marks a goal INCONCLUSIVE (never PASS)
#     when fewer than 3 rounds of its kind count.
#
# The harness (perf/dpdk/dpdk-ring-mempool.c, built here with cc and pkg-config libdpdk)
# runs DPDK's own rte_ring and rte_mempool with the loops of ring_perf_autotest and
# mempool_perf_autotest; see its header for what it does differently (longer two-core passes,
# medians of repeated passes, like dp-perf).
#
# Units and definitions (verified against DPDK 22.11's output and test_ring_perf.c):
#   ring, DPDK prints TSC cycles. single: per enqueue+dequeue of one element.
#     burst/bulk on one core: per enqueue+dequeue CALL PAIR (22.11 divides by iterations
#     only; later versions divide by elements too), so the script divides by the batch size.
#     two cores: per element, producer's and consumer's per-element times SUMMED; dp-perf
#     and the harness report the same sum. Cycles become ns with the TSC frequency DPDK logs
#     ("TSC frequency is ~N KHz", from --log-level=lib.eal:debug; the harness prints it).
#   mempool, rate_persec = objects got and returned per second, summed over cores, for
#     n_get_bulk = n_put_bulk = bulk, n_keep = 128. DPDK 22.11.x prints each equal-bulk case
#     twice: constant_n=0 (bulk size known only at run time, like dp-perf's) and
#     constant_n=1 (compile-time constant). Ratios use constant_n=0; the n=const column is
#     shown for reference. When DPDK prints cores=2 twice (2 cores and "all" cores on a
#     two-core run) the first is used.
#   Repeated cases are reported as the median over the rounds per side, with the range and the
#   spread ((max - min) / median); the ratio is of the two medians, and the range of the
#   per-round ratios is shown next to it.
#
# Memory: hugepages when at least DPDK_MEM_MB of them are free, else --no-huge. dp-perf's
# pools use hugepages automatically under the same condition.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CPUS=${CPUS:-0,1}
DPDK_MEM_MB=${DPDK_MEM_MB:-512}
RING_TIMEOUT=${RING_TIMEOUT:-900}
ROUNDS=${ROUNDS:-${RING_ROUNDS:-3}}
SECONDS_PER_CASE=${SECONDS_PER_CASE:-2}
MEMPOOL_TIMEOUT=${MEMPOOL_TIMEOUT:-3600}
DO_RING=1
DO_MEMPOOL=1
DO_CONTENDED=1
QUICK=0
OUT=""
DPDK_MEMPOOL_LOG=""

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --ring-only) DO_MEMPOOL=0 DO_CONTENDED=0 ;;
        --mempool-only) DO_RING=0 DO_CONTENDED=0 ;;
        --contended) DO_RING=0 DO_MEMPOOL=0 ;;
        --quick) QUICK=1 ;;
        --rounds)
            [ $# -ge 2 ] || usage
            ROUNDS=$2
            shift
            ;;
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
if ! [[ $ROUNDS =~ ^[0-9]+$ ]] || [ "$ROUNDS" -lt 1 ]; then
    echo "bench-vs-dpdk: --rounds must be a positive number, got '$ROUNDS'" >&2
    exit 2
fi
if [ "$ROUNDS" -lt 3 ]; then
    echo "bench-vs-dpdk: note: $ROUNDS round(s) give no meaningful median or spread; use at least 3" >&2
fi
if ! [[ $SECONDS_PER_CASE =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    echo "bench-vs-dpdk: SECONDS_PER_CASE must be a number of seconds, got '$SECONDS_PER_CASE'" >&2
    exit 2
fi

# Per-side options of the runs below; --quick shrinks them.
DP_RING_ARGS=()
HARNESS_RING_ARGS=()
if [ -n "${TWO_CORE_ELEMS:-}" ]; then
    if ! [[ $TWO_CORE_ELEMS =~ ^[0-9]+$ ]] || [ "$TWO_CORE_ELEMS" -lt 128 ]; then
        echo "bench-vs-dpdk: TWO_CORE_ELEMS must be a number of at least 128, got '$TWO_CORE_ELEMS'" >&2
        exit 2
    fi
    DP_RING_ARGS=(--two-core-elems "$TWO_CORE_ELEMS")
    HARNESS_RING_ARGS=(--elems "$TWO_CORE_ELEMS")
fi
# Against ring_perf_autotest (the ring rounds) the two-core passes are the autotest's own
# length, 2^15 calls per side (a few ms, so host preemption shows as little on our side as on
# DPDK's); the contended rounds keep the long passes on both sides.
AUTOTEST_CALLS=32768
DP_AUTOTEST_ARGS=(--two-core-calls "$AUTOTEST_CALLS")
HARNESS_AUTOTEST_ARGS=(--calls "$AUTOTEST_CALLS")
if [ -n "${TWO_CORE_ELEMS:-}" ]; then
    DP_AUTOTEST_ARGS=("${DP_RING_ARGS[@]}")
    HARNESS_AUTOTEST_ARGS=("${HARNESS_RING_ARGS[@]}")
fi
if [ "$QUICK" -eq 1 ]; then
    DP_RING_ARGS=(--quick)
    HARNESS_RING_ARGS=(--quick)
    DP_AUTOTEST_ARGS=(--quick)
    HARNESS_AUTOTEST_ARGS=(--quick)
    SECONDS_PER_CASE=0.05
fi

OUT=${OUT:-$(mktemp -d /tmp/bench-vs-dpdk.XXXXXX)}
mkdir -p "$OUT"
log() { printf '[bench-vs-dpdk %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- DPDK: dpdk-test and the harness ----------------------------------------------------------
DPDK_TEST_BIN=${DPDK_TEST_BIN:-$(command -v dpdk-test || true)}
if [ -z "$DPDK_TEST_BIN" ] || ! pkg-config --exists libdpdk 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
        log "dpdk-test or libdpdk missing; installing the Debian packages 'dpdk' and 'dpdk-dev'"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpdk dpdk-dev >&2
        DPDK_TEST_BIN=${DPDK_TEST_BIN:-$(command -v dpdk-test)}
    else
        echo "bench-vs-dpdk: dpdk-test or libdpdk (pkg-config) not found; install the 'dpdk' and 'dpdk-dev' packages (as root)" >&2
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

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
HARNESS=$TARGET_DIR/dpdk-ring-mempool
log "building the DPDK harness ($HARNESS)"
mkdir -p "$TARGET_DIR"
# shellcheck disable=SC2046 # pkg-config prints several words on purpose
cc -O3 -Wall -Wextra -o "$HARNESS" "$ROOT/perf/dpdk/dpdk-ring-mempool.c" \
    $(pkg-config --cflags libdpdk) -Wl,--no-as-needed $(pkg-config --libs libdpdk)

# Runs the harness: harness <json-out> <stderr-log> <command and options...>
harness() {
    local json=$1 err=$2
    shift 2
    if ! timeout --signal=INT --kill-after=10 "$RING_TIMEOUT" \
        "$HARNESS" "${EAL_ARGS[@]}" -- "$@" </dev/null >"$json" 2>"$err"; then
        echo "bench-vs-dpdk: the DPDK harness failed ($*); see $err" >&2
        tail -20 "$err" >&2
        exit 1
    fi
}

# --- dp-perf ---------------------------------------------------------------------------------
log "building dp-perf (release)"
(cd "$ROOT" && cargo build --release -q -p perf --bin dp-perf)
DP_PERF=$TARGET_DIR/release/dp-perf
# handoff FILE: appends the cache-line hand-off between the two CPUs (dp-perf limit --quick,
# ns, about 0.3 s) to FILE. Taken at every boundary of a round's blocks: the report counts a
# round only if the hand-off stayed in one mode through it (see bench_vs_dpdk_report.py).
handoff() {
    "$DP_PERF" --cpus "$CPUS" limit --quick --json 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["limit"]["cacheline_oneway_ns"])' \
            >>"$1" || true
}

log "dpdk-test: $DPDK_TEST_BIN (dpdk $DPDK_VERSION), EAL ${EAL_ARGS[*]}"
log "memory: $MEM_DESC; logs in $OUT; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
cut -d' ' -f1-3 /proc/loadavg >"$OUT/loadavg-before.txt"

# The host's cache-line hand-off latency between the two CPUs, before and after: on a VM it
# moves with the hypervisor's placement of the vCPUs (same core complex or not) and two-core
# numbers move with it, so the report prints it next to them.
"$DP_PERF" --cpus "$CPUS" limit --json --memcpy-mib 8 >"$OUT/limit-before.json"

# --- ring ------------------------------------------------------------------------------------
if [ "$DO_RING" -eq 1 ]; then
    # Alternate the sides ROUNDS times and compare medians: on a shared or virtualised host
    # the conditions drift within minutes, and a single DPDK-then-us pair measures the drift
    # as much as the rings.
    for round in $(seq 1 "$ROUNDS"); do
        handoff "$OUT/handoff-ring-$round.txt"
        log "ring round $round/$ROUNDS: DPDK ring_perf_autotest (timeout ${RING_TIMEOUT}s)"
        if ! dpdk_autotest ring_perf_autotest "$OUT/dpdk-ring-$round.log" "$RING_TIMEOUT" ||
            ! grep -q "Test OK" "$OUT/dpdk-ring-$round.log"; then
            echo "bench-vs-dpdk: ring_perf_autotest failed; see $OUT/dpdk-ring-$round.log" >&2
            tail -20 "$OUT/dpdk-ring-$round.log" >&2
            exit 1
        fi
        log "ring round $round/$ROUNDS: DPDK harness, RTS and HTS rings"
        harness "$OUT/dpdk-ring-modes-$round.json" "$OUT/dpdk-ring-modes-$round.log" \
            ring --modes rts,hts --cores 1,2 --batches 8,32 "${HARNESS_AUTOTEST_ARGS[@]}"
        handoff "$OUT/handoff-ring-$round.txt"
        log "ring round $round/$ROUNDS: dp-perf ring"
        "$DP_PERF" --cpus "$CPUS" ring --json "${DP_AUTOTEST_ARGS[@]}" >"$OUT/dp-ring-$round.json"
        handoff "$OUT/handoff-ring-$round.txt"
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

# --- contended -------------------------------------------------------------------------------
if [ "$DO_CONTENDED" -eq 1 ]; then
    for round in $(seq 1 "$ROUNDS"); do
        handoff "$OUT/handoff-contended-pool-$round.txt"
        log "contended round $round/$ROUNDS: DPDK pools without cache on two cores"
        harness "$OUT/dpdk-contended-pool-$round.json" "$OUT/dpdk-contended-pool-$round.log" \
            mempool --rings multi,rts,hts --caches 0 --cores 2 --bulks 1,4,8,32 --keep 128 \
            --seconds "$SECONDS_PER_CASE"
        handoff "$OUT/handoff-contended-pool-$round.txt"
        log "contended round $round/$ROUNDS: dp-perf pools without cache on two cores"
        "$DP_PERF" --cpus "$CPUS" mempool --json --cache 0 --cores 2 --bulk 1,4,8,32 \
            --keep 128 --ring-sync multi,rts,hts --seconds "$SECONDS_PER_CASE" \
            >"$OUT/dp-contended-pool-$round.json"
        handoff "$OUT/handoff-contended-pool-$round.txt"
        tail -n 1 "$OUT/handoff-contended-pool-$round.txt" >"$OUT/handoff-contended-ring-$round.txt"
        log "contended round $round/$ROUNDS: DPDK rings on two cores"
        harness "$OUT/dpdk-contended-ring-$round.json" "$OUT/dpdk-contended-ring-$round.log" \
            ring --modes spsc,mpmc,rts,hts --cores 2 --batches 8,32 "${HARNESS_RING_ARGS[@]}"
        handoff "$OUT/handoff-contended-ring-$round.txt"
        log "contended round $round/$ROUNDS: dp-perf rings on two cores"
        "$DP_PERF" --cpus "$CPUS" ring --json --cores 2 "${DP_RING_ARGS[@]}" \
            >"$OUT/dp-contended-ring-$round.json"
        handoff "$OUT/handoff-contended-ring-$round.txt"
    done
fi

"$DP_PERF" --cpus "$CPUS" limit --json --memcpy-mib 8 >"$OUT/limit-after.json"
cut -d' ' -f1-3 /proc/loadavg >"$OUT/loadavg-after.txt"

# --- report ----------------------------------------------------------------------------------
python3 "$ROOT/scripts/bench_vs_dpdk_report.py" "$OUT" "$DO_RING" "$DO_MEMPOOL" "$DO_CONTENDED" \
    "$DPDK_VERSION" "$MEM_DESC" "$CPUS" | tee "$OUT/report.txt"
