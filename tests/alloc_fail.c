/* Allocation failure at every allocation of a realistic scenario, under
   ASan/LSan (build/alloc-fail). The scenario: an arena, batched requests with
   plans, K/V writes and attention on the CPU backend, a windowed session over
   many chunks, fork, offload / reload / trim, export / import, a keyed entry
   read through a cross plan; an arena of two layer groups (fenced, with the
   debug checks: checksummed host copies) with a lockstep pair admitted,
   planned per group, offloaded and reloaded, a request with a retention of
   its own in one group, make_room parking, flush and reset; and a CUDA store
   on the mock driver with its own arena. It runs once per allocation N, with "fail only the N-th" and "fail
   from the N-th on", through the compile-time macros (MSKV_MALLOC/REALLOC/
   FREE) and through the run-time allocators of the descriptors; device and
   pinned allocations of the mock driver count as allocations too.
   Whenever a call fails: it failed because an allocation failed (no other
   reason), with OUT_OF_MEMORY (CUDA for a device allocation), the arena's
   digest is unchanged and its audit passes, and the same call succeeds when
   retried with allocations allowed. A call that saw an allocation fail must
   not report success. After every run nothing is left allocated. */
#include <stdlib.h>
#include <stdint.h>

/* ---- the failing allocator, behind both the macros and the descriptors ---- */

static struct af_state {
    long count;        /* allocations asked for so far in this run */
    long fail_at;      /* 1-based; 0 = never */
    int fail_from;     /* fail every allocation from fail_at on */
    int paused;        /* a retry: allocations succeed and are not counted */
    long failed;       /* allocations refused so far */
    long live;         /* outstanding blocks */
    int runtime;       /* the scenario passes af_allocator() in descriptors */
} af;

static int af_refuse(void) {
    if (af.paused) return 0;
    af.count++;
    if (af.fail_at > 0 && (af.count == af.fail_at || (af.fail_from && af.count > af.fail_at))) { af.failed++; return 1; }
    return 0;
}
static void *af_malloc(size_t n) {
    void *p;
    if (af_refuse()) return NULL;
    p = malloc(n);
    if (p) af.live++;
    return p;
}
static void *af_realloc(void *p, size_t n) {
    void *q;
    if (af_refuse()) return NULL;
    q = realloc(p, n);
    if (q && !p) af.live++;
    return q;
}
static void af_free(void *p) { if (p) { af.live--; free(p); } }

#define MSKV_MALLOC(sz, u) ((void)(u), af_malloc(sz))
#define MSKV_REALLOC(p, sz, u) ((void)(u), af_realloc((p), (sz)))
#define MSKV_FREE(p, u) ((void)(u), af_free(p))
#define MSTAR_KV_IMPLEMENTATION
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"
#include "mskv_mock_cuda.h"

static void *af_rt_alloc(void *u, size_t n) { (void)u; return af_malloc(n); }
static void *af_rt_realloc(void *u, void *p, size_t n) { (void)u; return af_realloc(p, n); }
static void af_rt_free(void *u, void *p) { (void)u; af_free(p); }
static mskv_allocator af_allocator(void) {
    mskv_allocator al;
    memset(&al, 0, sizeof al);
    if (af.runtime) { al.alloc = af_rt_alloc; al.realloc = af_rt_realloc; al.free = af_rt_free; }
    return al;
}

/* ---- one scenario run ------------------------------------------------------- */

typedef struct af_run {
    int broken;           /* a rule was broken: the test fails */
    char what[256];
    int steps;            /* calls made */
    int injected_steps;   /* calls that saw a refused allocation */
} af_run;

static void af_broke(af_run *run, const char *fmt, const char *call, mskv_result r) {
    if (run->broken++) return;
    snprintf(run->what, sizeof run->what, fmt, call, (int)r, mskv_result_string(r));
}

/* The scenario's session once it exists: a failed call leaves it as it was too. */
static const mskv_session *af_watch;

/* One call of the scenario: when an allocation was refused during it, it
   must have failed, changed nothing, and succeed on a retry. */
