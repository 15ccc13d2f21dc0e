/* Streamed blobs (mskv_request_export_begin / import_begin): the same bytes
   as mskv_request_export without a host copy, all-or-nothing admission on
   the receiver, a checksum over what arrived, and nothing half-imported. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"
#include "mskv_test_states.h"
#include "../mstar_kv_ucx.h"

/* The whole blob of a request (malloc'd), NULL on failure. */
static unsigned char *mst_export(mskv_arena *a, mskv_request r, size_t *size) {
    unsigned char *b;
    if (mskv_request_export(a, r, NULL, 0, size) != MSKV_SUCCESS) return NULL;
    b = (unsigned char *)malloc(*size);
    if (b && mskv_request_export(a, r, b, *size, size) != MSKV_SUCCESS) { free(b); return NULL; }
    return b;
}

/* A streamed export gathered into one buffer: header, ranges, checksum. */
static unsigned char *mst_stream_out(mskv_arena *a, mskv_request r, size_t *size) {
    mskv_blob_layout L;
    unsigned char *b;
    mskv_blob_range *rg;
    int64_t k;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    if (mskv_request_export_begin(a, r, hdr, sizeof hdr, &L) != MSKV_SUCCESS) return NULL;
    b = (unsigned char *)malloc(L.blob_bytes);
    rg = (mskv_blob_range *)malloc((size_t)(L.range_count + 1) * sizeof *rg);
    if (b && rg && mskv_request_blob_ranges(a, r, 0, L.range_count, rg) == MSKV_SUCCESS) {
        memcpy(b, hdr, L.header_bytes);
        for (k = 0; k < L.range_count; k++) memcpy(b + rg[k].offset, rg[k].data, rg[k].bytes);
        mtu_put64(b + L.blob_bytes - 8, L.checksum);
        *size = L.blob_bytes;
    } else {
        free(b);
        b = NULL;
    }
    free(rg);
    if (mskv_request_export_end(a, r) != MSKV_SUCCESS) { free(b); return NULL; }
    return b;
}

/* A streamed import of a whole blob: begin on its header, each range
   copied to where the ranges say, commit with its checksum. */
static mskv_result mst_stream_in(mskv_arena *a, const unsigned char *blob, size_t size, mskv_request *out) {
    mskv_blob_layout L;
    mskv_blob_range *rg;
    int64_t k;
    mskv_result e = mskv_request_import_begin(a, blob, size, out, &L);
    if (e != MSKV_SUCCESS) return e;
    rg = (mskv_blob_range *)malloc((size_t)(L.range_count + 1) * sizeof *rg);
    if (!rg) return MSKV_ERROR_OUT_OF_MEMORY;
    e = mskv_request_blob_ranges(a, *out, 0, L.range_count, rg);
    for (k = 0; e == MSKV_SUCCESS && k < L.range_count; k++) memcpy(rg[k].data, blob + rg[k].offset, rg[k].bytes);
    free(rg);
    if (e == MSKV_SUCCESS) {
        uint64_t sum = 0;
        int i;
        for (i = 7; i >= 0; i--) sum = sum << 8 | blob[size - 8 + (size_t)i];
        e = mskv_request_import_commit(a, *out, sum);
    }
    return e;
}

static mskv_arena *mst_arena_for(mts_state s, int32_t pages) { return mts_arena(pages, 4, s == MTS_GROUPS ? 2 : 1); }

TEST(streamed_export_gives_the_bytes_of_mskv_request_export_in_every_state) {
    int s;
    for (s = 0; s < MTS_COUNT; s++) {
        mskv_arena *a = mst_arena_for((mts_state)s, 64);
        mskv_request r;
        unsigned char *whole, *streamed;
        size_t n1 = 0, n2 = 0;
        ASSERT_TRUE(a != NULL);
        ASSERT_EQ(MSKV_SUCCESS, mts_build(a, (mts_state)s, 37, 11u + (uint32_t)s, &r));
        whole = mst_export(a, r, &n1);
        streamed = mst_stream_out(a, r, &n2);
        ASSERT_TRUE(whole && streamed);
        EXPECT_EQ((int64_t)n1, (int64_t)n2);
        if (n1 != n2 || memcmp(whole, streamed, n1) != 0) mt_fail(__FILE__, __LINE__, "state %s: streamed blob differs", mts_names[s]);
        mtu_audit(a);
        free(whole);
        free(streamed);
        mskv_arena_destroy(a);
    }
}

