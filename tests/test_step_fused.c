/* mskv_step (admit + commit under one lock): the same state as the two
   calls, all or nothing with admit's errors, and page counts exact for every
   page size (the page divisor without a divide, up to 2^31 tokens). */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

typedef struct mtf_log { int count; char last[256]; } mtf_log;
static void mtf_log_fn(void *user, mskv_log_level level, const char *msg) {
    mtf_log *l = (mtf_log *)user;
    (void)level;
    l->count++;
    snprintf(l->last, sizeof l->last, "%s", msg);
}

static mskv_arena *mtf_make(int32_t num_pages, int32_t page_size, int32_t max_requests, mtf_log *log) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    d.max_requests = max_requests;
    if (log) { d.log = mtf_log_fn; d.log_user = log; }
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

/* What a call could change: the arena's counts, and each request's
   bookkeeping and page table. */
#define MTF_REQS 4
typedef struct mtf_state {
    mskv_arena_stats st;
    mskv_request_info info[MTF_REQS];
    int32_t pages[MTF_REQS][128], count[MTF_REQS];
} mtf_state;

static void mtf_snap(mskv_arena *a, const mskv_request *r, int32_t nr, mtf_state *s) {
    int32_t i;
    memset(s, 0, sizeof *s);
    if (mskv_arena_stats_get(a, &s->st) != MSKV_SUCCESS) s->st.num_pages = -1;
    for (i = 0; i < nr; i++) {
        if (mskv_request_info_get(a, r[i], &s->info[i]) != MSKV_SUCCESS) s->info[i].num_pages = -1;
        if (mskv_request_pages(a, r[i], s->pages[i], 128, &s->count[i]) != MSKV_SUCCESS) s->count[i] = -1;
    }
}

/* The same bookkeeping; with same_ids the same page ids too (two arenas
   that saw the same calls hand out the same ids). */
static int mtf_same(const mtf_state *x, const mtf_state *y, int32_t nr, int same_ids) {
    int32_t i, k;
    if (x->st.free_pages != y->st.free_pages || x->st.live_pages != y->st.live_pages ||
        x->st.pending_pages != y->st.pending_pages || x->st.requests != y->st.requests || x->st.step != y->st.step)
        return 0;
    for (i = 0; i < nr; i++) {
        const mskv_request_info *a = &x->info[i], *b = &y->info[i];
        if (a->committed != b->committed || a->reserved != b->reserved || a->has_reservation != b->has_reservation ||
            a->num_pages != b->num_pages || a->kv_len != b->kv_len || a->live_start != b->live_start ||
            a->last_admitted != b->last_admitted || a->release_point != b->release_point || x->count[i] != y->count[i])
            return 0;
        for (k = 0; same_ids && k < x->count[i]; k++)
            if (x->pages[i][k] != y->pages[i][k]) return 0;
    }
    return 1;
}

/* One bad segment alone (the single-segment path): step and admit both
   refuse it with `code` and a message holding `msg`, and change nothing. */
static void mtf_one_fails(mskv_arena *a, mtf_log *log, const mskv_request *r, int32_t nr, mskv_segment seg,
                          mskv_result code, const char *msg, int line) {
    mtf_state before, after;
    int call;
    mtf_snap(a, r, nr, &before);
    for (call = 0; call < 2; call++) {
        mskv_result e;
        log->count = 0;
        e = call == 0 ? mskv_step(a, &seg, 1) : mskv_admit(a, &seg, 1);
        mtf_snap(a, r, nr, &after);
        if (e != code || log->count != 1 || !strstr(log->last, msg) || !mtf_same(&before, &after, nr, 1))
            mt_fail(__FILE__, line, "%s of one segment: result %d (want %d), message '%s' (want '%s')%s",
                    call == 0 ? "step" : "admit", (int)e, (int)code, log->last, msg,
                    mtf_same(&before, &after, nr, 1) ? "" : ", and the state changed");
    }
}

static int64_t mtf_rand(uint64_t *s, int64_t n) {   /* xorshift64*, in [0, n) */
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return (int64_t)((*s * 0x2545f4914f6cdd1dull) >> 33) % n;
}