static int af_step(af_run *run, mskv_arena *a, const char *call, mskv_result (*fn)(void *), void *ctx) {
    uint64_t d = a ? mskv_arena_digest(a) : 0;
    long failed_before = af.failed;
    mskv_session was;
    mskv_result r;
    char why[256];
    if (af_watch) was = *af_watch;
    else memset(&was, 0, sizeof was);
    r = fn(ctx);
    run->steps++;
    if (af.failed == failed_before) {
        if (r != MSKV_SUCCESS) { af_broke(run, "%s failed without a refused allocation: %d %s", call, r); return 0; }
        return 1;
    }
    run->injected_steps++;
    if (r == MSKV_SUCCESS) { af_broke(run, "%s reported success after a refused allocation (%d %s)", call, r); return 0; }
    if (r != MSKV_ERROR_OUT_OF_MEMORY && r != MSKV_ERROR_CUDA) { af_broke(run, "%s: %d %s instead of OUT_OF_MEMORY", call, r); return 0; }
    if (a && mskv_arena_digest(a) != d) { af_broke(run, "%s failed (%d %s) and changed the arena", call, r); return 0; }
    if (af_watch && memcmp(&was, af_watch, sizeof was) != 0) { af_broke(run, "%s failed (%d %s) and changed the session", call, r); return 0; }
    why[0] = '\0';
    if (a && mskv_arena_audit(a, why, sizeof why) != MSKV_SUCCESS) { af_broke(run, "%s failed (%d %s) and broke the audit", call, r); return 0; }
    af.paused = 1;
    r = fn(ctx);
    af.paused = 0;
    if (r != MSKV_SUCCESS) { af_broke(run, "%s failed again on a retry with memory: %d %s", call, r); return 0; }
    return 1;
}

/* The scenario's objects, so each step is a small function of them. */
typedef struct af_sc {
    mskv_arena *a, *ga, *two;   /* two: the arena of two layer groups */
    mskv_request pair[2], solo, parked[4];
    mskv_lockstep ls;
    mskv_segment psegs[2];
    mskv_plan tplan;
    mskv_cpu *cpu;
    mskv_request r[3], child, imported, entry;
    mskv_segment segs[3];
    mskv_plan plan, xplan, gplan;
    mskv_segment gseg;
    mskv_session s;
    mskv_retention ret;
    unsigned char *blob;
    size_t blob_size;
    mskv_cuda_functions fn;
    mskv_cuda *cu;
    mskv_cuda_store *st;
    mskv_cuda_dplan dp;
    float k[64 * 16], v[64 * 16], q[64 * 32], o[64 * 32], lse[64 * 2];
    mskv_prefix_view view;
    uint16_t vk[16 * 64], vv[16 * 64];   /* the GPU arena's prefix: 1 layer, 16 tokens of 64 f16 */
} af_sc;

static mskv_arena_desc af_arena_desc(void) {
    mskv_arena_desc d;
    memset(&d, 0, sizeof d);
    d.num_pages = 64; d.page_size = 4; d.max_requests = 16;
    d.num_layers = 2; d.kv_heads = 2; d.head_dim = 8; d.dtype = MSKV_DTYPE_F32;
    d.allocator = af_allocator();
    d.host_allocator = af_allocator();
    return d;
}

