/* The Hopper attention kernel (mskv_attn_sm90: a producer warpgroup loading
   K/V pages by TMA or cp.async into an mbarrier ring, two consumer
   warpgroups on wgmma in ping-pong) emulated on the CPU against the CPU
   backend of mstar_kv.h: the sweeps of mskv_attn (page sizes 1 to 256 on
   both load paths, GQA, masks on absolute positions, ragged batches,
   split-KV), then the planted bugs the emulation must catch. Pools start as
   NaN everywhere, page tables are shuffled. Shapes are kept small: the
   emulated kernel runs 384 fibres per block. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
#include "../mstar_kv.h"
#include <algorithm>
#include <random>

namespace eh_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace eh_f16_64 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace eh_bf16_128 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 128
#include "../kernels.cu"
}
namespace eh_f16_128 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 128
#include "../kernels.cu"
}
namespace eh_bf16_256 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 256
#include "../kernels.cu"
}
/* planted: the old stage hand-back (one arrival per consumer warpgroup, by its
   first thread, after that thread's own wgmma.wait_group; "empty" counts 2) */
namespace eh_bf16_64_leader {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_SM90_PLANT_LEADER_RELEASE 1
#include "../kernels.cu"
}

using mskv_emu::Dim3;

typedef void (*eh_attn_fn)(const mskv_tmap, const mskv_tmap, int, const void *, const void *, const void *, const int *,
                           const int *, const int *, const int *, const int *, const int *, int, int, int, float, int,
                           int, int, int, void *, float *, float *, float *, const int *, const int *, const int *);
typedef void (*eh_merge_fn)(const float *, const float *, int, mskv_i64, mskv_i64, void *, float *);

struct eh_variant { eh_attn_fn attn; eh_merge_fn merge; mskv_dtype dtype; int d, bn, smem; const char *name; };
enum { EH_BF16_64, EH_F16_64, EH_BF16_128, EH_F16_128, EH_BF16_256, EH_BF16_64_LEADER };
static const eh_variant eh_variants[] = {
    {eh_bf16_64::mskv_attn_sm90, eh_bf16_64::mskv_lse_merge, MSKV_DTYPE_BF16, 64, eh_bf16_64::mskv_attn_sm90_block_keys,
     eh_bf16_64::mskv_attn_sm90_smem_bytes, "bf16 d64"},
    {eh_f16_64::mskv_attn_sm90, eh_f16_64::mskv_lse_merge, MSKV_DTYPE_F16, 64, eh_f16_64::mskv_attn_sm90_block_keys,
     eh_f16_64::mskv_attn_sm90_smem_bytes, "f16 d64"},
    {eh_bf16_128::mskv_attn_sm90, eh_bf16_128::mskv_lse_merge, MSKV_DTYPE_BF16, 128, eh_bf16_128::mskv_attn_sm90_block_keys,
     eh_bf16_128::mskv_attn_sm90_smem_bytes, "bf16 d128"},
    {eh_f16_128::mskv_attn_sm90, eh_f16_128::mskv_lse_merge, MSKV_DTYPE_F16, 128, eh_f16_128::mskv_attn_sm90_block_keys,
     eh_f16_128::mskv_attn_sm90_smem_bytes, "f16 d128"},
    {eh_bf16_256::mskv_attn_sm90, eh_bf16_256::mskv_lse_merge, MSKV_DTYPE_BF16, 256, eh_bf16_256::mskv_attn_sm90_block_keys,
     eh_bf16_256::mskv_attn_sm90_smem_bytes, "bf16 d256"},
    {eh_bf16_64_leader::mskv_attn_sm90, eh_bf16_64_leader::mskv_lse_merge, MSKV_DTYPE_BF16, 64,
     eh_bf16_64_leader::mskv_attn_sm90_block_keys, eh_bf16_64_leader::mskv_attn_sm90_smem_bytes,
     "bf16 d64 (planted leader-only release)"},
};

static float eh_f(mskv_dtype t, uint16_t h) { return t == MSKV_DTYPE_F16 ? mskv_f16_to_f32(h) : mskv_bf16_to_f32(h); }
static uint16_t eh_h(mskv_dtype t, float f) { return t == MSKV_DTYPE_F16 ? mskv_f32_to_f16(f) : mskv_f32_to_bf16(f); }

