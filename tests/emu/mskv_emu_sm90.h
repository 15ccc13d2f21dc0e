/* mskv_emu_sm90.h - the Hopper (sm_90a) primitives of the emulation, as the
   PTX ISA defines them; included at the end of mskv_emu.h.

   wgmma.mma_async m64nNk16, f32 += {f16, bf16} x {f16, bf16}: the 128
   threads of a warpgroup (4 consecutive warps from a multiple of 4) meet;
   the last computes D = A B (+ D) for all of them. A comes from registers
   (each warp's 16 rows in the m16n8k16 A layout) or from a shared-memory
   matrix descriptor, B from a descriptor; descriptors are read field by
   field (start address, leading / stride byte offsets, base offset, swizzle
   mode), K-major or MN-major, every swizzle mode laid out as the canonical
   layouts say (see desc_addr). The results are undefined until
   wgmma.wait_group: the accumulator registers get NaN at issue and the real
   values only when the wait retires the op, so reading them early shows. A
   wgmma must follow a wgmma.fence once the thread last waited (it touches
   its registers after a wait); the A registers and accumulators of an op in
   flight must not change (checked when it retires); a thread that exits
   with ops in flight is an error.

   mbarrier: init (expected arrival count), arrive, arrive.expect_tx,
   complete_tx (by bulk copies), try_wait.parity with phase parity: a wait
   for parity p returns once the phase of that parity has completed (the
   current phase's parity differs from p), so a fresh barrier lets parity 1
   through and holds parity 0. More arrivals than expected in a phase are
   an error; a wait that can never complete ends in the deadlock report.

   Bulk tensor copies (cp.async.bulk.tensor, tile mode) read a tensor map
   made by tmap_encode (what the mock drivers' cuTensorMapEncodeTiled calls):
   dims, byte strides, box, element type, swizzle, out-of-bounds fill. A copy
   lands at the latest legal time (when a wait needs its bytes, cfg().tma_eager:
   at issue), with the swizzle applied to the shared-memory image by address
   bits as the hardware does, out-of-bounds elements zero-filled, and its
   bytes completed on the mbarrier.

   Proxies: shared memory written through the generic proxy (cp.async)
   must be fenced (fence.proxy.async by the writing thread) before wgmma
   reads it; wgmma may not read shared memory a copy is still writing, nor
   memory nothing wrote; copies may not land in memory an in-flight wgmma
   reads (mskv_emu.h tracks every 16-byte granule). A wgmma's shared-memory
   reads stay live until EVERY warp of its warpgroup has waited for it:
   wgmma.commit_group / wait_group track the executing warp's groups, so
   one warp's wait says nothing of the other three (a warp executes
   wait_group together, .sync.aligned: its first lane's wait retires the
   warp's part). A stage handed back after only one warp's wait is then
   caught when the producer refills it while another warp has not waited;
   cfg().random_warps makes that order happen.

   setmaxnreg.inc / .dec: checked (a multiple of 8 in [24, 256], the same
   value and direction across the warpgroup), otherwise nothing: the
   emulation has no register file. */
#ifndef MSKV_EMU_SM90_H
#define MSKV_EMU_SM90_H

#include <algorithm>
#include <map>
#include <memory>

#define MSKV_EMU_SM90 1

/* what kernels.cu passes a tensor map as (CUtensorMap: 128 opaque bytes);
   declare it alignas(64) where tmap_encode writes it, as the driver requires
   (the type itself is not over-aligned: passing it by value would change the ABI) */
struct mskv_tmap { mskv_u64 opaque[16]; };
#define MSKV_GRID_CONST
#define MSKV_BOUNDS(threads, blocks)