static mskv_result af_create(void *c) { af_sc *x = (af_sc *)c; mskv_arena_desc d = af_arena_desc(); return mskv_arena_create(&d, &x->a); }
static mskv_result af_cpu(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_cpu_desc d;
    memset(&d, 0, sizeof d);
    d.num_threads = 2; d.allocator = af_allocator();
    return mskv_cpu_create(&d, &x->cpu);
}
static mskv_result af_add0(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->a, &x->r[0]); }
static mskv_result af_add1(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->a, &x->r[1]); }
static mskv_result af_add2(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->a, &x->r[2]); }
static mskv_result af_admit(void *c) { af_sc *x = (af_sc *)c; return mskv_admit(x->a, x->segs, 3); }
static mskv_result af_plan_alloc(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_plan_size ps;
    mskv_result r;
    mskv_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_3D; pd.grid_h = 2; pd.grid_w = 3;
    if ((r = mskv_plan_query(x->a, x->segs, 3, &pd, &ps)) != MSKV_SUCCESS) return r;
    return mskv_plan_alloc(x->a, ps.batch, ps.total_q + 16, ps.num_page_ids + 16, &x->plan);
}
static mskv_result af_plan_build(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_3D; pd.grid_h = 2; pd.grid_w = 3;
    return mskv_plan_build(x->a, x->segs, 3, &pd, &x->plan);
}
static mskv_result af_write(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_rope rope;
    memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_3D;
    return mskv_cpu_write_kv(x->a, 1, &x->plan, x->k, x->v, MSKV_DTYPE_F32, &rope);
}
static mskv_result af_attend(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_attn at;
    memset(&at, 0, sizeof at);
    at.q_heads = 4; at.mask = MSKV_MASK_CAUSAL;
    return mskv_cpu_attention(x->cpu, x->a, 1, &x->plan, &at, x->q, x->o, x->lse);
}
static mskv_result af_commit(void *c) { af_sc *x = (af_sc *)c; return mskv_commit(x->a, x->segs, 3); }
static mskv_result af_publish(void *c) { af_sc *x = (af_sc *)c; return mskv_publish(x->a, x->segs, 3, NULL); }
static mskv_result af_session_init(void *c) { af_sc *x = (af_sc *)c; return mskv_session_init(&x->s, x->a, x->r[2], &x->ret); }
static mskv_result af_begin(void *c) { af_sc *x = (af_sc *)c; return mskv_session_begin_chunk(&x->s, 6); }
static mskv_result af_session_plan(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    return mskv_session_plan(&x->s, &pd, &x->plan);
}
static mskv_result af_commit_chunk(void *c) { af_sc *x = (af_sc *)c; return mskv_session_commit_chunk(&x->s, NULL); }
static mskv_result af_fork(void *c) { af_sc *x = (af_sc *)c; return mskv_request_fork(x->a, x->r[0], &x->child); }
static mskv_result af_offload(void *c) { af_sc *x = (af_sc *)c; return mskv_request_offload(x->a, x->r[1]); }
static mskv_result af_reload(void *c) { af_sc *x = (af_sc *)c; return mskv_request_reload(x->a, x->r[1]); }
static mskv_result af_trim(void *c) { af_sc *x = (af_sc *)c; mskv_arena_trim(x->a); return MSKV_SUCCESS; }
static mskv_result af_export(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_result r = mskv_request_export(x->a, x->child, NULL, 0, &x->blob_size);
    if (r != MSKV_SUCCESS) return r;
    free(x->blob);
    x->blob = (unsigned char *)malloc(x->blob_size);   /* the test's own memory: not counted */
    return x->blob ? mskv_request_export(x->a, x->child, x->blob, x->blob_size, &x->blob_size) : MSKV_ERROR_OUT_OF_MEMORY;
}
static mskv_result af_import(void *c) { af_sc *x = (af_sc *)c; return mskv_request_import(x->a, x->blob, x->blob_size, &x->imported); }
static mskv_result af_reload_imported(void *c) { af_sc *x = (af_sc *)c; return mskv_request_reload(x->a, x->imported); }
static mskv_result af_reserve(void *c) { af_sc *x = (af_sc *)c; return mskv_request_reserve(x->a, x->imported, 200); }
static mskv_result af_keyed(void *c) { af_sc *x = (af_sc *)c; return mskv_keyed_create(x->a, 42, 7, &x->entry); }
static mskv_result af_keyed_write(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_segment s;
    mskv_result r;
    s.request = x->entry; s.n_tokens = 7;
    if ((r = mskv_plan_build(x->a, &s, 1, NULL, &x->plan)) != MSKV_SUCCESS) return r;
    return mskv_cpu_write_kv(x->a, 0, &x->plan, x->k, x->v, MSKV_DTYPE_F32, NULL);
}
static mskv_result af_seal(void *c) { af_sc *x = (af_sc *)c; return mskv_keyed_seal(x->a, x->entry); }
static mskv_result af_cross(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_segment s;
    mskv_plan_desc pd;
    mskv_plan_size ps;
    mskv_attn at;
    mskv_result r;
    s.request = x->r[0]; s.n_tokens = 2;
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_CROSS; pd.cross = x->entry;
    if ((r = mskv_plan_query(x->a, &s, 1, &pd, &ps)) != MSKV_SUCCESS) return r;
    mskv_plan_free(x->a, &x->xplan);
    if ((r = mskv_plan_alloc(x->a, ps.batch, ps.total_q, ps.num_page_ids, &x->xplan)) != MSKV_SUCCESS) return r;
    if ((r = mskv_plan_build(x->a, &s, 1, &pd, &x->xplan)) != MSKV_SUCCESS) return r;
    memset(&at, 0, sizeof at);
    at.q_heads = 2;
    return mskv_cpu_attention(x->cpu, x->a, 0, &x->xplan, &at, x->q, x->o, x->lse);
}
static mskv_result af_remove_import(void *c) { af_sc *x = (af_sc *)c; return mskv_request_remove(x->a, x->imported); }
static mskv_result af_keyed_remove(void *c) { af_sc *x = (af_sc *)c; return mskv_keyed_remove(x->a, 42); }
/* the arena of two layer groups: a lockstep pair, make_room, flush, reset */
static mskv_result af_two_create(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_arena_desc d = af_arena_desc();
    d.num_groups = 2;
    d.retire_mode = MSKV_RETIRE_FENCED;
    d.debug = MSKV_DEBUG_ALL;
    return mskv_arena_create(&d, &x->two);
}
static mskv_result af_two_add0(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->two, &x->pair[0]); }
static mskv_result af_two_add1(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->two, &x->pair[1]); }
static mskv_result af_two_add_solo(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->two, &x->solo); }
static mskv_result af_two_lockstep(void *c) { af_sc *x = (af_sc *)c; return mskv_lockstep_create(x->two, x->pair, 2, &x->ls); }
/* the solo request: a retention of its own in group 1; admitted first, so make_room's first choice */
static mskv_result af_two_solo_retention(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_retention r;
    memset(&r, 0, sizeof r);
    r.chunk_size = 4; r.window_chunks = 1;
    return mskv_request_set_retention_in_group(x->two, x->solo, 1, &r);
}
static mskv_result af_two_solo_admit(void *c) { af_sc *x = (af_sc *)c; mskv_segment s; s.request = x->solo; s.n_tokens = 10; return mskv_admit(x->two, &s, 1); }
static mskv_result af_two_solo_commit(void *c) { af_sc *x = (af_sc *)c; mskv_segment s; s.request = x->solo; s.n_tokens = 10; return mskv_commit(x->two, &s, 1); }
static mskv_result af_two_solo_publish(void *c) { af_sc *x = (af_sc *)c; mskv_segment s; s.request = x->solo; s.n_tokens = 0; return mskv_publish(x->two, &s, 1, NULL); }
static mskv_result af_two_solo_admit1(void *c) { af_sc *x = (af_sc *)c; mskv_segment s; s.request = x->solo; s.n_tokens = 1; return mskv_admit(x->two, &s, 1); }
static mskv_result af_two_solo_abort(void *c) { af_sc *x = (af_sc *)c; mskv_segment s; s.request = x->solo; s.n_tokens = 1; return mskv_abort(x->two, &s, 1); }
static mskv_result af_two_pair_admit(void *c) {
    af_sc *x = (af_sc *)c;
    int32_t n = 0;
    mskv_result e = mskv_lockstep_segments(x->two, x->ls, 7, x->psegs, 2, &n);
    return e == MSKV_SUCCESS ? mskv_admit(x->two, x->psegs, n) : e;
}
static mskv_result af_two_pair_plan(void *c) {   /* the pair's batch in group 1, K/V and attention */
    af_sc *x = (af_sc *)c;
    mskv_plan_desc pd;
    mskv_plan_size ps;
    mskv_attn at;
    mskv_result e;
    memset(&pd, 0, sizeof pd);
    pd.group = 1; pd.pos_mode = MSKV_POS_1D;
    if ((e = mskv_plan_query(x->two, x->psegs, 2, &pd, &ps)) != MSKV_SUCCESS) return e;
    if (!x->tplan.owned && (e = mskv_plan_alloc(x->two, ps.batch, ps.total_q, ps.num_page_ids + 8, &x->tplan)) != MSKV_SUCCESS) return e;
    if ((e = mskv_plan_build(x->two, x->psegs, 2, &pd, &x->tplan)) != MSKV_SUCCESS) return e;
    if ((e = mskv_cpu_write_kv(x->two, 0, &x->tplan, x->k, x->v, MSKV_DTYPE_F32, NULL)) != MSKV_SUCCESS) return e;
    memset(&at, 0, sizeof at);
    at.q_heads = 4; at.mask = MSKV_MASK_CAUSAL;
    return mskv_cpu_attention(x->cpu, x->two, 0, &x->tplan, &at, x->q, x->o, x->lse);
}
static mskv_result af_two_pair_commit(void *c) { af_sc *x = (af_sc *)c; return mskv_commit(x->two, x->psegs, 2); }
static mskv_result af_two_pair_publish(void *c) { af_sc *x = (af_sc *)c; return mskv_publish(x->two, x->psegs, 2, NULL); }
static mskv_result af_two_pair_release(void *c) { af_sc *x = (af_sc *)c; return mskv_lockstep_release_oldest(x->two, x->ls, 1, 4, NULL); }
static mskv_result af_two_pair_offload(void *c) { af_sc *x = (af_sc *)c; return mskv_lockstep_offload(x->two, x->ls); }
static mskv_result af_two_pair_reload(void *c) { af_sc *x = (af_sc *)c; return mskv_lockstep_reload(x->two, x->ls); }
static mskv_result af_two_make_room(void *c) {   /* room for more than is free: the solo request is parked */
    af_sc *x = (af_sc *)c;
    mskv_arena_stats st;
    int32_t n = 0;
    mskv_result e = mskv_arena_stats_get(x->two, &st);
    if (e != MSKV_SUCCESS) return e;
    e = mskv_make_room(x->two, (int64_t)st.free_pages + st.pending_pages + 1, UINT64_MAX, x->psegs, 2, x->parked, 4, &n);
    return e == MSKV_SUCCESS && (n != 1 || x->parked[0].id != x->solo.id) ? MSKV_ERROR_BAD_STATE : e;
}
static mskv_result af_two_flush(void *c) { af_sc *x = (af_sc *)c; return mskv_arena_flush(x->two); }
static mskv_result af_two_reload_parked(void *c) { af_sc *x = (af_sc *)c; return mskv_request_reload(x->two, x->solo); }
static mskv_result af_two_make_room_pair(void *c) {   /* the solo request admitted last: the pair is parked whole */
    af_sc *x = (af_sc *)c;
    mskv_segment s;
    mskv_arena_stats st;
    int32_t n = 0;
    mskv_result e = mskv_arena_stats_get(x->two, &st);
    s.request = x->solo; s.n_tokens = 1;
    if (e != MSKV_SUCCESS) return e;
    e = mskv_make_room(x->two, (int64_t)st.free_pages + st.pending_pages + 1, UINT64_MAX, &s, 1, x->parked, 4, &n);
    return e == MSKV_SUCCESS && n != 2 ? MSKV_ERROR_BAD_STATE : e;
}
static mskv_result af_two_reset(void *c) { af_sc *x = (af_sc *)c; return mskv_arena_reset(x->two); }
static mskv_result af_two_add_after_reset(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->two, &x->solo); }
static mskv_result af_two_admit_after_reset(void *c) { af_sc *x = (af_sc *)c; mskv_segment s; s.request = x->solo; s.n_tokens = 5; return mskv_admit(x->two, &s, 1); }

