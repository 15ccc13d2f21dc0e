/* The issue-9 checks where they meet layer groups, lockstep groups,
   make_room, reset and flush: a plan goes stale per request and per layer
   group (a plan of group g reads only group g's tables: pages leaving
   another group's table leave it valid); pages freed by reset, flush and
   make_room are poisoned in every group; the checksums of a host copy cover
   every group's records, and every member's copy after a lockstep offload. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* ---- fixture: 2 groups of 1 layer, page size 4, 2 kv heads x 8 dims, f32 ----
   (a page of one pool is 256 bytes; a host-copy record, K and V, 512) */

#define MHG_RECORD 512

/* host allocator that remembers its blocks, so a test can reach a host copy */
static unsigned char *mhg_host[8];
static int mhg_nhost;
static void *mhg_host_alloc(void *u, size_t n) {
    unsigned char *p = (unsigned char *)malloc(n);
    (void)u;
    if (p && mhg_nhost < 8) mhg_host[mhg_nhost++] = p;
    return p;
}
static void *mhg_host_realloc(void *u, void *p, size_t n) { (void)u; return realloc(p, n); }
static void mhg_host_free(void *u, void *p) { (void)u; free(p); }

static mskv_arena *mhg_make(int32_t num_pages, mskv_retire_mode mode, uint32_t debug) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = 4; d.num_groups = 2;
    d.num_layers = 1; d.kv_heads = 2; d.head_dim = 8; d.dtype = MSKV_DTYPE_F32;
    d.retire_mode = mode;
    d.debug = debug;
    d.host_allocator.alloc = mhg_host_alloc; d.host_allocator.realloc = mhg_host_realloc; d.host_allocator.free = mhg_host_free;
    mhg_nhost = 0;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

static unsigned char mhg_byte(uint32_t tag, int32_t g, int64_t pos, int kind, size_t i) {
    return (unsigned char)(tag * 29u + (uint32_t)g * 101u + (uint32_t)pos * 13u + (uint32_t)kind * 7u + (uint32_t)i);
}

/* write (check: count mismatching tokens of) positions [from, to) of group g */
static int64_t mhg_bytes(mskv_arena *a, mskv_request r, int32_t g, uint32_t tag, int64_t from, int64_t to, int check) {
    mskv_store_info si;
    int64_t pos, slot, bad = 0;
    int kind;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return -1;
    for (pos = from; pos < to; pos++) {
        int ok = 1;
        if (mskv_request_slot_in_group(a, r, g, pos, &slot) != MSKV_SUCCESS) { bad++; continue; }
        for (kind = 0; kind < 2; kind++) {
            unsigned char *p = (unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)slot * si.slot_bytes;
            for (i = 0; i < si.slot_bytes; i++) {
                if (!check) p[i] = mhg_byte(tag, g, pos, kind, i);
                else if (p[i] != mhg_byte(tag, g, pos, kind, i)) ok = 0;
            }
        }
        bad += !ok;
    }
    return bad;
}

/* a request of n committed tokens, every group's bytes written */
static int mhg_request(mskv_arena *a, mskv_request *r, int64_t n, uint32_t tag) {
    return mskv_request_add(a, r) == MSKV_SUCCESS && mtu_grow(a, *r, n) == MSKV_SUCCESS &&
           mhg_bytes(a, *r, 0, tag, 0, n, 0) == 0 && mhg_bytes(a, *r, 1, tag, 0, n, 0) == 0;
}

/* page p holds the poison in every byte of both pools (poisoned), or does not (!poisoned) */
static int mhg_poisoned(mskv_arena *a, int32_t p, int poisoned) {
    mskv_store_info si;
    int kind, all = 1;
    size_t k;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0;
    for (kind = 0; kind < 2; kind++) {
        const unsigned char *b = (const unsigned char *)mskv_store_pool(a, 0, kind) + (size_t)p * si.page_bytes;
        for (k = 0; k < si.page_bytes; k++)
            if (b[k] != MSKV_POISON_BYTE) all = 0;
    }
    return poisoned ? all : !all;
}

/* the pages of r in every group, group 0's first; their count */
static int32_t mhg_pages(mskv_arena *a, mskv_request r, int32_t *pages, int32_t cap) {
    int32_t n0 = 0, n1 = 0;
    if (mskv_request_pages_in_group(a, r, 0, pages, cap, &n0) != MSKV_SUCCESS ||
        mskv_request_pages_in_group(a, r, 1, pages + n0, cap - n0, &n1) != MSKV_SUCCESS)
        return -1;
    return n0 + n1;
}