namespace mskv_emu {

/* ---- the state ----------------------------------------------------------- */

struct MBar {
    int expected = 0, pending = 0, phase = 0;
    long long tx = 0;
    int init_tid = -1;
    bool fenced = false;      /* its init was fenced before any copy completes on it */
};

struct TmaCopy {
    unsigned char *dst;
    std::vector<unsigned char> bytes;
    mskv_u32 bar;
};

/* smem granules one wgmma reads, live until each of the warpgroup's 4 warps has waited for it */
struct WgReads {
    std::vector<size_t> granules;
    unsigned live_warps = 0xfu;   /* bit w: warp w of the warpgroup has not waited yet */
};

struct WgRec {
    float *d;
    int nd;
    std::vector<float> vals;
    const mskv_u32 *a;        /* A registers (nullptr: A from a descriptor) */
    mskv_u32 a_vals[4];
    int group;
    std::shared_ptr<WgReads> reads;
};

struct WgThread {
    std::vector<WgRec> recs;
    int committed = 0;
    bool fenced = false;      /* wgmma.fence since the last wait (or the start) */
};

enum { WG_MMA = 1, WG_SETMAXNREG };

struct WgDeposit {
    int op, n, acc, trans_a, trans_b, bf16, value;
    mskv_u64 da, db;
    const mskv_u32 *a;
    float *d;
};

struct WarpGroup {
    int arrived = 0, gen = 0, op = 0;
    WgDeposit dep[128];
    std::vector<float> out;   /* [128][128] results of the last wgmma */
};

struct Sm90 {
    std::map<mskv_u32, MBar> bars;
    std::vector<TmaCopy> copies;
    std::vector<WgThread> threads;
    std::vector<WarpGroup> groups;
    /* scratch of the wgmma computation */
    std::vector<float> A, B;
};
inline Sm90 &sm90() { static Sm90 s; return s; }

inline void sm90_block_begin() {
    Sm90 &h = sm90();
    h.bars.clear();
    h.copies.clear();
    h.threads.assign((size_t)st().nthreads, WgThread());
    h.groups.assign((size_t)((st().nthreads + 127) / 128), WarpGroup());
    for (auto &g : h.groups) g.out.assign(128 * 128, 0.0f);
}

inline int my_tid() { return st().cur->tid; }
inline int my_wg() { return st().cur->tid >> 7; }

/* ---- mbarrier ------------------------------------------------------------ */

inline MBar *mbar(mskv_u32 a, const char *op) {
    static char msg[160];
    auto it = sm90().bars.find(a);
    if ((a & 7) != 0 || !saddr_ok(a, 8)) {
        std::snprintf(msg, sizeof msg, "%s: mbarrier address 0x%x is not an 8-byte aligned shared address", op, (unsigned)a);
        fail(msg);
        return nullptr;
    }
    if (it == sm90().bars.end()) {
        std::snprintf(msg, sizeof msg, "%s: mbarrier at 0x%x used before mbarrier.init", op, (unsigned)a);
        fail(msg);
        return nullptr;
    }
    return &it->second;
}

inline void mbar_init(mskv_u32 a, int count) {
    if ((a & 7) != 0 || !saddr_ok(a, 8)) { fail("mbarrier.init: not an 8-byte aligned shared address"); return; }
    if (count < 1 || count > (1 << 20) - 1) { fail("mbarrier.init: count outside [1, 2^20 - 1]"); return; }
    MBar b;
    b.expected = b.pending = count;
    b.init_tid = my_tid();
    sm90().bars[a] = b;
    note();
}

/* fence.mbarrier_init (or fence.proxy.async): the thread's inits become
   visible to the async proxy, so copies may complete on them */
inline void mbar_fence_inits(int tid) {
    for (auto &kv : sm90().bars)
        if (kv.second.init_tid == tid) kv.second.fenced = true;
}

inline void mbar_try_complete(MBar &b) {
    if (b.pending == 0 && b.tx == 0) {
        b.phase++;
        b.pending = b.expected;
    }
}

inline void mbar_arrive(mskv_u32 a, long long expect_tx) {
    MBar *b = mbar(a, "mbarrier.arrive");
    if (!b) return;
    note();
    b->tx += expect_tx;
    if (b->tx > (1 << 20) - 1) { fail("mbarrier: expected transaction bytes past 2^20 - 1"); return; }
    if (b->pending == 0) {
        fail("mbarrier: more arrivals than it expects in this phase (a producer past the ring, or a missing wait?)");
        return;
    }
    b->pending--;
    mbar_try_complete(*b);
}

inline void mbar_complete_tx(mskv_u32 a, long long bytes) {
    MBar *b = mbar(a, "complete_tx");
    if (!b) return;
    if (!b->fenced) {
        fail("a bulk copy completes on an mbarrier whose mbarrier.init was not fenced (fence.mbarrier_init or fence.proxy.async)");
        return;
    }
    b->tx -= bytes;
    if (b->tx < -((1 << 20) - 1)) { fail("mbarrier: transaction count below -(2^20 - 1)"); return; }
    mbar_try_complete(*b);
}

/* ---- bulk tensor copies ----------------------------------------------------- */

struct TMap {
    mskv_u32 magic, dtype, rank, esize;
    mskv_u64 gaddr;
    mskv_u64 dims[5];
    mskv_u64 strides[4];      /* bytes between consecutive indices of dims 1..rank-1 */
    mskv_u16 box[5], estr[5];
    unsigned char interleave, swizzle, l2, oob;
};
static_assert(sizeof(TMap) <= sizeof(mskv_tmap), "the emulated tensor map fits CUtensorMap");
enum { TMAP_MAGIC = 0x4d534b56 };

/* cuTensorMapEncodeTiled, checked against the requirements the driver API
   documents; 0 = CUDA_SUCCESS, 1 = CUDA_ERROR_INVALID_VALUE. Interleaved
   layouts and element strides other than 1 are not emulated (refused). */
inline int tmap_encode(void *map, int dtype, unsigned rank, void *gaddr, const mskv_u64 *dims, const mskv_u64 *strides,
                       const mskv_u32 *box, const mskv_u32 *estr, int interleave, int swizzle, int l2, int oob) {
    static const int esizes[13] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
    TMap t;
    std::memset(&t, 0, sizeof t);
    if (!map || ((uintptr_t)map & 63) != 0) return 1;
    if (dtype < 0 || dtype > 12 || rank < 1 || rank > 5 || interleave != 0 || swizzle < 0 || swizzle > 3 ||
        l2 < 0 || l2 > 3 || oob < 0 || oob > 1)
        return 1;
    if (!gaddr || ((uintptr_t)gaddr & 15) != 0) return 1;
    t.magic = TMAP_MAGIC;
    t.dtype = (mskv_u32)dtype;
    t.rank = rank;
    t.esize = (mskv_u32)esizes[dtype];
    t.gaddr = (mskv_u64)(uintptr_t)gaddr;
    for (unsigned i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > (1ull << 32) || box[i] == 0 || box[i] > 256 || estr[i] != 1) return 1;
        t.dims[i] = dims[i];
        t.box[i] = (mskv_u16)box[i];
        t.estr[i] = 1;
    }
    for (unsigned i = 0; i + 1 < rank; i++) {
        /* each stride covers the dimension below it (cuda.h: "includes previous dimension stride") */
        mskv_u64 below = i == 0 ? dims[0] * t.esize : strides[i - 1] * dims[i];
        if (strides[i] % 16 != 0 || strides[i] >= (1ull << 40) || strides[i] < below) return 1;
        t.strides[i] = strides[i];
    }
    if ((box[0] * t.esize) % 16 != 0) return 1;
    if (swizzle != 0 && box[0] * t.esize > (16u << swizzle)) return 1;
    t.interleave = 0;
    t.swizzle = (unsigned char)swizzle;
    t.l2 = (unsigned char)l2;
    t.oob = (unsigned char)oob;
    std::memset(map, 0, sizeof(mskv_tmap));
    std::memcpy(map, &t, sizeof t);
    return 0;
}