struct eh_case {
    int variant = EH_BF16_64, page_size = 16, q_heads = 2, kv_heads = 1, window_left = 0, kv_chunk = 0;
    int tma = 1;   /* the TMA path where the page size allows it */
    mskv_mask mask = MSKV_MASK_NONE;
    std::vector<int> qo, kv, split, shift;
    std::vector<int> q_pos;                   /* [total_q] each query's mask position; empty: the tail rule */
    std::vector<int> sink_end, window_start;  /* [batch] visibility bounds; empty: none */
};

/* TMA needs whole pages per tile: page_size a multiple of BN, or BN a
   multiple of page_size of at least 16 rows (the runtime's rule). */
static int eh_tma_ok(int P, int bn) { return P % bn == 0 || (bn % P == 0 && P >= 16); }

/* The tensor map the runtime makes for a pool: [pages][page_size][kv_heads][D], 64-wide boxes of one page piece. */
static int eh_map(mskv_tmap *map, void *pool, mskv_dtype dt, int num_pages, int P, int kvh, int D, int bn) {
    const mskv_u64 dims[4] = {(mskv_u64)D, (mskv_u64)kvh, (mskv_u64)P, (mskv_u64)num_pages};
    const mskv_u64 strides[3] = {(mskv_u64)D * 2, (mskv_u64)kvh * D * 2, (mskv_u64)P * kvh * D * 2};
    const mskv_u32 box[4] = {64, 1, (mskv_u32)std::min(P, bn), 1}, es[4] = {1, 1, 1, 1};
    return mskv_emu::tmap_encode(map, dt == MSKV_DTYPE_F16 ? 6 : 9, 4, pool, dims, strides, box, es, 0, 3, 3, 0);
}

static int eh_pos(int j, int split, int shift) { return j < split ? j : j + shift; }

/* The plan's masking rule in double precision (for q_pos and the visibility
   bounds): key j of segment b is visible to query i iff its position is
   outside [sink_end, window_start) and the mask lets the query's position see it. */
static void eh_reference(const eh_case &c, int D, const std::vector<int32_t> &qo_indptr, const std::vector<int32_t> &kv_indptr,
                         const std::vector<int32_t> &kv_indices, const std::vector<uint16_t> &kp,
                         const std::vector<uint16_t> &vp, const std::vector<uint16_t> &q, std::vector<uint16_t> &ref_o,
                         std::vector<float> &ref_lse) {
    const mskv_dtype dt = eh_variants[c.variant].dtype;
    const int P = c.page_size, group = c.q_heads / c.kv_heads;
    const double scale = 1.0 / std::sqrt((double)D);
    for (size_t b = 0; b < c.qo.size(); b++)
        for (int i = 0; i < c.qo[b]; i++) {
            const int qi = qo_indptr[b] + i;
            const int qpos = c.q_pos.empty() ? eh_pos(c.kv[b] - c.qo[b] + i, c.split[b], c.shift[b]) : c.q_pos[(size_t)qi];
            for (int h = 0; h < c.q_heads; h++) {
                const size_t row = (size_t)qi * c.q_heads + h;
                std::vector<double> sc;
                std::vector<size_t> at;
                double mx = -INFINITY;
                for (int j = 0; j < c.kv[b]; j++) {
                    const int kpos = eh_pos(j, c.split[b], c.shift[b]);
                    if (!c.sink_end.empty() && kpos >= c.sink_end[b] && kpos < c.window_start[b]) continue;
                    if (c.mask != MSKV_MASK_NONE && kpos > qpos) continue;
                    if (c.mask == MSKV_MASK_WINDOW && qpos - kpos > c.window_left) continue;
                    const size_t base = (((size_t)kv_indices[(size_t)(kv_indptr[b] + j / P)] * P + j % P) * c.kv_heads + h / group) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += (double)eh_f(dt, q[row * D + d]) * eh_f(dt, kp[base + d]);
                    sc.push_back(dot * scale);
                    at.push_back(base);
                    mx = std::max(mx, dot * scale);
                }
                double sum = 0;
                for (double x : sc) sum += std::exp(x - mx);
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (size_t k = 0; k < sc.size(); k++) acc += std::exp(sc[k] - mx) * eh_f(dt, vp[at[k] + d]);
                    ref_o[row * D + d] = eh_h(dt, sc.empty() ? 0.0f : (float)(acc / sum));
                }
                ref_lse[row] = sc.empty() ? -INFINITY : (float)(mx + std::log(sum));
            }
        }
}

