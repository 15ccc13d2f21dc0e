/* The thread stress, built under ThreadSanitizer (make test: build/tests-tsan;
   longer: make stress). Eight threads drive one arena at once, each through
   MSKV_STRESS_OPS operations (default 10^5) on requests of its own: admit /
   plan / K/V write / commit or abort, release, protect, fork, offload /
   reload, export / import, pause / resume, remove, publish and retire, a
   keyed entry of its own read through cross plans, and attention on two
   mskv_cpu shared by all threads (one with a single thread, one with a
   pool). A ninth thread watches: audit, stats (pages conserved) and digest,
   over and over. Two phases: FENCED retirement, then IMMEDIATE; a third
   (below) on two layer groups with lockstep pairs, make_room and flush,
   then reset. TSan halts
   on its first report, so any data race fails the program; at the end the
   audit passes and every page is back. */
#define _POSIX_C_SOURCE 200809L  /* pthread barriers under -std=c99 */
#include <pthread.h>
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
/* a report is a failure, not a warning in the log */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "halt_on_error=1:abort_on_error=0:exitcode=66"; }
#endif
#endif

#define MST_THREADS 8
#define MST_REQS 3
#define MST_P 4
#define MST_DIM 8
#define MST_MAX_KV 40

typedef struct mst_req { int used; mskv_request h; uint32_t uid; } mst_req;

typedef struct mst_shared {
    mskv_arena *a;
    mskv_cpu *cpu1, *cpuN;
    pthread_barrier_t *go;
    int fenced;
    long ops;
    volatile int done;   /* written under `lock` */
    pthread_mutex_t lock;
} mst_shared;

typedef struct mst_thread {
    mst_shared *sh;
    int index;
    uint64_t rng;
    mst_req r[MST_REQS];
    mskv_request keyed;
    int has_keyed;
    uint64_t key_serial;
    uint32_t next_uid;
    long failures, ops_done, attn_calls, bytes_checked, imports;
    char first[256];
    /* plan arrays of a fixed capacity, reused by every call of this thread */
    int32_t qo[2], kvp[2], idx[64], last[1], kvl[1], split[1], shift[1], pos[16], vse[1], vws[1];
    int64_t tok[2], slots[16];
    mskv_request plan_reqs[1];   /* so a plan is stale only when its own request loses pages */
    float kbuf[16 * MST_DIM], vbuf[16 * MST_DIM], q[16 * 2 * MST_DIM], o[16 * 2 * MST_DIM], lse[16 * 2];
} mst_thread;

static uint64_t mst_rand(mst_thread *t) {
    uint64_t x = t->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    t->rng = x;
    return x * 2685821657736338717ull;
}
static void mst_fail(mst_thread *t, long op, const char *what, mskv_result e) {
    if (t->failures++ == 0)
        snprintf(t->first, sizeof t->first, "thread %d op %ld: %s (%d %s)", t->index, op, what, (int)e, mskv_result_string(e));
}
static float mst_value(uint32_t uid, int64_t pos) { return (float)((uid * 40503u + (uint32_t)pos * 977u) & 0xFFFFFu); }

static void mst_plan_arrays(mst_thread *t, mskv_plan *p) {
    memset(p, 0, sizeof *p);
    p->qo_indptr = t->qo; p->kv_indptr = t->kvp; p->kv_indices = t->idx; p->kv_last_page_len = t->last;
    p->kv_len = t->kvl; p->kv_pos_split = t->split; p->kv_pos_shift = t->shift; p->kv_token_indptr = t->tok;
    p->slot_mapping = t->slots; p->positions = t->pos; p->requests = t->plan_reqs;
    p->vis_sink_end = t->vse; p->vis_window_start = t->vws;   /* exact visibility (the default) may need them */
    p->cap_batch = 1; p->cap_tokens = 16; p->cap_page_ids = 64;
}

/* In FENCED mode pages come back only when a fence retires: out of pages is
   then a moment to end the step, not a failure. */
static int mst_short_of_pages(mst_thread *t, mskv_result e) {
    uint64_t step = 0;
    if (e != MSKV_ERROR_OUT_OF_PAGES || !t->sh->fenced) return 0;
    if (mskv_publish(t->sh->a, NULL, 0, &step) == MSKV_SUCCESS) (void)mskv_arena_retire(t->sh->a, step);
    return 1;
}

/* Admit, plan, write K/V of the new tokens (their values say whose they are). */
static void mst_admit_write(mst_thread *t, mst_req *q, long op) {
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d;
    mskv_result e;
    int64_t i;
    s.request = q->h;
    s.n_tokens = 1 + (int64_t)(mst_rand(t) % 6);
    e = mskv_admit(t->sh->a, &s, 1);
    if (mst_short_of_pages(t, e)) return;
    if (e != MSKV_SUCCESS) { mst_fail(t, op, "admit", e); return; }
    memset(&d, 0, sizeof d);
    d.pos_mode = MSKV_POS_1D;
    mst_plan_arrays(t, &p);
    e = mskv_plan_build(t->sh->a, &s, 1, &d, &p);
    if (e != MSKV_SUCCESS) { mst_fail(t, op, "plan of an admitted segment", e); return; }
    for (i = 0; i < p.total_q; i++) {
        int k;
        for (k = 0; k < MST_DIM; k++) t->kbuf[i * MST_DIM + k] = t->vbuf[i * MST_DIM + k] = mst_value(q->uid, t->pos[i]);
    }
    e = mskv_cpu_write_kv(t->sh->a, 0, &p, t->kbuf, t->vbuf, MSKV_DTYPE_F32, NULL);
    if (e != MSKV_SUCCESS) mst_fail(t, op, "write_kv", e);
}

