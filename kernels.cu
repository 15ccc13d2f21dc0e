/* kernels.cu - the GPU kernel blob of mstar_kv.

   Self-contained CUDA C++ (no #include at all: NVRTC compiles it without any
   -I), every kernel extern "C" __global__, specialised at JIT time by -D
   defines. The same source also compiles as host C++17 under the emulation
   layer (tests/emu/mskv_emu.h, included first), which runs each block on the
   CPU with one fibre per GPU thread, so CI tests the kernels without a GPU.

   Pools: per layer, K and V separately, layout [page][slot][kv_head][head_dim];
   element (slot, h, d) at ((long long)slot * kv_heads + h) * head_dim + d,
   slot = page * page_size + offset. All offsets are 64-bit.

   Defines (the runtime passes every one a kernel uses):
     MSKV_DTYPE      storage dtype of pools, K/V sources, q and o: 0 f32, 1 f16, 2 bf16
     MSKV_HEAD_DIM   64, 128 or 256
     MSKV_ROPE       0 none, 1 one-D, 2 three-D (kv_write and rope kernels)
     MSKV_ROPE_STYLE 0 half: pairs (x[i], x[i+w/2]) in a part of width w;
                     1 interleaved: pairs (x[2i], x[2i+1])
     MSKV_ROPE_D0/D1/D2  part widths, consecutive from dim 0 (1-D uses D0;
                     0 = head_dim for 1-D; for 3-D all 0 = the default split
                     2*(p-2*(p/3)), 2*(p/3), 2*(p/3) with p = head_dim/2).
                     Pair i of a part of width w turns by pos * theta^(-2i/w):
                     (x, y) -> (x cos - y sin, x sin + y cos), in f32.
     MSKV_ATTN_WARP_KEYS  attention only: 0 = prefill layout (4 warps x 16
                     query rows, 64 rows per block); 1 = decode layout (16 rows
                     per block, the 4 warps split each key tile, merged in smem)

   Kernels, parameters and launch geometry:

   mskv_kv_write(k_src, v_src, slot_mapping, n_tokens, kv_heads, k_pool,
                 v_pool, pool_slots, positions, theta)
     Row r = token * kv_heads + h of k_src/v_src ([n_tokens][kv_heads][D],
     pool dtype) goes to slot slot_mapping[token]; slots < 0 or >= pool_slots
     are skipped. With MSKV_ROPE, K is rotated on the way in at positions
     ([n] or [n][3]); theta <= 0 means 10000.
     Block 128, grid ceil(n_tokens * kv_heads / 4): one warp per row.

   mskv_page_gather(pool, pages, n_pages, page_bytes, dst, dst_stride)
   mskv_page_scatter(pool, pages, n_pages, page_bytes, src, src_stride)
     Copy page pages[i] (page_bytes at pool + pages[i] * page_bytes) to / from
     dst + i * dst_stride. Block 256, grid (min(ceil(page_bytes / 4096),
     65535), n_pages); 16-byte accesses when every base, size and stride is
     16-byte aligned, bytes otherwise.

   mskv_rope(x, n, heads, positions, theta)
     Rotates x [n][heads][D] in place. Block 128, grid ceil(n * heads / 4).

   mskv_attn(q, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices, kv_len,
             kv_pos_split, kv_pos_shift, q_heads, kv_heads, page_size,
             scale_log2, mask, window_left, kv_chunk, n_splits,
             o, lse, o_part, lse_part)
     Paged attention over a CSR plan (MSKV_DTYPE 1 or 2; mma.sync m16n8k16
     with f32 accumulation). A block takes one (segment, kv head, key split)
     and a tile of "rows", row = query * group + (q head within the kv head's
     group), so every K/V byte is read once for all of a kv head's q heads.
     Grid (ceil(max over segments of qo_len * group / BM), batch,
     kv_heads * n_splits); block 128; dynamic shared memory
     2 * (BM * D + 4 * BN * D) bytes (Q tile, two stages of K and V):
     BM = 64 rows, BN = 64 keys (32 for D = 256) in the prefill layout,
     BM = 16, BN = 64 in the decode layout (e.g. 80 KiB prefill at D = 128).
     K/V tiles are gathered row by row through kv_indices with cp.async
     (any page size), rows past kv_len zero-filled; S = Q K^T and O += P V
     with ldmatrix(.trans) fragments and mma; online softmax in exp2.
     Positions must not decrease with the compacted index (kv_pos_shift >= 0):
     the mask's reach bounds the key range a block visits.
     mask: 0 none, 1 causal (key pos <= query pos), 2 causal and
     q - k <= window_left, on absolute positions. scale_log2 = scale * log2(e).
     Keys of split s: [s * kv_chunk, (s + 1) * kv_chunk) (kv_chunk a multiple
     of BN; n_splits 1 = no split). With n_splits == 1: o [total_q][q_heads][D]
     (dtype) and lse [total_q][q_heads] (natural log; may be NULL). Otherwise
     f32 partials o_part [n_splits][total_q][q_heads][D] and lse_part
     [n_splits][total_q][q_heads], merged by mskv_lse_merge. A row that sees
     no key: o = 0, lse = -inf.

   mskv_state_merge(o_a, lse_a, o_b, lse_b, rows, o, lse)
     Merges two partial states (f32 o [rows][D], lse [rows]) into o, lse
     (f32; may alias either input). Block 128 (one warp per row), grid
     ceil(rows / 4).

   mskv_lse_merge(o_part, lse_part, n_parts, part_rows, rows, o, lse)
     o/lse of each of `rows` rows (row = token * heads + head) from n_parts
     partial states at o_part + p * part_rows * D, lse_part + p * part_rows.
     Output o in MSKV_DTYPE (0 = f32; may alias part 0 when f32), lse f32
     (may be NULL). Block 128 (one warp per row), grid ceil(rows / 4).
*/

