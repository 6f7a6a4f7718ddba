#!/usr/bin/env python3
"""The report of scripts/bench-vs-dpdk.sh: DPDK and dp-perf side by side, with ratios, spreads
and the goals.

Usage: bench_vs_dpdk_report.py OUT DO_RING DO_MEMPOOL DO_CONTENDED DPDK_VERSION MEM_DESC CPUS

OUT is the directory bench-vs-dpdk.sh wrote its logs and JSON files to; the file names are
those it uses. Repeated cases (rounds) are reported as the median per side over the rounds,
with the range and the spread ((max - min) / median); the ratio is of the medians, and the
range of the per-round ratios follows it. Run it by hand on an old OUT to re-print a report.
"""

import glob
import json
import re
import statistics
import sys


def rounds_of(out, pattern):
    """The files of one kind, in round order."""
    return sorted(glob.glob(f"{out}/{pattern}"), key=lambda p: int(re.findall(r"(\d+)\.\w+$", p)[0]))


def load_rows(path, key):
    return json.load(open(path))[key]


class Series:
    """One case measured once per round."""

    def __init__(self, values):
        self.values = [v for v in values if v is not None]

    def __bool__(self):
        return bool(self.values)

    @property
    def median(self):
        return statistics.median(self.values)

    def spread(self):
        m = self.median
        return (max(self.values) - min(self.values)) / m if m else float("nan")

    def cell(self, fmt):
        if not self.values:
            return "-"
        if len(self.values) == 1:
            return fmt(self.median)
        return f"{fmt(self.median)} [{fmt(min(self.values))}-{fmt(max(self.values))}, {100 * self.spread():.0f}%]"


def ratio_cell(ours, dpdk):
    """Ratio of the medians, and the range of the per-round ratios."""
    if not ours or not dpdk:
        return "-", None
    r = ours.median / dpdk.median
    pairs = [o / d for o, d in zip(ours.values, dpdk.values) if d]
    if len(pairs) > 1:
        return f"{r:.2f} ({min(pairs):.2f}-{max(pairs):.2f})", r
    return f"{r:.2f}", r


def parse_dpdk_ring_log(path):
    """(mode, op, batch, cores) -> cycles per element, legacy (pointer-sized) API only."""
    got, section = {}, None
    for line in open(path).read().splitlines():
        if line.startswith("###"):
            section = line
            continue
        m = re.match(r"legacy APIs: (SP/SC|MP/MC): (single|burst|bulk)(?: \(size: (\d+)\))?: ([\d.]+)", line)
        if not m or section is None:
            continue
        mode = "spsc" if m.group(1) == "SP/SC" else "mpmc"
        op, batch, cyc = m.group(2), int(m.group(3) or 1), float(m.group(4))
        if "single element" in section:
            got[(mode, "single", 1, 1)] = cyc
        elif "burst enq/deq" in section or "bulk enq/deq" in section:
            # Per call pair in 22.11: make it per element.
            got[(mode, op, batch, 1)] = cyc / batch
        elif "two physical cores" in section:
            got[(mode, "bulk", batch, 2)] = cyc
    return got


def ring_key(r):
    return (r["mode"], r["op"], r["batch"], r["cores"])


def pool_key(r):
    return (r.get("ring", "multi"), r["cache"], r["cores"], r["bulk"])


def series(rounds, key):
    return Series([r.get(key) for r in rounds])


# The host's cache-line hand-off moves between modes (35-75 ns and 200-215 ns on the 2-vCPU
# development box, switching within minutes): a round in which it changed compares one side in
# one mode with the other side in the other. A round counts only if every hand-off sample taken
# at its block boundaries lies within this factor of the smallest.
STEADY_FACTOR = 2.0
# Fewest counted rounds for a goal verdict; with fewer the goal is INCONCLUSIVE.
MIN_ROUNDS = 3


def steady_rounds(out, kind, n):
    """(indices of the rounds of `kind` whose hand-off stayed steady, report lines).

    Rounds without a hand-off file (runs from before the script took them) all count."""
    keep, notes = [], []
    for i in range(n):
        path = f"{out}/handoff-{kind}-{i + 1}.txt"
        try:
            samples = [float(x) for x in open(path).read().split()]
        except (OSError, ValueError):
            samples = []
        if not samples or max(samples) <= STEADY_FACTOR * min(samples):
            keep.append(i)
            if samples:
                notes.append(f"round {i + 1}: {'/'.join(f'{v:.0f}' for v in samples)} ns")
        else:
            notes.append(f"round {i + 1}: {'/'.join(f'{v:.0f}' for v in samples)} ns EXCLUDED"
                         " (the hand-off changed mode during it)")
    return keep, notes


