/* The bad-input table: every public function of the host core with each
   invalid argument returns its specific error code, and the state is
   unchanged (the arena's digest before and after are equal, the audit
   passes). */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* One arena in a state where every kind of invalid call is possible:
   no free page left, requests resident / reserved / offloaded / removed,
   keyed entries sealed and open, a valid blob and one from another layout. */
typedef struct mtb_fx {
    mskv_arena *a;
    mskv_request ok;      /* 20 committed, prefix 4, [4,12) released: 3 pages */
    mskv_request part;    /* 5 committed: a partial last page */
    mskv_request res;     /* 5 committed + 3 reserved */
    mskv_request off;     /* offloaded, 6 committed (2 pages) */
    mskv_request stale;   /* removed */
    mskv_request unknown; /* never handed out */
    mskv_request sealed;  /* keyed 77, sealed, 5 tokens */
    mskv_request open;    /* keyed 78, not sealed */
    mskv_request hog;     /* every remaining page */
    unsigned char *blob, *foreign;
    size_t blob_size, foreign_size;
} mtb_fx;


static mskv_arena *mtb_arena(int32_t num_pages, int32_t page_size, int32_t max_requests) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size; d.max_requests = max_requests;
    d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4; d.dtype = MSKV_DTYPE_F32;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

static unsigned char *mtb_export(mskv_arena *a, mskv_request r, size_t *size) {
    unsigned char *b;
    if (mskv_request_export(a, r, NULL, 0, size) != MSKV_SUCCESS) return NULL;
    b = (unsigned char *)malloc(*size);
    if (b && mskv_request_export(a, r, b, *size, size) != MSKV_SUCCESS) { free(b); b = NULL; }
    return b;
}

static int mtb_setup(mtb_fx *f) {
    mskv_arena *other;
    mskv_request x;
    mskv_segment s;
    mskv_arena_stats st;
    memset(f, 0, sizeof *f);
    f->a = mtb_arena(24, 4, 16);
    if (!f->a) return 0;
    if (mskv_request_add(f->a, &f->ok) || mtu_grow(f->a, f->ok, 20) || mskv_request_protect_prefix(f->a, f->ok, 4) ||
        mskv_request_release_oldest(f->a, f->ok, 8, NULL))
        return 0;
    if (mskv_request_add(f->a, &f->part) || mtu_grow(f->a, f->part, 5)) return 0;
    if (mskv_request_add(f->a, &f->res) || mtu_grow(f->a, f->res, 5)) return 0;
    s.request = f->res; s.n_tokens = 3;
    if (mskv_admit(f->a, &s, 1)) return 0;
    if (mskv_request_add(f->a, &f->off) || mtu_grow(f->a, f->off, 6) || mskv_request_offload(f->a, f->off)) return 0;
    if (mskv_request_add(f->a, &f->stale) || mskv_request_remove(f->a, f->stale)) return 0;
    f->unknown.id = 0xFFFFFFFFu;
    if (mskv_keyed_create(f->a, 77, 5, &f->sealed) || mskv_keyed_seal(f->a, f->sealed)) return 0;
    if (mskv_keyed_create(f->a, 78, 3, &f->open)) return 0;
    if (mskv_arena_stats_get(f->a, &st) || mskv_request_add(f->a, &f->hog) || mtu_grow(f->a, f->hog, (int64_t)st.free_pages * 4))
        return 0;
    if (mskv_arena_stats_get(f->a, &st) || st.free_pages != 0) return 0;
    f->blob = mtb_export(f->a, f->ok, &f->blob_size);
    other = mtb_arena(24, 8, 0);
    if (!other || !f->blob) return 0;
    if (mskv_request_add(other, &x) || mtu_grow(other, x, 9)) return 0;
    f->foreign = mtb_export(other, x, &f->foreign_size);
    mskv_arena_destroy(other);
    return f->foreign != NULL;
}

static void mtb_teardown(mtb_fx *f) {
    free(f->blob);
    free(f->foreign);
    mskv_arena_destroy(f->a);
}

