/* Thread safety: several threads drive their own requests through one arena
   (the core locks internally). Each thread checks its own requests after
   every operation and writes/reads its tokens' bytes; at the end the pages
   are conserved and the audit passes. */
#include <stdlib.h>
#include "mskv_test.h"
#include "mskv_test_util.h"
#include "../mstar_kv.h"

#define MTT_THREADS 4
#ifndef MTT_OPS
#define MTT_OPS 1000000L  /* 10^5 rarely exposes a missing lock on two cores; 10^6 did every time (TSan needs fewer) */
#endif
#define MTT_REQS 3
#define MTT_P 4

typedef struct mtt_req {
    int used;
    mskv_request h;
    uint32_t uid;
} mtt_req;

typedef struct mtt_thread {
    mskv_arena *a;
    int index;
    uint64_t rng;
    mtt_req r[MTT_REQS];
    uint32_t next_uid;
    mtu_barrier *go;
    long failures, ops_done, bytes_checked;
    char first[256];
} mtt_thread;

static uint64_t mtt_rand(mtt_thread *t) {
    uint64_t x = t->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    t->rng = x;
    return x * 2685821657736338717ull;
}

static void mtt_fail(mtt_thread *t, long op, const char *what, mskv_result e) {
    if (t->failures++ == 0)
        snprintf(t->first, sizeof t->first, "thread %d op %ld: %s (%d %s)", t->index, op, what, (int)e, mskv_result_string(e));
}

static float mtt_value(uint32_t uid, int64_t pos) { return (float)((uid * 40503u + (uint32_t)pos * 977u) & 0xFFFFFu); }

static int mtt_info(mtt_thread *t, const mtt_req *q, mskv_request_info *i) {
    return mskv_request_info_get(t->a, q->h, i) == MSKV_SUCCESS;
}

/* Reads back one resident position of a request. */
static void mtt_check_one(mtt_thread *t, const mtt_req *q, long op) {
    mskv_request_info i;
    int64_t pos, slot;
    const float *k = (const float *)mskv_store_pool(t->a, 0, 0);
    int64_t split, live, j;
    if (!mtt_info(t, q, &i) || i.location != MSKV_RESIDENT) return;
    /* resident committed positions: [0, split) and [live_start, committed) */
    split = (int64_t)i.prefix_pages * MTT_P < i.committed ? (int64_t)i.prefix_pages * MTT_P : i.committed;
    live = i.committed > i.live_start ? i.committed - i.live_start : 0;
    if (split + live == 0) return;
    j = (int64_t)(mtt_rand(t) % (uint64_t)(split + live));
    pos = j < split ? j : i.live_start + (j - split);
    if (mskv_request_slot(t->a, q->h, pos, &slot) != MSKV_SUCCESS) { mtt_fail(t, op, "slot of a resident position", MSKV_SUCCESS); return; }
    if (k[slot] != mtt_value(q->uid, pos)) mtt_fail(t, op, "a token's bytes changed", MSKV_SUCCESS);
    t->bytes_checked++;
}

