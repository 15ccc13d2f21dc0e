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
    size_t max_bytes;    /* a block larger than this fails (0: no limit) */
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
    if (mth_should_fail() || mth.nlive == MTH_MAX_LIVE || (mth.max_bytes && n > mth.max_bytes)) return NULL;
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
    if (mth_should_fail() || (mth.max_bytes && n > mth.max_bytes)) return NULL;
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
    printf("  mskv_arena_create: %ld allocation sites, each failed in turn (only it, and it on)\n", sites);
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

/* ---- defect 5 --------------------------------------------------------------------- */

/* One request of 10 committed tokens + 6 reserved, page size 4; a plan of
   its 6 new tokens (absolute positions 10..15). */
typedef struct mth_pos_fx {
    mskv_arena *a;
    mskv_request r;
    mskv_segment seg;
    mskv_plan p;
} mth_pos_fx;

static int mth_pos_open(mth_pos_fx *f) {
    mskv_arena_desc d = mth_desc(16, 4, 0);
    memset(f, 0, sizeof *f);
    if (mskv_arena_create(&d, &f->a) || mskv_request_add(f->a, &f->r) || mtu_grow(f->a, f->r, 10)) return 0;
    f->seg.request = f->r;
    f->seg.n_tokens = 6;
    return mskv_admit(f->a, &f->seg, 1) == MSKV_SUCCESS && mskv_plan_alloc(f->a, 1, 6, 8, &f->p) == MSKV_SUCCESS;
}
static void mth_pos_close(mth_pos_fx *f) {
    mskv_plan_free(f->a, &f->p);
    mskv_arena_destroy(f->a);
}

/* Builds with pos_offset and mode; on failure checks that the plan's
   positions and the arena are untouched and that plan_query agrees. */
static mskv_result mth_pos_build(mth_pos_fx *f, mskv_pos_mode mode, int64_t offset, int32_t gh, int32_t gw) {
    mskv_plan_desc pd;
    mskv_plan_size sz;
    mskv_result r, rq;
    uint64_t before = mskv_arena_digest(f->a);
    int i;
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = mode; pd.pos_offset = offset; pd.grid_h = gh; pd.grid_w = gw;
    for (i = 0; i < 18; i++) f->p.positions[i] = -7;
    rq = mskv_plan_query(f->a, &f->seg, 1, &pd, &sz);
    r = mskv_plan_build(f->a, &f->seg, 1, &pd, &f->p);
    EXPECT_EQ(r, rq);
    if (r != MSKV_SUCCESS) {
        for (i = 0; i < 18; i++)
            if (f->p.positions[i] != -7) { mt_fail(__FILE__, __LINE__, "a failed build wrote positions[%d]", i); break; }
        EXPECT_EQ_U64(before, mskv_arena_digest(f->a));
    }
    return r;
}

TEST(plan_positions_whose_offset_overflows_int64_are_OVERFLOW) {
    mth_pos_fx f;
    ASSERT_TRUE(mth_pos_open(&f));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mth_pos_build(&f, MSKV_POS_1D, INT64_MIN, 0, 0));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mth_pos_build(&f, MSKV_POS_3D, INT64_MIN, 3, 5));
    /* the last position, 15, minus (INT64_MIN + 16) is INT64_MAX: no overflow, but no int32 either */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_1D, INT64_MIN + 16, 0, 0));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mth_pos_build(&f, MSKV_POS_1D, INT64_MIN + 15, 0, 0));
    mth_pos_close(&f);
}

TEST(plan_positions_outside_int32_are_OUT_OF_RANGE_not_truncated) {
    mth_pos_fx f;
    int i;
    ASSERT_TRUE(mth_pos_open(&f));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_1D, INT64_MAX, 0, 0));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_3D, INT64_MAX, 3, 5));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_3D, INT64_MIN + 16, 1, 1));
    /* frame 2^40 (grid 3 x 5): it used to become frame 0 */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_3D, -(((int64_t)1 << 40) * 15), 3, 5));
    /* the int32 edges themselves are exact */
    ASSERT_EQ(MSKV_SUCCESS, mth_pos_build(&f, MSKV_POS_1D, 15 - (int64_t)INT32_MAX, 0, 0));
    for (i = 0; i < 6; i++) EXPECT_EQ((int64_t)INT32_MAX - 5 + i, f.p.positions[i]);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_1D, 15 - (int64_t)INT32_MAX - 1, 0, 0));
    ASSERT_EQ(MSKV_SUCCESS, mth_pos_build(&f, MSKV_POS_1D, 10 - (int64_t)INT32_MIN, 0, 0));
    for (i = 0; i < 6; i++) EXPECT_EQ((int64_t)INT32_MIN + i, f.p.positions[i]);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_1D, 10 - (int64_t)INT32_MIN + 1, 0, 0));
    /* 3-D: frame INT32_MIN of a 1 x 1 grid is the lowest, one below it is refused */
    ASSERT_EQ(MSKV_SUCCESS, mth_pos_build(&f, MSKV_POS_3D, 10 - (int64_t)INT32_MIN, 1, 1));
    EXPECT_EQ(INT32_MIN, f.p.positions[0]);
    EXPECT_EQ(0, f.p.positions[1]);
    EXPECT_EQ(0, f.p.positions[2]);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mth_pos_build(&f, MSKV_POS_3D, 10 - (int64_t)INT32_MIN + 1, 1, 1));
    /* a negative frame is a floor division: position -1 of a 3 x 5 grid is frame -1, row 2, column 4 */
    ASSERT_EQ(MSKV_SUCCESS, mth_pos_build(&f, MSKV_POS_3D, 11, 3, 5));
    EXPECT_EQ(-1, f.p.positions[0]);
    EXPECT_EQ(2, f.p.positions[1]);
    EXPECT_EQ(4, f.p.positions[2]);
    mth_pos_close(&f);
}