/* the GPU layer on the mock driver: context, store, its own arena, a step */
static mskv_result af_cuda(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_cuda_desc d;
    memset(&d, 0, sizeof d);
    d.functions = &x->fn; d.disable_disk_cache = 1; d.allocator = af_allocator();
    d.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    return mskv_cuda_create(&d, &x->cu);
}
static mskv_result af_store(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_cuda_store_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.num_pages = 16; sd.page_size = 4; sd.num_layers = 1; sd.kv_heads = 1; sd.head_dim = 64; sd.dtype = MSKV_DTYPE_F16;
    sd.max_batch = 4; sd.max_tokens = 32; sd.max_page_ids = 32; sd.staging_bytes = 1 << 14; sd.plan_ring = 2;
    return mskv_cuda_store_create(x->cu, &sd, &x->st);
}
static mskv_result af_store_arena(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_arena_desc d;
    mskv_result r;
    memset(&d, 0, sizeof d);
    d.allocator = af_allocator();
    if ((r = mskv_cuda_store_arena_desc(x->st, &d)) != MSKV_SUCCESS) return r;
    if ((r = mskv_arena_create(&d, &x->ga)) != MSKV_SUCCESS) return r;
    r = mskv_cuda_store_bind(x->st, x->ga);
    if (r != MSKV_SUCCESS) { mskv_arena_destroy(x->ga); x->ga = NULL; }
    return r;
}
/* one call per step: a failed step must leave the arena as it was */
static mskv_result af_gpu_add(void *c) { af_sc *x = (af_sc *)c; return mskv_request_add(x->ga, &x->gseg.request); }
static mskv_result af_gpu_admit(void *c) { af_sc *x = (af_sc *)c; x->gseg.n_tokens = 9; return mskv_admit(x->ga, &x->gseg, 1); }
static mskv_result af_gpu_plan(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_result r = x->gplan.owned ? MSKV_SUCCESS : mskv_plan_alloc(x->ga, 1, 16, 8, &x->gplan);
    return r == MSKV_SUCCESS ? mskv_plan_build(x->ga, &x->gseg, 1, NULL, &x->gplan) : r;
}
static mskv_result af_gpu_upload(void *c) { af_sc *x = (af_sc *)c; return mskv_cuda_plan_upload(x->st, &x->gplan, MSKV_POS_NONE, &x->dp); }
/* the sm_90a kernel's first call (the mock is a compute capability 9.0
   device): its module compiled and loaded, the pools' tensor maps made */
