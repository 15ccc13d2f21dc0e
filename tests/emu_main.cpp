/* The emulated-kernel test program: the harness, main(), and the tests of the
   emulation itself (fragment layouts against hand-computed products, cp.async
   timing, barriers), so a wrong emulator cannot bless a wrong kernel. */
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"
#include "emu/mskv_emu.h"

using mskv_emu::Dim3;

static mskv_u16 emm_bf(float x) { return mskv_emu::f2b(x); }

/* A[16][16] and B[16][8] with small integers (exact in bf16 and in f32 sums). */
static void emm_matrices(float A[16][16], float B[16][8], float C[16][8]) {
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) A[i][k] = (float)((i * 7 + k * 3) % 11 - 5);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = (float)((k * 5 + n * 9) % 7 - 3);
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 8; n++) C[i][n] = (float)(i - n);
}

/* Each lane builds its fragments straight from the PTX ISA's m16n8k16 layout
   (groupID = lane / 4, threadID_in_group = lane % 4), runs mma, and puts its
   four results back by the C/D layout. */
static int emm_mma_by_layout(float D[16][8]) {
    static float A[16][16], B[16][8], C[16][8];
    emm_matrices(A, B, C);
    return mskv_emu::launch(Dim3{1, 1, 1}, 32, 0, [&] {
        int l = mskv_tid(), g = l / 4, t = l % 4;
        auto pk = [](float lo, float hi) { return (mskv_u32)emm_bf(lo) | ((mskv_u32)emm_bf(hi) << 16); };
        mskv_u32 a[4] = {pk(A[g][2 * t], A[g][2 * t + 1]), pk(A[g + 8][2 * t], A[g + 8][2 * t + 1]),
                         pk(A[g][2 * t + 8], A[g][2 * t + 9]), pk(A[g + 8][2 * t + 8], A[g + 8][2 * t + 9])};
        mskv_u32 b[2] = {pk(B[2 * t][g], B[2 * t + 1][g]), pk(B[2 * t + 8][g], B[2 * t + 9][g])};
        float d[4] = {C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]};
        mskv_mma_bf16(d, a, b);
        D[g][2 * t] = d[0]; D[g][2 * t + 1] = d[1]; D[g + 8][2 * t] = d[2]; D[g + 8][2 * t + 1] = d[3];
    });
}

static int emm_product_matches(const float D[16][8]) {
    float A[16][16], B[16][8], C[16][8];
    emm_matrices(A, B, C);
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 8; n++) {
            float ref = C[i][n];
            for (int k = 0; k < 16; k++) ref += A[i][k] * B[k][n];
            if (ref != D[i][n]) return 0;
        }
    return 1;
}

TEST(emu_mma_follows_the_ptx_fragment_layout) {
    float D[16][8];
    ASSERT_TRUE(emm_mma_by_layout(D));
    EXPECT_TRUE(emm_product_matches(D));
}

TEST(emu_mma_with_swapped_fragment_rows_gives_a_wrong_product) {
    float D[16][8];
    mskv_emu::cfg().mma_swap_rows = 1;
    int ok = emm_mma_by_layout(D);
    mskv_emu::cfg().mma_swap_rows = 0;
    ASSERT_TRUE(ok);
    EXPECT_FALSE(emm_product_matches(D));
}

/* ldmatrix: A row-major and B stored as [n][k] (what .col means) in shared
   memory, fragments by ldmatrix (B of both k halves by one x4 of two n...),
   then mma: the same product. V-style B ([k][n] rows) goes through .trans. */
static int emm_mma_from_ldmatrix(float D[16][8], int b_rows_are_k) {
    static float A[16][16], B[16][8], C[16][8];
    emm_matrices(A, B, C);
    return mskv_emu::launch(Dim3{1, 1, 1}, 32, 1024, [&] {
        MSKV_SMEM(sm);
        mskv_u16 *sa = (mskv_u16 *)sm, *sb = sa + 256;
        int l = mskv_tid(), g = l / 4, t = l % 4;
        for (int i = l; i < 256; i += 32) sa[i] = emm_bf(A[i / 16][i % 16]);
        for (int i = l; i < 128; i += 32) {
            if (b_rows_are_k) sb[i] = emm_bf(B[i / 8][i % 8]);      /* [k][n]: 16 rows of 8 */
            else sb[i] = emm_bf(B[i % 16][i / 16]);                 /* [n][k]: 8 rows of 16 */
        }
        mskv_sync();
        mskv_u32 a[4], bb[4], b[2];
        mskv_ldsm_x4(a, sa + (l & 15) * 16 + (l >> 4) * 8);
        if (b_rows_are_k) {
            /* matrices: k 0-7, k 8-15 (then the same again for the unused x4 half) */
            mskv_ldsm_x4_t(bb, sb + ((l & 7) + ((l >> 3) & 1) * 8) * 8);
        } else {
            /* matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), repeated */
            mskv_ldsm_x4(bb, sb + (l & 7) * 16 + ((l >> 3) & 1) * 8);
        }
        b[0] = bb[0]; b[1] = bb[1];
        float d[4] = {C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]};
        mskv_mma_bf16(d, a, b);
        D[g][2 * t] = d[0]; D[g][2 * t + 1] = d[1]; D[g + 8][2 * t] = d[2]; D[g + 8][2 * t + 1] = d[3];
    });
}

