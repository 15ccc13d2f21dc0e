/* The emulated kernels against the CPU backend of mstar_kv.h (the oracle):
   attention over the full sweep of page sizes x GQA groups x kv lengths x
   masks, every layout and dtype on a sample, K/V write with RoPE, RoPE, and
   the merge. Pools start as NaN everywhere, page tables are shuffled. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
#include "../mstar_kv.h"   /* implemented in emu_cuda.cpp, beside the GPU layer that needs it */
#include "../mstar_kv_cuda.h"  /* mskv_cuda_page_divisor (also implemented in emu_cuda.cpp) */
#include <algorithm>
#include <random>

namespace eor_p_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace eor_d_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}
namespace eor_p_f16_128 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 128
#include "../kernels.cu"
}
namespace eor_d_bf16_128 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 128
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}
namespace eor_rope3_f16_64 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 2
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
namespace eor_rope1i_bf16_128 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 128
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 1
#define MSKV_ROPE_D0 96
#include "../kernels.cu"
}
namespace eor_f32_64 {
#define MSKV_DTYPE 0
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}

using mskv_emu::Dim3;

typedef void (*eor_attn_fn)(const void *, const void *, const void *, const int *, const int *, const int *,
                            const int *, const int *, const int *, int, int, int, unsigned int, int, float, int, int, int, int,
                            void *, float *, float *, float *, const int *, const int *, const int *);
typedef void (*eor_merge_fn)(const float *, const float *, int, mskv_i64, mskv_i64, void *, float *);

struct eor_variant { eor_attn_fn attn; eor_merge_fn merge; mskv_dtype dtype; int d, bm, smem; const char *name; };
static const eor_variant eor_variants[] = {
    {eor_p_bf16_64::mskv_attn, eor_p_bf16_64::mskv_lse_merge, MSKV_DTYPE_BF16, 64, eor_p_bf16_64::mskv_attn_block_rows, eor_p_bf16_64::mskv_attn_smem_bytes, "prefill bf16 d64"},
    {eor_d_bf16_64::mskv_attn, eor_d_bf16_64::mskv_lse_merge, MSKV_DTYPE_BF16, 64, eor_d_bf16_64::mskv_attn_block_rows, eor_d_bf16_64::mskv_attn_smem_bytes, "decode bf16 d64"},
    {eor_p_f16_128::mskv_attn, eor_p_f16_128::mskv_lse_merge, MSKV_DTYPE_F16, 128, eor_p_f16_128::mskv_attn_block_rows, eor_p_f16_128::mskv_attn_smem_bytes, "prefill f16 d128"},
    {eor_d_bf16_128::mskv_attn, eor_d_bf16_128::mskv_lse_merge, MSKV_DTYPE_BF16, 128, eor_d_bf16_128::mskv_attn_block_rows, eor_d_bf16_128::mskv_attn_smem_bytes, "decode bf16 d128"},
};

static float eor_f(mskv_dtype t, uint16_t h) { return t == MSKV_DTYPE_F16 ? mskv_f16_to_f32(h) : mskv_bf16_to_f32(h); }
static uint16_t eor_h(mskv_dtype t, float f) { return t == MSKV_DTYPE_F16 ? mskv_f32_to_f16(f) : mskv_f32_to_bf16(f); }

struct eor_case {
    int variant = 0, page_size = 16, q_heads = 2, kv_heads = 1, window_left = 0, kv_chunk = 0;
    mskv_mask mask = MSKV_MASK_NONE;
    std::vector<int> qo, kv, split, shift;
};

/* Runs the case on the emulated kernel and on the CPU backend; returns the
   worst |o| and |lse| differences (1e9: a NaN, a missing -inf, or a failure). */