static mskv_result af_gpu_attend(void *c) {
    af_sc *x = (af_sc *)c;
    mskv_attn at;
    mskv_cu_ptr q = ((mskv_cu_ptr)(uintptr_t)x->q + 15) & ~(mskv_cu_ptr)15;   /* never read: launches only count */
    memset(&at, 0, sizeof at);
    at.q_heads = 2; at.q_dtype = MSKV_DTYPE_F16;
    return mskv_cuda_attention(x->st, 0, &x->gplan, &x->dp, &at, q, q, 0);
}
static mskv_result af_gpu_commit(void *c) { af_sc *x = (af_sc *)c; return mskv_commit(x->ga, &x->gseg, 1); }
static mskv_result af_gpu_publish(void *c) { af_sc *x = (af_sc *)c; return mskv_cuda_publish(x->st, NULL, 0, NULL); }
static mskv_result af_gpu_offload(void *c) { af_sc *x = (af_sc *)c; return mskv_request_offload(x->ga, x->gseg.request); }
static mskv_result af_gpu_reload(void *c) { af_sc *x = (af_sc *)c; return mskv_request_reload(x->ga, x->gseg.request); }
static mskv_result af_gpu_protect(void *c) { af_sc *x = (af_sc *)c; return mskv_request_protect_prefix(x->ga, x->gseg.request, 6); }
static mskv_result af_gpu_view(void *c) {   /* whole page records through store_ops: a record buffer */
    af_sc *x = (af_sc *)c;
    x->view.request = x->gseg.request; x->view.k = x->vk; x->view.v = x->vv; x->view.cap_tokens = 16;
    return mskv_prefix_view_gather(x->ga, &x->view);
}