TEST(schedule_whose_last_window_would_end_past_int64_is_OVERFLOW) {
    mskv_schedule s;
    mskv_window w;
    int64_t big = (int64_t)1 << 62;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_schedule_init(&s, INT64_MAX, big, 0));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_schedule_init(&s, big + 1, big, 0));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_schedule_init(&s, INT64_MAX, INT64_MAX - 1, 3));
    /* the largest that fits: 2^63 - 1 = 7 x 1317624576693539401, so the
       seventh window ends exactly at INT64_MAX (padded by 5 past total) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_schedule_init(&s, INT64_MAX - 5, INT64_MAX / 7, 0));
    ASSERT_EQ(7, s.count);
    ASSERT_EQ(MSKV_SUCCESS, mskv_schedule_window(&s, 6, &w));
    EXPECT_EQ(INT64_MAX, w.end);
    EXPECT_EQ(INT64_MAX - 5, w.commit_end);
    EXPECT_EQ(5, w.pad);
}

TEST(schedule_window_of_a_hand_made_schedule_recomputes_it_instead_of_overflowing) {
    mskv_schedule s;
    mskv_window w;
    mskv_decode_span ds;
    int64_t big = (int64_t)1 << 62;
    s.total = INT64_MAX; s.window = big; s.overlap = 0; s.stride = big; s.count = 2;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_schedule_window(&s, 1, &w));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_schedule_decode_span(&s, 1, 4, &ds));
    ASSERT_EQ(MSKV_SUCCESS, mskv_schedule_init(&s, 100, 10, 2));
    s.count++;   /* a window past the schedule's end */
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_schedule_window(&s, s.count - 1, &w));
    s.count--;
    s.total = -1;
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_schedule_window(&s, 0, &w));
}

/* ---- defect 6 --------------------------------------------------------------------- */

static mskv_result mth_nop_read(void *u, const int32_t *p, int32_t n, void *d) { (void)u; (void)p; (void)n; (void)d; return MSKV_SUCCESS; }
static mskv_result mth_nop_write(void *u, const int32_t *p, int32_t n, const void *s) { (void)u; (void)p; (void)n; (void)s; return MSKV_SUCCESS; }
static mskv_result mth_nop_copy(void *u, int32_t s, int32_t d) { (void)u; (void)s; (void)d; return MSKV_SUCCESS; }

TEST(arena_create_validates_every_descriptor_field_whatever_num_layers_says) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_store_ops ops;
    d = mth_desc(8, 4, 0);
    d.dtype = (mskv_dtype)9;          /* no host store, but still not a dtype */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d.dtype = (mskv_dtype)-1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d = mth_desc(8, 4, 0);
    d.kv_heads = -1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d = mth_desc(8, 4, 0);
    d.head_dim = -5;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    /* store ops are called by offload, reload and fork: all three or the descriptor is wrong */
    memset(&ops, 0, sizeof ops);
    ops.read_pages = mth_nop_read; ops.write_pages = mth_nop_write;
    d = mth_desc(8, 4, 1);
    d.store_ops = &ops;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    EXPECT_TRUE(a == NULL);
    ops.copy_page = mth_nop_copy;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mskv_arena_destroy(a);
    a = NULL;
    /* geometry given without layers is unused, and allowed */
    d = mth_desc(8, 4, 0);
    d.kv_heads = 8; d.head_dim = 64; d.dtype = MSKV_DTYPE_BF16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mskv_arena_destroy(a);
}

/* ---- defect 7 --------------------------------------------------------------------- */

/* A brute-force causal video decoder with temporal ratio r and a left
   receptive field of c latent frames. Decoding latents [a, b) as one
   stream: the first gives one "start" frame; latent a + i (i >= 1) gives r
   frames, each a function of the latents it sees, a + i - c .. a + i, where
   those before a are padding. A frame is identified by a hash of exactly
   what it depends on. */
