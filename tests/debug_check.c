/* The MSKV_DEBUG build (a test program of its own: the switch is compile
   time): every arena runs every debug check, whatever its descriptor says. */
#define MSKV_DEBUG
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include <stdlib.h>
#include "mskv_test.h"
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"

/* a descriptor that asks for no debug check: page size 4, one layer, 2 x 8 f32 */
static mskv_arena *mtd_arena(void) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4; d.num_layers = 1; d.kv_heads = 2; d.head_dim = 8;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

static mskv_result mtd_grow(mskv_arena *a, mskv_request r, int64_t n) {
    mskv_segment s;
    mskv_result e;
    s.request = r; s.n_tokens = n;
    if ((e = mskv_admit(a, &s, 1)) != MSKV_SUCCESS) return e;
    return mskv_commit(a, &s, 1);
}

TEST(mskv_debug_poisons_a_freed_page_and_audits_the_bytes_without_being_asked) {
    mskv_arena *a = mtd_arena();
    mskv_request r;
    int64_t slot;
    float *k;
    char why[256];
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtd_grow(a, r, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(a, r, 0, &slot));
    k = (float *)mskv_store_pool(a, 0, 0) + slot * 16;
    k[0] = 1.0f;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 4, NULL));
    EXPECT_TRUE(k[0] != k[0]);   /* NaN */
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(a, why, sizeof why));
    k[3] = 0.0f;                 /* a write into the freed page */
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(a, why, sizeof why));
    mskv_arena_destroy(a);
}

static unsigned char *mtd_host;
static void *mtd_alloc(void *u, size_t n) { (void)u; return mtd_host = (unsigned char *)malloc(n); }
static void *mtd_realloc(void *u, void *p, size_t n) { (void)u; return realloc(p, n); }
static void mtd_free(void *u, void *p) { (void)u; free(p); }

TEST(mskv_debug_checksums_host_copies_without_being_asked) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r;
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4; d.num_layers = 1; d.kv_heads = 2; d.head_dim = 8;
    d.host_allocator.alloc = mtd_alloc; d.host_allocator.realloc = mtd_realloc; d.host_allocator.free = mtd_free;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtd_grow(a, r, 6));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    mtd_host[9] ^= 1;
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(a, r));
    mtd_host[9] ^= 1;
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    mskv_arena_destroy(a);
}
