/* Emulated tests of the simple kernels: kv_write (with fused RoPE), rope,
   page gather/scatter, and the LSE merge, against direct host computations. */
#include "mskv_test.h"
#include "emu/mskv_emu.h"
#include <random>

namespace ekv_f32 {
#define MSKV_DTYPE 0
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ekv_bf16 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 64
#include "../kernels.cu"
}
namespace ekv_r1_half {
#define MSKV_DTYPE 0
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
namespace ekv_r1_inter_part {
#define MSKV_DTYPE 0
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 1
#define MSKV_ROPE_STYLE 1
#define MSKV_ROPE_D0 32
#include "../kernels.cu"
}
namespace ekv_r3_default {
#define MSKV_DTYPE 0
#define MSKV_HEAD_DIM 64
#define MSKV_ROPE 2
#define MSKV_ROPE_STYLE 0
#include "../kernels.cu"
}
namespace ekv_r3_custom_bf16 {
#define MSKV_DTYPE 2
#define MSKV_HEAD_DIM 128
#define MSKV_ROPE 2
#define MSKV_ROPE_STYLE 1
#define MSKV_ROPE_D0 16
#define MSKV_ROPE_D1 24
#define MSKV_ROPE_D2 24
#include "../kernels.cu"
}

using mskv_emu::Dim3;

typedef void (*ekv_write_fn)(const void *, const void *, const mskv_i64 *, int, int, void *, void *, mskv_i64, const int *, float);
typedef void (*ekv_rope_fn)(void *, mskv_i64, int, const int *, float);

/* Rotates one head in double by the ABI's rule: parts of widths w[0..2] from
   dim 0; pair i of a part turns by pos[axis] * theta^(-2i/w). */
static void ekv_rope_ref(double *x, int D, int style, const int w[3], int naxes, const int *pos, double theta) {
    int base = 0;
    for (int a = 0; a < naxes; a++) {
        for (int i = 0; i < w[a] / 2; i++) {
            int e0 = style == 0 ? base + i : base + 2 * i, e1 = style == 0 ? base + i + w[a] / 2 : base + 2 * i + 1;
            double ang = pos[a] * std::pow(theta, -2.0 * i / w[a]), c = std::cos(ang), s = std::sin(ang);
            double u = x[e0], v = x[e1];
            x[e0] = u * c - v * s;
            x[e1] = u * s + v * c;
        }
        base += w[a];
    }
    (void)D;
}

/* kv_write of n tokens x kvh heads into a pool of `slots` slots; slot_of[t]
   may be out of range. f32 or 16-bit (dtype) elements; returns pools. */
template <typename T>
static int ekv_write(ekv_write_fn fn, int D, int n, int kvh, const std::vector<mskv_i64> &slot_of, mskv_i64 slots,
                     const std::vector<T> &k, const std::vector<T> &v, const std::vector<int> &pos, float theta,
                     std::vector<T> &kp, std::vector<T> &vp, T fill) {
    kp.assign((size_t)slots * kvh * D, fill);
    vp.assign(kp.size(), fill);
    return mskv_emu::launch(Dim3{(n * kvh + 3) / 4, 1, 1}, 128, 0, [&] {
        fn(k.data(), v.data(), slot_of.data(), n, kvh, kp.data(), vp.data(), slots, pos.data(), theta);
    });
}

TEST(kv_write_puts_each_row_at_its_slot_and_skips_invalid_slots) {
    const int D = 64, n = 7, kvh = 3;
    const mskv_i64 slots = 20;
    std::vector<mskv_i64> slot_of = {5, -1, 19, 0, 20, 11, 3};
    std::vector<float> k((size_t)n * kvh * D), v(k.size());
    for (size_t i = 0; i < k.size(); i++) { k[i] = (float)i; v[i] = -(float)i; }
    std::vector<float> kp, vp;
    std::vector<int> pos(n, 0);
    ASSERT_TRUE(ekv_write<float>(ekv_f32::mskv_kv_write, D, n, kvh, slot_of, slots, k, v, pos, 0.0f, kp, vp, 999.0f));
    int bad = 0, written = 0;
    for (mskv_i64 s = 0; s < slots; s++) {
        int t = -1;
        for (int i = 0; i < n; i++) if (slot_of[(size_t)i] == s) t = i;
        for (int h = 0; h < kvh; h++)
            for (int d = 0; d < D; d++) {
                size_t at = ((size_t)s * kvh + h) * D + d, src = ((size_t)t * kvh + h) * D + d;
                float ek = t < 0 ? 999.0f : k[src], ev = t < 0 ? 999.0f : v[src];
                if (kp[at] != ek || vp[at] != ev) bad++;
                if (t >= 0) written++;
            }
    }
    EXPECT_EQ(0, bad);
    EXPECT_EQ(5 * kvh * D, written);
}

TEST(kv_write_copies_16_bit_rows_bit_exactly) {
    const int D = 64, n = 5, kvh = 2;
    std::vector<mskv_i64> slot_of = {4, 3, 2, 1, 0};
    std::vector<mskv_u16> k((size_t)n * kvh * D), v(k.size()), kp, vp;
    std::mt19937 rng(7);
    for (size_t i = 0; i < k.size(); i++) { k[i] = (mskv_u16)rng(); v[i] = (mskv_u16)rng(); }
    std::vector<int> pos(n, 0);
    ASSERT_TRUE(ekv_write<mskv_u16>(ekv_bf16::mskv_kv_write, D, n, kvh, slot_of, 5, k, v, pos, 0.0f, kp, vp, 0));
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int e = 0; e < kvh * D; e++) {
            size_t at = (size_t)slot_of[(size_t)t] * kvh * D + e, src = (size_t)t * kvh * D + e;
            if (kp[at] != k[src] || vp[at] != v[src]) bad++;
        }
    EXPECT_EQ(0, bad);
}