TEST(step_gives_the_state_of_admit_then_commit_for_every_page_size) {
    static const int32_t sizes[] = {1, 3, 7, 16, 40, 64};
    uint64_t seed = mt_seed(), rs = seed | 1;
    size_t si;
    printf("  step vs admit+commit: seed %llu\n", (unsigned long long)seed);
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int32_t P = sizes[si];
        mskv_arena *a = mtf_make(400, P, 8, NULL), *b = mtf_make(400, P, 8, NULL);
        mskv_request ra[MTF_REQS], rb[MTF_REQS];
        mtf_state sa, sb;
        int32_t i, round;
        ASSERT_TRUE(a && b);
        for (i = 0; i < MTF_REQS; i++) {
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &ra[i]));
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &rb[i]));
        }
        for (round = 0; round < 60; round++) {
            mskv_segment ga[MTF_REQS], gb[MTF_REQS];
            int32_t n = (int32_t)mtf_rand(&rs, MTF_REQS) + 1, first = (int32_t)mtf_rand(&rs, MTF_REQS);
            mskv_result ea, eb;
            for (i = 0; i < n; i++) {
                int64_t t = mtf_rand(&rs, 3 * (int64_t)P + 2);
                ga[i].request = ra[(first + i) % MTF_REQS];
                gb[i].request = rb[(first + i) % MTF_REQS];
                ga[i].n_tokens = gb[i].n_tokens = t;
            }
            {   /* mskv_admit_query counts with the batch checks (every n): step takes exactly that */
                int64_t want = -1;
                mskv_arena_stats s0, s1;
                mskv_result eq = mskv_admit_query(a, ga, n, &want);
                ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s0));
                ea = mskv_step(a, ga, n);
                ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &s1));
                if (eq == MSKV_SUCCESS && want <= s0.free_pages) EXPECT_EQ(want, (int64_t)(s0.free_pages - s1.free_pages));
                if (eq != MSKV_SUCCESS) EXPECT_EQ(eq, ea);
            }
            eb = mskv_admit(b, gb, n);
            if (eb == MSKV_SUCCESS) eb = mskv_commit(b, gb, n);
            EXPECT_EQ(eb, ea);
            /* the page tables cover exactly ceil(committed / P) pages (a plain division here) */
            for (i = 0; i < MTF_REQS; i++) {
                mskv_request_info info;
                ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, ra[i], &info));
                EXPECT_EQ((info.committed + P - 1) / P - info.live_start / P, (int64_t)info.num_pages);
            }
            /* the windowed decode that follows: release some of the oldest tokens of one request */
            if (mtf_rand(&rs, 3) == 0) {
                mskv_request_info info;
                int32_t k = (int32_t)mtf_rand(&rs, MTF_REQS);
                int64_t gone, vis, got_a = -1, got_b = -2;
                ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, ra[k], &info));
                /* at most half of what is still visible (past the release point and the pages already gone) */
                vis = info.committed - (info.release_point > info.live_start ? info.release_point : info.live_start);
                gone = vis > 1 ? mtf_rand(&rs, vis / 2 + 1) : 0;
                EXPECT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, ra[k], gone, &got_a));
                EXPECT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(b, rb[k], gone, &got_b));
                EXPECT_EQ(got_b, got_a);
            }
            EXPECT_EQ(MSKV_SUCCESS, mskv_publish(a, ga, n, NULL));
            EXPECT_EQ(MSKV_SUCCESS, mskv_publish(b, gb, n, NULL));
            mtf_snap(a, ra, MTF_REQS, &sa);
            mtf_snap(b, rb, MTF_REQS, &sb);
            if (!mtf_same(&sa, &sb, MTF_REQS, 1)) {
                mt_fail(__FILE__, __LINE__, "page size %d, round %d: step and admit+commit differ", (int)P, (int)round);
                break;
            }
        }
        EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(a, NULL, 0));
        mskv_arena_destroy(a);
        mskv_arena_destroy(b);
    }
}

