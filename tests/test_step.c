/* The step lifecycle: admit (all or nothing), plan (CSR views, slots,
   positions, caller-owned buffers), commit, abort, publish (events), keyed
   cross-attention entries and the windowed session. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

static mskv_arena *mts_make_desc(int32_t num_pages, int32_t page_size, mskv_event_fn ev, void *ev_user) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    d.on_event = ev;
    d.event_user = ev_user;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

static mskv_arena *mts_make(int32_t num_pages, int32_t page_size) {
    return mts_make_desc(num_pages, page_size, NULL, NULL);
}

/* admit + commit + publish of one segment: one whole step */
static mskv_result mts_step(mskv_arena *a, mskv_request r, int64_t n) {
    mskv_segment s;
    mskv_result e;
    s.request = r;
    s.n_tokens = n;
    e = mskv_admit(a, &s, 1);
    if (e == MSKV_SUCCESS) e = mskv_commit(a, &s, 1);
    if (e == MSKV_SUCCESS) e = mskv_publish(a, &s, 1, NULL);
    return e;
}



static int32_t mts_free_pages(mskv_arena *a) {
    mskv_arena_stats st;
    if (mskv_arena_stats_get(a, &st) != MSKV_SUCCESS) return -1;
    return st.free_pages;
}

static mskv_request_info mts_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.num_pages = -1;
    return i;
}

/* A plan with arrays owned here, large enough for the tests of this file. */
typedef struct mts_bufs {
    int32_t qo[9], kvp[9], idx[256], last[8], kvlen[8], split[8], shift[8], pos[3 * 512];
    int64_t tok[9], slots[512];
} mts_bufs;

static void mts_bind(mskv_plan *p, mts_bufs *b, int32_t cap_batch, int32_t cap_tokens, int32_t cap_ids) {
    memset(p, 0, sizeof *p);
    p->qo_indptr = b->qo; p->kv_indptr = b->kvp; p->kv_indices = b->idx;
    p->kv_last_page_len = b->last; p->kv_len = b->kvlen;
    p->kv_pos_split = b->split; p->kv_pos_shift = b->shift;
    p->kv_token_indptr = b->tok; p->slot_mapping = b->slots; p->positions = b->pos;
    p->cap_batch = cap_batch; p->cap_tokens = cap_tokens; p->cap_page_ids = cap_ids;
}

/* Every SELF-plan fact that can be derived from the requests themselves. */
static int mts_check_self_plan(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan *p, int32_t num_pages) {
    char why[256];
    int32_t b, q = 0, ids = 0;
    if (mskv_plan_validate(p, num_pages, why, sizeof why) != MSKV_SUCCESS) {
        mt_fail(__FILE__, __LINE__, "plan_validate: %s", why);
        return 0;
    }
    if (p->batch != n) return 0;
    for (b = 0; b < n; b++) {
        mskv_request_info i = mts_info(a, segs[b].request);
        int32_t table[64], count = 0, k, P = p->page_size;
        int64_t j;
        if (mskv_request_pages(a, segs[b].request, table, 64, &count) != MSKV_SUCCESS) return 0;
        if (p->qo_indptr[b] != q || p->kv_indptr[b] != ids) return 0;
        if (p->kv_len[b] != i.kv_len) return 0;
        if (p->kv_indptr[b + 1] - p->kv_indptr[b] != count) return 0;
        for (k = 0; k < count; k++) if (p->kv_indices[ids + k] != table[k]) return 0;
        if (count > 0 && p->kv_last_page_len[b] != i.kv_len - (int64_t)(count - 1) * P) return 0;
        for (j = 0; j < segs[b].n_tokens; j++) {
            /* query j is the token at compacted index kv_len - qo_len + j */
            int64_t cj = i.kv_len - segs[b].n_tokens + j, slot;
            int64_t abs_pos = cj < p->kv_pos_split[b] ? cj : cj + p->kv_pos_shift[b];
            if (abs_pos != i.committed + j) return 0;
            if (mskv_request_slot(a, segs[b].request, abs_pos, &slot) != MSKV_SUCCESS) return 0;
            if (p->slot_mapping[q + j] != slot) return 0;
        }
        q += (int32_t)segs[b].n_tokens;
        ids += count;
    }
    return p->qo_indptr[n] == q && p->kv_indptr[n] == ids && p->total_q == q && p->num_page_ids == ids;
}

