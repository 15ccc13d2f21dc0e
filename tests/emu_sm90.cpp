/* Tests of the Hopper part of the emulation (tests/emu/mskv_emu_sm90.h), so
   a wrong emulator cannot bless a wrong kernel: wgmma against products
   computed here, with operands laid out in shared memory by hand-derived
   formulas of each canonical layout (the swizzle as an XOR of address bits,
   written out per mode rather than through the emulator's own address
   function); mbarrier phases; bulk tensor copies and their swizzle; the
   proxy, ordering and deadlock checks; setmaxnreg; named barriers. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
#include <algorithm>
#include <vector>

using mskv_emu::Dim3;

/* ---- operands ------------------------------------------------------------------- */

/* A[64][16], B[n][16] (B as N x K), C[64][n]: small integers, exact in 16-bit types and f32 sums */
struct esm_mats {
    int n;
    std::vector<float> A, B, C;
    explicit esm_mats(int n_) : n(n_), A(64 * 16), B((size_t)n_ * 16), C((size_t)64 * n_) {
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < 16; k++) A[(size_t)m * 16 + k] = (float)((m * 7 + k * 3) % 11 - 5);
        for (int j = 0; j < n; j++)
            for (int k = 0; k < 16; k++) B[(size_t)j * 16 + k] = (float)((j * 5 + k * 9 + j / 8) % 7 - 3);
        for (int m = 0; m < 64; m++)
            for (int j = 0; j < n; j++) C[(size_t)m * n + j] = (float)((m - j) % 5);
    }
    float ref(int m, int j, bool acc) const {
        float r = acc ? C[(size_t)m * n + j] : 0.0f;
        for (int k = 0; k < 16; k++) r += A[(size_t)m * 16 + k] * B[(size_t)j * 16 + k];
        return r;
    }
};

static mskv_u16 esm_h(float x, int bf16) { return bf16 ? mskv_emu::f2b(x) : mskv_emu::f2h(x); }

/* Byte offset of element (mn, k) of a 16-wide-K operand, for a tile whose
   swizzle pattern starts on a 1024-byte boundary. sw: 0 none, 32, 64, 128. */