/* Runs the case on the emulated kernel and the CPU backend; the worst |o| and
   |lse| differences (1e9: a NaN, a missing -inf, or a refused launch, whose
   reason goes to *why). */
static void eh_compare(const eh_case &c, uint64_t seed, double *o_err, double *lse_err, std::string *why) {
    const eh_variant &v = eh_variants[c.variant];
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
                kp[slot * se + e] = eh_h(v.dtype, uni(rng));
                vp[slot * se + e] = eh_h(v.dtype, uni(rng));
            }
        }
    for (auto &x : q) x = eh_h(v.dtype, 2.0f * uni(rng));

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
    if (!c.q_pos.empty() || !c.sink_end.empty()) {
        eh_reference(c, D, qo_indptr, kv_indptr, kv_indices, kp, vp, q, ref_o, ref_lse);
    } else if (mskv_cpu_attention_pools(NULL, &pools, &plan, &at, q.data(), ref_o.data(), ref_lse.data()) != MSKV_SUCCESS) {
        *why = "the CPU backend refused the case";
        return;
    }

    const int use_tma = c.tma && eh_tma_ok(P, v.bn);
    alignas(64) mskv_tmap kmap, vmap;
    memset(&kmap, 0, sizeof kmap);
    memset(&vmap, 0, sizeof vmap);
    if (use_tma && (eh_map(&kmap, kp.data(), v.dtype, num_pages, P, c.kv_heads, D, v.bn) != 0 ||
                    eh_map(&vmap, vp.data(), v.dtype, num_pages, P, c.kv_heads, D, v.bn) != 0)) {
        *why = "cuTensorMapEncodeTiled (emulated) refused the pool";
        return;
    }
    const int n_splits = c.kv_chunk > 0 ? std::max(1, (max_kv + c.kv_chunk - 1) / c.kv_chunk) : 1;
    std::vector<float> o_part((size_t)n_splits * q.size()), lse_part((size_t)n_splits * ref_lse.size());
    const float scale_log2 = (1.0f / std::sqrt((float)D)) * 1.4426950408889634f;
    int ok = mskv_emu::launch(Dim3{std::max(1, (max_rows + 127) / 128), batch, c.kv_heads * n_splits}, 384, (size_t)v.smem, [&] {
        v.attn(kmap, vmap, use_tma, q.data(), kp.data(), vp.data(), qo_indptr.data(), kv_indptr.data(), kv_indices.data(),
               kv_len.data(), psplit.data(), pshift.data(), c.q_heads, c.kv_heads, P, scale_log2, (int)c.mask,
               c.window_left, c.kv_chunk, n_splits, o.data(), lse.data(), o_part.data(), lse_part.data(),
               c.q_pos.empty() ? nullptr : c.q_pos.data(), c.sink_end.empty() ? nullptr : c.sink_end.data(),
               c.window_start.empty() ? nullptr : c.window_start.data());
    });
    if (ok && n_splits > 1) {
        mskv_i64 rows = (mskv_i64)total_q * c.q_heads;
        ok = mskv_emu::launch(Dim3{(int)((rows + 3) / 4), 1, 1}, 128, 0, [&] {
            v.merge(o_part.data(), lse_part.data(), n_splits, rows, rows, o.data(), lse.data());
        });
    }
    if (!ok) { *why = mskv_emu::error(); mskv_emu::clear_error(); return; }
    double oe = 0, le = 0;
    for (size_t r = 0; r < ref_lse.size(); r++) {
        if (std::isinf(ref_lse[r])) {
            if (!(std::isinf(lse[r]) && lse[r] < 0)) le = 1e9;
        } else {
            le = std::max(le, std::isfinite(lse[r]) ? (double)std::fabs(lse[r] - ref_lse[r]) : 1e9);
        }
        for (int d = 0; d < D; d++) {
            double a = eh_f(v.dtype, o[r * D + d]), b = eh_f(v.dtype, ref_o[r * D + d]);
            oe = std::max(oe, std::isfinite(a) ? std::fabs(a - b) : 1e9);
        }
    }
    *o_err = oe;
    *lse_err = le;
}