static void eor_compare(const eor_case &c, uint64_t seed, double *o_err, double *lse_err) {
    const eor_variant &v = eor_variants[c.variant];
    const int D = v.d, P = c.page_size, batch = (int)c.qo.size(), group = c.q_heads / c.kv_heads;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<int32_t> qo_indptr(1, 0), kv_indptr(1, 0), last, kv_len(c.kv.begin(), c.kv.end()),
        psplit(c.split.begin(), c.split.end()), pshift(c.shift.begin(), c.shift.end());
    int n_ids = 0, max_rows = 0, max_kv = 0;
    for (int b = 0; b < batch; b++) {
        int np = (c.kv[b] + P - 1) / P;
        qo_indptr.push_back(qo_indptr.back() + c.qo[b]);
        n_ids += np;
        kv_indptr.push_back(n_ids);
        last.push_back(np ? c.kv[b] - (np - 1) * P : 0);
        max_rows = std::max(max_rows, c.qo[b] * group);
        max_kv = std::max(max_kv, c.kv[b]);
    }
    const int total_q = qo_indptr.back(), num_pages = n_ids + 3;
    std::vector<int32_t> ids;
    for (int i = 1; i < num_pages; i++) ids.push_back(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> kv_indices(ids.begin(), ids.begin() + n_ids);
    const size_t se = (size_t)c.kv_heads * D;
    const uint16_t nan16 = v.dtype == MSKV_DTYPE_F16 ? 0x7e00 : 0x7fc0;
    std::vector<uint16_t> kp((size_t)num_pages * P * se, nan16), vp(kp), q((size_t)total_q * c.q_heads * D);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < c.kv[b]; j++) {
            size_t slot = (size_t)kv_indices[(size_t)(kv_indptr[b] + j / P)] * P + j % P;
            for (size_t e = 0; e < se; e++) {
                kp[slot * se + e] = eor_h(v.dtype, uni(rng));
                vp[slot * se + e] = eor_h(v.dtype, uni(rng));
            }
        }
    for (auto &x : q) x = eor_h(v.dtype, 2.0f * uni(rng));

    mskv_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.batch = batch; plan.total_q = total_q; plan.num_page_ids = n_ids; plan.page_size = P;
    plan.qo_indptr = qo_indptr.data(); plan.kv_indptr = kv_indptr.data(); plan.kv_indices = kv_indices.data();
    plan.kv_last_page_len = last.data(); plan.kv_len = kv_len.data();
    plan.kv_pos_split = psplit.data(); plan.kv_pos_shift = pshift.data();
    mskv_pools pools;
    pools.k = kp.data(); pools.v = vp.data(); pools.dtype = v.dtype;
    pools.num_pages = num_pages; pools.page_size = P; pools.kv_heads = c.kv_heads; pools.head_dim = D;
    mskv_attn at;
    memset(&at, 0, sizeof at);
    at.q_heads = c.q_heads; at.mask = c.mask; at.window_left = c.window_left; at.q_dtype = v.dtype;
    std::vector<uint16_t> ref_o(q.size()), o(q.size(), 0x1234);
    std::vector<float> ref_lse((size_t)total_q * c.q_heads), lse(ref_lse.size(), 12345.0f);
    *o_err = *lse_err = 1e9;
    if (mskv_cpu_attention_pools(NULL, &pools, &plan, &at, q.data(), ref_o.data(), ref_lse.data()) != MSKV_SUCCESS) return;

    const int n_splits = c.kv_chunk > 0 ? std::max(1, (max_kv + c.kv_chunk - 1) / c.kv_chunk) : 1;
    std::vector<float> o_part((size_t)n_splits * q.size()), lse_part((size_t)n_splits * ref_lse.size());
    const float scale_log2 = (1.0f / std::sqrt((float)D)) * 1.4426950408889634f;
    uint32_t magic;
    int32_t shift;
    mskv_cuda_page_divisor(P, &magic, &shift);
    int ok = mskv_emu::launch(Dim3{(max_rows + v.bm - 1) / v.bm, batch, c.kv_heads * n_splits}, 128, (size_t)v.smem, [&] {
        v.attn(q.data(), kp.data(), vp.data(), qo_indptr.data(), kv_indptr.data(), kv_indices.data(), kv_len.data(),
               psplit.data(), pshift.data(), c.q_heads, c.kv_heads, P, magic, shift, scale_log2, (int)c.mask, c.window_left,
               c.kv_chunk, n_splits, o.data(), lse.data(), o_part.data(), lse_part.data(), nullptr, nullptr, nullptr);
    });
    if (ok && n_splits > 1) {
        mskv_i64 rows = (mskv_i64)total_q * c.q_heads;
        ok = mskv_emu::launch(Dim3{(int)((rows + 3) / 4), 1, 1}, 128, 0, [&] {
            v.merge(o_part.data(), lse_part.data(), n_splits, rows, rows, o.data(), lse.data());
        });
    }
    if (!ok) { mskv_emu::clear_error(); return; }
    double oe = 0, le = 0;
    for (size_t r = 0; r < ref_lse.size(); r++) {
        if (std::isinf(ref_lse[r])) {
            if (!(std::isinf(lse[r]) && lse[r] < 0)) le = 1e9;
        } else {
            le = std::max(le, std::isfinite(lse[r]) ? (double)std::fabs(lse[r] - ref_lse[r]) : 1e9);
        }
        for (int d = 0; d < D; d++) {
            double a = eor_f(v.dtype, o[r * D + d]), b = eor_f(v.dtype, ref_o[r * D + d]);
            oe = std::max(oe, std::isfinite(a) ? std::fabs(a - b) : 1e9);
        }
    }
    *o_err = oe;
    *lse_err = le;
}

