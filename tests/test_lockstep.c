/* Lockstep groups (classifier-free guidance's conditional and unconditional
   branches): separate requests admitted, planned, committed, published,
   released, offloaded, reloaded and removed together, all or nothing; a
   failed group call leaves the digest as it was. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* ---- a host allocator that fails its n-th allocation ---------------------- */

static int mtl_fail_at, mtl_allocs;
static long mtl_live;
static void *mtl_alloc(void *u, size_t n) {
    (void)u;
    if (++mtl_allocs == mtl_fail_at) return NULL;
    mtl_live++;
    return malloc(n);
}
static void *mtl_realloc(void *u, void *p, size_t n) {
    void *q;
    (void)u;
    if (!p) return mtl_alloc(u, n);
    q = realloc(p, n);
    return q;
}
static void mtl_free(void *u, void *p) { (void)u; if (p) { mtl_live--; free(p); } }

/* ---- a store that keeps the bytes itself and fails its n-th read or write -- */

typedef struct mtl_store {
    unsigned char *dev;       /* [num_pages][record] */
    size_t record;
    int reads, writes, fail_read_at, fail_write_at, flushes;
    mskv_result flush_result;
} mtl_store;

static mskv_result mtl_read(void *u, const int32_t *pages, int32_t n, void *dst) {
    mtl_store *s = (mtl_store *)u;
    int32_t i;
    if (++s->reads == s->fail_read_at) return MSKV_ERROR_IO;
    for (i = 0; i < n; i++) memcpy((unsigned char *)dst + (size_t)i * s->record, s->dev + (size_t)pages[i] * s->record, s->record);
    return MSKV_SUCCESS;
}
static mskv_result mtl_write(void *u, const int32_t *pages, int32_t n, const void *src) {
    mtl_store *s = (mtl_store *)u;
    int32_t i;
    if (++s->writes == s->fail_write_at) return MSKV_ERROR_IO;
    for (i = 0; i < n; i++) memcpy(s->dev + (size_t)pages[i] * s->record, (const unsigned char *)src + (size_t)i * s->record, s->record);
    return MSKV_SUCCESS;
}
static mskv_result mtl_copy(void *u, int32_t src, int32_t dst) {
    mtl_store *s = (mtl_store *)u;
    memcpy(s->dev + (size_t)dst * s->record, s->dev + (size_t)src * s->record, s->record);
    return MSKV_SUCCESS;
}

/* One layer, one head of 4 f32: a page record is 2 * page_size * 16 bytes. */
static mskv_arena *mtl_make(int32_t num_pages, int32_t page_size, int host_alloc, const mskv_store_ops *ops) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4; d.dtype = MSKV_DTYPE_F32;
    d.store_ops = ops;
    if (host_alloc) {
        d.host_allocator.alloc = mtl_alloc;
        d.host_allocator.realloc = mtl_realloc;
        d.host_allocator.free = mtl_free;
    }
    mtl_fail_at = 0;
    mtl_allocs = 0;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

/* a CFG pair: cond with a 5-token prompt, uncond with a 3-token one */
static int mtl_pair(mskv_arena *a, mskv_request br[2], mskv_lockstep *ls) {
    if (mskv_request_add(a, &br[0]) || mtu_grow(a, br[0], 5)) return 0;
    if (mskv_request_add(a, &br[1]) || mtu_grow(a, br[1], 3)) return 0;
    return mskv_lockstep_create(a, br, 2, ls) == MSKV_SUCCESS;
}

static mskv_request_info mtl_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.num_pages = -1;
    return i;
}

/* A byte per (request tag, position) in the host pools, or in the mock store. */
static unsigned char mtl_byte(uint32_t tag, int64_t pos, size_t i) { return (unsigned char)(tag * 37u + (uint32_t)pos * 11u + (uint32_t)i); }
static int64_t mtl_bytes(mskv_arena *a, mtl_store *st, mskv_request r, uint32_t tag, int64_t from, int64_t to, int check) {
    mskv_store_info si;
    int64_t pos, slot, bad = 0;
    int kind;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return -1;
    for (pos = from; pos < to; pos++) {
        int ok = 1;
        if (mskv_request_slot(a, r, pos, &slot) != MSKV_SUCCESS) { bad++; continue; }
        for (kind = 0; kind < 2; kind++) {
            unsigned char *p;
            if (st) p = st->dev + (size_t)(slot / si.page_size) * st->record + (size_t)kind * si.page_bytes + (size_t)(slot % si.page_size) * si.slot_bytes;
            else p = (unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)slot * si.slot_bytes;
            for (i = 0; i < si.slot_bytes; i++) {
                if (!check) p[i] = mtl_byte(tag + (uint32_t)kind, pos, i);
                else if (p[i] != mtl_byte(tag + (uint32_t)kind, pos, i)) ok = 0;
            }
        }
        bad += !ok;
    }
    return bad;
}