static mskv_location mhg_where(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    i.location = (mskv_location)-1;
    (void)mskv_request_info_get(a, r, &i);
    return i.location;
}

/* ---- stale plans across groups ---------------------------------------------------- */

/* A plan of the last 2 tokens of each of segs' requests, reading group g's tables. */
typedef struct mhg_plan {
    mskv_plan p;
    float q[8 * 2 * 8], o[8 * 2 * 8];
} mhg_plan;

static int mhg_plan_build(mskv_arena *a, const mskv_request *reqs, int32_t n, int32_t g, mhg_plan *out) {
    mskv_segment segs[4];
    mskv_plan_desc pd;
    int32_t i;
    memset(out, 0, sizeof *out);
    memset(&pd, 0, sizeof pd);
    pd.group = g;
    for (i = 0; i < n; i++) { segs[i].request = reqs[i]; segs[i].n_tokens = 2; }
    for (i = 0; i < 8 * 2 * 8; i++) out->q[i] = 0.01f * (float)i;
    return mskv_plan_alloc(a, n, 8, 64, &out->p) == MSKV_SUCCESS && mskv_plan_build(a, segs, n, &pd, &out->p) == MSKV_SUCCESS;
}

/* mskv_plan_check and mskv_cpu_attention agree: 1 when both succeed, 0 when both say STALE_PLAN */
static int mhg_current(mskv_arena *a, mhg_plan *f) {
    mskv_attn at;
    mskv_result c, t;
    memset(&at, 0, sizeof at);
    at.q_heads = 2; at.q_dtype = MSKV_DTYPE_F32;
    c = mskv_plan_check(a, &f->p);
    t = mskv_cpu_attention(NULL, a, 0, &f->p, &at, f->q, f->o, NULL);
    if (c == MSKV_SUCCESS && t == MSKV_SUCCESS) return 1;
    if (c == MSKV_ERROR_STALE_PLAN && t == MSKV_ERROR_STALE_PLAN) return 0;
    mt_fail(__FILE__, __LINE__, "plan_check %d, cpu_attention %d", (int)c, (int)t);
    return -1;
}

TEST(group_plan_is_stale_once_its_groups_table_loses_pages) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request r;
    mhg_plan p1;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 16, 1));
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 1, &p1));
    EXPECT_EQ(1, mhg_current(a, &p1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(a, r, 1, 4, NULL));
    EXPECT_EQ(0, mhg_current(a, &p1));
    mskv_plan_free(a, &p1.p);
    mskv_arena_destroy(a);
}

/* Per request and per group: group 0's plan reads none of the pages group 1
   lost, so it stays valid (a plan without the requests array still takes
   any loss as its own). */
TEST(group_plan_stays_valid_when_another_groups_table_loses_pages) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request r;
    mhg_plan p0, blind;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 16, 1));
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 0, &p0));
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 0, &blind));
    blind.p.requests = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(a, r, 1, 8, NULL));
    EXPECT_EQ(1, mhg_current(a, &p0));
    EXPECT_EQ(0, mhg_current(a, &blind));
    mskv_plan_free(a, &blind.p);
    mskv_plan_free(a, &p0.p);
    mskv_arena_destroy(a);
}

/* Retention is per group: what group 1's policy releases at publish makes
   group 1's plans stale, not group 0's. */
TEST(group_plan_is_stale_once_its_groups_retention_releases_at_publish) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request r;
    mskv_retention ret;
    mskv_segment s;
    mhg_plan p0, p1;
    ASSERT_TRUE(a != NULL);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 4; ret.sink_chunks = 1; ret.window_chunks = 1;
    ASSERT_TRUE(mhg_request(a, &r, 12, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_set_retention_in_group(a, r, 1, &ret));
    s.request = r; s.n_tokens = 12;
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &s, 1, NULL));   /* group 1 keeps [0, 4) + [8, 12) */
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 0, &p0));
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 1, &p1));
    s.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    EXPECT_EQ(1, mhg_current(a, &p1));                       /* grown, not yet published */
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &s, 1, NULL));   /* group 1 lets [8, 12) go */
    EXPECT_EQ(0, mhg_current(a, &p1));
    EXPECT_EQ(1, mhg_current(a, &p0));
    mskv_plan_free(a, &p0.p);
    mskv_plan_free(a, &p1.p);
    mskv_arena_destroy(a);
}

