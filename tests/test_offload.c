/* Offload, reload, export and import: byte-exact round trips, all-or-nothing
   reload, and blobs that are damaged or come from another layout. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

#define MTO_LAYERS 2
#define MTO_HEADS 2
#define MTO_DIM 4

static mskv_arena *mto_make_dt(int32_t num_pages, int32_t page_size, mskv_dtype dt) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    d.num_layers = MTO_LAYERS; d.kv_heads = MTO_HEADS; d.head_dim = MTO_DIM; d.dtype = dt;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

static mskv_arena *mto_make(int32_t num_pages, int32_t page_size) {
    return mto_make_dt(num_pages, page_size, MSKV_DTYPE_F32);
}



/* A byte pattern per (tag, position, layer, kind, byte): every byte of a slot
   is checked, whatever the dtype. */
static unsigned char mto_byte(uint32_t tag, int64_t pos, int layer, int kind, size_t i) {
    uint32_t x = tag * 2654435761u ^ (uint32_t)pos * 40503u ^ (uint32_t)layer * 977u ^ (uint32_t)kind * 131u ^ (uint32_t)i * 7u;
    x ^= x >> 13;
    return (unsigned char)(x * 31u >> 3);
}

static int mto_write(mskv_arena *a, mskv_request r, uint32_t tag, int64_t from, int64_t to) {
    mskv_store_info si;
    int64_t pos, slot;
    int layer, kind;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0;
    for (pos = from; pos < to; pos++) {
        if (mskv_request_slot(a, r, pos, &slot) != MSKV_SUCCESS) return 0;
        for (layer = 0; layer < si.num_layers; layer++)
            for (kind = 0; kind < 2; kind++) {
                unsigned char *p = (unsigned char *)mskv_store_pool(a, layer, kind);
                if (!p) return 0;
                for (i = 0; i < si.slot_bytes; i++) p[(size_t)slot * si.slot_bytes + i] = mto_byte(tag, pos, layer, kind, i);
            }
    }
    return 1;
}

static int64_t mto_check(mskv_arena *a, mskv_request r, uint32_t tag, int64_t from, int64_t to) {
    mskv_store_info si;
    int64_t pos, slot, bad = 0;
    int layer, kind;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return -1;
    for (pos = from; pos < to; pos++) {
        int ok = 1;
        if (mskv_request_slot(a, r, pos, &slot) != MSKV_SUCCESS) { bad++; continue; }
        for (layer = 0; layer < si.num_layers; layer++)
            for (kind = 0; kind < 2; kind++) {
                const unsigned char *p = (const unsigned char *)mskv_store_pool(a, layer, kind);
                for (i = 0; i < si.slot_bytes; i++)
                    if (p[(size_t)slot * si.slot_bytes + i] != mto_byte(tag, pos, layer, kind, i)) ok = 0;
            }
        if (!ok) bad++;
    }
    return bad;
}

static mskv_request_info mto_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.num_pages = -1;
    return i;
}

static int mto_same_state(const mskv_request_info *x, const mskv_request_info *y) {
    return x->committed == y->committed && x->prefix_tokens == y->prefix_tokens &&
           x->prefix_pages == y->prefix_pages && x->live_start == y->live_start &&
           x->num_pages == y->num_pages && x->kv_len == y->kv_len && x->location == y->location;
}

/* A request with a prefix, a released window and a partial last page:
   [0,6) protected, [8,20) released, [20,27) live. Bytes tagged `tag`. */
static int mto_shaped(mskv_arena *a, mskv_request *r, uint32_t tag) {
    if (mskv_request_add(a, r) != MSKV_SUCCESS) return 0;
    if (mtu_grow(a, *r, 27) != MSKV_SUCCESS) return 0;
    if (!mto_write(a, *r, tag, 0, 27)) return 0;
    if (mskv_request_protect_prefix(a, *r, 6) != MSKV_SUCCESS) return 0;
    return mskv_request_release_oldest(a, *r, 12, NULL) == MSKV_SUCCESS;
}

/* Overwrite every byte of every pool: after an offload nothing resident is
   left to protect, and a reload must then really copy the bytes back. */
static void mto_scribble_pools(mskv_arena *a) {
    mskv_store_info si;
    int32_t l;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return;
    for (l = 0; l < si.num_layers; l++) {
        memset(mskv_store_pool(a, l, 0), 0x5a, si.pool_bytes);
        memset(mskv_store_pool(a, l, 1), 0xa5, si.pool_bytes);
    }
}

static int64_t mto_check_shaped(mskv_arena *a, mskv_request r, uint32_t tag) {
    return mto_check(a, r, tag, 0, 8) + mto_check(a, r, tag, 20, 27);
}