/* >>primitives ---------------------------------------------------------- */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define MSKV_GPU 1
typedef unsigned short mskv_u16;
typedef unsigned int mskv_u32;
typedef long long mskv_i64;
typedef unsigned long long mskv_u64;
#define MSKV_KERNEL extern "C" __global__
#define MSKV_DEV static __device__ __forceinline__
#define MSKV_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define MSKV_RESTRICT __restrict__
#define MSKV_UNROLL _Pragma("unroll")
MSKV_DEV int mskv_tid(void) { return (int)threadIdx.x; }
MSKV_DEV int mskv_bid_x(void) { return (int)blockIdx.x; }
MSKV_DEV int mskv_bid_y(void) { return (int)blockIdx.y; }
MSKV_DEV int mskv_bid_z(void) { return (int)blockIdx.z; }
MSKV_DEV int mskv_nblk_x(void) { return (int)gridDim.x; }
MSKV_DEV int mskv_nblk_y(void) { return (int)gridDim.y; }
MSKV_DEV float mskv_u_as_f(mskv_u32 u) { return __uint_as_float(u); }
MSKV_DEV mskv_u32 mskv_f_as_u(float f) { return __float_as_uint(f); }
MSKV_DEV void mskv_sync(void) { __syncthreads(); }
/* A barrier the emulation can drop on purpose (planted-bug tests); always real here. */
#define MSKV_SYNC_ID(id) __syncthreads()
MSKV_DEV float mskv_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
MSKV_DEV void mskv_syncwarp(void) { __syncwarp(); }
MSKV_DEV float mskv_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
MSKV_DEV float mskv_h2f(mskv_u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
MSKV_DEV mskv_u16 mskv_f2h(float f) { mskv_u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
MSKV_DEV float mskv_b2f(mskv_u16 h) { return __uint_as_float(((mskv_u32)h) << 16); }
MSKV_DEV mskv_u16 mskv_f2b(float f) { mskv_u16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
MSKV_DEV mskv_u32 mskv_smem_addr(const void *p) { return (mskv_u32)__cvta_generic_to_shared(p); }
/* D += A * B, m16n8k16, A row-major (4 regs), B column-major (2 regs), f32 accumulators. */
MSKV_DEV void mskv_mma_f16(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
MSKV_DEV void mskv_mma_bf16(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
MSKV_DEV void mskv_ldsm_x4(mskv_u32 r[4], const void *smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(mskv_smem_addr(smem_row)));
}
MSKV_DEV void mskv_ldsm_x4_t(mskv_u32 r[4], const void *smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(mskv_smem_addr(smem_row)));
}
/* 16 bytes global -> shared, asynchronous; src_bytes 0 zero-fills the destination. */
MSKV_DEV void mskv_cp_async16(void *smem_dst, const void *gsrc, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(mskv_smem_addr(smem_dst)), "l"(gsrc), "r"(src_bytes) : "memory");
}
MSKV_DEV void mskv_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> MSKV_DEV void mskv_cp_wait(void) { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
struct __align__(16) mskv_v16 { mskv_u32 x, y, z, w; };
#else
/* Host C++: tests/emu/mskv_emu.h must be included first; it defines the same
   names (MSKV_KERNEL, MSKV_DEV, MSKV_SMEM, mskv_tid, mskv_sync, MSKV_SYNC_ID,
   mskv_shfl_xor, mskv_syncwarp, mskv_exp2, conversions, mma, ldmatrix, cp.async, mskv_v16). */
#ifndef MSKV_EMU_H
#error "kernels.cu: include tests/emu/mskv_emu.h before compiling the kernels on the host"
#endif
#endif

/* sm_90a-only code (wgmma, setmaxnreg, the kernel built on them): NVRTC
   compiling for sm_90a, or the host emulation (tests/emu/mskv_emu_sm90.h) */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(MSKV_EMU_SM90)
#define MSKV_SM90A 1
#else
#define MSKV_SM90A 0
#endif

#ifndef MSKV_DTYPE
#define MSKV_DTYPE 2
#endif
#ifndef MSKV_HEAD_DIM
#define MSKV_HEAD_DIM 128
#endif
#ifndef MSKV_ROPE
#define MSKV_ROPE 0
#endif
#ifndef MSKV_ROPE_STYLE
#define MSKV_ROPE_STYLE 0
#endif
#ifndef MSKV_ROPE_D0
#define MSKV_ROPE_D0 0
#endif
#ifndef MSKV_ROPE_D1
#define MSKV_ROPE_D1 0
#endif
#ifndef MSKV_ROPE_D2
#define MSKV_ROPE_D2 0
#endif
#ifndef MSKV_ATTN_WARP_KEYS
#define MSKV_ATTN_WARP_KEYS 0
#endif

#define MSKV_D MSKV_HEAD_DIM
#if MSKV_DTYPE == 0
#define MSKV_ESIZE 4
#else
#define MSKV_ESIZE 2
#endif

/* >>elements ------------------------------------------------------------- */
MSKV_DEV float mskv_load_el(const void *base, mskv_i64 i) {
#if MSKV_DTYPE == 0
    return ((const float *)base)[i];
#elif MSKV_DTYPE == 1
    return mskv_h2f(((const mskv_u16 *)base)[i]);
#else
    return mskv_b2f(((const mskv_u16 *)base)[i]);
#endif
}
MSKV_DEV void mskv_store_el(void *base, mskv_i64 i, float v) {
#if MSKV_DTYPE == 0
    ((float *)base)[i] = v;
#elif MSKV_DTYPE == 1
    ((mskv_u16 *)base)[i] = mskv_f2h(v);
#else
    ((mskv_u16 *)base)[i] = mskv_f2b(v);
#endif
}

/* >>rope ----------------------------------------------------------------- */
#if MSKV_ROPE == 1
#define MSKV_RD0 (MSKV_ROPE_D0 > 0 ? MSKV_ROPE_D0 : MSKV_D)
#define MSKV_RD1 0
#define MSKV_RD2 0
#elif MSKV_ROPE == 2
#if (MSKV_ROPE_D0 + MSKV_ROPE_D1 + MSKV_ROPE_D2) == 0
#define MSKV_RD1 (2 * ((MSKV_D / 2) / 3))
#define MSKV_RD2 (2 * ((MSKV_D / 2) / 3))
#define MSKV_RD0 (MSKV_D - MSKV_RD1 - MSKV_RD2)
#else
#define MSKV_RD0 MSKV_ROPE_D0
#define MSKV_RD1 MSKV_ROPE_D1
#define MSKV_RD2 MSKV_ROPE_D2
#endif
#endif

#if MSKV_ROPE != 0
/* Pair p of the head (0 <= p < D/2): the two element indices it moves and its
   angle. Pairs past the rotated parts keep (2p, 2p+1) unrotated. */
MSKV_DEV void mskv_rope_pair(int p, const int *pos, float log2_theta, int *e0, int *e1, float *c, float *s) {
    int base = 0, w = MSKV_RD0, axis = 0;
    if (2 * p >= MSKV_RD0) { base = MSKV_RD0; w = MSKV_RD1; axis = 1; }
    if (2 * p >= MSKV_RD0 + MSKV_RD1) { base = MSKV_RD0 + MSKV_RD1; w = MSKV_RD2; axis = 2; }
    if (2 * p >= MSKV_RD0 + MSKV_RD1 + MSKV_RD2 || w == 0) {
        *e0 = 2 * p; *e1 = 2 * p + 1; *c = 1.0f; *s = 0.0f;
        return;
    }
    {
        int i = p - base / 2;
        float ang, inv_freq = exp2f(-(float)(2 * i) / (float)w * log2_theta);
#if MSKV_ROPE_STYLE == 0
        *e0 = base + i; *e1 = base + i + w / 2;
#else
        *e0 = base + 2 * i; *e1 = base + 2 * i + 1;
#endif
        ang = (float)pos[MSKV_ROPE == 2 ? axis : 0] * inv_freq;
        *c = cosf(ang); *s = sinf(ang);
    }
}

/* Rotates one row src -> dst (both D elements of the pool dtype; may alias). */
MSKV_DEV void mskv_rope_row(const void *src, void *dst, const int *pos, float theta, int lane) {
    float l2t = log2f(theta > 0.0f ? theta : 10000.0f);
    for (int p = lane; p < MSKV_D / 2; p += 32) {
        int e0, e1;
        float c, s, x, y;
        mskv_rope_pair(p, pos, l2t, &e0, &e1, &c, &s);
        x = mskv_load_el(src, e0);
        y = mskv_load_el(src, e1);
        mskv_store_el(dst, e0, x * c - y * s);
        mskv_store_el(dst, e1, x * s + y * c);
    }
}
#endif

/* >>kv write ------------------------------------------------------------- */
/* Copies one row of D elements with 16-byte accesses (rows are 16-byte aligned:
   D * esize is a multiple of 16 and the bases come from the allocator). */
MSKV_DEV void mskv_copy_row(const void *src, void *dst, int lane) {
    const mskv_v16 *s = (const mskv_v16 *)src;
    mskv_v16 *d = (mskv_v16 *)dst;
    for (int c = lane; c < MSKV_D * MSKV_ESIZE / 16; c += 32) d[c] = s[c];
}

MSKV_KERNEL void mskv_kv_write(const void *k_src, const void *v_src, const mskv_i64 *slot_mapping,
                               int n_tokens, int kv_heads, void *k_pool, void *v_pool,
                               mskv_i64 pool_slots, const int *positions, float theta) {
    int lane = mskv_tid() & 31;
    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);
    mskv_i64 token, slot, h, src_off, dst_off;
    if (row >= (mskv_i64)n_tokens * kv_heads) return;
    token = row / kv_heads;
    h = row - token * kv_heads;
    slot = slot_mapping[token];
    if (slot < 0 || slot >= pool_slots) return;
    src_off = row * MSKV_D * MSKV_ESIZE;
    dst_off = (slot * kv_heads + h) * MSKV_D * MSKV_ESIZE;
#if MSKV_ROPE != 0
    mskv_copy_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);
    mskv_rope_row((const unsigned char *)k_src + src_off, (unsigned char *)k_pool + dst_off,
                  positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);
#else
    {
        /* K and V chunks in one loop, so a 256-byte row pair keeps all 32 lanes busy */
        const int ch = MSKV_D * MSKV_ESIZE / 16;
        (void)positions; (void)theta;
        for (int c = lane; c < 2 * ch; c += 32) {
            int v = c >= ch, cc = c - (v ? ch : 0);
            const mskv_v16 *s = (const mskv_v16 *)((const unsigned char *)(v ? v_src : k_src) + src_off);
            mskv_v16 *d = (mskv_v16 *)((unsigned char *)(v ? v_pool : k_pool) + dst_off);
            d[cc] = s[cc];
        }
    }
#endif
}

MSKV_KERNEL void mskv_rope(void *x, mskv_i64 n, int heads, const int *positions, float theta) {
    int lane = mskv_tid() & 31;
    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);
    if (row >= n * heads) return;
#if MSKV_ROPE != 0
    {
        mskv_i64 token = row / heads;
        unsigned char *p = (unsigned char *)x + row * MSKV_D * MSKV_ESIZE;
        mskv_rope_row(p, p, positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);
    }
#else
    (void)x; (void)positions; (void)theta; (void)lane;
#endif
}

/* >>page copy ------------------------------------------------------------ */
MSKV_DEV void mskv_copy_bytes(const unsigned char *src, unsigned char *dst, mskv_i64 n, int vec) {
    mskv_i64 chunk = (mskv_i64)mskv_bid_x() * 4096;
    mskv_i64 step = (mskv_i64)mskv_nblk_x() * 4096;
    for (; chunk < n; chunk += step) {
        mskv_i64 end = chunk + 4096 < n ? chunk + 4096 : n;
        if (vec) {
            for (mskv_i64 i = chunk + 16 * (mskv_i64)mskv_tid(); i < end; i += 16 * 256)
                *(mskv_v16 *)(dst + i) = *(const mskv_v16 *)(src + i);
        } else {
            for (mskv_i64 i = chunk + mskv_tid(); i < end; i += 256) dst[i] = src[i];
        }
    }
}