TEST(lockstep_branches_are_admitted_planned_committed_and_published_together) {
    mskv_arena *a = mtl_make(64, 4, 0, NULL);
    mskv_request br[2], got[2];
    mskv_lockstep ls;
    mskv_retention ret;
    mskv_segment segs[2];
    mskv_plan plan;
    mskv_plan_desc pd;
    int32_t n = 0, k, b;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_members(a, ls, got, 2, &n));
    ASSERT_EQ(2, n);
    EXPECT_EQ(br[0].id, got[0].id);
    EXPECT_EQ(br[1].id, got[1].id);
    EXPECT_TRUE(mtl_info(a, br[0]).lockstep && mtl_info(a, br[1]).lockstep);
    memset(&ret, 0, sizeof ret);   /* a window of 2 chunks of 4 after a 4-token sink */
    ret.chunk_size = 4; ret.sink_chunks = 1; ret.window_chunks = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_set_retention(a, br[0], &ret));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_set_retention(a, br[1], &ret));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 2, 8, 64, &plan));
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    for (k = 0; k < 6; k++) {
        mskv_request_info c, u;
        ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 4, segs, 2, &n));
        ASSERT_EQ(2, n);
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, segs, n));
        EXPECT_TRUE(mtl_info(a, br[0]).has_reservation && mtl_info(a, br[1]).has_reservation);
        EXPECT_EQ(mtl_info(a, br[0]).last_admitted, mtl_info(a, br[1]).last_admitted);
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, segs, n, &pd, &plan));   /* one plan: branch b is segment b */
        ASSERT_EQ(2, plan.batch);
        for (b = 0; b < 2; b++) {
            int32_t pages[32], np = 0, i;
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, br[b], pages, 32, &np));
            ASSERT_EQ(np, plan.kv_indptr[b + 1] - plan.kv_indptr[b]);
            for (i = 0; i < np; i++) EXPECT_EQ(pages[i], plan.kv_indices[plan.kv_indptr[b] + i]);
            EXPECT_EQ((b == 0 ? 5 : 3) + 4 * k, plan.positions[plan.qo_indptr[b]]);   /* each branch's own positions */
        }
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, segs, n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, segs, n, NULL));   /* both branches' retention in this step */
        EXPECT_TRUE(mtu_audit(a));
        c = mtl_info(a, br[0]);
        u = mtl_info(a, br[1]);
        EXPECT_EQ(5 + 4 * (k + 1), c.committed);
        EXPECT_EQ(3 + 4 * (k + 1), u.committed);
        EXPECT_EQ(4 + mskv_skipped_tokens(&ret, c.committed) / 4 * 4, c.live_start);
        EXPECT_EQ(4 + mskv_skipped_tokens(&ret, u.committed) / 4 * 4, u.live_start);
    }
    EXPECT_GT(mtl_info(a, br[0]).live_start, 4);   /* both windows slid */
    EXPECT_GT(mtl_info(a, br[1]).live_start, 4);
    mskv_plan_free(a, &plan);
    mskv_arena_destroy(a);
}

