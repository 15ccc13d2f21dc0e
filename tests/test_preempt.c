/* Preemption under a page budget: mskv_make_room parks idle requests, least
   recently admitted first (an admit count, not a clock), within a host byte
   budget, all or nothing; reload brings them back. mskv_arena_reset drops
   every request and returns every page; mskv_arena_flush waits for every
   fence so that every pending page is free. The audit runs after each. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* One layer, one head of 4 f32: a page record (K and V) is 2 * page_size * 16 bytes. */
static mskv_arena *mtp_make(int32_t num_pages, int32_t page_size, mskv_retire_mode mode) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size; d.retire_mode = mode;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4; d.dtype = MSKV_DTYPE_F32;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}
static uint64_t mtp_record(mskv_arena *a) {
    mskv_store_info si;
    return mskv_store_info_get(a, &si) == MSKV_SUCCESS ? (uint64_t)si.page_bytes * 2u * (uint64_t)si.num_layers : 0;
}

static mskv_request_info mtp_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.num_pages = -1;
    return i;
}
static int32_t mtp_free(mskv_arena *a) {
    mskv_arena_stats st;
    return mskv_arena_stats_get(a, &st) == MSKV_SUCCESS ? st.free_pages : -1;
}

/* A byte per (tag, position) in the host pool: parked requests come back exact. */
static int64_t mtp_bytes(mskv_arena *a, mskv_request r, uint32_t tag, int64_t to, int check) {
    mskv_store_info si;
    int64_t pos, slot, bad = 0;
    int kind;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return -1;
    for (pos = 0; pos < to; pos++) {
        if (mskv_request_slot(a, r, pos, &slot) != MSKV_SUCCESS) { bad++; continue; }
        for (kind = 0; kind < 2; kind++) {
            unsigned char *p = (unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)slot * si.slot_bytes;
            for (i = 0; i < si.slot_bytes; i++) {
                unsigned char want = (unsigned char)(tag * 29u + (uint32_t)pos * 13u + (uint32_t)i + (uint32_t)kind * 101u);
                if (!check) p[i] = want;
                else if (p[i] != want) { bad++; break; }
            }
        }
    }
    return bad;
}

/* n requests of pages[i] full pages each (page size 4), admitted in index
   order, one step each: request 0 is the least recently admitted. */
static int mtp_requests(mskv_arena *a, mskv_request *r, const int *pages, int n) {
    int i;
    for (i = 0; i < n; i++) {
        if (mskv_request_add(a, &r[i]) != MSKV_SUCCESS || mtu_grow(a, r[i], 4 * pages[i]) != MSKV_SUCCESS) return 0;
        if (mtp_bytes(a, r[i], (uint32_t)i + 1, 4 * pages[i], 0) != 0) return 0;
        if (mskv_publish(a, NULL, 0, NULL) != MSKV_SUCCESS) return 0;
    }
    return 1;
}

TEST(last_admitted_follows_the_admit_count_not_a_clock) {
    mskv_arena *a = mtp_make(32, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request x, y;
    mskv_segment s[2];
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &x));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &y));
    EXPECT_EQ(0, (long long)mtp_info(a, x).last_admitted);   /* never admitted */
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, x, 4));
    EXPECT_EQ(1, (long long)mtp_info(a, x).last_admitted);
    s[0].request = x; s[0].n_tokens = 1;
    s[1].request = y; s[1].n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, s, 2));                 /* one admit: one count for the batch */
    EXPECT_EQ(2, (long long)mtp_info(a, x).last_admitted);
    EXPECT_EQ(2, (long long)mtp_info(a, y).last_admitted);
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, s, 2));
    s[0].n_tokens = 1000;                                         /* a failed admit counts nothing */
    ASSERT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(a, s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, y, 1));
    EXPECT_EQ(2, (long long)mtp_info(a, x).last_admitted);
    EXPECT_EQ(3, (long long)mtp_info(a, y).last_admitted);
    mskv_arena_destroy(a);
}

