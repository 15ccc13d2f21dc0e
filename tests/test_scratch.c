/* Keyed scratch entries (mskv_scratch_create / mskv_scratch_reset): a small
   model's per-step K/V in the arena's pages, reset and refilled every step.
   Checked: many steps of a code-predictor-like loop with attention equal to
   a direct computation over the same tokens, host allocations flat after the
   first step and pages back to the baseline at every reset; a reset's pages
   wait for their fence in FENCED mode and make only the entry's own plans
   stale; and bad input, each refused with its code and nothing changed. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

enum { MSC_P = 4, MSC_L = 2, MSC_KVH = 2, MSC_QH = 4, MSC_D = 8, MSC_CAP = 24 };

/* an allocator that counts its calls */
typedef struct msc_count { long allocs, reallocs, frees; int refuse; } msc_count;
static void *msc_alloc(void *u, size_t n) { ((msc_count *)u)->allocs++; return ((msc_count *)u)->refuse ? NULL : malloc(n); }
static void *msc_realloc(void *u, void *p, size_t n) { ((msc_count *)u)->reallocs++; return ((msc_count *)u)->refuse ? NULL : realloc(p, n); }
static void msc_free(void *u, void *p) { if (p) ((msc_count *)u)->frees++; free(p); }

static mskv_arena *msc_make(msc_count *c, mskv_retire_mode mode) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 64;
    d.page_size = MSC_P;
    d.max_requests = 8;
    d.num_layers = MSC_L;
    d.kv_heads = MSC_KVH;
    d.head_dim = MSC_D;
    d.dtype = MSKV_DTYPE_F32;
    d.retire_mode = mode;
    if (c) {
        d.allocator.user = c;
        d.allocator.alloc = msc_alloc;
        d.allocator.realloc = msc_realloc;
        d.allocator.free = msc_free;
    }
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

static int32_t msc_free_pages(mskv_arena *a) {
    mskv_arena_stats st;
    return mskv_arena_stats_get(a, &st) == MSKV_SUCCESS ? st.free_pages : -1;
}

static float msc_val(uint64_t *s) { return (float)((int)(mtu_xorshift(s) % 2001) - 1000) / 1000.0f; }

