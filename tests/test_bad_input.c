/* The bad-input table: every public function of the host core with each
   invalid argument returns its specific error code, and what the call could
   have changed is unchanged. A row says which:
     MTB      the call reaches the fixture's arena: its digest before and
              after are equal and the audit passes;
     MTB_OUT  the call writes an out-parameter: the object it would have
              written is byte for byte unchanged, and the fixture's digest
              and audit as MTB;
     MTB_OUT_ONLY  no arena to check (an arena_create or cpu_create row):
              the out-parameter alone (no arena was handed out);
     MTB_CODE the call has nothing it could change (a NULL object, a const
              input): the code alone.
   Each test prints how many rows of each kind it ran. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* counts the fixture arena's allocator calls: plan_free and friends must not free what is not theirs */
static long mtb_frees;
static void *mtb_calloc(void *u, size_t n) { (void)u; return malloc(n); }
static void *mtb_crealloc(void *u, void *p, size_t n) { (void)u; return realloc(p, n); }
static void mtb_cfree(void *u, void *p) { (void)u; if (p) mtb_frees++; free(p); }

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
    d.allocator.alloc = mtb_calloc; d.allocator.realloc = mtb_crealloc; d.allocator.free = mtb_cfree;
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

static int mtb_rows_state, mtb_rows_code;

static void mtb_teardown(mtb_fx *f) {
    free(f->blob);
    free(f->foreign);
    mskv_arena_destroy(f->a);
    printf("  bad-input rows so far: %d with a check that the state is unchanged, %d checking the code only\n",
           mtb_rows_state, mtb_rows_code);
}

static void mtb_code(int line, const char *call, mskv_result want, mskv_result got) {
    if (got != want)
        mt_fail(__FILE__, line, "%s: expected %d (%s), got %d (%s)", call, (int)want, mskv_result_string(want), (int)got,
                mskv_result_string(got));
}

static void mtb_check(mskv_arena *a, int line, const char *call, mskv_result want, mskv_result got, uint64_t digest) {
    char why[256];
    mtb_code(line, call, want, got);
    if (mskv_arena_digest(a) != digest) mt_fail(__FILE__, line, "%s changed the state", call);
    why[0] = '\0';
    if (mskv_arena_audit(a, why, sizeof why) != MSKV_SUCCESS) mt_fail(__FILE__, line, "%s: audit after: %s", call, why);
    mtb_rows_state++;
}

#define MTB(want, call)                                                  \
    do {                                                                 \
        uint64_t mtb__d = mskv_arena_digest(f.a);                        \
        mskv_result mtb__e = (call);                                     \
        mtb_check(f.a, __LINE__, #call, (want), mtb__e, mtb__d);          \
    } while (0)

/* obj: what the call would have written (the caller's variable); the
   arena's digest and audit are checked too, as MTB does */
#define MTB_OUT(want, call, obj)                                         \
    do {                                                                 \
        unsigned char mtb__b[sizeof(obj)];                               \
        uint64_t mtb__d = mskv_arena_digest(f.a);                        \
        mskv_result mtb__e;                                              \
        memcpy(mtb__b, &(obj), sizeof(obj));                             \
        mtb__e = (call);                                                 \
        mtb_check(f.a, __LINE__, #call, (want), mtb__e, mtb__d);          \
        if (memcmp(mtb__b, &(obj), sizeof(obj)) != 0)                    \
            mt_fail(__FILE__, __LINE__, "%s changed %s", #call, #obj);   \
    } while (0)

/* the same with no arena to check (the descriptor rows): only *out */
#define MTB_OUT_ONLY(want, call, obj)                                    \
    do {                                                                 \
        unsigned char mtb__b[sizeof(obj)];                               \
        mskv_result mtb__e;                                              \
        memcpy(mtb__b, &(obj), sizeof(obj));                             \
        mtb__e = (call);                                                 \
        mtb_code(__LINE__, #call, (want), mtb__e);                       \
        if (memcmp(mtb__b, &(obj), sizeof(obj)) != 0)                    \
            mt_fail(__FILE__, __LINE__, "%s changed %s", #call, #obj);   \
        mtb_rows_state++;                                                \
    } while (0)

#define MTB_CODE(want, call)                                             \
    do {                                                                 \
        mtb_code(__LINE__, #call, (want), (call));                       \
        mtb_rows_code++;                                                 \
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
    memset(&st, 0xA5, sizeof st);   /* an out-parameter a failed call must not touch */
    memset(&si, 0xA5, sizeof si);
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_arena_create(NULL, &out), out);
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_arena_create(&d, NULL));
    d.num_pages = 1;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.num_pages = 8; d.page_size = 0;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.page_size = 4; d.max_requests = 65536;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.max_requests = 0; d.retire_mode = (mskv_retire_mode)7;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.retire_mode = MSKV_RETIRE_IMMEDIATE; d.num_layers = -1;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.num_layers = 1; d.kv_heads = 0; d.head_dim = 4;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.kv_heads = 1; d.dtype = (mskv_dtype)9;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &out), out);
    d.dtype = MSKV_DTYPE_F32;
    d.num_pages = 0x7FFFFFFF; d.page_size = 0x7FFFFFFF; d.kv_heads = 0x7FFFFFFF; d.head_dim = 0x7FFFFFFF;
    MTB_OUT(MSKV_ERROR_OVERFLOW, mskv_arena_create(&d, &out), out);
    EXPECT_TRUE(out == NULL);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_arena_stats_get(NULL, &st), st);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_arena_stats_get(f.a, NULL));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_arena_audit(NULL, NULL, 0));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_arena_retire(NULL, 0));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_arena_retire(f.a, mskv_arena_step(f.a) + 1));  /* a fence not reached yet */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_store_info_get(NULL, &si), si);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_store_info_get(f.a, NULL));
    EXPECT_TRUE(mskv_store_pool(NULL, 0, 0) == NULL);
    EXPECT_TRUE(mskv_store_pool(f.a, 1, 0) == NULL);
    EXPECT_EQ(0, (int)mskv_arena_step(NULL));
    EXPECT_EQ_U64(0, mskv_arena_digest(NULL));
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
    memset(&c, 0xA5, sizeof c);   /* an out-parameter a failed call must not touch */
    memset(&info, 0xA5, sizeof info);
    /* add / remove */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_add(NULL, &c), c);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_add(f.a, NULL));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_remove(NULL, f.ok));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_remove(f.a, f.stale));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_remove(f.a, f.unknown));
    /* fork */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_fork(NULL, f.ok, &c), c);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_fork(f.a, f.ok, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_fork(f.a, f.stale, &c));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_fork(f.a, f.res, &c));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_fork(f.a, f.off, &c));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_request_fork(f.a, f.part, &c));  /* the partial page needs a copy */
    /* info / pages */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_info_get(NULL, f.ok, &info), info);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_info_get(f.a, f.ok, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(f.a, f.stale, &info));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_get(f.a, f.unknown, &info));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_pages(f.a, f.ok, pages, 64, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_pages(f.a, f.stale, pages, 64, &count));
    MTB(MSKV_ERROR_CAPACITY, mskv_request_pages(f.a, f.ok, pages, 2, &count));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_pages(f.a, f.off, pages, 64, &count));
    /* pause / resume */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_pause(NULL, f.ok));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_pause(f.a, f.stale));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_resume(f.a, f.unknown));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_pause(f.a, f.res));
    MTB(MSKV_ERROR_BAD_STATE, mskv_request_resume(f.a, f.ok));           /* not paused */
    /* reserve (table capacity) */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_reserve(NULL, f.ok, 64));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_reserve(f.a, f.stale, 64));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_reserve(f.a, f.unknown, 64));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_reserve(f.a, f.ok, -1));
    MTB(MSKV_ERROR_OVERFLOW, mskv_request_reserve(f.a, f.ok, (int64_t)1 << 40));
    /* protect */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_protect_prefix(NULL, f.ok, 1));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_protect_prefix(f.a, f.stale, 1));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_protect_prefix(f.a, f.part, 6));    /* beyond committed */
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_protect_prefix(f.a, f.res, 6));     /* reserved is not committed */
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_protect_prefix(f.a, f.ok, -1));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_protect_prefix(f.a, f.off, 2));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_protect_prefix(f.a, f.sealed, 2));
    /* release */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_release_oldest(NULL, f.ok, 1, &rel), rel);
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_release_oldest(f.a, f.stale, 1, &rel));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest(f.a, f.ok, 9, &rel));  /* live is [12,20) */
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest(f.a, f.res, 6, &rel)); /* reserved tokens are not releasable */
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_release_oldest(f.a, f.ok, -1, &rel));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_release_oldest(f.a, f.off, 1, &rel));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_release_oldest(f.a, f.sealed, 4, &rel));
    /* slot */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_slot(NULL, f.ok, 0, &slot), slot);
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
    memset(&y, 0xA5, sizeof y);   /* an out-parameter a failed call must not touch */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_offload(NULL, f.ok));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_offload(f.a, f.stale));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_offload(f.a, f.res));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_offload(f.a, f.off));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_reload(NULL, f.off));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_reload(f.a, f.stale));
    MTB(MSKV_ERROR_NOT_OFFLOADED, mskv_request_reload(f.a, f.ok));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_request_reload(f.a, f.off));  /* no page is free */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_export(NULL, f.ok, NULL, 0, &size), size);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_export(f.a, f.ok, NULL, 0, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_export(f.a, f.stale, NULL, 0, &size));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_request_export(f.a, f.res, NULL, 0, &size));
    MTB(MSKV_ERROR_CAPACITY, mskv_request_export(f.a, f.ok, small, sizeof small, &size));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_import(NULL, f.blob, f.blob_size, &y), y);
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
    memset(&s, 0xA5, sizeof s);   /* an out-parameter a failed call must not touch */
    memset(&w, 0xA5, sizeof w);
    memset(&ds, 0xA5, sizeof ds);
    memset(&r, 0, sizeof r);
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_schedule_init(NULL, 10, 4, 1));
    MTB_OUT(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, -1, 4, 1), s);
    MTB_OUT(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 10, 0, 0), s);
    MTB_OUT(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 10, 4, 4), s);
    MTB_OUT(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 10, 4, -1), s);
    MTB_CODE(MSKV_SUCCESS, mskv_schedule_init(&s, 10, 4, 1));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_schedule_window(NULL, 0, &w), w);
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_schedule_window(&s, 0, NULL));
    MTB_OUT(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_window(&s, s.count, &w), w);
    MTB_OUT(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_window(&s, -1, &w), w);
    broken = s;
    broken.stride = 7;  /* a schedule not made by schedule_init */
    MTB_OUT(MSKV_ERROR_INVALID_SPEC, mskv_schedule_window(&broken, 0, &w), w);
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_schedule_decode_span(&s, 0, 1, NULL));
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_schedule_decode_span(&s, 0, -1, &ds), ds);
    MTB_OUT(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_decode_span(&s, s.count, 1, &ds), ds);
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_retention_validate(NULL, 4, why, sizeof why));
    MTB_CODE(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 4, why, sizeof why));  /* chunk_size 0 */
    r.chunk_size = 8; r.window_chunks = 2; r.sink_chunks = -1;
    MTB_CODE(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 4, why, sizeof why));
    r.sink_chunks = 1; r.window_tokens = 15;
    MTB_CODE(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 4, why, sizeof why));
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_request_set_retention(f.a, f.ok, &r));
    r.window_tokens = 16;
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_set_retention(NULL, f.ok, &r));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_set_retention(f.a, f.stale, &r));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_set_retention(f.a, f.sealed, &r));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_skipped_tokens(NULL, 100));
    {   /* the result-code form: *out is written only on success */
        int64_t skip = -7;
        MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_skipped_tokens_get(NULL, 100, &skip), skip);
        MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_skipped_tokens_get(&r, 100, NULL));
        MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_skipped_tokens_get(&r, -1, &skip), skip);
        r.chunk_size = 0;
        MTB_OUT(MSKV_ERROR_INVALID_SPEC, mskv_skipped_tokens_get(&r, 100, &skip), skip);
        EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_skipped_tokens(&r, 100));   /* the deprecated form: the code, negative */
    }
    mtb_teardown(&f);
}