#define MTH_MAX_FRAMES 256
static int mth_decode(int64_t a, int64_t b, int r, int c, uint64_t *out) {
    int n = 0, j, d;
    int64_t i;
    out[n++] = 0x5151u + (uint64_t)a * 7919u;   /* a stream start, seeing latent a alone */
    for (i = 1; i < b - a; i++)
        for (j = 1; j <= r; j++) {
            uint64_t h = (uint64_t)j * 1000003u;
            for (d = 0; d <= c; d++) {
                int64_t idx = a + i - d;
                h = h * 31u + (idx < a ? 1u : (uint64_t)idx + 7u);
            }
            out[n++] = h;
        }
    return n;
}

/* Streams the schedule window by window, dropping 1 + r(trim - 1) frames
   when trim > 0 as the header says; 1 when the concatenation equals one
   whole-stream decode of 1 + r(total - 1) frames. */
static int mth_stream_matches(int64_t total, int64_t window, int64_t overlap, int64_t ctx, int r, int c) {
    uint64_t whole[MTH_MAX_FRAMES], part[MTH_MAX_FRAMES], got[MTH_MAX_FRAMES];
    mskv_schedule s;
    int64_t k;
    int nwhole, ngot = 0, i;
    if (mskv_schedule_init(&s, total, window, overlap) != MSKV_SUCCESS) return -1;
    nwhole = mth_decode(0, total, r, c, whole);
    if (nwhole != 1 + r * (total - 1)) return -1;
    for (k = 0; k < s.count; k++) {
        mskv_decode_span ds;
        int npart, drop;
        if (mskv_schedule_decode_span(&s, k, ctx, &ds) != MSKV_SUCCESS) return -1;
        npart = mth_decode(ds.in_start, ds.in_end, r, c, part);
        drop = ds.trim > 0 ? 1 + r * (int)(ds.trim - 1) : 0;
        for (i = drop; i < npart && ngot < MTH_MAX_FRAMES; i++) got[ngot++] = part[i];
    }
    return ngot == nwhole && memcmp(got, whole, (size_t)nwhole * sizeof(uint64_t)) == 0;
}

TEST(decode_span_trim_drops_one_plus_r_times_trim_minus_one_frames_of_a_causal_decoder) {
    static const int ratios[3] = {1, 2, 4};
    int ri, c, mismatches_short_ctx = 0;
    int64_t total, window, overlap, ctx;
    for (ri = 0; ri < 3; ri++)
        for (c = 1; c <= 3; c++)
            for (total = 1; total <= 20; total++)
                for (window = 1; window <= 8; window++)
                    for (overlap = 0; overlap < window; overlap++) {
                        for (ctx = c; ctx <= c + 2; ctx += 2)
                            if (mth_stream_matches(total, window, overlap, ctx, ratios[ri], c) != 1) {
                                mt_fail(__FILE__, __LINE__, "r %d, field %d: total %lld window %lld overlap %lld ctx %lld: "
                                        "the trimmed windows are not the whole stream", ratios[ri], c, (long long)total,
                                        (long long)window, (long long)overlap, (long long)ctx);
                                return;
                            }
                        /* the model can tell: context short of the receptive field breaks the stream */
                        mismatches_short_ctx += mth_stream_matches(total, window, overlap, c - 1, ratios[ri], c) == 0;
                    }
    EXPECT_LT(0, mismatches_short_ctx);
}

/* ---- found by re-reading the core: page tables ------------------------------------ */

/* A table whose live pages start past its memory's front (after a release)
   asked to hold INT32_MAX entries: head + need overflowed an int32. */
TEST(request_reserve_of_the_largest_table_after_a_release_fails_cleanly) {
    mskv_arena_desc d = mth_desc(16, 1, 0);
    mskv_arena *a = NULL;
    mskv_request r;
    uint64_t before;
    mth_reset();
    mth.max_bytes = (size_t)1 << 30;   /* an 8 GiB table is refused */
    d.allocator = mth_allocator();
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 2, NULL));  /* the table's head moves */
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, mskv_request_reserve(a, r, (int64_t)INT32_MAX - 1));
    EXPECT_EQ_U64(before, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    EXPECT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 3));  /* still usable */
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
    EXPECT_EQ(0, mth.nlive);
}

/* ---- found by re-reading the core: plans, descriptors, the LSE merge --------------- */

/* The host store's pools are counted in int32 (layer * 2 + kind): a
   descriptor whose pool count does not fit is refused, pools or not. */
TEST(arena_create_refuses_more_layers_than_int32_pool_indices_hold) {
    mskv_arena_desc d = mth_desc(2, 1, 1);
    mskv_arena *a = NULL;
    mskv_store_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.read_pages = mth_nop_read; ops.write_pages = mth_nop_write; ops.copy_page = mth_nop_copy;
    d.kv_heads = 1; d.head_dim = 1;
    d.store_ops = &ops;
    d.num_layers = (int32_t)(INT32_MAX / 2) + 1;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_arena_create(&d, &a));
    EXPECT_TRUE(a == NULL);
    d.num_layers = INT32_MAX;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_arena_create(&d, &a));
    d.num_layers = INT32_MAX / 2;   /* the largest count: bytes live elsewhere, so nothing is allocated for them */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mskv_arena_destroy(a);
}

