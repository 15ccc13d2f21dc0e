/* libFuzzer harness: arbitrary plans (with or without the optional q_pos,
   visibility bounds and features) into every consumer of a plan:
   mskv_plan_validate, mskv_cpu_write_kv(_pools), mskv_cpu_attention(_pools),
   mskv_cpu_attention_dense over dense K/V of a declared row count,
   and the host side of the GPU wrappers (mskv_cuda_plan_upload,
   mskv_cuda_write_kv, mskv_cuda_attention) on the mock driver of
   tests/mskv_mock_cuda.h. Every array is allocated at exactly the size the
   plan's own counts (batch, total_q, num_page_ids) declare, so ASan reports
   any read past them: whatever the contents, no consumer may read out of
   bounds, and a plan that passes mskv_plan_validate must also be safe for
   the attention calls.
   Plans of layer groups too: some inputs start from a plan that an arena of
   two groups built (of either group, or a group it does not have), made
   stale or not by a release in one group (mskv_plan_check must say which),
   then edited wildly; the GPU side runs them on a store with adopted pools
   (mskv_cuda_store_desc.pools), bound to a two-group arena, on the store's
   own stream, the legacy default stream or a caller's stream. */
#define MSTAR_KV_IMPLEMENTATION
#include "fuzz_common.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../../mstar_kv_cuda.h"
#include "../mskv_mock_cuda.h"

#define FP_MAX_COUNT 512    /* larger declared counts are clamped: the arrays are really allocated */
#define FP_PAGES 16
#define FP_P 4

static struct fp_rig {
    int ready;
    mskv_arena *a;              /* F32, 2 layers x 2 heads x 8 dims */
    mskv_cpu *cpu;              /* two threads */
    mskv_cuda_functions fn;
    mskv_cuda *cu;
    mskv_cuda_store *st;        /* F16, 2 layers x 2 heads x 64 dims */
    mskv_cu_ptr dq, dout, dlse, dk, dv;
    /* the same geometry on adopted pools, bound to an arena of two layer groups */
    mskv_cuda_store *st2;
    mskv_cu_ptr pools2[4];
    mskv_arena *ga;
    mskv_request greq[2];
    mskv_cu_stream caller_stream;
} fp;

/* The bound arena's requests: 9 and 5 tokens; group 1 released request 0's
   first page, so the groups' tables differ. */
static void fp_setup_groups(void) {
    mskv_cuda_store_desc sd;
    mskv_arena_desc d;
    mskv_segment seg[2];
    int i;
    memset(&sd, 0, sizeof sd);
    sd.num_pages = FP_PAGES; sd.page_size = FP_P; sd.num_layers = 2; sd.kv_heads = 2; sd.head_dim = 64;
    sd.dtype = MSKV_DTYPE_F16; sd.max_batch = 8; sd.max_tokens = 64; sd.max_page_ids = 64; sd.staging_bytes = 1 << 16;
    for (i = 0; i < 4; i++)
        FZ_CHECK(mskv_cuda_malloc(fp.cu, (size_t)FP_PAGES * FP_P * 2 * 64 * 2, &fp.pools2[i]) == MSKV_SUCCESS, "adopted pool");
    sd.pools = fp.pools2;
    FZ_CHECK(mskv_cuda_store_create(fp.cu, &sd, &fp.st2) == MSKV_SUCCESS, "mock store on adopted pools");
    memset(&d, 0, sizeof d);
    d.allocator = fz_allocator();
    FZ_CHECK(mskv_cuda_store_arena_desc(fp.st2, &d) == MSKV_SUCCESS, "store arena desc");
    d.num_groups = 2;
    FZ_CHECK(mskv_arena_create(&d, &fp.ga) == MSKV_SUCCESS && mskv_cuda_store_bind(fp.st2, fp.ga) == MSKV_SUCCESS, "bound arena");
    for (i = 0; i < 2; i++) {
        FZ_CHECK(mskv_request_add(fp.ga, &fp.greq[i]) == MSKV_SUCCESS, "add");
        seg[i].request = fp.greq[i];
        seg[i].n_tokens = i ? 5 : 9;
    }
    FZ_CHECK(mskv_admit(fp.ga, seg, 2) == MSKV_SUCCESS && mskv_commit(fp.ga, seg, 2) == MSKV_SUCCESS, "grow");
    FZ_CHECK(mskv_request_release_oldest_in_group(fp.ga, fp.greq[0], 1, FP_P, NULL) == MSKV_SUCCESS, "release in group 1");
    FZ_CHECK(fp.fn.cuStreamCreate(&fp.caller_stream, 0) == 0, "a caller's stream");
}

