/* Requests: handles, fork, protect, release and the compacted page table,
   slot lookup, prefix epochs. */
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* A store of 2 layers x 1 head x 4 dims in f32, so bytes can be checked. */
static mskv_arena *mtr_make(int32_t num_pages, int32_t page_size, int with_store) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    if (with_store) { d.num_layers = 2; d.kv_heads = 1; d.head_dim = 4; d.dtype = MSKV_DTYPE_F32; }
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}



static float mtr_value(uint32_t tag, int64_t pos, int layer, int kind, int d) {
    return (float)((tag * 7919u + (uint32_t)pos * 131u + (uint32_t)layer * 17u + (uint32_t)kind * 7u + (uint32_t)d) & 0xFFFFFu);
}

/* Writes (tag, pos) values for positions [from, to) of a request through its slots. */
static int mtr_write(mskv_arena *a, mskv_request r, uint32_t tag, int64_t from, int64_t to) {
    int64_t pos, slot;
    int layer, kind, d;
    for (pos = from; pos < to; pos++) {
        if (mskv_request_slot(a, r, pos, &slot) != MSKV_SUCCESS) return 0;
        for (layer = 0; layer < 2; layer++)
            for (kind = 0; kind < 2; kind++) {
                float *p = (float *)mskv_store_pool(a, layer, kind);
                if (!p) return 0;
                for (d = 0; d < 4; d++) p[slot * 4 + d] = mtr_value(tag, pos, layer, kind, d);
            }
    }
    return 1;
}

/* Number of positions in [from, to) whose bytes differ from (tag, pos). */
static int64_t mtr_check(mskv_arena *a, mskv_request r, uint32_t tag, int64_t from, int64_t to) {
    int64_t pos, slot, bad = 0;
    int layer, kind, d;
    for (pos = from; pos < to; pos++) {
        if (mskv_request_slot(a, r, pos, &slot) != MSKV_SUCCESS) { bad++; continue; }
        for (layer = 0; layer < 2; layer++)
            for (kind = 0; kind < 2; kind++) {
                const float *p = (const float *)mskv_store_pool(a, layer, kind);
                for (d = 0; d < 4; d++)
                    if (!p || p[slot * 4 + d] != mtr_value(tag, pos, layer, kind, d)) { bad++; d = 4; layer = kind = 2; }
            }
    }
    return bad;
}

static mskv_request_info mtr_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.num_pages = -1;
    return i;
}

TEST(removed_request_handle_is_stale) {
    mskv_request r, r2;
    mskv_request_info info;
    mskv_arena *a = mtr_make(16, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, r, &info));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_remove(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r2));  /* may reuse the slot, never the handle */
    EXPECT_NE(r.id, r2.id);
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mtu_grow(a, r, 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, r2, &info));
    mskv_arena_destroy(a);
}