/* causal attention of nq queries at positions base.. over keys [0, base + nq), computed directly */
static void msc_reference(const float *k, const float *v, int64_t base, int32_t nq, const float *q, float *o) {
    int32_t i, h, j, d;
    float scale = 1.0f / sqrtf((float)MSC_D);
    for (i = 0; i < nq; i++)
        for (h = 0; h < MSC_QH; h++) {
            int32_t kh = h / (MSC_QH / MSC_KVH);
            int64_t nk = base + i + 1;
            float mx = -1e30f, sum = 0.0f, w[MSC_CAP];
            const float *qi = q + ((size_t)i * MSC_QH + h) * MSC_D;
            for (j = 0; j < nk; j++) {
                float dot = 0.0f;
                for (d = 0; d < MSC_D; d++) dot += qi[d] * k[((size_t)j * MSC_KVH + kh) * MSC_D + d];
                w[j] = dot * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (j = 0; j < nk; j++) { w[j] = expf(w[j] - mx); sum += w[j]; }
            for (d = 0; d < MSC_D; d++) {
                float acc = 0.0f;
                for (j = 0; j < nk; j++) acc += w[j] * v[((size_t)j * MSC_KVH + kh) * MSC_D + d];
                o[((size_t)i * MSC_QH + h) * MSC_D + d] = acc / sum;
            }
        }
}

TEST(scratch_steps_reuse_pages_with_flat_memory) {
    enum { STEPS = 1000 };
    msc_count c;
    mskv_arena *a;
    mskv_request main_req, scr, found;
    mskv_plan plan;
    mskv_attn at;
    int32_t main_pages[8], main_pages_after[8], n_main = 0, n_after = 0, base_free, step, l, i;
    long base_calls = -1;
    uint64_t seed = mt_seed(), rng = seed | 1;
    int64_t total = 0;
    double worst = 0.0;
    /* per layer: every token's K and V of the current step, contiguous */
    static float ks[MSC_L][MSC_CAP * MSC_KVH * MSC_D], vs[MSC_L][MSC_CAP * MSC_KVH * MSC_D];
    static float q[MSC_CAP * MSC_QH * MSC_D], o[MSC_CAP * MSC_QH * MSC_D], ref[MSC_CAP * MSC_QH * MSC_D];
    memset(&c, 0, sizeof c);
    ASSERT_TRUE((a = msc_make(&c, MSKV_RETIRE_IMMEDIATE)) != NULL);
    /* another request that must not notice the scratch's steps */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &main_req));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, main_req, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, main_req, main_pages, 8, &n_main));
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_create(a, 0xC0DEull, MSC_CAP, &scr));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_find(a, 0xC0DEull, &found));
    EXPECT_EQ(scr.id, found.id);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, MSC_CAP, MSC_CAP / MSC_P + 1, &plan));
    base_free = msc_free_pages(a);
    memset(&at, 0, sizeof at);
    at.q_heads = MSC_QH;
    at.mask = MSKV_MASK_CAUSAL;
    at.q_dtype = MSKV_DTYPE_F32;
    for (step = 0; step < STEPS && !mt_failed_now(); step++) {
        int32_t sub, nsub = 1 + (int32_t)(mtu_xorshift(&rng) % 4);
        int64_t len = 0;
        ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_reset(a, scr));
        ASSERT_EQ(base_free, msc_free_pages(a));   /* every page of the last step is back */
        for (sub = 0; sub < nsub; sub++) {         /* the predictor's own autoregressive loop */
            mskv_segment s;
            mskv_plan_desc pd;
            s.request = scr;
            s.n_tokens = 1 + (int64_t)(mtu_xorshift(&rng) % 5);
            ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
            memset(&pd, 0, sizeof pd);
            ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &plan));
            for (i = 0; i < (int32_t)s.n_tokens * MSC_QH * MSC_D; i++) q[i] = msc_val(&rng);
            for (l = 0; l < MSC_L; l++) {
                float *kn = ks[l] + len * MSC_KVH * MSC_D, *vn = vs[l] + len * MSC_KVH * MSC_D;
                for (i = 0; i < (int32_t)s.n_tokens * MSC_KVH * MSC_D; i++) { kn[i] = msc_val(&rng); vn[i] = msc_val(&rng); }
                ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, l, &plan, kn, vn, MSKV_DTYPE_F32, NULL));
                ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, l, &plan, &at, q, o, NULL));
                msc_reference(ks[l], vs[l], len, (int32_t)s.n_tokens, q, ref);
                for (i = 0; i < (int32_t)s.n_tokens * MSC_QH * MSC_D; i++) {
                    double e = fabs((double)o[i] - (double)ref[i]);
                    if (e > worst) worst = e;
                }
            }
            ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
            len += s.n_tokens;
            total += s.n_tokens;
        }
        ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
        if (step == 0) base_calls = c.allocs + c.reallocs;
        else ASSERT_EQ(base_calls, c.allocs + c.reallocs);   /* no host allocation after the first step */
        if (step % 100 == 0 && !mtu_audit(a)) break;
    }
    if (worst > 1e-5) mt_fail(__FILE__, __LINE__, "scratch attention differs from the direct computation by %g (seed %llu)", worst, (unsigned long long)seed);
    EXPECT_TRUE(total > STEPS);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, main_req, main_pages_after, 8, &n_after));
    EXPECT_EQ(n_main, n_after);
    EXPECT_EQ(0, memcmp(main_pages, main_pages_after, sizeof(int32_t) * (size_t)n_main));
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_reset(a, scr));
    EXPECT_EQ(base_free, msc_free_pages(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 0xC0DEull));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_scratch_reset(a, scr));
    mtu_audit(a);
    mskv_plan_free(a, &plan);
    mskv_arena_destroy(a);
}