static void fp_setup(void) {
    mskv_arena_desc d;
    mskv_cpu_desc cd;
    mskv_cuda_desc gd;
    mskv_cuda_store_desc sd;
    memset(&d, 0, sizeof d);
    d.num_pages = FP_PAGES; d.page_size = FP_P; d.num_layers = 2; d.kv_heads = 2; d.head_dim = 8;
    d.allocator = fz_allocator();
    FZ_CHECK(mskv_arena_create(&d, &fp.a) == MSKV_SUCCESS, "arena");
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    FZ_CHECK(mskv_cpu_create(&cd, &fp.cpu) == MSKV_SUCCESS, "cpu");
    fp.fn = mmc_table();
    memset(&gd, 0, sizeof gd);
    gd.functions = &fp.fn;
    gd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    gd.disable_disk_cache = 1;
    FZ_CHECK(mskv_cuda_create(&gd, &fp.cu) == MSKV_SUCCESS, "mock cuda");
    memset(&sd, 0, sizeof sd);
    sd.num_pages = FP_PAGES; sd.page_size = FP_P; sd.num_layers = 2; sd.kv_heads = 2; sd.head_dim = 64;
    sd.dtype = MSKV_DTYPE_F16; sd.max_batch = 8; sd.max_tokens = 64; sd.max_page_ids = 64; sd.staging_bytes = 1 << 16;
    FZ_CHECK(mskv_cuda_store_create(fp.cu, &sd, &fp.st) == MSKV_SUCCESS, "mock store");
    /* device tensors sized for the store's largest plan (max_tokens x 8 q heads x 64 dims) */
    FZ_CHECK(mskv_cuda_malloc(fp.cu, 64 * 8 * 64 * 2, &fp.dq) == MSKV_SUCCESS, "dq");
    FZ_CHECK(mskv_cuda_malloc(fp.cu, 64 * 8 * 64 * 2, &fp.dout) == MSKV_SUCCESS, "do");
    FZ_CHECK(mskv_cuda_malloc(fp.cu, 64 * 8 * 4, &fp.dlse) == MSKV_SUCCESS, "dlse");
    FZ_CHECK(mskv_cuda_malloc(fp.cu, 64 * 2 * 64 * 2, &fp.dk) == MSKV_SUCCESS, "dk");
    FZ_CHECK(mskv_cuda_malloc(fp.cu, 64 * 2 * 64 * 2, &fp.dv) == MSKV_SUCCESS, "dv");
    fp_setup_groups();
    fp.ready = 1;
}

/* A declared count: mostly small, sometimes negative or large. */
static int32_t fp_count(fz_in *in, int32_t small) {
    uint8_t sel = fz_u8(in);
    if (sel < 220) return (int32_t)(sel % (uint8_t)(small + 1));
    if (sel < 236) return -(int32_t)(sel % 3) - 1;
    return (int32_t)(fz_raw(in, 2) % FP_MAX_COUNT);
}
static int32_t fp_value(fz_in *in, int32_t around) {
    uint8_t sel = fz_u8(in);
    if (sel < 160) return (int32_t)(sel % 8);
    if (sel < 224) return around + (int32_t)(sel % 5) - 2;
    return fz_wild32(in);
}

/* wrapping: a wild step may overflow, and the plan is meant to be nonsense then */
static int32_t fp_add32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }

/* An array of exactly n elements (n <= 0: a NULL or a one-element array). */
static void *fp_array(fz_in *in, int64_t n, size_t elem, int may_null) {
    if (may_null && fz_u8(in) < 12) return NULL;
    return calloc(n > 0 ? (size_t)n : 1, elem);
}

typedef struct fp_plan { mskv_plan p; mskv_pos_mode pos; } fp_plan;