TEST(offload_reload_round_trip_restores_state_and_bytes_exactly) {
    mskv_request r;
    mskv_request_info before, mid, after;
    mskv_arena_stats st;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 11));
    before = mto_info(a, r);
    ASSERT_EQ(4, before.num_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    mid = mto_info(a, r);
    EXPECT_EQ(MSKV_OFFLOADED, mid.location);
    EXPECT_EQ(before.committed, mid.committed);
    EXPECT_EQ(before.prefix_tokens, mid.prefix_tokens);
    EXPECT_EQ(before.live_start, mid.live_start);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.live_pages);
    EXPECT_EQ(4, st.offloaded_pages);
    EXPECT_EQ(31, st.free_pages);
    EXPECT_TRUE(mtu_audit(a));
    mto_scribble_pools(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    after = mto_info(a, r);
    EXPECT_TRUE(mto_same_state(&before, &after));
    EXPECT_EQ(0, mto_check_shaped(a, r, 11));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.offloaded_pages);
    EXPECT_EQ(4, st.live_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(reload_onto_different_page_ids_keeps_the_bytes) {
    mskv_request r, other;
    int32_t before[8], after[8], nb = 0, na = 0, k, moved = 0;
    mskv_arena *a = mto_make(12, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 12));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, before, 8, &nb));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    /* another request takes the freed pages (and more) and scribbles on them */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &other));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, other, 24));
    ASSERT_TRUE(mto_write(a, other, 99, 0, 24));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, after, 8, &na));
    ASSERT_EQ(nb, na);
    for (k = 0; k < na; k++) moved += before[k] != after[k];
    EXPECT_LT(0, moved);
    EXPECT_EQ(0, mto_check_shaped(a, r, 12));
    EXPECT_EQ(0, mto_check(a, other, 99, 0, 24));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(offload_reload_is_byte_exact_for_half_precision_stores) {
    mskv_dtype dts[2] = {MSKV_DTYPE_F16, MSKV_DTYPE_BF16};
    int k;
    for (k = 0; k < 2; k++) {
        mskv_request r;
        mskv_arena *a = mto_make_dt(32, 3, dts[k]);
        ASSERT_TRUE(a != NULL);
        ASSERT_TRUE(mto_shaped(a, &r, 13 + (uint32_t)k));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
        mto_scribble_pools(a);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
        /* page size 3: prefix pages hold [0, 6), the live window [18, 27) */
        EXPECT_EQ(0, mto_check(a, r, 13 + (uint32_t)k, 0, 6));
        EXPECT_EQ(0, mto_check(a, r, 13 + (uint32_t)k, 18, 27));
        mskv_arena_destroy(a);
    }
}

TEST(reload_moves_the_prefix_epoch) {
    mskv_request r;
    uint64_t e0;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 14));
    e0 = mto_info(a, r).prefix_epoch;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    EXPECT_EQ_U64(e0, mto_info(a, r).prefix_epoch);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_NE_U64(e0, mto_info(a, r).prefix_epoch);
    mskv_arena_destroy(a);
}

TEST(offloaded_request_refuses_operations_that_need_resident_pages) {
    mskv_request r, child;
    mskv_segment s;
    int64_t slot, rel;
    uint64_t d;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 15));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    d = mskv_arena_digest(a);
    s.request = r; s.n_tokens = 1;
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_request_fork(a, r, &child));
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_request_protect_prefix(a, r, 4));
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_request_release_oldest(a, r, 1, &rel));
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_request_slot(a, r, 21, &slot));
    EXPECT_EQ(MSKV_ERROR_OFFLOADED, mskv_request_offload(a, r));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    mskv_arena_destroy(a);
}

TEST(reload_of_a_resident_request_is_NOT_OFFLOADED) {
    mskv_request r;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    EXPECT_EQ(MSKV_ERROR_NOT_OFFLOADED, mskv_request_reload(a, r));
    mskv_arena_destroy(a);
}

TEST(offload_with_an_open_reservation_is_RESERVATION_PENDING) {
    mskv_request r;
    mskv_segment s;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    s.request = r; s.n_tokens = 5;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));
    EXPECT_EQ(MSKV_ERROR_RESERVATION_PENDING, mskv_request_offload(a, r));
    EXPECT_EQ(MSKV_RESIDENT, mto_info(a, r).location);
    mskv_arena_destroy(a);
}