TEST(make_room_parks_the_least_recently_admitted_idle_requests_first) {
    static const int pages[4] = { 2, 2, 2, 2 };
    mskv_arena *a = mtp_make(1 + 8 + 2, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r[4], parked[4];
    mskv_segment seg;
    int32_t n = -1;
    int64_t need = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_requests(a, r, pages, 4));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[0], 0));           /* r0 admitted again: now r1 is the oldest */
    seg.request = r[3]; seg.n_tokens = 16;                   /* 4 more pages, 2 free */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit_query(a, &seg, 1, &need));
    EXPECT_EQ(4, need);
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, need, UINT64_MAX, &seg, 1, parked, 4, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(r[1].id, parked[0].id);
    EXPECT_EQ(MSKV_OFFLOADED, mtp_info(a, r[1]).location);
    EXPECT_EQ(4, mtp_free(a));
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    EXPECT_TRUE(mtu_audit(a));
    /* one more step's worth: r2, then r0 (admitted after r2 by the extra admit) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &seg, 1));
    seg.n_tokens = 16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit_query(a, &seg, 1, &need));
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, need, UINT64_MAX, &seg, 1, parked, 4, &n));
    ASSERT_EQ(2, n);
    EXPECT_EQ(r[2].id, parked[0].id);
    EXPECT_EQ(r[0].id, parked[1].id);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(make_room_never_parks_a_request_of_the_current_batch) {
    static const int pages[3] = { 2, 2, 2 };
    mskv_arena *a = mtp_make(1 + 6 + 1, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r[3], parked[3];
    mskv_segment batch[2];
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_requests(a, r, pages, 3));
    batch[0].request = r[2]; batch[0].n_tokens = 4;
    batch[1].request = r[0]; batch[1].n_tokens = 4;   /* the oldest is in the batch */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 3, UINT64_MAX, batch, 2, parked, 3, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(r[1].id, parked[0].id);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, r[0]).location);
    EXPECT_TRUE(mtu_audit(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_admit(a, batch, 2));
    mskv_arena_destroy(a);
}

TEST(make_room_passes_over_paused_keyed_reserved_and_offloaded_requests) {
    static const int pages[4] = { 1, 1, 1, 1 };
    mskv_arena *a = mtp_make(1 + 4 + 1 + 1, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r[4], parked[4], e;
    mskv_segment s;
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 9, 4, &e));     /* the oldest of all, never admitted */
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, e));
    ASSERT_TRUE(mtp_requests(a, r, pages, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pause(a, r[0]));          /* its scheduler parked it in place */
    s.request = r[1]; s.n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));                 /* in flight */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r[2]));        /* already parked */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 2, UINT64_MAX, NULL, 0, parked, 4, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(r[3].id, parked[0].id);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(a, 3, UINT64_MAX, NULL, 0, parked, 4, &n));   /* nobody else may go */
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, r[0]).location);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, e).location);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(make_room_respects_the_host_budget_exactly) {
    static const int pages[3] = { 3, 1, 3 };
    mskv_arena *a = mtp_make(1 + 7, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r[3], parked[3];
    mskv_arena_stats st;
    int32_t n = 0;
    uint64_t rec, d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_requests(a, r, pages, 3));
    rec = mtp_record(a);
    ASSERT_GT((long long)rec, 0);
    /* 3 pages: r0's copy is 3 records; one byte less and r0 is passed over,
       r1 (1 record) is not enough, r2 (3 records) does not fit what is left */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(a, 3, 3 * rec - 1, NULL, 0, parked, 3, &n));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 3, 3 * rec, NULL, 0, parked, 3, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(r[0].id, parked[0].id);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(3, st.offloaded_pages);   /* 3 records: the whole budget */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r[0]));
    /* r0 admitted again, so r1 then r2 come first: 4 pages in 1 + 3 records of a 4-record budget */
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r[0], 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 4, 4 * rec, NULL, 0, parked, 3, &n));
    ASSERT_EQ(2, n);
    EXPECT_EQ(r[1].id, parked[0].id);
    EXPECT_EQ(r[2].id, parked[1].id);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(4, st.offloaded_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(make_room_is_all_or_nothing_when_the_idle_requests_cannot_free_enough) {
    static const int pages[3] = { 2, 2, 2 };
    mskv_arena *a = mtp_make(1 + 6 + 1, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r[3], parked[3];
    mskv_segment batch;
    int32_t n = -1;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_requests(a, r, pages, 3));
    batch.request = r[2]; batch.n_tokens = 24;   /* 6 pages: r0 and r1 give 4, plus 1 free */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(a, 6, UINT64_MAX, &batch, 1, parked, 3, &n));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(-1, n);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, r[0]).location);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, r[1]).location);
    EXPECT_TRUE(mtu_audit(a));
    /* too small an output array: the count, and nothing parked */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_make_room(a, 5, UINT64_MAX, &batch, 1, parked, 1, &n));
    EXPECT_EQ(2, n);
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