TEST(streamed_import_of_an_exported_blob_exports_the_same_bytes_in_every_state) {
    int s;
    for (s = 0; s < MTS_COUNT; s++) {
        mskv_arena *a = mst_arena_for((mts_state)s, 64), *b = mst_arena_for((mts_state)s, 64);
        mskv_request r, got;
        mskv_request_info info;
        unsigned char *blob, *again;
        size_t n1 = 0, n2 = 0;
        ASSERT_TRUE(a && b);
        ASSERT_EQ(MSKV_SUCCESS, mts_build(a, (mts_state)s, 37, 21u + (uint32_t)s, &r));
        blob = mst_export(a, r, &n1);
        ASSERT_TRUE(blob != NULL);
        EXPECT_EQ(MSKV_SUCCESS, mst_stream_in(b, blob, n1, &got));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(b, got, &info));
        EXPECT_EQ(MSKV_RESIDENT, info.location);   /* streamed in: the pages are taken at begin */
        again = mst_export(b, got, &n2);
        ASSERT_TRUE(again != NULL);
        if (n1 != n2 || memcmp(blob, again, n1) != 0) mt_fail(__FILE__, __LINE__, "state %s: re-exported blob differs", mts_names[s]);
        mtu_audit(a);
        mtu_audit(b);
        free(blob);
        free(again);
        mskv_arena_destroy(a);
        mskv_arena_destroy(b);
    }
}

TEST(whole_blob_import_of_a_streamed_export_exports_the_same_bytes) {
    mskv_arena *a = mst_arena_for(MTS_GAP, 64), *b = mst_arena_for(MTS_GAP, 64);
    mskv_request r, got;
    unsigned char *streamed, *again;
    size_t n1 = 0, n2 = 0;
    ASSERT_TRUE(a && b);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_GAP, 50, 5, &r));
    streamed = mst_stream_out(a, r, &n1);
    ASSERT_TRUE(streamed != NULL);
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(b, streamed, n1, &got));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(b, got));
    again = mst_export(b, got, &n2);
    ASSERT_TRUE(again != NULL);
    EXPECT_TRUE(n1 == n2 && memcmp(streamed, again, n1) == 0);
    free(streamed);
    free(again);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(the_largest_header_fits_MSKV_BLOB_HEADER_MAX_32_groups_with_positions) {
    mskv_arena *a = mts_arena(128, 4, MSKV_MAX_GROUPS), *b = mts_arena(128, 4, MSKV_MAX_GROUPS);
    mskv_request r, got;
    mskv_segment seg;
    mskv_blob_layout L;
    int64_t released;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX], *blob;
    size_t n = 0;
    ASSERT_TRUE(a && b);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    seg.request = r;
    seg.n_tokens = 10;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 5, &released));   /* a point inside a page */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_shift_positions(a, r, -4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    EXPECT_EQ((int64_t)(128 + 8 + 64 * (MSKV_MAX_GROUPS - 1) + 8 + 8 * MSKV_MAX_GROUPS), (int64_t)L.header_bytes);
    EXPECT_EQ((int64_t)MSKV_BLOB_HEADER_MAX, (int64_t)L.header_bytes);
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
    blob = mst_stream_out(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    EXPECT_EQ(MSKV_SUCCESS, mst_stream_in(b, blob, n, &got));
    {
        mskv_request_info ia, ib;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, r, &ia));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(b, got, &ib));
        EXPECT_EQ(ia.pos_shift, ib.pos_shift);
        EXPECT_EQ(-4, ib.pos_shift);
    }
    mtu_audit(a);
    mtu_audit(b);
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(import_begin_with_too_few_pages_is_OUT_OF_PAGES_and_changes_nothing) {
    mskv_arena *a = mst_arena_for(MTS_PLAIN, 64), *b = mst_arena_for(MTS_PLAIN, 8);
    mskv_request r, got, filler;
    mskv_blob_layout L;
    unsigned char *blob;
    size_t n = 0;
    uint64_t before;
    ASSERT_TRUE(a && b);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PLAIN, 40, 3, &r));   /* 10 pages; b has 7 */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &filler));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(b, filler, 4));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    before = mskv_arena_digest(b);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_request_import_begin(b, blob, n, &got, &L));
    EXPECT_EQ_U64(before, mskv_arena_digest(b));
    mtu_audit(b);
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(import_commit_over_changed_bytes_is_BLOB_CORRUPT_and_abort_returns_every_page) {
    mskv_arena *a = mst_arena_for(MTS_PREFIX, 64), *b = mst_arena_for(MTS_PREFIX, 64);
    mskv_request r, got, probe;
    mskv_blob_layout L;
    mskv_blob_range rg[2];
    mskv_arena_stats s0, s1;
    int32_t pages_before[16], pages_after[16], n0 = 0, n1 = 0;
    unsigned char *blob;
    size_t n = 0;
    uint64_t sum = 0;
    int i;
    ASSERT_TRUE(a && b);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PREFIX, 30, 9, &r));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    for (i = 7; i >= 0; i--) sum = sum << 8 | blob[n - 8 + (size_t)i];
    /* the pages a request of 30 tokens gets in b before any import */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &probe));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(b, probe, 30));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(b, probe, pages_before, 16, &n0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(b, probe));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(b, &s0));

    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(b, blob, n, &got, &L));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(b, got, 0, 2, rg));
    memcpy(rg[0].data, blob + rg[0].offset, rg[0].bytes);
    memcpy(rg[1].data, blob + rg[1].offset, rg[1].bytes);
    ((unsigned char *)rg[1].data)[3] ^= 0x10;   /* one flipped bit; the other ranges never arrived */
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import_commit(b, got, sum));
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import_commit(b, got, sum ^ 1));   /* still open */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import_abort(b, got));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_request_import_abort(b, got));   /* the handle is stale */

    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(b, &s1));
    EXPECT_EQ(s0.free_pages, s1.free_pages);
    EXPECT_EQ(s0.live_pages, s1.live_pages);
    EXPECT_EQ(s0.requests, s1.requests);
    mtu_audit(b);
    /* the free list is as it was: the same request gets the same pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &probe));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(b, probe, 30));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(b, probe, pages_after, 16, &n1));
    ASSERT_EQ(n0, n1);
    for (i = 0; i < n0; i++) EXPECT_EQ(pages_before[i], pages_after[i]);
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(a_request_being_exported_refuses_changes_until_export_end) {
    mskv_arena *a = mst_arena_for(MTS_PREFIX, 64);
    mskv_request r, child, other;
    mskv_blob_layout L;
    mskv_segment seg;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    uint64_t digest;
    int64_t rel = 0;
    int32_t parked = 0;
    mskv_request park[2];
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PREFIX, 30, 4, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &other));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    digest = mskv_arena_digest(a);
    seg.request = r;
    seg.n_tokens = 4;
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit(a, &seg, 1));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_protect_prefix(a, r, 8));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_release_oldest(a, r, 8, &rel));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_offload(a, r));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_remove(a, r));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_shift_positions(a, r, 5));   /* the header it streams says the shift */
    {
        mskv_request pair[2];
        mskv_lockstep ls;
        pair[0] = r;
        pair[1] = other;
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_lockstep_create(a, pair, 2, &ls));
    }
    /* 55 pages free: parking it would free 8 more, but make_room passes over it */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(a, 60, (uint64_t)1 << 30, NULL, 0, park, 2, &parked));
    EXPECT_EQ(0, parked);
    EXPECT_EQ_U64(digest, mskv_arena_digest(a));
    /* reads go on: a fork shares its pages */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_fork(a, r, &child));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_export_end(a, r));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 8, &rel));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    mtu_audit(a);
    mskv_arena_destroy(a);
}