/* Reset drops every request: every plan built before it is stale, in every
   group, also once new requests hold the same slots and page ids again. */
TEST(plans_built_before_an_arena_reset_are_stale_in_every_group) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request r[2], again[2];
    mhg_plan p0, p1;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r[0], 8, 1));
    ASSERT_TRUE(mhg_request(a, &r[1], 8, 2));
    ASSERT_TRUE(mhg_plan_build(a, r, 2, 0, &p0));
    ASSERT_TRUE(mhg_plan_build(a, r, 2, 1, &p1));
    EXPECT_EQ(1, mhg_current(a, &p0));
    EXPECT_EQ(1, mhg_current(a, &p1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_reset(a));
    EXPECT_EQ(0, mhg_current(a, &p0));
    EXPECT_EQ(0, mhg_current(a, &p1));
    ASSERT_TRUE(mhg_request(a, &again[0], 8, 3));
    ASSERT_TRUE(mhg_request(a, &again[1], 8, 4));
    EXPECT_EQ(0, mhg_current(a, &p0));
    EXPECT_EQ(0, mhg_current(a, &p1));
    mskv_plan_free(a, &p0.p);
    mskv_plan_free(a, &p1.p);
    mskv_arena_destroy(a);
}

/* make_room parks r (least recently admitted, not in the batch): r's plans
   go stale in every group; the batch's request keeps its plans. */
TEST(plans_of_requests_parked_by_make_room_are_stale_and_the_others_stay_valid) {
    mskv_arena *a = mhg_make(1 + 16, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request r, s, parked[2];
    mskv_segment seg;
    mhg_plan r0, r1, s1;
    int32_t np = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 8, 1));   /* 2 pages per group */
    ASSERT_TRUE(mhg_request(a, &s, 8, 2));
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 0, &r0));
    ASSERT_TRUE(mhg_plan_build(a, &r, 1, 1, &r1));
    ASSERT_TRUE(mhg_plan_build(a, &s, 1, 1, &s1));
    seg.request = s; seg.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 10, UINT64_MAX, &seg, 1, parked, 2, &np));
    ASSERT_EQ(1, np);
    EXPECT_EQ(r.id, parked[0].id);
    EXPECT_EQ(0, mhg_current(a, &r0));
    EXPECT_EQ(0, mhg_current(a, &r1));
    EXPECT_EQ(1, mhg_current(a, &s1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));   /* other pages now: still stale */
    EXPECT_EQ(0, mhg_current(a, &r1));
    mskv_plan_free(a, &r0.p);
    mskv_plan_free(a, &r1.p);
    mskv_plan_free(a, &s1.p);
    mskv_arena_destroy(a);
}

static int mhg_pair(mskv_arena *a, mskv_request br[2], mskv_lockstep *ls) {
    return mhg_request(a, &br[0], 8, 1) && mhg_request(a, &br[1], 6, 2) && mskv_lockstep_create(a, br, 2, ls) == MSKV_SUCCESS;
}

