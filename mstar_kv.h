/* mstar_kv.h - v0.1.0 - a paged KV cache for windowed autoregressive video
   diffusion and LLM decode, in one C99 header.

   It owns the whole life of a KV cache: which physical pages hold which tokens
   of which request, which pages may be freed as the attention window slides,
   what survives every release (the prompt, the sink frames), how a request is
   parked in host memory and brought back, the per-step plans (CSR page
   tables, slot mappings, RoPE positions) that attention kernels consume, and
   a CPU backend (K/V write, paged attention, RoPE, LSE merge) that serves as
   the reference for the GPU kernels of mstar_kv_cuda.h.

   Do this in exactly one C or C++ file:
       #define MSTAR_KV_IMPLEMENTATION
       #include "mstar_kv.h"
   and include it plainly everywhere else. Build:
       cc -std=c99 -O2 app.c -lpthread -lm
   (with mstar_kv_cuda.h as well: cc -std=c99 -O2 app.c -ldl -lpthread -lm)

   Options, defined before the implementation include:
     MSKV_STATIC                 make every function static (private copy per file)
     MSKV_MALLOC(sz,u) / MSKV_REALLOC(p,sz,u) / MSKV_FREE(p,u)
                                 compile-time allocator; define all three or none.
                                 A run-time allocator (mskv_allocator) in a
                                 descriptor overrides them for that object.
     MSKV_ASSERT(x)              internal consistency checks (default: assert.h)
     MSKV_NO_THREADS             no pthreads: no internal lock, no worker threads

   Example:
       mskv_arena_desc d = {0};            // zero means defaults
       d.num_pages = 1024; d.page_size = 16;
       d.num_layers = 1; d.kv_heads = 8; d.head_dim = 128; d.dtype = MSKV_DTYPE_BF16;
       mskv_arena *a; mskv_request r;
       if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) ...;
       mskv_request_add(a, &r);
       mskv_segment seg = { r, 100 };       // 100 new tokens this step
       mskv_admit(a, &seg, 1);              // reserve pages, all or nothing
       mskv_plan_build(a, &seg, 1, &plan_desc, &plan);   // page table, slots, positions
       ... write K/V through plan.slot_mapping, attend over the plan ...
       mskv_commit(a, &seg, 1);
       mskv_publish(a, &seg, 1, NULL);      // retention, events, end of step

   Conventions: every fallible function returns mskv_result; a failed call
   changes nothing. mskv_result_string() names the failure; the logger callback
   (if set) receives the details. Zero-initialised descriptors mean defaults.

   License: MIT, at the end of this file.
*/
#ifndef MSTAR_KV_H
#define MSTAR_KV_H

#include <stddef.h>
#include <stdint.h>

#define MSKV_VERSION_MAJOR 0
#define MSKV_VERSION_MINOR 1
#define MSKV_VERSION_PATCH 0

#ifdef MSKV_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define MSKV_API static __attribute__((unused)) /* a private copy need not use every function */
#else
#define MSKV_API static
#endif
#else
#define MSKV_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* // >>results ------------------------------------------------------------ */