TEST(a_request_being_imported_is_invisible_until_commit) {
    mskv_arena *a = mst_arena_for(MTS_KEYED, 64), *b = mst_arena_for(MTS_KEYED, 64);
    mskv_request r, got, found;
    mskv_blob_layout L;
    mskv_request_info info;
    mskv_segment seg;
    unsigned char *blob;
    size_t n = 0;
    ASSERT_TRUE(a && b);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_KEYED, 20, 0, &r));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(b, blob, n, &got, &L));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_info_get(b, got, &info));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_remove(b, got));
    seg.request = got;
    seg.n_tokens = 0;
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit(b, &seg, 1));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(b, MTS_KEY, &found));
    EXPECT_EQ(MSKV_ERROR_NOT_FOUND, mskv_keyed_remove(b, MTS_KEY));
    EXPECT_EQ(MSKV_ERROR_DUPLICATE, mskv_request_import(b, blob, n, &found));   /* the key is taken */
    mtu_audit(b);
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(import_begin_checks_the_header_as_import_does) {
    mskv_arena *a = mst_arena_for(MTS_PLAIN, 64), *b = mst_arena_for(MTS_PLAIN, 64), *other = mts_arena(64, 8, 1);
    mskv_request r, got;
    mskv_blob_layout L;
    unsigned char *blob;
    size_t n = 0;
    uint64_t before;
    ASSERT_TRUE(a && b && other);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PLAIN, 20, 1, &r));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    before = mskv_arena_digest(b);
    EXPECT_EQ(MSKV_ERROR_BLOB_TRUNCATED, mskv_request_import_begin(b, blob, 100, &got, &L));
    EXPECT_EQ(MSKV_ERROR_BLOB_MISMATCH, mskv_request_import_begin(other, blob, n, &got, &L));
    blob[44] ^= 1;   /* the page count no longer matches the size */
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import_begin(b, blob, n, &got, &L));
    blob[44] ^= 1;
    blob[0] ^= 1;
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import_begin(b, blob, n, &got, &L));
    blob[0] ^= 1;
    blob[8] = 9;
    EXPECT_EQ(MSKV_ERROR_BLOB_VERSION, mskv_request_import_begin(b, blob, n, &got, &L));
    EXPECT_EQ_U64(before, mskv_arena_digest(b));
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
    mskv_arena_destroy(other);
}