static void mtb_check(mtb_fx *f, int line, const char *call, mskv_result want, mskv_result got, uint64_t digest) {
    char why[256];
    if (got != want)
        mt_fail(__FILE__, line, "%s: expected %d (%s), got %d (%s)", call, (int)want, mskv_result_string(want), (int)got,
                mskv_result_string(got));
    if (mskv_arena_digest(f->a) != digest) mt_fail(__FILE__, line, "%s changed the state", call);
    why[0] = '\0';
    if (mskv_arena_audit(f->a, why, sizeof why) != MSKV_SUCCESS) mt_fail(__FILE__, line, "%s: audit after: %s", call, why);
}

#define MTB(want, call)                                                  \
    do {                                                                 \
        uint64_t mtb__d = mskv_arena_digest(f.a);                        \
        mskv_result mtb__e = (call);                                     \
        mtb_check(&f, __LINE__, #call, (want), mtb__e, mtb__d);          \
    } while (0)

#define MTB_FIXTURE(f)                                                   \
    mtb_fx f;                                                            \
    if (!mtb_setup(&f)) {                                                \
        mt_fail(__FILE__, __LINE__, "fixture setup failed");             \
        mtb_teardown(&f);                                                \
        return;                                                          \
    }

TEST(bad_input_arena_functions_return_their_codes_and_change_nothing) {
    mskv_arena_desc d;
    mskv_arena *out = NULL;
    mskv_arena_stats st;
    mskv_store_info si;
    MTB_FIXTURE(f);
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_create(NULL, &out));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_create(&d, NULL));
    d.num_pages = 1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.num_pages = 8; d.page_size = 0;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.page_size = 4; d.max_requests = 65536;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.max_requests = 0; d.retire_mode = (mskv_retire_mode)7;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.retire_mode = MSKV_RETIRE_IMMEDIATE; d.num_layers = -1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.num_layers = 1; d.kv_heads = 0; d.head_dim = 4;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.kv_heads = 1; d.dtype = (mskv_dtype)9;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    d.dtype = MSKV_DTYPE_F32;
    d.num_pages = 0x7FFFFFFF; d.page_size = 0x7FFFFFFF; d.kv_heads = 0x7FFFFFFF; d.head_dim = 0x7FFFFFFF;
    MTB(MSKV_ERROR_OVERFLOW, mskv_arena_create(&d, &out));
    EXPECT_TRUE(out == NULL);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_stats_get(NULL, &st));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_stats_get(f.a, NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_audit(NULL, NULL, 0));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_retire(NULL, 0));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_arena_retire(f.a, mskv_arena_step(f.a) + 1));  /* a fence not reached yet */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_store_info_get(NULL, &si));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_store_info_get(f.a, NULL));
    EXPECT_TRUE(mskv_store_pool(NULL, 0, 0) == NULL);
    EXPECT_TRUE(mskv_store_pool(f.a, 1, 0) == NULL);
    EXPECT_EQ(0, (int)mskv_arena_step(NULL));
    EXPECT_EQ_U64(0, mskv_arena_digest(NULL));
    mskv_arena_destroy(NULL);  /* harmless */
    mtb_teardown(&f);
}

static void *mtb_alloc(void *u, size_t n) { (void)u; return malloc(n); }

TEST(bad_input_arena_rejects_an_allocator_with_only_some_functions) {
    mskv_arena_desc d;
    mskv_arena *out = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4;
    d.allocator.alloc = mtb_alloc;  /* realloc and free missing */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    EXPECT_TRUE(out == NULL);
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4;
    d.host_allocator.alloc = mtb_alloc;  /* the same rule for the host-copy allocator */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out));
    EXPECT_TRUE(out == NULL);
}