TEST(step_errors_are_admits_and_leave_the_arena_unchanged) {
    mtf_log log = {0, ""};
    mskv_arena *a = mtf_make(9, 16, 4, &log);   /* 8 usable pages */
    mskv_request r[MTF_REQS], gone;
    mskv_segment s[2];
    mtf_state before, after;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[2]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &gone));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, gone));
    r[3] = r[2];
    s[0].request = r[0]; s[0].n_tokens = 20;
    ASSERT_EQ(MSKV_SUCCESS, mskv_step(a, s, 1));   /* 2 pages, 20 committed */
    mtf_snap(a, r, 3, &before);
    EXPECT_EQ(20, before.info[0].committed);
    EXPECT_EQ(0, before.info[0].has_reservation);
    EXPECT_EQ(2, before.count[0]);
    EXPECT_EQ(6, before.st.free_pages);

    /* out of pages: the second segment needs 7 more, 6 are free; the first takes none either */
    s[0].request = r[0]; s[0].n_tokens = 13;          /* fills page 2 and takes a third */
    s[1].request = r[1]; s[1].n_tokens = 6 * 16 + 1;
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "need 8 pages, 6 free") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
    mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_OUT_OF_PAGES, "admit: need 7 pages, 6 free", __LINE__);

    /* a request twice in one batch */
    s[1].request = r[0]; s[1].n_tokens = 1;
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1 repeats a request") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));

    /* a removed handle */
    s[1].request = gone;
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1 has an unknown or removed request") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
    mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_INVALID_HANDLE, "admit: segment 0 has an unknown or removed request", __LINE__);

    /* a negative token count */
    s[1].request = r[1]; s[1].n_tokens = -1;
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1 has -1 tokens") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
    mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_INVALID_ARGUMENT, "admit: segment 0 has -1 tokens", __LINE__);

    /* past 2^31 tokens */
    s[1].n_tokens = (int64_t)INT32_MAX;
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1 would pass 2^31 tokens") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
    mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_OVERFLOW, "admit: segment 0 would pass 2^31 tokens", __LINE__);

    /* an open reservation (from a plain admit): step refuses it, and the open one stays */
    s[1].request = r[1]; s[1].n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s[1], 1));
    mtf_snap(a, r, 3, &before);
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_RESERVATION_PENDING, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1's request already has a reservation") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
    mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_RESERVATION_PENDING, "admit: segment 0's request already has a reservation", __LINE__);
    EXPECT_EQ(1, after.info[1].has_reservation);
    EXPECT_EQ(MSKV_SUCCESS, mskv_commit(a, &s[1], 1));

    /* a paused request */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pause(a, r[2]));
    s[1].request = r[2]; s[1].n_tokens = 1;
    mtf_snap(a, r, 3, &before);
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_step(a, s, 2));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1's request is paused") != NULL);
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
    mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_BAD_STATE, "admit: segment 0's request is paused", __LINE__);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_resume(a, r[2]));

    /* a write-once keyed entry */
    {
        mskv_request e;
        ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 77, 4, &e));
        ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, e));
        s[1].request = e; s[1].n_tokens = 1;
        mtf_snap(a, r, 3, &before);
        log.count = 0;
        EXPECT_EQ(MSKV_ERROR_READ_ONLY, mskv_step(a, s, 2));
        EXPECT_TRUE(log.count == 1 && strstr(log.last, "segment 1 is a keyed entry") != NULL);
        mtf_snap(a, r, 3, &after);
        EXPECT_TRUE(mtf_same(&before, &after, 3, 1));
        mtf_one_fails(a, &log, r, 3, s[1], MSKV_ERROR_READ_ONLY, "admit: segment 0 is a keyed entry", __LINE__);
    }

    /* the argument checks */
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_step(NULL, s, 1));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_step(a, NULL, 1));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_step(a, s, -1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_step(a, NULL, 0));
    mtf_snap(a, r, 3, &after);
    EXPECT_TRUE(mtf_same(&before, &after, 3, 1));

    /* and the good step after all of that: both segments commit under one call */
    s[1].request = r[1]; s[1].n_tokens = 5;
    EXPECT_EQ(MSKV_SUCCESS, mskv_step(a, s, 2));
    mtf_snap(a, r, 3, &after);
    EXPECT_EQ(33, after.info[0].committed);
    EXPECT_EQ(8, after.info[1].committed);
    EXPECT_EQ(0, after.info[0].has_reservation + after.info[1].has_reservation);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(a, NULL, 0));
    mskv_arena_destroy(a);
}