static void fp_make(fz_in *in, fp_plan *f) {
    mskv_plan *p = &f->p;
    int32_t b, i;
    int64_t nb, nq, ni;
    memset(f, 0, sizeof *f);
    p->batch = fp_count(in, 4);
    p->total_q = fp_count(in, 12);
    p->num_page_ids = fp_count(in, 10);
    p->page_size = fz_u8(in) < 230 ? FP_P : fp_value(in, FP_P);
    nb = p->batch < 0 ? 0 : p->batch;
    nq = p->total_q < 0 ? 0 : p->total_q;
    ni = p->num_page_ids < 0 ? 0 : p->num_page_ids;
    f->pos = (mskv_pos_mode)(fz_u8(in) % 3);
    p->qo_indptr = (int32_t *)fp_array(in, nb + 1, 4, 1);
    p->kv_indptr = (int32_t *)fp_array(in, nb + 1, 4, 1);
    p->kv_indices = (int32_t *)fp_array(in, ni, 4, 1);
    p->kv_last_page_len = (int32_t *)fp_array(in, nb, 4, 1);
    p->kv_len = (int32_t *)fp_array(in, nb, 4, 1);
    p->kv_pos_split = (int32_t *)fp_array(in, nb, 4, 1);
    p->kv_pos_shift = (int32_t *)fp_array(in, nb, 4, 1);
    p->kv_token_indptr = (int64_t *)fp_array(in, nb + 1, 8, 1);
    p->slot_mapping = (int64_t *)fp_array(in, nq, 8, 1);
    p->positions = (int32_t *)fp_array(in, nq * (f->pos == MSKV_POS_3D ? 3 : 1), 4, 1);
    /* the optional arrays: mostly absent; present ones sometimes without their features bit */
    if (fz_u8(in) < 96) p->q_pos = (int32_t *)fp_array(in, nq, 4, 0);
    if (fz_u8(in) < 96) {
        p->vis_sink_end = (int32_t *)fp_array(in, nb, 4, 0);
        p->vis_window_start = (int32_t *)fp_array(in, nb, 4, fz_u8(in) < 250);   /* rarely one without the other */
    }
    p->features = fz_u8(in) < 230 ? (uint32_t)(fz_u8(in) % 4) : (uint32_t)fz_raw(in, 4);
    p->cap_batch = (int32_t)nb; p->cap_tokens = (int32_t)nq; p->cap_page_ids = (int32_t)ni;
    /* mostly a caller-made plan (generation 0, never stale); sometimes one that claims an arena's
       generation, with or without its requests array (handles that may name nothing) */
    if (fz_u8(in) < 64) {
        p->generation = (uint64_t)(fz_u8(in) % 4);
        if (fz_u8(in) & 1) {
            p->requests = (mskv_request *)calloc(nb > 0 ? (size_t)nb : 1, sizeof(mskv_request));
            for (b = 0; b < nb; b++) p->requests[b].id = fz_u8(in) < 200 ? (uint32_t)(1u << 16 | fz_u8(in) % 4) : (uint32_t)fz_raw(in, 4);
        }
    }
    /* contents: mostly a plausible CSR (prefix sums of small steps), then wild edits */
    if (p->qo_indptr) for (b = 0; b <= nb; b++) p->qo_indptr[b] = b == 0 ? fp_value(in, 0) : fp_add32(p->qo_indptr[b - 1], fp_value(in, 2));
    if (p->kv_indptr) for (b = 0; b <= nb; b++) p->kv_indptr[b] = b == 0 ? fp_value(in, 0) : fp_add32(p->kv_indptr[b - 1], fp_value(in, 2));
    if (p->kv_indices) for (i = 0; i < ni; i++) p->kv_indices[i] = fp_value(in, FP_PAGES);
    for (b = 0; b < nb; b++) {
        if (p->kv_last_page_len) p->kv_last_page_len[b] = fp_value(in, FP_P);
        if (p->kv_len) p->kv_len[b] = fp_value(in, FP_P * 2);
        if (p->kv_pos_split) p->kv_pos_split[b] = fp_value(in, 4);
        if (p->kv_pos_shift) p->kv_pos_shift[b] = fp_value(in, 0);
        if (p->kv_token_indptr) p->kv_token_indptr[b + 1] = (int64_t)((uint64_t)p->kv_token_indptr[b] + (uint64_t)(int64_t)fp_value(in, 8));
    }
    if (p->slot_mapping) for (i = 0; i < nq; i++) p->slot_mapping[i] = fz_u8(in) < 200 ? fp_value(in, FP_PAGES * FP_P) : fz_wild64(in);
    if (p->positions) for (i = 0; i < nq * (f->pos == MSKV_POS_3D ? 3 : 1); i++) p->positions[i] = fp_value(in, 100);
    if (p->q_pos) for (i = 0; i < nq; i++) p->q_pos[i] = fp_value(in, FP_P * 2);
    for (b = 0; b < nb; b++) {
        if (p->vis_sink_end) p->vis_sink_end[b] = fp_value(in, FP_P);
        if (p->vis_window_start) p->vis_window_start[b] = fp_value(in, FP_P + 3);
    }
}