/* The last token of a request (or one query against the keyed entry)
   attends on one of the shared mskv_cpu; with every key equal to one value,
   the output is that value. */
static void mst_attend(mst_thread *t, mst_req *q, int cross, long op) {
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d;
    mskv_attn at;
    mskv_request_info info;
    mskv_result e;
    int k;
    if (mskv_request_info_get(t->sh->a, q->h, &info) != MSKV_SUCCESS || info.location != MSKV_RESIDENT || info.kv_len < 1 ||
        info.has_reservation)
        return;
    s.request = q->h;
    s.n_tokens = 1;
    memset(&d, 0, sizeof d);
    if (cross) { d.kind = MSKV_PLAN_CROSS; d.cross = t->keyed; }
    mst_plan_arrays(t, &p);
    e = mskv_plan_build(t->sh->a, &s, 1, &d, &p);
    if (e != MSKV_SUCCESS) { mst_fail(t, op, cross ? "cross plan" : "self plan", e); return; }
    for (k = 0; k < 2 * MST_DIM; k++) t->q[k] = 0.125f;
    memset(&at, 0, sizeof at);
    at.q_heads = 2;
    at.mask = cross ? MSKV_MASK_NONE : MSKV_MASK_CAUSAL;
    e = mskv_cpu_attention(mst_rand(t) & 1 ? t->sh->cpu1 : t->sh->cpuN, t->sh->a, 0, &p, &at, t->q, t->o, t->lse);
    if (e != MSKV_SUCCESS) { mst_fail(t, op, "attention", e); return; }
    t->attn_calls++;
}

static void mst_keyed(mst_thread *t, long op) {
    mskv_result e;
    if (!t->has_keyed) {
        mskv_segment s;
        mskv_plan p;
        mskv_plan_desc d;
        int64_t i;
        uint64_t key = (uint64_t)t->index << 32 | ++t->key_serial;
        e = mskv_keyed_create(t->sh->a, key, 1 + (int64_t)(mst_rand(t) % 9), &t->keyed);
        if (mst_short_of_pages(t, e)) return;
        if (e != MSKV_SUCCESS) { mst_fail(t, op, "keyed_create", e); return; }
        s.request = t->keyed;
        s.n_tokens = 0;
        memset(&d, 0, sizeof d);
        mst_plan_arrays(t, &p);
        /* the entry's reserved tokens are its own queries: a self plan writes them */
        {
            mskv_request_info info;
            if (mskv_request_info_get(t->sh->a, t->keyed, &info) != MSKV_SUCCESS) { mst_fail(t, op, "keyed info", MSKV_SUCCESS); return; }
            s.n_tokens = info.reserved;
        }
        e = mskv_plan_build(t->sh->a, &s, 1, &d, &p);
        if (e != MSKV_SUCCESS) { mst_fail(t, op, "keyed plan", e); return; }
        for (i = 0; i < p.total_q * MST_DIM; i++) t->kbuf[i] = t->vbuf[i] = 1.0f;
        e = mskv_cpu_write_kv(t->sh->a, 0, &p, t->kbuf, t->vbuf, MSKV_DTYPE_F32, NULL);
        if (e == MSKV_SUCCESS) e = mskv_keyed_seal(t->sh->a, t->keyed);
        if (e != MSKV_SUCCESS) { mst_fail(t, op, "keyed write + seal", e); return; }
        t->has_keyed = 1;
        return;
    }
    if (mst_rand(t) % 4 == 0) {
        mskv_request found;
        uint64_t key = (uint64_t)t->index << 32 | t->key_serial;
        e = mskv_keyed_find(t->sh->a, key, &found);
        if (e != MSKV_SUCCESS || found.id != t->keyed.id) { mst_fail(t, op, "keyed_find of an own key", e); return; }
        e = mskv_keyed_remove(t->sh->a, key);
        if (e != MSKV_SUCCESS) mst_fail(t, op, "keyed_remove", e);
        t->has_keyed = 0;
        return;
    }
    {   /* someone else's key: found or not, never an error other than NOT_FOUND */
        mskv_request found;
        uint64_t key = (uint64_t)(1 + mst_rand(t) % MST_THREADS) << 32 | (1 + mst_rand(t) % 4);
        e = mskv_keyed_find(t->sh->a, key, &found);
        if (e != MSKV_SUCCESS && e != MSKV_ERROR_NOT_FOUND) mst_fail(t, op, "keyed_find", e);
    }
    {
        int k;
        for (k = 0; k < MST_REQS; k++)
            if (t->r[k].used) { mst_attend(t, &t->r[k], 1, op); break; }
    }
}

/* Export a request, import the blob as a new one, reload it, compare its
   first token's bytes, and keep it where there is room. */