typedef enum mskv_result {
    MSKV_SUCCESS = 0,
    /* the caller's arguments */
    MSKV_ERROR_INVALID_ARGUMENT = -1,  /* a value out of its domain (zero page size, bad enum, ...) */
    MSKV_ERROR_NULL_POINTER = -2,      /* a required pointer is NULL */
    MSKV_ERROR_INVALID_HANDLE = -3,    /* unknown request, or removed (stale generation) */
    MSKV_ERROR_OUT_OF_RANGE = -4,      /* a count or position past the end (release past committed, protect beyond resident) */
    MSKV_ERROR_RELEASED = -5,          /* the position's page was released */
    MSKV_ERROR_NOT_WRITTEN = -6,       /* the position is neither committed nor reserved */
    MSKV_ERROR_CAPACITY = -7,          /* a caller buffer is too small (plan, blob) */
    MSKV_ERROR_INVALID_SPEC = -8,      /* an inconsistent window schedule or retention policy */
    MSKV_ERROR_DUPLICATE = -9,         /* a request twice in one batch, or a key that exists */
    MSKV_ERROR_NOT_FOUND = -10,        /* no keyed entry with this key */
    /* the request's state */
    MSKV_ERROR_OFFLOADED = -20,        /* needs resident pages, the request is offloaded */
    MSKV_ERROR_NOT_OFFLOADED = -21,    /* reload of a resident request */
    MSKV_ERROR_RESERVATION_PENDING = -22, /* admit/fork/offload while a reservation is open */
    MSKV_ERROR_NO_RESERVATION = -23,   /* commit or abort without an open reservation */
    MSKV_ERROR_READ_ONLY = -24,        /* a sealed keyed entry, or a forbidden change to it */
    MSKV_ERROR_BAD_STATE = -25,        /* any other operation the request's state forbids */
    /* resources */
    MSKV_ERROR_OUT_OF_PAGES = -40,     /* not enough free pages: nothing was allocated */
    MSKV_ERROR_OUT_OF_MEMORY = -41,    /* the allocator returned NULL */
    MSKV_ERROR_OVERFLOW = -42,         /* a size product does not fit */
    MSKV_ERROR_TOO_MANY_REQUESTS = -43,
    /* data */
    MSKV_ERROR_BLOB_TRUNCATED = -60,
    MSKV_ERROR_BLOB_CORRUPT = -61,     /* bad magic or checksum */
    MSKV_ERROR_BLOB_VERSION = -62,     /* written by an incompatible version */
    MSKV_ERROR_BLOB_MISMATCH = -63,    /* page size, layers, heads, dim or dtype differ from the arena */
    MSKV_ERROR_AUDIT_FAILED = -64,     /* an invariant does not hold (a library bug, or memory corruption) */
    /* platform */
    MSKV_ERROR_UNSUPPORTED = -80,
    MSKV_ERROR_THREAD = -81,
    MSKV_ERROR_IO = -82,
    MSKV_ERROR_CUDA_UNAVAILABLE = -83, /* no driver, no device or no NVRTC: use the CPU backend */
    MSKV_ERROR_CUDA = -84,             /* a driver call failed */
    MSKV_ERROR_NVRTC = -85             /* kernel compilation failed; the log went to the logger */
} mskv_result;

/* A static, human-readable description; never NULL. */
MSKV_API const char *mskv_result_string(mskv_result r);

typedef enum mskv_log_level {
    MSKV_LOG_DEBUG = 0, MSKV_LOG_INFO = 1, MSKV_LOG_WARN = 2, MSKV_LOG_ERROR = 3
} mskv_log_level;

typedef void (*mskv_log_fn)(void *user, mskv_log_level level, const char *message);

/* Run-time allocator. All three functions or none (NULL = MSKV_MALLOC etc.). */
typedef struct mskv_allocator {
    void *user;
    void *(*alloc)(void *user, size_t size);
    void *(*realloc)(void *user, void *ptr, size_t size);
    void (*free)(void *user, void *ptr);
} mskv_allocator;

typedef enum mskv_dtype {
    MSKV_DTYPE_F32 = 0,   /* the default */
    MSKV_DTYPE_F16 = 1,   /* IEEE binary16 */
    MSKV_DTYPE_BF16 = 2   /* bfloat16, round to nearest even on store */
} mskv_dtype;

MSKV_API size_t mskv_dtype_size(mskv_dtype t);   /* 4, 2, 2; 0 for an unknown dtype */

/* // >>arena -------------------------------------------------------------- */

typedef struct mskv_arena mskv_arena;

/* A request handle: index + generation, so a handle kept after remove is caught. */
typedef struct mskv_request { uint32_t id; } mskv_request;

typedef enum mskv_event_type {
    MSKV_EVENT_PAGE_STORED = 1,   /* a page became full of committed tokens (published) */
    MSKV_EVENT_PAGE_REMOVED = 2   /* a request dropped its reference to a page */
} mskv_event_type;

typedef struct mskv_event {
    mskv_event_type type;
    mskv_request request;
    int32_t page;          /* physical page id */
    int64_t first_token;   /* absolute position of the page's first slot */
    uint64_t step;         /* the fence of the step in which it happened */
} mskv_event;

typedef void (*mskv_event_fn)(void *user, const mskv_event *event);

/* Where the K/V bytes of pages live when they are not in the arena's own host
   store (the GPU layer provides this). Host copies use the page-major layout
   [page][layer][K then V][slot][kv_head][dim]. Every function is synchronous
   with respect to the bytes it returns or consumes. */
typedef struct mskv_store_ops {
    void *user;
    mskv_result (*read_pages)(void *user, const int32_t *pages, int32_t n, void *dst);
    mskv_result (*write_pages)(void *user, const int32_t *pages, int32_t n, const void *src);
    mskv_result (*copy_page)(void *user, int32_t src_page, int32_t dst_page);
} mskv_store_ops;

