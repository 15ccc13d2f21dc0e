/* Ranks in agreement (mskv_rank_check): one arena per rank, every rank
   making the same decisions, compared by their bookkeeping digests through
   a caller's all-reduce. Two ranks run here as two threads of one process;
   their all-reduce is a fake one: shared memory and a barrier. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

#define MTR_STEPS 12
#define MTR_VALUES (4 * MSKV_RANK_STEPS)

typedef struct mtr_world {
    mtu_barrier *meet;
    uint64_t vals[2][MTR_VALUES];
} mtr_world;

typedef struct mtr_rank {
    mtr_world *w;
    int rank;
    mskv_arena *a;
    mskv_request req;          /* the request the steps drive */
    int diverge_at;            /* rank 1 only: the step at which it decides differently (0: never) */
    int check_every;           /* compares at steps that are multiples of this, records in between */
    int bad_count;             /* the all-reduce was asked for another count than 4 * MSKV_RANK_STEPS */
    mskv_result setup;         /* the first failure of the script's own calls */
    mskv_result result[MTR_STEPS + 1];
    uint64_t first[MTR_STEPS + 1];
    void (*step)(struct mtr_rank *r, int s);
} mtr_rank;

/* the fake collective: each rank's values in shared memory, then the minimum of both */
static mskv_result mtr_allreduce(void *user, uint64_t *v, int32_t n) {
    mtr_rank *r = (mtr_rank *)user;
    int32_t i;
    if (n != MTR_VALUES) { r->bad_count = 1; n = n < MTR_VALUES ? n : MTR_VALUES; }
    memcpy(r->w->vals[r->rank], v, (size_t)n * sizeof(uint64_t));
    mtu_barrier_wait(r->w->meet);
    for (i = 0; i < n; i++) v[i] = r->w->vals[0][i] < r->w->vals[1][i] ? r->w->vals[0][i] : r->w->vals[1][i];
    mtu_barrier_wait(r->w->meet);   /* nobody overwrites its values before the other has read them */
    return MSKV_SUCCESS;
}

static void mtr_note(mtr_rank *r, mskv_result e) { if (r->setup == MSKV_SUCCESS) r->setup = e; }

static void mtr_thread(void *p) {
    mtr_rank *r = (mtr_rank *)p;
    int s;
    for (s = 1; s <= MTR_STEPS; s++) {
        r->step(r, s);
        r->first[s] = 0;
        r->result[s] = mskv_rank_check(r->a, (uint64_t)s, s % r->check_every == 0 ? mtr_allreduce : NULL, r, &r->first[s]);
    }
}

static mskv_arena *mtr_arena(mskv_retire_mode mode, int32_t layers) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 64;
    d.page_size = 4;
    d.retire_mode = mode;
    d.num_layers = layers;
    d.kv_heads = 1;
    d.head_dim = 4;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

/* Runs two ranks, each its arena and step function, to the end. 0 when a thread could not start. */
static int mtr_run(mtr_rank ranks[2], mtr_world *w) {
    mtu_thread *t[2];
    int i;
    w->meet = mtu_barrier_new(2);
    if (!w->meet) return 0;
    for (i = 0; i < 2; i++) {
        ranks[i].w = w;
        ranks[i].rank = i;
    }
    t[0] = mtu_thread_start(mtr_thread, &ranks[0]);
    t[1] = t[0] ? mtu_thread_start(mtr_thread, &ranks[1]) : NULL;
    if (!t[1]) {
        /* the started rank would wait at the barrier for ever: let it through alone */
        if (t[0]) { mtr_thread(&ranks[1]); mtu_thread_join(t[0]); }
        mtu_barrier_free(w->meet);
        return 0;
    }
    mtu_thread_join(t[0]);
    mtu_thread_join(t[1]);
    mtu_barrier_free(w->meet);
    return 1;
}

/* The step both ranks take: a request grows 3 tokens a step, its oldest page
   goes every third step, the fence of the step before retires (FENCED, so
   waiting for it is the deterministic choice). Rank 1 admits 2 tokens more
   at its diverge_at step: a decision the other rank did not make. */
static void mtr_serving_step(mtr_rank *r, int s) {
    if (s == 1) mtr_note(r, mskv_request_add(r->a, &r->req));
    mtr_note(r, mtu_grow(r->a, r->req, r->rank == 1 && s == r->diverge_at ? 5 : 3));
    if (s % 3 == 0) mtr_note(r, mskv_request_release_oldest(r->a, r->req, 4, NULL));
    mtr_note(r, mskv_publish(r->a, NULL, 0, NULL));
    mtr_note(r, mskv_arena_retire(r->a, mskv_arena_step(r->a) - 2));
}

static void mtr_ranks_init(mtr_rank ranks[2], void (*step)(mtr_rank *, int), int check_every) {
    int i;
    memset(ranks, 0, 2 * sizeof(mtr_rank));
    for (i = 0; i < 2; i++) {
        ranks[i].a = mtr_arena(MSKV_RETIRE_FENCED, 0);
        ranks[i].step = step;
        ranks[i].check_every = check_every;
    }
}