static int mtp_fail_at, mtp_allocs;
static void *mtp_alloc(void *u, size_t n) { (void)u; return ++mtp_allocs == mtp_fail_at ? NULL : malloc(n); }
static void *mtp_realloc(void *u, void *p, size_t n) { (void)u; return realloc(p, n); }
static void mtp_freefn(void *u, void *p) { (void)u; free(p); }

TEST(make_room_copies_every_parked_request_before_freeing_any_page) {
    static const int pages[3] = { 2, 2, 2 };
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r[3], parked[3];
    int32_t n = 0, i;
    uint64_t dg;
    memset(&d, 0, sizeof d);
    d.num_pages = 1 + 6; d.page_size = 4;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4;
    d.host_allocator.alloc = mtp_alloc; d.host_allocator.realloc = mtp_realloc; d.host_allocator.free = mtp_freefn;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_TRUE(mtp_requests(a, r, pages, 3));
    mtp_allocs = 0;
    mtp_fail_at = 2;               /* the second request's host copy */
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, mskv_make_room(a, 4, UINT64_MAX, NULL, 0, parked, 3, &n));
    EXPECT_EQ_U64(dg, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    mtp_fail_at = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 4, UINT64_MAX, NULL, 0, parked, 3, &n));
    ASSERT_EQ(2, n);
    /* reload brings them back, byte-exact, possibly on other pages */
    memset(mskv_store_pool(a, 0, 0), 0, 7 * 4 * 16);
    memset(mskv_store_pool(a, 0, 1), 0, 7 * 4 * 16);
    for (i = 0; i < 2; i++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, parked[i]));
        EXPECT_EQ(0, mtp_bytes(a, r[i], (uint32_t)i + 1, 8, 1));
    }
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* The same calls park the same requests: two arenas driven alike agree on
   every choice and end in the same state. */
TEST(make_room_is_deterministic) {
    mskv_arena *x = mtp_make(1 + 20, 4, MSKV_RETIRE_IMMEDIATE), *y = mtp_make(1 + 20, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_arena *ab[2];
    mskv_request r[2][6], parked[2][6];
    int32_t n[2] = { 0, 0 }, k, i, j, parks = 0;
    uint64_t seed = mt_seed(), s = seed | 1;
    ASSERT_TRUE(x != NULL && y != NULL);
    ab[0] = x; ab[1] = y;
    for (j = 0; j < 2; j++)
        for (i = 0; i < 6; i++) ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(ab[j], &r[j][i]));
    for (k = 0; k < 200; k++) {
        int32_t pick, len;
        mskv_result e[2];
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        pick = (int32_t)(s % 6);
        len = (int32_t)((s >> 8) % 9);
        for (j = 0; j < 2; j++) {
            mskv_segment seg;
            int64_t need = 0;
            seg.request = r[j][pick]; seg.n_tokens = len;
            if (mtp_info(ab[j], r[j][pick]).location == MSKV_OFFLOADED &&
                mskv_make_room(ab[j], mtp_info(ab[j], r[j][pick]).num_pages, UINT64_MAX, NULL, 0, parked[j], 6, &n[j]) == MSKV_SUCCESS)
                (void)mskv_request_reload(ab[j], r[j][pick]);
            e[j] = mskv_admit_query(ab[j], &seg, 1, &need);
            if (e[j] == MSKV_SUCCESS) e[j] = mskv_make_room(ab[j], need, (s >> 20) % 2 ? UINT64_MAX : 8 * mtp_record(x), &seg, 1, parked[j], 6, &n[j]);
            if (e[j] == MSKV_SUCCESS) e[j] = mtu_grow(ab[j], r[j][pick], len);
            if ((s >> 30) % 5 == 0) (void)mskv_request_release_oldest(ab[j], r[j][pick], mtp_info(ab[j], r[j][pick]).committed / 2, NULL);
        }
        ASSERT_EQ(e[0], e[1]);
        ASSERT_EQ(n[0], n[1]);
        if (e[0] == MSKV_SUCCESS) parks += n[0];
        for (i = 0; e[0] == MSKV_SUCCESS && i < n[0]; i++) ASSERT_EQ(parked[0][i].id, parked[1][i].id);
        if (!mtu_audit(x)) break;
    }
    EXPECT_EQ_U64(mskv_arena_digest(x), mskv_arena_digest(y));
    EXPECT_GT(parks, 0);   /* the workload did need room */
    printf("  seed %llu: 200 steps, %d requests parked, the same ones in both arenas\n", (unsigned long long)seed, (int)parks);
    mskv_arena_destroy(x);
    mskv_arena_destroy(y);
}