/* Address bits 4.. of 16-byte chunks XORed with bits 7..: the swizzle of
   mode 1 (32 B), 2 (64 B), 3 (128 B) in CUtensorMapSwizzle numbering. */
inline mskv_u32 tma_swizzle(mskv_u32 a, int mode) {
    if (mode == 0) return a;
    return a ^ (((a >> 7) & ((1u << mode) - 1)) << 4);
}

inline void tma_land(TmaCopy &c) {
    State &s = st();
    for (size_t g = gran(c.dst); g <= gran(c.dst + c.bytes.size() - 1); g++) s.g_copies[g]--;
    tracked_write(c.dst, c.bytes.data(), c.bytes.size(), -1);
    note();
    if (s.error.empty()) mbar_complete_tx(c.bar, (long long)c.bytes.size());
}

/* Lands the copies in flight (those completing on bar, or all when bar is 0);
   returns whether there were any. */
inline bool tma_land_pending(mskv_u32 bar) {
    Sm90 &h = sm90();
    bool any = false;
    for (size_t i = 0; i < h.copies.size();) {
        if (bar != 0 && h.copies[i].bar != bar) { i++; continue; }
        TmaCopy c = std::move(h.copies[i]);
        h.copies.erase(h.copies.begin() + (long)i);
        tma_land(c);
        any = true;
        if (!st().error.empty()) break;
    }
    return any;
}