static double eh_tol(const eh_case &c) { return eh_variants[c.variant].dtype == MSKV_DTYPE_F16 ? 4e-3 : 2.5e-2; }

static int eh_check(const eh_case &c, uint64_t seed) {
    double oe, le;
    std::string why;
    eh_compare(c, seed, &oe, &le, &why);
    if (oe <= eh_tol(c) && le <= 2e-3) return 1;
    mt_fail(__FILE__, __LINE__, "%s, P=%d (%s), heads %d/%d, mask %d (window %d), chunk %d, qo %d kv %d split %d shift %d%s: "
            "o err %.3g (tol %.3g), lse err %.3g%s%s", eh_variants[c.variant].name, c.page_size,
            c.tma && eh_tma_ok(c.page_size, eh_variants[c.variant].bn) ? "TMA" : "cp.async", c.q_heads, c.kv_heads,
            (int)c.mask, c.window_left, c.kv_chunk, c.qo[0], c.kv[0], c.split[0], c.shift[0],
            c.qo.size() > 1 ? " (+more segments)" : "", oe, eh_tol(c), le, why.empty() ? "" : ": ", why.c_str());
    return 0;
}

static eh_case eh_one(int variant, int P, int qh, int kvh, int qo, int kv, mskv_mask mask = MSKV_MASK_NONE) {
    eh_case c;
    c.variant = variant; c.page_size = P; c.q_heads = qh; c.kv_heads = kvh; c.mask = mask;
    c.qo = {qo}; c.kv = {kv}; c.split = {kv / 2}; c.shift = {mask != MSKV_MASK_NONE ? 9 : 0};
    return c;
}

/* ---- against the CPU backend ---------------------------------------------------------- */

