#!/usr/bin/env bash
# Fuzzing with cargo-fuzz (libFuzzer) on the stable toolchain: the targets are in fuzz/
# (fuzz/README.md says what each checks).
#
#   scripts/fuzz.sh smoke [SECONDS]        every target for SECONDS (default 5) after replaying
#                                          its regression inputs; fails on any crash that
#                                          fuzz/known-crashes.txt does not list (CI runs this)
#   scripts/fuzz.sh run TARGET SECONDS     one campaign: prints inputs executed and crashes
#   scripts/fuzz.sh all SECONDS            each target in turn; a table target | execs | crashes
#   scripts/fuzz.sh repro TARGET FILE...   runs inputs once and prints what they crash on
#   scripts/fuzz.sh minimize TARGET CRASH NAME
#                                          minimises a crash into fuzz/regressions/TARGET/NAME
#   scripts/fuzz.sh build | list
#
# Environment: FUZZ_RUNS=N stops each campaign after N inputs as well as after SECONDS
# (`FUZZ_RUNS=10000000 scripts/fuzz.sh all 86400` runs 10 M inputs per target). Campaigns
# run one libFuzzer process at a time, under `nice -n 19`.
#
# Builds, working corpora and crash artifacts are cached under target/fuzz/; fuzz/seeds/ and
# fuzz/regressions/ are the committed inputs. On a fresh Debian machine this installs what
# it needs (as root: g++ from apt; cargo-fuzz, pinned, with `cargo install --locked`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

CARGO_FUZZ_VERSION=0.13.2
out=target/fuzz
bin=$out/$(rustc -vV | sed -n 's/^host: //p')/release
known=fuzz/known-crashes.txt

say() { echo "fuzz: $*"; }

setup() {
  if ! command -v c++ > /dev/null; then
    # libfuzzer-sys compiles libFuzzer's C++ sources.
    if [ "$(id -u)" != 0 ]; then
      say "a C++ compiler is missing (apt-get install g++ as root)" >&2
      exit 1
    fi
    say "installing g++ (libFuzzer is C++): apt-get install g++"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ > /dev/null
  fi
  local have
  have=$(cargo fuzz --version 2> /dev/null | awk '{print $2}' || true)
  if [ "$have" != "$CARGO_FUZZ_VERSION" ]; then
    say "installing cargo-fuzz $CARGO_FUZZ_VERSION (have: ${have:-none}):" \
        "cargo install --locked cargo-fuzz@$CARGO_FUZZ_VERSION"
    cargo install --locked --quiet "cargo-fuzz@$CARGO_FUZZ_VERSION"
  fi
}

targets() {
  sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^dataplane-fuzz$'
}

build() {
  setup
  # -s none: no sanitizer, the only cargo-fuzz mode that needs no nightly flag (the targets
  # are safe Rust or check their unsafe accesses themselves); -a: debug assertions and
  # overflow checks on, so `debug_assert!`s and arithmetic overflow count as crashes.
  say "building the targets (cargo fuzz build -s none -a, into $out)"
  nice -n 10 cargo fuzz build -s none -a --target-dir "$out" "$@"
}