TEST(bad_input_request_functions_return_their_codes_and_change_nothing) {
    mskv_request c;
    mskv_request_info info;
    int32_t pages[64], count = 0;
    int64_t slot = 0, rel = 0;
    MTB_FIXTURE(f);
    /* add / remove */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_add(NULL, &c));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_add(f.a, NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_remove(NULL, f.ok));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_remove(f.a, f.stale));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_remove(f.a, f.unknown));
    /* fork */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_fork(NULL, f.ok, &c));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_fork(f.a, f.ok, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_fork(f.a, f.stale, &c));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_fork(f.a, f.res, &c));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_fork(f.a, f.off, &c));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_request_fork(f.a, f.part, &c));  /* the partial page needs a copy */
    /* info / pages */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_info_get(NULL, f.ok, &info));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_info_get(f.a, f.ok, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(f.a, f.stale, &info));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(f.a, f.unknown, &info));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_pages(f.a, f.ok, pages, 64, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_pages(f.a, f.stale, pages, 64, &count));
    MTB(MSKV_ERROR_CAPACITY, mskv_request_pages(f.a, f.ok, pages, 2, &count));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_pages(f.a, f.off, pages, 64, &count));
    /* pause / resume */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_pause(NULL, f.ok));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_pause(f.a, f.stale));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_resume(f.a, f.unknown));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_pause(f.a, f.res));
    MTB(MSKV_ERROR_BAD_STATE, mskv_request_resume(f.a, f.ok));           /* not paused */
    /* reserve (table capacity) */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_reserve(NULL, f.ok, 64));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_reserve(f.a, f.stale, 64));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_reserve(f.a, f.unknown, 64));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_reserve(f.a, f.ok, -1));
    MTB(MSKV_ERROR_OVERFLOW, mskv_request_reserve(f.a, f.ok, (int64_t)1 << 40));
    /* protect */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_protect_prefix(NULL, f.ok, 1));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_protect_prefix(f.a, f.stale, 1));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_protect_prefix(f.a, f.part, 6));    /* beyond committed */
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_protect_prefix(f.a, f.res, 6));     /* reserved is not committed */
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_protect_prefix(f.a, f.ok, -1));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_protect_prefix(f.a, f.off, 2));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_protect_prefix(f.a, f.sealed, 2));
    /* release */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_release_oldest(NULL, f.ok, 1, &rel));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_release_oldest(f.a, f.stale, 1, &rel));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest(f.a, f.ok, 9, &rel));  /* live is [12,20) */
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest(f.a, f.res, 6, &rel)); /* reserved tokens are not releasable */
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_release_oldest(f.a, f.ok, -1, &rel));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_release_oldest(f.a, f.off, 1, &rel));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_release_oldest(f.a, f.sealed, 4, &rel));
    /* slot */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_slot(NULL, f.ok, 0, &slot));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_slot(f.a, f.ok, 0, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_slot(f.a, f.stale, 0, &slot));
    MTB(MSKV_ERROR_RELEASED, mskv_request_slot(f.a, f.ok, 4, &slot));
    MTB(MSKV_ERROR_RELEASED, mskv_request_slot(f.a, f.ok, 11, &slot));
    MTB(MSKV_ERROR_NOT_WRITTEN, mskv_request_slot(f.a, f.ok, 20, &slot));
    MTB(MSKV_ERROR_NOT_WRITTEN, mskv_request_slot(f.a, f.res, 8, &slot));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_slot(f.a, f.ok, -1, &slot));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_slot(f.a, f.off, 0, &slot));
    /* position shift */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_shift_positions(NULL, f.ok, 1));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_shift_positions(f.a, f.stale, 1));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_shift_positions(f.a, f.unknown, 1));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_shift_positions(f.a, f.sealed, 1));
    MTB(MSKV_ERROR_OVERFLOW, mskv_request_shift_positions(f.a, f.ok, (int64_t)INT32_MAX + 1));
    MTB(MSKV_ERROR_OVERFLOW, mskv_request_shift_positions(f.a, f.res, -(int64_t)INT32_MAX - 1));   /* pending too */
    mtb_teardown(&f);
}