TEST(make_room_parks_a_lockstep_group_whole_or_not_at_all) {
    mskv_arena *a = mtp_make(1 + 6 + 1, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request br[2], solo, parked[3];
    mskv_lockstep ls;
    mskv_segment segs[2];
    int32_t n = 0;
    uint64_t rec;
    ASSERT_TRUE(a != NULL);
    rec = mtp_record(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &br[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &br[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(a, br, 2, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 8, segs, 2, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, segs, n));             /* the group: 4 pages, admitted first */
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, segs, n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &solo));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, solo, 8));               /* 2 pages, admitted later */
    /* 2 pages would do, but the oldest candidate is the group: both branches go */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 3, UINT64_MAX, NULL, 0, parked, 3, &n));
    ASSERT_EQ(2, n);
    EXPECT_EQ(br[0].id, parked[0].id);
    EXPECT_EQ(br[1].id, parked[1].id);
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    /* a budget for one branch is no budget for the group: it is passed over whole */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 3, 3 * rec, NULL, 0, parked, 3, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(solo.id, parked[0].id);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, br[0]).location);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, br[1]).location);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(make_room_counts_a_shared_page_only_when_every_owner_is_parked) {
    mskv_arena *a = mtp_make(1 + 5, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request p, c, parked[2];
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 8));        /* 2 full pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, p, &c));   /* shares both */
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, c, 4));        /* the child admitted later, 1 page of its own */
    /* parking the parent alone frees nothing (the child holds its pages): passed over */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 3, UINT64_MAX, NULL, 0, parked, 2, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(c.id, parked[0].id);
    EXPECT_EQ(MSKV_RESIDENT, mtp_info(a, p).location);
    EXPECT_EQ(3, mtp_free(a));
    EXPECT_TRUE(mtu_audit(a));
    /* now the parent is the last owner of its pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 5, UINT64_MAX, NULL, 0, parked, 2, &n));
    ASSERT_EQ(1, n);
    EXPECT_EQ(p.id, parked[0].id);
    EXPECT_EQ(5, mtp_free(a));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(make_room_in_fenced_mode_counts_pending_pages_and_flush_frees_them) {
    static const int pages[2] = { 2, 2 };
    mskv_arena *a = mtp_make(1 + 4 + 1, 4, MSKV_RETIRE_FENCED);
    mskv_request r[2], parked[2];
    mskv_segment seg;
    mskv_arena_stats st;
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_requests(a, r, pages, 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, mskv_arena_step(a) - 1));
    seg.request = r[1]; seg.n_tokens = 12;   /* 3 pages, 1 free */
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 3, UINT64_MAX, &seg, 1, parked, 2, &n));
    ASSERT_EQ(1, n);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(2, st.pending_pages);          /* a kernel may still read them */
    EXPECT_EQ(1, st.free_pages);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_flush(a));
    EXPECT_TRUE(mtu_audit(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(reset_drops_every_request_and_returns_every_page) {
    mskv_arena *a = mtp_make(1 + 12, 4, MSKV_RETIRE_IMMEDIATE), *fresh = mtp_make(1 + 12, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r, off, e, res, br[2], again, fr;
    mskv_lockstep ls;
    mskv_segment seg;
    mskv_arena_stats st;
    mskv_request_info info;
    int32_t p1[4], p2[4], n1 = 0, n2 = 0, i;
    uint64_t step;
    ASSERT_TRUE(a != NULL && fresh != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 9));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &off));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, off, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, off));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 3, 4, &e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &res));
    seg.request = res; seg.n_tokens = 5;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &br[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &br[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(a, br, 2, &ls));
    step = mskv_arena_step(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_reset(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.requests);
    EXPECT_EQ(12, st.free_pages);
    EXPECT_EQ(0, st.live_pages);
    EXPECT_EQ(0, st.offloaded_pages);
    EXPECT_EQ_U64(step, st.step);            /* fences keep counting */
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, r, &info));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, off, &info));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, res, &info));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(a, ls));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(a, 3, &e));
    EXPECT_TRUE(mtu_audit(a));
    /* the same calls hand out the same page ids as in a new arena */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &again));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, again, 13));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(fresh, &fr));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(fresh, fr, 13));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, again, p1, 4, &n1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(fresh, fr, p2, 4, &n2));
    ASSERT_EQ(n2, n1);
    for (i = 0; i < n1; i++) EXPECT_EQ(p2[i], p1[i]);
    EXPECT_EQ(fr.id & 0xFFFFu, again.id & 0xFFFFu);   /* the same slot, a newer generation */
    EXPECT_NE(fr.id, again.id);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
    mskv_arena_destroy(fresh);
}

