#!/usr/bin/env bash
# The project's test command (README "Run the tests"). Runs every test in release mode
# (the data-path tests move millions of messages), at most two tests at a time so
# busy-polling tests never oversubscribe a 2-core machine, then the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."

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

if [ "$verbs" = 1 ]; then
  echo "== verbs provider (hardware tests run when DP_TEST_DEVICE names a device)"
  cargo test -p dp-verbs --features verbs --release -- --test-threads=1
fi

echo "== loom models (mempool rings and pools)"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test -p mempool --release --test 'loom_*' 2>&1 | tail -n 5
