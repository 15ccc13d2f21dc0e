/* mskv_emu.h - host emulation of the device primitives kernels.cu is written
   against, so the kernels run (slowly, exactly) on a CPU in CI.

   Each block runs on the CPU with one fibre per GPU thread (ucontext stacks,
   round-robin scheduling; or a warp at a time as far as it goes, in warp
   order or, cfg().random_warps, in a seeded random order at every pass).
   __syncthreads waits until every live fibre of the block arrives. Warp-collective operations (shuffles, mma.sync, ldmatrix)
   are rendezvous of the warp's 32 lanes: each lane deposits its operands, the
   last to arrive computes every lane's result following the PTX ISA fragment
   layouts, and each lane then takes its own. cp.async copies are deferred
   until the issuing thread's cp.async.wait_group releases their group, so a
   missing wait (or a missing barrier after it) reads stale shared memory,
   which starts out as NaN bytes.

   Shared memory: the block's dynamic shared memory starts at a shared-window
   address (saddr) with the same alignment modulo 1024 as its host pointer, so
   address arithmetic on either agrees; every emulated writer (cp.async, bulk
   copies) also records what it wrote, per 16-byte granule, so readers in the
   async proxy (wgmma, see mskv_emu_sm90.h) can be checked.

   Every thread that cannot proceed waits in a yield loop; a full scheduling
   pass in which no thread got past anything is a deadlock, reported with
   what each thread waits on (instead of a test that hangs).

   Include this header, then kernels.cu (after the -D style defines, here as
   #defines), in one C++17 translation unit; launch with mskv_emu::launch().
   Planted-bug switches (mskv_emu::cfg()) let tests check that a wrong fragment
   layout or a dropped barrier makes the kernels' results wrong. The Hopper
   primitives (wgmma, mbarrier, TMA, setmaxnreg, proxy fences, named barriers)
   are in mskv_emu_sm90.h, included at the end. */
#ifndef MSKV_EMU_H
#define MSKV_EMU_H

#include <ucontext.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
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
    unsigned long long random_warps = 0; /* nonzero: the seed of a scheduling mode that, at
                                 every pass, runs the block's warps in a fresh random
                                 order (so the warps of a warpgroup, and the other
                                 warpgroups' between them), each as far as it goes
                                 (as greedy_warps); reseeded at each launch; starts
                                 as $MSKV_EMU_RANDOM_WARPS (to run any test so) */
    int smem_base_offset = 0; /* dynamic shared memory starts this many bytes past a
                                 1024-byte boundary (a multiple of 16): kernels that
                                 align their own buffers must not assume it is 0 */
    /* Hopper (mskv_emu_sm90.h): planted kernel bugs */
    int wgmma_swizzle_override = -1; /* wgmma reads every descriptor with this swizzle mode
                                        (0 none, 1 128 B, 2 64 B, 3 32 B) instead of its own */
    int skip_wgmma_wait = 0;         /* wgmma.wait_group does nothing */
    int skip_fence_proxy = 0;        /* fence.proxy.async does nothing */
    int mbar_parity_flip_wg = -1;    /* mbarrier waits of this warpgroup use the other parity */
    int skip_mbar_wait_wg = -1;      /* mbarrier waits of this warpgroup return at once */
    int tma_eager = 0;               /* bulk copies land at issue (else at the latest legal
                                        time: when a wait needs their bytes) */
};
inline Config &cfg() {
    static Config c = [] {
        Config x;
        const char *e = std::getenv("MSKV_EMU_RANDOM_WARPS");
        if (e && *e) x.random_warps = std::strtoull(e, nullptr, 10);
        return x;
    }();
    return c;
}

enum Op { OP_NONE, OP_SYNCWARP, OP_SHFL, OP_MMA_F16, OP_MMA_BF16, OP_LDSM, OP_LDSM_T };

struct Pending { unsigned char *dst; unsigned char data[16]; int group; };

enum Wait { WAIT_NONE, WAIT_SYNC, WAIT_WARP, WAIT_WARPGROUP, WAIT_NBAR, WAIT_MBAR };

