/* SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * dpdk-ring-mempool: DPDK's own rte_ring and rte_mempool, driven by the loops of DPDK's
 * ring_perf_autotest and mempool_perf_autotest, with the cases those tests do not have and
 * with repeatable, short runs. It is the DPDK side of `scripts/bench-vs-dpdk.sh --contended`
 * and of the RTS/HTS ring comparison; dp-perf is the other side.
 *
 * Why not only dpdk-test: DPDK 22.11's ring_perf_autotest has no RTS or HTS cases, and
 * mempool_perf_autotest cannot be narrowed (about 40 minutes per run, 5 s per case), so it
 * cannot be alternated with dp-perf several times to take medians. This harness runs exactly
 * the cases asked for, as often as asked, and prints them in dp-perf's JSON shapes.
 *
 *   dpdk-ring-mempool [EAL args] -- ring    [--modes spsc,mpmc,rts,hts] [--cores 1,2]
 *                                           [--batches 8,32] [--reps N] [--elems N | --calls N]
 *                                           [--quick]
 *   dpdk-ring-mempool [EAL args] -- mempool [--rings multi,rts,hts] [--caches 0,512]
 *                                           [--cores 1,2] [--bulks 1,4,8,32] [--keep 128]
 *                                           [--seconds S]
 *
 * EAL needs two lcores (-l A,B): one-core cases run on the main lcore, two-core cases add the
 * second. Output: one JSON object on stdout, {"ring": [...]} or {"mempool": [...]}, rows as
 * dp-perf's (`perf/src/ring_perf.rs`, `perf/src/pool_perf.rs`), plus "tsc_hz".
 *
 * ring: the loops of test_ring_perf.c. One core: `iterations` x (enqueue n; dequeue n) with
 * the mode's own API (rte_ring_sp_/mp_/mp_rts_/mp_hts_enqueue_bulk and the dequeue
 * counterparts; single = bulk of 1, as rte_ring_mp_enqueue is), reported per element. Two
 * cores: a producer lcore retries enqueue_bulk(n), a consumer lcore retries dequeue_bulk(n),
 * with rte_pause() between retries; each side's time per element, summed (DPDK's two-core
 * number). Unlike the autotest (2^15 calls, a few ms), every two-core pass moves `--elems`
 * elements (default 2^26, as dp-perf) after a warm-up of a tenth, starting from a barrier, on
 * a fresh ring, and the median of `--reps` passes is printed: the same method as dp-perf's.
 * `--calls N` makes each two-core pass N calls per side instead (N x batch elements), the
 * autotest's pass length with N = 32768, as `dp-perf ring --two-core-calls`.
 * Rings have 4096 slots (capacity 4095; DPDK's test does not set RING_F_EXACT_SZ). --quick
 * runs 1/256 of the one-core iterations, 2^18 two-core elements and one pass per case: a check
 * that everything runs, with meaningless numbers.
 *
 * mempool: per_lcore_mempool_test of test_mempool_perf.c: each core repeats "get n_keep
 * objects in chunks of n_get_bulk, put them back in chunks of n_put_bulk" for `--seconds`,
 * 65536 objects between clock reads, with n_get_bulk = n_put_bulk = bulk (not compile-time
 * constants, DPDK's constant_n=0). The pool is DPDK's: MEMPOOL_SIZE = 2 x (512 + 512) - 1
 * objects of 2048 bytes, created with rte_mempool_create (ops ring_mp_mc) or, for RTS/HTS,
 * rte_mempool_create_empty + rte_mempool_set_ops_byname("ring_mt_rts"/"ring_mt_hts") +
 * rte_mempool_populate_default; cache 0 or the default per-lcore cache of the given size.
 * rate = objects per second summed over cores, each core's count divided by its own elapsed
 * time (DPDK divides by the nominal 5 s; dp-perf divides by the elapsed time, and so does
 * this).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#define RING_SIZE 4096
#define MAX_BATCH 128
#define N_OBJS 65536
#define ELT_SIZE 2048
#define MAX_KEEP 512
#define CACHE_MAX RTE_MEMPOOL_CACHE_MAX_SIZE
#define MAX_LIST 8

enum mode { SPSC, MPMC, RTS, HTS, N_MODES };
static const char *const mode_names[N_MODES] = {"spsc", "mpmc", "rts", "hts"};
/* Pool ring names as dp-perf's `ring` field, and DPDK's mempool ops for them. */
static const char *const pool_ring_names[N_MODES] = {NULL, "multi", "rts", "hts"};
static const char *const pool_ops[N_MODES] = {NULL, "ring_mp_mc", "ring_mt_rts", "ring_mt_hts"};