TEST(lockstep_batch_with_a_member_missing_is_BAD_STATE_and_changes_nothing) {
    mskv_arena *a = mtl_make(64, 4, 0, NULL);
    mskv_request br[2], other;
    mskv_lockstep ls;
    mskv_segment segs[3];
    int32_t n = 0;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &other));
    segs[0].request = other; segs[0].n_tokens = 4;
    segs[1].request = br[1]; segs[1].n_tokens = 4;
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit(a, segs, 2));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_publish(a, segs + 1, 1, NULL));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    /* the whole group inside a larger batch is fine */
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 4, segs + 1, 2, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, segs, 3));
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_commit(a, segs + 1, 1));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_abort(a, segs + 2, 1));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_abort(a, segs + 1, 2));
    EXPECT_EQ(MSKV_SUCCESS, mskv_commit(a, segs, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(lockstep_admit_out_of_pages_for_the_second_branch_changes_neither) {
    /* cond holds 2 pages, uncond 1; 3 free: a step of 8 tokens needs 2 + 2 */
    mskv_arena *a = mtl_make(1 + 3 + 3, 4, 0, NULL);
    mskv_request br[2];
    mskv_lockstep ls;
    mskv_segment segs[2];
    int32_t n = 0;
    int64_t need = 0;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 8, segs, 2, &n));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit_query(a, segs, 1, &need));   /* half a group */
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit_query(a, segs, 2, &need));
    EXPECT_EQ(4, need);
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(a, segs, 2));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_FALSE(mtl_info(a, br[0]).has_reservation);
    EXPECT_FALSE(mtl_info(a, br[1]).has_reservation);
    EXPECT_EQ(2, mtl_info(a, br[0]).num_pages);   /* cond alone would have fitted: it got nothing */
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(lockstep_offload_with_a_host_allocation_failure_for_one_branch_leaves_both_resident) {
    mskv_arena *a = mtl_make(32, 4, 1, NULL);
    mskv_request br[2];
    mskv_lockstep ls;
    mskv_arena_stats st;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(0, mtl_bytes(a, NULL, br[0], 1, 0, 5, 0));
    ASSERT_EQ(0, mtl_bytes(a, NULL, br[1], 7, 0, 3, 0));
    mtl_allocs = 0;
    mtl_fail_at = 2;              /* the second branch's host copy */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, mskv_lockstep_offload(a, ls));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(0, mtl_live);       /* the first branch's copy went back */
    EXPECT_EQ(MSKV_RESIDENT, mtl_info(a, br[0]).location);
    EXPECT_EQ(MSKV_RESIDENT, mtl_info(a, br[1]).location);
    EXPECT_TRUE(mtu_audit(a));
    /* and with memory both go, and come back byte-exact */
    mtl_fail_at = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    EXPECT_EQ(2, mtl_live);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.live_pages);
    EXPECT_EQ(3, st.offloaded_pages);
    EXPECT_TRUE(mtu_audit(a));
    memset(mskv_store_pool(a, 0, 0), 0, 32 * 4 * 16);
    memset(mskv_store_pool(a, 0, 1), 0, 32 * 4 * 16);
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    EXPECT_EQ(0, mtl_bytes(a, NULL, br[0], 1, 0, 5, 1));
    EXPECT_EQ(0, mtl_bytes(a, NULL, br[1], 7, 0, 3, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
    EXPECT_EQ(0, mtl_live);
}

TEST(lockstep_offload_and_reload_with_a_store_failure_for_one_branch_change_neither) {
    static mtl_store st;
    mskv_store_ops ops;
    mskv_arena *a;
    mskv_request br[2];
    mskv_lockstep ls;
    uint64_t d;
    memset(&st, 0, sizeof st);
    st.record = 2 * 4 * 16;
    st.dev = (unsigned char *)calloc(32, st.record);
    ASSERT_TRUE(st.dev != NULL);
    memset(&ops, 0, sizeof ops);
    ops.user = &st; ops.read_pages = mtl_read; ops.write_pages = mtl_write; ops.copy_page = mtl_copy;
    a = mtl_make(32, 4, 0, &ops);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(0, mtl_bytes(a, &st, br[0], 1, 0, 5, 0));
    ASSERT_EQ(0, mtl_bytes(a, &st, br[1], 7, 0, 3, 0));
    st.reads = 0;
    st.fail_read_at = 2;          /* copying the second branch out fails */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_IO, mskv_lockstep_offload(a, ls));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_RESIDENT, mtl_info(a, br[0]).location);
    EXPECT_TRUE(mtu_audit(a));
    st.fail_read_at = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    memset(st.dev, 0, 32 * st.record);
    st.writes = 0;
    st.fail_write_at = 2;         /* copying the second branch back fails */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_IO, mskv_lockstep_reload(a, ls));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_OFFLOADED, mtl_info(a, br[0]).location);
    EXPECT_EQ(MSKV_OFFLOADED, mtl_info(a, br[1]).location);
    EXPECT_TRUE(mtu_audit(a));
    st.fail_write_at = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    EXPECT_EQ(0, mtl_bytes(a, &st, br[0], 1, 0, 5, 1));
    EXPECT_EQ(0, mtl_bytes(a, &st, br[1], 7, 0, 3, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
    free(st.dev);
}

TEST(lockstep_reload_needs_pages_for_every_branch) {
    mskv_arena *a = mtl_make(1 + 3 + 2, 4, 0, NULL);
    mskv_request br[2], hog;
    mskv_lockstep ls;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &hog));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, hog, 12));   /* 3 of 5 pages: room for one branch, not both */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_lockstep_reload(a, ls));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, hog));
    EXPECT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    EXPECT_EQ(MSKV_RESIDENT, mtl_info(a, br[0]).location);
    EXPECT_EQ(MSKV_RESIDENT, mtl_info(a, br[1]).location);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(single_request_calls_refuse_lockstep_members) {
    mskv_arena *a = mtl_make(32, 4, 0, NULL);
    mskv_request br[2], child;
    mskv_lockstep ls;
    mskv_session sess;
    mskv_retention ret;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_offload(a, br[0]));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_remove(a, br[1]));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_release_oldest(a, br[0], 4, NULL));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_release_oldest_in_group(a, br[1], 0, 0, NULL));
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 4; ret.window_chunks = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&sess, a, br[0], &ret));
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_session_begin_chunk(&sess, 4));   /* a session admits one request */
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_reload(a, br[0]));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    /* what frees no page stays per request: protect, fork (the child is no member) */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, br[1], 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, br[0], &child));
    EXPECT_FALSE(mtl_info(a, child).lockstep);
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(a, child));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(a_paused_member_keeps_its_lockstep_group_from_being_admitted) {
    mskv_arena *a = mtl_make(32, 4, 0, NULL);
    mskv_request br[2];
    mskv_lockstep ls;
    mskv_segment segs[2];
    int32_t n = 0;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pause(a, br[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 4, segs, 2, &n));
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit(a, segs, n));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_resume(a, br[1]));
    EXPECT_EQ(MSKV_SUCCESS, mskv_admit(a, segs, n));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(lockstep_release_oldest_releases_every_member_or_none) {
    mskv_arena *a = mtl_make(32, 4, 0, NULL);
    mskv_request br[2];
    mskv_lockstep ls;
    int64_t released = -1;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));        /* 5 and 3 committed tokens */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_lockstep_release_oldest(a, ls, 0, 4, &released));   /* uncond has 3 */
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(-1, released);
    EXPECT_EQ(MSKV_SUCCESS, mskv_lockstep_release_oldest(a, ls, 0, 3, &released));
    EXPECT_EQ(0, released);                   /* page floor: no page is wholly before token 3 */
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mtu_grow(a, br[0], 4));   /* one branch alone is not admitted */
    {
        mskv_segment segs[2];
        int32_t n = 0;
        ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 4, segs, 2, &n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, segs, n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, segs, n));   /* 9 and 7 */
    }
    EXPECT_EQ(MSKV_SUCCESS, mskv_lockstep_release_oldest(a, ls, 0, 4, &released));
    EXPECT_EQ(8, released);                   /* one page from each */
    EXPECT_EQ(4, mtl_info(a, br[0]).live_start);
    EXPECT_EQ(4, mtl_info(a, br[1]).live_start);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(lockstep_remove_drops_every_member_and_the_group) {
    mskv_arena *a = mtl_make(32, 4, 0, NULL);
    mskv_request br[2];
    mskv_lockstep ls;
    mskv_arena_stats st;
    mskv_request_info info;
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_remove(a, ls));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, br[0], &info));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(a, br[1], &info));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_members(a, ls, NULL, 0, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.requests);
    EXPECT_EQ(31, st.free_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(lockstep_dissolve_leaves_independent_requests_and_a_stale_handle) {
    mskv_arena *a = mtl_make(32, 4, 0, NULL);
    mskv_request br[2];
    mskv_lockstep ls, again;
    mskv_segment seg;
    int32_t n = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtl_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_dissolve(a, ls));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_segments(a, ls, 1, &seg, 1, &n));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(a, ls));
    EXPECT_FALSE(mtl_info(a, br[0]).lockstep);
    EXPECT_EQ(MSKV_SUCCESS, mtu_grow(a, br[0], 4));       /* alone now */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(a, br[1]));
    /* a new group may reuse the slot: the old handle stays stale */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(a, br[1]));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(a, br, 2, &again));
    EXPECT_NE(ls.id, again.id);
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(a, ls));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* The bad-input rows of the lockstep calls (the pattern of
   tests/test_bad_input.c): each invalid argument returns its code and the
   state is unchanged. */