/* n x heads rows counted in int64 wrapped to 0 and the merge "succeeded". */
TEST(cpu_merge_of_more_elements_than_int64_counts_is_OVERFLOW) {
    float o[8] = {0}, l[1] = {0};
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_cpu_merge((int64_t)1 << 62, 4, 8, o, l, o, l, o, l));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_cpu_merge(INT64_MAX / 8 + 1, 1, 8, o, l, o, l, o, l));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_merge(1, 1, 8, o, l, o, l, o, l));
}

/* ---- stale plans ------------------------------------------------------------------- */

/* An arena with a host store (page size 4, one layer, 2 kv heads x 8 dims,
   f32), two requests a and b of 10 committed tokens each and 3 reserved (a
   fourth page each), and a plan of a's 3 new tokens from mskv_plan_alloc. */
typedef struct mth_sp {
    mskv_arena *a;
    mskv_request ra, rb;
    mskv_segment seg;
    mskv_plan p;
    float k[3 * 16], v[3 * 16], q[3 * 2 * 8], o[3 * 2 * 8];
    mskv_attn at;
} mth_sp;

static int mth_sp_open(mth_sp *f, mskv_retire_mode mode) {
    mskv_arena_desc d = mth_desc(16, 4, 1);
    mskv_segment sb;
    int i;
    memset(f, 0, sizeof *f);
    d.retire_mode = mode;
    for (i = 0; i < 48; i++) { f->k[i] = (float)i; f->v[i] = (float)-i; }
    for (i = 0; i < 48; i++) f->q[i] = 0.1f * (float)i;
    f->at.q_heads = 2;
    if (mskv_arena_create(&d, &f->a) || mskv_request_add(f->a, &f->ra) || mskv_request_add(f->a, &f->rb) ||
        mtu_grow(f->a, f->ra, 10) || mtu_grow(f->a, f->rb, 10))
        return 0;
    f->seg.request = f->ra; f->seg.n_tokens = 3;
    sb.request = f->rb; sb.n_tokens = 3;
    return mskv_admit(f->a, &f->seg, 1) == MSKV_SUCCESS && mskv_admit(f->a, &sb, 1) == MSKV_SUCCESS &&
           mskv_plan_alloc(f->a, 2, 8, 8, &f->p) == MSKV_SUCCESS &&
           mskv_plan_build(f->a, &f->seg, 1, NULL, &f->p) == MSKV_SUCCESS;
}
static void mth_sp_close(mth_sp *f) {
    mskv_plan_free(f->a, &f->p);
    mskv_arena_destroy(f->a);
}
/* the plan's three uses agree: 1 when all succeed, 0 when all are STALE_PLAN, -1 otherwise */
static int mth_sp_uses(mth_sp *f, const mskv_plan *p) {
    mskv_result c = mskv_plan_check(f->a, p);
    mskv_result w = mskv_cpu_write_kv(f->a, 0, p, f->k, f->v, MSKV_DTYPE_F32, NULL);
    mskv_result t = mskv_cpu_attention(NULL, f->a, 0, p, &f->at, f->q, f->o, NULL);
    if (c == MSKV_SUCCESS && w == MSKV_SUCCESS && t == MSKV_SUCCESS) return 1;
    if (c == MSKV_ERROR_STALE_PLAN && w == MSKV_ERROR_STALE_PLAN && t == MSKV_ERROR_STALE_PLAN) return 0;
    mt_fail(__FILE__, __LINE__, "check %d, write_kv %d, attention %d", (int)c, (int)w, (int)t);
    return -1;
}

TEST(plan_is_stale_once_its_request_releases_pages) {
    mth_sp f;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    EXPECT_EQ(1, mth_sp_uses(&f, &f.p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(f.a, f.ra, 4, NULL));
    EXPECT_EQ(0, mth_sp_uses(&f, &f.p));
    mth_sp_close(&f);
}

TEST(plan_is_stale_once_its_request_is_offloaded) {
    mth_sp f;
    mskv_segment s;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_FENCED));
    s.request = f.ra; s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(f.a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(f.a, f.ra));
    EXPECT_EQ(0, mth_sp_uses(&f, &f.p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(f.a, f.ra));   /* other pages now: still stale */
    EXPECT_EQ(0, mth_sp_uses(&f, &f.p));
    mth_sp_close(&f);
}

TEST(plan_is_stale_once_its_request_is_removed) {
    mth_sp f;
    mskv_request again;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, f.ra));
    EXPECT_EQ(0, mth_sp_uses(&f, &f.p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &again));    /* the slot, reused, is another request */
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, again, 12));
    EXPECT_EQ(0, mth_sp_uses(&f, &f.p));
    mth_sp_close(&f);
}