TEST(blob_ranges_outside_the_blob_are_OUT_OF_RANGE_and_need_an_open_transfer) {
    mskv_arena *a = mst_arena_for(MTS_PLAIN, 64);
    mskv_request r;
    mskv_blob_layout L;
    mskv_blob_range rg[4];
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PLAIN, 8, 1, &r));   /* 2 pages x 2 layers x K,V */
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_blob_ranges(a, r, 0, 1, rg));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    EXPECT_EQ(8, L.range_count);
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(a, r, 4, 4, rg));
    EXPECT_EQ(1, rg[0].layer * 2 + rg[0].kind == 0 && rg[0].offset == L.header_bytes + 4 * L.range_bytes);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_request_blob_ranges(a, r, 5, 4, rg));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_request_blob_ranges(a, r, -1, 1, rg));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_request_export_begin(a, r, hdr, 10, &L));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_export_end(a, r));   /* a failed begin opened nothing */
    mskv_arena_destroy(a);
}

static mskv_result mst_read(void *u, const int32_t *p, int32_t n, void *d) { (void)u; (void)p; (void)n; (void)d; return MSKV_SUCCESS; }
static mskv_result mst_write(void *u, const int32_t *p, int32_t n, const void *s) { (void)u; (void)p; (void)n; (void)s; return MSKV_SUCCESS; }
static mskv_result mst_copy(void *u, int32_t s, int32_t d) { (void)u; (void)s; (void)d; return MSKV_SUCCESS; }

TEST(streaming_pages_behind_store_ops_is_UNSUPPORTED) {
    mskv_store_ops ops;
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r, got;
    mskv_blob_layout L;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    memset(&ops, 0, sizeof ops);
    ops.read_pages = mst_read;
    ops.write_pages = mst_write;
    ops.copy_page = mst_copy;
    memset(&d, 0, sizeof d);
    d.num_pages = 16; d.page_size = 4; d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4;
    d.store_ops = &ops;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 5));
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    memset(hdr, 0, sizeof hdr);
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_request_import_begin(a, hdr, sizeof hdr, &got, &L));
    mskv_arena_destroy(a);
}

/* The transport over these streams (mstar_kv_ucx.h, tested with two
   processes in tests/test_ucx.c) loads UCX at run time; without it every
   call that needs it is UNSUPPORTED and says why. */
TEST(ucx_layer_without_its_library_is_UNSUPPORTED_with_the_reason) {
    char why[512];
    mskv_ucx_desc d;
    mskv_ucx *u = NULL;
    memset(&d, 0, sizeof d);
#ifdef _WIN32
    d.library = NULL;
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_ucx_probe(NULL, why, sizeof why));
    EXPECT_TRUE(strstr(why, "UCX is not available on Windows") != NULL);
#else
    d.library = "libucp-absent.so.0";
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_ucx_probe(d.library, why, sizeof why));
    EXPECT_TRUE(strstr(why, "libucp-absent.so.0") != NULL);
#endif
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_ucx_listen(&d, "127.0.0.1", 0, &u));
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_ucx_connect(&d, "127.0.0.1", 1, &u));
    EXPECT_TRUE(u == NULL);
}

/* The debug checks of issue 9 meet streaming: an aborted import leaves its
   pages poisoned again, and a changed host copy is never streamed out. */