/* Writes n tokens with RoPE (f32 pools) and compares K with the double
   reference, V with the input. */
static double ekv_rope_err(ekv_write_fn fn, int D, int style, const int w[3], int naxes, float theta, int *v_bad) {
    const int n = 6, kvh = 2;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<mskv_i64> slot_of;
    std::vector<float> k((size_t)n * kvh * D), v(k.size()), kp, vp;
    std::vector<int> pos((size_t)n * naxes);
    for (int t = 0; t < n; t++) slot_of.push_back(n - 1 - t);
    for (auto &x : k) x = uni(rng);
    for (auto &x : v) x = uni(rng);
    for (size_t i = 0; i < pos.size(); i++) pos[i] = (int)(rng() % 5000);
    if (!ekv_write<float>(fn, D, n, kvh, slot_of, n, k, v, pos, theta, kp, vp, 0.0f)) return 1e9;
    double err = 0;
    *v_bad = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < kvh; h++) {
            std::vector<double> x(D);
            size_t src = ((size_t)t * kvh + h) * D, dst = ((size_t)slot_of[(size_t)t] * kvh + h) * D;
            for (int d = 0; d < D; d++) x[(size_t)d] = k[src + d];
            ekv_rope_ref(x.data(), D, style, w, naxes, &pos[(size_t)t * naxes], theta > 0 ? theta : 10000.0);
            for (int d = 0; d < D; d++) {
                err = std::max(err, std::fabs(x[(size_t)d] - kp[dst + d]));
                if (vp[dst + d] != v[src + d]) (*v_bad)++;
            }
        }
    return err;
}

TEST(kv_write_rotates_k_by_1d_rope_half_style) {
    int w[3] = {64, 0, 0}, vb;
    EXPECT_NEAR(0.0, ekv_rope_err(ekv_r1_half::mskv_kv_write, 64, 0, w, 1, 0.0f, &vb), 2e-3);
    EXPECT_EQ(0, vb);
}

TEST(kv_write_rotates_only_the_rope_part_interleaved) {
    int w[3] = {32, 0, 0}, vb;   /* dims 32..63 must come through unchanged */
    EXPECT_NEAR(0.0, ekv_rope_err(ekv_r1_inter_part::mskv_kv_write, 64, 1, w, 1, 500.0f, &vb), 2e-3);
    EXPECT_EQ(0, vb);
}

TEST(kv_write_rotates_k_by_3d_rope_with_the_default_split) {
    int w[3] = {24, 20, 20}, vb;  /* p = 32 pairs: 2*(32 - 2*10), 2*10, 2*10 */
    EXPECT_NEAR(0.0, ekv_rope_err(ekv_r3_default::mskv_kv_write, 64, 0, w, 3, 0.0f, &vb), 2e-3);
    EXPECT_EQ(0, vb);
}