TEST(plan_is_stale_once_its_reservation_is_aborted) {
    mth_sp f;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_FENCED));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(f.a, &f.seg, 1));   /* the reserved tokens' page goes */
    EXPECT_EQ(0, mth_sp_uses(&f, &f.p));
    mth_sp_close(&f);
}

/* The case: immediate retirement hands a released page to the next
   admit, so the old plan would read (and write) another request's tokens. */
TEST(plan_of_released_pages_is_refused_before_it_reads_another_requests_tokens) {
    mth_sp f;
    mskv_request c;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(f.a, &f.seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &c));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, c, 4));   /* takes the freed page */
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cpu_write_kv(f.a, 0, &f.p, f.k, f.v, MSKV_DTYPE_F32, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cpu_attention(NULL, f.a, 0, &f.p, &f.at, f.q, f.o, NULL));
    mth_sp_close(&f);
}

TEST(plan_stays_valid_while_its_requests_only_grow) {
    mth_sp f;
    mskv_segment s;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    s.request = f.ra; s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(f.a, &s, 1));
    s.n_tokens = 9;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(f.a, &s, 1));     /* new pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(f.a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(f.a, f.ra, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(f.a, &s, 1, NULL));
    EXPECT_EQ(1, mth_sp_uses(&f, &f.p));
    mth_sp_close(&f);
}

/* With the plan's requests known (mskv_plan_alloc gives the array), pages
   leaving another request do not touch it: the check looks at its own. */
TEST(plan_stays_valid_when_another_request_loses_pages) {
    mth_sp f;
    mskv_segment sb;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    sb.request = f.rb; sb.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(f.a, &sb, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(f.a, f.rb, 8, NULL));
    EXPECT_EQ(1, mth_sp_uses(&f, &f.p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, f.rb));
    EXPECT_EQ(1, mth_sp_uses(&f, &f.p));
    mth_sp_close(&f);
}

/* A caller-owned plan without the requests array cannot tell whose pages
   left, so it takes any loss as its own: never a stale plan let through. */
TEST(plan_without_its_requests_array_is_stale_once_any_request_loses_pages) {
    mth_sp f;
    mskv_plan p;
    mskv_segment sb;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    p = f.p;
    p.requests = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, &f.seg, 1, NULL, &p));
    EXPECT_EQ(1, mth_sp_uses(&f, &p));
    sb.request = f.rb; sb.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(f.a, &sb, 1));
    EXPECT_EQ(0, mth_sp_uses(&f, &p));
    EXPECT_EQ(1, mth_sp_uses(&f, &f.p));   /* the same plan with the array is still valid */
    mth_sp_close(&f);
}

/* While no table lost pages the check is one compare: it reads no segment
   (here the segments' handles are garbage and are never looked at). */
TEST(plan_check_reads_no_segment_while_no_table_lost_pages) {
    mth_sp f;
    mskv_request garbage[2];
    mskv_plan p;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    p = f.p;
    garbage[0].id = 0xDEADBEEFu; garbage[1].id = 0;
    p.requests = garbage;
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_check(f.a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(f.a, f.rb, 4, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_plan_check(f.a, &p));   /* now it looks, and finds no such request */
    mth_sp_close(&f);
}

TEST(plan_with_a_generation_this_arena_never_had_is_stale) {
    mth_sp f;
    mskv_plan p;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    p = f.p;
    p.generation += 1000;
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_plan_check(f.a, &p));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_plan_check(NULL, &p));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_plan_check(f.a, NULL));
    mth_sp_close(&f);
}

/* Plans the arena did not build carry generation 0 and are never checked;
   the raw-pool functions take no arena and check nothing. */
TEST(caller_made_plans_and_raw_pool_calls_are_not_checked) {
    mth_sp f;
    mskv_plan p;
    mskv_pools pools;
    mskv_store_info si;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    p = f.p;
    p.generation = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(f.a, f.ra, 4, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_plan_check(f.a, &f.p));
    EXPECT_EQ(1, mth_sp_uses(&f, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_store_info_get(f.a, &si));
    memset(&pools, 0, sizeof pools);
    pools.k = mskv_store_pool(f.a, 0, 0); pools.v = mskv_store_pool(f.a, 0, 1);
    pools.dtype = si.dtype; pools.num_pages = si.num_pages; pools.page_size = si.page_size;
    pools.kv_heads = si.kv_heads; pools.head_dim = si.head_dim;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(NULL, &pools, &f.p, &f.at, f.q, f.o, NULL));
    mth_sp_close(&f);
}