static size_t esm_kmajor(int sw, int mn, int k, int lbo, int sbo) {
    const int c = k / 8, e = k % 8;
    switch (sw) {
    case 128: return (size_t)((mn / 8) * sbo + (mn % 8) * 128 + ((c ^ (mn % 8)) * 16) + e * 2);        /* bits 4-6 ^= 7-9 */
    case 64: return (size_t)((mn / 8) * sbo + (mn % 8) * 64 + ((c ^ ((mn >> 1) & 3)) * 16) + e * 2);   /* bits 4-5 ^= 7-8 */
    case 32: return (size_t)((mn / 8) * sbo + (mn % 8) * 32 + ((c ^ ((mn >> 2) & 1)) * 16) + e * 2);   /* bit 4 ^= bit 7 */
    default: return (size_t)((mn / 8) * sbo + c * lbo + (mn % 8) * 16 + e * 2);                        /* 8x16 B core matrices */
    }
}
/* MN-major: the M/N index contiguous; atoms of W bytes of MN by 8 k rows. */
static size_t esm_mnmajor(int sw, int mn, int k, int lbo, int sbo) {
    const int e = mn % 8;
    switch (sw) {
    case 128: return (size_t)((mn / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + ((((mn % 64) / 8) ^ (k % 8)) * 16) + e * 2);
    case 64: return (size_t)((mn / 32) * lbo + (k / 8) * sbo + (k % 8) * 64 + ((((mn % 32) / 8) ^ ((k >> 1) & 3)) * 16) + e * 2);
    case 32: return (size_t)((mn / 16) * lbo + (k / 8) * sbo + (k % 8) * 32 + ((((mn % 16) / 8) ^ ((k >> 2) & 1)) * 16) + e * 2);
    default: return (size_t)((mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + e * 2);
    }
}

static mskv_u64 esm_desc(mskv_u32 addr, int lbo, int sbo, int base, int sw) {
    const mskv_u64 mode = sw == 128 ? 1 : sw == 64 ? 2 : sw == 32 ? 3 : 0;
    return (mskv_u64)((addr & 0x3ffff) >> 4) | ((mskv_u64)((unsigned)lbo >> 4) << 16) |
           ((mskv_u64)((unsigned)sbo >> 4) << 32) | ((mskv_u64)base << 49) | (mode << 62);
}

/* Every thread copies its share of img into shared memory at off with
   cp.async, waits, fences for the async proxy, and meets the block. */
static void esm_stage(const std::vector<unsigned char> &img, size_t off, int fence = 1) {
    unsigned char *s = mskv_emu::smem() + off;
    for (size_t c = 16 * (size_t)mskv_tid(); c < img.size(); c += 16 * (size_t)mskv_emu::st().nthreads)
        mskv_cp_async16(s + c, img.data() + c, 16);
    mskv_cp_commit();
    mskv_cp_wait<0>();
    if (fence) mskv_fence_proxy_async();
    mskv_sync();
}

/* The thread's A fragment (registers) for warp w's 16 rows, m16n8k16 layout. */
static void esm_a_regs(const esm_mats &M, int bf16, mskv_u32 a[4]) {
    const int t = mskv_tid() & 127, w = t >> 5, l = t & 31, g = l >> 2, c = l & 3, r = 16 * w + g;
    auto pk = [&](int m, int k) { return (mskv_u32)esm_h(M.A[(size_t)m * 16 + k], bf16) | ((mskv_u32)esm_h(M.A[(size_t)m * 16 + k + 1], bf16) << 16); };
    a[0] = pk(r, 2 * c); a[1] = pk(r + 8, 2 * c); a[2] = pk(r, 2 * c + 8); a[3] = pk(r + 8, 2 * c + 8);
}

/* accumulator element i of the thread: row 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 c + (i & 1) */
static void esm_rowcol(int i, int *row, int *col) {
    const int t = mskv_tid() & 127, w = t >> 5, l = t & 31;
    *row = 16 * w + (l >> 2) + 8 * ((i >> 1) & 1);
    *col = (i >> 2) * 8 + 2 * (l & 3) + (i & 1);
}

struct esm_op {
    int n = 64, bf16 = 1, a_regs = 0, trans_a = 0, trans_b = 0, sw_a = 128, sw_b = 128, base_b = 0;
    int lbo_a = 16, sbo_a = 1024, lbo_b = 16, sbo_b = 1024;
    size_t off_b = 0;   /* B's pattern start past the 1024-aligned region (base-offset test) */
};

/* Lays A and B out as op says, runs one wgmma (D = A B + C) on 128 threads,
   and counts elements of D that differ from the product. Returns -1 when the
   emulation refused the launch. */
static int esm_run(const esm_op &op) {
    esm_mats M(op.n);
    const size_t a_at = 0, b_at = 16384;
    std::vector<unsigned char> ia(16384, 0), ib(32768 + 4096, 0);
    for (int m = 0; m < 64; m++)
        for (int k = 0; k < 16; k++) {
            const mskv_u16 h = esm_h(M.A[(size_t)m * 16 + k], op.bf16);
            const size_t at = op.trans_a ? esm_mnmajor(op.sw_a, m, k, op.lbo_a, op.sbo_a) : esm_kmajor(op.sw_a, m, k, op.lbo_a, op.sbo_a);
            std::memcpy(&ia[at], &h, 2);
        }
    for (int j = 0; j < op.n; j++)
        for (int k = 0; k < 16; k++) {
            const mskv_u16 h = esm_h(M.B[(size_t)j * 16 + k], op.bf16);
            const size_t at = op.off_b + (op.trans_b ? esm_mnmajor(op.sw_b, j, k, op.lbo_b, op.sbo_b)
                                                     : esm_kmajor(op.sw_b, j, k, op.lbo_b, op.sbo_b));
            std::memcpy(&ib[at], &h, 2);
        }
    int bad = 0;
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 65536, [&] {
        esm_stage(ia, a_at);
        esm_stage(ib, b_at);
        const mskv_u32 sa = mskv_smem_addr(mskv_emu::smem() + a_at), sb = mskv_smem_addr(mskv_emu::smem() + b_at + op.off_b);
        float d[128];
        mskv_u32 a[4];
        for (int i = 0; i < op.n / 2; i++) {
            int r, c;
            esm_rowcol(i, &r, &c);
            d[i] = M.C[(size_t)r * op.n + c];
        }
        esm_a_regs(M, op.bf16, a);
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, op.n, op.a_regs ? a : nullptr, esm_desc(sa, op.lbo_a, op.sbo_a, 0, op.sw_a),
                        esm_desc(sb, op.lbo_b, op.sbo_b, op.base_b, op.sw_b), 1, op.trans_a, op.trans_b, op.bf16);
        mskv_wgmma_commit();
        mskv_wgmma_wait<0>();
        for (int i = 0; i < op.n / 2; i++) {
            int r, c;
            esm_rowcol(i, &r, &c);
            if (d[i] != M.ref(r, c, true)) bad++;
        }
    });
    if (!ok) { mskv_emu::clear_error(); return -1; }
    return bad;
}

/* ---- wgmma ------------------------------------------------------------------------ */

TEST(emu_wgmma_a_from_registers_follows_the_fragment_layout) {
    esm_op op;
    op.a_regs = 1;
    EXPECT_EQ(0, esm_run(op));
    op.bf16 = 0;
    op.n = 128;
    EXPECT_EQ(0, esm_run(op));
}

TEST(emu_wgmma_k_major_descriptors_in_every_swizzle_mode) {
    const int sws[4] = {0, 32, 64, 128};
    for (int sa : sws)
        for (int sb : sws) {
            esm_op op;
            op.sw_a = sa; op.sw_b = sb;
            /* dense atoms: 8 rows of W bytes; no swizzle: the two K halves far apart (LBO) */
            op.sbo_a = sa ? 8 * sa : 128; op.lbo_a = sa ? 16 : 64 / 8 * 128;
            op.sbo_b = sb ? 8 * sb : 256; op.lbo_b = sb ? 16 : 128;
            EXPECT_EQ(0, esm_run(op));
        }
}