MSKV_KERNEL void mskv_page_gather(const unsigned char *pool, const int *pages, int n_pages,
                                  mskv_i64 page_bytes, unsigned char *dst, mskv_i64 dst_stride) {
    int i = mskv_bid_y();
    const unsigned char *s;
    unsigned char *d;
    if (i >= n_pages) return;
    s = pool + (mskv_i64)pages[i] * page_bytes;
    d = dst + (mskv_i64)i * dst_stride;
    mskv_copy_bytes(s, d, page_bytes,
                    (((mskv_u64)pool | (mskv_u64)dst | (mskv_u64)page_bytes | (mskv_u64)dst_stride) & 15) == 0);
}

MSKV_KERNEL void mskv_page_scatter(unsigned char *pool, const int *pages, int n_pages,
                                   mskv_i64 page_bytes, const unsigned char *src, mskv_i64 src_stride) {
    int i = mskv_bid_y();
    const unsigned char *s;
    unsigned char *d;
    if (i >= n_pages) return;
    s = src + (mskv_i64)i * src_stride;
    d = pool + (mskv_i64)pages[i] * page_bytes;
    mskv_copy_bytes(s, d, page_bytes,
                    (((mskv_u64)pool | (mskv_u64)src | (mskv_u64)page_bytes | (mskv_u64)src_stride) & 15) == 0);
}

/* >>attention ------------------------------------------------------------ */
MSKV_DEV float mskv_neg_inf(void) { return mskv_u_as_f(0xff800000u); }

/* LSE merge: one warp per row, any dtype out. */
MSKV_KERNEL void mskv_lse_merge(const float *o_part, const float *lse_part, int n_parts, mskv_i64 part_rows,
                                mskv_i64 rows, void *o, float *lse) {
    int lane = mskv_tid() & 31;
    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);
    float m = mskv_neg_inf(), sum = 0.0f;
    float acc[MSKV_D / 32];
    if (row >= rows) return;
    for (int p = 0; p < n_parts; p++) m = fmaxf(m, lse_part[p * part_rows + row]);
    for (int i = 0; i < MSKV_D / 32; i++) acc[i] = 0.0f;
    if (m != mskv_neg_inf()) {
        for (int p = 0; p < n_parts; p++) {
            float l = lse_part[p * part_rows + row], w;
            if (l == mskv_neg_inf()) continue;  /* an empty part: its o may be anything */
            w = expf(l - m);
            sum += w;
            for (int i = 0; i < MSKV_D / 32; i++) acc[i] += w * o_part[(p * part_rows + row) * MSKV_D + lane + 32 * i];
        }
    }
    for (int i = 0; i < MSKV_D / 32; i++)
        mskv_store_el(o, row * MSKV_D + lane + 32 * i, sum > 0.0f ? acc[i] / sum : 0.0f);
    if (lse && lane == 0) lse[row] = sum > 0.0f ? m + logf(sum) : mskv_neg_inf();
}

/* Two partial states over disjoint keys -> their union (f32 o, any aliasing
   of o with o_a or o_b allowed: each element is read before it is written). */
MSKV_KERNEL void mskv_state_merge(const float *o_a, const float *lse_a, const float *o_b, const float *lse_b,
                                  mskv_i64 rows, float *o, float *lse) {
    int lane = mskv_tid() & 31;
    mskv_i64 row = (mskv_i64)mskv_bid_x() * 4 + (mskv_tid() >> 5);
    float la, lb, m, wa, wb, sum;
    if (row >= rows) return;
    la = lse_a[row]; lb = lse_b[row];
    m = fmaxf(la, lb);
    wa = la == mskv_neg_inf() ? 0.0f : expf(la - m);
    wb = lb == mskv_neg_inf() ? 0.0f : expf(lb - m);
    sum = wa + wb;
    for (int d = lane; d < MSKV_D; d += 32) {
        mskv_i64 i = row * MSKV_D + d;
        float x = (wa > 0.0f ? wa * o_a[i] : 0.0f) + (wb > 0.0f ? wb * o_b[i] : 0.0f);
        o[i] = sum > 0.0f ? x / sum : 0.0f;
    }
    mskv_syncwarp();  /* every lane has read lse_a/lse_b[row] before it may be overwritten */
    if (lse && lane == 0) lse[row] = sum > 0.0f ? m + logf(sum) : mskv_neg_inf();
}

#if MSKV_DTYPE != 0
/* Tiles: BM query rows per block, BN keys per K/V tile (two stages), 4 warps.
   Prefill: warp w owns rows [16w, 16w+16) and every key of a tile.
   Decode: the block has 16 rows; warp w takes keys [16w, 16w+16) of each tile;
   the four partial softmax states are merged through shared memory. */
#if MSKV_ATTN_WARP_KEYS
#define MSKV_BM 16
#define MSKV_BN 64
#define MSKV_WK 16
#else
#define MSKV_BM 64
#define MSKV_BN (MSKV_D >= 256 ? 32 : 64)
#define MSKV_WK MSKV_BN
#endif
#define MSKV_CH (MSKV_D / 8)          /* 16-byte chunks per row */
#define MSKV_NT (MSKV_WK / 8)         /* n-tiles of 8 keys per warp and tile */
#define MSKV_QREG (MSKV_D <= 128)     /* keep Q fragments in registers */
#define MSKV_ATTN_SMEM (2 * (MSKV_BM * MSKV_D + 4 * MSKV_BN * MSKV_D))

/* Element offset of 16-byte chunk c of row r: XOR swizzle, so the 8 rows an
   ldmatrix reads fall in 8 different bank groups. */
MSKV_DEV int mskv_swz(int r, int c) { return (r * MSKV_CH + (c ^ (r & 7))) * 8; }

MSKV_DEV mskv_u32 mskv_pack2(float lo, float hi) {
#if MSKV_DTYPE == 1
    return (mskv_u32)mskv_f2h(lo) | ((mskv_u32)mskv_f2h(hi) << 16);
#else
    return (mskv_u32)mskv_f2b(lo) | ((mskv_u32)mskv_f2b(hi) << 16);
#endif
}
MSKV_DEV void mskv_mma(float d[4], const mskv_u32 a[4], const mskv_u32 b[2]) {
#if MSKV_DTYPE == 1
    mskv_mma_f16(d, a, b);
#else
    mskv_mma_bf16(d, a, b);
#endif
}

/* Absolute position of compacted index j. */
MSKV_DEV int mskv_abs_pos(int j, int split, int shift) { return j < split ? j : j + shift; }
/* The smallest compacted index whose position is >= p (positions increase with j). */
MSKV_DEV int mskv_first_at(int p, int split, int shift) {
    if (p < split) return p > 0 ? p : 0;
    return p - shift > split ? p - shift : split;
}

struct mskv_tile_ctx {
    const unsigned char *k_pool, *v_pool;
    const int *pages;
    int page_size, kv_heads, kvh, n_hi;
};

/* Issues the cp.async copies of keys [n0, n0 + BN) of K and V into one stage,
   each row found through the page table; rows past n_hi are zero-filled (a
   page's unused slots may hold anything, NaN included). */
MSKV_DEV void mskv_load_kv(const mskv_tile_ctx &c, mskv_u16 *sk, mskv_u16 *sv, int n0) {
    for (int idx = mskv_tid(); idx < MSKV_BN * MSKV_CH; idx += 128) {
        int r = idx / MSKV_CH, ch = idx % MSKV_CH, j = n0 + r, ok = j < c.n_hi;
        mskv_i64 off = 0;
        if (ok) {
            mskv_i64 slot = (mskv_i64)c.pages[j / c.page_size] * c.page_size + j % c.page_size;
            off = ((slot * c.kv_heads + c.kvh) * MSKV_D + ch * 8) * 2;
        }
        mskv_cp_async16(sk + mskv_swz(r, ch), c.k_pool + off, ok ? 16 : 0);
        mskv_cp_async16(sv + mskv_swz(r, ch), c.v_pool + off, ok ? 16 : 0);
    }
}