TEST(bad_input_functions_without_a_result_code_take_any_argument) {
    /* no result code to check: what they return for a value out of their domain, and that they change nothing */
    mskv_arena_stats st;
    uint64_t d;
    MTB_FIXTURE(f);
    EXPECT_EQ(0, (int)mskv_dtype_size((mskv_dtype)9));
    EXPECT_EQ(0, (int)mskv_dtype_size((mskv_dtype)-1));
    EXPECT_TRUE(mskv_f16_to_f32(mskv_f32_to_f16(NAN)) != mskv_f16_to_f32(mskv_f32_to_f16(NAN)));     /* NaN stays NaN */
    EXPECT_TRUE(mskv_bf16_to_f32(mskv_f32_to_bf16(NAN)) != mskv_bf16_to_f32(mskv_f32_to_bf16(NAN)));
    EXPECT_TRUE(mskv_f16_to_f32(mskv_f32_to_f16(1e10f)) == INFINITY);                                /* overflow goes to inf */
    EXPECT_TRUE(mskv_f16_to_f32(0xFFFFu) != mskv_f16_to_f32(0xFFFFu) && mskv_bf16_to_f32(0xFFFFu) != mskv_bf16_to_f32(0xFFFFu));
    /* trim gives back the kept host buffer and nothing else */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, f.off));   /* its host copy is kept for the next offload */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(f.a, &st));
    EXPECT_LT(0, (int)st.host_spare_bytes);
    d = mskv_arena_digest(f.a);
    mskv_arena_trim(NULL);
    mskv_arena_trim(f.a);
    EXPECT_EQ_U64(d, mskv_arena_digest(f.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(f.a, &st));
    EXPECT_EQ_U64(0, st.host_spare_bytes);
    mskv_arena_destroy(NULL);   /* nothing to destroy: returns */
    mtb_teardown(&f);
}