TEST(emu_wgmma_n_major_b_in_every_swizzle_mode) {
    const int sws[4] = {0, 32, 64, 128};
    for (int sb : sws) {
        esm_op op;
        op.n = 128; op.a_regs = 1; op.trans_b = 1; op.sw_b = sb;
        if (sb) { op.sbo_b = 8 * sb; op.lbo_b = 16 * sb; }   /* atoms along N after the two 8-row k groups */
        else { op.sbo_b = 128; op.lbo_b = 128 / 8 * 128; }  /* 16-byte columns of 8 k rows, then the next 8 k */
        EXPECT_EQ(0, esm_run(op));
    }
}

TEST(emu_wgmma_m_major_a_from_a_descriptor) {
    esm_op op;
    op.trans_a = 1; op.sw_a = 128; op.sbo_a = 1024; op.lbo_a = 2048;
    EXPECT_EQ(0, esm_run(op));
}

TEST(emu_wgmma_descriptor_base_offset_locates_a_pattern_that_starts_off_its_boundary) {
    /* B's 128-byte pattern starts 256 bytes past a 1024-byte boundary: base offset (start >> 7) & 7 */
    esm_op op;
    op.off_b = 256;
    op.base_b = 0;
    EXPECT_GT(esm_run(op), 0);
    op.base_b = 2;
    EXPECT_EQ(0, esm_run(op));
}

TEST(emu_wgmma_descriptor_with_a_wrong_swizzle_mode_reads_a_wrong_matrix) {
    esm_op op;
    mskv_emu::cfg().wgmma_swizzle_override = 2;   /* 64 B where the data has 128 B */
    int bad = esm_run(op);
    mskv_emu::cfg().wgmma_swizzle_override = -1;
    EXPECT_GT(bad, 0);
}

/* Issues one wgmma accumulating into d (C = 0); body(d) runs between the
   commit and the final wait. Returns whether the launch succeeded. */
template <class F> static int esm_one(int fence, F body) {
    esm_mats M(64);
    std::vector<unsigned char> ib(8192, 0);
    for (int j = 0; j < 64; j++)
        for (int k = 0; k < 16; k++) {
            mskv_u16 h = esm_h(M.B[(size_t)j * 16 + k], 1);
            std::memcpy(&ib[esm_kmajor(128, j, k, 16, 1024)], &h, 2);
        }
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 16384, [&] {
        esm_stage(ib, 0);
        float d[32];
        mskv_u32 a[4];
        for (int i = 0; i < 32; i++) d[i] = 0.0f;
        esm_a_regs(M, 1, a);
        if (fence) mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(mskv_smem_addr(mskv_emu::smem()), 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
        body(d, a);
        mskv_wgmma_wait<0>();
    });
    if (!ok) mskv_emu::clear_error();
    return ok;
}

TEST(emu_wgmma_accumulators_read_before_wait_group_are_nan) {
    int nan_before = 0, nan_after = 0;
    ASSERT_TRUE(esm_one(1, [&](float *d, mskv_u32 *) {
        for (int i = 0; i < 32; i++) nan_before += std::isnan(d[i]) ? 1 : 0;
    }));
    EXPECT_EQ(128 * 32, nan_before);
    ASSERT_TRUE(esm_one(1, [&](float *d, mskv_u32 *) {
        mskv_wgmma_wait<0>();
        for (int i = 0; i < 32; i++) nan_after += std::isnan(d[i]) ? 1 : 0;
    }));
    EXPECT_EQ(0, nan_after);
}

TEST(emu_wgmma_wait_group_n_retires_all_but_the_newest_n_groups) {
    esm_mats M(64);
    std::vector<unsigned char> ib(8192, 0);
    for (int j = 0; j < 64; j++)
        for (int k = 0; k < 16; k++) {
            mskv_u16 h = esm_h(M.B[(size_t)j * 16 + k], 1);
            std::memcpy(&ib[esm_kmajor(128, j, k, 16, 1024)], &h, 2);
        }
    int first_ready = 1, second_pending = 1, chained_ok = 1;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 128, 16384, [&] {
        esm_stage(ib, 0);
        float d0[32], d1[32];
        mskv_u32 a[4];
        const mskv_u64 db = esm_desc(mskv_smem_addr(mskv_emu::smem()), 16, 1024, 0, 128);
        esm_a_regs(M, 1, a);
        mskv_wgmma_fence();
        mskv_emu::wgmma(d0, 64, a, 0, db, 0, 0, 0, 1);
        mskv_wgmma_commit();
        mskv_emu::wgmma(d1, 64, a, 0, db, 0, 0, 0, 1);
        mskv_emu::wgmma(d1, 64, a, 0, db, 1, 0, 0, 1);   /* chained: d1 = 2 A B, no wait between */
        mskv_wgmma_commit();
        mskv_wgmma_wait<1>();
        for (int i = 0; i < 32; i++) {
            int r, c;
            esm_rowcol(i, &r, &c);
            if (d0[i] != M.ref(r, c, false)) first_ready = 0;
            if (!std::isnan(d1[i])) second_pending = 0;
        }
        mskv_wgmma_wait<0>();
        for (int i = 0; i < 32; i++) {
            int r, c;
            esm_rowcol(i, &r, &c);
            if (d1[i] != 2.0f * M.ref(r, c, false)) chained_ok = 0;
        }
    }));
    EXPECT_TRUE(first_ready);
    EXPECT_TRUE(second_pending);
    EXPECT_TRUE(chained_ok);
}

