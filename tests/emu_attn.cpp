/* Emulated tests of the attention kernels (mskv_attn, mskv_lse_merge): every
   layout (prefill, decode), f16/bf16, head_dim 64/128, any page size, GQA,
   masks on absolute positions, split-KV, against a double-precision reference
   over the same paged inputs; plus planted bugs that must be caught. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"
#include <algorithm>
#include <random>

namespace eat_p_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ATTN_WARP_KEYS 0
#include "../kernels.cu"
}
namespace eat_d_bf16_64 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}
namespace eat_p_f16_128 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 128
#define MSKV_ATTN_WARP_KEYS 0
#include "../kernels.cu"
}
namespace eat_d_f16_128 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 128
#define MSKV_ATTN_WARP_KEYS 1
#include "../kernels.cu"
}
namespace eat_p_bf16_128 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 128
#define MSKV_ATTN_WARP_KEYS 0
#include "../kernels.cu"
}
namespace eat_p_f16_256 {
#define MSKV_DTYPE 1
#define MSKV_HEAD_DIM 256
#define MSKV_ATTN_WARP_KEYS 0
#include "../kernels.cu"
}

typedef void (*eat_attn_fn)(const void *, const void *, const void *, const int *, const int *, const int *,
                            const int *, const int *, const int *, int, int, int, unsigned int, int, float, int, int, int, int,
                            void *, float *, float *, float *, const int *, const int *, const int *);
typedef void (*eat_merge_fn)(const float *, const float *, int, mskv_i64, mskv_i64, void *, float *);

struct eat_variant {
    eat_attn_fn attn;
    eat_merge_fn merge;
    int dtype, d, bm, smem;
};
enum { EAT_P_BF16_64, EAT_D_BF16_64, EAT_P_F16_128, EAT_D_F16_128, EAT_P_BF16_128, EAT_P_F16_256 };
static const eat_variant eat_variants[] = {
    {eat_p_bf16_64::mskv_attn, eat_p_bf16_64::mskv_lse_merge, 2, 64, eat_p_bf16_64::mskv_attn_block_rows, eat_p_bf16_64::mskv_attn_smem_bytes},
    {eat_d_bf16_64::mskv_attn, eat_d_bf16_64::mskv_lse_merge, 2, 64, eat_d_bf16_64::mskv_attn_block_rows, eat_d_bf16_64::mskv_attn_smem_bytes},
    {eat_p_f16_128::mskv_attn, eat_p_f16_128::mskv_lse_merge, 1, 128, eat_p_f16_128::mskv_attn_block_rows, eat_p_f16_128::mskv_attn_smem_bytes},
    {eat_d_f16_128::mskv_attn, eat_d_f16_128::mskv_lse_merge, 1, 128, eat_d_f16_128::mskv_attn_block_rows, eat_d_f16_128::mskv_attn_smem_bytes},
    {eat_p_bf16_128::mskv_attn, eat_p_bf16_128::mskv_lse_merge, 2, 128, eat_p_bf16_128::mskv_attn_block_rows, eat_p_bf16_128::mskv_attn_smem_bytes},
    {eat_p_f16_256::mskv_attn, eat_p_f16_256::mskv_lse_merge, 1, 256, eat_p_f16_256::mskv_attn_block_rows, eat_p_f16_256::mskv_attn_smem_bytes},
};

static float eat_to_f(int dtype, mskv_u16 h) { return dtype == 1 ? mskv_emu::h2f(h) : mskv_emu::b2f(h); }
static mskv_u16 eat_from_f(int dtype, float f) { return dtype == 1 ? mskv_emu::f2h(f) : mskv_emu::f2b(f); }

/* One attention problem: segments with their own qo/kv lengths and position
   split/shift, pages drawn shuffled from a pool whose every unused slot is NaN. */
struct eat_case {
    int variant = EAT_P_BF16_64;
    int page_size = 16, q_heads = 2, kv_heads = 1, mask = 0, window_left = 0;
    int kv_chunk = 0;  /* > 0: split-KV with this many keys per split */
    int divisor_page_size = 0;  /* planted bug: the kernel gets another page size's divisor (0: none) */
    std::vector<int> qo, kv, split, shift;
    std::vector<int> q_pos;           /* [total_q] each query's mask position; empty: the tail rule */
    std::vector<int> sink_end, window_start;  /* [batch] visibility bounds; empty: none */
    int sink_end_delta = 0;   /* planted bug: the kernel gets sink_end + this */
    /* K/V as a function of (position, head, dim) and q of (query row, dim), not
       of the draw order: cases that cut one sequence differently share data */
    int keyed = 0;
};

