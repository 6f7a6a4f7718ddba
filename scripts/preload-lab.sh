#!/usr/bin/env bash
# The drop-in and preload lab run, on a host with an RDMA device (Soft-RoCE in
# ../shared/tools/rxe-lab, whose VM has rxe0 on 10.77.0.1):
#
#   1. qperf's rc_lat on the system's RDMA CM and verbs, loaded through this project's
#      librdmacm.so.1 (every RDMA CM call forwarded to the system's librdmacm), next to the
#      same run on the system's librdmacm alone;
#   2. the reference: librdmacm's own rsockets through its librspreload.so over rxe0:
#      rstream -T s (the run that hung on the drop-in), iperf against kernel TCP, and
#      qperf tcp_lat (which needs F_SETOWN and a forking server);
#   3. this project's own preload (apps/rsocket-preload, libdp_rspreload.so) on librdmacm's
#      rsockets over rxe0: qperf tcp_lat and tcp_bw, server and client both through it
#      (qperf's server forks after accepting: the connections move to rsockets in the child).
#
#   scripts/preload-lab.sh LIB BIN_DIR [DEVICE] [IP]
#
# STEPS (default 123) selects the steps; DP_RSPRELOAD names libdp_rspreload.so (default:
# target/release/libdp_rspreload.so, from cargo build --release -p dp-rspreload).
#
# LIB is the drop-in (target/release/librdmacm.so); BIN_DIR holds qperf and iperf (the
# VM has rdmacm-utils but not these: copy the host's, Debian 12 like the VM). Under rxe-lab:
#   cargo build --release -p dp-rsocket-c
#   mkdir -p target/lab-bin && cp /usr/bin/qperf /usr/bin/iperf target/lab-bin/
#   ../shared/tools/rxe-lab --timeout 3600 -- scripts/preload-lab.sh target/release/librdmacm.so target/lab-bin
# Everything runs on one emulated host: compare ratios, not absolute numbers.
set -uo pipefail
lib=${1:?usage: preload-lab.sh LIB BIN_DIR [DEVICE] [IP]}
bin=${2:?usage: preload-lab.sh LIB BIN_DIR [DEVICE] [IP]}
dev=${3:-rxe0}
ip=${4:-10.77.0.1}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preload=$(ls /usr/lib/*/rsocket/librspreload.so 2>/dev/null | head -1)
fails=0
step() { echo; echo "=== $*"; }
ulimit -l unlimited 2>/dev/null || true
export DP_RSOCKET_LIB=$lib

# pair NAME TIMEOUT 'SERVER CMD' 'CLIENT CMD': runs the server in the background, then the
# client; prints both outputs; counts a failure if the client fails or times out.
pair() {
    local name=$1 limit=$2 srv=$3 cli=$4
    bash -c "$srv" >"/tmp/lab-$name-server.log" 2>&1 &
    local pid=$!
    sleep 2
    echo "--- $name client: $cli"
    timeout "$limit" bash -c "$cli"
    local rc=$?
    sleep 1
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "--- $name server: $srv"
    cat "/tmp/lab-$name-server.log"
    if [ "$rc" = 0 ]; then echo "--- $name: ok"; else echo "--- $name: FAILED ($rc)"; fails=$((fails + 1)); fi
}

step "device"
rdma link 2>/dev/null || true

steps=${STEPS:-123}
own=${DP_RSPRELOAD:-$root/target/release/libdp_rspreload.so}

if [[ $steps == *1* ]]; then
step "1. qperf rc_lat on the system's RDMA CM and verbs"
# -cm1: connect through the RDMA CM (RoCE needs it: qperf's own exchange uses LIDs).
pair qperf-rc-system 300 "$bin/qperf -lp 19801" "$bin/qperf $ip -lp 19801 -cm1 -t 2 -m 64 rc_lat"
pair qperf-rc-dropin 300 "$root/scripts/with-rsocket $bin/qperf -lp 19802" \
    "$root/scripts/with-rsocket $bin/qperf $ip -lp 19802 -cm1 -t 2 -m 64 rc_lat"
echo "--- the drop-in is what qperf loaded:"
"$root/scripts/with-rsocket" bash -c "ldd $bin/qperf | grep librdmacm"
fi

if [[ $steps != *2* ]]; then
    :
elif [ -z "$preload" ]; then
    echo "librspreload.so not found; skipping the reference runs"
else
    step "2. reference: librdmacm's rsockets through $preload over $dev"
    # The issue's invocation: the server runs rstream's default plan (64_lat first: read 64,
    # write 64), the client a custom one (20000 writes of 64, then 20000 reads).
    pair rstream-s-ref-mismatched 300 "LD_PRELOAD=$preload rstream -T s -p 19811" \
        "LD_PRELOAD=$preload rstream -T s -s $ip -p 19811 -S 64 -C 20000"
    # Both ends with the same plan.
    pair rstream-s-ref-matched 600 "LD_PRELOAD=$preload rstream -T s -p 19812 -S 64 -C 20000" \
        "LD_PRELOAD=$preload rstream -T s -s $ip -p 19812 -S 64 -C 20000"
    # Kernel TCP with the issue's invocation, for comparison.
    pair rstream-tcp-mismatched 300 "rstream -T s -p 19813" "rstream -T s -s $ip -p 19813 -S 64 -C 20000"
    for i in 1 2 3; do
        pair "iperf-tcp-$i" 120 "$bin/iperf -s -p $((19820 + i))" "$bin/iperf -c $ip -p $((19820 + i)) -t 5"
        pair "iperf-ref-$i" 120 "LD_PRELOAD=$preload $bin/iperf -s -p $((19830 + i))" \
            "LD_PRELOAD=$preload $bin/iperf -c $ip -p $((19830 + i)) -t 5"
    done
    pair qperf-tcp-ref 120 "LD_PRELOAD=$preload $bin/qperf -lp 19841" \
        "LD_PRELOAD=$preload $bin/qperf $ip -lp 19841 -t 2 tcp_lat"
fi
if [[ $steps == *3* ]]; then
    step "3. dp-rspreload ($own) on librdmacm's rsockets over $dev"
    if [ ! -f "$own" ]; then
        echo "$own not found (cargo build --release -p dp-rspreload)"; fails=$((fails + 1))
    else
        # The system's librdmacm (no with-rsocket): the preload opens librdmacm.so.1.
        for t in tcp_lat tcp_bw; do
            pair "qperf-$t-dp-rspreload" 300 \
                "LD_PRELOAD=$own DP_RSPRELOAD_VERBOSE=1 $bin/qperf -lp 19851" \
                "LD_PRELOAD=$own DP_RSPRELOAD_VERBOSE=1 $bin/qperf $ip -lp 19851 -t 2 -vu -oo msg_size:64:64K:*1024 $t"
        done
        pair qperf-tcp-kernel 120 "$bin/qperf -lp 19852" \
            "$bin/qperf $ip -lp 19852 -t 2 -vu -oo msg_size:64:64K:*1024 tcp_lat tcp_bw"
    fi
fi
echo
echo "failures: $fails"