TEST(bad_input_step_functions_return_their_codes_and_change_nothing) {
    mskv_segment s[2];
    uint64_t ended;
    MTB_FIXTURE(f);
    memset(&ended, 0xA5, sizeof ended);   /* an out-parameter a failed call must not touch */
    s[0].request = f.ok; s[0].n_tokens = 1;
    s[1] = s[0];
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_admit(NULL, s, 1));
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
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_commit(NULL, s, 1));
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
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_abort(NULL, s, 1));
    s[1].request = f.open;  /* a keyed entry is sealed, not committed */
    MTB(MSKV_ERROR_READ_ONLY, mskv_commit(f.a, s + 1, 1));
    s[1].request = f.off;
    MTB(MSKV_ERROR_OFFLOADED, mskv_publish(f.a, s + 1, 1, &ended));
    s[1].request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_publish(f.a, s + 1, 1, &ended));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_publish(NULL, NULL, 0, &ended), ended);
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
    memset(&sz, 0xA5, sizeof sz);   /* an out-parameter a failed call must not touch */
    memset(&owned, 0xA5, sizeof owned);
    memset(&pd, 0, sizeof pd);
    memset(&p, 0, sizeof p);
    p.qo_indptr = qo; p.kv_indptr = kvp; p.kv_indices = idx; p.kv_last_page_len = last; p.kv_len = kvlen;
    p.kv_pos_split = split; p.kv_pos_shift = shift; p.kv_token_indptr = tok; p.slot_mapping = slots; p.positions = pos;
    p.cap_batch = 2; p.cap_tokens = 8; p.cap_page_ids = 16;
    s[0].request = f.res; s[0].n_tokens = 3;
    s[1] = s[0];
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_plan_query(NULL, s, 1, &pd, &sz), sz);
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
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_plan_alloc(NULL, 1, 1, 1, &owned), owned);
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_alloc(f.a, -1, 1, 1, &owned));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_alloc(f.a, 1, -1, 1, &owned));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_alloc(f.a, 1, 1, -1, &owned));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_plan_validate(NULL, 24, why, sizeof why));
    {   /* plan_free frees only what plan_alloc gave: nothing for NULL or a caller-owned plan */
        long frees = mtb_frees;
        uint64_t d = mskv_arena_digest(f.a);
        mskv_plan_free(f.a, NULL);
        mskv_plan_free(f.a, &p);
        EXPECT_EQ(frees, mtb_frees);
        EXPECT_EQ_U64(d, mskv_arena_digest(f.a));
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(f.a, 1, 1, 1, &owned));
        mskv_plan_free(f.a, &owned);
        EXPECT_LT(frees, mtb_frees);   /* the counter sees a real free */
    }
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
    /* a device view's layer carries the flag that keeps it away from the CPU */
    w.device = 1;
    MTB(MSKV_SUCCESS, mskv_prefix_view_layer(&w, f.a, 0, &kv));
    EXPECT_EQ(1, kv.device);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_dense_kv_check(NULL));
    kv.request = f.stale;
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_dense_kv_check(&kv));
    kv.request = f.ok; kv.epoch = 0;
    MTB(MSKV_ERROR_STALE_VIEW, mskv_dense_kv_check(&kv));
    kv.arena = NULL;
    MTB(MSKV_SUCCESS, mskv_dense_kv_check(&kv));   /* no arena: no check */
    {
        int32_t pages[4], n = -7;
        int64_t tokens = -7;
        uint64_t epoch = 7;
        MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_pages_get(NULL, f.ok, 0, pages, 4, &n, &tokens, &epoch));
        MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_pages_get(f.a, f.ok, 0, NULL, 4, &n, &tokens, &epoch));
        MTB(MSKV_ERROR_NULL_POINTER, mskv_prefix_pages_get(f.a, f.ok, 0, pages, 4, NULL, &tokens, &epoch));
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_prefix_pages_get(f.a, f.ok, 0, pages, -1, &n, &tokens, &epoch));
        MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_prefix_pages_get(f.a, f.ok, 1, pages, 4, &n, &tokens, &epoch));
        MTB(MSKV_ERROR_INVALID_HANDLE, mskv_prefix_pages_get(f.a, f.stale, 0, pages, 4, &n, &tokens, &epoch));
        MTB(MSKV_ERROR_OFFLOADED, mskv_prefix_pages_get(f.a, f.off, 0, pages, 4, &n, &tokens, &epoch));
        EXPECT_EQ(-7, n);
        /* too small: the count, nothing else */
        MTB(MSKV_ERROR_CAPACITY, mskv_prefix_pages_get(f.a, f.ok, 0, NULL, 0, &n, &tokens, &epoch));
        EXPECT_GT(n, 0);
        EXPECT_EQ(-7, (int)tokens);
        EXPECT_EQ_U64(7, epoch);
        MTB(MSKV_SUCCESS, mskv_prefix_pages_get(f.a, f.ok, 0, pages, 4, &n, &tokens, &epoch));
        EXPECT_EQ(4, (int)tokens);   /* ok's prefix */
        EXPECT_NE_U64(0, epoch);
    }
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
    memset(&e, 0xA5, sizeof e);   /* an out-parameter a failed call must not touch */
    memset(&ses, 0xA5, sizeof ses);
    memset(&r, 0, sizeof r);
    memset(&p, 0, sizeof p);
    r.chunk_size = 4; r.sink_chunks = 1; r.window_chunks = 1;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_keyed_create(NULL, 1, 4, &e), e);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_create(f.a, 1, 4, NULL));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_keyed_create(f.a, 1, 0, &e));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_keyed_create(f.a, 1, -4, &e));
    MTB(MSKV_ERROR_DUPLICATE, mskv_keyed_create(f.a, 77, 4, &e));
    MTB(MSKV_ERROR_DUPLICATE, mskv_keyed_create(f.a, 78, 4, &e));
    MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_keyed_create(f.a, 79, 4, &e));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_keyed_seal(NULL, f.open));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_keyed_seal(f.a, f.stale));
    MTB(MSKV_ERROR_BAD_STATE, mskv_keyed_seal(f.a, f.ok));
    MTB(MSKV_ERROR_READ_ONLY, mskv_keyed_seal(f.a, f.sealed));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_keyed_find(NULL, 77, &e), e);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_keyed_find(f.a, 77, NULL));
    MTB(MSKV_ERROR_NOT_FOUND, mskv_keyed_find(f.a, 79, &e));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_keyed_remove(NULL, 77));
    MTB(MSKV_ERROR_NOT_FOUND, mskv_keyed_remove(f.a, 79));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_offload(f.a, f.sealed));  /* keyed entries stay put */
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_init(NULL, f.a, f.ok, &r));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_session_init(&ses, NULL, f.ok, &r), ses);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_session_init(&ses, f.a, f.ok, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_session_init(&ses, f.a, f.stale, &r));
    r.chunk_size = 0;
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_session_init(&ses, f.a, f.part, &r));
    r.chunk_size = 4;
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_session_begin_chunk(NULL, 4));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_session_commit_chunk(NULL, NULL));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_session_abort_chunk(NULL));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_session_plan(NULL, NULL, &p), p);
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

/* ---- every descriptor field ------------------------------------------------------ */

static mskv_store_ops mtb_ops_missing_copy;  /* read and write set, copy_page NULL */
static mskv_result mtb_rw(void *u, const int32_t *p, int32_t n, void *d) { (void)u; (void)p; (void)n; (void)d; return MSKV_SUCCESS; }
static mskv_result mtb_wr(void *u, const int32_t *p, int32_t n, const void *s) { (void)u; (void)p; (void)n; (void)s; return MSKV_SUCCESS; }
static mskv_result mtb_cp(void *u, int32_t a, int32_t b) { (void)u; (void)a; (void)b; return MSKV_SUCCESS; }

TEST(bad_input_every_arena_descriptor_field_is_checked_on_its_own) {
    /* one invalid field at a time over an otherwise valid descriptor: no arena is handed out */
    mskv_arena_desc ok, d;
    mskv_arena *out = NULL;
    int i;
    memset(&ok, 0, sizeof ok);
    ok.num_pages = 8; ok.page_size = 4; ok.num_layers = 1; ok.kv_heads = 1; ok.head_dim = 4;
    mtb_ops_missing_copy.read_pages = mtb_rw;
    mtb_ops_missing_copy.write_pages = mtb_wr;
#define MTB_FIELD(want, assign) do { d = ok; assign; MTB_OUT_ONLY(want, mskv_arena_create(&d, &out), out); } while (0)
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.num_pages = 1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.num_pages = -5);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.page_size = 0);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.page_size = -3);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.max_requests = -1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.max_requests = 65536);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.num_layers = -1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.kv_heads = 0);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.kv_heads = -2);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, (d.num_layers = 0, d.kv_heads = -2));   /* checked without layers too */
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.head_dim = 0);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, (d.num_layers = 0, d.head_dim = -1));
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.dtype = (mskv_dtype)9);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.dtype = (mskv_dtype)-1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, (d.num_layers = 0, d.dtype = (mskv_dtype)9));
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.store_ops = &mtb_ops_missing_copy);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.retire_mode = (mskv_retire_mode)2);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.retire_mode = (mskv_retire_mode)-1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.num_groups = -1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.num_groups = MSKV_MAX_GROUPS + 1);
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, (d.num_layers = 0, d.num_groups = -1));    /* checked without layers too */
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.debug = MSKV_DEBUG_ALL + 1);              /* a check that does not exist */
    MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, d.debug = 0x80000000u | MSKV_DEBUG_POISON);
    for (i = 1; i < 7; i++) {   /* every partial set of the three allocator functions, for both allocators */
        MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, (d.allocator.alloc = i & 1 ? mtb_calloc : NULL,
                                                d.allocator.realloc = i & 2 ? mtb_crealloc : NULL,
                                                d.allocator.free = i & 4 ? mtb_cfree : NULL));
        MTB_FIELD(MSKV_ERROR_INVALID_ARGUMENT, (d.host_allocator.alloc = i & 1 ? mtb_calloc : NULL,
                                                d.host_allocator.realloc = i & 2 ? mtb_crealloc : NULL,
                                                d.host_allocator.free = i & 4 ? mtb_cfree : NULL));
    }
    MTB_FIELD(MSKV_ERROR_OVERFLOW, (d.num_pages = 0x7FFFFFFF, d.page_size = 0x7FFFFFFF, d.kv_heads = 0x7FFFFFFF, d.head_dim = 0x7FFFFFFF));
