/* Issue 20's re-read of the core for the class of the RoPE widths overflow:
   a sum or difference of caller-controlled values computed before its parts
   were bounded. Each test failed before its fix under UBSan (tests-asan:
   signed integer overflow), and passes a call whose parts do fit, so the
   check refuses only what it must. */
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"
#include "mskv_mock_cuda.h"

/* A one-segment plan of a dense sequence (one key, no pages): rows
   kv_token_indptr[0] .. [1] of a dense K/V. */
typedef struct trs_dense {
    mskv_plan p;
    int32_t qo[2], kvp[2], kvl[1], last[1], split[1], shift[1];
    int64_t tok[2], slots[1];
} trs_dense;
static void trs_dense_plan(trs_dense *d, int64_t t0, int64_t t1) {
    memset(d, 0, sizeof *d);
    d->qo[1] = 1; d->kvl[0] = 1; d->split[0] = 1; d->slots[0] = -1;
    d->tok[0] = t0; d->tok[1] = t1;
    d->p.batch = 1; d->p.total_q = 1; d->p.page_size = 4;
    d->p.qo_indptr = d->qo; d->p.kv_indptr = d->kvp; d->p.kv_len = d->kvl; d->p.kv_last_page_len = d->last;
    d->p.kv_pos_split = d->split; d->p.kv_pos_shift = d->shift; d->p.kv_token_indptr = d->tok; d->p.slot_mapping = d->slots;
}

/* mskv_plan_validate and mskv_cpu_attention_dense took kv_token_indptr[b + 1]
   - kv_token_indptr[b] after checking only the first >= 0: an end of -2^63
   overflowed the difference. An end below the start is refused first. */
TEST(dense_row_range_whose_end_is_far_below_its_start_is_refused_without_overflow) {
    trs_dense d;
    mskv_dense_kv kv;
    mskv_attn at;
    char why[160];
    float k[4 * 4], v[4 * 4], q[4], o[4];
    int i;
    for (i = 0; i < 16; i++) { k[i] = 0.25f * (float)i; v[i] = (float)i; }
    for (i = 0; i < 4; i++) { q[i] = 1.0f; o[i] = 7.0f; }
    memset(&kv, 0, sizeof kv);
    kv.k = k; kv.v = v; kv.dtype = MSKV_DTYPE_F32; kv.kv_heads = 1; kv.head_dim = 4; kv.tokens = 4;
    memset(&at, 0, sizeof at);
    at.q_heads = 1;
    trs_dense_plan(&d, 1, INT64_MIN);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_validate(&d.p, 4, why, sizeof why));
    EXPECT_TRUE(strstr(why, "kv_token_indptr") != NULL);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &kv, &d.p, &at, q, o, NULL));
    for (i = 0; i < 4; i++) EXPECT_TRUE(o[i] == 7.0f);   /* nothing written */
    trs_dense_plan(&d, INT64_MAX, INT64_MIN);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_validate(&d.p, 4, why, sizeof why));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &kv, &d.p, &at, q, o, NULL));
    /* the same plan with rows 2 .. 3: valid, and it reads row 2 (V = 8 .. 11) */
    trs_dense_plan(&d, 2, 3);
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_validate(&d.p, 4, why, sizeof why));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(NULL, &kv, &d.p, &at, q, o, NULL));
    for (i = 0; i < 4; i++) EXPECT_TRUE(o[i] == v[8 + i]);
}

/* The GPU layer's plan upload: the dense check took the same difference, and
   the rows a plan reaches were summed (kv_token_indptr[i] + kv_len[i]) before
   the start was bounded, for paged segments too, whose kv_token_indptr the
   kernels never read. */
