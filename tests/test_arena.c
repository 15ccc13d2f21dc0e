/* The arena: page accounting, the null page, deterministic allocation,
   pending pages and fences, the host store's geometry, the allocator hook. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

static mskv_arena *mta_make(int32_t num_pages, int32_t page_size, mskv_retire_mode mode) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    d.retire_mode = mode;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}


static int mta_conserved(mskv_arena *a) {
    mskv_arena_stats st;
    if (mskv_arena_stats_get(a, &st) != MSKV_SUCCESS) return 0;
    return st.free_pages + st.live_pages + st.pending_pages + 1 == st.num_pages;
}

TEST(arena_rejects_fewer_than_two_pages_and_page_size_below_one) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 1; d.page_size = 16;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d.num_pages = 16; d.page_size = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d.page_size = -3;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    EXPECT_TRUE(a == NULL);
    d.num_pages = 2; d.page_size = 1;  /* the smallest legal arena: one usable page */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mskv_arena_destroy(a);
}

TEST(null_page_is_never_allocated) {
    int32_t pages[16], count = 0, i;
    mskv_request r, r2;
    mskv_arena *a = mta_make(9, 1, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));  /* every usable page */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, pages, 16, &count));
    ASSERT_EQ(8, count);
    for (i = 0; i < count; i++) {
        int32_t j;
        EXPECT_LT(0, pages[i]);
        EXPECT_GT(9, pages[i]);
        for (j = 0; j < i; j++) EXPECT_NE(pages[j], pages[i]);
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r2));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mtu_grow(a, r2, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(conservation_free_live_pending_and_null_make_num_pages) {
    mskv_request r[3];
    mskv_arena_stats st;
    int i;
    mskv_arena *a = mta_make(40, 3, MSKV_RETIRE_FENCED);
    ASSERT_TRUE(a != NULL);
    EXPECT_TRUE(mta_conserved(a));
    for (i = 0; i < 3; i++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[i]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[i], 10 + 7 * i));
        EXPECT_TRUE(mta_conserved(a));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(4 + 6 + 8, st.live_pages);  /* ceil(10/3) + ceil(17/3) + ceil(24/3) */
    EXPECT_EQ(3, st.requests);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r[1], 9, NULL));
    EXPECT_TRUE(mta_conserved(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(4 + 3, st.pending_pages);
    EXPECT_TRUE(mta_conserved(a));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* The same calls on two arenas: a small random workload driven by one seed. */
static void mta_workload(mskv_arena *a, uint64_t seed, int32_t *trace, int trace_cap, int *trace_len) {
    mskv_request reqs[4];
    int live[4] = {0, 0, 0, 0}, step, n = 0;
    uint64_t x = seed | 1;
    for (step = 0; step < 400; step++) {
        int k, op;
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        k = (int)(x % 4);
        op = (int)((x >> 8) % 5);
        if (!live[k]) {
            if (mskv_request_add(a, &reqs[k]) == MSKV_SUCCESS) live[k] = 1;
            continue;
        }
        if (op <= 2) (void)mtu_grow(a, reqs[k], (int64_t)((x >> 16) % 9) + 1);
        else if (op == 3) (void)mskv_request_release_oldest(a, reqs[k], (int64_t)((x >> 16) % 5), NULL);
        else { (void)mskv_request_remove(a, reqs[k]); live[k] = 0; }
        for (k = 0; k < 4; k++) {
            int32_t pages[64], count = 0, i;
            if (!live[k]) continue;
            if (mskv_request_pages(a, reqs[k], pages, 64, &count) != MSKV_SUCCESS) continue;
            for (i = 0; i < count && n < trace_cap; i++) trace[n++] = pages[i];
        }
    }
    *trace_len = n;
}

TEST(allocation_order_is_deterministic_across_arenas) {
    static int32_t t1[40000], t2[40000];
    int n1 = 0, n2 = 0, i;
    uint64_t seed = mt_seed();
    mskv_arena *a = mta_make(64, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_arena *b = mta_make(64, 2, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL && b != NULL);
    mta_workload(a, seed, t1, 40000, &n1);
    mta_workload(b, seed, t2, 40000, &n2);
    EXPECT_LT(100, n1);  /* the workload did hand out pages */
    ASSERT_EQ(n1, n2);
    for (i = 0; i < n1; i++)
        if (t1[i] != t2[i]) { EXPECT_EQ(t1[i], t2[i]); break; }
    EXPECT_EQ_U64(mskv_arena_digest(a), mskv_arena_digest(b));
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(fenced_pending_pages_are_not_reused_before_retire) {
    mskv_request r, r2;
    mskv_arena_stats st;
    uint64_t fence;
    mskv_arena *a = mta_make(5, 1, MSKV_RETIRE_FENCED);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
    fence = mskv_arena_step(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(4, st.pending_pages);
    EXPECT_EQ(0, st.free_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r2));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mtu_grow(a, r2, 1));
    if (fence > 0) {  /* an older fence does not release pages freed in this one */
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, fence - 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
        EXPECT_EQ(4, st.pending_pages);
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, fence));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.pending_pages);
    EXPECT_EQ(4, st.free_pages);
    EXPECT_EQ_U64(fence, st.completed_step);
    EXPECT_EQ(MSKV_SUCCESS, mtu_grow(a, r2, 4));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(immediate_mode_reuses_freed_pages_at_once) {
    mskv_request r, r2;
    mskv_arena_stats st;
    mskv_arena *a = mta_make(5, 2, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.pending_pages);
    EXPECT_EQ(4, st.free_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r2));
    EXPECT_EQ(MSKV_SUCCESS, mtu_grow(a, r2, 8));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(publish_advances_the_fence_and_reports_the_one_that_ended) {
    uint64_t s0, ended = 12345;
    mskv_arena_stats st;
    mskv_arena *a = mta_make(8, 4, MSKV_RETIRE_FENCED);
    ASSERT_TRUE(a != NULL);
    s0 = mskv_arena_step(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, &ended));
    EXPECT_EQ_U64(s0, ended);
    EXPECT_LT(s0, mskv_arena_step(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ_U64(mskv_arena_step(a), st.step);
    mskv_arena_destroy(a);
}

TEST(digest_changes_with_the_state_and_only_with_it) {
    mskv_request r;
    mskv_request_info info;
    mskv_arena_stats st;
    int32_t pages[8], count;
    int64_t slot;
    uint64_t d0, d1;
    mskv_arena *a = mta_make(16, 4, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    d0 = mskv_arena_digest(a);
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));
    d1 = mskv_arena_digest(a);
    EXPECT_NE_U64(d0, d1);
    /* read-only calls */
    (void)mskv_request_info_get(a, r, &info);
    (void)mskv_request_pages(a, r, pages, 8, &count);
    (void)mskv_request_slot(a, r, 3, &slot);
    (void)mskv_arena_stats_get(a, &st);
    (void)mskv_arena_audit(a, NULL, 0);
    EXPECT_EQ_U64(d1, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 2));
    EXPECT_NE_U64(d1, mskv_arena_digest(a));
    mskv_arena_destroy(a);
}

TEST(store_geometry_follows_the_descriptor) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_store_info si;
    int32_t l;
    memset(&d, 0, sizeof d);
    d.num_pages = 10; d.page_size = 5; d.num_layers = 3; d.kv_heads = 2; d.head_dim = 8;
    d.dtype = MSKV_DTYPE_BF16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_store_info_get(a, &si));
    EXPECT_EQ(3, si.num_layers);
    EXPECT_EQ(2, si.kv_heads);
    EXPECT_EQ(8, si.head_dim);
    EXPECT_EQ(5, si.page_size);
    EXPECT_EQ(10, si.num_pages);
    EXPECT_EQ(2, (int)si.elem_size);
    EXPECT_EQ(2 * 8 * 2, (int64_t)si.slot_bytes);
    EXPECT_EQ(5 * 2 * 8 * 2, (int64_t)si.page_bytes);
    EXPECT_EQ(10 * 5 * 2 * 8 * 2, (int64_t)si.pool_bytes);
    for (l = 0; l < 3; l++) {
        EXPECT_TRUE(mskv_store_pool(a, l, 0) != NULL);
        EXPECT_TRUE(mskv_store_pool(a, l, 1) != NULL);
        EXPECT_TRUE(mskv_store_pool(a, l, 0) != mskv_store_pool(a, l, 1));
    }
    EXPECT_TRUE(mskv_store_pool(a, 3, 0) == NULL);
    EXPECT_TRUE(mskv_store_pool(a, -1, 0) == NULL);
    EXPECT_TRUE(mskv_store_pool(a, 0, 2) == NULL);
    mskv_arena_destroy(a);
}