TEST(emu_ldmatrix_gives_mma_fragments_of_row_major_tiles) {
    float D[16][8];
    ASSERT_TRUE(emm_mma_from_ldmatrix(D, 0));
    EXPECT_TRUE(emm_product_matches(D));
}

TEST(emu_ldmatrix_trans_gives_b_fragments_of_k_major_tiles) {
    float D[16][8];
    ASSERT_TRUE(emm_mma_from_ldmatrix(D, 1));
    EXPECT_TRUE(emm_product_matches(D));
    mskv_emu::cfg().ldsm_trans_off = 1;
    int ok = emm_mma_from_ldmatrix(D, 1);
    mskv_emu::cfg().ldsm_trans_off = 0;
    ASSERT_TRUE(ok);
    EXPECT_FALSE(emm_product_matches(D));
}

TEST(emu_cp_async_lands_at_wait_group_not_before) {
    static unsigned char src[64];
    int before_ok = 1, after_ok = 1, older_ok = 1;
    for (int i = 0; i < 64; i++) src[i] = (unsigned char)i;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 32, 64, [&] {
        MSKV_SMEM(sm);
        if (mskv_tid() != 0) return;
        mskv_cp_async16(sm, src, 16);
        mskv_cp_commit();
        mskv_cp_async16(sm + 16, src + 16, 16);
        mskv_cp_commit();
        if (sm[0] != 0xff) before_ok = 0;          /* not landed yet */
        mskv_cp_wait<1>();
        if (sm[5] != 5) older_ok = 0;              /* the older group landed */
        if (sm[16] != 0xff) older_ok = 0;          /* the newest did not */
        mskv_cp_wait<0>();
        if (sm[16 + 7] != 23) after_ok = 0;
    }));
    EXPECT_TRUE(before_ok);
    EXPECT_TRUE(older_ok);
    EXPECT_TRUE(after_ok);
}

TEST(emu_cp_async_zero_fills_when_the_source_size_is_zero) {
    int ok = 1;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 32, 16, [&] {
        MSKV_SMEM(sm);
        if (mskv_tid() == 0) {
            mskv_cp_async16(sm, nullptr, 0);
            mskv_cp_commit();
            mskv_cp_wait<0>();
            for (int i = 0; i < 16; i++) ok = ok && sm[i] == 0;
        }
    }));
    EXPECT_TRUE(ok);
}

TEST(emu_barrier_makes_other_threads_writes_visible) {
    int bad = 0;
    ASSERT_TRUE(mskv_emu::launch(Dim3{2, 1, 1}, 128, 512, [&] {
        MSKV_SMEM(sm);
        int *x = (int *)sm, t = mskv_tid();
        x[t] = t * 3 + mskv_bid_x();
        mskv_sync();
        if (x[127 - t] != (127 - t) * 3 + mskv_bid_x()) bad++;
    }));
    EXPECT_EQ(0, bad);
}

TEST(emu_missing_barrier_shows_stale_shared_memory) {
    int stale = 0;
    mskv_emu::cfg().skip_barrier = 7;
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 512, [&] {
        MSKV_SMEM(sm);
        int *x = (int *)sm, t = mskv_tid();
        x[t] = t;
        MSKV_SYNC_ID(7);
        mskv_shfl_xor(0.0f, 1);  /* a warp step, so the warps interleave */
        if (x[(t + 64) % 128] != (t + 64) % 128) stale++;
    });
    mskv_emu::cfg().skip_barrier = -1;
    ASSERT_TRUE(ok);
    EXPECT_GT(stale, 0);
}

TEST(emu_shfl_xor_exchanges_between_lanes) {
    int bad = 0;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 64, 0, [&] {
        int t = mskv_tid();
        for (int m = 1; m < 32; m <<= 1)
            if (mskv_shfl_xor((float)t, m) != (float)((t & ~31) | ((t & 31) ^ m))) bad++;
    }));
    EXPECT_EQ(0, bad);
}

TEST(emu_half_conversions_round_to_nearest_even) {
    /* 1 + 2^-11 is halfway between two halves: ties to even (1.0); 1 + 3*2^-11 rounds up */
    EXPECT_EQ(0x3c00, mskv_emu::f2h(1.0f + 1.0f / 2048.0f));
    EXPECT_EQ(0x3c02, mskv_emu::f2h(1.0f + 3.0f / 2048.0f));
    EXPECT_EQ(0x7c00, mskv_emu::f2h(70000.0f));
    EXPECT_EQ(0x0001, mskv_emu::f2h(5.9604645e-8f));
    EXPECT_NEAR(5.9604645e-8, mskv_emu::h2f(1), 1e-12);
    EXPECT_EQ(0x3f80, mskv_emu::f2b(1.0f + 1.0f / 256.0f));   /* tie: even */
    EXPECT_EQ(0x3f82, mskv_emu::f2b(1.0f + 3.0f / 256.0f));
    EXPECT_TRUE(std::isnan(mskv_emu::b2f(mskv_emu::f2b(NAN))));
}