typedef enum mskv_retire_mode {
    MSKV_RETIRE_IMMEDIATE = 0, /* freed pages are reusable at once (CPU backend) */
    MSKV_RETIRE_FENCED = 1     /* freed pages wait until mskv_arena_retire(fence) (GPU) */
} mskv_retire_mode;

typedef struct mskv_arena_desc {
    int32_t num_pages;      /* pages in all, including the null page 0; >= 2 */
    int32_t page_size;      /* tokens per page; >= 1, any value */
    int32_t max_requests;   /* 0 = 256; at most 65535 */
    /* Host K/V store: num_layers == 0 means bookkeeping only (no bytes). */
    int32_t num_layers;
    int32_t kv_heads;
    int32_t head_dim;
    mskv_dtype dtype;
    const mskv_store_ops *store_ops;  /* non-NULL: bytes live elsewhere (no host pools) */
    mskv_retire_mode retire_mode;
    mskv_allocator allocator;
    mskv_allocator host_allocator;    /* host copies of offloaded requests (pinned or caching); all NULL = allocator */
    mskv_log_fn log;
    void *log_user;
    mskv_event_fn on_event;
    void *event_user;
} mskv_arena_desc;

typedef struct mskv_arena_stats {
    int32_t num_pages;        /* total, including the null page */
    int32_t free_pages;
    int32_t live_pages;       /* referenced by at least one request */
    int32_t protected_pages;  /* live pages inside some request's protected prefix */
    int32_t pending_pages;    /* freed, waiting for their fence */
    int64_t offloaded_pages;  /* pages held in host copies of offloaded requests */
    int32_t requests;
    uint64_t step;            /* the current fence (step number) */
    uint64_t completed_step;  /* highest fence retired */
} mskv_arena_stats;

/* Creates an arena. Parameters: desc (zero fields = defaults), out.
   Return value: MSKV_SUCCESS, or INVALID_ARGUMENT / OVERFLOW / OUT_OF_MEMORY.
   Thread safety: the arena's functions may be called from several threads. */
MSKV_API mskv_result mskv_arena_create(const mskv_arena_desc *desc, mskv_arena **out);
MSKV_API void mskv_arena_destroy(mskv_arena *arena);
MSKV_API mskv_result mskv_arena_stats_get(mskv_arena *arena, mskv_arena_stats *out);
/* Checks every invariant; on failure returns MSKV_ERROR_AUDIT_FAILED and writes
   which one broke into why (why may be NULL). */
MSKV_API mskv_result mskv_arena_audit(mskv_arena *arena, char *why, size_t why_cap);
/* A hash of the whole bookkeeping state (pages, requests, reservations, host
   copies, keys): equal digests mean nothing changed. */
MSKV_API uint64_t mskv_arena_digest(mskv_arena *arena);
/* Pages freed during fences <= completed become reusable (FENCED mode). */
MSKV_API mskv_result mskv_arena_retire(mskv_arena *arena, uint64_t completed);
/* The current fence: pages freed now are tagged with it. */
MSKV_API uint64_t mskv_arena_step(mskv_arena *arena);

/* Host store geometry and pools (NULL pools when num_layers == 0 or store_ops). */
typedef struct mskv_store_info {
    int32_t num_layers, kv_heads, head_dim, page_size, num_pages;
    mskv_dtype dtype;
    size_t elem_size;
    size_t slot_bytes;    /* kv_heads * head_dim * elem_size */
    size_t page_bytes;    /* page_size * slot_bytes: one page of one layer of K (or V) */
    size_t pool_bytes;    /* num_pages * page_bytes */
} mskv_store_info;

MSKV_API mskv_result mskv_store_info_get(mskv_arena *arena, mskv_store_info *out);
/* Pool of one layer, layout [page][slot][kv_head][dim]. kind 0 = K, 1 = V. */
MSKV_API void *mskv_store_pool(mskv_arena *arena, int32_t layer, int kind);

/* // >>requests ----------------------------------------------------------- */

typedef enum mskv_location { MSKV_RESIDENT = 0, MSKV_OFFLOADED = 1 } mskv_location;