TEST(admit_is_all_or_nothing) {
    mskv_request r[3];
    mskv_segment s[3];
    mskv_request_info i;
    uint64_t d;
    int k;
    mskv_arena *a = mts_make(11, 4);  /* 10 usable pages */
    ASSERT_TRUE(a != NULL);
    for (k = 0; k < 3; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
        s[k].request = r[k];
    }
    s[0].n_tokens = 12; s[1].n_tokens = 16; s[2].n_tokens = 9;  /* 3 + 4 + 3 = 10 pages */
    s[2].n_tokens = 13;  /* the last one needs a fourth page: nothing may be taken */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(a, s, 3));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(10, mts_free_pages(a));
    for (k = 0; k < 3; k++) {
        i = mts_info(a, r[k]);
        EXPECT_EQ(0, i.has_reservation);
        EXPECT_EQ(0, i.num_pages);
    }
    s[2].n_tokens = 12;
    EXPECT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 3));
    EXPECT_EQ(0, mts_free_pages(a));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(admit_fills_the_partial_last_page_before_taking_new_ones) {
    mskv_request r;
    mskv_arena *a = mts_make(11, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 5));
    EXPECT_EQ(8, mts_free_pages(a));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 3));
    EXPECT_EQ(8, mts_free_pages(a));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 1));
    EXPECT_EQ(7, mts_free_pages(a));
    mskv_arena_destroy(a);
}

TEST(admit_rejects_a_request_twice_in_one_batch) {
    mskv_request r;
    mskv_segment s[2];
    uint64_t d;
    mskv_arena *a = mts_make(16, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s[0].request = r; s[0].n_tokens = 2;
    s[1] = s[0];
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_admit(a, s, 2));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    mskv_arena_destroy(a);
}

TEST(admit_with_an_open_reservation_is_RESERVATION_PENDING) {
    mskv_request r;
    mskv_segment s;
    mskv_arena *a = mts_make(16, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_RESERVATION_PENDING, mskv_admit(a, &s, 1));
    EXPECT_EQ(2, mts_info(a, r).reserved);
    mskv_arena_destroy(a);
}

TEST(commit_turns_reserved_tokens_into_committed_ones) {
    mskv_request r;
    mskv_segment s;
    mskv_request_info i;
    mskv_arena *a = mts_make(16, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = 6;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    i = mts_info(a, r);
    EXPECT_EQ(0, i.committed);
    EXPECT_EQ(6, i.reserved);
    EXPECT_EQ(1, i.has_reservation);
    EXPECT_EQ(6, i.kv_len);
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    i = mts_info(a, r);
    EXPECT_EQ(6, i.committed);
    EXPECT_EQ(0, i.reserved);
    EXPECT_EQ(0, i.has_reservation);
    EXPECT_EQ(MSKV_ERROR_NO_RESERVATION, mskv_commit(a, &s, 1));
    mskv_arena_destroy(a);
}

TEST(abort_frees_the_reservations_new_pages) {
    mskv_request r;
    mskv_segment s;
    int32_t before[8], after[8], nb = 0, na = 0, k;
    mskv_arena *a = mts_make(16, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, before, 8, &nb));
    s.request = r; s.n_tokens = 9;  /* fills page 1, takes two more */
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(11, mts_free_pages(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &s, 1));
    EXPECT_EQ(13, mts_free_pages(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, after, 8, &na));
    ASSERT_EQ(nb, na);
    for (k = 0; k < na; k++) EXPECT_EQ(before[k], after[k]);
    EXPECT_EQ(6, mts_info(a, r).committed);
    EXPECT_EQ(0, mts_info(a, r).reserved);
    EXPECT_EQ(MSKV_ERROR_NO_RESERVATION, mskv_abort(a, &s, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(plan_of_a_batch_is_valid_csr_matching_each_requests_table_and_slots) {
    mskv_request r[3];
    mskv_segment s[3];
    mskv_plan p;
    mskv_plan_desc pd;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int k;
    mskv_arena *a = mts_make(64, 5);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    pd.visibility = MSKV_VIS_PAGES;   /* the tables as they are (the plan has no bound arrays) */
    for (k = 0; k < 3; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[k], 7 * k + 3));
        s[k].request = r[k];
        s[k].n_tokens = 1 + 4 * k;
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r[2], 6));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r[2], 6, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 3));
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 3, &pd, &p));
    EXPECT_TRUE(mts_check_self_plan(a, s, 3, &p, 64));
    mskv_arena_destroy(a);
    free(b);
}

TEST(plan_maps_compacted_indices_to_absolute_positions_across_the_released_gap) {
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int64_t j;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    pd.visibility = MSKV_VIS_PAGES;   /* the tables as they are (the plan has no bound arrays) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 30));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 13, NULL));  /* frees [8,20) */
    s.request = r; s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &p));
    ASSERT_EQ(8 + 13, p.kv_len[0]);  /* [0,8) + [20,33) */
    for (j = 0; j < p.kv_len[0]; j++) {
        int64_t abs_pos = j < p.kv_pos_split[0] ? j : j + p.kv_pos_shift[0];
        EXPECT_EQ(j < 8 ? j : j + 12, abs_pos);
    }
    EXPECT_EQ(1, p.kv_last_page_len[0]);
    mskv_arena_destroy(a);
    free(b);
}