TEST(new_request_is_empty_and_resident) {
    mskv_request r;
    mskv_request_info i;
    mskv_arena *a = mtr_make(16, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    i = mtr_info(a, r);
    EXPECT_EQ(0, i.committed);
    EXPECT_EQ(0, i.reserved);
    EXPECT_EQ(0, i.has_reservation);
    EXPECT_EQ(0, i.prefix_tokens);
    EXPECT_EQ(0, i.num_pages);
    EXPECT_EQ(0, i.kv_len);
    EXPECT_EQ(MSKV_RESIDENT, i.location);
    EXPECT_EQ(0, i.keyed);
    mskv_arena_destroy(a);
}

TEST(fork_shares_full_pages_and_copies_the_partial_last_page) {
    mskv_request p, c;
    int32_t pp[8], cp[8], np = 0, nc = 0, i;
    mskv_arena_stats s0, s1;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 10));  /* pages: 4 + 4 + 2 */
    ASSERT_TRUE(mtr_write(a, p, 1, 0, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, p, &c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s1));
    EXPECT_EQ(s0.live_pages + 1, s1.live_pages);  /* only the partial page is new */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, p, pp, 8, &np));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, c, cp, 8, &nc));
    ASSERT_EQ(3, np);
    ASSERT_EQ(3, nc);
    for (i = 0; i < 2; i++) EXPECT_EQ(pp[i], cp[i]);
    EXPECT_NE(pp[2], cp[2]);
    EXPECT_EQ(10, mtr_info(a, c).committed);
    EXPECT_EQ(0, mtr_check(a, c, 1, 0, 10));  /* the copied page holds the parent's bytes */
    /* each side now writes its own continuation without disturbing the other */
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, c, 3));
    ASSERT_TRUE(mtr_write(a, c, 2, 10, 13));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 3));
    ASSERT_TRUE(mtr_write(a, p, 3, 10, 13));
    EXPECT_EQ(0, mtr_check(a, c, 2, 10, 13));
    EXPECT_EQ(0, mtr_check(a, p, 3, 10, 13));
    EXPECT_EQ(0, mtr_check(a, c, 1, 0, 10));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(fork_of_a_page_aligned_request_shares_every_page) {
    mskv_request p, c;
    int32_t pp[8], cp[8], np = 0, nc = 0, i;
    mskv_arena_stats s0, s1;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 12));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, p, &c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s1));
    EXPECT_EQ(s0.live_pages, s1.live_pages);
    EXPECT_EQ(s0.free_pages, s1.free_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, p, pp, 8, &np));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, c, cp, 8, &nc));
    ASSERT_EQ(np, nc);
    for (i = 0; i < np; i++) EXPECT_EQ(pp[i], cp[i]);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(shared_pages_live_until_the_last_owner_drops_them) {
    mskv_request p, c;
    mskv_arena_stats st;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 8));
    ASSERT_TRUE(mtr_write(a, p, 5, 0, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, p, &c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(2, st.live_pages);
    EXPECT_EQ(0, mtr_check(a, c, 5, 0, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.live_pages);
    EXPECT_EQ(31, st.free_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(fork_needs_a_resident_parent_without_reservation) {
    mskv_request p, c;
    mskv_segment s;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 5));
    s.request = p; s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_RESERVATION_PENDING, mskv_request_fork(a, p, &c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, p));
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_request_fork(a, p, &c));
    mskv_arena_destroy(a);
}

TEST(release_frees_whole_pages_only) {
    mskv_request r;
    int64_t released = -1;
    mskv_request_info i;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 3, &released));
    EXPECT_EQ(0, released);  /* page 0 still holds tokens 3 */
    i = mtr_info(a, r);
    EXPECT_EQ(3, i.num_pages);
    EXPECT_EQ(0, i.live_start);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 6, &released));
    EXPECT_EQ(8, released);  /* release point 3 + 6 = 9: pages [0,4) and [4,8) */
    i = mtr_info(a, r);
    EXPECT_EQ(1, i.num_pages);
    EXPECT_EQ(8, i.live_start);
    EXPECT_EQ(2, i.kv_len);
    EXPECT_EQ(10, i.committed);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* Each release hides the n oldest tokens still visible, counting on from
   the previous release point, so repeated small releases add up (they used
   to count from the page-level live_start: twelve release_oldest(1) freed
   nothing); pages go once they lie wholly behind the point. */
