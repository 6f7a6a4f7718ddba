#!/usr/bin/env python3
"""Checks, byte for byte, that a device region holds `dp-perf blk --verify` patterns.

    python3 check_pattern.py DEVICE BYTES [--offset N]

Every 512-byte sector written by `dp-perf blk --verify` is: u32 magic 0x64627670, u32
generation (non-zero), u64 the sector's byte offset on the device (all little-endian), then
496 bytes of xorshift64 output seeded by offset ^ (generation << 40) ^ 0x9E3779B97F4A7C15
(perf/src/blk/verify.rs `fill`). This script recomputes each sector from its own header
and compares all 512 bytes, so a sector that is missing, misplaced, torn or corrupted
fails. It reads with O_DIRECT (the kernel's rnbd-server writes with bios, so the page cache
of the exported device may be stale). Exit status 0 when every sector matches.
"""
import mmap
import os
import struct
import sys

MAGIC = 0x64627670
SECTOR = 512
M64 = (1 << 64) - 1


def sector(off, gen):
    out = bytearray(struct.pack("<IIQ", MAGIC, gen, off))
    x = off ^ (gen << 40) ^ 0x9E3779B97F4A7C15
    for _ in range((SECTOR - 16) // 8):
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        out += struct.pack("<Q", x)
    return bytes(out)


def main():
    args = sys.argv[1:]
    base = 0
    if "--offset" in args:
        i = args.index("--offset")
        base = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    dev, size = args[0], int(args[1])
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    chunk = 1 << 20
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
    bad = 0
    done = 0
    first = None
    while done < size:
        n = min(chunk, size - done)
        got = os.preadv(fd, [memoryview(buf)[:n]], base + done)
        if got != n:
            print(f"short read at {base + done}: {got} of {n}", file=sys.stderr)
            return 1
        for s in range(0, n, SECTOR):
            off = base + done + s
            data = bytes(buf[s : s + SECTOR])
            magic, gen, hoff = struct.unpack_from("<IIQ", data)
            ok = magic == MAGIC and gen != 0 and hoff == off and data == sector(off, gen)
            if not ok:
                bad += 1
                if first is None:
                    first = f"offset {off}: magic {magic:#x} gen {gen} header offset {hoff}"
        done += n
    os.close(fd)
    sectors = size // SECTOR
    if bad:
        print(f"{bad} of {sectors} sectors wrong; first at {first}")
        return 1
    print(f"all {sectors} sectors ({size} bytes) match the pattern byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