TEST(attn_sm90_matches_cpu_backend_for_page_sizes_1_to_256_on_both_load_paths) {
    /* 300 keys: three 128-key tiles, so the 3-stage ring of d64 turns over; every
       page size once by cp.async and, where a tile holds whole pages, by TMA */
    const int Ps[] = {1, 3, 5, 16, 40, 64, 128, 256};
    int failures = 0;
    for (int P : Ps)
        for (int tma = 0; tma < 2 && failures < 4; tma++) {
            if (tma && !eh_tma_ok(P, 128)) continue;
            eh_case c = eh_one(EH_BF16_64, P, 2, 1, 40, 300, MSKV_MASK_CAUSAL);
            c.tma = tma;
            failures += !eh_check(c, (uint64_t)(P * 31 + tma));
        }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_packs_gqa_groups_of_any_size) {
    /* 24 queries x group rows: from one block of 24 rows to 192 rows (both consumers, two blocks) */
    const int groups[] = {1, 2, 3, 4, 6, 8};
    int failures = 0;
    for (int gq : groups) {
        eh_case c = eh_one(EH_BF16_64, 16, 2 * gq, 2, 24, 150, MSKV_MASK_CAUSAL);
        failures += !eh_check(c, (uint64_t)(100 + gq));
    }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_masks_compare_absolute_positions) {
    int failures = 0;
    for (int m = 0; m < 3; m++) {
        eh_case c = eh_one(EH_BF16_64, 16, 2, 1, 70, 400, (mskv_mask)m);
        c.split = {160}; c.shift = {500}; c.window_left = 150;   /* a released middle, a window over two tiles */
        failures += !eh_check(c, (uint64_t)(200 + m));
        c = eh_one(EH_BF16_64, 40, 1, 1, 130, 130, (mskv_mask)m);  /* square: every query its own diagonal */
        c.window_left = 37;
        failures += !eh_check(c, (uint64_t)(210 + m));
    }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_rows_that_see_no_key_get_zero_and_negative_infinity) {
    int failures = 0;
    eh_case c = eh_one(EH_BF16_64, 16, 2, 1, 4, 0);
    failures += !eh_check(c, 301);                              /* an empty sequence */
    c = eh_one(EH_BF16_64, 16, 2, 1, 3, 3, MSKV_MASK_WINDOW);
    c.window_left = 0;
    failures += !eh_check(c, 302);                              /* each query sees itself only */
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_splits_merged_equal_the_whole) {
    int failures = 0;
    eh_case c = eh_one(EH_BF16_64, 16, 4, 2, 20, 520);
    c.kv_chunk = 256;
    failures += !eh_check(c, 401);
    c = eh_one(EH_BF16_64, 3, 2, 1, 30, 400, MSKV_MASK_WINDOW);
    c.window_left = 60;   /* some splits see nothing: they must be neutral */
    c.kv_chunk = 128;
    failures += !eh_check(c, 402);
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_ragged_batches_with_shuffled_pages_match_cpu_backend) {
    uint64_t seed = mt_seed();
    std::mt19937_64 rng(seed);
    int failures = 0;
    for (int rep = 0; rep < 6 && failures < 3; rep++) {
        eh_case c;
        const int Ps[] = {1, 3, 16, 40, 64, 128}, groups[] = {1, 2, 3, 4, 8};
        c.variant = rep % 2 ? EH_F16_64 : EH_BF16_64;
        c.page_size = Ps[rng() % 6];
        c.tma = (int)(rng() % 2);
        c.kv_heads = 1 + (int)(rng() % 2);
        c.q_heads = c.kv_heads * groups[rng() % 5];
        c.mask = (mskv_mask)(rng() % 3);
        c.window_left = (int)(rng() % 200);
        c.kv_chunk = rng() % 3 == 0 ? 128 : 0;
        int batch = 1 + (int)(rng() % 3);
        for (int b = 0; b < batch; b++) {
            int kv = (int)(rng() % 330), qo = kv ? 1 + (int)(rng() % std::min(kv, 50)) : (c.mask ? 0 : 1);
            c.qo.push_back(qo); c.kv.push_back(kv); c.split.push_back((int)(rng() % (kv + 1)));
            c.shift.push_back((int)(rng() % 1000));
        }
        failures += !eh_check(c, seed + (uint64_t)rep);
    }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_head_dim_128_and_256_match_cpu_backend) {
    int failures = 0;
    eh_case c = eh_one(EH_BF16_128, 16, 4, 1, 40, 300, MSKV_MASK_CAUSAL);
    failures += !eh_check(c, 501);
    c = eh_one(EH_F16_128, 40, 2, 2, 30, 200);   /* cp.async path */
    failures += !eh_check(c, 502);
    c = eh_one(EH_BF16_256, 64, 2, 1, 20, 150, MSKV_MASK_WINDOW);
    c.window_left = 70;
    failures += !eh_check(c, 503);
    EXPECT_EQ(0, failures);
}

/* ---- q_pos and the visibility bounds, against a double-precision reference ---- */

