/* mskv_emu.h - host emulation of the device primitives kernels.cu is written
   against, so the kernels run (slowly, exactly) on a CPU in CI.

   Each block runs on the CPU with one fibre per GPU thread (ucontext stacks,
   round-robin scheduling). __syncthreads waits until every live fibre of the
   block arrives. Warp-collective operations (shuffles, mma.sync, ldmatrix)
   are rendezvous of the warp's 32 lanes: each lane deposits its operands, the
   last to arrive computes every lane's result following the PTX ISA fragment
   layouts, and each lane then takes its own. cp.async copies are deferred
   until the issuing thread's cp.async.wait_group releases their group, so a
   missing wait (or a missing barrier after it) reads stale shared memory,
   which starts out as NaN bytes.

   Include this header, then kernels.cu (after the -D style defines, here as
   #defines), in one C++17 translation unit; launch with mskv_emu::launch().
   Planted-bug switches (mskv_emu::cfg()) let tests check that a wrong fragment
   layout or a dropped barrier makes the kernels' results wrong. */
#ifndef MSKV_EMU_H
#define MSKV_EMU_H

#include <ucontext.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

typedef uint16_t mskv_u16;
typedef uint32_t mskv_u32;
typedef long long mskv_i64;
typedef unsigned long long mskv_u64;
struct alignas(16) mskv_v16 { mskv_u32 x, y, z, w; };

#define MSKV_KERNEL static inline
#define MSKV_DEV static inline
#define MSKV_RESTRICT
#define MSKV_UNROLL
#define MSKV_SMEM(name) unsigned char *name = mskv_emu::smem()

