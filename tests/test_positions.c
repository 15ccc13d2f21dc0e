/* Explicit positions (issue 12, item 5): RoPE positions a caller gives per
   segment, the per-request position shift applied at commit (RoPE
   re-indexing that keeps positions bounded), and the plan's explicit query
   positions (q_pos) that let any part of a split-KV computation carry a
   causal mask. The attention side of q_pos is tested against the double
   reference in test_cpu.c; here the plans and the request state. */
#include <math.h>
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

static mskv_arena *mtp_arena(int32_t num_pages, int32_t page_size, int32_t layers, int32_t kvh, int32_t dim) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size;
    d.num_layers = layers; d.kv_heads = kvh; d.head_dim = dim; d.dtype = MSKV_DTYPE_F32;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

static mskv_request_info mtp_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.committed = -1;
    return i;
}

static mskv_plan_desc mtp_desc(mskv_pos_mode mode) {
    mskv_plan_desc d;
    memset(&d, 0, sizeof d);
    d.pos_mode = mode;
    return d;
}

TEST(explicit_positions_are_copied_per_segment_and_a_null_entry_is_derived) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r[3];
    mskv_segment s[3];
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_1D);
    static const int32_t e0[5] = {7, 7, 7, 100, -3};      /* any values: the caller's own scheme */
    static const int32_t e2[2] = {0, 1};
    const int32_t *per[3];
    int32_t i;
    ASSERT_TRUE(a != NULL);
    for (i = 0; i < 3; i++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[i]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[i], 10 * (i + 1)));
        s[i].request = r[i];
    }
    s[0].n_tokens = 5; s[1].n_tokens = 3; s[2].n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 3));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 3, 16, 64, &p));
    per[0] = e0; per[1] = NULL; per[2] = e2;
    d.positions = per;
    d.pos_offset = 4;                                        /* applies to derived positions only */
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 3, &d, &p));
    for (i = 0; i < 5; i++) EXPECT_EQ(e0[i], p.positions[i]);
    for (i = 0; i < 3; i++) EXPECT_EQ(20 + i - 4, p.positions[5 + i]);
    for (i = 0; i < 2; i++) EXPECT_EQ(e2[i], p.positions[8 + i]);
    /* masks do not read them: q_pos is the tokens' absolute positions (the tail rule) */
    for (i = 0; i < 5; i++) EXPECT_EQ(10 + i, p.q_pos[i]);
    EXPECT_EQ(0u, p.features);
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

TEST(explicit_3d_positions_are_three_per_token_frame_row_column) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_3D);
    static const int32_t e[4 * 3] = {5, 0, 0, 5, 0, 1, 5, 1, 0, 5, 1, 1};   /* one 2 x 2 frame, at frame 5 */
    const int32_t *per[1];
    int32_t i;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 4, 4, &p));
    per[0] = e;
    d.positions = per;
    d.grid_h = 7; d.grid_w = 7;   /* would derive (0, 0, 0) .. (0, 0, 3) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    for (i = 0; i < 12; i++) EXPECT_EQ(e[i], p.positions[i]);
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* The explicit positions are what K is rotated by on the way into the
   pool (mskv_cpu_write_kv with a rope): checked against the RoPE formula in
   double (1-D, half rotation, theta 10000). */