TEST(streamed_import_abort_leaves_every_page_poisoned_again_in_debug_mode) {
    mskv_arena *a = mst_arena_for(MTS_PLAIN, 64), *b;
    mskv_arena_desc d;
    mskv_request r, got;
    mskv_blob_layout L;
    mskv_blob_range rg;
    unsigned char *blob;
    size_t n = 0;
    char why[256];
    ASSERT_TRUE(a != NULL);
    memset(&d, 0, sizeof d);
    d.num_pages = 64; d.page_size = 4; d.num_layers = MTS_LAYERS; d.kv_heads = MTS_HEADS; d.head_dim = MTS_DIM;
    d.dtype = MSKV_DTYPE_BF16;
    d.debug = MSKV_DEBUG_POISON;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &b));
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PLAIN, 30, 2, &r));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(b, blob, n, &got, &L));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(b, got, 3, 1, &rg));
    memcpy(rg.data, blob + rg.offset, rg.bytes);   /* one range arrived, then the peer went away */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_abort(b, got));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(b, why, sizeof why));
    mtu_audit(b);
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(streamed_export_of_a_changed_host_copy_is_HOST_COPY_CORRUPT_in_debug_mode) {
    mskv_arena_desc d;
    mskv_arena *a;
    mskv_request r;
    mskv_blob_layout L;
    mskv_blob_range rg;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    memset(&d, 0, sizeof d);
    d.num_pages = 64; d.page_size = 4; d.num_layers = MTS_LAYERS; d.kv_heads = MTS_HEADS; d.head_dim = MTS_DIM;
    d.dtype = MSKV_DTYPE_BF16;
    d.debug = MSKV_DEBUG_CHECKSUMS;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_OFFLOADED, 30, 2, &r));
    /* the ranges of an open export show where the host copy lies: change one byte of it */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(a, r, 1, 1, &rg));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
    ((unsigned char *)rg.data)[0] ^= 1;
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_export_end(a, r));   /* nothing was opened */
    mskv_arena_destroy(a);
}

/* ---- an open transfer holds its pages (issue 20, item 2) ---------------- */

/* The arena of mts_arena with a logger keeping the last error message. */
static char mst_msg[256];
static void mst_log(void *u, mskv_log_level l, const char *m) {
    (void)u; (void)l;
    strncpy(mst_msg, m, sizeof mst_msg - 1);
    mst_msg[sizeof mst_msg - 1] = '\0';
}
static mskv_arena *mst_arena_logged(int32_t num_pages, mskv_retire_mode mode) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = 4;
    d.num_layers = MTS_LAYERS;
    d.kv_heads = MTS_HEADS;
    d.head_dim = MTS_DIM;
    d.dtype = MSKV_DTYPE_BF16;
    d.retire_mode = mode;
    d.log = mst_log;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

static uint64_t mst_sum_of(const unsigned char *blob, size_t n) {
    uint64_t sum = 0;
    int i;
    for (i = 7; i >= 0; i--) sum = sum << 8 | blob[n - 8 + (size_t)i];
    return sum;
}

/* Every byte of every page of req (all layers, K and V) equals v. */
static int mst_pages_all(mskv_arena *a, mskv_request req, unsigned char v) {
    mskv_store_info si;
    int32_t pages[64], n = 0, i, l, kind;
    size_t j;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS || mskv_request_pages(a, req, pages, 64, &n) != MSKV_SUCCESS) return 0;
    for (l = 0; l < si.num_layers; l++)
        for (kind = 0; kind < 2; kind++)
            for (i = 0; i < n; i++) {
                const unsigned char *p = (const unsigned char *)mskv_store_pool(a, l, kind) + (size_t)pages[i] * si.page_bytes;
                for (j = 0; j < si.page_bytes; j++)
                    if (p[j] != v) return 0;
            }
    return 1;
}
static void mst_pages_set(mskv_arena *a, mskv_request req, unsigned char v) {
    mskv_store_info si;
    int32_t pages[64], n = 0, i, l, kind;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS || mskv_request_pages(a, req, pages, 64, &n) != MSKV_SUCCESS) return;
    for (l = 0; l < si.num_layers; l++)
        for (kind = 0; kind < 2; kind++)
            for (i = 0; i < n; i++) memset((unsigned char *)mskv_store_pool(a, l, kind) + (size_t)pages[i] * si.page_bytes, v, si.page_bytes);
}

/* The reproducer: reset while an import is open took back the import's
   pages, a new request got them, and the transport's writes through the
   ranges it held landed in that request. */