TEST(rank_check_agrees_at_every_step_while_ranks_make_the_same_decisions) {
    mtr_world w;
    mtr_rank r[2];
    int s, i;
    mtr_ranks_init(r, mtr_serving_step, 1);
    ASSERT_TRUE(r[0].a && r[1].a);
    if (!mtr_run(r, &w)) { mskv_arena_destroy(r[0].a); mskv_arena_destroy(r[1].a); SKIP("no second thread to run a rank on"); }
    for (i = 0; i < 2; i++) {
        EXPECT_EQ(MSKV_SUCCESS, r[i].setup);
        EXPECT_EQ(0, r[i].bad_count);
        for (s = 1; s <= MTR_STEPS; s++) EXPECT_EQ(MSKV_SUCCESS, r[i].result[s]);
    }
    EXPECT_EQ_U64(mskv_arena_digest(r[0].a), mskv_arena_digest(r[1].a));
    mskv_arena_destroy(r[0].a);
    mskv_arena_destroy(r[1].a);
}

/* Checks every 4 steps (records in between): rank 1's different admit at
   step 5 is found at the check of step 8, on both ranks, named as step 5;
   the records stay, so the check of step 12 names step 5 again. */
TEST(rank_check_names_the_first_step_at_which_one_rank_decided_differently) {
    mtr_world w;
    mtr_rank r[2];
    int i;
    mtr_ranks_init(r, mtr_serving_step, 4);
    r[1].diverge_at = 5;
    ASSERT_TRUE(r[0].a && r[1].a);
    if (!mtr_run(r, &w)) { mskv_arena_destroy(r[0].a); mskv_arena_destroy(r[1].a); SKIP("no second thread to run a rank on"); }
    for (i = 0; i < 2; i++) {
        EXPECT_EQ(MSKV_SUCCESS, r[i].setup);
        EXPECT_EQ(MSKV_SUCCESS, r[i].result[4]);           /* the checks before it agree */
        EXPECT_EQ(MSKV_SUCCESS, r[i].result[5]);           /* recorded only */
        EXPECT_EQ(MSKV_ERROR_DIVERGED, r[i].result[8]);
        EXPECT_EQ_U64(5, r[i].first[8]);
        EXPECT_EQ(MSKV_ERROR_DIVERGED, r[i].result[12]);
        EXPECT_EQ_U64(5, r[i].first[12]);
    }
    mskv_arena_destroy(r[0].a);
    mskv_arena_destroy(r[1].a);
}

/* Retirement is a decision too: a rank that takes pages back earlier than
   another hands out other page ids (and under pressure admits what the
   other refuses). Here rank 1 does not retire at step 4. */
static void mtr_late_retire_step(mtr_rank *r, int s) {
    if (s == 1) mtr_note(r, mskv_request_add(r->a, &r->req));
    mtr_note(r, mtu_grow(r->a, r->req, 4));
    if (s == 3) mtr_note(r, mskv_request_release_oldest(r->a, r->req, 8, NULL));
    mtr_note(r, mskv_publish(r->a, NULL, 0, NULL));
    if (!(r->rank == 1 && s == 4)) mtr_note(r, mskv_arena_retire(r->a, mskv_arena_step(r->a) - 2));
}

TEST(rank_check_counts_retirement_as_a_decision) {
    mtr_world w;
    mtr_rank r[2];
    int i;
    mtr_ranks_init(r, mtr_late_retire_step, 6);
    ASSERT_TRUE(r[0].a && r[1].a);
    if (!mtr_run(r, &w)) { mskv_arena_destroy(r[0].a); mskv_arena_destroy(r[1].a); SKIP("no second thread to run a rank on"); }
    for (i = 0; i < 2; i++) {
        EXPECT_EQ(MSKV_SUCCESS, r[i].setup);
        EXPECT_EQ(MSKV_ERROR_DIVERGED, r[i].result[6]);
        EXPECT_EQ_U64(4, r[i].first[6]);
    }
    mskv_arena_destroy(r[0].a);
    mskv_arena_destroy(r[1].a);
}

/* Each rank's host copies hold its own heads: different bytes, the same
   decisions. The rank check leaves the bytes out (the arena digest does not). */
static void mtr_offload_step(mtr_rank *r, int s) {
    if (s == 1) {
        mtr_note(r, mskv_request_add(r->a, &r->req));
        mtr_note(r, mtu_grow(r->a, r->req, 10));
        /* this rank's K and V: every byte of its pools */
        memset(mskv_store_pool(r->a, 0, 0), 0x10 + r->rank, (size_t)64 * 4 * 4 * sizeof(float));
        memset(mskv_store_pool(r->a, 0, 1), 0x20 + r->rank, (size_t)64 * 4 * 4 * sizeof(float));
    }
    if (s == 2) mtr_note(r, mskv_request_offload(r->a, r->req));
    if (s == 4) mtr_note(r, mskv_request_reload(r->a, r->req));
    mtr_note(r, mskv_publish(r->a, NULL, 0, NULL));
}

