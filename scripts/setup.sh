#!/usr/bin/env bash
# Installs the system packages the optional parts of dataplane need (Debian/Ubuntu).
#
#   libibverbs-dev librdmacm-dev libclang-dev pkg-config   the `verbs` provider (rdma-sys)
#   rdmacm-utils                                           Debian's rstream/riostream, for the
#                                                          librdmacm drop-in tests
#   qperf iperf sockperf                                   unmodified socket and RDMA CM programs
#                                                          for the drop-in's preload tests
#                                                          (apps/rsocket-c/tests/preload.rs,
#                                                          tests/rspreload.rs)
#   valgrind                                               memcheck over the C API tests
#                                                          (scripts/test.sh)
#   dpdk dpdk-dev                                          dpdk-test, for scripts/bench-vs-dpdk.sh
#
# The default build needs none of this: only cargo. Run as root; without root it only says
# what is missing.
set -euo pipefail

pkgs=(libibverbs-dev librdmacm-dev libclang-dev pkg-config rdmacm-utils ibverbs-providers valgrind
      qperf iperf sockperf)
if [ "${DP_SETUP_DPDK:-0}" = 1 ]; then pkgs+=(dpdk dpdk-dev); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all system packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup: missing packages: ${missing[*]} (run this script as root to install them)" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
