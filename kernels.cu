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
     MSKV_ATTN_WARP_KEYS  attention only: 0 = prefill layout (4 warps x 32
                     rows, 128 rows per block; 16 and 64 at D = 256); 1 = decode
                     layout (16 rows per block, the 4 warps split each key tile,
                     merged in smem)

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
             page_magic, page_shift, scale_log2, mask, window_left,
             kv_chunk, n_splits, o, lse, o_part, lse_part, q_pos,
             vis_sink_end, vis_window_start)
     Paged attention over a CSR plan (MSKV_DTYPE 1 or 2; mma.sync m16n8k16
     with f32 accumulation). A block takes one (segment, kv head, key split)
     and a tile of "rows", row = query * group + (q head within the kv head's
     group), so every K/V byte is read once for all of a kv head's q heads.
     Grid (ceil(max over segments of qo_len * group / BM), batch,
     kv_heads * n_splits); block 128 (4 warps); dynamic shared memory
     MSKV_ATTN_SMEM:
       prefill, D <= 128: BM = 128 (32 rows per warp), BN = 64, Q tile + 2
         stages of K and V (96 KiB at D = 128, 48 KiB at D = 64);
       prefill, D = 256: BM = 64 (16 rows per warp), BN = 32, 96 KiB;
       decode: BM = 16, BN = 64 (16 keys per warp), 3 stages, Q read into
         registers once from the last stage (96 KiB at D = 128; D = 256
         keeps a Q tile: 200 KiB).
     The page of key j is (j * page_magic) >> page_shift (host:
     mskv_cuda_page_divisor; any page size >= 1), and page_size * kv_heads *
     D * 2 < 2^32. Each thread copies part of one K/V row per tile with
     cp.async, its page id loaded a tile ahead; rows past kv_len are
     zero-filled. S = Q K^T and O += P V with ldmatrix(.trans) fragments and
     mma; online softmax in exp2; row sums by mma of P with ones. The tiles
     that need a per-element mask run first, in a loop of their own.
     Positions must not decrease with the compacted index (kv_pos_shift >= 0):
     the mask's reach bounds the key range a block visits.
     mask: 0 none, 1 causal (key pos <= query pos), 2 causal and
     q - k <= window_left, on absolute positions. scale_log2 = scale * log2(e).
     Query i of segment b is at q_pos[qo_indptr[b] + i] when q_pos is not
     NULL (any order), else at the position of key kv_len - qo_len + i (the
     tail rule). With vis_sink_end and vis_window_start (per segment, both
     or neither), keys at positions in [vis_sink_end[b], vis_window_start[b])
     are hidden (none when window start <= sink end): as positions rise with
     the index, the visible keys are two runs, [0, first(sink end)) and
     [first(window start), kv_len). A block visits the tiles of each run
     (tiles wholly hidden are not read); the one tile of the first run that
     reaches past the hole masks the keys from its start on, and the tiles
     every row sees whole run unmasked, in up to two runs of their own.
     Everything is computed on the device from these arrays, so a plan
     uploaded once and replayed by a graph needs nothing derived.
     Dense K/V (a prefix view, any caller buffer [row][kv_heads][D]): with
     kv_indices NULL, k_pool / v_pool are the buffers, page_size 1
     (page_magic 2^31, page_shift 31) and kv_indptr[b] the row of segment
     b's key 0: key j is row kv_indptr[b] + j, no table is read.
     Keys of split s: [s * kv_chunk, (s + 1) * kv_chunk) (kv_chunk a multiple
     of BN; n_splits 1 = no split). With n_splits == 1: o [total_q][q_heads][D]
     (dtype) and lse [total_q][q_heads] (natural log; may be NULL). Otherwise
     f32 partials o_part [n_splits][total_q][q_heads][D] and lse_part
     [n_splits][total_q][q_heads], merged by mskv_lse_merge. A row that sees
     no key: o = 0, lse = -inf.

   mskv_attn_sm90(k_map, v_map, use_tma, q, k_pool, v_pool, qo_indptr,
                  kv_indptr, kv_indices, kv_len, kv_pos_split, kv_pos_shift,
                  q_heads, kv_heads, page_size, scale_log2, mask, window_left,
                  kv_chunk, n_splits, o, lse, o_part, lse_part, q_pos,
                  vis_sink_end, vis_window_start)
     The same attention as mskv_attn (plan, rows, masks, q_pos, visibility
     bounds, splits, outputs, empty rows) for sm_90a only (wgmma, setmaxnreg: compiled when NVRTC
     targets sm_90a, MSKV_SM90A; the sm_90a module has no mskv_attn), in the
     warp-specialised manner of FlashAttention-3. Block 384 threads =
     3 warpgroups, __launch_bounds__(384, 1); grid (ceil(max qo_len * group
     / 128), batch, kv_heads * n_splits); dynamic shared memory MSKV_H_SMEM:
     1 KiB alignment slack + two 64-row Q tiles + STAGES x (K tile, V tile,
     ones block) + 2 x STAGES mbarriers; BN = 128 keys (64 at D = 256),
     STAGES = 3 at D = 64, else 2: 164,912 B (161 KiB) at D = 64, 197,664 B
     (193 KiB) at D = 128 and at D = 256 (what the host's formula and
     kernel-stats' smem_dyn give). Every tile is K-major with the 128-byte swizzle:
     [D / 64 column blocks][rows][128 B], 16-byte chunk c of row r at
     c ^ (r & 7), 1024-byte aligned.
       producer (warpgroup 0, setmaxnreg.dec 40): for each key tile, waits
         on the stage's "empty" mbarrier, then either (use_tma, and the tile
         lies below kv_len) one warp issues TMA copies, one box per page
         piece and column block, completing on the stage's "full" mbarrier
         (arrive.expect_tx); or the warpgroup copies whole rows with
         cp.async (one page id per row, any page size, rows past kv_len
         zero-filled), waits, fence.proxy.async, and one thread arrives.
         k_map / v_map (CUtensorMap, __grid_constant__): the pool as dims
         (D, kv_heads, page_size, num_pages), byte strides (2 D,
         2 D kv_heads, 2 D kv_heads page_size), box (64, 1, min(page_size,
         BN), 1), 128-byte swizzle: box (c * 64, kvh, slot in page, page id)
         is a 64-wide column block of up to BN consecutive slots of one page.
         The host passes use_tma when page_size is a multiple of BN or BN a
         multiple of a page of at least 16 slots; otherwise the maps are
         not read. Dense K/V (kv_indices NULL, page_size 1, kv_indptr[b]
         the row of segment b's key 0, as mskv_attn): the maps, if used,
         are the buffers as dims (D, kv_heads, rows, 1), box (64, 1, BN, 1).
       consumers (warpgroups 1 and 2, setmaxnreg.inc 232): 64 rows each,
         Q (cp.async, fence.proxy.async) from a descriptor; per tile, in
         alternating turns at the tensor cores (named barriers 4 and 5,
         bar.sync / bar.arrive over 256 threads), issue S = Q K^T
         (wgmma m64nBNk16, both operands from descriptors) and O += P V of
         the previous tile (wgmma m64nNk16, P from registers, V N-major),
         then mask and online softmax while the other warpgroup's GEMMs run,
         wait for P V, release the stage (lane 0 of each consumer warp
         arrives after its own warp's wgmma.wait_group: the "empty"
         mbarrier counts all 8 consumer warps), rescale O. Up to
         D = 128 each V tile is followed by a block of ones and N = D + 8,
         so the row sums come out of the tensor cores with O.
     Tiles that need a per-element mask run first, then the whole ones, in
     loops of their own. Tiles start on multiples of BN (a TMA box never
     straddles a page), so the tiles at both ends of the hidden keys mask
     them per element; tiles wholly hidden are not loaded.

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
MSKV_DEV int mskv_shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
/* lane 0's x in every lane: the compiler then knows x is warp-uniform (uniform registers and datapath) */
MSKV_DEV int mskv_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }
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
   mskv_shfl_xor, mskv_shfl_xor_i, mskv_uniform, mskv_syncwarp, mskv_exp2, conversions, mma, ldmatrix, cp.async, mskv_v16). */
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
/* Layouts (4 warps, 128 threads; a row is query * group + q head within the
   kv head's group, so one K/V tile serves the whole group):
   prefill, D <= 128: 128 rows per block, warp w owns rows [32w, 32w + 32):
       two m16 tiles, so each K/V fragment feeds four mma; 64-key tiles, 2 stages.
   prefill, D = 256: 64 rows, 16 per warp (32 rows of f32 accumulators would
       not fit the registers); 32-key tiles, 2 stages.
   decode: 16 rows; warp w takes keys [16w, 16w + 16) of every 64-key tile;
       3 stages; the four partial softmax states are merged through shared memory. */