/* A value in [-1, 1) from a seed and three indices. */
static float eat_hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full) ^ (c * 0x165667b19e3779f9ull);
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

struct eat_result {
    std::vector<float> o, lse, ref_o, ref_lse;
    int launched = 0;
};

static int eat_pos(int j, int split, int shift) { return j < split ? j : j + shift; }

static void eat_run(const eat_case &c, uint64_t seed, eat_result &res) {
    const eat_variant &v = eat_variants[c.variant];
    const int D = v.d, P = c.page_size, batch = (int)c.qo.size(), group = c.q_heads / c.kv_heads;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<int> qo_indptr(1, 0), kv_indptr(1, 0), kv_indices, kv_len(c.kv), psplit(c.split), pshift(c.shift);
    int n_ids = 0, max_rows = 0;
    for (int b = 0; b < batch; b++) {
        qo_indptr.push_back(qo_indptr.back() + c.qo[b]);
        n_ids += (c.kv[b] + P - 1) / P;
        kv_indptr.push_back(n_ids);
        max_rows = std::max(max_rows, c.qo[b] * group);
    }
    const int total_q = qo_indptr.back(), num_pages = n_ids + 3;  /* page 0 and two spare pages stay NaN */
    std::vector<int> ids;
    for (int i = 1; i < num_pages; i++) ids.push_back(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    kv_indices.assign(ids.begin(), ids.begin() + n_ids);
    const size_t slot_elems = (size_t)c.kv_heads * D;
    const mskv_u16 nan16 = v.dtype == 1 ? 0x7e00 : 0x7fc0;
    std::vector<mskv_u16> kp((size_t)num_pages * P * slot_elems, nan16), vp(kp), q((size_t)total_q * c.q_heads * D);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < c.kv[b]; j++) {
            size_t slot = (size_t)kv_indices[(size_t)(kv_indptr[b] + j / P)] * P + j % P;
            const uint64_t kpos = (uint64_t)eat_pos(j, c.split[b], c.shift[b]);
            for (size_t e = 0; e < slot_elems; e++) {
                kp[slot * slot_elems + e] = eat_from_f(v.dtype, c.keyed ? eat_hash(seed, kpos, e, 1) : uni(rng));
                vp[slot * slot_elems + e] = eat_from_f(v.dtype, c.keyed ? eat_hash(seed, kpos, e, 2) : uni(rng));
            }
        }
    for (size_t i = 0; i < q.size(); i++) q[i] = eat_from_f(v.dtype, 2.0f * (c.keyed ? eat_hash(seed, i, 0, 3) : uni(rng)));
    const float scale = 1.0f / std::sqrt((float)D);

    /* reference, double precision, from the same rounded inputs */
    res.ref_o.assign(q.size(), 0.0f);
    res.ref_lse.assign((size_t)total_q * c.q_heads, -INFINITY);
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < c.qo[b]; i++)
            for (int h = 0; h < c.q_heads; h++) {
                const size_t row = (size_t)(qo_indptr[b] + i) * c.q_heads + h;
                const int qpos = c.q_pos.empty() ? eat_pos(c.kv[b] - c.qo[b] + i, c.split[b], c.shift[b])
                                                 : c.q_pos[(size_t)(qo_indptr[b] + i)];
                std::vector<double> s, w;
                std::vector<size_t> at;
                double mx = -INFINITY;
                for (int j = 0; j < c.kv[b]; j++) {
                    int kpos = eat_pos(j, c.split[b], c.shift[b]);
                    if (!c.sink_end.empty() && kpos >= c.sink_end[b] && kpos < c.window_start[b]) continue;
                    if (c.mask >= 1 && kpos > qpos) continue;
                    if (c.mask == 2 && qpos - kpos > c.window_left) continue;
                    size_t base = (((size_t)kv_indices[(size_t)(kv_indptr[b] + j / P)] * P + j % P) * c.kv_heads + h / group) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += (double)eat_to_f(v.dtype, q[row * D + d]) * eat_to_f(v.dtype, kp[base + d]);
                    s.push_back(dot * scale);
                    at.push_back(base);
                    mx = std::max(mx, dot * scale);
                }
                if (s.empty()) continue;
                double sum = 0;
                for (double x : s) sum += std::exp(x - mx);
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (size_t k = 0; k < s.size(); k++) acc += std::exp(s[k] - mx) * eat_to_f(v.dtype, vp[at[k] + d]);
                    res.ref_o[row * D + d] = (float)(acc / sum);
                }
                res.ref_lse[row] = (float)(mx + std::log(sum));
            }

    /* the launch the runtime wrapper makes */
    int max_kv = 0;
    for (int x : c.kv) max_kv = std::max(max_kv, x);
    const int n_splits = c.kv_chunk > 0 ? std::max(1, (max_kv + c.kv_chunk - 1) / c.kv_chunk) : 1;
    std::vector<mskv_u16> o(q.size(), 0x1234);
    std::vector<float> lse((size_t)total_q * c.q_heads, 12345.0f);
    std::vector<float> o_part((size_t)n_splits * q.size(), 777.0f), lse_part((size_t)n_splits * total_q * c.q_heads, 777.0f);
    const float scale_log2 = scale * 1.4426950408889634f;
    uint32_t magic;
    int32_t shift;
    std::vector<int> sink_end(c.sink_end);
    for (int &x : sink_end) x += c.sink_end_delta;
    mskv_cuda_page_divisor(c.divisor_page_size ? c.divisor_page_size : P, &magic, &shift);
    res.launched = mskv_emu::launch(mskv_emu::Dim3{(max_rows + v.bm - 1) / v.bm, batch, c.kv_heads * n_splits}, 128,
                                    (size_t)v.smem, [&] {
        v.attn(q.data(), kp.data(), vp.data(), qo_indptr.data(), kv_indptr.data(), kv_indices.data(),
               kv_len.data(), psplit.data(), pshift.data(), c.q_heads, c.kv_heads, P, magic, shift, scale_log2, c.mask,
               c.window_left, c.kv_chunk, n_splits, o.data(), lse.data(), o_part.data(), lse_part.data(),
               c.q_pos.empty() ? nullptr : c.q_pos.data(), sink_end.empty() ? nullptr : sink_end.data(),
               c.window_start.empty() ? nullptr : c.window_start.data());
    });
    if (res.launched && n_splits > 1) {
        const mskv_i64 rows = (mskv_i64)total_q * c.q_heads;
        res.launched = mskv_emu::launch(mskv_emu::Dim3{(int)((rows + 3) / 4), 1, 1}, 128, 0, [&] {
            v.merge(o_part.data(), lse_part.data(), n_splits, rows, rows, o.data(), lse.data());
        });
    }
    res.o.resize(o.size());
    for (size_t i = 0; i < o.size(); i++) res.o[i] = eat_to_f(v.dtype, o[i]);
    res.lse = lse;
}