MSKV_KERNEL void mskv_attn(const void *q, const void *k_pool, const void *v_pool,
                           const int *qo_indptr, const int *kv_indptr, const int *kv_indices,
                           const int *kv_len, const int *kv_pos_split, const int *kv_pos_shift,
                           int q_heads, int kv_heads, int page_size, float scale_log2,
                           int mask, int window_left, int kv_chunk, int n_splits,
                           void *o, float *lse, float *o_part, float *lse_part) {
    MSKV_SMEM(smem);
    mskv_u16 *sq = (mskv_u16 *)smem;
    mskv_u16 *sk = sq + MSKV_BM * MSKV_D;       /* [2][BN][D] */
    mskv_u16 *sv = sk + 2 * MSKV_BN * MSKV_D;   /* [2][BN][D] */
    const int tid = mskv_tid(), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;
    const int group = q_heads / kv_heads;
    const int q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0;
    const int rows = qo_len * group, row0 = mskv_bid_x() * MSKV_BM;
    const int kvl = kv_len[b], psplit = kv_pos_split[b], pshift = kv_pos_shift[b];
    const int wrow0 = MSKV_ATTN_WARP_KEYS ? 0 : warp * 16;   /* the warp's first row in the block */
    const int wkey0 = MSKV_ATTN_WARP_KEYS ? warp * 16 : 0;   /* the warp's first key in a tile */
    int n_lo, n_hi, n_tiles;
    int qpos[2], rvalid[2];
    float m[2], l[2], oacc[MSKV_D / 8][4];
    mskv_tile_ctx tc;
    if (row0 >= rows) return;  /* whole block: before any barrier */

    /* keys this block needs: its split, cut by the mask's reach */
    n_lo = n_splits > 1 ? split * kv_chunk : 0;
    n_hi = n_splits > 1 ? (n_lo + kv_chunk < kvl ? n_lo + kv_chunk : kvl) : kvl;
    {
        int last = row0 + MSKV_BM - 1 < rows - 1 ? row0 + MSKV_BM - 1 : rows - 1;
        int qi_first = kvl - qo_len + row0 / group, qi_last = kvl - qo_len + last / group;
        if (mask >= 1 && qi_last + 1 < n_hi) n_hi = qi_last + 1;
        if (mask == 2) {
            int lo = mskv_first_at(mskv_abs_pos(qi_first, psplit, pshift) - window_left, psplit, pshift);
            if (lo > n_lo) n_lo = lo;
        }
    }
    n_tiles = n_hi > n_lo ? (n_hi - n_lo + MSKV_BN - 1) / MSKV_BN : 0;
    tc.k_pool = (const unsigned char *)k_pool;
    tc.v_pool = (const unsigned char *)v_pool;
    tc.pages = kv_indices + kv_indptr[b];
    tc.page_size = page_size; tc.kv_heads = kv_heads; tc.kvh = kvh; tc.n_hi = n_hi;

    /* Q tile: row r of the block is query (row0 + r) / group, q head kvh * group + (row0 + r) % group */
    for (int idx = tid; idx < MSKV_BM * MSKV_CH; idx += 128) {
        int r = idx / MSKV_CH, ch = idx % MSKV_CH, R = row0 + r, ok = R < rows;
        mskv_i64 off = 0;
        if (ok) off = (((mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group) * MSKV_D + ch * 8) * 2;
        mskv_cp_async16(sq + mskv_swz(r, ch), (const unsigned char *)q + off, ok ? 16 : 0);
    }
    mskv_cp_commit();
    if (n_tiles > 0) mskv_load_kv(tc, sk, sv, n_lo);
    mskv_cp_commit();

    for (int h = 0; h < 2; h++) {
        int R = row0 + wrow0 + g + 8 * h;
        rvalid[h] = R < rows;
        qpos[h] = mskv_abs_pos(kvl - qo_len + (rvalid[h] ? R : rows - 1) / group, psplit, pshift);
        m[h] = mskv_neg_inf();
        l[h] = 0.0f;
    }
MSKV_UNROLL
    for (int i = 0; i < MSKV_D / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;

#if MSKV_QREG
    mskv_u32 qf[MSKV_D / 16][4];
#endif
    for (int it = 0; it < n_tiles; it++) {
        const int st = it & 1, n0 = n_lo + it * MSKV_BN;
        const mskv_u16 *tk = sk + st * MSKV_BN * MSKV_D, *tv = sv + st * MSKV_BN * MSKV_D;
        float s[MSKV_NT][4];
        if (it + 1 < n_tiles) {
            mskv_load_kv(tc, sk + (st ^ 1) * MSKV_BN * MSKV_D, sv + (st ^ 1) * MSKV_BN * MSKV_D, n0 + MSKV_BN);
            mskv_cp_commit();
            mskv_cp_wait<1>();
        } else {
            mskv_cp_wait<0>();
        }
        MSKV_SYNC_ID(1);  /* this stage (and Q) landed for every thread */
#if MSKV_QREG
        if (it == 0) {
MSKV_UNROLL
            for (int kk = 0; kk < MSKV_D / 16; kk++)
                mskv_ldsm_x4(qf[kk], sq + mskv_swz(wrow0 + (lane & 15), 2 * kk + (lane >> 4)));
        }
#endif
        /* S = Q K^T for the warp's 16 rows x WK keys */
MSKV_UNROLL
        for (int nt = 0; nt < MSKV_NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
MSKV_UNROLL
        for (int kk = 0; kk < MSKV_D / 16; kk++) {
#if MSKV_QREG
            const mskv_u32 *a = qf[kk];
#else
            mskv_u32 a[4];
            mskv_ldsm_x4(a, sq + mskv_swz(wrow0 + (lane & 15), 2 * kk + (lane >> 4)));
#endif
MSKV_UNROLL
            for (int np = 0; np < MSKV_NT / 2; np++) {
                mskv_u32 kb[4];
                mskv_ldsm_x4(kb, tk + mskv_swz(wkey0 + np * 16 + (lane & 7) + (lane >> 4) * 8, 2 * kk + ((lane >> 3) & 1)));
                mskv_mma(s[2 * np], a, kb);
                mskv_mma(s[2 * np + 1], a, kb + 2);
            }
        }
        /* mask, online softmax: the running max m is kept unscaled, exponents in log2 units */
        {
            float mx[2], alpha[2];
            /* is every key of the warp's slice visible to both of this thread's
               rows? Then no per-element test (positions grow with the index). */
            const int k_first = n0 + wkey0, k_last = k_first + MSKV_WK - 1;
            int full = k_first >= n_lo && k_last < n_hi;
            if (full && mask >= 1) {
                int qmin = qpos[0] < qpos[1] ? qpos[0] : qpos[1], qmax = qpos[0] < qpos[1] ? qpos[1] : qpos[0];
                full = mskv_abs_pos(k_last, psplit, pshift) <= qmin &&
                       (mask != 2 || qmax - mskv_abs_pos(k_first, psplit, pshift) <= window_left);
            }
            mx[0] = m[0]; mx[1] = m[1];
            if (full) {
MSKV_UNROLL
                for (int nt = 0; nt < MSKV_NT; nt++) {
MSKV_UNROLL
                    for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
                }
            } else {
MSKV_UNROLL
                for (int nt = 0; nt < MSKV_NT; nt++) {
MSKV_UNROLL
                    for (int e = 0; e < 4; e++) {
                        int h = e >> 1, j = k_first + nt * 8 + 2 * t4 + (e & 1);
                        int kp = mskv_abs_pos(j, psplit, pshift);
                        int ok = j >= n_lo && j < n_hi;
                        if (mask >= 1) ok = ok && kp <= qpos[h];
                        if (mask == 2) ok = ok && qpos[h] - kp <= window_left;
                        s[nt][e] = ok ? s[nt][e] : mskv_neg_inf();
                        mx[h] = fmaxf(mx[h], s[nt][e]);
                    }
                }
            }
MSKV_UNROLL
            for (int h = 0; h < 2; h++) {
                float mu;
                mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 1));
                mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 2));
                mu = mx[h] == mskv_neg_inf() ? 0.0f : mx[h];  /* nothing seen yet: keep exp2 finite */
                alpha[h] = mskv_exp2((m[h] - mu) * scale_log2);
                m[h] = mx[h];
                l[h] *= alpha[h];
                mx[h] = mu * scale_log2;  /* p = exp2(s * scale_log2 - mx): one fma per score */
            }
MSKV_UNROLL
            for (int i = 0; i < MSKV_D / 8; i++) {
                oacc[i][0] *= alpha[0]; oacc[i][1] *= alpha[0];
                oacc[i][2] *= alpha[1]; oacc[i][3] *= alpha[1];
            }
MSKV_UNROLL
            for (int nt = 0; nt < MSKV_NT; nt++) {
MSKV_UNROLL
                for (int e = 0; e < 4; e++) {
                    s[nt][e] = mskv_exp2(fmaf(s[nt][e], scale_log2, -mx[e >> 1]));
                    l[e >> 1] += s[nt][e];
                }
            }
        }
        /* O += P V: P from the S accumulators (C layout == A layout per 16 keys) */
MSKV_UNROLL
        for (int ks = 0; ks < MSKV_NT / 2; ks++) {
            mskv_u32 pa[4];
            pa[0] = mskv_pack2(s[2 * ks][0], s[2 * ks][1]);
            pa[1] = mskv_pack2(s[2 * ks][2], s[2 * ks][3]);
            pa[2] = mskv_pack2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
            pa[3] = mskv_pack2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
MSKV_UNROLL
            for (int dp = 0; dp < MSKV_D / 16; dp++) {
                mskv_u32 vb[4];
                mskv_ldsm_x4_t(vb, tv + mskv_swz(wkey0 + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));
                mskv_mma(oacc[2 * dp], pa, vb);
                mskv_mma(oacc[2 * dp + 1], pa, vb + 2);
            }
        }
        MSKV_SYNC_ID(2);  /* everyone is done with this stage before it is refilled */
    }
    mskv_cp_wait<0>();

    /* row sums were kept per lane; the 4 lanes of a row add them up */
    for (int h = 0; h < 2; h++) {
        l[h] += mskv_shfl_xor(l[h], 1);
        l[h] += mskv_shfl_xor(l[h], 2);
    }
    {
        const mskv_i64 total_q = qo_indptr[mskv_nblk_y()];
        const float ln2 = 0.6931471805599453f;
#if MSKV_ATTN_WARP_KEYS
        /* merge the 4 warps' states: smem [warp][16][D] f32 o, then m and l */
        float *mo = (float *)smem, *mm = mo + 4 * 16 * MSKV_D, *ml = mm + 4 * 16;
        MSKV_SYNC_ID(3);  /* K/V tiles are dead: reuse shared memory */
MSKV_UNROLL
        for (int i = 0; i < MSKV_D / 8; i++) {
            float *p0 = mo + (warp * 16 + g) * MSKV_D + i * 8 + 2 * t4, *p1 = p0 + 8 * MSKV_D;
            p0[0] = oacc[i][0]; p0[1] = oacc[i][1]; p1[0] = oacc[i][2]; p1[1] = oacc[i][3];
        }
        if (t4 == 0) {
            mm[warp * 16 + g] = m[0]; mm[warp * 16 + g + 8] = m[1];
            ml[warp * 16 + g] = l[0]; ml[warp * 16 + g + 8] = l[1];
        }
        MSKV_SYNC_ID(4);
        for (int idx = tid; idx < 16 * MSKV_D; idx += 128) {
            int r = idx / MSKV_D, d = idx % MSKV_D, R = row0 + r;
            float M = mskv_neg_inf(), L = 0.0f, acc = 0.0f;
            mskv_i64 orow;
            if (R >= rows) continue;
            for (int w = 0; w < 4; w++) M = fmaxf(M, mm[w * 16 + r]);
            if (M != mskv_neg_inf()) {
                for (int w = 0; w < 4; w++) {
                    float f = mskv_exp2((mm[w * 16 + r] - M) * scale_log2);
                    L += f * ml[w * 16 + r];
                    acc += f * mo[(w * 16 + r) * MSKV_D + d];
                }
            }
            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;
            if (n_splits > 1) {
                o_part[((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + d] = L > 0.0f ? acc / L : 0.0f;
                if (d == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = L > 0.0f ? (M * scale_log2 + log2f(L)) * ln2 : mskv_neg_inf();
            } else {
                mskv_store_el(o, orow * MSKV_D + d, L > 0.0f ? acc / L : 0.0f);
                if (lse && d == 0) lse[orow] = L > 0.0f ? (M * scale_log2 + log2f(L)) * ln2 : mskv_neg_inf();
            }
        }
#else
        for (int h = 0; h < 2; h++) {
            int R = row0 + wrow0 + g + 8 * h;
            float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
            float lv = l[h] > 0.0f ? (m[h] * scale_log2 + log2f(l[h])) * ln2 : mskv_neg_inf();
            mskv_i64 orow;
            if (!rvalid[h]) continue;
            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;
            if (n_splits > 1) {
                float *dst = o_part + ((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + 2 * t4;
MSKV_UNROLL
                for (int i = 0; i < MSKV_D / 8; i++) { dst[i * 8] = oacc[i][2 * h] * inv; dst[i * 8 + 1] = oacc[i][2 * h + 1] * inv; }
                if (t4 == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = lv;
            } else {
                mskv_u32 *dst = (mskv_u32 *)((mskv_u16 *)o + orow * MSKV_D + 2 * t4);
MSKV_UNROLL
                for (int i = 0; i < MSKV_D / 8; i++) dst[i * 4] = mskv_pack2(oacc[i][2 * h] * inv, oacc[i][2 * h + 1] * inv);
                if (lse && t4 == 0) lse[orow] = lv;
            }
        }
#endif
    }
}
#endif /* MSKV_DTYPE != 0 */

/* >>attention sm90a -------------------------------------------------------- */
/* mskv_attn_sm90: the prefill/chunk attention of mskv_attn for sm_90a, in the
   warp-specialised manner of FlashAttention-3 (see the file's header). */
#if MSKV_SM90A && MSKV_DTYPE != 0

#ifdef MSKV_GPU
/* Hopper primitives. The tensor map is CUtensorMap: 128 opaque bytes, passed
   by value as a __grid_constant__ parameter so TMA can read it in place. */
struct __align__(64) mskv_tmap { mskv_u64 opaque[16]; };
#define MSKV_GRID_CONST __grid_constant__
#define MSKV_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
/* bar.sync / bar.arrive: n threads (a multiple of 32) meet at named barrier id */
MSKV_DEV void mskv_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory"); }
MSKV_DEV void mskv_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(n) : "memory"); }
MSKV_DEV void mskv_mbar_init(mskv_u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
/* makes the inits visible to the async proxy (the copies that complete on them) */
MSKV_DEV void mskv_mbar_init_fence(void) { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
MSKV_DEV void mskv_mbar_arrive(mskv_u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" :: "r"(bar) : "memory");
}
MSKV_DEV void mskv_mbar_arrive_tx(mskv_u32 bar, mskv_u32 bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" :: "r"(bar), "r"(bytes) : "memory");
}
/* 1 once the phase of this parity has completed */
MSKV_DEV int mskv_mbar_try_wait(mskv_u32 bar, int parity) {
    mskv_u32 ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return (int)ok;
}
/* generic-proxy writes of this thread (cp.async) become visible to wgmma and TMA */
MSKV_DEV void mskv_fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
MSKV_DEV void mskv_tma_load_4d(mskv_u32 dst, const mskv_tmap *map, int c0, int c1, int c2, int c3, mskv_u32 bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
                 :: "r"(dst), "l"((mskv_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
MSKV_DEV void mskv_wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
MSKV_DEV void mskv_wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> MSKV_DEV void mskv_wgmma_wait(void) { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
template <int N> MSKV_DEV void mskv_setmaxnreg_inc(void) { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> MSKV_DEV void mskv_setmaxnreg_dec(void) { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
/* Registers an asynchronous wgmma reads or writes: the compiler must neither
   move their uses across the wait nor reuse them while the op runs. */
MSKV_DEV void mskv_wg_keep(float &x) { asm volatile("" : "+f"(x) :: "memory"); }
MSKV_DEV void mskv_wg_keep_u(mskv_u32 &x) { asm volatile("" : "+r"(x) :: "memory"); }
#if MSKV_DTYPE == 1
#define MSKV_WG_TY ".f16.f16"
#else
#define MSKV_WG_TY ".bf16.bf16"
#endif
/* accumulator operand lists: "+f"(d[0]) ... */
#define MSKV_WG_O8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MSKV_WG_O32 MSKV_WG_O8(0), MSKV_WG_O8(8), MSKV_WG_O8(16), MSKV_WG_O8(24)
#define MSKV_WG_O64 MSKV_WG_O32, MSKV_WG_O8(32), MSKV_WG_O8(40), MSKV_WG_O8(48), MSKV_WG_O8(56)
#define MSKV_WG_O128 MSKV_WG_O64, MSKV_WG_O8(64), MSKV_WG_O8(72), MSKV_WG_O8(80), MSKV_WG_O8(88), \
    MSKV_WG_O8(96), MSKV_WG_O8(104), MSKV_WG_O8(112), MSKV_WG_O8(120)
#define MSKV_WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MSKV_WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define MSKV_WG_D128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
/* wgmma m64nNk16 with f32 accumulators d[N/2]; acc 0: D = A B, else D += A B.
   ss: A and B K-major from descriptors (S = Q K^T); rs: A from registers (P),
   B N-major from a descriptor (O += P V, imm-trans-b 1). */
#define MSKV_WG_SS(N, DL, OPS, IA, IB, IP)                                                              \
    MSKV_DEV void mskv_wgmma_ss##N(float *d, mskv_u64 da, mskv_u64 db, int acc) {                       \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" MSKV_WG_TY " " DL ", %" #IA ", %" #IB \
                     ", p, 1, 1, 0, 0;\n}\n" : OPS : "l"(da), "l"(db), "r"(acc));                        \
    }
#define MSKV_WG_RS(N, DL, OPS, I0, I1, I2, I3, IB, IP)                                                  \
    MSKV_DEV void mskv_wgmma_rs##N(float *d, const mskv_u32 *a, mskv_u64 db, int acc) {                 \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" MSKV_WG_TY " " DL ", {%" #I0 ", %" #I1 \
                     ", %" #I2 ", %" #I3 "}, %" #IB ", p, 1, 1, 1;\n}\n"                                 \
                     : OPS : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));            \
    }
MSKV_WG_SS(64, MSKV_WG_D32, MSKV_WG_O32, 32, 33, 34)
MSKV_WG_SS(128, MSKV_WG_D64, MSKV_WG_O64, 64, 65, 66)
MSKV_WG_RS(64, MSKV_WG_D32, MSKV_WG_O32, 32, 33, 34, 35, 36, 37)
MSKV_WG_RS(128, MSKV_WG_D64, MSKV_WG_O64, 64, 65, 66, 67, 68, 69)
MSKV_WG_RS(256, MSKV_WG_D128, MSKV_WG_O128, 128, 129, 130, 131, 132, 133)
#else
/* host emulation: tests/emu/mskv_emu_sm90.h has the primitives; the wgmma
   entry points take this file's MSKV_DTYPE */
MSKV_DEV void mskv_wgmma_ss64(float *d, mskv_u64 da, mskv_u64 db, int acc) { mskv_emu_wgmma_ss(d, 64, da, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_ss128(float *d, mskv_u64 da, mskv_u64 db, int acc) { mskv_emu_wgmma_ss(d, 128, da, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_rs64(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 64, a, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_rs128(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 128, a, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_rs256(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 256, a, db, acc, MSKV_DTYPE == 2); }
#endif

/* Tiles: 128 rows per block (two consumer warpgroups of 64), BN keys per K/V
   tile, a ring of STAGES stages of K and V. Every operand tile is K-major
   with the 128-byte swizzle: [D/64 column blocks][rows][128 B], 16-byte chunk
   c of row r at ((c ^ (r & 7)) << 4) of its 128-byte row, each tile on a
   1024-byte boundary. */
#if MSKV_D >= 256
#define MSKV_H_BN 64
#else
#define MSKV_H_BN 128
#endif
#if MSKV_D <= 64
#define MSKV_H_STAGES 3
#else
#define MSKV_H_STAGES 2
#endif
#define MSKV_H_THREADS 384                        /* producer warpgroup + 2 consumers */
#define MSKV_H_BM 128
#define MSKV_H_QB (64 * MSKV_D * 2)                /* one consumer's Q tile */
#define MSKV_H_TB (MSKV_H_BN * MSKV_D * 2)         /* one K (or V) tile */
#define MSKV_H_SB (2 * MSKV_H_TB)                  /* a stage: K, then V */
#define MSKV_H_BARS (2 * MSKV_H_QB + MSKV_H_STAGES * MSKV_H_SB)   /* full[STAGES], empty[STAGES] */
#define MSKV_H_SMEM (1024 + MSKV_H_BARS + 16 * MSKV_H_STAGES)     /* + slack to align the base */
#define MSKV_H_REGS_PRODUCER 40
#define MSKV_H_REGS_CONSUMER 232                  /* 128 x 40 + 256 x 232 <= 64K */
/* named barriers: 1 producer team, 2 + w consumer w's Q, 4 + w consumer w's turn at the tensor cores */
#define MSKV_CAT2(a, b) a##b
#define MSKV_CAT(a, b) MSKV_CAT2(a, b)
#define MSKV_WGMMA_S MSKV_CAT(mskv_wgmma_ss, MSKV_H_BN)
#define MSKV_WGMMA_PV MSKV_CAT(mskv_wgmma_rs, MSKV_HEAD_DIM)

#ifndef MSKV_GPU
/* for the host tests: the launch geometry of these defines */
static const int mskv_attn_sm90_block_keys = MSKV_H_BN, mskv_attn_sm90_smem_bytes = MSKV_H_SMEM;
#endif

/* matrix descriptor, 128-byte swizzle: start, leading / stride byte offsets */
MSKV_DEV mskv_u64 mskv_h_desc(mskv_u32 addr, mskv_u32 lbo, mskv_u32 sbo) {
    return (mskv_u64)((addr & 0x3ffffu) >> 4) | ((mskv_u64)((lbo & 0x3ffffu) >> 4) << 16) |
           ((mskv_u64)((sbo & 0x3ffffu) >> 4) << 32) | (1ull << 62);
}

/* The keys a block visits, as tiles of BN from tile0 (BN-aligned). Tiles
   [f_lo, f_hi) are visible whole to every row of the block; the others
   ("masked") go first, in a loop of their own, then the whole ones. */
struct mskv_h_keys {
    int split_lo, split_hi;   /* the split's keys (kv_len cut) */
    int n_lo, n_hi;           /* cut further by the mask's reach over the block's rows */
    int tile0, n_tiles, f_lo, f_hi, n_masked;
};
MSKV_DEV mskv_h_keys mskv_h_block_keys(int row0, int rows, int group, int qo_len, int kvl, int psplit, int pshift,
                                       int mask, int window_left, int kv_chunk, int n_splits, int split) {
    mskv_h_keys k;
    const int last = row0 + MSKV_H_BM - 1 < rows - 1 ? row0 + MSKV_H_BM - 1 : rows - 1;
    const int qi_first = kvl - qo_len + row0 / group, qi_last = kvl - qo_len + last / group;
    int lo_max, hi_min;
    k.split_lo = n_splits > 1 ? split * kv_chunk : 0;
    k.split_hi = n_splits > 1 ? (k.split_lo + kv_chunk < kvl ? k.split_lo + kv_chunk : kvl) : kvl;
    k.n_lo = lo_max = k.split_lo;
    k.n_hi = hi_min = k.split_hi;
    if (mask >= 1) {
        if (qi_last + 1 < k.n_hi) k.n_hi = qi_last + 1;
        if (qi_first + 1 < hi_min) hi_min = qi_first + 1;
    }
    if (mask == 2) {
        const int lo = mskv_first_at(mskv_abs_pos(qi_first, psplit, pshift) - window_left, psplit, pshift);
        const int lo2 = mskv_first_at(mskv_abs_pos(qi_last, psplit, pshift) - window_left, psplit, pshift);
        if (lo > k.n_lo) k.n_lo = lo;
        if (lo2 > lo_max) lo_max = lo2;
    }
    k.tile0 = k.n_lo / MSKV_H_BN * MSKV_H_BN;
    k.n_tiles = k.n_hi > k.n_lo ? (k.n_hi - k.tile0 + MSKV_H_BN - 1) / MSKV_H_BN : 0;
    k.f_lo = (lo_max - k.tile0 + MSKV_H_BN - 1) / MSKV_H_BN;
    if (k.f_lo > k.n_tiles) k.f_lo = k.n_tiles;
    k.f_hi = hi_min > k.tile0 ? (hi_min - k.tile0) / MSKV_H_BN : 0;
    if (k.f_hi > k.n_tiles) k.f_hi = k.n_tiles;
    if (k.f_hi < k.f_lo) k.f_hi = k.f_lo;
    k.n_masked = k.f_lo + (k.n_tiles - k.f_hi);
    return k;
}
/* first key of the i-th tile in visiting order (producer and consumers agree) */
MSKV_DEV int mskv_h_tile_key(const mskv_h_keys &k, int i) {
    const int tile = i < k.n_masked ? (i < k.f_lo ? i : i - k.f_lo + k.f_hi) : i - k.n_masked + k.f_lo;
    return k.tile0 + tile * MSKV_H_BN;
}

/* ---- producer: one tile of K and V into a stage ---- */

/* TMA: the tile lies in whole pages (page_size a multiple of BN, or BN a
   multiple of page_size), one box per page piece and 64-wide column block:
   the tensor map is the pool as [pages][page_size][kv_heads][D] (dims D,
   kv_heads, page_size, num_pages; box 64 x 1 x min(page_size, BN) x 1), so a
   box is (c * 64, kvh, slot in page, page id). Lanes of one warp share the boxes. */
MSKV_DEV void mskv_h_load_tma(const mskv_tmap *k_map, const mskv_tmap *v_map, const int *pages, int page_size, int kvh,
                              int key0, mskv_u32 kst, mskv_u32 full, int lane) {
    const int box_rows = page_size < MSKV_H_BN ? page_size : MSKV_H_BN, boxes = MSKV_H_BN / box_rows;
    /* the expectation may follow the first bytes: tx counts below zero until it comes */
    if (lane == 0) mskv_mbar_arrive_tx(full, 2 * MSKV_H_TB);
    for (int x = lane; x < boxes * (MSKV_D / 64); x += 32) {
        const int pb = x / (MSKV_D / 64), cb = x % (MSKV_D / 64), key = key0 + pb * box_rows;
        const int page = pages[key / page_size], slot = key % page_size;
        const mskv_u32 dst = kst + (mskv_u32)(cb * (MSKV_H_BN * 128) + pb * box_rows * 128);
        mskv_tma_load_4d(dst, k_map, cb * 64, kvh, slot, page, full);
        mskv_tma_load_4d(dst + MSKV_H_TB, v_map, cb * 64, kvh, slot, page, full);
    }
}

/* cp.async, any page size: team threads copy whole rows (one page id each),
   rows at or past kv_len zero-filled (a page's unused slots may hold NaN);
   then wait, fence the generic writes for the tensor cores, meet, arrive. */
MSKV_DEV void mskv_h_load_rows(const unsigned char *k_pool, const unsigned char *v_pool, const int *pages, int page_size,
                               int kv_heads, int kvh, int kvl, int key0, unsigned char *sk, mskv_u32 full, int idx, int team) {
    const mskv_u64 slot_bytes = (mskv_u64)kv_heads * (MSKV_D * 2);
    for (int r = idx; r < MSKV_H_BN; r += team) {
        const int j = key0 + r, ok = j < kvl;
        mskv_u64 off = 0;
        if (ok) off = ((mskv_u64)pages[j / page_size] * (mskv_u64)page_size + (mskv_u64)(j % page_size)) * slot_bytes +
                      (mskv_u64)kvh * (MSKV_D * 2);
MSKV_UNROLL
        for (int c = 0; c < MSKV_D / 8; c++) {
            const int d = (c >> 3) * (MSKV_H_BN * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
            mskv_cp_async16(sk + d, k_pool + off + 16 * c, ok ? 16 : 0);
            mskv_cp_async16(sk + d + MSKV_H_TB, v_pool + off + 16 * c, ok ? 16 : 0);
        }
    }
    mskv_cp_commit();
    mskv_cp_wait<0>();
    mskv_fence_proxy_async();
    if (team == 32) mskv_syncwarp();
    else mskv_bar_sync(1, team);
    if (idx == 0) mskv_mbar_arrive(full);
}

/* ---- consumers ---- */

/* One consumer warpgroup's state; a thread holds rows g and g + 8 of its
   warp's 16 (the wgmma accumulator layout: element i is row g + 8 ((i >> 1) & 1),
   column 8 (i >> 2) + 2 t4 + (i & 1)). */
struct mskv_h_cons {
    float o[MSKV_D / 2];                 /* O, unnormalised */
    float s[MSKV_H_BN / 2];              /* S, then P of the current tile */
    mskv_u32 p[MSKV_H_BN / 16][4];       /* P of the previous tile as A fragments (k16 slices) */
    float m[2], l[2];                    /* running max (unscaled), this lane's part of the row sums */
    int klo[2], khi[2];                  /* the keys row h may see: [klo, khi) */
    mskv_u64 qd;                         /* descriptor of this warpgroup's Q tile */
    mskv_u32 ring;                       /* shared address of stage 0 */
    mskv_u32 bars;                       /* shared address of full[0] */
    int cw, t4;
    float scale_log2;
};

/* mask, online softmax, P into c.s; the O rescale factors into alpha */
template <int MASKED>
MSKV_DEV void mskv_h_softmax(mskv_h_cons &c, int key0, float alpha[2]) {
    float mx[2], neg[2];
    mx[0] = c.m[0]; mx[1] = c.m[1];
    if (MASKED) {
        int lo[2], hi[2];
        for (int h = 0; h < 2; h++) { lo[h] = c.klo[h] - key0 - 2 * c.t4; hi[h] = c.khi[h] - key0 - 2 * c.t4; }
MSKV_UNROLL
        for (int i = 0; i < MSKV_H_BN / 2; i++) {
            const int h = (i >> 1) & 1, col = (i >> 2) * 8 + (i & 1);
            c.s[i] = col >= lo[h] && col < hi[h] ? c.s[i] : mskv_neg_inf();
        }
    }
MSKV_UNROLL
    for (int i = 0; i < MSKV_H_BN / 2; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], c.s[i]);
MSKV_UNROLL
    for (int h = 0; h < 2; h++) {
        float mu;
        mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 1));
        mx[h] = fmaxf(mx[h], mskv_shfl_xor(mx[h], 2));
        mu = mx[h] == mskv_neg_inf() ? 0.0f : mx[h];   /* nothing seen yet: keep exp2 finite */
        alpha[h] = mskv_exp2((c.m[h] - mu) * c.scale_log2);
        c.m[h] = mx[h];
        c.l[h] *= alpha[h];
        neg[h] = mu * c.scale_log2;
    }
MSKV_UNROLL
    for (int i = 0; i < MSKV_H_BN / 2; i++) {
        const int h = (i >> 1) & 1;
        c.s[i] = mskv_exp2(fmaf(c.s[i], c.scale_log2, -neg[h]));
        c.l[h] += c.s[i];
    }
}

/* O += P V of the tile in stage ps (issued, committed) */
MSKV_DEV void mskv_h_issue_pv(mskv_h_cons &c, int ps) {
    const mskv_u64 vd = mskv_h_desc(c.ring + (mskv_u32)(ps * MSKV_H_SB + MSKV_H_TB), MSKV_H_BN * 128, 1024);
MSKV_UNROLL
    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) MSKV_WGMMA_PV(c.o, c.p[kk], vd + (mskv_u64)(kk * 16 * 128 / 16), 1);
    mskv_wgmma_commit();
}

/* PV done: the stage goes back to the producer (one arrival per warpgroup) */
MSKV_DEV void mskv_h_release(mskv_h_cons &c, int ps) {
MSKV_UNROLL
    for (int i = 0; i < MSKV_D / 2; i++) mskv_wg_keep(c.o[i]);
MSKV_UNROLL
    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) {
MSKV_UNROLL
        for (int e = 0; e < 4; e++) mskv_wg_keep_u(c.p[kk][e]);
    }
    if ((mskv_tid() & 127) == 0) mskv_mbar_arrive(c.bars + (mskv_u32)(8 * (MSKV_H_STAGES + ps)));
}

/* One turn at the tensor cores (taken in alternation with the other
   consumer, so one's softmax runs under the other's GEMMs): S = Q K^T of
   tile t and O += P V of tile t - 1 are issued together; the softmax of S
   overlaps the P V; O is rescaled once that is done. */
template <int MASKED, int FIRST>
MSKV_DEV void mskv_h_turn(mskv_h_cons &c, int t, int key0) {
    const int s = t % MSKV_H_STAGES, ps = (t + MSKV_H_STAGES - 1) % MSKV_H_STAGES;
    float alpha[2];
    while (!mskv_mbar_try_wait(c.bars + (mskv_u32)(8 * s), (t / MSKV_H_STAGES) & 1)) {}
    mskv_bar_sync(4 + c.cw, 256);
    mskv_wgmma_fence();
    {
        const mskv_u64 kd = mskv_h_desc(c.ring + (mskv_u32)(s * MSKV_H_SB), 16, 1024);
MSKV_UNROLL
        for (int kk = 0; kk < MSKV_D / 16; kk++)
            MSKV_WGMMA_S(c.s, c.qd + (mskv_u64)(((kk >> 2) * 64 * 128 + (kk & 3) * 32) >> 4),
                         kd + (mskv_u64)(((kk >> 2) * MSKV_H_BN * 128 + (kk & 3) * 32) >> 4), kk > 0);
        mskv_wgmma_commit();
    }
    if (!FIRST) mskv_h_issue_pv(c, ps);
    mskv_bar_arrive(4 + (c.cw ^ 1), 256);
    if (FIRST) mskv_wgmma_wait<0>();
    else mskv_wgmma_wait<1>();
MSKV_UNROLL
    for (int i = 0; i < MSKV_H_BN / 2; i++) mskv_wg_keep(c.s[i]);
    mskv_h_softmax<MASKED>(c, key0, alpha);
    if (!FIRST) {
        mskv_wgmma_wait<0>();
        mskv_h_release(c, ps);
    }
MSKV_UNROLL
    for (int i = 0; i < MSKV_D / 2; i++) c.o[i] *= alpha[(i >> 1) & 1];
MSKV_UNROLL
    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) {
        c.p[kk][0] = mskv_pack2(c.s[8 * kk], c.s[8 * kk + 1]);
        c.p[kk][1] = mskv_pack2(c.s[8 * kk + 2], c.s[8 * kk + 3]);
        c.p[kk][2] = mskv_pack2(c.s[8 * kk + 4], c.s[8 * kk + 5]);
        c.p[kk][3] = mskv_pack2(c.s[8 * kk + 6], c.s[8 * kk + 7]);
    }
}

/* the last turn: only the P V of the last tile (consumer 1 has no one to hand on to) */
MSKV_DEV void mskv_h_last_turn(mskv_h_cons &c, int n) {
    const int ps = (n - 1) % MSKV_H_STAGES;
    mskv_bar_sync(4 + c.cw, 256);
    mskv_wgmma_fence();
    mskv_h_issue_pv(c, ps);
    if (c.cw == 0) mskv_bar_arrive(5, 256);
    mskv_wgmma_wait<0>();
    mskv_h_release(c, ps);
}

MSKV_KERNEL void MSKV_BOUNDS(MSKV_H_THREADS, 1)
mskv_attn_sm90(const MSKV_GRID_CONST mskv_tmap k_map, const MSKV_GRID_CONST mskv_tmap v_map, int use_tma,
               const void *q, const void *k_pool, const void *v_pool, const int *qo_indptr, const int *kv_indptr,
               const int *kv_indices, const int *kv_len, const int *kv_pos_split, const int *kv_pos_shift,
               int q_heads, int kv_heads, int page_size, float scale_log2, int mask, int window_left, int kv_chunk,
               int n_splits, void *o, float *lse, float *o_part, float *lse_part) {
    MSKV_SMEM(smem);
    const int tid = mskv_tid(), wg = tid >> 7;
    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;
    const int group = q_heads / kv_heads;
    const int q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0, rows = qo_len * group;
    const int row0 = mskv_bid_x() * MSKV_H_BM;
    const int kvl = kv_len[b], psplit = kv_pos_split[b], pshift = kv_pos_shift[b];
    mskv_h_keys kb;
    mskv_u32 base;
    unsigned char *sbase;
    if (row0 >= rows) return;  /* whole block: before any barrier */
    kb = mskv_h_block_keys(row0, rows, group, qo_len, kvl, psplit, pshift, mask, window_left, kv_chunk, n_splits, split);
    base = (mskv_smem_addr(smem) + 1023u) & ~1023u;
    sbase = smem + (base - mskv_smem_addr(smem));
    if (tid == 0) {
        for (int s = 0; s < MSKV_H_STAGES; s++) {
            mskv_mbar_init(base + MSKV_H_BARS + 8 * s, 1);                      /* full: the producer */
            mskv_mbar_init(base + MSKV_H_BARS + 8 * (MSKV_H_STAGES + s), 2);    /* empty: both consumers */
        }
        mskv_mbar_init_fence();
    }
    mskv_sync();

    if (wg == 0) {
        /* producer: TMA needs one warp (the rest leave); cp.async takes all four */
        const int team = use_tma ? 32 : 128;
        const int *pages = kv_indices + kv_indptr[b];
        mskv_setmaxnreg_dec<MSKV_H_REGS_PRODUCER>();
        if (tid >= team) return;
        for (int i = 0; i < kb.n_tiles; i++) {
            const int s = i % MSKV_H_STAGES, key0 = mskv_h_tile_key(kb, i);
            const mskv_u32 full = base + MSKV_H_BARS + 8 * s, stage = base + 2 * MSKV_H_QB + s * MSKV_H_SB;
            while (!mskv_mbar_try_wait(full + 8 * MSKV_H_STAGES, ((i / MSKV_H_STAGES) & 1) ^ 1)) {}
            if (use_tma && key0 + MSKV_H_BN <= kvl)
                mskv_h_load_tma(&k_map, &v_map, pages, page_size, kvh, key0, stage, full, tid);
            else
                mskv_h_load_rows((const unsigned char *)k_pool, (const unsigned char *)v_pool, pages, page_size,
                                 kv_heads, kvh, kvl, key0, sbase + (stage - base), full, tid, team);
        }
    } else {
        mskv_h_cons c;
        const int cw = wg - 1, t = tid & 127, warp = t >> 5, lane = tid & 31, g = lane >> 2;
        mskv_setmaxnreg_inc<MSKV_H_REGS_CONSUMER>();
        c.cw = cw; c.t4 = lane & 3; c.scale_log2 = scale_log2;
        c.ring = base + 2 * MSKV_H_QB;
        c.bars = base + MSKV_H_BARS;
        c.qd = mskv_h_desc(base + (mskv_u32)(cw * MSKV_H_QB), 16, 1024);
        {
            /* this warpgroup's 64 rows of Q; row r of the block is query r / group,
               q head kvh * group + r % group; rows past the segment are zero */
            unsigned char *qs = sbase + cw * MSKV_H_QB;
            for (int idx = t; idx < 64 * (MSKV_D / 8); idx += 128) {
                const int r = idx / (MSKV_D / 8), ch = idx % (MSKV_D / 8), R = row0 + 64 * cw + r, ok = R < rows;
                mskv_i64 off = 0;
                if (ok) off = (((mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group) * MSKV_D + ch * 8) * 2;
                mskv_cp_async16(qs + (ch >> 3) * (64 * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4),
                                (const unsigned char *)q + off, ok ? 16 : 0);
            }
            mskv_cp_commit();
            mskv_cp_wait<0>();
            mskv_fence_proxy_async();
            mskv_bar_sync(2 + cw, 128);
        }
        for (int h = 0; h < 2; h++) {
            const int R = row0 + 64 * cw + 16 * warp + g + 8 * h, Rc = R < rows ? R : rows - 1;
            const int qi = kvl - qo_len + Rc / group, qpos = mskv_abs_pos(qi, psplit, pshift);
            c.klo[h] = kb.split_lo;
            c.khi[h] = kb.split_hi;
            if (mask >= 1 && qi + 1 < c.khi[h]) c.khi[h] = qi + 1;
            if (mask == 2) {
                const int lo = mskv_first_at(qpos - window_left, psplit, pshift);
                if (lo > c.klo[h]) c.klo[h] = lo;
            }
            c.m[h] = mskv_neg_inf();
            c.l[h] = 0.0f;
        }
MSKV_UNROLL
        for (int i = 0; i < MSKV_D / 2; i++) c.o[i] = 0.0f;
        if (kb.n_tiles > 0) {
            int it = 1;
            if (cw == 1) mskv_bar_arrive(4, 256);   /* consumer 0 takes the first turn */
            if (kb.n_masked > 0) mskv_h_turn<1, 1>(c, 0, mskv_h_tile_key(kb, 0));
            else mskv_h_turn<0, 1>(c, 0, mskv_h_tile_key(kb, 0));
            for (; it < kb.n_masked; it++) mskv_h_turn<1, 0>(c, it, mskv_h_tile_key(kb, it));
            for (; it < kb.n_tiles; it++) mskv_h_turn<0, 0>(c, it, mskv_h_tile_key(kb, it));
            mskv_h_last_turn(c, kb.n_tiles);
        }
        /* the 4 lanes of a row add up their sums; write O / l and the LSE */
        for (int h = 0; h < 2; h++) {
            c.l[h] += mskv_shfl_xor(c.l[h], 1);
            c.l[h] += mskv_shfl_xor(c.l[h], 2);
        }
        {
            const mskv_i64 total_q = qo_indptr[mskv_nblk_y()];
            const float ln2 = 0.6931471805599453f;
            for (int h = 0; h < 2; h++) {
                const int R = row0 + 64 * cw + 16 * warp + g + 8 * h;
                const float inv = c.l[h] > 0.0f ? 1.0f / c.l[h] : 0.0f;
                const float lv = c.l[h] > 0.0f ? (c.m[h] * scale_log2 + log2f(c.l[h])) * ln2 : mskv_neg_inf();
                mskv_i64 orow;
                if (R >= rows) continue;
                orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;
                if (n_splits > 1) {
                    float *dst = o_part + ((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + 2 * c.t4;
MSKV_UNROLL
                    for (int qd = 0; qd < MSKV_D / 8; qd++) {
                        dst[qd * 8] = c.o[4 * qd + 2 * h] * inv;
                        dst[qd * 8 + 1] = c.o[4 * qd + 2 * h + 1] * inv;
                    }
                    if (c.t4 == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = lv;
                } else {
                    mskv_u32 *dst = (mskv_u32 *)((mskv_u16 *)o + orow * MSKV_D + 2 * c.t4);
MSKV_UNROLL
                    for (int qd = 0; qd < MSKV_D / 8; qd++)
                        dst[qd * 4] = mskv_pack2(c.o[4 * qd + 2 * h] * inv, c.o[4 * qd + 2 * h + 1] * inv);
                    if (lse && c.t4 == 0) lse[orow] = lv;
                }
            }
        }
    }
}
#endif /* MSKV_SM90A && MSKV_DTYPE != 0 */

/* Shared memory the attention kernel of these defines needs (host side
   mirrors this in the launch wrapper). */
#define MSKV_ATTN_SMEM_BYTES_OF(bm, bn, d) (2 * ((bm) * (d) + 4 * (bn) * (d)))

#ifndef MSKV_GPU
/* Host emulation: let a test include this file again with other defines. */
#undef MSKV_DTYPE
#undef MSKV_HEAD_DIM
#undef MSKV_ROPE
#undef MSKV_ROPE_STYLE
#undef MSKV_ROPE_D0
#undef MSKV_ROPE_D1
#undef MSKV_ROPE_D2
#undef MSKV_ATTN_WARP_KEYS
#undef MSKV_D
#undef MSKV_ESIZE
#undef MSKV_RD0
#undef MSKV_RD1
#undef MSKV_RD2
#undef MSKV_BM
#undef MSKV_BN
#undef MSKV_WK
#undef MSKV_CH
#undef MSKV_NT
#undef MSKV_QREG
#undef MSKV_ATTN_SMEM
#undef MSKV_ATTN_SMEM_BYTES_OF
#undef MSKV_SM90A
#undef MSKV_H_BN
#undef MSKV_H_STAGES
#undef MSKV_H_THREADS
#undef MSKV_H_BM
#undef MSKV_H_QB
#undef MSKV_H_TB
#undef MSKV_H_SB
#undef MSKV_H_BARS
#undef MSKV_H_SMEM
#undef MSKV_H_REGS_PRODUCER
#undef MSKV_H_REGS_CONSUMER
#undef MSKV_CAT2
#undef MSKV_CAT
#undef MSKV_WGMMA_S
#undef MSKV_WGMMA_PV
#endif