#if MSKV_ATTN_WARP_KEYS
#define MSKV_MT 1
#define MSKV_BM 16
#define MSKV_BN 64
#define MSKV_WK 16
#define MSKV_STAGES 3
#else
#define MSKV_MT (MSKV_D <= 128 ? 2 : 1)
#define MSKV_BM (64 * MSKV_MT)
#define MSKV_BN (MSKV_D >= 256 ? 32 : 64)
#define MSKV_WK MSKV_BN
#define MSKV_STAGES 2
#endif
#define MSKV_WM (16 * MSKV_MT)                 /* rows per warp */
#define MSKV_CH (MSKV_D / 8)                   /* 16-byte chunks per row */
#define MSKV_ROWB (MSKV_D * 2)                 /* bytes per row of a tile */
#define MSKV_NT (MSKV_WK / 8)                  /* n-tiles of 8 keys per warp and tile */
#define MSKV_QREG (MSKV_WM * MSKV_D <= 2048)   /* Q fragments in registers (at most 32 per thread) */
#define MSKV_TPR (128 / MSKV_BN)               /* gather: threads per K/V row */
#define MSKV_CPT (MSKV_CH / MSKV_TPR)          /* gather: 16-byte chunks per thread and row */
#define MSKV_TILE_BYTES (MSKV_BN * MSKV_D * 2) /* one K (or V) tile */
#define MSKV_STAGE_BYTES (2 * MSKV_TILE_BYTES) /* K, then V */
/* Q has its own tile unless the decode layout reads it into registers once:
   then it waits in the last stage, which is first refilled after that read. */
#define MSKV_Q_PARKED (MSKV_ATTN_WARP_KEYS && MSKV_QREG)
#define MSKV_Q_BYTES (MSKV_Q_PARKED ? 0 : MSKV_BM * MSKV_D * 2)
#define MSKV_Q_OFF (MSKV_Q_PARKED ? (MSKV_STAGES - 1) * MSKV_STAGE_BYTES : 0)
#define MSKV_ATTN_SMEM (MSKV_Q_BYTES + MSKV_STAGES * MSKV_STAGE_BYTES)
#define MSKV_MERGE_LD (MSKV_D + 8)             /* decode merge: padded f32 row, no bank conflicts */
/* row-sum accumulator: element of row r (= 2 mt + h), and the row of element c */
#define MSKV_LSUM(r) (MSKV_MT == 2 ? 2 * ((r) & 1) + ((r) >> 1) : 2 * ((r) & 1))
#define MSKV_LROW(c) (MSKV_MT == 2 ? 2 * ((c) & 1) + ((c) >> 1) : ((c) >> 1))

#ifndef MSKV_GPU
/* for the host tests: the launch geometry of these defines */
static const int mskv_attn_block_rows = MSKV_BM, mskv_attn_block_keys = MSKV_BN, mskv_attn_smem_bytes = MSKV_ATTN_SMEM;
#endif

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
/* two 16-bit ones (f16 0x3c00, bf16 0x3f80) */
#define MSKV_ONE2 (MSKV_DTYPE == 1 ? 0x3c003c00u : 0x3f803f80u)
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

/* The mask position of query i of a segment of kvl keys and qo_len queries:
   q_pos[i] when the plan gives it, else the tail rule. */
MSKV_DEV int mskv_q_pos(const int *q_pos, int i, int kvl, int qo_len, int split, int shift) {
    return q_pos ? q_pos[i] : mskv_abs_pos(kvl - qo_len + i, split, shift);
}
/* The hidden run of compacted keys [*h0, *h1) of segment b: keys at
   positions in [vis_sink_end, vis_window_start) (positions rise with the
   index, so they are one run); none (h0 = h1 = kvl) without bounds. */
MSKV_DEV void mskv_vis_hole(const int *vis_sink_end, const int *vis_window_start, int b, int kvl, int split, int shift,
                            int *h0, int *h1) {
    *h0 = *h1 = kvl;
    if (vis_sink_end && vis_window_start && vis_window_start[b] > vis_sink_end[b]) {
        const int a = mskv_first_at(vis_sink_end[b], split, shift), z = mskv_first_at(vis_window_start[b], split, shift);
        *h0 = a < kvl ? a : kvl;
        *h1 = z < kvl ? z : kvl;
    }
}
/* The smallest and largest q_pos of the block's queries [qa, qa + nq) (any
   order: a caller's positions need not rise), for the block's key range.
   Every thread of the block calls it (two barriers); scratch: 2 ints per
   warp of shared memory that nothing else uses until the second barrier. */
template <int THREADS>
MSKV_DEV void mskv_q_pos_range(const int *q_pos, int qa, int nq, int *scratch, int *mn, int *mx) {
    const int tid = mskv_tid(), warp = tid >> 5, nw = THREADS / 32;
    int lo = 0x7fffffff, hi = -0x7fffffff - 1;
    for (int i = tid; i < nq; i += THREADS) { const int v = q_pos[qa + i]; lo = v < lo ? v : lo; hi = v > hi ? v : hi; }
    for (int m = 1; m < 32; m <<= 1) {
        const int a = mskv_shfl_xor_i(lo, m), z = mskv_shfl_xor_i(hi, m);
        lo = a < lo ? a : lo;
        hi = z > hi ? z : hi;
    }
    if ((tid & 31) == 0) { scratch[warp] = lo; scratch[nw + warp] = hi; }
    MSKV_SYNC_ID(8);
    for (int k = 0; k < nw; k++) {
        lo = scratch[k] < lo ? scratch[k] : lo;
        hi = scratch[nw + k] > hi ? scratch[nw + k] : hi;
    }
    MSKV_SYNC_ID(9);  /* every thread has read the scratch before it is reused */
    *mn = lo;
    *mx = hi;
}

/* Page of compacted index j (0 <= j < 2^31) without a division:
   (j * magic) >> shift, magic = ceil(2^(31+l) / page_size), shift = 31 + l,
   l = ceil(log2(page_size)) (mskv_cuda_page_divisor on the host). Exact: the
   rounding adds j * (magic - 2^(31+l) / page_size) / 2^(31+l) < 1 / page_size. */
MSKV_DEV int mskv_page_of(int j, mskv_u32 magic, int shift) {
    return (int)(((mskv_u64)(mskv_u32)j * magic) >> shift);
}

/* The K/V gather: thread t copies chunks [c0, c0 + CPT) (c0 = (t % TPR) * CPT)
   of row t / TPR of every tile, so each row's slot is found once per tile,
   from one page id loaded a tile ahead. */
struct mskv_gather {
    /* kernel parameters as they are (the compiler reads them from the constant bank) */
    const unsigned char *k_pool, *v_pool;
    const int *kv_indices;
    mskv_u32 magic;
    int shift, page_size, kv_heads;
    /* per thread */
    int page0;                    /* the segment's first entry in kv_indices */
    int n_hi, row;
    mskv_u32 head;                /* byte offset of the kv head's chunk c0 within a slot */
    mskv_u32 dst;                 /* byte offset of chunk c0 of the row within a K tile */
};
/* The key of the thread's row of the tile at n0, clamped into the sequence
   (a tile past the end reads a harmless page id and copies nothing). */
MSKV_DEV int mskv_row_key(const mskv_gather &g, int n0) {
    return n0 + g.row < g.n_hi ? n0 + g.row : g.n_hi - 1;
}
/* Its page id, loaded a tile before the copies that need it. Dense K/V
   (kv_indices NULL, page_size 1): "page" page0 + j is row page0 + j of the
   buffer, no table to read. */
MSKV_DEV int mskv_row_fetch(const mskv_gather &g, int n0) {
    const int at = g.page0 + mskv_page_of(mskv_row_key(g, n0), g.magic, g.shift);
    return g.kv_indices ? g.kv_indices[at] : at;
}

/* Issues the copies of the thread's chunks of K and V of the tile at key n0
   into the stage at shared offset stage; a row at or past n_hi is
   zero-filled (a page's unused slots may hold anything, NaN included). */
MSKV_DEV void mskv_gather_tile(const mskv_gather &g, unsigned char *smem, mskv_u32 stage, int n0, int pid) {
    const int bytes = n0 + g.row < g.n_hi ? 16 : 0, j = mskv_row_key(g, n0);
    const int in_page = j - mskv_page_of(j, g.magic, g.shift) * g.page_size;
    const mskv_u32 slot_bytes = (mskv_u32)g.kv_heads * (MSKV_D * 2);
    const mskv_u64 off = (mskv_u64)(mskv_u32)pid * ((mskv_u32)g.page_size * slot_bytes) +
                         ((mskv_u32)in_page * slot_bytes + g.head);
    const unsigned char *ks = g.k_pool + off, *vs = g.v_pool + off;
    const mskv_u32 d0 = g.dst + stage;
MSKV_UNROLL
    for (int k = 0; k < MSKV_CPT; k++) {
        /* chunk c0 + k = c0 ^ k lands at (c0 ^ k) ^ (row & 7): the swizzle is an
           XOR inside the row, whose start is aligned to its length */
        const mskv_u32 d = d0 ^ (mskv_u32)(k << 4);
        mskv_cp_async16(smem + d, ks + 16 * k, bytes);
        mskv_cp_async16(smem + d + MSKV_TILE_BYTES, vs + 16 * k, bytes);
    }
}

/* The tiles a block visits. Its keys are at most two runs of compacted
   indices (the visibility bounds hide the keys between them): run A from
   a_lo, tiles 0..n_a-1, and run B from b_lo (at or past A's last tile, so no
   key is visited twice), tiles n_a..n_tiles-1. Tiles wholly hidden are not
   visited. Tiles every row sees whole form up to two runs of consecutive
   tiles, [f1_lo, f1_hi) and [f2_lo, f2_hi) (f1 empty unless both are not);
   the others need the per-element mask and come first ([0, f1_lo),
   [f1_hi, f2_lo), [f2_hi, n_tiles)), so each kind runs in a loop of its own. */
