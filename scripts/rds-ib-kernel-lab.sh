#!/bin/bash
# rds-ib-kernel-lab.sh: our RDS over RDMA (the fabric transport on the verbs provider, RDS-IB's wire)
# against the Linux kernel's rds_rdma over Soft-RoCE, inside the kernel-peers lab VM (issue 14).
#
#   nice -n 10 cargo build --release -p perf --bin dp-perf --features verbs           # on the host
#   flock /work/notes/lab.lock nice -n 19 /work/shared/tools/kernel-peers/lab --timeout 1500 -- \
#       bash scripts/rds-ib-kernel-lab.sh [--quick] [--json]
#
# Root namespace (rxe serves no other), two Soft-RoCE wires from kernel-lab/rxe-wire.sh:
# 10.78.0.1 rxw0a <-> 10.78.0.2 rxw0b (ours against the kernel) and 10.78.1.1 <-> 10.78.1.2 (the kernel
# against itself, the reference of the ratios). The kernel's rds_rdma listens on RDMA CM 0.0.0.0:18634,
# so our node (10.78.0.2, device rxw0b) listens on 18635 and dials the kernel's 10.78.0.1:18634; the
# kernel then has the connection and sends on it. rds_rdma is reloaded before each case with our node,
# so no connection of an earlier case is left (after ours goes, the kernel redials 10.78.0.2:18634 and
# its own listener answers, see "kernel dials first" below).
#
# Cases:
#   echo          dp-perf rds-echo (ours) <-> kernel-lab/rds_echo_peer.py (an AF_RDS socket, transport
#                 ib): messages of 0 B to 1 MiB, each checked byte for byte by the kernel's side and again
#                 when its echo comes back to ours: once each, in order. RoCE capture of w0a decoded into
#                 target/rds-ib-kernel-lab/echo.txt.
#   cm-private    from that capture: our REQ and the kernel's REP carry rds_ib_connect_private,
#                 protocol 3.1, addresses of the two sides.
#   stress-*      dp-perf rds-stress request/ack, ours (active) -> kernel (--kernel --kernel-transport ib,
#                 passive): 64 B msgs/s and 64 KiB bandwidth; kk-* the same between two kernel sockets on
#                 wire 1. ROUNDS rounds (default 3, --quick 1), ours and the kernel's interleaved; the
#                 ratios ours/kernel are the medians of the rounds' (same VM run).
#   redial        (shown, not counted) ours again without reloading rds_rdma: the kernel's connection is then
#                 up with itself (it redialled 10.78.0.2 when ours went), so our request meets the duel
#                 described at the case; kernel counters from kernel-lab/rds_info.py.
#   kernel-first  (shown, not counted) the kernel sends first to 10.78.0.2: its connect reaches its own
#                 listener (0.0.0.0:18634), which answers; our node cannot listen on 18634 beside it.
#
# Logs, captures and the kernel log land in target/rds-ib-kernel-lab/. Prints a table and ends with
# `rds-ib-kernel-lab: N passed, M failed`; --json prints {"rds_ib_kernel":{"msgs_ratio":F,"bw_ratio":F}}
# (ours / kernel) before that line.
set -uo pipefail

quick=0 json=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --json) json=1 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "rds-ib-kernel-lab.sh: unknown option $a (--quick, --json)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
here=$root/scripts/kernel-lab
perf=${DP_PERF:-$root/target/release/dp-perf}
log=$root/target/rds-ib-kernel-lab
[ -x "$perf" ] || { echo "rds-ib-kernel-lab: $perf missing: build it on the host (cargo build --release -p perf --bin dp-perf --features verbs)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "rds-ib-kernel-lab: run it inside the lab VM (root)" >&2; exit 2; }
mkdir -p "$log"
secs=3; count=56
[ $quick = 1 ] && { secs=1; count=14; }
sizes=0,1,47,48,100,4095,4096,4097,8192,12289,65535,65536,262144,1048576
pass=0 fail=0 rows=() info=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "${dmesg_pid:-}" ] && kill "$dmesg_pid" 2>/dev/null
}
trap cleanup EXIT