TEST(step_refuses_part_of_a_lockstep_group_and_takes_it_whole) {
    mtf_log log = {0, ""};
    mskv_arena *a = mtf_make(33, 8, 4, &log);
    mskv_request r[2];
    mskv_segment s[2];
    mtf_state after;
    mskv_lockstep g;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(a, r, 2, &g));
    s[0].request = r[0]; s[0].n_tokens = 9;
    s[1].request = r[1]; s[1].n_tokens = 9;
    mtf_one_fails(a, &log, r, 2, s[0], MSKV_ERROR_BAD_STATE, "admit: segment 0's lockstep group is not whole in the batch", __LINE__);
    mtf_one_fails(a, &log, r, 2, s[1], MSKV_ERROR_BAD_STATE, "admit: segment 0's lockstep group is not whole in the batch", __LINE__);
    EXPECT_EQ(MSKV_SUCCESS, mskv_step(a, s, 2));
    mtf_snap(a, r, 2, &after);
    EXPECT_EQ(9, after.info[0].committed);
    EXPECT_EQ(9, after.info[1].committed);
    EXPECT_EQ(2, after.count[0]);
    mskv_arena_destroy(a);
}

/* The host core's division by the page size (a multiply and a shift below
   2^31) against the divide, at the edges of every page and of the range, for
   every page size up to 2048, the powers of two, and random ones. */
TEST(page_division_matches_the_divide_for_every_page_size) {
    uint64_t seed = mt_seed(), rs = seed | 1;
    int64_t bad = 0;
    int32_t k;
    printf("  page division: seed %llu\n", (unsigned long long)seed);
    for (k = 0; k < 2048 + 31 + 2000; k++) {
        int32_t P = k < 2048 ? k + 1 : k < 2048 + 31 ? (int32_t)1 << (k - 2048) : (int32_t)mtf_rand(&rs, INT32_MAX) + 1;
        int64_t top = ((int64_t)1 << 31) - 1, m = top / P, xs[16];
        int j;
        xs[0] = 0; xs[1] = 1; xs[2] = P - 1; xs[3] = P; xs[4] = (int64_t)P + 1;
        xs[5] = m * P - 1; xs[6] = m * P; xs[7] = top; xs[8] = top - 1; xs[9] = top - P;
        xs[10] = mtf_rand(&rs, top + 1); xs[11] = mtf_rand(&rs, m + 1) * P - 1; xs[12] = mtf_rand(&rs, m + 1) * P;
        xs[13] = top + 1;                 /* past the exact range: the divide */
        xs[14] = ((int64_t)1 << 40) + 12345;
        xs[15] = -(int64_t)P - 1;         /* negative: the divide's truncation */
        for (j = 0; j < 16; j++) {
            int64_t x = xs[j] < 0 && j != 15 ? 0 : xs[j];
            if (mtu_page_div(P, x) != x / P) {
                if (bad++ < 5) mt_fail(__FILE__, __LINE__, "%lld / %d: got %lld, want %lld", (long long)x, (int)P,
                                       (long long)mtu_page_div(P, x), (long long)(x / P));
            }
        }
    }
    EXPECT_EQ(0, bad);
}

/* The page counts at the top of the token range through the arena, for page
   sizes that keep the arena small (reciprocals and a power of two):
   admit_query asks for exactly ceil(n / P) pages, and step takes them. */