static void mst_export_import(mst_thread *t, mst_req *q, long op) {
    size_t size = 0;
    unsigned char *blob;
    mskv_request h;
    mskv_result e;
    int k;
    if (mskv_request_export(t->sh->a, q->h, NULL, 0, &size) != MSKV_SUCCESS) { mst_fail(t, op, "export size", MSKV_SUCCESS); return; }
    blob = (unsigned char *)malloc(size);
    if (!blob) return;
    e = mskv_request_export(t->sh->a, q->h, blob, size, &size);
    if (e == MSKV_SUCCESS) e = mskv_request_import(t->sh->a, blob, size, &h);
    free(blob);
    if (e == MSKV_ERROR_TOO_MANY_REQUESTS) return;
    if (e != MSKV_SUCCESS) { mst_fail(t, op, "export + import", e); return; }
    t->imports++;
    for (k = 0; k < MST_REQS && t->r[k].used; k++) {}
    if (k == MST_REQS) {
        if ((e = mskv_request_remove(t->sh->a, h)) != MSKV_SUCCESS) mst_fail(t, op, "remove an import", e);
        return;
    }
    t->r[k].used = 1;
    t->r[k].h = h;
    t->r[k].uid = q->uid;   /* the same tokens */
}

static void mst_check_bytes(mst_thread *t, const mst_req *q, long op) {
    mskv_request_info i;
    int64_t pos, slot, split, live, j;
    const float *k = (const float *)mskv_store_pool(t->sh->a, 0, 0);
    if (mskv_request_info_get(t->sh->a, q->h, &i) != MSKV_SUCCESS || i.location != MSKV_RESIDENT) return;
    split = (int64_t)i.prefix_pages * MST_P < i.committed ? (int64_t)i.prefix_pages * MST_P : i.committed;
    live = i.committed > i.live_start ? i.committed - i.live_start : 0;
    if (split + live == 0) return;
    j = (int64_t)(mst_rand(t) % (uint64_t)(split + live));
    pos = j < split ? j : i.live_start + (j - split);
    if (mskv_request_slot(t->sh->a, q->h, pos, &slot) != MSKV_SUCCESS) { mst_fail(t, op, "slot of a resident position", MSKV_SUCCESS); return; }
    if (k[slot * MST_DIM] != mst_value(q->uid, pos)) mst_fail(t, op, "a token's bytes changed", MSKV_SUCCESS);
    t->bytes_checked++;
}

static void mst_one_op(mst_thread *t, long op) {
    mskv_arena *a = t->sh->a;
    mst_req *q = &t->r[mst_rand(t) % MST_REQS];
    mskv_request_info before;
    mskv_result e;
    int pick = (int)(mst_rand(t) % 100);
    if (!q->used) {
        e = mskv_request_add(a, &q->h);
        if (e != MSKV_SUCCESS) { mst_fail(t, op, "add", e); return; }
        q->used = 1;
        q->uid = (uint32_t)t->index << 24 | ++t->next_uid;
        return;
    }
    if (mskv_request_info_get(a, q->h, &before) != MSKV_SUCCESS) { mst_fail(t, op, "info of an own request", MSKV_SUCCESS); return; }
    if (before.location == MSKV_OFFLOADED) {
        e = mskv_request_reload(a, q->h);
        if (!mst_short_of_pages(t, e) && e != MSKV_SUCCESS) mst_fail(t, op, "reload", e);
        return;
    }
    if (before.has_reservation) {
        mskv_segment s;
        s.request = q->h;
        s.n_tokens = before.reserved;
        e = pick < 80 ? mskv_commit(a, &s, 1) : mskv_abort(a, &s, 1);
        if (e != MSKV_SUCCESS) mst_fail(t, op, "commit/abort", e);
        return;
    }
    if (pick < 28) {
        if (before.kv_len < MST_MAX_KV) mst_admit_write(t, q, op);
    } else if (pick < 38) {
        mst_attend(t, q, 0, op);
    } else if (pick < 46) {
        int64_t live = before.committed - (before.release_point > before.live_start ? before.release_point : before.live_start);
        if (live > 0 && (e = mskv_request_release_oldest(a, q->h, 1 + (int64_t)(mst_rand(t) % (uint64_t)live), NULL)) != MSKV_SUCCESS)
            mst_fail(t, op, "release", e);
    } else if (pick < 50) {
        int64_t n = before.committed < 6 ? before.committed : 6;
        if (before.live_start <= (int64_t)before.prefix_pages * MST_P && (e = mskv_request_protect_prefix(a, q->h, n)) != MSKV_SUCCESS)
            mst_fail(t, op, "protect", e);
    } else if (pick < 54) {
        int k;
        for (k = 0; k < MST_REQS && t->r[k].used; k++) {}
        if (k == MST_REQS) return;
        e = mskv_request_fork(a, q->h, &t->r[k].h);
        if (mst_short_of_pages(t, e)) return;
        if (e != MSKV_SUCCESS) { mst_fail(t, op, "fork", e); return; }
        t->r[k].used = 1;
        t->r[k].uid = q->uid;
    } else if (pick < 60) {
        if ((e = mskv_request_offload(a, q->h)) != MSKV_SUCCESS) mst_fail(t, op, "offload", e);
    } else if (pick < 63) {
        mst_export_import(t, q, op);
    } else if (pick < 66) {
        mskv_segment s;
        s.request = q->h;
        s.n_tokens = 1;
        if ((e = mskv_request_pause(a, q->h)) != MSKV_SUCCESS) { mst_fail(t, op, "pause", e); return; }
        if ((e = mskv_admit(a, &s, 1)) != MSKV_ERROR_BAD_STATE) mst_fail(t, op, "admit of a paused request", e);
        if ((e = mskv_request_resume(a, q->h)) != MSKV_SUCCESS) mst_fail(t, op, "resume", e);
    } else if (pick < 69) {
        if ((e = mskv_request_remove(a, q->h)) != MSKV_SUCCESS) mst_fail(t, op, "remove", e);
        q->used = 0;
    } else if (pick < 74) {
        uint64_t step = 0;
        if ((e = mskv_publish(a, NULL, 0, &step)) != MSKV_SUCCESS) mst_fail(t, op, "publish", e);
        else if (t->sh->fenced && (e = mskv_arena_retire(a, step)) != MSKV_SUCCESS) mst_fail(t, op, "retire", e);
    } else if (pick < 80) {
        mst_keyed(t, op);
    } else if (pick < 83) {
        if ((e = mskv_request_reserve(a, q->h, MST_MAX_KV + 8)) != MSKV_SUCCESS) mst_fail(t, op, "reserve", e);
    } else {
        mst_check_bytes(t, q, op);
    }
}

