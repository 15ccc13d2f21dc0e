/* Plans padded to a captured shape (issue 12, item 2): one CUDA graph serves
   every step that fits the shape it was captured at. A smaller step is
   planned into that shape (empty segments holding the extra queries, slot
   -1, position 0, no pages) and stays a valid plan whose padding reads and
   writes nothing; a larger step is CAPACITY ("capture again"). The GPU side
   (eager vs replay) is in tests/emu_cuda.cpp. */
#include <stdlib.h>
#include <string.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

enum { MTP_P = 8, MTP_KVH = 2, MTP_D = 32, MTP_QH = 4, MTP_ROW = MTP_KVH * MTP_D, MTP_CAPB = 8, MTP_CAPT = 64 };

static char mtp_log_text[512];
static void mtp_log(void *user, mskv_log_level level, const char *message) {
    (void)user; (void)level;
    strncpy(mtp_log_text, message, sizeof mtp_log_text - 1);
}

static float mtp_val(int kind, int64_t pos, int32_t i) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + i * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

static mskv_arena *mtp_arena(void) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 64; d.page_size = MTP_P; d.num_layers = 1; d.kv_heads = MTP_KVH; d.head_dim = MTP_D;
    d.dtype = MSKV_DTYPE_F32; d.log = mtp_log;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

/* K/V rows of the plan's queries by their absolute (q_pos) position; padding rows get garbage. */
static void mtp_rows(const mskv_plan *p, int32_t real_q, float *k, float *v) {
    int32_t t, i;
    for (t = 0; t < p->total_q; t++)
        for (i = 0; i < MTP_ROW; i++) {
            k[t * MTP_ROW + i] = t < real_q ? mtp_val(0, p->q_pos[t], i) : 1e30f;
            v[t * MTP_ROW + i] = t < real_q ? mtp_val(1, p->q_pos[t], i) : -1e30f;
        }
}

/* Three requests with 21, 37 and 5 committed tokens. */
static int mtp_history(mskv_arena *a, mskv_request r[3]) {
    static const int32_t len[3] = { 21, 37, 5 };
    static float k[64 * MTP_ROW], v[64 * MTP_ROW];
    int32_t i, ok = 1;
    mskv_plan p;
    if (mskv_plan_alloc(a, MTP_CAPB, MTP_CAPT, 64, &p) != MSKV_SUCCESS) return 0;
    for (i = 0; ok && i < 3; i++) {
        mskv_segment s;
        ok = mskv_request_add(a, &r[i]) == MSKV_SUCCESS;
        s.request = r[i]; s.n_tokens = len[i];
        ok = ok && mskv_admit(a, &s, 1) == MSKV_SUCCESS && mskv_plan_build(a, &s, 1, NULL, &p) == MSKV_SUCCESS;
        if (ok) mtp_rows(&p, p.total_q, k, v);
        ok = ok && mskv_cpu_write_kv(a, 0, &p, k, v, MSKV_DTYPE_F32, NULL) == MSKV_SUCCESS &&
             mskv_commit(a, &s, 1) == MSKV_SUCCESS;
    }
    mskv_plan_free(a, &p);
    return ok;
}

/* The shape a graph was captured at: batch 3 padded to 4 (room for a
   padding segment), 10 queries, segments of at most 4 queries and 48 keys. */
static mskv_plan_desc mtp_desc(void) {
    mskv_plan_desc d;
    memset(&d, 0, sizeof d);
    d.pos_mode = MSKV_POS_1D;
    d.pad_batch = 4; d.pad_tokens = 10; d.pad_qo_len = 4; d.pad_kv_len = 48;
    return d;
}