static int eor_check(const eor_case &c, uint64_t seed) {
    double oe, le, tol = eor_variants[c.variant].dtype == MSKV_DTYPE_F16 ? 4e-3 : 2.5e-2;
    eor_compare(c, seed, &oe, &le);
    if (oe <= tol && le <= 2e-3) return 1;
    mt_fail(__FILE__, __LINE__, "%s, P=%d, heads %d/%d, mask %d (window %d), chunk %d, qo %d kv %d split %d shift %d%s: o err %.3g (tol %.3g), lse err %.3g",
            eor_variants[c.variant].name, c.page_size, c.q_heads, c.kv_heads, (int)c.mask, c.window_left, c.kv_chunk,
            c.qo[0], c.kv[0], c.split[0], c.shift[0], c.qo.size() > 1 ? " (+more segments)" : "", oe, tol, le);
    return 0;
}

TEST(attn_matches_cpu_backend_over_page_sizes_gqa_lengths_and_masks) {
    const int Ps[] = {1, 3, 16, 40}, groups[] = {1, 2, 3, 4, 6, 8};
    int failures = 0;
    for (int P : Ps)
        for (int gq : groups) {
            const int lens[] = {0, 1, P - 1, P, P + 1, 100};
            for (int kv : lens) {
                if (kv < 0) continue;
                for (int m = 0; m < 3 && failures < 5; m++) {
                    eor_case c;
                    c.page_size = P; c.kv_heads = 2; c.q_heads = 2 * gq; c.mask = (mskv_mask)m;
                    c.window_left = 7;
                    int qo = std::min(kv, 5);
                    if (m == 0 && kv == 0) qo = 2;  /* no keys at all: o = 0, lse = -inf */
                    c.qo = {qo}; c.kv = {kv}; c.split = {kv / 2}; c.shift = {m ? 9 : 0};
                    failures += !eor_check(c, (uint64_t)(P * 10007 + gq * 101 + kv * 7 + m));
                }
            }
        }
    EXPECT_EQ(0, failures);
}

/* The K/V gather finds each row's page once per tile (a magic-multiply
   division, exact for every page size) from page ids loaded a tile ahead:
   358 keys end mid-tile and mid-page for every size here, pages of 1, 3 and 5
   change inside every tile, and decode (head_dim 128) runs its three-stage
   loop unrolled by stage; the split runs exercise the merge. */
TEST(attn_matches_cpu_backend_for_any_page_size_with_page_ids_fetched_ahead) {
    const int Ps[] = {1, 3, 5, 16, 64, 256}, groups[] = {1, 4, 8};
    int failures = 0, run = 0;
    for (int P : Ps)
        for (int variant = 2; variant < 4; variant++)
            for (int k = 0; k < 2 && failures < 5; k++, run++) {
                const bool decode = eor_variants[variant].bm == 16;
                const int gq = groups[run % 3];
                eor_case c;
                c.variant = variant; c.page_size = P; c.kv_heads = 2; c.q_heads = 2 * gq;
                c.mask = (mskv_mask)(run % 3);
                c.window_left = 150;
                c.kv_chunk = k ? 128 : 0;
                c.qo = {decode ? std::max(1, 16 / gq) : 40}; c.kv = {358}; c.split = {200}; c.shift = {c.mask ? 17 : 0};
                failures += !eor_check(c, (uint64_t)(P * 31 + run));
            }
    EXPECT_EQ(0, failures);
}

