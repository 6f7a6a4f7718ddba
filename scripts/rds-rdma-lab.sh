#!/bin/bash
# rds-rdma-lab.sh: RDS's RDMA (RDS_GET_MR, RDS_CMSG_RDMA_DEST, RDS_CMSG_RDMA_ARGS) over the verbs
# provider on Soft-RoCE, inside the kernel-peers lab VM (as root):
#
#   flock /work/notes/lab.lock nice -n 19 /work/shared/tools/kernel-peers/lab --timeout 1500 -- \
#     bash scripts/rds-rdma-lab.sh [--quick]
#
# Build on the host first (the VM has no cargo; it runs the host's binary, same Debian 12 glibc):
#   nice -n 10 cargo build --release -p perf --bin dp-perf --features verbs
#
# One Soft-RoCE wire (scripts/kernel-lab/rxe-wire.sh: 10.78.0.1 on rxw0a <-> 10.78.0.2 on rxw0b). Each check
# runs `dp-perf rds-stress --provider verbs` with a passive process on 10.78.0.2 and an active one on
# 10.78.0.1: --rdma one way (the payload by RDMA WRITE, -d operations in flight, each notified), --rdma with
# acks, and request/ack without --rdma for the ratio (a one-way rate without RDMA is only known to the
# passive process). A check passes when the active side reports a
# rate above 0 (an RDMA failure ends its run with the RDS_RDMA status). Qemu TCG is slow: compare the two
# runs of one VM session, never absolute numbers.
set -uo pipefail

quick=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "rds-rdma-lab.sh: unknown option $a (--quick)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")/.." && pwd)
perf="$here/target/release/dp-perf"
[ -x "$perf" ] || { echo "rds-rdma-lab: $perf missing: build it on the host first (--features verbs)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "rds-rdma-lab: run it inside the lab VM (root)" >&2; exit 2; }
# The kernel's RDS-IB (rds_rdma) listens on RDMA CM 0.0.0.0:18634, where our nodes listen: unload it.
modprobe -r rds_rdma 2>/dev/null
if lsmod | grep -q '^rds_rdma'; then
  echo "rds-rdma-lab: rds_rdma is loaded and holds RDMA CM port 18634; unload it first" >&2; exit 2
fi
bash "$here/scripts/kernel-lab/rxe-wire.sh" 1 || { echo "rds-rdma-lab: rxe-wire.sh failed" >&2; exit 2; }

secs=3; [ $quick = 1 ] && secs=1
pass=0 fail=0
rows=()
tmp=$(mktemp -d)
ppid_=""
cleanup() {
  [ -n "$ppid_" ] && kill "$ppid_" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# One run: NAME, then rds-stress options for both sides.
run() {
  local name=$1; shift
  local common=(rds-stress --provider verbs -T "$secs" "$@")
  "$perf" "${common[@]}" --device rxw0b -r 10.78.0.2 >"$tmp/passive" 2>&1 &
  ppid_=$!
  sleep 1
  if timeout $((secs + 60)) "$perf" "${common[@]}" --device rxw0a -r 10.78.0.1 -s 10.78.0.2 --json \
      >"$tmp/out" 2>"$tmp/err"; then
    local line; line=$(tail -n 1 "$tmp/out")
    local rate; rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["rds_stress"]["msgs_per_sec"])' "$line" 2>/dev/null || echo 0)
    local gbps; gbps=$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["rds_stress"]["gbps"], 3))' "$line" 2>/dev/null || echo 0)
    if python3 -c "import sys; sys.exit(0 if float('$rate') > 0 else 1)"; then
      pass=$((pass + 1)); rows+=("$(printf '%-40s PASS  %s msgs/s, %s Gb/s' "$name" "$rate" "$gbps")")
    else
      fail=$((fail + 1)); rows+=("$(printf '%-40s FAIL  %s' "$name" "$line")")
    fi
  else
    fail=$((fail + 1)); rows+=("$(printf '%-40s FAIL  %s' "$name" "$(tail -n 2 "$tmp/err" | tr '\n' ' ')")")
  fi
  kill "$ppid_" 2>/dev/null; wait "$ppid_" 2>/dev/null; ppid_=""
}

run "rdma one way, 64 KiB, depth 8" -q 64K -o -d 8 --rdma
run "rdma request/ack, 64 KiB, depth 8" -q 64K -a 16 -d 8 --rdma
# Without RDMA only request/ack is measured by the active process (one way, only the passive one knows).
run "no rdma request/ack, 64 KiB, depth 8" -q 64K -a 16 -d 8

printf '%s\n' "${rows[@]}"
echo "rds-rdma-lab: $pass passed, $fail failed"
[ "$fail" = 0 ]