inline void tma_load(mskv_u32 dst, const void *map, const int *coord, int ncoord, mskv_u32 bar) {
    TMap t;
    State &s = st();
    char msg[200];
    std::memcpy(&t, map, sizeof t);
    if (t.magic != TMAP_MAGIC) { fail("cp.async.bulk.tensor: not a tensor map made by cuTensorMapEncodeTiled"); return; }
    if ((int)t.rank != ncoord) { fail("cp.async.bulk.tensor: the number of coordinates is not the map's rank"); return; }
    size_t n = 1;
    for (unsigned i = 0; i < t.rank; i++) n *= t.box[i];
    const size_t bytes = n * t.esize;
    if ((dst & 127) != 0 || !saddr_ok(dst, bytes)) {
        std::snprintf(msg, sizeof msg, "cp.async.bulk.tensor: destination 0x%x (%zu bytes) is not a 128-byte aligned shared buffer",
                      (unsigned)dst, bytes);
        fail(msg);
        return;
    }
    if (!mbar(bar, "cp.async.bulk.tensor")) return;
    for (auto &kv : sm90().bars)
        if (kv.first + 8 > dst && kv.first < dst + bytes) { fail("cp.async.bulk.tensor: the destination covers an mbarrier"); return; }
    unsigned char *p = sptr(dst);
    for (size_t g = gran(p); g <= gran(p + bytes - 1); g++) {
        if (s.g_reads[g] > 0) { fail("a bulk copy is issued into shared memory an in-flight wgmma still reads (the producer overran the ring?)"); return; }
        if (s.g_copies[g] > 0) { fail("two copies in flight write the same shared memory"); return; }
    }
    TmaCopy c;
    c.dst = p;
    c.bar = bar;
    c.bytes.assign(bytes, 0);
    /* the box, innermost dimension first, packed; then swizzled by address */
    for (size_t e = 0; e < n; e++) {
        size_t rem = e;
        long long gc[5] = {0, 0, 0, 0, 0};
        bool oob = false;
        for (unsigned i = 0; i < t.rank; i++) {
            gc[i] = (long long)coord[i] + (long long)(rem % t.box[i]);
            rem /= t.box[i];
            if (gc[i] < 0 || gc[i] >= (long long)t.dims[i]) oob = true;
        }
        const mskv_u32 to = tma_swizzle(dst + (mskv_u32)(e * t.esize), t.swizzle) - dst;
        if (oob) {
            if (t.oob) std::memset(c.bytes.data() + to, 0xff, t.esize);   /* NaN request: all ones */
            continue;
        }
        mskv_u64 off = (mskv_u64)gc[0] * t.esize;
        for (unsigned i = 1; i < t.rank; i++) off += (mskv_u64)gc[i] * t.strides[i - 1];
        std::memcpy(c.bytes.data() + to, (const unsigned char *)(uintptr_t)(t.gaddr + off), t.esize);
    }
    note();
    for (size_t g = gran(p); g <= gran(p + bytes - 1); g++) s.g_copies[g]++;
    if (cfg().tma_eager) { tma_land(c); return; }
    sm90().copies.push_back(std::move(c));
}

/* try_wait.parity: lands the copies the barrier still waits for only when
   the phase is not otherwise complete (the latest legal time). */
inline bool mbar_try_wait(mskv_u32 a, int parity) {
    const int wg = my_wg();
    if (cfg().skip_mbar_wait_wg == wg) { note(); return true; }
    if (cfg().mbar_parity_flip_wg == wg) parity ^= 1;
    MBar *b = mbar(a, "mbarrier.try_wait");
    if ((b->phase & 1) == (parity & 1)) {
        tma_land_pending(a);
        b = mbar(a, "mbarrier.try_wait");
    }
    if ((b->phase & 1) != (parity & 1)) { note(); return true; }
    wait_yield(WAIT_MBAR, a, parity & 1);
    return false;
}

/* ---- wgmma ------------------------------------------------------------------- */

/* Shared address of element (mn, k) of a 2-byte operand (mn: the M or N
   index, k in 0..15) under a matrix descriptor; mn_major: the M/N index is
   the contiguous one (imm-trans 1). In 16-byte units T, the canonical
   layouts (PTX ISA, "Shared Memory Matrix Layout"; swizzle atom of W bytes):
     K-major, none:     ((8, m), (T, 2)) : ((1T, SBO), (1, LBO))
     K-major, W:        ((8, m), (T, 2)) : ((W/16 T, SBO), (1, T))    (LBO unused)
     MN-major, none:    ((T, m), (8, 2)) : ((1, SBO), (1T, LBO))
     MN-major, W:       ((T, W/16, m), (8, 2)) : ((1, T, LBO), (W/16 T, SBO))
   then the swizzle: address bits [4, 4+b) ^= bits [7, 7+b) (b = 3, 2, 1 for
   128, 64, 32 B), the row phase counted from the pattern's start: base
   offset = (pattern start >> 7) & 7, 0 when it starts on a 1024-byte
   (512, 256) boundary. */