TEST(rank_check_leaves_out_host_copy_bytes_that_differ_between_ranks) {
    mtr_world w;
    mtr_rank r[2];
    int i, s;
    mtr_ranks_init(r, mtr_offload_step, 3);   /* a check while the copy exists: step 3 */
    for (i = 0; i < 2; i++) {
        mskv_arena_destroy(r[i].a);
        r[i].a = mtr_arena(MSKV_RETIRE_IMMEDIATE, 1);
    }
    ASSERT_TRUE(r[0].a && r[1].a);
    if (!mtr_run(r, &w)) { mskv_arena_destroy(r[0].a); mskv_arena_destroy(r[1].a); SKIP("no second thread to run a rank on"); }
    for (i = 0; i < 2; i++) {
        EXPECT_EQ(MSKV_SUCCESS, r[i].setup);
        for (s = 3; s <= MTR_STEPS; s += 3) EXPECT_EQ(MSKV_SUCCESS, r[i].result[s]);
    }
    /* the bytes do differ: an offload now makes host copies the arena digest tells apart */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(r[0].a, r[0].req));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(r[1].a, r[1].req));
    EXPECT_NE_U64(mskv_arena_digest(r[0].a), mskv_arena_digest(r[1].a));
    mskv_arena_destroy(r[0].a);
    mskv_arena_destroy(r[1].a);
}

/* ---- one rank alone: the records and the callback ---------------------------------------- */

static int mtr_calls;
static uint64_t mtr_seen[MTR_VALUES];
static mskv_result mtr_alone(void *user, uint64_t *v, int32_t n) {
    (void)user;
    mtr_calls++;
    memcpy(mtr_seen, v, (size_t)(n < MTR_VALUES ? n : MTR_VALUES) * sizeof(uint64_t));
    return MSKV_SUCCESS;   /* the minimum over one rank is its own values */
}
static mskv_result mtr_broken(void *user, uint64_t *v, int32_t n) {
    (void)user; (void)v; (void)n;
    mtr_calls++;
    return MSKV_ERROR_IO;
}

TEST(rank_check_records_without_an_allreduce_until_one_place_is_left_for_the_check) {
    mskv_arena *a = mtr_arena(MSKV_RETIRE_IMMEDIATE, 0);
    int s;
    ASSERT_TRUE(a != NULL);
    for (s = 1; s < MSKV_RANK_STEPS; s++) ASSERT_EQ(MSKV_SUCCESS, mskv_rank_check(a, (uint64_t)s, NULL, NULL, NULL));
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_rank_check(a, MSKV_RANK_STEPS, NULL, NULL, NULL));
    mtr_calls = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_rank_check(a, MSKV_RANK_STEPS, mtr_alone, NULL, NULL));
    EXPECT_EQ(1, mtr_calls);
    /* every record in step order, the refused one not among them, the check's own last */
    for (s = 0; s < MSKV_RANK_STEPS - 1; s++) EXPECT_EQ_U64((uint64_t)(s + 1), mtr_seen[2 * s]);
    EXPECT_EQ_U64((uint64_t)MSKV_RANK_STEPS, mtr_seen[2 * (MSKV_RANK_STEPS - 1)]);
    /* the check dropped them: recording works again */
    EXPECT_EQ(MSKV_SUCCESS, mskv_rank_check(a, MSKV_RANK_STEPS + 1, NULL, NULL, NULL));
    mskv_arena_destroy(a);
}

TEST(rank_check_sends_the_complement_of_its_records_for_the_maximum) {
    mskv_arena *a = mtr_arena(MSKV_RETIRE_IMMEDIATE, 0);
    int i;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_rank_check(a, 7, mtr_alone, NULL, NULL));
    EXPECT_EQ_U64(7, mtr_seen[0]);
    EXPECT_EQ_U64(mskv_arena_digest(a), mtr_seen[1]);   /* no host copies: the same digest */
    EXPECT_EQ_U64(UINT64_MAX, mtr_seen[2]);              /* no second record */
    EXPECT_EQ_U64(0, mtr_seen[3]);
    for (i = 0; i < 2 * MSKV_RANK_STEPS; i++) EXPECT_EQ_U64(~mtr_seen[i], mtr_seen[2 * MSKV_RANK_STEPS + i]);
    mskv_arena_destroy(a);
}

TEST(rank_check_whose_allreduce_fails_keeps_its_records_for_the_next_check) {
    mskv_arena *a = mtr_arena(MSKV_RETIRE_IMMEDIATE, 0);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_rank_check(a, 1, NULL, NULL, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_rank_check(a, 2, NULL, NULL, NULL));
    EXPECT_EQ(MSKV_ERROR_IO, mskv_rank_check(a, 3, mtr_broken, NULL, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_rank_check(a, 4, mtr_alone, NULL, NULL));
    EXPECT_EQ_U64(1, mtr_seen[0]);
    EXPECT_EQ_U64(2, mtr_seen[2]);
    EXPECT_EQ_U64(4, mtr_seen[4]);                       /* the failed check recorded nothing */
    EXPECT_EQ_U64(UINT64_MAX, mtr_seen[6]);
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_rank_check(NULL, 5, mtr_alone, NULL, NULL));
    mskv_arena_destroy(a);
}