TEST(padded_plan_has_the_captured_shape_and_its_padding_segments_read_and_write_nothing) {
    mskv_arena *a = mtp_arena();
    mskv_request r[3];
    mskv_segment s[2];
    mskv_plan p, u;
    mskv_plan_desc d = mtp_desc(), du = mtp_desc();
    char why[256];
    int32_t b, i;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_history(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, MTP_CAPB, MTP_CAPT, 64, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, MTP_CAPB, MTP_CAPT, 64, &u));
    s[0].request = r[2]; s[0].n_tokens = 3;
    s[1].request = r[0]; s[1].n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 2));
    du.pad_batch = du.pad_tokens = du.pad_qo_len = du.pad_kv_len = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &du, &u));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &d, &p));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_validate(&p, 64, why, sizeof why));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_check(a, &p));
    EXPECT_EQ(4, p.batch);
    EXPECT_EQ(10, p.total_q);
    EXPECT_EQ(4, p.pad_qo_len);
    EXPECT_EQ(48, p.pad_kv_len);
    EXPECT_EQ(0u, p.features);
    EXPECT_EQ(2, p.pad_segments);
    EXPECT_EQ(u.num_page_ids, p.num_page_ids);
    /* the step's segments are the unpadded plan's */
    for (b = 0; b <= 2; b++) {
        EXPECT_EQ(u.qo_indptr[b], p.qo_indptr[b]);
        EXPECT_EQ(u.kv_indptr[b], p.kv_indptr[b]);
    }
    for (b = 0; b < 2; b++) {
        EXPECT_EQ(u.kv_len[b], p.kv_len[b]);
        EXPECT_EQ(u.kv_pos_split[b], p.kv_pos_split[b]);
        EXPECT_EQ(u.kv_pos_shift[b], p.kv_pos_shift[b]);
    }
    for (i = 0; i < u.total_q; i++) {
        EXPECT_EQ(u.slot_mapping[i], p.slot_mapping[i]);
        EXPECT_EQ(u.positions[i], p.positions[i]);
        EXPECT_EQ(u.q_pos[i], p.q_pos[i]);
    }
    for (i = 0; i < u.num_page_ids; i++) EXPECT_EQ(u.kv_indices[i], p.kv_indices[i]);
    /* padding: the 6 extra queries spread 3 + 3 over two segments without keys */
    EXPECT_EQ(7, p.qo_indptr[3]);
    EXPECT_EQ(10, p.qo_indptr[4]);
    for (b = 2; b < 4; b++) {
        EXPECT_EQ(0, p.kv_len[b]);
        EXPECT_EQ(p.num_page_ids, p.kv_indptr[b + 1]);
        EXPECT_EQ(0, p.kv_last_page_len[b]);
        EXPECT_EQ(0u, p.requests[b].id);
    }
    for (i = u.total_q; i < p.total_q; i++) {
        EXPECT_EQ(-1, p.slot_mapping[i]);
        EXPECT_EQ(0, p.positions[i]);
    }
    mskv_plan_free(a, &p);
    mskv_plan_free(a, &u);
    mskv_arena_destroy(a);
}

/* The size query gives the padded sizes, which the buffers must hold. */
TEST(plan_query_of_a_padded_step_gives_the_padded_sizes) {
    mskv_arena *a = mtp_arena();
    mskv_request r[3];
    mskv_segment s;
    mskv_plan_size sz;
    mskv_plan_desc d = mtp_desc();
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_history(a, r));
    s.request = r[1]; s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_query(a, &s, 1, &d, &sz));
    EXPECT_EQ(4, sz.batch);
    EXPECT_EQ(10, sz.total_q);
    EXPECT_EQ(5, sz.num_page_ids);   /* 39 tokens on pages of 8: padding takes none */
    mskv_arena_destroy(a);
}

/* Each way a step can outgrow the captured shape: refused before anything
   is written, with the log saying to capture again. */
TEST(a_step_larger_than_the_padded_shape_is_CAPACITY_and_writes_nothing) {
    mskv_arena *a = mtp_arena();
    mskv_request r[3], more[2];
    mskv_segment s[5];
    mskv_plan p;
    mskv_plan_desc d;
    int32_t i, case_no;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_history(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &more[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &more[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, MTP_CAPB, MTP_CAPT, 64, &p));
    for (i = 0; i < 3; i++) { s[i].request = r[i]; s[i].n_tokens = 1; }
    s[3].request = more[0]; s[3].n_tokens = 1;
    s[4].request = more[1]; s[4].n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 5));
    for (case_no = 0; case_no < 5; case_no++) {
        int32_t n = 2;
        d = mtp_desc();
        switch (case_no) {
        case 0: n = 5; break;                            /* 5 segments, 4 captured */
        case 1: d.pad_tokens = 1; break;                 /* 2 queries, 1 captured */
        case 2: d.pad_qo_len = 0; d.pad_kv_len = 30; s[1].request = r[1]; break;   /* 38 keys, 30 captured */
        case 3: d.pad_batch = 2; break;                  /* 8 extra queries and no padding segment */
        default: d.pad_qo_len = 0; s[0].request = r[0]; s[0].n_tokens = 1; d.pad_kv_len = 21; break;  /* 22 keys */
        }
        memset(p.qo_indptr, 0x5a, sizeof(int32_t) * (MTP_CAPB + 1));
        memset(p.slot_mapping, 0x5a, sizeof(int64_t) * MTP_CAPT);
        mtp_log_text[0] = 0;
        EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_plan_build(a, s, n, &d, &p));
        EXPECT_TRUE(strstr(mtp_log_text, "capture again") != NULL);
        EXPECT_EQ(0x5a5a5a5a, p.qo_indptr[0]);
        EXPECT_EQ((int64_t)0x5a5a5a5a5a5a5a5all, p.slot_mapping[0]);
        s[0].request = r[0]; s[1].request = r[1];
    }
    /* the same step padded to a shape it fits is planned, extra queries past
       pad_qo_len in its padding segments included (their rows are no result) */
    d = mtp_desc();
    d.pad_qo_len = 3;
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &d, &p));
    EXPECT_EQ(6, p.qo_indptr[3]);   /* 8 extra queries: 4 + 4 */
    d = mtp_desc();
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &d, &p));
    EXPECT_EQ(10, p.total_q);
    d.pad_batch = -1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(a, s, 2, &d, &p));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* The padded plan's K/V write stores exactly the unpadded one's bytes
   (padding rows hold garbage and slot -1), and attention over it gives the
   unpadded rows bit for bit, o = 0 and lse = -inf on the padding rows. */
