#!/usr/bin/env bash
# Issue 17's numbers in one command, every figure a ratio taken in this run:
#
#   1. iperf through librdmacm's librspreload.so on the dataplane rsockets against kernel
#      TCP: RUNS runs of each, interleaved; medians, the spread of each side's runs, and
#      the ratio of the medians (goal: >= 2x, runs within 20% of each other);
#   2. sockperf ping-pong --tcp, 64 bytes, through the preload with DP_RSOCKET_SENDTO=linux
#      against kernel TCP: the p50 of each and their ratio (goal: >= 20x lower);
#   3. dp-perf rstream --pair -S 64 -C 1 -I ITERS with --sockets 1 and --sockets SOCKETS:
#      the measured connection's one-way p50 of each, their ratio (goal: <= 1.2x), and the
#      memory per idle connection;
#   4. the host's cache-line hand-off (dp-perf limit) and the load average before and
#      after, which say how far the run's CPUs were from idle.
#
#   scripts/preload-compare.sh
#
# Environment: RSPRELOAD (the preload: librdmacm1's librspreload.so by default; `dp` for
# this project's own, apps/rsocket-preload, built here), RUNS (default 3), SECS (iperf and sockperf seconds per run, default 5),
# SOCKETS (default 1024), ITERS (default 50000), BUF (dp-perf -B for the scale runs,
# default 16384: each connection's rings are twice this), PORT (first port, default derived
# from the pid). Needs iperf, sockperf (apt-get install iperf sockperf; scripts/setup.sh)
# and librdmacm1's librspreload.so. Builds what it runs (release).
#
# Everything busy-polls on two CPUs: on a shared or loaded host the absolute numbers move
# from run to run; compare the ratios, and retake them on idle CPUs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${RUNS:-3}
secs=${SECS:-5}
sockets=${SOCKETS:-1024}
iters=${ITERS:-50000}
buf=${BUF:-16384}
port=${PORT:-$((30000 + ($$ % 1000) * 20))}
arch=$(uname -m)
preload=${RSPRELOAD:-/usr/lib/$arch-linux-gnu/rsocket/librspreload.so}
own_preload=0
if [ "$preload" = dp ]; then own_preload=1; fi

for p in iperf sockperf; do
    command -v "$p" >/dev/null || { echo "$0: $p not found (apt-get install $p)" >&2; exit 1; }
done
[ "$own_preload" = 1 ] || [ -f "$preload" ] ||
    { echo "$0: $preload not found (apt-get install librdmacm1, or RSPRELOAD=dp)" >&2; exit 1; }