struct mskv_tiles { int n_hi, a_lo, n_a, b_lo, n_tiles, f1_lo, f1_hi, f2_lo, f2_hi, n_masked; };
/* First key of tile k (in key order). */
MSKV_DEV int mskv_tile_at(const mskv_tiles &t, int k) {
    return k < t.n_a ? t.a_lo + k * MSKV_BN : t.b_lo + (k - t.n_a) * MSKV_BN;
}
/* Key index of the i-th tile a block visits (n_hi when past the last: a
   zero-filled load). */
MSKV_DEV int mskv_tile_key(const mskv_tiles &t, int i) {
    const int m1 = t.f1_lo, m2 = m1 + t.f2_lo - t.f1_hi, w1 = t.f1_hi - t.f1_lo;
    int k;
    if (i < t.n_masked) k = i < m1 ? i : i < m2 ? i - m1 + t.f1_hi : i - m2 + t.f2_hi;
    else k = i - t.n_masked < w1 ? i - t.n_masked + t.f1_lo : i - t.n_masked - w1 + t.f2_lo;
    return i < t.n_tiles ? mskv_tile_at(t, k) : t.n_hi;
}
/* One warp's running softmax state and what it needs per tile. */
struct mskv_attn_warp {
    float o[MSKV_MT][MSKV_D / 8][4];
    float m[2 * MSKV_MT];                   /* row g + 8h of m-tile mt: index 2 mt + h */
    /* row sums, by mma of P with a matrix of ones, so they add the P that O
       adds, rounded alike, and the f32 probabilities die once packed. One
       accumulator for both m-tiles: m-tile 0 sums into the even columns, 1
       into the odd ones, so l[MSKV_LSUM(r)] is row r's (whole row, every lane) */
    float l[4];
    /* the keys row r may see, as compacted indices [klo[r], khi[r]): the
       mask, the split and kv_len in one interval (positions grow with j) */
    int klo[2 * MSKV_MT], khi[2 * MSKV_MT];
    /* the first key the visibility bounds hide (kv_len: none): a tile of
       run A (it starts below h0) masks the keys from h0 on; run B's tiles
       start where the keys are visible again */
    int h0;
#if MSKV_QREG
    mskv_u32 qf[MSKV_MT][MSKV_D / 16][4];
#endif
    /* ldmatrix addresses: a lane's row start and its swizzled chunk of k-step 0;
       k-step kk XORs 32 * kk into it (the swizzle permutes chunks inside the row) */
    mskv_u32 qb, kb, vb;
    int wrow0, wkey0;
    float scale_log2;
};

/* S = Q K^T, the mask (MASKED: per element), the online softmax and O += P V
   for one tile whose K and V sit at tk, tv; n0 is its first key. */