TEST(plan_positions_are_absolute_minus_offset_in_1d) {
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int32_t j;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    pd.pos_offset = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 8, NULL));
    s.request = r; s.n_tokens = 7;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &p));
    for (j = 0; j < 7; j++) EXPECT_EQ(10 + j - 3, p.positions[j]);
    mskv_arena_destroy(a);
    free(b);
}

TEST(plan_positions_are_frame_row_col_on_the_grid_in_3d) {
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int32_t j;
    mskv_arena *a = mts_make(128, 7);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_3D;
    pd.grid_h = 3; pd.grid_w = 5;  /* 15 tokens per frame */
    pd.pos_offset = 15;            /* e.g. one conditioning frame not counted */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 22));
    s.request = r; s.n_tokens = 40;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &p));
    for (j = 0; j < 40; j++) {
        int32_t x = 22 + j - 15;
        EXPECT_EQ(x / 15, p.positions[3 * j + 0]);
        EXPECT_EQ((x % 15) / 5, p.positions[3 * j + 1]);
        EXPECT_EQ(x % 5, p.positions[3 * j + 2]);
    }
    mskv_arena_destroy(a);
    free(b);
}

TEST(plan_into_caller_buffers_keeps_the_same_addresses_step_after_step) {
    mskv_request r[2];
    mskv_segment s[2];
    mskv_plan p;
    mskv_plan_desc pd;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int step, k;
    mskv_arena *a = mts_make(128, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    for (k = 0; k < 2; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
        s[k].request = r[k];
    }
    mts_bind(&p, b, 8, 512, 256);
    for (step = 0; step < 20; step++) {
        s[0].n_tokens = 1 + step % 3;
        s[1].n_tokens = 2;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &pd, &p));
        ASSERT_TRUE(p.qo_indptr == b->qo && p.kv_indptr == b->kvp && p.kv_indices == b->idx &&
                    p.kv_last_page_len == b->last && p.slot_mapping == b->slots && p.positions == b->pos);
        EXPECT_TRUE(mts_check_self_plan(a, s, 2, &p, 128));
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, s, 2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, s, 2, NULL));
    }
    mskv_arena_destroy(a);
    free(b);
}

TEST(plan_into_too_small_buffers_is_CAPACITY_and_writes_nothing) {
    mskv_request r[2];
    mskv_segment s[2];
    mskv_plan p;
    mskv_plan_desc pd;
    mskv_plan_size sz;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int k;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    for (k = 0; k < 2; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[k], 9));
        s[k].request = r[k];
        s[k].n_tokens = 5;
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_query(a, s, 2, &pd, &sz));
    EXPECT_EQ(2, sz.batch);
    EXPECT_EQ(10, sz.total_q);
    EXPECT_EQ(8, sz.num_page_ids);
    memset(b, 0x5a, sizeof *b);
    mts_bind(&p, b, 1, 512, 256);
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_plan_build(a, s, 2, &pd, &p));
    mts_bind(&p, b, 8, 9, 256);
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_plan_build(a, s, 2, &pd, &p));
    mts_bind(&p, b, 8, 512, 7);
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_plan_build(a, s, 2, &pd, &p));
    for (k = 0; k < 9; k++) EXPECT_EQ(0x5a5a5a5a, b->qo[k]);
    EXPECT_EQ(0x5a5a5a5a, b->idx[0]);
    mts_bind(&p, b, 2, 10, 8);  /* exactly the queried sizes */
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &pd, &p));
    EXPECT_TRUE(mts_check_self_plan(a, s, 2, &p, 64));
    mskv_arena_destroy(a);
    free(b);
}

TEST(plan_alloc_gives_arrays_of_the_asked_capacity) {
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    memset(&pd, 0, sizeof pd);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = 30;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 30, 8, &p));
    EXPECT_TRUE(p.owned != NULL);
    EXPECT_EQ(1, p.cap_batch);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &p));
    EXPECT_TRUE(mts_check_self_plan(a, &s, 1, &p, 64));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