TEST(emu_wgmma_without_a_fence_is_an_error) {
    EXPECT_FALSE(esm_one(0, [](float *, mskv_u32 *) {}));
}

TEST(emu_wgmma_a_registers_changed_in_flight_is_an_error) {
    EXPECT_FALSE(esm_one(1, [](float *, mskv_u32 *a) { a[0] ^= 1; }));
}

TEST(emu_wgmma_accumulators_written_in_flight_is_an_error) {
    EXPECT_FALSE(esm_one(1, [](float *d, mskv_u32 *) { d[3] = 1.0f; }));
}

TEST(emu_thread_exiting_with_wgmma_in_flight_is_an_error) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 16384, [&] {
        std::vector<unsigned char> z(8192, 0);
        esm_stage(z, 0);
        float d[32];
        mskv_u32 a[4] = {0, 0, 0, 0};
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(mskv_smem_addr(mskv_emu::smem()), 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("in flight") != std::string::npos);
    mskv_emu::clear_error();
}

/* cp.async data read by wgmma: fine after the writer's fence.proxy.async, an error without */
static int esm_proxy(int fence) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 16384, [&] {
        std::vector<unsigned char> z(8192, 0);
        esm_stage(z, 0, fence);
        float d[32];
        mskv_u32 a[4] = {0, 0, 0, 0};
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(mskv_smem_addr(mskv_emu::smem()), 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
        mskv_wgmma_wait<0>();
    });
    return ok;
}

TEST(emu_generic_writes_read_by_wgmma_need_fence_proxy_async) {
    EXPECT_TRUE(esm_proxy(1));
    EXPECT_FALSE(esm_proxy(0));
    EXPECT_TRUE(mskv_emu::error().find("fence.proxy.async") != std::string::npos);
    mskv_emu::clear_error();
}

TEST(emu_wgmma_reading_shared_memory_nothing_wrote_is_an_error) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 16384, [&] {
        float d[32];
        mskv_u32 a[4] = {0, 0, 0, 0};
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(mskv_smem_addr(mskv_emu::smem()), 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
        mskv_wgmma_wait<0>();
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("nothing has written") != std::string::npos);
    mskv_emu::clear_error();
}

/* ---- mbarrier ---------------------------------------------------------------------- */

TEST(emu_mbarrier_phase_completes_after_its_arrivals_and_bytes) {
    int states[4] = {-1, -1, -1, -1};
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 32, 64, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem());
        if (mskv_tid() != 0) return;
        mskv_mbar_init(bar, 2);
        mskv_mbar_init_fence();
        mskv_mbar_arrive_tx(bar, 64);                 /* 1 of 2 arrivals, 64 bytes expected */
        states[0] = mskv_emu::sm90().bars[bar].phase;
        mskv_mbar_arrive(bar);                         /* arrivals done, bytes not */
        states[1] = mskv_emu::sm90().bars[bar].phase;
        mskv_emu::mbar_complete_tx(bar, 64);
        states[2] = mskv_emu::sm90().bars[bar].phase;  /* phase 0 complete */
        states[3] = mskv_emu::sm90().bars[bar].pending; /* re-armed with the expected count */
    }));
    EXPECT_EQ(0, states[0]);
    EXPECT_EQ(0, states[1]);
    EXPECT_EQ(1, states[2]);
    EXPECT_EQ(2, states[3]);
}

TEST(emu_mbarrier_parity_wait_passes_only_for_a_completed_phase) {
    int fresh_odd = 0, fresh_even = 1, done_even = 0, done_odd = 1;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 32, 64, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem());
        if (mskv_tid() != 0) return;
        mskv_mbar_init(bar, 1);
        fresh_odd = mskv_mbar_try_wait(bar, 1);    /* "the phase before the first": complete */
        fresh_even = mskv_mbar_try_wait(bar, 0);   /* phase 0: not yet */
        mskv_mbar_arrive(bar);
        done_even = mskv_mbar_try_wait(bar, 0);
        done_odd = mskv_mbar_try_wait(bar, 1);     /* phase 1 is the current one */
    }));
    EXPECT_TRUE(fresh_odd);
    EXPECT_FALSE(fresh_even);
    EXPECT_TRUE(done_even);
    EXPECT_FALSE(done_odd);
}