template <int MASKED>
MSKV_DEV void mskv_attn_tile(mskv_attn_warp &w, const unsigned char *smem, mskv_u32 stage, int n0) {
    const int t4 = mskv_tid() & 3;
    const mskv_u32 kb0 = stage + w.kb, vb0 = stage + MSKV_TILE_BYTES + w.vb;
    float s[MSKV_MT][MSKV_NT][4];
MSKV_UNROLL
    for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
        for (int nt = 0; nt < MSKV_NT; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
MSKV_UNROLL
    for (int kk = 0; kk < MSKV_D / 16; kk++) {
#if MSKV_QREG
#define MSKV_QA(mt) w.qf[mt][kk]
#else
        mskv_u32 qa[MSKV_MT][4];
MSKV_UNROLL
        for (int mt = 0; mt < MSKV_MT; mt++)
            mskv_ldsm_x4(qa[mt], smem + ((w.qb ^ (mskv_u32)(32 * kk)) + mt * 16 * MSKV_ROWB));
#define MSKV_QA(mt) qa[mt]
#endif
MSKV_UNROLL
        for (int np = 0; np < MSKV_NT / 2; np++) {
            mskv_u32 kb[4];
            mskv_ldsm_x4(kb, smem + ((kb0 ^ (mskv_u32)(32 * kk)) + np * 16 * MSKV_ROWB));
MSKV_UNROLL
            for (int mt = 0; mt < MSKV_MT; mt++) {
                mskv_mma(s[mt][2 * np], MSKV_QA(mt), kb);
                mskv_mma(s[mt][2 * np + 1], MSKV_QA(mt), kb + 2);
            }
        }
#undef MSKV_QA
    }
    /* the online softmax: m kept unscaled, exponents in log2 units */
    {
        float mx[2 * MSKV_MT], alpha[2 * MSKV_MT];
        const int jb = n0 + w.wkey0 + 2 * t4;   /* this lane's first key of the tile */
        const int clip = n0 < w.h0 ? w.h0 : 0x7fffffff;
MSKV_UNROLL
        for (int r = 0; r < 2 * MSKV_MT; r++) mx[r] = w.m[r];
MSKV_UNROLL
        for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
            for (int nt = 0; nt < MSKV_NT; nt++)
MSKV_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int r = 2 * mt + (e >> 1);
                    if (MASKED) {
                        const int j = jb + nt * 8 + (e & 1);
                        s[mt][nt][e] = (j >= w.klo[r]) & (j < w.khi[r]) & (j < clip) ? s[mt][nt][e] : mskv_neg_inf();
                    }
                    mx[r] = fmaxf(mx[r], s[mt][nt][e]);
                }
MSKV_UNROLL
        for (int r = 0; r < 2 * MSKV_MT; r++) {
            float mu;
            mx[r] = fmaxf(mx[r], mskv_shfl_xor(mx[r], 1));
            mx[r] = fmaxf(mx[r], mskv_shfl_xor(mx[r], 2));
            mu = mx[r] == mskv_neg_inf() ? 0.0f : mx[r];  /* nothing seen yet: keep exp2 finite */
            alpha[r] = mskv_exp2((w.m[r] - mu) * w.scale_log2);
            w.m[r] = mx[r];
            mx[r] = mu * w.scale_log2;  /* p = exp2(s * scale_log2 - mx): one fma per score */
        }
MSKV_UNROLL
        for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
            for (int i = 0; i < MSKV_D / 8; i++) {
                w.o[mt][i][0] *= alpha[2 * mt]; w.o[mt][i][1] *= alpha[2 * mt];
                w.o[mt][i][2] *= alpha[2 * mt + 1]; w.o[mt][i][3] *= alpha[2 * mt + 1];
            }
MSKV_UNROLL
        for (int c = 0; c < 4; c++) w.l[c] *= alpha[MSKV_LROW(c)];
MSKV_UNROLL
        for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
            for (int nt = 0; nt < MSKV_NT; nt++)
MSKV_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int r = 2 * mt + (e >> 1);
                    s[mt][nt][e] = mskv_exp2(fmaf(s[mt][nt][e], w.scale_log2, -mx[r]));
                }
    }
    /* O += P V: P packed first (the f32 scores die here; C layout == A
       layout per 16 keys), then every V fragment feeds the warp's m-tiles */
    {
        mskv_u32 pa[MSKV_MT][MSKV_NT / 2][4];
        /* B columns n = lane / 4: all ones, or (two m-tiles) ones in the even
           columns for m-tile 0 and in the odd ones for m-tile 1 */
        const mskv_u32 one_e = MSKV_MT == 1 || !(mskv_tid() & 4) ? MSKV_ONE2 : 0u;
        const mskv_u32 one_o = MSKV_MT == 1 || (mskv_tid() & 4) ? MSKV_ONE2 : 0u;
        const mskv_u32 ones[2][2] = { { one_e, one_e }, { one_o, one_o } };
MSKV_UNROLL
        for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
            for (int ks = 0; ks < MSKV_NT / 2; ks++) {
                pa[mt][ks][0] = mskv_pack2(s[mt][2 * ks][0], s[mt][2 * ks][1]);
                pa[mt][ks][1] = mskv_pack2(s[mt][2 * ks][2], s[mt][2 * ks][3]);
                pa[mt][ks][2] = mskv_pack2(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
                pa[mt][ks][3] = mskv_pack2(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
            }
MSKV_UNROLL
        for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
            for (int ks = 0; ks < MSKV_NT / 2; ks++) mskv_mma(w.l, pa[mt][ks], ones[mt]);
MSKV_UNROLL
        for (int dp = 0; dp < MSKV_D / 16; dp++)
MSKV_UNROLL
            for (int ks = 0; ks < MSKV_NT / 2; ks++) {
                mskv_u32 vb[4];
                mskv_ldsm_x4_t(vb, smem + ((vb0 ^ (mskv_u32)(32 * dp)) + ks * 16 * MSKV_ROWB));
MSKV_UNROLL
                for (int mt = 0; mt < MSKV_MT; mt++) {
                    mskv_mma(w.o[mt][2 * dp], pa[mt][ks], vb);
                    mskv_mma(w.o[mt][2 * dp + 1], pa[mt][ks], vb + 2);
                }
            }
    }
}

/* The pipeline: STAGES - 1 tiles in flight ahead of the one computed. One
   barrier per tile: after it, tile i has landed for every thread and every
   warp is done with tile i - 1, whose stage takes tile i + STAGES - 1. */
struct mskv_pipe {
    int next;                    /* page id of the thread's row of the tile issued next */
    mskv_u32 cs, ls;             /* shared offsets of the stage computed and the stage loaded */
};
MSKV_DEV mskv_u32 mskv_stage_next(mskv_u32 s) {
    return s + MSKV_STAGE_BYTES < MSKV_Q_BYTES + MSKV_STAGES * MSKV_STAGE_BYTES ? s + MSKV_STAGE_BYTES : MSKV_Q_BYTES;
}
/* One tile: wait for the tile at key n0, refill the oldest stage with the
   tile at key n_load, fetch the page id for the one at n_fetch, compute.
   ST < 0: the stages rotate in p; ST >= 0: n0's tile sits in stage ST, known
   when compiling (an unrolled loop), so every shared address is a constant
   offset from registers set up once. */
template <int MASKED, int ST>
MSKV_DEV void mskv_attn_step(mskv_attn_warp &w, mskv_pipe &p, const mskv_gather &g, unsigned char *smem,
                             int n0, int n_load, int n_fetch) {
    const mskv_u32 cs = ST < 0 ? p.cs : (mskv_u32)(MSKV_Q_BYTES + ST * MSKV_STAGE_BYTES);
    const mskv_u32 ls = ST < 0 ? p.ls : (mskv_u32)(MSKV_Q_BYTES + ((ST + MSKV_STAGES - 1) % MSKV_STAGES) * MSKV_STAGE_BYTES);
    mskv_cp_wait<MSKV_STAGES - 2>();
    MSKV_SYNC_ID(1);
    mskv_gather_tile(g, smem, ls, n_load, p.next);
    mskv_cp_commit();
    p.next = mskv_row_fetch(g, n_fetch);
    mskv_attn_tile<MASKED>(w, smem, cs, n0);
    if (ST < 0) {
        p.cs = mskv_stage_next(p.cs);
        p.ls = mskv_stage_next(p.ls);
    }
}

/* A run of whole tiles, keys [n0, f_end), the block's last: loads past it
   are zero-filled (n_hi). */
MSKV_DEV void mskv_attn_run(mskv_attn_warp &w, mskv_pipe &p, const mskv_gather &g, unsigned char *smem,
                            int n0, int f_end, int n_hi) {
#define MSKV_FULL_STEP(st, n) \
    mskv_attn_step<0, st>(w, p, g, smem, (n), (n) + (MSKV_STAGES - 1) * MSKV_BN < f_end ? (n) + (MSKV_STAGES - 1) * MSKV_BN : n_hi, \
                          (n) + MSKV_STAGES * MSKV_BN < f_end ? (n) + MSKV_STAGES * MSKV_BN : n_hi)
#if MSKV_ATTN_WARP_KEYS && MSKV_D <= 128
    /* decode: three tiles an iteration, one per stage, so no stage
       arithmetic and no address arithmetic for shared memory remains
       (at D = 256 the unrolled addresses would spill registers) */
    for (; n0 < f_end && p.cs != (mskv_u32)MSKV_Q_BYTES; n0 += MSKV_BN) MSKV_FULL_STEP(-1, n0);
    for (; n0 + 2 * MSKV_BN < f_end; n0 += 3 * MSKV_BN) {
        MSKV_FULL_STEP(0, n0);
        MSKV_FULL_STEP(1, n0 + MSKV_BN);
        MSKV_FULL_STEP(2, n0 + 2 * MSKV_BN);
    }
#endif
    for (; n0 < f_end; n0 += MSKV_BN) MSKV_FULL_STEP(-1, n0);
#undef MSKV_FULL_STEP
}
/* The first of two runs of whole tiles (the sink's, before the hidden
   keys), keys [n0, f_end): loads past its end continue gap keys later, in
   the second run (and past that, where nothing is computed, they only
   read keys of the sequence: mskv_row_key clamps). */
MSKV_DEV void mskv_attn_run1(mskv_attn_warp &w, mskv_pipe &p, const mskv_gather &g, unsigned char *smem,
                             int n0, int f_end, int gap) {
    for (; n0 < f_end; n0 += MSKV_BN) {
        const int l = n0 + (MSKV_STAGES - 1) * MSKV_BN, f = n0 + MSKV_STAGES * MSKV_BN;
        mskv_attn_step<0, -1>(w, p, g, smem, n0, l < f_end ? l : l + gap, f < f_end ? f : f + gap);
    }
}

/* Tiles [lo, hi) of a run of n tiles from key r0 that every row sees whole:
   those inside [kw, kc); an empty range is (n, n). */
template <int BN>
MSKV_DEV void mskv_whole_tiles(int r0, int n, int kw, int kc, int *lo, int *hi) {
    const int a = kw > r0 ? (kw - r0 + BN - 1) / BN : 0;
    int z = kc > r0 ? (kc - r0) / BN : 0;
    z = z < n ? z : n;
    *lo = a < z ? a : n;
    *hi = a < z ? z : n;
}

/* The keys a block needs (its split, cut by the mask's reach over the
   block's query positions [qpos_min, qpos_max], less the hidden run
   [h0, h1)) and which of its tiles every row of the block sees whole
   (positions grow with the compacted index, so those form one run of tiles
   on either side of the hidden keys). */
MSKV_DEV mskv_tiles mskv_attn_tiles(int n_splits, int split, int kv_chunk, int kvl, int mask, int window_left,
                                    int psplit, int pshift, int qpos_min, int qpos_max, int h0, int h1) {
    mskv_tiles t;
    int n_lo, a_hi, b_lo, kc, kw, alo, ahi, blo, bhi;
    n_lo = n_splits > 1 ? split * kv_chunk : 0;
    t.n_hi = n_splits > 1 ? (n_lo + kv_chunk < kvl ? n_lo + kv_chunk : kvl) : kvl;
    if (mask >= 1) { const int c = mskv_first_at(qpos_max + 1, psplit, pshift); t.n_hi = c < t.n_hi ? c : t.n_hi; }
    if (mask == 2) { const int c = mskv_first_at(qpos_min - window_left, psplit, pshift); n_lo = c > n_lo ? c : n_lo; }
    /* run A: [n_lo, min(n_hi, h0)); run B: [max(n_lo, h1), n_hi), whose
       first keys A's last tile may load too (masked there: they are >= h0) */
    a_hi = h0 < t.n_hi ? h0 : t.n_hi;
    t.a_lo = n_lo;
    t.n_a = a_hi > n_lo ? (a_hi - n_lo + MSKV_BN - 1) / MSKV_BN : 0;
    b_lo = h1 > n_lo ? h1 : n_lo;
    t.b_lo = b_lo;
    t.n_tiles = t.n_a + (t.n_hi > t.b_lo ? (t.n_hi - t.b_lo + MSKV_BN - 1) / MSKV_BN : 0);
    kc = t.n_hi;   /* keys below kc: seen by every row (causal) */
    kw = n_lo;     /* keys from kw on: within every row's window */
    if (mask >= 1) { const int c = mskv_first_at(qpos_min + 1, psplit, pshift); kc = c < kc ? c : kc; }
    if (mask == 2) { const int c = mskv_first_at(qpos_max - window_left, psplit, pshift); kw = c > kw ? c : kw; }
    mskv_whole_tiles<MSKV_BN>(t.a_lo, t.n_a, kw, kc < a_hi ? kc : a_hi, &alo, &ahi);
    mskv_whole_tiles<MSKV_BN>(t.b_lo, t.n_tiles - t.n_a, kw, kc, &blo, &bhi);
    blo += t.n_a; bhi += t.n_a;
    if (alo == ahi) { t.f1_lo = t.f1_hi = blo; t.f2_lo = blo; t.f2_hi = bhi; }       /* B's run (or none) last */
    else if (blo == bhi) { t.f1_lo = t.f1_hi = alo; t.f2_lo = alo; t.f2_hi = ahi; }  /* A's run alone */
    else { t.f1_lo = alo; t.f1_hi = ahi; t.f2_lo = blo; t.f2_hi = bhi; }
    t.n_masked = t.n_tiles - (t.f1_hi - t.f1_lo) - (t.f2_hi - t.f2_lo);
    return t;
}

/* The block's rows out: o (or the split's partial o_part) and lse. Indices
   are recomputed here, not kept alive through the key loop, where every
   register is taken. */
MSKV_DEV void mskv_attn_store(mskv_attn_warp &w, unsigned char *smem, const int *qo_indptr, int q_heads, int kv_heads,
                              float scale_log2, int n_splits, void *o, float *lse, float *o_part, float *lse_part) {
    const int tid = mskv_tid(), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;
    const int group = q_heads / kv_heads;
    const int q0 = qo_indptr[b], rows = (qo_indptr[b + 1] - q0) * group, row0 = mskv_bid_x() * MSKV_BM;
    {
        const mskv_i64 total_q = qo_indptr[mskv_nblk_y()];
        const float ln2 = 0.6931471805599453f;
#if MSKV_ATTN_WARP_KEYS
        /* merge the 4 warps' states: smem [warp][16][D + 8] f32 o (the pad
           keeps the 8 rows of a 64-bit store in different banks), then m, l */
        float *mo = (float *)smem, *mm = mo + 4 * 16 * MSKV_MERGE_LD, *ml = mm + 4 * 16;
        MSKV_SYNC_ID(3);  /* K/V tiles are dead: reuse shared memory */
MSKV_UNROLL
        for (int d = 0; d < MSKV_D / 8; d++) {
            float *p0 = mo + (warp * 16 + g) * MSKV_MERGE_LD + d * 8 + 2 * t4, *p1 = p0 + 8 * MSKV_MERGE_LD;
            p0[0] = w.o[0][d][0]; p0[1] = w.o[0][d][1]; p1[0] = w.o[0][d][2]; p1[1] = w.o[0][d][3];
        }
        if (t4 == 0) {
            mm[warp * 16 + g] = w.m[0]; mm[warp * 16 + g + 8] = w.m[1];
            ml[warp * 16 + g] = w.l[MSKV_LSUM(0)]; ml[warp * 16 + g + 8] = w.l[MSKV_LSUM(1)];
        }
        MSKV_SYNC_ID(4);
        for (int idx = tid; idx < 16 * MSKV_D; idx += 128) {
            int r = idx / MSKV_D, d = idx % MSKV_D, R = row0 + r;
            float M = mskv_neg_inf(), L = 0.0f, acc = 0.0f;
            mskv_i64 orow;
            if (R >= rows) continue;
            for (int k = 0; k < 4; k++) M = fmaxf(M, mm[k * 16 + r]);
            if (M != mskv_neg_inf()) {
                for (int k = 0; k < 4; k++) {
                    float f = mskv_exp2((mm[k * 16 + r] - M) * scale_log2);
                    L += f * ml[k * 16 + r];
                    acc += f * mo[(k * 16 + r) * MSKV_MERGE_LD + d];
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
        (void)smem;
        for (int h = 0; h < 2 * MSKV_MT; h++) {
            const int mt = h >> 1, e = 2 * (h & 1);
            int R = row0 + warp * MSKV_WM + 16 * mt + g + 8 * (h & 1);
            const float l = w.l[MSKV_LSUM(h)];
            float inv = l > 0.0f ? 1.0f / l : 0.0f;
            float lv = l > 0.0f ? (w.m[h] * scale_log2 + log2f(l)) * ln2 : mskv_neg_inf();
            mskv_i64 orow;
            if (R >= rows) continue;
            orow = (mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group;
            if (n_splits > 1) {
                float *dst = o_part + ((mskv_i64)split * total_q * q_heads + orow) * MSKV_D + 2 * t4;
MSKV_UNROLL
                for (int d = 0; d < MSKV_D / 8; d++) { dst[d * 8] = w.o[mt][d][e] * inv; dst[d * 8 + 1] = w.o[mt][d][e + 1] * inv; }
                if (t4 == 0) lse_part[(mskv_i64)split * total_q * q_heads + orow] = lv;
            } else {
                mskv_u32 *dst = (mskv_u32 *)((mskv_u16 *)o + orow * MSKV_D + 2 * t4);
MSKV_UNROLL
                for (int d = 0; d < MSKV_D / 8; d++) dst[d * 4] = mskv_pack2(w.o[mt][d][e] * inv, w.o[mt][d][e + 1] * inv);
                if (lse && t4 == 0) lse[orow] = lv;
            }
        }
#endif
    }
}

/* The sm_90a module (the runtime's arch-specific build, for mskv_attn_sm90)
   leaves mskv_attn out: it is launched from the sm_90 module only, and at the
   sm_90a module's ptxas -O3 it would spill. */
#if !(defined(MSKV_GPU) && MSKV_SM90A)
MSKV_KERNEL void mskv_attn(const void *q, const void *k_pool, const void *v_pool,
                           const int *qo_indptr, const int *kv_indptr, const int *kv_indices,
                           const int *kv_len, const int *kv_pos_split, const int *kv_pos_shift,
                           int q_heads, int kv_heads, int page_size, unsigned int page_magic, int page_shift,
                           float scale_log2, int mask, int window_left, int kv_chunk, int n_splits,
                           void *o, float *lse, float *o_part, float *lse_part,
                           const int *q_pos, const int *vis_sink_end, const int *vis_window_start) {
    MSKV_SMEM(smem);
    const int tid = mskv_tid(), warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    const int b = mskv_bid_y(), kvh = mskv_bid_z() % kv_heads, split = mskv_bid_z() / kv_heads;
    const int group = q_heads / kv_heads;
    const int q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0;
    const int rows = qo_len * group, row0 = mskv_bid_x() * MSKV_BM;
    const int kvl = kv_len[b], psplit = kv_pos_split[b], pshift = kv_pos_shift[b];
    mskv_u16 *sq = (mskv_u16 *)(smem + MSKV_Q_OFF);
    mskv_attn_warp w;
    mskv_tiles t;
    mskv_gather ga;
    mskv_pipe p;
    int i, qpos_min, qpos_max, h0, h1;
    if (row0 >= rows) return;  /* whole block: before any barrier */
    w.wrow0 = MSKV_ATTN_WARP_KEYS ? 0 : warp * MSKV_WM;
    w.wkey0 = MSKV_ATTN_WARP_KEYS ? warp * 16 : 0;
    /* Q (A operand): row wrow0 + (lane & 15), chunk 2 kk + lane / 16; K (B
       operand): key wkey0 + (lane & 7) + 8 (lane / 16), chunk 2 kk + bit 3 of
       lane; V (B, transposed): key wkey0 + (lane & 15), chunk 2 dp + lane / 16.
       In every case row & 7 == lane & 7 and the chunk's low bit is b, so the
       swizzled chunk of k-step kk is 2 kk ^ b ^ (lane & 7): the offset of
       k-step 0 XOR 32 kk (the row start is aligned to the row's length). */
    w.qb = (mskv_u32)(MSKV_Q_OFF + (w.wrow0 + (lane & 15)) * MSKV_ROWB + 16 * ((lane >> 4) ^ (lane & 7)));
    w.kb = (mskv_u32)((w.wkey0 + (lane & 7) + 8 * (lane >> 4)) * MSKV_ROWB + 16 * (((lane >> 3) & 1) ^ (lane & 7)));
    w.vb = (mskv_u32)((w.wkey0 + (lane & 15)) * MSKV_ROWB + 16 * ((lane >> 4) ^ (lane & 7)));
    w.scale_log2 = scale_log2;

    {
        /* the block's queries [qa, qz] and their mask positions */
        const int qa = row0 / group, qz = (row0 + MSKV_BM - 1 < rows - 1 ? row0 + MSKV_BM - 1 : rows - 1) / group;
        if (q_pos && mask >= 1) {
            mskv_q_pos_range<128>(q_pos + q0, qa, qz - qa + 1, (int *)(void *)smem, &qpos_min, &qpos_max);
        } else {
            qpos_min = mskv_abs_pos(kvl - qo_len + qa, psplit, pshift);
            qpos_max = mskv_abs_pos(kvl - qo_len + qz, psplit, pshift);
        }
    }
    mskv_vis_hole(vis_sink_end, vis_window_start, b, kvl, psplit, pshift, &h0, &h1);
    /* block-uniform values the compiler cannot see as such (they went
       through shared memory): said so, the key loop's bounds stay in
       uniform registers */
    qpos_min = mskv_uniform(qpos_min); qpos_max = mskv_uniform(qpos_max);
    h0 = mskv_uniform(h0); h1 = mskv_uniform(h1);
    w.h0 = h0;
    t = mskv_attn_tiles(n_splits, split, kv_chunk, kvl, mask, window_left, psplit, pshift, qpos_min, qpos_max, h0, h1);
    {
        const int c0 = (tid % MSKV_TPR) * MSKV_CPT, row = tid / MSKV_TPR;
        ga.k_pool = (const unsigned char *)k_pool;
        ga.v_pool = (const unsigned char *)v_pool;
        ga.kv_indices = kv_indices;
        ga.magic = page_magic; ga.shift = page_shift; ga.page_size = page_size; ga.kv_heads = kv_heads;
        ga.page0 = kv_indptr[b];
        ga.head = (mskv_u32)(kvh * MSKV_D * 2 + c0 * 16);
        ga.n_hi = t.n_hi;
        ga.row = row;
        ga.dst = (mskv_u32)((row * MSKV_CH + (c0 ^ (row & 7))) * 16);
    }

    /* Q tile: row r of the block is query (row0 + r) / group, q head kvh * group + (row0 + r) % group */
    for (int idx = tid; idx < MSKV_BM * MSKV_CH; idx += 128) {
        int r = idx / MSKV_CH, ch = idx % MSKV_CH, R = row0 + r, ok = R < rows;
        mskv_i64 off = 0;
        if (ok) off = (((mskv_i64)(q0 + R / group) * q_heads + kvh * group + R % group) * MSKV_D + ch * 8) * 2;
        mskv_cp_async16(sq + mskv_swz(r, ch), (const unsigned char *)q + off, ok ? 16 : 0);
    }
    /* the first STAGES - 1 tiles, one commit group each (Q rides with tile 0) */
    p.cs = MSKV_Q_BYTES;
    p.ls = MSKV_Q_BYTES;
    for (i = 0; i < MSKV_STAGES - 1; i++) {
        if (t.n_tiles > 0) mskv_gather_tile(ga, smem, p.ls, mskv_tile_key(t, i), mskv_row_fetch(ga, mskv_tile_key(t, i)));
        mskv_cp_commit();
        p.ls = mskv_stage_next(p.ls);
    }
    if (t.n_tiles > 0) p.next = mskv_row_fetch(ga, mskv_tile_key(t, MSKV_STAGES - 1));
    else p.next = 0;

    for (int h = 0; h < 2 * MSKV_MT; h++) {
        const int R = row0 + w.wrow0 + 16 * (h >> 1) + g + 8 * (h & 1);
        const int qpos = mskv_q_pos(q_pos ? q_pos + q0 : 0, (R < rows ? R : rows - 1) / group, kvl, qo_len, psplit, pshift);
        int lo = t.a_lo, hi = t.n_hi;
        if (mask >= 1) { const int c = mskv_first_at(qpos + 1, psplit, pshift); hi = c < hi ? c : hi; }
        if (mask == 2) { const int c = mskv_first_at(qpos - window_left, psplit, pshift); lo = c > lo ? c : lo; }
        w.klo[h] = lo;
        w.khi[h] = hi;
        w.m[h] = mskv_neg_inf();
    }
    w.l[0] = w.l[1] = w.l[2] = w.l[3] = 0.0f;
MSKV_UNROLL
    for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
        for (int d = 0; d < MSKV_D / 8; d++) w.o[mt][d][0] = w.o[mt][d][1] = w.o[mt][d][2] = w.o[mt][d][3] = 0.0f;
#if MSKV_QREG
    /* Q into registers once (with tile 0: its group is the oldest) */
    mskv_cp_wait<MSKV_STAGES - 2>();
    MSKV_SYNC_ID(5);
MSKV_UNROLL
    for (int mt = 0; mt < MSKV_MT; mt++)
MSKV_UNROLL
        for (int kk = 0; kk < MSKV_D / 16; kk++)
            mskv_ldsm_x4(w.qf[mt][kk], smem + ((w.qb ^ (mskv_u32)(32 * kk)) + mt * 16 * MSKV_ROWB));
#endif

    /* the masked tiles, then the whole ones: loops of their own, so the common one carries no mask code */
    for (i = 0; i < t.n_masked; i++)
        mskv_attn_step<1, -1>(w, p, ga, smem, mskv_tile_key(t, i), mskv_tile_key(t, i + MSKV_STAGES - 1),
                              mskv_tile_key(t, i + MSKV_STAGES));
    if (t.f1_hi > t.f1_lo)
        mskv_attn_run1(w, p, ga, smem, mskv_tile_at(t, t.f1_lo), mskv_tile_at(t, t.f1_hi - 1) + MSKV_BN,
                       mskv_tile_at(t, t.f2_lo) - (mskv_tile_at(t, t.f1_hi - 1) + MSKV_BN));
    mskv_attn_run(w, p, ga, smem, mskv_tile_at(t, t.f2_lo), mskv_tile_at(t, t.f2_lo) + (t.f2_hi - t.f2_lo) * MSKV_BN, t.n_hi);
    mskv_cp_wait<0>();

    mskv_attn_store(w, smem, qo_indptr, q_heads, kv_heads, scale_log2, n_splits, o, lse, o_part, lse_part);
}
#endif

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
/* lane 0's x in every lane: the compiler then knows x is warp-uniform (descriptors
   and barrier ids stay in uniform registers) */
MSKV_DEV int mskv_bcast0(int x) { return __shfl_sync(0xffffffffu, x, 0); }
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
#define MSKV_WG_O36 MSKV_WG_O32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#define MSKV_WG_O68 MSKV_WG_O64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
#define MSKV_WG_O128 MSKV_WG_O64, MSKV_WG_O8(64), MSKV_WG_O8(72), MSKV_WG_O8(80), MSKV_WG_O8(88), \
    MSKV_WG_O8(96), MSKV_WG_O8(104), MSKV_WG_O8(112), MSKV_WG_O8(120)
#define MSKV_WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MSKV_WG_D36 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35}"
#define MSKV_WG_D68 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67}"
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
   B N-major from a descriptor (O += P V, imm-trans-b 1; N = head_dim + 8
   when V carries a block of ones for the row sums). */
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
MSKV_WG_RS(72, MSKV_WG_D36, MSKV_WG_O36, 36, 37, 38, 39, 40, 41)
MSKV_WG_RS(136, MSKV_WG_D68, MSKV_WG_O68, 68, 69, 70, 71, 72, 73)
MSKV_WG_RS(256, MSKV_WG_D128, MSKV_WG_O128, 128, 129, 130, 131, 132, 133)
/* a 16-byte generic store of four copies of w (fence.proxy.async before the tensor cores read it) */
MSKV_DEV void mskv_sts16(void *dst, mskv_u32 w) {
    mskv_v16 v;
    v.x = v.y = v.z = v.w = w;
    *(mskv_v16 *)dst = v;
}
#else
/* host emulation: tests/emu/mskv_emu_sm90.h has the primitives; the wgmma
   entry points take this file's MSKV_DTYPE */
MSKV_DEV void mskv_wgmma_ss64(float *d, mskv_u64 da, mskv_u64 db, int acc) { mskv_emu_wgmma_ss(d, 64, da, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_ss128(float *d, mskv_u64 da, mskv_u64 db, int acc) { mskv_emu_wgmma_ss(d, 128, da, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_rs72(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 72, a, db, acc, MSKV_DTYPE == 2); }
MSKV_DEV void mskv_wgmma_rs136(float *d, const mskv_u32 *a, mskv_u64 db, int acc) { mskv_emu_wgmma_rs_tb(d, 136, a, db, acc, MSKV_DTYPE == 2); }
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
/* Row sums by the tensor cores where N allows (head_dim <= 128): each
   stage's V is followed by a block of ones, so O += P V with N = D + 8 also
   accumulates sum(P) in columns D..D+7, rescaled with O (64 FADD less a tile). */
#if MSKV_D == 64
#define MSKV_H_PVN 72
#define MSKV_H_ONES 1
#elif MSKV_D == 128
#define MSKV_H_PVN 136
#define MSKV_H_ONES 1
#else
#define MSKV_H_PVN MSKV_D
#define MSKV_H_ONES 0
#endif
#define MSKV_H_THREADS 384                        /* producer warpgroup + 2 consumers */
#define MSKV_H_BM 128
#define MSKV_H_QB (64 * MSKV_D * 2)                /* one consumer's Q tile */
#define MSKV_H_TB (MSKV_H_BN * MSKV_D * 2)         /* one K (or V) tile */
#define MSKV_H_OB (MSKV_H_ONES * MSKV_H_BN * 128)  /* the ones block after V (an atom of 64 columns) */
#define MSKV_H_SB (2 * MSKV_H_TB + MSKV_H_OB)      /* a stage: K, V, ones */
#define MSKV_H_BARS (2 * MSKV_H_QB + MSKV_H_STAGES * MSKV_H_SB)   /* full[STAGES], empty[STAGES] */
#define MSKV_H_SMEM (1024 + MSKV_H_BARS + 16 * MSKV_H_STAGES)     /* + slack to align the base */
/* A stage goes back to the producer when every consumer warp that read it
   has waited for its own wgmma groups: wgmma.commit_group / wait_group track
   the executing warp's groups, so one warp's wait says nothing of the other
   three. Lane 0 of each consumer warp arrives on the stage's "empty" barrier
   after its warp's wgmma.wait_group (.sync.aligned: the whole warp waits
   together), and the barrier counts 4 warps x 2 consumer warpgroups. The
   leader-only form (one arrival per warpgroup, count 2) is kept as a planted
   bug for the emulator's tests only: MSKV_SM90_PLANT_LEADER_RELEASE. */
#if !defined(MSKV_GPU) && defined(MSKV_SM90_PLANT_LEADER_RELEASE)
#define MSKV_H_RELEASERS 2
#else
#define MSKV_H_RELEASERS 8
#endif
#define MSKV_H_REGS_PRODUCER 40
#define MSKV_H_REGS_CONSUMER 232                  /* 128 x 40 + 256 x 232 <= 64K */
/* named barriers: 1 producer team, 2 + w consumer w's Q, 4 + w consumer w's turn at the tensor cores */
#define MSKV_CAT2(a, b) a##b
#define MSKV_CAT(a, b) MSKV_CAT2(a, b)
#define MSKV_WGMMA_S MSKV_CAT(mskv_wgmma_ss, MSKV_H_BN)
#define MSKV_WGMMA_PV MSKV_CAT(mskv_wgmma_rs, MSKV_H_PVN)

#ifndef MSKV_GPU
/* for the host tests: the launch geometry of these defines */
static const int mskv_attn_sm90_block_keys = MSKV_H_BN, mskv_attn_sm90_smem_bytes = MSKV_H_SMEM;
#endif

/* matrix descriptor, 128-byte swizzle: start, leading / stride byte offsets */
MSKV_DEV mskv_u64 mskv_h_desc(mskv_u32 addr, mskv_u32 lbo, mskv_u32 sbo) {
    return (mskv_u64)((addr & 0x3ffffu) >> 4) | ((mskv_u64)((lbo & 0x3ffffu) >> 4) << 16) |
           ((mskv_u64)((sbo & 0x3ffffu) >> 4) << 32) | (1ull << 62);
}

/* The keys a block visits, as tiles of BN on BN-aligned keys (a TMA box
   never straddles a page). Like mskv_attn's: run A from a0 (tiles
   0..n_a-1) up to the hidden keys, run B from b0 (at or past A's last tile)
   after them, tiles n_a..n_tiles-1; tiles wholly hidden are not visited.
   Tiles [f1_lo, f1_hi) and [f2_lo, f2_hi) are visible whole to every row of
   the block (f1 empty unless both are not); the others ("masked") go first,
   in a loop of their own, then the whole ones. */
struct mskv_h_keys {
    int split_lo, split_hi;   /* the split's keys (kv_len cut) */
    int a0, n_a, b0, n_tiles, f1_lo, f1_hi, f2_lo, f2_hi, n_masked;
};
MSKV_DEV mskv_h_keys mskv_h_block_keys(int kvl, int psplit, int pshift, int mask, int window_left, int kv_chunk,
                                       int n_splits, int split, int qpos_min, int qpos_max, int h0, int h1) {
    mskv_h_keys k;
    int n_lo, n_hi, lo_max, hi_min, a_hi, b_lo, alo, ahi, blo, bhi;
    k.split_lo = n_splits > 1 ? split * kv_chunk : 0;
    k.split_hi = n_splits > 1 ? (k.split_lo + kv_chunk < kvl ? k.split_lo + kv_chunk : kvl) : kvl;
    n_lo = lo_max = k.split_lo;
    n_hi = hi_min = k.split_hi;
    if (mask >= 1) {
        const int c = mskv_first_at(qpos_max + 1, psplit, pshift), c2 = mskv_first_at(qpos_min + 1, psplit, pshift);
        if (c < n_hi) n_hi = c;
        if (c2 < hi_min) hi_min = c2;
    }
    if (mask == 2) {
        const int lo = mskv_first_at(qpos_min - window_left, psplit, pshift);
        const int lo2 = mskv_first_at(qpos_max - window_left, psplit, pshift);
        if (lo > n_lo) n_lo = lo;
        if (lo2 > lo_max) lo_max = lo2;
    }
    a_hi = h0 < n_hi ? h0 : n_hi;
    k.a0 = n_lo / MSKV_H_BN * MSKV_H_BN;
    k.n_a = a_hi > n_lo ? (a_hi - k.a0 + MSKV_H_BN - 1) / MSKV_H_BN : 0;
    b_lo = h1 > n_lo ? h1 : n_lo;
    k.b0 = b_lo / MSKV_H_BN * MSKV_H_BN;
    if (k.b0 < k.a0 + k.n_a * MSKV_H_BN) k.b0 = k.a0 + k.n_a * MSKV_H_BN;
    k.n_tiles = k.n_a + (n_hi > b_lo && n_hi > k.b0 ? (n_hi - k.b0 + MSKV_H_BN - 1) / MSKV_H_BN : 0);
    mskv_whole_tiles<MSKV_H_BN>(k.a0, k.n_a, lo_max, hi_min < a_hi ? hi_min : a_hi, &alo, &ahi);
    mskv_whole_tiles<MSKV_H_BN>(k.b0, k.n_tiles - k.n_a, lo_max > b_lo ? lo_max : b_lo, hi_min, &blo, &bhi);
    blo += k.n_a; bhi += k.n_a;
    if (alo == ahi) { k.f1_lo = k.f1_hi = blo; k.f2_lo = blo; k.f2_hi = bhi; }
    else if (blo == bhi) { k.f1_lo = k.f1_hi = alo; k.f2_lo = alo; k.f2_hi = ahi; }
    else { k.f1_lo = alo; k.f1_hi = ahi; k.f2_lo = blo; k.f2_hi = bhi; }
    k.n_masked = k.n_tiles - (k.f1_hi - k.f1_lo) - (k.f2_hi - k.f2_lo);
    return k;
}
/* first key of tile k in key order */
MSKV_DEV int mskv_h_tile_at(const mskv_h_keys &k, int t) {
    return t < k.n_a ? k.a0 + t * MSKV_H_BN : k.b0 + (t - k.n_a) * MSKV_H_BN;
}
/* first key of the i-th tile in visiting order (producer and consumers agree) */
MSKV_DEV int mskv_h_tile_key(const mskv_h_keys &k, int i) {
    const int m1 = k.f1_lo, m2 = m1 + k.f2_lo - k.f1_hi, w1 = k.f1_hi - k.f1_lo;
    int t;
    if (i < k.n_masked) t = i < m1 ? i : i < m2 ? i - m1 + k.f1_hi : i - m2 + k.f2_hi;
    else t = i - k.n_masked < w1 ? i - k.n_masked + k.f1_lo : i - k.n_masked - w1 + k.f2_lo;
    return mskv_h_tile_at(k, t);
}

/* ---- producer: one tile of K and V into a stage ---- */

/* TMA: the tile lies in whole pages (page_size a multiple of BN, or BN a
   multiple of page_size), one box per page piece and 64-wide column block:
   the tensor map is the pool as [pages][page_size][kv_heads][D] (dims D,
   kv_heads, page_size, num_pages; box 64 x 1 x min(page_size, BN) x 1), so a
   box is (c * 64, kvh, slot in page, page id). Dense K/V (pages NULL, key0
   its buffer row): the map is the buffer as one page of all its rows (box
   64 x 1 x BN x 1), a box (c * 64, kvh, key0, 0). Lanes of one warp share the boxes. */
MSKV_DEV void mskv_h_load_tma(const mskv_tmap *k_map, const mskv_tmap *v_map, const int *pages, int page_size, int kvh,
                              int key0, mskv_u32 kst, mskv_u32 full, int lane) {
    /* dense K/V (pages NULL): one page of every row, the box BN rows from row key0 */
    const int box_rows = !pages || page_size >= MSKV_H_BN ? MSKV_H_BN : page_size, boxes = MSKV_H_BN / box_rows;
    /* the expectation may follow the first bytes: tx counts below zero until it comes */
    if (lane == 0) mskv_mbar_arrive_tx(full, 2 * MSKV_H_TB);
    for (int x = lane; x < boxes * (MSKV_D / 64); x += 32) {
        const int pb = x / (MSKV_D / 64), cb = x % (MSKV_D / 64), key = key0 + pb * box_rows;
        const int page = pages ? pages[key / page_size] : 0, slot = pages ? key % page_size : key;
        const mskv_u32 dst = kst + (mskv_u32)(cb * (MSKV_H_BN * 128) + pb * box_rows * 128);
        mskv_tma_load_4d(dst, k_map, cb * 64, kvh, slot, page, full);
        mskv_tma_load_4d(dst + MSKV_H_TB, v_map, cb * 64, kvh, slot, page, full);
    }
}

/* cp.async, any page size: team threads copy whole rows (one page id each),
   rows at or past kv_len zero-filled (a page's unused slots may hold NaN);
   then wait, fence the generic writes for the tensor cores, meet, arrive. */
MSKV_DEV void mskv_h_load_rows(const unsigned char *k_pool, const unsigned char *v_pool, const int *pages, int krow0,
                               int page_size, int kv_heads, int kvh, int kvl, int key0, unsigned char *sk, mskv_u32 full,
                               int idx, int team) {
    const mskv_u64 slot_bytes = (mskv_u64)kv_heads * (MSKV_D * 2);
    for (int r = idx; r < MSKV_H_BN; r += team) {
        const int j = key0 + r, ok = j < kvl;
        mskv_u64 off = 0;
        if (ok) off = (pages ? (mskv_u64)pages[j / page_size] * (mskv_u64)page_size + (mskv_u64)(j % page_size)
                             : (mskv_u64)(krow0 + j)) * slot_bytes +
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
    float o[MSKV_H_PVN / 2];             /* O, unnormalised (then the row sums, MSKV_H_ONES) */
    float s[MSKV_H_BN / 2];              /* S, then P of the current tile */
    mskv_u32 p[MSKV_H_BN / 16][4];       /* P of the previous tile as A fragments (k16 slices) */
    float m[2], l[2];                    /* running max (unscaled), this lane's part of the row sums */
    int klo[2], khi[2];                  /* the keys row h may see: [klo, khi) */
    int h0;                              /* the visibility bounds' hidden keys [h0, h0 + hlen) */
    mskv_u32 hlen;
    mskv_u64 qd;                         /* descriptor of this warpgroup's Q tile */
    mskv_u32 ring;                       /* shared address of stage 0 */
    mskv_u32 bars;                       /* shared address of full[0] */
    int cw, t4, leader;                  /* consumer 0 or 1 (warp-uniform), lane in quad, arrives for its warp */
    float scale_log2;
};

/* mask, online softmax, P into c.s; the O rescale factors into alpha */
template <int MASKED>
MSKV_DEV void mskv_h_softmax(mskv_h_cons &c, int key0, float alpha[2]) {
    float mx[2], neg[2];
    mx[0] = c.m[0]; mx[1] = c.m[1];
    if (MASKED) {
        int lo[2], hi[2];
        const int hl = c.h0 - key0 - 2 * c.t4;
        for (int h = 0; h < 2; h++) { lo[h] = c.klo[h] - key0 - 2 * c.t4; hi[h] = c.khi[h] - key0 - 2 * c.t4; }
MSKV_UNROLL
        for (int i = 0; i < MSKV_H_BN / 2; i++) {
            const int h = (i >> 1) & 1, col = (i >> 2) * 8 + (i & 1);
            c.s[i] = col >= lo[h] && col < hi[h] && (mskv_u32)(col - hl) >= c.hlen ? c.s[i] : mskv_neg_inf();
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
#if !MSKV_H_ONES
        c.l[h] *= alpha[h];
#endif
        neg[h] = mu * c.scale_log2;
    }
MSKV_UNROLL
    for (int i = 0; i < MSKV_H_BN / 2; i++) {
        const int h = (i >> 1) & 1;
        c.s[i] = mskv_exp2(fmaf(c.s[i], c.scale_log2, -neg[h]));
#if !MSKV_H_ONES
        c.l[h] += c.s[i];
#endif
    }
}

/* O += P V of the tile in stage ps (issued, committed) */
MSKV_DEV void mskv_h_issue_pv(mskv_h_cons &c, int ps) {
    const mskv_u64 vd = mskv_h_desc(c.ring + (mskv_u32)(ps * MSKV_H_SB + MSKV_H_TB), MSKV_H_BN * 128, 1024);
MSKV_UNROLL
    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) MSKV_WGMMA_PV(c.o, c.p[kk], vd + (mskv_u64)(kk * 16 * 128 / 16), 1);
    mskv_wgmma_commit();
}

/* PV done (this warp's wgmma.wait_group 0): the stage goes back to the
   producer, one arrival per consumer warp (see MSKV_H_RELEASERS) */
MSKV_DEV void mskv_h_release(mskv_h_cons &c, int ps) {
MSKV_UNROLL
    for (int i = 0; i < MSKV_H_PVN / 2; i++) mskv_wg_keep(c.o[i]);
MSKV_UNROLL
    for (int kk = 0; kk < MSKV_H_BN / 16; kk++) {
MSKV_UNROLL
        for (int e = 0; e < 4; e++) mskv_wg_keep_u(c.p[kk][e]);
    }
    if (c.leader) mskv_mbar_arrive(c.bars + (mskv_u32)(8 * (MSKV_H_STAGES + ps)));
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
    for (int i = 0; i < MSKV_H_PVN / 2; i++) c.o[i] *= alpha[(i >> 1) & 1];
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
               int n_splits, void *o, float *lse, float *o_part, float *lse_part,
               const int *q_pos, const int *vis_sink_end, const int *vis_window_start) {
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
    int qpos_min, qpos_max, h0, h1;
    if (row0 >= rows) return;  /* whole block: before any barrier */
    base = (mskv_smem_addr(smem) + 1023u) & ~1023u;
    sbase = smem + (base - mskv_smem_addr(smem));
    {
        /* the block's queries [qa, qz] and their mask positions (the scratch:
           the Q tiles, loaded after the barrier that follows the mbarrier inits) */
        const int qa = row0 / group, qz = (row0 + MSKV_H_BM - 1 < rows - 1 ? row0 + MSKV_H_BM - 1 : rows - 1) / group;
        if (q_pos && mask >= 1) {
            mskv_q_pos_range<MSKV_H_THREADS>(q_pos + q0, qa, qz - qa + 1, (int *)(void *)sbase, &qpos_min, &qpos_max);
        } else {
            qpos_min = mskv_abs_pos(kvl - qo_len + qa, psplit, pshift);
            qpos_max = mskv_abs_pos(kvl - qo_len + qz, psplit, pshift);
        }
    }
    mskv_vis_hole(vis_sink_end, vis_window_start, b, kvl, psplit, pshift, &h0, &h1);
    qpos_min = mskv_uniform(qpos_min); qpos_max = mskv_uniform(qpos_max);   /* as in mskv_attn */
    h0 = mskv_uniform(h0); h1 = mskv_uniform(h1);
    kb = mskv_h_block_keys(kvl, psplit, pshift, mask, window_left, kv_chunk, n_splits, split, qpos_min, qpos_max, h0, h1);
    if (tid == 0) {
        for (int s = 0; s < MSKV_H_STAGES; s++) {
            mskv_mbar_init(base + MSKV_H_BARS + 8 * s, 1);                      /* full: the producer */
            mskv_mbar_init(base + MSKV_H_BARS + 8 * (MSKV_H_STAGES + s), MSKV_H_RELEASERS);   /* empty: every consumer warp */
        }
        mskv_mbar_init_fence();
    }
#if MSKV_H_ONES
    for (int x = tid; x < MSKV_H_STAGES * (MSKV_H_OB / 16); x += MSKV_H_THREADS) {
        const int st = x / (MSKV_H_OB / 16), at = x % (MSKV_H_OB / 16);
        mskv_sts16(sbase + 2 * MSKV_H_QB + st * MSKV_H_SB + 2 * MSKV_H_TB + 16 * at, MSKV_DTYPE == 1 ? 0x3c003c00u : 0x3f803f80u);
    }
    mskv_fence_proxy_async();   /* generic stores the tensor cores read */
#endif
    mskv_sync();

    if (wg == 0) {
        /* producer: TMA needs one warp (the rest leave); cp.async takes all four */
        const int team = use_tma ? 32 : 128;
        /* dense K/V (kv_indices NULL, page_size 1): key j of the segment is row krow0 + j */
        const int krow0 = kv_indptr[b];
        const int *pages = kv_indices ? kv_indices + krow0 : 0;
        mskv_setmaxnreg_dec<MSKV_H_REGS_PRODUCER>();
        if (tid >= team) return;
        for (int i = 0; i < kb.n_tiles; i++) {
            const int s = i % MSKV_H_STAGES, key0 = mskv_h_tile_key(kb, i);
            const mskv_u32 full = base + MSKV_H_BARS + 8 * s, stage = base + 2 * MSKV_H_QB + s * MSKV_H_SB;
            while (!mskv_mbar_try_wait(full + 8 * MSKV_H_STAGES, ((i / MSKV_H_STAGES) & 1) ^ 1)) {}
            if (use_tma && key0 + MSKV_H_BN <= kvl)
                mskv_h_load_tma(&k_map, &v_map, pages, page_size, kvh, key0 + (pages ? 0 : krow0), stage, full, tid);
            else
                mskv_h_load_rows((const unsigned char *)k_pool, (const unsigned char *)v_pool, pages, krow0, page_size,
                                 kv_heads, kvh, kvl, key0, sbase + (stage - base), full, tid, team);
        }
    } else {
        mskv_h_cons c;
        const int cw = mskv_bcast0(wg - 1), t = tid & 127, warp = t >> 5, lane = tid & 31, g = lane >> 2;
        mskv_setmaxnreg_inc<MSKV_H_REGS_CONSUMER>();
        c.cw = cw; c.t4 = lane & 3; c.leader = MSKV_H_RELEASERS == 8 ? lane == 0 : t == 0; c.scale_log2 = scale_log2;
        c.h0 = h0; c.hlen = (mskv_u32)(h1 - h0);
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
            const int qpos = mskv_q_pos(q_pos ? q_pos + q0 : 0, Rc / group, kvl, qo_len, psplit, pshift);
            c.klo[h] = kb.split_lo;
            c.khi[h] = kb.split_hi;
            if (mask >= 1) {
                const int hi = mskv_first_at(qpos + 1, psplit, pshift);
                if (hi < c.khi[h]) c.khi[h] = hi;
            }
            if (mask == 2) {
                const int lo = mskv_first_at(qpos - window_left, psplit, pshift);
                if (lo > c.klo[h]) c.klo[h] = lo;
            }
            c.m[h] = mskv_neg_inf();
            c.l[h] = 0.0f;
        }
MSKV_UNROLL
        for (int i = 0; i < MSKV_H_PVN / 2; i++) c.o[i] = 0.0f;
        if (kb.n_tiles > 0) {
            int it = 1;
            if (cw == 1) mskv_bar_arrive(4, 256);   /* consumer 0 takes the first turn */
            if (kb.n_masked > 0) mskv_h_turn<1, 1>(c, 0, mskv_h_tile_key(kb, 0));
            else mskv_h_turn<0, 1>(c, 0, mskv_h_tile_key(kb, 0));
            for (; it < kb.n_masked; it++) mskv_h_turn<1, 0>(c, it, mskv_h_tile_key(kb, it));
            /* whole tiles: the consumers need no key (only the producer does) */
            for (; it < kb.n_tiles; it++) mskv_h_turn<0, 0>(c, it, 0);
            mskv_h_last_turn(c, kb.n_tiles);
        }
        /* the row sums: from the ones columns, else the 4 lanes of a row add theirs; write O / l and the LSE */
        for (int h = 0; h < 2; h++) {
#if MSKV_H_ONES
            c.l[h] = c.o[MSKV_D / 2 + 2 * h];
#else
            c.l[h] += mskv_shfl_xor(c.l[h], 1);
            c.l[h] += mskv_shfl_xor(c.l[h], 2);
#endif
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
#undef MSKV_MT
#undef MSKV_BM
#undef MSKV_BN
#undef MSKV_WK
#undef MSKV_STAGES
#undef MSKV_WM
#undef MSKV_CH
#undef MSKV_ROWB
#undef MSKV_NT
#undef MSKV_QREG
#undef MSKV_TPR
#undef MSKV_CPT
#undef MSKV_TILE_BYTES
#undef MSKV_STAGE_BYTES
#undef MSKV_Q_PARKED
#undef MSKV_Q_BYTES
#undef MSKV_Q_OFF
#undef MSKV_ATTN_SMEM
#undef MSKV_MERGE_LD
#undef MSKV_ONE2
#undef MSKV_LSUM
#undef MSKV_LROW
#undef MSKV_SM90A
#undef MSKV_H_BN
#undef MSKV_H_STAGES
#undef MSKV_H_THREADS
#undef MSKV_H_BM
#undef MSKV_H_QB
#undef MSKV_H_TB
#undef MSKV_H_SB
#undef MSKV_H_OB
#undef MSKV_H_PVN
#undef MSKV_H_ONES
#undef MSKV_H_BARS
#undef MSKV_H_SMEM
#undef MSKV_H_REGS_PRODUCER
#undef MSKV_H_RELEASERS
#undef MSKV_SM90_PLANT_LEADER_RELEASE
#undef MSKV_H_REGS_CONSUMER
#undef MSKV_CAT2
#undef MSKV_CAT
#undef MSKV_WGMMA_S
#undef MSKV_WGMMA_PV
#endif