static void *mst_worker(void *arg) {
    mst_thread *t = (mst_thread *)arg;
    long op;
    pthread_barrier_wait(t->sh->go);
    for (op = 0; op < t->sh->ops && t->failures == 0; op++) {
        mst_one_op(t, op);
        t->ops_done++;
    }
    return NULL;
}

typedef struct mst_observer { mst_shared *sh; long audits, failures; char first[256]; } mst_observer;

static void *mst_watch(void *arg) {
    mst_observer *w = (mst_observer *)arg;
    int done = 0;
    pthread_barrier_wait(w->sh->go);
    while (!done) {
        char why[256];
        mskv_arena_stats st;
        why[0] = '\0';
        if (mskv_arena_audit(w->sh->a, why, sizeof why) != MSKV_SUCCESS && w->failures++ == 0)
            snprintf(w->first, sizeof w->first, "audit during the run: %s", why);
        if (mskv_arena_stats_get(w->sh->a, &st) != MSKV_SUCCESS ||
            st.num_pages != st.free_pages + st.live_pages + st.pending_pages + 1) {
            if (w->failures++ == 0) snprintf(w->first, sizeof w->first, "pages not conserved during the run");
        }
        (void)mskv_arena_digest(w->sh->a);
        w->audits++;
        pthread_mutex_lock(&w->sh->lock);
        done = w->sh->done;
        pthread_mutex_unlock(&w->sh->lock);
    }
    return NULL;
}

static long mst_ops_per_thread(void) {
    const char *env = getenv("MSKV_STRESS_OPS");
    long n = env && *env ? strtol(env, NULL, 10) : 0;
    return n > 0 ? n : 100000L;
}

