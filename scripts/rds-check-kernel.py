#!/usr/bin/env python3
"""rds-check-kernel.py: `dp-perf rds-check` over the kernel's own AF_RDS sockets (RDS-TCP).

    rds-check-kernel.py --recv -r ADDR [-p 4000] [-n 400] [--seed 1] [--stall-after K --stall-secs S]
    rds-check-kernel.py --send -r ADDR -s PEER [-p 4000] [-n 400] [--seed 1] [--sockets N]

The same run as `dp-perf rds-check` (perf/src/rds/pattern.rs: keep the schedule, the payload and
the identification in step with it): -n messages whose sizes (0, 1, 47, 48, 4095, 4096, 4097, 65535,
65536, 1 MiB, then xorshift64 draws up to 1 MiB) and bytes both sides derive from (-n, --seed); the
sender sends message j from socket j % --sockets (ports -p+1..) to the receiver's port -p, non-blocking,
counting the sends that had to wait (ENOBUFS: the destination is congested; EAGAIN: send buffer full);
the receiver counts received/duplicated/out_of_order/corrupt/missing, then answers every sender socket
with b"DONE", which the sender waits for. Prints one line of JSON: {"rds_check": {...}} as dp-perf.
Needs a kernel with rds_tcp (the kernel-peers lab VM); runs in the kernel's namespace.
"""
import argparse
import errno
import json
import socket
import sys
import time

MAX_MSG = 1 << 20
EDGE = [0, 1, 47, 48, 4095, 4096, 4097, 65535, 65536, MAX_MSG]
M64 = (1 << 64) - 1
SOL_RDS = 276
SO_RDS_TRANSPORT = 8
RDS_TRANS_TCP = 2
BASE = bytes(range(251)) * (MAX_MSG // 251 + 3)  # BASE[i] == i % 251
DONE = b"DONE"


def schedule(count, seed):
    x = seed | 1
    out = []
    for j in range(count):
        if j < len(EDGE):
            out.append(EDGE[j])
            continue
        draws = []
        for _ in range(2):
            x ^= (x << 13) & M64
            x ^= x >> 7
            x ^= (x << 17) & M64
            draws.append(x)
        cls, r = draws[0] % 4, draws[1]
        out.append([r % 128, r % 8192, r % 131072, r % (MAX_MSG + 1)][cls])
    return out


def payload(j, size):
    off = ((j % 251) * 97 + (size % 251) * 13) % 251
    if size >= 8:
        return j.to_bytes(8, "little") + BASE[off + 8:off + size]
    return BASE[off:off + size]


def rds_socket(addr, port, buf):
    s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
    s.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, RDS_TRANS_TCP)
    # RDS refuses a message longer than half of SO_SNDBUF (EMSGSIZE), and SO_SNDBUF is capped
    # at net.core.wmem_max (208 KiB by default): the FORCE variants (root) pass the cap.
    for force, plain in ((32, socket.SO_SNDBUF), (33, socket.SO_RCVBUF)):  # SO_*BUFFORCE
        try:
            s.setsockopt(socket.SOL_SOCKET, force, buf)
        except PermissionError:
            s.setsockopt(socket.SOL_SOCKET, plain, buf)
    s.bind((addr, port))
    return s


def report(role, a, **kw):
    r = {"role": role, "count": a.count, "sent": 0, "received": 0, "missing": 0, "duplicated": 0,
         "out_of_order": 0, "corrupt": 0, "bytes": 0, "enobufs": 0, "eagain": 0, "enomem": 0,
         "done": False, "stalled_secs": 0.0, "seconds": 0.0, "npaths": 0, "paths": []}
    r.update(kw)
    if role == "send":
        r["ok"] = r["done"] and r["sent"] == a.count
    else:
        r["ok"] = not (r["missing"] or r["duplicated"] or r["out_of_order"] or r["corrupt"])
    return {"rds_check": r}