TEST(emu_mbarrier_wait_for_a_phase_that_never_completes_is_reported_as_a_deadlock) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 64, 64, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem());
        if (mskv_tid() == 0) mskv_mbar_init(bar, 1);
        mskv_sync();
        while (!mskv_mbar_try_wait(bar, 0)) {}          /* nobody arrives */
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("deadlock") != std::string::npos);
    EXPECT_TRUE(mskv_emu::error().find("mbarrier") != std::string::npos);
    EXPECT_TRUE(mskv_emu::error().find("threads 0-63") != std::string::npos);
    mskv_emu::clear_error();
}

TEST(emu_mbarrier_arrival_past_the_expected_count_is_an_error) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 32, 64, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem());
        if (mskv_tid() != 0) return;
        mskv_mbar_init(bar, 1);
        mskv_mbar_init_fence();
        mskv_mbar_arrive_tx(bar, 32);   /* phase waits for 32 bytes */
        mskv_mbar_arrive(bar);          /* a second arrival in the same phase */
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("more arrivals") != std::string::npos);
    mskv_emu::clear_error();
}

/* ---- bulk tensor copies -------------------------------------------------------------- */

/* a 2-D bf16 tensor [rows][cols] with a row pitch of pitch elements */
static std::vector<mskv_u16> esm_tensor(int rows, int pitch) {
    std::vector<mskv_u16> t((size_t)rows * pitch);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < pitch; c++) t[(size_t)r * pitch + c] = (mskv_u16)(r * 256 + c);
    return t;
}

static int esm_map2d(mskv_tmap *map, std::vector<mskv_u16> &t, int rows, int cols, int pitch, int box_c, int box_r, int swz) {
    const mskv_u64 dims[2] = {(mskv_u64)cols, (mskv_u64)rows}, strides[1] = {(mskv_u64)pitch * 2};
    const mskv_u32 box[2] = {(mskv_u32)box_c, (mskv_u32)box_r}, es[2] = {1, 1};
    return mskv_emu::tmap_encode(map, 9, 2, t.data(), dims, strides, box, es, 0, swz, 0, 0);
}

TEST(emu_tensor_map_encode_refuses_what_the_driver_refuses) {
    std::vector<mskv_u16> t = esm_tensor(16, 128);
    alignas(64) mskv_tmap map;
    EXPECT_EQ(0, esm_map2d(&map, t, 16, 128, 128, 64, 8, 3));
    EXPECT_NE(0, esm_map2d(&map, t, 16, 128, 128, 72, 8, 3));    /* 144-byte inner box > 128-byte swizzle span */
    EXPECT_NE(0, esm_map2d(&map, t, 16, 128, 128, 64, 300, 3));  /* box past 256 */
    EXPECT_NE(0, esm_map2d(&map, t, 16, 128, 100, 64, 8, 0));    /* row pitch 200 bytes: not a multiple of 16 */
    EXPECT_NE(0, esm_map2d(&map, t, 16, 128, 64, 64, 8, 0));     /* pitch below one row */
    EXPECT_NE(0, esm_map2d(&map, t, 16, 128, 128, 4, 8, 0));     /* 8-byte inner box */
    {
        unsigned char raw[256];
        mskv_tmap *odd = (mskv_tmap *)(void *)(((uintptr_t)raw + 63) / 64 * 64 + 8);
        EXPECT_NE(0, esm_map2d(odd, t, 16, 128, 128, 64, 8, 0));  /* map not 64-byte aligned */
    }
}

/* Copies the box at (c0, r0) of t into shared memory and returns the bytes there. */
static int esm_tma(std::vector<mskv_u16> &t, int rows, int cols, int box_c, int box_r, int swz, int c0, int r0,
                   std::vector<mskv_u16> &out, int *landed_before_wait = nullptr) {
    alignas(64) mskv_tmap map;
    if (esm_map2d(&map, t, rows, cols, cols, box_c, box_r, swz) != 0) return 0;
    const size_t bytes = (size_t)box_c * box_r * 2;
    out.assign(bytes / 2, 0);
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 32, 1024 + bytes, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem()), dst = bar + 1024;
        if (mskv_tid() != 0) return;
        mskv_mbar_init(bar, 1);
        mskv_mbar_init_fence();
        mskv_mbar_arrive_tx(bar, (mskv_u32)bytes);
        const int c[2] = {c0, r0};
        mskv_emu::tma_load(dst, &map, c, 2, bar);
        if (landed_before_wait) *landed_before_wait = mskv_emu::sptr(dst)[0] != 0xff || mskv_emu::sptr(dst)[1] != 0xff;
        while (!mskv_mbar_try_wait(bar, 0)) {}
        std::memcpy(out.data(), mskv_emu::sptr(dst), bytes);
    });
    if (!ok) mskv_emu::clear_error();
    return ok;
}

TEST(emu_tma_copies_a_box_and_zero_fills_past_the_tensor) {
    std::vector<mskv_u16> t = esm_tensor(20, 64), out;
    int bad = 0;
    ASSERT_TRUE(esm_tma(t, 20, 64, 32, 8, 0, 16, 15, out));   /* rows 15..22 of 20: three past the end */
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 32; c++) {
            mskv_u16 want = 15 + r < 20 ? (mskv_u16)((15 + r) * 256 + 16 + c) : 0;
            bad += out[(size_t)r * 32 + c] != want;
        }
    EXPECT_EQ(0, bad);
}

