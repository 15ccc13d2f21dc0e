/* Model-based randomised test of the host core.

   A shadow model follows >= 10^5 random operations per seed (add, remove,
   fork, admit, commit, abort, protect, release, offload, reload,
   export/import, publish, retire) on a small arena. It predicts each call's
   result code, and after every operation the audit must pass and every
   request's counts, page-table length, kv_len, slots and prefix epoch must
   equal the model's. Physical page ids come from the arena; the model checks
   they are distinct across requests except pages a fork shares (same
   absolute page, fully committed, same bytes), that no page is taken from
   the pending set in FENCED mode, and that the stats add up. Every written
   token carries a value derived from (writer, position) in the host store,
   and the bytes are checked after fork, reload and import (and periodically
   for every request).
   Every call's code is predicted exactly, also when several things are wrong
   (the order is the one the header documents under Conventions), and the
   digest is compared after every call: a failure leaves it, a success
   changes it unless the model knows the call is a no-op (reserve, a plan,
   protect at the same length, a release that frees no page). The walk also
   pauses and resumes, reserves, publishes segments (page-stored events name
   pages of those requests, each once, in order; page-removed events match
   release, abort and remove), builds 3-D position and dense plans, binds
   retention policies that publish applies (sink protected, whole chunks
   released: the model computes the skipped tokens chunk by chunk), and
   creates, seals, finds and removes keyed entries that cross plans read.
   (Sessions are protect/release/admit over the same core; their own rules
   are tested in test_windows.c and driven by the fuzzers.)
   A second, smaller model (at the end) walks an arena of two layer groups
   with lockstep pairs. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"

#define MTM_MAXREQ 8
#define MTM_MAXPAGES 200
#define MTM_MAXP 7
#define MTM_MAXTOK (MTM_MAXPAGES * MTM_MAXP)
#define MTM_DIM 4

#ifdef MSKV_TEST_SANITIZED
#define MTM_SEEDS 2
#elif defined(MSKV_TEST_QUICK)   /* the Windows build under wine: the walk is the same logic the native builds run in full */
#define MTM_SEEDS 1
#else
#define MTM_SEEDS 4
#endif
#define MTM_OPS 100000L

typedef struct mtm_req {
    int used;
    mskv_request h;
    uint32_t uid;                  /* writer id: new tokens carry (uid, position) */
    int64_t committed, reserved, prefix, live_start;
    int has_res, offloaded;
    int epoch_moves;               /* the last operation must have moved the epoch */
    uint64_t epoch;
    int32_t ntab;                  /* table length (host pages while offloaded) */
    int32_t tab[MTM_MAXPAGES];     /* physical ids; -1 = not yet observed */
    uint32_t exp[MTM_MAXTOK];      /* expected value per compacted index */
    int check_bytes;
    int paused;
    int keyed, sealed;             /* a keyed entry (kept out of the general operations) */
    uint64_t key;
    int has_ret;                   /* a retention policy applied at publish */
    mskv_retention ret;
    int64_t stored_upto;           /* page-stored events so far covered [0, stored_upto) */
} mtm_req;

typedef struct mtm {
    mskv_arena *a;
    int32_t P, num_pages;
    int fenced;
    mtm_req r[MTM_MAXREQ];
    uint8_t live[MTM_MAXPAGES], pending[MTM_MAXPAGES];
    uint64_t pend_tag[MTM_MAXPAGES];
    uint64_t rng;
    uint32_t next_uid;
    mskv_request stale[8];
    int nstale;
    long op;
    const char *op_name;
    int bad;
    int32_t scratch[MTM_MAXPAGES];
    /* caller-owned plan arrays for the admitted batch (<= 3 segments) */
    int32_t pl_qo[4], pl_kvp[4], pl_idx[3 * MTM_MAXPAGES], pl_last[3], pl_len[3], pl_split[3], pl_shift[3];
    int32_t pl_pos[3 * 6 * MTM_MAXP];
    int64_t pl_tok[4], pl_slots[3 * 6 * MTM_MAXP];
    long counts[24];               /* successful operations by kind, to show the walk went everywhere */
    long digest_checks;
    long removed_events;           /* PAGE_REMOVED events since the counter was reset */
    mskv_event stored[256];        /* PAGE_STORED events of the current publish */
    uint64_t release_tag;          /* nonzero: pages that left a table in this operation wait for this fence */
    int nstored;
} mtm;

static uint64_t mtm_rand(mtm *m) {
    uint64_t x = m->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    m->rng = x;
    return x * 2685821657736338717ull;
}
static int64_t mtm_below(mtm *m, int64_t n) { return n <= 0 ? 0 : (int64_t)(mtm_rand(m) % (uint64_t)n); }