TEST(reset_in_fenced_mode_leaves_every_freed_page_pending_until_its_fence) {
    mskv_arena *a = mtp_make(1 + 8, 4, MSKV_RETIRE_FENCED);
    mskv_request r, s;
    mskv_arena_stats st;
    uint64_t fence;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 12));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &s));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, s, 4));
    fence = mskv_arena_step(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_reset(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(4, st.pending_pages);          /* a kernel of this step may still read them */
    EXPECT_EQ(4, st.free_pages);
    EXPECT_EQ(0, st.requests);
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_retire(a, fence));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.pending_pages);
    EXPECT_EQ(8, st.free_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(flush_makes_every_pending_page_free_whatever_its_fence) {
    mskv_arena *a = mtp_make(1 + 8, 4, MSKV_RETIRE_FENCED);
    mskv_request r, s;
    mskv_arena_stats st;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 12));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &s));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, s, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 8, NULL));   /* pending on this fence */
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, s));                    /* and on the next */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(4, st.pending_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_flush(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.pending_pages);
    EXPECT_EQ(7, st.free_pages);
    EXPECT_EQ_U64(st.step, st.completed_step);
    EXPECT_TRUE(mtu_audit(a));
    /* nothing pending: a flush is harmless */
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_flush(a));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

typedef struct mtp_store { unsigned char dev[16][128]; int flushes; mskv_result flush_result; } mtp_store;
static mskv_result mtp_read(void *u, const int32_t *p, int32_t n, void *dst) {
    mtp_store *s = (mtp_store *)u;
    int32_t i;
    for (i = 0; i < n; i++) memcpy((unsigned char *)dst + (size_t)i * 128, s->dev[p[i]], 128);
    return MSKV_SUCCESS;
}
static mskv_result mtp_write(void *u, const int32_t *p, int32_t n, const void *src) {
    mtp_store *s = (mtp_store *)u;
    int32_t i;
    for (i = 0; i < n; i++) memcpy(s->dev[p[i]], (const unsigned char *)src + (size_t)i * 128, 128);
    return MSKV_SUCCESS;
}
static mskv_result mtp_copy(void *u, int32_t from, int32_t to) { mtp_store *s = (mtp_store *)u; memcpy(s->dev[to], s->dev[from], 128); return MSKV_SUCCESS; }
static mskv_result mtp_flush(void *u) { mtp_store *s = (mtp_store *)u; s->flushes++; return s->flush_result; }