TEST(bookkeeping_only_arena_has_no_pools) {
    mskv_arena *a = mta_make(10, 4, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL);
    EXPECT_TRUE(mskv_store_pool(a, 0, 0) == NULL);
    mskv_arena_destroy(a);
}

TEST(dtype_sizes_are_four_two_two_and_zero_for_unknown) {
    EXPECT_EQ(4, (int)mskv_dtype_size(MSKV_DTYPE_F32));
    EXPECT_EQ(2, (int)mskv_dtype_size(MSKV_DTYPE_F16));
    EXPECT_EQ(2, (int)mskv_dtype_size(MSKV_DTYPE_BF16));
    EXPECT_EQ(0, (int)mskv_dtype_size((mskv_dtype)7));
}

TEST(result_string_names_every_code_and_never_returns_null) {
    static const mskv_result codes[] = {
        MSKV_SUCCESS, MSKV_ERROR_INVALID_ARGUMENT, MSKV_ERROR_NULL_POINTER, MSKV_ERROR_INVALID_HANDLE,
        MSKV_ERROR_OUT_OF_RANGE, MSKV_ERROR_RELEASED, MSKV_ERROR_NOT_WRITTEN, MSKV_ERROR_CAPACITY,
        MSKV_ERROR_INVALID_SPEC, MSKV_ERROR_DUPLICATE, MSKV_ERROR_NOT_FOUND, MSKV_ERROR_OFFLOADED,
        MSKV_ERROR_NOT_OFFLOADED, MSKV_ERROR_RESERVATION_PENDING, MSKV_ERROR_NO_RESERVATION,
        MSKV_ERROR_READ_ONLY, MSKV_ERROR_BAD_STATE, MSKV_ERROR_STALE_PLAN, MSKV_ERROR_STALE_VIEW, MSKV_ERROR_OUT_OF_PAGES, MSKV_ERROR_OUT_OF_MEMORY,
        MSKV_ERROR_OVERFLOW, MSKV_ERROR_TOO_MANY_REQUESTS, MSKV_ERROR_BLOB_TRUNCATED,
        MSKV_ERROR_BLOB_CORRUPT, MSKV_ERROR_BLOB_VERSION, MSKV_ERROR_BLOB_MISMATCH,
        MSKV_ERROR_AUDIT_FAILED, MSKV_ERROR_HOST_COPY_CORRUPT, MSKV_ERROR_DIVERGED, MSKV_ERROR_UNSUPPORTED, MSKV_ERROR_THREAD, MSKV_ERROR_IO,
        MSKV_ERROR_CUDA_UNAVAILABLE, MSKV_ERROR_CUDA, MSKV_ERROR_NVRTC, MSKV_ERROR_PEER, MSKV_ERROR_TIMEOUT,
        MSKV_ERROR_IN_DOUBT, MSKV_ERROR_DENIED};
    size_t i, j, n = sizeof codes / sizeof codes[0];
    for (i = 0; i < n; i++) {
        const char *s = mskv_result_string(codes[i]);
        ASSERT_TRUE(s != NULL);
        EXPECT_TRUE(s[0] != '\0');
        for (j = 0; j < i; j++)  /* each code has its own description */
            if (strcmp(s, mskv_result_string(codes[j])) == 0)
                mt_fail(__FILE__, __LINE__, "codes %d and %d share \"%s\"", (int)codes[i], (int)codes[j], s);
    }
    EXPECT_TRUE(mskv_result_string((mskv_result)-12345) != NULL);
}