/* A CROSS plan reads the keyed entry's pages: only their loss makes it stale. */
TEST(cross_plan_is_stale_once_its_keyed_entry_is_removed_not_when_the_querying_request_shrinks) {
    mth_sp f;
    mskv_request e;
    mskv_plan_desc pd;
    mskv_segment s;
    ASSERT_TRUE(mth_sp_open(&f, MSKV_RETIRE_IMMEDIATE));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(f.a, 42, 6, &e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(f.a, e));
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_CROSS; pd.cross = e;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, &f.seg, 1, &pd, &f.p));
    EXPECT_EQ(1, mth_sp_uses(&f, &f.p));
    s.request = f.ra; s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(f.a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(f.a, f.ra, 8, NULL));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_check(f.a, &f.p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(f.a, 42));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_plan_check(f.a, &f.p));
    mth_sp_close(&f);
}

/* ---- debug mode: poisoned free pages, the byte audit, checksummed host copies ------ */

/* page_size 4, one layer, 2 kv heads x 8 dims: a page of one pool is 4 x 16 elements */
static mskv_arena *mth_debug_arena(uint32_t debug, mskv_dtype dt, mskv_retire_mode mode) {
    mskv_arena_desc d = mth_desc(16, 4, 1);
    mskv_arena *a = NULL;
    d.debug = debug;
    d.dtype = dt;
    d.retire_mode = mode;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

/* every byte of page p of both pools equals v (-1: none does) */
static int mth_page_is(mskv_arena *a, int32_t p, int v) {
    mskv_store_info si;
    int kind, all = 1, none = 1;
    size_t k;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0;
    for (kind = 0; kind < 2; kind++) {
        const unsigned char *b = (const unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)p * si.page_bytes;
        for (k = 0; k < si.page_bytes; k++) {
            if (b[k] != (unsigned char)(v < 0 ? MSKV_POISON_BYTE : (unsigned)v)) all = 0;
            else none = 0;
        }
    }
    return v < 0 ? none : all;
}

/* the first page of r's table */
static int32_t mth_first_page(mskv_arena *a, mskv_request r) {
    int32_t pages[16], n = 0;
    return mskv_request_pages(a, r, pages, 16, &n) == MSKV_SUCCESS && n > 0 ? pages[0] : -1;
}

/* writes K = V = 1.0 into every committed token of r (slots from the arena) */
static int mth_write_ones(mskv_arena *a, mskv_request r, int64_t n) {
    mskv_store_info si;
    int64_t t, slot;
    int kind;
    size_t e;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0;
    for (t = 0; t < n; t++) {
        if (mskv_request_slot(a, r, t, &slot) != MSKV_SUCCESS) return 0;
        for (kind = 0; kind < 2; kind++)
            for (e = 0; e < 16; e++) {
                unsigned char *at = (unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)slot * si.slot_bytes + e * si.elem_size;
                if (si.dtype == MSKV_DTYPE_F32) { float one = 1.0f; memcpy(at, &one, 4); }
                else { uint16_t h = si.dtype == MSKV_DTYPE_F16 ? mskv_f32_to_f16(1.0f) : mskv_f32_to_bf16(1.0f); memcpy(at, &h, 2); }
            }
    }
    return 1;
}

/* element e of page p of pool kind, as a float whatever the dtype */
static float mth_elem(mskv_arena *a, int kind, int32_t p, size_t e) {
    mskv_store_info si;
    const unsigned char *b;
    float f;
    uint16_t h;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0.0f;
    b = (const unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)p * si.page_bytes + e * si.elem_size;
    if (si.dtype == MSKV_DTYPE_F32) { memcpy(&f, b, 4); return f; }
    memcpy(&h, b, 2);
    return si.dtype == MSKV_DTYPE_F16 ? mskv_f16_to_f32(h) : mskv_bf16_to_f32(h);
}

TEST(poisoned_pages_read_nan_in_every_float_dtype) {
    static const mskv_dtype dts[3] = {MSKV_DTYPE_F32, MSKV_DTYPE_F16, MSKV_DTYPE_BF16};
    int i, kind;
    size_t e;
    for (i = 0; i < 3; i++) {
        mskv_arena *a = mth_debug_arena(MSKV_DEBUG_POISON, dts[i], MSKV_RETIRE_IMMEDIATE);
        mskv_request r;
        int32_t page;
        ASSERT_TRUE(a != NULL);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
        ASSERT_TRUE(mth_write_ones(a, r, 8));
        page = mth_first_page(a, r);
        EXPECT_NEAR(1.0, mth_elem(a, 0, page, 0), 0);   /* live: the written ones */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
        for (kind = 0; kind < 2; kind++)
            for (e = 0; e < 4 * 16; e++)
                if (!(mth_elem(a, kind, page, e) != mth_elem(a, kind, page, e))) {
                    mt_fail(__FILE__, __LINE__, "dtype %d: element %zu of the freed page reads %g, not NaN", (int)dts[i], e,
                            (double)mth_elem(a, kind, page, e));
                    break;
                }
        mskv_arena_destroy(a);
    }
}

TEST(pages_free_at_creation_are_poisoned_and_the_null_page_stays_zero) {
    mskv_arena *a = mth_debug_arena(MSKV_DEBUG_POISON, MSKV_DTYPE_F32, MSKV_RETIRE_IMMEDIATE);
    int32_t p;
    char why[256];
    ASSERT_TRUE(a != NULL);
    EXPECT_TRUE(mth_page_is(a, 0, 0));
    for (p = 1; p < 16; p++) EXPECT_TRUE(mth_page_is(a, p, (int)MSKV_POISON_BYTE));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    mskv_arena_destroy(a);
}

/* In FENCED mode a freed page may still be read by a kernel until its
   fence: it keeps its bytes while pending, and is poisoned at retirement. */
TEST(fenced_pages_are_poisoned_when_their_fence_retires_not_before) {
    mskv_arena *a = mth_debug_arena(MSKV_DEBUG_POISON, MSKV_DTYPE_F32, MSKV_RETIRE_FENCED);
    mskv_request r;
    int32_t page;
    uint64_t step = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_TRUE(mth_write_ones(a, r, 8));
    page = mth_first_page(a, r);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    EXPECT_TRUE(mth_page_is(a, page, -1));                 /* pending: the data is still there */
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, &step));
    EXPECT_TRUE(mth_page_is(a, page, -1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, step));
    EXPECT_TRUE(mth_page_is(a, page, (int)MSKV_POISON_BYTE));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, NULL, 0));
    mskv_arena_destroy(a);
}