/* The same step twice takes the same page ids: reset gives them back in order. */
TEST(scratch_reset_hands_back_the_same_pages) {
    mskv_arena *a;
    mskv_request scr;
    mskv_segment s;
    int32_t p1[8], p2[8], n1 = 0, n2 = 0;
    ASSERT_TRUE((a = msc_make(NULL, MSKV_RETIRE_IMMEDIATE)) != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_create(a, 5, 16, &scr));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, scr, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, scr, p1, 8, &n1));
    EXPECT_EQ(3, n1);
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_reset(a, scr));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, scr, p2, 8, &n2));
    EXPECT_EQ(0, n2);
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, scr, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, scr, p2, 8, &n2));
    ASSERT_EQ(n1, n2);
    EXPECT_EQ(0, memcmp(p1, p2, sizeof(int32_t) * (size_t)n1));
    /* an abort of a scratch step gives its pages back too */
    s.request = scr;
    s.n_tokens = 6;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, scr, p2, 8, &n2));
    EXPECT_EQ(3, n2);
    mtu_audit(a);
    mskv_arena_destroy(a);
}

/* FENCED: a reset's pages wait for the fence a kernel may still read them in;
   only the entry's own plans go stale. */
TEST(scratch_reset_waits_for_the_fence_and_stales_its_plans) {
    mskv_arena *a;
    mskv_request scr, other;
    mskv_segment s[2];
    mskv_plan ps, po;
    mskv_plan_desc pd;
    mskv_arena_stats st;
    uint64_t fence = 0;
    int32_t free0;
    ASSERT_TRUE((a = msc_make(NULL, MSKV_RETIRE_FENCED)) != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_create(a, 77, 12, &scr));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &other));
    free0 = msc_free_pages(a);
    s[0].request = scr; s[0].n_tokens = 9;
    s[1].request = other; s[1].n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 2));
    memset(&pd, 0, sizeof pd);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 16, 8, &ps));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 16, 8, &po));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s[0], 1, &pd, &ps));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s[1], 1, &pd, &po));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, s, 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, s, 2, &fence));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_check(a, &ps));
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_reset(a, scr));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_plan_check(a, &ps));   /* it reads pages the entry gave back */
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_check(a, &po));            /* the other request's plan is untouched */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(3, st.pending_pages);                              /* 9 tokens on pages of 4 */
    EXPECT_EQ(free0 - 4, st.free_pages);                         /* and the other request's 1 */
    /* the next step cannot take them until the fence they were freed in retires */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, mskv_arena_step(a)));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.pending_pages);
    EXPECT_EQ(free0 - 1, st.free_pages);
    mtu_audit(a);
    mskv_plan_free(a, &ps);
    mskv_plan_free(a, &po);
    mskv_arena_destroy(a);
}