def send(a):
    sizes = schedule(a.count, a.seed)
    socks = [rds_socket(a.local, a.port + 1 + k, a.sockbuf) for k in range(a.sockets)]
    dest = (a.peer, a.port)
    waits = {errno.ENOBUFS: 0, errno.EAGAIN: 0, errno.ENOMEM: 0}
    t0 = time.monotonic()
    nxt, done, msg = 0, False, None
    while not done and time.monotonic() - t0 < a.timeout:
        while nxt < a.count:
            if msg is None:
                msg = payload(nxt, sizes[nxt])
            try:
                socks[nxt % a.sockets].sendto(msg, socket.MSG_DONTWAIT, dest)
            except OSError as e:
                if e.errno not in waits:
                    sys.exit(f"rds-check-kernel: sendto of message {nxt} ({sizes[nxt]} B): {e}")
                waits[e.errno] += 1
                break
            nxt, msg = nxt + 1, None
        for s in socks:
            try:
                data = s.recv(64, socket.MSG_DONTWAIT)
                done |= data == DONE
            except BlockingIOError:
                pass
        if not done:
            time.sleep(0.0005)
    return report("send", a, sent=nxt, done=done, enobufs=waits[errno.ENOBUFS],
                  eagain=waits[errno.EAGAIN], enomem=waits[errno.ENOMEM],
                  seconds=time.monotonic() - t0)


def recv(a):
    sizes = schedule(a.count, a.seed)
    short = {}
    for j, n in enumerate(sizes):
        if n < 8:
            short.setdefault(n, []).append(j)
    got = [False] * a.count
    highest = {}
    t = dict(received=0, duplicated=0, out_of_order=0, corrupt=0, bytes=0)
    s = rds_socket(a.local, a.port, a.sockbuf)
    s.settimeout(0.2)
    senders = []
    t0 = time.monotonic()
    first = last = None
    stalled = 0.0
    while t["received"] < a.count and time.monotonic() - t0 < a.timeout:
        if last is not None and time.monotonic() - last > a.idle:
            break
        if a.stall_after is not None and not stalled and t["received"] >= a.stall_after:
            time.sleep(a.stall_secs)
            stalled = float(a.stall_secs)
            last = time.monotonic()
        try:
            data, frm = s.recvfrom(MAX_MSG + 1)
        except socket.timeout:
            continue
        now = time.monotonic()
        first = first or now
        last = now
        if frm not in senders:
            senders.append(frm)
        n = len(data)
        if n >= 8:
            j = int.from_bytes(data[:8], "little")
            cands = [j] if j < a.count and sizes[j] == n and data == payload(j, n) else []
        else:
            cands = [j for j in short.get(n, []) if data == payload(j, n)]
            cands.sort(key=lambda j: got[j])
        if not cands:
            t["corrupt"] += 1
            if t["corrupt"] <= 5:
                print(f"rds-check-kernel: a message from {frm} is none of the run's: {n} bytes, "
                      f"starting {data[:16].hex()}", file=sys.stderr)
            continue
        j = cands[0]
        if got[j]:
            t["duplicated"] += 1
            continue
        got[j] = True
        t["received"] += 1
        t["bytes"] += n
        h = highest.setdefault(frm[1], j)
        if j < h:
            t["out_of_order"] += 1
        highest[frm[1]] = max(h, j)
    end = time.monotonic()
    for to in senders:
        for _ in range(1000):
            try:
                s.sendto(DONE, socket.MSG_DONTWAIT, to)
                break
            except OSError:
                time.sleep(0.002)
    time.sleep(0.5)
    return report("recv", a, missing=a.count - t["received"], stalled_secs=stalled,
                  seconds=(end - first) if first else 0.0, **t)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--send", action="store_true")
    g.add_argument("--recv", action="store_true")
    p.add_argument("-r", dest="local", required=True)
    p.add_argument("-s", dest="peer")
    p.add_argument("-p", dest="port", type=int, default=4000)
    p.add_argument("-n", dest="count", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sockets", type=int, default=1)
    p.add_argument("--stall-after", type=int)
    p.add_argument("--stall-secs", type=float, default=3)
    p.add_argument("--sockbuf", type=int, default=4 << 20)
    p.add_argument("--idle", type=float, default=20)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--json", action="store_true", help="accepted for symmetry: always JSON")
    a = p.parse_args()
    if a.send and not a.peer:
        p.error("--send needs -s ADDR: the receiver's address")
    if a.count < 1 or a.sockets < 1:
        p.error("-n and --sockets must be at least 1")
    print(json.dumps(send(a) if a.send else recv(a)))


if __name__ == "__main__":
    main()
