#!/usr/bin/env bash
# rstream over kernel TCP (-T s) and over the dataplane rsockets (scripts/with-rsocket), back
# to back on 127.0.0.1 with server and client as separate processes; prints both tables and
# the ratio for every size.
#
#   scripts/rstream-compare.sh [RSTREAM ARGS...]     e.g.  -S all    -T b    -T a
#
# Both runs get the same ARGS. The ratio is TCP usec/xfer over rsocket usec/xfer: both runs
# move the same bytes, so it is also rsocket Gb/sec over TCP Gb/sec; above 1 means the
# rsocket run was faster.
#
# Environment: RSTREAM (default rstream), PORT (first of two ports; default derived from the
# pid), TIMEOUT (seconds per run, default 600), and with-rsocket's (DP_RSOCKET_LIB, ...).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rstream=${RSTREAM:-rstream}
timeout_s=${TIMEOUT:-600}
port=${PORT:-$((20000 + ($$ % 4000) * 2))}

if ! command -v "$rstream" >/dev/null; then
    echo "$0: $rstream not found; install rdmacm-utils (apt-get install rdmacm-utils)" >&2
    exit 1
fi

work=$(mktemp -d)
server=
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
export DP_SHM_DIR=$work/shm

# Build the library (if needed) before timing anything.
"$root/scripts/with-rsocket" true

# run LABEL PORT MODE: MODE is "tcp" (rstream -T s) or "rs" (through with-rsocket).
run() {
    local label=$1 p=$2 mode=$3; shift 3
    local cmd=("$rstream") extra=()
    if [ "$mode" = tcp ]; then extra=(-T s); else cmd=("$root/scripts/with-rsocket" "$rstream"); fi
    "${cmd[@]}" -p "$p" "${extra[@]}" "$@" >"$work/$label.server" 2>&1 &
    server=$!
    # Wait until the server listens (kernel socket, or the shm listener's socket file).
    for _ in $(seq 200); do
        if [ "$mode" = tcp ] && ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then break; fi
        if [ "$mode" = rs ] && ls "$DP_SHM_DIR"/listen/*_"$p".sock >/dev/null 2>&1; then break; fi
        if ! kill -0 "$server" 2>/dev/null; then break; fi
        sleep 0.05
    done
    if ! timeout "$timeout_s" "${cmd[@]}" -s 127.0.0.1 -p "$p" "${extra[@]}" "$@" >"$work/$label.client" 2>&1; then
        echo "$0: the $label client failed:" >&2
        cat "$work/$label.client" "$work/$label.server" >&2
        exit 1
    fi
    # The server ends right after the client; give it a bounded moment.
    for _ in $(seq 600); do kill -0 "$server" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$server" 2>/dev/null; then
        echo "$0: the $label server did not exit after its client" >&2
        exit 1
    fi
    wait "$server" || { echo "$0: the $label server failed:" >&2; cat "$work/$label.server" >&2; exit 1; }
    server=
}

run tcp "$port" tcp "$@"
run rs "$((port + 1))" rs "$@"

echo "== kernel TCP: rstream -T s $*"
cat "$work/tcp.client"
echo
echo "== dataplane rsockets: scripts/with-rsocket rstream $*"
cat "$work/rs.client"
echo
echo "== ratio per size: TCP time / rsocket time (same bytes, so also rsocket Gb/s / TCP Gb/s; >1: rsockets faster)"
awk '
    FNR == 1 { file++ ; next }
    file == 1 { gb[$1] = $7; us[$1] = $8; order[n++] = $1; next }
    file == 2 { rgb[$1] = $7; rus[$1] = $8 }
    END {
        printf "%-10s %10s %10s %12s %12s %8s\n", "name", "TCP Gb/s", "rs Gb/s", "TCP us/xfer", "rs us/xfer", "ratio"
        for (i = 0; i < n; i++) {
            k = order[i]
            if (!(k in rus)) continue
            # usec/xfer carries more digits than Gb/sec (which rounds small sizes to 0.00).
            r = (rus[k] > 0) ? sprintf("%.2f", us[k] / rus[k]) : "-"
            printf "%-10s %10s %10s %12s %12s %8s\n", k, gb[k], rgb[k], us[k], rus[k], r
        }
    }
' "$work/tcp.client" "$work/rs.client"
