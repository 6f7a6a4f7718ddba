#!/usr/bin/env python3
"""rds_info.py: the kernel's RDS state through RDS_INFO_* getsockopts, as rds-info prints it
(rds-tools is not in the lab VM).

    rds_info.py [COUNTER ...]

Without arguments: every non-zero counter (RDS_INFO_COUNTERS: core then transport counters),
the connections (RDS_INFO_CONNECTIONS: addresses, transport, next tx/rx sequence, flags
s=sending c=connecting C=connected) and the send, retransmit and receive queues. With counter
names: `name value` of just those (0 when absent).
"""
import ctypes
import socket
import struct
import sys

SOL_RDS = 276
LIBC = ctypes.CDLL(None, use_errno=True)


def info(s, opt):
    """One RDS_INFO_* snapshot (Python's own getsockopt caps the buffer at 1024 bytes)."""
    n = 1 << 20
    buf = ctypes.create_string_buffer(n)
    ln = ctypes.c_uint32(n)
    if LIBC.getsockopt(s.fileno(), SOL_RDS, opt, buf, ctypes.byref(ln)) < 0:
        return b""
    return buf.raw[:ln.value]


def counters(s):
    c = info(s, 10000)
    out = {}
    for i in range(len(c) // 40):
        name, v = struct.unpack_from("<32sQ", c, i * 40)
        out[name.rstrip(b"\0").decode()] = v
    return out


def main():
    s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
    cs = counters(s)
    if len(sys.argv) > 1:
        print(" ".join("%s=%d" % (n, cs.get(n, 0)) for n in sys.argv[1:]))
        return
    for k, v in cs.items():
        if v:
            print("counter %-32s %d" % (k, v))
    c = info(s, 10001)
    for i in range(len(c) // 42):
        tx, rx, la, fa, tr, fl, tos = struct.unpack_from("<QQ4s4s16sBB", c, i * 42)
        flags = "".join(ch for bit, ch in ((1, "s"), (2, "c"), (4, "C")) if fl & bit) or "-"
        print("conn %s -> %s %s next_tx %d next_rx %d flags %s tos %d" % (
            socket.inet_ntoa(la), socket.inet_ntoa(fa), tr.rstrip(b"\0").decode(), tx, rx, flags, tos))
    for name, opt in (("send", 10003), ("retrans", 10004), ("recv", 10005)):
        c = info(s, opt)
        for i in range(len(c) // 26):
            seq, ln, la, fa, lp, fp, fl, tos = struct.unpack_from("<QI4s4sHHBB", c, i * 26)
            print("%s seq %d len %d %s:%d -> %s:%d" % (name, seq, ln, socket.inet_ntoa(la), socket.ntohs(lp),
                                                    socket.inet_ntoa(fa), socket.ntohs(fp)))


if __name__ == "__main__":
    main()
