/* CPU backend: public declarations (inlined into mstar_kv.h's >>cpu backend section). */

/* Half <-> float conversions used by the store (round to nearest even). */
MSKV_API uint16_t mskv_f32_to_f16(float x);
MSKV_API float mskv_f16_to_f32(uint16_t h);
MSKV_API uint16_t mskv_f32_to_bf16(float x);
MSKV_API float mskv_bf16_to_f32(uint16_t h);

typedef enum mskv_rope_style {
    MSKV_ROPE_HALF = 0,        /* pairs (x[i], x[i + d/2]) */
    MSKV_ROPE_INTERLEAVED = 1  /* pairs (x[2i], x[2i + 1]) */
} mskv_rope_style;

/* RoPE: the pair i of a rotated part of width w turns by pos * theta^(-2i/w).
   1-D (positions [n]): one part, dims[0] wide (0 = head_dim), at the start of
   the head. 3-D (positions [n][3] = frame, row, col): three consecutive parts
   of widths dims[0..2] (all 0 = the split of 2*(p - 2*(p/3)), 2*(p/3), 2*(p/3)
   with p = head_dim/2 pairs), each rotated by its own axis' position. Dims
   past the rotated parts are left alone. Widths must be even. */
typedef struct mskv_rope {
    mskv_rope_style style;
    mskv_pos_mode mode;       /* MSKV_POS_1D or MSKV_POS_3D */
    float theta;              /* 0 = 10000 */
    int32_t dims[3];
} mskv_rope;

/* Rotate x [n][heads][head_dim] (dtype) in place by positions. */
MSKV_API mskv_result mskv_rope_apply(const mskv_rope *rope, void *x, mskv_dtype dtype, int64_t n, int32_t heads, int32_t head_dim, const int32_t *positions);

/* Thread pool for large CPU calls (0 or 1 threads = run in the caller). */
typedef struct mskv_cpu mskv_cpu;
typedef struct mskv_cpu_desc {
    int32_t num_threads;      /* 0 = 1 */
    size_t workspace_bytes;   /* 0 = enough for head_dim <= 256 on every thread */
    mskv_allocator allocator;
} mskv_cpu_desc;
MSKV_API mskv_result mskv_cpu_create(const mskv_cpu_desc *desc, mskv_cpu **out);
MSKV_API void mskv_cpu_destroy(mskv_cpu *cpu);

/* Scatter new rows k,v [n_tokens][kv_heads][head_dim] (dtype `src_dtype`)
   into layer `layer` of the arena's host store through plan->slot_mapping
   (slots < 0 are skipped). rope (optional) is applied to K on the way in,
   at plan->positions. */
MSKV_API mskv_result mskv_cpu_write_kv(mskv_arena *arena, int32_t layer, const mskv_plan *plan, const void *k, const void *v, mskv_dtype src_dtype, const mskv_rope *rope);

typedef enum mskv_mask {
    MSKV_MASK_NONE = 0,    /* bidirectional: every query sees its whole sequence */
    MSKV_MASK_CAUSAL = 1,  /* key position <= query position (absolute positions) */
    MSKV_MASK_WINDOW = 2   /* causal and query - key <= window_left */
} mskv_mask;

typedef struct mskv_attn {
    int32_t q_heads;          /* a multiple of the store's kv_heads (GQA) */
    float scale;              /* 0 = 1/sqrt(head_dim) */
    mskv_mask mask;
    int32_t window_left;
    mskv_dtype q_dtype;       /* dtype of q and o */
} mskv_attn;

/* Paged attention over a plan, for one layer of the host store.
   q: [plan->total_q][q_heads][head_dim]; o: same shape; lse (optional):
   [total_q][q_heads], natural log. A query that sees no key: o = 0, lse = -inf.
   Accumulation in f32. cpu may be NULL (single thread, no allocation beyond a
   stack workspace). */
MSKV_API mskv_result mskv_cpu_attention(mskv_cpu *cpu, mskv_arena *arena, int32_t layer, const mskv_plan *plan, const mskv_attn *attn, const void *q, void *o, float *lse);

/* The same, on raw pools (no arena): k_pool/v_pool [num_pages][page_size][kv_heads][head_dim]. */
typedef struct mskv_pools {
    const void *k, *v;
    mskv_dtype dtype;
    int32_t num_pages, page_size, kv_heads, head_dim;
} mskv_pools;
MSKV_API mskv_result mskv_cpu_attention_pools(mskv_cpu *cpu, const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn, const void *q, void *o, float *lse);

/* Merge two partial results over disjoint key sets into (o, lse) over their union:
   [n][heads][head_dim] f32 and [n][heads]. Empty parts (lse = -inf) are neutral.
   o/lse may alias a or b. */
MSKV_API mskv_result mskv_cpu_merge(int64_t n, int32_t heads, int32_t head_dim, const float *o_a, const float *lse_a, const float *o_b, const float *lse_b, float *o, float *lse);