static void mtp_attend_padded_equals_unpadded(mskv_mask mask) {
    mskv_arena *a = mtp_arena(), *b = mtp_arena();
    mskv_request ra[3], rb[3];
    mskv_segment sa[3], sb[3];
    mskv_plan pa, pb;
    mskv_plan_desc du = mtp_desc(), d = mtp_desc();
    mskv_attn at;
    static float k[MTP_CAPT * MTP_ROW], v[MTP_CAPT * MTP_ROW], q[MTP_CAPT * MTP_QH * MTP_D];
    static float oa[MTP_CAPT * MTP_QH * MTP_D], ob[MTP_CAPT * MTP_QH * MTP_D], la[MTP_CAPT * MTP_QH], lb[MTP_CAPT * MTP_QH];
    size_t pool = (size_t)64 * MTP_P * MTP_ROW * 4;
    int32_t i, bad = 0;
    ASSERT_TRUE(a && b && mtp_history(a, ra) && mtp_history(b, rb));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, MTP_CAPB, MTP_CAPT, 64, &pa));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(b, MTP_CAPB, MTP_CAPT, 64, &pb));
    for (i = 0; i < 3; i++) { sa[i].request = ra[i]; sb[i].request = rb[i]; }
    sa[0].n_tokens = sb[0].n_tokens = 4;   /* 2 + 4 + 1 = 7 of 10 queries, 1 padding segment of 3 */
    sa[1].n_tokens = sb[1].n_tokens = 2;
    sa[2].n_tokens = sb[2].n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, sa, 3));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(b, sb, 3));
    du.pad_batch = du.pad_tokens = du.pad_qo_len = du.pad_kv_len = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, sa, 3, &du, &pa));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(b, sb, 3, &d, &pb));
    ASSERT_EQ(10, pb.total_q);
    mtp_rows(&pa, pa.total_q, k, v);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, 0, &pa, k, v, MSKV_DTYPE_F32, NULL));
    mtp_rows(&pb, pa.total_q, k, v);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(b, 0, &pb, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_EQ(0, memcmp(mskv_store_pool(a, 0, 0), mskv_store_pool(b, 0, 0), pool));
    EXPECT_EQ(0, memcmp(mskv_store_pool(a, 0, 1), mskv_store_pool(b, 0, 1), pool));
    for (i = 0; i < pb.total_q * MTP_QH * MTP_D; i++) q[i] = mtp_val(2, i, 0);
    memset(&at, 0, sizeof at);
    at.q_heads = MTP_QH; at.mask = mask; at.q_dtype = MSKV_DTYPE_F32;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, 0, &pa, &at, q, oa, la));
    pb.q_pos = NULL;   /* a caller's plan without q_pos: padding needs no positions */
    memset(ob, 0x7f, sizeof ob);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, b, 0, &pb, &at, q, ob, lb));
    EXPECT_EQ(0, memcmp(oa, ob, sizeof(float) * (size_t)pa.total_q * MTP_QH * MTP_D));
    EXPECT_EQ(0, memcmp(la, lb, sizeof(float) * (size_t)pa.total_q * MTP_QH));
    for (i = pa.total_q * MTP_QH * MTP_D; i < pb.total_q * MTP_QH * MTP_D; i++) bad += ob[i] != 0.0f;
    for (i = pa.total_q * MTP_QH; i < pb.total_q * MTP_QH; i++) bad += !(lb[i] < 0 && lb[i] * 0 != 0);
    EXPECT_EQ(0, bad);
    mskv_plan_free(a, &pa);
    mskv_plan_free(b, &pb);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

/* Padding must read and write nothing: a padding segment with keys or a
   padding query with a slot is not a valid plan. */
TEST(plan_validate_rejects_padding_segments_with_keys_or_slots) {
    mskv_arena *a = mtp_arena();
    mskv_request r[3];
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d = mtp_desc();
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_history(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, MTP_CAPB, MTP_CAPT, 64, &p));
    s.request = r[1]; s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_validate(&p, 64, why, sizeof why));
    p.slot_mapping[9] = 8;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_validate(&p, 64, why, sizeof why));
    EXPECT_TRUE(strstr(why, "padding query") != NULL);
    p.slot_mapping[9] = -1;
    p.pad_segments = 4;   /* the step's own segment is not padding: it has keys */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_validate(&p, 64, why, sizeof why));
    EXPECT_TRUE(strstr(why, "has keys") != NULL);
    p.pad_segments = 5;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_validate(&p, 64, why, sizeof why));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

TEST(cpu_attention_over_a_padded_plan_equals_the_unpadded_one_causal) { mtp_attend_padded_equals_unpadded(MSKV_MASK_CAUSAL); }
TEST(cpu_attention_over_a_padded_plan_equals_the_unpadded_one_unmasked) { mtp_attend_padded_equals_unpadded(MSKV_MASK_NONE); }