inline mskv_u32 desc_addr(mskv_u64 desc, int mn, int k, bool mn_major) {
    const mskv_u32 start = (mskv_u32)(desc & 0x3fff) << 4;
    const mskv_u32 lbo = (mskv_u32)((desc >> 16) & 0x3fff) << 4;
    const mskv_u32 sbo = (mskv_u32)((desc >> 32) & 0x3fff) << 4;
    const mskv_u32 base = (mskv_u32)((desc >> 49) & 7);
    int mode = (int)((desc >> 62) & 3);
    if (cfg().wgmma_swizzle_override >= 0) mode = cfg().wgmma_swizzle_override & 3;
    const mskv_u32 W = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
    const mskv_u32 um = (mskv_u32)mn, uk = (mskv_u32)k;
    mskv_u32 a;
    if (!mn_major) {
        if (!W) a = start + (um % 8) * 16 + (um / 8) * sbo + (uk / 8) * lbo + (uk % 8) * 2;
        else a = start + (um % 8) * W + (um / 8) * sbo + uk * 2;
    } else {
        if (!W) a = start + (um % 8) * 2 + (um / 8) * sbo + (uk % 8) * 16 + (uk / 8) * lbo;
        else a = start + (um % (W / 2)) * 2 + (um / (W / 2)) * lbo + (uk % 8) * W + (uk / 8) * sbo;
    }
    if (W) {
        const mskv_u32 bits = W == 128 ? 7 : W == 64 ? 3 : 1;
        a ^= (((a >> 7) - base) & bits) << 4;
    }
    return a;
}

/* the low 18 address bits of the descriptor: the shared window wraps there */
inline bool desc_read(mskv_u64 desc, int rows, bool mn_major, int bf16, float *out, std::vector<size_t> &gr, const char *who) {
    char msg[160];
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < 16; k++) {
            const mskv_u32 a = desc_addr(desc, r, k, mn_major);
            if (!saddr_ok(a, 2) || (a & 1)) {
                std::snprintf(msg, sizeof msg, "%s: descriptor element (%d, %d) at 0x%x is outside shared memory", who, r, k, (unsigned)a);
                fail(msg);
                return false;
            }
            const unsigned char *p = sptr(a);
            mskv_u16 h;
            std::memcpy(&h, p, 2);
            out[r * 16 + k] = bf16 ? b2f(h) : h2f(h);
            gr.push_back(gran(p));
        }
    std::sort(gr.begin(), gr.end());
    gr.erase(std::unique(gr.begin(), gr.end()), gr.end());
    for (size_t g : gr)
        if (!async_read_ok(st().smem_base + (g << 4), 16, who)) return false;
    return true;
}

/* NaN with a payload: "written at issue, not yet retired" */
const mskv_u32 WG_PENDING = 0x7fc0beefu;

/* The value thread t's accumulator element i holds for the next op: the
   newest op in flight that writes it, else the register. */
inline float wg_chain(int t, float *d, int i) {
    const WgThread &w = sm90().threads[(size_t)t];
    for (size_t r = w.recs.size(); r-- > 0;)
        if (w.recs[r].d == d) return w.recs[r].vals[(size_t)i];
    return d[i];
}