namespace mskv_emu {

/* Planted bugs, for tests that must see the kernels fail. */
struct Config {
    int skip_barrier = -1;    /* MSKV_SYNC_ID(n) with n == skip_barrier is a no-op */
    int mma_swap_rows = 0;    /* mma reads A's rows g and g+8 swapped */
    int ldsm_trans_off = 0;   /* ldmatrix .trans behaves like the plain form */
    int cp_async_eager = 0;   /* cp.async lands at issue: the earliest legal time
                                 (shows write-after-read races), instead of at
                                 the wait (the latest: shows a missing wait) */
    int greedy_warps = 0;     /* run each warp as far as it goes before the next
                                 (maximal skew between warps) instead of
                                 round-robin over threads */
};
inline Config &cfg() { static Config c; return c; }

enum Op { OP_NONE, OP_SYNCWARP, OP_SHFL, OP_MMA_F16, OP_MMA_BF16, OP_LDSM, OP_LDSM_T };

struct Pending { unsigned char *dst; unsigned char data[16]; int group; };

struct Fiber {
    ucontext_t ctx;
    int tid = 0;
    bool done = false;
    std::vector<Pending> pend;
    int commits = 0;
    int bar_gen = -1;         /* the barrier generation it waits on, -1 when running */
};

struct Warp {
    int arrived = 0, gen = 0, alive = 0, op = OP_NONE;
    int arg = 0;
    mskv_u32 in[32][10];
    const unsigned char *ptr[32];
    mskv_u32 out[32][4];
};

struct State {
    int bx = 0, by = 0, bz = 0, gx = 1, gy = 1, gz = 1, nthreads = 0, alive = 0;
    int bar_count = 0, bar_gen = 0;
    std::vector<unsigned char> smem;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    std::vector<std::vector<unsigned char>> stacks;
    Fiber *cur = nullptr;
    ucontext_t sched;
    const std::function<void()> *body = nullptr;
    std::string error;
};
inline State &st() { static State s; return s; }

inline void fail(const char *what) {
    if (st().error.empty()) st().error = what;
}
inline const std::string &error() { return st().error; }
inline void clear_error() { st().error.clear(); }

inline void yield() { swapcontext(&st().cur->ctx, &st().sched); }

inline unsigned char *smem() { return st().smem.data(); }

inline bool in_smem(const void *p, size_t n) {
    const unsigned char *b = st().smem.data(), *q = (const unsigned char *)p;
    return q >= b && q + n <= b + st().smem.size();
}

inline void barrier_release_if_complete() {
    State &s = st();
    if (s.bar_count > 0 && s.bar_count >= s.alive) { s.bar_count = 0; s.bar_gen++; }
}

inline void sync() {
    State &s = st();
    int g = s.bar_gen;
    s.bar_count++;
    barrier_release_if_complete();
    s.cur->bar_gen = g;
    while (s.bar_gen == g) yield();
    s.cur->bar_gen = -1;
}

inline Warp &my_warp() { return st().warps[(size_t)(st().cur->tid >> 5)]; }
inline int lane() { return st().cur->tid & 31; }

inline void compute(Warp &w);

/* Deposit done by the caller; wait for the warp, the last lane computes. */
inline void rendezvous(Warp &w, int op) {
    int g = w.gen;
    if (w.arrived == 0) w.op = op;
    else if (w.op != op) fail("warp lanes reached different collective operations");
    w.arrived++;
    if (w.arrived >= w.alive) {
        if (w.alive != 32) fail("warp collective with fewer than 32 live lanes");
        compute(w);
        w.arrived = 0;
        w.gen++;
        return;
    }
    while (w.gen == g) yield();
}

inline float u2f(mskv_u32 u) { float f; std::memcpy(&f, &u, 4); return f; }
inline mskv_u32 f2u(float f) { mskv_u32 u; std::memcpy(&u, &f, 4); return u; }

inline float h2f(mskv_u16 h) {
    mskv_u32 s = (mskv_u32)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 0) {
        float v = std::ldexp((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31) return u2f(s | 0x7f800000u | (m << 13));
    return u2f(s | ((e + 112) << 23) | (m << 13));
}
inline mskv_u16 f2h(float f) {
    mskv_u32 u = f2u(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (mskv_u16)(s | 0x7e00u);
    if (a >= 0x477ff000u) return (mskv_u16)(s | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) { /* subnormal half (or zero): round |f| * 2^24 to an integer, ties to even */
        float v = std::nearbyint(u2f(a) * 16777216.0f);
        return (mskv_u16)(s | (mskv_u32)v);
    }
    {
        mskv_u32 r = a + 0xfffu + ((a >> 13) & 1u);
        return (mskv_u16)(s | ((r - 0x38000000u) >> 13));
    }
}
inline float b2f(mskv_u16 h) { return u2f((mskv_u32)h << 16); }
inline mskv_u16 f2b(float f) {
    mskv_u32 u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mskv_u16)((u >> 16) | 0x40u);
    return (mskv_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline void compute(Warp &w) {
    Config &c = cfg();
    switch (w.op) {
    case OP_SYNCWARP:
        break;
    case OP_SHFL:
        for (int l = 0; l < 32; l++) w.out[l][0] = w.in[l ^ (int)w.in[l][1]][0];
        break;
    case OP_MMA_F16: case OP_MMA_BF16: {
        float A[16][16], B[16][8], C[16][8];
        bool bf = w.op == OP_MMA_BF16;
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3, r0 = c.mma_swap_rows ? g + 8 : g, r1 = c.mma_swap_rows ? g : g + 8;
            const mskv_u32 *a = w.in[l];
            auto cv = [bf](mskv_u32 x) { return bf ? b2f((mskv_u16)x) : h2f((mskv_u16)x); };
            A[r0][2 * t] = cv(a[0] & 0xffff); A[r0][2 * t + 1] = cv(a[0] >> 16);
            A[r1][2 * t] = cv(a[1] & 0xffff); A[r1][2 * t + 1] = cv(a[1] >> 16);
            A[r0][2 * t + 8] = cv(a[2] & 0xffff); A[r0][2 * t + 9] = cv(a[2] >> 16);
            A[r1][2 * t + 8] = cv(a[3] & 0xffff); A[r1][2 * t + 9] = cv(a[3] >> 16);
            B[2 * t][g] = cv(a[4] & 0xffff); B[2 * t + 1][g] = cv(a[4] >> 16);
            B[2 * t + 8][g] = cv(a[5] & 0xffff); B[2 * t + 9][g] = cv(a[5] >> 16);
            C[g][2 * t] = u2f(a[6]); C[g][2 * t + 1] = u2f(a[7]);
            C[g + 8][2 * t] = u2f(a[8]); C[g + 8][2 * t + 1] = u2f(a[9]);
        }
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3;
            int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
            for (int i = 0; i < 4; i++) {
                float acc = C[rows[i]][cols[i]];
                for (int k = 0; k < 16; k++) acc += A[rows[i]][k] * B[k][cols[i]];
                w.out[l][i] = f2u(acc);
            }
        }
        break;
    }
    case OP_LDSM: case OP_LDSM_T: {
        bool tr = w.op == OP_LDSM_T && !c.ldsm_trans_off;
        for (int l = 0; l < 32; l++) {
            if (((uintptr_t)w.ptr[l] & 15) != 0 || !in_smem(w.ptr[l], 16)) fail("ldmatrix row address not a 16-byte aligned shared address");
        }
        if (!st().error.empty()) break;
        for (int l = 0; l < 32; l++) {
            for (int m = 0; m < 4; m++) {
                mskv_u16 lo, hi;
                if (!tr) {
                    const unsigned char *row = w.ptr[m * 8 + (l >> 2)];
                    std::memcpy(&lo, row + 4 * (l & 3), 2);
                    std::memcpy(&hi, row + 4 * (l & 3) + 2, 2);
                } else {
                    std::memcpy(&lo, w.ptr[m * 8 + 2 * (l & 3)] + 2 * (l >> 2), 2);
                    std::memcpy(&hi, w.ptr[m * 8 + 2 * (l & 3) + 1] + 2 * (l >> 2), 2);
                }
                w.out[l][m] = (mskv_u32)lo | ((mskv_u32)hi << 16);
            }
        }
        break;
    }
    default: fail("unknown warp operation");
    }
}

inline float shfl_xor(float v, int m) {
    Warp &w = my_warp();
    int l = lane();
    w.in[l][0] = f2u(v);
    w.in[l][1] = (mskv_u32)m;
    rendezvous(w, OP_SHFL);
    return u2f(w.out[l][0]);
}

inline void syncwarp() { rendezvous(my_warp(), OP_SYNCWARP); }

inline void mma(float d[4], const mskv_u32 a[4], const mskv_u32 b[2], bool bf) {
    Warp &w = my_warp();
    int l = lane();
    for (int i = 0; i < 4; i++) w.in[l][i] = a[i];
    w.in[l][4] = b[0]; w.in[l][5] = b[1];
    for (int i = 0; i < 4; i++) w.in[l][6 + i] = f2u(d[i]);
    rendezvous(w, bf ? OP_MMA_BF16 : OP_MMA_F16);
    for (int i = 0; i < 4; i++) d[i] = u2f(w.out[l][i]);
}

inline void ldsm(mskv_u32 r[4], const void *p, bool trans) {
    Warp &w = my_warp();
    int l = lane();
    w.ptr[l] = (const unsigned char *)p;
    rendezvous(w, trans ? OP_LDSM_T : OP_LDSM);
    for (int i = 0; i < 4; i++) r[i] = w.out[l][i];
}

inline void cp_async16(void *dst, const void *src, int src_bytes) {
    Fiber *f = st().cur;
    Pending p;
    if (((uintptr_t)dst & 15) != 0 || !in_smem(dst, 16)) { fail("cp.async destination not a 16-byte aligned shared address"); return; }
    if (src_bytes != 0 && src_bytes != 16) { fail("cp.async src size other than 0 or 16"); return; }
    if (src_bytes && ((uintptr_t)src & 15) != 0) { fail("cp.async source not 16-byte aligned"); return; }
    p.dst = (unsigned char *)dst;
    std::memset(p.data, 0, 16);
    if (src_bytes) std::memcpy(p.data, src, 16);
    if (cfg().cp_async_eager) { std::memcpy(p.dst, p.data, 16); return; }
    p.group = f->commits;
    f->pend.push_back(p);
}
inline void cp_commit() { st().cur->commits++; }
inline void cp_wait(int n) {
    Fiber *f = st().cur;
    std::vector<Pending> keep;
    for (const Pending &p : f->pend) {
        if (p.group < f->commits - n) std::memcpy(p.dst, p.data, 16);
        else keep.push_back(p);
    }
    f->pend.swap(keep);
}

inline void trampoline() {
    State &s = st();
    (*s.body)();
    cp_wait(0);  /* a thread's outstanding copies land when it exits */
    s.cur->done = true;
    s.alive--;
    s.warps[(size_t)(s.cur->tid >> 5)].alive--;
    barrier_release_if_complete();
    /* uc_link returns to the scheduler */
}

struct Dim3 { int x, y, z; };

/* Runs body once per thread of every block, blocks one after another.
   Returns false (and error() says why) when the emulation caught a misuse. */
inline bool launch(Dim3 grid, int block_threads, size_t smem_bytes, const std::function<void()> &body) {
    State &s = st();
    const size_t stack_bytes = 64 * 1024;
    if (block_threads <= 0 || block_threads % 32 != 0 || block_threads > 1024) { fail("block size must be a multiple of 32 up to 1024"); return false; }
    s.body = &body;
    s.gx = grid.x; s.gy = grid.y; s.gz = grid.z;
    s.nthreads = block_threads;
    s.stacks.resize((size_t)block_threads);
    for (auto &stk : s.stacks) if (stk.size() != stack_bytes) stk.assign(stack_bytes, 0);
    for (int bz = 0; bz < grid.z; bz++)
    for (int by = 0; by < grid.y; by++)
    for (int bx = 0; bx < grid.x; bx++) {
        s.bx = bx; s.by = by; s.bz = bz;
        s.smem.assign(smem_bytes + 16, 0xff);  /* NaN bytes: reading unwritten smem shows */
        s.fibers.assign((size_t)block_threads, Fiber());
        s.warps.assign((size_t)(block_threads / 32), Warp());
        for (auto &w : s.warps) w.alive = 32;
        s.alive = block_threads;
        s.bar_count = 0;
        for (int t = 0; t < block_threads; t++) {
            Fiber &f = s.fibers[(size_t)t];
            f.tid = t;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = s.stacks[(size_t)t].data();
            f.ctx.uc_stack.ss_size = stack_bytes;
            f.ctx.uc_link = &s.sched;
            makecontext(&f.ctx, (void (*)(void))trampoline, 0);
        }
        while (s.alive > 0 && s.error.empty()) {
            if (!cfg().greedy_warps) {
                for (int t = 0; t < block_threads; t++) {
                    Fiber &f = s.fibers[(size_t)t];
                    if (f.done) continue;
                    s.cur = &f;
                    swapcontext(&s.sched, &f.ctx);
                }
                continue;
            }
            for (int w = 0; w < block_threads / 32 && s.error.empty(); w++) {
                for (;;) {  /* this warp until every lane is done or held at a block barrier */
                    int ran = 0;
                    for (int t = 32 * w; t < 32 * w + 32; t++) {
                        Fiber &f = s.fibers[(size_t)t];
                        if (f.done || (f.bar_gen >= 0 && f.bar_gen == s.bar_gen)) continue;
                        s.cur = &f;
                        swapcontext(&s.sched, &f.ctx);
                        ran = 1;
                    }
                    if (!ran || !s.error.empty()) break;
                }
            }
        }
        s.cur = nullptr;
        if (!s.error.empty()) return false;
    }
    return true;
}

} /* namespace mskv_emu */

MSKV_DEV int mskv_tid(void) { return mskv_emu::st().cur->tid; }
MSKV_DEV int mskv_bid_x(void) { return mskv_emu::st().bx; }
MSKV_DEV int mskv_bid_y(void) { return mskv_emu::st().by; }
MSKV_DEV int mskv_bid_z(void) { return mskv_emu::st().bz; }
MSKV_DEV int mskv_nblk_x(void) { return mskv_emu::st().gx; }
MSKV_DEV int mskv_nblk_y(void) { return mskv_emu::st().gy; }
MSKV_DEV void mskv_sync(void) { mskv_emu::sync(); }
#define MSKV_SYNC_ID(id) do { if (mskv_emu::cfg().skip_barrier != (id)) mskv_emu::sync(); } while (0)
MSKV_DEV float mskv_shfl_xor(float v, int m) { return mskv_emu::shfl_xor(v, m); }
MSKV_DEV void mskv_syncwarp(void) { mskv_emu::syncwarp(); }
MSKV_DEV float mskv_exp2(float x) { return std::exp2(x); }
MSKV_DEV float mskv_h2f(mskv_u16 h) { return mskv_emu::h2f(h); }
MSKV_DEV mskv_u16 mskv_f2h(float f) { return mskv_emu::f2h(f); }
MSKV_DEV float mskv_b2f(mskv_u16 h) { return mskv_emu::b2f(h); }
MSKV_DEV mskv_u16 mskv_f2b(float f) { return mskv_emu::f2b(f); }
MSKV_DEV float mskv_u_as_f(mskv_u32 u) { return mskv_emu::u2f(u); }
MSKV_DEV mskv_u32 mskv_f_as_u(float f) { return mskv_emu::f2u(f); }
MSKV_DEV void mskv_mma_f16(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) { mskv_emu::mma(d, a, b, false); }
MSKV_DEV void mskv_mma_bf16(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) { mskv_emu::mma(d, a, b, true); }
MSKV_DEV void mskv_ldsm_x4(mskv_u32 r[4], const void *p) { mskv_emu::ldsm(r, p, false); }
MSKV_DEV void mskv_ldsm_x4_t(mskv_u32 r[4], const void *p) { mskv_emu::ldsm(r, p, true); }
MSKV_DEV void mskv_cp_async16(void *dst, const void *src, int src_bytes) { mskv_emu::cp_async16(dst, src, src_bytes); }
MSKV_DEV void mskv_cp_commit(void) { mskv_emu::cp_commit(); }
template <int N> MSKV_DEV void mskv_cp_wait(void) { mskv_emu::cp_wait(N); }

#endif /* MSKV_EMU_H */