static void fp_drop(fp_plan *f) {
    mskv_plan *p = &f->p;
    free(p->qo_indptr); free(p->kv_indptr); free(p->kv_indices); free(p->kv_last_page_len); free(p->kv_len);
    free(p->kv_pos_split); free(p->kv_pos_shift); free(p->kv_token_indptr); free(p->slot_mapping); free(p->positions);
    free(p->requests); free(p->q_pos); free(p->vis_sink_end); free(p->vis_window_start);
}

static void fp_rope(fz_in *in, mskv_rope *r, mskv_pos_mode pos) {
    memset(r, 0, sizeof *r);
    /* positions are [total_q] or [total_q][3] by the mode: the caller's
       contract, which no callee can check, so a 3-D rope only over 3-D positions */
    r->mode = pos != MSKV_POS_NONE ? pos : MSKV_POS_1D;
    if (fz_u8(in) >= 220) r->mode = fz_u8(in) & 1 ? MSKV_POS_NONE : (mskv_pos_mode)3;
    r->style = (mskv_rope_style)(fz_u8(in) % 3);
    r->theta = fz_u8(in) < 200 ? 0.0f : (float)fz_wild32(in);
    if (fz_u8(in) < 64) { r->dims[0] = fp_value(in, 4); r->dims[1] = fp_value(in, 2); r->dims[2] = fp_value(in, 2); }
}

static void fp_attn(fz_in *in, mskv_attn *at, int32_t kv_heads) {
    memset(at, 0, sizeof *at);
    at->q_heads = fz_u8(in) < 230 ? kv_heads * (1 + fz_u8(in) % 4) : fp_value(in, kv_heads);
    at->mask = (mskv_mask)(fz_u8(in) % 4);
    at->window_left = fp_value(in, 3);
    at->q_dtype = (mskv_dtype)(fz_u8(in) % 4);
    at->scale = fz_u8(in) < 230 ? 0.0f : (float)fp_value(in, 1) / 4.0f;
}