(cd "$root" && cargo build --quiet --release -p dp-rsocket-c -p perf -p dp-rspreload)
target=$(cd "$root" && cargo metadata --format-version 1 --no-deps --offline 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
target=${target:-$root/target}
export DP_RSOCKET_LIB=$target/release/librdmacm.so
dpperf=$target/release/dp-perf
if [ "$own_preload" = 1 ]; then preload=$target/release/libdp_rspreload.so; fi
echo "preload: $preload"

work=$(mktemp -d)
server=
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
export DP_SHM_DIR=$work/shm

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "load average at start: $(load)  (CPUs: $(nproc))"
echo "cache-line hand-off of this run:"
"$dpperf" limit 2>/dev/null | grep -iE "hand-?off|one-way" | head -3 || true

# serve MODE PORT CMD...: starts a server (kernel or through the preload) in the background.
serve() {
    local mode=$1 p=$2; shift 2
    if [ "$mode" = rs ]; then
        env LD_PRELOAD="$preload" DP_RSOCKET_SENDTO=linux "$root/scripts/with-rsocket" "$@" \
            >"$work/server.log" 2>&1 &
    else
        "$@" >"$work/server.log" 2>&1 &
    fi
    server=$!
    for _ in $(seq 100); do
        # librspreload listens on an rsocket (a file in the shm rendezvous directory);
        # dp-rspreload on a kernel socket (its connections move to rsockets once accepted).
        if [ "$mode" = rs ] && ls "$DP_SHM_DIR"/listen/*_"$p".sock >/dev/null 2>&1; then return; fi
        if [ "$mode" = rs ] && [ "$own_preload" = 1 ] &&
            ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then return; fi
        if [ "$mode" = tcp ] && ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then return; fi
        sleep 0.05
    done
}
stop() { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; server=; }
client() { # MODE CMD...
    local mode=$1; shift
    if [ "$mode" = rs ]; then
        timeout 120 env LD_PRELOAD="$preload" DP_RSOCKET_SENDTO=linux "$root/scripts/with-rsocket" "$@"
    else
        timeout 120 "$@"
    fi
}

# The bandwidth iperf prints, in Gbit/s.
iperf_gbps() {
    awk '/bits\/sec/ { v = $(NF-1); u = $NF }
         END { if (u ~ /^G/) print v; else if (u ~ /^M/) print v / 1000; else if (u ~ /^K/) print v / 1e6; else print 0 }'
}
# median and spread (max/min) of numbers on stdin: "MEDIAN SPREAD".
stats() { sort -g | awk '{ a[n++] = $1 } END { m = (n % 2) ? a[int(n/2)] : (a[n/2-1] + a[n/2]) / 2;
                                              printf "%.3f %.2f\n", m, (a[0] > 0) ? a[n-1] / a[0] : 0 }'; }

echo
echo "== 1. iperf, $runs runs of ${secs}s each way, interleaved"
: >"$work/iperf.tcp"; : >"$work/iperf.rs"
for i in $(seq "$runs"); do
    for mode in tcp rs; do
        off=0; [ "$mode" = rs ] && off=1
        p=$((port + i * 2 + off))
        serve "$mode" "$p" iperf -s -p "$p"
        g=$(client "$mode" iperf -c 127.0.0.1 -p "$p" -t "$secs" 2>&1 | iperf_gbps)
        stop
        echo "$g" >>"$work/iperf.$mode"
        echo "  run $i $mode: $g Gbit/s"
    done
done
read -r tm ts < <(stats <"$work/iperf.tcp")
read -r rm rsp < <(stats <"$work/iperf.rs")
echo "  kernel TCP median $tm Gbit/s (spread max/min ${ts}x); preload median $rm Gbit/s (spread ${rsp}x)"
echo "  ratio preload/TCP: $(awk -v a="$rm" -v b="$tm" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')x  (goal >= 2x, spread <= 1.2x)"

echo
echo "== 2. sockperf ping-pong --tcp, 64 B, ${secs}s each (preload: DP_RSOCKET_SENDTO=linux)"
for mode in tcp rs; do
    off=0; [ "$mode" = rs ] && off=1
    p=$((port + 10 + off))
    serve "$mode" "$p" sockperf sr --tcp -i 127.0.0.1 -p "$p"
    client "$mode" sockperf pp --tcp -i 127.0.0.1 -p "$p" -m 64 -t "$secs" --mps 100000 >"$work/sp.$mode" 2>&1 || true
    stop
    v=$(awk -F= '/percentile 50.000/ { gsub(/ /, "", $2); print $2 }' "$work/sp.$mode")
    echo "${v:-0}" >"$work/sp50.$mode"
    echo "  $mode p50: ${v:-?} us"
done
echo "  ratio TCP/preload p50: $(awk -v a="$(cat "$work/sp50.tcp")" -v b="$(cat "$work/sp50.rs")" \
    'BEGIN { printf "%.1f", (b > 0) ? a / b : 0 }')x lower  (goal >= 20x)"

echo
echo "== 3. dp-perf rstream --pair -S 64 -C 1 -I $iters -B $buf: 1 connection, then $sockets"
for n in 1 "$sockets"; do
    "$dpperf" rstream --pair --sockets "$n" -B "$buf" -S 64 -C 1 -I "$iters" 2>/dev/null \
        | tee "$work/scale.$n" | sed -n '/measured on/,$p'
    awk '/one-way per transfer/ { for (i = 1; i <= NF; i++) if ($i == "p50") print $(i+1) }' \
        "$work/scale.$n" >"$work/scale50.$n"
done
echo "  ratio p50 $sockets/1: $(awk -v a="$(cat "$work/scale50.$sockets")" -v b="$(cat "$work/scale50.1")" \
    'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')x  (goal <= 1.2x)"

echo
echo "load average at end: $(load)"
