#!/usr/bin/env bash
# The RTRS goals of issue 15, measured in one run with dp-perf over shm (benchmarks, not
# tests): 4 KiB READ IOPS at iodepth 128 on one client lcore (goal 1.5 M); the iodepth-1
# 4 KiB READ p50 against the cache-line hand-off of the same run (goal <= 4x); two paths
# round-robin against one path (goal >= 1.6x; on 2 CPUs both paths share one client lcore
# and one server lcore, so this shows the multipath overhead, not the scaling).
#
#   scripts/rtrs-goals.sh [SECONDS] [busy|hybrid]     (default 5 s, busy: dedicated CPUs)
#
# Prints the load average and the hand-off before and after, every dp-perf JSON line, and
# the ratios. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
poll=${2:-busy}
nice -n 10 cargo build --release --quiet -p perf
b=target/release/dp-perf
handoff() { "$b" limit --quick --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["limit"]["cacheline_oneway_ns"])'; }
run() { "$b" rtrs --pair --rw read --bs 4096 -T "$secs" --poll "$poll" --json "$@"; }
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
h0=$(handoff)
qd128=$(run --iodepth 128 --paths 1 --port 18600)
qd1=$(run --iodepth 1 --paths 1 --port 18610)
one=$(run --iodepth 128 --paths 1 --policy rr --port 18620)
two=$(run --iodepth 128 --paths 2 --policy rr --port 18630)
h1=$(handoff)
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'qd128 1 path: %s\nqd1   1 path: %s\nrr    1 path: %s\nrr   2 paths: %s\n' "$qd128" "$qd1" "$one" "$two"
python3 - "$h0" "$h1" "$qd128" "$qd1" "$one" "$two" <<'EOF'
import json, sys
h0, h1 = float(sys.argv[1]), float(sys.argv[2])
qd128, qd1, one, two = (json.loads(a)["rtrs"] for a in sys.argv[3:])
h = (h0 + h1) / 2
print(f"cache-line hand-off: {h0:.1f} ns before, {h1:.1f} ns after (mean {h:.1f})")
print(f"4 KiB READ, iodepth 128, one client lcore: {qd128['iops'] / 1e6:.3f} M IOPS (goal 1.5), failed {qd128['failed']}")
print(f"iodepth-1 4 KiB READ p50 {qd1['p50_ns']:.0f} ns = {qd1['p50_ns'] / h:.1f}x the hand-off (goal <= 4)")
print(f"two paths rr / one path: {two['iops'] / one['iops']:.2f}x (goal >= 1.6 with a lcore pair per path)")
EOF
