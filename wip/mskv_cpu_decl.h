/* CPU backend: public declarations (inlined into mstar_kv.h's >>cpu backend section).

   The host side of everything the GPU kernels do, and their test oracle:
   K/V write through a plan's slot mapping (optionally with RoPE on K), paged
   attention over a plan (GQA, bidirectional / causal / sliding window,
   O and natural-log LSE), RoPE (1-D, 3-D), and the LSE merge of two partial
   results. Storage and Q/O in f32, f16 or bf16; accumulation in f32. */

#define MSKV_CPU_MAX_HEAD_DIM 256  /* the backend's head_dim limit (tiles are sized for it) */

/* Half <-> float conversions used by the store (round to nearest even;
   inf and NaN are kept, overflow goes to inf). */
MSKV_API uint16_t mskv_f32_to_f16(float x);
MSKV_API float mskv_f16_to_f32(uint16_t h);
MSKV_API uint16_t mskv_f32_to_bf16(float x);
MSKV_API float mskv_bf16_to_f32(uint16_t h);

typedef enum mskv_rope_style {
    MSKV_ROPE_HALF = 0,        /* pairs (x[i], x[i + w/2]) within a part of width w */
    MSKV_ROPE_INTERLEAVED = 1  /* pairs (x[2i], x[2i + 1]) within a part */
} mskv_rope_style;

/* RoPE: the pair i of a rotated part of width w turns by pos * theta^(-2i/w):
   (a, b) -> (a cos - b sin, a sin + b cos).
   1-D (positions [n]): one part, dims[0] wide (0 = head_dim rounded down to
   even), at the start of the head. 3-D (positions [n][3] = frame, row, col):
   three consecutive parts of widths dims[0..2] (all 0 = the split
   2*(p - 2*(p/3)), 2*(p/3), 2*(p/3) with p = head_dim/2 pairs), each rotated
   by its own axis' position. Dims past the rotated parts are left alone.
   Widths must be even and add up to at most head_dim. */
typedef struct mskv_rope {
    mskv_rope_style style;
    mskv_pos_mode mode;       /* MSKV_POS_1D or MSKV_POS_3D */
    float theta;              /* 0 = 10000 */
    int32_t dims[3];
} mskv_rope;

/* Rotate x [n][heads][head_dim] (dtype) in place by positions ([n] or [n][3]).
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (mode, style, widths,
   head_dim > MSKV_CPU_MAX_HEAD_DIM). Thread safety: reentrant. */
MSKV_API mskv_result mskv_rope_apply(const mskv_rope *rope, void *x, mskv_dtype dtype, int64_t n, int32_t heads, int32_t head_dim, const int32_t *positions);

/* Thread pool and per-thread scratch for large CPU calls. The caller's thread
   is worker 0; num_threads - 1 threads are started. Calls below a few MFLOP
   run on the caller alone. Concurrent calls on one mskv_cpu are serialised.
   Work items are (sequence, block of up to 64 query rows, kv head); a
   single sequence's keys are not split across threads. */
typedef struct mskv_cpu mskv_cpu;
typedef struct mskv_cpu_desc {
    int32_t num_threads;      /* 0 = 1 (MSKV_NO_THREADS: always 1) */
    size_t workspace_bytes;   /* per thread; 0 = the largest tiles (about 280 KB); a
                                 smaller budget picks smaller tiles (at least about 55 KB) */
    mskv_allocator allocator;
} mskv_cpu_desc;
/* Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT, OVERFLOW, OUT_OF_MEMORY, THREAD. */
MSKV_API mskv_result mskv_cpu_create(const mskv_cpu_desc *desc, mskv_cpu **out);
MSKV_API void mskv_cpu_destroy(mskv_cpu *cpu);

/* Scatter new rows k,v [plan->total_q][kv_heads][head_dim] (dtype `src_dtype`)
   into layer `layer` of the arena's host store through plan->slot_mapping
   (slots < 0 are skipped). rope (optional) is applied to K on the way in,
   at plan->positions ([total_q] for 1-D, [total_q][3] for 3-D).
   Every slot is checked first (inside the pool, not the null page 0):
   OUT_OF_RANGE and nothing written otherwise. UNSUPPORTED when the arena has
   no host pools. */
MSKV_API mskv_result mskv_cpu_write_kv(mskv_arena *arena, int32_t layer, const mskv_plan *plan, const void *k, const void *v, mskv_dtype src_dtype, const mskv_rope *rope);

typedef enum mskv_mask {
    MSKV_MASK_NONE = 0,    /* bidirectional: every query sees its whole sequence */
    MSKV_MASK_CAUSAL = 1,  /* key position <= query position (absolute positions) */
    MSKV_MASK_WINDOW = 2   /* causal and query - key <= window_left */
} mskv_mask;

typedef struct mskv_attn {
    int32_t q_heads;          /* a multiple of the store's kv_heads (GQA: q head h reads kv head h / (q_heads / kv_heads)) */
    float scale;              /* 0 = 1/sqrt(head_dim) */
    mskv_mask mask;
    int32_t window_left;      /* MSKV_MASK_WINDOW: >= 0 */
    mskv_dtype q_dtype;       /* dtype of q and o */
} mskv_attn;

/* Paged attention over a plan, for one layer of the host store.
   q: [plan->total_q][q_heads][head_dim]; o: same shape; lse (optional):
   [total_q][q_heads], natural log. A query that sees no key: o = 0, lse = -inf.
   Accumulation in f32. Only the pages in the plan's table are read, and only
   their first kv_len slots. o must not overlap q. cpu may be NULL: one thread, small tiles on the
   stack (about 50 KB), no allocation. A masked plan (CAUSAL, WINDOW) needs
   qo_len <= kv_len per segment and kv_pos_shift >= 0.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (heads, dtype, mask,
   an inconsistent plan), OUT_OF_RANGE (a page outside the pool),
   UNSUPPORTED (no host pools). Nothing is written on failure. */
MSKV_API mskv_result mskv_cpu_attention(mskv_cpu *cpu, mskv_arena *arena, int32_t layer, const mskv_plan *plan, const mskv_attn *attn, const void *q, void *o, float *lse);

/* The same, on raw pools (no arena): k/v [num_pages][page_size][kv_heads][head_dim]. */
typedef struct mskv_pools {
    const void *k, *v;
    mskv_dtype dtype;
    int32_t num_pages, page_size, kv_heads, head_dim;
} mskv_pools;
MSKV_API mskv_result mskv_cpu_attention_pools(mskv_cpu *cpu, const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn, const void *q, void *o, float *lse);
/* mskv_cpu_write_kv on raw pools: pools->k and pools->v must point at writable memory. */
MSKV_API mskv_result mskv_cpu_write_kv_pools(const mskv_pools *pools, const mskv_plan *plan, const void *k, const void *v, mskv_dtype src_dtype, const mskv_rope *rope);

/* Merge two partial results over disjoint key sets into (o, lse) over their union:
   [n][heads][head_dim] f32 and [n][heads]. Empty parts (lse = -inf) are neutral;
   both empty gives o = 0, lse = -inf. o/lse may alias a or b. */
MSKV_API mskv_result mskv_cpu_merge(int64_t n, int32_t heads, int32_t head_dim, const float *o_a, const float *lse_a, const float *o_b, const float *lse_b, float *o, float *lse);