inline void wg_compute(WarpGroup &g, int wg) {
    Sm90 &h = sm90();
    const WgDeposit &o = g.dep[0];
    const int n = o.n;
    for (int t = 1; t < 128; t++) {
        const WgDeposit &x = g.dep[t];
        if (x.n != o.n || x.acc != o.acc || x.trans_a != o.trans_a || x.trans_b != o.trans_b || x.bf16 != o.bf16 ||
            x.db != o.db || (x.a == nullptr) != (o.a == nullptr) || (!o.a && x.da != o.da)) {
            fail("wgmma: the warpgroup's threads disagree on the operation (shape, type, descriptors, scale-d)");
            return;
        }
    }
    if (n < 8 || n > 256 || n % 8 != 0) { fail("wgmma: N must be a multiple of 8 in [8, 256]"); return; }
    h.A.assign(64 * 16, 0.0f);
    h.B.assign((size_t)n * 16, 0.0f);
    auto reads = std::make_shared<WgReads>();
    if (o.a) {
        for (int t = 0; t < 128; t++) {
            const int w = t >> 5, l = t & 31, gq = l >> 2, c = l & 3, r0 = 16 * w + gq;
            const mskv_u32 *a = g.dep[t].a;
            auto cv = [&](mskv_u32 x) { return o.bf16 ? b2f((mskv_u16)x) : h2f((mskv_u16)x); };
            h.A[(size_t)r0 * 16 + 2 * c] = cv(a[0] & 0xffff); h.A[(size_t)r0 * 16 + 2 * c + 1] = cv(a[0] >> 16);
            h.A[(size_t)(r0 + 8) * 16 + 2 * c] = cv(a[1] & 0xffff); h.A[(size_t)(r0 + 8) * 16 + 2 * c + 1] = cv(a[1] >> 16);
            h.A[(size_t)r0 * 16 + 2 * c + 8] = cv(a[2] & 0xffff); h.A[(size_t)r0 * 16 + 2 * c + 9] = cv(a[2] >> 16);
            h.A[(size_t)(r0 + 8) * 16 + 2 * c + 8] = cv(a[3] & 0xffff); h.A[(size_t)(r0 + 8) * 16 + 2 * c + 9] = cv(a[3] >> 16);
        }
    } else if (!desc_read(o.da, 64, o.trans_a != 0, o.bf16, h.A.data(), reads->granules, "wgmma (A)")) {
        return;
    }
    {
        std::vector<size_t> gb;
        if (!desc_read(o.db, n, o.trans_b != 0, o.bf16, h.B.data(), gb, "wgmma (B)")) return;
        reads->granules.insert(reads->granules.end(), gb.begin(), gb.end());
    }
    for (size_t x : reads->granules) st().g_reads[x]++;
    for (int t = 0; t < 128; t++) {
        const int w = t >> 5, l = t & 31, gq = l >> 2, c = l & 3;
        for (int i = 0; i < n / 2; i++) {
            const int row = 16 * w + gq + 8 * ((i >> 1) & 1), col = (i >> 2) * 8 + 2 * c + (i & 1);
            float acc = o.acc ? wg_chain(128 * wg + t, g.dep[t].d, i) : 0.0f;
            for (int k = 0; k < 16; k++) acc += h.A[(size_t)row * 16 + k] * h.B[(size_t)col * 16 + k];
            g.out[(size_t)t * 128 + (size_t)i] = acc;
        }
    }
    /* the op belongs to every thread; each takes its record after the meeting */
    for (int t = 0; t < 128; t++) {
        WgThread &th = h.threads[(size_t)(128 * wg + t)];
        WgRec rec;
        rec.d = g.dep[t].d;
        rec.nd = n / 2;
        rec.vals.assign(g.out.begin() + (long)t * 128, g.out.begin() + (long)t * 128 + n / 2);
        rec.a = g.dep[t].a;
        if (rec.a) std::memcpy(rec.a_vals, rec.a, sizeof rec.a_vals);
        rec.group = th.committed;
        rec.reads = reads;
        th.recs.push_back(std::move(rec));
    }
}

inline void wg_meet(WgDeposit dep) {
    State &s = st();
    const int tid = my_tid(), wg = tid >> 7;
    if ((size_t)wg >= sm90().groups.size() || 128 * (wg + 1) > s.nthreads) { fail("a warpgroup collective needs all 128 threads of 4 warps"); return; }
    WarpGroup &g = sm90().groups[(size_t)wg];
    for (int t = 128 * wg; t < 128 * wg + 128; t++)
        if (s.fibers[(size_t)t].done) { fail("a warpgroup collective with exited threads"); return; }
    const int gen = g.gen;
    if (g.arrived == 0) g.op = dep.op;
    else if (g.op != dep.op) { fail("a warpgroup's threads reached different collective operations"); return; }
    g.dep[tid & 127] = dep;
    note();
    if (++g.arrived == 128) {
        if (dep.op == WG_MMA) wg_compute(g, wg);
        else if (dep.op == WG_SETMAXNREG) {
            for (int t = 0; t < 128; t++)
                if (g.dep[t].value != dep.value || g.dep[t].acc != dep.acc) {
                    fail("setmaxnreg: the warpgroup's threads ask for different register counts");
                    break;
                }
        }
        g.arrived = 0;
        g.gen++;
        return;
    }
    while (g.gen == gen) wait_yield(WAIT_WARPGROUP, 0, 0);
}