TEST(kv_write_rounds_rotated_16_bit_k_to_nearest) {
    /* bf16, 3-D interleaved parts 16/24/24 of 128 (the tail 64.. untouched) */
    const int D = 128, n = 4, kvh = 1, w[3] = {16, 24, 24};
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
    std::vector<mskv_i64> slot_of = {0, 1, 2, 3};
    std::vector<mskv_u16> k((size_t)n * D), v(k.size()), kp, vp;
    std::vector<int> pos((size_t)n * 3);
    for (auto &x : k) x = mskv_emu::f2b(uni(rng));
    for (auto &x : v) x = mskv_emu::f2b(uni(rng));
    for (auto &p : pos) p = (int)(rng() % 64);
    ASSERT_TRUE(ekv_write<mskv_u16>(ekv_r3_custom_bf16::mskv_kv_write, D, n, kvh, slot_of, n, k, v, pos, 0.0f, kp, vp, 0));
    int far = 0, tail_changed = 0;
    for (int t = 0; t < n; t++) {
        std::vector<double> x(D);
        for (int d = 0; d < D; d++) x[(size_t)d] = mskv_emu::b2f(k[(size_t)t * D + d]);
        ekv_rope_ref(x.data(), D, 1, w, 3, &pos[(size_t)t * 3], 10000.0);
        for (int d = 0; d < D; d++) {
            float got = mskv_emu::b2f(kp[(size_t)t * D + d]);
            /* within one bf16 step of the exact value (f32 sin/cos vs double) */
            if (std::fabs(got - x[(size_t)d]) > std::fabs(x[(size_t)d]) / 128.0 + 1e-6) far++;
            if (d >= 64 && kp[(size_t)t * D + d] != k[(size_t)t * D + d]) tail_changed++;
        }
    }
    EXPECT_EQ(0, far);
    EXPECT_EQ(0, tail_changed);
}

TEST(rope_kernel_rotates_in_place_like_kv_write) {
    const int D = 64, n = 5, heads = 3;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> x((size_t)n * heads * D), kp, vp;
    std::vector<int> pos((size_t)n * 3);
    std::vector<mskv_i64> slot_of;
    for (auto &e : x) e = uni(rng);
    for (auto &p : pos) p = (int)(rng() % 900);
    for (int t = 0; t < n; t++) slot_of.push_back(t);
    ASSERT_TRUE(ekv_write<float>(ekv_r3_default::mskv_kv_write, D, n, heads, slot_of, n, x, x, pos, 0.0f, kp, vp, 0.0f));
    std::vector<float> y(x);
    ASSERT_TRUE(mskv_emu::launch(Dim3{(n * heads + 3) / 4, 1, 1}, 128, 0, [&] {
        ekv_r3_default::mskv_rope(y.data(), n, heads, pos.data(), 0.0f);
    }));
    int diff = 0;
    for (size_t i = 0; i < y.size(); i++) if (y[i] != kp[i]) diff++;
    EXPECT_EQ(0, diff);
}

/* gather pages (listed out of order) to a staging buffer and scatter them into
   a fresh pool: the listed pages come back byte for byte, others untouched. */
static int ekv_gather_scatter(long long page_bytes, long long stride, int offset) {
    const int num_pages = 9;
    std::vector<int> pages = {7, 2, 5, 1};
    std::vector<unsigned char> pool((size_t)(num_pages * page_bytes) + 32), stage((size_t)(pages.size() * stride) + 32, 0), back(pool.size(), 0xee);
    std::mt19937 rng(9);
    for (auto &b : pool) b = (unsigned char)rng();
    unsigned char *P = pool.data() + offset, *S = stage.data() + offset, *B = back.data() + offset;
    int n = (int)pages.size();
    int gx = (int)std::min<long long>((page_bytes + 4095) / 4096, 65535);
    if (!mskv_emu::launch(Dim3{gx, n, 1}, 256, 0, [&] { ekv_bf16::mskv_page_gather(P, pages.data(), n, page_bytes, S, stride); })) return 0;
    if (!mskv_emu::launch(Dim3{gx, n, 1}, 256, 0, [&] { ekv_bf16::mskv_page_scatter(B, pages.data(), n, page_bytes, S, stride); })) return 0;
    for (int p = 0; p < num_pages; p++) {
        int listed = 0;
        for (int q : pages) listed |= q == p;
        for (long long i = 0; i < page_bytes; i++) {
            unsigned char want = listed ? P[p * page_bytes + i] : 0xee;
            if (B[p * page_bytes + i] != want) return 0;
        }
    }
    return 1;
}

