/* The platform wrappers (mstar_kv.h's >>platform: Win32 on Windows, pthreads
   elsewhere), through tests/main.c's mtu_* doors: threads start and join,
   the mutex excludes, the condition variable (in a barrier) wakes every
   waiter and no one early, and the once flag runs its function once, with
   every caller returning after it finished. */
#include <stdlib.h>
#include "mskv_test.h"
#include "mskv_test_util.h"

#define TPL_THREADS 4

typedef struct tpl_slot { int index, result; } tpl_slot;
static void tpl_square(void *arg) {
    tpl_slot *s = (tpl_slot *)arg;
    s->result = s->index * s->index;
}

TEST(platform_threads_run_their_function_and_are_joined) {
    tpl_slot s[TPL_THREADS];
    mtu_thread *t[TPL_THREADS];
    int i, started = 0;
    for (i = 0; i < TPL_THREADS; i++) {
        s[i].index = i + 2;
        s[i].result = -1;
        if ((t[i] = mtu_thread_start(tpl_square, &s[i])) == NULL) break;
        started++;
    }
    for (i = 0; i < started; i++) mtu_thread_join(t[i]);
    ASSERT_EQ(TPL_THREADS, started);
    for (i = 0; i < TPL_THREADS; i++) EXPECT_EQ((i + 2) * (i + 2), s[i].result);
}

/* ---- mutex ---- */

#define TPL_INCREMENTS 200000L
typedef struct tpl_counter { mtu_mutex *m; mtu_barrier *go; volatile long n; } tpl_counter;
static void tpl_count(void *arg) {
    tpl_counter *c = (tpl_counter *)arg;
    long i;
    mtu_barrier_wait(c->go);      /* all at once, so they contend */
    for (i = 0; i < TPL_INCREMENTS; i++) {
        volatile int spin;
        long v;
        mtu_mutex_lock(c->m);
        v = c->n;
        for (spin = 0; spin < 32; spin++) {}   /* a wide window between read and write: */
        c->n = v + 1;                          /* without the lock, increments get lost */
        mtu_mutex_unlock(c->m);
    }
}

TEST(platform_mutex_keeps_increments_from_several_threads_exact) {
    tpl_counter c;
    mtu_thread *t[TPL_THREADS];
    int i, started = 0;
    c.m = mtu_mutex_new();
    c.go = mtu_barrier_new(TPL_THREADS);
    c.n = 0;
    ASSERT_TRUE(c.m != NULL && c.go != NULL);
    for (i = 0; i < TPL_THREADS; i++) {
        if ((t[i] = mtu_thread_start(tpl_count, &c)) == NULL) break;
        started++;
    }
    if (started < TPL_THREADS) {
        mt_fail(__FILE__, __LINE__, "only %d threads started", started);
        exit(1);
    }
    for (i = 0; i < started; i++) mtu_thread_join(t[i]);
    mtu_mutex_free(c.m);
    mtu_barrier_free(c.go);
    EXPECT_EQ((long)TPL_THREADS * TPL_INCREMENTS, c.n);
}

/* ---- condition variable, in a barrier ---- */

#define TPL_ROUNDS 300
typedef struct tpl_meet {
    mtu_barrier *b;
    mtu_mutex *m;
    int arrived[TPL_ROUNDS];
    int early;                    /* a thread that left a round before everyone arrived */
} tpl_meet;
static void tpl_meet_run(void *arg) {
    tpl_meet *g = (tpl_meet *)arg;
    int r;
    for (r = 0; r < TPL_ROUNDS; r++) {
        mtu_mutex_lock(g->m);
        g->arrived[r]++;
        mtu_mutex_unlock(g->m);
        mtu_barrier_wait(g->b);
        mtu_mutex_lock(g->m);
        if (g->arrived[r] != TPL_THREADS) g->early++;
        mtu_mutex_unlock(g->m);
    }
}

TEST(platform_condition_variable_holds_every_thread_until_all_arrive) {
    tpl_meet *g = (tpl_meet *)calloc(1, sizeof *g);
    mtu_thread *t[TPL_THREADS];
    int i, started = 0;
    ASSERT_TRUE(g != NULL);
    g->b = mtu_barrier_new(TPL_THREADS);
    g->m = mtu_mutex_new();
    ASSERT_TRUE(g->b != NULL && g->m != NULL);
    for (i = 0; i < TPL_THREADS; i++) {
        if ((t[i] = mtu_thread_start(tpl_meet_run, g)) == NULL) break;
        started++;
    }
    if (started < TPL_THREADS) {
        /* the barrier would wait forever for the missing ones */
        mt_fail(__FILE__, __LINE__, "only %d threads started", started);
        exit(1);
    }
    for (i = 0; i < started; i++) mtu_thread_join(t[i]);
    EXPECT_EQ(0, g->early);
    for (i = 0; i < TPL_ROUNDS; i++) EXPECT_EQ(TPL_THREADS, g->arrived[i]);
    mtu_barrier_free(g->b);
    mtu_mutex_free(g->m);
    free(g);
}

/* ---- once ---- */

static volatile int tpl_once_calls, tpl_once_done;
static mtu_barrier *tpl_once_go;
static void tpl_once_fn(void) {
    volatile long spin;
    tpl_once_calls++;
    for (spin = 0; spin < 2000000L; spin++) {}   /* the others arrive meanwhile and must wait */
    tpl_once_done = 1;
}
typedef struct tpl_once_seen { int done_after; } tpl_once_seen;
static void tpl_once_run(void *arg) {
    mtu_barrier_wait(tpl_once_go);
    mtu_once(tpl_once_fn);
    ((tpl_once_seen *)arg)->done_after = tpl_once_done;
}

TEST(platform_once_runs_its_function_once_and_every_caller_returns_after_it) {
    tpl_once_seen seen[TPL_THREADS];
    mtu_thread *t[TPL_THREADS];
    int i, started = 0;
    tpl_once_go = mtu_barrier_new(TPL_THREADS);
    ASSERT_TRUE(tpl_once_go != NULL);
    for (i = 0; i < TPL_THREADS; i++) {
        seen[i].done_after = -1;
        if ((t[i] = mtu_thread_start(tpl_once_run, &seen[i])) == NULL) break;
        started++;
    }
    if (started < TPL_THREADS) {
        mt_fail(__FILE__, __LINE__, "only %d threads started", started);
        exit(1);
    }
    for (i = 0; i < started; i++) mtu_thread_join(t[i]);
    mtu_barrier_free(tpl_once_go);
    EXPECT_EQ(1, tpl_once_calls);
    for (i = 0; i < TPL_THREADS; i++) EXPECT_EQ(1, seen[i].done_after);
    mtu_once(tpl_once_fn);                      /* and never again */
    EXPECT_EQ(1, tpl_once_calls);
}