#undef MTB_FIELD
    /* the callbacks and their user pointers have no invalid value: any is accepted */
    d = ok;
    d.log_user = &d; d.event_user = &d;
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &out));
    mskv_arena_destroy(out);
    printf("  bad-input rows so far: %d with a check that the state is unchanged, %d checking the code only\n",
           mtb_rows_state, mtb_rows_code);
}

TEST(bad_input_plan_descriptor_fields_return_their_codes_and_change_nothing) {
    mskv_segment s[1];
    mskv_plan_desc pd;
    mskv_plan_size sz;
    int64_t dense[1];
    MTB_FIXTURE(f);
    s[0].request = f.res; s[0].n_tokens = 3;
#define MTB_PD(want, assign) do { memset(&pd, 0, sizeof pd); assign; memset(&sz, 0xA5, sizeof sz); \
        MTB(want, mskv_plan_query(f.a, s, 1, &pd, &sz)); } while (0)
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, pd.kind = -1);
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, pd.pos_mode = (mskv_pos_mode)3);
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, (pd.pos_mode = MSKV_POS_3D, pd.grid_h = 2, pd.grid_w = 0));
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, (pd.pos_mode = MSKV_POS_3D, pd.grid_h = -2, pd.grid_w = 3));
    MTB_PD(MSKV_ERROR_OVERFLOW, (pd.pos_mode = MSKV_POS_1D, pd.pos_offset = INT64_MIN));
    MTB_PD(MSKV_ERROR_OUT_OF_RANGE, (pd.pos_mode = MSKV_POS_1D, pd.pos_offset = -((int64_t)1 << 40)));
    MTB_PD(MSKV_ERROR_OUT_OF_RANGE, (pd.pos_mode = MSKV_POS_3D, pd.grid_h = 1, pd.grid_w = 1, pd.pos_offset = -((int64_t)1 << 40)));
    MTB_PD(MSKV_ERROR_INVALID_HANDLE, (pd.kind = MSKV_PLAN_CROSS, pd.cross = f.unknown));
    dense[0] = -1;
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, (pd.kind = MSKV_PLAN_DENSE, pd.dense_kv_len = dense));
    dense[0] = (int64_t)INT32_MAX + 1;
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, (pd.kind = MSKV_PLAN_DENSE, pd.dense_kv_len = dense));
    dense[0] = 2;   /* fewer keys than the segment's 3 queries */
    MTB_PD(MSKV_ERROR_OUT_OF_RANGE, (pd.kind = MSKV_PLAN_DENSE, pd.dense_kv_len = dense));
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, pd.group = 1);    /* the fixture's arena has one layer group */
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, pd.group = -1);
    MTB_PD(MSKV_ERROR_INVALID_ARGUMENT, (pd.kind = MSKV_PLAN_CROSS, pd.cross = f.sealed, pd.group = 1));
#undef MTB_PD
    mtb_teardown(&f);
}

TEST(bad_input_retention_fields_are_each_checked) {
    mskv_retention ok, r;
    char why[128];
    memset(&ok, 0, sizeof ok);
    ok.chunk_size = 8; ok.sink_chunks = 1; ok.window_chunks = 2; ok.exact = 1;
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&ok, 4, why, sizeof why));
#define MTB_RET(want, assign) do { r = ok; assign; MTB_CODE(want, mskv_retention_validate(&r, 4, why, sizeof why)); } while (0)
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.chunk_size = -8);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.chunk_size = ((int64_t)1 << 40) + 4);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.sink_chunks = -1);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.sink_chunks = ((int64_t)1 << 20) + 1);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.window_chunks = -1);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.window_chunks = ((int64_t)1 << 20) + 1);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.window_tokens = 17);
    MTB_RET(MSKV_ERROR_INVALID_SPEC, r.chunk_size = 6);                /* exact, not page-aligned */
    MTB_RET(MSKV_ERROR_INVALID_SPEC, (r.chunk_size = 2, r.sink_chunks = 1, r.window_chunks = 2)); /* the sink, 2 tokens */
    MTB_CODE(MSKV_ERROR_INVALID_ARGUMENT, mskv_retention_validate(&ok, -4, why, sizeof why));
    MTB_RET(MSKV_SUCCESS, (r.chunk_size = 6, r.exact = 0));           /* not exact: any chunk size */
    MTB_RET(MSKV_SUCCESS, r.window_chunks = 0);                       /* without reset too: only the sink is kept */
#undef MTB_RET
}

/* ---- the CPU backend --------------------------------------------------------------- */

static uint64_t mtb_pools_hash(mskv_arena *a) {
    mskv_store_info si;
    uint64_t h = 1469598103934665603ull;
    int32_t l, k;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0;
    for (l = 0; l < si.num_layers; l++)
        for (k = 0; k < 2; k++) {
            const unsigned char *p = (const unsigned char *)mskv_store_pool(a, l, k);
            for (i = 0; i < si.pool_bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
        }
    return h;
}

/* a CPU call on the fixture's arena: its code, the bookkeeping and every pool byte unchanged */
#define MTB_POOLS(want, call)                                                        \
    do {                                                                             \
        uint64_t mtb__h = mtb_pools_hash(f.a);                                       \
        MTB(want, call);                                                             \
        if (mtb_pools_hash(f.a) != mtb__h) mt_fail(__FILE__, __LINE__, "%s wrote into the pools", #call); \
    } while (0)

TEST(bad_input_cpu_backend_functions_return_their_codes_and_write_nothing) {
    mskv_segment s;
    mskv_plan_desc pd;
    mskv_plan p, bad;
    mskv_attn at, a2;
    mskv_rope rope, r2;
    mskv_pools pools;
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    int32_t qo[2], kvp[2], idx[8], last[1], kvlen[1], split[1], shift[1], pos[3 * 3];
    int64_t tok[2], slots[3], badslots[3];
    float k[3 * 4], v[3 * 4], q[3 * 4], o[3 * 4], lse[3], x[3 * 4], pool_k[4 * 4 * 4], pool_v[4 * 4 * 4];
    float oa[4], la[1], ob[4], lb[1];
    mskv_arena *bare;
    mskv_arena_desc bd;
    int i;
    MTB_FIXTURE(f);
    for (i = 0; i < 12; i++) { k[i] = v[i] = q[i] = x[i] = (float)i; o[i] = 99.0f; }
    for (i = 0; i < 3; i++) lse[i] = 99.0f;
    memset(&p, 0, sizeof p);
    p.qo_indptr = qo; p.kv_indptr = kvp; p.kv_indices = idx; p.kv_last_page_len = last; p.kv_len = kvlen;
    p.kv_pos_split = split; p.kv_pos_shift = shift; p.kv_token_indptr = tok; p.slot_mapping = slots; p.positions = pos;
    p.cap_batch = 1; p.cap_tokens = 3; p.cap_page_ids = 8;
    s.request = f.res; s.n_tokens = 3;
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, &s, 1, &pd, &p));
    memset(&at, 0, sizeof at);
    at.q_heads = 1;
    memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D;
    /* K/V write: each bad argument is refused before a byte moves */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_cpu_write_kv(NULL, 0, &p, k, v, MSKV_DTYPE_F32, NULL));
    MTB_POOLS(MSKV_ERROR_NULL_POINTER, mskv_cpu_write_kv(f.a, 0, NULL, k, v, MSKV_DTYPE_F32, NULL));
    MTB_POOLS(MSKV_ERROR_NULL_POINTER, mskv_cpu_write_kv(f.a, 0, &p, NULL, v, MSKV_DTYPE_F32, NULL));
    MTB_POOLS(MSKV_ERROR_NULL_POINTER, mskv_cpu_write_kv(f.a, 0, &p, k, NULL, MSKV_DTYPE_F32, NULL));
    MTB_POOLS(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(f.a, 1, &p, k, v, MSKV_DTYPE_F32, NULL));
    MTB_POOLS(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(f.a, -1, &p, k, v, MSKV_DTYPE_F32, NULL));
    MTB_POOLS(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv(f.a, 0, &p, k, v, (mskv_dtype)9, NULL));
    bad = p; memcpy(badslots, slots, sizeof slots); bad.slot_mapping = badslots;
    badslots[2] = 1;   /* the null page: the two good slots before it are not written either */
    MTB_POOLS(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(f.a, 0, &bad, k, v, MSKV_DTYPE_F32, NULL));
    badslots[2] = 24 * 4;   /* one past the pool */
    MTB_POOLS(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(f.a, 0, &bad, k, v, MSKV_DTYPE_F32, NULL));
    bad = p; bad.page_size = 3;
    MTB_POOLS(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv(f.a, 0, &bad, k, v, MSKV_DTYPE_F32, NULL));
    bad = p; bad.positions = NULL;
    MTB_POOLS(MSKV_ERROR_NULL_POINTER, mskv_cpu_write_kv(f.a, 0, &bad, k, v, MSKV_DTYPE_F32, &rope));