/* Worst error of o and lse against the reference; rows without keys must be
   exactly o = 0, lse = -inf (a mismatch there counts as error 1e9). */
static double eat_error(const eat_result &r, int D, double *lse_err) {
    double e = 0, le = 0;
    for (size_t row = 0; row < r.ref_lse.size(); row++) {
        if (std::isinf(r.ref_lse[row])) {
            if (!(std::isinf(r.lse[row]) && r.lse[row] < 0)) le = 1e9;
            for (int d = 0; d < D; d++) if (r.o[row * D + d] != 0.0f) e = 1e9;
            continue;
        }
        le = std::max(le, std::isfinite(r.lse[row]) ? (double)std::fabs(r.lse[row] - r.ref_lse[row]) : 1e9);
        for (int d = 0; d < D; d++) {
            double x = r.o[row * D + d];
            e = std::max(e, std::isfinite(x) ? std::fabs(x - r.ref_o[row * D + d]) : 1e9);
        }
    }
    *lse_err = le;
    return e;
}

static double eat_tol(int variant) { return eat_variants[variant].dtype == 1 ? 4e-3 : 2e-2; }

/* Runs a case and checks it; returns 1 when it matched. */
static int eat_check(const eat_case &c, uint64_t seed, const char *what) {
    eat_result r;
    double le, e;
    eat_run(c, seed, r);
    if (!r.launched) {
        mt_fail(__FILE__, __LINE__, "%s: emulation error: %s", what, mskv_emu::error().c_str());
        mskv_emu::clear_error();
        return 0;
    }
    e = eat_error(r, eat_variants[c.variant].d, &le);
    if (e > eat_tol(c.variant) || le > 2e-3) {
        mt_fail(__FILE__, __LINE__, "%s: variant %d P=%d heads %d/%d mask %d chunk %d batch %d (first qo %d kv %d): o err %.3g, lse err %.3g",
                what, c.variant, c.page_size, c.q_heads, c.kv_heads, c.mask, c.kv_chunk, (int)c.qo.size(),
                c.qo[0], c.kv[0], e, le);
        return 0;
    }
    return 1;
}