TEST(bad_input_offload_and_blob_functions_return_their_codes_and_change_nothing) {
    mskv_request y;
    size_t size = 0;
    unsigned char small[8];
    MTB_FIXTURE(f);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_offload(NULL, f.ok));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_offload(f.a, f.stale));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_offload(f.a, f.res));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_offload(f.a, f.off));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_reload(NULL, f.off));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_reload(f.a, f.stale));
    MTB(MSKV_ERROR_NOT_OFFLOADED, mskv_request_reload(f.a, f.ok));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_request_reload(f.a, f.off));  /* no page is free */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_export(NULL, f.ok, NULL, 0, &size));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_export(f.a, f.ok, NULL, 0, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_export(f.a, f.stale, NULL, 0, &size));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_export(f.a, f.res, NULL, 0, &size));
    MTB(MSKV_ERROR_CAPACITY, mskv_request_export(f.a, f.ok, small, sizeof small, &size));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_import(NULL, f.blob, f.blob_size, &y));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_import(f.a, NULL, f.blob_size, &y));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_import(f.a, f.blob, f.blob_size, NULL));
    MTB(MSKV_ERROR_BLOB_TRUNCATED, mskv_request_import(f.a, f.blob, 0, &y));
    MTB(MSKV_ERROR_BLOB_TRUNCATED, mskv_request_import(f.a, f.blob, f.blob_size - 1, &y));
    MTB(MSKV_ERROR_BLOB_MISMATCH, mskv_request_import(f.a, f.foreign, f.foreign_size, &y));
    f.blob[f.blob_size / 2] ^= 0x10;
    MTB(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(f.a, f.blob, f.blob_size, &y));
    f.blob[f.blob_size / 2] ^= 0x10;
    f.blob[0] ^= 0x01;  /* the magic */
    MTB(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(f.a, f.blob, f.blob_size, &y));
    f.blob[0] ^= 0x01;
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(f.a, f.blob, f.blob_size, &y));  /* the intact blob imports */
    mtb_teardown(&f);
}

TEST(bad_input_import_into_a_full_request_table_is_TOO_MANY_REQUESTS) {
    mskv_arena *a = mtb_arena(16, 4, 2);
    mskv_request r1, r2, y;
    size_t size = 0;
    unsigned char *blob;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r1));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r1, 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r2));
    blob = mtb_export(a, r1, &size);
    ASSERT_TRUE(blob != NULL);
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_TOO_MANY_REQUESTS, mskv_request_import(a, blob, size, &y));
    EXPECT_EQ(MSKV_ERROR_TOO_MANY_REQUESTS, mskv_request_add(a, &y));
    EXPECT_EQ(MSKV_ERROR_TOO_MANY_REQUESTS, mskv_request_fork(a, r1, &y));
    EXPECT_EQ(MSKV_ERROR_TOO_MANY_REQUESTS, mskv_keyed_create(a, 5, 4, &y));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    free(blob);
    mskv_arena_destroy(a);
}

TEST(bad_input_window_functions_return_their_codes) {
    mskv_schedule s, broken;
    mskv_window w;
    mskv_decode_span ds;
    mskv_retention r;
    char why[64];
    MTB_FIXTURE(f);
    memset(&r, 0, sizeof r);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_schedule_init(NULL, 10, 4, 1));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, -1, 4, 1));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 10, 0, 0));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 10, 4, 4));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 10, 4, -1));
    MTB(MSKV_SUCCESS, mskv_schedule_init(&s, 10, 4, 1));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_schedule_window(NULL, 0, &w));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_schedule_window(&s, 0, NULL));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_window(&s, s.count, &w));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_window(&s, -1, &w));
    broken = s;
    broken.stride = 7;  /* a schedule not made by schedule_init */
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_schedule_window(&broken, 0, &w));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_schedule_decode_span(&s, 0, 1, NULL));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_schedule_decode_span(&s, 0, -1, &ds));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_decode_span(&s, s.count, 1, &ds));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_retention_validate(NULL, 4, why, sizeof why));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 4, why, sizeof why));  /* chunk_size 0 */
    r.chunk_size = 8; r.window_chunks = 2; r.sink_chunks = -1;
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 4, why, sizeof why));
    r.sink_chunks = 1; r.window_tokens = 15;
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 4, why, sizeof why));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_request_set_retention(f.a, f.ok, &r));
    r.window_tokens = 16;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_set_retention(NULL, f.ok, &r));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_set_retention(f.a, f.stale, &r));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_set_retention(f.a, f.sealed, &r));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_skipped_tokens(NULL, 100));
    mtb_teardown(&f);
}