TEST(flush_waits_through_the_store_and_changes_nothing_when_the_store_fails) {
    static mtp_store st;
    mskv_store_ops ops;
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_arena_stats s;
    uint64_t dg;
    memset(&st, 0, sizeof st);
    memset(&ops, 0, sizeof ops);
    ops.user = &st; ops.read_pages = mtp_read; ops.write_pages = mtp_write; ops.copy_page = mtp_copy; ops.flush = mtp_flush;
    memset(&d, 0, sizeof d);
    d.num_pages = 16; d.page_size = 4; d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4;
    d.store_ops = &ops; d.retire_mode = MSKV_RETIRE_FENCED;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 12));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    st.flush_result = MSKV_ERROR_CUDA;
    dg = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_arena_flush(a));
    EXPECT_EQ(1, st.flushes);
    EXPECT_EQ_U64(dg, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s));
    EXPECT_EQ(3, s.pending_pages);
    st.flush_result = MSKV_SUCCESS;
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_flush(a));
    EXPECT_EQ(2, st.flushes);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s));
    EXPECT_EQ(0, s.pending_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* The bad-input rows of make_room, reset and flush (the pattern of
   tests/test_bad_input.c): each invalid argument returns its code and the
   state is unchanged. */
#define MTP_BAD(a, want, call)                                                            \
    do {                                                                                  \
        uint64_t mtp__d = mskv_arena_digest(a);                                           \
        mskv_result mtp__e = (call);                                                      \
        if (mtp__e != (want))                                                             \
            mt_fail(__FILE__, __LINE__, "%s: expected %d (%s), got %d (%s)", #call, (int)(want), \
                    mskv_result_string(want), (int)mtp__e, mskv_result_string(mtp__e));   \
        if (mskv_arena_digest(a) != mtp__d) mt_fail(__FILE__, __LINE__, "%s changed the state", #call); \
        (void)mtu_audit(a);                                                               \
    } while (0)

TEST(bad_input_make_room_reset_and_flush_return_their_codes_and_change_nothing) {
    static const int pages[2] = { 2, 2 };
    mskv_arena *a = mtp_make(1 + 4 + 1, 4, MSKV_RETIRE_IMMEDIATE);
    mskv_request r[2], stale, parked[2];
    mskv_segment seg[2];
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtp_requests(a, r, pages, 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, stale));
    seg[0].request = r[1]; seg[0].n_tokens = 4;
    MTP_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_make_room(NULL, 2, 0, seg, 1, parked, 2, &n));
    MTP_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_make_room(a, 2, UINT64_MAX, seg, 1, parked, 2, NULL));
    MTP_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_make_room(a, 2, UINT64_MAX, NULL, 1, parked, 2, &n));
    MTP_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_make_room(a, 2, UINT64_MAX, seg, 1, NULL, 2, &n));
    MTP_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_make_room(a, -1, UINT64_MAX, seg, 1, parked, 2, &n));
    MTP_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_make_room(a, 2, UINT64_MAX, seg, -1, parked, 2, &n));
    MTP_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_make_room(a, 2, UINT64_MAX, seg, 1, parked, -1, &n));
    seg[1].request = stale; seg[1].n_tokens = 0;
    MTP_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_make_room(a, 2, UINT64_MAX, seg, 2, parked, 2, &n));
    seg[1].request = r[1];
    MTP_BAD(a, MSKV_ERROR_DUPLICATE, mskv_make_room(a, 2, UINT64_MAX, seg, 2, parked, 2, &n));
    MTP_BAD(a, MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(a, 6, UINT64_MAX, seg, 1, parked, 2, &n));   /* more than the arena has */
    MTP_BAD(a, MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(a, 3, 0, seg, 1, parked, 2, &n));            /* no host budget */
    MTP_BAD(a, MSKV_ERROR_CAPACITY, mskv_make_room(a, 3, UINT64_MAX, seg, 1, NULL, 0, &n));
    MTP_BAD(a, MSKV_SUCCESS, mskv_make_room(a, 1, 0, seg, 1, NULL, 0, &n));                          /* room already */
    EXPECT_EQ(0, n);
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_arena_reset(NULL));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_arena_flush(NULL));
    mskv_arena_destroy(a);
}