TEST(plan_validate_rejects_each_broken_csr_rule) {
    mskv_plan p;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    char why[128];
    ASSERT_TRUE(b != NULL);
    /* two sequences: 3 pages with kv_len 10 (last 2), 1 page with kv_len 4 (last 4) */
#define MTS_GOOD()                                                                           \
    do {                                                                                     \
        mts_bind(&p, b, 8, 512, 256);                                                        \
        p.batch = 2; p.total_q = 3; p.num_page_ids = 4; p.page_size = 4;                     \
        b->qo[0] = 0; b->qo[1] = 2; b->qo[2] = 3;                                            \
        b->kvp[0] = 0; b->kvp[1] = 3; b->kvp[2] = 4;                                         \
        b->idx[0] = 5; b->idx[1] = 1; b->idx[2] = 7; b->idx[3] = 2;                          \
        b->last[0] = 2; b->last[1] = 4; b->kvlen[0] = 10; b->kvlen[1] = 4;                   \
        b->split[0] = b->split[1] = 0; b->shift[0] = b->shift[1] = 0;                        \
        b->slots[0] = 29; b->slots[1] = 30; b->slots[2] = 11;                                \
    } while (0)
    MTS_GOOD();
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->kvp[1] = 5;  /* not monotone */
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->qo[1] = 4;
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->idx[2] = 0;  /* the null page inside a live sequence */
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->idx[3] = 8;  /* out of range */
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->last[0] = 0;
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->last[1] = 5;
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->kvlen[0] = 11;  /* inconsistent with 3 pages and last 2 */
    EXPECT_NE(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
    MTS_GOOD(); b->kvp[2] = 3; b->kvlen[1] = 0; b->last[1] = 0;  /* an empty sequence is fine */
    p.num_page_ids = 3;
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_validate(&p, 8, why, sizeof why));
#undef MTS_GOOD
    free(b);
}

TEST(dense_plan_gives_prefix_sums_of_kv_lengths_and_no_slots) {
    mskv_request r[2];
    mskv_segment s[2];
    mskv_plan p;
    mskv_plan_desc pd;
    int64_t lens[2] = {100, 37};
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int k;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_DENSE;
    pd.dense_kv_len = lens;
    for (k = 0; k < 2; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
        s[k].request = r[k];
        s[k].n_tokens = 3 + k;
    }
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 2, &pd, &p));
    EXPECT_EQ(0, p.kv_token_indptr[0]);
    EXPECT_EQ(100, p.kv_token_indptr[1]);
    EXPECT_EQ(137, p.kv_token_indptr[2]);
    EXPECT_EQ(7, p.qo_indptr[2]);
    for (k = 0; k < 7; k++) EXPECT_EQ(-1, p.slot_mapping[k]);
    mskv_arena_destroy(a);
    free(b);
}

/* ---- keyed entries ---- */

TEST(keyed_entry_is_written_once_sealed_and_then_read_only) {
    mskv_request e, found;
    mskv_segment s;
    mskv_request_info i;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 0xC0FFEEu, 10, &e));
    i = mts_info(a, e);
    EXPECT_EQ(1, i.keyed);
    EXPECT_EQ(0, i.sealed);
    EXPECT_EQ(10, i.reserved);
    EXPECT_EQ(3, i.num_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, e));
    i = mts_info(a, e);
    EXPECT_EQ(1, i.sealed);
    EXPECT_EQ(10, i.committed);
    EXPECT_EQ(0, i.reserved);
    s.request = e; s.n_tokens = 1;
    EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_keyed_find(a, 0xC0FFEEu, &found));
    EXPECT_EQ(e.id, found.id);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(keyed_create_of_an_existing_key_is_DUPLICATE) {
    mskv_request e, e2;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 42, 8, &e));
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_keyed_create(a, 42, 8, &e2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 42));
    EXPECT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 42, 8, &e2));
    mskv_arena_destroy(a);
}

TEST(keyed_find_and_remove_of_a_missing_key_is_NOT_FOUND) {
    mskv_request e;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(a, 7, &e));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_remove(a, 7));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 7, 3, &e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 7));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(a, 7, &e));
    {
        mskv_request_info i;
        EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, e, &i));
    }
    mskv_arena_destroy(a);
}

TEST(many_requests_plan_cross_attention_against_one_sealed_entry) {
    mskv_request e, r[3];
    mskv_segment s[3], es;
    mskv_plan p;
    mskv_plan_desc pd;
    int32_t table[8], n = 0;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int k, j;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 99, 13, &e));
    /* written once through a SELF plan of its reservation */
    memset(&pd, 0, sizeof pd);
    es.request = e; es.n_tokens = 13;
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &es, 1, &pd, &p));
    EXPECT_EQ(13, p.total_q);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, e, table, 8, &n));
    ASSERT_EQ(4, n);
    for (k = 0; k < 3; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[k], 5));
        s[k].request = r[k];
        s[k].n_tokens = 2 + k;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s[k], 1));
    }
    pd.kind = MSKV_PLAN_CROSS;
    pd.cross = e;
    mts_bind(&p, b, 8, 512, 256);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, s, 3, &pd, &p));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_validate(&p, 64, NULL, 0));
    EXPECT_EQ(3, p.batch);
    EXPECT_EQ(9, p.total_q);
    for (k = 0; k < 3; k++) {
        EXPECT_EQ(13, p.kv_len[k]);
        EXPECT_EQ(1, p.kv_last_page_len[k]);
        EXPECT_EQ(4 * k, p.kv_indptr[k]);
        for (j = 0; j < 4; j++) EXPECT_EQ(table[j], p.kv_indices[p.kv_indptr[k] + j]);
    }
    for (k = 0; k < 9; k++) EXPECT_EQ(-1, p.slot_mapping[k]);
    mskv_arena_destroy(a);
    free(b);
}