static void die(const char *what)
{
	fprintf(stderr, "dpdk-ring-mempool: %s\n", what);
	exit(2);
}

/* A comma-separated list of unsigned numbers. */
static unsigned parse_list(const char *s, unsigned *out, unsigned max_len, const char *what)
{
	unsigned n = 0;
	char *copy = strdup(s), *save = NULL;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long v = strtoul(tok, &end, 10);
		if (*end != '\0' || n == max_len) {
			fprintf(stderr, "dpdk-ring-mempool: bad %s list '%s'\n", what, s);
			exit(2);
		}
		out[n++] = (unsigned)v;
	}
	free(copy);
	return n;
}

/* A comma-separated list of names out of `names`; returns the indices. */
static unsigned parse_names(const char *s, const char *const *names, unsigned *out,
			    const char *what)
{
	unsigned n = 0;
	char *copy = strdup(s), *save = NULL;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		unsigned i;
		for (i = 0; i < N_MODES; i++)
			if (names[i] && strcmp(tok, names[i]) == 0)
				break;
		if (i == N_MODES || n == MAX_LIST) {
			fprintf(stderr, "dpdk-ring-mempool: unknown %s '%s'\n", what, tok);
			exit(2);
		}
		out[n++] = i;
	}
	free(copy);
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static bool first_row = true;

static void row_sep(void)
{
	printf(first_row ? "\n    " : ",\n    ");
	first_row = false;
}

/* ---- ring ---------------------------------------------------------------------------- */

static unsigned ring_flags(enum mode m)
{
	switch (m) {
	case SPSC:
		return RING_F_SP_ENQ | RING_F_SC_DEQ;
	case RTS:
		return RING_F_MP_RTS_ENQ | RING_F_MC_RTS_DEQ;
	case HTS:
		return RING_F_MP_HTS_ENQ | RING_F_MC_HTS_DEQ;
	default:
		return 0;
	}
}

/* The mode's own enqueue/dequeue, as test_ring.h calls them: no sync-type dispatch. */
static __rte_always_inline unsigned enq(enum mode m, struct rte_ring *r, void **objs, unsigned n,
					bool burst)
{
	switch (m) {
	case SPSC:
		return burst ? rte_ring_sp_enqueue_burst(r, objs, n, NULL)
			     : rte_ring_sp_enqueue_bulk(r, objs, n, NULL);
	case MPMC:
		return burst ? rte_ring_mp_enqueue_burst(r, objs, n, NULL)
			     : rte_ring_mp_enqueue_bulk(r, objs, n, NULL);
	case RTS:
		return burst ? rte_ring_mp_rts_enqueue_burst(r, objs, n, NULL)
			     : rte_ring_mp_rts_enqueue_bulk(r, objs, n, NULL);
	default:
		return burst ? rte_ring_mp_hts_enqueue_burst(r, objs, n, NULL)
			     : rte_ring_mp_hts_enqueue_bulk(r, objs, n, NULL);
	}
}

static __rte_always_inline unsigned deq(enum mode m, struct rte_ring *r, void **objs, unsigned n,
					bool burst)
{
	switch (m) {
	case SPSC:
		return burst ? rte_ring_sc_dequeue_burst(r, objs, n, NULL)
			     : rte_ring_sc_dequeue_bulk(r, objs, n, NULL);
	case MPMC:
		return burst ? rte_ring_mc_dequeue_burst(r, objs, n, NULL)
			     : rte_ring_mc_dequeue_bulk(r, objs, n, NULL);
	case RTS:
		return burst ? rte_ring_mc_rts_dequeue_burst(r, objs, n, NULL)
			     : rte_ring_mc_rts_dequeue_bulk(r, objs, n, NULL);
	default:
		return burst ? rte_ring_mc_hts_dequeue_burst(r, objs, n, NULL)
			     : rte_ring_mc_hts_dequeue_bulk(r, objs, n, NULL);
	}
}

