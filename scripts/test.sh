#!/usr/bin/env bash
# The project's test command (README "Run the tests"). Runs every test in release mode
# (the data-path tests move millions of messages), at most two tests at a time so
# busy-polling tests never oversubscribe a 2-core machine; then the codec, state-machine
# and mempool unit tests again in debug, the C API tests under valgrind, and the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each "== title" line below is followed, when the next one starts, by the seconds the
# previous step took.
t0=$SECONDS
took() { echo "== (took $((SECONDS - t0)) s)"; t0=$SECONDS; }

# The optional parts' system packages (verbs provider, Debian's rdmacm-utils): installed when
# running as root, otherwise their tests are skipped with a message.
verbs=1
if ! scripts/setup.sh; then
  verbs=0
  echo "== note: not root and packages missing: the verbs provider's tests are skipped," \
       "and the rdmacm-utils tests print why they skip (run scripts/setup.sh as root to include them)"
fi

echo "== cargo test (release)"
cargo test --workspace --release -- --test-threads=2

took
if [ "$verbs" = 1 ]; then
  echo "== verbs provider (hardware tests run when DP_TEST_DEVICE names a device)"
  cargo test -p dp-verbs --features verbs --release -- --test-threads=1
fi

took
# The wire codecs, the protocol state machines and mempool once more in debug, where
# overflow checks and `debug_assert!`s run (the release run above skips both).
echo "== unit tests in debug (wire codecs, state machines, shm control messages, mempool)"
# RTRS's set-up rules, IO path and hostile peers through its simulator (the long failover
# and reconnect runs stay in the release run above).
cargo test -p dp-rtrs --test rtrs_setup --test rtrs_io --test rtrs_hostile -- --test-threads=2
cargo test -p dp-wire -p dp-rsocket -p dp-rds -p dp-rtrs -p dp-shm -p mempool --lib -- --test-threads=2
cargo test -p dp-rsocket --test rsocket_sim -- --test-threads=2
cargo test -p dp-rds --test rds_protocol --test rds_hostile --test rds_reliability --test rds_socket --test rds_rdma_rules -- --test-threads=2

took
# The C API tests of the drop-in librdmacm.so.1 (built above in release) under memcheck.
# Only definite leaks are errors: the library's service threads are still running at exit,
# so what they hold shows as "possibly lost". Suppressions: scripts/valgrind.supp.
if command -v valgrind > /dev/null; then
  echo "== valgrind (memcheck) over the C API tests of dp-rsocket-c"
  # The binaries the workspace run above built (same features: nothing is rebuilt).
  api=$(cargo test --workspace --release --no-run --message-format=json 2> /dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if t.get("name") == "api" and t.get("kind") == ["test"] and m.get("executable"):
        print(m["executable"])')
  [ -n "$api" ] || { echo "== the api test binary of dp-rsocket-c was not found" >&2; exit 1; }
  cargo build --release --quiet -p dp-rsocket-c
  DP_RSOCKET_LIB="$PWD/target/release/librdmacm.so" \
    valgrind --quiet --error-exitcode=1 --suppressions=scripts/valgrind.supp \
      --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
      "$api" --test-threads=1
else
  echo "== note: valgrind missing, the C API tests are not run under memcheck" \
       "(scripts/setup.sh installs it as root)"
fi

took
echo "== loom models (mempool rings and pools, RTRS permits)"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test -p mempool --release --test 'loom_*' 2>&1 | tail -n 5
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test -p dp-rtrs --release --test loom_permits 2>&1 | tail -n 5
took