TEST(arena_reset_during_an_open_import_is_BAD_STATE_and_the_transport_writes_into_no_one_else) {
    mskv_arena *a = mst_arena_logged(64, MSKV_RETIRE_IMMEDIATE), *b = mst_arena_logged(64, MSKV_RETIRE_IMMEDIATE);
    mskv_request r, got, victim, again;
    mskv_blob_layout L;
    mskv_blob_range *rg;
    unsigned char *blob, *back;
    size_t n = 0, m = 0;
    uint64_t digest;
    int64_t k;
    ASSERT_TRUE(a && b);
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_PLAIN, 30, 3, &r));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(b, blob, n, &got, &L));
    rg = (mskv_blob_range *)malloc((size_t)L.range_count * sizeof *rg);
    ASSERT_TRUE(rg != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(b, got, 0, L.range_count, rg));
    digest = mskv_arena_digest(b);
    mst_msg[0] = '\0';
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_arena_reset(b));
    EXPECT_TRUE(strstr(mst_msg, "open streamed import") != NULL);
    EXPECT_EQ_U64(digest, mskv_arena_digest(b));
    /* a new request in b, its pages filled with 0x5A */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &victim));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(b, victim, 30));
    mst_pages_set(b, victim, 0x5A);
    /* the transport goes on writing what arrives, as a transport does */
    for (k = 0; k < L.range_count; k++) memcpy(rg[k].data, blob + rg[k].offset, rg[k].bytes);
    EXPECT_TRUE(mst_pages_all(b, victim, 0x5A));   /* none of it landed in the new request */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import_commit(b, got, mst_sum_of(blob, n)));
    back = mst_export(b, got, &m);
    ASSERT_TRUE(back != NULL);
    EXPECT_TRUE(m == n && memcmp(back, blob, n) == 0);
    mtu_audit(b);
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_reset(b));   /* the transfer is over */
    /* an aborted import frees reset too */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(b, blob, n, &again, &L));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_arena_reset(b));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import_abort(b, again));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_reset(b));
    mtu_audit(b);
    free(back);
    free(rg);
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

/* The same for an export: reset would free the pages (or the host copy of
   an offloaded request) the sender still reads; export_end would then be
   INVALID_HANDLE. Resident and offloaded, in both retirement modes. */
TEST(arena_reset_during_an_open_export_is_BAD_STATE_and_the_ranges_stay_the_request) {
    int s, mode;
    for (mode = 0; mode < 2; mode++)
        for (s = 0; s < 2; s++) {
            mskv_arena *a = mst_arena_logged(64, mode ? MSKV_RETIRE_FENCED : MSKV_RETIRE_IMMEDIATE);
            mskv_request r, victim;
            mskv_blob_layout L, L2;
            unsigned char hdr[MSKV_BLOB_HEADER_MAX], *whole, *streamed;
            size_t n = 0, m = 0;
            uint64_t digest;
            ASSERT_TRUE(a != NULL);
            ASSERT_EQ(MSKV_SUCCESS, mts_build(a, s ? MTS_OFFLOADED : MTS_PREFIX, 30, 5, &r));
            whole = mst_export(a, r, &n);
            ASSERT_TRUE(whole != NULL);
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
            digest = mskv_arena_digest(a);
            mst_msg[0] = '\0';
            EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_arena_reset(a));
            EXPECT_TRUE(strstr(mst_msg, "open streamed export") != NULL);
            EXPECT_EQ_U64(digest, mskv_arena_digest(a));
            EXPECT_EQ(MSKV_SUCCESS, mskv_arena_flush(a));   /* frees only pending pages: the export goes on */
            /* a new request takes pages and writes them; the export's bytes stay */
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &victim));
            ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, victim, 30));
            mst_pages_set(a, victim, 0xA5);
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
            streamed = mst_stream_out(a, r, &m);   /* the blob read again through the ranges */
            ASSERT_TRUE(streamed != NULL);
            EXPECT_TRUE(m == n && memcmp(streamed, whole, n) == 0);
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L2));
            EXPECT_EQ_U64(L.checksum, L2.checksum);
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
            EXPECT_EQ(MSKV_SUCCESS, mskv_arena_reset(a));
            mtu_audit(a);
            free(whole);
            free(streamed);
            mskv_arena_destroy(a);
        }
}

/* Every other call that frees or moves pages, against an open import (the
   request is not one yet) and an open export (it is frozen): refused with
   nothing changed, or (make_room) passed over; flush and retire go on and
   leave the transfer's pages alone. */