TEST(bad_input_step_functions_return_their_codes_and_change_nothing) {
    mskv_segment s[2];
    uint64_t ended;
    MTB_FIXTURE(f);
    s[0].request = f.ok; s[0].n_tokens = 1;
    s[1] = s[0];
    MTB(MSKV_ERROR_NULL_POINTER, mskv_admit(NULL, s, 1));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_admit(f.a, NULL, 1));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_admit(f.a, s, -1));
    MTB(MSKV_ERROR_DUPLICATE, mskv_admit(f.a, s, 2));
    s[1].request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_admit(f.a, s, 2));
    s[1].request = f.part; s[1].n_tokens = -2;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_admit(f.a, s, 2));
    s[1].n_tokens = 1; s[1].request = f.off;
    MTB(MSKV_ERROR_OFFLOADED, mskv_admit(f.a, s, 2));
    s[1].request = f.res;
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_admit(f.a, s, 2));
    s[1].request = f.sealed;
    MTB(MSKV_ERROR_READ_ONLY, mskv_admit(f.a, s, 2));
    s[1].request = f.part;  /* ok needs a page, part fits in its partial page: the batch still fails whole */
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(f.a, s, 2));
    s[0].request = f.ok;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_commit(NULL, s, 1));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_commit(f.a, NULL, 1));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_commit(f.a, s, -1));
    MTB(MSKV_ERROR_NO_RESERVATION, mskv_commit(f.a, s, 1));
    s[0].request = f.res; s[0].n_tokens = 3; s[1] = s[0];
    MTB(MSKV_ERROR_DUPLICATE, mskv_commit(f.a, s, 2));
    s[1].request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_commit(f.a, s, 2));
    s[1].request = f.ok;  /* one segment without a reservation: nothing is committed */
    MTB(MSKV_ERROR_NO_RESERVATION, mskv_commit(f.a, s, 2));
    MTB(MSKV_ERROR_NO_RESERVATION, mskv_abort(f.a, s, 2));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_abort(NULL, s, 1));
    s[1].request = f.open;  /* a keyed entry is sealed, not committed */
    MTB(MSKV_ERROR_READ_ONLY, mskv_commit(f.a, s + 1, 1));
    s[1].request = f.off;
    MTB(MSKV_ERROR_OFFLOADED, mskv_publish(f.a, s + 1, 1, &ended));
    s[1].request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_publish(f.a, s + 1, 1, &ended));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_publish(NULL, NULL, 0, &ended));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_publish(f.a, s, -1, &ended));
    mtb_teardown(&f);
}