TEST(max_requests_is_enforced_with_too_many_requests) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r[4], extra;
    int i;
    memset(&d, 0, sizeof d);
    d.num_pages = 16; d.page_size = 4; d.max_requests = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    for (i = 0; i < 3; i++) ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[i]));
    EXPECT_EQ(MSKV_ERROR_TOO_MANY_REQUESTS, mskv_request_add(a, &extra));
    EXPECT_EQ(MSKV_ERROR_TOO_MANY_REQUESTS, mskv_request_fork(a, r[0], &extra));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r[1]));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[3]));
    mskv_arena_destroy(a);
}

/* Counting allocator: every byte the arena takes goes through it and comes back. */
typedef struct mta_counter { long allocs, frees, live; } mta_counter;

static void *mta_alloc(void *user, size_t size) {
    mta_counter *c = (mta_counter *)user;
    void *p = malloc(size ? size : 1);
    if (p) { c->allocs++; c->live++; }
    return p;
}
static void *mta_realloc(void *user, void *ptr, size_t size) {
    mta_counter *c = (mta_counter *)user;
    void *p = realloc(ptr, size ? size : 1);
    if (p && !ptr) { c->allocs++; c->live++; }
    return p;
}
static void mta_free(void *user, void *ptr) {
    mta_counter *c = (mta_counter *)user;
    if (ptr) { c->frees++; c->live--; }
    free(ptr);
}

TEST(runtime_allocator_receives_every_allocation_and_every_free) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r, child;
    mskv_plan plan;
    mskv_segment s;
    mskv_plan_desc pd;
    mta_counter c = {0, 0, 0};
    memset(&d, 0, sizeof d);
    memset(&pd, 0, sizeof pd);
    d.num_pages = 32; d.page_size = 4; d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4;
    d.allocator.user = &c;
    d.allocator.alloc = mta_alloc;
    d.allocator.realloc = mta_realloc;
    d.allocator.free = mta_free;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    EXPECT_LT(0, c.allocs);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, r, &child));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, child));
    s.request = r; s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 4, 64, 64, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &plan));
    mskv_plan_free(a, &plan);
    mskv_arena_destroy(a);
    EXPECT_EQ(c.allocs, c.frees);
    EXPECT_EQ(0, c.live);
}