/* q/o/lse exactly for [total_q][q_heads][dim] when that is a sane size, else no call. */
static void fp_cpu(fz_in *in, fp_plan *f) {
    const mskv_plan *p = &f->p;
    mskv_attn at;
    mskv_rope rope;
    char why[128];
    mskv_result rv, r;
    int64_t nq = p->total_q > 0 ? p->total_q : 0;
    int32_t layer = fz_u8(in) < 240 ? (int32_t)(fz_u8(in) % 2) : fp_value(in, 1);
    rv = mskv_plan_validate(p, fz_u8(in) < 230 ? FP_PAGES : fp_value(in, FP_PAGES), why, fz_u8(in) % 2 ? sizeof why : 0);
    fp_attn(in, &at, 2);
    if (at.q_heads >= 0 && at.q_heads <= 64) {
        size_t es = mskv_dtype_size(at.q_dtype) ? mskv_dtype_size(at.q_dtype) : 4;
        size_t n = (size_t)nq * (size_t)at.q_heads * 8;
        unsigned char *q = (unsigned char *)calloc(n ? n : 1, es), *o = (unsigned char *)calloc(n ? n : 1, es);
        float *lse = (float *)calloc((size_t)nq * (size_t)at.q_heads + 1, sizeof(float));
        r = mskv_cpu_attention(fz_u8(in) & 1 ? fp.cpu : NULL, fp.a, layer, p, &at, q, o, fz_u8(in) & 1 ? lse : NULL);
        /* the page range the CPU checks is the arena's; validate's is the caller's */
        (void)rv;
        (void)r;
        free(q); free(o); free(lse);
    }
    {
        size_t n = (size_t)nq * 2 * 8;
        mskv_dtype dt = (mskv_dtype)(fz_u8(in) % 4);
        size_t es = mskv_dtype_size(dt) ? mskv_dtype_size(dt) : 4;
        unsigned char *k = (unsigned char *)calloc(n ? n : 1, es), *v = (unsigned char *)calloc(n ? n : 1, es);
        fp_rope(in, &rope, f->pos);
        (void)mskv_cpu_write_kv(fp.a, layer, p, k, v, dt, fz_u8(in) % 3 == 0 ? &rope : NULL);
        free(k); free(v);
    }
    {
        /* raw pools of a geometry from the input, allocated at exactly their size */
        mskv_pools pools;
        size_t bytes, es;
        void *k, *v;
        memset(&pools, 0, sizeof pools);
        pools.dtype = (mskv_dtype)(fz_u8(in) % 4);
        pools.num_pages = fp_value(in, FP_PAGES);
        pools.page_size = fz_u8(in) < 200 ? p->page_size : fp_value(in, 4);
        pools.kv_heads = 1 + fz_u8(in) % 2;
        pools.head_dim = fz_u8(in) < 240 ? 4 : fp_value(in, 8);
        es = mskv_dtype_size(pools.dtype) ? mskv_dtype_size(pools.dtype) : 4;
        if (pools.num_pages <= 0 || pools.num_pages > 64 || pools.page_size <= 0 || pools.page_size > 64 ||
            pools.head_dim <= 0 || pools.head_dim > 300)
            bytes = 1;
        else
            bytes = (size_t)pools.num_pages * (size_t)pools.page_size * (size_t)pools.kv_heads * (size_t)pools.head_dim * es;
        k = calloc(bytes, 1);
        v = calloc(bytes, 1);
        pools.k = k; pools.v = v;
        fp_attn(in, &at, pools.kv_heads);
        /* pools larger than what was allocated would be the caller's lie; sizes the
           library must refuse (<= 0, head_dim past its limit) are fine to declare */
        if (bytes == 1 && pools.num_pages > 0 && pools.page_size > 0 && pools.head_dim > 0 &&
            pools.head_dim <= MSKV_CPU_MAX_HEAD_DIM)
            at.q_heads = -1;
        if (at.q_heads >= 0 && at.q_heads <= 64) {
            size_t qes = mskv_dtype_size(at.q_dtype) ? mskv_dtype_size(at.q_dtype) : 4;
            size_t dim = pools.head_dim > 0 && pools.head_dim <= 300 ? (size_t)pools.head_dim : 1;
            size_t n = (size_t)nq * (size_t)at.q_heads * dim;
            unsigned char *q = (unsigned char *)calloc(n ? n : 1, qes), *o = (unsigned char *)calloc(n ? n : 1, qes);
            (void)mskv_cpu_attention_pools(fz_u8(in) & 1 ? fp.cpu : NULL, &pools, p, &at, q, o, NULL);
            free(q); free(o);
            n = (size_t)nq * (size_t)pools.kv_heads * dim;
            q = (unsigned char *)calloc(n ? n : 1, es); o = (unsigned char *)calloc(n ? n : 1, es);
            fp_rope(in, &rope, f->pos);
            (void)mskv_cpu_write_kv_pools(&pools, p, q, o, pools.dtype, fz_u8(in) % 3 == 0 ? &rope : NULL);
            free(q); free(o);
        }
        free(k); free(v);
    }
    {
        /* dense K/V of a declared row count, allocated at exactly that size (packed, or with strides) */
        mskv_dense_kv kv;
        size_t rows, es;
        void *k, *v;
        memset(&kv, 0, sizeof kv);
        kv.dtype = (mskv_dtype)(fz_u8(in) % 4);
        kv.kv_heads = 1 + fz_u8(in) % 2;
        kv.head_dim = fz_u8(in) < 240 ? 4 : fp_value(in, 8);
        kv.tokens = fp_value(in, 16);
        es = mskv_dtype_size(kv.dtype) ? mskv_dtype_size(kv.dtype) : 4;
        rows = kv.tokens > 0 && kv.tokens <= 64 ? (size_t)kv.tokens : 0;
        if (kv.head_dim > 0 && kv.head_dim <= 300 && fz_u8(in) < 64) {   /* head-major: [head][row][dim] */
            kv.token_stride = kv.head_dim;
            kv.head_stride = (int64_t)rows * kv.head_dim;
        }
        k = calloc(rows * (size_t)kv.kv_heads * (kv.head_dim > 0 && kv.head_dim <= 300 ? (size_t)kv.head_dim : 1) * es + 1, 1);
        v = calloc(rows * (size_t)kv.kv_heads * (kv.head_dim > 0 && kv.head_dim <= 300 ? (size_t)kv.head_dim : 1) * es + 1, 1);
        kv.k = k; kv.v = v;
        if (kv.tokens > 64 && kv.head_dim > 0 && kv.head_dim <= MSKV_CPU_MAX_HEAD_DIM) kv.tokens = -1;   /* more rows than allocated: the caller's lie */
        fp_attn(in, &at, kv.kv_heads);
        if (at.q_heads >= 0 && at.q_heads <= 64) {
            size_t qes = mskv_dtype_size(at.q_dtype) ? mskv_dtype_size(at.q_dtype) : 4;
            size_t dim = kv.head_dim > 0 && kv.head_dim <= 300 ? (size_t)kv.head_dim : 1;
            size_t n = (size_t)nq * (size_t)at.q_heads * dim;
            unsigned char *q = (unsigned char *)calloc(n ? n : 1, qes), *o = (unsigned char *)calloc(n ? n : 1, qes);
            (void)mskv_cpu_attention_dense(fz_u8(in) & 1 ? fp.cpu : NULL, &kv, p, &at, q, o, NULL);
            free(q); free(o);
        }
        free(k); free(v);
    }
}