#define MTB_ROPE(want, assign) do { r2 = rope; assign; MTB_POOLS(want, mskv_cpu_write_kv(f.a, 0, &p, k, v, MSKV_DTYPE_F32, &r2)); } while (0)
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.style = (mskv_rope_style)2);
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.mode = MSKV_POS_NONE);
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.theta = -1.0f);
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.theta = NAN);
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.theta = INFINITY);
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.dims[0] = 3);                        /* odd */
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.dims[0] = 6);                        /* wider than the head */
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, r2.dims[0] = -2);
    MTB_ROPE(MSKV_ERROR_INVALID_ARGUMENT, (r2.mode = MSKV_POS_3D, r2.dims[0] = 2, r2.dims[1] = 2, r2.dims[2] = 2));
#undef MTB_ROPE
    /* attention: refused before o or lse is written */
#define MTB_ATTN(want, cpu_, arena, layer, plan, attn)                                               \
    do { MTB_OUT(want, mskv_cpu_attention(cpu_, arena, layer, plan, attn, q, o, lse), o);            \
         EXPECT_TRUE(lse[0] == 99.0f && lse[2] == 99.0f); } while (0)
    MTB_ATTN(MSKV_ERROR_NULL_POINTER, NULL, NULL, 0, &p, &at);
    MTB_ATTN(MSKV_ERROR_NULL_POINTER, NULL, f.a, 0, NULL, &at);
    MTB_ATTN(MSKV_ERROR_NULL_POINTER, NULL, f.a, 0, &p, NULL);
    MTB_ATTN(MSKV_ERROR_OUT_OF_RANGE, NULL, f.a, 1, &p, &at);
    MTB_ATTN(MSKV_ERROR_OUT_OF_RANGE, NULL, f.a, -1, &p, &at);
#define MTB_AT(want, assign) do { a2 = at; assign; MTB_ATTN(want, NULL, f.a, 0, &p, &a2); } while (0)
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.q_heads = 0);
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.q_heads = -1);
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.mask = (mskv_mask)3);
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, (a2.mask = MSKV_MASK_WINDOW, a2.window_left = -1));
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.q_dtype = (mskv_dtype)9);
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.scale = -1.0f);
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.scale = NAN);
    MTB_AT(MSKV_ERROR_INVALID_ARGUMENT, a2.scale = INFINITY);
    MTB_AT(MSKV_ERROR_OVERFLOW, a2.q_heads = 1 << 30);   /* rows = queries x q heads past int32 */
#undef MTB_AT
    bad = p; bad.kv_indptr = kvp; idx[0] = 24;   /* a page outside the pool */
    MTB_ATTN(MSKV_ERROR_OUT_OF_RANGE, NULL, f.a, 0, &bad, &at);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, &s, 1, &pd, &p));
    kvp[1] = 1000;   /* past the plan's page ids */
    MTB_ATTN(MSKV_ERROR_INVALID_ARGUMENT, NULL, f.a, 0, &p, &at);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, &s, 1, &pd, &p));
    at.mask = MSKV_MASK_CAUSAL; kvlen[0] = 2; last[0] = 2;  /* masked: more queries (3) than keys (2) */
    MTB_ATTN(MSKV_ERROR_INVALID_ARGUMENT, NULL, f.a, 0, &p, &at);
    at.mask = MSKV_MASK_NONE;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, &s, 1, &pd, &p));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention(NULL, f.a, 0, &p, &at, NULL, o, lse), o);
#undef MTB_ATTN
    /* bytes that live elsewhere (store_ops): the CPU backend has no pools to read or write */
    memset(&bd, 0, sizeof bd);
    bd.num_pages = 24; bd.page_size = 4; bd.num_layers = 1; bd.kv_heads = 1; bd.head_dim = 4;
    mtb_ops_missing_copy.read_pages = mtb_rw;
    mtb_ops_missing_copy.write_pages = mtb_wr;
    mtb_ops_missing_copy.copy_page = mtb_cp;
    bd.store_ops = &mtb_ops_missing_copy;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&bd, &bare));
    bad = p;
    bad.generation = 0;   /* a caller-made plan: not another arena's (that would be STALE_PLAN) */
    MTB_OUT(MSKV_ERROR_UNSUPPORTED, mskv_cpu_attention(NULL, bare, 0, &bad, &at, q, o, lse), o);
    MTB_CODE(MSKV_ERROR_UNSUPPORTED, mskv_cpu_write_kv(bare, 0, &bad, k, v, MSKV_DTYPE_F32, NULL));
    mtb_ops_missing_copy.copy_page = NULL;
    mskv_arena_destroy(bare);
    /* raw pools: every field of mskv_pools */
    memset(pool_k, 0, sizeof pool_k); memset(pool_v, 0, sizeof pool_v);
#define MTB_POOL(want, assign) do { memset(&pools, 0, sizeof pools); pools.k = pool_k; pools.v = pool_v; \
        pools.num_pages = 4; pools.page_size = 4; pools.kv_heads = 1; pools.head_dim = 4; assign;          \
        MTB_OUT(want, mskv_cpu_attention_pools(NULL, &pools, &p, &at, q, o, lse), o);                       \
        MTB_OUT(want, mskv_cpu_write_kv_pools(&pools, &p, k, v, MSKV_DTYPE_F32, NULL), pool_k); } while (0)
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.dtype = (mskv_dtype)7);
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.num_pages = 0);
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.page_size = 0);
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.page_size = 3);   /* not the plan's */
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.kv_heads = 0);
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.head_dim = 0);
    MTB_POOL(MSKV_ERROR_INVALID_ARGUMENT, pools.head_dim = MSKV_CPU_MAX_HEAD_DIM + 1);
#undef MTB_POOL
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention_pools(NULL, NULL, &p, &at, q, o, lse));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_cpu_write_kv_pools(NULL, &p, k, v, MSKV_DTYPE_F32, NULL));
    /* RoPE, merge */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_rope_apply(NULL, x, MSKV_DTYPE_F32, 3, 1, 4, pos), x);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&rope, x, MSKV_DTYPE_F32, -1, 1, 4, pos), x);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&rope, x, MSKV_DTYPE_F32, 3, 0, 4, pos), x);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&rope, x, (mskv_dtype)5, 3, 1, 4, pos), x);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&rope, x, MSKV_DTYPE_F32, 3, 1, MSKV_CPU_MAX_HEAD_DIM + 2, pos), x);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_rope_apply(&rope, x, MSKV_DTYPE_F32, 3, 1, 4, NULL), x);
    for (i = 0; i < 4; i++) { oa[i] = ob[i] = 1.0f; }
    la[0] = lb[0] = 0.0f;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_merge(-1, 1, 4, oa, la, ob, lb, oa, la), oa);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_merge(1, 0, 4, oa, la, ob, lb, oa, la), oa);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_merge(1, 1, 0, oa, la, ob, lb, oa, la), oa);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_cpu_merge(1, 1, 4, oa, la, NULL, lb, oa, la), oa);
    MTB_OUT(MSKV_ERROR_OVERFLOW, mskv_cpu_merge(INT64_MAX / 2, 4, 4, oa, la, ob, lb, oa, la), oa);
    /* mskv_cpu_desc: every field */
    memset(&cd, 0, sizeof cd);
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_cpu_create(&cd, NULL));
#define MTB_CD(want, assign) do { memset(&cd, 0, sizeof cd); assign; MTB_OUT(want, mskv_cpu_create(&cd, &cpu), cpu); } while (0)
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.num_threads = -1);
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.num_threads = 1025);
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.workspace_bytes = 1024);   /* below the smallest tiles */
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.allocator.alloc = mtb_calloc);
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.allocator.free = mtb_cfree);
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.isa = (mskv_cpu_isa)-1);
    MTB_CD(MSKV_ERROR_INVALID_ARGUMENT, cd.isa = (mskv_cpu_isa)(MSKV_CPU_ISA_AMX_BF16 + 1));  /* past the last path */
    {   /* a path this build or CPU lacks (x86 has no NEON; arm64 no AVX2) */
        mskv_cpu_isa missing = MSKV_CPU_ISA_AUTO;
        int k;
        for (k = MSKV_CPU_ISA_PORTABLE; k <= MSKV_CPU_ISA_AMX_BF16 && missing == MSKV_CPU_ISA_AUTO; k++)
            if (!mskv_cpu_isa_available((mskv_cpu_isa)k)) missing = (mskv_cpu_isa)k;
        if (missing != MSKV_CPU_ISA_AUTO) MTB_CD(MSKV_ERROR_UNSUPPORTED, cd.isa = missing);
        else mt_fail(__FILE__, __LINE__, "every instruction-set path is available: no row for UNSUPPORTED");
    }