TEST(attn_sm90_q_pos_puts_queries_anywhere_and_the_masks_compare_it) {
    int failures = 0;
    eh_case c = eh_one(EH_BF16_64, 16, 2, 1, 0, 300, MSKV_MASK_CAUSAL);
    c.split = {300}; c.shift = {0};
    c.q_pos = {150, 2, 299, 128, 127, 0, 40, 40, 255, 256};
    c.qo = {(int)c.q_pos.size()};
    failures += !eh_check(c, 21001);
    c.mask = MSKV_MASK_WINDOW; c.window_left = 70;
    failures += !eh_check(c, 21002);
    /* 100 queries x 2 heads: two blocks, each with its own range of positions */
    c.q_pos.clear();
    for (int i = 0; i < 100; i++) c.q_pos.push_back((i * 53) % 300);
    c.qo = {100}; c.mask = MSKV_MASK_CAUSAL;
    failures += !eh_check(c, 21003);
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_causal_split_with_q_pos_sees_only_the_keys_before_each_query) {
    /* the first part of a split computation: keys [0, 200) of a 330-key
       sequence whose last 40 tokens are the queries (positions 290..329),
       and the second part's keys [200, 330) at their true positions */
    int failures = 0;
    for (int part = 0; part < 2; part++) {
        eh_case c = eh_one(EH_F16_64, 16, 4, 2, 40, part ? 130 : 200, MSKV_MASK_CAUSAL);
        c.split = {0}; c.shift = {part ? 200 : 0};
        for (int i = 0; i < 40; i++) c.q_pos.push_back(290 + i - (part ? 0 : 100));  /* part 0: queries inside its keys */
        failures += !eh_check(c, 21101 + (uint64_t)part);
    }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_visibility_bounds_at_every_alignment_to_the_key_tile_and_the_page) {
    /* 128-key tiles; pages of 16 (TMA), 64 (TMA) and 40 (cp.async) */
    const int bounds[][2] = {{10, 40}, {128, 256}, {127, 257}, {129, 255}, {30, 420}, {0, 0}, {300, 100},
                             {16, 32}, {200, 5000}, {0, 300}, {0, 459}, {0, 5000}, {100, 140}};
    int failures = 0;
    for (int P : {16, 64, 40})
        for (const auto &bd : bounds)
            for (int m = 0; m < 2 && failures < 4; m++) {
                eh_case c = eh_one(EH_BF16_64, P, 4, 2, 20, 460, (mskv_mask)m);
                c.sink_end = {bd[0]}; c.window_start = {bd[1]};
                failures += !eh_check(c, 22001 + (uint64_t)(bd[0] * 3 + bd[1] + m));
            }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_visibility_bounds_with_q_pos_gqa_splits_and_head_dim_128) {
    int failures = 0;
    eh_case c = eh_one(EH_BF16_64, 16, 6, 2, 0, 600, MSKV_MASK_WINDOW);
    c.window_left = 300;
    c.sink_end = {70}; c.window_start = {400};
    c.q_pos = {599, 400, 399, 450, 70, 69, 150, 530, 300};
    c.qo = {(int)c.q_pos.size()};
    failures += !eh_check(c, 22101);
    c.kv_chunk = 128;    /* splits wholly hidden, cut by a bound, or whole */
    failures += !eh_check(c, 22102);
    c.variant = EH_F16_128; c.kv_chunk = 0;
    failures += !eh_check(c, 22103);
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_visibility_bounds_per_segment_in_a_random_batch) {
    uint64_t seed = mt_seed();
    std::mt19937_64 rng(seed);
    int failures = 0;
    for (int rep = 0; rep < 4 && failures < 2; rep++) {
        eh_case c;
        const int Ps[] = {1, 16, 40, 128};
        c.variant = EH_BF16_64;
        c.page_size = Ps[rng() % 4];
        c.kv_heads = 1 + (int)(rng() % 2);
        c.q_heads = c.kv_heads * (1 + (int)(rng() % 3));
        c.mask = (mskv_mask)(rng() % 3);
        c.window_left = (int)(rng() % 300);
        c.kv_chunk = rep % 2 ? 128 : 0;
        int batch = 1 + (int)(rng() % 3);
        for (int b = 0; b < batch; b++) {
            int kv = (int)(rng() % 400), qo = 1 + (int)(rng() % 30), split = (int)(rng() % (kv + 1));
            int shift = (int)(rng() % 100), end = kv + shift + 10;
            c.qo.push_back(qo); c.kv.push_back(kv); c.split.push_back(split); c.shift.push_back(shift);
            c.sink_end.push_back((int)(rng() % end)); c.window_start.push_back((int)(rng() % end));
            for (int i = 0; i < qo; i++) c.q_pos.push_back((int)(rng() % end));
        }
        failures += !eh_check(c, seed + (uint64_t)rep);
    }
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_passes_under_skewed_warps_early_copies_and_an_unaligned_shared_base) {
    int failures = 0;
    mskv_emu::cfg().greedy_warps = 1;
    mskv_emu::cfg().tma_eager = 1;
    mskv_emu::cfg().cp_async_eager = 1;
    failures += !eh_check(eh_one(EH_BF16_64, 64, 2, 1, 60, 420, MSKV_MASK_CAUSAL), 601);
    failures += !eh_check(eh_one(EH_BF16_64, 5, 2, 1, 60, 300), 602);
    mskv_emu::cfg().greedy_warps = 0;
    mskv_emu::cfg().tma_eager = 0;
    mskv_emu::cfg().cp_async_eager = 0;
    mskv_emu::cfg().smem_base_offset = 16;   /* the kernel aligns its ring to 1024 bytes itself */
    failures += !eh_check(eh_one(EH_BF16_64, 16, 2, 1, 60, 300), 603);
    mskv_emu::cfg().smem_base_offset = 0;
    EXPECT_EQ(0, failures);
}