TEST(page_counts_are_exact_up_to_2_pow_31_tokens_for_any_page_size) {
    static const int32_t sizes[] = {1000003, 1 << 20, 65537 * 3, 999999937};
    size_t si;
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int32_t P = sizes[si];
        const int64_t top = (int64_t)INT32_MAX - P;   /* the most admit allows from 0 committed */
        const int64_t ns[] = {1, P - 1, P, (int64_t)P + 1, top - 1, top, top - P, top - P + 1};
        int32_t most = (int32_t)((top + P - 1) / P);
        mskv_arena *a = mtf_make(most + 2, P, 2, NULL);
        mskv_request r;
        mskv_segment s;
        size_t k;
        ASSERT_TRUE(a != NULL);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
        s.request = r;
        for (k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int64_t pages = -1;
            if (ns[k] < 1 || ns[k] > top) continue;
            s.n_tokens = ns[k];
            EXPECT_EQ(MSKV_SUCCESS, mskv_admit_query(a, &s, 1, &pages));
            if (pages != (ns[k] + P - 1) / P)
                mt_fail(__FILE__, __LINE__, "page size %d, %lld tokens: %lld pages, want %lld", (int)P, (long long)ns[k],
                        (long long)pages, (long long)((ns[k] + P - 1) / P));
        }
        /* and step takes that many, then release gives back the whole pages behind a point near 2^31 */
        s.n_tokens = top;
        ASSERT_EQ(MSKV_SUCCESS, mskv_step(a, &s, 1));
        {
            mskv_request_info info;
            int64_t got = 0;
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, r, &info));
            EXPECT_EQ((int64_t)most, (int64_t)info.num_pages);
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, top - 1, &got));
            EXPECT_EQ((top - 1) / P * P, got);
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, r, &info));
            EXPECT_EQ((int64_t)most - (top - 1) / P, (int64_t)info.num_pages);
        }
        mskv_arena_destroy(a);
    }
}

/* The release path frees a run of pages onto the free stack in one loop
   when nothing waits for a fence and no poison is written; with
   MSKV_DEBUG_POISON it frees them one by one (mskv__unref). Two arenas fed
   the same random calls, one each way, with a forked child sharing the
   parent's pages (a page whose count stays above zero is not freed), keep
   the same page ids, the same results, and a clean audit. */
TEST(release_frees_the_same_pages_in_order_with_and_without_the_one_by_one_path) {
    uint64_t seed = mt_seed(), rs = seed | 1;
    mskv_arena_desc d;
    mskv_arena *a = NULL, *b = NULL;
    mskv_request ra[2], rb[2];
    mtf_state sa, sb;
    int round, freed = 0, stepped = 0;
    printf("  release paths: seed %llu\n", (unsigned long long)seed);
    memset(&d, 0, sizeof d);
    d.num_pages = 97; d.page_size = 16; d.max_requests = 4;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = 8; d.dtype = MSKV_DTYPE_F16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    d.debug = MSKV_DEBUG_POISON;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &b));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &ra[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &rb[0]));
    {
        mskv_segment s;
        s.request = ra[0]; s.n_tokens = 16 * 6 + 3;
        ASSERT_EQ(MSKV_SUCCESS, mskv_step(a, &s, 1));
        s.request = rb[0];
        ASSERT_EQ(MSKV_SUCCESS, mskv_step(b, &s, 1));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, ra[0], &ra[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(b, rb[0], &rb[1]));
    for (round = 0; round < 400; round++) {
        int32_t who = (int32_t)mtf_rand(&rs, 2);
        mskv_result ea, eb;
        int64_t ga = -1, gb = -1;
        if (mtf_rand(&rs, 2) == 0) {
            mskv_segment s;
            s.n_tokens = 1 + mtf_rand(&rs, 40);
            s.request = ra[who]; ea = mskv_step(a, &s, 1);
            s.request = rb[who]; eb = mskv_step(b, &s, 1);
        } else {
            mskv_request_info info;
            int64_t n;
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, ra[who], &info));
            n = mtf_rand(&rs, 48);   /* past the visible tokens at times: OUT_OF_RANGE in both */
            ea = mskv_request_release_oldest(a, ra[who], n, &ga);
            eb = mskv_request_release_oldest(b, rb[who], n, &gb);
        }
        mtf_snap(a, ra, 2, &sa);
        mtf_snap(b, rb, 2, &sb);
        if (ea != eb || ga != gb || !mtf_same(&sa, &sb, 2, 1)) {
            mt_fail(__FILE__, __LINE__, "round %d: results %d / %d, released %lld / %lld%s", round, (int)ea, (int)eb,
                    (long long)ga, (long long)gb, mtf_same(&sa, &sb, 2, 1) ? "" : ", and the states differ");
            break;
        }
        if (ea == MSKV_SUCCESS && ga > 0) freed++;
        if (ea == MSKV_SUCCESS && ga < 0) stepped++;
    }
    EXPECT_TRUE(freed > 0 && stepped > 0);   /* both kinds of call did something */
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(a, NULL, 0));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(b, NULL, 0));
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