/* one m64nNk16 op: a (4 registers) or da (descriptor) for A, db for B */
inline void wgmma(float *d, int n, const mskv_u32 *a, mskv_u64 da, mskv_u64 db, int acc, int trans_a, int trans_b, int bf16) {
    const int tid = my_tid();
    WgThread &th = sm90().threads[(size_t)tid];
    if (!th.fenced) { fail("wgmma.mma_async without a wgmma.fence since the thread last waited (or began)"); return; }
    WgDeposit dep;
    std::memset(&dep, 0, sizeof dep);
    dep.op = WG_MMA; dep.n = n; dep.acc = acc; dep.trans_a = trans_a; dep.trans_b = trans_b; dep.bf16 = bf16;
    dep.da = da; dep.db = db; dep.a = a; dep.d = d;
    /* an accumulator that overlaps one in flight without being the same registers cannot be chained */
    for (const WgRec &r : th.recs)
        if (r.d != d && r.d < d + n / 2 && d < r.d + r.nd) { fail("wgmma: accumulators overlap an op in flight"); return; }
    wg_meet(dep);
    if (!st().error.empty()) return;
    for (int i = 0; i < n / 2; i++) std::memcpy(&d[i], &WG_PENDING, 4);
}

inline void wgmma_fence() { sm90().threads[(size_t)my_tid()].fenced = true; note(); }
inline void wgmma_commit() { sm90().threads[(size_t)my_tid()].committed++; note(); }

/* thread tid's warp is done with the op's reads; the last of the 4 warps frees them */
inline void wg_release(WgRec &r, int tid) {
    const unsigned bit = 1u << ((tid >> 5) & 3);
    if (!r.reads || !(r.reads->live_warps & bit)) return;
    r.reads->live_warps &= ~bit;
    if (r.reads->live_warps == 0)
        for (size_t g : r.reads->granules) st().g_reads[g]--;
}

inline void wgmma_wait(int n) {
    WgThread &th = sm90().threads[(size_t)my_tid()];
    note();
    if (cfg().skip_wgmma_wait) return;
    const int last = th.committed - n;   /* groups < last retire */
    std::vector<WgRec> keep;
    for (size_t i = 0; i < th.recs.size(); i++) {
        WgRec &r = th.recs[i];
        if (r.group >= last) { keep.push_back(std::move(r)); continue; }
        if (r.a && std::memcmp(r.a, r.a_vals, sizeof r.a_vals) != 0) {
            fail("the A registers of an in-flight wgmma changed before wgmma.wait_group");
            return;
        }
        bool newest = true;   /* the last op of this accumulator chain sets the registers */
        for (size_t j = i + 1; j < th.recs.size(); j++) newest = newest && th.recs[j].d != r.d;
        if (newest) {
            for (int e = 0; e < r.nd; e++)
                if (std::memcmp(&r.d[e], &WG_PENDING, 4) != 0) {
                    fail("accumulator registers of an in-flight wgmma were written before wgmma.wait_group");
                    return;
                }
            std::memcpy(r.d, r.vals.data(), (size_t)r.nd * 4);
        }
        wg_release(r, my_tid());
    }
    th.recs.swap(keep);
    th.fenced = false;
}

inline void setmaxnreg(int inc, int n) {
    if (n % 8 != 0 || n < 24 || n > 256) { fail("setmaxnreg: the count must be a multiple of 8 in [24, 256]"); return; }
    WgDeposit dep;
    std::memset(&dep, 0, sizeof dep);
    dep.op = WG_SETMAXNREG; dep.value = n; dep.acc = inc;
    wg_meet(dep);
}

inline void fence_proxy_async() {
    note();
    if (cfg().skip_fence_proxy) return;
    st().cur->proxy_fences++;
    mbar_fence_inits(my_tid());
}

/* ---- the block's life (called by mskv_emu.h) ----------------------------------------- */

inline void sm90_thread_exit() {
    Sm90 &h = sm90();
    if ((size_t)my_tid() < h.threads.size() && !h.threads[(size_t)my_tid()].recs.empty() && !cfg().skip_wgmma_wait)
        fail("a thread exited with wgmma operations in flight (a missing wgmma.wait_group)");
    if ((size_t)my_tid() < h.threads.size())
        for (WgRec &r : h.threads[(size_t)my_tid()].recs) wg_release(r, my_tid());
}

inline bool sm90_flush() { return tma_land_pending(0); }

inline void sm90_block_end() {
    if (!sm90().copies.empty()) fail("the block exited with bulk copies in flight");
}