#undef MTB_CD
    {   /* mskv_cpu_info_get: a pool to read, and where to write */
        mskv_cpu_info ci;
        memset(&cd, 0, sizeof cd);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &cpu));
        memset(&ci, 0xA5, sizeof ci);
        MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_cpu_info_get(NULL, &ci), ci);
        MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_cpu_info_get(cpu, NULL));
        mskv_cpu_destroy(cpu);
        cpu = NULL;
        /* the names and availability of paths take any value */
        EXPECT_TRUE(mskv_cpu_isa_name((mskv_cpu_isa)-7) != NULL && mskv_cpu_isa_name((mskv_cpu_isa)99) != NULL);
        EXPECT_FALSE(mskv_cpu_isa_available((mskv_cpu_isa)99));
        EXPECT_FALSE(mskv_cpu_isa_available((mskv_cpu_isa)-1));
    }
    mtb_teardown(&f);
}

/* ---- layer groups, lockstep groups, preemption ----------------------------------- */

/* An arena of `groups` layer groups: one layer of 2 heads x 8 f32. */
static mskv_arena *mtb_groups_arena(int32_t num_pages, int32_t groups) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = 4; d.num_groups = groups;
    d.num_layers = 1; d.kv_heads = 2; d.head_dim = 8; d.dtype = MSKV_DTYPE_F32;
    d.allocator.alloc = mtb_calloc; d.allocator.realloc = mtb_crealloc; d.allocator.free = mtb_cfree;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

TEST(bad_input_layer_group_calls_return_their_codes_and_change_nothing) {
    struct { mskv_arena *a; } f;
    mskv_request r, off, stale, unknown, keyed;
    mskv_request_info info;
    mskv_retention ret;
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    mskv_plan_size sz;
    int32_t pages[16], count = 0;
    int64_t slot = 0, rel = 0, need = 0;
    f.a = mtb_groups_arena(32, 2);
    ASSERT_TRUE(f.a != NULL);
    unknown.id = 0xFFFFFFFFu;
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 4; ret.sink_chunks = 1; ret.window_chunks = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, r, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &off));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, off, 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(f.a, off));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(f.a, 7, 4, &keyed));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(f.a, keyed));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(f.a, 1, 16, 16, &plan));
    memset(&info, 0xA5, sizeof info);   /* out-parameters a failed call must not touch */
    memset(&sz, 0xA5, sizeof sz);
    /* info */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_info_in_group(NULL, r, 0, &info), info);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_info_in_group(f.a, r, 0, NULL));
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_info_in_group(f.a, r, -1, &info), info);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_info_in_group(f.a, r, 2, &info), info);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_in_group(f.a, stale, 1, &info), info);
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_info_in_group(f.a, unknown, 1, &info));
    /* pages */
    count = -7;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_pages_in_group(NULL, r, 1, pages, 16, &count), count);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_pages_in_group(f.a, r, 1, pages, 16, NULL));
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_pages_in_group(f.a, r, 2, pages, 16, &count), count);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_request_pages_in_group(f.a, stale, 1, pages, 16, &count), count);
    MTB_OUT(MSKV_ERROR_OFFLOADED, mskv_request_pages_in_group(f.a, off, 1, pages, 16, &count), count);
    MTB(MSKV_ERROR_CAPACITY, mskv_request_pages_in_group(f.a, r, 1, pages, 1, &count));
    EXPECT_EQ(3, count);   /* the size it needs, even when the buffer is too small */
    /* slot */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_slot_in_group(NULL, r, 1, 0, &slot), slot);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_request_slot_in_group(f.a, r, 1, 0, NULL));
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_slot_in_group(f.a, r, -1, 0, &slot), slot);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_slot_in_group(f.a, r, 1, -1, &slot), slot);
    MTB_OUT(MSKV_ERROR_NOT_WRITTEN, mskv_request_slot_in_group(f.a, r, 1, 10, &slot), slot);
    MTB_OUT(MSKV_ERROR_OFFLOADED, mskv_request_slot_in_group(f.a, off, 1, 0, &slot), slot);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_request_slot_in_group(f.a, stale, 1, 0, &slot), slot);
    /* protect */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_protect_prefix_in_group(NULL, r, 1, 2));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_protect_prefix_in_group(f.a, r, 2, 2));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_protect_prefix_in_group(f.a, r, 1, -1));
    MTB(MSKV_ERROR_OUT_OF_RANGE, mskv_request_protect_prefix_in_group(f.a, r, 1, 11));
    MTB(MSKV_ERROR_OFFLOADED, mskv_request_protect_prefix_in_group(f.a, off, 1, 1));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_protect_prefix_in_group(f.a, keyed, 1, 1));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_protect_prefix_in_group(f.a, stale, 1, 1));
    /* release */
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_request_release_oldest_in_group(NULL, r, 1, 4, &rel), rel);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_release_oldest_in_group(f.a, r, 2, 4, &rel), rel);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_release_oldest_in_group(f.a, r, 1, -4, &rel), rel);
    MTB_OUT(MSKV_ERROR_OUT_OF_RANGE, mskv_request_release_oldest_in_group(f.a, r, 1, 11, &rel), rel);
    MTB_OUT(MSKV_ERROR_OFFLOADED, mskv_request_release_oldest_in_group(f.a, off, 1, 1, &rel), rel);
    MTB_OUT(MSKV_ERROR_READ_ONLY, mskv_request_release_oldest_in_group(f.a, keyed, 1, 1, &rel), rel);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_request_release_oldest_in_group(f.a, stale, 1, 1, &rel), rel);
    /* retention */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_request_set_retention_in_group(NULL, r, 1, &ret));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_set_retention_in_group(f.a, r, 2, &ret));
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_request_set_retention_in_group(f.a, r, -1, NULL));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_request_set_retention_in_group(f.a, stale, 1, &ret));
    MTB(MSKV_ERROR_READ_ONLY, mskv_request_set_retention_in_group(f.a, keyed, 1, &ret));
    ret.chunk_size = 0;
    MTB(MSKV_ERROR_INVALID_SPEC, mskv_request_set_retention_in_group(f.a, r, 1, &ret));
    /* admit_query */
    seg.request = r; seg.n_tokens = 4;
    need = -7;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_admit_query(NULL, &seg, 1, &need), need);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_admit_query(f.a, &seg, 1, NULL));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_admit_query(f.a, NULL, 1, &need), need);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_admit_query(f.a, &seg, -1, &need), need);
    seg.request = off;
    MTB_OUT(MSKV_ERROR_OFFLOADED, mskv_admit_query(f.a, &seg, 1, &need), need);
    seg.request = keyed;
    MTB_OUT(MSKV_ERROR_READ_ONLY, mskv_admit_query(f.a, &seg, 1, &need), need);
    seg.request = stale;
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_admit_query(f.a, &seg, 1, &need), need);
    seg.request = r; seg.n_tokens = -1;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_admit_query(f.a, &seg, 1, &need), need);
    seg.n_tokens = (int64_t)INT32_MAX;
    MTB_OUT(MSKV_ERROR_OVERFLOW, mskv_admit_query(f.a, &seg, 1, &need), need);
    /* a plan of a group the arena does not have */
    seg.n_tokens = 0;
    memset(&pd, 0, sizeof pd);
    pd.group = 2;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, &seg, 1, &pd, &plan));
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_query(f.a, &seg, 1, &pd, &sz), sz);
    pd.group = -1;
    MTB(MSKV_ERROR_INVALID_ARGUMENT, mskv_plan_build(f.a, &seg, 1, &pd, &plan));
    mskv_plan_free(f.a, &plan);
    mskv_arena_destroy(f.a);
    printf("  bad-input rows so far: %d with a check that the state is unchanged, %d checking the code only\n",
           mtb_rows_state, mtb_rows_code);
}