TEST(attn_every_layout_and_dtype_matches_cpu_backend_on_random_batches) {
    uint64_t seed = mt_seed();
    std::mt19937_64 rng(seed);
    int failures = 0;
    for (int variant = 0; variant < 4; variant++)
        for (int rep = 0; rep < 5 && failures < 5; rep++) {
            eor_case c;
            const int Ps[] = {1, 3, 16, 40}, groups[] = {1, 2, 3, 4, 6, 8};
            bool decode = eor_variants[variant].bm == 16;
            c.variant = variant;
            c.page_size = Ps[rng() % 4];
            c.kv_heads = 1 + (int)(rng() % 2);
            int gq = groups[rng() % 6];
            c.q_heads = c.kv_heads * gq;
            c.mask = (mskv_mask)(rng() % 3);
            c.window_left = (int)(rng() % 80);
            c.kv_chunk = rng() % 2 ? 64 * (1 + (int)(rng() % 2)) : 0;
            int batch = 1 + (int)(rng() % 3);
            for (int b = 0; b < batch; b++) {
                int kv = (int)(rng() % 150);
                int qmax = decode ? std::max(1, 16 / gq) : 40;
                int qo = kv ? 1 + (int)(rng() % std::min(kv, qmax)) : (c.mask ? 0 : 1);
                int split = (int)(rng() % (kv + 1));
                c.qo.push_back(qo); c.kv.push_back(kv); c.split.push_back(split); c.shift.push_back((int)(rng() % 1000));
            }
            failures += !eor_check(c, seed + (uint64_t)(variant * 100 + rep));
        }
    EXPECT_EQ(0, failures);
}

TEST(kv_write_with_3d_rope_matches_cpu_backend) {
    const int n = 9, kvh = 2, D = 64, P = 4, num_pages = 5;
    std::mt19937 rng(21);
    std::uniform_real_distribution<float> uni(-1.5f, 1.5f);
    std::vector<uint16_t> k((size_t)n * kvh * D), v(k.size());
    for (auto &x : k) x = mskv_f32_to_f16(uni(rng));
    for (auto &x : v) x = mskv_f32_to_f16(uni(rng));
    std::vector<int64_t> slots = {17, 13, -1, 8, 4, 19, 12, 5, 6};  /* page 0 (the null page) never written */
    std::vector<int32_t> pos((size_t)n * 3);
    for (auto &p : pos) p = (int)(rng() % 3000);
    std::vector<uint16_t> kg((size_t)num_pages * P * kvh * D, 0x7e00), vg(kg), kc(kg), vc(kg);
    mskv_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.total_q = n; plan.page_size = P; plan.slot_mapping = slots.data(); plan.positions = pos.data();
    mskv_pools pools = {kc.data(), vc.data(), MSKV_DTYPE_F16, num_pages, P, kvh, D};
    mskv_rope rope;
    memset(&rope, 0, sizeof rope);
    rope.style = MSKV_ROPE_HALF; rope.mode = MSKV_POS_3D;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&pools, &plan, k.data(), v.data(), MSKV_DTYPE_F16, &rope));
    ASSERT_TRUE(mskv_emu::launch(Dim3{(n * kvh + 3) / 4, 1, 1}, 128, 0, [&] {
        eor_rope3_f16_64::mskv_kv_write(k.data(), v.data(), (const mskv_i64 *)slots.data(), n, kvh, kg.data(), vg.data(),
                                        (mskv_i64)num_pages * P, pos.data(), 10000.0f);
    }));
    double err = 0;
    int v_diff = 0, nan_diff = 0;
    for (size_t i = 0; i < kg.size(); i++) {
        float a = mskv_f16_to_f32(kg[i]), b = mskv_f16_to_f32(kc[i]);
        if (std::isnan(a) != std::isnan(b)) nan_diff++;
        else if (!std::isnan(a)) err = std::max(err, (double)std::fabs(a - b));
        if (vg[i] != vc[i]) v_diff++;
    }
    EXPECT_EQ(0, nan_diff);   /* the same slots written, the skipped ones untouched */
    EXPECT_EQ(0, v_diff);
    EXPECT_NEAR(0.0, err, 2e-3);  /* one f16 step at |x| < 2 */
}