inline void sm90_describe(const Fiber &f, char *out, size_t cap) {
    if (f.wait == WAIT_MBAR) {
        auto it = sm90().bars.find(f.wait_addr);
        if (it == sm90().bars.end()) { std::snprintf(out, cap, "on an unknown mbarrier"); return; }
        const MBar &b = it->second;
        std::snprintf(out, cap, "on the mbarrier at 0x%x for parity %d (it is in phase %d: %d of %d arrivals and %lld bytes pending)",
                      (unsigned)f.wait_addr, f.wait_arg, b.phase, b.pending, b.expected, b.tx);
        return;
    }
    std::snprintf(out, cap, "running");
}

} /* namespace mskv_emu */

/* ---- what kernels.cu calls ------------------------------------------------------------- */
MSKV_DEV void mskv_bar_sync(int id, int n) { mskv_emu::named_barrier(id, n, true); }
MSKV_DEV void mskv_bar_arrive(int id, int n) { mskv_emu::named_barrier(id, n, false); }
MSKV_DEV void mskv_mbar_init(mskv_u32 bar, int count) { mskv_emu::mbar_init(bar, count); }
MSKV_DEV void mskv_mbar_init_fence(void) { mskv_emu::note(); mskv_emu::mbar_fence_inits(mskv_emu::my_tid()); }
MSKV_DEV void mskv_mbar_arrive(mskv_u32 bar) { mskv_emu::mbar_arrive(bar, 0); }
MSKV_DEV void mskv_mbar_arrive_tx(mskv_u32 bar, mskv_u32 bytes) { mskv_emu::mbar_arrive(bar, (long long)bytes); }
MSKV_DEV int mskv_mbar_try_wait(mskv_u32 bar, int parity) { return mskv_emu::mbar_try_wait(bar, parity) ? 1 : 0; }
MSKV_DEV void mskv_fence_proxy_async(void) { mskv_emu::fence_proxy_async(); }
MSKV_DEV void mskv_tma_load_4d(mskv_u32 dst, const mskv_tmap *map, int c0, int c1, int c2, int c3, mskv_u32 bar) {
    const int c[4] = {c0, c1, c2, c3};
    mskv_emu::tma_load(dst, map, c, 4, bar);
}
MSKV_DEV void mskv_wgmma_fence(void) { mskv_emu::wgmma_fence(); }
MSKV_DEV void mskv_wgmma_commit(void) { mskv_emu::wgmma_commit(); }
template <int N> MSKV_DEV void mskv_wgmma_wait(void) { mskv_emu::wgmma_wait(N); }
template <int N> MSKV_DEV void mskv_setmaxnreg_inc(void) { mskv_emu::setmaxnreg(1, N); }
template <int N> MSKV_DEV void mskv_setmaxnreg_dec(void) { mskv_emu::setmaxnreg(0, N); }
/* S = Q K^T: A and B K-major from descriptors; O += P V: A from registers, B MN-major */
MSKV_DEV void mskv_emu_wgmma_ss(float *d, int n, mskv_u64 da, mskv_u64 db, int acc, int bf16) {
    mskv_emu::wgmma(d, n, nullptr, da, db, acc, 0, 0, bf16);
}
/* st.shared of 16 bytes: a generic-proxy write the emulation tracks */
MSKV_DEV void mskv_sts16(void *dst, mskv_u32 w) {
    const mskv_u32 v[4] = {w, w, w, w};
    if (((uintptr_t)dst & 15) != 0 || !mskv_emu::in_smem(dst, 16)) { mskv_emu::fail("st.shared.v4: not a 16-byte aligned shared address"); return; }
    mskv_emu::note();
    mskv_emu::tracked_write((unsigned char *)dst, v, 16, mskv_emu::my_tid());
}
/* shfl.idx from lane 0: lane l takes lane (l ^ l)'s value through the warp's shuffle */
MSKV_DEV int mskv_bcast0(int x) {
    float f;
    std::memcpy(&f, &x, 4);
    f = mskv_emu::shfl_xor(f, mskv_emu::lane());
    std::memcpy(&x, &f, 4);
    return x;
}
/* registers an async op reads or writes: nothing to hold in the emulation */
MSKV_DEV void mskv_wg_keep(float &x) { (void)x; }
MSKV_DEV void mskv_wg_keep_u(mskv_u32 &x) { (void)x; }
MSKV_DEV void mskv_emu_wgmma_rs_tb(float *d, int n, const mskv_u32 a[4], mskv_u64 db, int acc, int bf16) {
    mskv_emu::wgmma(d, n, a, 0, db, acc, 0, 1, bf16);
}

#endif /* MSKV_EMU_SM90_H */