# The crash signature of one input: "file:line: first line of the panic message", or "" if
# the input runs cleanly.
signature() {
  local t=$1 f=$2 log
  log=$("$bin/$t" -timeout=10 "$f" 2>&1) && { echo ""; return; }
  local sig
  sig=$(awk '/panicked at /{ sub(/.*panicked at /, ""); sub(/:[0-9]+:$/, ""); loc=$0;
                             getline; print loc ": " $0; exit }' <<< "$log")
  if [ -z "$sig" ]; then
    sig=$(grep -m1 -E 'ERROR: libFuzzer|SUMMARY' <<< "$log" || echo "crash without a panic message")
  fi
  sig=${sig#"$root/"}
  # The fuzz crate's own files are named relative to fuzz/.
  [[ $sig == src/* ]] && sig="fuzz/$sig"
  echo "$sig"
}

# fuzz/known-crashes.txt, loaded once: target, signature glob and note of each entry.
known_t=()
known_p=()
known_n=()
load_known() {
  local kt pat note
  [ -f "$known" ] || return 0
  while IFS='|' read -r kt pat note; do
    [[ $kt =~ ^[[:space:]]*(#|$) ]] && continue
    known_t+=("$(sed 's/^ *//; s/ *$//' <<< "$kt")")
    known_p+=("$(sed 's/^ *//; s/ *$//' <<< "$pat")")
    known_n+=("$(sed 's/^ *//; s/ *$//' <<< "$note")")
  done < "$known"
}

# The note of the known-crashes entry of target $1 that matches signature $2, if any.
known_crash() {
  local t=$1 sig=$2 i
  for i in "${!known_t[@]}"; do
    # shellcheck disable=SC2053 # the pattern is a glob on purpose
    if [ "${known_t[$i]}" = "$t" ] && [[ $sig == *${known_p[$i]}* ]]; then
      echo "${known_n[$i]}"
      return 0
    fi
  done
  return 1
}

# Replays fuzz/regressions/$1; returns the number of unknown crashes.
replay() {
  local t=$1 bad=0 f sig
  [ -d "fuzz/regressions/$t" ] || return 0
  for f in "fuzz/regressions/$t"/*; do
    [ -f "$f" ] || continue
    sig=$(signature "$t" "$f")
    if [ -z "$sig" ]; then
      if grep -qF "$(basename "$f")" "$known" 2> /dev/null; then
        say "$t: regression $f passes now: fixed? (remove its entry from $known)"
      fi
    elif note=$(known_crash "$t" "$sig"); then
      say "$t: regression $f still crashes (known, open: $note): $sig"
    else
      say "$t: REGRESSION $f crashes: $sig"
      bad=$((bad + 1))
    fi
  done
  return "$bad"
}

# Fuzzes target $1 for $2 seconds (and at most $FUZZ_RUNS inputs); sets execs, crashes,
# unknown and sigs. libFuzzer stops at a crash: the campaign then goes on in a new process
# for the time left (so a known crash does not end it), adding up the inputs executed.
campaign() {
  local t=$1 secs=$2
  local corpus="$out/corpus/$t" art="$out/artifacts/$t" log="$out/logs/$t.log"
  mkdir -p "$corpus" "$art" "$(dirname "$log")"
  local before
  before=$(find "$art" -type f | sort)
  # Seeds, and the regression inputs that run cleanly (a crashing one would stop every
  # restart at once; `replay` reports those).
  local seeds=("$out/seeds/$t") f
  rm -rf "$out/seeds/$t" && mkdir -p "$out/seeds/$t"
  [ -d "fuzz/seeds/$t" ] && cp fuzz/seeds/"$t"/* "$out/seeds/$t/" 2> /dev/null || true
  for f in fuzz/regressions/"$t"/*; do
    [ -f "$f" ] && [ -z "$(signature "$t" "$f")" ] && cp "$f" "$out/seeds/$t/"
  done
  execs=0
  crashes=0
  local t0 left runs=${FUZZ_RUNS:-} n rc restarts=0
  t0=$(date +%s)
  : > "$log"
  while :; do
    left=$((secs - ($(date +%s) - t0)))
    [ "$left" -gt 0 ] || break
    local args=(-max_total_time="$left" -timeout=10 -print_final_stats=1
                -artifact_prefix="$art/")
    if [ -n "$runs" ]; then
      [ "$runs" -gt "$execs" ] || break
      args+=(-runs=$((runs - execs)))
    fi
    rc=0
    # No heap trimming: the targets allocate and free buffers of up to 64 KiB per input,
    # and glibc would otherwise return and re-fault those pages every time (half the time
    # of stream_conn).
    GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=1073741824 \
      nice -n 19 "$bin/$t" "${args[@]}" "$corpus" "${seeds[@]}" > "$log.run" 2>&1 || rc=$?
    cat "$log.run" >> "$log"
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log.run" | tail -n1)
    execs=$((execs + ${n:-0}))
    [ "$rc" -eq 0 ] && break
    crashes=$((crashes + 1))
    restarts=$((restarts + 1))
    if [ "$restarts" -ge 100000 ] || ! grep -qE 'Test unit written to|deadly signal|ERROR: libFuzzer' "$log.run"; then
      say "$t: libFuzzer exited with $rc (see $log)"
      break
    fi
  done
  rm -f "$log.run"
  elapsed=$(($(date +%s) - t0))
  unknown=0
  sigs=""
  local sig note
  for f in $(comm -13 <(echo "$before") <(find "$art" -type f | sort)); do
    sig=$(signature "$t" "$f")
    [ -z "$sig" ] && sig="(does not reproduce alone)"
    if note=$(known_crash "$t" "$sig"); then
      sigs+="  known ($note): $sig  [$f]"$'\n'
    else
      sigs+="  NEW: $sig  [$f]"$'\n'
      unknown=$((unknown + 1))
    fi
  done
  # One line per kind of crash: numbers in the messages vary from input to input.
  sigs=$(sed '/^$/d' <<< "$sigs" | awk '{ k = $0; sub(/ *\[.*/, "", k); gsub(/[0-9]+/, "N", k)
                                          if (!(k in seen)) { seen[k] = 1; print } }')
}

report() {
  local t=$1
  kinds=0
  [ -n "$sigs" ] && kinds=$(wc -l <<< "$sigs")
  say "$t: $execs inputs executed in ${elapsed}s, $crashes crashes of $kinds kinds" \
      "($unknown new inputs not in $known)"
  [ -n "$sigs" ] && echo "$sigs"
  return 0
}

load_known
cmd=${1:-}
case "$cmd" in
  build)
    build
    ;;
  list)
    targets
    ;;
  smoke)
    secs=${2:-5}
    build
    fail=0
    for t in $(targets); do
      replay "$t" || fail=$((fail + $?))
      campaign "$t" "$secs"
      report "$t"
      fail=$((fail + unknown))
    done
    if [ "$fail" -gt 0 ]; then
      say "smoke: $fail crash(es) not listed in $known (inputs under $out/artifacts)"
      exit 1
    fi
    say "smoke: no new crash"
    ;;
  run)
    [ $# -eq 3 ] || { echo "usage: $0 run TARGET SECONDS" >&2; exit 2; }
    build "$2"
    campaign "$2" "$3"
    report "$2"
    [ "$unknown" -eq 0 ]
    ;;
  all)
    [ $# -eq 2 ] || { echo "usage: $0 all SECONDS" >&2; exit 2; }
    build
    table="target | execs | crashes | kinds | new"$'\n'
    details=""
    total_unknown=0
    for t in $(targets); do
      campaign "$t" "$2"
      report "$t"
      table+="$t | $execs | $crashes | $kinds | $unknown"$'\n'
      total_unknown=$((total_unknown + unknown))
    done
    echo
    awk -F' [|] ' '{ printf "%-20s | %12s | %7s | %5s | %s\n", $1, $2, $3, $4, $5 }' <<< "${table%$'\n'}"
    [ "$total_unknown" -eq 0 ]
    ;;
  repro)
    [ $# -ge 3 ] || { echo "usage: $0 repro TARGET FILE..." >&2; exit 2; }
    t=$2; shift 2
    [ -x "$bin/$t" ] || build "$t"
    for f in "$@"; do
      sig=$(signature "$t" "$f")
      echo "$f: ${sig:-runs cleanly}"
    done
    ;;
  minimize)
    [ $# -eq 4 ] || { echo "usage: $0 minimize TARGET CRASH NAME" >&2; exit 2; }
    t=$2
    [ -x "$bin/$t" ] || build "$t"
    mkdir -p "fuzz/regressions/$t" "$out/logs"
    dst="fuzz/regressions/$t/$4"
    nice -n 19 "$bin/$t" -minimize_crash=1 -runs=20000 -exact_artifact_path="$dst" "$3" \
      > "$out/logs/minimize-$t.log" 2>&1 || true
    say "$dst ($(wc -c < "$dst") bytes): $(signature "$t" "$dst")"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