TEST(emu_tma_swizzle_moves_16_byte_chunks_by_the_row_bits_of_the_address) {
    /* 128 B: chunk c of row r at c ^ (r & 7); 64 B: rows of 64 B, c ^ ((r >> 1) & 3); 32 B: c ^ ((r >> 2) & 1) */
    const int swz[3] = {3, 2, 1}, row_bytes[3] = {128, 64, 32};
    for (int m = 0; m < 3; m++) {
        const int cols = row_bytes[m] / 2, chunks = row_bytes[m] / 16;
        std::vector<mskv_u16> t = esm_tensor(16, cols), out;
        int bad = 0;
        ASSERT_TRUE(esm_tma(t, 16, cols, cols, 16, swz[m], 0, 0, out));
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < chunks; c++) {
                const int bits = m == 0 ? (r & 7) : m == 1 ? ((r >> 1) & 3) : ((r >> 2) & 1);
                for (int e = 0; e < 8; e++)
                    bad += out[(size_t)r * cols + (size_t)((c ^ bits) * 8 + e)] != t[(size_t)r * cols + (size_t)(c * 8 + e)];
            }
        EXPECT_EQ(0, bad);
    }
}

TEST(emu_tma_lands_when_a_wait_needs_it_not_at_issue) {
    std::vector<mskv_u16> t = esm_tensor(8, 64), out;
    int early = -1;
    ASSERT_TRUE(esm_tma(t, 8, 64, 64, 8, 3, 0, 0, out, &early));
    EXPECT_EQ(0, early);
    EXPECT_EQ(t[0], out[0]);
    mskv_emu::cfg().tma_eager = 1;
    ASSERT_TRUE(esm_tma(t, 8, 64, 64, 8, 3, 0, 0, out, &early));
    mskv_emu::cfg().tma_eager = 0;
    EXPECT_EQ(1, early);
}

TEST(emu_tma_on_an_mbarrier_whose_init_was_not_fenced_is_an_error) {
    std::vector<mskv_u16> t = esm_tensor(8, 64);
    alignas(64) mskv_tmap map;
    ASSERT_EQ(0, esm_map2d(&map, t, 8, 64, 64, 64, 8, 3));
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 32, 2048, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem());
        if (mskv_tid() != 0) return;
        mskv_mbar_init(bar, 1);
        mskv_mbar_arrive_tx(bar, 1024);
        const int c[2] = {0, 0};
        mskv_emu::tma_load(bar + 1024, &map, c, 2, bar);
        while (!mskv_mbar_try_wait(bar, 0)) {}
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("not fenced") != std::string::npos);
    mskv_emu::clear_error();
}

/* A swizzled TMA tile is what a 128-byte swizzle descriptor reads: B
   [64][64] row-major in global memory, the 16 k of each row at column k0. */
TEST(emu_tma_128b_tile_is_read_right_by_a_128b_k_major_descriptor) {
    esm_mats M(64);
    std::vector<mskv_u16> g((size_t)64 * 64, 0);
    const int k0 = 16;   /* the second 32 bytes of each 128-byte row: descriptor start + 32 */
    for (int j = 0; j < 64; j++)
        for (int k = 0; k < 16; k++) g[(size_t)j * 64 + k0 + k] = esm_h(M.B[(size_t)j * 16 + k], 1);
    alignas(64) mskv_tmap map;
    ASSERT_EQ(0, esm_map2d(&map, g, 64, 64, 64, 64, 64, 3));
    int bad = 0;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 128, 2048 + 8192, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem()), tile = bar + 2048;
        if (mskv_tid() == 0) {
            mskv_mbar_init(bar, 1);
            mskv_mbar_init_fence();
            mskv_mbar_arrive_tx(bar, 8192);
            const int c[2] = {0, 0};
            mskv_emu::tma_load(tile, &map, c, 2, bar);
        }
        mskv_sync();
        while (!mskv_mbar_try_wait(bar, 0)) {}
        float d[32];
        mskv_u32 a[4];
        esm_a_regs(M, 1, a);
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(tile + 2 * k0, 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
        mskv_wgmma_wait<0>();
        for (int i = 0; i < 32; i++) {
            int r, c;
            esm_rowcol(i, &r, &c);
            bad += d[i] != M.ref(r, c, false);
        }
    }));
    EXPECT_EQ(0, bad);
}

