/* Hardening: the defects an independent fuzz run found (issue 9) and the
   same classes of bug found by re-reading the core, one rule per test; then
   stale-plan detection and the debug mode (poisoned free pages, the byte
   audit, per-page checksums of host copies). */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* ---- an allocator that fails on request and checks every free ------------------
   Fresh blocks are filled with garbage, so memory the library forgot to
   initialise is not accidentally zero; a free of a pointer it never handed
   out (or handed out and freed already) is counted, not performed. */

#define MTH_MAX_LIVE 4096
static struct mth_heap {
    void *live[MTH_MAX_LIVE];
    int nlive;
    long calls;          /* allocations attempted (alloc + realloc of NULL or not) */
    long fail_at;        /* the calls-th attempt fails when calls == fail_at (1-based; 0 never) */
    int fail_from;       /* fail every attempt from fail_at on */
    long bad_frees;
} mth;

static void mth_reset(void) { memset(&mth, 0, sizeof mth); }
static int mth_find(void *p) {
    int i;
    for (i = 0; i < mth.nlive; i++)
        if (mth.live[i] == p) return i;
    return -1;
}
static int mth_should_fail(void) {
    mth.calls++;
    return mth.fail_at > 0 && (mth.calls == mth.fail_at || (mth.fail_from && mth.calls > mth.fail_at));
}
static void *mth_alloc(void *u, size_t n) {
    void *p;
    (void)u;
    if (mth_should_fail() || mth.nlive == MTH_MAX_LIVE) return NULL;
    p = malloc(n);
    if (!p) return NULL;
    memset(p, 0xA5, n);
    mth.live[mth.nlive++] = p;
    return p;
}
static void mth_free(void *u, void *p) {
    int i;
    (void)u;
    if (!p) return;
    i = mth_find(p);
    if (i < 0) { mth.bad_frees++; return; }
    mth.live[i] = mth.live[--mth.nlive];
    free(p);
}
static void *mth_realloc(void *u, void *p, size_t n) {
    int i;
    void *q;
    (void)u;
    if (!p) return mth_alloc(u, n);
    i = mth_find(p);
    if (i < 0) { mth.bad_frees++; return NULL; }
    if (mth_should_fail()) return NULL;
    q = realloc(p, n);
    if (!q) return NULL;
    mth.live[i] = q;
    return q;
}
static mskv_allocator mth_allocator(void) {
    mskv_allocator a;
    a.user = NULL; a.alloc = mth_alloc; a.realloc = mth_realloc; a.free = mth_free;
    return a;
}

static mskv_arena_desc mth_desc(int32_t num_pages, int32_t page_size, int32_t num_layers) {
    mskv_arena_desc d;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size; d.max_requests = 8;
    d.num_layers = num_layers; d.kv_heads = num_layers ? 2 : 0; d.head_dim = num_layers ? 8 : 0;
    d.dtype = MSKV_DTYPE_F32;
    return d;
}

/* ---- defect 1 --------------------------------------------------------------------- */

TEST(arena_create_out_of_memory_at_any_allocation_returns_out_of_memory_and_frees_only_what_it_allocated) {
    long n, sites = 0;
    int mode;
    for (mode = 0; mode < 2; mode++) {
        for (n = 1; n < 100; n++) {
            mskv_arena_desc d = mth_desc(16, 4, 3);
            mskv_arena *a = NULL;
            mskv_result r;
            mth_reset();
            mth.fail_at = n;
            mth.fail_from = mode;
            d.allocator = mth_allocator();
            r = mskv_arena_create(&d, &a);
            EXPECT_EQ(0, mth.bad_frees);
            if (r == MSKV_SUCCESS) {
                ASSERT_TRUE(a != NULL);
                EXPECT_TRUE(mtu_audit(a));
                mskv_arena_destroy(a);
                EXPECT_EQ(0, mth.nlive);
                EXPECT_EQ(0, mth.bad_frees);
                break;
            }
            EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, r);
            EXPECT_TRUE(a == NULL);
            EXPECT_EQ(0, mth.nlive);   /* nothing leaked */
            if (mode == 0) sites++;
        }
        EXPECT_LT(n, 100);
    }
    EXPECT_LE(9, sites);   /* the arena, its tables, the pools: every one was made to fail */
}

/* ---- defect 2 --------------------------------------------------------------------- */

static unsigned char *mth_export(mskv_arena *a, mskv_request r, size_t *size) {
    unsigned char *b;
    if (mskv_request_export(a, r, NULL, 0, size) != MSKV_SUCCESS) return NULL;
    b = (unsigned char *)malloc(*size);
    if (b && mskv_request_export(a, r, b, *size, size) != MSKV_SUCCESS) { free(b); b = NULL; }
    return b;
}

/* A signed blob with the retention flag clear but 2^49 in chunk_size and
   window_chunks: those fields were never validated, and their product
   overflowed a signed multiply. */
TEST(import_refuses_retention_fields_in_a_blob_without_the_retention_flag) {
    mskv_arena_desc d = mth_desc(16, 4, 1);
    mskv_arena *a = NULL;
    mskv_request r, y;
    unsigned char *blob;
    size_t size;
    uint64_t before;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));
    blob = mth_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    mtu_put64(blob + 88, (uint64_t)1 << 49);   /* chunk_size */
    mtu_put64(blob + 104, (uint64_t)1 << 49);  /* window_chunks */
    mtu_blob_sign(blob, size);
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(a, blob, size, &y));
    EXPECT_EQ_U64(before, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    free(blob);
    mskv_arena_destroy(a);
}