static eat_case eat_one(int variant, int P, int qh, int kvh, int qo, int kv, int mask = 0) {
    eat_case c;
    c.variant = variant; c.page_size = P; c.q_heads = qh; c.kv_heads = kvh; c.mask = mask;
    c.qo = {qo}; c.kv = {kv}; c.split = {kv}; c.shift = {0};
    return c;
}

TEST(attn_prefill_matches_reference_for_every_page_size_and_kv_length) {
    const int sizes[] = {1, 3, 16, 40};
    for (int P : sizes) {
        const int lens[] = {0, 1, P - 1, P, P + 1, 100};
        for (int kv : lens) {
            if (kv < 0 || (P == 1 && kv == 0 && 0)) continue;
            eat_check(eat_one(EAT_P_BF16_64, P, 2, 1, 5, kv), 1000 + P * 200 + kv, "prefill");
        }
    }
}

TEST(attn_packs_gqa_groups_of_any_size) {
    const int groups[] = {1, 2, 3, 4, 6, 8};
    for (int gq : groups) eat_check(eat_one(EAT_P_BF16_64, 16, 2 * gq, 2, 7, 37, 1), 2000 + gq, "gqa");
}

TEST(attn_causal_mask_compares_absolute_positions) {
    /* a released middle: compacted index >= split sits shift positions later */
    eat_case c = eat_one(EAT_P_BF16_64, 16, 4, 2, 20, 90, 1);
    c.split = {32}; c.shift = {500};
    eat_check(c, 3001, "causal, shifted");
    c = eat_one(EAT_P_BF16_64, 3, 4, 2, 70, 70, 1);
    eat_check(c, 3002, "causal, square");
}

TEST(attn_window_mask_keeps_keys_within_window_left) {
    eat_case c = eat_one(EAT_P_BF16_64, 16, 2, 1, 40, 150, 2);
    c.window_left = 37;
    eat_check(c, 4001, "window");
    c.split = {48}; c.shift = {100}; c.window_left = 130;
    eat_check(c, 4002, "window, shifted");
}

TEST(attn_rows_that_see_no_key_get_zero_and_negative_infinity) {
    /* window 0 with shifted positions: the queries see only themselves; kv 0: nothing */
    eat_check(eat_one(EAT_P_BF16_64, 16, 2, 1, 4, 0), 5001, "empty sequence");
    eat_case c = eat_one(EAT_P_BF16_64, 16, 2, 1, 3, 3, 2);
    c.window_left = 0;
    eat_check(c, 5002, "window 0");
}

TEST(attn_batches_segments_with_shuffled_pages) {
    uint64_t seed = mt_seed();
    std::mt19937_64 rng(seed);
    for (int rep = 0; rep < 6; rep++) {
        eat_case c;
        const int Ps[] = {1, 3, 16, 40}, groups[] = {1, 2, 3, 4, 6, 8};
        c.variant = EAT_P_BF16_64;
        c.page_size = Ps[rng() % 4];
        c.kv_heads = 1 + (int)(rng() % 2);
        c.q_heads = c.kv_heads * groups[rng() % 6];
        c.mask = (int)(rng() % 3);
        c.window_left = (int)(rng() % 60);
        int batch = 1 + (int)(rng() % 3);
        for (int b = 0; b < batch; b++) {
            int kv = (int)(rng() % 110), qo = kv ? 1 + (int)(rng() % std::min(kv, 24)) : 0;
            int split = (int)(rng() % (kv + 1));
            c.qo.push_back(qo); c.kv.push_back(kv); c.split.push_back(split); c.shift.push_back((int)(rng() % 300));
        }
        eat_check(c, seed + (uint64_t)rep, "random batch");
    }
}

TEST(attn_f16_head_dim_128_matches_reference) {
    eat_check(eat_one(EAT_P_F16_128, 16, 4, 1, 9, 70, 1), 6001, "f16 d128 causal");
    eat_check(eat_one(EAT_P_BF16_128, 40, 2, 2, 3, 81), 6002, "bf16 d128");
}

TEST(attn_head_dim_256_matches_reference) {
    eat_check(eat_one(EAT_P_F16_256, 16, 2, 1, 3, 40, 1), 6101, "f16 d256");
}