typedef struct mskv_request_info {
    int64_t committed;      /* tokens 0..committed-1 are part of the sequence */
    int64_t reserved;       /* tokens reserved by an open admit, after committed */
    int32_t has_reservation;
    int64_t prefix_tokens;  /* protected prefix length */
    int32_t prefix_pages;   /* pages at the front of the table holding the prefix */
    int64_t live_start;     /* absolute position of the first token after the prefix pages */
    int32_t num_pages;      /* entries in the page table */
    int64_t kv_len;         /* tokens the kernels see: prefix pages + live (incl. reserved) */
    uint64_t prefix_epoch;
    mskv_location location;
    int32_t keyed;          /* a keyed (cross-attention) entry */
    int32_t sealed;
} mskv_request_info;

MSKV_API mskv_result mskv_request_add(mskv_arena *arena, mskv_request *out);
/* Every page goes back (pending until the current fence retires). */
MSKV_API mskv_result mskv_request_remove(mskv_arena *arena, mskv_request req);
/* A child sharing the parent's full pages (refcounted); the partial last page
   is copied. The parent must be resident without an open reservation. */
MSKV_API mskv_result mskv_request_fork(mskv_arena *arena, mskv_request parent, mskv_request *child);
/* Size the request's page table for `tokens` tokens now, so steps up to that
   length never allocate. Changes no state. */
MSKV_API mskv_result mskv_request_reserve(mskv_arena *arena, mskv_request req, int64_t tokens);
MSKV_API mskv_result mskv_request_info_get(mskv_arena *arena, mskv_request req, mskv_request_info *out);
/* The page table, [prefix pages][live pages]; *count is set to the number of
   entries even when cap is too small (then MSKV_ERROR_CAPACITY); pages == NULL
   with cap == 0 is a size query. */
MSKV_API mskv_result mskv_request_pages(mskv_arena *arena, mskv_request req, int32_t *pages, int32_t cap, int32_t *count);
/* Protect the first n committed tokens (their pages whole) against release.
   Changing the length moves prefix_epoch. With released pages behind the
   prefix, n must keep the same prefix pages. */
MSKV_API mskv_result mskv_request_protect_prefix(mskv_arena *arena, mskv_request req, int64_t n);
/* Release the n oldest live tokens: the release point is live_start + n
   (<= committed). Only pages whose every slot lies before it are freed (page
   floor); *released (optional) gets the tokens actually freed. */
MSKV_API mskv_result mskv_request_release_oldest(mskv_arena *arena, mskv_request req, int64_t n, int64_t *released);
/* slot = page * page_size + offset of absolute position pos. RELEASED for a
   released position, NOT_WRITTEN past committed + reserved. */
MSKV_API mskv_result mskv_request_slot(mskv_arena *arena, mskv_request req, int64_t pos, int64_t *slot);

/* // >>offload ------------------------------------------------------------ */

/* Copy every resident page (all layers, K and V) to host memory owned by the
   request, then free the pages. Needs no open reservation. */
MSKV_API mskv_result mskv_request_offload(mskv_arena *arena, mskv_request req);
/* All or nothing: fresh pages (possibly other ids), bytes copied back,
   prefix_epoch moves. OUT_OF_PAGES changes nothing and keeps the host copy. */
MSKV_API mskv_result mskv_request_reload(mskv_arena *arena, mskv_request req);
/* Serialise a request (offloaded or resident) into a versioned, checksummed
   blob. buf may be NULL to query the size; *size always gets the size needed. */
MSKV_API mskv_result mskv_request_export(mskv_arena *arena, mskv_request req, void *buf, size_t cap, size_t *size);
/* A new, offloaded request from a blob; reload it to use it. */
MSKV_API mskv_result mskv_request_import(mskv_arena *arena, const void *blob, size_t size, mskv_request *out);

/* // >>windows ------------------------------------------------------------ */

/* Window schedule over `total` units (frames or tokens): window k denoises
   [k*stride, k*stride + window), stride = window - overlap. */
typedef struct mskv_schedule {
    int64_t total, window, overlap, stride, count;
} mskv_schedule;

typedef struct mskv_window {
    int64_t index;
    int64_t start, end;             /* [start, end): what the window denoises; end may pass total */
    int64_t cond_start, cond_end;   /* conditioning: the previous window's tail (empty for window 0) */
    int64_t commit_start, commit_end; /* what it adds, clamped to total; the spans tile [0, total) */
    int64_t pad;                    /* end - total when the last window passes the end, else 0 */
} mskv_window;

typedef struct mskv_decode_span {
    int64_t in_start, in_end;  /* units to decode: the commit span plus up to ctx units of left context */
    int64_t trim;              /* leading outputs (in units) to drop: in's context part */
} mskv_decode_span;