/* ---- events ---- */

typedef struct mts_events { int stored, removed, n; mskv_event ev[64]; } mts_events;

static void mts_on_event(void *user, const mskv_event *e) {
    mts_events *c = (mts_events *)user;
    if (e->type == MSKV_EVENT_PAGE_STORED) c->stored++;
    if (e->type == MSKV_EVENT_PAGE_REMOVED) c->removed++;
    if (c->n < 64) c->ev[c->n++] = *e;
}

TEST(page_stored_events_come_at_publish_for_pages_that_filled) {
    mts_events c;
    mskv_request r;
    mskv_segment seg;
    int32_t table[8], n = 0;
    int k;
    mskv_arena *a;
    memset(&c, 0, sizeof c);
    a = mts_make_desc(32, 4, mts_on_event, &c);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    EXPECT_EQ(0, c.stored);  /* committed but not yet published */
    seg.request = r; seg.n_tokens = 10;
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &seg, 1, NULL));
    ASSERT_EQ(2, c.stored);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, table, 8, &n));
    for (k = 0; k < 2; k++) {
        EXPECT_EQ(MSKV_EVENT_PAGE_STORED, c.ev[k].type);
        EXPECT_EQ(r.id, c.ev[k].request.id);
        EXPECT_EQ(table[c.ev[k].first_token / 4], c.ev[k].page);
    }
    EXPECT_NE(c.ev[0].first_token, c.ev[1].first_token);
    ASSERT_EQ(MSKV_SUCCESS, mts_step(a, r, 1));
    EXPECT_EQ(2, c.stored);  /* page [8,12) holds 3 tokens */
    ASSERT_EQ(MSKV_SUCCESS, mts_step(a, r, 1));
    ASSERT_EQ(3, c.stored);
    EXPECT_EQ(8, c.ev[2].first_token);
    EXPECT_EQ(table[2], c.ev[2].page);
    mskv_arena_destroy(a);
}

TEST(page_removed_events_follow_release_and_remove) {
    mts_events c;
    mskv_request r;
    int32_t table[8], n = 0;
    int k, seen0 = 0, seen1 = 0;
    mskv_arena *a;
    memset(&c, 0, sizeof c);
    a = mts_make_desc(32, 4, mts_on_event, &c);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mts_step(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, table, 8, &n));
    c.n = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 8, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
    EXPECT_EQ(2, c.removed);
    for (k = 0; k < c.n; k++)
        if (c.ev[k].type == MSKV_EVENT_PAGE_REMOVED) {
            if (c.ev[k].page == table[0] && c.ev[k].first_token == 0) seen0 = 1;
            if (c.ev[k].page == table[1] && c.ev[k].first_token == 4) seen1 = 1;
        }
    EXPECT_TRUE(seen0 && seen1);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
    EXPECT_EQ(3, c.removed);
    mskv_arena_destroy(a);
}

/* ---- windowed session ---- */

TEST(windowed_session_keeps_memory_flat_over_a_long_run) {
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan p;
    mskv_plan_desc pd;
    mts_bufs *b = (mts_bufs *)calloc(1, sizeof *b);
    int chunk;
    const int32_t P = 4;
    mskv_arena *a = mts_make(64, P);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&ret, 0, sizeof ret);
    memset(&pd, 0, sizeof pd);
    ret.chunk_size = 12; ret.sink_chunks = 1; ret.window_chunks = 2; ret.exact = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    for (chunk = 0; chunk < 200; chunk++) {
        mskv_request_info i;
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 12));
        mts_bind(&p, b, 8, 512, 256);
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_plan(&ses, &pd, &p));
        EXPECT_EQ(12, p.total_q);
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
        i = mts_info(a, r);
        EXPECT_EQ((int64_t)(chunk + 1) * 12, i.committed);
        EXPECT_EQ(chunk + 1, ses.chunks_done);
        /* sink (3 pages) + window (6 pages); exact eviction leaves no partial page */
        ASSERT_LE(i.num_pages, 3 + 6);
        if (chunk >= 2) {
            EXPECT_EQ(12 + 24, i.kv_len);
            EXPECT_EQ(12, i.prefix_tokens);
            EXPECT_EQ((int64_t)(chunk + 1) * 12 - 36, ses.released_total);
        }
        if (!mtu_audit(a)) break;
    }
    mskv_arena_destroy(a);
    free(b);
}