TEST(every_page_freeing_call_leaves_an_open_transfer_alone) {
    mskv_arena *a = mst_arena_logged(64, MSKV_RETIRE_FENCED), *b = mst_arena_logged(64, MSKV_RETIRE_FENCED);
    mskv_request r, got, other, park[4], child;
    mskv_blob_layout L;
    mskv_segment seg;
    mskv_lockstep ls;
    mskv_request pair[2];
    mskv_blob_range *rg;
    unsigned char *blob, hdr[MSKV_BLOB_HEADER_MAX];
    size_t n = 0;
    uint64_t digest, step = 0;
    int64_t rel = 0, k;
    int32_t parked = 0, side;
    mskv_result mr;
    mskv_arena_stats st;
    mskv_retention ret;
    ASSERT_TRUE(a && b);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 4;
    ret.sink_chunks = 1;
    ret.window_chunks = 1;
    ret.window_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mts_build(a, MTS_GAP, 30, 7, &r));
    blob = mst_export(a, r, &n);
    ASSERT_TRUE(blob != NULL);
    for (side = 0; side < 2; side++) {
        mskv_arena *x = side ? a : b;
        mskv_request h;
        if (side == 0) {
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(b, blob, n, &got, &L));
            h = got;
        } else {
            ASSERT_EQ(MSKV_SUCCESS, mskv_request_export_begin(a, r, hdr, sizeof hdr, &L));
            h = r;
        }
        rg = (mskv_blob_range *)malloc((size_t)L.range_count * sizeof *rg);
        ASSERT_TRUE(rg != NULL);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(x, h, 0, L.range_count, rg));
        if (side == 0)
            for (k = 0; k < L.range_count; k++) memcpy(rg[k].data, blob + rg[k].offset, rg[k].bytes);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(x, &other));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(x, other, 6));
        digest = mskv_arena_digest(x);
        seg.request = h;
        seg.n_tokens = 4;
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_remove(x, h));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_release_oldest(x, h, 8, &rel));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_release_oldest_in_group(x, h, 0, 8, &rel));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_offload(x, h));
        if (side == 0) EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_reload(x, h));
        else EXPECT_NE(MSKV_SUCCESS, mskv_request_reload(x, h));   /* resident already */
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_protect_prefix(x, h, 4));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_admit(x, &seg, 1));
        seg.n_tokens = 0;
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_abort(x, &seg, 1));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_commit(x, &seg, 1));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_publish(x, &seg, 1, NULL));   /* publish applies retention */
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_set_retention(x, h, &ret));   /* frozen: its header says the policy */
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_request_shift_positions(x, h, 2));
        pair[0] = h;
        pair[1] = other;
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_lockstep_create(x, pair, 2, &ls));
        EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_arena_reset(x));
        EXPECT_EQ_U64(digest, mskv_arena_digest(x));
        /* make_room parks the other request, never the transfer's */
        parked = 0;
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_flush(x));   /* no pending page to count on */
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(x, &st));
        mr = mskv_make_room(x, st.free_pages + 1, (uint64_t)1 << 30, NULL, 0, park, 4, &parked);
        EXPECT_EQ(MSKV_SUCCESS, mr);
        EXPECT_EQ(1, parked);   /* the neighbour, though the transfer's request has more pages */
        for (k = 0; k < parked; k++) EXPECT_TRUE(park[k].id != h.id);
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(x, other));
        /* the neighbour goes; its pages pend, then retire and flush free them */
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(x, other));
        EXPECT_EQ(MSKV_SUCCESS, mskv_publish(x, NULL, 0, &step));
        EXPECT_EQ(MSKV_SUCCESS, mskv_arena_retire(x, step));
        EXPECT_EQ(MSKV_SUCCESS, mskv_arena_flush(x));
        if (side == 1) EXPECT_EQ(MSKV_SUCCESS, mskv_request_fork(x, h, &child));   /* reads go on */
        mtu_audit(x);
        /* the bytes are still the blob's */
        for (k = 0; k < L.range_count; k++) EXPECT_TRUE(memcmp(rg[k].data, blob + rg[k].offset, rg[k].bytes) == 0);
        if (side == 0) EXPECT_EQ(MSKV_SUCCESS, mskv_request_import_commit(b, got, mst_sum_of(blob, n)));
        else EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
        EXPECT_EQ(MSKV_SUCCESS, mskv_arena_reset(x));
        mtu_audit(x);
        free(rg);
    }
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

/* ---- a version-3 header that an older version could have said (item 3) -- */