MSKV_API mskv_result mskv_schedule_init(mskv_schedule *s, int64_t total, int64_t window, int64_t overlap);
MSKV_API mskv_result mskv_schedule_window(const mskv_schedule *s, int64_t k, mskv_window *out);
MSKV_API mskv_result mskv_schedule_decode_span(const mskv_schedule *s, int64_t k, int64_t ctx, mskv_decode_span *out);

/* Chunk-window retention: keep `sink_chunks` leading chunks and the last
   `window_chunks` chunks (window_tokens must equal window_chunks*chunk_size,
   or be 0 = derive it). */
typedef struct mskv_retention {
    int64_t chunk_size;
    int64_t sink_chunks;
    int64_t window_chunks;
    int64_t window_tokens;
    int32_t reset_at_boundary;  /* drop everything past the sink at each completed chunk boundary */
    int32_t exact;              /* require chunk and sink to be page-aligned, so eviction is exact */
} mskv_retention;

/* Validates a policy against a page size (page_size 0 = skip alignment rules);
   the reason goes into why (optional). */
MSKV_API mskv_result mskv_retention_validate(const mskv_retention *r, int32_t page_size, char *why, size_t why_cap);
/* Tokens after the sink that are no longer needed once num_computed tokens
   exist: kept = [0, sink) + [sink + skipped, num_computed). Pure; 0 on an invalid policy. */
MSKV_API int64_t mskv_skipped_tokens(const mskv_retention *r, int64_t num_computed);
/* Bind a retention policy to a request (NULL clears it); publish applies it. */
MSKV_API mskv_result mskv_request_set_retention(mskv_arena *arena, mskv_request req, const mskv_retention *r);

/* // >>step lifecycle ----------------------------------------------------- */

/* One request's new tokens in this step. */
typedef struct mskv_segment {
    mskv_request request;
    int64_t n_tokens;
} mskv_segment;

/* All or nothing: every segment gets its tokens reserved (pages allocated), or
   none does. A request may appear once; it must be resident with no open reservation. */