# What rds_ib_conn_error logs about a peer's frames or its queue pair (bad checksum, no header, fragment
# mismatch, an error completion): a case fails if the kernel logged any of it while it ran.
complaints_seen=0
complaints() { grep -E "corrupted header|include a header|header mismatch|had status|ib_post_send to" "$log/dmesg.txt" 2>/dev/null; }
result() {  # name, ok (0/1), detail
  local c n
  sleep 0.3
  c=$(complaints); n=$(printf '%s' "$c" | grep -c .)
  if [ "$n" -gt "$complaints_seen" ]; then
    set -- "$1" 1 "$3 | kernel: $(printf '%s\n' "$c" | tail -n $((n - complaints_seen)) | head -2 | tr '\n' ' ')"
  fi
  complaints_seen=$n
  if [ "$2" = 0 ]; then pass=$((pass + 1)); rows+=("$(printf '%-14s PASS  %s' "$1" "$3")")
  else fail=$((fail + 1)); rows+=("$(printf '%-14s FAIL  %s' "$1" "$3")"); fi
  echo "  [$([ "$2" = 0 ] && echo PASS || echo FAIL)] $1: $3"
}
num() { python3 -c 'import json,sys
try:
  d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(d["rds_stress"][sys.argv[2]])
except Exception: print(0)' "$1" "$2"; }
klog() { grep -E "rds|RDS|rxe" "$log/dmesg.txt" | tail -"${1:-3}" | tr '\n' ' '; }
reload() {  # a fresh rds_rdma: no connection left from an earlier case
  modprobe -r rds_rdma 2>/dev/null
  modprobe rds_rdma || { echo "rds-ib-kernel-lab: modprobe rds_rdma failed" >&2; exit 2; }
  sleep 0.5
}
capture() {  # dev name: start a RoCE capture into $log/name.pcap
  tcpdump --immediate-mode -i "$1" -U -s 0 -c 20000 -w "$log/$2.pcap" udp port 4791 2>"$log/$2.tcpdump" &
  cap_pid=$!; pids+=("$cap_pid")
  for _ in $(seq 50); do grep -q listening "$log/$2.tcpdump" 2>/dev/null && break; sleep 0.1; done
}
decode() {  # name
  sleep 0.5; kill "$cap_pid" 2>/dev/null; wait "$cap_pid" 2>/dev/null
  python3 "$here/roce_dump.py" "$log/$1.pcap" --proto rds --max 60 >"$log/$1.txt" 2>&1
}

bound() {  # FILE: wait until the echo peer writing FILE has bound its socket (its pattern takes seconds
  # under TCG, and a message that arrives before the bind is dropped, recv_drop_no_sock, yet acked)
  for _ in $(seq 300); do grep -q "peer: bound" "$1" 2>/dev/null && return; sleep 0.1; done
}

# ours: dp-perf with the fabric transport on rxw0b, listening on 18635, dialling the kernel's 18634.
ours=(--provider verbs --device rxw0b --ib-port 18635 --ib-peer-port 18634)

ulimit -l unlimited 2>/dev/null || true
sysctl -qw net.core.wmem_max=33554432 net.core.rmem_max=33554432
dmesg -C 2>/dev/null
dmesg -w >"$log/dmesg.txt" 2>&1 &
dmesg_pid=$!
bash "$here/rxe-wire.sh" 2 >"$log/wires.txt" 2>&1 || { cat "$log/wires.txt"; echo "rds-ib-kernel-lab: rxe-wire.sh failed" >&2; exit 2; }
modprobe rds_rdma || { echo "rds-ib-kernel-lab: modprobe rds_rdma failed: this kernel has no RDS-IB" >&2; exit 2; }
echo "kernel $(uname -r); $(tr '\n' ' ' <"$log/wires.txt")"
# The cache-line hand-off of this VM run (ratios are only comparable within one run).
handoff=$("$perf" limit --quick --json 2>/dev/null | python3 -c 'import json,sys
try: print("%.0f ns" % json.loads(sys.stdin.read().strip().splitlines()[-1])["limit"]["cacheline_oneway_ns"])
except Exception: print("unknown")')

# ---- echo: byte-exact, both ways ----
reload
capture w0a echo
python3 "$here/rds_echo_peer.py" 10.78.0.1 5001 "$count" "$sizes" --timeout 120 >"$log/echo.peer" 2>&1 &
peer=$!; pids+=("$peer")
bound "$log/echo.peer"
timeout 150 "$perf" rds-echo "${ours[@]}" -r 10.78.0.2 -s 10.78.0.1 -c "$count" --sizes "$sizes" -T 100 \
  >"$log/echo.ours" 2>&1
orc=$?
wait "$peer"; prc=$?
decode echo
if [ $orc = 0 ] && [ $prc = 0 ]; then
  result echo 0 "$count msgs of 0 B..1 MiB ours->kernel->ours: $(grep -o 'peer: OK.*' "$log/echo.peer" | cut -c7-60)...; ours: $(head -1 "$log/echo.ours" | cut -c11-80)"
else
  result echo 1 "ours rc $orc: $(tail -c 300 "$log/echo.ours" | tr '\n' ' ') | kernel side rc $prc: $(tail -2 "$log/echo.peer" | tr '\n' ' ') | dmesg: $(klog)"
fi
req=$(grep -A12 " REQ" "$log/echo.txt" | grep -m1 "rds_ib_connect_private" | sed 's/^ *//')
rep=$(grep -A12 " REP" "$log/echo.txt" | grep -m1 "rds_ib_connect_private" | sed 's/^ *//')
if [[ $req == *"10.78.0.2 -> 10.78.0.1, protocol 3.1"* ]] && [[ $rep == *"10.78.0.1 -> 10.78.0.2, protocol 3.1"* ]]; then
  result cm-private 0 "REQ (ours): ${req#rds_ib_connect_private: } | REP (kernel): ${rep#rds_ib_connect_private: }"
else
  result cm-private 1 "REQ: ${req:-none} | REP: ${rep:-none} (see $log/echo.txt)"
fi

# ---- ours again, rds_rdma not reloaded (shown, not counted) ----
# When our node went away the kernel redialled 10.78.0.2 and its own listener answered, so the kernel's
# connection <10.78.0.1,10.78.0.2> is up with itself. Our new dial meets it: rds_ib_cm_handle_connect drops
# an UP connection as stale and rejects the request, then redials itself at once (backoff reset by its
# last success): a duel in which each of our attempts costs the kernel its connection.
python3 "$here/rds_info.py" ib_listen_closed_stale ib_connect_raced conn_reset >"$log/redial.before" 2>&1
capture w0a redial
python3 "$here/rds_echo_peer.py" 10.78.0.1 5003 4 0,1,4097,65536 --timeout 30 >"$log/redial.peer" 2>&1 &
peer=$!; pids+=("$peer")
bound "$log/redial.peer"
timeout 40 "$perf" rds-echo "${ours[@]}" -r 10.78.0.2 -s 10.78.0.1 -p 5003 --peer-port 5003 -c 4 --sizes 0,1,4097,65536 -T 20 \
  >"$log/redial.ours" 2>&1
rrc=$?
wait "$peer"
decode redial
python3 "$here/rds_info.py" ib_listen_closed_stale ib_connect_raced conn_reset >"$log/redial.after" 2>&1
info+=("redial (rds_rdma kept): ours $([ $rrc = 0 ] && echo "got through" || echo "failed: $(cut -c 20-200 "$log/redial.ours" | tr '\n' ' ')"); CM on w0a: $(grep -c ' REQ  10.78.0.2' "$log/redial.txt") REQ from ours, $(grep -c ' REJ' "$log/redial.txt") REJ, $(grep -c ' REQ  10.78.0.1' "$log/redial.txt") REQ from the kernel to itself; kernel counters before: $(cat "$log/redial.before"), after: $(cat "$log/redial.after")")

complaints_seen=$(complaints | grep -c .)   # the duel's own error completions count against no case

# ---- rds-stress: ours (active, 10.78.0.2) -> kernel (passive, 10.78.0.1); kernel -> kernel on wire 1 ----
stress() {  # name pkind(kernel) akind(ours|kernel) paddr aaddr load...
  local name=$1 akind=$2 paddr=$3 aaddr=$4; shift 4
  local aopt=("${ours[@]}")
  [ "$akind" = kernel ] && aopt=(--kernel --kernel-transport ib)
  reload
  "$perf" rds-stress --kernel --kernel-transport ib -r "$paddr" -T "$secs" "$@" >"$log/$name.passive" 2>&1 &
  local ppid=$!; pids+=("$ppid")
  sleep 1
  timeout $((secs + 60)) "$perf" rds-stress "${aopt[@]}" -r "$aaddr" -s "$paddr" -T "$secs" "$@" --json \
    >"$log/$name.json" 2>"$log/$name.err"
  local rc=$?
  kill "$ppid" 2>/dev/null; wait "$ppid" 2>/dev/null
  return $rc
}
check() {  # name what akind paddr aaddr load...
  local name=$1 what=$2; shift 2
  if stress "$name" "$@" && python3 -c "import sys; sys.exit(0 if float('$(num "$log/$name.json" msgs_per_sec)') > 0 else 1)"; then
    result "$name" 0 "$what: $(num "$log/$name.json" msgs_per_sec | cut -c1-9) msgs/s, $(num "$log/$name.json" gbps | cut -c1-6) Gb/s"
  else
    result "$name" 1 "$what: $(tail -c 300 "$log/$name.err" | tr '\n' ' ') | dmesg: $(klog)"
  fi
}
# Rounds of the four, ours and the kernel's interleaved, so that the VM's drift (TCG on a host shared with
# builds) hits both alike; the ratios are the medians of the rounds' ratios.
rounds=${ROUNDS:-3}; [ $quick = 1 ] && rounds=${ROUNDS:-1}
ratio_rows=()
for ((r = 1; r <= rounds; r++)); do
  sfx=""; [ "$rounds" -gt 1 ] && sfx="-$r"
  check "stress-64$sfx" "ours->kernel 64 B req/ack, 4 tasks x depth 16" ours 10.78.0.1 10.78.0.2 -q 64 -a 64 -t 4 -d 16
  check "kk-64$sfx" "kernel->kernel 64 B req/ack, 4 tasks x depth 16" kernel 10.78.1.1 10.78.1.2 -q 64 -a 64 -t 4 -d 16
  check "stress-64K$sfx" "ours->kernel 64 KiB req, 16 B ack, depth 16" ours 10.78.0.1 10.78.0.2 -q 64K -a 16 -d 16
  check "kk-64K$sfx" "kernel->kernel 64 KiB req, 16 B ack, depth 16" kernel 10.78.1.1 10.78.1.2 -q 64K -a 16 -d 16
  ratio_rows+=("$(num "$log/stress-64$sfx.json" msgs_per_sec) $(num "$log/kk-64$sfx.json" msgs_per_sec) $(num "$log/stress-64K$sfx.json" gbps) $(num "$log/kk-64K$sfx.json" gbps)")
done

# ---- the kernel dials first (shown, not counted) ----
reload
capture w0a kfirst
python3 - <<'EOF' >"$log/kfirst.send" 2>&1
import socket
s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
s.setsockopt(276, 8, 0)
s.bind(("10.78.0.1", 5002))
s.sendto(b"kernel first", ("10.78.0.2", 5002))
print("sent 12 bytes 10.78.0.1:5002 -> 10.78.0.2:5002")
EOF
sleep 2
timeout 20 "$perf" rds-echo --provider verbs --device rxw0b -r 10.78.0.2 -s 10.78.0.1 -c 1 -T 5 >"$log/kfirst.ours" 2>&1
decode kfirst
kreq=$(grep -A12 " REQ" "$log/kfirst.txt" | grep -m1 "rds_ib_connect_private" | sed 's/^ *//')
krep=$(grep -c " REP" "$log/kfirst.txt")
info+=("kernel-first: the kernel's REQ (${kreq#rds_ib_connect_private: }) to 10.78.0.2:18634 was answered by $krep REP(s) from the kernel's own listener (0.0.0.0:18634); our node on 10.78.0.2 (rxw0b), which listens on 18635 in the cases above, cannot listen on 18634: $(grep -o 'RDS fabric transport.*' "$log/kfirst.ours" | head -1 | cut -c1-160)")

# ---- ratios ----
ratios=$(printf '%s\n' "${ratio_rows[@]}" | python3 -c '
import statistics, sys
m, b, lines = [], [], []
for k, l in enumerate(sys.stdin.read().split("\n")):
    if not l.strip():
        continue
    o1, k1, o2, k2 = map(float, l.split())
    m.append(o1 / k1 if k1 else 0.0)
    b.append(o2 / k2 if k2 else 0.0)
    lines.append("round %d: 64 B %.0f vs %.0f msgs/s = %.2fx; 64 KiB %.4f vs %.4f Gb/s = %.2fx" % (k + 1, o1, k1, m[-1], o2, k2, b[-1]))
print("%.2f %.2f" % (statistics.median(m), statistics.median(b)))
print("\n".join(lines))')
medians=$(head -1 <<<"$ratios")

echo
printf '%-14s %-5s %s\n' "case" "" "detail"
for r in "${rows[@]}"; do echo "$r"; done
for r in "${info[@]}"; do echo "(shown) $r"; done
echo "cache-line hand-off of this VM run (dp-perf limit): $handoff"
tail -n +2 <<<"$ratios"
echo "ours vs kernel RDS-IB (same VM run, median of $rounds round(s)): 64 B req/ack ${medians% *}x; 64 KiB ${medians#* }x"
if [ $json = 1 ]; then
  echo "{\"rds_ib_kernel\":{\"msgs_ratio\":${medians% *},\"bw_ratio\":${medians#* }}}"
fi
echo "rds-ib-kernel-lab: $pass passed, $fail failed"
[ $fail = 0 ]