struct Fiber {
    ucontext_t ctx;
    int tid = 0;
    bool done = false;
    std::vector<Pending> pend;
    int commits = 0;
    int bar_gen = -1;         /* the barrier generation it waits on, -1 when running */
    int wait = WAIT_NONE;     /* what it is blocked on (the deadlock report) */
    mskv_u32 wait_addr = 0;
    int wait_arg = 0;
    int proxy_fences = 0;     /* fence.proxy.async executed so far */
};

struct Warp {
    int arrived = 0, gen = 0, alive = 0, op = OP_NONE;
    int arg = 0;
    mskv_u32 in[32][10];
    const unsigned char *ptr[32];
    mskv_u32 out[32][4];
};

struct NamedBarrier { int count = 0, expected = 0, gen = 0; };

struct State {
    int bx = 0, by = 0, bz = 0, gx = 1, gy = 1, gz = 1, nthreads = 0, alive = 0;
    int bar_count = 0, bar_gen = 0;
    std::vector<unsigned char> smem_store;   /* backing; smem_base points into it */
    unsigned char *smem_base = nullptr;
    size_t smem_bytes = 0;                   /* usable bytes from smem_base */
    mskv_u32 saddr0 = 0;                     /* shared-window address of smem_base */
    /* per 16-byte granule of shared memory */
    std::vector<unsigned char> shadow;       /* the bytes the emulated writers last stored */
    std::vector<unsigned char> g_written;    /* written by anything since the launch */
    std::vector<int> g_writer, g_epoch;      /* generic-proxy writer (-1: none) and its fence count then */
    std::vector<int> g_copies;               /* copies in flight that will write it */
    std::vector<int> g_reads;                /* in-flight wgmma that read it */
    NamedBarrier nbar[16];
    long events = 0;                         /* anything got past anything (deadlock detection) */
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    std::vector<std::vector<unsigned char>> stacks;
    std::mt19937_64 warp_rng;                /* cfg().random_warps */
    std::vector<int> warp_order;
    Fiber *cur = nullptr;
    ucontext_t sched;
    const std::function<void()> *body = nullptr;
    std::string error;
};
inline State &st() { static State s; return s; }

inline void yield() { swapcontext(&st().cur->ctx, &st().sched); }

/* Records the first misuse. A thread that hits one stops there (the launch
   ends after the current pass), so it never runs on with a broken state. */
inline void fail(const char *what) {
    if (st().error.empty()) st().error = what;
    if (st().cur)
        for (;;) yield();
}
inline const std::string &error() { return st().error; }
inline void clear_error() { st().error.clear(); }

inline unsigned char *smem() { return st().smem_base; }

inline bool in_smem(const void *p, size_t n) {
    const unsigned char *b = st().smem_base, *q = (const unsigned char *)p;
    return b && q >= b && q + n <= b + st().smem_bytes;
}
/* shared-window address <-> host pointer */
inline mskv_u32 saddr(const void *p) { return st().saddr0 + (mskv_u32)((const unsigned char *)p - st().smem_base); }
inline unsigned char *sptr(mskv_u32 a) { return st().smem_base + ((long long)a - (long long)st().saddr0); }
inline bool saddr_ok(mskv_u32 a, size_t n) {
    return a >= st().saddr0 && (size_t)(a - st().saddr0) + n <= st().smem_bytes;
}

inline void note() { st().events++; }

/* Blocks the calling thread until the scheduler comes back to it. */
inline void wait_yield(int kind, mskv_u32 addr, int arg) {
    Fiber *f = st().cur;
    f->wait = kind; f->wait_addr = addr; f->wait_arg = arg;
    yield();
    f->wait = WAIT_NONE;
}

/* ---- shared-memory writes and async-proxy reads, per 16-byte granule ---- */
inline size_t gran(const void *p) { return (size_t)((const unsigned char *)p - st().smem_base) >> 4; }

inline bool overwrites_wgmma_reads(const unsigned char *dst, size_t n) {
    State &s = st();
    for (size_t g = gran(dst); g <= gran(dst + n - 1); g++)
        if (s.g_reads[g] > 0) return true;
    return false;
}
/* tid >= 0: a generic-proxy write (cp.async, st.shared) by that thread, which
   the async proxy may read only after the thread's next fence.proxy.async;
   tid < 0: an async-proxy write (a bulk copy). */
