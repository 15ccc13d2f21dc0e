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
     MSKV_SRC_DTYPE  kv_write only: dtype of k_src/v_src (default MSKV_DTYPE);
                     another one is converted on the way in, rounded to
                     nearest even as the CPU backend rounds
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
     MSKV_SRC_DTYPE) goes to slot slot_mapping[token], in the pool dtype;
     slots < 0 or >= pool_slots are skipped. With MSKV_ROPE, K is rotated on
     the way in at positions ([n] or [n][3]), in f32 from the source values,
     rounded once into the pool; theta <= 0 means 10000.
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
#ifndef MSKV_SRC_DTYPE
#define MSKV_SRC_DTYPE MSKV_DTYPE
#endif

#define MSKV_D MSKV_HEAD_DIM
#if MSKV_DTYPE == 0
#define MSKV_ESIZE 4
#else
#define MSKV_ESIZE 2
#endif

/* >>elements ------------------------------------------------------------- */
/* Element i of an array of dtype dt (a compile-time constant at every call). */
MSKV_DEV float mskv_load_dt(const void *base, mskv_i64 i, int dt) {
    return dt == 0 ? ((const float *)base)[i]
         : dt == 1 ? mskv_h2f(((const mskv_u16 *)base)[i]) : mskv_b2f(((const mskv_u16 *)base)[i]);
}
MSKV_DEV float mskv_load_el(const void *base, mskv_i64 i) { return mskv_load_dt(base, i, MSKV_DTYPE); }
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

/* Rotates one row src (D elements of dtype src_dt) -> dst (the pool dtype;
   may alias src when src_dt is the pool dtype). */
MSKV_DEV void mskv_rope_row(const void *src, int src_dt, void *dst, const int *pos, float theta, int lane) {
    float l2t = log2f(theta > 0.0f ? theta : 10000.0f);
    for (int p = lane; p < MSKV_D / 2; p += 32) {
        int e0, e1;
        float c, s, x, y;
        mskv_rope_pair(p, pos, l2t, &e0, &e1, &c, &s);
        x = mskv_load_dt(src, e0, src_dt);
        y = mskv_load_dt(src, e1, src_dt);
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

/* One row of D source elements into the pool dtype, element by element: the
   conversion of a variant whose source dtype is not the pool's. */
MSKV_DEV void mskv_convert_row(const void *src, void *dst, int lane) {
    for (int e = lane; e < MSKV_D; e += 32) mskv_store_el(dst, e, mskv_load_dt(src, e, MSKV_SRC_DTYPE));
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
    src_off = row * MSKV_D * (MSKV_SRC_DTYPE == 0 ? 4 : 2);
    dst_off = (slot * kv_heads + h) * MSKV_D * MSKV_ESIZE;
#if MSKV_SRC_DTYPE != MSKV_DTYPE
    mskv_convert_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);
#if MSKV_ROPE != 0
    mskv_rope_row((const unsigned char *)k_src + src_off, MSKV_SRC_DTYPE, (unsigned char *)k_pool + dst_off,
                  positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);
#else
    (void)positions; (void)theta;
    mskv_convert_row((const unsigned char *)k_src + src_off, (unsigned char *)k_pool + dst_off, lane);
#endif
#elif MSKV_ROPE != 0
    mskv_copy_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);
    mskv_rope_row((const unsigned char *)k_src + src_off, MSKV_DTYPE, (unsigned char *)k_pool + dst_off,
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
        mskv_rope_row(p, MSKV_DTYPE, p, positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);
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
#undef MSKV_SRC_DTYPE
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
#endif
