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


# The shm provider's segment layout version (dataplane/fabric/shm/src/layout.rs).
SEG_VERSION = 3


def seg_header(kind, length):
    # SegHeader: magic "DPSHMSEG", kind u32, version u32 (layout.rs SEG_VERSION), len u64,
    # ctx_id u32, reserved.
    return b"DPSHMSEG" + struct.pack("<IIQII", kind, SEG_VERSION, length, 7, 0)


def next_mult(v, m):
    return (v + m - 1) // m * m


# shm_seg input: selector (bit 0: queue pair), memfd length u32, message number u64,
# released bounce position u64, bytes.
def qp_seed(rq_cap, bounce_len, n, kind, ln, bounce_end, key=0, addr=0, credit=0):
    hdr_len = 128 + 4 * 128
    slots_off = next_mult(hdr_len + 4 * rq_cap, 128)
    bounce_off = next_mult(slots_off + 128 * rq_cap, 4096)
    total = next_mult(bounce_off + bounce_len, 4096)
    seg = bytearray(seg_header(3, total) + struct.pack("<IIII", 0x7001, rq_cap, bounce_len, 0))
    slot = slots_off + 128 * (n & (rq_cap - 1))
    seg += bytes(slot + 128 - len(seg))
    # InboundSlot (128 bytes): seq u64 (n + 1), kind, imm, len, has_imm u32, bounce_end u64,
    # key u32, credit u32 (the sender's posted receives), addr u64, then 80 bytes of inline
    # payload.
    seg[slot:slot + 48] = struct.pack("<QIIIIQIIQ", n + 1, kind, 0, ln, 0, bounce_end, key, credit, addr)
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
# A SEND with invalidate (kind 6): a bounce payload, the key to invalidate, a credit word.
put("shm_seg", "qp-send-inv", qp_seed(16, 4096, 3, 6, 200, 300, 0x0010_0105, 0, credit=40))
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

# RTRS (dataplane/rtrs): what Linux 6.1 sends (shared/tools/kernel-peers README).
uuid_p, uuid_s = bytes(range(0x10, 0x20)), bytes(range(0x20, 0x30))
conn_req = bytes([0, 0]) + struct.pack("<HHHHH", 0x1BBD, 0x0200, 1, 3, 1) + uuid_p + uuid_s + bytes([1]) + bytes(11)
conn_rsp = struct.pack("<HHhHIII", 0x1BBD, 0x0200, 0, 512, 126976, 4096, 2) + bytes(36)
put("rtrs_conn", "kernel-conn-req", conn_req)
put("rtrs_conn", "kernel-conn-rsp", conn_rsp)
put("rtrs_conn", "reject-ebusy", struct.pack("<HHh", 0x1BBD, 0x0200, -16) + bytes(50))
# rtrs_info input: queue depth u16 (LE), chunk-size selector u8 (8192 = 1 << (12 % 20 + 1)), bytes.
info_req = struct.pack("<H", 0) + b"host1-sess".ljust(255, b"\0") + bytes(15)
put("rtrs_info", "info-req", struct.pack("<HB", 8, 12) + info_req)
info_rsp = struct.pack("<HH", 1, 8) + bytes(4) + b"".join(struct.pack("<QII", 0x10000000 + i * 8192, 0x100 + i, 8192) for i in range(8))
put("rtrs_info", "info-rsp-per-chunk", struct.pack("<HB", 8, 12) + info_rsp)
info_rsp2 = struct.pack("<HH", 1, 2) + bytes(4) + struct.pack("<QII", 0x10000000, 7, 4 * 8192) + struct.pack("<QII", 0x20000000, 9, 4 * 8192)
put("rtrs_info", "info-rsp-regions", struct.pack("<HB", 8, 12) + info_rsp2)
put("rtrs_info", "rkey-rsp", struct.pack("<HB", 8, 12) + struct.pack("<HHI", 4, 3, 0x12345601))
# rtrs_io_hdr input: max length u32, offset u32, header bytes.
rd = struct.pack("<HHHH", 3, 32, 1, 1) + struct.pack("<QII", 0xFFFF888100000000, 0x12345601, 4096)
put("rtrs_io_hdr", "read-need-inval", struct.pack("<II", 131072, 4096 + 32) + rd)
put("rtrs_io_hdr", "write", struct.pack("<II", 131072, 4096 + 32) + struct.pack("<HH", 2, 32))