TEST(plans_of_lockstep_members_are_stale_after_lockstep_offload_in_every_group) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request br[2];
    mskv_lockstep ls;
    mhg_plan p0, p1;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_pair(a, br, &ls));
    ASSERT_TRUE(mhg_plan_build(a, br, 2, 0, &p0));
    ASSERT_TRUE(mhg_plan_build(a, br, 2, 1, &p1));
    EXPECT_EQ(1, mhg_current(a, &p0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    EXPECT_EQ(0, mhg_current(a, &p0));
    EXPECT_EQ(0, mhg_current(a, &p1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    EXPECT_EQ(0, mhg_current(a, &p0));
    EXPECT_EQ(0, mhg_current(a, &p1));
    mskv_plan_free(a, &p0.p);
    mskv_plan_free(a, &p1.p);
    mskv_arena_destroy(a);
}

TEST(plans_of_lockstep_members_are_stale_after_a_lockstep_release_in_their_group_only) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0);
    mskv_request br[2];
    mskv_lockstep ls;
    mhg_plan p0, p1;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_pair(a, br, &ls));
    ASSERT_TRUE(mhg_plan_build(a, br, 2, 0, &p0));
    ASSERT_TRUE(mhg_plan_build(a, br, 2, 1, &p1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_release_oldest(a, ls, 1, 4, NULL));
    EXPECT_EQ(1, mhg_current(a, &p0));
    EXPECT_EQ(0, mhg_current(a, &p1));
    mskv_plan_free(a, &p0.p);
    mskv_plan_free(a, &p1.p);
    mskv_arena_destroy(a);
}

/* ---- debug poisoning of pages freed by reset, flush and make_room ------------------ */

TEST(pages_freed_by_reset_are_poisoned_in_every_group) {
    mskv_arena *a = mhg_make(1 + 16, MSKV_RETIRE_IMMEDIATE, MSKV_DEBUG_POISON);
    mskv_request r, s;
    int32_t pages[16], n, i;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 8, 1));
    ASSERT_TRUE(mhg_request(a, &s, 5, 2));
    n = mhg_pages(a, r, pages, 16);
    ASSERT_EQ(4, n);
    for (i = 0; i < n; i++) EXPECT_TRUE(mhg_poisoned(a, pages[i], 0));   /* live: the written bytes */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_reset(a));
    for (i = 1; i < 17; i++) EXPECT_TRUE(mhg_poisoned(a, i, 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    mskv_arena_destroy(a);
}

/* FENCED: a page freed (by reset, or released in any group) keeps its bytes
   while pending, for a kernel may still read it; flush frees and poisons it. */
TEST(pending_pages_are_poisoned_by_flush_not_before) {
    mskv_arena *a = mhg_make(1 + 16, MSKV_RETIRE_FENCED, MSKV_DEBUG_POISON);
    mskv_request r, s;
    int32_t pr[16], ps[16], nr, ns, i;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 8, 1));
    ASSERT_TRUE(mhg_request(a, &s, 8, 2));
    nr = mhg_pages(a, r, pr, 16);
    ns = mhg_pages(a, s, ps, 16);
    ASSERT_EQ(4, nr);
    ASSERT_EQ(4, ns);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(a, s, 1, 4, NULL));   /* ps[2], group 1's first */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_reset(a));
    for (i = 0; i < nr; i++) EXPECT_TRUE(mhg_poisoned(a, pr[i], 0));
    for (i = 0; i < ns; i++) EXPECT_TRUE(mhg_poisoned(a, ps[i], 0));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));   /* pending pages are not expected poisoned */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_flush(a));
    for (i = 0; i < nr; i++) EXPECT_TRUE(mhg_poisoned(a, pr[i], 1));
    for (i = 0; i < ns; i++) EXPECT_TRUE(mhg_poisoned(a, ps[i], 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    mskv_arena_destroy(a);
}

TEST(pages_parked_by_make_room_are_poisoned_in_every_group) {
    mskv_arena *a = mhg_make(1 + 16, MSKV_RETIRE_IMMEDIATE, MSKV_DEBUG_POISON);
    mskv_request r, s, parked[2];
    mskv_segment seg;
    int32_t pages[16], n, i, np = 0;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 8, 1));
    ASSERT_TRUE(mhg_request(a, &s, 8, 2));
    n = mhg_pages(a, r, pages, 16);
    ASSERT_EQ(4, n);
    seg.request = s; seg.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 10, UINT64_MAX, &seg, 1, parked, 2, &np));
    ASSERT_EQ(1, np);
    for (i = 0; i < n; i++) EXPECT_TRUE(mhg_poisoned(a, pages[i], 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));   /* the host copy holds the bytes, not the poison */
    EXPECT_EQ(0, mhg_bytes(a, r, 0, 1, 0, 8, 1));
    EXPECT_EQ(0, mhg_bytes(a, r, 1, 1, 0, 8, 1));
    mskv_arena_destroy(a);
}

/* ---- checksums of multi-group and lockstep host copies ----------------------------- */

/* r: 12 tokens; group 1 released [0, 4): 3 records of group 0, then 2 of group 1 */
static int mhg_uneven(mskv_arena *a, mskv_request *r) {
    return mhg_request(a, r, 12, 5) && mskv_request_release_oldest_in_group(a, *r, 1, 4, NULL) == MSKV_SUCCESS;
}
static int64_t mhg_check_uneven(mskv_arena *a, mskv_request r) {
    return mhg_bytes(a, r, 0, 5, 0, 12, 1) + mhg_bytes(a, r, 1, 5, 4, 12, 1);
}

/* The last group's records are checked too: the checksums cover the whole
   copy, not group 0's page count of it. */