static uint64_t mst_get64(const unsigned char *p) { uint64_t v = 0; int i; for (i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint32_t mst_get32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* blob (version 1 or 2, `groups` layer groups) rewritten as version 3 with
   the positions record the old version implies (pos_shift 0; each group's
   release point live_start when pages were released, else 0), re-signed:
   a blob another writer may send, and mskv_request_import accepts. */
static unsigned char *mst_as_v3(const unsigned char *blob, size_t n, int32_t groups, size_t *out_n) {
    size_t old_hdr = mst_get32(blob + 12), base = 128 + 8 + 64 * (size_t)(groups - 1), hdr = base + 8 + 8 * (size_t)groups;
    size_t m = n - old_hdr + hdr;
    uint32_t P = mst_get32(blob + 24);
    int32_t g;
    unsigned char *b = (unsigned char *)calloc(1, m);
    if (!b) return NULL;
    memcpy(b, blob, old_hdr);
    mtu_put32(b + 8, 6);   /* layout 3, XXH64-signed */
    mtu_put32(b + 12, (uint32_t)hdr);
    mtu_put64(b + 16, (uint64_t)m);
    mtu_put32(b + 128, (uint32_t)groups);
    mtu_put32(b + 132, 0);
    for (g = 0; g < groups; g++) {
        const unsigned char *p = blob + 136 + 64 * (size_t)(g - 1);
        uint64_t live = g == 0 ? mst_get64(blob + 72) : mst_get64(p + 24);
        uint32_t pp = g == 0 ? mst_get32(blob + 52) : mst_get32(p + 4);
        mtu_put64(b + base + 8 + 8 * (size_t)g, live > (uint64_t)pp * P ? live : 0);
    }
    memcpy(b + hdr, blob + old_hdr, n - old_hdr);
    mtu_blob_sign(b, m);
    *out_n = m;
    return b;
}

TEST(streamed_import_of_a_version_3_header_an_older_version_could_say_lays_out_its_real_header) {
    /* 32 tokens: the gap's release ends on a page boundary (a version-1 blob) */
    static const mts_state states[] = { MTS_PLAIN, MTS_GAP, MTS_KEYED, MTS_PLAIN };
    size_t si;
    for (si = 0; si < sizeof states / sizeof states[0]; si++) {
        mts_state s = states[si];
        int32_t groups = si == 3 ? 2 : 1;   /* a version-2 blob */
        mskv_arena *a = mts_arena(64, 4, groups), *b = mts_arena(64, 4, groups), *c = mts_arena(64, 4, groups);
        mskv_request r, whole, streamed;
        mskv_blob_layout L;
        mskv_blob_range first;
        unsigned char *blob, *v3, *e_whole, *e_streamed;
        size_t n = 0, m = 0, nw = 0, ns = 0;
        ASSERT_TRUE(a && b && c);
        ASSERT_EQ(MSKV_SUCCESS, mts_build(a, s, 32, 2, &r));
        blob = mst_export(a, r, &n);
        ASSERT_TRUE(blob != NULL);
        ASSERT_EQ(groups + 3, (int32_t)mst_get32(blob + 8));   /* version 4 or 5 (layouts 1, 2): what the rewrite starts from */
        v3 = mst_as_v3(blob, n, groups, &m);
        ASSERT_TRUE(v3 != NULL);
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(b, v3, m, &whole));
        /* the layout is the arriving blob's: header + ranges + 8 == blob */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_import_begin(c, v3, m, &streamed, &L));
        EXPECT_EQ((int64_t)mst_get32(v3 + 12), (int64_t)L.header_bytes);
        EXPECT_EQ((int64_t)m, (int64_t)L.blob_bytes);
        EXPECT_EQ((int64_t)L.blob_bytes, (int64_t)(L.header_bytes + (size_t)L.range_count * L.range_bytes + 8));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(c, streamed, 0, 1, &first));
        EXPECT_EQ_U64((uint64_t)L.header_bytes, first.offset);
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_import_abort(c, streamed));
        EXPECT_EQ(MSKV_SUCCESS, mst_stream_in(c, v3, m, &streamed));
        /* both paths give the same request: the same blob (the version the state needs) */
        e_whole = mst_export(b, whole, &nw);
        e_streamed = mst_export(c, streamed, &ns);
        ASSERT_TRUE(e_whole && e_streamed);
        EXPECT_TRUE(nw == ns && memcmp(e_whole, e_streamed, nw) == 0);
        EXPECT_TRUE(nw == n && memcmp(e_whole, blob, n) == 0);
        mtu_audit(c);
        free(e_whole);
        free(e_streamed);
        free(v3);
        free(blob);
        mskv_arena_destroy(a);
        mskv_arena_destroy(b);
        mskv_arena_destroy(c);
    }
}