static void mst_phase(int fenced) {
    mskv_arena_desc d;
    mskv_cpu_desc cd;
    mst_shared sh;
    mst_thread *th;
    mst_observer w;
    pthread_t tid[MST_THREADS + 1];
    pthread_barrier_t go;
    mskv_arena_stats st;
    uint64_t seed = mt_seed(), step = 0;
    long total = 0, attn = 0, checked = 0, imports = 0;
    int i, k, started = 0;
    memset(&sh, 0, sizeof sh);
    memset(&d, 0, sizeof d);
    /* every thread holds at most 3 requests of < 40 + 6 tokens and an entry of
       <= 9: never out of pages in IMMEDIATE mode */
    d.num_pages = 1 + MST_THREADS * (MST_REQS * 13 + 4);
    d.page_size = MST_P;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = MST_DIM;
    d.retire_mode = fenced ? MSKV_RETIRE_FENCED : MSKV_RETIRE_IMMEDIATE;
    d.max_requests = MST_THREADS * (MST_REQS + 1) + 8;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &sh.a));
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &sh.cpu1));
    cd.num_threads = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &sh.cpuN));
    sh.fenced = fenced;
    sh.ops = mst_ops_per_thread();
    sh.go = &go;
    ASSERT_EQ(0, pthread_mutex_init(&sh.lock, NULL));
    th = (mst_thread *)calloc(MST_THREADS, sizeof *th);
    ASSERT_TRUE(th != NULL);
    memset(&w, 0, sizeof w);
    w.sh = &sh;
    ASSERT_EQ(0, pthread_barrier_init(&go, NULL, MST_THREADS + 1));
    for (i = 0; i < MST_THREADS; i++) {
        th[i].sh = &sh;
        th[i].index = i + 1;
        th[i].rng = (seed + (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)fenced) | 1;
        if (pthread_create(&tid[i], NULL, mst_worker, &th[i]) != 0) break;
        started++;
    }
    if (started == MST_THREADS && pthread_create(&tid[MST_THREADS], NULL, mst_watch, &w) == 0) started++;
    if (started < MST_THREADS + 1) {
        mt_fail(__FILE__, __LINE__, "only %d threads started", started);
        exit(1);   /* the barrier would wait forever for the missing ones */
    }
    for (i = 0; i < MST_THREADS; i++) pthread_join(tid[i], NULL);
    pthread_mutex_lock(&sh.lock);
    sh.done = 1;
    pthread_mutex_unlock(&sh.lock);
    pthread_join(tid[MST_THREADS], NULL);
    pthread_barrier_destroy(&go);
    for (i = 0; i < MST_THREADS; i++) {
        if (th[i].failures) mt_fail(__FILE__, __LINE__, "%s", th[i].first);
        total += th[i].ops_done; attn += th[i].attn_calls; checked += th[i].bytes_checked; imports += th[i].imports;
    }
    if (w.failures) mt_fail(__FILE__, __LINE__, "observer: %s", w.first);
    printf("  %s: %d threads x %ld operations = %ld (%ld attention calls, %ld byte checks, %ld imports), %ld audits by the observer\n",
           fenced ? "FENCED" : "IMMEDIATE", MST_THREADS, sh.ops, total, attn, checked, imports, w.audits);
    EXPECT_EQ((long)MST_THREADS * sh.ops, total);
    EXPECT_LT(100, attn);
    EXPECT_LT(1, w.audits);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(sh.a, NULL, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(sh.a, &st));
    EXPECT_EQ(st.num_pages, st.free_pages + st.live_pages + st.pending_pages + 1);
    for (i = 0; i < MST_THREADS; i++) {
        for (k = 0; k < MST_REQS; k++)
            if (th[i].r[k].used) EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(sh.a, th[i].r[k].h));
        if (th[i].has_keyed) EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(sh.a, th[i].keyed));
    }
    EXPECT_EQ(MSKV_SUCCESS, mskv_publish(sh.a, NULL, 0, &step));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_retire(sh.a, step));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(sh.a, &st));
    EXPECT_EQ(st.num_pages - 1, st.free_pages);
    EXPECT_EQ(0, st.requests);
    EXPECT_EQ(0, (int)st.offloaded_pages);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(sh.a, NULL, 0));
    free(th);
    pthread_mutex_destroy(&sh.lock);
    mskv_cpu_destroy(sh.cpu1);
    mskv_cpu_destroy(sh.cpuN);
    mskv_arena_destroy(sh.a);
}

TEST(stress_eight_threads_on_one_fenced_arena_race_nothing_and_conserve_pages) { mst_phase(1); }
TEST(stress_eight_threads_on_one_immediate_arena_race_nothing_and_conserve_pages) { mst_phase(0); }

/* ---- lockstep groups, layer groups, make_room, flush; reset ------------------------ */
/* A third phase on an arena of two layer groups (IMMEDIATE): each thread
   steps a lockstep pair of its own (segments, admit, a plan of either
   group, K/V write, commit or abort; release, offload/reload, dissolve and
   re-form, remove) and a request of its own through the *_in_group calls,
   and asks admit_query, flush and publish. make_room parks whatever is
   idle, other threads' requests too: a scheduler calls it between steps,
   when no kernel reads those pages, so here it takes a write lock that
   every other operation holds for reading (the observer audits without
   it). A thread finds its request or pair parked at its next operation and
   reloads it. At the end mskv_arena_reset runs in a phase of its own (it
   drops every thread's requests), with the observer still auditing. */

#define MSG_KV 24   /* tokens a request grows to before it releases instead */

typedef struct msg_shared {
    mst_shared base;
    pthread_rwlock_t rw;
    pthread_mutex_t turn;   /* writer first: readers pass it before taking rw */
} msg_shared;

typedef struct msg_thread {
    msg_shared *sh;
    int index;
    uint64_t rng;
    mskv_request pair[2], solo;
    mskv_lockstep ls;
    int has_pair, has_solo;
    mskv_plan plan;
    long failures, ops_done, steps, room_calls, parked, reloads;
    char first[256];
    float k[16 * MST_DIM], v[16 * MST_DIM], q[16 * 2 * MST_DIM], o[16 * 2 * MST_DIM], lse[16 * 2];
} msg_thread;

static uint64_t msg_rand(msg_thread *t) {
    uint64_t x = t->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    t->rng = x;
    return x * 2685821657736338717ull;
}
static int msg_fail(msg_thread *t, long op, const char *what, mskv_result e) {
    if (t->failures++ == 0)
        snprintf(t->first, sizeof t->first, "thread %d op %ld: %s (%d %s)", t->index, op, what, (int)e, mskv_result_string(e));
    return 0;
}
#define MSG_OK(t, op, what, call)                                               \
    do {                                                                        \
        mskv_result msg__e = (call);                                            \
        if (msg__e != MSKV_SUCCESS) { msg_fail(t, op, what, msg__e); return; } \
    } while (0)

