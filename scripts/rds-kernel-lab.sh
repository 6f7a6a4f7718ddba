#!/bin/bash
# rds-kernel-lab.sh: our RDS-TCP against the Linux kernel's RDS-TCP, inside the kernel-peers lab VM.
#
#   nice -n 19 /work/shared/tools/kernel-peers/lab -- bash scripts/rds-kernel-lab.sh [--quick] [--json]
#
# Build on the host first (the VM has no cargo; it runs the host's binary, same Debian 12 glibc):
#   nice -n 10 cargo build --release -p perf --bin dp-perf
#
# Set-up (a) of kernel-peers/README.md: namespaces kp-kernel (the kernel's AF_RDS sockets, through
# `dp-perf rds-stress --kernel`) and kp-user (our RDS-TCP node, `dp-perf rds-stress --transport tcp`,
# listening on 26385 behind the nftables redirect of 16385 and dialling the kernel's 16385), from
# kernel-peers/rds-netns.sh. Each check runs rds-stress's request/ack load between the two: requests one
# way, acks the other, so every check carries messages both ways between our RDS and the kernel's.
# rds-stress's load is sequenced by the harness (each ack answers one request); payload bytes are not
# compared here (tests/rds_tcp.rs does that between our nodes).
#
# Then, for the ratios, the same load between two kernel namespaces (kernel RDS-TCP against itself) and
# ours (active) against the kernel (passive), 64 B req/ack msgs/s and 64 KiB request bandwidth (req/ack,
# -a 16: a one-way rate is only known to the passive process), same VM run.
#
# Prints a pass/fail table and ends with `rds-kernel-lab: N passed, M failed`; --json also prints
# {"rds_kernel":{"msgs_ratio":F,"bw_ratio":F}} (ours/kernel) before that line.
set -uo pipefail

quick=0 json=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --json) json=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "rds-kernel-lab.sh: unknown option $a (--quick, --json)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")/.." && pwd)
perf="$here/target/release/dp-perf"
kp="${KERNEL_PEERS:-$here/scripts}"   # rds-netns.sh, copied from kernel-peers (the VM sees only this checkout)
[ -x "$perf" ] || { echo "rds-kernel-lab: $perf missing: build it on the host first (cargo build --release -p perf --bin dp-perf)" >&2; exit 2; }
[ -f "$kp/rds-netns.sh" ] || { echo "rds-kernel-lab: $kp/rds-netns.sh not found (set KERNEL_PEERS)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "rds-kernel-lab: run it inside the lab VM (root)" >&2; exit 2; }
modprobe rds_tcp || { echo "rds-kernel-lab: modprobe rds_tcp failed: this kernel has no RDS-TCP" >&2; exit 2; }

secs=3; [ $quick = 1 ] && secs=1
pass=0 fail=0
rows=()
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  bash "$kp/rds-netns.sh" --down >/dev/null 2>&1
  ip netns del kk-a 2>/dev/null; ip netns del kk-b 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

result() {  # name, ok (0/1), detail
  if [ "$2" = 0 ]; then pass=$((pass + 1)); rows+=("$(printf '%-44s PASS  %s' "$1" "$3")")
  else fail=$((fail + 1)); rows+=("$(printf '%-44s FAIL  %s' "$1" "$3")"); fi
}

# msgs/s from an rds-stress --json output file (0 if none).
rate() { python3 -c 'import json,sys
try:
  d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(d["rds_stress"]["msgs_per_sec"])
except Exception: print(0)' "$1"; }
gbps() { python3 -c 'import json,sys
try:
  d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(d["rds_stress"]["gbps"])
except Exception: print(0)' "$1"; }

# One rds-stress run: passive in namespace $1 (kernel or ours), active in $2; $3/$4 = passive/active
# flavour (kernel|ours), $5 = passive addr, $6 = active addr, rest = load options. Output file: $tmp/out.
stress() {
  local pns=$1 ans=$2 pkind=$3 akind=$4 paddr=$5 aaddr=$6; shift 6
  local popt aopt
  case $pkind in kernel) popt="--kernel" ;; ours) popt="--transport tcp --tcp-port 26385 --tcp-peer-port 16385" ;; esac
  case $akind in kernel) aopt="--kernel" ;; ours) aopt="--transport tcp --tcp-port 26385 --tcp-peer-port 16385" ;; esac
  ip netns exec "$pns" "$perf" rds-stress $popt -r "$paddr" -T "$secs" "$@" >"$tmp/passive" 2>&1 &
  local ppid=$!; pids+=("$ppid")
  sleep 1
  timeout $((secs + 40)) ip netns exec "$ans" "$perf" rds-stress $aopt -r "$aaddr" -s "$paddr" -T "$secs" "$@" --json >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  kill "$ppid" 2>/dev/null; wait "$ppid" 2>/dev/null
  return $rc
}

