#!/usr/bin/env python3
"""The kernel's side of `dp-perf rds-echo`: an AF_RDS socket that checks every message and
sends it back.

    rds_echo_peer.py ADDR PORT COUNT SIZES [--transport ib|tcp] [--timeout S]

Binds ADDR:PORT (SO_RDS_TRANSPORT ib by default: the kernel's rds_rdma), expects COUNT
messages, message i of SIZES[i % len] bytes being the pattern stream from offset
i * 7919 % 1 MiB (the same xorshift32 stream as perf/src/rds/pattern.rs), and echoes each to
its sender as it arrives. Prints one line: `peer: OK N messages ...` or `peer: FAIL ...`
naming the first difference; exit status 0 only when all COUNT arrived byte-exact, in
order, once (it listens 2 s after the last one for a duplicate).
"""
import argparse
import array
import socket
import sys
import time

SOL_RDS = 276
SO_RDS_TRANSPORT = 8
TRANSPORTS = {"ib": 0, "tcp": 2}
MAX_MSG = 1 << 20


def pattern():
    a = array.array("I")
    x = 0x2545F491
    m = 0xFFFFFFFF
    for _ in range(2 * MAX_MSG // 4):
        x ^= (x << 13) & m
        x ^= x >> 17
        x ^= (x << 5) & m
        a.append(x)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def message(pat, i, n):
    off = (i * 7919) % MAX_MSG
    return pat[off:off + n]


def first_difference(got, want):
    if len(got) != len(want):
        return "%d bytes, expected %d" % (len(got), len(want))
    for k in range(len(got)):
        if got[k] != want[k]:
            return "byte %d is %#04x, expected %#04x" % (k, got[k], want[k])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("port", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("sizes")
    ap.add_argument("--transport", default="ib", choices=sorted(TRANSPORTS))
    ap.add_argument("--timeout", type=float, default=90.0)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    pat = pattern()
    s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
    s.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, TRANSPORTS[a.transport])
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 16 << 20)
    s.bind((a.addr, a.port))
    print("peer: bound %s:%d (%s), expecting %d messages" % (a.addr, a.port, a.transport, a.count),
          flush=True)
    deadline = time.monotonic() + a.timeout
    got = 0
    nbytes = 0
    quiet_until = None
    while True:
        now = time.monotonic()
        if quiet_until is not None and now >= quiet_until:
            break
        if quiet_until is None and now >= deadline:
            print("peer: FAIL %d of %d messages within %.0f s" % (got, a.count, a.timeout))
            return 1
        s.settimeout(max(0.05, (quiet_until or deadline) - now))
        try:
            data, frm = s.recvfrom(MAX_MSG + 1)
        except socket.timeout:
            continue
        if got >= a.count:
            print("peer: FAIL message %d more than the %d expected (%d bytes from %s): a duplicate"
                  % (got, a.count, len(data), frm))
            return 1
        want = message(pat, got, sizes[got % len(sizes)])
        if data != want:
            print("peer: FAIL message %d from %s: %s" % (got, frm, first_difference(data, want)))
            return 1
        while True:
            try:
                s.settimeout(30)
                s.sendto(data, frm)
                break
            except OSError as e:
                if e.errno in (105, 11):  # ENOBUFS (congested), EAGAIN
                    time.sleep(0.001)
                    continue
                print("peer: FAIL echo of message %d: %s" % (got, e))
                return 1
        got += 1
        nbytes += len(data)
        if got == a.count:
            quiet_until = time.monotonic() + 2.0
    print("peer: OK %d messages (%d bytes) received byte-exact, in order, once, and echoed"
          % (got, nbytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