TEST(explicit_positions_rotate_k_on_the_way_into_the_pool) {
    enum { D = 8, N = 3 };
    mskv_arena *a = mtp_arena(16, 4, 1, 1, D);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_1D);
    mskv_rope rope;
    static const int32_t e[N] = {1000, -7, 1000};   /* repeated and negative: the caller's scheme */
    const int32_t *per[1];
    float k[N * D], v[N * D];
    const float *pool;
    int32_t t, i;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = N;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, N, 4, &p));
    per[0] = e;
    d.positions = per;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    for (t = 0; t < N * D; t++) { k[t] = (float)((t * 7) % 11) / 5.0f - 1.0f; v[t] = 0.0f; }
    memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, 0, &p, k, v, MSKV_DTYPE_F32, &rope));
    pool = (const float *)mskv_store_pool(a, 0, 0);
    for (t = 0; t < N; t++)
        for (i = 0; i < D / 2; i++) {
            double ang = e[t] * pow(10000.0, -2.0 * i / D), x = k[t * D + i], y = k[t * D + i + D / 2];
            const float *row = pool + (size_t)p.slot_mapping[t] * D;
            EXPECT_NEAR(x * cos(ang) - y * sin(ang), row[i], 1e-5);
            EXPECT_NEAR(x * sin(ang) + y * cos(ang), row[i + D / 2], 1e-5);
        }
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

TEST(explicit_positions_without_a_pos_mode_are_refused_and_nothing_written) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_NONE);
    static const int32_t e[2] = {1, 2};
    const int32_t *per[1];
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 4, 4, &p));
    per[0] = e;
    d.positions = per;
    p.batch = -7;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(a, &s, 1, &d, &p));
    EXPECT_EQ(-7, p.batch);
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* The shift asked for while a chunk is open waits for its commit: every
   plan of the chunk (one per denoise step) carries the same positions. */
TEST(position_shift_during_an_open_chunk_applies_at_its_commit) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_1D);
    mskv_request_info info;
    int32_t i;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 30));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 16, &p));
    s.request = r; s.n_tokens = 6;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -20));
    info = mtp_info(a, r);
    EXPECT_EQ(0, info.pos_shift);
    EXPECT_EQ(-20, info.pos_shift_pending);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    for (i = 0; i < 6; i++) EXPECT_EQ(30 + i, p.positions[i]);   /* the chunk keeps its positions */
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    info = mtp_info(a, r);
    EXPECT_EQ(-20, info.pos_shift);
    EXPECT_EQ(0, info.pos_shift_pending);
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    for (i = 0; i < 6; i++) EXPECT_EQ(36 + i - 20, p.positions[i]);
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

TEST(position_shift_without_an_open_chunk_applies_at_once_and_an_abort_drops_a_pending_one) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_3D);
    mskv_request_info info;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 24));          /* 4 frames of 2 x 3 */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -12));   /* two frames back */
    EXPECT_EQ(-12, mtp_info(a, r).pos_shift);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 16, &p));
    s.request = r; s.n_tokens = 6;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    d.grid_h = 2; d.grid_w = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    EXPECT_EQ(2, p.positions[0]);    /* absolute frame 4, shifted to 2 */
    EXPECT_EQ(0, p.positions[1]);
    EXPECT_EQ(0, p.positions[2]);
    EXPECT_EQ(1, p.positions[3 * 5 + 1]);
    EXPECT_EQ(2, p.positions[3 * 5 + 2]);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &s, 1));
    info = mtp_info(a, r);
    EXPECT_EQ(-12, info.pos_shift);
    EXPECT_EQ(0, info.pos_shift_pending);
    EXPECT_TRUE(mtu_audit(a));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* Slots, the key position map, q_pos and the visibility bounds stay on
   absolute token indices: only the RoPE positions move. */
TEST(position_shift_moves_rope_positions_only) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p0, p1;
    mskv_plan_desc d = mtp_desc(MSKV_POS_1D);
    int32_t i;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 41));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 6));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 17, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 16, &p0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 16, &p1));
    s.request = r; s.n_tokens = 5;
    d.visibility = MSKV_VIS_EXACT;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -1000));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p1));
    EXPECT_EQ(p0.kv_len[0], p1.kv_len[0]);
    EXPECT_EQ(p0.kv_pos_split[0], p1.kv_pos_split[0]);
    EXPECT_EQ(p0.kv_pos_shift[0], p1.kv_pos_shift[0]);
    EXPECT_EQ(p0.vis_sink_end[0], p1.vis_sink_end[0]);
    EXPECT_EQ(p0.vis_window_start[0], p1.vis_window_start[0]);
    for (i = 0; i < 5; i++) {
        EXPECT_EQ(p0.slot_mapping[i], p1.slot_mapping[i]);
        EXPECT_EQ(p0.q_pos[i], p1.q_pos[i]);
        EXPECT_EQ(41 + i, p0.q_pos[i]);
        EXPECT_EQ(p0.positions[i] - 1000, p1.positions[i]);
    }
    mskv_plan_free(a, &p0);
    mskv_plan_free(a, &p1);
    mskv_arena_destroy(a);
}