/* commit and abort of one segment check it without marking (the decode
   step's path): each refusal has the code and the message the batch path
   gives the same segment at index 0 beside a good one, and neither call
   changes anything. */
TEST(commit_and_abort_of_one_segment_refuse_as_the_batch_does) {
    mtf_log log = {0, ""};
    mskv_arena *a = mtf_make(33, 8, 8, &log);
    mskv_request r[MTF_REQS], gone, e, l[2];
    mskv_segment bad[5], pair[2];
    mskv_lockstep ls;
    mtf_state before, after;
    int k, call;
    ASSERT_TRUE(a != NULL);
    for (k = 0; k < MTF_REQS; k++) ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r[k]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &gone));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, gone));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 5, 4, &e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &l[0]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &l[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(a, l, 2, &ls));
    pair[0].request = l[0]; pair[0].n_tokens = 3;
    pair[1].request = l[1]; pair[1].n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, pair, 2));   /* both hold a reservation */
    pair[0].request = r[0]; pair[0].n_tokens = 5;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, pair, 1));   /* the good segment: r[0], reserved */
    for (k = 0; k < 5; k++) bad[k].n_tokens = 1;
    bad[0].request = gone;   /* unknown */
    bad[1].request = r[1];   /* no reservation */
    bad[2].request = e;      /* a keyed entry (being filled: it has a reservation) */
    bad[3].request = l[0];   /* half a lockstep group */
    bad[4].request = l[1];
    for (k = 0; k < 5; k++)
        for (call = 0; call < 2; call++) {
            mskv_result one, batch;
            char msg[256];
            int one_logs;
            pair[0] = bad[k];   /* the bad segment first, the good one second */
            pair[1].request = r[0];
            pair[1].n_tokens = 5;
            mtf_snap(a, r, MTF_REQS, &before);
            log.count = 0;
            one = call == 0 ? mskv_commit(a, bad + k, 1) : mskv_abort(a, bad + k, 1);
            one_logs = log.count;
            snprintf(msg, sizeof msg, "%s", log.last);
            log.count = 0;
            batch = call == 0 ? mskv_commit(a, pair, 2) : mskv_abort(a, pair, 2);
            mtf_snap(a, r, MTF_REQS, &after);
            if (one == MSKV_SUCCESS || one != batch || one_logs != 1 || log.count != 1 || strcmp(msg, log.last) != 0 ||
                !mtf_same(&before, &after, MTF_REQS, 1))
                mt_fail(__FILE__, __LINE__, "%s, bad segment %d: one %d '%s', batch %d '%s'%s", call == 0 ? "commit" : "abort", k,
                        (int)one, msg, (int)batch, log.last, mtf_same(&before, &after, MTF_REQS, 1) ? "" : ", and the state changed");
        }
    /* the good one alone commits, then has no reservation to commit again */
    EXPECT_EQ(MSKV_SUCCESS, mskv_commit(a, pair + 1, 1));
    log.count = 0;
    EXPECT_EQ(MSKV_ERROR_NO_RESERVATION, mskv_commit(a, pair + 1, 1));
    EXPECT_TRUE(log.count == 1 && strstr(log.last, "commit: segment 0's request has no reservation") != NULL);
    mtf_snap(a, r, 1, &after);
    EXPECT_EQ(5, after.info[0].committed);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(a, NULL, 0));
    mskv_arena_destroy(a);
}