TEST(reload_with_too_few_pages_is_OUT_OF_PAGES_changes_nothing_and_succeeds_later) {
    mskv_request r, hog;
    uint64_t d;
    mskv_arena *a = mto_make(12, 4);  /* 11 usable pages */
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 16));  /* 4 pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &hog));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, hog, 32));  /* 8 pages: 3 left */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_request_reload(a, r));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_OFFLOADED, mto_info(a, r).location);
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, hog, 4, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_EQ(0, mto_check_shaped(a, r, 16));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(offload_of_a_forked_child_leaves_the_shared_pages_to_the_parent) {
    mskv_request p, c;
    mskv_arena_stats st;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 10));
    ASSERT_TRUE(mto_write(a, p, 17, 0, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, p, &c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, c));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(3, st.live_pages);
    EXPECT_EQ(0, mto_check(a, p, 17, 0, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, c));
    EXPECT_EQ(0, mto_check(a, c, 17, 0, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(6, st.live_pages);  /* the reloaded child owns its own copies */
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* ---- blobs ---- */

static unsigned char *mto_export(mskv_arena *a, mskv_request r, size_t *size) {
    unsigned char *buf;
    *size = 0;
    if (mskv_request_export(a, r, NULL, 0, size) != MSKV_SUCCESS || *size == 0) return NULL;
    buf = (unsigned char *)malloc(*size);
    if (buf && mskv_request_export(a, r, buf, *size, size) != MSKV_SUCCESS) { free(buf); return NULL; }
    return buf;
}

TEST(export_import_round_trip_into_another_arena_is_exact) {
    mskv_request r, y;
    mskv_request_info ri, yi;
    size_t size = 0;
    unsigned char *blob;
    mskv_arena *a = mto_make(32, 4), *b = mto_make(20, 4);
    ASSERT_TRUE(a != NULL && b != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 18));
    blob = mto_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(b, blob, size, &y));
    EXPECT_EQ(MSKV_OFFLOADED, mto_info(b, y).location);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(b, y));
    ri = mto_info(a, r);
    yi = mto_info(b, y);
    EXPECT_TRUE(mto_same_state(&ri, &yi));
    EXPECT_EQ(0, mto_check_shaped(b, y, 18));
    EXPECT_TRUE(mtu_audit(b));
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(export_of_an_offloaded_request_equals_export_of_it_resident) {
    mskv_request r;
    size_t s1 = 0, s2 = 0;
    unsigned char *b1, *b2;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 19));
    b1 = mto_export(a, r, &s1);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    b2 = mto_export(a, r, &s2);
    ASSERT_TRUE(b1 != NULL && b2 != NULL);
    ASSERT_EQ((int64_t)s1, (int64_t)s2);
    EXPECT_EQ(0, memcmp(b1, b2, s1));
    free(b1);
    free(b2);
    mskv_arena_destroy(a);
}

TEST(export_into_a_short_buffer_is_CAPACITY_and_reports_the_size) {
    mskv_request r;
    size_t need = 0, got = 0;
    unsigned char small[16];
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 20));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, NULL, 0, &need));
    EXPECT_LT(16, (int64_t)need);
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_request_export(a, r, small, sizeof small, &got));
    EXPECT_EQ((int64_t)need, (int64_t)got);
    mskv_arena_destroy(a);
}

TEST(truncated_blob_of_every_length_is_rejected_and_changes_nothing) {
    mskv_request r, y;
    size_t size = 0, len;
    unsigned char *blob, *copy;
    uint64_t d;
    mskv_arena *a = mto_make(32, 2);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 5));
    ASSERT_TRUE(mto_write(a, r, 21, 0, 5));
    blob = mto_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    d = mskv_arena_digest(a);
    for (len = 0; len < size; len++) {
        mskv_result e;
        copy = (unsigned char *)malloc(len ? len : 1);  /* exact-size copy: ASan sees any overread */
        ASSERT_TRUE(copy != NULL);
        memcpy(copy, blob, len);
        e = mskv_request_import(a, copy, len, &y);
        free(copy);
        if (e != MSKV_ERROR_BLOB_TRUNCATED) {
            mt_fail(__FILE__, __LINE__, "import of %zu of %zu bytes: expected BLOB_TRUNCATED, got %d", len, size, (int)e);
            break;
        }
    }
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(a, blob, size, &y));
    free(blob);
    mskv_arena_destroy(a);
}