TEST(attn_sm90_passes_under_random_warp_orders) {
    /* every pass runs the 12 warps in a fresh random order, each as far as it
       goes; a stage's reads stay live until all 4 warps of a consumer have
       waited: the ring on both load paths (3 stages at d64, 2 at d128), a
       split, and GQA, 3 schedules each */
    const uint64_t seed = mt_seed();
    const unsigned long long before = mskv_emu::cfg().random_warps;
    int failures = 0;
    for (int k = 0; k < 3 && failures < 3; k++) {
        eh_case cs[4] = {eh_one(EH_BF16_64, 64, 2, 1, 100, 520, MSKV_MASK_CAUSAL), eh_one(EH_BF16_64, 5, 2, 1, 60, 300),
                         eh_one(EH_F16_128, 16, 4, 2, 30, 400, MSKV_MASK_WINDOW), eh_one(EH_BF16_64, 16, 4, 2, 20, 520)};
        cs[2].window_left = 200;
        cs[3].kv_chunk = 256;
        for (int i = 0; i < 4; i++) {
            mskv_emu::cfg().random_warps = seed * 8 + (uint64_t)(4 * k + i) + 1;
            const int ok = eh_check(cs[i], 801 + (uint64_t)i);
            if (!ok) printf("  failed under random_warps %llu\n", mskv_emu::cfg().random_warps);
            failures += !ok;
            mskv_emu::cfg().random_warps = before;
        }
    }
    EXPECT_EQ(0, failures);
}

/* ---- planted bugs ------------------------------------------------------------------------ */

/* What a planted bug did to a case that passes: the emulator's complaint, or "" with wrong numbers. */
static std::string eh_planted(const eh_case &c, uint64_t seed, int *wrong) {
    double oe, le;
    std::string why;
    eh_compare(c, seed, &oe, &le, &why);
    *wrong = why.empty() && (oe > eh_tol(c) || le > 2e-3);
    return why;
}

static eh_case eh_planted_case(void) { return eh_one(EH_BF16_64, 64, 2, 1, 100, 520, MSKV_MASK_CAUSAL); }

TEST(attn_sm90_planted_wrong_swizzle_mode_is_caught) {
    int wrong = 0;
    mskv_emu::cfg().wgmma_swizzle_override = 2;   /* descriptors say 64 B; TMA and cp.async wrote 128 B */
    std::string why = eh_planted(eh_planted_case(), 701, &wrong);
    mskv_emu::cfg().wgmma_swizzle_override = -1;
    /* the other layout puts rows elsewhere: wrong numbers, or reads past the tiles */
    EXPECT_TRUE(wrong || why.find("outside shared memory") != std::string::npos ||
                why.find("nothing has written") != std::string::npos);
    printf("  %s\n", wrong ? "wrong results" : why.c_str());
}

TEST(attn_sm90_planted_missing_wgmma_wait_is_caught) {
    int wrong = 0;
    mskv_emu::cfg().skip_wgmma_wait = 1;
    std::string why = eh_planted(eh_planted_case(), 702, &wrong);
    mskv_emu::cfg().skip_wgmma_wait = 0;
    /* the accumulators stay NaN; the in-flight P V still reads the stage its release hands back */
    EXPECT_TRUE(wrong || why.find("in-flight wgmma") != std::string::npos);
    if (!wrong) printf("  caught by the emulator: %s\n", why.c_str());
}