static void fp_gpu(fz_in *in, fp_plan *f, mskv_cuda_store *st) {
    mskv_cuda_dplan dp;
    mskv_attn at;
    mskv_rope rope;
    mskv_result r;
    int32_t layer = fz_u8(in) < 240 ? (int32_t)(fz_u8(in) % 2) : fp_value(in, 1);
    mskv_pos_mode pm = f->pos;
    memset(&dp, 0, sizeof dp);
    if (fz_u8(in) >= 240) pm = fz_u8(in) & 1 ? (mskv_pos_mode)3 : f->pos == MSKV_POS_3D ? MSKV_POS_1D : MSKV_POS_NONE;
    r = mskv_cuda_plan_upload(st, &f->p, pm, &dp);
    if (r != MSKV_SUCCESS) return;
    fp_rope(in, &rope, f->pos);
    (void)mskv_cuda_write_kv(st, layer, &dp, fp.dk, fp.dv, fz_u8(in) % 3 == 0 ? &rope : NULL);
    fp_attn(in, &at, 2);
    if (fz_u8(in) < 200) at.q_dtype = MSKV_DTYPE_F16;
    if (at.q_heads > 8) at.q_heads = 8;    /* the device tensors hold 8 q heads */
    (void)mskv_cuda_attention(st, layer, &f->p, &dp, &at, fp.dq, fp.dout, fz_u8(in) & 1 ? fp.dlse : 0);
}

/* The arrays of a plan an arena built, copied into arrays of exactly its
   counts (the fuzzer's own, so wild edits and ASan see the real sizes). */
static void fp_adopt(fp_plan *f, const mskv_plan *src, mskv_pos_mode pos) {
    mskv_plan *p = &f->p;
    int64_t nb = src->batch, nq = src->total_q, ni = src->num_page_ids, npos = nq * (pos == MSKV_POS_3D ? 3 : 1);
    memset(f, 0, sizeof *f);
    *p = *src;
    f->pos = pos;
#define FP_COPY(field, n, type)                                                                  \
    p->field = (type *)calloc((n) > 0 ? (size_t)(n) : 1, sizeof(type));                         \
    if (src->field && (n) > 0) memcpy(p->field, src->field, (size_t)(n) * sizeof(type));
    FP_COPY(qo_indptr, nb + 1, int32_t)
    FP_COPY(kv_indptr, nb + 1, int32_t)
    FP_COPY(kv_indices, ni, int32_t)
    FP_COPY(kv_last_page_len, nb, int32_t)
    FP_COPY(kv_len, nb, int32_t)
    FP_COPY(kv_pos_split, nb, int32_t)
    FP_COPY(kv_pos_shift, nb, int32_t)
    FP_COPY(kv_token_indptr, nb + 1, int64_t)
    FP_COPY(slot_mapping, nq, int64_t)
    FP_COPY(positions, npos, int32_t)
    FP_COPY(requests, nb, mskv_request)
    /* the optional arrays too: the copy must not point into the plan freed after it */
    if (src->q_pos) { FP_COPY(q_pos, nq, int32_t) }
    if (src->vis_sink_end) { FP_COPY(vis_sink_end, nb, int32_t) }
    if (src->vis_window_start) { FP_COPY(vis_window_start, nb, int32_t) }
#undef FP_COPY
    if (pos == MSKV_POS_NONE) { free(p->positions); p->positions = NULL; }
    p->cap_batch = (int32_t)nb; p->cap_tokens = (int32_t)nq; p->cap_page_ids = (int32_t)ni;
    p->owned = NULL;
}