TEST(bad_input_lockstep_calls_return_their_codes_and_change_nothing) {
    struct { mskv_arena *a; } f;
    mskv_request br[2], free1, res, off, stale, keyed, d1, d2, m[MSKV_MAX_LOCKSTEP + 1];
    mskv_lockstep ls, out, dead, unknown;
    mskv_segment segs[4], s1;
    mskv_request got[4];
    int32_t n = 0, i;
    int64_t rel = 0;
    /* pages: the pair 2 + 1, res 1, the entry 1; 1 + 2 + 1 + 3 + 3 in all */
    f.a = mtb_groups_arena(10, 1);
    ASSERT_TRUE(f.a != NULL);
    unknown.id = 0xFFFFFFFFu;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &br[0]));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, br[0], 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &br[1]));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, br[1], 3));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(f.a, br, 2, &ls));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &free1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &res));
    s1.request = res; s1.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(f.a, &s1, 1));                       /* 1 page, open */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &off));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, off, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(f.a, off));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(f.a, 5, 4, &keyed));          /* 1 page */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &d1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &d2));
    m[0] = d1; m[1] = d2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_create(f.a, m, 2, &dead));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_dissolve(f.a, dead));
    memset(&out, 0xA5, sizeof out);   /* out-parameters a failed call must not touch */
    memset(got, 0xA5, sizeof got);
    /* create */
    m[0] = free1; m[1] = res;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_create(NULL, m, 2, &out), out);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_create(f.a, NULL, 2, &out), out);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_lockstep_create(f.a, m, 2, NULL));
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_create(f.a, m, 1, &out), out);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_create(f.a, m, -2, &out), out);
    for (i = 0; i <= MSKV_MAX_LOCKSTEP; i++) m[i] = free1;
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_create(f.a, m, MSKV_MAX_LOCKSTEP + 1, &out), out);
    MTB_OUT(MSKV_ERROR_DUPLICATE, mskv_lockstep_create(f.a, m, 2, &out), out);
    m[1] = stale;
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_create(f.a, m, 2, &out), out);
    m[1] = res;
    MTB_OUT(MSKV_ERROR_RESERVATION_PENDING, mskv_lockstep_create(f.a, m, 2, &out), out);
    m[1] = keyed;
    MTB_OUT(MSKV_ERROR_READ_ONLY, mskv_lockstep_create(f.a, m, 2, &out), out);
    m[1] = br[0];
    MTB_OUT(MSKV_ERROR_BAD_STATE, mskv_lockstep_create(f.a, m, 2, &out), out);   /* already a member */
    m[1] = off;
    MTB_OUT(MSKV_ERROR_BAD_STATE, mskv_lockstep_create(f.a, m, 2, &out), out);   /* resident with offloaded */
    /* dissolve, members, segments */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_lockstep_dissolve(NULL, ls));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(f.a, dead));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_dissolve(f.a, unknown));
    n = -7;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_members(NULL, ls, got, 4, &n), n);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_lockstep_members(f.a, ls, got, 4, NULL));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_members(f.a, ls, NULL, 4, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_members(f.a, ls, got, -1, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_members(f.a, dead, got, 4, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_members(f.a, unknown, got, 4, &n), got);
    MTB_OUT(MSKV_ERROR_CAPACITY, mskv_lockstep_members(f.a, ls, got, 1, &n), got);   /* no member written */
    EXPECT_EQ(2, n);   /* the size it needs, even when the buffer is too small */
    n = -7;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_segments(NULL, ls, 4, segs, 4, &n), n);
    MTB(MSKV_ERROR_NULL_POINTER, mskv_lockstep_segments(f.a, ls, 4, segs, 4, NULL));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_segments(f.a, ls, 4, NULL, 4, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_segments(f.a, ls, -1, segs, 4, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_segments(f.a, ls, 4, segs, -1, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_segments(f.a, dead, 4, segs, 4, &n), n);
    memset(segs, 0xA5, sizeof segs);
    MTB_OUT(MSKV_ERROR_CAPACITY, mskv_lockstep_segments(f.a, ls, 4, segs, 1, &n), segs);
    /* offload, reload, remove, release */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_lockstep_offload(NULL, ls));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_offload(f.a, dead));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_lockstep_reload(NULL, ls));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_reload(f.a, unknown));
    MTB(MSKV_ERROR_NOT_OFFLOADED, mskv_lockstep_reload(f.a, ls));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_lockstep_remove(NULL, ls));
    MTB(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_remove(f.a, dead));
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_lockstep_release_oldest(NULL, ls, 0, 1, &rel), rel);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_release_oldest(f.a, ls, 1, 1, &rel), rel);   /* one group */
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_lockstep_release_oldest(f.a, ls, 0, -1, &rel), rel);
    MTB_OUT(MSKV_ERROR_OUT_OF_RANGE, mskv_lockstep_release_oldest(f.a, ls, 0, 4, &rel), rel);      /* the second has 3 */
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_lockstep_release_oldest(f.a, dead, 0, 1, &rel), rel);
    /* members refuse the single-request calls that move or free their pages */
    MTB(MSKV_ERROR_BAD_STATE, mskv_request_remove(f.a, br[1]));
    MTB(MSKV_ERROR_BAD_STATE, mskv_request_offload(f.a, br[0]));
    MTB_OUT(MSKV_ERROR_BAD_STATE, mskv_request_release_oldest(f.a, br[0], 4, &rel), rel);
    s1.request = br[1]; s1.n_tokens = 1;   /* a batch with one member of the two */
    MTB(MSKV_ERROR_BAD_STATE, mskv_admit(f.a, &s1, 1));
    MTB(MSKV_ERROR_BAD_STATE, mskv_publish(f.a, &s1, 1, NULL));
    /* offload with a member's reservation open, then commit and abort of half the group */
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_segments(f.a, ls, 1, segs, 4, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(f.a, segs, n));
    MTB(MSKV_ERROR_RESERVATION_PENDING, mskv_lockstep_offload(f.a, ls));
    MTB(MSKV_ERROR_BAD_STATE, mskv_commit(f.a, segs + 1, 1));
    MTB(MSKV_ERROR_BAD_STATE, mskv_abort(f.a, segs, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(f.a, segs, n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_lockstep_offload(f.a, ls));
    MTB(MSKV_ERROR_OFFLOADED, mskv_lockstep_offload(f.a, ls));
    MTB_OUT(MSKV_ERROR_OFFLOADED, mskv_lockstep_release_oldest(f.a, ls, 0, 0, &rel), rel);
    MTB(MSKV_ERROR_BAD_STATE, mskv_request_reload(f.a, br[0]));   /* a member comes back with its group */
    {   /* the group's 3 pages with 2 free: neither member comes back */
        mskv_arena_stats st;
        mskv_request hog;
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(f.a, &st));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &hog));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, hog, 4 * (int64_t)(st.free_pages - 2)));
        MTB(MSKV_ERROR_OUT_OF_PAGES, mskv_lockstep_reload(f.a, ls));
    }
    mskv_arena_destroy(f.a);
    printf("  bad-input rows so far: %d with a check that the state is unchanged, %d checking the code only\n",
           mtb_rows_state, mtb_rows_code);
}

/* a store whose flush fails: mskv_arena_flush passes its error on */
static mskv_result mtb_flush_fails(void *u) { (void)u; return MSKV_ERROR_CUDA; }