/* commit_chunk is all or nothing (issue 20, item 7). It used to commit, unlock,
   then publish: another thread that offloaded the request in between (legal
   once the reservation was committed) made publish fail with the chunk
   already committed and the session closed. Now commit and publish run under
   one lock with both calls' checks first, so the other thread's offload can
   only land outside the chunk, and a failed commit_chunk (a removed request
   here) leaves the arena and the session as they were. */
typedef struct mts_racer {
    mskv_arena *a;
    mskv_request r;
    mtu_mutex *m;
    int stop;
    long offloads;
} mts_racer;

static void mts_racer_main(void *arg) {
    mts_racer *x = (mts_racer *)arg;
    int stop = 0;
    while (!stop) {
        if (mskv_request_offload(x->a, x->r) == MSKV_SUCCESS) {
            x->offloads++;
            while (mskv_request_reload(x->a, x->r) != MSKV_SUCCESS) {}
        }
        mtu_mutex_lock(x->m);
        stop = x->stop;
        mtu_mutex_unlock(x->m);
    }
}

TEST(session_commit_chunk_is_all_or_nothing_while_another_thread_offloads) {
    mskv_request r;
    mskv_session ses, was;
    mskv_retention ret;
    mskv_request_info i;
    mts_racer x;
    mtu_thread *th;
    mskv_result e;
    long chunk, commits = 0, broken = 0;
    uint64_t d;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 4; ret.sink_chunks = 1; ret.window_chunks = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    memset(&x, 0, sizeof x);
    x.a = a; x.r = r; x.m = mtu_mutex_new();
    ASSERT_TRUE(x.m != NULL);
    th = mtu_thread_start(mts_racer_main, &x);
    if (!th) { mtu_mutex_free(x.m); mskv_arena_destroy(a); SKIP("no thread"); }
    for (chunk = 0; commits < 300000 && chunk < 6000000 && broken == 0; chunk++) {   /* the old code failed in 6 runs of 6 */
        if ((e = mskv_session_begin_chunk(&ses, 4)) != MSKV_SUCCESS) {
            if (e != MSKV_ERROR_OFFLOADED) broken++;   /* the other thread holds it offloaded: try again */
            continue;
        }
        i = mts_info(a, r);
        was = ses;
        e = mskv_session_commit_chunk(&ses, NULL);
        if (e == MSKV_SUCCESS) { commits++; continue; }
        /* a failure must have changed nothing: report the first and stop */
        broken++;
        EXPECT_EQ(MSKV_SUCCESS, e);
        EXPECT_EQ(i.committed, mts_info(a, r).committed);
        EXPECT_EQ(was.chunk_tokens, ses.chunk_tokens);
        EXPECT_EQ(was.chunks_done, ses.chunks_done);
    }
    mtu_mutex_lock(x.m);
    x.stop = 1;
    mtu_mutex_unlock(x.m);
    mtu_thread_join(th);
    mtu_mutex_free(x.m);
    EXPECT_EQ(0, broken);
    EXPECT_LT(0, commits);
    printf("  %ld chunks committed, %ld offloads between them\n", commits, x.offloads);
    /* a failed commit_chunk changes neither the arena nor the session */
    if (mts_info(a, r).location != MSKV_RESIDENT) ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    d = mskv_arena_digest(a);
    was = ses;
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_session_commit_chunk(&ses, NULL));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(0, memcmp(&was, &ses, sizeof ses));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* A sink of several chunks is kept whole while it is still being filled:
   nothing before the sink's end is released, before or after it is protected. */
TEST(session_never_releases_a_sink_of_several_chunks_while_it_fills) {
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    int chunk;
    const int32_t P = 8;
    mskv_arena *a = mts_make(128, P);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 16; ret.sink_chunks = 3; ret.window_chunks = 1; ret.exact = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    for (chunk = 0; chunk < 8; chunk++) {
        mskv_request_info i;
        int64_t slot, pos;
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 16));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
        i = mts_info(a, r);
        /* every sink token committed so far still has a slot */
        for (pos = 0; pos < 48 && pos < i.committed; pos++)
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, pos, &slot));
        if (chunk < 2) {
            EXPECT_EQ(0, ses.released_total);
            EXPECT_EQ(i.committed, i.kv_len);
        } else {
            EXPECT_EQ(48, i.prefix_tokens);
            EXPECT_EQ(chunk == 2 ? 48 : 48 + 16, i.kv_len);  /* the sink + the last chunk */
        }
        if (!mtu_audit(a)) break;
    }
    mskv_arena_destroy(a);
}