TEST(blob_with_any_flipped_byte_is_corrupt_and_changes_nothing) {
    mskv_request r, y;
    size_t size = 0, i;
    unsigned char *blob;
    uint64_t d;
    mskv_arena *a = mto_make(32, 2);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 5));
    ASSERT_TRUE(mto_write(a, r, 22, 0, 5));
    blob = mto_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    d = mskv_arena_digest(a);
    for (i = 0; i < size; i++) {
        mskv_result e;
        int bit;
        for (bit = 0; bit < 8; bit += 7) {
            blob[i] ^= (unsigned char)(1u << bit);
            e = mskv_request_import(a, blob, size, &y);
            blob[i] ^= (unsigned char)(1u << bit);
            /* a damaged length field may read as a truncated blob; anything else is corrupt */
            if (e != MSKV_ERROR_BLOB_CORRUPT && !(e == MSKV_ERROR_BLOB_TRUNCATED && i >= 16 && i < 24)) {
                mt_fail(__FILE__, __LINE__, "byte %zu bit %d flipped: expected BLOB_CORRUPT, got %d", i, bit, (int)e);
                i = size;
                break;
            }
        }
    }
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    free(blob);
    mskv_arena_destroy(a);
}

TEST(blob_from_an_arena_with_another_layout_is_BLOB_MISMATCH) {
    mskv_request r, y;
    size_t size = 0;
    unsigned char *blob;
    int k;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 23));
    blob = mto_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    for (k = 0; k < 5; k++) {
        mskv_arena_desc d;
        mskv_arena *b = NULL;
        uint64_t dg;
        memset(&d, 0, sizeof d);
        d.num_pages = 32; d.page_size = 4;
        d.num_layers = MTO_LAYERS; d.kv_heads = MTO_HEADS; d.head_dim = MTO_DIM; d.dtype = MSKV_DTYPE_F32;
        if (k == 0) d.page_size = 8;
        if (k == 1) d.num_layers = 1;
        if (k == 2) d.kv_heads = 1;
        if (k == 3) d.head_dim = 8;
        if (k == 4) d.dtype = MSKV_DTYPE_F16;
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &b));
        dg = mskv_arena_digest(b);
        EXPECT_EQ(MSKV_ERROR_BLOB_MISMATCH, mskv_request_import(b, blob, size, &y));
        EXPECT_EQ_U64(dg, mskv_arena_digest(b));
        mskv_arena_destroy(b);
    }
    free(blob);
    mskv_arena_destroy(a);
}

TEST(remove_of_an_offloaded_request_drops_its_host_copy) {
    mskv_request r;
    mskv_arena_stats st;
    mskv_arena *a = mto_make(32, 4);
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mto_shaped(a, &r, 24));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.offloaded_pages);
    EXPECT_EQ(0, st.requests);
    EXPECT_EQ(31, st.free_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* ---- host memory reuse ---- */

typedef struct mto_count { long allocs, frees; } mto_count;
static void *mto_alloc(void *u, size_t n) { ((mto_count *)u)->allocs++; return malloc(n); }
static void *mto_realloc(void *u, void *p, size_t n) { (void)u; return realloc(p, n); }
static void mto_free(void *u, void *p) { if (p) ((mto_count *)u)->frees++; free(p); }

/* Parking the same request again reuses the host buffer its reload gave back
   (no new allocation, so no page faults on the copy); trim returns it. */
TEST(offload_after_reload_reuses_the_host_buffer_until_trimmed) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_arena_stats st;
    mto_count c = {0, 0};
    int k;
    memset(&d, 0, sizeof d);
    d.num_pages = 32; d.page_size = 4;
    d.num_layers = MTO_LAYERS; d.kv_heads = MTO_HEADS; d.head_dim = MTO_DIM;
    d.host_allocator.user = &c;
    d.host_allocator.alloc = mto_alloc;
    d.host_allocator.realloc = mto_realloc;
    d.host_allocator.free = mto_free;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 30));
    for (k = 0; k < 5; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
        EXPECT_TRUE(mtu_audit(a));
    }
    EXPECT_EQ(1, c.allocs);          /* one host buffer for all five round trips */
    EXPECT_EQ(0, c.frees);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ((int64_t)8 * MTO_LAYERS * 2 * 4 * MTO_HEADS * MTO_DIM * 4, (int64_t)st.host_spare_bytes);
    mskv_arena_trim(a);
    EXPECT_EQ(1, c.frees);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, (int64_t)st.host_spare_bytes);
    /* a much smaller request does not take a large spare: it gets its own buffer */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    {
        mskv_request small;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &small));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, small, 3));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, small));
        EXPECT_EQ(3, c.allocs);
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
        EXPECT_GT((int64_t)st.host_spare_bytes, 0);   /* the large spare is still kept */
    }
    mskv_arena_destroy(a);
    EXPECT_EQ(c.allocs, c.frees);
}

/* ---- signed blobs with impossible states ---- */

/* A blob whose checksum is right but whose state could never have been
   exported is still corrupt: import refuses it and nothing changes. */