TEST(repeated_small_releases_move_the_window_and_free_whole_pages) {
    mskv_request r, s;
    mskv_arena_stats st0, st;
    mskv_request_info i;
    mskv_plan p;
    mskv_plan_desc d;
    mskv_segment seg;
    int64_t released = -1, total = 0, slot = 0;
    uint64_t digest;
    int k;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 20));
    ASSERT_TRUE(mtr_write(a, r, 3, 0, 20));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st0));
    for (k = 1; k <= 12; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 1, &released));
        total += released;
        i = mtr_info(a, r);
        EXPECT_EQ(k, i.release_point);
        EXPECT_EQ((k / 4) * 4, i.live_start);          /* the page floor of the point */
        EXPECT_EQ((k / 4) * 4, total);
        if (k >= 4) EXPECT_EQ(MSKV_ERROR_RELEASED, mskv_request_slot(a, r, (k / 4) * 4 - 1, &slot));
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, (k / 4) * 4, &slot));   /* a kept page */
    }
    EXPECT_EQ(12, total);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(st0.free_pages + 3, st.free_pages);        /* pages [0,4), [4,8), [8,12) */
    i = mtr_info(a, r);
    EXPECT_EQ(2, i.num_pages);
    EXPECT_EQ(8, i.kv_len);
    EXPECT_EQ(0, mtr_check(a, r, 3, 12, 20));          /* the kept tokens keep their bytes */
    /* an exact plan shows exactly the eight kept: the twelve left with their
       pages, so it needs no bounds (the canonical (0, 0)) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 4, 8, &p));
    memset(&d, 0, sizeof d);
    d.visibility = MSKV_VIS_EXACT;
    seg.request = r; seg.n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &d, &p));
    EXPECT_EQ(0, p.vis_window_start[0]);
    EXPECT_EQ(0u, p.features & MSKV_PLAN_VISIBILITY);
    EXPECT_EQ(8, p.kv_len[0]);
    EXPECT_EQ(12, p.kv_pos_shift[0]);                   /* key j sits at 12 + j */
    mskv_plan_free(a, &p);
    /* eight still visible: nine is past them, and a refusal changes nothing */
    digest = mskv_arena_digest(a);
    released = -1;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest(a, r, 9, &released));
    EXPECT_EQ(-1, released);
    EXPECT_EQ_U64(digest, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 0, &released));
    EXPECT_EQ(0, released);
    EXPECT_EQ(12, mtr_info(a, r).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 8, &released));
    EXPECT_EQ(8, released);
    i = mtr_info(a, r);
    EXPECT_EQ(20, i.live_start);
    EXPECT_EQ(0, i.kv_len);
    /* behind a prefix that ends inside a page: counting starts at live_start */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &s));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, s, 20));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, s, 2));   /* prefix page [0, 4) */
    for (k = 1; k <= 12; k++) ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, s, 1, NULL));
    i = mtr_info(a, s);
    EXPECT_EQ(16, i.release_point);
    EXPECT_EQ(16, i.live_start);
    EXPECT_EQ(1, i.prefix_pages);
    EXPECT_EQ(4 + 4, i.kv_len);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(release_never_frees_a_page_holding_a_reserved_token) {
    mskv_request r;
    mskv_segment s;
    int64_t released = -1;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));
    s.request = r; s.n_tokens = 5;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest(a, r, 7, &released));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 6, &released));
    EXPECT_EQ(4, released);
    EXPECT_EQ(2, mtr_info(a, r).num_pages);  /* [4,8) and [8,12) */
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(release_compacts_the_table_to_prefix_pages_then_live_pages) {
    mskv_request r;
    int32_t before[8], after[8], nb = 0, na = 0;
    int64_t released = 0;
    mskv_request_info i;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 22));  /* 6 pages, the last holds 2 */
    ASSERT_TRUE(mtr_write(a, r, 9, 0, 22));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 5));  /* touches pages 0 and 1 */
    i = mtr_info(a, r);
    EXPECT_EQ(2, i.prefix_pages);
    EXPECT_EQ(8, i.live_start);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, before, 8, &nb));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 10, &released));  /* point 18 */
    EXPECT_EQ(8, released);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, after, 8, &na));
    ASSERT_EQ(4, na);
    EXPECT_EQ(before[0], after[0]);
    EXPECT_EQ(before[1], after[1]);
    EXPECT_EQ(before[4], after[2]);
    EXPECT_EQ(before[5], after[3]);
    i = mtr_info(a, r);
    EXPECT_EQ(16, i.live_start);
    EXPECT_EQ(8 + 6, i.kv_len);
    EXPECT_EQ(5, i.prefix_tokens);
    /* absolute positions survive: prefix and live tokens keep their bytes */
    EXPECT_EQ(0, mtr_check(a, r, 9, 0, 8));
    EXPECT_EQ(0, mtr_check(a, r, 9, 16, 22));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(prefix_pages_survive_every_release) {
    mskv_request r;
    int64_t released = 0;
    mskv_request_info i;
    mskv_arena *a = mtr_make(32, 4, 1);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));
    ASSERT_TRUE(mtr_write(a, r, 4, 0, 6));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 6));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 14));
    ASSERT_TRUE(mtr_write(a, r, 4, 6, 20));
    i = mtr_info(a, r);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 20 - i.live_start, &released));
    i = mtr_info(a, r);
    EXPECT_EQ(2, i.prefix_pages);
    EXPECT_EQ(2, i.num_pages);
    EXPECT_EQ(20, i.live_start);
    EXPECT_EQ(8, i.kv_len);
    EXPECT_EQ(0, mtr_check(a, r, 4, 0, 8));  /* 6 and 7 are unprotected but share a protected page */
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(slot_is_page_times_page_size_plus_offset) {
    mskv_request r;
    int32_t pages[16], n = 0;
    int64_t pos, slot;
    mskv_arena *a = mtr_make(32, 5, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 23));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, pages, 16, &n));
    ASSERT_EQ(5, n);
    for (pos = 0; pos < 23; pos++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, pos, &slot));
        EXPECT_EQ((int64_t)pages[pos / 5] * 5 + pos % 5, slot);
    }
    mskv_arena_destroy(a);
}