TEST(position_shift_survives_offload_reload_fork_and_export_import) {
    mskv_arena *a = mtp_arena(64, 4, 1, 1, 4), *b = mtp_arena(64, 4, 1, 1, 4);
    mskv_request r, c, x;
    unsigned char *blob;
    size_t size = 0;
    ASSERT_TRUE(a != NULL && b != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 13));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, 77));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    EXPECT_EQ(77, mtp_info(a, r).pos_shift);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -7));   /* bookkeeping: allowed while offloaded */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_EQ(70, mtp_info(a, r).pos_shift);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, r, &c));
    EXPECT_EQ(70, mtp_info(a, c).pos_shift);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, NULL, 0, &size));
    blob = (unsigned char *)malloc(size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, blob, size, &size));
    EXPECT_EQ(6, (int)blob[8]);   /* layout 3, XXH64-signed */    /* versions 1 and 2 cannot say it */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(b, blob, size, &x));
    EXPECT_EQ(70, mtp_info(b, x).pos_shift);
    EXPECT_TRUE(mtu_audit(a));
    EXPECT_TRUE(mtu_audit(b));
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(position_shift_past_int32_is_overflow_and_a_keyed_entry_has_none) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r, k;
    mskv_segment s;
    uint64_t before;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, INT32_MAX));
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_request_shift_positions(a, r, 1));
    s.request = r; s.n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_request_shift_positions(a, r, 1));   /* pending counts too */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -(int64_t)INT32_MAX * 2));
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_request_shift_positions(a, r, -1));
    EXPECT_NE_U64(before, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 9, 3, &k));
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_request_shift_positions(a, k, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* A derived position that does not fit in int32 after the shift is refused
   (nothing written), not truncated. */
TEST(a_shifted_position_past_int32_is_refused_by_plan_build) {
    mskv_arena *a = mtp_arena(64, 4, 0, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_1D);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, INT32_MAX - 12));
    s.request = r; s.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 8, &p));
    p.batch = -7;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_plan_build(a, &s, 1, &d, &p));   /* token 13 at 13 + INT32_MAX - 12 */
    EXPECT_EQ(-7, p.batch);
    s.n_tokens = 2;      /* the queries are the tail: tokens 12, 13 */
    d.pos_offset = 1;    /* 13 + INT32_MAX - 12 - 1 is INT32_MAX: fits */
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    EXPECT_EQ(INT32_MAX, p.positions[1]);
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* ---- RoPE re-indexing over an endless stream -------------------------------------- */

/* deterministic K, V, Q values of a token (by absolute position) */
static float mtp_val(int kind, int64_t pos, int32_t d) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + d * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

/* Writes the plan's tokens: K, V by absolute position (the plan's q_pos),
   K rotated at the plan's RoPE positions. */
static mskv_result mtp_write(mskv_arena *a, const mskv_plan *p, const mskv_rope *rope, int32_t D) {
    float k[64 * 32], v[64 * 32];
    int32_t t, d;
    for (t = 0; t < p->total_q; t++)
        for (d = 0; d < D; d++) {
            k[t * D + d] = mtp_val(0, p->q_pos[t], d);
            v[t * D + d] = mtp_val(1, p->q_pos[t], d);
        }
    return mskv_cpu_write_kv(a, 0, p, k, v, MSKV_DTYPE_F32, rope);
}