TEST(bad_input_plan_functions_return_their_codes_and_change_nothing) {
    mskv_segment s[2];
    mskv_plan_desc pd;
    mskv_plan_size sz;
    mskv_plan p, owned;
    int32_t qo[3], kvp[3], idx[16], last[2], kvlen[2], split[2], shift[2], pos[3 * 8];
    int64_t tok[3], slots[8];
    char why[64];
    MTB_FIXTURE(f);
    memset(&pd, 0, sizeof pd);
    memset(&p, 0, sizeof p);
    p.qo_indptr = qo; p.kv_indptr = kvp; p.kv_indices = idx; p.kv_last_page_len = last; p.kv_len = kvlen;
    p.kv_pos_split = split; p.kv_pos_shift = shift; p.kv_token_indptr = tok; p.slot_mapping = slots; p.positions = pos;
    p.cap_batch = 2; p.cap_tokens = 8; p.cap_page_ids = 16;
    s[0].request = f.res; s[0].n_tokens = 3;
    s[1] = s[0];
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_query(NULL, s, 1, &pd, &sz));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_query(f.a, s, 1, &pd, NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_query(f.a, NULL, 1, &pd, &sz));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_query(f.a, s, -1, &pd, &sz));
    MTB(MSKV_ERROR_DUPLICATE, mskv_plan_query(f.a, s, 2, &pd, &sz));
    s[1].request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_plan_build(f.a, s, 2, &pd, &p));
    s[1].request = f.off;
    MTB(MSKV_ERROR_OFFLOADED, mskv_plan_build(f.a, s, 2, &pd, &p));
    s[1].request = f.part; s[1].n_tokens = 6;  /* more queries than the sequence has tokens */
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_plan_build(f.a, s, 2, &pd, &p));
    s[1].n_tokens = -1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
    s[1].n_tokens = 1;
    pd.kind = (mskv_plan_kind)5;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
    pd.kind = MSKV_PLAN_SELF; pd.pos_mode = MSKV_POS_3D;  /* grid 0 x 0 */
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
    pd.pos_mode = MSKV_POS_NONE; pd.kind = MSKV_PLAN_CROSS; pd.cross = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_plan_build(f.a, s, 2, &pd, &p));
    pd.cross = f.open;  /* not sealed yet */
    MTB(MSKV_ERROR_BAD_STATE, mskv_plan_build(f.a, s, 2, &pd, &p));
    pd.cross = f.ok;    /* not a keyed entry */
    MTB(MSKV_ERROR_BAD_STATE, mskv_plan_build(f.a, s, 2, &pd, &p));
    pd.kind = MSKV_PLAN_DENSE; pd.dense_kv_len = NULL;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_build(f.a, s, 2, &pd, &p));
    pd.kind = MSKV_PLAN_SELF;
    {   /* explicit positions, visibility, exclude_prefix, PREFIX plans */
        static const int32_t e[3] = {1, 2, 3};
        const int32_t *per[2];
        int64_t se[2] = {8, 8}, ws[2] = {16, 16};
        int32_t vse[2], vws[2], qpos[8];
        mskv_segment one;
        one.request = f.ok; one.n_tokens = 1;
        per[0] = e; per[1] = e;
        pd.positions = per;   /* without a pos_mode */
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
        pd.positions = NULL;
        pd.visibility = (mskv_visibility)7;
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
        pd.visibility = MSKV_VIS_CALLER;   /* without the bounds */
        MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_build(f.a, s, 2, &pd, &p));
        pd.vis_sink_end = se; pd.vis_window_start = ws;   /* the plan has no arrays for them */
        MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_build(f.a, s, 2, &pd, &p));
        p.vis_sink_end = vse; p.vis_window_start = vws;
        se[1] = -1;
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
        se[1] = 8; ws[1] = (int64_t)INT32_MAX + 1;
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, s, 2, &pd, &p));
        ws[1] = 16;
        pd.exclude_prefix = 1;   /* ok's prefix is 4 tokens: [4, 8) visible before a hole */
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, &one, 1, &pd, &p));
        pd.visibility = MSKV_VIS_PAGES; pd.kind = MSKV_PLAN_CROSS; pd.cross = f.sealed;
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, &one, 1, &pd, &p));
        pd.exclude_prefix = 0; pd.kind = MSKV_PLAN_PREFIX;   /* without q_pos */
        MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_build(f.a, &one, 1, &pd, &p));
        p.q_pos = qpos;
        pd.kind = (mskv_plan_kind)4;
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, &one, 1, &pd, &p));
        pd.kind = MSKV_PLAN_SELF;
        pd.vis_sink_end = pd.vis_window_start = NULL;
        p.vis_sink_end = p.vis_window_start = NULL; p.q_pos = NULL;
    }
    p.cap_page_ids = 2;  /* res has 2 pages, part 2 */
    MTB(MSKV_ERROR_CAPACITY, mskv_plan_build(f.a, s, 2, &pd, &p));
    p.cap_page_ids = 16; p.cap_tokens = 3;
    MTB(MSKV_ERROR_CAPACITY, mskv_plan_build(f.a, s, 2, &pd, &p));
    p.cap_tokens = 8; p.cap_batch = 1;
    MTB(MSKV_ERROR_CAPACITY, mskv_plan_build(f.a, s, 2, &pd, &p));
    p.cap_batch = 2;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_build(f.a, s, 2, &pd, NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_alloc(f.a, 1, 1, 1, NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_alloc(NULL, 1, 1, 1, &owned));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_alloc(f.a, -1, 1, 1, &owned));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_alloc(f.a, 1, -1, 1, &owned));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_alloc(f.a, 1, 1, -1, &owned));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_validate(NULL, 24, why, sizeof why));
    mskv_plan_free(f.a, NULL);  /* harmless */
    mtb_teardown(&f);
}