typedef struct af_def { const char *name; mskv_result (*fn)(void *); int on_gpu_arena; } af_def;

static const af_def af_steps[] = {
    { "cpu_create", af_cpu, -1 }, { "request_add", af_add0, 0 }, { "request_add", af_add1, 0 }, { "request_add", af_add2, 0 },
    { "admit (3 segments)", af_admit, 0 }, { "plan_alloc", af_plan_alloc, 0 }, { "plan_build (3-D)", af_plan_build, 0 },
    { "cpu_write_kv (rope)", af_write, 0 }, { "cpu_attention (2 threads)", af_attend, 0 }, { "commit", af_commit, 0 },
    { "publish", af_publish, 0 }, { "session_init", af_session_init, 0 },
};
static const af_def af_chunk_steps[] = {
    { "session_begin_chunk", af_begin, 0 }, { "session_plan", af_session_plan, 0 }, { "session_commit_chunk", af_commit_chunk, 0 },
};
static const af_def af_tail_steps[] = {
    { "request_fork", af_fork, 0 }, { "request_offload", af_offload, 0 }, { "arena_trim", af_trim, 0 },
    { "request_reload", af_reload, 0 }, { "request_offload again", af_offload, 0 }, { "request_reload again", af_reload, 0 },
    { "request_export", af_export, 0 }, { "request_import", af_import, 0 }, { "reload of the import", af_reload_imported, 0 },
    { "request_reserve", af_reserve, 0 }, { "keyed_create", af_keyed, 0 }, { "keyed entry K/V", af_keyed_write, 0 },
    { "keyed_seal", af_seal, 0 }, { "cross plan + attention", af_cross, 0 }, { "request_remove", af_remove_import, 0 }, { "keyed_remove", af_keyed_remove, 0 },
    { "arena_create (2 groups)", af_two_create, -1 }, { "request_add (pair)", af_two_add0, 2 }, { "request_add (pair)", af_two_add1, 2 },
    { "request_add (solo)", af_two_add_solo, 2 }, { "lockstep_create", af_two_lockstep, 2 },
    { "set_retention_in_group", af_two_solo_retention, 2 }, { "admit (solo)", af_two_solo_admit, 2 },
    { "commit (solo)", af_two_solo_commit, 2 }, { "publish (solo: retention in group 1)", af_two_solo_publish, 2 },
    { "admit (lockstep pair)", af_two_pair_admit, 2 },
    { "plan group 1 + write + attention", af_two_pair_plan, 2 }, { "commit (lockstep pair)", af_two_pair_commit, 2 },
    { "publish (lockstep pair)", af_two_pair_publish, 2 }, { "lockstep_release_oldest", af_two_pair_release, 2 },
    { "lockstep_offload", af_two_pair_offload, 2 }, { "lockstep_reload", af_two_pair_reload, 2 },
    { "admit (lockstep pair) again", af_two_pair_admit, 2 }, { "make_room (solo parked)", af_two_make_room, 2 },
    { "commit (lockstep pair) again", af_two_pair_commit, 2 }, { "arena_flush", af_two_flush, 2 },
    { "reload of the parked request", af_two_reload_parked, 2 }, { "admit (solo, 1 token)", af_two_solo_admit1, 2 },
    { "make_room (the pair parked whole)", af_two_make_room_pair, 2 }, { "abort (solo)", af_two_solo_abort, 2 },
    { "lockstep_reload after make_room", af_two_pair_reload, 2 }, { "arena_reset", af_two_reset, 2 },
    { "request_add after reset", af_two_add_after_reset, 2 }, { "admit after reset", af_two_admit_after_reset, 2 },
    { "cuda_create (mock)", af_cuda, -1 }, { "cuda_store_create", af_store, -1 }, { "store arena + bind", af_store_arena, -1 },
    { "request_add (GPU arena)", af_gpu_add, 1 }, { "admit (GPU arena)", af_gpu_admit, 1 }, { "plan (GPU arena)", af_gpu_plan, 1 },
    { "cuda_plan_upload", af_gpu_upload, 1 }, { "cuda_attention (sm_90a)", af_gpu_attend, 1 },
    { "commit (GPU arena)", af_gpu_commit, 1 }, { "cuda_publish", af_gpu_publish, 1 },
    { "offload (pinned copy)", af_gpu_offload, 1 }, { "cuda_publish", af_gpu_publish, 1 }, { "reload (GPU arena)", af_gpu_reload, 1 },
    { "protect_prefix (GPU arena)", af_gpu_protect, 1 }, { "prefix_view_gather (store reads)", af_gpu_view, 1 },
};