static unsigned ring_seq;

static struct rte_ring *make_ring(enum mode m)
{
	char name[RTE_RING_NAMESIZE];
	snprintf(name, sizeof(name), "perf%u", ring_seq++);
	struct rte_ring *r = rte_ring_create(name, RING_SIZE, rte_socket_id(), ring_flags(m));
	if (r == NULL)
		die("rte_ring_create failed");
	return r;
}

/* One one-core pass: cycles per element of `iters` x (enqueue n; dequeue n). */
static double one_core_pass(enum mode m, unsigned n, bool burst, uint64_t iters)
{
	/* Opaque to the optimiser, like DPDK's volatile bulk sizes. */
	volatile unsigned vn = n;
	void *objs[MAX_BATCH] = {0};
	struct rte_ring *r = make_ring(m);
	uint64_t moved = 0;
	for (int pass = 0; pass < 2; pass++) {
		uint64_t count = pass == 0 ? iters / 10 + 1 : iters;
		moved = 0;
		const uint64_t t0 = rte_rdtsc();
		for (uint64_t i = 0; i < count; i++) {
			moved += enq(m, r, objs, vn, burst);
			moved += deq(m, r, objs, vn, burst);
		}
		const uint64_t t1 = rte_rdtsc();
		if (moved != 2 * count * n)
			die("an uncontended ring moved fewer elements than asked");
		if (pass == 1) {
			rte_ring_free(r);
			return (double)(t1 - t0) / ((double)count * n);
		}
	}
	return 0;
}

struct two_core_arg {
	struct rte_ring *r;
	enum mode m;
	unsigned n;
	uint64_t calls, warm;
	uint64_t cycles;
};

static volatile uint32_t arrived;

/* Both sides finish their warm-up, then meet here with the ring empty. */
static void barrier2(void)
{
	__atomic_add_fetch(&arrived, 1, __ATOMIC_ACQ_REL);
	while (__atomic_load_n(&arrived, __ATOMIC_ACQUIRE) < 2)
		rte_pause();
}

static int producer(void *p)
{
	struct two_core_arg *a = p;
	void *objs[MAX_BATCH] = {0};
	for (uint64_t i = 0; i < a->warm; i++)
		while (enq(a->m, a->r, objs, a->n, false) == 0)
			rte_pause();
	barrier2();
	const uint64_t t0 = rte_rdtsc();
	for (uint64_t i = 0; i < a->calls; i++)
		while (enq(a->m, a->r, objs, a->n, false) == 0)
			rte_pause();
	a->cycles = rte_rdtsc() - t0;
	return 0;
}

static int consumer(void *p)
{
	struct two_core_arg *a = p;
	void *objs[MAX_BATCH];
	for (uint64_t i = 0; i < a->warm; i++)
		while (deq(a->m, a->r, objs, a->n, false) == 0)
			rte_pause();
	barrier2();
	const uint64_t t0 = rte_rdtsc();
	for (uint64_t i = 0; i < a->calls; i++)
		while (deq(a->m, a->r, objs, a->n, false) == 0)
			rte_pause();
	a->cycles = rte_rdtsc() - t0;
	return 0;
}

/* One two-core pass: producer + consumer cycles per element (DPDK's sum). */
static double two_core_pass(enum mode m, unsigned n, uint64_t elems, uint64_t fixed_calls,
			    unsigned worker)
{
	struct rte_ring *r = make_ring(m);
	uint64_t calls = fixed_calls ? fixed_calls : elems / n;
	struct two_core_arg p = {.r = r, .m = m, .n = n, .calls = calls, .warm = calls / 10 + 1};
	struct two_core_arg c = p;
	__atomic_store_n(&arrived, 0, __ATOMIC_RELEASE);
	if (rte_eal_remote_launch(consumer, &c, worker) != 0)
		die("rte_eal_remote_launch failed");
	producer(&p);
	if (rte_eal_wait_lcore(worker) < 0)
		die("the consumer lcore failed");
	rte_ring_free(r);
	return (double)p.cycles / ((double)calls * n) + (double)c.cycles / ((double)calls * n);
}