TEST(import_refuses_a_correctly_signed_blob_with_an_impossible_state) {
    mskv_arena *a = mto_make(32, 4);
    mskv_request r, k, out;
    unsigned char *blob, *edit;
    size_t size = 0, ksize = 0;
    uint64_t digest;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, NULL, 0, &size));
    blob = (unsigned char *)malloc(size);
    edit = (unsigned char *)malloc(size);
    ASSERT_TRUE(blob && edit);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, blob, size, &size));
    digest = mskv_arena_digest(a);
    /* the signing is right: an unedited copy re-signed imports */
    memcpy(edit, blob, size);
    mtu_blob_sign(edit, size);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(a, edit, size, &out));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, out));
    digest = mskv_arena_digest(a);
    /* released past the committed tokens: live_start 12 > committed 10, no pages */
    memcpy(edit, blob, 128);
    mtu_put64(edit + 72, 12);
    mtu_put32(edit + 44, 0);
    mtu_put64(edit + 16, 136);
    mtu_blob_sign(edit, 136);
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(a, edit, 136, &out));
    /* a retention policy that does not validate (chunk size 0) */
    memcpy(edit, blob, size);
    mtu_put32(edit + 48, 4);
    mtu_put64(edit + 88, 0);
    mtu_put64(edit + 104, 1);
    mtu_blob_sign(edit, size);
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(a, edit, size, &out));
    /* an overflowing one (chunk 2^62 x window 2^40) is refused before any arithmetic */
    mtu_put64(edit + 88, (uint64_t)1 << 62);
    mtu_put64(edit + 104, (uint64_t)1 << 40);
    mtu_blob_sign(edit, size);
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(a, edit, size, &out));
    EXPECT_EQ_U64(digest, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    /* a keyed entry may carry no retention policy, prefix or released window */
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 5, 6, &k));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, k));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, k, NULL, 0, &ksize));
    free(edit);
    edit = (unsigned char *)malloc(ksize);
    ASSERT_TRUE(edit != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, k, edit, ksize, &ksize));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 5));
    digest = mskv_arena_digest(a);
    mtu_put32(edit + 48, 7);                    /* keyed | sealed | retention */
    mtu_put64(edit + 88, 4);
    mtu_put64(edit + 104, 1);
    mtu_blob_sign(edit, ksize);
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(a, edit, ksize, &out));
    EXPECT_EQ_U64(digest, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    free(blob);
    free(edit);
    mskv_arena_destroy(a);
}

/* A request of more than 4 MiB (the sizes offload is measured at) comes
   back byte for byte, with pages whose bytes are a multiple of 64 and pages
   of 1,110 bytes (copies that start and end inside a 16-byte unit), onto
   page ids the reload changes. */
TEST(offload_reload_of_a_request_over_4_mib_is_byte_exact) {
    static const int32_t cfg[2][5] = {{2, 5, 3, 37, 1300}, {1, 8, 64, 16, 90}}; /* layers, heads, dim, page, pages */
    static const mskv_dtype dts[2] = {MSKV_DTYPE_F16, MSKV_DTYPE_F32};
    int c;
    for (c = 0; c < 2; c++) {
        mskv_arena_desc d;
        mskv_arena *a = NULL;
        mskv_request r, other;
        mskv_store_info si;
        int64_t tokens = (int64_t)cfg[c][3] * (cfg[c][4] - 10);
        memset(&d, 0, sizeof d);
        d.num_layers = cfg[c][0]; d.kv_heads = cfg[c][1]; d.head_dim = cfg[c][2];
        d.page_size = cfg[c][3]; d.num_pages = cfg[c][4]; d.dtype = dts[c];
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
        ASSERT_EQ(MSKV_SUCCESS, mskv_store_info_get(a, &si));
        ASSERT_TRUE((double)tokens * (double)si.slot_bytes * 2 * si.num_layers >= 4.0 * 1048576);
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, tokens));
        ASSERT_TRUE(mto_write(a, r, 21 + (uint32_t)c, 0, tokens));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
        mto_scribble_pools(a);
        /* another request takes the first free pages, so the reload lands elsewhere */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &other));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, other, (int64_t)cfg[c][3] * 5));
        ASSERT_TRUE(mto_write(a, other, 77, 0, (int64_t)cfg[c][3] * 5));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
        EXPECT_EQ(0, mto_check(a, r, 21 + (uint32_t)c, 0, tokens));
        EXPECT_EQ(0, mto_check(a, other, 77, 0, (int64_t)cfg[c][3] * 5));
        EXPECT_TRUE(mtu_audit(a));
        mskv_arena_destroy(a);
    }
}