static int af_device_alloc(void) { return af_refuse(); }

static void af_teardown(af_sc *x) {
    if (x->a) { mskv_plan_free(x->a, &x->plan); mskv_plan_free(x->a, &x->xplan); }
    if (x->two) { mskv_plan_free(x->two, &x->tplan); mskv_arena_destroy(x->two); }
    if (x->ga) mskv_plan_free(x->ga, &x->gplan);
    if (x->ga) mskv_arena_destroy(x->ga);
    if (x->st) mskv_cuda_store_destroy(x->st);
    if (x->cu) mskv_cuda_destroy(x->cu);
    if (x->a) mskv_arena_destroy(x->a);
    mskv_cpu_destroy(x->cpu);
    free(x->blob);
}

static void af_scenario(af_run *run) {
    af_sc *x = (af_sc *)calloc(1, sizeof *x);
    size_t i;
    int chunk, ok = 1;
    if (!x) { af_broke(run, "%s: %d %s", "calloc", MSKV_ERROR_OUT_OF_MEMORY); return; }
    mmc_reset();
    mmc.hook = af_device_alloc;
    x->fn = mmc_table();
    for (i = 0; i < 64 * 16; i++) { x->k[i] = (float)(i % 13) * 0.1f; x->v[i] = (float)(i % 7); }
    for (i = 0; i < 64 * 32; i++) x->q[i] = 0.25f;
    x->segs[0].n_tokens = 5; x->segs[1].n_tokens = 9; x->segs[2].n_tokens = 3;
    memset(&x->ret, 0, sizeof x->ret);
    x->ret.chunk_size = 6; x->ret.sink_chunks = 1; x->ret.window_chunks = 4;   /* sink + window + chunk: the table grows past 8 in a begin_chunk */
    ok = af_step(run, NULL, "arena_create", af_create, x);
    for (i = 0; ok && i < sizeof af_steps / sizeof af_steps[0]; i++) {
        ok = af_step(run, af_steps[i].on_gpu_arena < 0 ? NULL : x->a, af_steps[i].name, af_steps[i].fn, x);
        if (i == 3) { x->segs[0].request = x->r[0]; x->segs[1].request = x->r[1]; x->segs[2].request = x->r[2]; }
    }
    af_watch = &x->s;
    for (chunk = 0; ok && chunk < 10; chunk++)
        for (i = 0; ok && i < sizeof af_chunk_steps / sizeof af_chunk_steps[0]; i++)
            ok = af_step(run, x->a, af_chunk_steps[i].name, af_chunk_steps[i].fn, x);
    af_watch = NULL;
    for (i = 0; ok && i < sizeof af_tail_steps / sizeof af_tail_steps[0]; i++)
        ok = af_step(run, af_tail_steps[i].on_gpu_arena < 0 ? NULL : af_tail_steps[i].on_gpu_arena == 2 ? x->two
                          : af_tail_steps[i].on_gpu_arena ? x->ga : x->a,
                     af_tail_steps[i].name, af_tail_steps[i].fn, x);
    if (ok && x->a) {
        char why[256];
        why[0] = '\0';
        if (mskv_arena_audit(x->a, why, sizeof why) != MSKV_SUCCESS) af_broke(run, "%s: %d %s", "final audit", MSKV_ERROR_AUDIT_FAILED);
        /* the debug checks' bytes: no failed call wrote a free page or a host copy */
        if (x->two && mskv_arena_audit_bytes(x->two, why, sizeof why) != MSKV_SUCCESS)
            af_broke(run, "%s: %d %s", "audit_bytes of the two-group arena", MSKV_ERROR_AUDIT_FAILED);
    }
    af.paused = 1;   /* teardown frees; it allocates nothing that may fail */
    af_teardown(x);
    af.paused = 0;
    free(x);
    if (!mmc_nothing_live()) af_broke(run, "%s: %d %s", "mock driver objects left after teardown", MSKV_SUCCESS);
    mmc.hook = NULL;
}