inline void tracked_write(unsigned char *dst, const void *src, size_t n, int tid) {
    State &s = st();
    if (overwrites_wgmma_reads(dst, n)) {
        fail(tid >= 0 ? "a generic write lands in shared memory an in-flight wgmma still reads (release before wgmma.wait_group?)"
                      : "a bulk copy lands in shared memory an in-flight wgmma still reads (the producer overran the ring?)");
        return;
    }
    std::memcpy(dst, src, n);
    std::memcpy(s.shadow.data() + (dst - s.smem_base), src, n);
    for (size_t g = gran(dst); g <= gran(dst + n - 1); g++) {
        s.g_written[g] = 1;
        s.g_writer[g] = tid;
        s.g_epoch[g] = tid >= 0 ? s.fibers[(size_t)tid].proxy_fences : 0;
    }
}
/* May the async proxy read [p, p+n) now? Fails (and returns false) when a copy
   still writes it, nothing wrote it, a generic write to it was not fenced, or
   plain stores (which the emulation cannot see) changed it. */
inline bool async_read_ok(const unsigned char *p, size_t n, const char *who) {
    State &s = st();
    static char msg[256];
    for (size_t g = gran(p); g <= gran(p + n - 1); g++) {
        const char *why = nullptr;
        size_t off = g << 4;
        if (s.g_copies[g] > 0) why = "shared memory a copy is still writing (a missing or wrong mbarrier wait?)";
        else if (!s.g_written[g]) why = "shared memory nothing has written";
        else if (s.g_writer[g] >= 0 && s.fibers[(size_t)s.g_writer[g]].proxy_fences == s.g_epoch[g])
            why = "shared memory written through the generic proxy without a fence.proxy.async since";
        else if (std::memcmp(s.smem_base + off, s.shadow.data() + off, 16) != 0)
            why = "shared memory changed by plain stores (only cp.async and bulk copies are tracked)";
        if (why) {
            std::snprintf(msg, sizeof msg, "%s reads %s (shared address 0x%x)", who, why, (unsigned)(s.saddr0 + off));
            fail(msg);
            return false;
        }
    }
    return true;
}

inline void barrier_release_if_complete() {
    State &s = st();
    if (s.bar_count > 0 && s.bar_count >= s.alive) { s.bar_count = 0; s.bar_gen++; }
}

inline void sync() {
    State &s = st();
    int g = s.bar_gen;
    note();
    s.bar_count++;
    barrier_release_if_complete();
    s.cur->bar_gen = g;
    while (s.bar_gen == g) wait_yield(WAIT_SYNC, 0, 0);
    s.cur->bar_gen = -1;
}

/* bar.sync / bar.arrive id, n: n threads (a multiple of 32) meet at barrier
   id (1..15; 0 is __syncthreads). arrive counts without waiting. */
inline void named_barrier(int id, int n, bool wait) {
    State &s = st();
    char msg[128];
    if (id <= 0 || id > 15 || n <= 0 || n % 32 != 0 || n > s.nthreads) {
        std::snprintf(msg, sizeof msg, "named barrier %d with %d threads: ids 1..15, a multiple of 32 up to the block", id, n);
        fail(msg);
        return;
    }
    NamedBarrier &b = s.nbar[id];
    if (b.count > 0 && b.expected != n) {
        std::snprintf(msg, sizeof msg, "named barrier %d used with %d and %d threads at once", id, b.expected, n);
        fail(msg);
        return;
    }
    note();
    b.expected = n;
    int g = b.gen;
    if (++b.count == n) { b.count = 0; b.gen++; }
    if (!wait) return;
    while (b.gen == g) wait_yield(WAIT_NBAR, (mskv_u32)id, n);
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
    note();
    if (w.arrived >= w.alive) {
        if (w.alive != 32) fail("warp collective with fewer than 32 live lanes");
        compute(w);
        w.arrived = 0;
        w.gen++;
        return;
    }
    while (w.gen == g) wait_yield(WAIT_WARP, 0, 0);
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
    note();
    if (cfg().cp_async_eager) { tracked_write(p.dst, p.data, 16, f->tid); return; }
    if (overwrites_wgmma_reads(p.dst, 16)) { fail("cp.async into shared memory an in-flight wgmma still reads"); return; }
    p.group = f->commits;
    f->pend.push_back(p);
    st().g_copies[gran(p.dst)]++;
}
inline void cp_commit() { st().cur->commits++; }
inline void cp_wait(int n) {
    Fiber *f = st().cur;
    std::vector<Pending> keep;
    for (const Pending &p : f->pend) {
        if (p.group < f->commits - n) {
            st().g_copies[gran(p.dst)]--;
            tracked_write(p.dst, p.data, 16, f->tid);
        } else {
            keep.push_back(p);
        }
    }
    f->pend.swap(keep);
    note();
}

