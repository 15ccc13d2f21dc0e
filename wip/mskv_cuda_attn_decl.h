/* GPU attention, merge and RoPE launch wrappers: public declarations (part of
   mstar_kv_cuda.h's >>attention wrappers section). C99 and C++, no CUDA headers. */

/* How one attention call is laid out on the device. Pure arithmetic (no
   device): the wrapper uses it, and a caller can size its workspace or check
   what a CUDA graph will launch. */
typedef struct mskv_cuda_attn_geometry {
    int32_t decode;          /* 1: decode layout (16 rows per block, warps split the keys) */
    int32_t block_rows;      /* BM: rows (query x q head of a group) per block */
    int32_t block_keys;      /* BN: keys per K/V tile */
    uint32_t grid[3];        /* row tiles, segments, kv_heads * n_splits */
    uint32_t block_threads;  /* 128 */
    uint32_t smem_bytes;     /* dynamic shared memory */
    int32_t n_splits;        /* key splits (flash-decoding); 1 = none */
    int32_t kv_chunk;        /* keys per split (a multiple of block_keys) */
    size_t workspace_bytes;  /* f32 partial o and lse when n_splits > 1, else 0 */
} mskv_cuda_attn_geometry;

/* Parameters: the plan's sizes (batch, total_q, the longest qo_len and
   kv_len of a segment), heads, head_dim (64, 128, 256), the device's SM count
   and opt-in shared memory per block (0 = 99 KiB, what every sm_80+ part has).
   Splits are chosen so that about two waves of blocks fill the SMs when the
   (segment, kv head, row tile) blocks alone would not.
   Return value: SUCCESS, INVALID_ARGUMENT (heads, head_dim), OVERFLOW. */
MSKV_API mskv_result mskv_cuda_attn_geometry_get(int32_t batch, int32_t total_q, int32_t max_qo_len,
                                                 int32_t max_kv_len, int32_t q_heads, int32_t kv_heads,
                                                 int32_t head_dim, int32_t multiprocessors,
                                                 int32_t max_smem_bytes, mskv_cuda_attn_geometry *out);

/* Paged attention over a plan for one layer of the store, on the store's
   stream (tensor cores: the store's dtype must be F16 or BF16, and
   attn->q_dtype the same). plan: the host plan (for its sizes); dplan: the
   same plan uploaded by mskv_cuda_plan_upload (a paged plan: the dense
   form has no page table). q (16-byte aligned), o: device
   [total_q][q_heads][head_dim]; lse (0 = none): device f32 [total_q][q_heads],
   natural log. Masked plans need kv_pos_split/shift (positions must not
   decrease along a sequence: kv_pos_shift >= 0). Semantics are mskv_cpu_attention's: masks on absolute
   positions, GQA, a query that sees no key gets o = 0 and lse = -inf.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT, OUT_OF_RANGE (layer),
   UNSUPPORTED (f32 store, head_dim), CUDA, NVRTC (first use compiles). */
MSKV_API mskv_result mskv_cuda_attention(mskv_cuda_store *st, int32_t layer, const mskv_plan *plan,
                                         const mskv_cuda_dplan *dplan, const mskv_attn *attn,
                                         mskv_cu_ptr q, mskv_cu_ptr o, mskv_cu_ptr lse);

/* mskv_cpu_merge on the device: two partial states over disjoint key sets
   (f32 [n][heads][head_dim] and [n][heads]) into their union; o/lse may alias
   a or b. head_dim 64, 128 or 256. */
MSKV_API mskv_result mskv_cuda_merge(mskv_cuda_store *st, int64_t n, int32_t heads, int32_t head_dim,
                                     mskv_cu_ptr o_a, mskv_cu_ptr lse_a, mskv_cu_ptr o_b, mskv_cu_ptr lse_b,
                                     mskv_cu_ptr o, mskv_cu_ptr lse);

/* mskv_rope_apply on the device: rotates x (device [n][heads][store
   head_dim], the store's dtype) in place at positions (device int32, [n] or
   [n][3] by rope->mode). */
MSKV_API mskv_result mskv_cuda_rope(mskv_cuda_store *st, const mskv_rope *rope, mskv_cu_ptr x, int64_t n,
                                    int32_t heads, mskv_cu_ptr positions);