TEST(a_changed_byte_in_any_groups_records_of_a_host_copy_is_refused_at_reload) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, MSKV_DEBUG_CHECKSUMS);
    mskv_request r;
    unsigned char *copy, blob[8192];
    size_t size = 0, at = 4 * MHG_RECORD + 300;   /* group 1's second record */
    uint64_t before;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_uneven(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(1, mhg_nhost);
    copy = mhg_host[0];
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    copy[at] ^= 0x21;
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(a, r));
    EXPECT_EQ_U64(before, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_OFFLOADED, mhg_where(a, r));
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_export(a, r, blob, sizeof blob, &size));
    why[0] = 0;
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(a, why, sizeof why));
    EXPECT_TRUE(strstr(why, "page 4 of its host copy") != NULL);
    copy[at] ^= 0x21;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_EQ(0, mhg_check_uneven(a, r));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* A version-2 (multi-group) blob imported into a checksumming arena: every
   group's records are summed at import. */
TEST(an_imported_multi_group_host_copy_is_checksummed_in_every_group) {
    mskv_arena *src = mhg_make(32, MSKV_RETIRE_IMMEDIATE, 0), *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, MSKV_DEBUG_CHECKSUMS);
    mskv_request r, y;
    unsigned char *blob, *copy;
    size_t size = 0;
    ASSERT_TRUE(src != NULL && a != NULL);
    ASSERT_TRUE(mhg_uneven(src, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(src, r, NULL, 0, &size));
    blob = (unsigned char *)malloc(size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(src, r, blob, size, &size));
    EXPECT_EQ(5, (int)blob[8]);   /* layout 2, XXH64-signed */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(a, blob, size, &y));
    ASSERT_EQ(1, mhg_nhost);
    copy = mhg_host[0];
    copy[4 * MHG_RECORD + 17] ^= 0x02;
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(a, y));
    copy[4 * MHG_RECORD + 17] ^= 0x02;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, y));
    EXPECT_EQ(0, mhg_check_uneven(a, y));
    free(blob);
    mskv_arena_destroy(src);
    mskv_arena_destroy(a);
}

/* Lockstep offload checksums every member's copy; a change in one refuses
   the reload of the whole group, and nothing changes. */
TEST(lockstep_reload_refuses_the_group_when_one_members_host_copy_changed) {
    mskv_arena *a = mhg_make(32, MSKV_RETIRE_IMMEDIATE, MSKV_DEBUG_CHECKSUMS);
    mskv_request br[2];
    mskv_lockstep ls;
    unsigned char *second;
    uint64_t before;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_pair(a, br, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(a, ls));
    ASSERT_EQ(2, mhg_nhost);
    second = mhg_host[1];   /* member 1: 2 records of group 0, then 2 of group 1 */
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    second[3 * MHG_RECORD + 5] ^= 0x80;
    before = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_lockstep_reload(a, ls));
    EXPECT_EQ_U64(before, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_OFFLOADED, mhg_where(a, br[0]));
    EXPECT_EQ(MSKV_OFFLOADED, mhg_where(a, br[1]));
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(a, why, sizeof why));
    second[3 * MHG_RECORD + 5] ^= 0x80;
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_reload(a, ls));
    EXPECT_EQ(0, mhg_bytes(a, br[0], 0, 1, 0, 8, 1) + mhg_bytes(a, br[0], 1, 1, 0, 8, 1));
    EXPECT_EQ(0, mhg_bytes(a, br[1], 0, 2, 0, 6, 1) + mhg_bytes(a, br[1], 1, 2, 0, 6, 1));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(host_copies_made_by_make_room_are_checksummed) {
    mskv_arena *a = mhg_make(1 + 16, MSKV_RETIRE_IMMEDIATE, MSKV_DEBUG_CHECKSUMS);
    mskv_request r, s, parked[2];
    mskv_segment seg;
    int32_t np = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mhg_request(a, &r, 8, 1));
    ASSERT_TRUE(mhg_request(a, &s, 8, 2));
    seg.request = s; seg.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_make_room(a, 10, UINT64_MAX, &seg, 1, parked, 2, &np));
    ASSERT_EQ(1, np);
    ASSERT_EQ(1, mhg_nhost);
    mhg_host[0][2 * MHG_RECORD + 9] ^= 0x04;   /* group 1's first record */
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(a, r));
    mhg_host[0][2 * MHG_RECORD + 9] ^= 0x04;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_EQ(0, mhg_bytes(a, r, 0, 1, 0, 8, 1) + mhg_bytes(a, r, 1, 1, 0, 8, 1));
    mskv_arena_destroy(a);
}