check() {  # name, then stress args
  local name=$1; shift
  if stress "$@" && [ "$(python3 -c "print(float('$(rate "$tmp/out")') > 0)")" = True ]; then
    result "$name" 0 "$(rate "$tmp/out" | cut -c1-10) msgs/s"
  else
    result "$name" 1 "$(tail -c 300 "$tmp/err" | tr '\n' ' ')"
  fi
}

# ---- ours (smaller address, dials) <-> kernel ----
eval "$(bash "$kp/rds-netns.sh" --user smaller)"
for q in 0 64 4096 65536 1M; do
  check "ours(smaller)->kernel req $q, ack 64" "$KP_KERNEL_NS" "$KP_USER_NS" kernel ours "$KP_KERNEL_ADDR" "$KP_USER_ADDR" -q "$q" -a 64 -d 4
done
check "kernel->ours(smaller) req 64K, ack 64" "$KP_USER_NS" "$KP_KERNEL_NS" ours kernel "$KP_USER_ADDR" "$KP_KERNEL_ADDR" -q 64K -a 64 -d 4
stress "$KP_KERNEL_NS" "$KP_USER_NS" kernel ours "$KP_KERNEL_ADDR" "$KP_USER_ADDR" -q 64 -a 64 -t 4 -d 16; ours_msgs=$(rate "$tmp/out")
stress "$KP_KERNEL_NS" "$KP_USER_NS" kernel ours "$KP_KERNEL_ADDR" "$KP_USER_ADDR" -q 64K -a 16 -d 16; ours_bw=$(gbps "$tmp/out")
bash "$kp/rds-netns.sh" --down >/dev/null 2>&1

# ---- kernel dials us: ours is the larger address ----
eval "$(bash "$kp/rds-netns.sh" --user larger)"
check "kernel(smaller)->ours req 4096, ack 64" "$KP_USER_NS" "$KP_KERNEL_NS" ours kernel "$KP_USER_ADDR" "$KP_KERNEL_ADDR" -q 4096 -a 64 -d 4
check "ours(larger)->kernel req 1M, ack 64" "$KP_KERNEL_NS" "$KP_USER_NS" kernel ours "$KP_KERNEL_ADDR" "$KP_USER_ADDR" -q 1M -a 64 -d 2
bash "$kp/rds-netns.sh" --down >/dev/null 2>&1

# ---- kernel <-> kernel (the reference of the ratios) ----
for ns in kk-a kk-b; do ip netns del $ns 2>/dev/null; ip netns add $ns; ip -n $ns link set lo up; done
ip link add kka netns kk-a type veth peer name kkb netns kk-b
ip -n kk-a addr add 10.98.0.1/24 dev kka; ip -n kk-b addr add 10.98.0.2/24 dev kkb
ip -n kk-a link set kka up; ip -n kk-b link set kkb up; sleep 0.5
stress kk-b kk-a kernel kernel 10.98.0.2 10.98.0.1 -q 64 -a 64 -t 4 -d 16; rc=$?; k_msgs=$(rate "$tmp/out")
if python3 -c "import sys; sys.exit(0 if float('$k_msgs') > 0 else 1)"; then
  result "kernel<->kernel 64 B req/ack (reference)" 0 "$k_msgs msgs/s"
else
  result "kernel<->kernel 64 B req/ack (reference)" 1 "rc $rc: $(tail -c 300 "$tmp/err" | tr '\n' ' ')"
fi
stress kk-b kk-a kernel kernel 10.98.0.2 10.98.0.1 -q 64K -a 16 -d 16; rc=$?; k_bw=$(gbps "$tmp/out")
if python3 -c "import sys; sys.exit(0 if float('$k_bw') > 0 else 1)"; then
  result "kernel<->kernel 64 KiB req/ack (reference)" 0 "$k_bw Gb/s"
else
  result "kernel<->kernel 64 KiB req/ack (reference)" 1 "rc $rc: $(tail -c 300 "$tmp/err" | tr '\n' ' ')"
fi

echo
printf '%-44s %-5s %s\n' "check" "" "detail"
for r in "${rows[@]}"; do echo "$r"; done
echo "ours vs kernel RDS-TCP (same VM run): 64 B req/ack: ours $ours_msgs msgs/s, kernel $k_msgs; 64 KiB req/ack: ours $ours_bw Gb/s, kernel $k_bw"
if [ $json = 1 ]; then
  python3 -c "import json; k1=float('$k_msgs'); k2=float('$k_bw'); print(json.dumps({'rds_kernel': {'msgs_ratio': float('$ours_msgs')/k1 if k1 else 0.0, 'bw_ratio': float('$ours_bw')/k2 if k2 else 0.0}}))"
fi
echo "rds-kernel-lab: $pass passed, $fail failed"
[ $fail = 0 ]