/* Runs the scenario once per allocation until a run refuses none. */
static void af_sweep(int runtime, int from) {
    long n, total = 0, injected_steps = 0;
    af_run run;
    memset(&af, 0, sizeof af);
    af.runtime = runtime;
    memset(&run, 0, sizeof run);
    af_scenario(&run);   /* a clean run: how many allocations there are */
    ASSERT_FALSE(run.broken);
    total = af.count;
    ASSERT_EQ(0, af.live);
    ASSERT_LT(20, total);
    for (n = 1; n <= total + 1; n++) {
        memset(&run, 0, sizeof run);
        af.count = 0; af.failed = 0; af.fail_at = n; af.fail_from = from; af.paused = 0;
        af_scenario(&run);
        if (run.broken) { mt_fail(__FILE__, __LINE__, "allocation %ld of %ld: %s", n, total, run.what); return; }
        if (af.live != 0) { mt_fail(__FILE__, __LINE__, "allocation %ld refused: %ld blocks leaked", n, af.live); return; }
        if (n <= total && af.failed == 0) { mt_fail(__FILE__, __LINE__, "allocation %ld was never asked for", n); return; }
        injected_steps += run.injected_steps;
    }
    printf("  %s, %s: %ld allocation sites reached (the allocations of one run, each refused in turn), %ld failed calls retried with success\n",
           runtime ? "run-time allocators" : "MSKV_MALLOC macros", from ? "fail from the N-th on" : "fail only the N-th",
           total, injected_steps);
}

TEST(alloc_fail_only_the_nth_through_the_macros_fails_cleanly_and_the_retry_succeeds) { af_sweep(0, 0); }
TEST(alloc_fail_from_the_nth_on_through_the_macros_fails_cleanly_and_the_retry_succeeds) { af_sweep(0, 1); }
TEST(alloc_fail_only_the_nth_through_the_runtime_allocator_fails_cleanly_and_the_retry_succeeds) { af_sweep(1, 0); }
TEST(alloc_fail_from_the_nth_on_through_the_runtime_allocator_fails_cleanly_and_the_retry_succeeds) { af_sweep(1, 1); }
