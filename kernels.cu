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
     kv_heads * n_splits); block 128; dynamic smem mskv_attn_smem_bytes()
     below (BM = 64 prefill, 16 decode; BN = 64 keys, or 32 for D = 256).
     mask: 0 none, 1 causal (key pos <= query pos), 2 causal and
     q - k <= window_left, on absolute positions. scale_log2 = scale * log2(e).
     Keys of split s: [s * kv_chunk, (s + 1) * kv_chunk) (kv_chunk a multiple
     of BN; n_splits 1 = no split). With n_splits == 1: o [total_q][q_heads][D]
     (dtype) and lse [total_q][q_heads] (natural log; may be NULL). Otherwise
     f32 partials o_part [n_splits][total_q][q_heads][D] and lse_part
     [n_splits][total_q][q_heads], merged by mskv_lse_merge. A row that sees
     no key: o = 0, lse = -inf.

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
MSKV_DEV int mskv_tid(void) { return (int)threadIdx.x; }
MSKV_DEV int mskv_bid_x(void) { return (int)blockIdx.x; }
MSKV_DEV int mskv_bid_y(void) { return (int)blockIdx.y; }
MSKV_DEV int mskv_bid_z(void) { return (int)blockIdx.z; }
MSKV_DEV int mskv_nblk_x(void) { return (int)gridDim.x; }
MSKV_DEV void mskv_sync(void) { __syncthreads(); }
/* A barrier the emulation can drop on purpose (planted-bug tests); always real here. */
#define MSKV_SYNC_ID(id) __syncthreads()
MSKV_DEV float mskv_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
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
   mskv_shfl_xor, mskv_exp2, conversions, mma, ldmatrix, cp.async, mskv_v16). */
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
    mskv_copy_row((const unsigned char *)v_src + src_off, (unsigned char *)v_pool + dst_off, lane);
#if MSKV_ROPE != 0
    mskv_rope_row((const unsigned char *)k_src + src_off, (unsigned char *)k_pool + dst_off,
                  positions + (MSKV_ROPE == 2 ? 3 * token : token), theta, lane);
#else
    (void)positions; (void)theta;
    mskv_copy_row((const unsigned char *)k_src + src_off, (unsigned char *)k_pool + dst_off, lane);
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