TEST(attn_decode_layout_matches_reference) {
    const int Ps[] = {1, 16, 40};
    for (int P : Ps) {
        eat_check(eat_one(EAT_D_BF16_64, P, 8, 2, 1, 99), 7000 + P, "decode bf16 d64");
        eat_check(eat_one(EAT_D_BF16_64, P, 6, 1, 2, P + 1, 1), 7100 + P, "decode bf16 two queries causal");
    }
    eat_check(eat_one(EAT_D_F16_128, 16, 4, 1, 1, 130), 7201, "decode f16 d128");
    eat_check(eat_one(EAT_D_F16_128, 16, 4, 1, 1, 0), 7202, "decode f16 d128 empty");
}

TEST(attn_split_kv_merged_equals_the_whole) {
    eat_case c = eat_one(EAT_D_BF16_64, 16, 4, 2, 1, 200);
    c.kv_chunk = 64;
    eat_check(c, 8001, "decode split");
    c = eat_one(EAT_P_BF16_64, 3, 2, 1, 10, 150, 2);
    c.window_left = 40;  /* some splits see nothing: they must be neutral */
    c.kv_chunk = 64;
    eat_check(c, 8002, "prefill split, window");
    c = eat_one(EAT_D_BF16_64, 40, 4, 1, 1, 150);
    c.qo = {1, 1}; c.kv = {150, 20}; c.split = {150, 20}; c.shift = {0, 0};
    c.kv_chunk = 64;
    eat_check(c, 8003, "decode split, uneven batch");
}

TEST(attn_passes_under_skewed_warps_and_early_copies) {
    mskv_emu::cfg().greedy_warps = 1;
    mskv_emu::cfg().cp_async_eager = 1;
    eat_check(eat_one(EAT_P_BF16_64, 16, 2, 1, 20, 200, 1), 9001, "skewed prefill");
    eat_check(eat_one(EAT_D_BF16_64, 16, 4, 1, 1, 200), 9002, "skewed decode");
    mskv_emu::cfg().greedy_warps = 0;
    mskv_emu::cfg().cp_async_eager = 0;
}

/* ---- explicit query positions (plan->q_pos) ---- */

/* Queries of one segment at the given positions (q_pos), keys 0..kv-1. */
static eat_case eat_at(int variant, int P, int qh, int kvh, int kv, int mask, std::vector<int> pos) {
    eat_case c = eat_one(variant, P, qh, kvh, (int)pos.size(), kv, mask);
    c.q_pos = pos;
    return c;
}

TEST(attn_q_pos_puts_queries_anywhere_and_the_masks_compare_it) {
    /* the middle of the sequence, rising, in any order, repeated, before every key */
    eat_check(eat_at(EAT_P_BF16_64, 16, 2, 1, 200, 1, {50, 51, 52, 53, 54, 55, 56, 57}), 11001, "q_pos middle, causal");
    eat_check(eat_at(EAT_P_BF16_64, 3, 4, 2, 150, 1, {140, 3, 77, 64, 63, 0, 149, 100, 12}), 11002, "q_pos any order");
    eat_check(eat_at(EAT_P_BF16_64, 16, 2, 1, 90, 1, {40, 40, 40, 7, 7}), 11003, "q_pos repeated");
    eat_case c = eat_at(EAT_P_BF16_64, 16, 2, 1, 130, 2, {100, 20, 64, 129, 65});
    c.window_left = 30;
    eat_check(c, 11004, "q_pos window");
    eat_check(eat_at(EAT_P_BF16_64, 16, 2, 1, 60, 0, {5, 1000}), 11005, "q_pos no mask");
    /* positions with a released middle: keys j >= 40 sit 300 later */
    c = eat_at(EAT_P_BF16_64, 16, 4, 2, 120, 1, {30, 39, 340, 341, 390, 419, 200});
    c.split = {40}; c.shift = {300};
    eat_check(c, 11006, "q_pos shifted keys");
}

TEST(attn_q_pos_spans_many_blocks_of_rows) {
    /* 150 queries x 2 heads = 300 rows: three blocks of 128, each with its own range of positions */
    std::vector<int> pos;
    for (int i = 0; i < 150; i++) pos.push_back((i * 37) % 260);
    eat_check(eat_at(EAT_P_BF16_64, 16, 2, 1, 260, 1, pos), 11101, "q_pos, three row blocks");
}

TEST(attn_q_pos_in_the_decode_layout_and_at_head_dim_128) {
    eat_check(eat_at(EAT_D_BF16_64, 16, 8, 2, 300, 1, {120}), 11201, "decode q_pos");
    eat_check(eat_at(EAT_D_F16_128, 40, 4, 1, 300, 1, {299, 10}), 11202, "decode f16 d128 two q_pos");
    eat_check(eat_at(EAT_P_F16_128, 16, 4, 1, 200, 1, {150, 10, 199, 70}), 11203, "prefill f16 d128 q_pos");
}