MSKV_API mskv_result mskv_admit(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* Reserved tokens become committed. Every segment must have an open reservation. */
MSKV_API mskv_result mskv_commit(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* Return reservations without committing; their new pages are freed. */
MSKV_API mskv_result mskv_abort(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* End of step: for the given segments' requests, retention policies release
   pages and page-stored events are emitted; then the fence advances (also
   with n == 0). *step_out (optional) gets the fence that ended. */
MSKV_API mskv_result mskv_publish(mskv_arena *arena, const mskv_segment *segs, int32_t n, uint64_t *step_out);

typedef enum mskv_pos_mode {
    MSKV_POS_NONE = 0,   /* no position plan */
    MSKV_POS_1D = 1,     /* positions[i] = absolute position - pos_offset */
    MSKV_POS_3D = 2      /* positions[3i..3i+2] = (frame, row, col) of (abs - pos_offset) on a grid_h x grid_w frame */
} mskv_pos_mode;

typedef enum mskv_plan_kind {
    MSKV_PLAN_SELF = 0,   /* each segment attends over its own request's stream (incl. its reserved tokens) */
    MSKV_PLAN_CROSS = 1,  /* each segment attends over the keyed entry `cross` */
    MSKV_PLAN_DENSE = 2   /* no page table: kv_token_indptr over contiguous K/V of kv_len tokens per segment */
} mskv_plan_kind;

typedef struct mskv_plan_desc {
    mskv_plan_kind kind;
    mskv_request cross;          /* for MSKV_PLAN_CROSS */
    const int64_t *dense_kv_len; /* for MSKV_PLAN_DENSE: kv tokens per segment */
    mskv_pos_mode pos_mode;
    int64_t pos_offset;
    int32_t grid_h, grid_w;      /* tokens per frame = grid_h * grid_w (3-D) */
} mskv_plan_desc;

/* The kernels' view of one step. Arrays are caller-owned (fixed capacity, so
   a captured graph replays at the same addresses) or plan-owned (mskv_plan_alloc).
   Query i of segment b (0 <= i < qo_len) is the token at compacted index
   kv_len - qo_len + i of its sequence (queries are the tail). Compacted index
   j has absolute position j < kv_pos_split[b] ? j : j + kv_pos_shift[b]. */
typedef struct mskv_plan {
    int32_t batch, total_q, num_page_ids, page_size;
    int32_t *qo_indptr;        /* [batch+1] */
    int32_t *kv_indptr;        /* [batch+1] into kv_indices */
    int32_t *kv_indices;       /* [num_page_ids] physical pages */
    int32_t *kv_last_page_len; /* [batch], 1..page_size (0 only for a sequence with no pages) */
    int32_t *kv_len;           /* [batch] tokens per sequence */
    int32_t *kv_pos_split;     /* [batch] */
    int32_t *kv_pos_shift;     /* [batch] */
    int64_t *kv_token_indptr;  /* [batch+1] dense path: prefix sums of kv_len */
    int64_t *slot_mapping;     /* [total_q] page*page_size+offset of each new token; -1 = none (cross/dense) */
    int32_t *positions;        /* [total_q] (1-D) or [3*total_q] (3-D) */
    /* capacities of the arrays above (caller-owned mode) */
    int32_t cap_batch, cap_tokens, cap_page_ids;
    uint64_t step;             /* the fence the plan was built in */
    void *owned;               /* set by mskv_plan_alloc */
} mskv_plan;

typedef struct mskv_plan_size {
    int32_t batch, total_q, num_page_ids;
} mskv_plan_size;

MSKV_API mskv_result mskv_plan_query(mskv_arena *arena, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan_size *out);
/* Fills the plan's arrays. CAPACITY (nothing written) when a cap is too small. */
MSKV_API mskv_result mskv_plan_build(mskv_arena *arena, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan *plan);
/* Allocate arrays of the given capacities (through the arena's allocator). */
MSKV_API mskv_result mskv_plan_alloc(mskv_arena *arena, int32_t cap_batch, int32_t cap_tokens, int32_t cap_page_ids, mskv_plan *plan);
MSKV_API void mskv_plan_free(mskv_arena *arena, mskv_plan *plan);
/* Checks the CSR invariants: monotone indptrs, indices in [1, num_pages),
   last_page_len rule, kv_len consistent with pages. why gets the broken rule. */
MSKV_API mskv_result mskv_plan_validate(const mskv_plan *plan, int32_t num_pages, char *why, size_t why_cap);

/* Keyed, write-once K/V (cross-attention, e.g. text-encoder output): created
   with its tokens reserved, written through a plan, sealed, then read by any
   number of requests' plans. Removal waits for the fence like any free. */
MSKV_API mskv_result mskv_keyed_create(mskv_arena *arena, uint64_t key, int64_t n_tokens, mskv_request *out);
MSKV_API mskv_result mskv_keyed_seal(mskv_arena *arena, mskv_request entry);
MSKV_API mskv_result mskv_keyed_find(mskv_arena *arena, uint64_t key, mskv_request *out);
MSKV_API mskv_result mskv_keyed_remove(mskv_arena *arena, uint64_t key);

/* Windowed session: binds a request to a retention policy and does the
   protect/release bookkeeping. begin_chunk reserves a chunk's tokens (admit);
   the model writes K/V through mskv_session_plan's slots and attends; after
   the last denoise step, commit_chunk commits, protects the sink once it is
   complete and releases what fell out of the window. */
typedef struct mskv_session {
    mskv_arena *arena;
    mskv_request request;
    mskv_retention retention;
    int64_t chunk_tokens;   /* the open chunk's tokens, 0 when none */
    int64_t chunks_done;
    int64_t released_total; /* tokens released so far */
} mskv_session;

MSKV_API mskv_result mskv_session_init(mskv_session *s, mskv_arena *arena, mskv_request req, const mskv_retention *r);
MSKV_API mskv_result mskv_session_begin_chunk(mskv_session *s, int64_t n_tokens);
MSKV_API mskv_result mskv_session_plan(mskv_session *s, const mskv_plan_desc *desc, mskv_plan *plan);
MSKV_API mskv_result mskv_session_commit_chunk(mskv_session *s, uint64_t *step_out);
MSKV_API mskv_result mskv_session_abort_chunk(mskv_session *s);

/* // >>cpu backend -------------------------------------------------------- */
#include "wip/mskv_cpu_decl.h"

#ifdef __cplusplus
}
#endif
#endif /* MSTAR_KV_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#ifdef MSTAR_KV_IMPLEMENTATION
#ifndef MSTAR_KV_IMPLEMENTED
#define MSTAR_KV_IMPLEMENTED
#include "wip/mskv_core_impl.h"
#include "wip/mskv_cpu_impl.h"
#endif /* MSTAR_KV_IMPLEMENTED */
#endif /* MSTAR_KV_IMPLEMENTATION */