/* A few wild edits of a real plan: one array entry, a count, or the fields the stale check reads. */
static void fp_edit(fz_in *in, fp_plan *f) {
    mskv_plan *p = &f->p;
    int n = fz_u8(in) % 4, i;
    for (i = 0; i < n; i++) {
        uint8_t what = fz_u8(in) % 10;
        int32_t v = fp_value(in, 4);
        if (what == 0 && p->batch >= 0) p->qo_indptr[fz_u8(in) % (p->batch + 1)] = v;
        else if (what == 1 && p->batch >= 0) p->kv_indptr[fz_u8(in) % (p->batch + 1)] = v;
        else if (what == 2 && p->num_page_ids > 0) p->kv_indices[fz_u8(in) % p->num_page_ids] = fp_value(in, FP_PAGES);
        else if (what == 3 && p->batch > 0) p->kv_len[fz_u8(in) % p->batch] = fp_value(in, 2 * FP_P);
        else if (what == 4 && p->batch > 0) p->kv_last_page_len[fz_u8(in) % p->batch] = fp_value(in, FP_P);
        else if (what == 5 && p->total_q > 0) p->slot_mapping[fz_u8(in) % p->total_q] = fz_wild64(in);
        else if (what == 6) p->group = fz_u8(in) < 200 ? (int32_t)(fz_u8(in) % 3) - (fz_u8(in) < 20) : fz_wild32(in);
        else if (what == 7) p->generation = fz_u8(in) < 128 ? p->generation + (uint64_t)(fz_u8(in) % 3) - 1 : (uint64_t)fz_wild64(in);
        else if (what == 8 && p->batch > 0) p->requests[fz_u8(in) % p->batch].id = fz_u8(in) < 128 ? fp.greq[fz_u8(in) & 1].id : (uint32_t)fz_raw(in, 4);
        else if (what == 9 && p->batch > 0 && p->kv_pos_split) p->kv_pos_split[fz_u8(in) % p->batch] = v;
    }
}

/* A plan of a layer group from an arena of two groups: built, checked for
   staleness after a release in one group, edited, then handed to every
   consumer. Returns 0 when no plan could be built. */