/* admit n tokens for segs, plan them in group g, write K/V, commit (or abort) */
static void msg_step(msg_thread *t, mskv_segment *segs, int32_t n, int32_t g, long op) {
    mskv_arena *a = t->sh->base.a;
    mskv_plan_desc d;
    int64_t i;
    MSG_OK(t, op, "admit", mskv_admit(a, segs, n));
    memset(&d, 0, sizeof d);
    d.group = g;
    d.pos_mode = MSKV_POS_1D;
    MSG_OK(t, op, "plan of an admitted batch", mskv_plan_build(a, segs, n, &d, &t->plan));
    for (i = 0; i < t->plan.total_q * MST_DIM; i++) t->k[i] = t->v[i] = (float)(t->index + g);
    MSG_OK(t, op, "write_kv in a group", mskv_cpu_write_kv(a, 0, &t->plan, t->k, t->v, MSKV_DTYPE_F32, NULL));
    if (msg_rand(t) % 5) MSG_OK(t, op, "commit", mskv_commit(a, segs, n));
    else MSG_OK(t, op, "abort", mskv_abort(a, segs, n));
    t->steps++;
}

/* the fewest live tokens of group g over the requests */
static int64_t msg_live(msg_thread *t, const mskv_request *r, int n, int32_t g) {
    int64_t least = INT64_MAX;
    int i;
    for (i = 0; i < n; i++) {
        mskv_request_info info;
        int64_t from;
        if (mskv_request_info_in_group(t->sh->base.a, r[i], g, &info) != MSKV_SUCCESS) return 0;
        from = info.release_point > info.live_start ? info.release_point : info.live_start;
        if (info.committed - from < least) least = info.committed - from;   /* still visible */
    }
    return least > 0 ? least : 0;   /* live_start runs ahead of committed behind a partial prefix page */
}

static void msg_pair_op(msg_thread *t, const mskv_request_info *info, int pick, int32_t g, long op) {
    mskv_arena *a = t->sh->base.a;
    mskv_segment segs[2];
    mskv_request got[2];
    int32_t n = 0;
    if (pick < 35) {
        if (info->committed + 4 > MSG_KV) pick = 40;   /* long enough: release instead */
        else {
            MSG_OK(t, op, "lockstep_segments", mskv_lockstep_segments(a, t->ls, 1 + (int64_t)(msg_rand(t) % 4), segs, 2, &n));
            msg_step(t, segs, n, g, op);
            return;
        }
    }
    if (pick < 45) {
        int64_t live = msg_live(t, t->pair, 2, g);
        MSG_OK(t, op, "lockstep_release_oldest",
               mskv_lockstep_release_oldest(a, t->ls, g, (int64_t)(msg_rand(t) % (uint64_t)(live + 1)), NULL));
    } else if (pick < 50) {
        MSG_OK(t, op, "lockstep_offload", mskv_lockstep_offload(a, t->ls));
    } else if (pick < 55) {
        MSG_OK(t, op, "lockstep_members", mskv_lockstep_members(a, t->ls, got, 2, &n));
        if (n != 2 || got[0].id != t->pair[0].id || got[1].id != t->pair[1].id) msg_fail(t, op, "members in order", MSKV_SUCCESS);
        MSG_OK(t, op, "lockstep_dissolve", mskv_lockstep_dissolve(a, t->ls));
        MSG_OK(t, op, "lockstep_create again", mskv_lockstep_create(a, t->pair, 2, &t->ls));
    } else if (pick < 58) {
        MSG_OK(t, op, "lockstep_remove", mskv_lockstep_remove(a, t->ls));
        t->has_pair = 0;
    } else {   /* what a scheduler asks: the pages a step needs, each group's view */
        int64_t pages = -1, slot = 0;
        int32_t ids[32], count = 0, k;
        MSG_OK(t, op, "lockstep_segments", mskv_lockstep_segments(a, t->ls, 4, segs, 2, &n));
        MSG_OK(t, op, "admit_query", mskv_admit_query(a, segs, n, &pages));
        if (pages < 0) msg_fail(t, op, "admit_query gave a negative count", MSKV_SUCCESS);
        for (k = 0; k < 2; k++) {
            mskv_request_info gi;
            MSG_OK(t, op, "info_in_group", mskv_request_info_in_group(a, t->pair[1], k, &gi));
            MSG_OK(t, op, "pages_in_group", mskv_request_pages_in_group(a, t->pair[1], k, ids, 32, &count));
            if (count != gi.num_pages) msg_fail(t, op, "pages_in_group against info_in_group", MSKV_SUCCESS);
            if (gi.committed > gi.live_start)
                MSG_OK(t, op, "slot_in_group", mskv_request_slot_in_group(a, t->pair[1], k, gi.committed - 1, &slot));
        }
    }
}