static int ring_main(int argc, char **argv, unsigned worker)
{
	unsigned modes[MAX_LIST] = {SPSC, MPMC, RTS, HTS}, n_modes = 4;
	unsigned cores[2] = {1, 2}, n_cores = 2;
	unsigned batches[MAX_LIST] = {8, 32}, n_batches = 2;
	unsigned reps = 3, iter_shift = 0;
	uint64_t elems = 1ull << 26, calls = 0;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			reps = 1;
			elems = 1ull << 18;
			iter_shift = 8;
			continue;
		}
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (v == NULL)
			die("option without a value");
		if (!strcmp(argv[i], "--modes"))
			n_modes = parse_names(v, mode_names, modes, "ring mode");
		else if (!strcmp(argv[i], "--cores"))
			n_cores = parse_list(v, cores, 2, "core");
		else if (!strcmp(argv[i], "--batches"))
			n_batches = parse_list(v, batches, MAX_LIST, "batch");
		else if (!strcmp(argv[i], "--reps"))
			reps = (unsigned)strtoul(v, NULL, 10);
		else if (!strcmp(argv[i], "--elems"))
			elems = strtoull(v, NULL, 10);
		else if (!strcmp(argv[i], "--calls")) {
			calls = strtoull(v, NULL, 10);
			if (calls == 0)
				die("--calls must be positive");
		} else
			die("unknown ring option (see the header of dpdk-ring-mempool.c)");
		i++;
	}
	if (reps == 0 || reps > 1000 || elems == 0)
		die("--reps must be 1..1000 and --elems positive");
	for (unsigned b = 0; b < n_batches; b++)
		if (batches[b] == 0 || batches[b] > MAX_BATCH)
			die("batch sizes must be 1..128");
	const double ns_per_cycle = 1e9 / (double)rte_get_tsc_hz();
	double samples[1000];
	printf("{\"tsc_hz\": %" PRIu64 ", \"ring\": [", rte_get_tsc_hz());
	for (unsigned mi = 0; mi < n_modes; mi++) {
		enum mode m = modes[mi];
		for (unsigned ci = 0; ci < n_cores; ci++) {
			if (cores[ci] == 1) {
				/* single (2^24 pairs), then burst and bulk (2^23 pairs per size). */
				struct { const char *op; bool burst; unsigned n; uint64_t iters; } cases[2 * MAX_LIST + 1];
				unsigned nc = 0;
				cases[nc++] = (typeof(cases[0])){"single", false, 1, 1u << (24 - iter_shift)};
				for (unsigned b = 0; b < n_batches; b++)
					cases[nc++] = (typeof(cases[0])){"burst", true, batches[b], 1u << (23 - iter_shift)};
				for (unsigned b = 0; b < n_batches; b++)
					cases[nc++] = (typeof(cases[0])){"bulk", false, batches[b], 1u << (23 - iter_shift)};
				for (unsigned k = 0; k < nc; k++) {
					for (unsigned rep = 0; rep < reps; rep++)
						samples[rep] = one_core_pass(m, cases[k].n, cases[k].burst,
									     cases[k].iters);
					row_sep();
					printf("{\"mode\": \"%s\", \"op\": \"%s\", \"batch\": %u, \"cores\": 1, "
					       "\"ns_per_elem\": %.4f}",
					       mode_names[m], cases[k].op, cases[k].n,
					       median(samples, reps) * ns_per_cycle);
				}
			} else if (cores[ci] == 2) {
				for (unsigned b = 0; b < n_batches; b++) {
					for (unsigned rep = 0; rep < reps; rep++)
						samples[rep] = two_core_pass(m, batches[b], elems, calls, worker);
					row_sep();
					printf("{\"mode\": \"%s\", \"op\": \"bulk\", \"batch\": %u, \"cores\": 2, "
					       "\"ns_per_elem\": %.4f}",
					       mode_names[m], batches[b], median(samples, reps) * ns_per_cycle);
				}
			} else {
				die("core counts must be 1 or 2");
			}
			fflush(stdout);
		}
	}
	printf("\n]}\n");
	return 0;
}