TEST(rope_kernel_matches_cpu_backend_interleaved_partial) {
    const int n = 7, heads = 3, D = 128;
    std::mt19937 rng(23);
    std::uniform_real_distribution<float> uni(-1.5f, 1.5f);
    std::vector<uint16_t> x((size_t)n * heads * D);
    for (auto &e : x) e = mskv_f32_to_bf16(uni(rng));
    std::vector<uint16_t> y(x);
    std::vector<int32_t> pos(n);
    for (auto &p : pos) p = (int)(rng() % 16384);
    mskv_rope rope;
    memset(&rope, 0, sizeof rope);
    rope.style = MSKV_ROPE_INTERLEAVED; rope.mode = MSKV_POS_1D; rope.theta = 10000.0f; rope.dims[0] = 96;
    ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&rope, x.data(), MSKV_DTYPE_BF16, n, heads, D, pos.data()));
    ASSERT_TRUE(mskv_emu::launch(Dim3{(n * heads + 3) / 4, 1, 1}, 128, 0, [&] {
        eor_rope1i_bf16_128::mskv_rope(y.data(), n, heads, pos.data(), 10000.0f);
    }));
    double err = 0;
    int tail_diff = 0;
    for (size_t i = 0; i < x.size(); i++) {
        err = std::max(err, (double)std::fabs(mskv_bf16_to_f32(x[i]) - mskv_bf16_to_f32(y[i])));
        if (i % D >= 96 && x[i] != y[i]) tail_diff++;
    }
    EXPECT_EQ(0, tail_diff);
    EXPECT_NEAR(0.0, err, 1.6e-2);  /* one bf16 step at |x| < 2 */
}

TEST(state_merge_matches_cpu_merge) {
    const int n = 5, heads = 3, D = 64;
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> oa((size_t)n * heads * D), ob(oa.size()), la((size_t)n * heads), lb(la.size());
    for (auto &e : oa) e = uni(rng);
    for (auto &e : ob) e = uni(rng);
    for (auto &e : la) e = 5.0f * uni(rng);
    for (auto &e : lb) e = 5.0f * uni(rng);
    la[2] = -INFINITY; lb[4] = -INFINITY; la[7] = lb[7] = -INFINITY;
    std::vector<float> oc(oa.size()), lc(la.size()), og(oa.size()), lg(la.size());
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_merge(n, heads, D, oa.data(), la.data(), ob.data(), lb.data(), oc.data(), lc.data()));
    ASSERT_TRUE(mskv_emu::launch(Dim3{(n * heads + 3) / 4, 1, 1}, 128, 0, [&] {
        eor_f32_64::mskv_state_merge(oa.data(), la.data(), ob.data(), lb.data(), (mskv_i64)n * heads, og.data(), lg.data());
    }));
    double err = 0;
    for (size_t i = 0; i < og.size(); i++) err = std::max(err, (double)std::fabs(og[i] - oc[i]));
    for (size_t i = 0; i < lg.size(); i++) {
        if (std::isinf(lc[i])) EXPECT_TRUE(std::isinf(lg[i]) && lg[i] < 0);
        else err = std::max(err, (double)std::fabs(lg[i] - lc[i]));
    }
    EXPECT_NEAR(0.0, err, 1e-5);
}

TEST(attn_matches_cpu_backend_at_tile_boundaries) {
    /* kv lengths one short of, at and past 16- and 64-key tiles; both layouts */
    const int lens[] = {15, 16, 17, 63, 64, 65, 127, 128, 129};
    int failures = 0;
    for (int variant = 0; variant < 2; variant++)
        for (int kv : lens)
            for (int m = 0; m < 2; m++) {
                eor_case c;
                c.variant = variant; c.page_size = 16; c.kv_heads = 1; c.q_heads = 2; c.mask = (mskv_mask)m;
                c.qo = {variant ? 4 : std::min(kv, 70)}; c.kv = {kv}; c.split = {kv}; c.shift = {0};
                failures += !eor_check(c, (uint64_t)(kv * 4 + m + 77 * variant));
            }
    EXPECT_EQ(0, failures);
}

TEST(attn_window_wider_than_a_tile_matches_cpu_backend) {
    /* windows of 70 and 130 keys let whole 64-key tiles be visible to some rows and not others */
    const int windows[] = {70, 130};
    int failures = 0;
    for (int w : windows)
        for (int variant = 0; variant < 2; variant++) {
            eor_case c;
            c.variant = variant; c.page_size = 16; c.kv_heads = 1; c.q_heads = 1; c.mask = MSKV_MASK_WINDOW;
            c.window_left = w;
            c.qo = {variant ? 16 : 120}; c.kv = {300}; c.split = {150}; c.shift = {5};
            failures += !eor_check(c, (uint64_t)(w + variant));
        }
    EXPECT_EQ(0, failures);
}