TEST(attn_sm90_planted_wrong_mbarrier_parity_deadlocks_with_a_report) {
    int wrong = 0;
    mskv_emu::cfg().mbar_parity_flip_wg = 0;   /* the producer waits for the wrong phase of "empty" */
    std::string why = eh_planted(eh_planted_case(), 703, &wrong);
    mskv_emu::cfg().mbar_parity_flip_wg = -1;
    EXPECT_TRUE(why.find("deadlock") != std::string::npos);
    EXPECT_TRUE(why.find("mbarrier") != std::string::npos);
    printf("  %.300s...\n", why.c_str());
}

TEST(attn_sm90_planted_consumer_on_the_wrong_parity_is_caught) {
    int wrong = 0;
    mskv_emu::cfg().mbar_parity_flip_wg = 1;   /* consumer 0 takes "the phase before" as its data */
    std::string why = eh_planted(eh_planted_case(), 704, &wrong);
    mskv_emu::cfg().mbar_parity_flip_wg = -1;
    /* it reads a stage before its copy landed, or waits for a phase that never comes */
    EXPECT_TRUE(why.find("still writing") != std::string::npos || why.find("deadlock") != std::string::npos);
    printf("  %.160s...\n", why.c_str());
}

TEST(attn_sm90_planted_missing_fence_proxy_async_is_caught) {
    int wrong = 0;
    mskv_emu::cfg().skip_fence_proxy = 1;
    std::string why = eh_planted(eh_planted_case(), 705, &wrong);
    mskv_emu::cfg().skip_fence_proxy = 0;
    EXPECT_TRUE(why.find("fence.proxy.async") != std::string::npos);
}

TEST(attn_sm90_planted_producer_overrunning_the_ring_is_caught) {
    int wrong = 0;
    mskv_emu::cfg().skip_mbar_wait_wg = 0;     /* the producer never waits for "empty" */
    std::string why = eh_planted(eh_planted_case(), 706, &wrong);
    mskv_emu::cfg().skip_mbar_wait_wg = -1;
    EXPECT_TRUE(why.find("more arrivals") != std::string::npos || why.find("two copies in flight") != std::string::npos ||
                why.find("in-flight wgmma") != std::string::npos);
    printf("  %s\n", why.c_str());
}

TEST(attn_sm90_planted_leader_only_release_is_caught_under_random_warp_orders) {
    /* the old hand-back: the first consumer warp's wait alone returns the
       stage, so the producer may refill K/V the other three warps' wgmma
       still read; a random warp order shows it within a few schedules */
    const uint64_t seed = mt_seed();
    eh_case c = eh_planted_case();
    c.variant = EH_BF16_64_LEADER;
    const unsigned long long before = mskv_emu::cfg().random_warps;
    int wrong = 0, caught = -1;
    std::string why, first;
    /* in the fixed warp order the variant is right: only the hand-back differs */
    mskv_emu::cfg().random_warps = 0;
    why = eh_planted(c, 707, &wrong);
    EXPECT_TRUE(why.empty() && !wrong);
    if (!why.empty() || wrong) printf("  in warp order: %s\n", wrong ? "wrong results" : why.c_str());
    for (int k = 0; k < 16 && caught < 0; k++) {
        mskv_emu::cfg().random_warps = seed * 16 + (uint64_t)k + 1;
        why = eh_planted(c, 707, &wrong);
        if (why.find("in-flight wgmma") != std::string::npos) caught = k;
        else if (first.empty()) first = wrong ? "wrong results" : why.empty() ? "passed" : why;
        if (caught >= 0) printf("  caught under random_warps %llu (schedule %d of 16): %s\n", mskv_emu::cfg().random_warps, k + 1,
                                why.c_str());
        mskv_emu::cfg().random_warps = before;
    }
    EXPECT_TRUE(caught >= 0);
    if (caught < 0) printf("  not caught in 16 schedules from %llu (first: %s)\n", (unsigned long long)(seed * 16 + 1), first.c_str());
}