#define MTL_BAD(a, want, call)                                                            \
    do {                                                                                  \
        uint64_t mtl__d = mskv_arena_digest(a);                                           \
        mskv_result mtl__e = (call);                                                      \
        if (mtl__e != (want))                                                             \
            mt_fail(__FILE__, __LINE__, "%s: expected %d (%s), got %d (%s)", #call, (int)(want), \
                    mskv_result_string(want), (int)mtl__e, mskv_result_string(mtl__e));   \
        if (mskv_arena_digest(a) != mtl__d) mt_fail(__FILE__, __LINE__, "%s changed the state", #call); \
        (void)mtu_audit(a);                                                               \
    } while (0)

TEST(bad_input_lockstep_calls_return_their_codes_and_change_nothing) {
    mskv_arena *a = mtl_make(1 + 2 + 1 + 3 + 3, 4, 0, NULL);
    mskv_request br[2], free1, res, off, stale, keyed, d1, d2, m[MSKV_MAX_LOCKSTEP + 1];
    mskv_lockstep ls, out, dead, unknown;
    mskv_segment segs[4], s1;
    mskv_request got[4];
    int32_t n = 0, i;
    int64_t rel = 0;
    ASSERT_TRUE(a != NULL);
    unknown.id = 0xFFFFFFFFu;
    ASSERT_TRUE(mtl_pair(a, br, &ls));                                   /* 3 pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &free1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &res));
    s1.request = res; s1.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s1, 1));                       /* 1 page, open */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &off));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, off, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, off));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 5, 4, &keyed));          /* 1 page */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &d1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &d2));
    m[0] = d1; m[1] = d2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(a, m, 2, &dead));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_dissolve(a, dead));
    /* create */
    m[0] = free1; m[1] = res;
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_create(NULL, m, 2, &out));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_create(a, NULL, 2, &out));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_create(a, m, 2, NULL));
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_create(a, m, 1, &out));
    for (i = 0; i <= MSKV_MAX_LOCKSTEP; i++) m[i] = free1;
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_create(a, m, MSKV_MAX_LOCKSTEP + 1, &out));
    MTL_BAD(a, MSKV_ERROR_DUPLICATE, mskv_lockstep_create(a, m, 2, &out));
    m[1] = stale;
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_create(a, m, 2, &out));
    m[1] = res;
    MTL_BAD(a, MSKV_ERROR_RESERVATION_PENDING, mskv_lockstep_create(a, m, 2, &out));
    m[1] = keyed;
    MTL_BAD(a, MSKV_ERROR_READ_ONLY, mskv_lockstep_create(a, m, 2, &out));
    m[1] = br[0];
    MTL_BAD(a, MSKV_ERROR_BAD_STATE, mskv_lockstep_create(a, m, 2, &out));   /* already a member */
    m[1] = off;
    MTL_BAD(a, MSKV_ERROR_BAD_STATE, mskv_lockstep_create(a, m, 2, &out));   /* resident with offloaded */
    /* dissolve, members, segments */
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_dissolve(NULL, ls));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(a, dead));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(a, unknown));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_members(NULL, ls, got, 4, &n));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_members(a, ls, got, 4, NULL));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_members(a, ls, NULL, 4, &n));
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_members(a, ls, got, -1, &n));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_members(a, dead, got, 4, &n));
    n = 0;
    MTL_BAD(a, MSKV_ERROR_CAPACITY, mskv_lockstep_members(a, ls, got, 1, &n));
    EXPECT_EQ(2, n);
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_segments(NULL, ls, 4, segs, 4, &n));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_segments(a, ls, 4, segs, 4, NULL));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_segments(a, ls, 4, NULL, 4, &n));
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_segments(a, ls, -1, segs, 4, &n));
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_segments(a, ls, 4, segs, -1, &n));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_segments(a, dead, 4, segs, 4, &n));
    MTL_BAD(a, MSKV_ERROR_CAPACITY, mskv_lockstep_segments(a, ls, 4, segs, 1, &n));
    /* offload, reload, remove, release */
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_offload(NULL, ls));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_offload(a, dead));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_reload(NULL, ls));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_reload(a, unknown));
    MTL_BAD(a, MSKV_ERROR_NOT_OFFLOADED, mskv_lockstep_reload(a, ls));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_remove(NULL, ls));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_remove(a, dead));
    MTL_BAD(a, MSKV_ERROR_NULL_POINTER, mskv_lockstep_release_oldest(NULL, ls, 0, 1, &rel));
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_release_oldest(a, ls, 1, 1, &rel));
    MTL_BAD(a, MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_release_oldest(a, ls, 0, -1, &rel));
    MTL_BAD(a, MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_release_oldest(a, dead, 0, 1, &rel));
    /* offload with a member's reservation open; then out of pages to admit the group */
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(a, ls, 1, segs, 4, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, segs, n));
    MTL_BAD(a, MSKV_ERROR_RESERVATION_PENDING, mskv_lockstep_offload(a, ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, segs, n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    MTL_BAD(a, MSKV_ERROR_OFFLOADED, mskv_lockstep_offload(a, ls));
    MTL_BAD(a, MSKV_ERROR_OFFLOADED, mskv_lockstep_release_oldest(a, ls, 0, 0, &rel));
    mskv_arena_destroy(a);
}