/* Streams chunk after chunk with a window (release), attends causally with
   RoPE; with shift != 0 the positions are re-indexed by -shift after every
   `every` chunks, and the cached keys re-rotated by the same amount. Writes
   the last chunk's output. Returns the largest RoPE position planned. */
static int32_t mtp_stream(int32_t shift, int32_t every, float *o_last) {
    enum { P = 8, D = 32, CH = 12, CHUNKS = 9, WIN = 36 };
    mskv_arena *a = mtp_arena(64, P, 1, 1, D);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc(MSKV_POS_1D);
    mskv_rope rope;
    mskv_attn at;
    int32_t c, t, dd, top = 0;
    float q[CH * D], lse[CH];
    if (!a) return -1;
    memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D;
    memset(&at, 0, sizeof at);
    at.q_heads = 1; at.mask = MSKV_MASK_CAUSAL; at.q_dtype = MSKV_DTYPE_F32;
    if (mskv_request_add(a, &r) || mskv_plan_alloc(a, 1, CH, 16, &p)) return -1;
    s.request = r; s.n_tokens = CH;
    for (c = 0; c < CHUNKS; c++) {
        if (mskv_admit(a, &s, 1) || mskv_plan_build(a, &s, 1, &d, &p) || mtp_write(a, &p, &rope, D)) return -1;
        for (t = 0; t < CH; t++) {
            if (p.positions[t] > top) top = p.positions[t];
            for (dd = 0; dd < D; dd++) q[t * D + dd] = mtp_val(2, p.q_pos[t], dd);
        }
        if (mskv_rope_apply(&rope, q, MSKV_DTYPE_F32, CH, 1, D, p.positions)) return -1;
        if (mskv_cpu_attention(NULL, a, 0, &p, &at, q, o_last, lse)) return -1;
        if (shift && (c + 1) % every == 0) {
            /* re-index: the chunk commits first, then every cached key turns back by shift */
            int32_t pages[64], n = 0, i, back[P];
            if (mskv_request_shift_positions(a, r, -shift)) return -1;
            if (mskv_commit(a, &s, 1) || mskv_request_pages(a, r, pages, 64, &n)) return -1;
            for (i = 0; i < P; i++) back[i] = -shift;
            for (i = 0; i < n; i++)
                if (mskv_rope_apply(&rope, (float *)mskv_store_pool(a, 0, 0) + (size_t)pages[i] * P * D, MSKV_DTYPE_F32, P, 1, D, back))
                    return -1;
        } else if (mskv_commit(a, &s, 1)) {
            return -1;
        }
        if (mtp_info(a, r).committed > WIN && mskv_request_release_oldest(a, r, mtp_info(a, r).committed - WIN - mtp_info(a, r).live_start, NULL))
            return -1;
    }
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
    return top;
}

/* RoPE depends on position differences only: a stream re-indexed every
   three chunks (positions kept below a bound however long it runs), with its
   cached keys re-rotated, attends exactly like the stream that counts on. */
TEST(rope_reindexing_by_a_position_shift_keeps_attention_and_bounds_positions) {
    float o0[12 * 32], o1[12 * 32];
    int32_t top0, top1, i;
    top0 = mtp_stream(0, 1, o0);
    top1 = mtp_stream(36, 3, o1);
    ASSERT_TRUE(top0 > 0 && top1 > 0);
    EXPECT_EQ(9 * 12 - 1, top0);
    EXPECT_LT(top1, 3 * 12 + 36);      /* bounded: three chunks past the last re-index */
    for (i = 0; i < 12 * 32; i++)
        if (fabs((double)o0[i] - (double)o1[i]) > 1e-5) {
            mt_fail(__FILE__, __LINE__, "o[%d]: %.8g without re-indexing, %.8g with", (int)i, (double)o0[i], (double)o1[i]);
            break;
        }
}