/* The keyed case of a sequence of kv keys whose last qo tokens are the
   queries, with its keys cut to [lo, hi) (kpos = j + lo) and the queries'
   true positions in q_pos. */
static eat_case eat_part(int variant, int kv, int qo, int lo, int hi, int mask) {
    eat_case c = eat_one(variant, 16, 4, 2, qo, hi - lo, mask);
    c.keyed = 1;
    c.split = {0}; c.shift = {lo};
    for (int i = 0; i < qo; i++) c.q_pos.push_back(kv - qo + i);
    return c;
}

TEST(attn_causal_split_and_merge_with_q_pos_equals_the_unsplit_attention) {
    /* keys cut at a point inside the queries' range: the first part still
       needs the causal mask (its queries are not its tail), and a query
       before the cut sees nothing in the second part (lse -inf) */
    const int kv = 230, qo = 60, cuts[] = {1, 64, 171, 185, 229};
    for (int variant : {EAT_P_F16_128, EAT_D_F16_128}) {
        const int nq = variant == EAT_D_F16_128 ? 2 : qo;
        eat_case whole = eat_part(variant, kv, nq, 0, kv, 1);
        eat_result rw;
        eat_run(whole, 11301, rw);
        for (int cut : cuts) {
            eat_result r1, r2;
            eat_run(eat_part(variant, kv, nq, 0, cut, 1), 11301, r1);
            eat_run(eat_part(variant, kv, nq, cut, kv, 1), 11301, r2);
            ASSERT_TRUE(rw.launched && r1.launched && r2.launched);
            double e = 0, le = 0;
            const int D = eat_variants[variant].d;
            for (size_t row = 0; row < rw.ref_lse.size(); row++) {
                /* each part against its own reference, then merged by LSE against the whole */
                double l1 = r1.lse[row], l2 = r2.lse[row], m = std::max(l1, l2);
                double w1 = std::isinf(l1) ? 0 : std::exp(l1 - m), w2 = std::isinf(l2) ? 0 : std::exp(l2 - m);
                EXPECT_TRUE((std::isinf(l1) == std::isinf((double)r1.ref_lse[row])) && (std::isinf(l2) == std::isinf((double)r2.ref_lse[row])));
                le = std::max(le, std::fabs(m + std::log(w1 + w2) - rw.ref_lse[row]));
                for (int d = 0; d < D; d++) {
                    double x = (w1 * r1.o[row * D + d] + w2 * r2.o[row * D + d]) / (w1 + w2);
                    e = std::max(e, std::fabs(x - rw.ref_o[row * D + d]));
                }
            }
            if (e > eat_tol(variant) || le > 2e-3)
                mt_fail(__FILE__, __LINE__, "variant %d cut %d: merged o err %.3g, lse err %.3g", variant, cut, e, le);
        }
    }
}

/* ---- visibility bounds (plan->vis_sink_end / vis_window_start) ---- */

static eat_case eat_vis(int variant, int P, int qo, int kv, int mask, int se, int ws) {
    eat_case c = eat_one(variant, P, 4, 2, qo, kv, mask);
    c.sink_end = {se}; c.window_start = {ws};
    return c;
}

TEST(attn_visibility_bounds_at_every_alignment_to_the_key_tile_and_the_page) {
    /* the key tile is 64 keys in both layouts at head_dim 64; pages of 16 and 24 */
    const int kv = 300;
    const int bounds[][2] = {
        {10, 40},    /* a hole inside one tile */
        {64, 128},   /* on tile edges: one whole tile hidden */
        {63, 129},   /* one key either side of the edges */
        {65, 127},   /* inside the tile on both sides */
        {30, 250},   /* whole tiles hidden, both ends inside tiles */
        {0, 0},      /* hiding nothing */
        {200, 100},  /* window start before sink end: hiding nothing */
        {16, 32},    /* on page edges inside a tile */
        {100, 1000}, /* sink only: everything from 100 on hidden */
        {0, 200},    /* window only */
        {0, 299},    /* only the last key */
        {0, 5000},   /* everything hidden */
        {48, 72},    /* a hole across a tile edge (page 24: on page edges) */
    };
    for (int variant : {EAT_P_BF16_64, EAT_D_BF16_64})
        for (int P : {16, 24})
            for (const auto &bd : bounds) {
                const int qo = variant == EAT_D_BF16_64 ? 1 : 9;
                char what[96];
                snprintf(what, sizeof what, "%s P %d bounds [%d, %d)", variant == EAT_D_BF16_64 ? "decode" : "prefill", P,
                         bd[0], bd[1]);
                eat_check(eat_vis(variant, P, qo, kv, 0, bd[0], bd[1]), 12001 + (uint64_t)bd[0] * 7 + (uint64_t)bd[1], what);
                eat_check(eat_vis(variant, P, qo, kv, 1, bd[0], bd[1]), 12002 + (uint64_t)bd[0] * 7 + (uint64_t)bd[1], what);
            }
}