TEST(emu_wgmma_reading_a_tile_a_copy_still_writes_is_an_error) {
    std::vector<mskv_u16> g((size_t)64 * 64, 0);
    alignas(64) mskv_tmap map;
    ASSERT_EQ(0, esm_map2d(&map, g, 64, 64, 64, 64, 64, 3));
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 2048 + 8192, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem()), tile = bar + 2048;
        if (mskv_tid() == 0) {
            mskv_mbar_init(bar, 1);
            mskv_mbar_init_fence();
            mskv_mbar_arrive_tx(bar, 8192);
            const int c[2] = {0, 0};
            mskv_emu::tma_load(tile, &map, c, 2, bar);
        }
        mskv_sync();   /* no wait on the barrier */
        float d[32];
        mskv_u32 a[4] = {0, 0, 0, 0};
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(tile, 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
        mskv_wgmma_wait<0>();
        while (!mskv_mbar_try_wait(bar, 0)) {}
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("still writing") != std::string::npos);
    mskv_emu::clear_error();
}

TEST(emu_copy_into_a_tile_an_inflight_wgmma_reads_is_an_error) {
    std::vector<mskv_u16> g((size_t)64 * 64, 0);
    std::vector<unsigned char> z(8192, 0);
    alignas(64) mskv_tmap map;
    ASSERT_EQ(0, esm_map2d(&map, g, 64, 64, 64, 64, 64, 3));
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 2048 + 8192, [&] {
        const mskv_u32 bar = mskv_smem_addr(mskv_emu::smem()), tile = bar + 2048;
        if (mskv_tid() == 0) { mskv_mbar_init(bar, 1); mskv_mbar_init_fence(); }
        esm_stage(z, 2048);
        float d[32];
        mskv_u32 a[4] = {0, 0, 0, 0};
        mskv_wgmma_fence();
        mskv_emu::wgmma(d, 64, a, 0, esm_desc(tile, 16, 1024, 0, 128), 0, 0, 0, 1);
        mskv_wgmma_commit();
        if (mskv_tid() == 0) {   /* refill the tile before any thread waited for the wgmma */
            mskv_mbar_arrive_tx(bar, 8192);
            const int c[2] = {0, 0};
            mskv_emu::tma_load(tile, &map, c, 2, bar);
        }
        mskv_sync();
        mskv_wgmma_wait<0>();
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("in-flight wgmma") != std::string::npos);
    mskv_emu::clear_error();
}

/* A producer (warp 0) refills a tile that warpgroup 1's wgmma read, once the
   "empty" mbarrier completes. per_warp 0: warp 4 (the warpgroup's first)
   alone arrives after its wgmma.wait_group while warps 5-7 wait for the
   producer before theirs (the order the hardware allows when wait_group
   tracks the executing warp's groups only); per_warp 1: lane 0 of each warp
   arrives after its own wait, the barrier counting 4. Returns the launch. */
static int esm_release_run(int per_warp) {
    std::vector<mskv_u16> g((size_t)64 * 64, 0x3f80);   /* bf16 1.0 */
    std::vector<unsigned char> z(8192, 0);
    alignas(64) mskv_tmap map;
    if (esm_map2d(&map, g, 64, 64, 64, 64, 64, 3) != 0) return -1;
    return mskv_emu::launch(Dim3{1, 1, 1}, 256, 2048 + 8192, [&] {
        const mskv_u32 empty = mskv_smem_addr(mskv_emu::smem()), full = empty + 8, tile = empty + 2048;
        const int t = mskv_tid(), warp = t >> 5, lane = t & 31;
        if (t == 0) {
            mskv_mbar_init(empty, per_warp ? 4 : 1);
            mskv_mbar_init(full, 1);
            mskv_mbar_init_fence();
        }
        esm_stage(z, 2048);
        if (warp == 0) {
            if (lane == 0) {
                while (!mskv_mbar_try_wait(empty, 0)) {}
                mskv_mbar_arrive_tx(full, 8192);
                const int c[2] = {0, 0};
                mskv_emu::tma_load(tile, &map, c, 2, full);
            }
            if (!per_warp) mskv_bar_arrive(1, 128);
            if (lane == 0) while (!mskv_mbar_try_wait(full, 0)) {}
        } else if (t >= 128) {
            float d[32];
            mskv_u32 a[4] = {0, 0, 0, 0};
            mskv_wgmma_fence();
            mskv_emu::wgmma(d, 64, a, 0, esm_desc(tile, 16, 1024, 0, 128), 0, 0, 0, 1);
            mskv_wgmma_commit();
            if (!per_warp && warp > 4) mskv_bar_sync(1, 128);   /* after the producer's copy */
            mskv_wgmma_wait<0>();
            if (lane == 0 && (per_warp || warp == 4)) mskv_mbar_arrive(empty);
        }
    });
}

TEST(emu_wgmma_reads_stay_live_until_every_warp_of_the_warpgroup_has_waited) {
    /* one warp's wait does not free the warpgroup's reads: the copy is caught */
    EXPECT_FALSE(esm_release_run(0));
    EXPECT_TRUE(mskv_emu::error().find("in-flight wgmma") != std::string::npos);
    if (mskv_emu::error().find("in-flight wgmma") == std::string::npos) printf("  error: %s\n", mskv_emu::error().c_str());
    mskv_emu::clear_error();
    /* every warp arriving after its own wait hands the tile back safely */
    EXPECT_TRUE(esm_release_run(1));
    if (!mskv_emu::error().empty()) printf("  error: %s\n", mskv_emu::error().c_str());
    mskv_emu::clear_error();
}