static void msg_solo_op(msg_thread *t, const mskv_request_info *info, int pick, int32_t g, long op) {
    mskv_arena *a = t->sh->base.a;
    mskv_segment s;
    mskv_request_info gi;
    s.request = t->solo;
    if (pick < 35 && info->committed + 4 <= MSG_KV) {
        s.n_tokens = 1 + (int64_t)(msg_rand(t) % 4);
        msg_step(t, &s, 1, g, op);
    } else if (pick < 50) {
        int64_t live = msg_live(t, &t->solo, 1, g);
        MSG_OK(t, op, "release_oldest_in_group",
               mskv_request_release_oldest_in_group(a, t->solo, g, (int64_t)(msg_rand(t) % (uint64_t)(live + 1)), NULL));
    } else if (pick < 58) {
        MSG_OK(t, op, "info_in_group", mskv_request_info_in_group(a, t->solo, g, &gi));
        if (gi.live_start <= (int64_t)gi.prefix_pages * MST_P)
            MSG_OK(t, op, "protect_prefix_in_group",
                   mskv_request_protect_prefix_in_group(a, t->solo, g, gi.committed < 6 ? gi.committed : 6));
    } else if (pick < 63) {
        MSG_OK(t, op, "offload", mskv_request_offload(a, t->solo));
    } else if (pick < 66) {
        MSG_OK(t, op, "remove", mskv_request_remove(a, t->solo));
        t->has_solo = 0;
    } else if (msg_live(t, &t->solo, 1, g) > 0) {   /* the last token, live in group g, attends there */
        mskv_plan_desc d;
        mskv_attn at;
        int k;
        s.n_tokens = 1;
        memset(&d, 0, sizeof d);
        d.group = g;
        MSG_OK(t, op, "plan in a group", mskv_plan_build(a, &s, 1, &d, &t->plan));
        for (k = 0; k < 2 * MST_DIM; k++) t->q[k] = 0.125f;
        memset(&at, 0, sizeof at);
        at.q_heads = 2;
        at.mask = MSKV_MASK_CAUSAL;
        MSG_OK(t, op, "attention in a group",
               mskv_cpu_attention(msg_rand(t) & 1 ? t->sh->base.cpu1 : t->sh->base.cpuN, a, 0, &t->plan, &at, t->q, t->o, t->lse));
    }
}

/* with every other thread between operations: park idle requests, anyone's */
static void msg_make_room(msg_thread *t, long op) {
    mskv_arena *a = t->sh->base.a;
    mskv_arena_stats st;
    mskv_request parked[64];
    int32_t n = 0;
    int64_t need;
    mskv_result e;
    pthread_mutex_lock(&t->sh->turn);
    pthread_rwlock_wrlock(&t->sh->rw);
    pthread_mutex_unlock(&t->sh->turn);
    if ((e = mskv_arena_stats_get(a, &st)) != MSKV_SUCCESS) msg_fail(t, op, "stats", e);
    need = (int64_t)st.free_pages + 1 + (int64_t)(msg_rand(t) % 6);
    e = mskv_make_room(a, need, UINT64_MAX, NULL, 0, parked, 64, &n);
    t->room_calls++;
    if (e == MSKV_SUCCESS) {
        t->parked += n;
        if (mskv_arena_stats_get(a, &st) != MSKV_SUCCESS || (int64_t)st.free_pages < need)
            msg_fail(t, op, "make_room succeeded without the room", MSKV_SUCCESS);
    } else if (e != MSKV_ERROR_OUT_OF_PAGES) {   /* not enough idle requests: nothing parked */
        msg_fail(t, op, "make_room", e);
    }
    pthread_rwlock_unlock(&t->sh->rw);
}

static void msg_one_op(msg_thread *t, long op) {
    mskv_arena *a = t->sh->base.a;
    mskv_request_info info;
    int pick = (int)(msg_rand(t) % 100);
    int32_t g = (int32_t)(msg_rand(t) % 2);
    mskv_result e;
    if (pick < 2) { msg_make_room(t, op); return; }
    pthread_mutex_lock(&t->sh->turn);
    pthread_rwlock_rdlock(&t->sh->rw);
    pthread_mutex_unlock(&t->sh->turn);
    if (!t->has_pair) {
        if ((e = mskv_request_add(a, &t->pair[0])) != MSKV_SUCCESS) msg_fail(t, op, "add", e);
        else if ((e = mskv_request_add(a, &t->pair[1])) != MSKV_SUCCESS) msg_fail(t, op, "add", e);
        else if ((e = mskv_lockstep_create(a, t->pair, 2, &t->ls)) != MSKV_SUCCESS) msg_fail(t, op, "lockstep_create", e);
        else t->has_pair = 1;
    } else if (!t->has_solo) {
        if ((e = mskv_request_add(a, &t->solo)) != MSKV_SUCCESS) msg_fail(t, op, "add", e);
        else t->has_solo = 1;
    } else if (pick < 5) {
        uint64_t step = 0;
        if ((e = mskv_arena_flush(a)) != MSKV_SUCCESS) msg_fail(t, op, "flush", e);
        else if ((e = mskv_publish(a, NULL, 0, &step)) != MSKV_SUCCESS) msg_fail(t, op, "publish", e);
    } else {
        mskv_request which = msg_rand(t) & 1 ? t->pair[0] : t->solo;
        if ((e = mskv_request_info_get(a, which, &info)) != MSKV_SUCCESS) msg_fail(t, op, "info of an own request", e);
        else if (info.location == MSKV_OFFLOADED) {   /* offloaded here, or parked by anyone's make_room */
            e = which.id == t->solo.id ? mskv_request_reload(a, t->solo) : mskv_lockstep_reload(a, t->ls);
            if (e != MSKV_SUCCESS) msg_fail(t, op, "reload", e);
            t->reloads++;
        } else if (which.id == t->solo.id) msg_solo_op(t, &info, pick, g, op);
        else msg_pair_op(t, &info, pick, g, op);
    }
    pthread_rwlock_unlock(&t->sh->rw);
}

static void *msg_worker(void *arg) {
    msg_thread *t = (msg_thread *)arg;
    long op;
    pthread_barrier_wait(t->sh->base.go);
    for (op = 0; op < t->sh->base.ops && t->failures == 0; op++) {
        msg_one_op(t, op);
        t->ops_done++;
    }
    return NULL;
}

