/* The blob checksum is XXH64 (seed 0) from blob version 4 on, exactly as
   xxHash's specification gives it: the published sanity vectors, a blob
   that an independent XXH64 verifies, streamed and whole exports agreeing,
   and blobs of versions 1 to 3 (the earlier digest) still read. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"
#include "mskv_test_states.h"

static unsigned char *mbh_export(mskv_arena *a, mskv_request r, size_t *size) {
    unsigned char *b;
    if (mskv_request_export(a, r, NULL, 0, size) != MSKV_SUCCESS) return NULL;
    b = (unsigned char *)malloc(*size);
    if (b && mskv_request_export(a, r, b, *size, size) != MSKV_SUCCESS) { free(b); return NULL; }
    return b;
}

static uint64_t mbh_get64(const unsigned char *p) { uint64_t v = 0; int i; for (i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

TEST(xxh64_matches_the_published_sanity_vectors) {
    /* xxHash's sanity buffer: byte i is the top byte of PRIME32 * PRIME64^i */
    unsigned char buf[2367];
    uint64_t gen = 2654435761u;
    size_t i;
    static const struct { size_t n; uint64_t seed, want; } v[] = {
        {0, 0, 0xEF46DB3751D8E999ull}, {0, 2654435761u, 0xAC75FDA2929B17EFull}, {1, 0, 0xE934A84ADB052768ull},
        {1, 2654435761u, 0x5014607643A9B4C3ull}, {4, 0, 0x9136A0DCA57457EEull}, {14, 0, 0x8282DCC4994E35C8ull},
        {14, 2654435761u, 0xC3BD6BF63DEB6DF0ull}, {222, 0, 0xB641AE8CB691C174ull}, {222, 2654435761u, 0x20CB8AB7AE10C14Aull}};
    for (i = 0; i < sizeof buf; i++) {
        buf[i] = (unsigned char)(gen >> 56);
        gen *= 11400714785074694797ull;
    }
    for (i = 0; i < sizeof v / sizeof v[0]; i++)
        if (mskv_xxh64(buf, v[i].n, v[i].seed) != v[i].want)
            mt_fail(__FILE__, __LINE__, "XXH64 of %zu bytes, seed %llu: %016llx, wanted %016llx", v[i].n, (unsigned long long)v[i].seed,
                    (unsigned long long)mskv_xxh64(buf, v[i].n, v[i].seed), (unsigned long long)v[i].want);
    EXPECT_EQ_U64(0x44BC2CF5AD770999ull, mskv_xxh64("abc", 3, 0));
}

TEST(a_blob_ends_with_xxh64_of_everything_before_it_in_every_state) {
    int s;
    for (s = 0; s < MTS_COUNT; s++) {
        mskv_arena *a = mts_arena(64, 4, s == MTS_GROUPS ? 2 : 1);
        mskv_request r;
        mskv_blob_layout L;
        unsigned char hdr[MSKV_BLOB_HEADER_MAX], *b;
        size_t n = 0;
        ASSERT_TRUE(a != NULL);
        ASSERT_EQ(MSKV_SUCCESS, mts_build(a, (mts_state)s, 37, 5, &r));
        b = mbh_export(a, r, &n);
        ASSERT_TRUE(b != NULL);
        EXPECT_TRUE(b[8] >= 4 && b[8] <= 6);
        EXPECT_EQ_U64(mskv_xxh64(b, n - 8, 0), mbh_get64(b + n - 8));
        /* the streamed export's checksum is the same number */
        if (mskv_request_export_begin(a, r, hdr, sizeof hdr, &L) == MSKV_SUCCESS) {
            EXPECT_EQ_U64(mbh_get64(b + n - 8), L.checksum);
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_export_end(a, r));
        }
        free(b);
        mskv_arena_destroy(a);
    }
}

TEST(blobs_of_versions_1_to_3_with_the_earlier_digest_are_still_read) {
    int s;
    for (s = 0; s < MTS_COUNT; s++) {
        mskv_arena *a = mts_arena(64, 4, s == MTS_GROUPS ? 2 : 1), *b = mts_arena(64, 4, s == MTS_GROUPS ? 2 : 1);
        mskv_request r, back, bad;
        mskv_blob_layout L;
        unsigned char *blob, *old, *again;
        size_t n = 0, n2 = 0;
        ASSERT_TRUE(a && b);
        ASSERT_EQ(MSKV_SUCCESS, mts_build(a, (mts_state)s, 37, 5, &r));
        blob = mbh_export(a, r, &n);
        ASSERT_TRUE(blob != NULL);
        old = (unsigned char *)malloc(n);
        ASSERT_TRUE(old != NULL);
        memcpy(old, blob, n);
        mtu_put32(old + 8, (uint32_t)blob[8] - 3);   /* the same layout as an older library wrote it */
        mtu_put64(old + n - 8, mtu_blob_legacy_checksum(old, n - 8));
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_import(b, old, n, &back));
        again = mbh_export(b, back, &n2);
        EXPECT_TRUE(again && n2 == n && memcmp(again, blob, n) == 0);   /* exported again: the current version, XXH64 */
        free(again);
        EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(b, back));
        /* streamed too: the checksum the offer carries is the old digest */
        if (mskv_request_import_begin(b, old, n, &back, &L) == MSKV_SUCCESS) {
            mskv_blob_range *rg = (mskv_blob_range *)malloc((size_t)(L.range_count + 1) * sizeof *rg);
            int64_t k;
            ASSERT_TRUE(rg != NULL);
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_blob_ranges(b, back, 0, L.range_count, rg));
            for (k = 0; k < L.range_count; k++) memcpy(rg[k].data, old + rg[k].offset, rg[k].bytes);
            free(rg);
            EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import_commit(b, back, mskv_xxh64(old, n - 8, 0)));   /* the wrong hash for it */
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_import_commit(b, back, mbh_get64(old + n - 8)));
            EXPECT_EQ(MSKV_SUCCESS, mskv_request_remove(b, back));
        } else {
            mt_fail(__FILE__, __LINE__, "import_begin of an old-version header failed");
        }
        /* an old version signed with XXH64, or a new one with the old digest: corrupt */
        mtu_put64(old + n - 8, mskv_xxh64(old, n - 8, 0));
        EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(b, old, n, &bad));
        mtu_put64(blob + n - 8, mtu_blob_legacy_checksum(blob, n - 8));
        EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(b, blob, n, &bad));
        /* a version past 6, correctly signed: BLOB_VERSION */
        mtu_put32(blob + 8, 7);
        mtu_put64(blob + n - 8, mskv_xxh64(blob, n - 8, 0));
        EXPECT_EQ(MSKV_ERROR_BLOB_VERSION, mskv_request_import(b, blob, n, &bad));
        mtu_audit(b);
        free(old);
        free(blob);
        mskv_arena_destroy(a);
        mskv_arena_destroy(b);
    }
}