TEST(page_gather_and_scatter_round_trip_with_16_byte_accesses) {
    EXPECT_TRUE(ekv_gather_scatter(2 * 4096 + 512, 2 * 4096 + 1024, 0));
}

TEST(page_gather_and_scatter_round_trip_unaligned) {
    EXPECT_TRUE(ekv_gather_scatter(4096 + 13, 4096 + 20, 3));
}

TEST(lse_merge_weights_parts_by_their_lse_and_ignores_empty_ones) {
    const int D = 64, parts = 3;
    const mskv_i64 rows = 5;
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> o((size_t)parts * rows * D), lse((size_t)parts * rows), out((size_t)rows * D, 5.0f), out_lse((size_t)rows, 5.0f);
    for (auto &x : o) x = uni(rng);
    for (auto &x : lse) x = 3.0f * uni(rng);
    lse[1 * rows + 2] = -INFINITY; o[(1 * rows + 2) * D] = NAN;  /* an empty part's o is never read */
    for (int p = 0; p < parts; p++) lse[p * rows + 4] = -INFINITY;  /* a row that saw nothing */
    ASSERT_TRUE(mskv_emu::launch(Dim3{(int)((rows + 3) / 4), 1, 1}, 128, 0, [&] {
        ekv_f32::mskv_lse_merge(o.data(), lse.data(), parts, rows, rows, out.data(), out_lse.data());
    }));
    double err = 0;
    for (mskv_i64 r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (int p = 0; p < parts; p++) m = std::max(m, (double)lse[p * rows + r]);
        for (int p = 0; p < parts; p++) if (std::isfinite(lse[p * rows + r])) s += std::exp(lse[p * rows + r] - m);
        if (s == 0) {
            EXPECT_TRUE(std::isinf(out_lse[(size_t)r]) && out_lse[(size_t)r] < 0);
            for (int d = 0; d < D; d++) EXPECT_EQ(0, out[(size_t)r * D + d] != 0.0f);
            continue;
        }
        err = std::max(err, std::fabs(out_lse[(size_t)r] - (m + std::log(s))));
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int p = 0; p < parts; p++)
                if (std::isfinite(lse[p * rows + r])) acc += std::exp(lse[p * rows + r] - m) * o[(p * rows + r) * D + d];
            err = std::max(err, std::fabs(acc / s - out[(size_t)r * D + d]));
        }
    }
    EXPECT_NEAR(0.0, err, 1e-5);
}

TEST(state_merge_of_two_parts_matches_the_formula_in_place) {
    const int D = 64;
    const mskv_i64 rows = 6;
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> oa((size_t)rows * D), ob(oa.size()), la((size_t)rows), lb((size_t)rows);
    for (auto &x : oa) x = uni(rng);
    for (auto &x : ob) x = uni(rng);
    for (auto &x : la) x = 4.0f * uni(rng);
    for (auto &x : lb) x = 4.0f * uni(rng);
    la[1] = -INFINITY;                      /* a empty: the result is b */
    lb[2] = -INFINITY;                      /* b empty: the result is a */
    la[3] = lb[3] = -INFINITY;              /* both empty: 0, -inf */
    std::vector<float> a0(oa), la0(la);
    ASSERT_TRUE(mskv_emu::launch(Dim3{(int)((rows + 3) / 4), 1, 1}, 128, 0, [&] {
        ekv_f32::mskv_state_merge(oa.data(), la.data(), ob.data(), lb.data(), rows, oa.data(), la.data());
    }));
    double err = 0;
    for (mskv_i64 r = 0; r < rows; r++) {
        double m = std::max(la0[(size_t)r], lb[(size_t)r]);
        double wa = std::isinf(la0[(size_t)r]) ? 0 : std::exp(la0[(size_t)r] - m), wb = std::isinf(lb[(size_t)r]) ? 0 : std::exp(lb[(size_t)r] - m);
        if (wa + wb == 0) {
            EXPECT_TRUE(std::isinf(la[(size_t)r]) && la[(size_t)r] < 0);
            for (int d = 0; d < D; d++) EXPECT_EQ(0, oa[(size_t)r * D + d] != 0.0f);
            continue;
        }
        err = std::max(err, std::fabs(la[(size_t)r] - (m + std::log(wa + wb))));
        for (int d = 0; d < D; d++) {
            size_t i = (size_t)r * D + d;
            err = std::max(err, std::fabs(oa[i] - (wa * a0[i] + wb * ob[i]) / (wa + wb)));
        }
    }
    EXPECT_NEAR(0.0, err, 1e-5);
}