TEST(stress_eight_threads_with_lockstep_pairs_layer_groups_and_make_room_race_nothing_then_reset_empties_the_arena) {
    mskv_arena_desc d;
    mskv_cpu_desc cd;
    msg_shared sh;
    msg_thread *th;
    mst_observer w;
    pthread_t tid[MST_THREADS + 1];
    pthread_barrier_t go;
    mskv_arena_stats st;
    mskv_request_info info;
    mskv_request any[2];
    uint64_t seed = mt_seed();
    long total = 0, steps = 0, rooms = 0, parked = 0, reloads = 0;
    int32_t n = 0;
    int i, started = 0;
    memset(&sh, 0, sizeof sh);
    memset(&d, 0, sizeof d);
    /* three requests of <= MSG_KV tokens per thread, 2 groups: never out of pages */
    d.num_pages = 1 + MST_THREADS * 3 * 2 * (MSG_KV / MST_P + 1);
    d.page_size = MST_P;
    d.num_groups = 2;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = MST_DIM;
    d.retire_mode = MSKV_RETIRE_IMMEDIATE;
    d.max_requests = MST_THREADS * 3 + 8;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &sh.base.a));
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &sh.base.cpu1));
    cd.num_threads = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &sh.base.cpuN));
    sh.base.ops = mst_ops_per_thread() / 4;   /* each operation here is several calls */
    sh.base.go = &go;
    ASSERT_EQ(0, pthread_mutex_init(&sh.base.lock, NULL));
    ASSERT_EQ(0, pthread_mutex_init(&sh.turn, NULL));
    ASSERT_EQ(0, pthread_rwlock_init(&sh.rw, NULL));
    th = (msg_thread *)calloc(MST_THREADS, sizeof *th);
    ASSERT_TRUE(th != NULL);
    for (i = 0; i < MST_THREADS; i++)
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(sh.base.a, 2, 16, 64, &th[i].plan));
    memset(&w, 0, sizeof w);
    w.sh = &sh.base;
    ASSERT_EQ(0, pthread_barrier_init(&go, NULL, MST_THREADS + 1));
    for (i = 0; i < MST_THREADS; i++) {
        th[i].sh = &sh;
        th[i].index = i + 1;
        th[i].rng = (seed + (uint64_t)i * 0x9E3779B97F4A7C15ull + 7) | 1;
        if (pthread_create(&tid[i], NULL, msg_worker, &th[i]) != 0) break;
        started++;
    }
    if (started == MST_THREADS && pthread_create(&tid[MST_THREADS], NULL, mst_watch, &w) == 0) started++;
    if (started < MST_THREADS + 1) {
        mt_fail(__FILE__, __LINE__, "only %d threads started", started);
        exit(1);   /* the barrier would wait forever for the missing ones */
    }
    for (i = 0; i < MST_THREADS; i++) pthread_join(tid[i], NULL);
    for (i = 0; i < MST_THREADS; i++) {
        if (th[i].failures) mt_fail(__FILE__, __LINE__, "%s", th[i].first);
        total += th[i].ops_done; steps += th[i].steps; rooms += th[i].room_calls; parked += th[i].parked; reloads += th[i].reloads;
    }
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(sh.base.a, NULL, 0));
    /* reset, in a phase of its own: every thread's requests and pairs go, while the observer audits */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_reset(sh.base.a));
    pthread_mutex_lock(&sh.base.lock);
    sh.base.done = 1;
    pthread_mutex_unlock(&sh.base.lock);
    pthread_join(tid[MST_THREADS], NULL);
    pthread_barrier_destroy(&go);
    if (w.failures) mt_fail(__FILE__, __LINE__, "observer: %s", w.first);
    printf("  LOCKSTEP/GROUPS/MAKE_ROOM: %d threads x %ld operations = %ld (%ld steps, %ld make_room calls parking %ld requests, "
           "%ld reloads), %ld audits by the observer\n", MST_THREADS, sh.base.ops, total, steps, rooms, parked, reloads, w.audits);
    EXPECT_EQ((long)MST_THREADS * sh.base.ops, total);
    EXPECT_LT(100, steps);
    EXPECT_LT(0, parked);
    EXPECT_LT(1, w.audits);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(sh.base.a, &st));
    EXPECT_EQ(st.num_pages - 1, st.free_pages);
    EXPECT_EQ(0, st.requests);
    EXPECT_EQ(0, (int)st.offloaded_pages);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit(sh.base.a, NULL, 0));
    for (i = 0; i < MST_THREADS; i++) {   /* every handle is stale */
        if (th[i].has_pair) EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_members(sh.base.a, th[i].ls, any, 2, &n));
        if (th[i].has_solo) EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(sh.base.a, th[i].solo, &info));
        mskv_plan_free(sh.base.a, &th[i].plan);
    }
    free(th);
    pthread_rwlock_destroy(&sh.rw);
    pthread_mutex_destroy(&sh.turn);
    pthread_mutex_destroy(&sh.base.lock);
    mskv_cpu_destroy(sh.base.cpu1);
    mskv_cpu_destroy(sh.base.cpuN);
    mskv_arena_destroy(sh.base.a);
}