/* ---- mempool ------------------------------------------------------------------------- */

struct pool_arg {
	struct rte_mempool *mp;
	unsigned bulk, keep;
	uint64_t run_cycles;
	uint64_t objects, cycles;
	int failed;
};

static volatile uint32_t go;

static int pool_worker(void *p)
{
	struct pool_arg *a = p;
	void *table[MAX_KEEP] __rte_cache_aligned;
	struct rte_mempool_cache *cache = rte_mempool_default_cache(a->mp, rte_lcore_id());
	/* Opaque bulk and keep, as DPDK's constant_n=0. */
	volatile unsigned vbulk = a->bulk, vkeep = a->keep;
	const unsigned bulk = vbulk, keep = vkeep;
	a->objects = 0;
	a->failed = 0;
	__atomic_add_fetch(&arrived, 1, __ATOMIC_ACQ_REL);
	while (__atomic_load_n(&go, __ATOMIC_ACQUIRE) == 0)
		rte_pause();
	const uint64_t t0 = rte_get_timer_cycles();
	uint64_t now = t0;
	while (now - t0 < a->run_cycles) {
		for (unsigned i = 0; i < N_OBJS / keep; i++) {
			for (unsigned idx = 0; idx < keep; idx += bulk)
				if (unlikely(rte_mempool_generic_get(a->mp, &table[idx], bulk, cache) < 0)) {
					a->failed = 1;
					return -1;
				}
			for (unsigned idx = 0; idx < keep; idx += bulk)
				rte_mempool_generic_put(a->mp, &table[idx], bulk, cache);
		}
		a->objects += N_OBJS;
		now = rte_get_timer_cycles();
	}
	a->cycles = now - t0;
	return 0;
}

static unsigned pool_seq;

static struct rte_mempool *make_pool(enum mode ring, unsigned cache, unsigned size)
{
	char name[RTE_MEMPOOL_NAMESIZE];
	snprintf(name, sizeof(name), "perf%u", pool_seq++);
	struct rte_mempool *mp;
	if (ring == MPMC) {
		mp = rte_mempool_create(name, size, ELT_SIZE, cache, 0, NULL, NULL, NULL, NULL,
					SOCKET_ID_ANY, 0);
	} else {
		mp = rte_mempool_create_empty(name, size, ELT_SIZE, cache, 0, SOCKET_ID_ANY, 0);
		if (mp != NULL && (rte_mempool_set_ops_byname(mp, pool_ops[ring], NULL) < 0 ||
				   rte_mempool_populate_default(mp) < 0)) {
			rte_mempool_free(mp);
			mp = NULL;
		}
	}
	if (mp == NULL) {
		fprintf(stderr, "dpdk-ring-mempool: cannot create a %s pool of %u objects: %s\n",
			pool_ops[ring], size, rte_strerror(rte_errno));
		exit(1);
	}
	return mp;
}