TEST(windowed_session_with_unaligned_chunks_holds_at_most_one_extra_partial_page) {
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    int chunk;
    const int32_t P = 16;
    mskv_arena *a = mts_make(256, P);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 30; ret.sink_chunks = 1; ret.window_chunks = 3;  /* 30 % 16 != 0 */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    for (chunk = 0; chunk < 150; chunk++) {
        mskv_request_info i;
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 30));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
        i = mts_info(a, r);
        ASSERT_LE(i.num_pages, 2 + 6 + 1);  /* ceil(30/16) + ceil(90/16) + 1 */
        if (!mtu_audit(a)) break;
    }
    mskv_arena_destroy(a);
}

TEST(session_abort_chunk_returns_the_chunks_pages) {
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    int32_t free0;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 8; ret.sink_chunks = 1; ret.window_chunks = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    free0 = mts_free_pages(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 8));
    EXPECT_EQ(free0 - 2, mts_free_pages(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_abort_chunk(&ses));
    EXPECT_EQ(free0, mts_free_pages(a));
    EXPECT_EQ(0, ses.chunk_tokens);
    EXPECT_EQ(0, ses.chunks_done);
    EXPECT_EQ(0, mts_info(a, r).committed);
    mskv_arena_destroy(a);
}

TEST(session_rejects_an_invalid_retention_policy) {
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_arena *a = mts_make(64, 16);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 30; ret.sink_chunks = 1; ret.window_chunks = 3; ret.exact = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_session_init(&ses, a, r, &ret));
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_request_set_retention(a, r, &ret));
    mskv_arena_destroy(a);
}

TEST(retention_bound_to_a_request_is_applied_at_publish) {
    mskv_request r;
    mskv_retention ret;
    mskv_segment s;
    mskv_request_info i;
    int k;
    mskv_arena *a = mts_make(64, 4);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 8; ret.sink_chunks = 1; ret.window_chunks = 1; ret.exact = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_set_retention(a, r, &ret));
    s.request = r; s.n_tokens = 8;
    for (k = 0; k < 5; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &s, 1, NULL));
    }
    i = mts_info(a, r);
    EXPECT_EQ(40, i.committed);
    EXPECT_EQ(16, i.kv_len);     /* sink [0,8) + window [32,40) */
    EXPECT_EQ(4, i.num_pages);
    EXPECT_EQ(32, i.live_start);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(windowed_session_in_reset_mode_keeps_only_the_sink_after_each_chunk) {
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    int chunk;
    mskv_arena *a = mts_make(32, 4);
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 8; ret.sink_chunks = 1; ret.window_chunks = 1; ret.reset_at_boundary = 1; ret.exact = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    for (chunk = 0; chunk < 100; chunk++) {
        mskv_request_info i;
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 8));
        EXPECT_EQ(chunk == 0 ? 8 : 16, mts_info(a, r).kv_len);  /* the sink + the open chunk */
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
        i = mts_info(a, r);
        EXPECT_EQ(8, i.kv_len);
        EXPECT_EQ(2, i.num_pages);
        if (chunk > 0) EXPECT_EQ((int64_t)(chunk + 1) * 8, i.live_start);
        if (!mtu_audit(a)) break;
    }
    mskv_arena_destroy(a);
}

/* A sliding window of 0 chunks without reset is the design's eviction function
   with nothing kept after the sink: skipped = (n - sink) snapped down to a
   chunk boundary, the same as reset_at_boundary. It used to be refused
   (INVALID_SPEC); now a session under it keeps what reset mode keeps, step
   for step, on pages that chunks and the sink end inside. */