static void mtt_main(void *arg) {
    mtt_thread *t = (mtt_thread *)arg;
    long op;
    mtu_barrier_wait(t->go);  /* all threads start together, so they contend */
    for (op = 0; op < MTT_OPS && t->failures == 0; op++) {
        mtt_req *q = &t->r[mtt_rand(t) % MTT_REQS];
        mskv_request_info before, after;
        mskv_result e;
        int pick = (int)(mtt_rand(t) % 100);
        t->ops_done++;
        if (!q->used) {
            e = mskv_request_add(t->a, &q->h);
            if (e != MSKV_SUCCESS) { mtt_fail(t, op, "add", e); break; }
            q->used = 1;
            q->uid = (uint32_t)t->index << 24 | ++t->next_uid;
            continue;
        }
        if (!mtt_info(t, q, &before)) { mtt_fail(t, op, "info of an own request", MSKV_SUCCESS); break; }
        if (before.location == MSKV_OFFLOADED) {
            e = mskv_request_reload(t->a, q->h);
            if (e != MSKV_SUCCESS) mtt_fail(t, op, "reload", e);
            if (!mtt_info(t, q, &after) || after.committed != before.committed || after.location != MSKV_RESIDENT)
                mtt_fail(t, op, "reload changed the counts", MSKV_SUCCESS);
            continue;
        }
        if (before.has_reservation) {
            mskv_segment s;
            s.request = q->h;
            s.n_tokens = before.reserved;
            e = pick < 80 ? mskv_commit(t->a, &s, 1) : mskv_abort(t->a, &s, 1);
            if (e != MSKV_SUCCESS) { mtt_fail(t, op, "commit/abort", e); break; }
            if (!mtt_info(t, q, &after) || after.committed != before.committed + (pick < 80 ? before.reserved : 0) || after.reserved != 0)
                mtt_fail(t, op, "commit/abort counts", MSKV_SUCCESS);
            continue;
        }
        if (pick < 45 && before.kv_len < 48) {
            mskv_segment s;
            int64_t pos, slot;
            float *k = (float *)mskv_store_pool(t->a, 0, 0);
            s.request = q->h;
            s.n_tokens = 1 + (int64_t)(mtt_rand(t) % 6);
            e = mskv_admit(t->a, &s, 1);
            if (e != MSKV_SUCCESS) { mtt_fail(t, op, "admit", e); break; }
            for (pos = before.committed; pos < before.committed + s.n_tokens; pos++) {
                if (mskv_request_slot(t->a, q->h, pos, &slot) != MSKV_SUCCESS) { mtt_fail(t, op, "slot of a reserved token", MSKV_SUCCESS); break; }
                k[slot] = mtt_value(q->uid, pos);
            }
        } else if (pick < 60) {
            int64_t live = before.committed - (before.release_point > before.live_start ? before.release_point : before.live_start), got = -1;
            if (live <= 0) continue;
            e = mskv_request_release_oldest(t->a, q->h, 1 + (int64_t)(mtt_rand(t) % (uint64_t)live), &got);
            if (e != MSKV_SUCCESS || got < 0 || got % MTT_P != 0) mtt_fail(t, op, "release", e);
        } else if (pick < 66) {
            int64_t n = before.committed < 6 ? before.committed : 6;
            if (before.live_start > (int64_t)before.prefix_pages * MTT_P) continue;  /* a gap: the prefix is fixed */
            e = mskv_request_protect_prefix(t->a, q->h, n);
            if (e != MSKV_SUCCESS) mtt_fail(t, op, "protect", e);
        } else if (pick < 72) {
            int k;
            for (k = 0; k < MTT_REQS && t->r[k].used; k++) {}
            if (k == MTT_REQS) continue;
            e = mskv_request_fork(t->a, q->h, &t->r[k].h);
            if (e != MSKV_SUCCESS) { mtt_fail(t, op, "fork", e); break; }
            t->r[k].used = 1;
            t->r[k].uid = q->uid;  /* the child inherits every token; new ones get their own writer below */
            if (!mtt_info(t, &t->r[k], &after) || after.committed != before.committed || after.num_pages != before.num_pages)
                mtt_fail(t, op, "fork counts", MSKV_SUCCESS);
        } else if (pick < 78) {
            e = mskv_request_offload(t->a, q->h);
            if (e != MSKV_SUCCESS) mtt_fail(t, op, "offload", e);
        } else if (pick < 82) {
            e = mskv_request_remove(t->a, q->h);
            if (e != MSKV_SUCCESS) mtt_fail(t, op, "remove", e);
            q->used = 0;
        } else if (pick < 85) {
            e = mskv_publish(t->a, NULL, 0, NULL);
            if (e != MSKV_SUCCESS) mtt_fail(t, op, "publish", e);
        } else {
            mtt_check_one(t, q, op);
        }
    }
}

TEST(threads_on_their_own_requests_keep_pages_conserved_and_the_audit_passing) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mtt_thread th[MTT_THREADS];
    mtu_thread *tid[MTT_THREADS];
    mskv_arena_stats st;
    char why[256];
    uint64_t seed = mt_seed();
    mtu_barrier *go;
    int i, k, started = 0;
    long total_ops = 0, checked = 0;
    memset(&d, 0, sizeof d);
    /* every thread holds at most 3 requests of < 48 + 6 tokens: never out of pages */
    d.num_pages = 1 + MTT_THREADS * MTT_REQS * 16;
    d.page_size = MTT_P;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    memset(th, 0, sizeof th);
    go = mtu_barrier_new(MTT_THREADS);
    ASSERT_TRUE(go != NULL);
    for (i = 0; i < MTT_THREADS; i++) {
        th[i].a = a;
        th[i].go = go;
        th[i].index = i + 1;
        th[i].rng = (seed + (uint64_t)i * 0x9E3779B97F4A7C15ull) | 1;
        if ((tid[i] = mtu_thread_start(mtt_main, &th[i])) == NULL) break;
        started++;
    }
    if (started < MTT_THREADS) {
        /* the barrier would wait forever for the missing ones */
        mt_fail(__FILE__, __LINE__, "only %d threads started", started);
        exit(1);
    }
    for (i = 0; i < started; i++) mtu_thread_join(tid[i]);
    mtu_barrier_free(go);
    for (i = 0; i < MTT_THREADS; i++) {
        if (th[i].failures) mt_fail(__FILE__, __LINE__, "%s", th[i].first);
        total_ops += th[i].ops_done;
        checked += th[i].bytes_checked;
    }
    EXPECT_EQ((long)MTT_THREADS * MTT_OPS, total_ops);
    EXPECT_LT(1000, checked);
    why[0] = '\0';
    if (mskv_arena_audit(a, why, sizeof why) != MSKV_SUCCESS) mt_fail(__FILE__, __LINE__, "audit: %s", why);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(st.num_pages, st.free_pages + st.live_pages + st.pending_pages + 1);
    for (i = 0; i < MTT_THREADS; i++)
        for (k = 0; k < MTT_REQS; k++)
            if (th[i].r[k].used) EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(a, th[i].r[k].h));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(st.num_pages - 1, st.free_pages);
    EXPECT_EQ(0, st.requests);
    EXPECT_EQ(0, (int)st.offloaded_pages);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(a, NULL, 0));
    mskv_arena_destroy(a);
}