TEST(cuda_plan_upload_bounds_dense_row_starts_before_adding_to_them) {
    mskv_cuda_functions fn = mmc_table();
    mskv_cuda_desc cd;
    mskv_cuda_store_desc sd;
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_cuda_dplan dp;
    trs_dense d;
    mskv_plan p;
    int32_t qo[2] = { 0, 1 }, kvp[2] = { 0, 1 }, ids[1] = { 1 }, kvl[1] = { 2 }, last[1] = { 2 }, split[1] = { 2 }, shift[1] = { 0 };
    int64_t tok[2] = { INT64_MAX, INT64_MAX }, slots[1] = { -1 };
    mmc_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    memset(&sd, 0, sizeof sd);
    sd.num_pages = 8; sd.page_size = 4; sd.num_layers = 1; sd.kv_heads = 1; sd.head_dim = 64;
    sd.dtype = MSKV_DTYPE_F16; sd.max_batch = 4; sd.max_tokens = 16; sd.max_page_ids = 16; sd.staging_bytes = 1 << 16;
    if (mskv_cuda_store_create(cu, &sd, &st) != MSKV_SUCCESS) {
        mskv_cuda_destroy(cu);
        ASSERT_TRUE(!"mock store");
    }
    trs_dense_plan(&d, 1, INT64_MIN);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(st, &d.p, MSKV_POS_NONE, &dp));
    trs_dense_plan(&d, 2, 3);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &d.p, MSKV_POS_NONE, &dp));
    /* a paged segment (one page, two keys) with a wild kv_token_indptr: uploads, without dense rows */
    memset(&p, 0, sizeof p);
    p.batch = 1; p.total_q = 1; p.num_page_ids = 1; p.page_size = 4;
    p.qo_indptr = qo; p.kv_indptr = kvp; p.kv_indices = ids; p.kv_len = kvl; p.kv_last_page_len = last;
    p.kv_pos_split = split; p.kv_pos_shift = shift; p.kv_token_indptr = tok; p.slot_mapping = slots;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &p, MSKV_POS_NONE, &dp));
    EXPECT_EQ(1, dp.batch);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
    EXPECT_TRUE(mmc_nothing_live());
}

/* mskv_plan_build's derived positions summed pos_shift - pos_offset first,
   then added the absolute position; mskv__plan_sizes had checked (absolute
   + pos_shift) - pos_offset. A negative shift with pos_offset near 2^63 fits
   that way and not the other: 3-D positions of a large grid, where the frame
   of such a position still fits int32. */
TEST(plan_positions_add_the_shift_before_the_offset_as_their_check_does) {
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_segment seg;
    mskv_plan_desc pd;
    mskv_plan_size ps;
    mskv_plan p;
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 8; ad.page_size = 4; ad.num_layers = 0;   /* bookkeeping only */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    seg.request = r;
    seg.n_tokens = 10;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -5));   /* tokens 8, 9 at positions 3, 4 */
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_SELF;
    pd.pos_mode = MSKV_POS_3D;
    pd.grid_h = 65536; pd.grid_w = 65536;   /* 2^32 positions a frame */
    pd.pos_offset = INT64_MAX - 1;          /* 3 - (2^63 - 2) = -2^63 + 5: frame -2^31, row 0, column 5 */
    seg.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_query(a, &seg, 1, &pd, &ps));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, ps.batch, ps.total_q, ps.num_page_ids, &p));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &p));
    EXPECT_EQ(INT32_MIN, p.positions[0]);
    EXPECT_EQ(0, p.positions[1]);
    EXPECT_EQ(5, p.positions[2]);
    EXPECT_EQ(INT32_MIN, p.positions[3]);
    EXPECT_EQ(0, p.positions[4]);
    EXPECT_EQ(6, p.positions[5]);
    /* the largest offset: -5 - (2^63 - 1) alone is past int64, the positions are not */
    pd.pos_offset = INT64_MAX;
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &p));
    EXPECT_EQ(INT32_MIN, p.positions[0]);
    EXPECT_EQ(4, p.positions[2]);
    EXPECT_EQ(5, p.positions[5]);
    /* and one whose sum does pass int64 is refused, as before: 3 - (-2^63 + 2) */
    pd.pos_offset = INT64_MIN + 2;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_plan_build(a, &seg, 1, &pd, &p));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}