TEST(window_of_zero_chunks_without_reset_keeps_only_the_sink_like_reset_mode) {
    static const int64_t sizes[] = {6, 3, 3, 6, 2, 4, 1, 5};
    mskv_request r0, r1;
    mskv_session s0, s1;
    mskv_retention zero, reset;
    int chunk;
    mskv_arena *a = mts_make(64, 4), *b = mts_make(64, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&zero, 0, sizeof zero);
    zero.chunk_size = 6; zero.sink_chunks = 1; zero.window_chunks = 0;
    reset = zero;
    reset.reset_at_boundary = 1;
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&zero, 4, NULL, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &r1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&s0, a, r0, &zero));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&s1, b, r1, &reset));
    for (chunk = 0; chunk < 120; chunk++) {
        int64_t n = sizes[chunk % 8], skipped = -1, sink = 6, after;
        mskv_request_info i0, i1;
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&s0, n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&s1, n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&s0, NULL));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&s1, NULL));
        i0 = mts_info(a, r0);
        i1 = mts_info(b, r1);
        /* the design's function, written out */
        after = i0.committed - sink;
        ASSERT_EQ(MSKV_SUCCESS, mskv_skipped_tokens_get(&zero, i0.committed, &skipped));
        EXPECT_EQ(after <= 0 ? 0 : after / 6 * 6, skipped);
        if (i0.committed >= sink) {
            EXPECT_EQ(sink, i0.prefix_tokens);
            if (skipped > 0) EXPECT_EQ(sink + skipped, i0.release_point);   /* exactly the sink stays visible, and the open chunk */
        }
        EXPECT_EQ(i1.committed, i0.committed);
        EXPECT_EQ(i1.kv_len, i0.kv_len);
        EXPECT_EQ(i1.num_pages, i0.num_pages);
        EXPECT_EQ(i1.live_start, i0.live_start);
        EXPECT_EQ(i1.release_point, i0.release_point);
        EXPECT_EQ(s1.released_total, s0.released_total);
        ASSERT_LE(i0.num_pages, 2 + 3);   /* the sink's 2 pages + at most 6 + 5 tokens across pages */
        if (!mtu_audit(a) || !mtu_audit(b)) break;
    }
    EXPECT_LT(0, s0.released_total);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(retention_policy_travels_with_an_exported_request) {
    mskv_request r, y;
    mskv_retention ret;
    mskv_segment s;
    mskv_request_info i;
    size_t size = 0;
    unsigned char *blob;
    mskv_arena *a = mts_make(32, 4), *b = mts_make(32, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 8; ret.sink_chunks = 1; ret.window_chunks = 1; ret.exact = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_set_retention(a, r, &ret));
    ASSERT_EQ(MSKV_SUCCESS, mts_step(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mts_step(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, NULL, 0, &size));
    blob = (unsigned char *)malloc(size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, blob, size, &size));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(b, blob, size, &y));
    free(blob);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(b, y));
    s.request = y; s.n_tokens = 8;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(b, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(b, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(b, &s, 1, NULL));
    i = mts_info(b, y);
    EXPECT_EQ(24, i.committed);
    EXPECT_EQ(16, i.kv_len);  /* sink [0,8) + window [16,24): the imported request still slides */
    EXPECT_EQ(16, i.live_start);
    EXPECT_TRUE(mtu_audit(b));
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(keyed_removal_waits_for_the_fence_like_any_free) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request e;
    mskv_arena_stats st;
    memset(&d, 0, sizeof d);
    d.num_pages = 16; d.page_size = 4; d.retire_mode = MSKV_RETIRE_FENCED;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 5, 10, &e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(3, st.pending_pages);
    EXPECT_EQ(12, st.free_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, mskv_arena_step(a)));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.pending_pages);
    EXPECT_EQ(15, st.free_pages);
    mskv_arena_destroy(a);
}

/* A dense plan, like the paged ones, cannot have more queries than its
   sequence has tokens (queries are the tail of their sequence). */
TEST(dense_plan_refuses_more_queries_than_keys) {
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    mskv_plan_size sz;
    int64_t len = 2;
    mskv_arena *a = mts_make(16, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_DENSE;
    pd.dense_kv_len = &len;
    s.request = r; s.n_tokens = 5;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_plan_query(a, &s, 1, &pd, &sz));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 0, &p));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_plan_build(a, &s, 1, &pd, &p));
    s.n_tokens = 2;
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &pd, &p));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* Only reserved tokens get a slot: re-planning committed tokens (whose full
   pages a fork may share) gives -1, so nothing can write into them. */
TEST(plan_gives_slots_only_to_reserved_tokens) {
    mskv_request r, c;
    mskv_segment s;
    mskv_plan p;
    int32_t j;
    mskv_arena *a = mts_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, r, &c));   /* both pages shared */
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 16, 16, &p));
    s.request = r; s.n_tokens = 6;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, NULL, &p));
    for (j = 0; j < 6; j++) EXPECT_EQ(-1, p.slot_mapping[j]);
    s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    s.n_tokens = 5;                                          /* 2 committed + 3 reserved */
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, NULL, &p));
    EXPECT_EQ(-1, p.slot_mapping[0]);
    EXPECT_EQ(-1, p.slot_mapping[1]);
    for (j = 2; j < 5; j++) {
        int64_t slot = -2;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, 8 + j - 2, &slot));
        EXPECT_EQ(slot, p.slot_mapping[j]);
    }
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}