TEST(attn_visibility_bounds_are_positions_not_indices) {
    /* a released middle: keys j >= 100 sit 1000 positions later; bounds inside the gap, before it and after it */
    const int bounds[][2] = {{50, 1150}, {100, 1100}, {60, 500}, {500, 1160}, {1130, 1190}};
    for (const auto &bd : bounds) {
        eat_case c = eat_vis(EAT_P_BF16_64, 16, 20, 250, 1, bd[0], bd[1]);
        c.split = {100}; c.shift = {1000};
        eat_check(c, 12101 + (uint64_t)bd[0], "bounds, shifted positions");
        c.mask = 2; c.window_left = 1080;
        eat_check(c, 12201 + (uint64_t)bd[0], "bounds, shifted positions, window");
    }
}

TEST(attn_visibility_bounds_with_q_pos_gqa_and_a_window) {
    eat_case c = eat_vis(EAT_P_BF16_64, 16, 0, 400, 2, 70, 260);
    c.q_heads = 6; c.kv_heads = 2; c.window_left = 200;
    c.q_pos = {399, 260, 259, 300, 70, 69, 150, 330};
    c.qo = {(int)c.q_pos.size()};
    eat_check(c, 12301, "bounds + q_pos + gqa + window");
    c.variant = EAT_P_F16_128;
    eat_check(c, 12302, "bounds + q_pos + gqa + window, f16 d128");
    c.variant = EAT_P_F16_256;
    eat_check(c, 12303, "bounds + q_pos + gqa + window, f16 d256");
}

TEST(attn_visibility_bounds_with_split_kv_merge_exactly) {
    /* splits of 64 keys: some wholly hidden (empty parts), some cut by a bound */
    eat_case c = eat_vis(EAT_D_BF16_64, 16, 1, 500, 0, 90, 330);
    c.kv_chunk = 64;
    eat_check(c, 12401, "decode split, bounds");
    c = eat_vis(EAT_P_BF16_64, 3, 12, 400, 1, 64, 256);
    c.kv_chunk = 128;
    eat_check(c, 12402, "prefill split, bounds on split edges");
    c.q_pos = std::vector<int>{399, 10, 300, 65, 64, 63, 255, 256, 200, 380, 1, 390};
    eat_check(c, 12403, "prefill split, bounds, q_pos");
}

TEST(attn_visibility_bounds_per_segment_in_a_random_batch) {
    uint64_t seed = mt_seed();
    std::mt19937_64 rng(seed);
    for (int rep = 0; rep < 6; rep++) {
        eat_case c;
        const int Ps[] = {1, 3, 16, 40};
        c.variant = rep % 3 == 2 ? EAT_D_BF16_64 : EAT_P_BF16_64;
        c.page_size = Ps[rng() % 4];
        c.kv_heads = 1 + (int)(rng() % 2);
        c.q_heads = c.kv_heads * (1 + (int)(rng() % 4));
        c.mask = (int)(rng() % 3);
        c.window_left = (int)(rng() % 200);
        c.kv_chunk = rep % 2 ? 64 : 0;
        int batch = 1 + (int)(rng() % 3);
        for (int b = 0; b < batch; b++) {
            int kv = (int)(rng() % 260), qo = c.variant == EAT_D_BF16_64 ? 1 : 1 + (int)(rng() % 20);
            int split = (int)(rng() % (kv + 1)), shift = (int)(rng() % 100), end = kv + shift + 10;
            c.qo.push_back(qo); c.kv.push_back(kv); c.split.push_back(split); c.shift.push_back(shift);
            c.sink_end.push_back((int)(rng() % end)); c.window_start.push_back((int)(rng() % end));
            for (int i = 0; i < qo; i++) c.q_pos.push_back((int)(rng() % end));
        }
        eat_check(c, seed + (uint64_t)rep, "random batch with bounds and q_pos");
    }
}

/* A planted bug must turn a matching run into a mismatch. */
static int eat_mismatches(const eat_case &c, uint64_t seed) {
    eat_result r;
    double le, e;
    eat_run(c, seed, r);
    if (!r.launched) { mskv_emu::clear_error(); return 0; }  /* must be wrong numbers, not a misuse */
    e = eat_error(r, eat_variants[c.variant].d, &le);
    return e > eat_tol(c.variant) || le > 2e-3;
}