/* Reports the first failure of a seed with enough context to replay it. */
#define MTM_CHECK(m, cond, ...)                                                              \
    do {                                                                                     \
        if (!(cond) && !(m)->bad) {                                                          \
            (m)->bad = 1;                                                                    \
            mt_fail(__FILE__, __LINE__, "op %ld (%s): %s", (m)->op, (m)->op_name, #cond);   \
            mt_fail(__FILE__, __LINE__, __VA_ARGS__);                                        \
        }                                                                                    \
    } while (0)

/* ---- the model's arithmetic (from DESIGN.md and the header) ---- */

static int32_t mtm_pp(const mtm *m, const mtm_req *q) { return (int32_t)((q->prefix + m->P - 1) / m->P); }
static int32_t mtm_entries(const mtm *m, const mtm_req *q, int64_t total) {
    int32_t live = total > q->live_start ? (int32_t)((total - q->live_start + m->P - 1) / m->P) : 0;
    return mtm_pp(m, q) + live;
}
static int64_t mtm_kv_len(const mtm *m, const mtm_req *q) {
    int64_t total = q->committed + q->reserved, split = (int64_t)mtm_pp(m, q) * m->P;
    return (total < split ? total : split) + (total > q->live_start ? total - q->live_start : 0);
}
static int mtm_gap(const mtm *m, const mtm_req *q) { return q->live_start > (int64_t)mtm_pp(m, q) * m->P; }

/* Compacted index of an absolute position, or the error the slot lookup must give. */
static mskv_result mtm_compact(const mtm *m, const mtm_req *q, int64_t pos, int64_t *j) {
    int64_t split = (int64_t)mtm_pp(m, q) * m->P;
    if (pos < 0) return MSKV_ERROR_INVALID_ARGUMENT;   /* a value outside its domain comes before the state */
    if (q->offloaded) return MSKV_ERROR_OFFLOADED;
    if (pos >= q->committed + q->reserved) return MSKV_ERROR_NOT_WRITTEN;
    if (pos < split) { *j = pos; return MSKV_SUCCESS; }
    if (pos < q->live_start) return MSKV_ERROR_RELEASED;
    *j = split + pos - q->live_start;
    return MSKV_SUCCESS;
}
static int64_t mtm_abs(const mtm *m, const mtm_req *q, int64_t j) {
    int64_t split = (int64_t)mtm_pp(m, q) * m->P;
    return j < split ? j : j - split + q->live_start;
}

static uint32_t mtm_value(uint32_t uid, int64_t pos) {
    uint32_t x = uid * 0x9E3779B1u ^ (uint32_t)pos * 0x85EBCA77u;
    x ^= x >> 15; x *= 0x2C1B3C6Du; x ^= x >> 12;
    return x & 0x7FFFFu;  /* + small d stays exact in f32 */
}

static int32_t mtm_free(const mtm *m) {
    int32_t i, used = 0;
    for (i = 1; i < m->num_pages; i++) used += m->live[i] || m->pending[i];
    return m->num_pages - 1 - used;
}

static int mtm_count_used(const mtm *m) {
    int i, n = 0;
    for (i = 0; i < MTM_MAXREQ; i++) n += m->r[i].used;
    return n;
}

/* ---- bytes ---- */

static void mtm_write_token(mtm *m, const mtm_req *q, int64_t j) {
    float *k = (float *)mskv_store_pool(m->a, 0, 0), *v = (float *)mskv_store_pool(m->a, 0, 1);
    int64_t slot = (int64_t)q->tab[j / m->P] * m->P + j % m->P;
    int d;
    for (d = 0; d < MTM_DIM; d++) {
        k[slot * MTM_DIM + d] = (float)(q->exp[j] + (uint32_t)d);
        v[slot * MTM_DIM + d] = (float)(q->exp[j] ^ (uint32_t)(d + 1) * 0x101u);
    }
}

static void mtm_check_bytes(mtm *m, const mtm_req *q) {
    const float *k = (const float *)mskv_store_pool(m->a, 0, 0), *v = (const float *)mskv_store_pool(m->a, 0, 1);
    int64_t j, n = mtm_kv_len(m, q);
    int d;
    for (j = 0; j < n && !m->bad; j++) {
        int64_t slot = (int64_t)q->tab[j / m->P] * m->P + j % m->P;
        for (d = 0; d < MTM_DIM; d++) {
            MTM_CHECK(m, k[slot * MTM_DIM + d] == (float)(q->exp[j] + (uint32_t)d) &&
                             v[slot * MTM_DIM + d] == (float)(q->exp[j] ^ (uint32_t)(d + 1) * 0x101u),
                      "request %u position %lld (compacted %lld, slot %lld): wrong bytes", q->h.id,
                      (long long)mtm_abs(m, q, j), (long long)j, (long long)slot);
        }
    }
}

/* ---- verification after every operation ---- */

static void mtm_verify(mtm *m) {
    char why[256];
    mskv_arena_stats st;
    int i;
    int32_t p, nlive = 0, npend = 0;
    uint8_t now[MTM_MAXPAGES];
    why[0] = '\0';
    MTM_CHECK(m, mskv_arena_audit(m->a, why, sizeof why) == MSKV_SUCCESS, "audit: %s", why);
    memset(now, 0, sizeof now);
    for (i = 0; i < MTM_MAXREQ && !m->bad; i++) {
        mtm_req *q = &m->r[i];
        mskv_request_info inf;
        int32_t count = -1, k;
        if (!q->used) continue;
        MTM_CHECK(m, mskv_request_info_get(m->a, q->h, &inf) == MSKV_SUCCESS, "info of request %u", q->h.id);
        if (m->bad) return;
        MTM_CHECK(m, inf.committed == q->committed && inf.reserved == q->reserved &&
                         inf.has_reservation == q->has_res && inf.prefix_tokens == q->prefix &&
                         inf.prefix_pages == mtm_pp(m, q) && inf.live_start == q->live_start &&
                         inf.location == (q->offloaded ? MSKV_OFFLOADED : MSKV_RESIDENT),
                  "request %u: library (committed %lld reserved %lld res %d prefix %lld/%d live_start %lld loc %d) "
                  "model (%lld %lld %d %lld/%d %lld %d)", q->h.id, (long long)inf.committed, (long long)inf.reserved,
                  inf.has_reservation, (long long)inf.prefix_tokens, inf.prefix_pages, (long long)inf.live_start,
                  (int)inf.location, (long long)q->committed, (long long)q->reserved, q->has_res, (long long)q->prefix,
                  mtm_pp(m, q), (long long)q->live_start, q->offloaded);
        MTM_CHECK(m, inf.keyed == q->keyed && inf.sealed == q->sealed && inf.paused == q->paused,
                  "request %u: keyed %d sealed %d paused %d, model %d %d %d", q->h.id, inf.keyed, inf.sealed, inf.paused,
                  q->keyed, q->sealed, q->paused);
        if (q->epoch_moves) MTM_CHECK(m, inf.prefix_epoch != q->epoch, "request %u: epoch did not move", q->h.id);
        else MTM_CHECK(m, inf.prefix_epoch == q->epoch, "request %u: epoch moved", q->h.id);
        q->epoch = inf.prefix_epoch;
        q->epoch_moves = 0;
        if (q->offloaded) continue;
        MTM_CHECK(m, inf.num_pages == q->ntab && inf.kv_len == mtm_kv_len(m, q),
                  "request %u: pages %d kv_len %lld, model %d %lld", q->h.id, inf.num_pages, (long long)inf.kv_len,
                  q->ntab, (long long)mtm_kv_len(m, q));
        MTM_CHECK(m, mskv_request_pages(m->a, q->h, m->scratch, MTM_MAXPAGES, &count) == MSKV_SUCCESS && count == q->ntab,
                  "request %u: table of %d entries, model %d", q->h.id, count, q->ntab);
        if (m->bad) return;
        for (k = 0; k < count; k++) {
            int32_t id = m->scratch[k];
            MTM_CHECK(m, id > 0 && id < m->num_pages, "request %u entry %d: page %d", q->h.id, k, id);
            if (m->bad) return;
            /* entries the operation did not touch keep their ids */
            MTM_CHECK(m, q->tab[k] < 0 || q->tab[k] == id, "request %u entry %d: page %d became %d", q->h.id, k, q->tab[k], id);
            /* a new page is never one still waiting for its fence */
            MTM_CHECK(m, q->tab[k] >= 0 || (!m->live[id] && !m->pending[id]), "request %u got page %d, which was %s",
                      q->h.id, id, m->live[id] ? "live" : "pending");
            q->tab[k] = id;
            now[id] = 1;
        }
    }
    if (m->bad) return;
    /* pages that left every table become pending (FENCED) or free */
    for (p = 1; p < m->num_pages; p++) {
        if (m->live[p] && !now[p] && m->fenced) {
            m->pending[p] = 1;
            m->pend_tag[p] = m->release_tag ? m->release_tag : mskv_arena_step(m->a);
        }
        if (now[p]) m->pending[p] = 0;
        m->live[p] = now[p];
        nlive += now[p];
        npend += m->pending[p];
    }
    MTM_CHECK(m, mskv_arena_stats_get(m->a, &st) == MSKV_SUCCESS, "stats");
    MTM_CHECK(m, st.live_pages == nlive && st.pending_pages == npend && st.free_pages == m->num_pages - 1 - nlive - npend &&
                     st.requests == mtm_count_used(m),
              "stats live %d pending %d free %d requests %d, model %d %d %d %d", st.live_pages, st.pending_pages,
              st.free_pages, st.requests, nlive, npend, m->num_pages - 1 - nlive - npend, mtm_count_used(m));
    {
        int64_t off = 0;
        for (i = 0; i < MTM_MAXREQ; i++)
            if (m->r[i].used && m->r[i].offloaded) off += m->r[i].ntab;
        MTM_CHECK(m, st.offloaded_pages == off, "offloaded pages %lld, model %lld", (long long)st.offloaded_pages, (long long)off);
    }
    /* a page in two tables: a fork's shared page, same absolute page, fully committed, same tokens */
    for (i = 0; i < MTM_MAXREQ && !m->bad; i++) {
        const mtm_req *q = &m->r[i];
        int i2, k, k2;
        if (!q->used || q->offloaded) continue;
        for (i2 = i + 1; i2 < MTM_MAXREQ && !m->bad; i2++) {
            const mtm_req *o = &m->r[i2];
            if (!o->used || o->offloaded) continue;
            for (k = 0; k < q->ntab; k++)
                for (k2 = 0; k2 < o->ntab; k2++) {
                    int64_t a1, a2, t;
                    if (q->tab[k] != o->tab[k2]) continue;
                    a1 = mtm_abs(m, q, (int64_t)k * m->P);
                    a2 = mtm_abs(m, o, (int64_t)k2 * m->P);
                    MTM_CHECK(m, a1 == a2 && a1 + m->P <= q->committed && a2 + m->P <= o->committed,
                              "page %d shared by requests %u (from %lld) and %u (from %lld)", q->tab[k], q->h.id,
                              (long long)a1, o->h.id, (long long)a2);
                    for (t = 0; t < m->P && !m->bad; t++)
                        MTM_CHECK(m, q->exp[(int64_t)k * m->P + t] == o->exp[(int64_t)k2 * m->P + t],
                                  "page %d shared by requests %u and %u with different tokens", q->tab[k], q->h.id, o->h.id);
                }
        }
    }
    /* slots: the edges of every region and a few random positions */
    for (i = 0; i < MTM_MAXREQ && !m->bad; i++) {
        const mtm_req *q = &m->r[i];
        int64_t probes[10], split = (int64_t)mtm_pp(m, q) * m->P, total = q->committed + q->reserved;
        int k;
        if (!q->used) continue;
        probes[0] = 0; probes[1] = split - 1; probes[2] = split; probes[3] = q->live_start - 1;
        probes[4] = q->live_start; probes[5] = total - 1; probes[6] = total;
        probes[7] = mtm_below(m, total + 2); probes[8] = mtm_below(m, total + 2); probes[9] = -1;
        for (k = 0; k < 10 && !m->bad; k++) {
            int64_t j = -1, slot = -1;
            mskv_result want = mtm_compact(m, q, probes[k], &j);
            mskv_result got = mskv_request_slot(m->a, q->h, probes[k], &slot);
            MTM_CHECK(m, got == want, "request %u slot(%lld): expected %d, got %d", q->h.id, (long long)probes[k], (int)want, (int)got);
            if (want == MSKV_SUCCESS)
                MTM_CHECK(m, slot == (int64_t)q->tab[j / m->P] * m->P + j % m->P, "request %u slot(%lld) = %lld",
                          q->h.id, (long long)probes[k], (long long)slot);
        }
    }
    for (i = 0; i < MTM_MAXREQ && !m->bad; i++) {
        mtm_req *q = &m->r[i];
        if (q->used && !q->offloaded && (q->check_bytes || (m->op & 255) == 0)) mtm_check_bytes(m, q);
        q->check_bytes = 0;
    }
}

/* ---- operations ---- */

static mtm_req *mtm_pick(mtm *m) {
    int i, n = 0, k;
    for (i = 0; i < MTM_MAXREQ; i++) n += m->r[i].used && !m->r[i].keyed;
    if (n == 0) return NULL;
    k = (int)mtm_below(m, n);
    for (i = 0; i < MTM_MAXREQ; i++)
        if (m->r[i].used && !m->r[i].keyed && k-- == 0) return &m->r[i];
    return NULL;
}

static mtm_req *mtm_pick_keyed(mtm *m, int sealed_only) {
    int i, n = 0, k;
    for (i = 0; i < MTM_MAXREQ; i++) n += m->r[i].used && m->r[i].keyed && (m->r[i].sealed || !sealed_only);
    if (n == 0) return NULL;
    k = (int)mtm_below(m, n);
    for (i = 0; i < MTM_MAXREQ; i++)
        if (m->r[i].used && m->r[i].keyed && (m->r[i].sealed || !sealed_only) && k-- == 0) return &m->r[i];
    return NULL;
}
static mtm_req *mtm_find_key(mtm *m, uint64_t key) {
    int i;
    for (i = 0; i < MTM_MAXREQ; i++)
        if (m->r[i].used && m->r[i].keyed && m->r[i].key == key) return &m->r[i];
    return NULL;
}

static mtm_req *mtm_slot_free(mtm *m) {
    int i;
    for (i = 0; i < MTM_MAXREQ; i++)
        if (!m->r[i].used) return &m->r[i];
    return NULL;
}

/* Several violated conditions: the code is the first in the header's order
   (see "Errors" at the top of mstar_kv.h), which the model lists its checks in. */
#define MTM_VIOL(code) do { if (nviol++ == 0) want = (code); } while (0)

/* What a successful call does to the digest: the model knows when a call is a no-op. */
enum { MTM_SAME = 0, MTM_CHANGES = 1, MTM_EITHER = 2 };

static uint64_t mtm_digest(mtm *m) { return mskv_arena_digest(m->a); }

/* The exact code, and the digest after every call: unchanged by a failure,
   and changed or not by a success as the model says. */
static void mtm_expect(mtm *m, mskv_result got, int nviol, mskv_result want, uint64_t digest_before, int change) {
    uint64_t after = mskv_arena_digest(m->a);
    if (nviol == 0) {
        MTM_CHECK(m, got == MSKV_SUCCESS, "expected success, got %d (%s)", (int)got, mskv_result_string(got));
        if (got == MSKV_SUCCESS && change == MTM_SAME) MTM_CHECK(m, after == digest_before, "a no-op changed the digest");
        if (got == MSKV_SUCCESS && change == MTM_CHANGES) MTM_CHECK(m, after != digest_before, "a change left the digest as it was");
    } else {
        MTM_CHECK(m, got == want, "expected %d (%s), got %d (%s) with %d violations", (int)want, mskv_result_string(want),
                  (int)got, mskv_result_string(got), nviol);
        MTM_CHECK(m, after == digest_before, "a failed call changed the state");
    }
    m->digest_checks++;
}

static void mtm_new_req(mtm *m, mtm_req *q, mskv_request h) {
    memset(q, 0, sizeof *q);
    q->used = 1;
    q->h = h;
    q->uid = ++m->next_uid;
    q->epoch_moves = 0;
}

static void mtm_adopt_epoch(mtm *m, mtm_req *q) {
    mskv_request_info inf;
    if (mskv_request_info_get(m->a, q->h, &inf) == MSKV_SUCCESS) q->epoch = inf.prefix_epoch;
}

static void mtm_op_add(mtm *m) {
    mtm_req *q = mtm_slot_free(m);
    mskv_request h;
    uint64_t d = mtm_digest(m);
    mskv_result e;
    m->op_name = "add";
    e = mskv_request_add(m->a, &h);
    mtm_expect(m, e, q ? 0 : 1, MSKV_ERROR_TOO_MANY_REQUESTS, d, MTM_CHANGES);
    if (e == MSKV_SUCCESS && q) {
        mtm_new_req(m, q, h);
        mtm_adopt_epoch(m, q);
        m->counts[0]++;
    }
}

static void mtm_op_remove(mtm *m) {
    mtm_req *q = mtm_pick(m);
    uint64_t d = mtm_digest(m);
    m->op_name = "remove";
    if (!q) return;
    m->removed_events = 0;
    mtm_expect(m, mskv_request_remove(m->a, q->h), 0, MSKV_SUCCESS, d, MTM_CHANGES);
    MTM_CHECK(m, m->removed_events == (q->offloaded ? 0 : q->ntab), "remove: %ld page-removed events for %d pages",
              m->removed_events, q->offloaded ? 0 : q->ntab);
    if (m->nstale < 8) m->stale[m->nstale++] = q->h;
    else m->stale[mtm_below(m, 8)] = q->h;
    q->used = 0;
    m->counts[1]++;
}

static void mtm_op_stale(mtm *m) {
    mskv_segment s;
    uint64_t d = mskv_arena_digest(m->a);
    int64_t slot;
    m->op_name = "stale handle";
    if (m->nstale == 0) return;
    s.request = m->stale[mtm_below(m, m->nstale)];
    s.n_tokens = 1;
    mtm_expect(m, mskv_admit(m->a, &s, 1), 1, MSKV_ERROR_INVALID_HANDLE, d, MTM_SAME);
    mtm_expect(m, mskv_request_remove(m->a, s.request), 1, MSKV_ERROR_INVALID_HANDLE, d, MTM_SAME);
    mtm_expect(m, mskv_request_slot(m->a, s.request, 0, &slot), 1, MSKV_ERROR_INVALID_HANDLE, d, MTM_SAME);
    mtm_expect(m, mskv_request_reload(m->a, s.request), 1, MSKV_ERROR_INVALID_HANDLE, d, MTM_SAME);
    mtm_expect(m, mskv_request_pause(m->a, s.request), 1, MSKV_ERROR_INVALID_HANDLE, d, MTM_SAME);
    s.n_tokens = -1;   /* a stale handle and a bad count: the handle is named first */
    mtm_expect(m, mskv_admit(m->a, &s, 1), 1, MSKV_ERROR_INVALID_HANDLE, d, MTM_SAME);
}

static void mtm_op_fork(mtm *m) {
    mtm_req *p = mtm_pick(m), *c = mtm_slot_free(m);
    mskv_request h;
    uint64_t d;
    int nviol = 0;
    mskv_result want = MSKV_SUCCESS, e;
    int32_t need;
    m->op_name = "fork";
    if (!p) return;
    need = (p->ntab > 0 && p->committed % m->P != 0) ? 1 : 0;
    if (p->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
    if (p->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
    if (!c) MTM_VIOL(MSKV_ERROR_TOO_MANY_REQUESTS);
    if (!p->offloaded && need > mtm_free(m)) MTM_VIOL(MSKV_ERROR_OUT_OF_PAGES);
    d = mtm_digest(m);
    e = mskv_request_fork(m->a, p->h, &h);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    mtm_new_req(m, c, h);
    c->committed = p->committed;
    c->prefix = p->prefix;
    c->live_start = p->live_start;
    c->ntab = p->ntab;
    memcpy(c->tab, p->tab, sizeof c->tab);
    memcpy(c->exp, p->exp, sizeof c->exp);
    if (need) c->tab[c->ntab - 1] = -1;  /* the partial page is a fresh copy */
    c->stored_upto = p->stored_upto;     /* what was published is carried, pausing is not */
    c->check_bytes = 1;
    mtm_adopt_epoch(m, c);
    m->counts[2]++;
}

/* The SELF plan of an admitted batch: valid CSR, and every entry what the model says. */
static void mtm_check_plan(mtm *m, const mskv_segment *s, mtm_req *const *qs, int n) {
    mskv_plan p;
    mskv_plan_desc pd;
    char why[256];
    int k, q_at = 0, id_at = 0;
    memset(&p, 0, sizeof p);
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    pd.visibility = MSKV_VIS_PAGES;   /* the table as it is: what the model checks */
    p.qo_indptr = m->pl_qo; p.kv_indptr = m->pl_kvp; p.kv_indices = m->pl_idx; p.kv_last_page_len = m->pl_last;
    p.kv_len = m->pl_len; p.kv_pos_split = m->pl_split; p.kv_pos_shift = m->pl_shift; p.kv_token_indptr = m->pl_tok;
    p.slot_mapping = m->pl_slots; p.positions = m->pl_pos;
    p.cap_batch = 3; p.cap_tokens = 3 * 6 * MTM_MAXP; p.cap_page_ids = 3 * MTM_MAXPAGES;
    m->op_name = "admit: plan";
    MTM_CHECK(m, mskv_plan_build(m->a, s, n, &pd, &p) == MSKV_SUCCESS, "plan_build of the admitted batch");
    if (m->bad) return;
    why[0] = '\0';
    MTM_CHECK(m, mskv_plan_validate(&p, m->num_pages, why, sizeof why) == MSKV_SUCCESS, "plan_validate: %s", why);
    MTM_CHECK(m, p.batch == n && p.page_size == m->P, "plan batch %d page size %d", p.batch, p.page_size);
    for (k = 0; k < n && !m->bad; k++) {
        const mtm_req *q = qs[k];
        int64_t len = mtm_kv_len(m, q), i, t;
        MTM_CHECK(m, p.qo_indptr[k] == q_at && p.kv_indptr[k] == id_at && p.kv_len[k] == len &&
                         p.kv_indptr[k + 1] - p.kv_indptr[k] == q->ntab,
                  "segment %d: qo %d kv %d len %d pages %d, model %d %d %lld %d", k, p.qo_indptr[k], p.kv_indptr[k],
                  p.kv_len[k], p.kv_indptr[k + 1] - p.kv_indptr[k], q_at, id_at, (long long)len, q->ntab);
        if (m->bad) return;
        for (t = 0; t < q->ntab; t++) MTM_CHECK(m, p.kv_indices[id_at + t] == q->tab[t], "segment %d entry %d", k, (int)t);
        MTM_CHECK(m, q->ntab == 0 || p.kv_last_page_len[k] == len - (int64_t)(q->ntab - 1) * m->P, "segment %d last_page_len %d",
                  k, p.kv_last_page_len[k]);
        for (i = 0; i < s[k].n_tokens && !m->bad; i++) {
            int64_t cj = len - s[k].n_tokens + i, abs_pos = cj < p.kv_pos_split[k] ? cj : cj + p.kv_pos_shift[k];
            int64_t j = 0;
            MTM_CHECK(m, abs_pos == q->committed + i && p.positions[q_at + i] == abs_pos,
                      "segment %d query %lld: position %lld (plan %d), model %lld", k, (long long)i, (long long)abs_pos,
                      p.positions[q_at + i], (long long)(q->committed + i));
            if (mtm_compact(m, q, q->committed + i, &j) == MSKV_SUCCESS)
                MTM_CHECK(m, p.slot_mapping[q_at + i] == (int64_t)q->tab[j / m->P] * m->P + j % m->P,
                          "segment %d query %lld: slot %lld", k, (long long)i, (long long)p.slot_mapping[q_at + i]);
        }
        q_at += (int)s[k].n_tokens;
        id_at += q->ntab;
    }
    MTM_CHECK(m, p.total_q == q_at && p.num_page_ids == id_at, "plan totals %d %d, model %d %d", p.total_q, p.num_page_ids,
              q_at, id_at);
    m->op_name = "admit";
}

static void mtm_op_admit(mtm *m) {
    mskv_segment s[3];
    mtm_req *qs[3];
    int n = 1 + (int)mtm_below(m, 3), k, k2, nviol = 0, sloppy = mtm_below(m, 10) == 0;
    int64_t need = 0;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "admit";
    for (k = 0; k < n; k++) {
        int tries = 0;
        do qs[k] = mtm_pick(m);
        while (!sloppy && qs[k] && (qs[k]->offloaded || qs[k]->has_res) && ++tries < 8);
        if (!qs[k] || (!sloppy && (qs[k]->offloaded || qs[k]->has_res))) { n = k; break; }
        for (k2 = 0; k2 < k && !sloppy; k2++)
            if (qs[k2] == qs[k]) break;
        if (!sloppy && k2 < k) { n = k; break; }
        s[k].request = qs[k]->h;
        s[k].n_tokens = 1 + mtm_below(m, mtm_below(m, 4) == 0 ? 6 * m->P : m->P + 1);
    }
    if (n == 0) return;
    for (k = 0; k < n; k++)   /* handles and duplicates: the whole batch first */
        for (k2 = 0; k2 < k; k2++)
            if (qs[k2] == qs[k]) MTM_VIOL(MSKV_ERROR_DUPLICATE);
    for (k = 0; k < n; k++) {
        mtm_req *q = qs[k];
        if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
        else if (q->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
        else if (q->paused) MTM_VIOL(MSKV_ERROR_BAD_STATE);
        else need += mtm_entries(m, q, q->committed + s[k].n_tokens) - q->ntab;
    }
    if (nviol == 0 && need > mtm_free(m)) MTM_VIOL(MSKV_ERROR_OUT_OF_PAGES);
    d = mtm_digest(m);
    e = mskv_admit(m->a, s, n);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < n; k++) {
        mtm_req *q = qs[k];
        int32_t old = q->ntab, t;
        int64_t pos;
        q->reserved = s[k].n_tokens;
        q->has_res = 1;
        q->ntab = mtm_entries(m, q, q->committed + q->reserved);
        for (t = old; t < q->ntab; t++) q->tab[t] = -1;
        /* learn the new ids now so the tokens can be written at their slots */
        if (mskv_request_pages(m->a, q->h, m->scratch, MTM_MAXPAGES, &t) != MSKV_SUCCESS || t != q->ntab) {
            MTM_CHECK(m, 0, "request %u: table after admit", q->h.id);
            return;
        }
        for (t = 0; t < old; t++) MTM_CHECK(m, q->tab[t] == m->scratch[t], "admit changed an old entry");
        for (t = old; t < q->ntab; t++) {
            MTM_CHECK(m, !m->pending[m->scratch[t]] && !m->live[m->scratch[t]], "admit took page %d, which is not free", m->scratch[t]);
            q->tab[t] = m->scratch[t];
        }
        for (pos = q->committed; pos < q->committed + q->reserved; pos++) {
            int64_t j = 0;
            if (mtm_compact(m, q, pos, &j) != MSKV_SUCCESS) continue;
            q->exp[j] = mtm_value(q->uid, pos);
            mtm_write_token(m, q, j);
        }
    }
    mtm_check_plan(m, s, qs, n);
    m->counts[3]++;
}

/* The requests with an open reservation, each once (sloppy: maybe one without). */
static int mtm_open_batch(mtm *m, mskv_segment *s, mtm_req **qs, int *nviol) {
    int i, n = 0;
    *nviol = 0;
    for (i = 0; i < MTM_MAXREQ; i++) {
        mtm_req *q = &m->r[i];
        if (!q->used || q->keyed) continue;
        if (q->has_res ? mtm_below(m, 4) != 0 : mtm_below(m, 40) == 0) {
            if (!q->has_res) (*nviol)++;
            s[n].request = q->h;
            s[n].n_tokens = q->reserved;
            qs[n++] = q;
        }
    }
    return n;
}

static void mtm_op_commit(mtm *m, int abort_it) {
    mskv_segment s[MTM_MAXREQ];
    mtm_req *qs[MTM_MAXREQ];
    int n, nviol, k;
    uint64_t d;
    mskv_result e;
    m->op_name = abort_it ? "abort" : "commit";
    n = mtm_open_batch(m, s, qs, &nviol);
    if (n == 0) return;
    d = mtm_digest(m);
    m->removed_events = 0;
    e = abort_it ? mskv_abort(m->a, s, n) : mskv_commit(m->a, s, n);
    mtm_expect(m, e, nviol, MSKV_ERROR_NO_RESERVATION, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    if (abort_it) {   /* the pages the reservations added go, one event each */
        long added = 0;
        for (k = 0; k < n; k++) added += qs[k]->ntab - mtm_entries(m, qs[k], qs[k]->committed);
        MTM_CHECK(m, m->removed_events == added, "abort: %ld page-removed events for %ld pages", m->removed_events, added);
    } else {
        MTM_CHECK(m, m->removed_events == 0, "commit removed pages");
    }
    for (k = 0; k < n; k++) {
        mtm_req *q = qs[k];
        if (!abort_it) q->committed += q->reserved;
        q->reserved = 0;
        q->has_res = 0;
        q->ntab = mtm_entries(m, q, q->committed);
    }
    m->counts[abort_it ? 5 : 4]++;
}

static void mtm_op_protect(mtm *m) {
    mtm_req *q = mtm_pick(m);
    int64_t n;
    int32_t newpp;
    int nviol = 0;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "protect";
    if (!q) return;
    n = mtm_below(m, 8) == 0 ? q->committed + 1 + mtm_below(m, 3) : mtm_below(m, q->committed + 1);
    if (mtm_below(m, 3) == 0) n = q->prefix + mtm_below(m, 3) - 1;  /* near the current prefix */
    if (n < 0) n = 0;
    newpp = (int32_t)((n + m->P - 1) / m->P);
    if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
    if (n > q->committed) MTM_VIOL(MSKV_ERROR_OUT_OF_RANGE);
    /* released pages behind the prefix: it may neither reach them nor give up pages in front of them */
    if (n != q->prefix && mtm_gap(m, q) && newpp > mtm_pp(m, q)) MTM_VIOL(MSKV_ERROR_RELEASED);
    if (n != q->prefix && mtm_gap(m, q) && newpp < mtm_pp(m, q)) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    d = mtm_digest(m);
    e = mskv_request_protect_prefix(m->a, q->h, n);
    mtm_expect(m, e, nviol, want, d, n == q->prefix ? MTM_SAME : MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    if (n != q->prefix) {
        if (!mtm_gap(m, q)) q->live_start = (int64_t)newpp * m->P;
        q->prefix = n;
        q->epoch_moves = 1;
    }
    m->counts[6]++;
}

/* Pages a release of n live tokens frees (page floor), and the model's table after it. */
static int32_t mtm_freed_by(const mtm *m, const mtm_req *q, int64_t n) {
    int64_t point = q->live_start + n;
    int32_t freed = (int32_t)(point / m->P - q->live_start / m->P);
    return freed < 0 ? 0 : freed;
}
static void mtm_model_release(mtm *m, mtm_req *q, int32_t freed) {
    int32_t pp = mtm_pp(m, q);
    if (freed <= 0) return;
    memmove(q->tab + pp, q->tab + pp + freed, (size_t)(q->ntab - pp - freed) * sizeof(int32_t));
    memmove(q->exp + (int64_t)pp * m->P, q->exp + (int64_t)(pp + freed) * m->P,
            (size_t)(q->ntab - pp - freed) * (size_t)m->P * sizeof(uint32_t));
    q->ntab -= freed;
    q->live_start += (int64_t)freed * m->P;
}

static void mtm_op_release(mtm *m) {
    mtm_req *q = mtm_pick(m);
    int64_t live, n, got = -1, point, from;
    int32_t freed, pp;
    mskv_request_info info, after;
    int nviol = 0;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "release";
    if (!q) return;
    /* the token-exact release point moves even where no page goes, and n
       counts on from it (the still-visible tokens): the library's own
       before-value, the rule (previous point or live_start, + n) checked after */
    if (mskv_request_info_get(m->a, q->h, &info) != MSKV_SUCCESS) info.release_point = -1;
    from = info.release_point > q->live_start ? info.release_point : q->live_start;
    live = q->committed - from;
    if (live < 0) live = 0;
    n = mtm_below(m, 10) == 0 ? live + 1 + mtm_below(m, 4) : mtm_below(m, live + 1);
    if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
    if (n > live) MTM_VIOL(MSKV_ERROR_OUT_OF_RANGE);
    freed = mtm_freed_by(m, q, from + n - q->live_start);
    point = n > 0 ? from + n : info.release_point;
    d = mtm_digest(m);
    m->removed_events = 0;
    e = mskv_request_release_oldest(m->a, q->h, n, &got);
    mtm_expect(m, e, nviol, want, d, freed || point != info.release_point ? MTM_CHANGES : MTM_SAME);
    if (e != MSKV_SUCCESS || nviol) return;
    MTM_CHECK(m, mskv_request_info_get(m->a, q->h, &after) == MSKV_SUCCESS && after.release_point == point,
              "release point %lld, model %lld", (long long)after.release_point, (long long)point);
    MTM_CHECK(m, m->removed_events == freed, "%ld page-removed events for %d released pages", m->removed_events, (int)freed);
    MTM_CHECK(m, got == (int64_t)freed * m->P, "released %lld tokens, model %lld", (long long)got, (long long)freed * m->P);
    mtm_model_release(m, q, freed);
    (void)pp;
    m->counts[7]++;
}

static void mtm_op_offload(mtm *m) {
    mtm_req *q = mtm_pick(m);
    int nviol = 0;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "offload";
    if (!q) return;
    if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
    if (q->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
    d = mtm_digest(m);
    e = mskv_request_offload(m->a, q->h);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    q->offloaded = 1;
    m->counts[8]++;
}

static void mtm_op_reload(mtm *m) {
    mtm_req *q = mtm_pick(m);
    int nviol = 0;
    int32_t t;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "reload";
    if (!q) return;
    if (!q->offloaded) MTM_VIOL(MSKV_ERROR_NOT_OFFLOADED);
    else if (q->ntab > mtm_free(m)) MTM_VIOL(MSKV_ERROR_OUT_OF_PAGES);
    d = mtm_digest(m);
    e = mskv_request_reload(m->a, q->h);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    q->offloaded = 0;
    for (t = 0; t < q->ntab; t++) q->tab[t] = -1;
    q->epoch_moves = 1;
    q->check_bytes = 1;
    m->counts[9]++;
}

static void mtm_op_export_import(mtm *m) {
    mtm_req *q = mtm_pick(m), *c = mtm_slot_free(m);
    size_t size = 0;
    unsigned char *blob;
    mskv_request h;
    uint64_t d = mskv_arena_digest(m->a);  /* export must leave everything as it was */
    mskv_result e;
    m->op_name = "export/import";
    if (!q) return;
    e = mskv_request_export(m->a, q->h, NULL, 0, &size);
    mtm_expect(m, e, q->has_res, MSKV_ERROR_RESERVATION_PENDING, d, MTM_SAME);
    if (e != MSKV_SUCCESS) return;
    blob = (unsigned char *)malloc(size);
    if (!blob) return;
    MTM_CHECK(m, mskv_request_export(m->a, q->h, blob, size, &size) == MSKV_SUCCESS, "export");
    MTM_CHECK(m, mskv_arena_digest(m->a) == d, "export changed the state");
    e = mskv_request_import(m->a, blob, size, &h);
    free(blob);
    mtm_expect(m, e, c ? 0 : 1, MSKV_ERROR_TOO_MANY_REQUESTS, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || !c) return;
    mtm_new_req(m, c, h);
    c->committed = q->committed;
    c->prefix = q->prefix;
    c->live_start = q->live_start;
    c->ntab = q->ntab;
    c->offloaded = 1;
    c->stored_upto = q->stored_upto;
    c->has_ret = q->has_ret;   /* a blob carries the policy; a fork does not */
    c->ret = q->ret;
    memcpy(c->exp, q->exp, sizeof c->exp);
    mtm_adopt_epoch(m, c);
    m->counts[10]++;
}

static void mtm_op_publish(mtm *m) {
    uint64_t before = mskv_arena_step(m->a), ended = ~0ull;
    m->op_name = "publish";
    MTM_CHECK(m, mskv_publish(m->a, NULL, 0, &ended) == MSKV_SUCCESS, "publish");
    MTM_CHECK(m, ended == before && mskv_arena_step(m->a) > before, "fence %llu -> %llu, ended %llu",
              (unsigned long long)before, (unsigned long long)mskv_arena_step(m->a), (unsigned long long)ended);
    m->counts[11]++;
}

static void mtm_op_retire(mtm *m) {
    uint64_t step = mskv_arena_step(m->a), c = (uint64_t)mtm_below(m, (int64_t)step + 1);
    int32_t p;
    m->op_name = "retire";
    MTM_CHECK(m, mskv_arena_retire(m->a, c) == MSKV_SUCCESS, "retire %llu", (unsigned long long)c);
    for (p = 1; p < m->num_pages; p++)
        if (m->pending[p] && m->pend_tag[p] <= c) m->pending[p] = 0;
    m->counts[12]++;
}

static void mtm_on_event(void *user, const mskv_event *e) {
    mtm *m = (mtm *)user;
    if (e->type == MSKV_EVENT_PAGE_REMOVED) m->removed_events++;
    else if (m->nstored < 256) m->stored[m->nstored++] = *e;
}

static void mtm_op_pause(mtm *m) {
    mtm_req *q = mtm_pick(m);
    int nviol = 0, resume;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    if (!q) return;
    resume = q->paused ? mtm_below(m, 4) != 0 : mtm_below(m, 8) == 0;
    m->op_name = resume ? "resume" : "pause";
    if (resume) {
        if (!q->paused) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    } else {
        if (q->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
        if (q->paused) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    }
    d = mtm_digest(m);
    e = resume ? mskv_request_resume(m->a, q->h) : mskv_request_pause(m->a, q->h);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    q->paused = !resume;
    m->counts[13 + resume]++;
}

/* Sizing the table changes no state; a count past 2^31 tokens overflows. */
static void mtm_op_reserve(mtm *m) {
    mtm_req *q = mtm_pick(m);
    int64_t n;
    int nviol = 0;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "reserve";
    if (!q) return;
    n = mtm_below(m, 10) == 0 ? -1 - mtm_below(m, 5) : mtm_below(m, 10) == 0 ? ((int64_t)1 << 31) + mtm_below(m, 9)
                                                                                : mtm_below(m, (int64_t)MTM_MAXTOK);
    if (n < 0) MTM_VIOL(MSKV_ERROR_INVALID_ARGUMENT);
    if (n > INT32_MAX) MTM_VIOL(MSKV_ERROR_OVERFLOW);
    d = mtm_digest(m);
    e = mskv_request_reserve(m->a, q->h, n);
    mtm_expect(m, e, nviol, want, d, MTM_SAME);
    if (e == MSKV_SUCCESS) m->counts[15]++;
}

/* Chunk-window retention at publish, from DESIGN.md and the header: once the
   sink is complete it is protected (when no release has left a gap), then
   everything past the sink except the window goes, a whole chunk at a time
   (skipped tokens), released like release_oldest (page floor). */
static int64_t mtm_skipped(const mskv_retention *r, int64_t n) {
    int64_t sink = r->sink_chunks * r->chunk_size, s = 0;
    if (n <= sink) return 0;
    while (s + r->chunk_size <= n - sink && (r->reset_at_boundary || n - sink - (s + r->chunk_size) >= r->window_chunks * r->chunk_size))
        s += r->chunk_size;
    return s;
}
static void mtm_model_retention(mtm *m, mtm_req *q) {
    int64_t sink = q->ret.sink_chunks * q->ret.chunk_size, keep_from, live;
    if (q->committed >= sink && q->prefix < sink && !mtm_gap(m, q)) {
        q->live_start = (int64_t)((sink + m->P - 1) / m->P) * m->P;
        q->prefix = sink;
        q->epoch_moves = 1;
    }
    if (q->prefix < sink) return;
    keep_from = sink + mtm_skipped(&q->ret, q->committed);
    live = q->committed - q->live_start;
    if (keep_from > q->live_start && live > 0)
        mtm_model_release(m, q, mtm_freed_by(m, q, keep_from - q->live_start < live ? keep_from - q->live_start : live));
}

/* Publish with segments: page-stored events name pages of those requests,
   full of committed tokens, each page once, in order. */
static void mtm_op_publish_segments(mtm *m) {
    mskv_segment s[MTM_MAXREQ];
    mtm_req *qs[MTM_MAXREQ];
    int n = 0, i, k, nviol = 0;
    uint64_t d, ended = 0;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "publish segments";
    for (i = 0; i < MTM_MAXREQ; i++)
        if (m->r[i].used && !m->r[i].keyed && mtm_below(m, 2)) {
            qs[n] = &m->r[i];
            s[n].request = m->r[i].h;
            s[n].n_tokens = 0;
            if (m->r[i].offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
            n++;
        }
    d = mtm_digest(m);
    m->nstored = 0;
    e = mskv_publish(m->a, s, n, &ended);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < m->nstored && !m->bad; k++) {
        const mskv_event *ev = &m->stored[k];
        mtm_req *q = NULL;
        int64_t j = -1;
        for (i = 0; i < n; i++)
            if (qs[i]->h.id == ev->request.id) q = qs[i];
        MTM_CHECK(m, q != NULL, "page-stored event for request %u, not published", ev->request.id);
        if (!q) return;
        MTM_CHECK(m, ev->first_token % m->P == 0 && ev->first_token >= q->stored_upto && ev->first_token + m->P <= q->committed &&
                         mtm_compact(m, q, ev->first_token, &j) == MSKV_SUCCESS && q->tab[j / m->P] == ev->page && ev->step == ended,
                  "page-stored event: request %u page %d from %lld (stored up to %lld, committed %lld)", q->h.id, ev->page,
                  (long long)ev->first_token, (long long)q->stored_upto, (long long)q->committed);
        q->stored_upto = ev->first_token + m->P;
    }
    for (i = 0; i < n; i++)
        if (qs[i]->has_ret) mtm_model_retention(m, qs[i]);
    m->release_tag = ended;   /* retention releases inside the step that publish ends */
    m->counts[16]++;
}

/* The plans of other kinds over the admitted-and-committed state: a dense plan
   and a 3-D position plan for a resident request's last tokens. */
static void mtm_op_plans(mtm *m) {
    mtm_req *q = mtm_pick(m);
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    int64_t dense[1], len, i, nq;
    int nviol = 0;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "plan 3-D / dense";
    if (!q) return;
    len = mtm_kv_len(m, q);
    nq = len > 0 ? 1 + mtm_below(m, len < 6 * m->P ? len : 6 * m->P) : 1;
    memset(&p, 0, sizeof p);
    p.qo_indptr = m->pl_qo; p.kv_indptr = m->pl_kvp; p.kv_indices = m->pl_idx; p.kv_last_page_len = m->pl_last;
    p.kv_len = m->pl_len; p.kv_pos_split = m->pl_split; p.kv_pos_shift = m->pl_shift; p.kv_token_indptr = m->pl_tok;
    p.slot_mapping = m->pl_slots; p.positions = m->pl_pos;
    p.cap_batch = 3; p.cap_tokens = 3 * 6 * MTM_MAXP; p.cap_page_ids = 3 * MTM_MAXPAGES;
    s.request = q->h;
    s.n_tokens = nq;
    memset(&pd, 0, sizeof pd);
    pd.visibility = MSKV_VIS_PAGES;   /* the plan has no bound arrays: positions are what this checks */
    if (mtm_below(m, 2)) {
        pd.kind = MSKV_PLAN_DENSE;
        dense[0] = nq + mtm_below(m, 3) - 1;   /* sometimes one key short */
        pd.dense_kv_len = dense;
        pd.pos_mode = MSKV_POS_1D;
        if (dense[0] < nq) MTM_VIOL(MSKV_ERROR_OUT_OF_RANGE);
    } else {
        pd.pos_mode = MSKV_POS_3D;
        pd.grid_h = 1 + (int32_t)mtm_below(m, 3);
        pd.grid_w = 1 + (int32_t)mtm_below(m, 4);
        pd.pos_offset = mtm_below(m, 5) - 2;
        if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
        if (nq > len) MTM_VIOL(MSKV_ERROR_OUT_OF_RANGE);
    }
    d = mtm_digest(m);
    e = mskv_plan_build(m->a, &s, 1, &pd, &p);
    mtm_expect(m, e, nviol, want, d, MTM_SAME);
    if (e != MSKV_SUCCESS || nviol) return;
    MTM_CHECK(m, p.batch == 1 && p.total_q == nq && p.qo_indptr[1] == nq, "plan sizes");
    if (pd.kind == MSKV_PLAN_DENSE) {
        MTM_CHECK(m, p.num_page_ids == 0 && p.kv_len[0] == dense[0] && p.kv_token_indptr[1] == dense[0], "dense plan: %d keys",
                  p.kv_len[0]);
        for (i = 0; i < nq; i++)
            MTM_CHECK(m, p.slot_mapping[i] == -1 && p.positions[i] == dense[0] - nq + i, "dense plan query %lld", (long long)i);
    } else {
        int64_t tpf = (int64_t)pd.grid_h * pd.grid_w;
        for (i = 0; i < nq && !m->bad; i++) {
            int64_t cj = len - nq + i, abs_pos = cj < p.kv_pos_split[0] ? cj : cj + p.kv_pos_shift[0], rel, f;
            rel = abs_pos - pd.pos_offset;
            f = rel >= 0 ? rel / tpf : -((-rel + tpf - 1) / tpf);   /* floor */
            MTM_CHECK(m, abs_pos == mtm_abs(m, q, cj) && p.positions[3 * i] == f &&
                             p.positions[3 * i + 1] == (rel - f * tpf) / pd.grid_w && p.positions[3 * i + 2] == (rel - f * tpf) % pd.grid_w,
                      "3-D position of query %lld (absolute %lld, offset %lld, grid %dx%d): (%d, %d, %d)", (long long)i,
                      (long long)abs_pos, (long long)pd.pos_offset, pd.grid_h, pd.grid_w, p.positions[3 * i],
                      p.positions[3 * i + 1], p.positions[3 * i + 2]);
        }
    }
    m->counts[17 + (pd.kind == MSKV_PLAN_DENSE)]++;
}

static void mtm_op_set_retention(mtm *m) {
    mtm_req *q = mtm_pick(m);
    mskv_retention r;
    int nviol = 0, clear;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "set_retention";
    if (!q) return;
    memset(&r, 0, sizeof r);
    clear = mtm_below(m, 8) == 0;
    r.chunk_size = (int64_t)m->P * (1 + mtm_below(m, 3));
    r.sink_chunks = mtm_below(m, 3);
    r.window_chunks = 1 + mtm_below(m, 3);
    r.reset_at_boundary = mtm_below(m, 4) == 0;
    r.exact = (int32_t)mtm_below(m, 2);
    if (mtm_below(m, 6) == 0 && m->P > 1) { r.chunk_size += 1; r.exact = 1; }   /* exact eviction needs page-aligned chunks */
    if (!clear && r.exact && r.chunk_size % m->P != 0) MTM_VIOL(MSKV_ERROR_INVALID_SPEC);
    d = mtm_digest(m);
    e = mskv_request_set_retention(m->a, q->h, clear ? NULL : &r);
    mtm_expect(m, e, nviol, want, d, MTM_EITHER);
    if (e != MSKV_SUCCESS || nviol) return;
    q->has_ret = !clear;
    if (!clear) q->ret = r;
    m->counts[19]++;
}

static void mtm_op_keyed_create(mtm *m) {
    mtm_req *c = mtm_slot_free(m);
    uint64_t key = (uint64_t)mtm_below(m, 4) + 100, d;
    int64_t n = mtm_below(m, 10) == 0 ? 0 : 1 + mtm_below(m, 3 * m->P), pos;
    int32_t need = (int32_t)((n + m->P - 1) / m->P), t, count = 0;
    int nviol = 0;
    mskv_request h;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "keyed_create";
    if (n < 1) MTM_VIOL(MSKV_ERROR_INVALID_ARGUMENT);
    if (mtm_find_key(m, key)) MTM_VIOL(MSKV_ERROR_DUPLICATE);
    if (!c) MTM_VIOL(MSKV_ERROR_TOO_MANY_REQUESTS);
    if (need > mtm_free(m)) MTM_VIOL(MSKV_ERROR_OUT_OF_PAGES);
    d = mtm_digest(m);
    e = mskv_keyed_create(m->a, key, n, &h);
    mtm_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    mtm_new_req(m, c, h);
    c->keyed = 1;
    c->key = key;
    c->reserved = n;
    c->has_res = 1;
    c->ntab = need;
    mtm_adopt_epoch(m, c);
    /* its tokens are written before it is sealed: learn the pages, write (uid, position) */
    if (mskv_request_pages(m->a, h, m->scratch, MTM_MAXPAGES, &count) != MSKV_SUCCESS || count != need) {
        MTM_CHECK(m, 0, "keyed entry %u: table of %d, model %d", h.id, count, need);
        return;
    }
    for (t = 0; t < need; t++) {
        MTM_CHECK(m, !m->pending[m->scratch[t]] && !m->live[m->scratch[t]], "keyed_create took page %d, not free", m->scratch[t]);
        c->tab[t] = m->scratch[t];
    }
    for (pos = 0; pos < n; pos++) {
        c->exp[pos] = mtm_value(c->uid, pos);
        mtm_write_token(m, c, pos);
    }
    m->counts[20]++;
}

static void mtm_op_keyed_other(mtm *m) {
    mtm_req *q = mtm_pick_keyed(m, 0), *f;
    uint64_t key = (uint64_t)mtm_below(m, 5) + 100, d = mtm_digest(m);
    mskv_request h;
    mskv_result e;
    int64_t pick = mtm_below(m, 3);
    if (pick == 0) {
        m->op_name = "keyed_seal";
        if (!q) return;
        e = mskv_keyed_seal(m->a, q->h);
        mtm_expect(m, e, q->sealed, MSKV_ERROR_READ_ONLY, d, MTM_CHANGES);
        if (e != MSKV_SUCCESS || q->sealed) return;
        q->sealed = 1;
        q->committed = q->reserved;
        q->reserved = 0;
        q->has_res = 0;
        m->counts[21]++;
    } else if (pick == 1) {
        m->op_name = "keyed_find";
        f = mtm_find_key(m, key);
        h.id = 0;
        e = mskv_keyed_find(m->a, key, &h);
        mtm_expect(m, e, f ? 0 : 1, MSKV_ERROR_NOT_FOUND, d, MTM_SAME);
        if (f) MTM_CHECK(m, h.id == f->h.id, "keyed_find(%llu) = %u, model %u", (unsigned long long)key, h.id, f->h.id);
    } else {
        m->op_name = "keyed_remove";
        f = mtm_find_key(m, key);
        m->removed_events = 0;
        e = mskv_keyed_remove(m->a, key);
        mtm_expect(m, e, f ? 0 : 1, MSKV_ERROR_NOT_FOUND, d, MTM_CHANGES);
        if (e != MSKV_SUCCESS || !f) return;
        MTM_CHECK(m, m->removed_events == f->ntab, "keyed_remove: %ld page-removed events for %d pages", m->removed_events, f->ntab);
        if (m->nstale < 8) m->stale[m->nstale++] = f->h;
        f->used = 0;
        m->counts[22]++;
    }
}

/* A cross plan: a request's last tokens attend over a keyed entry's pages. */
static void mtm_op_cross(mtm *m) {
    mtm_req *q = mtm_pick(m), *x = mtm_pick_keyed(m, 0);
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc pd;
    int64_t len, nq, i;
    int nviol = 0, t;
    uint64_t d;
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "cross plan";
    if (!q || !x || q->offloaded) return;
    len = mtm_kv_len(m, q);
    if (len < 1) return;
    nq = 1 + mtm_below(m, len < 6 * m->P ? len : 6 * m->P);
    memset(&p, 0, sizeof p);
    p.qo_indptr = m->pl_qo; p.kv_indptr = m->pl_kvp; p.kv_indices = m->pl_idx; p.kv_last_page_len = m->pl_last;
    p.kv_len = m->pl_len; p.kv_pos_split = m->pl_split; p.kv_pos_shift = m->pl_shift; p.kv_token_indptr = m->pl_tok;
    p.slot_mapping = m->pl_slots; p.positions = m->pl_pos;
    p.cap_batch = 3; p.cap_tokens = 3 * 6 * MTM_MAXP; p.cap_page_ids = 3 * MTM_MAXPAGES;
    s.request = q->h;
    s.n_tokens = nq;
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_CROSS;
    pd.cross = x->h;
    pd.pos_mode = MSKV_POS_1D;
    if (!x->sealed) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    d = mtm_digest(m);
    e = mskv_plan_build(m->a, &s, 1, &pd, &p);
    mtm_expect(m, e, nviol, want, d, MTM_SAME);
    if (e != MSKV_SUCCESS || nviol) return;
    MTM_CHECK(m, p.batch == 1 && p.total_q == nq && p.kv_len[0] == x->committed && p.num_page_ids == x->ntab &&
                     p.kv_last_page_len[0] == x->committed - (int64_t)(x->ntab - 1) * m->P,
              "cross plan: %d keys over %d pages, the entry has %lld over %d", p.kv_len[0], p.num_page_ids,
              (long long)x->committed, x->ntab);
    for (t = 0; t < x->ntab && !m->bad; t++) MTM_CHECK(m, p.kv_indices[t] == x->tab[t], "cross plan page %d", t);
    for (i = 0; i < nq && !m->bad; i++)
        MTM_CHECK(m, p.slot_mapping[i] == -1 && p.positions[i] == mtm_abs(m, q, len - nq + i),
                  "cross plan query %lld: slot %lld position %d", (long long)i, (long long)p.slot_mapping[i], p.positions[i]);
    m->counts[23]++;
}

static void mtm_run_seed(uint64_t seed) {
    mtm *m = (mtm *)calloc(1, sizeof *m);
    mskv_arena_desc d;
    long i;
    if (!m) { mt_fail(__FILE__, __LINE__, "out of memory"); return; }
    m->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    m->P = 1 + (int32_t)mtm_below(m, MTM_MAXP);
    m->num_pages = 64 + (int32_t)mtm_below(m, MTM_MAXPAGES - 64 + 1);
    m->fenced = (int)mtm_below(m, 2);
    memset(&d, 0, sizeof d);
    d.num_pages = m->num_pages;
    d.page_size = m->P;
    d.max_requests = MTM_MAXREQ;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = MTM_DIM; d.dtype = MSKV_DTYPE_F32;
    d.retire_mode = m->fenced ? MSKV_RETIRE_FENCED : MSKV_RETIRE_IMMEDIATE;
    d.on_event = mtm_on_event;
    d.event_user = m;
    if (mskv_arena_create(&d, &m->a) != MSKV_SUCCESS) {
        mt_fail(__FILE__, __LINE__, "arena_create");
        free(m);
        return;
    }
    printf("  seed %llu: page size %d, %d pages, %s\n", (unsigned long long)seed, (int)m->P, (int)m->num_pages,
           m->fenced ? "fenced" : "immediate");
    for (i = 0; i < MTM_OPS && !m->bad; i++) {
        int64_t pick = mtm_below(m, 100);
        m->op = i;
        m->release_tag = 0;
        if (pick < 5) mtm_op_add(m);
        else if (pick < 8) mtm_op_remove(m);
        else if (pick < 12) mtm_op_fork(m);
        else if (pick < 36) mtm_op_admit(m);
        else if (pick < 49) mtm_op_commit(m, 0);
        else if (pick < 54) mtm_op_commit(m, 1);
        else if (pick < 60) mtm_op_protect(m);
        else if (pick < 71) mtm_op_release(m);
        else if (pick < 76) mtm_op_offload(m);
        else if (pick < 82) mtm_op_reload(m);
        else if (pick < 85) mtm_op_export_import(m);
        else if (pick < 87) mtm_op_publish(m);
        else if (pick < 88) mtm_op_publish_segments(m);
        else if (pick < 90) mtm_op_pause(m);
        else if (pick < 91) mtm_op_reserve(m);
        else if (pick < 93) mtm_op_plans(m);
        else if (pick < 95) {
            int64_t k = mtm_below(m, 4);
            if (k == 0) mtm_op_set_retention(m);
            else if (k == 1) mtm_op_keyed_create(m);
            else if (k == 2) mtm_op_keyed_other(m);
            else mtm_op_cross(m);
        }
        else if (pick < 98) { if (m->fenced) mtm_op_retire(m); else mtm_op_publish(m); }
        else mtm_op_stale(m);
        if (!m->bad) mtm_verify(m);
    }
    if (!m->bad) {
        /* every kind of operation succeeded many times: the walk was not stuck */
        static const char *names[24] = {"add", "remove", "fork", "admit", "commit", "abort", "protect", "release",
                                        "offload", "reload", "export/import", "publish", "retire", "pause", "resume",
                                        "reserve", "publish with segments", "3-D plan", "dense plan", "set_retention",
                                        "keyed_create", "keyed_seal", "keyed_remove", "cross plan"};
        int k;
        for (k = 0; k < 24; k++) {
            if (k == 12 && !m->fenced) continue;
            if (m->counts[k] < (k >= 19 ? 10 : k >= 13 ? 50 : 200)) mt_fail(__FILE__, __LINE__, "only %ld successful %s operations", m->counts[k], names[k]);
        }
    }
    printf("    successes: add %ld remove %ld fork %ld admit %ld commit %ld abort %ld protect %ld release %ld "
           "offload %ld reload %ld import %ld publish %ld retire %ld pause %ld resume %ld reserve %ld "
           "publish-with-segments %ld 3-D %ld dense %ld retention %ld keyed create %ld seal %ld remove %ld cross %ld; "
           "%ld digest checks\n", m->counts[0], m->counts[1], m->counts[2],
           m->counts[3], m->counts[4], m->counts[5], m->counts[6], m->counts[7], m->counts[8], m->counts[9],
           m->counts[10], m->counts[11], m->counts[12], m->counts[13], m->counts[14], m->counts[15], m->counts[16],
           m->counts[17], m->counts[18], m->counts[19], m->counts[20], m->counts[21], m->counts[22], m->counts[23],
           m->digest_checks);
    mskv_arena_destroy(m->a);
    free(m);
}

TEST(model_random_walk_matches_the_shadow_model_after_every_operation) {
    uint64_t base = mt_seed();
    int s;
    for (s = 0; s < MTM_SEEDS && !mt_failed_now(); s++) mtm_run_seed(base + (uint64_t)s * 0x632BE59BD9B4E019ull);
}

/* ---- layer groups and lockstep pairs --------------------------------------------- */
/* A second shadow model, over an arena of two layer groups whose retention
   differs (group 0: a sink chunk and a window of two chunks of one page;
   group 1: no sink, a window of one chunk of two pages), with lockstep
   pairs: add, remove, admit and commit/abort of a request or a whole pair
   (half a pair is BAD_STATE), release in a group of a request or a pair,
   offload/reload of either, lockstep create/dissolve/remove, retention per
   group and publish applying it group by group. Every call's code is
   predicted exactly, the digest compared after every call, and after every
   operation the audit passes, the free pages add up, and every request's
   counts, location, lockstep flag and, per group, prefix, live_start and
   page count equal the model's. */

#define MTG_MAXREQ 6
#define MTG_MAXPAIRS 3
#define MTG_OPS 40000L

typedef struct mtg_req {
    int used, pair;                /* pair: index of its lockstep pair, -1 */
    mskv_request h;
    int64_t committed, reserved;
    int has_res, offloaded;
    int64_t prefix[2], live_start[2];
    int has_ret[2];
} mtg_req;

typedef struct mtg {
    mskv_arena *a;
    int32_t P, num_pages;
    mtg_req r[MTG_MAXREQ];
    struct { int used; mskv_lockstep h; int m[2]; } ls[MTG_MAXPAIRS];
    mskv_retention ret[2];
    mskv_request stale;
    mskv_lockstep dead;
    int has_stale, has_dead;
    uint64_t rng;
    long op;
    const char *op_name;
    int bad;
    long counts[16], digest_checks;
} mtg;

static int64_t mtg_below(mtg *m, int64_t n) {
    uint64_t x = m->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    m->rng = x;
    return n <= 0 ? 0 : (int64_t)((x * 2685821657736338717ull) % (uint64_t)n);
}

static int32_t mtg_pp(const mtg *m, const mtg_req *q, int g) { return (int32_t)((q->prefix[g] + m->P - 1) / m->P); }
static int32_t mtg_entries(const mtg *m, const mtg_req *q, int g, int64_t total) {
    int32_t live = total > q->live_start[g] ? (int32_t)((total - q->live_start[g] + m->P - 1) / m->P) : 0;
    return mtg_pp(m, q, g) + live;
}
/* pages of both groups */
static int32_t mtg_pages(const mtg *m, const mtg_req *q, int64_t total) {
    return mtg_entries(m, q, 0, total) + mtg_entries(m, q, 1, total);
}
static int32_t mtg_free(const mtg *m) {
    int32_t used = 0, i;
    for (i = 0; i < MTG_MAXREQ; i++)
        if (m->r[i].used && !m->r[i].offloaded) used += mtg_pages(m, &m->r[i], m->r[i].committed + m->r[i].reserved);
    return m->num_pages - 1 - used;
}
/* where group g's still-visible tokens start: the library's release point
   (checked by the walk of one group), else the model's live_start */
static int64_t mtg_from(const mtg *m, const mtg_req *q, int g) {
    mskv_request_info info;
    if (mskv_request_info_in_group(m->a, q->h, g, &info) != MSKV_SUCCESS) info.release_point = 0;
    return info.release_point > q->live_start[g] ? info.release_point : q->live_start[g];
}
static int64_t mtg_live(const mtg *m, const mtg_req *q, int g) {
    int64_t live = q->committed - mtg_from(m, q, g);
    return live > 0 ? live : 0;
}
static void mtg_release(mtg *m, mtg_req *q, int g, int64_t n) {
    int32_t freed = (int32_t)((q->live_start[g] + n) / m->P - q->live_start[g] / m->P);
    if (freed > 0) q->live_start[g] += (int64_t)freed * m->P;
}
/* publish's retention in group g (as mtm_model_retention, per group) */
static void mtg_retention(mtg *m, mtg_req *q, int g) {
    const mskv_retention *r = &m->ret[g];
    int64_t sink = r->sink_chunks * r->chunk_size, keep_from, live;
    if (q->committed >= sink && q->prefix[g] < sink && q->live_start[g] <= (int64_t)mtg_pp(m, q, g) * m->P) {
        q->live_start[g] = (int64_t)((sink + m->P - 1) / m->P) * m->P;
        q->prefix[g] = sink;
    }
    if (q->prefix[g] < sink) return;
    keep_from = sink + mtm_skipped(r, q->committed);
    live = q->committed - q->live_start[g];
    if (keep_from > q->live_start[g] && live > 0) mtg_release(m, q, g, keep_from - q->live_start[g] < live ? keep_from - q->live_start[g] : live);
}

static void mtg_expect(mtg *m, mskv_result got, int nviol, mskv_result want, uint64_t before, int change) {
    uint64_t after = mskv_arena_digest(m->a);
    if (nviol == 0) {
        MTM_CHECK(m, got == MSKV_SUCCESS, "expected success, got %d (%s)", (int)got, mskv_result_string(got));
        if (got == MSKV_SUCCESS && change == MTM_SAME) MTM_CHECK(m, after == before, "a no-op changed the digest");
        if (got == MSKV_SUCCESS && change == MTM_CHANGES) MTM_CHECK(m, after != before, "a change left the digest as it was");
    } else {
        MTM_CHECK(m, got == want, "expected %d (%s), got %d (%s) with %d violations", (int)want, mskv_result_string(want),
                  (int)got, mskv_result_string(got), nviol);
        MTM_CHECK(m, after == before, "a failed call changed the state");
    }
    m->digest_checks++;
}

static void mtg_verify(mtg *m) {
    char why[256];
    mskv_arena_stats st;
    int i, g;
    why[0] = '\0';
    MTM_CHECK(m, mskv_arena_audit(m->a, why, sizeof why) == MSKV_SUCCESS, "audit: %s", why);
    MTM_CHECK(m, mskv_arena_stats_get(m->a, &st) == MSKV_SUCCESS && st.free_pages == mtg_free(m),
              "%d free pages, model %d", (int)st.free_pages, (int)mtg_free(m));
    for (i = 0; i < MTG_MAXREQ && !m->bad; i++) {
        mtg_req *q = &m->r[i];
        if (!q->used) continue;
        for (g = 0; g < 2 && !m->bad; g++) {
            mskv_request_info inf;
            MTM_CHECK(m, mskv_request_info_in_group(m->a, q->h, g, &inf) == MSKV_SUCCESS, "info of request %u", q->h.id);
            if (m->bad) return;
            MTM_CHECK(m, inf.committed == q->committed && inf.reserved == q->reserved && inf.has_reservation == q->has_res &&
                             inf.prefix_tokens == q->prefix[g] && inf.live_start == q->live_start[g] &&
                             inf.location == (q->offloaded ? MSKV_OFFLOADED : MSKV_RESIDENT) && inf.lockstep == (q->pair >= 0) &&
                             (q->offloaded || inf.num_pages == mtg_entries(m, q, g, q->committed + q->reserved)),
                      "request %u group %d: library (committed %lld reserved %lld prefix %lld live_start %lld loc %d lockstep %d "
                      "pages %d) model (%lld %lld %lld %lld %d %d %d)", q->h.id, g, (long long)inf.committed,
                      (long long)inf.reserved, (long long)inf.prefix_tokens, (long long)inf.live_start, (int)inf.location,
                      inf.lockstep, inf.num_pages, (long long)q->committed, (long long)q->reserved, (long long)q->prefix[g],
                      (long long)q->live_start[g], q->offloaded, q->pair >= 0, mtg_entries(m, q, g, q->committed + q->reserved));
        }
    }
}

/* a used request (or NULL) */
static mtg_req *mtg_pick(mtg *m) {
    int i, s = (int)mtg_below(m, MTG_MAXREQ);
    for (i = 0; i < MTG_MAXREQ; i++)
        if (m->r[(s + i) % MTG_MAXREQ].used) return &m->r[(s + i) % MTG_MAXREQ];
    return NULL;
}
static int mtg_pick_pair(mtg *m) {
    int i, s = (int)mtg_below(m, MTG_MAXPAIRS);
    for (i = 0; i < MTG_MAXPAIRS; i++)
        if (m->ls[(s + i) % MTG_MAXPAIRS].used) return (s + i) % MTG_MAXPAIRS;
    return -1;
}

static void mtg_op_add(mtg *m) {
    int i;
    mskv_request h;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "add";
    for (i = 0; i < MTG_MAXREQ && m->r[i].used; i++) {}
    if (i == MTG_MAXREQ) return;
    mtg_expect(m, mskv_request_add(m->a, &h), 0, MSKV_SUCCESS, d, MTM_CHANGES);
    if (m->bad) return;
    memset(&m->r[i], 0, sizeof m->r[i]);
    m->r[i].used = 1;
    m->r[i].pair = -1;
    m->r[i].h = h;
    m->counts[0]++;
}

static void mtg_op_remove(mtg *m) {
    mtg_req *q = mtg_pick(m);
    int nviol = 0, stale = m->has_stale && mtg_below(m, 5) == 0;
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "remove";
    if (!q) return;
    if (stale) MTM_VIOL(MSKV_ERROR_INVALID_HANDLE);
    else if (q->pair >= 0) MTM_VIOL(MSKV_ERROR_BAD_STATE);   /* mskv_lockstep_remove */
    e = mskv_request_remove(m->a, stale ? m->stale : q->h);
    mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    m->stale = q->h;
    m->has_stale = 1;
    q->used = 0;
    m->counts[1]++;
}

/* The segments of a request or of its whole pair (half a pair when half is set). */
static int mtg_unit(mtg *m, mtg_req *q, int half, mskv_segment *s, mtg_req **qs, int64_t n_tokens) {
    int n = 0, k;
    if (q->pair < 0 || half) {
        qs[0] = q;
        n = 1;
    } else
        for (k = 0; k < 2; k++) qs[n++] = &m->r[m->ls[q->pair].m[k]];
    for (k = 0; k < n; k++) {
        s[k].request = qs[k]->h;
        s[k].n_tokens = n_tokens < 0 ? qs[k]->reserved : n_tokens;
    }
    return n;
}

static void mtg_op_admit(mtg *m) {
    mtg_req *q = mtg_pick(m), *qs[2];
    mskv_segment s[2];
    int n, k, nviol = 0, half;
    int64_t tokens, need = 0;
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "admit";
    if (!q) return;
    half = q->pair >= 0 && mtg_below(m, 8) == 0;
    tokens = 1 + mtg_below(m, 3 * m->P);
    n = mtg_unit(m, q, half, s, qs, tokens);
    if (half) MTM_VIOL(MSKV_ERROR_BAD_STATE);   /* the whole group steps */
    for (k = 0; k < n; k++) {
        if (qs[k]->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
        else if (qs[k]->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
        else need += mtg_pages(m, qs[k], qs[k]->committed + tokens) - mtg_pages(m, qs[k], qs[k]->committed);
    }
    if (need > mtg_free(m)) MTM_VIOL(MSKV_ERROR_OUT_OF_PAGES);
    if (nviol == 0) {   /* what admit_query says first */
        int64_t asked = -1;
        uint64_t d2 = mskv_arena_digest(m->a);
        e = mskv_admit_query(m->a, s, n, &asked);
        MTM_CHECK(m, e == MSKV_SUCCESS && asked == need, "admit_query: %d, %lld pages, model %lld", (int)e, (long long)asked, (long long)need);
        MTM_CHECK(m, mskv_arena_digest(m->a) == d2, "admit_query changed the state");
    }
    e = mskv_admit(m->a, s, n);
    mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < n; k++) {
        qs[k]->reserved = tokens;
        qs[k]->has_res = 1;
    }
    m->counts[2]++;
}

static void mtg_op_commit(mtg *m, int abort_it) {
    mtg_req *q = mtg_pick(m), *qs[2];
    mskv_segment s[2];
    int n, k, nviol = 0, half;
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = abort_it ? "abort" : "commit";
    if (!q) return;
    half = q->pair >= 0 && mtg_below(m, 8) == 0;
    n = mtg_unit(m, q, half, s, qs, -1);
    if (half) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    for (k = 0; k < n; k++)
        if (!qs[k]->has_res) MTM_VIOL(MSKV_ERROR_NO_RESERVATION);
    e = abort_it ? mskv_abort(m->a, s, n) : mskv_commit(m->a, s, n);
    mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < n; k++) {
        if (!abort_it) qs[k]->committed += qs[k]->reserved;
        qs[k]->reserved = 0;
        qs[k]->has_res = 0;
    }
    m->counts[abort_it ? 4 : 3]++;
}

static void mtg_op_release(mtg *m) {
    mtg_req *q = mtg_pick(m);
    int g = (int)mtg_below(m, 2), nviol = 0, k, whole;
    int64_t n, live, got = -1, want_got = 0, from[2] = {0, 0};
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "release in a group";
    if (!q) return;
    whole = q->pair >= 0 && mtg_below(m, 6) != 0;   /* mostly the pair's call */
    live = mtg_live(m, q, g);
    if (whole)
        for (k = 0; k < 2; k++) {
            from[k] = mtg_from(m, &m->r[m->ls[q->pair].m[k]], g);
            if (mtg_live(m, &m->r[m->ls[q->pair].m[k]], g) < live) live = mtg_live(m, &m->r[m->ls[q->pair].m[k]], g);
        }
    else
        from[0] = mtg_from(m, q, g);
    n = mtg_below(m, 10) == 0 ? live + 1 : mtg_below(m, live + 1);
    if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
    if (n > live) MTM_VIOL(MSKV_ERROR_OUT_OF_RANGE);
    if (!whole && q->pair >= 0) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    e = whole ? mskv_lockstep_release_oldest(m->a, m->ls[q->pair].h, g, n, &got)
              : mskv_request_release_oldest_in_group(m->a, q->h, g, n, &got);
    mtg_expect(m, e, nviol, want, d, MTM_EITHER);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < (whole ? 2 : 1); k++) {
        mtg_req *x = whole ? &m->r[m->ls[q->pair].m[k]] : q;
        int64_t before = x->live_start[g];
        mtg_release(m, x, g, from[k] + n - before);   /* n counts on from the previous release point */
        want_got += x->live_start[g] - before;
    }
    MTM_CHECK(m, got == want_got, "released %lld tokens, model %lld", (long long)got, (long long)want_got);
    m->counts[5]++;
}

static void mtg_op_offload(mtg *m) {
    mtg_req *q = mtg_pick(m);
    int nviol = 0, k, whole;
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "offload";
    if (!q) return;
    whole = q->pair >= 0 && mtg_below(m, 6) != 0;
    if (whole) {
        for (k = 0; k < 2; k++) {
            mtg_req *x = &m->r[m->ls[q->pair].m[k]];
            if (x->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
            else if (x->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
        }
    } else {
        if (q->offloaded) MTM_VIOL(MSKV_ERROR_OFFLOADED);
        else if (q->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
        if (q->pair >= 0) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    }
    e = whole ? mskv_lockstep_offload(m->a, m->ls[q->pair].h) : mskv_request_offload(m->a, q->h);
    mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < (whole ? 2 : 1); k++) (whole ? &m->r[m->ls[q->pair].m[k]] : q)->offloaded = 1;
    m->counts[6]++;
}

static void mtg_op_reload(mtg *m) {
    mtg_req *q = mtg_pick(m);
    int nviol = 0, k, whole;
    int32_t need = 0;
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "reload";
    if (!q) return;
    whole = q->pair >= 0 && mtg_below(m, 6) != 0;
    for (k = 0; k < (whole ? 2 : 1); k++) {
        mtg_req *x = whole ? &m->r[m->ls[q->pair].m[k]] : q;
        if (!x->offloaded) MTM_VIOL(MSKV_ERROR_NOT_OFFLOADED);
        need += mtg_pages(m, x, x->committed);
    }
    if (!whole && q->pair >= 0) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    if (need > mtg_free(m)) MTM_VIOL(MSKV_ERROR_OUT_OF_PAGES);
    e = whole ? mskv_lockstep_reload(m->a, m->ls[q->pair].h) : mskv_request_reload(m->a, q->h);
    mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (k = 0; k < (whole ? 2 : 1); k++) (whole ? &m->r[m->ls[q->pair].m[k]] : q)->offloaded = 0;
    m->counts[7]++;
}

static void mtg_op_lockstep(mtg *m) {
    int p = mtg_pick_pair(m), i, nviol = 0, k = (int)mtg_below(m, 3);
    mskv_result want = MSKV_SUCCESS, e;
    uint64_t d = mskv_arena_digest(m->a);
    if (k == 0 || p < 0) {   /* create from two requests in no pair */
        int cand[MTG_MAXREQ], nc = 0, slot;
        mtg_req *a0, *a1;
        mskv_request mem[2];
        mskv_lockstep out;
        m->op_name = "lockstep_create";
        for (slot = 0; slot < MTG_MAXPAIRS && m->ls[slot].used; slot++) {}
        for (i = 0; i < MTG_MAXREQ; i++)
            if (m->r[i].used && m->r[i].pair < 0) cand[nc++] = i;
        if (slot == MTG_MAXPAIRS || nc < 2) return;
        i = (int)mtg_below(m, nc);
        k = (i + 1 + (int)mtg_below(m, nc - 1)) % nc;
        a0 = &m->r[cand[i]]; a1 = &m->r[cand[k]];
        mem[0] = a0->h; mem[1] = a1->h;
        if (a0->has_res || a1->has_res) MTM_VIOL(MSKV_ERROR_RESERVATION_PENDING);
        if (a0->offloaded != a1->offloaded) MTM_VIOL(MSKV_ERROR_BAD_STATE);   /* resident with offloaded */
        e = mskv_lockstep_create(m->a, mem, 2, &out);
        mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
        if (e != MSKV_SUCCESS || nviol) return;
        m->ls[slot].used = 1; m->ls[slot].h = out; m->ls[slot].m[0] = cand[i]; m->ls[slot].m[1] = cand[k];
        a0->pair = a1->pair = slot;
        m->counts[8]++;
    } else if (k == 1) {
        int stale = m->has_dead && mtg_below(m, 5) == 0;
        m->op_name = "lockstep_dissolve";
        if (stale) MTM_VIOL(MSKV_ERROR_INVALID_HANDLE);
        e = mskv_lockstep_dissolve(m->a, stale ? m->dead : m->ls[p].h);
        mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
        if (e != MSKV_SUCCESS || nviol) return;
        m->dead = m->ls[p].h; m->has_dead = 1;
        m->ls[p].used = 0;
        m->r[m->ls[p].m[0]].pair = m->r[m->ls[p].m[1]].pair = -1;
        m->counts[9]++;
    } else {
        m->op_name = "lockstep_remove";
        e = mskv_lockstep_remove(m->a, m->ls[p].h);
        mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
        if (e != MSKV_SUCCESS || nviol) return;
        m->dead = m->ls[p].h; m->has_dead = 1;
        m->stale = m->r[m->ls[p].m[0]].h; m->has_stale = 1;
        m->ls[p].used = 0;
        m->r[m->ls[p].m[0]].used = m->r[m->ls[p].m[1]].used = 0;
        m->counts[10]++;
    }
}

static void mtg_op_set_retention(mtg *m) {
    mtg_req *q = mtg_pick(m);
    int g = (int)mtg_below(m, 2), clear = mtg_below(m, 6) == 0;
    uint64_t d = mskv_arena_digest(m->a);
    m->op_name = "set_retention_in_group";
    if (!q) return;
    mtg_expect(m, mskv_request_set_retention_in_group(m->a, q->h, g, clear ? NULL : &m->ret[g]), 0, MSKV_SUCCESS, d, MTM_EITHER);
    if (m->bad) return;
    q->has_ret[g] = !clear;
    m->counts[11]++;
}

static void mtg_op_publish(mtg *m) {
    mskv_segment s[MTG_MAXREQ];
    mtg_req *qs[MTG_MAXREQ];
    int n = 0, i, g, nviol = 0, half = 0, off = 0;
    uint64_t d = mskv_arena_digest(m->a);
    mskv_result want = MSKV_SUCCESS, e;
    m->op_name = "publish segments";
    for (i = 0; i < MTG_MAXREQ; i++)
        if (m->r[i].used && mtg_below(m, 2)) {
            qs[n] = &m->r[i];
            s[n].request = m->r[i].h;
            s[n].n_tokens = 0;
            n++;
        }
    for (i = 0; i < n; i++) {   /* a pair is published whole */
        int k, found = 0;
        if (qs[i]->pair < 0) continue;
        for (k = 0; k < n; k++) found += qs[k]->pair == qs[i]->pair;
        half |= found < 2;
        off |= qs[i]->offloaded;
    }
    for (i = 0; i < n; i++) off |= qs[i]->offloaded;
    if (half) MTM_VIOL(MSKV_ERROR_BAD_STATE);
    if (off) MTM_VIOL(MSKV_ERROR_OFFLOADED);
    e = mskv_publish(m->a, s, n, NULL);
    mtg_expect(m, e, nviol, want, d, MTM_CHANGES);
    if (e != MSKV_SUCCESS || nviol) return;
    for (i = 0; i < n; i++)
        for (g = 0; g < 2; g++)
            if (qs[i]->has_ret[g]) mtg_retention(m, qs[i], g);
    m->counts[12]++;
}

static void mtg_run_seed(uint64_t seed) {
    mtg *m = (mtg *)calloc(1, sizeof *m);
    mskv_arena_desc d;
    long i;
    int k;
    if (!m) { mt_fail(__FILE__, __LINE__, "out of memory"); return; }
    m->rng = seed * 0x9E3779B97F4A7C15ull + 3;
    m->P = 1 + (int32_t)mtg_below(m, 4);
    m->num_pages = 40 + (int32_t)mtg_below(m, 60);
    memset(&d, 0, sizeof d);
    d.num_pages = m->num_pages;
    d.page_size = m->P;
    d.num_groups = 2;
    d.max_requests = MTG_MAXREQ;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = MTM_DIM;
    d.retire_mode = MSKV_RETIRE_IMMEDIATE;
    if (mskv_arena_create(&d, &m->a) != MSKV_SUCCESS) {
        mt_fail(__FILE__, __LINE__, "arena_create");
        free(m);
        return;
    }
    m->ret[0].chunk_size = m->P; m->ret[0].sink_chunks = 1; m->ret[0].window_chunks = 2;
    m->ret[1].chunk_size = 2 * (int64_t)m->P; m->ret[1].window_chunks = 1;
    printf("  seed %llu: page size %d, %d pages, two layer groups\n", (unsigned long long)seed, (int)m->P, (int)m->num_pages);
    for (i = 0; i < MTG_OPS && !m->bad; i++) {
        int64_t pick = mtg_below(m, 100);
        m->op = i;
        if (pick < 8) mtg_op_add(m);
        else if (pick < 12) mtg_op_remove(m);
        else if (pick < 34) mtg_op_admit(m);
        else if (pick < 48) mtg_op_commit(m, 0);
        else if (pick < 53) mtg_op_commit(m, 1);
        else if (pick < 65) mtg_op_release(m);
        else if (pick < 71) mtg_op_offload(m);
        else if (pick < 78) mtg_op_reload(m);
        else if (pick < 86) mtg_op_lockstep(m);
        else if (pick < 90) mtg_op_set_retention(m);
        else mtg_op_publish(m);
        if (!m->bad) mtg_verify(m);
    }
    if (!m->bad) {
        static const char *names[13] = {"add", "remove", "admit", "commit", "abort", "release", "offload", "reload",
                                        "lockstep_create", "lockstep_dissolve", "lockstep_remove", "set_retention", "publish"};
        for (k = 0; k < 13; k++)
            if (m->counts[k] < 20) mt_fail(__FILE__, __LINE__, "only %ld successful %s operations", m->counts[k], names[k]);
    }
    printf("    successes: add %ld remove %ld admit %ld commit %ld abort %ld release %ld offload %ld reload %ld "
           "lockstep create %ld dissolve %ld remove %ld retention %ld publish %ld; %ld digest checks\n",
           m->counts[0], m->counts[1], m->counts[2], m->counts[3], m->counts[4], m->counts[5], m->counts[6], m->counts[7],
           m->counts[8], m->counts[9], m->counts[10], m->counts[11], m->counts[12], m->digest_checks);
    mskv_arena_destroy(m->a);
    free(m);
}

TEST(model_random_walk_of_layer_groups_and_lockstep_pairs_matches_the_shadow_model_after_every_operation) {
    uint64_t base = mt_seed();
    int s;
    for (s = 0; s < MTM_SEEDS && !mt_failed_now(); s++) mtg_run_seed(base + (uint64_t)s * 0x632BE59BD9B4E019ull);
}