TEST(slot_of_a_released_position_is_RELEASED_and_past_the_end_NOT_WRITTEN) {
    mskv_request r;
    mskv_segment s;
    int64_t slot = -7;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 13));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 9, NULL));
    EXPECT_EQ(MSKV_ERROR_RELEASED, mskv_request_slot(a, r, 0, &slot));
    EXPECT_EQ(MSKV_ERROR_RELEASED, mskv_request_slot(a, r, 7, &slot));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, 8, &slot));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, 12, &slot));
    EXPECT_EQ(MSKV_ERROR_NOT_WRITTEN, mskv_request_slot(a, r, 13, &slot));
    s.request = r; s.n_tokens = 2;  /* reserved positions have slots too */
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, 14, &slot));
    EXPECT_EQ(MSKV_ERROR_NOT_WRITTEN, mskv_request_slot(a, r, 15, &slot));
    mskv_arena_destroy(a);
}

TEST(protect_beyond_committed_tokens_is_OUT_OF_RANGE) {
    mskv_request r;
    mskv_segment s;
    uint64_t d;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 7));
    s.request = r; s.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_request_protect_prefix(a, r, 8));  /* reserved, not committed */
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 7));
    mskv_arena_destroy(a);
}

TEST(prefix_epoch_moves_on_protect_with_a_new_length_only) {
    mskv_request r;
    uint64_t e0, e1, e2;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 12));
    e0 = mtr_info(a, r).prefix_epoch;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 6));
    e1 = mtr_info(a, r).prefix_epoch;
    EXPECT_NE_U64(e0, e1);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 6));  /* same length */
    EXPECT_EQ_U64(e1, mtr_info(a, r).prefix_epoch);
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
    EXPECT_EQ_U64(e1, mtr_info(a, r).prefix_epoch);  /* growth, release, publish: same prefix */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 7));
    e2 = mtr_info(a, r).prefix_epoch;
    EXPECT_NE_U64(e1, e2);
    EXPECT_NE_U64(e0, e2);
    mskv_arena_destroy(a);
}

TEST(protect_after_a_release_must_keep_the_same_prefix_pages) {
    mskv_request r;
    uint64_t d;
    mskv_result e;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 20));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 8, NULL));  /* frees [4,12) */
    d = mskv_arena_digest(a);
    e = mskv_request_protect_prefix(a, r, 9);  /* would need the released pages back */
    EXPECT_TRUE(e != MSKV_SUCCESS);
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 3));  /* same single prefix page */
    EXPECT_EQ(1, mtr_info(a, r).prefix_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(page_table_query_reports_the_count_when_the_buffer_is_short) {
    mskv_request r;
    int32_t pages[2], count = 0;
    mskv_arena *a = mtr_make(32, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 13));
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_request_pages(a, r, pages, 2, &count));
    EXPECT_EQ(4, count);
    mskv_arena_destroy(a);
}

TEST(remove_returns_every_page) {
    mskv_request r[3];
    mskv_arena_stats st;
    int i;
    mskv_arena *a = mtr_make(40, 3, 0);
    ASSERT_TRUE(a != NULL);
    for (i = 0; i < 3; i++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[i]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[i], 5 + 4 * i));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r[2], 4));
    for (i = 0; i < 3; i++) ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r[i]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(39, st.free_pages);
    EXPECT_EQ(0, st.live_pages);
    EXPECT_EQ(0, st.protected_pages);
    EXPECT_EQ(0, st.requests);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(protected_pages_are_counted_in_stats) {
    mskv_request r;
    mskv_arena_stats st;
    mskv_arena *a = mtr_make(40, 4, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 20));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 9));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(3, st.protected_pages);
    EXPECT_EQ(5, st.live_pages);
    mskv_arena_destroy(a);
}

/* ---- pause / resume ---- */

TEST(paused_request_keeps_its_pages_but_is_not_admitted_until_resumed) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_segment s;
    mskv_request_info i;
    int32_t before[8], after[8], nb = 0, na = 0;
    memset(&d, 0, sizeof d);
    d.num_pages = 16; d.page_size = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, before, 8, &nb));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pause(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, r, &i));
    EXPECT_EQ(1, i.paused);
    s.request = r; s.n_tokens = 2;
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_pause(a, r));
    /* parked, it can still be offloaded and brought back */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_resume(a, r));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_resume(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, after, 8, &na));
    EXPECT_EQ(nb, na);
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_RESERVATION_PENDING, mskv_request_pause(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, r, &i));
    EXPECT_EQ(12, i.committed);
    EXPECT_EQ(0, i.paused);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}