TEST(attn_planted_wrong_mma_fragment_layout_is_detected) {
    eat_case c = eat_one(EAT_P_BF16_64, 16, 2, 1, 20, 100);
    mskv_emu::cfg().mma_swap_rows = 1;
    int bad = eat_mismatches(c, 10001);
    mskv_emu::cfg().mma_swap_rows = 0;
    EXPECT_TRUE(bad);
}

TEST(attn_planted_plain_ldmatrix_for_v_is_detected) {
    eat_case c = eat_one(EAT_P_BF16_64, 16, 2, 1, 20, 100);
    mskv_emu::cfg().ldsm_trans_off = 1;
    int bad = eat_mismatches(c, 10002);
    mskv_emu::cfg().ldsm_trans_off = 0;
    EXPECT_TRUE(bad);
}

/* One barrier a tile: after it the tile has landed for every thread and
   every warp is done with the stage refilled next. The races show with
   skewed warps (each runs as far as it can before the next). */
TEST(attn_planted_missing_barrier_after_the_copy_wait_is_detected) {
    eat_case c = eat_one(EAT_P_BF16_64, 16, 2, 1, 20, 200);
    mskv_emu::cfg().greedy_warps = 1;
    mskv_emu::cfg().skip_barrier = 1;
    int bad = eat_mismatches(c, 10003);
    mskv_emu::cfg().skip_barrier = -1;
    mskv_emu::cfg().greedy_warps = 0;
    EXPECT_TRUE(bad);
}

TEST(attn_planted_missing_barrier_before_a_stage_is_refilled_is_detected) {
    /* copies land at issue: a warp ahead overwrites the stage a slower one reads */
    eat_case c = eat_one(EAT_D_F16_128, 16, 4, 1, 1, 400);
    mskv_emu::cfg().greedy_warps = 1;
    mskv_emu::cfg().cp_async_eager = 1;
    mskv_emu::cfg().skip_barrier = 1;
    int bad = eat_mismatches(c, 10004);
    mskv_emu::cfg().skip_barrier = -1;
    mskv_emu::cfg().greedy_warps = 0;
    mskv_emu::cfg().cp_async_eager = 0;
    EXPECT_TRUE(bad);
}

TEST(attn_planted_missing_barrier_before_q_enters_registers_is_detected) {
    /* decode keeps Q in registers, read once from the last stage */
    eat_case c = eat_one(EAT_D_F16_128, 16, 4, 1, 1, 400);
    mskv_emu::cfg().greedy_warps = 1;
    mskv_emu::cfg().skip_barrier = 5;
    int bad = eat_mismatches(c, 10006);
    mskv_emu::cfg().skip_barrier = -1;
    mskv_emu::cfg().greedy_warps = 0;
    EXPECT_TRUE(bad);
}

TEST(attn_planted_wrong_page_divisor_is_detected) {
    /* the kernel divides by the page size with a magic multiply from the host */
    const int sizes[] = {3, 16};
    for (int P : sizes) {
        eat_case c = eat_one(EAT_P_BF16_64, P, 2, 1, 20, 150);
        c.divisor_page_size = P + 1;
        EXPECT_TRUE(eat_mismatches(c, 10007 + (uint64_t)P));
        c.divisor_page_size = 0;
        EXPECT_FALSE(eat_mismatches(c, 10007 + (uint64_t)P));
    }
}

TEST(attn_planted_missing_barrier_in_the_decode_merge_is_detected) {
    eat_case c = eat_one(EAT_D_BF16_64, 16, 4, 1, 1, 100);
    mskv_emu::cfg().greedy_warps = 1;
    mskv_emu::cfg().skip_barrier = 4;
    int bad = eat_mismatches(c, 10005);
    mskv_emu::cfg().skip_barrier = -1;
    mskv_emu::cfg().greedy_warps = 0;
    EXPECT_TRUE(bad);
}

TEST(attn_planted_bound_off_by_one_is_detected) {
    /* the kernel hides one key more (or less) than the reference at a sink end inside a tile */
    for (int d : {1, -1}) {
        eat_case c = eat_vis(EAT_P_BF16_64, 16, 9, 300, 1, 37, 200);
        c.sink_end_delta = d;
        EXPECT_TRUE(eat_mismatches(c, 13001));
        c.sink_end_delta = 0;
        EXPECT_FALSE(eat_mismatches(c, 13001));
    }
}