/* What the bookkeeping audit cannot see: a stale table writing into a page
   after it was freed (here through the raw-pool writer, which checks no plan). */
TEST(a_write_into_a_freed_page_is_caught_by_the_byte_audit) {
    mskv_arena *a = mth_debug_arena(MSKV_DEBUG_POISON, MSKV_DTYPE_F32, MSKV_RETIRE_IMMEDIATE);
    mskv_request r;
    mskv_store_info si;
    mskv_pools pools;
    mskv_plan p;
    int64_t slot;
    float k[16], v[16];
    char why[256];
    int i;
    ASSERT_TRUE(a != NULL);
    for (i = 0; i < 16; i++) k[i] = v[i] = 2.0f;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, 1, &slot));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    ASSERT_EQ(MSKV_SUCCESS, mskv_store_info_get(a, &si));
    memset(&pools, 0, sizeof pools);
    pools.k = mskv_store_pool(a, 0, 0); pools.v = mskv_store_pool(a, 0, 1);
    pools.dtype = si.dtype; pools.num_pages = si.num_pages; pools.page_size = si.page_size;
    pools.kv_heads = si.kv_heads; pools.head_dim = si.head_dim;
    memset(&p, 0, sizeof p);
    p.total_q = 1; p.page_size = 4; p.slot_mapping = &slot;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&pools, &p, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(a, NULL, 0));   /* the bookkeeping is fine */
    why[0] = 0;
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(a, why, sizeof why));
    EXPECT_TRUE(strstr(why, "free page") != NULL && strstr(why, "written after it was freed") != NULL);
    mskv_arena_destroy(a);
}

/* ---- host copies with checksums ---- */

/* host allocator that remembers the last block, so a test can reach a host copy */
static unsigned char *mth_last_host;
static size_t mth_last_host_size;
static void *mth_host_alloc(void *u, size_t n) { (void)u; mth_last_host = (unsigned char *)malloc(n); mth_last_host_size = n; return mth_last_host; }
static void *mth_host_realloc(void *u, void *p, size_t n) { (void)u; return realloc(p, n); }
static void mth_host_free(void *u, void *p) { (void)u; free(p); }