/* the Hopper state (mskv_emu_sm90.h) */
inline void sm90_block_begin();
inline void sm90_thread_exit();
inline bool sm90_flush();
inline void sm90_block_end();
inline void sm90_describe(const Fiber &f, char *out, size_t cap);

inline void trampoline() {
    State &s = st();
    (*s.body)();
    cp_wait(0);  /* a thread's outstanding copies land when it exits */
    sm90_thread_exit();
    note();
    s.cur->done = true;
    s.alive--;
    s.warps[(size_t)(s.cur->tid >> 5)].alive--;
    barrier_release_if_complete();
    /* uc_link returns to the scheduler */
}

struct Dim3 { int x, y, z; };

/* Every live thread waits and nothing changed in a whole pass: say on what. */
inline void report_deadlock() {
    State &s = st();
    std::string msg = "deadlock: every live thread waits and none can proceed:";
    int first = -1;
    char cur[256] = "", prev[256] = "";
    auto flush = [&](int last) {
        char buf[320];
        if (first < 0) return;
        std::snprintf(buf, sizeof buf, " threads %d-%d %s;", first, last, prev);
        msg += buf;
    };
    for (int t = 0; t <= s.nthreads; t++) {
        cur[0] = 0;
        if (t < s.nthreads) {
            const Fiber &f = s.fibers[(size_t)t];
            if (f.done) std::snprintf(cur, sizeof cur, "exited");
            else if (f.wait == WAIT_SYNC) std::snprintf(cur, sizeof cur, "at __syncthreads");
            else if (f.wait == WAIT_WARP) std::snprintf(cur, sizeof cur, "at a warp collective");
            else if (f.wait == WAIT_WARPGROUP) std::snprintf(cur, sizeof cur, "at a warpgroup collective");
            else if (f.wait == WAIT_NBAR)
                std::snprintf(cur, sizeof cur, "at named barrier %u (%d of %d arrived)", (unsigned)f.wait_addr,
                              s.nbar[f.wait_addr & 15].count, f.wait_arg);
            else sm90_describe(f, cur, sizeof cur);
        }
        if (t == s.nthreads || std::strcmp(cur, prev) != 0) {
            flush(t - 1);
            first = t;
            std::memcpy(prev, cur, sizeof prev);
        }
    }
    fail(msg.c_str());
}

/* After a pass: no thread got anywhere. Copies still in flight may free
   someone; if none, it is a deadlock. */
inline void check_progress(long before) {
    State &s = st();
    if (s.events != before || s.alive == 0 || !s.error.empty()) return;
    if (!sm90_flush()) report_deadlock();
}

/* Runs body once per thread of every block, blocks one after another.
   Returns false (and error() says why) when the emulation caught a misuse. */