/* Every byte of the retention block (88..119) and of the key (120..127)
   must be zero unless the flag that gives it a meaning is set. */
TEST(import_refuses_any_nonzero_byte_of_a_field_its_flags_leave_unused) {
    mskv_arena_desc d = mth_desc(16, 4, 1);
    mskv_arena *a = NULL;
    mskv_request r, y;
    unsigned char *blob;
    size_t size, at;
    uint64_t before;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));
    blob = mth_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    before = mskv_arena_digest(a);
    for (at = 88; at < 128; at++) {
        unsigned char keep = blob[at];
        blob[at] = 1;
        mtu_blob_sign(blob, size);
        if (mskv_request_import(a, blob, size, &y) != MSKV_ERROR_BLOB_CORRUPT) mt_fail(__FILE__, __LINE__, "byte %d set to 1 was accepted", (int)at);
        blob[at] = keep;
    }
    mtu_blob_sign(blob, size);
    EXPECT_EQ_U64(before, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(a, blob, size, &y));  /* the untouched blob still imports */
    EXPECT_TRUE(mtu_audit(a));
    free(blob);
    mskv_arena_destroy(a);
}

/* ---- defect 3 --------------------------------------------------------------------- */

/* A one-segment plan over page 1 whose kv_indptr[1] claims `np` page ids
   while num_page_ids says 3: the table must be refused before any id past
   the third is read. */
typedef struct mth_bad_table {
    mskv_plan p;
    int32_t qo[2], kvp[2], last[1], len[1], split[1], shift[1];
    int64_t tok[2], slots[1];
    int32_t pos[1];
} mth_bad_table;

static void mth_bad_table_init(mth_bad_table *t, int32_t *indices, int32_t np, int32_t page_size) {
    memset(t, 0, sizeof *t);
    t->qo[1] = 1;
    t->kvp[1] = np;
    t->len[0] = np * page_size;
    t->last[0] = page_size;
    t->split[0] = t->len[0];
    t->tok[1] = t->len[0];
    t->slots[0] = -1;
    t->p.batch = 1; t->p.total_q = 1; t->p.num_page_ids = 3; t->p.page_size = page_size;
    t->p.qo_indptr = t->qo; t->p.kv_indptr = t->kvp; t->p.kv_indices = indices; t->p.kv_last_page_len = t->last;
    t->p.kv_len = t->len; t->p.kv_pos_split = t->split; t->p.kv_pos_shift = t->shift; t->p.kv_token_indptr = t->tok;
    t->p.slot_mapping = t->slots; t->p.positions = t->pos;
}

TEST(cpu_attention_refuses_a_kv_indptr_past_the_plans_page_id_count) {
    mskv_arena_desc d = mth_desc(8, 1, 1);
    mskv_arena *a = NULL;
    mskv_attn at;
    mth_bad_table t;
    int32_t *many = (int32_t *)malloc(1000 * sizeof(int32_t)), *three = (int32_t *)malloc(3 * sizeof(int32_t));
    float q[2 * 8], o[2 * 8];
    int i;
    ASSERT_TRUE(many && three);
    for (i = 0; i < 1000; i++) many[i] = 1;  /* valid ids past the end: only the count check can refuse them */
    for (i = 0; i < 3; i++) three[i] = 1 + i;
    memset(&at, 0, sizeof at);
    at.q_heads = 2;
    memset(q, 0, sizeof q);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mth_bad_table_init(&t, many, 1000, 1);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention(NULL, a, 0, &t.p, &at, q, o, NULL));
    mth_bad_table_init(&t, three, 1000, 1);   /* under ASan: no read past the three ids */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention(NULL, a, 0, &t.p, &at, q, o, NULL));
    mth_bad_table_init(&t, three, 3, 1);      /* the consistent table is accepted */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, 0, &t.p, &at, q, o, NULL));
    free(many);
    free(three);
    mskv_arena_destroy(a);
}

TEST(plan_validate_refuses_a_kv_indptr_past_the_page_id_count_before_reading_ids) {
    mth_bad_table t;
    char why[128];
    int32_t *three = (int32_t *)malloc(3 * sizeof(int32_t));
    ASSERT_TRUE(three != NULL);
    three[0] = 1; three[1] = 2; three[2] = 3;
    mth_bad_table_init(&t, three, 1000, 1);
    why[0] = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_validate(&t.p, 8, why, sizeof why));
    EXPECT_TRUE(strstr(why, "num_page_ids") != NULL);
    mth_bad_table_init(&t, three, 3, 1);
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_validate(&t.p, 8, why, sizeof why));
    free(three);
}

/* ---- defect 4 --------------------------------------------------------------------- */

/* 2^28 q heads over one kv head: 8 queries make 2^31 rows of one kv head,
   which overflowed an int32 row count before any check. */
TEST(cpu_attention_with_more_rows_per_kv_head_than_int32_holds_is_OVERFLOW) {
    mskv_arena_desc d = mth_desc(8, 1, 1);
    mskv_arena *a = NULL;
    mskv_attn at;
    mth_bad_table t;
    int32_t ids[3] = {1, 2, 3};
    float q[16], o[16];
    d.kv_heads = 1;
    memset(&at, 0, sizeof at);
    at.q_heads = 1 << 28;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mth_bad_table_init(&t, ids, 3, 1);
    t.qo[1] = 8;
    t.p.total_q = 8;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_cpu_attention(NULL, a, 0, &t.p, &at, q, o, NULL));
    mskv_arena_destroy(a);
}