TEST(bad_input_make_room_reset_flush_and_checks_return_their_codes_and_change_nothing) {
    struct { mskv_arena *a; } f;
    mskv_request r[2], stale, parked[2];
    mskv_segment seg[2];
    mskv_store_ops ops;
    mskv_arena_desc bd;
    mskv_arena *failing;
    mskv_plan p;
    mskv_plan_desc pd;
    int32_t n = 0, i;
    char why[64];
    f.a = mtb_groups_arena(1 + 4 + 1, 1);   /* two requests of 2 pages each, one page free */
    ASSERT_TRUE(f.a != NULL);
    for (i = 0; i < 2; i++) {   /* request 0 admitted first: the least recently admitted */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &r[i]));
        ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, r[i], 8));
        ASSERT_EQ(MSKV_SUCCESS, mskv_publish(f.a, NULL, 0, NULL));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &stale));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, stale));
    memset(parked, 0xA5, sizeof parked);
    seg[0].request = r[1]; seg[0].n_tokens = 4;
    n = -7;
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_make_room(NULL, 2, 0, seg, 1, parked, 2, &n), n);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_make_room(f.a, 2, UINT64_MAX, seg, 1, parked, 2, NULL), parked);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_make_room(f.a, 2, UINT64_MAX, NULL, 1, parked, 2, &n), n);
    MTB_OUT(MSKV_ERROR_NULL_POINTER, mskv_make_room(f.a, 2, UINT64_MAX, seg, 1, NULL, 2, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_make_room(f.a, -1, UINT64_MAX, seg, 1, parked, 2, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_make_room(f.a, 2, UINT64_MAX, seg, -1, parked, 2, &n), n);
    MTB_OUT(MSKV_ERROR_INVALID_ARGUMENT, mskv_make_room(f.a, 2, UINT64_MAX, seg, 1, parked, -1, &n), n);
    seg[1].request = stale; seg[1].n_tokens = 0;
    MTB_OUT(MSKV_ERROR_INVALID_HANDLE, mskv_make_room(f.a, 2, UINT64_MAX, seg, 2, parked, 2, &n), n);
    seg[1].request = r[1];
    MTB_OUT(MSKV_ERROR_DUPLICATE, mskv_make_room(f.a, 2, UINT64_MAX, seg, 2, parked, 2, &n), n);
    MTB_OUT(MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(f.a, 6, UINT64_MAX, seg, 1, parked, 2, &n), parked);  /* more than the arena has */
    MTB_OUT(MSKV_ERROR_OUT_OF_PAGES, mskv_make_room(f.a, 3, 0, seg, 1, parked, 2, &n), n);                  /* no host budget */
    MTB(MSKV_ERROR_CAPACITY, mskv_make_room(f.a, 3, UINT64_MAX, seg, 1, NULL, 0, &n));
    EXPECT_EQ(1, n);   /* how many it would park */
    MTB(MSKV_SUCCESS, mskv_make_room(f.a, 1, 0, seg, 1, NULL, 0, &n));                                       /* room already */
    EXPECT_EQ(0, n);
    /* reset, flush, the audits, the stale-plan check */
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_arena_reset(NULL));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_arena_flush(NULL));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_arena_audit_bytes(NULL, why, sizeof why));
    MTB(MSKV_ERROR_UNSUPPORTED, mskv_arena_audit_bytes(f.a, why, sizeof why));   /* no debug check runs: nothing to compare */
    memset(&pd, 0, sizeof pd);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(f.a, 1, 4, 4, &p));
    seg[0].n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(f.a, seg, 1, &pd, &p));
    MTB_CODE(MSKV_ERROR_NULL_POINTER, mskv_plan_check(NULL, &p));
    MTB(MSKV_ERROR_NULL_POINTER, mskv_plan_check(f.a, NULL));
    MTB(MSKV_SUCCESS, mskv_plan_check(f.a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(f.a, r[1], 4, NULL));
    MTB(MSKV_ERROR_STALE_PLAN, mskv_plan_check(f.a, &p));   /* a page left the plan's request */
    p.generation = ~0ull;
    MTB(MSKV_ERROR_STALE_PLAN, mskv_plan_check(f.a, &p));   /* a generation this arena never had */
    mskv_plan_free(f.a, &p);
    mskv_arena_destroy(f.a);
    /* a store that cannot wait for its work: nothing is retired */
    memset(&ops, 0, sizeof ops);
    ops.read_pages = mtb_rw; ops.write_pages = mtb_wr; ops.copy_page = mtb_cp; ops.flush = mtb_flush_fails;
    memset(&bd, 0, sizeof bd);
    bd.num_pages = 8; bd.page_size = 4; bd.num_layers = 1; bd.kv_heads = 1; bd.head_dim = 4;
    bd.store_ops = &ops; bd.retire_mode = MSKV_RETIRE_FENCED;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&bd, &failing));
    f.a = failing;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &r[0]));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, r[0], 5));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(f.a, r[0]));   /* 2 pages pending */
    MTB(MSKV_ERROR_CUDA, mskv_arena_flush(f.a));
    mskv_arena_destroy(failing);
    printf("  bad-input rows so far: %d with a check that the state is unchanged, %d checking the code only\n",
           mtb_rows_state, mtb_rows_code);
}

/* ---- allocation failure ----------------------------------------------------------- */

static int mtb_refuse;   /* the next allocations of the failing arena are refused */
static void *mtb_falloc(void *u, size_t n) { (void)u; return mtb_refuse ? NULL : malloc(n); }
static void *mtb_frealloc(void *u, void *p, size_t n) { (void)u; return mtb_refuse ? NULL : realloc(p, n); }
static void mtb_ffree(void *u, void *p) { (void)u; free(p); }

TEST(bad_input_allocation_failure_is_OUT_OF_MEMORY_and_changes_nothing) {
    struct { mskv_arena *a; } f;
    mskv_arena_desc d;
    mskv_arena *out = NULL;
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    mskv_request r, c, y;
    mskv_segment s;
    mskv_plan plan;
    unsigned char *blob;
    size_t size = 0;
    memset(&d, 0, sizeof d);
    d.num_pages = 256; d.page_size = 4; d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4;
    d.allocator.alloc = mtb_falloc; d.allocator.realloc = mtb_frealloc; d.allocator.free = mtb_ffree;
    mtb_refuse = 1;
    MTB_OUT_ONLY(MSKV_ERROR_OUT_OF_MEMORY, mskv_arena_create(&d, &out), out);
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2; cd.allocator = d.allocator;
    MTB_OUT_ONLY(MSKV_ERROR_OUT_OF_MEMORY, mskv_cpu_create(&cd, &cpu), cpu);
    mtb_refuse = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &f.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(f.a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(f.a, r, 6));
    blob = mtb_export(f.a, r, &size);
    ASSERT_TRUE(blob != NULL);
    mtb_refuse = 1;
    MTB(MSKV_ERROR_OUT_OF_MEMORY, mskv_request_reserve(f.a, r, 4000));       /* the page table cannot grow */
    s.request = r; s.n_tokens = 400;
    MTB(MSKV_ERROR_OUT_OF_MEMORY, mskv_admit(f.a, &s, 1));
    MTB(MSKV_ERROR_OUT_OF_MEMORY, mskv_request_fork(f.a, r, &c));
    MTB(MSKV_ERROR_OUT_OF_MEMORY, mskv_request_offload(f.a, r));              /* the host copy */
    MTB(MSKV_ERROR_OUT_OF_MEMORY, mskv_request_import(f.a, blob, size, &y));
    MTB(MSKV_ERROR_OUT_OF_MEMORY, mskv_keyed_create(f.a, 9, 200, &y));
    memset(&plan, 0xA5, sizeof plan);
    MTB_OUT(MSKV_ERROR_OUT_OF_MEMORY, mskv_plan_alloc(f.a, 2, 16, 16, &plan), plan);
    mtb_refuse = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(f.a, r));   /* with memory, the same calls succeed */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(f.a, blob, size, &y));
    free(blob);
    mskv_arena_destroy(f.a);
    printf("  bad-input rows so far: %d with a check that the state is unchanged, %d checking the code only\n",
           mtb_rows_state, mtb_rows_code);
}