static int mempool_main(int argc, char **argv, unsigned worker)
{
	unsigned rings[MAX_LIST] = {MPMC}, n_rings = 1;
	unsigned caches[MAX_LIST] = {0}, n_caches = 1;
	unsigned cores[2] = {1, 2}, n_cores = 2;
	unsigned bulks[MAX_LIST] = {1, 4, 8, 32}, n_bulks = 4;
	unsigned keep = 128;
	double seconds = 2.0;
	for (int i = 0; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (v == NULL)
			die("option without a value");
		if (!strcmp(argv[i], "--rings"))
			n_rings = parse_names(v, pool_ring_names, rings, "pool ring");
		else if (!strcmp(argv[i], "--caches"))
			n_caches = parse_list(v, caches, MAX_LIST, "cache");
		else if (!strcmp(argv[i], "--cores"))
			n_cores = parse_list(v, cores, 2, "core");
		else if (!strcmp(argv[i], "--bulks"))
			n_bulks = parse_list(v, bulks, MAX_LIST, "bulk");
		else if (!strcmp(argv[i], "--keep"))
			keep = (unsigned)strtoul(v, NULL, 10);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = strtod(v, NULL);
		else
			die("unknown mempool option (see the header of dpdk-ring-mempool.c)");
		i++;
	}
	if (keep == 0 || keep > MAX_KEEP || !(seconds > 0 && seconds <= 3600))
		die("--keep must be 1..512 and --seconds in (0, 3600]");
	for (unsigned b = 0; b < n_bulks; b++)
		if (bulks[b] == 0 || keep % bulks[b] != 0)
			die("every bulk must divide keep");
	for (unsigned c = 0; c < n_caches; c++)
		if (caches[c] > CACHE_MAX)
			die("cache sizes must be at most 512");
	/* DPDK's MEMPOOL_SIZE on two lcores. */
	const unsigned size = 2 * (MAX_KEEP + CACHE_MAX) - 1;
	const uint64_t hz = rte_get_timer_hz();
	printf("{\"tsc_hz\": %" PRIu64 ", \"mempool\": [", rte_get_tsc_hz());
	for (unsigned ri = 0; ri < n_rings; ri++)
		for (unsigned ci = 0; ci < n_caches; ci++)
			for (unsigned k = 0; k < n_cores; k++)
				for (unsigned b = 0; b < n_bulks; b++) {
					struct rte_mempool *mp = make_pool(rings[ri], caches[ci], size);
					struct pool_arg a = {.mp = mp, .bulk = bulks[b], .keep = keep,
							     .run_cycles = (uint64_t)(seconds * hz)};
					struct pool_arg w = a;
					__atomic_store_n(&arrived, 0, __ATOMIC_RELEASE);
					__atomic_store_n(&go, 0, __ATOMIC_RELEASE);
					if (cores[k] == 2 && rte_eal_remote_launch(pool_worker, &w, worker) != 0)
						die("rte_eal_remote_launch failed");
					if (cores[k] == 2)
						while (__atomic_load_n(&arrived, __ATOMIC_ACQUIRE) < 1)
							rte_pause();
					__atomic_store_n(&go, 1, __ATOMIC_RELEASE);
					pool_worker(&a);
					if (cores[k] == 2 && rte_eal_wait_lcore(worker) < 0)
						a.failed = 1;
					if (a.failed || (cores[k] == 2 && w.failed))
						die("a get failed although the pool holds enough objects");
					double rate = (double)a.objects * hz / (double)a.cycles;
					if (cores[k] == 2)
						rate += (double)w.objects * hz / (double)w.cycles;
					row_sep();
					printf("{\"ring\": \"%s\", \"cache\": %u, \"bulk\": %u, \"keep\": %u, "
					       "\"cores\": %u, \"ops_per_sec\": %.0f}",
					       pool_ring_names[rings[ri]], caches[ci], bulks[b], keep,
					       cores[k], rate);
					fflush(stdout);
					rte_mempool_free(mp);
				}
	printf("\n]}\n");
	return 0;
}

int main(int argc, char **argv)
{
	int used = rte_eal_init(argc, argv);
	if (used < 0)
		die("rte_eal_init failed (EAL arguments before --, e.g. -l 0,1 --no-pci)");
	argc -= used;
	argv += used;
	/* argv[0] is the program name (EAL consumed up to and including "--"). */
	if (argc < 2)
		die("usage: dpdk-ring-mempool [EAL args] -- ring|mempool [options]");
	unsigned worker = rte_get_next_lcore(rte_get_main_lcore(), 1, 0);
	if (worker >= RTE_MAX_LCORE)
		die("EAL needs two lcores (-l A,B)");
	int rc;
	if (!strcmp(argv[1], "ring"))
		rc = ring_main(argc - 2, argv + 2, worker);
	else if (!strcmp(argv[1], "mempool"))
		rc = mempool_main(argc - 2, argv + 2, worker);
	else
		die("the command is 'ring' or 'mempool'");
	rte_eal_cleanup();
	return rc;
}