def screen(out, kind, label, dpdk, ours, inconclusive):
    """Keeps the rounds of `kind` whose hand-off stayed steady, on both sides, and records `label`
    in `inconclusive[kind]` when fewer than MIN_ROUNDS are left. Returns the kept (dpdk, ours)
    rounds and the report lines that say which were kept (printed under the section heading)."""
    keep, notes = steady_rounds(out, kind, len(ours))
    lines = [f"  hand-off at the block boundaries of each {label} round: " + "; ".join(notes),
             f"  {len(keep)} of {len(ours)} rounds counted"]
    if len(keep) < MIN_ROUNDS:
        inconclusive[kind] = f"{label} ({len(keep)} of {len(ours)} rounds with a steady hand-off)"
    return [dpdk[i] for i in keep if i < len(dpdk)], [ours[i] for i in keep], lines


def main():
    out, do_ring, do_mempool, do_contended, version, mem, cpus = sys.argv[1:8]
    do_ring, do_mempool, do_contended = (x == "1" for x in (do_ring, do_mempool, do_contended))
    goals, behind, inconclusive = [], [], {}

    def verdict(ok):
        return "PASS" if ok else "FAIL"

    print(f"dataplane vs DPDK {version} on CPUs {cpus}, DPDK memory: {mem}")
    lat = [json.load(open(f"{out}/limit-{w}.json"))["limit"]["cacheline_oneway_ns"] for w in ("before", "after")]
    print(f"cache-line one-way hand-off between the CPUs: {lat[0]:.0f} ns before, {lat[1]:.0f} ns after"
          " (two-core results are only comparable between runs with similar values)")
    loads = [open(f"{out}/loadavg-{w}.txt").read().strip() for w in ("before", "after")]
    print(f"load average: {loads[0]} before, {loads[1]} after (numbers taken under load are indicative only)")

    spsc32 = {}
    if do_ring:
        logs = rounds_of(out, "dpdk-ring-[0-9]*.log")
        m = re.search(r"TSC frequency is ~(\d+) KHz", open(logs[0]).read())
        if m is None:
            sys.exit("bench-vs-dpdk: DPDK did not log its TSC frequency")
        ghz = float(m.group(1)) / 1e6
        dpdk_rounds = [{k: v / ghz for k, v in parse_dpdk_ring_log(p).items()} for p in logs]
        for i, p in enumerate(rounds_of(out, "dpdk-ring-modes-*.json")):
            dpdk_rounds[i].update({ring_key(r): r["ns_per_elem"] for r in load_rows(p, "ring")})
        ours_rounds = [{ring_key(r): r["ns_per_elem"] for r in load_rows(p, "ring")}
                       for p in rounds_of(out, "dp-ring-*.json")]
        dpdk_rounds, ours_rounds, steady = screen(out, "ring", "ring", dpdk_rounds, ours_rounds,
                                                  inconclusive)
        print(f"\nRING: ns per element (lower is better), median over {len(ours_rounds)} alternated rounds per side"
              f" [range, spread]; DPDK cycles / {ghz:.3f} GHz TSC")
        print("  one core: one enqueue + one dequeue per element; two cores: producer + consumer time per"
              " element (DPDK's sum). SP/SC and MP/MC: DPDK's ring_perf_autotest; RTS and HTS: its loops"
              " in perf/dpdk/dpdk-ring-mempool.c")
        print("\n".join(steady))
        print(f"  {'mode':<5} {'op':<6} {'batch':>5} {'cores':>5} {'DPDK ns':>26} {'ours ns':>26}  ours/DPDK (per round)")
        for mode in ("spsc", "mpmc", "rts", "hts"):
            cases = [(mode, "single", 1, 1)]
            cases += [(mode, op, b, 1) for op in ("burst", "bulk") for b in (8, 32)]
            cases += [(mode, "bulk", b, 2) for b in (8, 32)]
            for key in cases:
                d, o = series(dpdk_rounds, key), series(ours_rounds, key)
                text, r = ratio_cell(o, d)
                print(f"  {key[0]:<5} {key[1]:<6} {key[2]:>5} {key[3]:>5} {d.cell(lambda v: f'{v:.2f}'):>26}"
                      f" {o.cell(lambda v: f'{v:.2f}'):>26}  {text}")
                if r is not None and mode in ("spsc", "mpmc") and r > 1:
                    behind.append(f"ring {' '.join(map(str, key))} ({r:.2f})")
        o, d = series(ours_rounds, ("spsc", "bulk", 32, 2)), series(dpdk_rounds, ("spsc", "bulk", 32, 2))
        if o and d:
            spsc32["ring_perf_autotest"] = o.median / d.median

    if do_mempool:
        dpdk = {}
        block = None
        for line in open(f"{out}/dpdk-mempool.log").read().splitlines():
            if line.startswith("start performance test"):
                block = {"start performance test (without cache)": "nocache",
                         "start performance test (with cache)": "cache"}.get(line.strip(), "other")
                continue
            m = re.match(r"mempool_autotest cache=(\d+) cores=(\d+) n_get_bulk=(\d+) n_put_bulk=(\d+) "
                         r"n_keep=(\d+)(?: constant_n=(\d))? rate_persec=(\d+)", line)
            if not m or block not in ("nocache", "cache"):
                continue
            cache, cores, g, p, keep = (int(m.group(i)) for i in range(1, 6))
            const = int(m.group(6) or 0)
            if g != p or keep != 128:
                continue
            dpdk.setdefault((cache, cores, g, const), int(m.group(7)))
        ours = {(r["cache"], r["cores"], r["bulk"]): r["ops_per_sec"]
                for r in load_rows(f"{out}/dp-mempool.json", "mempool")
                if r.get("keep", 128) == 128 and r.get("ring", "multi") == "multi"}
        print("\nMEMPOOL: objects got+put per second, summed over cores, n_keep=128 (higher is better),"
              " one run of DPDK's mempool_perf_autotest (ring_mp_mc) and dp-perf (Multi ring)")
        print(f"  {'cache':>5} {'cores':>5} {'bulk':>4} {'DPDK n=var':>14} {'DPDK n=const':>14} {'ours':>14} {'ours/DPDK':>9}")
        for cache in (0, 512):
            for cores in (1, 2):
                for bulk in (1, 4, 8, 32):
                    d0 = dpdk.get((cache, cores, bulk, 0))
                    d1 = dpdk.get((cache, cores, bulk, 1))
                    o = ours.get((cache, cores, bulk))

                    def fmt(v):
                        return f"{v:>14,.0f}" if v is not None else f"{'-':>14}"
                    ratio = f"{o / d0:>9.2f}" if o and d0 else f"{'-':>9}"
                    print(f"  {cache:>5} {cores:>5} {bulk:>4} {fmt(d0)} {fmt(d1)} {fmt(o)} {ratio}")
                    if o and d0 and o < d0:
                        behind.append(f"mempool cache={cache} cores={cores} bulk={bulk} ({o / d0:.2f})")
        parts, ok = [], True
        for cores in (1, 2):
            d0, d1, o = dpdk.get((512, cores, 32, 0)), dpdk.get((512, cores, 32, 1)), ours.get((512, cores, 32))
            if d0 is None or o is None:
                parts.append(f"{cores} core(s): missing")
                ok = False
                continue
            ok = ok and o >= d0
            extra = f", vs n=const {o / d1:.2f}" if d1 else ""
            parts.append(f"{cores} core(s) ours {o / 1e6:,.0f} M/s vs DPDK {d0 / 1e6:,.0f} M/s = {o / d0:.2f}{extra}")
        goals.append(({"mempool"}, "GOAL pool: cache 512 bulk 32 ops/s, ratio ours/DPDK (>= 1 passes): "
                     + "; ".join(parts) + f" -> {verdict(ok)}"))
        if not do_contended:
            for bulk in (1, 32):
                d0, o = dpdk.get((0, 2, bulk, 0)), ours.get((0, 2, bulk))
                if d0 and o:
                    goals.append(({"mempool"}, f"GOAL pool: no cache bulk {bulk} on 2 cores, one autotest"
                                  f" run (not the contended rounds): ours/DPDK {o / d0:.2f} (>= 1.2"
                                  f" passes) -> {verdict(o / d0 >= 1.2)}"))

    if do_contended:
        dpdk_pool = [{pool_key(r): r["ops_per_sec"] for r in load_rows(p, "mempool")}
                     for p in rounds_of(out, "dpdk-contended-pool-*.json")]
        ours_pool = [{pool_key(r): r["ops_per_sec"] for r in load_rows(p, "mempool")}
                     for p in rounds_of(out, "dp-contended-pool-*.json")]
        dpdk_pool, ours_pool, steady = screen(out, "contended-pool", "contended pool", dpdk_pool,
                                              ours_pool, inconclusive)
        print(f"\nCONTENDED POOLS: no cache, 2 cores, n_keep=128, Mops/s (higher is better), median over"
              f" {len(ours_pool)} alternated rounds [range, spread]; DPDK's pools (ops ring_mp_mc,"
              " ring_mt_rts, ring_mt_hts) in perf/dpdk/dpdk-ring-mempool.c")
        print("\n".join(steady))
        print(f"  {'ring':<5} {'bulk':>4} {'DPDK Mops/s':>28} {'ours Mops/s':>28}  ours/DPDK (per round)")
        pool_ratio = {}
        for ring in ("multi", "rts", "hts"):
            for bulk in (1, 4, 8, 32):
                key = (ring, 0, 2, bulk)
                d, o = series(dpdk_pool, key), series(ours_pool, key)
                text, r = ratio_cell(o, d)
                pool_ratio[(ring, bulk)] = (r, o, d)
                print(f"  {ring:<5} {bulk:>4} {d.cell(lambda v: f'{v / 1e6:.1f}'):>28}"
                      f" {o.cell(lambda v: f'{v / 1e6:.1f}'):>28}  {text}")
        dpdk_ring = [{ring_key(r): r["ns_per_elem"] for r in load_rows(p, "ring")}
                     for p in rounds_of(out, "dpdk-contended-ring-*.json")]
        ours_ring = [{ring_key(r): r["ns_per_elem"] for r in load_rows(p, "ring")}
                     for p in rounds_of(out, "dp-contended-ring-*.json")]
        dpdk_ring, ours_ring, steady = screen(out, "contended-ring", "contended ring", dpdk_ring,
                                              ours_ring, inconclusive)
        print(f"\nCONTENDED RINGS: two cores, one producer and one consumer thread, ns per element (DPDK's"
              f" sum; lower is better), median over {len(ours_ring)} alternated rounds; DPDK in"
              " perf/dpdk/dpdk-ring-mempool.c (ring_perf_autotest's loop, long passes)")
        print("\n".join(steady))
        print(f"  {'mode':<5} {'batch':>5} {'DPDK ns':>26} {'ours ns':>26}  ours/DPDK (per round)")
        for mode in ("spsc", "mpmc", "rts", "hts"):
            for batch in (8, 32):
                key = (mode, "bulk", batch, 2)
                d, o = series(dpdk_ring, key), series(ours_ring, key)
                text, r = ratio_cell(o, d)
                print(f"  {mode:<5} {batch:>5} {d.cell(lambda v: f'{v:.2f}'):>26}"
                      f" {o.cell(lambda v: f'{v:.2f}'):>26}  {text}")
                if key == ("spsc", "bulk", 32, 2) and r is not None:
                    spsc32["harness, long passes"] = r
        for bulk in (1, 32):
            r, o, d = pool_ratio[("multi", bulk)]
            if r is None:
                goals.append(({"contended-pool"}, f"GOAL pool: no cache bulk {bulk} on 2 cores -> FAIL (missing result)"))
                continue
            goals.append(({"contended-pool"}, f"GOAL pool: no cache bulk {bulk} on 2 cores (Multi vs ring_mp_mc),"
                          f" median of {len(o.values)} rounds: ours {o.median / 1e6:.1f} vs DPDK"
                          f" {d.median / 1e6:.1f} Mops/s = {r:.2f} (>= 1.2 passes) -> {verdict(r >= 1.2)}"))

    if spsc32:
        parts = "; ".join(f"vs {src} {r:.2f}" for src, r in spsc32.items())
        goals.append(({"ring", "contended-ring"}, f"GOAL ring: SPSC bulk 32 on two cores, ns/elem ours/DPDK {parts}"
                      f" (<= 0.6 passes) -> {verdict(all(r <= 0.6 for r in spsc32.values()))}"))
    elif do_ring or do_contended:
        goals.append(({"ring", "contended-ring"}, "GOAL ring: SPSC bulk 32 on two cores -> FAIL (missing result)"))
    if do_ring or do_mempool:
        goals.append(({"ring", "mempool"}, f"GOAL every existing case ahead of DPDK: {len(behind)} behind"
                      + (f": {', '.join(behind)}" if behind else "") + f" -> {verdict(not behind)}"))

    print()
    for kinds, g in goals:
        # A goal measured on too few steady rounds cannot pass (it still fails if it failed).
        if kinds & inconclusive.keys() and g.endswith("-> PASS"):
            g = g[: -len("PASS")] + "INCONCLUSIVE"
        print(g)
    if inconclusive:
        print(f"INCONCLUSIVE: fewer than {MIN_ROUNDS} rounds kept a steady hand-off in: "
              + "; ".join(inconclusive.values()) + ". Re-run when `dp-perf limit --quick` stays in one"
              " mode, or with more --rounds.")


if __name__ == "__main__":
    main()