static mskv_arena *mth_sum_arena(uint32_t debug) {
    mskv_arena_desc d = mth_desc(16, 4, 1);
    mskv_arena *a = NULL;
    d.debug = debug;
    d.host_allocator.alloc = mth_host_alloc; d.host_allocator.realloc = mth_host_realloc; d.host_allocator.free = mth_host_free;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

TEST(a_corrupted_host_copy_is_refused_at_reload_and_nothing_changes) {
    mskv_arena *a = mth_sum_arena(MSKV_DEBUG_CHECKSUMS);
    mskv_request r;
    unsigned char *copy, keep, blob[4096];
    size_t size = 0;
    uint64_t before;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_TRUE(mth_write_ones(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    copy = mth_last_host;
    ASSERT_TRUE(copy != NULL && mth_last_host_size >= 3 * 2 * 4 * 64);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    keep = copy[2 * 512 + 77];         /* the third page's record */
    copy[2 * 512 + 77] ^= 0x10;
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(a, r));
    EXPECT_EQ_U64(before, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_export(a, r, blob, sizeof blob, &size));
    why[0] = 0;
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(a, why, sizeof why));
    EXPECT_TRUE(strstr(why, "page 2 of its host copy") != NULL);
    EXPECT_TRUE(mtu_audit(a));
    copy[2 * 512 + 77] = keep;          /* the copy as it was: it reloads */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(an_imported_host_copy_is_checksummed_like_an_offloaded_one) {
    mskv_arena *src = mth_sum_arena(0), *a = mth_sum_arena(MSKV_DEBUG_CHECKSUMS);
    mskv_request r, y;
    unsigned char *blob;
    size_t size;
    ASSERT_TRUE(src && a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(src, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(src, r, 6));
    ASSERT_TRUE(mth_write_ones(src, r, 6));
    blob = mth_export(src, r, &size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(a, blob, size, &y));
    mth_last_host[5] ^= 1;
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(a, y));
    mth_last_host[5] ^= 1;
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(a, y));
    free(blob);
    mskv_arena_destroy(src);
    mskv_arena_destroy(a);
}

/* ---- with the debug checks off, none of them runs ---- */

typedef struct mth_ops_count { long reads, writes, copies, fills; } mth_ops_count;
static mskv_result mth_cnt_read(void *u, const int32_t *p, int32_t n, void *d) {
    (void)p; ((mth_ops_count *)u)->reads++; memset(d, 0x11, (size_t)n * 2 * 4 * 64); return MSKV_SUCCESS;
}
static mskv_result mth_cnt_write(void *u, const int32_t *p, int32_t n, const void *s) { (void)p; (void)n; (void)s; ((mth_ops_count *)u)->writes++; return MSKV_SUCCESS; }
static mskv_result mth_cnt_copy(void *u, int32_t s, int32_t d) { (void)s; (void)d; ((mth_ops_count *)u)->copies++; return MSKV_SUCCESS; }
static mskv_result mth_cnt_fill(void *u, const int32_t *p, int32_t n, unsigned char b) { (void)p; (void)n; (void)b; ((mth_ops_count *)u)->fills++; return MSKV_SUCCESS; }

TEST(with_the_debug_checks_off_nothing_is_poisoned_checksummed_or_copied) {
    mskv_arena *a;
    mskv_arena_desc d = mth_desc(16, 4, 1);
    mskv_store_ops ops;
    mth_ops_count cnt;
    mskv_request r;
    int32_t page;
    uint64_t step = 0;
    /* host store: a freed page keeps its bytes; the byte audit has nothing to compare */
    a = mth_debug_arena(0, MSKV_DTYPE_F32, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_TRUE(mth_write_ones(a, r, 8));
    page = mth_first_page(a, r);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    EXPECT_TRUE(mth_page_is(a, page, -1));
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_arena_audit_bytes(a, NULL, 0));
    mskv_arena_destroy(a);
    /* a device store: no fill and no extra write at creation or at retirement; offload allocates the copy only */
    memset(&cnt, 0, sizeof cnt);
    memset(&ops, 0, sizeof ops);
    ops.user = &cnt; ops.read_pages = mth_cnt_read; ops.write_pages = mth_cnt_write; ops.copy_page = mth_cnt_copy;
    ops.fill_pages = mth_cnt_fill;
    d.store_ops = &ops;
    d.retire_mode = MSKV_RETIRE_FENCED;
    mth_reset();
    d.allocator = mth_allocator();
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, &step));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, step));
    mth.calls = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    EXPECT_EQ(1, mth.calls);   /* the host copy, nothing beside it */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_EQ(0, cnt.fills);
    EXPECT_EQ(1, cnt.writes);  /* the reload's own */
    EXPECT_EQ(1, cnt.reads);   /* the offload's own */
    mskv_arena_destroy(a);
    /* the same with the checks on: fills at creation and retirement, a checksum array per copy */
    memset(&cnt, 0, sizeof cnt);
    d.debug = MSKV_DEBUG_ALL;
    mth_reset();
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    EXPECT_EQ(1, cnt.fills);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, &step));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, step));
    EXPECT_EQ(2, cnt.fills);
    mth.calls = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    EXPECT_EQ(2, mth.calls);
    mskv_arena_destroy(a);
}

/* A store without fill_pages is poisoned through write_pages, page by page. */
TEST(a_store_without_fill_pages_is_poisoned_through_write_pages) {
    mskv_arena *a;
    mskv_arena_desc d = mth_desc(6, 4, 1);
    mskv_store_ops ops;
    mth_ops_count cnt;
    memset(&cnt, 0, sizeof cnt);
    memset(&ops, 0, sizeof ops);
    ops.user = &cnt; ops.read_pages = mth_cnt_read; ops.write_pages = mth_cnt_write; ops.copy_page = mth_cnt_copy;
    d.store_ops = &ops;
    d.debug = MSKV_DEBUG_POISON;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    EXPECT_EQ(5, cnt.writes);   /* pages 1..5 */
    mskv_arena_destroy(a);
}

TEST(debug_flags_outside_MSKV_DEBUG_ALL_are_refused) {
    mskv_arena_desc d = mth_desc(6, 4, 1);
    mskv_arena *a = NULL;
    d.debug = MSKV_DEBUG_ALL + 1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d.debug = 0x80000000u;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    EXPECT_TRUE(a == NULL);
}