TEST(bad_input_prefix_view_functions_return_their_codes_and_change_nothing) {
    mskv_prefix_view v, w;
    mskv_dense_kv kv;
    mskv_arena_desc d;
    mskv_arena *books = NULL;
    mskv_request b;
    float k[2 * 4], vv[2 * 4];
    MTB_FIXTURE(f);
    memset(&v, 0, sizeof v);
    v.request = f.ok; v.k = k; v.v = vv; v.cap_tokens = 2;   /* ok's prefix is 4 tokens */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_gather(NULL, &v));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_gather(f.a, NULL));
    MTB(MSKV_ERROR_CAPACITY, mskv_prefix_view_gather(f.a, &v));
    EXPECT_EQ_U64(0, v.epoch);
    w = v; w.group = 1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_prefix_view_gather(f.a, &w));
    w = v; w.cap_tokens = -1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_prefix_view_gather(f.a, &w));
    w = v; w.k = NULL;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_gather(f.a, &w));
    w = v; w.request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_prefix_view_gather(f.a, &w));
    w = v; w.request = f.off;
    MTB(MSKV_ERROR_OFFLOADED, mskv_prefix_view_gather(f.a, &w));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_check(NULL, &v));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_check(f.a, NULL));
    MTB(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(f.a, &v));   /* never gathered */
    w = v; w.group = -1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_prefix_view_check(f.a, &w));
    w = v; w.request = f.unknown;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_prefix_view_check(f.a, &w));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_layer(NULL, f.a, 0, &kv));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_view_layer(&v, f.a, 0, NULL));
    MTB(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_layer(&v, f.a, 0, &kv));
    w = v; w.epoch = 1; w.num_layers = 1;
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_prefix_view_layer(&w, f.a, 1, &kv));
    w.device = 1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_prefix_view_layer(&w, f.a, 0, &kv));
    /* an arena that keeps no bytes (num_layers 0) has nothing to gather */
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &books));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(books, &b));
    w = v; w.request = b;
    MTB(MSKV_ERROR_UNSUPPORTED, mskv_prefix_view_gather(books, &w));
    mskv_arena_destroy(books);
    mtb_teardown(&f);
}

TEST(bad_input_keyed_and_session_functions_return_their_codes_and_change_nothing) {
    mskv_request e;
    mskv_session ses;
    mskv_retention r;
    mskv_plan p;
    MTB_FIXTURE(f);
    memset(&r, 0, sizeof r);
    memset(&p, 0, sizeof p);
    r.chunk_size = 4; r.sink_chunks = 1; r.window_chunks = 1;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_create(NULL, 1, 4, &e));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_create(f.a, 1, 4, NULL));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_keyed_create(f.a, 1, 0, &e));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_keyed_create(f.a, 1, -4, &e));
    MTB(MSKV_ERROR_DUPLICATE, mskv_keyed_create(f.a, 77, 4, &e));
    MTB(MSKV_ERROR_DUPLICATE, mskv_keyed_create(f.a, 78, 4, &e));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_keyed_create(f.a, 79, 4, &e));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_seal(NULL, f.open));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_keyed_seal(f.a, f.stale));
    MTB(MSKV_ERROR_BAD_STATE, mskv_keyed_seal(f.a, f.ok));
    MTB(MSKV_ERROR_READ_ONLY, mskv_keyed_seal(f.a, f.sealed));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_find(NULL, 77, &e));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_find(f.a, 77, NULL));
    MTB(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(f.a, 79, &e));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_remove(NULL, 77));
    MTB(MSKV_ERROR_NOT_FOUND, mskv_keyed_remove(f.a, 79));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_offload(f.a, f.sealed));  /* keyed entries stay put */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_init(NULL, f.a, f.ok, &r));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_init(&ses, NULL, f.ok, &r));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_init(&ses, f.a, f.ok, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_session_init(&ses, f.a, f.stale, &r));
    r.chunk_size = 0;
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_session_init(&ses, f.a, f.part, &r));
    r.chunk_size = 4;
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_begin_chunk(NULL, 4));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_commit_chunk(NULL, NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_abort_chunk(NULL));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_plan(NULL, NULL, &p));
    /* a bound session on `part`, without an open chunk */
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, f.a, f.part, &r));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_session_begin_chunk(&ses, 0));
    MTB(MSKV_ERROR_NO_RESERVATION, mskv_session_commit_chunk(&ses, NULL));
    MTB(MSKV_ERROR_NO_RESERVATION, mskv_session_abort_chunk(&ses));
    MTB(MSKV_ERROR_NO_RESERVATION, mskv_session_plan(&ses, NULL, &p));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_session_begin_chunk(&ses, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 3));  /* fits in the partial page */
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_session_begin_chunk(&ses, 1));
    mtb_teardown(&f);
}
