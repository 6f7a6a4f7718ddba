#!/usr/bin/env python3
"""Writes the hand-made seed inputs under fuzz/seeds/ (committed; rerun after a layout change).

Seeds give libFuzzer valid structures to mutate where random bytes rarely get past a check:
shm segment headers (magic, kind, version and a length that matches the sizes), control
messages of every kind, and one valid block of rsocket connection data.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "seeds", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def seg_header(kind, length):
    # SegHeader: magic "DPSHMSEG", kind u32, version u32 = 2, len u64, ctx_id u32, reserved.
    return b"DPSHMSEG" + struct.pack("<IIQII", kind, 2, length, 7, 0)


def next_mult(v, m):
    return (v + m - 1) // m * m


# shm_seg input: selector (bit 0: queue pair), memfd length u32, message number u64,
# released bounce position u64, bytes.
def qp_seed(rq_cap, bounce_len, n, kind, ln, bounce_end, key=0, addr=0):
    hdr_len = 128 + 4 * 128
    slots_off = next_mult(hdr_len + 4 * rq_cap, 128)
    bounce_off = next_mult(slots_off + 128 * rq_cap, 4096)
    total = next_mult(bounce_off + bounce_len, 4096)
    seg = bytearray(seg_header(3, total) + struct.pack("<IIII", 0x7001, rq_cap, bounce_len, 0))
    slot = slots_off + 128 * (n & (rq_cap - 1))
    seg += bytes(slot + 128 - len(seg))
    # InboundSlot (128 bytes): seq u64 (n + 1), kind, imm, len, has_imm u32, bounce_end u64,
    # key u32, reserved u32, addr u64, then 80 bytes of inline payload.
    seg[slot:slot + 48] = struct.pack("<QIIIIQIIQ", n + 1, kind, 0, ln, 0, bounce_end, key, 0, addr)
    return struct.pack("<BIQQ", 1, total, n, 0) + bytes(seg)


def ud_seed(nslots, pos, ln):
    total = next_mult(512 + (64 + 4096) * nslots, 4096)
    seg = bytearray(seg_header(4, total) + struct.pack("<IIII", 0x7002, 0x1234, nslots, 0))
    slot = 512 + (64 + 4096) * (pos & (nslots - 1))
    seg += bytes(slot + 64 - len(seg))
    # UdSlotHdr: seq u64 (pos + 1), src_qpn, qkey, len, imm, has_imm u32.
    seg[slot:slot + 28] = struct.pack("<QIIIII", pos + 1, 9, 0x1234, ln, 0, 0)
    return struct.pack("<BIQQ", 0, total, pos, 0) + bytes(seg)


put("shm_seg", "qp-send", qp_seed(16, 4096, 0, 1, 100, 100))
put("shm_seg", "qp-write-imm", qp_seed(16, 4096, 5, 3, 0, 0))
put("shm_seg", "qp-write-imm-inline", qp_seed(16, 4096, 21, 5, 64, 0, 0x1001, 0x7f00_0000_1000))
put("shm_seg", "ud-datagram", ud_seed(1, 0, 64))

# shm_msg: "DPSH", version 1, kind, payload length u16, payload.
def msg(kind, payload):
    return b"DPSH" + struct.pack("<BBH", 2, kind, len(payload)) + payload


def addr4(port):
    return bytes([4, 127, 0, 0, 1]) + bytes(12) + struct.pack("<H", port)


def region(slot, ln, page, writable=1):
    return struct.pack("<IQIB", slot, ln, page, writable)


ep = struct.pack("<IIIQQIQQQH", 7, 1234, 0x7001, 3, 9, 17, 8192, 4096, 4096, 1) + region(0, 1 << 21, 1 << 21)
pdata = bytes([4, 1, 2, 3, 4])
put("shm_msg", "req", msg(1, addr4(40000) + addr4(7471) + ep + pdata))
put("shm_msg", "rep", msg(2, ep + pdata))
put("shm_msg", "rej", msg(3, pdata))
put("shm_msg", "rtu", msg(4, b""))
put("shm_msg", "mr-add", msg(6, struct.pack("<Q", 5) + region(2, 4096, 4096)))
put("shm_msg", "mr-del", msg(10, struct.pack("<I", 2)))
put("shm_msg", "ud-resolve-rep", msg(9, struct.pack("<IIIQQ", 0, 0x1234, 3, 1 << 20, 4096)))

# wire_conn_data: version 1, flags NET|IOMAP, credits 384 (BE), iomap size 0x81, target SGL
# (2 entries), data buffer.
cd = bytes([1, 3]) + struct.pack(">H", 384) + bytes(3) + bytes([0x81])
cd += struct.pack(">QII", 0x7F0011223000, 0x01020304, 2) + struct.pack(">QII", 0x7F00AABBC000, 0x0A0B0C0D, 65536)
put("wire_conn_data", "librdmacm", cd)

# wire_ds_udp_header: family byte (0: IPv4), then a Data header from 10.1.2.3.
put("wire_ds_udp_header", "data-v4", bytes([0]) + struct.pack(">I", 0x55555555) + bytes([4, 0, 16, 0]) + struct.pack(">I", 0x123456) + bytes([10, 1, 2, 3]))
put("wire_ds_header", "v6", bytes([6, 24]) + struct.pack(">HI", 7174, 0x12345) + bytes(15) + b"\x01")