static int fp_group_plan(fz_in *in, fp_plan *f, mskv_arena **own) {
    mskv_arena_desc d;
    mskv_arena *a;
    mskv_request r[2];
    mskv_segment seg[2];
    mskv_plan_desc pd;
    mskv_plan_size ps;
    mskv_plan built;
    mskv_result e;
    int32_t g = fz_u8(in) < 230 ? (int32_t)(fz_u8(in) % 2) : (int32_t)(fz_u8(in) % 4) - 1, rg, i, n = 1 + fz_u8(in) % 2;
    int gpu = fz_u8(in) & 1;
    *own = NULL;
    memset(&pd, 0, sizeof pd);
    pd.group = g;
    pd.pos_mode = (mskv_pos_mode)(fz_u8(in) % 3);
    pd.grid_h = 1; pd.grid_w = 2;
    if (gpu) {   /* the bound arena, which stays as it is: the plan is current */
        a = fp.ga;
        for (i = 0; i < n; i++) { seg[i].request = fp.greq[i]; seg[i].n_tokens = 1 + fz_u8(in) % 4; }
    } else {     /* an arena of its own: grown, released in one group, maybe after the build */
        memset(&d, 0, sizeof d);
        d.num_pages = FP_PAGES; d.page_size = FP_P; d.num_layers = 2; d.kv_heads = 2; d.head_dim = 8; d.num_groups = 2;
        d.allocator = fz_allocator();
        FZ_CHECK(mskv_arena_create(&d, &a) == MSKV_SUCCESS, "two-group arena");
        *own = a;
        for (i = 0; i < n; i++) {
            FZ_CHECK(mskv_request_add(a, &r[i]) == MSKV_SUCCESS, "add");
            seg[i].request = r[i];
            seg[i].n_tokens = 1 + fz_u8(in) % (3 * FP_P);
        }
        FZ_CHECK(mskv_admit(a, seg, n) == MSKV_SUCCESS && mskv_commit(a, seg, n) == MSKV_SUCCESS, "grow");
        for (i = 0; i < n; i++) seg[i].n_tokens = 1 + fz_u8(in) % seg[i].n_tokens;
    }
    e = mskv_plan_query(a, seg, n, &pd, &ps);
    if (e != MSKV_SUCCESS) {
        FZ_CHECK(g < 0 || g > 1, "plan_query of group %d: %s", (int)g, mskv_result_string(e));
        return 0;
    }
    FZ_CHECK(mskv_plan_alloc(a, ps.batch, ps.total_q, ps.num_page_ids, &built) == MSKV_SUCCESS, "plan_alloc");
    FZ_CHECK(mskv_plan_build(a, seg, n, &pd, &built) == MSKV_SUCCESS && built.group == g, "plan_build of group %d", (int)g);
    FZ_CHECK(mskv_plan_check(a, &built) == MSKV_SUCCESS, "a plan just built is stale");
    if (!gpu) {
        /* a release in group rg: stale exactly when it is the plan's group (and pages left) */
        int64_t got = 0;
        rg = (int32_t)(fz_u8(in) % 2);
        (void)mskv_request_release_oldest_in_group(a, r[0], rg, FP_P, &got);   /* OUT_OF_RANGE below a page: got stays 0 */
        e = mskv_plan_check(a, &built);
        FZ_CHECK(e == (got > 0 && rg == g ? MSKV_ERROR_STALE_PLAN : MSKV_SUCCESS),
                 "plan of group %d after releasing %lld tokens of group %d: %s", (int)g, (long long)got, (int)rg, mskv_result_string(e));
    }
    fp_adopt(f, &built, pd.pos_mode);
    mskv_plan_free(a, &built);
    fp_edit(in, f);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in;
    fp_plan f;
    uint64_t d0, dg;
    mskv_arena *own = NULL;
    uint8_t mode, stream;
    if (!fp.ready) fp_setup();
    in.p = data;
    in.n = size;
    d0 = mskv_arena_digest(fp.a);
    dg = mskv_arena_digest(fp.ga);
    mode = fz_u8(&in);
    /* the adopted-pool store runs on the stream the input names */
    stream = fz_u8(&in) % 3;
    FZ_CHECK(mskv_cuda_store_set_stream(fp.st2, stream == 0 ? NULL : stream == 1 ? MSKV_CU_STREAM_LEGACY : fp.caller_stream) == MSKV_SUCCESS,
             "set_stream");
    if (mode < 192) {
        fp_make(&in, &f);
    } else if (!fp_group_plan(&in, &f, &own)) {
        mskv_arena_destroy(own);
        return 0;
    }
    fp_cpu(&in, &f);
    if (own) {   /* the two-group arena's own pools, through its tables' pages */
        mskv_attn at;
        size_t n = (size_t)(f.p.total_q > 0 ? f.p.total_q : 0) * 4 * 8;
        float *q = (float *)calloc(n ? n : 1, 4), *o = (float *)calloc(n ? n : 1, 4);
        fp_attn(&in, &at, 2);
        at.q_dtype = MSKV_DTYPE_F32;
        if (at.q_heads > 4) at.q_heads = 4;
        (void)mskv_cpu_attention(fz_u8(&in) & 1 ? fp.cpu : NULL, own, fz_u8(&in) % 2, &f.p, &at, q, o, NULL);
        (void)mskv_cpu_write_kv(own, fz_u8(&in) % 2, &f.p, q, o, MSKV_DTYPE_F32, NULL);
        free(q); free(o);
        mskv_arena_destroy(own);
    }
    fp_gpu(&in, &f, fp.st);
    fp_gpu(&in, &f, fp.st2);
    fp_drop(&f);
    FZ_CHECK(mskv_arena_digest(fp.a) == d0, "a plan consumer changed the arena's bookkeeping");
    FZ_CHECK(mskv_arena_digest(fp.ga) == dg, "a plan consumer changed the bound arena's bookkeeping");
    FZ_CHECK(mskv_cuda_store_set_stream(fp.st2, NULL) == MSKV_SUCCESS, "back to the store's stream");
    return 0;
}