TEST(emu_random_warp_order_is_seeded_and_changes_at_every_pass) {
    /* 8 warps; lane 0 of each logs its warp at each of 16 steps between __syncthreads */
    const unsigned long long seed = (unsigned long long)mt_seed() | 1;
    const unsigned long long before = mskv_emu::cfg().random_warps;
    auto run = [before](unsigned long long s, std::vector<int> &log) {
        log.clear();
        mskv_emu::cfg().random_warps = s;
        const int ok = mskv_emu::launch(Dim3{1, 1, 1}, 256, 0, [&] {
            for (int step = 0; step < 16; step++) {
                if ((mskv_tid() & 31) == 0) log.push_back(mskv_tid() >> 5);
                mskv_sync();
            }
        });
        mskv_emu::cfg().random_warps = before;
        return ok;
    };
    std::vector<int> a, b, fixed;
    ASSERT_TRUE(run(seed, a));
    ASSERT_TRUE(run(seed, b));
    ASSERT_TRUE(run(0, fixed));
    ASSERT_EQ(128, (int)a.size());
    EXPECT_TRUE(a == b);          /* the seed reproduces the schedule */
    int orders = 0, all_warps = 1, fixed_sorted = 1;
    std::vector<std::vector<int>> seen;
    for (int step = 0; step < 16; step++) {
        std::vector<int> o(a.begin() + 8 * step, a.begin() + 8 * step + 8), sorted = o;
        std::sort(sorted.begin(), sorted.end());
        for (int w = 0; w < 8; w++) all_warps &= sorted[(size_t)w] == w;
        if (std::find(seen.begin(), seen.end(), o) == seen.end()) { seen.push_back(o); orders++; }
        for (int w = 0; w < 8; w++) fixed_sorted &= fixed[(size_t)(8 * step + w)] == w;
    }
    EXPECT_TRUE(all_warps);       /* every warp once per step */
    EXPECT_TRUE(fixed_sorted);    /* without the mode: warp order */
    EXPECT_TRUE(orders >= 8);     /* a fresh order (almost) every pass */
    printf("  random_warps %llu: %d distinct warp orders in 16 passes\n", seed, orders);
}

/* ---- setmaxnreg, named barriers ------------------------------------------------------ */

TEST(emu_setmaxnreg_takes_a_multiple_of_8_in_24_to_256_uniform_over_the_warpgroup) {
    EXPECT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 256, 0, [] {
        if (mskv_tid() < 128) mskv_setmaxnreg_dec<40>();
        else mskv_setmaxnreg_inc<232>();
    }));
    EXPECT_FALSE(mskv_emu::launch(Dim3{1, 1, 1}, 128, 0, [] { mskv_setmaxnreg_inc<236>(); }));
    mskv_emu::clear_error();
    EXPECT_FALSE(mskv_emu::launch(Dim3{1, 1, 1}, 128, 0, [] { mskv_setmaxnreg_dec<16>(); }));
    mskv_emu::clear_error();
    EXPECT_FALSE(mskv_emu::launch(Dim3{1, 1, 1}, 128, 0, [] {
        if (mskv_tid() < 64) mskv_setmaxnreg_inc<232>();
        else mskv_setmaxnreg_inc<240>();
    }));
    EXPECT_TRUE(mskv_emu::error().find("different register counts") != std::string::npos);
    mskv_emu::clear_error();
}

TEST(emu_named_barrier_releases_after_n_threads_counting_arrives) {
    int order_ok = 1;
    ASSERT_TRUE(mskv_emu::launch(Dim3{1, 1, 1}, 256, 64, [&] {
        int *x = (int *)mskv_emu::smem();
        const int t = mskv_tid();
        if (t < 128) {   /* producers: write, then arrive without waiting */
            if (t == 0) *x = 42;
            mskv_bar_arrive(3, 256);
        } else {         /* consumers: wait for all 256 */
            mskv_bar_sync(3, 256);
            if (*x != 42) order_ok = 0;
        }
    }));
    EXPECT_TRUE(order_ok);
}

TEST(emu_named_barrier_left_with_arrivals_at_exit_is_an_error) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 64, 0, [] {
        if (mskv_tid() < 32) mskv_bar_arrive(5, 64);   /* nobody syncs */
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("named barrier 5") != std::string::npos);
    mskv_emu::clear_error();
}

TEST(emu_named_barrier_that_cannot_fill_is_reported_as_a_deadlock) {
    int ok = mskv_emu::launch(Dim3{1, 1, 1}, 128, 0, [] {
        if (mskv_tid() < 64) mskv_bar_sync(2, 128);     /* the other 64 never come */
    });
    EXPECT_FALSE(ok);
    EXPECT_TRUE(mskv_emu::error().find("deadlock") != std::string::npos);
    EXPECT_TRUE(mskv_emu::error().find("named barrier 2 (64 of 128 arrived)") != std::string::npos);
    mskv_emu::clear_error();
}