TEST(scratch_bad_input_is_refused_and_changes_nothing) {
    mskv_arena *a;
    mskv_request scr, plain, keyed, child, dup;
    mskv_segment s;
    mskv_request_info info;
    mskv_retention rt;
    mskv_blob_layout lay;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    size_t size = 0;
    int64_t rel = 0;
    uint64_t dg;
    ASSERT_TRUE((a = msc_make(NULL, MSKV_RETIRE_IMMEDIATE)) != NULL);
    /* create */
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_scratch_create(NULL, 1, 8, &scr));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_scratch_create(a, 1, 8, NULL));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_scratch_create(a, 1, 0, &scr));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_scratch_create(a, 1, -5, &scr));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_scratch_create(a, 1, INT32_MAX, &scr));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_scratch_create(a, 1, 64 * MSC_P, &scr));   /* 64 pages, the null page among them */
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 2, 5, &keyed));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, keyed));
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_scratch_create(a, 2, 8, &scr));
    EXPECT_EQ(dg, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_create(a, 1, 8, &scr));
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_keyed_create(a, 1, 3, &dup));
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_scratch_create(a, 1, 8, &dup));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, scr, &info));
    EXPECT_EQ(1, info.keyed);
    EXPECT_EQ(0, info.sealed);
    EXPECT_EQ(0, info.num_pages);
    /* reset */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &plain));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, plain, 5));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, scr, 5));
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_scratch_reset(NULL, scr));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_scratch_reset(a, plain));   /* an ordinary request keeps its tokens */
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_scratch_reset(a, keyed));   /* so does a write-once keyed entry */
    child.id = scr.id + 0x10000u;                                     /* another generation of the slot */
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_scratch_reset(a, child));
    EXPECT_EQ(dg, mskv_arena_digest(a));
    /* a step in flight: reset refuses until it is committed or aborted */
    s.request = scr;
    s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_RESERVATION_PENDING, mskv_scratch_reset(a, scr));
    EXPECT_EQ(dg, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, scr, &info));
    EXPECT_EQ(5, info.committed);
    EXPECT_EQ(2, info.reserved);
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    /* past the capacity: nothing admitted */
    s.n_tokens = 2;   /* 7 + 2 > 8 */
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_admit(a, &s, 1));
    EXPECT_EQ(dg, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_SUCCESS, mtu_grow(a, scr, 1));   /* exactly the capacity */
    /* what would keep or move a sequence */
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_keyed_seal(a, scr));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_export(a, scr, NULL, 0, &size));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_export_begin(a, scr, hdr, sizeof hdr, &lay));
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_protect_prefix(a, scr, 4));
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_release_oldest(a, scr, 4, &rel));
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_offload(a, scr));
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_fork(a, scr, &child));
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_shift_positions(a, scr, 3));
    memset(&rt, 0, sizeof rt);
    rt.chunk_size = MSC_P; rt.sink_chunks = 1; rt.window_chunks = 1;
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_set_retention(a, scr, &rt));
    EXPECT_EQ(dg, mskv_arena_digest(a));
    mtu_audit(a);
    /* a CROSS plan reads sealed entries only */
    {
        mskv_plan p;
        mskv_plan_desc pd;
        mskv_segment qs;
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 8, &p));
        memset(&pd, 0, sizeof pd);
        pd.kind = MSKV_PLAN_CROSS;
        pd.cross = scr;
        qs.request = plain;
        qs.n_tokens = 1;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &qs, 1));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_plan_build(a, &qs, 1, &pd, &p));
        ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &qs, 1));
        mskv_plan_free(a, &p);
    }
    /* removed through its key: its pages go back, the handle is stale */
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 1));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_scratch_reset(a, scr));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(a, 1, &dup));
    mtu_audit(a);
    mskv_arena_destroy(a);
}

/* create's one allocation (the page tables) failing: nothing changes, and the key stays free */
TEST(scratch_create_out_of_memory_changes_nothing) {
    msc_count c;
    mskv_arena *a;
    mskv_request scr, found;
    uint64_t dg;
    long calls;
    memset(&c, 0, sizeof c);
    ASSERT_TRUE((a = msc_make(&c, MSKV_RETIRE_IMMEDIATE)) != NULL);
    dg = mskv_arena_digest(a);
    calls = c.allocs + c.reallocs;
    c.refuse = 1;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, mskv_scratch_create(a, 3, 40, &scr));
    c.refuse = 0;
    EXPECT_TRUE(c.allocs + c.reallocs > calls);   /* it did ask */
    EXPECT_EQ(dg, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(a, 3, &found));
    mtu_audit(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_scratch_create(a, 3, 40, &scr));
    EXPECT_EQ(MSKV_SUCCESS, mtu_grow(a, scr, 40));
    mtu_audit(a);
    mskv_arena_destroy(a);
}