# ---- RDS (dp-rds) ----
def rds_header(seq, ack, length, sport, dport, flags=0, credit=0, ext=b""):
    h = bytearray(struct.pack(">QQIHHBB", seq, ack, length, sport, dport, flags, credit) + bytes(6))
    h += ext + bytes(16 - len(ext))
    # RFC 1071 over the 48 bytes, stored big-endian at offset 30.
    s = sum(struct.unpack(">24H", bytes(h)))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    h[30:32] = struct.pack(">H", ~s & 0xFFFF)
    return bytes(h)


# The kernel-peers dump: the first RDS-TCP data message (19 bytes, 4000 -> 4001), unchecksummed.
put("rds_header", "tcp_first_data", struct.pack(">QQIHH", 1, 0, 19, 4000, 4001) + bytes(24))
put("rds_header", "ib_ack_only", rds_header(0, 5, 0, 0, 0))
put("rds_header", "ib_fragment", rds_header(7, 3, 10240, 4000, 4001, 0x02, 17))
put("rds_header", "probe_ping", rds_header(1, 0, 0, 1, 0, 0, 0, b"\x05\x00\x08\x06\xde\xad\xbe\xef"))
put("rds_header", "cong_map", rds_header(0, 0, 8192, 0, 0, 0x01))
# RDS-TCP streams (first byte: the chunk size seed), as the kernel sends them: a probe ping
# with NPATHS=8, the congestion map, two data messages (19 B and 0 B), then a huge h_len.
def tcp_msg(seq, payload, sport=4000, dport=4001, flags=0, ext=b""):
    return struct.pack(">QQIHHBB", seq, 0, len(payload), sport, dport, flags, 0) + bytes(6) + ext + bytes(16 - len(ext)) + payload


put("rds_tcp_stream", "kernel_open", b"\x07" + tcp_msg(1, b"", 1, 0, 0, b"\x05\x00\x08") + tcp_msg(0, bytes(8192), 0, 0, 0x01) + tcp_msg(2, b"hello from the kernel") + tcp_msg(3, b""))
put("rds_tcp_stream", "huge_len", b"\x01" + struct.pack(">QQIHH", 1, 0, 0xFFFFFFFF, 4000, 4001) + bytes(24))
put("rds_tcp_stream", "retransmit", b"\x30" + tcp_msg(1, b"a" * 5000) + tcp_msg(1, b"a" * 5000, flags=0x08) + tcp_msg(2, b"b"))
put("rds_exthdr", "npaths_gen_sport", b"\x05\x00\x08\x06\xde\xad\xbe\xef\x08\x00")
put("rds_exthdr", "rdma_dest", b"\x02\x00\x00\x00\x01\x03\x00\x00\x00\x02\x00\x00\x00\x03")
put("rds_cong", "one_port", bytes(500) + b"\x02" + bytes(7691))
# rds_ib_connect_private as Linux 6.1 sends it over Soft-RoCE (10.78.0.1 -> 10.78.0.2, 3.1).
put("rds_ib_priv", "v4_kernel", bytes([10, 78, 0, 1, 10, 78, 0, 2, 3, 1, 0, 3]) + bytes(20))
put("rds_ib_priv", "v6_4_1", bytes(15) + b"\x01" + bytes(15) + b"\x02"
    + bytes([4, 1, 0, 3, 0, 0, 0, 0]) + struct.pack(">QI", 9, 64) + bytes(4))
