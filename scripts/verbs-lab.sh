#!/usr/bin/env bash
# The verbs provider's lab run, on one host with an RDMA device (real, or Soft-RoCE as in
# ../shared/tools/rxe-lab, whose VM has rxe0 on 10.77.0.1):
#
#   1. the provider conformance suite and the verbs-specific checks on the device;
#   2. dp-perf write-lat, write-bw, send-lat, read-lat, send-bw, read-bw with --provider verbs,
#      next to perftest's ib_write_bw / ib_write_lat on the same device;
#   3. rstream: librdmacm's own rstream against itself, dp-perf's rsocket rstream against
#      itself, and the two mixed both ways (our client with its server, its client with our
#      server), every run verifying data (-T v).
#
#   scripts/verbs-lab.sh BIN_DIR [DEVICE] [IP]
#   STEPS="conformance perf perftest rstream rstream-b" (the default: all of them)
#
# BIN_DIR holds dp-perf (built with --features verbs) and the test binaries
# verbs_conformance and verbs_hw (cargo test -p dp-verbs --features verbs --no-run). Under rxe-lab:
#   ../shared/tools/rxe-lab --timeout 3600 -- scripts/verbs-lab.sh target/lab
# Everything runs on one host, so "client" and "server" share the device and the CPUs:
# compare ratios between the tools, not absolute numbers.
set -uo pipefail
bin=${1:?usage: verbs-lab.sh BIN_DIR [DEVICE] [IP]}
dev=${2:-rxe0}
ip=${3:-10.77.0.1}
steps=" ${STEPS:-conformance perf perftest rstream rstream-b} "
want() { [[ $steps == *" $1 "* ]]; }
fails=0
step() { echo; echo "=== $*"; }
check() { # NAME CMD...: runs CMD, records a failure without stopping the lab
    local name=$1; shift
    if "$@"; then echo "--- $name: ok"; else echo "--- $name: FAILED ($?)"; fails=$((fails + 1)); fi
}
server_then_client() { # NAME 'SERVER CMD' 'CLIENT CMD'
    local name=$1 srv=$2 cli=$3
    bash -c "$srv" > "/tmp/lab-$name-server.log" 2>&1 &
    local pid=$!
    sleep 2
    if timeout 900 bash -c "$cli"; then
        wait "$pid"; local rc=$?
        echo "--- $name server:"; cat "/tmp/lab-$name-server.log"
        if [ "$rc" = 0 ]; then echo "--- $name: ok"; else echo "--- $name: server FAILED ($rc)"; fails=$((fails + 1)); fi
    else
        echo "--- $name: client FAILED"; fails=$((fails + 1))
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
        cat "/tmp/lab-$name-server.log"
    fi
}

step "device"
rdma link 2>/dev/null || true
ibv_devinfo -d "$dev" 2>/dev/null | grep -E "hca_id|state|active_mtu|link_layer" || true
ulimit -l unlimited 2>/dev/null || true

if want conformance; then
step "conformance suite on $dev"
check conformance env DP_TEST_DEVICE="$dev" DP_TEST_IP="$ip" "$bin"/verbs_conformance --test-threads=1
check verbs_hw env DP_TEST_DEVICE="$dev" DP_TEST_IP="$ip" "$bin"/verbs_hw --test-threads=1
fi

if want perf; then
step "dp-perf --provider verbs on $dev (one host: both ends share it)"
for t in write-lat send-lat read-lat; do
    check "dp-perf $t" "$bin"/dp-perf "$t" --provider verbs -d "$dev" --pair -s 64 -n 2000
done
for t in write-bw send-bw read-bw; do
    check "dp-perf $t" "$bin"/dp-perf "$t" --provider verbs -d "$dev" --pair -s 65536 -n 2000
done
fi

if want perftest; then
step "perftest on $dev for comparison"
server_then_client ib_write_bw "ib_write_bw -d $dev -R -s 65536 -n 2000" \
    "ib_write_bw -d $dev -R -s 65536 -n 2000 $ip"
server_then_client ib_write_lat "ib_write_lat -d $dev -R -s 64 -n 2000" \
    "ib_write_lat -d $dev -R -s 64 -n 2000 $ip"
fi

if want rstream; then
step "rstream: librdmacm against itself (reference)"
server_then_client rstream-ref "rstream -b $ip -T v" "rstream -s $ip -T v"
step "rstream: dp-perf rsocket over verbs against itself"
server_then_client rstream-ours "$bin/dp-perf rstream --server --provider verbs -d $dev -b $ip -T v" \
    "$bin/dp-perf rstream --client $ip --provider verbs -d $dev -T v"
step "rstream: our client, librdmacm's server (byte-exact: -T v on both)"
server_then_client rstream-ours-theirs "rstream -b $ip -T v" \
    "$bin/dp-perf rstream --client $ip --provider verbs -d $dev -T v"
step "rstream: librdmacm's client, our server"
server_then_client rstream-theirs-ours "$bin/dp-perf rstream --server --provider verbs -d $dev -b $ip -T v" \
    "rstream -s $ip -T v"
fi
if want rstream-b; then
# librdmacm's rstream takes one letter per -T (dp-perf also accepts them combined).
step "rstream: blocking mode both ways, custom 1 MiB transfers"
server_then_client rstream-b-ours-theirs "rstream -b $ip -T b -T v -S 1048576 -C 20 -I 2" \
    "$bin/dp-perf rstream --client $ip --provider verbs -d $dev -T bv -S 1048576 -C 20 -I 2"
server_then_client rstream-b-theirs-ours "$bin/dp-perf rstream --server --provider verbs -d $dev -b $ip -T bv -S 1048576 -C 20 -I 2" \
    "rstream -s $ip -T b -T v -S 1048576 -C 20 -I 2"
fi

echo
echo "=== verbs lab: $fails failure(s)"
exit "$fails"