inline bool launch(Dim3 grid, int block_threads, size_t smem_bytes, const std::function<void()> &body) {
    State &s = st();
    const size_t stack_bytes = 64 * 1024;
    if (block_threads <= 0 || block_threads % 32 != 0 || block_threads > 1024) { fail("block size must be a multiple of 32 up to 1024"); return false; }
    s.body = &body;
    if (cfg().random_warps) s.warp_rng.seed(cfg().random_warps);
    s.gx = grid.x; s.gy = grid.y; s.gz = grid.z;
    s.nthreads = block_threads;
    s.stacks.resize((size_t)block_threads);
    for (auto &stk : s.stacks) if (stk.size() != stack_bytes) stk.assign(stack_bytes, 0);
    for (int bz = 0; bz < grid.z; bz++)
    for (int by = 0; by < grid.y; by++)
    for (int bx = 0; bx < grid.x; bx++) {
        s.bx = bx; s.by = by; s.bz = bz;
        {
            /* NaN bytes: reading unwritten smem shows */
            const size_t bytes = smem_bytes + 16, ng = (bytes + 15) / 16;
            const mskv_u32 off = (mskv_u32)cfg().smem_base_offset & 1008u;
            s.smem_store.assign(bytes + 2048, 0xff);
            s.smem_base = (unsigned char *)(((uintptr_t)s.smem_store.data() + 1023) & ~(uintptr_t)1023) + off;
            s.smem_bytes = bytes;
            s.saddr0 = 1024 + off;
            s.shadow.assign(ng * 16, 0xff);
            s.g_written.assign(ng, 0);
            s.g_writer.assign(ng, -1);
            s.g_epoch.assign(ng, 0);
            s.g_copies.assign(ng, 0);
            s.g_reads.assign(ng, 0);
            for (auto &b : s.nbar) b = NamedBarrier();
        }
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
        sm90_block_begin();
        while (s.alive > 0 && s.error.empty()) {
            const long before = s.events;
            if (!cfg().greedy_warps && !cfg().random_warps) {
                for (int t = 0; t < block_threads; t++) {
                    Fiber &f = s.fibers[(size_t)t];
                    if (f.done) continue;
                    s.cur = &f;
                    swapcontext(&s.sched, &f.ctx);
                }
                s.cur = nullptr;
                check_progress(before);
                continue;
            }
            s.warp_order.resize((size_t)(block_threads / 32));
            std::iota(s.warp_order.begin(), s.warp_order.end(), 0);
            if (cfg().random_warps) std::shuffle(s.warp_order.begin(), s.warp_order.end(), s.warp_rng);
            for (size_t wi = 0; wi < s.warp_order.size() && s.error.empty(); wi++) {
                const int w = s.warp_order[wi];
                for (;;) {  /* this warp until every lane is done or waits on the others */
                    int ran = 0;
                    const long e = s.events;
                    for (int t = 32 * w; t < 32 * w + 32; t++) {
                        Fiber &f = s.fibers[(size_t)t];
                        if (f.done || (f.bar_gen >= 0 && f.bar_gen == s.bar_gen)) continue;
                        s.cur = &f;
                        swapcontext(&s.sched, &f.ctx);
                        ran = 1;
                    }
                    if (!ran || !s.error.empty() || s.events == e) break;
                }
            }
            s.cur = nullptr;
            check_progress(before);
        }
        s.cur = nullptr;
        if (s.error.empty()) {
            for (int id = 1; id < 16; id++)
                if (s.nbar[id].count != 0) {
                    char msg[128];
                    std::snprintf(msg, sizeof msg, "named barrier %d has %d of %d arrivals left over at the block's exit",
                                  id, s.nbar[id].count, s.nbar[id].expected);
                    fail(msg);
                    break;
                }
            sm90_block_end();
        }
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
/* the shuffle moves bits: an int rides in a float's 32 bits */
MSKV_DEV int mskv_shfl_xor_i(int v, int m) { return (int)mskv_emu::f2u(mskv_emu::shfl_xor(mskv_emu::u2f((mskv_u32)v), m)); }
/* shfl.idx from lane 0: lane l takes lane (l ^ l)'s value */
MSKV_DEV int mskv_uniform(int x) { return mskv_shfl_xor_i(x, mskv_emu::lane()); }
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

MSKV_DEV mskv_u32 mskv_smem_addr(const void *p) { return mskv_emu::saddr(p); }

#include "mskv_emu_sm90.h"

#endif /* MSKV_EMU_H */
