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
     MSKV_DEBUG                  every arena runs with every debug check
                                 (mskv_arena_desc.debug = MSKV_DEBUG_ALL, whatever
                                 its descriptor says): poisoned free pages,
                                 checksummed host copies

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
   Every call that takes a NULL required pointer returns
   MSKV_ERROR_NULL_POINTER, and a removed or foreign request handle
   MSKV_ERROR_INVALID_HANDLE; the lists below name the other codes.
   When several things are wrong at once, the code is the first that
   applies in this order: NULL_POINTER; INVALID_HANDLE and DUPLICATE (a
   batch's segments are all looked up first, in order); INVALID_ARGUMENT or
   OVERFLOW for a value wrong by itself (out of its domain, too large); the
   request's state: OFFLOADED or NOT_OFFLOADED, then RESERVATION_PENDING or
   NO_RESERVATION, then READ_ONLY, then BAD_STATE or a key that exists
   (DUPLICATE) (a batch: segment by segment, each segment's first problem);
   values against that state: OUT_OF_RANGE, RELEASED, NOT_WRITTEN, OVERFLOW;
   last the resources: TOO_MANY_REQUESTS, OUT_OF_PAGES, OUT_OF_MEMORY.

   Thread safety: an arena's functions may be called from several threads at
   once (one internal lock per arena, removed by MSKV_NO_THREADS). Callbacks
   (logger, events, store ops) run with that lock held and must not call back
   into the same arena. Schedules, retention arithmetic and plans are plain
   data. A session (mskv_session) belongs to one thread at a time.

   Sections (search for "// >>"): results, arena, requests, offload, windows,
   step lifecycle, cpu backend; then the implementation in the same order.

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
    MSKV_ERROR_STALE_PLAN = -26,       /* pages left a request's table after the plan was built (release, offload, remove, abort) */
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
    MSKV_ERROR_HOST_COPY_CORRUPT = -65, /* a host copy's bytes changed since offload or import (debug checksums) */
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

/* A request handle: slot index + 16-bit generation, so a handle kept after
   remove is caught (until its slot has been reused 65,536 times). The zero
   handle is never valid. */
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
   with respect to the bytes it returns or consumes. fill_pages is optional
   (debug poisoning: every byte of the pages, all layers, K and V, set to
   `byte`; NULL = write_pages from a host record of that byte, page by page). */
typedef struct mskv_store_ops {
    void *user;
    mskv_result (*read_pages)(void *user, const int32_t *pages, int32_t n, void *dst);
    mskv_result (*write_pages)(void *user, const int32_t *pages, int32_t n, const void *src);
    mskv_result (*copy_page)(void *user, int32_t src_page, int32_t dst_page);
    mskv_result (*fill_pages)(void *user, const int32_t *pages, int32_t n, unsigned char byte);
} mskv_store_ops;

typedef enum mskv_retire_mode {
    MSKV_RETIRE_IMMEDIATE = 0, /* freed pages are reusable at once (CPU backend) */
    MSKV_RETIRE_FENCED = 1     /* freed pages wait until mskv_arena_retire(fence) (GPU) */
} mskv_retire_mode;

/* Debug checks (mskv_arena_desc.debug; all of them with MSKV_DEBUG). With
   none, nothing of them runs: no extra pass, allocation or copy.
   POISON: a page that becomes free (after its fence) has every byte set to
     MSKV_POISON_BYTE, which reads as NaN in f32, f16 and bf16, so a read
     through a stale table shows; pages free at creation are poisoned too
     (the null page stays zero). mskv_arena_audit_bytes then finds any write
     into a free page.
   CHECKSUMS: offload and import record a checksum of every page of the host
     copy; reload (and export) verify them and refuse a copy whose bytes
     changed (MSKV_ERROR_HOST_COPY_CORRUPT, nothing changes). */
#define MSKV_DEBUG_POISON 1u
#define MSKV_DEBUG_CHECKSUMS 2u
#define MSKV_DEBUG_ALL 3u
#define MSKV_POISON_BYTE 0xFFu   /* 0xFFFFFFFF (f32) and 0xFFFF (f16, bf16) are NaNs */

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
    uint32_t debug;                   /* MSKV_DEBUG_* checks (0 = none, unless MSKV_DEBUG) */
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
    uint64_t host_spare_bytes; /* a freed host copy kept for the next offload (mskv_arena_trim) */
} mskv_arena_stats;

/* Creates an arena. Parameters: desc (zero fields = defaults), out.
   Return value: MSKV_SUCCESS, or INVALID_ARGUMENT (any field out of its
   domain, checked whatever the other fields say: a bad dtype without layers
   too, store_ops missing a function) / OVERFLOW / OUT_OF_MEMORY.
   Thread safety: the arena's functions may be called from several threads. */
MSKV_API mskv_result mskv_arena_create(const mskv_arena_desc *desc, mskv_arena **out);
MSKV_API void mskv_arena_destroy(mskv_arena *arena);
MSKV_API mskv_result mskv_arena_stats_get(mskv_arena *arena, mskv_arena_stats *out);
/* Checks every invariant; on failure returns MSKV_ERROR_AUDIT_FAILED and writes
   which one broke into why (why may be NULL). */
MSKV_API mskv_result mskv_arena_audit(mskv_arena *arena, char *why, size_t why_cap);
/* mskv_arena_audit, then the bytes the debug checks make checkable: every
   free page still holds the poison (a write into a freed page is caught),
   every host copy still matches its checksums. Reads every free page (through
   store_ops for a device store) and every host copy: O(bytes), for tests and
   debugging. Return value: SUCCESS, AUDIT_FAILED (why says which page),
   UNSUPPORTED (the arena runs no debug check: there is nothing to compare). */
MSKV_API mskv_result mskv_arena_audit_bytes(mskv_arena *arena, char *why, size_t why_cap);
/* A hash of the whole bookkeeping state (pages, requests, reservations, host
   copies, keys): equal digests mean nothing changed. */
MSKV_API uint64_t mskv_arena_digest(mskv_arena *arena);
/* Frees the host memory the arena keeps for reuse (the last host copy a
   reload or remove gave back; the next offload would have reused it). */
MSKV_API void mskv_arena_trim(mskv_arena *arena);
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
    int32_t paused;         /* mskv_request_pause: not admitted until resumed */
} mskv_request_info;

/* A new, empty request (one KV stream). TOO_MANY_REQUESTS when every slot of
   max_requests is in use. */
MSKV_API mskv_result mskv_request_add(mskv_arena *arena, mskv_request *out);
/* Removes a request in any state (an open reservation is dropped, a host copy
   freed). Every page goes back: pending until the current fence retires in
   FENCED mode. The handle is stale from now on. */
MSKV_API mskv_result mskv_request_remove(mskv_arena *arena, mskv_request req);
/* A child sharing the parent's full pages (refcounted); the partial last page
   is copied into a fresh page. The child has the parent's tokens, prefix and
   released window, a prefix_epoch of its own, and no retention policy.
   Return value: OFFLOADED, RESERVATION_PENDING (commit or abort first),
   READ_ONLY (a keyed entry), OUT_OF_PAGES (no page for the copy),
   TOO_MANY_REQUESTS, OUT_OF_MEMORY, or a store ops error (copy_page). */
MSKV_API mskv_result mskv_request_fork(mskv_arena *arena, mskv_request parent, mskv_request *child);
/* Pause: the request keeps its pages (or its host copy) and every other
   operation, but admit refuses it (BAD_STATE) until it is resumed; a
   scheduler parks a stream without losing its place. Pause needs no open
   reservation (RESERVATION_PENDING); pausing a paused request, or resuming
   one that is not, is BAD_STATE. Pausing is scheduling state: a fork or an
   imported blob starts unpaused. */
MSKV_API mskv_result mskv_request_pause(mskv_arena *arena, mskv_request req);
MSKV_API mskv_result mskv_request_resume(mskv_arena *arena, mskv_request req);
/* Size the request's page table for `tokens` tokens now, so steps up to that
   length never allocate. Changes no state. */
MSKV_API mskv_result mskv_request_reserve(mskv_arena *arena, mskv_request req, int64_t tokens);
MSKV_API mskv_result mskv_request_info_get(mskv_arena *arena, mskv_request req, mskv_request_info *out);
/* The page table, [prefix pages][live pages]; *count is set to the number of
   entries even when cap is too small (then MSKV_ERROR_CAPACITY); pages == NULL
   with cap == 0 is a size query. */
MSKV_API mskv_result mskv_request_pages(mskv_arena *arena, mskv_request req, int32_t *pages, int32_t cap, int32_t *count);
/* Protect the first n committed tokens (their pages whole) against release.
   Changing the length moves prefix_epoch; the same length is a no-op.
   Return value: OUT_OF_RANGE (n > committed), INVALID_ARGUMENT (n < 0),
   OFFLOADED, READ_ONLY (keyed entry); with released pages behind the prefix
   the prefix pages cannot change: RELEASED (n reaches released tokens) or
   BAD_STATE (n would unprotect pages in front of the released ones). */
MSKV_API mskv_result mskv_request_protect_prefix(mskv_arena *arena, mskv_request req, int64_t n);
/* Release the n oldest live tokens: the release point is live_start + n.
   Only pages whose every slot lies before it are freed (page floor), the
   table is front-compacted to [prefix pages][live pages], and *released
   (optional) gets the tokens actually freed (a multiple of page_size).
   Return value: OUT_OF_RANGE (past the committed live tokens: reserved
   tokens are never released), INVALID_ARGUMENT (n < 0), OFFLOADED, READ_ONLY. */
MSKV_API mskv_result mskv_request_release_oldest(mskv_arena *arena, mskv_request req, int64_t n, int64_t *released);
/* slot = page * page_size + offset of absolute position pos (committed or
   reserved). Return value: RELEASED (its page was released), NOT_WRITTEN
   (pos >= committed + reserved), INVALID_ARGUMENT (pos < 0), OFFLOADED. */
MSKV_API mskv_result mskv_request_slot(mskv_arena *arena, mskv_request req, int64_t pos, int64_t *slot);

/* // >>offload ------------------------------------------------------------ */

/* Copy every resident page (all layers, K and V) to host memory owned by the
   request (desc.host_allocator; a buffer a reload gave back is reused), then
   free the pages; only once the copy is complete. Token counts, prefix, released window and epoch are kept.
   Return value: OFFLOADED (already), RESERVATION_PENDING, READ_ONLY (keyed
   entry), OUT_OF_MEMORY, or the store ops' error (the request stays resident).
   With MSKV_DEBUG_CHECKSUMS a checksum of every page is kept with the copy. */
MSKV_API mskv_result mskv_request_offload(mskv_arena *arena, mskv_request req);
/* All or nothing: fresh pages (possibly other ids), bytes copied back,
   prefix_epoch moves, the host copy is freed. Return value: NOT_OFFLOADED,
   OUT_OF_PAGES (nothing changes, the host copy stays), OUT_OF_MEMORY,
   HOST_COPY_CORRUPT (MSKV_DEBUG_CHECKSUMS: a page of the host copy changed
   since offload or import; nothing changes), or the store ops' error (the
   request stays offloaded). */
MSKV_API mskv_result mskv_request_reload(mskv_arena *arena, mskv_request req);
/* Serialise a request (offloaded or resident, or a sealed keyed entry) into
   a versioned, checksummed, little-endian blob: geometry, token counts,
   prefix, released window, retention, key, and every page's bytes. buf may be
   NULL to query the size; *size always gets the size needed.
   Return value: CAPACITY (cap < *size), RESERVATION_PENDING, OVERFLOW,
   HOST_COPY_CORRUPT (an offloaded request whose host copy changed, with
   MSKV_DEBUG_CHECKSUMS: a blob signed over changed bytes would import). */
MSKV_API mskv_result mskv_request_export(mskv_arena *arena, mskv_request req, void *buf, size_t cap, size_t *size);
/* A new, offloaded request from a blob (possibly written by another process);
   reload it to use it. Return value: BLOB_TRUNCATED, BLOB_CORRUPT (magic,
   size, checksum or an impossible state), BLOB_VERSION, BLOB_MISMATCH (page
   size, layers, heads, head_dim or dtype differ), DUPLICATE (a keyed entry
   whose key exists), TOO_MANY_REQUESTS, OUT_OF_MEMORY. Nothing changes on error. */
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
    int64_t trim;              /* units of context in front of the commit span: commit_start - in_start */
} mskv_decode_span;

/* INVALID_SPEC unless total >= 0, window >= 1 and 0 <= overlap < window;
   OVERFLOW when the last (padded) window would end past INT64_MAX.
   count = number of windows (0 for total 0; the last one may be padded). */
MSKV_API mskv_result mskv_schedule_init(mskv_schedule *s, int64_t total, int64_t window, int64_t overlap);
/* Window k (0 <= k < count, else OUT_OF_RANGE). A schedule that
   mskv_schedule_init would not have made (edited fields) is INVALID_SPEC,
   or OVERFLOW as init would say. */
MSKV_API mskv_result mskv_schedule_window(const mskv_schedule *s, int64_t k, mskv_window *out);
/* What a causal decoder with ctx units of left context decodes for window k:
   it decodes [in_start, in_end) as one stream and drops what the first
   `trim` units produced. For a causal video decoder with temporal ratio r
   (a stream's first latent frame gives 1 output frame, every later one r):
   when trim > 0 drop the first 1 + r*(trim - 1) output frames; when
   trim == 0 (window 0, in_start == 0) drop nothing. What remains is exactly
   the whole stream's frames of the commit span: r*(commit_start - 1) + 1 ..
   r*(commit_end - 1) (from 0 for window 0), so the windows' outputs
   concatenate to the 1 + r*(total - 1) frames of one whole-stream decode,
   provided ctx covers the decoder's left receptive field in latents (at
   least 1: with ctx == 0 a later window's first latent would decode as a
   stream start). */
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
   exist: kept = [0, sink) + [sink + skipped, num_computed); *out gets the
   count (a whole number of chunks). Pure. Return value: SUCCESS,
   NULL_POINTER (r or out), INVALID_SPEC (the policy is invalid:
   mskv_retention_validate says why), INVALID_ARGUMENT (num_computed < 0);
   *out is written only on success. */
MSKV_API mskv_result mskv_skipped_tokens_get(const mskv_retention *r, int64_t num_computed, int64_t *out);
/* Deprecated (0 used to mean both "nothing to skip" and "invalid"): the
   same count, or a negative value, the mskv_result code of
   mskv_skipped_tokens_get, when the call is invalid. */
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
   none does. A request may appear once; it must be resident with no open
   reservation. Return value: OUT_OF_PAGES (nothing allocated), DUPLICATE,
   OFFLOADED, RESERVATION_PENDING, READ_ONLY (keyed entry), INVALID_ARGUMENT
   (n < 0 or a negative token count), OVERFLOW (past 2^31 tokens),
   OUT_OF_MEMORY (a page table could not grow: see mskv_request_reserve). */
MSKV_API mskv_result mskv_admit(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* Reserved tokens become committed. Every segment must have an open
   reservation (else NO_RESERVATION, and nothing is committed). */
MSKV_API mskv_result mskv_commit(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* Return reservations without committing; the pages they added are freed
   (pending in FENCED mode: a kernel may have written them). NO_RESERVATION
   when a segment has none. */
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
    int64_t *slot_mapping;     /* [total_q] page*page_size+offset of each reserved token; -1 for a
                                  committed one (its page may be shared) and in CROSS/DENSE plans */
    int32_t *positions;        /* [total_q] (1-D) or [3*total_q] (3-D) */
    /* capacities of the arrays above (caller-owned mode) */
    int32_t cap_batch, cap_tokens, cap_page_ids;
    uint64_t step;             /* the fence the plan was built in */
    void *owned;               /* set by mskv_plan_alloc */
    /* Stale-plan check (mskv_plan_check), filled by mskv_plan_build: */
    mskv_request *requests;    /* [batch] optional (mskv_plan_alloc provides it): each segment's request, so
                                  only pages leaving these requests make the plan stale; NULL: any
                                  request's pages leaving make it stale */
    mskv_request cross;        /* a CROSS plan's keyed entry (its pages are the ones read); else 0 */
    uint64_t generation;       /* the arena's page-table generation at build; 0 = never checked (a
                                  plan not built by an arena, or a DENSE plan) */
} mskv_plan;

typedef struct mskv_plan_size {
    int32_t batch, total_q, num_page_ids;
} mskv_plan_size;

MSKV_API mskv_result mskv_plan_query(mskv_arena *arena, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan_size *out);
/* Fills the plan's arrays for this step's segments. Return value: CAPACITY
   (nothing written) when a cap is too small, NULL_POINTER for a missing
   array, OUT_OF_RANGE (a segment has more queries than its sequence has
   tokens, or a 1-D position / 3-D frame does not fit in int32: positions
   are exact or refused, never truncated), OVERFLOW (position - pos_offset
   does not fit in int64), OFFLOADED, BAD_STATE (CROSS against an entry that
   is not a sealed keyed entry), INVALID_ARGUMENT (kind, pos_mode, grid).
   mskv_plan_query returns the same codes. Nothing is written on failure. */
MSKV_API mskv_result mskv_plan_build(mskv_arena *arena, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan *plan);
/* Allocate arrays of the given capacities (through the arena's allocator). */
MSKV_API mskv_result mskv_plan_alloc(mskv_arena *arena, int32_t cap_batch, int32_t cap_tokens, int32_t cap_page_ids, mskv_plan *plan);
MSKV_API void mskv_plan_free(mskv_arena *arena, mskv_plan *plan);
/* Checks the CSR invariants: monotone indptrs, indices in [1, num_pages),
   last_page_len rule, kv_len consistent with pages. why gets the broken rule. */
MSKV_API mskv_result mskv_plan_validate(const mskv_plan *plan, int32_t num_pages, char *why, size_t why_cap);
/* Whether a plan built by mskv_plan_build still describes its requests'
   pages. A plan is stale once pages left the table of one of its requests
   (release, retention at publish, offload, abort, remove: those pages may
   now hold another request's tokens); a request that only grew (admit,
   commit) keeps its plans valid. The arena counts every loss of pages in
   one generation, and each request remembers the generation of its last
   loss: the check is one compare while nothing lost pages since the build,
   else one per segment (plan->requests; without that array any loss in the
   arena makes the plan stale). A plan with generation 0 (made by the caller,
   or DENSE) is never stale. mskv_cpu_write_kv, mskv_cpu_attention and the
   GPU wrappers call this first; check it yourself before handing a plan to
   your own kernels. Return value: SUCCESS, STALE_PLAN (also for a removed
   request, or a generation this arena never had), NULL_POINTER.
   Thread safety: takes the arena's lock. */
MSKV_API mskv_result mskv_plan_check(mskv_arena *arena, const mskv_plan *plan);

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
/* The host side of everything the GPU kernels do, and their test oracle:
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
   no host pools. STALE_PLAN when the plan's pages changed since it was
   built (mskv_plan_check). */
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
   an inconsistent plan: indptrs that decrease or pass total_q or
   num_page_ids, which bound the arrays read), OUT_OF_RANGE (a page outside the pool),
   OVERFLOW (a segment with 2^31 rows or more: queries x q_heads / kv_heads),
   STALE_PLAN (pages left one of the plan's requests since it was built:
   mskv_plan_check; the _pools form takes caller-made plans and never checks),
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
   both empty gives o = 0, lse = -inf. o/lse may alias a or b.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (n < 0, heads or
   head_dim < 1), OVERFLOW (n * heads * head_dim past int64). */
MSKV_API mskv_result mskv_cpu_merge(int64_t n, int32_t heads, int32_t head_dim, const float *o_a, const float *lse_a, const float *o_b, const float *lse_b, float *o, float *lse);

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
#include <stdarg.h>
#include <stdio.h>   /* vsnprintf only: the library never prints */
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifndef MSKV_NO_THREADS
#include <pthread.h>
#endif

#if defined(MSKV_MALLOC) || defined(MSKV_REALLOC) || defined(MSKV_FREE)
#if !defined(MSKV_MALLOC) || !defined(MSKV_REALLOC) || !defined(MSKV_FREE)
#error "define all of MSKV_MALLOC, MSKV_REALLOC and MSKV_FREE, or none of them"
#endif
#else
#define MSKV_MALLOC(sz, u) ((void)(u), malloc(sz))
#define MSKV_REALLOC(p, sz, u) ((void)(u), realloc((p), (sz)))
#define MSKV_FREE(p, u) ((void)(u), free(p))
#endif

#ifndef MSKV_ASSERT
#include <assert.h>
#define MSKV_ASSERT(x) assert(x)
#endif

#ifdef MSKV_STATIC
#define MSKV_IMPL static
#else
#define MSKV_IMPL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* // >>results (implementation) ------------------------------------------ */

MSKV_IMPL const char *mskv_result_string(mskv_result r) {
    switch (r) {
    case MSKV_SUCCESS: return "success";
    case MSKV_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case MSKV_ERROR_NULL_POINTER: return "a required pointer is NULL";
    case MSKV_ERROR_INVALID_HANDLE: return "unknown or removed request handle";
    case MSKV_ERROR_OUT_OF_RANGE: return "count or position out of range";
    case MSKV_ERROR_RELEASED: return "position was released";
    case MSKV_ERROR_NOT_WRITTEN: return "position is neither committed nor reserved";
    case MSKV_ERROR_CAPACITY: return "buffer capacity too small";
    case MSKV_ERROR_INVALID_SPEC: return "invalid window schedule or retention policy";
    case MSKV_ERROR_DUPLICATE: return "duplicate request in batch, or key already exists";
    case MSKV_ERROR_NOT_FOUND: return "no keyed entry with this key";
    case MSKV_ERROR_OFFLOADED: return "request is offloaded";
    case MSKV_ERROR_NOT_OFFLOADED: return "request is not offloaded";
    case MSKV_ERROR_RESERVATION_PENDING: return "request has an open reservation";
    case MSKV_ERROR_NO_RESERVATION: return "request has no open reservation";
    case MSKV_ERROR_READ_ONLY: return "keyed entry is read-only";
    case MSKV_ERROR_BAD_STATE: return "operation not allowed in the request's state";
    case MSKV_ERROR_STALE_PLAN: return "stale plan: pages left one of its requests' tables since it was built";
    case MSKV_ERROR_OUT_OF_PAGES: return "out of pages";
    case MSKV_ERROR_OUT_OF_MEMORY: return "out of memory";
    case MSKV_ERROR_OVERFLOW: return "size overflow";
    case MSKV_ERROR_TOO_MANY_REQUESTS: return "too many requests";
    case MSKV_ERROR_BLOB_TRUNCATED: return "blob is truncated";
    case MSKV_ERROR_BLOB_CORRUPT: return "blob is corrupt (magic or checksum)";
    case MSKV_ERROR_BLOB_VERSION: return "blob version not supported";
    case MSKV_ERROR_BLOB_MISMATCH: return "blob layout differs from the arena";
    case MSKV_ERROR_AUDIT_FAILED: return "audit failed: an invariant does not hold";
    case MSKV_ERROR_HOST_COPY_CORRUPT: return "a host copy changed since it was made (checksum mismatch)";
    case MSKV_ERROR_UNSUPPORTED: return "unsupported";
    case MSKV_ERROR_THREAD: return "thread error";
    case MSKV_ERROR_IO: return "I/O error";
    case MSKV_ERROR_CUDA_UNAVAILABLE: return "CUDA unavailable";
    case MSKV_ERROR_CUDA: return "CUDA driver error";
    case MSKV_ERROR_NVRTC: return "NVRTC compilation failed";
    }
    return "unknown result";
}

MSKV_IMPL size_t mskv_dtype_size(mskv_dtype t) {
    switch (t) {
    case MSKV_DTYPE_F32: return 4;
    case MSKV_DTYPE_F16: return 2;
    case MSKV_DTYPE_BF16: return 2;
    }
    return 0;
}

/* // >>internals --------------------------------------------------------- */

static void *mskv__alloc(const mskv_allocator *al, size_t n) {
    if (n == 0) n = 1;
    if (al && al->alloc) return al->alloc(al->user, n);
    return MSKV_MALLOC(n, NULL);
}
static void *mskv__realloc(const mskv_allocator *al, void *p, size_t n) {
    if (n == 0) n = 1;
    if (al && al->realloc) return al->realloc(al->user, p, n);
    return MSKV_REALLOC(p, n, NULL);
}
static void mskv__free(const mskv_allocator *al, void *p) {
    if (!p) return;
    if (al && al->free) { al->free(al->user, p); return; }
    MSKV_FREE(p, NULL);
}

/* a*b into *out; 0 on overflow */
static int mskv__mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > (size_t)-1 / a) return 0;
    *out = a * b;
    return 1;
}
static int mskv__add(size_t a, size_t b, size_t *out) {
    if (b > (size_t)-1 - a) return 0;
    *out = a + b;
    return 1;
}

static void mskv__why(char *why, size_t cap, const char *fmt, ...) {
    va_list ap;
    if (!why || cap == 0) return;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

/* 64-bit checksum / digest: four independent lanes over 8-byte words, then a
   final avalanche. Fast enough to cover every byte of an offloaded request. */
typedef struct mskv__hash { uint64_t v[4]; uint64_t len; unsigned char tail[32]; size_t ntail; } mskv__hash;
#define MSKV__H1 0x9E3779B185EBCA87ull
#define MSKV__H2 0xC2B2AE3D27D4EB4Full
static uint64_t mskv__rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t mskv__rd64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static void mskv__hash_init(mskv__hash *h) {
    h->v[0] = 0x243F6A8885A308D3ull; h->v[1] = 0x13198A2E03707344ull;
    h->v[2] = 0xA4093822299F31D0ull; h->v[3] = 0x082EFA98EC4E6C89ull;
    h->len = 0; h->ntail = 0;
}
static void mskv__hash_block(mskv__hash *h, const unsigned char *p) {
    int i;
    for (i = 0; i < 4; i++) {
        uint64_t w = mskv__rd64(p + 8 * i);
        h->v[i] = mskv__rotl(h->v[i] + w * MSKV__H2, 31) * MSKV__H1;
    }
}
static void mskv__hash_update(mskv__hash *h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    h->len += n;
    if (h->ntail) {
        size_t take = 32 - h->ntail;
        if (take > n) take = n;
        memcpy(h->tail + h->ntail, p, take);
        h->ntail += take; p += take; n -= take;
        if (h->ntail < 32) return;
        mskv__hash_block(h, h->tail);
        h->ntail = 0;
    }
    while (n >= 32) { mskv__hash_block(h, p); p += 32; n -= 32; }
    if (n) { memcpy(h->tail, p, n); h->ntail = n; }
}
static uint64_t mskv__hash_final(const mskv__hash *h) {
    uint64_t x = h->len * MSKV__H1;
    size_t i;
    for (i = 0; i < 4; i++) x = mskv__rotl(x ^ (h->v[i] * MSKV__H2), 27) * MSKV__H1 + 0x85EBCA77C2B2AE63ull;
    for (i = 0; i < h->ntail; i++) x = mskv__rotl(x ^ (h->tail[i] * MSKV__H1), 11) * MSKV__H2;
    x ^= x >> 33; x *= 0xFF51AFD7ED558CCDull; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53ull; x ^= x >> 33;
    return x;
}
static uint64_t mskv__checksum(const void *p, size_t n) {
    mskv__hash h;
    mskv__hash_init(&h);
    mskv__hash_update(&h, p, n);
    return mskv__hash_final(&h);
}
static void mskv__hash_u64(mskv__hash *h, uint64_t v) {
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    mskv__hash_update(h, b, 8);
}

/* // >>arena (implementation) -------------------------------------------- */

enum { MSKV__PAGE_NULL = 0, MSKV__PAGE_FREE = 1, MSKV__PAGE_LIVE = 2, MSKV__PAGE_PENDING = 3 };

typedef struct mskv__req {
    uint16_t gen;
    uint8_t used, location, keyed, sealed, has_res, has_ret, mark, paused;
    int64_t committed, reserved, prefix_tokens, live_start, published;
    uint64_t shrunk;          /* the arena's generation when pages last left this table */
    int32_t prefix_pages;
    int32_t *tab;             /* the table's memory */
    int32_t *pages;           /* tab + head: releases move the head, not the live pages */
    int32_t head, num_pages, cap_pages;
    uint64_t epoch, key;
    mskv_retention retention;
    unsigned char *host;      /* offloaded copy: host_pages records */
    size_t host_cap;          /* bytes allocated at host (it may be a larger reused block) */
    int32_t host_pages;
    uint64_t *sums;           /* MSKV_DEBUG_CHECKSUMS: a checksum per record of host */
} mskv__req;

struct mskv_arena {
    mskv_arena_desc desc;
    mskv_allocator al;
    int32_t P, num_pages, max_req;
    uint8_t *state;
    int32_t *refcount;
    int32_t *free_stack;
    int32_t free_top;
    int32_t *pend_page;        /* FIFO ring of pending pages; fences are nondecreasing */
    uint64_t *pend_fence;
    int32_t pend_head, pend_count;
    int32_t *scratch;          /* audit / stats workspace, num_pages entries */
    mskv__req *reqs;
    int32_t *req_free;
    int32_t req_free_top, nreq;
    uint64_t step, completed, epoch_counter;
    uint64_t generation;       /* moves whenever pages leave any request's table (plans record it) */
    int64_t offloaded_pages;
    mskv_store_info store;
    size_t record_bytes;       /* one page, all layers, K and V: num_layers * 2 * page_bytes */
    unsigned char **pools;     /* [layer*2 + kind] */
    unsigned char *spare;      /* one freed host copy kept for the next offload */
    size_t spare_cap;
    uint32_t debug;            /* MSKV_DEBUG_* in force */
    uint8_t *poisoned;         /* POISON: [num_pages], 1 while a free page holds the poison */
    unsigned char *dbg_rec;    /* POISON: a record of poison, then a record of scratch for the audit */
#ifndef MSKV_NO_THREADS
    pthread_mutex_t lock;
    int lock_ok;
#endif
};

#ifndef MSKV_NO_THREADS
#define MSKV__LOCK(a) pthread_mutex_lock(&(a)->lock)
#define MSKV__UNLOCK(a) pthread_mutex_unlock(&(a)->lock)
#else
#define MSKV__LOCK(a) ((void)0)
#define MSKV__UNLOCK(a) ((void)0)
#endif

static mskv_result mskv__err(mskv_arena *a, mskv_result code, const char *fmt, ...) {
    if (a && a->desc.log) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        a->desc.log(a->desc.log_user, MSKV_LOG_ERROR, msg);
    }
    return code;
}

/* Host copies of offloaded requests come from their own allocator (pinned or caching memory). */
static const mskv_allocator *mskv__hal(const mskv_arena *a) {
    return a->desc.host_allocator.alloc ? &a->desc.host_allocator : &a->al;
}

/* The buffer a reload frees is kept as the arena's one spare, so parking a
   request again copies into memory that is already mapped instead of paying
   a page fault per 4 KiB (mskv_arena_trim gives it back). A spare is reused
   only when at most half of it would go unused. */
static unsigned char *mskv__host_get(mskv_arena *a, size_t bytes, size_t *cap) {
    unsigned char *p;
    if (a->spare && a->spare_cap >= bytes && a->spare_cap / 2 <= bytes) {
        p = a->spare;
        *cap = a->spare_cap;
        a->spare = NULL;
        a->spare_cap = 0;
        return p;
    }
    *cap = bytes;
    return (unsigned char *)mskv__alloc(mskv__hal(a), bytes);
}
static void mskv__host_put(mskv_arena *a, unsigned char *p, size_t cap) {
    if (!p) return;
    if (a->spare && a->spare_cap >= cap) { mskv__free(mskv__hal(a), p); return; }
    mskv__free(mskv__hal(a), a->spare);
    a->spare = p;
    a->spare_cap = cap;
}

static void mskv__emit(mskv_arena *a, mskv_event_type type, int32_t ri, int32_t page, int64_t first) {
    mskv_event e;
    if (!a->desc.on_event) return;
    e.type = type;
    e.request.id = ((uint32_t)a->reqs[ri].gen << 16) | (uint32_t)(ri + 1);
    e.page = page;
    e.first_token = first;
    e.step = a->step;
    a->desc.on_event(a->desc.event_user, &e);
}

/* Every field is checked on its own, whatever the others say (a dtype is a
   dtype even when there is no host store to use it). */
static mskv_result mskv__arena_desc_check(const mskv_arena_desc *d) {
    if (d->num_pages < 2 || d->page_size < 1 || d->max_requests < 0 || d->max_requests > 65535 || d->num_layers < 0 ||
        d->kv_heads < 0 || d->head_dim < 0 || mskv_dtype_size(d->dtype) == 0 || (unsigned)d->retire_mode > 1u ||
        (d->num_layers > 0 && (d->kv_heads < 1 || d->head_dim < 1)) ||
        (d->store_ops && (!d->store_ops->read_pages || !d->store_ops->write_pages || !d->store_ops->copy_page)) ||
        (d->debug & ~MSKV_DEBUG_ALL) != 0 ||
        (d->allocator.alloc || d->allocator.realloc || d->allocator.free) !=
            (d->allocator.alloc && d->allocator.realloc && d->allocator.free) ||
        (d->host_allocator.alloc || d->host_allocator.realloc || d->host_allocator.free) !=
            (d->host_allocator.alloc && d->host_allocator.realloc && d->host_allocator.free))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if ((int64_t)d->num_pages * d->page_size > ((int64_t)1 << 62)) return MSKV_ERROR_OVERFLOW;
    if (d->num_layers > INT32_MAX / 2) return MSKV_ERROR_OVERFLOW;  /* pools are indexed layer * 2 + kind in int32 */
    return MSKV_SUCCESS;
}

/* MSKV_DEBUG_POISON: pages that just became free get the poison in every
   byte, and are marked so that mskv_arena_audit_bytes expects it there. A
   store that fails to poison leaves its pages unmarked (and says so). */
static void mskv__poison(mskv_arena *a, const int32_t *pages, int32_t n) {
    const mskv_store_ops *ops = a->desc.store_ops;
    int32_t i, l;
    mskv_result r = MSKV_SUCCESS;
    if (!(a->debug & MSKV_DEBUG_POISON) || n <= 0 || a->record_bytes == 0) return;
    if (!ops) {
        for (i = 0; i < n; i++) {
            for (l = 0; l < a->store.num_layers * 2; l++)
                memset(a->pools[l] + (size_t)pages[i] * a->store.page_bytes, (int)MSKV_POISON_BYTE, a->store.page_bytes);
            a->poisoned[pages[i]] = 1;
        }
        return;
    }
    if (ops->fill_pages) {
        r = ops->fill_pages(ops->user, pages, n, (unsigned char)MSKV_POISON_BYTE);
        for (i = 0; i < n; i++) a->poisoned[pages[i]] = r == MSKV_SUCCESS;
    } else {
        for (i = 0; i < n; i++) {
            mskv_result ri = ops->write_pages(ops->user, pages + i, 1, a->dbg_rec);
            a->poisoned[pages[i]] = ri == MSKV_SUCCESS;
            if (ri != MSKV_SUCCESS) r = ri;
        }
    }
    if (r != MSKV_SUCCESS && a->desc.log) {
        char msg[160];
        snprintf(msg, sizeof msg, "debug: poisoning freed pages failed (%s); the byte audit skips them", mskv_result_string(r));
        a->desc.log(a->desc.log_user, MSKV_LOG_WARN, msg);
    }
}

MSKV_IMPL mskv_result mskv_arena_create(const mskv_arena_desc *desc, mskv_arena **out) {
    mskv_arena *a;
    size_t n, sz, page_bytes = 0, pool_bytes = 0, rec = 0;
    int32_t i, nl;
    mskv_result r;
    if (!desc || !out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    if ((r = mskv__arena_desc_check(desc)) != MSKV_SUCCESS) return r;
    nl = desc->num_layers;
    if (nl > 0) {
        if (!mskv__mul((size_t)desc->kv_heads, (size_t)desc->head_dim, &sz) ||
            !mskv__mul(sz, mskv_dtype_size(desc->dtype), &sz) ||
            !mskv__mul(sz, (size_t)desc->page_size, &page_bytes) ||
            !mskv__mul(page_bytes, (size_t)desc->num_pages, &pool_bytes) ||
            !mskv__mul(page_bytes, (size_t)nl * 2, &rec) || !mskv__mul(rec, 2, &sz) /* the debug records */)
            return MSKV_ERROR_OVERFLOW;
    }
    a = (mskv_arena *)mskv__alloc(&desc->allocator, sizeof *a);
    if (!a) return MSKV_ERROR_OUT_OF_MEMORY;
    memset(a, 0, sizeof *a);
    a->desc = *desc;
    a->al = desc->allocator;
    a->P = desc->page_size;
    a->num_pages = desc->num_pages;
    a->max_req = desc->max_requests ? desc->max_requests : 256;
#ifndef MSKV_NO_THREADS
    if (pthread_mutex_init(&a->lock, NULL) != 0) {
        mskv__free(&a->al, a);
        return MSKV_ERROR_THREAD;
    }
    a->lock_ok = 1;
#endif
    n = (size_t)a->num_pages;
    a->state = (uint8_t *)mskv__alloc(&a->al, n);
    a->refcount = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->free_stack = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->pend_page = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->pend_fence = (uint64_t *)mskv__alloc(&a->al, n * sizeof(uint64_t));
    a->scratch = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->reqs = (mskv__req *)mskv__alloc(&a->al, (size_t)a->max_req * sizeof(mskv__req));
    /* zeroed at once: on a later failure mskv_arena_destroy frees every request's table and host copy */
    if (a->reqs) memset(a->reqs, 0, (size_t)a->max_req * sizeof(mskv__req));
    a->req_free = (int32_t *)mskv__alloc(&a->al, (size_t)a->max_req * sizeof(int32_t));
    if (nl > 0 && !desc->store_ops) {
        a->pools = (unsigned char **)mskv__alloc(&a->al, (size_t)nl * 2 * sizeof(unsigned char *));
        if (a->pools) {
            memset(a->pools, 0, (size_t)nl * 2 * sizeof(unsigned char *));
            for (i = 0; i < nl * 2; i++) {
                a->pools[i] = (unsigned char *)mskv__alloc(&a->al, pool_bytes);
                if (!a->pools[i]) break;
                memset(a->pools[i], 0, pool_bytes);
            }
        }
    }
    a->debug = desc->debug;
#ifdef MSKV_DEBUG
    a->debug = MSKV_DEBUG_ALL;
#endif
    if (a->debug & MSKV_DEBUG_POISON) {
        a->poisoned = (uint8_t *)mskv__alloc(&a->al, n);
        a->dbg_rec = (unsigned char *)mskv__alloc(&a->al, rec * 2);   /* checked above */
        if (a->poisoned) memset(a->poisoned, 0, n);
        if (a->dbg_rec) memset(a->dbg_rec, (int)MSKV_POISON_BYTE, rec);
    }
    if (!a->state || !a->refcount || !a->free_stack || !a->pend_page || !a->pend_fence || !a->scratch ||
        !a->reqs || !a->req_free || (nl > 0 && !desc->store_ops && (!a->pools || !a->pools[nl * 2 - 1])) ||
        ((a->debug & MSKV_DEBUG_POISON) && (!a->poisoned || !a->dbg_rec))) {
        a->store.num_layers = (a->pools ? nl : 0);
        mskv_arena_destroy(a);
        return MSKV_ERROR_OUT_OF_MEMORY;
    }
    for (i = 0; i < a->max_req; i++) { a->req_free[i] = a->max_req - 1 - i; a->reqs[i].gen = 1; }
    a->req_free_top = a->max_req;
    memset(a->refcount, 0, n * sizeof(int32_t));
    a->state[0] = MSKV__PAGE_NULL;
    /* the stack pops page 1 first, then 2, ...: a fresh arena allocates in id order */
    for (i = 1; i < a->num_pages; i++) {
        a->state[i] = MSKV__PAGE_FREE;
        a->free_stack[a->num_pages - 1 - i] = i;
    }
    a->free_top = a->num_pages - 1;
    a->step = 1;
    a->completed = 0;
    a->generation = 1;   /* 0 in a plan means "not built by an arena" */
    a->store.num_layers = nl;
    a->store.kv_heads = nl ? desc->kv_heads : 0;
    a->store.head_dim = nl ? desc->head_dim : 0;
    a->store.page_size = a->P;
    a->store.num_pages = a->num_pages;
    a->store.dtype = desc->dtype;
    a->store.elem_size = nl ? mskv_dtype_size(desc->dtype) : 0;
    a->store.slot_bytes = nl ? (size_t)desc->kv_heads * (size_t)desc->head_dim * a->store.elem_size : 0;
    a->store.page_bytes = page_bytes;
    a->store.pool_bytes = pool_bytes;
    a->record_bytes = rec;
    if (a->debug & MSKV_DEBUG_POISON) mskv__poison(a, a->free_stack, a->free_top);
    *out = a;
    return MSKV_SUCCESS;
}

MSKV_IMPL void mskv_arena_destroy(mskv_arena *a) {
    int32_t i;
    mskv_allocator al;
    if (!a) return;
    al = a->al;
    if (a->reqs) {
        for (i = 0; i < a->max_req; i++) {
            mskv__free(&al, a->reqs[i].tab);
            mskv__free(mskv__hal(a), a->reqs[i].host);
            mskv__free(&al, a->reqs[i].sums);
        }
    }
    mskv__free(&al, a->poisoned);
    mskv__free(&al, a->dbg_rec);
    mskv__free(mskv__hal(a), a->spare);
    if (a->pools) {
        for (i = 0; i < a->store.num_layers * 2; i++) mskv__free(&al, a->pools[i]);
        mskv__free(&al, a->pools);
    }
#ifndef MSKV_NO_THREADS
    if (a->lock_ok) pthread_mutex_destroy(&a->lock);
#endif
    mskv__free(&al, a->state);
    mskv__free(&al, a->refcount);
    mskv__free(&al, a->free_stack);
    mskv__free(&al, a->pend_page);
    mskv__free(&al, a->pend_fence);
    mskv__free(&al, a->scratch);
    mskv__free(&al, a->reqs);
    mskv__free(&al, a->req_free);
    mskv__free(&al, a);
}

/* Drop one reference to a page; at zero it is freed (pending or at once). */
static void mskv__unref(mskv_arena *a, int32_t page) {
    MSKV_ASSERT(page > 0 && page < a->num_pages && a->state[page] == MSKV__PAGE_LIVE && a->refcount[page] > 0);
    if (--a->refcount[page] > 0) return;
    if (a->desc.retire_mode == MSKV_RETIRE_IMMEDIATE) {
        a->state[page] = MSKV__PAGE_FREE;
        a->free_stack[a->free_top++] = page;
        if (a->debug & MSKV_DEBUG_POISON) mskv__poison(a, &page, 1);
    } else {
        int32_t at = (a->pend_head + a->pend_count) % a->num_pages;
        a->state[page] = MSKV__PAGE_PENDING;
        a->pend_page[at] = page;
        a->pend_fence[at] = a->step;
        a->pend_count++;
    }
}

/* The single allocation path: either all n pages, or none and OUT_OF_PAGES. */
static mskv_result mskv__take(mskv_arena *a, int64_t n, int32_t *out) {
    int64_t i;
    if (n > a->free_top)
        return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "need %lld pages, %d free (%d pending)", (long long)n,
                         (int)a->free_top, (int)a->pend_count);
    for (i = 0; i < n; i++) {
        int32_t p = a->free_stack[--a->free_top];
        a->state[p] = MSKV__PAGE_LIVE;
        a->refcount[p] = 1;
        if (a->poisoned) a->poisoned[p] = 0;
        out[i] = p;
    }
    return MSKV_SUCCESS;
}
/* Undo the last mskv__take of n pages exactly (the free stack is restored). */
static void mskv__untake(mskv_arena *a, int64_t n, const int32_t *pages) {
    int64_t i;
    for (i = n - 1; i >= 0; i--) {
        a->state[pages[i]] = MSKV__PAGE_FREE;
        a->refcount[pages[i]] = 0;
        a->free_stack[a->free_top++] = pages[i];
    }
    /* the failed step that took them may have written some bytes already */
    if (a->debug & MSKV_DEBUG_POISON) mskv__poison(a, pages, (int32_t)n);
}

static mskv_result mskv__retire(mskv_arena *a, uint64_t completed) {
    while (a->pend_count > 0 && a->pend_fence[a->pend_head] <= completed) {
        int32_t p = a->pend_page[a->pend_head];
        a->state[p] = MSKV__PAGE_FREE;
        a->free_stack[a->free_top++] = p;
        if (a->debug & MSKV_DEBUG_POISON) mskv__poison(a, &p, 1);   /* only now: a kernel may have read it until its fence */
        a->pend_head = (a->pend_head + 1) % a->num_pages;
        a->pend_count--;
    }
    if (completed > a->completed) a->completed = completed;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_arena_retire(mskv_arena *a, uint64_t completed) {
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    if (completed > a->step) r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "retire fence %llu is past the current step %llu",
                                          (unsigned long long)completed, (unsigned long long)a->step);
    else r = mskv__retire(a, completed);
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL void mskv_arena_trim(mskv_arena *a) {
    if (!a) return;
    MSKV__LOCK(a);
    mskv__free(mskv__hal(a), a->spare);
    a->spare = NULL;
    a->spare_cap = 0;
    MSKV__UNLOCK(a);
}

MSKV_IMPL uint64_t mskv_arena_step(mskv_arena *a) {
    uint64_t s;
    if (!a) return 0;
    MSKV__LOCK(a);
    s = a->step;
    MSKV__UNLOCK(a);
    return s;
}

MSKV_IMPL mskv_result mskv_arena_stats_get(mskv_arena *a, mskv_arena_stats *out) {
    int32_t i, j, live = 0, prot = 0;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    memset(a->scratch, 0, (size_t)a->num_pages * sizeof(int32_t));
    for (i = 0; i < a->max_req; i++) {
        const mskv__req *q = &a->reqs[i];
        if (!q->used) continue;
        for (j = 0; j < q->prefix_pages && j < q->num_pages; j++)
            if (!a->scratch[q->pages[j]]) { a->scratch[q->pages[j]] = 1; prot++; }
    }
    for (i = 1; i < a->num_pages; i++) live += a->state[i] == MSKV__PAGE_LIVE;
    out->num_pages = a->num_pages;
    out->free_pages = a->free_top;
    out->live_pages = live;
    out->protected_pages = prot;
    out->pending_pages = a->pend_count;
    out->offloaded_pages = a->offloaded_pages;
    out->requests = a->nreq;
    out->step = a->step;
    out->completed_step = a->completed;
    out->host_spare_bytes = a->spare_cap;
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_store_info_get(mskv_arena *a, mskv_store_info *out) {
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    *out = a->store;
    return MSKV_SUCCESS;
}

MSKV_IMPL void *mskv_store_pool(mskv_arena *a, int32_t layer, int kind) {
    if (!a || !a->pools || layer < 0 || layer >= a->store.num_layers || (kind != 0 && kind != 1)) return NULL;
    return a->pools[layer * 2 + kind];
}

/* // >>requests (implementation) ----------------------------------------- */

static int32_t mskv__ceil_div(int64_t x, int64_t d) { return (int32_t)((x + d - 1) / d); }

/* Table entries needed to cover absolute tokens [0, total) given the request's prefix and gap. */
static int32_t mskv__entries_for(const mskv_arena *a, const mskv__req *q, int64_t total) {
    int64_t live = (int64_t)mskv__ceil_div(total, a->P) - q->live_start / a->P;
    return q->prefix_pages + (int32_t)(live > 0 ? live : 0);
}
static int64_t mskv__kv_len(const mskv_arena *a, const mskv__req *q) {
    int64_t end = q->committed + q->reserved;
    int64_t split = (int64_t)q->prefix_pages * a->P;
    return split + (end - q->live_start); /* without a gap live_start == split: len == end */
}

/* Resolve a handle to an index; -1 when unknown or stale. */
static int32_t mskv__lookup(const mskv_arena *a, mskv_request h) {
    uint32_t idx = (h.id & 0xFFFFu);
    if (idx == 0 || idx > (uint32_t)a->max_req) return -1;
    idx -= 1;
    if (!a->reqs[idx].used || a->reqs[idx].gen != (uint16_t)(h.id >> 16)) return -1;
    return (int32_t)idx;
}
static mskv_request mskv__handle(const mskv_arena *a, int32_t ri) {
    mskv_request h;
    h.id = ((uint32_t)a->reqs[ri].gen << 16) | (uint32_t)(ri + 1);
    return h;
}

#define MSKV__GET(a, h, ri)                                                                       \
    do {                                                                                          \
        (ri) = mskv__lookup((a), (h));                                                            \
        if ((ri) < 0) {                                                                           \
            mskv_result mskv__e = mskv__err((a), MSKV_ERROR_INVALID_HANDLE, "request handle 0x%08x is unknown or removed", (unsigned)(h).id); \
            MSKV__UNLOCK(a);                                                                      \
            return mskv__e;                                                                       \
        }                                                                                         \
    } while (0)

/* Room for `need` entries from the head. Moving the entries to the front or
   growing the memory changes no logical state, so a failure here is harmless. */
static mskv_result mskv__reserve_table(mskv_arena *a, mskv__req *q, int32_t need) {
    int32_t cap;
    int32_t *p;
    size_t bytes;
    if ((int64_t)q->head + need <= q->cap_pages) return MSKV_SUCCESS;  /* need may be near INT32_MAX */
    if (q->head > 0) {
        if (q->num_pages) memmove(q->tab, q->pages, (size_t)q->num_pages * sizeof(int32_t));
        q->head = 0;
        q->pages = q->tab;
        if (need <= q->cap_pages) return MSKV_SUCCESS;
    }
    cap = q->cap_pages ? q->cap_pages : 8;
    while (cap < need) cap = cap > (1 << 29) ? need : cap * 2;
    if (!mskv__mul((size_t)cap, sizeof(int32_t), &bytes)) return mskv__err(a, MSKV_ERROR_OVERFLOW, "page table of %d entries", (int)cap);
    p = (int32_t *)mskv__realloc(&a->al, q->tab, bytes);
    if (!p) return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "page table of %d entries", (int)cap);
    q->tab = q->pages = p;
    q->cap_pages = cap;
    return MSKV_SUCCESS;
}

static int32_t mskv__new_req(mskv_arena *a) {
    int32_t ri;
    mskv__req *q;
    uint16_t gen;
    int32_t *pages, cap;
    if (a->req_free_top == 0) return -1;
    ri = a->req_free[--a->req_free_top];
    q = &a->reqs[ri];
    gen = q->gen; pages = q->tab; cap = q->cap_pages;
    memset(q, 0, sizeof *q);
    q->gen = gen; q->tab = q->pages = pages; q->cap_pages = cap; /* keep the table's memory: no allocation in steady state */
    q->used = 1;
    q->epoch = ++a->epoch_counter;
    a->nreq++;
    return ri;
}

/* Give back a slot just taken by mskv__new_req, exactly as it was (a failed call changes nothing). */
static void mskv__undo_new_req(mskv_arena *a, int32_t ri) {
    a->reqs[ri].used = 0;
    a->req_free[a->req_free_top++] = ri;
    a->nreq--;
    a->epoch_counter--;
}

static void mskv__drop_pages(mskv_arena *a, int32_t ri, int32_t from, int32_t count);

static void mskv__del_req(mskv_arena *a, int32_t ri) {
    mskv__req *q = &a->reqs[ri];
    mskv__drop_pages(a, ri, 0, q->num_pages);
    mskv__host_put(a, q->host, q->host_cap);
    mskv__free(&a->al, q->sums);
    q->sums = NULL;
    a->offloaded_pages -= q->host_pages;
    q->host = NULL;
    q->host_cap = 0;
    q->host_pages = 0;
    q->used = 0;
    q->gen = (uint16_t)(q->gen + 1);
    a->req_free[a->req_free_top++] = ri;
    a->nreq--;
}

/* Absolute position of the first slot of table entry i. */
static int64_t mskv__entry_pos(const mskv_arena *a, const mskv__req *q, int32_t i) {
    return i < q->prefix_pages ? (int64_t)i * a->P : q->live_start + (int64_t)(i - q->prefix_pages) * a->P;
}

/* Remove table entries [from, from+count), unreferencing their pages, and close
   the gap by moving the shorter side (releases move the few prefix pages, not
   the long live window). Pages are freed last-first, so the free stack hands
   them out again in table order: admit + abort + admit gives the same ids. */
static void mskv__drop_pages(mskv_arena *a, int32_t ri, int32_t from, int32_t count) {
    mskv__req *q = &a->reqs[ri];
    int32_t i, after;
    if (count <= 0) return;
    /* the one place pages leave a table: plans built before now that read them are stale */
    q->shrunk = ++a->generation;
    for (i = from; a->desc.on_event && i < from + count; i++)
        mskv__emit(a, MSKV_EVENT_PAGE_REMOVED, ri, q->pages[i], mskv__entry_pos(a, q, i));
    for (i = from + count - 1; i >= from; i--) mskv__unref(a, q->pages[i]);
    after = q->num_pages - from - count;
    if (from <= after) {
        if (from) memmove(q->pages + count, q->pages, (size_t)from * sizeof(int32_t));
        q->head += count;
        q->pages += count;
    } else if (after) {
        memmove(q->pages + from, q->pages + from + count, (size_t)after * sizeof(int32_t));
    }
    q->num_pages -= count;
    if (q->num_pages == 0) { q->head = 0; q->pages = q->tab; }
}

MSKV_IMPL mskv_result mskv_request_add(mskv_arena *a, mskv_request *out) {
    int32_t ri;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    ri = mskv__new_req(a);
    if (ri < 0) {
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "all %d request slots are in use", (int)a->max_req);
    }
    *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_remove(mskv_arena *a, mskv_request h) {
    int32_t ri;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    mskv__del_req(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

static void mskv__copy_page_bytes(mskv_arena *a, int32_t src, int32_t dst, mskv_result *r) {
    int32_t l;
    if (a->desc.store_ops) {
        *r = a->desc.store_ops->copy_page(a->desc.store_ops->user, src, dst);
        return;
    }
    for (l = 0; a->pools && l < a->store.num_layers * 2; l++)
        memcpy(a->pools[l] + (size_t)dst * a->store.page_bytes, a->pools[l] + (size_t)src * a->store.page_bytes,
               a->store.page_bytes);
    *r = MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_fork(mskv_arena *a, mskv_request parent, mskv_request *child) {
    int32_t pi, ci, i, partial, fresh = 0;
    mskv__req *p, *c;
    mskv_result r;
    if (!a || !child) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, parent, pi);
    p = &a->reqs[pi];
    r = p->location != MSKV_RESIDENT ? MSKV_ERROR_OFFLOADED
      : p->has_res ? MSKV_ERROR_RESERVATION_PENDING
      : p->keyed ? MSKV_ERROR_READ_ONLY : MSKV_SUCCESS;
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return mskv__err(a, r, "fork: %s", mskv_result_string(r)); }
    partial = (p->num_pages > 0 && p->committed % a->P != 0);
    ci = mskv__new_req(a);
    if (ci < 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "fork: no request slot"); }
    p = &a->reqs[pi];
    c = &a->reqs[ci];
    r = mskv__reserve_table(a, c, p->num_pages);
    if (r == MSKV_SUCCESS && partial) r = mskv__take(a, 1, &fresh);
    if (r == MSKV_SUCCESS && partial) {
        mskv__copy_page_bytes(a, p->pages[p->num_pages - 1], fresh, &r);
        if (r != MSKV_SUCCESS) mskv__untake(a, 1, &fresh);
    }
    if (r != MSKV_SUCCESS) {
        mskv__undo_new_req(a, ci);
        MSKV__UNLOCK(a);
        return r;
    }
    for (i = 0; i < p->num_pages; i++) {
        c->pages[i] = p->pages[i];
        if (!(partial && i == p->num_pages - 1)) a->refcount[p->pages[i]]++;
    }
    if (partial) c->pages[p->num_pages - 1] = fresh;
    c->num_pages = p->num_pages;
    c->committed = p->committed;
    c->prefix_tokens = p->prefix_tokens;
    c->prefix_pages = p->prefix_pages;
    c->live_start = p->live_start;
    c->published = p->published;
    *child = mskv__handle(a, ci);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

static void mskv__fill_info(const mskv_arena *a, const mskv__req *q, mskv_request_info *o) {
    o->committed = q->committed;
    o->reserved = q->reserved;
    o->has_reservation = q->has_res;
    o->prefix_tokens = q->prefix_tokens;
    o->prefix_pages = q->prefix_pages;
    o->live_start = q->live_start;
    o->num_pages = q->location == MSKV_RESIDENT ? q->num_pages : q->host_pages;
    o->kv_len = mskv__kv_len(a, q);
    o->prefix_epoch = q->epoch;
    o->location = (mskv_location)q->location;
    o->keyed = q->keyed;
    o->sealed = q->sealed;
    o->paused = q->paused;
}

MSKV_IMPL mskv_result mskv_request_info_get(mskv_arena *a, mskv_request h, mskv_request_info *out) {
    int32_t ri;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    mskv__fill_info(a, &a->reqs[ri], out);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_pages(mskv_arena *a, mskv_request h, int32_t *pages, int32_t cap, int32_t *count) {
    int32_t ri;
    const mskv__req *q;
    if (!a || !count) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (q->location != MSKV_RESIDENT) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OFFLOADED, "pages: request is offloaded"); }
    *count = q->num_pages;
    if (!pages && cap == 0) { MSKV__UNLOCK(a); return MSKV_SUCCESS; } /* a size query */
    if (!pages) { MSKV__UNLOCK(a); return MSKV_ERROR_NULL_POINTER; }
    if (cap < q->num_pages) { MSKV__UNLOCK(a); return MSKV_ERROR_CAPACITY; }
    if (q->num_pages) memcpy(pages, q->pages, (size_t)q->num_pages * sizeof(int32_t));
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

/* Checks shared by the mutators: resident, and writable unless allow_keyed. */
static mskv_result mskv__check_mutable(mskv_arena *a, const mskv__req *q, const char *what) {
    if (q->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "%s: request is offloaded", what);
    if (q->keyed) return mskv__err(a, MSKV_ERROR_READ_ONLY, "%s: keyed entries are write-once", what);
    return MSKV_SUCCESS;
}

static mskv_result mskv__protect(mskv_arena *a, int32_t ri, int64_t n) {
    mskv__req *q = &a->reqs[ri];
    int32_t pp = mskv__ceil_div(n, a->P);
    int gap = q->live_start > (int64_t)q->prefix_pages * a->P;
    if (n == q->prefix_tokens) return MSKV_SUCCESS;
    if (gap && pp > q->prefix_pages)
        return mskv__err(a, MSKV_ERROR_RELEASED, "protect %lld: tokens from %lld on were released", (long long)n,
                         (long long)q->prefix_pages * a->P);
    if (gap && pp < q->prefix_pages)
        return mskv__err(a, MSKV_ERROR_BAD_STATE, "protect %lld: cannot unprotect pages in front of released ones",
                         (long long)n);
    if (!gap) q->live_start = (int64_t)pp * a->P;
    q->prefix_tokens = n;
    q->prefix_pages = pp;
    q->epoch = ++a->epoch_counter;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_reserve(mskv_arena *a, mskv_request h, int64_t tokens) {
    int32_t ri;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if (tokens < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (tokens > (int64_t)INT32_MAX - a->P) return MSKV_ERROR_OVERFLOW;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    r = mskv__reserve_table(a, &a->reqs[ri], mskv__ceil_div(tokens, a->P) + 1);
    MSKV__UNLOCK(a);
    return r;
}

static mskv_result mskv__set_paused(mskv_arena *a, mskv_request h, uint8_t paused) {
    int32_t ri;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (q->paused == paused) r = mskv__err(a, MSKV_ERROR_BAD_STATE, paused ? "pause: already paused" : "resume: not paused");
    else if (paused && q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "pause: commit or abort first");
    else q->paused = paused;
    MSKV__UNLOCK(a);
    return r;
}
MSKV_IMPL mskv_result mskv_request_pause(mskv_arena *a, mskv_request h) { return mskv__set_paused(a, h, 1); }
MSKV_IMPL mskv_result mskv_request_resume(mskv_arena *a, mskv_request h) { return mskv__set_paused(a, h, 0); }

MSKV_IMPL mskv_result mskv_request_protect_prefix(mskv_arena *a, mskv_request h, int64_t n) {
    int32_t ri;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    r = mskv__check_mutable(a, &a->reqs[ri], "protect");
    if (r == MSKV_SUCCESS && n < 0) r = mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "protect: negative length");
    if (r == MSKV_SUCCESS && n > a->reqs[ri].committed)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "protect %lld: only %lld tokens are committed", (long long)n,
                      (long long)a->reqs[ri].committed);
    if (r == MSKV_SUCCESS) r = mskv__protect(a, ri, n);
    MSKV__UNLOCK(a);
    return r;
}

static int64_t mskv__release(mskv_arena *a, int32_t ri, int64_t n) {
    mskv__req *q = &a->reqs[ri];
    int64_t point = q->live_start + n;
    int32_t count = (int32_t)(point / a->P - q->live_start / a->P);
    if (count <= 0) return 0;
    mskv__drop_pages(a, ri, q->prefix_pages, count);
    q->live_start += (int64_t)count * a->P;
    return (int64_t)count * a->P;
}

MSKV_IMPL mskv_result mskv_request_release_oldest(mskv_arena *a, mskv_request h, int64_t n, int64_t *released) {
    int32_t ri;
    mskv_result r;
    int64_t live, got = 0;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    r = mskv__check_mutable(a, &a->reqs[ri], "release");
    live = a->reqs[ri].committed - a->reqs[ri].live_start;
    if (live < 0) live = 0;
    if (r == MSKV_SUCCESS && n < 0) r = mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "release: negative count");
    if (r == MSKV_SUCCESS && n > live)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "release %lld: only %lld committed live tokens", (long long)n,
                      (long long)live);
    if (r == MSKV_SUCCESS) got = mskv__release(a, ri, n);
    if (r == MSKV_SUCCESS && released) *released = got;
    MSKV__UNLOCK(a);
    return r;
}

/* Compacted index of an absolute position, with the position's status. */
static mskv_result mskv__compact_index(const mskv_arena *a, const mskv__req *q, int64_t pos, int64_t *j) {
    int64_t split = (int64_t)q->prefix_pages * a->P;
    if (pos < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (pos >= q->committed + q->reserved) return MSKV_ERROR_NOT_WRITTEN;
    if (pos < split) { *j = pos; return MSKV_SUCCESS; }
    if (pos < q->live_start) return MSKV_ERROR_RELEASED;
    *j = split + (pos - q->live_start);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_slot(mskv_arena *a, mskv_request h, int64_t pos, int64_t *slot) {
    int32_t ri;
    int64_t j = 0;
    mskv_result r;
    const mskv__req *q;
    if (!a || !slot) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (pos < 0) r = MSKV_ERROR_INVALID_ARGUMENT;   /* a value outside its domain before the state (the header's order) */
    else if (q->location != MSKV_RESIDENT) r = MSKV_ERROR_OFFLOADED;
    else r = mskv__compact_index(a, q, pos, &j);
    if (r == MSKV_SUCCESS) *slot = (int64_t)q->pages[j / a->P] * a->P + j % a->P;
    else r = mskv__err(a, r, "slot of position %lld: %s", (long long)pos, mskv_result_string(r));
    MSKV__UNLOCK(a);
    return r;
}

/* // >>offload (implementation) ------------------------------------------ */

static mskv_result mskv__read_pages(mskv_arena *a, const int32_t *pages, int32_t n, unsigned char *dst) {
    int32_t i, l;
    if (a->desc.store_ops) return a->desc.store_ops->read_pages(a->desc.store_ops->user, pages, n, dst);
    if (!a->pools) return MSKV_SUCCESS;
    for (i = 0; i < n; i++)
        for (l = 0; l < a->store.num_layers * 2; l++)
            memcpy(dst + (size_t)i * a->record_bytes + (size_t)l * a->store.page_bytes,
                   a->pools[l] + (size_t)pages[i] * a->store.page_bytes, a->store.page_bytes);
    return MSKV_SUCCESS;
}
static mskv_result mskv__write_pages(mskv_arena *a, const int32_t *pages, int32_t n, const unsigned char *src) {
    int32_t i, l;
    if (a->desc.store_ops) return a->desc.store_ops->write_pages(a->desc.store_ops->user, pages, n, src);
    if (!a->pools) return MSKV_SUCCESS;
    for (i = 0; i < n; i++)
        for (l = 0; l < a->store.num_layers * 2; l++)
            memcpy(a->pools[l] + (size_t)pages[i] * a->store.page_bytes,
                   src + (size_t)i * a->record_bytes + (size_t)l * a->store.page_bytes, a->store.page_bytes);
    return MSKV_SUCCESS;
}

/* MSKV_DEBUG_CHECKSUMS: one checksum per record of a host copy, taken when
   the copy is made and compared before its bytes are used again. */
static uint64_t *mskv__sums_of(mskv_arena *a, const unsigned char *host, int32_t n) {
    uint64_t *sums;
    size_t bytes;
    int32_t i;
    if (!mskv__mul((size_t)n, sizeof(uint64_t), &bytes)) return NULL;
    sums = (uint64_t *)mskv__alloc(&a->al, bytes);
    for (i = 0; sums && i < n; i++) sums[i] = mskv__checksum(host + (size_t)i * a->record_bytes, a->record_bytes);
    return sums;
}
/* The first record of q's host copy whose bytes changed; -1 when none (or no sums). */
static int32_t mskv__sums_bad(const mskv_arena *a, const mskv__req *q) {
    int32_t i;
    for (i = 0; q->sums && i < q->host_pages; i++)
        if (mskv__checksum(q->host + (size_t)i * a->record_bytes, a->record_bytes) != q->sums[i]) return i;
    return -1;
}

MSKV_IMPL mskv_result mskv_request_offload(mskv_arena *a, mskv_request h) {
    int32_t ri, n;
    mskv__req *q;
    mskv_result r;
    unsigned char *host = NULL;
    uint64_t *sums = NULL;
    size_t bytes, cap = 0;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    /* the header's order of state codes: location, reservation, keyed */
    r = q->location == MSKV_RESIDENT && q->has_res ? mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "offload: commit or abort first")
                                                   : mskv__check_mutable(a, q, "offload");
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    n = q->num_pages;
    if (!mskv__mul((size_t)n, a->record_bytes, &bytes)) { MSKV__UNLOCK(a); return MSKV_ERROR_OVERFLOW; }
    if (bytes > 0) {
        int reused = a->spare != NULL;
        host = mskv__host_get(a, bytes, &cap);
        if (!host) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "offload: %zu host bytes", bytes); }
        reused = reused && a->spare == NULL;
        r = mskv__read_pages(a, q->pages, n, host);
        if (r == MSKV_SUCCESS && (a->debug & MSKV_DEBUG_CHECKSUMS) && !(sums = mskv__sums_of(a, host, n)))
            r = mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "offload: the host copy's checksums");
        if (r != MSKV_SUCCESS) {
            if (reused) { a->spare = host; a->spare_cap = cap; }   /* as it was */
            else mskv__free(mskv__hal(a), host);
            MSKV__UNLOCK(a);
            return mskv__err(a, r, "offload: reading pages failed, request stays resident");
        }
    }
    /* the copy is complete: only now may the pages go */
    mskv__drop_pages(a, ri, 0, n);
    q->host = host;
    q->sums = sums;
    q->host_cap = cap;
    q->host_pages = n;
    q->location = MSKV_OFFLOADED;
    a->offloaded_pages += n;
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_reload(mskv_arena *a, mskv_request h) {
    int32_t ri, n;
    mskv__req *q;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (q->location != MSKV_OFFLOADED) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_NOT_OFFLOADED, "reload: request is resident"); }
    if (q->sums && (n = mskv__sums_bad(a, q)) >= 0) {
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_HOST_COPY_CORRUPT, "reload: page %d of the host copy changed since it was made", (int)n);
    }
    n = q->host_pages;
    /* out of pages is the common failure: find it before growing the table */
    r = n > a->free_top ? mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "reload: need %d pages, %d free (%d pending)", (int)n,
                                    (int)a->free_top, (int)a->pend_count)
                        : mskv__reserve_table(a, q, n);
    if (r == MSKV_SUCCESS && n > 0) r = mskv__take(a, n, q->pages);
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    if (n > 0 && q->host) {
        r = mskv__write_pages(a, q->pages, n, q->host);
        if (r != MSKV_SUCCESS) {
            mskv__untake(a, n, q->pages);
            MSKV__UNLOCK(a);
            return mskv__err(a, r, "reload: writing pages failed, request stays offloaded");
        }
    }
    q->num_pages = n;
    mskv__host_put(a, q->host, q->host_cap);
    mskv__free(&a->al, q->sums);
    q->host = NULL;
    q->sums = NULL;
    q->host_cap = 0;
    q->host_pages = 0;
    q->location = MSKV_RESIDENT;
    q->epoch = ++a->epoch_counter;
    a->offloaded_pages -= n;
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

/* Blob format, little-endian, version 1:
     0  "MSKVBLOB"       8  u32 version      12 u32 header bytes (128)
    16  u64 total bytes (header + payload + 8-byte checksum; at this offset in every version)
    24  u32 page_size   28 u32 num_layers   32 u32 kv_heads   36 u32 head_dim
    40  u32 dtype       44 u32 pages        48 u32 flags (1 keyed, 2 sealed, 4 retention)
    52  u32 prefix_pages
    56  i64 committed   64 i64 prefix_tokens 72 i64 live_start  80 i64 published
    88  retention: i64 chunk_size, i64 sink_chunks, i64 window_chunks, i32 reset, i32 exact  (120)
   120  u64 key
   128  payload: pages records of [layer][K,V][page bytes]
   end  u64 checksum of everything before it
   The checksum is verified before the version, so a damaged header reads as corrupt. */
#define MSKV__BLOB_VERSION 1u
#define MSKV__BLOB_HEADER 128u

static void mskv__put32(unsigned char *p, uint32_t v) { int i; for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void mskv__put64(unsigned char *p, uint64_t v) { int i; for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t mskv__get32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t mskv__get64(const unsigned char *p) { return mskv__rd64(p); }


MSKV_IMPL mskv_result mskv_request_export(mskv_arena *a, mskv_request h, void *buf, size_t cap, size_t *size) {
    int32_t ri, n;
    const mskv__req *q;
    size_t payload, total;
    unsigned char *b = (unsigned char *)buf;
    mskv_result r = MSKV_SUCCESS;
    if (!a || !size) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (q->has_res) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "export: commit or abort first"); }
    if (buf && q->location == MSKV_OFFLOADED && q->sums && (n = mskv__sums_bad(a, q)) >= 0) {
        MSKV__UNLOCK(a);   /* a signed blob of changed bytes would import as valid */
        return mskv__err(a, MSKV_ERROR_HOST_COPY_CORRUPT, "export: page %d of the host copy changed since it was made", (int)n);
    }
    n = q->location == MSKV_RESIDENT ? q->num_pages : q->host_pages;
    if (!mskv__mul((size_t)n, a->record_bytes, &payload) || !mskv__add(payload, MSKV__BLOB_HEADER + 8, &total)) {
        MSKV__UNLOCK(a);
        return MSKV_ERROR_OVERFLOW;
    }
    *size = total;
    if (!buf) { MSKV__UNLOCK(a); return MSKV_SUCCESS; }
    if (cap < total) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_CAPACITY, "export: need %zu bytes, have %zu", total, cap); }
    if (payload > 0) {
        if (q->location == MSKV_RESIDENT) r = mskv__read_pages(a, q->pages, n, b + MSKV__BLOB_HEADER);
        else memcpy(b + MSKV__BLOB_HEADER, q->host, payload);
    }
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return mskv__err(a, r, "export: reading pages failed"); }
    memset(b, 0, MSKV__BLOB_HEADER);
    memcpy(b, "MSKVBLOB", 8);
    mskv__put32(b + 8, MSKV__BLOB_VERSION);
    mskv__put32(b + 12, MSKV__BLOB_HEADER);
    mskv__put64(b + 16, (uint64_t)total);
    mskv__put32(b + 24, (uint32_t)a->P);
    mskv__put32(b + 28, (uint32_t)a->store.num_layers);
    mskv__put32(b + 32, (uint32_t)a->store.kv_heads);
    mskv__put32(b + 36, (uint32_t)a->store.head_dim);
    mskv__put32(b + 40, (uint32_t)(a->store.num_layers ? a->store.dtype : 0));
    mskv__put32(b + 44, (uint32_t)n);
    mskv__put32(b + 48, (uint32_t)(q->keyed | q->sealed << 1 | q->has_ret << 2));
    mskv__put32(b + 52, (uint32_t)q->prefix_pages);
    mskv__put64(b + 56, (uint64_t)q->committed);
    mskv__put64(b + 64, (uint64_t)q->prefix_tokens);
    mskv__put64(b + 72, (uint64_t)q->live_start);
    mskv__put64(b + 80, (uint64_t)q->published);
    mskv__put64(b + 88, (uint64_t)q->retention.chunk_size);
    mskv__put64(b + 96, (uint64_t)q->retention.sink_chunks);
    mskv__put64(b + 104, (uint64_t)q->retention.window_chunks);
    mskv__put32(b + 112, (uint32_t)q->retention.reset_at_boundary);
    mskv__put32(b + 116, (uint32_t)q->retention.exact);
    mskv__put64(b + 120, q->key);
    mskv__put64(b + total - 8, mskv__checksum(b, total - 8));
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

static int32_t mskv__find_key(const mskv_arena *a, uint64_t key) {
    int32_t i;
    for (i = 0; i < a->max_req; i++)
        if (a->reqs[i].used && a->reqs[i].keyed && a->reqs[i].key == key) return i;
    return -1;
}

static mskv_result mskv__retention_check(const mskv_retention *r, int32_t page_size, char *why, size_t cap);

static int mskv__all_zero(const unsigned char *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

MSKV_IMPL mskv_result mskv_request_import(mskv_arena *a, const void *blob, size_t size, mskv_request *out) {
    const unsigned char *b = (const unsigned char *)blob;
    uint64_t total;
    uint32_t n, flags, pp;
    int64_t committed, prefix, live, published;
    size_t payload;
    int32_t ri;
    mskv__req *q;
    unsigned char *host = NULL;
    uint64_t *sums = NULL;
    mskv_retention ret;
    if (!a || !blob || !out) return MSKV_ERROR_NULL_POINTER;
    if (size < MSKV__BLOB_HEADER + 8) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "import: %zu bytes is shorter than a header", size);
    if (memcmp(b, "MSKVBLOB", 8) != 0) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: bad magic");
    total = mskv__get64(b + 16);
    if (total > size) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "import: blob says %llu bytes, got %zu", (unsigned long long)total, size);
    if (total < size || total < MSKV__BLOB_HEADER + 8) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: size field %llu does not match %zu", (unsigned long long)total, size);
    if (mskv__checksum(b, size - 8) != mskv__get64(b + size - 8)) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: checksum mismatch");
    if (mskv__get32(b + 8) != MSKV__BLOB_VERSION || mskv__get32(b + 12) != MSKV__BLOB_HEADER)
        return mskv__err(a, MSKV_ERROR_BLOB_VERSION, "import: blob version %u, this library reads %u", (unsigned)mskv__get32(b + 8), MSKV__BLOB_VERSION);
    if (mskv__get32(b + 24) != (uint32_t)a->P || mskv__get32(b + 28) != (uint32_t)a->store.num_layers ||
        mskv__get32(b + 32) != (uint32_t)a->store.kv_heads || mskv__get32(b + 36) != (uint32_t)a->store.head_dim ||
        mskv__get32(b + 40) != (uint32_t)(a->store.num_layers ? a->store.dtype : 0))
        return mskv__err(a, MSKV_ERROR_BLOB_MISMATCH, "import: page size/layers/heads/dim/dtype differ from the arena");
    n = mskv__get32(b + 44);
    flags = mskv__get32(b + 48);
    pp = mskv__get32(b + 52);
    committed = (int64_t)mskv__get64(b + 56);
    prefix = (int64_t)mskv__get64(b + 64);
    live = (int64_t)mskv__get64(b + 72);
    published = (int64_t)mskv__get64(b + 80);
    ret.chunk_size = (int64_t)mskv__get64(b + 88);
    ret.sink_chunks = (int64_t)mskv__get64(b + 96);
    ret.window_chunks = (int64_t)mskv__get64(b + 104);
    ret.window_tokens = 0;  /* derived below, once the policy is known to be valid */
    /* a field its flags leave unused was written as zero: anything else is not our blob
       (and was never validated, whatever arithmetic it would feed) */
    if ((!(flags & 4u) && !mskv__all_zero(b + 88, 32)) || (!(flags & 1u) && !mskv__all_zero(b + 120, 8)))
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: a field its flags leave unused is not zero");
    ret.reset_at_boundary = (int32_t)mskv__get32(b + 112);
    ret.exact = (int32_t)mskv__get32(b + 116);
    /* a valid checksum over nonsense is still nonsense: check the state is one we could have written */
    if (!mskv__mul((size_t)n, a->record_bytes, &payload) || payload + MSKV__BLOB_HEADER + 8 != total ||
        committed < 0 || committed > INT32_MAX || prefix < 0 || prefix > committed || live < 0 || live % a->P != 0 ||
        pp != (uint32_t)mskv__ceil_div(prefix, a->P) || live < (int64_t)pp * a->P || published < 0 || published > committed ||
        (live > (int64_t)pp * a->P && live > committed) /* released past the committed tokens */ ||
        (flags & ~7u) != 0 || (flags & 1u) != ((flags >> 1) & 1u) /* only sealed keyed entries export */ ||
        ((flags & 1u) && ((flags & 4u) || prefix != 0 || live != 0)) /* keyed entries are never protected or released */ ||
        ((flags & 4u) && mskv__retention_check(&ret, a->P, NULL, 0) != MSKV_SUCCESS))
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: inconsistent header");
    if (flags & 4u) ret.window_tokens = ret.window_chunks * ret.chunk_size; /* bounded by the check above */
    {
        mskv__req probe;
        memset(&probe, 0, sizeof probe);
        probe.committed = committed; probe.prefix_pages = (int32_t)pp; probe.live_start = live;
        if ((uint32_t)mskv__entries_for(a, &probe, committed) != n)
            return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: page count does not match the token counts");
    }
    MSKV__LOCK(a);
    if ((flags & 1u) && mskv__find_key(a, mskv__get64(b + 120)) >= 0) {
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_DUPLICATE, "import: key exists");
    }
    if (payload > 0) {
        host = (unsigned char *)mskv__alloc(mskv__hal(a), payload);
        if (!host) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "import: %zu host bytes", payload); }
        memcpy(host, b + MSKV__BLOB_HEADER, payload);
        if ((a->debug & MSKV_DEBUG_CHECKSUMS) && !(sums = mskv__sums_of(a, host, (int32_t)n))) {
            mskv__free(mskv__hal(a), host);
            MSKV__UNLOCK(a);
            return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "import: the host copy's checksums");
        }
    }
    ri = mskv__new_req(a);
    if (ri < 0) {
        mskv__free(mskv__hal(a), host);
        mskv__free(&a->al, sums);
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "import: no request slot");
    }
    q = &a->reqs[ri];
    q->location = MSKV_OFFLOADED;
    q->host = host;
    q->sums = sums;
    q->host_cap = payload;
    q->host_pages = (int32_t)n;
    q->committed = committed;
    q->prefix_tokens = prefix;
    q->prefix_pages = (int32_t)pp;
    q->live_start = live;
    q->published = published;
    q->keyed = (uint8_t)(flags & 1u);
    q->sealed = (uint8_t)((flags >> 1) & 1u);
    q->key = mskv__get64(b + 120);
    q->has_ret = (uint8_t)((flags >> 2) & 1u);
    if (q->has_ret) q->retention = ret;
    a->offloaded_pages += n;
    *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

/* // >>windows (implementation) ------------------------------------------ */

MSKV_IMPL mskv_result mskv_schedule_init(mskv_schedule *s, int64_t total, int64_t window, int64_t overlap) {
    int64_t stride, count;
    if (!s) return MSKV_ERROR_NULL_POINTER;
    if (total < 0 || window < 1 || overlap < 0 || overlap >= window) return MSKV_ERROR_INVALID_SPEC;
    stride = window - overlap;
    if (total == 0) count = 0;
    else if (total <= window) count = 1;
    else count = 1 + (total - window + stride - 1) / stride;   /* the sum is below total: no overflow */
    /* the last window starts before total (so its start fits), but it may end past INT64_MAX */
    if (count > 0 && (count - 1) * stride > INT64_MAX - window) return MSKV_ERROR_OVERFLOW;
    s->total = total;
    s->window = window;
    s->overlap = overlap;
    s->stride = stride;
    s->count = count;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_schedule_window(const mskv_schedule *s, int64_t k, mskv_window *w) {
    mskv_schedule chk;
    mskv_result r;
    if (!s || !w) return MSKV_ERROR_NULL_POINTER;
    /* the struct is the caller's: only a schedule schedule_init would make is safe to compute with */
    if ((r = mskv_schedule_init(&chk, s->total, s->window, s->overlap)) != MSKV_SUCCESS) return r;
    if (chk.stride != s->stride || chk.count != s->count) return MSKV_ERROR_INVALID_SPEC;
    if (k < 0 || k >= s->count) return MSKV_ERROR_OUT_OF_RANGE;
    w->index = k;
    w->start = k * s->stride;
    w->end = w->start + s->window;
    w->cond_start = w->start;
    w->cond_end = k == 0 ? w->start : w->start + s->overlap;
    w->commit_start = k == 0 ? 0 : w->start + s->overlap;
    w->commit_end = w->end < s->total ? w->end : s->total;
    w->pad = w->end > s->total ? w->end - s->total : 0;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_schedule_decode_span(const mskv_schedule *s, int64_t k, int64_t ctx, mskv_decode_span *out) {
    mskv_window w;
    mskv_result r;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    if (ctx < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    r = mskv_schedule_window(s, k, &w);
    if (r != MSKV_SUCCESS) return r;
    out->in_start = w.commit_start - ctx > 0 ? w.commit_start - ctx : 0;
    out->in_end = w.commit_end;
    out->trim = w.commit_start - out->in_start;
    return MSKV_SUCCESS;
}

static mskv_result mskv__retention_check(const mskv_retention *r, int32_t page_size, char *why, size_t cap) {
    if (!r) return MSKV_ERROR_NULL_POINTER;
    if (r->chunk_size <= 0) { mskv__why(why, cap, "chunk_size must be positive (got %lld)", (long long)r->chunk_size); return MSKV_ERROR_INVALID_SPEC; }
    if (r->sink_chunks < 0 || r->window_chunks < 0) { mskv__why(why, cap, "sink_chunks and window_chunks must not be negative"); return MSKV_ERROR_INVALID_SPEC; }
    if (!r->reset_at_boundary && r->window_chunks < 1) { mskv__why(why, cap, "window_chunks must be at least 1 without reset_at_boundary"); return MSKV_ERROR_INVALID_SPEC; }
    if (r->chunk_size > ((int64_t)1 << 40) || r->sink_chunks > ((int64_t)1 << 20) || r->window_chunks > ((int64_t)1 << 20)) {
        mskv__why(why, cap, "chunk_size, sink_chunks or window_chunks is too large");
        return MSKV_ERROR_INVALID_SPEC;
    }
    if (r->window_tokens != 0 && r->window_tokens != r->window_chunks * r->chunk_size) {
        mskv__why(why, cap, "window_tokens %lld != window_chunks %lld * chunk_size %lld", (long long)r->window_tokens,
                  (long long)r->window_chunks, (long long)r->chunk_size);
        return MSKV_ERROR_INVALID_SPEC;
    }
    if (r->exact && page_size > 0 && r->chunk_size % page_size != 0) {
        mskv__why(why, cap, "exact eviction needs chunk_size %lld to be a multiple of page_size %d", (long long)r->chunk_size, (int)page_size);
        return MSKV_ERROR_INVALID_SPEC;
    }
    if (r->exact && page_size > 0 && (r->sink_chunks * r->chunk_size) % page_size != 0) {
        mskv__why(why, cap, "exact eviction needs the sink (%lld tokens) to be a multiple of page_size %d",
                  (long long)(r->sink_chunks * r->chunk_size), (int)page_size);
        return MSKV_ERROR_INVALID_SPEC;
    }
    if (page_size < 0) { mskv__why(why, cap, "negative page_size"); return MSKV_ERROR_INVALID_ARGUMENT; }
    mskv__why(why, cap, "ok");
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_retention_validate(const mskv_retention *r, int32_t page_size, char *why, size_t cap) {
    return mskv__retention_check(r, page_size, why, cap);
}

MSKV_IMPL mskv_result mskv_skipped_tokens_get(const mskv_retention *r, int64_t num_computed, int64_t *out) {
    int64_t sink, after, raw;
    mskv_result res;
    if (!r || !out) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv__retention_check(r, 0, NULL, 0)) != MSKV_SUCCESS) return res;
    if (num_computed < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    /* a valid policy bounds chunk (2^40) and chunk counts (2^20): these products fit */
    sink = r->sink_chunks * r->chunk_size;
    after = num_computed - sink;
    if (after <= 0) raw = 0;
    else if (r->reset_at_boundary) raw = after;
    else raw = after - r->window_chunks * r->chunk_size;
    *out = raw <= 0 ? 0 : raw / r->chunk_size * r->chunk_size;
    return MSKV_SUCCESS;
}

MSKV_IMPL int64_t mskv_skipped_tokens(const mskv_retention *r, int64_t num_computed) {
    int64_t n = 0;
    mskv_result res = mskv_skipped_tokens_get(r, num_computed, &n);
    return res == MSKV_SUCCESS ? n : (int64_t)res;
}

MSKV_IMPL mskv_result mskv_request_set_retention(mskv_arena *a, mskv_request h, const mskv_retention *r) {
    int32_t ri;
    mskv_result res = MSKV_SUCCESS;
    char why[160];
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    if (a->reqs[ri].keyed) res = mskv__err(a, MSKV_ERROR_READ_ONLY, "retention: keyed entries are never released");
    else if (r && (res = mskv__retention_check(r, a->P, why, sizeof why)) != MSKV_SUCCESS)
        res = mskv__err(a, res, "retention: %s", why);
    if (res == MSKV_SUCCESS) {
        a->reqs[ri].has_ret = r != NULL;
        if (r) {
            a->reqs[ri].retention = *r;
            a->reqs[ri].retention.window_tokens = r->window_chunks * r->chunk_size;
        } else {
            memset(&a->reqs[ri].retention, 0, sizeof(mskv_retention));
        }
    }
    MSKV__UNLOCK(a);
    return res;
}

/* // >>step lifecycle (implementation) ----------------------------------- */

/* The argument checks every batch call starts with. */
#define MSKV__CHECK_SEGS(a, segs, n)                              \
    do {                                                          \
        if (!(a)) return MSKV_ERROR_NULL_POINTER;                 \
        if ((n) < 0) return MSKV_ERROR_INVALID_ARGUMENT;          \
        if ((n) > 0 && !(segs)) return MSKV_ERROR_NULL_POINTER;   \
    } while (0)

/* Resolve and mark every segment's request; rejects unknown handles and duplicates.
   On failure all marks are cleared. idx receives the indices when non-NULL. */
static mskv_result mskv__resolve(mskv_arena *a, const mskv_segment *segs, int32_t n, int32_t *idx, const char *what) {
    int32_t i, ri;
    mskv_result r = MSKV_SUCCESS;
    for (i = 0; i < n; i++) {
        ri = mskv__lookup(a, segs[i].request);
        if (ri < 0) { r = mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "%s: segment %d has an unknown or removed request", what, (int)i); break; }
        if (a->reqs[ri].mark) { r = mskv__err(a, MSKV_ERROR_DUPLICATE, "%s: segment %d repeats a request", what, (int)i); break; }
        a->reqs[ri].mark = 1;
        if (idx) idx[i] = ri;
    }
    {
        int32_t j;
        for (j = 0; j < i; j++) a->reqs[mskv__lookup(a, segs[j].request)].mark = 0;
    }
    return r;
}

MSKV_IMPL mskv_result mskv_admit(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i, ri;
    int64_t need = 0;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__resolve(a, segs, n, NULL, "admit");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q;
        ri = mskv__lookup(a, segs[i].request);
        q = &a->reqs[ri];
        if (segs[i].n_tokens < 0) r = mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "admit: segment %d has %lld tokens", (int)i, (long long)segs[i].n_tokens);
        else if (q->location != MSKV_RESIDENT) r = mskv__err(a, MSKV_ERROR_OFFLOADED, "admit: segment %d's request is offloaded", (int)i);
        else if (q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "admit: segment %d's request already has a reservation", (int)i);
        else if (q->keyed) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "admit: segment %d is a keyed entry", (int)i);
        else if (q->paused) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "admit: segment %d's request is paused", (int)i);
        else if (segs[i].n_tokens > (int64_t)INT32_MAX - a->P - q->committed)
            r = mskv__err(a, MSKV_ERROR_OVERFLOW, "admit: segment %d would pass 2^31 tokens", (int)i);
        else need += mskv__entries_for(a, q, q->committed + segs[i].n_tokens) - q->num_pages;
    }
    if (r == MSKV_SUCCESS && need > a->free_top)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "admit: need %lld pages, %d free (%d pending)", (long long)need, (int)a->free_top, (int)a->pend_count);
    /* grow tables first: growing changes no state, and cannot fail half-way through pages */
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        mskv__req *q = &a->reqs[mskv__lookup(a, segs[i].request)];
        r = mskv__reserve_table(a, q, mskv__entries_for(a, q, q->committed + segs[i].n_tokens));
    }
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        mskv__req *q = &a->reqs[mskv__lookup(a, segs[i].request)];
        int32_t add = mskv__entries_for(a, q, q->committed + segs[i].n_tokens) - q->num_pages;
        if (add > 0) r = mskv__take(a, add, q->pages + q->num_pages);
        MSKV_ASSERT(r == MSKV_SUCCESS); /* the total was checked above */
        q->num_pages += add;
        q->reserved = segs[i].n_tokens;
        q->has_res = 1;
    }
    MSKV__UNLOCK(a);
    return r;
}

static mskv_result mskv__check_open(mskv_arena *a, const mskv_segment *segs, int32_t n, const char *what) {
    int32_t i;
    mskv_result r = mskv__resolve(a, segs, n, NULL, what);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q = &a->reqs[mskv__lookup(a, segs[i].request)];
        if (!q->has_res) r = mskv__err(a, MSKV_ERROR_NO_RESERVATION, "%s: segment %d's request has no reservation", what, (int)i);
        else if (q->keyed) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "%s: segment %d is a keyed entry (use mskv_keyed_seal)", what, (int)i);
    }
    return r;
}

MSKV_IMPL mskv_result mskv_commit(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__check_open(a, segs, n, "commit");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        mskv__req *q = &a->reqs[mskv__lookup(a, segs[i].request)];
        q->committed += q->reserved;
        q->reserved = 0;
        q->has_res = 0;
    }
    MSKV__UNLOCK(a);
    return r;
}

static void mskv__abort_one(mskv_arena *a, int32_t ri) {
    mskv__req *q = &a->reqs[ri];
    int32_t keep = mskv__entries_for(a, q, q->committed);
    mskv__drop_pages(a, ri, keep, q->num_pages - keep);
    q->reserved = 0;
    q->has_res = 0;
}

MSKV_IMPL mskv_result mskv_abort(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__check_open(a, segs, n, "abort");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) mskv__abort_one(a, mskv__lookup(a, segs[i].request));
    MSKV__UNLOCK(a);
    return r;
}

/* Apply a request's retention policy: protect the sink once complete, release what left the window. */
static void mskv__apply_retention(mskv_arena *a, int32_t ri) {
    mskv__req *q = &a->reqs[ri];
    const mskv_retention *rt = &q->retention;
    int64_t sink = rt->sink_chunks * rt->chunk_size, keep_from, live, skip = 0;
    if (q->committed >= sink && q->prefix_tokens < sink && q->live_start <= (int64_t)q->prefix_pages * a->P)
        (void)mskv__protect(a, ri, sink);
    if (q->prefix_tokens < sink) return; /* the sink is not complete (or not protectable): nothing may go yet */
    if (mskv_skipped_tokens_get(rt, q->committed, &skip) != MSKV_SUCCESS) return; /* validated when bound: cannot happen */
    keep_from = sink + skip;
    live = q->committed - q->live_start;
    if (keep_from > q->live_start && live > 0)
        (void)mskv__release(a, ri, keep_from - q->live_start < live ? keep_from - q->live_start : live);
}

MSKV_IMPL mskv_result mskv_publish(mskv_arena *a, const mskv_segment *segs, int32_t n, uint64_t *step_out) {
    int32_t i;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__resolve(a, segs, n, NULL, "publish");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++)
        if (a->reqs[mskv__lookup(a, segs[i].request)].location != MSKV_RESIDENT)
            r = mskv__err(a, MSKV_ERROR_OFFLOADED, "publish: segment %d's request is offloaded", (int)i);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        int32_t ri = mskv__lookup(a, segs[i].request);
        mskv__req *q = &a->reqs[ri];
        int64_t pg;
        /* pages that filled with committed tokens since the last publish */
        for (pg = q->published / a->P; a->desc.on_event && (pg + 1) * a->P <= q->committed; pg++) {
            int64_t j = 0;
            if ((pg + 1) * a->P <= q->published) continue;
            if (mskv__compact_index(a, q, pg * a->P, &j) == MSKV_SUCCESS)
                mskv__emit(a, MSKV_EVENT_PAGE_STORED, ri, q->pages[j / a->P], pg * a->P);
        }
        q->published = q->committed;
        if (q->has_ret) mskv__apply_retention(a, ri);
    }
    if (r == MSKV_SUCCESS) {
        if (step_out) *step_out = a->step;
        a->step++;
        if (a->desc.retire_mode == MSKV_RETIRE_IMMEDIATE) a->completed = a->step - 1;
    }
    MSKV__UNLOCK(a);
    return r;
}

/* Plans */

/* floor(x / d) for d >= 1 and every int64 x */
static int64_t mskv__floordiv(int64_t x, int64_t d) {
    int64_t q = x / d;
    return x % d != 0 && x < 0 ? q - 1 : q;
}

/* Absolute position of compacted index j of a request's stream. */
static int64_t mskv__abs_pos(const mskv_arena *a, const mskv__req *q, int64_t j) {
    int64_t split = (int64_t)q->prefix_pages * a->P;
    return j < split ? j : j + (q->live_start - split);
}

/* A position plan entry must be exact: OVERFLOW when pos - pos_offset does
   not fit in 64 bits, OUT_OF_RANGE when the 1-D position or the 3-D frame
   does not fit in int32 (rows and columns always do). */
static mskv_result mskv__pos_check(mskv_arena *a, const mskv_plan_desc *d, int64_t pos, int32_t seg) {
    int64_t rel, v;
    if (d->pos_mode == MSKV_POS_NONE) return MSKV_SUCCESS;
    if ((d->pos_offset < 0 && pos > INT64_MAX + d->pos_offset) || (d->pos_offset > 0 && pos < INT64_MIN + d->pos_offset))
        return mskv__err(a, MSKV_ERROR_OVERFLOW, "plan: segment %d: position %lld - pos_offset %lld overflows", (int)seg,
                         (long long)pos, (long long)d->pos_offset);
    rel = pos - d->pos_offset;
    v = d->pos_mode == MSKV_POS_1D ? rel : mskv__floordiv(rel, (int64_t)d->grid_h * d->grid_w);
    if (v < INT32_MIN || v > INT32_MAX)
        return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "plan: segment %d: %s %lld does not fit in int32", (int)seg,
                         d->pos_mode == MSKV_POS_1D ? "position" : "frame", (long long)v);
    return MSKV_SUCCESS;
}

static mskv_result mskv__plan_sizes(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan_desc *d,
                                    mskv_plan_size *sz, int32_t *cross_ri) {
    int32_t i, ri;
    int64_t tq = 0, ids = 0;
    mskv_result r = MSKV_SUCCESS;
    const mskv__req *x = NULL;
    if ((unsigned)d->kind > 2u || (unsigned)d->pos_mode > 2u) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: bad kind or pos_mode");
    if (d->pos_mode == MSKV_POS_3D && (d->grid_h < 1 || d->grid_w < 1)) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: 3-D positions need grid_h, grid_w >= 1");
    if (d->kind == MSKV_PLAN_CROSS) {
        ri = mskv__lookup(a, d->cross);
        if (ri < 0) return mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "plan: unknown cross entry");
        x = &a->reqs[ri];
        if (!x->keyed || !x->sealed) return mskv__err(a, MSKV_ERROR_BAD_STATE, "plan: the cross entry must be a sealed keyed entry");
        if (x->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "plan: the cross entry is offloaded");
        *cross_ri = ri;
    }
    if (d->kind == MSKV_PLAN_DENSE && n > 0 && !d->dense_kv_len) return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: dense_kv_len");
    if (d->kind != MSKV_PLAN_DENSE) r = mskv__resolve(a, segs, n, NULL, "plan");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        int64_t nt = segs[i].n_tokens;
        if (nt < 0) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: segment %d has %lld tokens", (int)i, (long long)nt);
        int64_t first, last;  /* the positions of the segment's first and last query */
        if (d->kind == MSKV_PLAN_DENSE) {
            if (d->dense_kv_len[i] < 0 || d->dense_kv_len[i] > INT32_MAX) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: dense kv length");
            if (nt > d->dense_kv_len[i])
                return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "plan: segment %d has %lld queries but only %lld tokens", (int)i, (long long)nt, (long long)d->dense_kv_len[i]);
            first = d->dense_kv_len[i] - nt;
            last = d->dense_kv_len[i] - 1;
        } else {
            const mskv__req *q = &a->reqs[mskv__lookup(a, segs[i].request)];
            int64_t len = mskv__kv_len(a, q);
            if (q->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "plan: segment %d's request is offloaded", (int)i);
            if (nt > len)
                return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "plan: segment %d has %lld queries but only %lld tokens", (int)i, (long long)nt, (long long)len);
            ids += d->kind == MSKV_PLAN_SELF ? q->num_pages : x->num_pages;
            first = mskv__abs_pos(a, q, len - nt);
            last = mskv__abs_pos(a, q, len - 1);
        }
        /* positions rise along a segment: its two ends bound every entry (the
           last first: an overflow, from a negative offset, shows there) */
        if (nt > 0 && ((r = mskv__pos_check(a, d, last, i)) != MSKV_SUCCESS || (r = mskv__pos_check(a, d, first, i)) != MSKV_SUCCESS))
            return r;
        tq += nt;
    }
    if (r != MSKV_SUCCESS) return r;
    if (tq > INT32_MAX || ids > INT32_MAX) return mskv__err(a, MSKV_ERROR_OVERFLOW, "plan: more than 2^31 queries or page ids");
    sz->batch = n;
    sz->total_q = (int32_t)tq;
    sz->num_page_ids = (int32_t)ids;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_plan_query(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan_size *out) {
    mskv_plan_desc zero;
    int32_t cross = -1;
    mskv_result r;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
    if (!desc) { memset(&zero, 0, sizeof zero); desc = &zero; }
    MSKV__LOCK(a);
    r = mskv__plan_sizes(a, segs, n, desc, out, &cross);
    MSKV__UNLOCK(a);
    return r;
}


MSKV_IMPL mskv_result mskv_plan_build(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan *p) {
    mskv_plan_desc zero;
    mskv_plan_size sz;
    int32_t cross = -1, b, i, q_at = 0, id_at = 0;
    int64_t tok_at = 0;
    mskv_result r;
    if (!a || !p) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
    if (!desc) { memset(&zero, 0, sizeof zero); desc = &zero; }
    MSKV__LOCK(a);
    r = mskv__plan_sizes(a, segs, n, desc, &sz, &cross);
    if (r == MSKV_SUCCESS && (!p->qo_indptr || !p->kv_indptr || !p->kv_last_page_len || !p->kv_len || !p->kv_pos_split ||
                              !p->kv_pos_shift || !p->kv_token_indptr || (sz.total_q > 0 && !p->slot_mapping) ||
                              (sz.num_page_ids > 0 && !p->kv_indices) ||
                              (desc->pos_mode != MSKV_POS_NONE && sz.total_q > 0 && !p->positions)))
        r = mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: an output array is NULL");
    if (r == MSKV_SUCCESS && (p->cap_batch < sz.batch || p->cap_tokens < sz.total_q || p->cap_page_ids < sz.num_page_ids))
        r = mskv__err(a, MSKV_ERROR_CAPACITY, "plan: needs batch %d, tokens %d, page ids %d; capacity %d, %d, %d", (int)sz.batch,
                      (int)sz.total_q, (int)sz.num_page_ids, (int)p->cap_batch, (int)p->cap_tokens, (int)p->cap_page_ids);
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    p->batch = sz.batch;
    p->total_q = sz.total_q;
    p->num_page_ids = sz.num_page_ids;
    p->page_size = a->P;
    p->step = a->step;
    p->generation = desc->kind == MSKV_PLAN_DENSE ? 0 : a->generation;   /* a dense plan reads no pages */
    p->cross.id = desc->kind == MSKV_PLAN_CROSS ? desc->cross.id : 0;
    if (p->requests && desc->kind != MSKV_PLAN_DENSE)   /* cap_batch entries, checked above */
        for (b = 0; b < n; b++) p->requests[b] = segs[b].request;
    p->qo_indptr[0] = 0;
    p->kv_indptr[0] = 0;
    p->kv_token_indptr[0] = 0;
    for (b = 0; b < n; b++) {
        const mskv__req *q = desc->kind == MSKV_PLAN_DENSE ? NULL : &a->reqs[mskv__lookup(a, segs[b].request)];
        const mskv__req *kv = desc->kind == MSKV_PLAN_CROSS ? &a->reqs[cross] : q;
        int32_t nq = (int32_t)segs[b].n_tokens;
        int64_t len, own_len, split, shift;
        if (kv) {
            len = mskv__kv_len(a, kv);
            split = (int64_t)kv->prefix_pages * a->P;
            if (split > len) split = len;
            shift = kv->live_start - (int64_t)kv->prefix_pages * a->P;
            if (kv->num_pages) memcpy(p->kv_indices + id_at, kv->pages, (size_t)kv->num_pages * sizeof(int32_t));
            id_at += kv->num_pages;
            p->kv_last_page_len[b] = kv->num_pages ? (int32_t)(len - (int64_t)(kv->num_pages - 1) * a->P) : 0;
        } else {
            len = desc->dense_kv_len[b];
            split = len;
            shift = 0;
            p->kv_last_page_len[b] = 0;
        }
        p->kv_len[b] = (int32_t)len;
        p->kv_pos_split[b] = (int32_t)split;
        p->kv_pos_shift[b] = (int32_t)shift;
        p->kv_indptr[b + 1] = id_at;
        tok_at += len;
        p->kv_token_indptr[b + 1] = tok_at;
        /* the segment's own tokens: the tail of its own stream (SELF, CROSS) or of the dense sequence */
        own_len = q ? mskv__kv_len(a, q) : len;
        for (i = 0; i < nq; i++) {
            int64_t j = own_len - nq + i, pos = q ? mskv__abs_pos(a, q, j) : j;
            /* only reserved tokens get a slot: a committed page may be shared with a fork */
            p->slot_mapping[q_at + i] = desc->kind == MSKV_PLAN_SELF && pos >= q->committed
                                            ? (int64_t)q->pages[j / a->P] * a->P + j % a->P : -1;
            if (desc->pos_mode == MSKV_POS_NONE) continue;
            pos -= desc->pos_offset;   /* checked by mskv__plan_sizes: exact, and in int32 */
            if (desc->pos_mode == MSKV_POS_1D) {
                p->positions[q_at + i] = (int32_t)pos;
            } else {
                int64_t tpf = (int64_t)desc->grid_h * desc->grid_w;
                int64_t f = mskv__floordiv(pos, tpf);
                int64_t rem = pos % tpf < 0 ? pos % tpf + tpf : pos % tpf;  /* f * tpf itself may not fit */
                p->positions[3 * (q_at + i) + 0] = (int32_t)f;
                p->positions[3 * (q_at + i) + 1] = (int32_t)(rem / desc->grid_w);
                p->positions[3 * (q_at + i) + 2] = (int32_t)(rem % desc->grid_w);
            }
        }
        q_at += nq;
        p->qo_indptr[b + 1] = q_at;
    }
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_plan_alloc(mskv_arena *a, int32_t cap_batch, int32_t cap_tokens, int32_t cap_page_ids, mskv_plan *p) {
    size_t b, t, ids, total = 0, off = 0, eights, fours;
    unsigned char *mem;
    if (!a || !p) return MSKV_ERROR_NULL_POINTER;
    if (cap_batch < 0 || cap_tokens < 0 || cap_page_ids < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    b = (size_t)cap_batch;
    t = (size_t)cap_tokens;
    ids = (size_t)cap_page_ids;
    /* 8-byte arrays first, then 4-byte ones: natural alignment without padding.
       Elements: (b + 1) + t eights; 2 (b + 1) + ids + 5 b + 3 t fours (the
       requests' handles are 4 bytes). Checked: with a 32-bit size_t they overflow. */
    if (!mskv__add(b + 1, t, &eights) || !mskv__mul(eights, 8, &eights) || !mskv__mul(b, 7, &fours) ||
        !mskv__add(fours, 2, &fours) || !mskv__add(fours, ids, &fours) || !mskv__mul(t, 3, &total) ||
        !mskv__add(fours, total, &fours) || !mskv__mul(fours, 4, &fours) || !mskv__add(eights, fours, &total))
        return mskv__err(a, MSKV_ERROR_OVERFLOW, "plan_alloc: capacities %d, %d, %d", (int)cap_batch, (int)cap_tokens, (int)cap_page_ids);
    mem = (unsigned char *)mskv__alloc(&a->al, total);
    if (!mem) return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "plan_alloc: %zu bytes", total);
    memset(p, 0, sizeof *p);
    p->owned = mem;
    p->kv_token_indptr = (int64_t *)(void *)(mem + off); off += (b + 1) * 8;
    p->slot_mapping = (int64_t *)(void *)(mem + off); off += t * 8;
    p->qo_indptr = (int32_t *)(void *)(mem + off); off += (b + 1) * 4;
    p->kv_indptr = (int32_t *)(void *)(mem + off); off += (b + 1) * 4;
    p->kv_indices = (int32_t *)(void *)(mem + off); off += ids * 4;
    p->kv_last_page_len = (int32_t *)(void *)(mem + off); off += b * 4;
    p->kv_len = (int32_t *)(void *)(mem + off); off += b * 4;
    p->kv_pos_split = (int32_t *)(void *)(mem + off); off += b * 4;
    p->kv_pos_shift = (int32_t *)(void *)(mem + off); off += b * 4;
    p->requests = (mskv_request *)(void *)(mem + off); off += b * sizeof(mskv_request);
    p->positions = (int32_t *)(void *)(mem + off); off += t * 4 * 3;
    MSKV_ASSERT(off == total);
    p->cap_batch = cap_batch;
    p->cap_tokens = cap_tokens;
    p->cap_page_ids = cap_page_ids;
    return MSKV_SUCCESS;
}

MSKV_IMPL void mskv_plan_free(mskv_arena *a, mskv_plan *p) {
    if (!a || !p) return;
    mskv__free(&a->al, p->owned);
    memset(p, 0, sizeof *p);
}

MSKV_IMPL mskv_result mskv_plan_validate(const mskv_plan *p, int32_t num_pages, char *why, size_t cap) {
    int32_t b, i, P;
    if (!p) return MSKV_ERROR_NULL_POINTER;
    P = p->page_size;
#define MSKV__BAD(...) do { mskv__why(why, cap, __VA_ARGS__); return MSKV_ERROR_INVALID_ARGUMENT; } while (0)
    if (p->batch < 0 || p->total_q < 0 || p->num_page_ids < 0 || P < 1) MSKV__BAD("negative sizes or page_size < 1");
    if (!p->qo_indptr || !p->kv_indptr || !p->kv_last_page_len || !p->kv_len || (p->num_page_ids > 0 && !p->kv_indices))
        MSKV__BAD("a plan array is NULL");
    if (p->qo_indptr[0] != 0 || p->kv_indptr[0] != 0) MSKV__BAD("indptr[0] must be 0");
    for (b = 0; b < p->batch; b++) {
        int64_t np = (int64_t)p->kv_indptr[b + 1] - p->kv_indptr[b];
        int32_t last = p->kv_last_page_len[b];
        if (p->qo_indptr[b + 1] < p->qo_indptr[b]) MSKV__BAD("qo_indptr decreases at %d", (int)b);
        if (np < 0) MSKV__BAD("kv_indptr decreases at %d", (int)b);
        /* kv_indices holds num_page_ids ids: nothing past them is read */
        if (p->kv_indptr[b + 1] > p->num_page_ids)
            MSKV__BAD("kv_indptr[%d] = %d is past num_page_ids %d", (int)b + 1, (int)p->kv_indptr[b + 1], (int)p->num_page_ids);
        if (np > 0 && (last < 1 || last > P)) MSKV__BAD("kv_last_page_len[%d] = %d outside [1, %d]", (int)b, (int)last, (int)P);
        if (np == 0 && last != 0) MSKV__BAD("kv_last_page_len[%d] = %d for a sequence without pages", (int)b, (int)last);
        if (np > 0 && (int64_t)p->kv_len[b] != (int64_t)(np - 1) * P + last) MSKV__BAD("kv_len[%d] = %d does not match its pages", (int)b, (int)p->kv_len[b]);
        if (p->kv_pos_split && (p->kv_pos_split[b] < 0 || p->kv_pos_split[b] > p->kv_len[b])) MSKV__BAD("kv_pos_split[%d] outside [0, kv_len]", (int)b);
        if (p->kv_pos_shift && p->kv_pos_shift[b] < 0) MSKV__BAD("kv_pos_shift[%d] is negative", (int)b);
        for (i = p->kv_indptr[b]; i < p->kv_indptr[b + 1]; i++) {
            int32_t k;
            if (p->kv_indices[i] == 0) MSKV__BAD("null page inside sequence %d", (int)b);
            if (p->kv_indices[i] < 0 || p->kv_indices[i] >= num_pages) MSKV__BAD("page %d out of range in sequence %d", (int)p->kv_indices[i], (int)b);
            for (k = p->kv_indptr[b]; k < i; k++)
                if (p->kv_indices[k] == p->kv_indices[i]) MSKV__BAD("page %d twice in sequence %d", (int)p->kv_indices[i], (int)b);
        }
    }
    if (p->qo_indptr[p->batch] != p->total_q) MSKV__BAD("qo_indptr[batch] != total_q");
    if (p->kv_indptr[p->batch] != p->num_page_ids) MSKV__BAD("kv_indptr[batch] != num_page_ids");
#undef MSKV__BAD
    mskv__why(why, cap, "ok");
    return MSKV_SUCCESS;
}

/* A request a plan reads: still there, and no page left it since generation g. */
static int mskv__plan_req_current(const mskv_arena *a, mskv_request h, uint64_t g) {
    int32_t ri = mskv__lookup(a, h);
    return ri >= 0 && a->reqs[ri].shrunk <= g;
}

MSKV_IMPL mskv_result mskv_plan_check(mskv_arena *a, const mskv_plan *p) {
    int ok = 1;
    int32_t b;
    if (!a || !p) return MSKV_ERROR_NULL_POINTER;
    if (p->generation == 0) return MSKV_SUCCESS;
    MSKV__LOCK(a);
    if (p->generation != a->generation) {   /* something lost pages since the build: whose? */
        if (p->generation > a->generation) ok = 0;              /* not a generation of this arena */
        else if (p->cross.id) ok = mskv__plan_req_current(a, p->cross, p->generation);
        else if (!p->requests) ok = 0;
        else
            for (b = 0; ok && b < p->batch; b++) ok = mskv__plan_req_current(a, p->requests[b], p->generation);
    }
    MSKV__UNLOCK(a);
    return ok ? MSKV_SUCCESS
              : mskv__err(a, MSKV_ERROR_STALE_PLAN, "plan built at generation %llu is stale: pages left one of its requests since",
                          (unsigned long long)p->generation);
}

/* Keyed entries */

MSKV_IMPL mskv_result mskv_keyed_create(mskv_arena *a, uint64_t key, int64_t n_tokens, mskv_request *out) {
    int32_t ri, need;
    mskv__req *q;
    mskv_result r;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    if (n_tokens < 1) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n_tokens > (int64_t)INT32_MAX - a->P) return MSKV_ERROR_OVERFLOW;
    MSKV__LOCK(a);
    if (mskv__find_key(a, key) >= 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_DUPLICATE, "keyed_create: key exists"); }
    need = mskv__ceil_div(n_tokens, a->P);
    /* the header's order of resources: a request slot before pages */
    if (a->req_free_top == 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "keyed_create: no request slot"); }
    if (need > a->free_top) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "keyed_create: need %d pages, %d free", (int)need, (int)a->free_top); }
    ri = mskv__new_req(a);
    if (ri < 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "keyed_create: no request slot"); }
    q = &a->reqs[ri];
    r = mskv__reserve_table(a, q, need);
    if (r != MSKV_SUCCESS) {
        mskv__undo_new_req(a, ri);
        MSKV__UNLOCK(a);
        return r;
    }
    r = mskv__take(a, need, q->pages);
    MSKV_ASSERT(r == MSKV_SUCCESS);
    q->num_pages = need;
    q->keyed = 1;
    q->key = key;
    q->reserved = n_tokens;
    q->has_res = 1;
    *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_keyed_seal(mskv_arena *a, mskv_request h) {
    int32_t ri;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (!q->keyed) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "keyed_seal: not a keyed entry");
    else if (q->sealed) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "keyed_seal: already sealed");
    else if (q->location != MSKV_RESIDENT) r = mskv__err(a, MSKV_ERROR_OFFLOADED, "keyed_seal: offloaded");
    if (r == MSKV_SUCCESS) {
        q->committed = q->reserved;
        q->published = q->committed;
        q->reserved = 0;
        q->has_res = 0;
        q->sealed = 1;
    }
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_keyed_find(mskv_arena *a, uint64_t key, mskv_request *out) {
    int32_t ri;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    ri = mskv__find_key(a, key);
    if (ri >= 0) *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return ri >= 0 ? MSKV_SUCCESS : MSKV_ERROR_NOT_FOUND;
}

MSKV_IMPL mskv_result mskv_keyed_remove(mskv_arena *a, uint64_t key) {
    int32_t ri;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    ri = mskv__find_key(a, key);
    if (ri >= 0) mskv__del_req(a, ri);
    MSKV__UNLOCK(a);
    return ri >= 0 ? MSKV_SUCCESS : mskv__err(a, MSKV_ERROR_NOT_FOUND, "keyed_remove: no such key");
}

/* Windowed session */

MSKV_IMPL mskv_result mskv_session_init(mskv_session *s, mskv_arena *a, mskv_request req, const mskv_retention *r) {
    mskv_result res;
    if (!s || !a || !r) return MSKV_ERROR_NULL_POINTER;
    res = mskv_request_set_retention(a, req, r);
    if (res != MSKV_SUCCESS) return res;
    memset(s, 0, sizeof *s);
    s->arena = a;
    s->request = req;
    s->retention = *r;
    s->retention.window_tokens = r->window_chunks * r->chunk_size;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_session_begin_chunk(mskv_session *s, int64_t n_tokens) {
    mskv_segment seg;
    mskv_result r;
    if (!s || !s->arena) return MSKV_ERROR_NULL_POINTER;
    if (s->chunk_tokens > 0) return MSKV_ERROR_RESERVATION_PENDING;
    if (n_tokens < 1) return MSKV_ERROR_INVALID_ARGUMENT;
    seg.request = s->request;
    seg.n_tokens = n_tokens;
    r = mskv_admit(s->arena, &seg, 1);
    if (r == MSKV_SUCCESS) s->chunk_tokens = n_tokens;
    return r;
}

MSKV_IMPL mskv_result mskv_session_plan(mskv_session *s, const mskv_plan_desc *desc, mskv_plan *plan) {
    mskv_segment seg;
    if (!s || !s->arena) return MSKV_ERROR_NULL_POINTER;
    if (s->chunk_tokens == 0) return MSKV_ERROR_NO_RESERVATION;
    seg.request = s->request;
    seg.n_tokens = s->chunk_tokens;
    return mskv_plan_build(s->arena, &seg, 1, desc, plan);
}

MSKV_IMPL mskv_result mskv_session_commit_chunk(mskv_session *s, uint64_t *step_out) {
    mskv_segment seg;
    mskv_request_info before, after;
    mskv_result r;
    if (!s || !s->arena) return MSKV_ERROR_NULL_POINTER;
    if (s->chunk_tokens == 0) return MSKV_ERROR_NO_RESERVATION;
    seg.request = s->request;
    seg.n_tokens = s->chunk_tokens;
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    r = mskv_request_info_get(s->arena, s->request, &before);
    if (r == MSKV_SUCCESS) r = mskv_commit(s->arena, &seg, 1);
    if (r != MSKV_SUCCESS) return r;
    s->chunk_tokens = 0;
    s->chunks_done++;
    r = mskv_publish(s->arena, &seg, 1, step_out);
    if (r == MSKV_SUCCESS && mskv_request_info_get(s->arena, s->request, &after) == MSKV_SUCCESS)
        s->released_total += (after.live_start - after.prefix_pages * (int64_t)s->arena->P) -
                             (before.live_start - before.prefix_pages * (int64_t)s->arena->P);
    return r;
}

MSKV_IMPL mskv_result mskv_session_abort_chunk(mskv_session *s) {
    mskv_segment seg;
    mskv_result r;
    if (!s || !s->arena) return MSKV_ERROR_NULL_POINTER;
    if (s->chunk_tokens == 0) return MSKV_ERROR_NO_RESERVATION;
    seg.request = s->request;
    seg.n_tokens = s->chunk_tokens;
    r = mskv_abort(s->arena, &seg, 1);
    if (r == MSKV_SUCCESS) s->chunk_tokens = 0;
    return r;
}

/* // >>audit ------------------------------------------------------------- */

MSKV_IMPL mskv_result mskv_arena_audit(mskv_arena *a, char *why, size_t cap) {
    int32_t i, j, nfree = 0, nlive = 0, npend = 0, nreq = 0;
    int64_t off = 0;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
#define MSKV__FAIL(...) do { mskv__why(why, cap, __VA_ARGS__); r = MSKV_ERROR_AUDIT_FAILED; goto done; } while (0)
    if (a->state[0] != MSKV__PAGE_NULL || a->refcount[0] != 0) MSKV__FAIL("the null page 0 changed state");
    memset(a->scratch, 0, (size_t)a->num_pages * sizeof(int32_t));
    for (i = 0; i < a->free_top; i++) {
        int32_t p = a->free_stack[i];
        if (p <= 0 || p >= a->num_pages) MSKV__FAIL("free list holds page %d, out of range", (int)p);
        if (a->state[p] != MSKV__PAGE_FREE) MSKV__FAIL("free list holds page %d whose state is %d", (int)p, (int)a->state[p]);
        if (a->scratch[p]) MSKV__FAIL("page %d is twice in the free list", (int)p);
        a->scratch[p] = 1;
    }
    for (i = 0; i < a->pend_count; i++) {
        int32_t at = (a->pend_head + i) % a->num_pages, p = a->pend_page[at];
        if (p <= 0 || p >= a->num_pages) MSKV__FAIL("pending list holds page %d, out of range", (int)p);
        if (a->state[p] != MSKV__PAGE_PENDING || a->scratch[p]) MSKV__FAIL("pending page %d is listed twice or has state %d", (int)p, (int)a->state[p]);
        if (i > 0 && a->pend_fence[at] < a->pend_fence[(at + a->num_pages - 1) % a->num_pages]) MSKV__FAIL("pending fences out of order");
        if (a->pend_fence[at] > a->step) MSKV__FAIL("page %d pending on a future fence", (int)p);
        a->scratch[p] = 1;
    }
    for (i = 1; i < a->num_pages; i++) {
        nfree += a->state[i] == MSKV__PAGE_FREE;
        nlive += a->state[i] == MSKV__PAGE_LIVE;
        npend += a->state[i] == MSKV__PAGE_PENDING;
        if (a->state[i] == MSKV__PAGE_NULL) MSKV__FAIL("page %d has the null state", (int)i);
        if (a->state[i] != MSKV__PAGE_LIVE && a->refcount[i] != 0) MSKV__FAIL("page %d is not live but has %d references", (int)i, (int)a->refcount[i]);
        if (a->state[i] == MSKV__PAGE_LIVE && a->scratch[i]) MSKV__FAIL("live page %d is in a free or pending list", (int)i);
        if (a->state[i] != MSKV__PAGE_LIVE && !a->scratch[i]) MSKV__FAIL("page %d is neither live nor listed (lost)", (int)i);
    }
    if (nfree != a->free_top || npend != a->pend_count) MSKV__FAIL("free/pending counts disagree with the lists");
    if (nfree + nlive + npend + 1 != a->num_pages) MSKV__FAIL("conservation: free %d + live %d + pending %d + null != %d", (int)nfree, (int)nlive, (int)npend, (int)a->num_pages);
    if (a->desc.retire_mode == MSKV_RETIRE_IMMEDIATE && npend) MSKV__FAIL("pending pages in immediate mode");
    /* count references from tables; scratch now counts refs */
    memset(a->scratch, 0, (size_t)a->num_pages * sizeof(int32_t));
    for (i = 0; i < a->max_req; i++) {
        const mskv__req *q = &a->reqs[i];
        int64_t end;
        if (!q->used) continue;
        nreq++;
        end = q->committed + q->reserved;
        if (q->committed < 0 || q->reserved < 0 || (q->reserved > 0 && !q->has_res)) MSKV__FAIL("request %d: bad token counts", (int)i);
        if (q->prefix_tokens < 0 || q->prefix_tokens > q->committed) MSKV__FAIL("request %d: prefix %lld beyond committed %lld", (int)i, (long long)q->prefix_tokens, (long long)q->committed);
        if (q->prefix_pages != mskv__ceil_div(q->prefix_tokens, a->P)) MSKV__FAIL("request %d: prefix pages %d do not cover the prefix", (int)i, (int)q->prefix_pages);
        if (q->live_start % a->P != 0 || q->live_start < (int64_t)q->prefix_pages * a->P) MSKV__FAIL("request %d: live_start %lld misplaced", (int)i, (long long)q->live_start);
        if (q->live_start > (int64_t)q->prefix_pages * a->P && q->live_start > q->committed) MSKV__FAIL("request %d: released past the committed tokens", (int)i);
        if (q->published > q->committed) MSKV__FAIL("request %d: published past committed", (int)i);
        if (q->keyed && q->sealed && q->has_res) MSKV__FAIL("request %d: sealed entry with a reservation", (int)i);
        if (q->location == MSKV_OFFLOADED) {
            if (q->num_pages != 0 || q->has_res) MSKV__FAIL("request %d: offloaded but holds pages or a reservation", (int)i);
            if (q->host_pages != mskv__entries_for(a, q, end)) MSKV__FAIL("request %d: host copy has %d pages, expected %d", (int)i, (int)q->host_pages, (int)mskv__entries_for(a, q, end));
            if ((q->host == NULL) != (q->host_pages == 0 || a->record_bytes == 0)) MSKV__FAIL("request %d: host copy missing", (int)i);
            off += q->host_pages;
            continue;
        }
        if (q->host || q->host_pages) MSKV__FAIL("request %d: resident but holds a host copy", (int)i);
        if (q->num_pages != mskv__entries_for(a, q, end)) MSKV__FAIL("request %d: table has %d pages, tokens need %d", (int)i, (int)q->num_pages, (int)mskv__entries_for(a, q, end));
        for (j = 0; j < q->num_pages; j++) {
            int32_t p = q->pages[j], k;
            if (p <= 0 || p >= a->num_pages) MSKV__FAIL("request %d: table entry %d is page %d (null or out of range)", (int)i, (int)j, (int)p);
            if (a->state[p] != MSKV__PAGE_LIVE) MSKV__FAIL("request %d: table holds page %d which is not live", (int)i, (int)p);
            for (k = 0; k < j; k++) if (q->pages[k] == p) MSKV__FAIL("request %d: page %d twice in its table", (int)i, (int)p);
            a->scratch[p]++;
        }
    }
    if (nreq != a->nreq || nreq + a->req_free_top != a->max_req) MSKV__FAIL("request count %d disagrees (%d used, %d free slots)", (int)nreq, (int)a->nreq, (int)a->req_free_top);
    if (off != a->offloaded_pages) MSKV__FAIL("offloaded pages %lld != sum of host copies %lld", (long long)a->offloaded_pages, (long long)off);
    for (i = 1; i < a->num_pages; i++)
        if (a->state[i] == MSKV__PAGE_LIVE && a->refcount[i] != a->scratch[i])
            MSKV__FAIL("page %d has refcount %d but %d owners", (int)i, (int)a->refcount[i], (int)a->scratch[i]);
    mskv__why(why, cap, "ok");
done:
#undef MSKV__FAIL
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_arena_audit_bytes(mskv_arena *a, char *why, size_t cap) {
    mskv_result r;
    int32_t p, i;
    size_t k;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if ((r = mskv_arena_audit(a, why, cap)) != MSKV_SUCCESS) return r;
    if (!a->debug) {
        mskv__why(why, cap, "the arena runs no debug check (mskv_arena_desc.debug, MSKV_DEBUG)");
        return MSKV_ERROR_UNSUPPORTED;
    }
    MSKV__LOCK(a);
    for (p = 1; r == MSKV_SUCCESS && (a->debug & MSKV_DEBUG_POISON) && a->record_bytes && p < a->num_pages; p++) {
        unsigned char *rec = a->dbg_rec + a->record_bytes;
        if (a->state[p] != MSKV__PAGE_FREE || !a->poisoned[p]) continue;
        if ((r = mskv__read_pages(a, &p, 1, rec)) != MSKV_SUCCESS) {   /* a device store's through its ops */
            mskv__why(why, cap, "reading free page %d failed: %s", (int)p, mskv_result_string(r));
            break;
        }
        for (k = 0; k < a->record_bytes; k++)
            if (rec[k] != MSKV_POISON_BYTE) {
                mskv__why(why, cap, "free page %d was written after it was freed (byte %zu of layer %zu %s)", (int)p,
                          k % a->store.page_bytes, k / a->store.page_bytes / 2, (k / a->store.page_bytes) % 2 ? "V" : "K");
                r = MSKV_ERROR_AUDIT_FAILED;
                break;
            }
    }
    for (i = 0; r == MSKV_SUCCESS && (a->debug & MSKV_DEBUG_CHECKSUMS) && i < a->max_req; i++) {
        int32_t bad = a->reqs[i].used ? mskv__sums_bad(a, &a->reqs[i]) : -1;
        if (bad >= 0) {
            mskv__why(why, cap, "request %d: page %d of its host copy changed since it was made", (int)i, (int)bad);
            r = MSKV_ERROR_AUDIT_FAILED;
        }
    }
    if (r == MSKV_SUCCESS) mskv__why(why, cap, "ok");
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL uint64_t mskv_arena_digest(mskv_arena *a) {
    mskv__hash h;
    int32_t i;
    if (!a) return 0;
    MSKV__LOCK(a);
    mskv__hash_init(&h);
    mskv__hash_u64(&h, a->step);
    mskv__hash_u64(&h, a->completed);
    mskv__hash_u64(&h, a->epoch_counter);
    mskv__hash_u64(&h, a->generation);
    mskv__hash_u64(&h, (uint64_t)a->free_top);
    mskv__hash_update(&h, a->free_stack, (size_t)a->free_top * sizeof(int32_t));
    for (i = 0; i < a->pend_count; i++) {
        int32_t at = (a->pend_head + i) % a->num_pages;
        mskv__hash_u64(&h, (uint64_t)a->pend_page[at]);
        mskv__hash_u64(&h, a->pend_fence[at]);
    }
    mskv__hash_update(&h, a->state, (size_t)a->num_pages);
    mskv__hash_update(&h, a->refcount, (size_t)a->num_pages * sizeof(int32_t));
    mskv__hash_u64(&h, (uint64_t)a->req_free_top);
    mskv__hash_update(&h, a->req_free, (size_t)a->req_free_top * sizeof(int32_t));
    for (i = 0; i < a->max_req; i++) {
        const mskv__req *q = &a->reqs[i];
        mskv__hash_u64(&h, (uint64_t)q->gen << 8 | q->used);
        if (!q->used) continue;
        mskv__hash_u64(&h, (uint64_t)q->location | (uint64_t)q->keyed << 8 | (uint64_t)q->sealed << 16 |
                               (uint64_t)q->has_res << 24 | (uint64_t)q->has_ret << 32 | (uint64_t)q->paused << 40);
        mskv__hash_u64(&h, (uint64_t)q->committed);
        mskv__hash_u64(&h, (uint64_t)q->reserved);
        mskv__hash_u64(&h, (uint64_t)q->prefix_tokens);
        mskv__hash_u64(&h, (uint64_t)q->live_start);
        mskv__hash_u64(&h, (uint64_t)q->published);
        mskv__hash_u64(&h, (uint64_t)q->prefix_pages);
        mskv__hash_u64(&h, q->epoch);
        mskv__hash_u64(&h, q->shrunk);
        mskv__hash_u64(&h, q->key);
        mskv__hash_update(&h, &q->retention, sizeof q->retention);
        mskv__hash_u64(&h, (uint64_t)q->num_pages);
        if (q->num_pages) mskv__hash_update(&h, q->pages, (size_t)q->num_pages * sizeof(int32_t));
        mskv__hash_u64(&h, (uint64_t)q->host_pages);
        if (q->host) mskv__hash_update(&h, q->host, (size_t)q->host_pages * a->record_bytes);
    }
    MSKV__UNLOCK(a);
    return mskv__hash_final(&h);
}

#ifdef __cplusplus
}
#endif

/* // >>cpu backend (implementation) ---------------------------------------
   Uses the public API, the core's allocation helpers and its own static
   mskv__cpu_* helpers.

   Attention is a flash-style loop: a work item is (segment, block of query
   rows, KV head); its rows are all (query token, q head of the GQA group)
   pairs, so every K/V row is converted once per key block and reused by
   every row. Scores Q.K^T come from a transposed K block (an axpy over keys,
   which vectorises without -ffast-math), the softmax is online (running max
   and sum per row), and P.V accumulates into an f32 row block. With 8 rows
   or fewer (decode), transposing K would cost more than the products: the
   scores are dot products over K rows instead, and one item takes several
   KV heads so that whole slot rows stream from memory in address order.
   With GCC/Clang the inner tiles use vector extensions (8 lanes with AVX,
   else 4), so the speed does not depend on the auto-vectoriser; elsewhere
   plain loops compute the same thing (MSKV_CPU_NO_SIMD forces them). */

#include <string.h>
#include <math.h>
#include <stdlib.h>
#ifndef MSKV_NO_THREADS
#include <pthread.h>
#endif

#ifdef __cplusplus
#define MSKV__CPU_RESTRICT __restrict
#else
#define MSKV__CPU_RESTRICT restrict
#endif

#define MSKV__CPU_MAX_DIM MSKV_CPU_MAX_HEAD_DIM
#define MSKV__CPU_KTILE 16      /* keys and dims are padded to this in the f32 tiles */
#define MSKV__CPU_SMALL_FLOPS 4.0e6 /* below this a call runs on the caller alone */

/* ---- half <-> float -------------------------------------------------------- */

static uint32_t mskv__cpu_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float mskv__cpu_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

MSKV_IMPL uint16_t mskv_f32_to_f16(float f) {
    uint32_t x = mskv__cpu_fbits(f);
    uint32_t sign = (x >> 16) & 0x8000u, r, rem;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf stays inf, NaN stays a (quiet) NaN */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (x < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        uint32_t e = x >> 23, m, shift, half;
        if (e < 102) return (uint16_t)sign; /* < 2^-25 (ties at 2^-25 go to even 0) */
        m = (x & 0x7fffffu) | 0x800000u;
        shift = 126 - e;  /* 14..24: units of 2^-24 */
        r = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    r = (x - 0x38000000u) >> 13; /* rebias 127 -> 15, keep 10 mantissa bits */
    rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++; /* a carry into the exponent is right */
    return (uint16_t)(sign | r);
}

MSKV_IMPL float mskv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, u;
    /* Place the 15 bits in a float and multiply by 2^112: exact for normals
       and subnormals alike (the subnormal input becomes a float denormal). */
    u = mskv__cpu_fbits(mskv__cpu_bitsf(em << 13) * mskv__cpu_bitsf(0x77800000u));
    if (em >= 0x7c00u) u = 0x7f800000u | ((em & 0x3ffu) << 13);
    return mskv__cpu_bitsf(u | sign);
}

MSKV_IMPL uint16_t mskv_f32_to_bf16(float f) {
    uint32_t x = mskv__cpu_fbits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

MSKV_IMPL float mskv_bf16_to_f32(uint16_t h) { return mskv__cpu_bitsf((uint32_t)h << 16); }

/* Rows of n elements of dtype t to f32 and back. */
static void mskv__cpu_load(float *MSKV__CPU_RESTRICT dst, const void *src, mskv_dtype t, int64_t n) {
    int64_t i;
    if (t == MSKV_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (t == MSKV_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (i = 0; i < n; i++) dst[i] = mskv__cpu_bitsf((uint32_t)s[i] << 16);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (i = 0; i < n; i++) dst[i] = mskv_f16_to_f32(s[i]);
    }
}

static void mskv__cpu_store(void *dst, mskv_dtype t, const float *MSKV__CPU_RESTRICT src, int64_t n) {
    int64_t i;
    if (t == MSKV_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (t == MSKV_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (i = 0; i < n; i++) d[i] = mskv_f32_to_bf16(src[i]);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (i = 0; i < n; i++) d[i] = mskv_f32_to_f16(src[i]);
    }
}

static int mskv__cpu_dtype_ok(mskv_dtype t) {
    return t == MSKV_DTYPE_F32 || t == MSKV_DTYPE_F16 || t == MSKV_DTYPE_BF16;
}
static size_t mskv__cpu_esize(mskv_dtype t) { return t == MSKV_DTYPE_F32 ? 4u : 2u; }

/* ---- RoPE ------------------------------------------------------------------ */

typedef struct mskv__cpu_rope_parts {
    int32_t nparts, off[3], width[3];
    int interleaved;
    double log_theta;
} mskv__cpu_rope_parts;

static mskv_result mskv__cpu_rope_resolve(const mskv_rope *r, int32_t head_dim, mskv__cpu_rope_parts *out) {
    int32_t k, sum = 0;
    double theta;
    if (head_dim <= 0 || head_dim > MSKV__CPU_MAX_DIM) return MSKV_ERROR_INVALID_ARGUMENT;
    if (r->style != MSKV_ROPE_HALF && r->style != MSKV_ROPE_INTERLEAVED) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(r->theta >= 0.0f) || r->theta == INFINITY) return MSKV_ERROR_INVALID_ARGUMENT;
    theta = r->theta > 0.0f ? (double)r->theta : 10000.0;
    memset(out, 0, sizeof(*out));
    out->interleaved = r->style == MSKV_ROPE_INTERLEAVED;
    out->log_theta = log(theta);
    if (r->mode == MSKV_POS_1D) {
        out->nparts = 1;
        out->width[0] = r->dims[0] ? r->dims[0] : (head_dim & ~1);
    } else if (r->mode == MSKV_POS_3D) {
        out->nparts = 3;
        if (r->dims[0] == 0 && r->dims[1] == 0 && r->dims[2] == 0) {
            int32_t p = head_dim / 2;
            out->width[1] = out->width[2] = 2 * (p / 3);
            out->width[0] = 2 * (p - 2 * (p / 3));
        } else {
            for (k = 0; k < 3; k++) out->width[k] = r->dims[k];
        }
    } else {
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    for (k = 0; k < out->nparts; k++) {
        if (out->width[k] < 0 || (out->width[k] & 1)) return MSKV_ERROR_INVALID_ARGUMENT;
        out->off[k] = sum;
        sum += out->width[k];
        if (sum > head_dim) return MSKV_ERROR_INVALID_ARGUMENT;
    }
    return MSKV_SUCCESS;
}

/* cos/sin of every pair of one token (pairs ordered part by part). Angles in
   double: positions reach 10^5 and more, where a float angle loses radians. */
static void mskv__cpu_rope_angles(const mskv__cpu_rope_parts *rp, const int32_t *pos, float *c, float *s) {
    int32_t k, i, n = 0;
    for (k = 0; k < rp->nparts; k++) {
        int32_t w = rp->width[k];
        for (i = 0; i < w / 2; i++, n++) {
            double inv_freq = exp(-(double)(2 * i) / (double)w * rp->log_theta);
            double a = (double)pos[k] * inv_freq;
            c[n] = (float)cos(a);
            s[n] = (float)sin(a);
        }
    }
}

static void mskv__cpu_rope_row(const mskv__cpu_rope_parts *rp, float *x, const float *c, const float *s) {
    int32_t k, i, n = 0;
    for (k = 0; k < rp->nparts; k++) {
        int32_t w = rp->width[k], h = w / 2;
        float *p = x + rp->off[k];
        for (i = 0; i < h; i++, n++) {
            int32_t e0 = rp->interleaved ? 2 * i : i, e1 = rp->interleaved ? 2 * i + 1 : i + h;
            float a = p[e0], b = p[e1];
            p[e0] = a * c[n] - b * s[n];
            p[e1] = a * s[n] + b * c[n];
        }
    }
}

MSKV_IMPL mskv_result mskv_rope_apply(const mskv_rope *rope, void *x, mskv_dtype dtype, int64_t n,
                                     int32_t heads, int32_t head_dim, const int32_t *positions) {
    mskv__cpu_rope_parts rp;
    float row[MSKV__CPU_MAX_DIM], c[MSKV__CPU_MAX_DIM / 2], s[MSKV__CPU_MAX_DIM / 2];
    int64_t t;
    int32_t h, stride;
    size_t es;
    mskv_result res;
    if (!rope) return MSKV_ERROR_NULL_POINTER;
    if (n < 0 || heads <= 0 || !mskv__cpu_dtype_ok(dtype)) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((res = mskv__cpu_rope_resolve(rope, head_dim, &rp)) != MSKV_SUCCESS) return res;
    if (n == 0) return MSKV_SUCCESS;
    if (!x || !positions) return MSKV_ERROR_NULL_POINTER;
    stride = rope->mode == MSKV_POS_3D ? 3 : 1;
    es = mskv__cpu_esize(dtype);
    for (t = 0; t < n; t++) {
        mskv__cpu_rope_angles(&rp, positions + t * stride, c, s);
        for (h = 0; h < heads; h++) {
            unsigned char *p = (unsigned char *)x + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)head_dim * es;
            mskv__cpu_load(row, p, dtype, head_dim);
            mskv__cpu_rope_row(&rp, row, c, s);
            mskv__cpu_store(p, dtype, row, head_dim);
        }
    }
    return MSKV_SUCCESS;
}

/* ---- K/V write --------------------------------------------------------------- */

static mskv_result mskv__cpu_write_kv(void *k_pool, void *v_pool, mskv_dtype pool_t, int32_t num_pages,
                                      int32_t page_size, int32_t kv_heads, int32_t head_dim,
                                      const mskv_plan *plan, const void *k, const void *v,
                                      mskv_dtype src_t, const mskv_rope *rope) {
    mskv__cpu_rope_parts rp;
    float row[MSKV__CPU_MAX_DIM], c[MSKV__CPU_MAX_DIM / 2], s[MSKV__CPU_MAX_DIM / 2];
    int64_t t, n, slots;
    int32_t h, pstride = 1;
    size_t pes, ses, row_elems;
    mskv_result res;
    if (!plan) return MSKV_ERROR_NULL_POINTER;
    if (!mskv__cpu_dtype_ok(pool_t) || !mskv__cpu_dtype_ok(src_t)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (num_pages < 1 || page_size < 1 || kv_heads < 1 || head_dim < 1 || head_dim > MSKV__CPU_MAX_DIM)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != page_size || plan->total_q < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (rope) {
        if ((res = mskv__cpu_rope_resolve(rope, head_dim, &rp)) != MSKV_SUCCESS) return res;
        pstride = rope->mode == MSKV_POS_3D ? 3 : 1;
    }
    n = plan->total_q;
    if (n == 0) return MSKV_SUCCESS;
    if (!k_pool || !v_pool || !k || !v || !plan->slot_mapping) return MSKV_ERROR_NULL_POINTER;
    if (rope && !plan->positions) return MSKV_ERROR_NULL_POINTER;
    slots = (int64_t)num_pages * page_size;
    /* Every slot is checked before any byte moves: a bad plan writes nothing. */
    for (t = 0; t < n; t++) {
        int64_t sl = plan->slot_mapping[t];
        if (sl < 0) continue;
        if (sl >= slots || sl < page_size) return MSKV_ERROR_OUT_OF_RANGE; /* past the pool, or the null page */
    }
    pes = mskv__cpu_esize(pool_t);
    ses = mskv__cpu_esize(src_t);
    row_elems = (size_t)kv_heads * (size_t)head_dim;
    for (t = 0; t < n; t++) {
        int64_t sl = plan->slot_mapping[t];
        const unsigned char *ks = (const unsigned char *)k + (size_t)t * row_elems * ses;
        const unsigned char *vs = (const unsigned char *)v + (size_t)t * row_elems * ses;
        unsigned char *kd, *vd;
        if (sl < 0) continue;
        kd = (unsigned char *)k_pool + (size_t)sl * row_elems * pes;
        vd = (unsigned char *)v_pool + (size_t)sl * row_elems * pes;
        if (rope) mskv__cpu_rope_angles(&rp, plan->positions + t * pstride, c, s);
        if (src_t == pool_t) {
            memcpy(vd, vs, row_elems * pes);
            if (!rope) memcpy(kd, ks, row_elems * pes);
        } else {
            for (h = 0; h < kv_heads; h++) {
                mskv__cpu_load(row, vs + (size_t)h * (size_t)head_dim * ses, src_t, head_dim);
                mskv__cpu_store(vd + (size_t)h * (size_t)head_dim * pes, pool_t, row, head_dim);
            }
        }
        if (rope || src_t != pool_t) {
            for (h = 0; h < kv_heads; h++) {
                mskv__cpu_load(row, ks + (size_t)h * (size_t)head_dim * ses, src_t, head_dim);
                if (rope) mskv__cpu_rope_row(&rp, row, c, s);
                mskv__cpu_store(kd + (size_t)h * (size_t)head_dim * pes, pool_t, row, head_dim);
            }
        }
    }
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_write_kv_pools(const mskv_pools *pools, const mskv_plan *plan, const void *k,
                                             const void *v, mskv_dtype src_dtype, const mskv_rope *rope) {
    if (!pools) return MSKV_ERROR_NULL_POINTER;
    /* the pools' memory is the caller's and writable; the struct is const for
       the attention call's sake */
    return mskv__cpu_write_kv((void *)(uintptr_t)pools->k, (void *)(uintptr_t)pools->v, pools->dtype,
                              pools->num_pages, pools->page_size, pools->kv_heads, pools->head_dim,
                              plan, k, v, src_dtype, rope);
}

MSKV_IMPL mskv_result mskv_cpu_write_kv(mskv_arena *arena, int32_t layer, const mskv_plan *plan, const void *k,
                                       const void *v, mskv_dtype src_dtype, const mskv_rope *rope) {
    mskv_store_info si;
    mskv_result res;
    void *kp, *vp;
    if (!arena || !plan) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv_store_info_get(arena, &si)) != MSKV_SUCCESS) return res;
    if (layer < 0 || layer >= si.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    if ((res = mskv_plan_check(arena, plan)) != MSKV_SUCCESS) return res;
    kp = mskv_store_pool(arena, layer, 0);
    vp = mskv_store_pool(arena, layer, 1);
    if (!kp || !vp) return MSKV_ERROR_UNSUPPORTED; /* bookkeeping-only arena, or bytes live elsewhere */
    return mskv__cpu_write_kv(kp, vp, si.dtype, si.num_pages, si.page_size, si.kv_heads, si.head_dim,
                              plan, k, v, src_dtype, rope);
}

/* ---- LSE merge --------------------------------------------------------------- */

MSKV_IMPL mskv_result mskv_cpu_merge(int64_t n, int32_t heads, int32_t head_dim, const float *o_a,
                                    const float *lse_a, const float *o_b, const float *lse_b, float *o,
                                    float *lse) {
    int64_t r, rows;
    int32_t d;
    if (n < 0 || heads <= 0 || head_dim <= 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > INT64_MAX / heads / head_dim) return MSKV_ERROR_OVERFLOW;  /* elements are counted in int64 */
    if (n == 0) return MSKV_SUCCESS;
    if (!o_a || !lse_a || !o_b || !lse_b || !o || !lse) return MSKV_ERROR_NULL_POINTER;
    rows = n * heads;
    /* element by element, reading before writing: o and lse may alias a or b */
    for (r = 0; r < rows; r++) {
        const float *a = o_a + r * head_dim, *b = o_b + r * head_dim;
        float *dst = o + r * head_dim;
        float la = lse_a[r], lb = lse_b[r], m = la > lb ? la : lb, wa, wb, sum;
        if (m == -INFINITY) {
            for (d = 0; d < head_dim; d++) dst[d] = 0.0f;
            lse[r] = -INFINITY;
            continue;
        }
        wa = la == -INFINITY ? 0.0f : expf(la - m);
        wb = lb == -INFINITY ? 0.0f : expf(lb - m);
        sum = wa + wb;
        wa /= sum;
        wb /= sum;
        for (d = 0; d < head_dim; d++) {
            float x = wa != 0.0f ? wa * a[d] : 0.0f, y = wb != 0.0f ? wb * b[d] : 0.0f;
            dst[d] = x + y;
        }
        lse[r] = m + logf(sum);
    }
    return MSKV_SUCCESS;
}

/* ---- f32 tiles ------------------------------------------------------------------ */

#if defined(__GNUC__) && !defined(MSKV_CPU_NO_SIMD)
#define MSKV__CPU_SIMD 1
#if defined(__AVX__)
#define MSKV__CPU_VW 8
#else
#define MSKV__CPU_VW 4   /* wider vectors would change the call ABI without AVX */
#endif
typedef float mskv__cpu_vf __attribute__((vector_size(MSKV__CPU_VW * 4)));
typedef int32_t mskv__cpu_vi __attribute__((vector_size(MSKV__CPU_VW * 4)));
static inline mskv__cpu_vf mskv__cpu_vld(const float *p) { mskv__cpu_vf v; memcpy(&v, p, sizeof v); return v; }
static inline void mskv__cpu_vst(float *p, mskv__cpu_vf v) { memcpy(p, &v, sizeof v); }
static inline mskv__cpu_vf mskv__cpu_vset(float x) {
    mskv__cpu_vf v;
    int i;
    for (i = 0; i < MSKV__CPU_VW; i++) v[i] = x;
    return v;
}
#else
#define MSKV__CPU_SIMD 0
#endif

/* S[r][j] = sum_d Q[r][d] * Kt[d][j] for r < nrp (multiple of 4), j < kbp
   (multiple of 16), d < dp. Rows of Q have stride dp, Kt and S stride ks. */
static void mskv__cpu_qk(const float *MSKV__CPU_RESTRICT Q, const float *MSKV__CPU_RESTRICT Kt,
                         float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbp, int32_t dp, int32_t ks) {
    int32_t r, j, d;
#if MSKV__CPU_SIMD
    for (r = 0; r < nrp; r += 4) {
        const float *q0 = Q + (size_t)r * dp, *q1 = q0 + dp, *q2 = q1 + dp, *q3 = q2 + dp;
        for (j = 0; j < kbp; j += 2 * MSKV__CPU_VW) {
            mskv__cpu_vf a00 = mskv__cpu_vset(0.0f), a01 = a00, a10 = a00, a11 = a00;
            mskv__cpu_vf a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (d = 0; d < dp; d++) {
                const float *kr = Kt + (size_t)d * ks + j;
                mskv__cpu_vf k0 = mskv__cpu_vld(kr), k1 = mskv__cpu_vld(kr + MSKV__CPU_VW);
                a00 += k0 * q0[d]; a01 += k1 * q0[d];
                a10 += k0 * q1[d]; a11 += k1 * q1[d];
                a20 += k0 * q2[d]; a21 += k1 * q2[d];
                a30 += k0 * q3[d]; a31 += k1 * q3[d];
            }
            mskv__cpu_vst(S + (size_t)(r + 0) * ks + j, a00); mskv__cpu_vst(S + (size_t)(r + 0) * ks + j + MSKV__CPU_VW, a01);
            mskv__cpu_vst(S + (size_t)(r + 1) * ks + j, a10); mskv__cpu_vst(S + (size_t)(r + 1) * ks + j + MSKV__CPU_VW, a11);
            mskv__cpu_vst(S + (size_t)(r + 2) * ks + j, a20); mskv__cpu_vst(S + (size_t)(r + 2) * ks + j + MSKV__CPU_VW, a21);
            mskv__cpu_vst(S + (size_t)(r + 3) * ks + j, a30); mskv__cpu_vst(S + (size_t)(r + 3) * ks + j + MSKV__CPU_VW, a31);
        }
    }
#else
    for (r = 0; r < nrp; r++) {
        float *srow = S + (size_t)r * ks;
        for (j = 0; j < kbp; j++) srow[j] = 0.0f;
        for (d = 0; d < dp; d++) {
            float q = Q[(size_t)r * dp + d];
            const float *kr = Kt + (size_t)d * ks;
            for (j = 0; j < kbp; j++) srow[j] += q * kr[j];
        }
    }
#endif
}

/* The same scores from K rows (krow[j], dp floats each) for j < kbe (even),
   r < nrp (multiple of 4): dot products along d. For a few rows (decode),
   where transposing K would cost more than the products themselves. */
static void mskv__cpu_qk_rows(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                              float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks) {
    int32_t r, j, d;
#if MSKV__CPU_SIMD
    for (r = 0; r < nrp; r += 4) {
        const float *q0 = Q + (size_t)r * dp, *q1 = q0 + dp, *q2 = q1 + dp, *q3 = q2 + dp;
        for (j = 0; j < kbe; j += 2) {
            const float *k0 = krow[j], *k1 = krow[j + 1];
            mskv__cpu_vf a00 = mskv__cpu_vset(0.0f), a01 = a00, a10 = a00, a11 = a00;
            mskv__cpu_vf a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            float t[8];
            int32_t i;
            for (d = 0; d < dp; d += MSKV__CPU_VW) {
                mskv__cpu_vf x0 = mskv__cpu_vld(k0 + d), x1 = mskv__cpu_vld(k1 + d), qv;
                qv = mskv__cpu_vld(q0 + d); a00 += x0 * qv; a01 += x1 * qv;
                qv = mskv__cpu_vld(q1 + d); a10 += x0 * qv; a11 += x1 * qv;
                qv = mskv__cpu_vld(q2 + d); a20 += x0 * qv; a21 += x1 * qv;
                qv = mskv__cpu_vld(q3 + d); a30 += x0 * qv; a31 += x1 * qv;
            }
            for (i = 0; i < 8; i++) t[i] = 0.0f;
            for (i = 0; i < MSKV__CPU_VW; i++) {
                t[0] += a00[i]; t[1] += a01[i]; t[2] += a10[i]; t[3] += a11[i];
                t[4] += a20[i]; t[5] += a21[i]; t[6] += a30[i]; t[7] += a31[i];
            }
            S[(size_t)(r + 0) * ks + j] = t[0]; S[(size_t)(r + 0) * ks + j + 1] = t[1];
            S[(size_t)(r + 1) * ks + j] = t[2]; S[(size_t)(r + 1) * ks + j + 1] = t[3];
            S[(size_t)(r + 2) * ks + j] = t[4]; S[(size_t)(r + 2) * ks + j + 1] = t[5];
            S[(size_t)(r + 3) * ks + j] = t[6]; S[(size_t)(r + 3) * ks + j + 1] = t[7];
        }
    }
#else
    for (r = 0; r < nrp; r++)
        for (j = 0; j < kbe; j++) {
            float acc = 0.0f;
            for (d = 0; d < dp; d++) acc += Q[(size_t)r * dp + d] * krow[j][d];
            S[(size_t)r * ks + j] = acc;
        }
#endif
}

/* O[r][:] = O[r][:] * alpha[r] + sum_{j < kb} P[r][j] * V_j[:], rows r < nrp
   (multiple of 4), dims < dp (multiple of 16). */
static void mskv__cpu_pv(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                         const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                         int32_t nrp, int32_t kb, int32_t dp, int32_t ks) {
    int32_t r, j, d;
#if MSKV__CPU_SIMD
    for (r = 0; r < nrp; r += 4) {
        const float *p0 = P + (size_t)r * ks, *p1 = p0 + ks, *p2 = p1 + ks, *p3 = p2 + ks;
        float *o0 = O + (size_t)r * dp, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        for (d = 0; d < dp; d += 2 * MSKV__CPU_VW) {
            mskv__cpu_vf a00 = mskv__cpu_vld(o0 + d) * alpha[r], a01 = mskv__cpu_vld(o0 + d + MSKV__CPU_VW) * alpha[r];
            mskv__cpu_vf a10 = mskv__cpu_vld(o1 + d) * alpha[r + 1], a11 = mskv__cpu_vld(o1 + d + MSKV__CPU_VW) * alpha[r + 1];
            mskv__cpu_vf a20 = mskv__cpu_vld(o2 + d) * alpha[r + 2], a21 = mskv__cpu_vld(o2 + d + MSKV__CPU_VW) * alpha[r + 2];
            mskv__cpu_vf a30 = mskv__cpu_vld(o3 + d) * alpha[r + 3], a31 = mskv__cpu_vld(o3 + d + MSKV__CPU_VW) * alpha[r + 3];
            for (j = 0; j < kb; j++) {
                const float *vr = vrow[j] + d;
                mskv__cpu_vf v0 = mskv__cpu_vld(vr), v1 = mskv__cpu_vld(vr + MSKV__CPU_VW);
                a00 += v0 * p0[j]; a01 += v1 * p0[j];
                a10 += v0 * p1[j]; a11 += v1 * p1[j];
                a20 += v0 * p2[j]; a21 += v1 * p2[j];
                a30 += v0 * p3[j]; a31 += v1 * p3[j];
            }
            mskv__cpu_vst(o0 + d, a00); mskv__cpu_vst(o0 + d + MSKV__CPU_VW, a01);
            mskv__cpu_vst(o1 + d, a10); mskv__cpu_vst(o1 + d + MSKV__CPU_VW, a11);
            mskv__cpu_vst(o2 + d, a20); mskv__cpu_vst(o2 + d + MSKV__CPU_VW, a21);
            mskv__cpu_vst(o3 + d, a30); mskv__cpu_vst(o3 + d + MSKV__CPU_VW, a31);
        }
    }
#else
    for (r = 0; r < nrp; r++) {
        float *orow = O + (size_t)r * dp;
        const float *prow = P + (size_t)r * ks;
        for (d = 0; d < dp; d++) orow[d] *= alpha[r];
        for (j = 0; j < kb; j++) {
            const float *vr = vrow[j];
            float p = prow[j];
            for (d = 0; d < dp; d++) orow[d] += p * vr[d];
        }
    }
#endif
}

/* p[j] = exp(s[j] - m) for j < n (multiple of 16), exactly 0 where s = -inf;
   returns the sum. s - m <= 0 always (m is the running max). */
static float mskv__cpu_exp_row(float *MSKV__CPU_RESTRICT s, float m, int32_t n) {
#if MSKV__CPU_SIMD
    /* e^x = 2^k * e^r, k = round(x / ln 2), |r| <= ln2/2, e^r by a degree-6
       polynomial (relative error ~1e-7); inputs under -87 give exactly 0 */
    const mskv__cpu_vf lo = mskv__cpu_vset(-87.0f), log2e = mskv__cpu_vset(1.44269504f);
    const mskv__cpu_vf magic = mskv__cpu_vset(12582912.0f); /* 1.5 * 2^23: rounds to an integer */
    const mskv__cpu_vf ln2hi = mskv__cpu_vset(0.693145752f), ln2lo = mskv__cpu_vset(1.42860677e-6f);
    mskv__cpu_vf acc = mskv__cpu_vset(0.0f);
    int32_t j, i;
    float sum = 0.0f;
    for (j = 0; j < n; j += MSKV__CPU_VW) {
        mskv__cpu_vf x = mskv__cpu_vld(s + j) - m, t, kf, r, p;
        mskv__cpu_vi keep = x > lo, ki;
        x = (mskv__cpu_vf)(((mskv__cpu_vi)x & keep) | ((mskv__cpu_vi)lo & ~keep));
        t = x * log2e + magic;
        kf = t - magic;
        r = x - kf * ln2hi - kf * ln2lo;
        p = ((((((r * (1.0f / 720) + (1.0f / 120)) * r + (1.0f / 24)) * r + (1.0f / 6)) * r + 0.5f) * r + 1.0f) * r + 1.0f);
        ki = ((mskv__cpu_vi)t - (mskv__cpu_vi)magic + 127) << 23;
        p = p * (mskv__cpu_vf)ki;
        p = (mskv__cpu_vf)((mskv__cpu_vi)p & keep);
        mskv__cpu_vst(s + j, p);
        acc += p;
    }
    for (i = 0; i < MSKV__CPU_VW; i++) sum += acc[i];
    return sum;
#else
    int32_t j;
    float sum = 0.0f;
    for (j = 0; j < n; j++) {
        s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
        sum += s[j];
    }
    return sum;
#endif
}

/* ---- thread pool --------------------------------------------------------------- */

/* A per-thread workspace: row tiles (Q, O: rows x MAX_DIM), key tiles
   (Kt: MAX_DIM x keys, V: keys x MAX_DIM), scores (rows x keys), row state. */
typedef struct mskv__cpu_ws {
    float *q, *o, *kt, *v, *s, *m, *l, *alpha;
    int64_t *qpos;
    size_t *el;          /* element offset of each key row of the block */
    const float **vrow, **krow;
    int32_t rows, keys;  /* tile capacities */
} mskv__cpu_ws;

/* Q and O hold rows * MAX_DIM floats: more rows at a smaller head_dim, up to
   MSKV__CPU_MAX_ROWS, for which the scores and row state are sized. */
#define MSKV__CPU_MAX_ROWS 64

static size_t mskv__cpu_ws_bytes(int32_t rows, int32_t keys) {
    size_t f = 2 * (size_t)rows * MSKV__CPU_MAX_DIM + 2 * (size_t)keys * MSKV__CPU_MAX_DIM +
               (size_t)MSKV__CPU_MAX_ROWS * (size_t)keys + 3 * (size_t)MSKV__CPU_MAX_ROWS;
    return f * 4 + (size_t)MSKV__CPU_MAX_ROWS * 8 + 2 * ((size_t)keys + 1) * sizeof(float *) + (size_t)keys * sizeof(size_t) + 64;
}

static void mskv__cpu_ws_carve(mskv__cpu_ws *w, void *mem, int32_t rows, int32_t keys) {
    unsigned char *p = (unsigned char *)mem;
    p += (64 - ((uintptr_t)p & 63)) & 63;  /* the tiles start on a cache line */
    w->rows = rows;
    w->keys = keys;
    w->q = (float *)(void *)p; p += (size_t)rows * MSKV__CPU_MAX_DIM * 4;
    w->o = (float *)(void *)p; p += (size_t)rows * MSKV__CPU_MAX_DIM * 4;
    w->kt = (float *)(void *)p; p += (size_t)keys * MSKV__CPU_MAX_DIM * 4;
    w->v = (float *)(void *)p; p += (size_t)keys * MSKV__CPU_MAX_DIM * 4;
    w->s = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * (size_t)keys * 4;
    w->qpos = (int64_t *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 8;
    w->m = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->l = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->alpha = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->vrow = (const float **)(void *)p; p += ((size_t)keys + 1) * sizeof(float *);
    w->krow = (const float **)(void *)p; p += ((size_t)keys + 1) * sizeof(float *);
    w->el = (size_t *)(void *)p;
}

typedef void (*mskv__cpu_task_fn)(void *ctx, mskv__cpu_ws *ws);

struct mskv_cpu {
    mskv_allocator allocator;
    int32_t num_threads;
    void *ws_mem;
    mskv__cpu_ws *ws;
#ifndef MSKV_NO_THREADS
    pthread_t *threads;
    int32_t started;
    pthread_mutex_t lock;
    pthread_mutex_t call_lock;  /* one call at a time per pool (also with one thread: one workspace) */
    int32_t call_lock_ok;
    pthread_cond_t wake, done;
    uint64_t generation;
    int32_t busy, shutdown;
    mskv__cpu_task_fn task;
    void *task_ctx;
#endif
};

#ifndef MSKV_NO_THREADS
typedef struct mskv__cpu_worker_arg { mskv_cpu *cpu; int32_t index; } mskv__cpu_worker_arg;

static void *mskv__cpu_worker(void *arg) {
    mskv_cpu *cpu = ((mskv__cpu_worker_arg *)arg)->cpu;
    int32_t index = ((mskv__cpu_worker_arg *)arg)->index;
    uint64_t seen = 0;
    for (;;) {
        mskv__cpu_task_fn fn;
        void *ctx;
        pthread_mutex_lock(&cpu->lock);
        while (!cpu->shutdown && cpu->generation == seen) pthread_cond_wait(&cpu->wake, &cpu->lock);
        if (cpu->shutdown) { pthread_mutex_unlock(&cpu->lock); break; }
        seen = cpu->generation;
        fn = cpu->task;
        ctx = cpu->task_ctx;
        pthread_mutex_unlock(&cpu->lock);
        fn(ctx, &cpu->ws[index]);
        pthread_mutex_lock(&cpu->lock);
        if (--cpu->busy == 0) pthread_cond_signal(&cpu->done);
        pthread_mutex_unlock(&cpu->lock);
    }
    return NULL;
}
#endif

static void mskv__cpu_teardown(mskv_cpu *cpu) {
#ifndef MSKV_NO_THREADS
    int32_t i;
    if (cpu->started > 0) {
        pthread_mutex_lock(&cpu->lock);
        cpu->shutdown = 1;
        pthread_cond_broadcast(&cpu->wake);
        pthread_mutex_unlock(&cpu->lock);
        for (i = 0; i < cpu->started; i++) pthread_join(cpu->threads[i], NULL);
    }
    if (cpu->threads) {
        pthread_cond_destroy(&cpu->wake);
        pthread_cond_destroy(&cpu->done);
        pthread_mutex_destroy(&cpu->lock);
        mskv__free(&cpu->allocator, cpu->threads);
    }
    if (cpu->call_lock_ok) pthread_mutex_destroy(&cpu->call_lock);
#endif
    mskv__free(&cpu->allocator, cpu->ws_mem);
    mskv__free(&cpu->allocator, cpu->ws);
}

MSKV_IMPL mskv_result mskv_cpu_create(const mskv_cpu_desc *desc, mskv_cpu **out) {
    static const int32_t ladder[4][2] = {{64, 64}, {32, 64}, {16, 32}, {8, 16}};
    mskv_cpu_desc d;
    mskv_cpu *cpu;
    size_t per = 0, stride;
    int32_t i, rows = 0, keys = 0;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    if (d.num_threads < 0 || d.num_threads > 1024) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((d.allocator.alloc || d.allocator.free) && !(d.allocator.alloc && d.allocator.free))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (d.num_threads == 0) d.num_threads = 1;
#ifdef MSKV_NO_THREADS
    d.num_threads = 1;
#endif
    /* the largest tiles the per-thread budget allows */
    for (i = 0; i < 4; i++) {
        per = mskv__cpu_ws_bytes(ladder[i][0], ladder[i][1]);
        if (d.workspace_bytes == 0 || per <= d.workspace_bytes) { rows = ladder[i][0]; keys = ladder[i][1]; break; }
    }
    if (!rows) return MSKV_ERROR_INVALID_ARGUMENT;
    stride = (per + 63) & ~(size_t)63;
    if (stride > SIZE_MAX / (size_t)d.num_threads) return MSKV_ERROR_OVERFLOW;
    cpu = (mskv_cpu *)mskv__alloc(&d.allocator, sizeof(mskv_cpu));
    if (!cpu) return MSKV_ERROR_OUT_OF_MEMORY;
    memset(cpu, 0, sizeof(*cpu));
    cpu->allocator = d.allocator;
    cpu->num_threads = d.num_threads;
    cpu->ws = (mskv__cpu_ws *)mskv__alloc(&d.allocator, sizeof(mskv__cpu_ws) * (size_t)d.num_threads);
    cpu->ws_mem = mskv__alloc(&d.allocator, stride * (size_t)d.num_threads);
    if (!cpu->ws || !cpu->ws_mem) { mskv__cpu_teardown(cpu); mskv__free(&d.allocator, cpu); return MSKV_ERROR_OUT_OF_MEMORY; }
    for (i = 0; i < d.num_threads; i++)
        mskv__cpu_ws_carve(&cpu->ws[i], (unsigned char *)cpu->ws_mem + stride * (size_t)i, rows, keys);
#ifndef MSKV_NO_THREADS
    if (pthread_mutex_init(&cpu->call_lock, NULL) != 0) {
        mskv__cpu_teardown(cpu);
        mskv__free(&d.allocator, cpu);
        return MSKV_ERROR_THREAD;
    }
    cpu->call_lock_ok = 1;
    if (d.num_threads > 1) {
        mskv__cpu_worker_arg *args;
        int ok = 1;
        cpu->threads = (pthread_t *)mskv__alloc(&d.allocator, (sizeof(pthread_t) + sizeof(*args)) * (size_t)d.num_threads);
        if (!cpu->threads) { mskv__cpu_teardown(cpu); mskv__free(&d.allocator, cpu); return MSKV_ERROR_OUT_OF_MEMORY; }
        args = (mskv__cpu_worker_arg *)(void *)(cpu->threads + d.num_threads);
        pthread_mutex_init(&cpu->lock, NULL);
        pthread_cond_init(&cpu->wake, NULL);
        pthread_cond_init(&cpu->done, NULL);
        /* thread 0 is the caller; workers 1..n-1 */
        for (i = 1; i < d.num_threads && ok; i++) {
            args[i].cpu = cpu;
            args[i].index = i;
            if (pthread_create(&cpu->threads[cpu->started], NULL, mskv__cpu_worker, &args[i]) != 0) ok = 0;
            else cpu->started++;
        }
        if (!ok) { mskv__cpu_teardown(cpu); mskv__free(&d.allocator, cpu); return MSKV_ERROR_THREAD; }
    }
#endif
    *out = cpu;
    return MSKV_SUCCESS;
}

MSKV_IMPL void mskv_cpu_destroy(mskv_cpu *cpu) {
    mskv_allocator a;
    if (!cpu) return;
    a = cpu->allocator;
    mskv__cpu_teardown(cpu);
    mskv__free(&a, cpu);
}

/* ---- paged attention ------------------------------------------------------------ */

typedef struct mskv__cpu_job {
    const mskv_pools *pools;
    const mskv_plan *plan;
    const void *q;
    void *o;
    float *lse;
    mskv_dtype qt;
    mskv_mask mask;
    int32_t q_heads, group, dim, dimp, window_left, rows;
    int32_t heads_cap;  /* most kv heads per item (few-row segments), so threads still get items */
    float scale;
    /* next work item, (segment, row block, kv head); taken under the pool lock */
    int32_t cur_b, cur_rb, cur_g;
#ifndef MSKV_NO_THREADS
    pthread_mutex_t *lock;
#endif
} mskv__cpu_job;

/* Absolute position of compacted index j (positions rise with j: shift >= 0). */
static int64_t mskv__cpu_kpos(int64_t j, int64_t split, int64_t shift) { return j < split ? j : j + shift; }

/* The first compacted index whose position is >= p (n when none). */
static int64_t mskv__cpu_first_at(int64_t p, int64_t split, int64_t shift, int64_t n) {
    int64_t j;
    if (p <= 0) return 0;
    if (p < split) return p < n ? p : n;
    j = p - shift > split ? p - shift : split;
    return j < n ? j : n;
}

static int32_t mskv__cpu_rows_of(const mskv__cpu_job *job, int32_t b) {
    return (job->plan->qo_indptr[b + 1] - job->plan->qo_indptr[b]) * job->group;
}

/* Takes the next item, (segment b, row block rb, kv heads [g, g + ng)); 0 when
   none is left. A segment with few rows per kv head (decode) takes several
   kv heads per item, so whole slot rows stream in one pass. */
static int mskv__cpu_next(mskv__cpu_job *job, int32_t *b, int32_t *rb, int32_t *g, int32_t *ng) {
    int ok = 0;
    int32_t kvh = job->pools->kv_heads;
#ifndef MSKV_NO_THREADS
    if (job->lock) pthread_mutex_lock(job->lock);
#endif
    while (job->cur_b < job->plan->batch) {
        int32_t rows = mskv__cpu_rows_of(job, job->cur_b), nrp = (rows + 3) & ~3, nrb, step = 1;
        if (nrp <= 8) {
            nrb = rows > 0;
            step = job->rows / (nrp > 0 ? nrp : 4);
            if (step > job->heads_cap) step = job->heads_cap;
            if (step < 1) step = 1;
        } else {
            nrb = (rows + job->rows - 1) / job->rows;
        }
        if (job->cur_rb >= nrb) { job->cur_b++; job->cur_rb = 0; job->cur_g = 0; continue; }
        *b = job->cur_b; *rb = job->cur_rb; *g = job->cur_g;
        *ng = kvh - job->cur_g < step ? kvh - job->cur_g : step;
        job->cur_g += *ng;
        if (job->cur_g == kvh) { job->cur_g = 0; job->cur_rb++; }
        ok = 1;
        break;
    }
#ifndef MSKV_NO_THREADS
    if (job->lock) pthread_mutex_unlock(job->lock);
#endif
    return ok;
}

/* One work item. Rows are (query i, q head hh of the group) in row-major
   order per kv head, so positions rise with the row; the ng kv heads' row
   sets follow each other (nrp rows each) in the tiles. */
static void mskv__cpu_item(const mskv__cpu_job *job, mskv__cpu_ws *ws, int32_t b, int32_t rb, int32_t g0, int32_t ng) {
    const mskv_plan *plan = job->plan;
    const mskv_pools *pools = job->pools;
    const int32_t D = job->dim, Dp = job->dimp, KS = ws->keys, P = pools->page_size;
    const int32_t kvh = pools->kv_heads, group = job->group;
    const size_t pes = mskv__cpu_esize(pools->dtype), qes = mskv__cpu_esize(job->qt);
    const int32_t qo0 = plan->qo_indptr[b], qo_len = plan->qo_indptr[b + 1] - qo0;
    int32_t KS_blk = KS;  /* keys per block (S and the tiles keep stride KS) */
    const int64_t kv_len = plan->kv_len[b];
    const int64_t split = plan->kv_pos_split ? plan->kv_pos_split[b] : kv_len;
    const int64_t shift = plan->kv_pos_shift ? plan->kv_pos_shift[b] : 0;
    const int32_t *pages = plan->kv_indices ? plan->kv_indices + plan->kv_indptr[b] : NULL; /* NULL: a plan without page ids */
    const int direct = pools->dtype == MSKV_DTYPE_F32 && D == Dp; /* pool rows usable as they are */
    int32_t r0 = rb * job->rows, nr, nrp, r, d, gi, few_rows;
    int64_t lo = 0, hi = kv_len, j0;
    nr = qo_len * group - r0;
    if (nr > job->rows) nr = job->rows;
    nrp = (nr + 3) & ~3;
    few_rows = nrp <= 8;
    if (ng > 1) {
        /* several kv heads: K and V of all of them per block, in the tiles.
           fit >= 4 * keys / rows >= 4, since ng * nrp <= rows * MAX_DIM / Dp */
        int32_t fit = (int32_t)((size_t)ws->keys * MSKV__CPU_MAX_DIM / ((size_t)Dp * (size_t)ng)) & ~1;
        if (fit < KS) KS_blk = fit;
    }

    for (gi = 0; gi < ng; gi++)
        for (r = 0; r < nrp; r++) {
            int32_t R = gi * nrp + r;
            float *qr = ws->q + (size_t)R * Dp;
            if (r < nr) {
                int32_t t = r0 + r, i = t / group, head = (g0 + gi) * group + t % group;
                const unsigned char *src = (const unsigned char *)job->q + ((size_t)(qo0 + i) * (size_t)job->q_heads + (size_t)head) * (size_t)D * qes;
                mskv__cpu_load(qr, src, job->qt, D);
                for (d = 0; d < D; d++) qr[d] *= job->scale;
                ws->qpos[r] = mskv__cpu_kpos(kv_len - qo_len + i, split, shift);
            } else {
                for (d = 0; d < D; d++) qr[d] = 0.0f;
            }
            for (d = D; d < Dp; d++) qr[d] = 0.0f;
            for (d = 0; d < Dp; d++) ws->o[(size_t)R * Dp + d] = 0.0f;
            ws->m[R] = -INFINITY;
            ws->l[R] = 0.0f;
        }
    if (job->mask != MSKV_MASK_NONE) {
        hi = mskv__cpu_first_at(ws->qpos[nr - 1] + 1, split, shift, kv_len);
        if (job->mask == MSKV_MASK_WINDOW) lo = mskv__cpu_first_at(ws->qpos[0] - job->window_left, split, shift, kv_len);
    }

    for (j0 = lo; j0 < hi; j0 += KS_blk) {
        int32_t kb = (int32_t)(hi - j0 < KS_blk ? hi - j0 : KS_blk), kbp = (kb + MSKV__CPU_KTILE - 1) & ~(MSKV__CPU_KTILE - 1), jj;
        int64_t pi = j0 / P, off = j0 % P;
        /* element offset of each key's slot row (kv head 0) */
        for (jj = 0; jj < kb; jj++) {
            ws->el[jj] = ((size_t)pages[pi] * (size_t)P + (size_t)off) * (size_t)kvh * (size_t)D;
            if (++off == P) { off = 0; pi++; }
        }
#if defined(__GNUC__)
        /* The next block's rows are scattered over pages, which the hardware
           prefetcher does not follow: request them now (the item's kv heads
           are adjacent in a slot row), they arrive while this block computes. */
        for (jj = 0; jj < KS_blk && j0 + kb + jj < hi; jj++) {
            size_t el = (((size_t)pages[pi] * (size_t)P + (size_t)off) * (size_t)kvh + (size_t)g0) * (size_t)D, at;
            const char *kp = (const char *)pools->k + el * pes, *vp = (const char *)pools->v + el * pes;
            for (at = 0; at < (size_t)ng * (size_t)D * pes; at += 64) { __builtin_prefetch(kp + at); __builtin_prefetch(vp + at); }
            if (++off == P) { off = 0; pi++; }
        }
#endif
        if (ng > 1 && !direct) {
            /* all heads' rows of each slot in address order (one contiguous
               run per slot), so the hardware streams them */
            for (jj = 0; jj < kb; jj++)
                for (gi = 0; gi < ng; gi++) {
                    size_t el = ws->el[jj] + (size_t)(g0 + gi) * (size_t)D, at = ((size_t)gi * KS_blk + (size_t)jj) * Dp;
                    mskv__cpu_load(ws->kt + at, (const unsigned char *)pools->k + el * pes, pools->dtype, D);
                    mskv__cpu_load(ws->v + at, (const unsigned char *)pools->v + el * pes, pools->dtype, D);
                    for (d = D; d < Dp; d++) ws->kt[at + d] = ws->v[at + d] = 0.0f;
                }
        }
        for (gi = 0; gi < ng; gi++) {
            const size_t goff = (size_t)(g0 + gi) * (size_t)D;
            float *S = ws->s + (size_t)gi * nrp * KS, *M = ws->m + gi * nrp, *L = ws->l + gi * nrp;
            float *A = ws->alpha + gi * nrp;
            const float *Q = ws->q + (size_t)gi * nrp * Dp;
            /* gather the block: K transposed into kt[d][j] (or as rows, for few
               query rows), V as f32 rows (or the pool's own rows) */
            for (jj = 0; jj < kb; jj++) {
                size_t el = ws->el[jj] + goff;
                float *vtmp = ws->v + (size_t)jj * Dp;
                if (ng > 1 && !direct) { /* converted above */
                    ws->krow[jj] = ws->kt + ((size_t)gi * KS_blk + (size_t)jj) * Dp;
                    ws->vrow[jj] = ws->v + ((size_t)gi * KS_blk + (size_t)jj) * Dp;
                    continue;
                }
                if (few_rows) {
                    if (direct) {
                        ws->krow[jj] = (const float *)pools->k + el;
                    } else {
                        float *kr = ws->kt + (size_t)jj * Dp;
                        mskv__cpu_load(kr, (const unsigned char *)pools->k + el * pes, pools->dtype, D);
                        for (d = D; d < Dp; d++) kr[d] = 0.0f;
                        ws->krow[jj] = kr;
                    }
                } else {
                    mskv__cpu_load(vtmp, (const unsigned char *)pools->k + el * pes, pools->dtype, D);
                    for (d = 0; d < D; d++) ws->kt[(size_t)d * KS + jj] = vtmp[d];
                    for (d = D; d < Dp; d++) ws->kt[(size_t)d * KS + jj] = 0.0f;
                }
                if (direct) {
                    ws->vrow[jj] = (const float *)pools->v + el;
                } else {
                    mskv__cpu_load(vtmp, (const unsigned char *)pools->v + el * pes, pools->dtype, D);
                    for (d = D; d < Dp; d++) vtmp[d] = 0.0f;
                    ws->vrow[jj] = vtmp;
                }
            }
            if (few_rows) {
                /* an odd block computes one spare score, masked below like the padding */
                ws->krow[kb] = ws->krow[kb - 1];
                mskv__cpu_qk_rows(Q, ws->krow, S, nrp, (kb + 1) & ~1, Dp, KS);
            } else {
                for (d = 0; d < Dp; d++)
                    for (jj = kb; jj < kbp; jj++) ws->kt[(size_t)d * KS + jj] = 0.0f;
                mskv__cpu_qk(Q, ws->kt, S, nrp, kbp, Dp, KS);
            }

            /* online softmax: running max M and sum L per row; A rescales O */
            for (r = 0; r < nrp; r++) {
                float *srow = S + (size_t)r * KS, mx = -INFINITY, mnew, sum;
                int32_t a = 0, z = kb;
                if (r < nr && job->mask != MSKV_MASK_NONE) {
                    int64_t e = mskv__cpu_first_at(ws->qpos[r] + 1, split, shift, kv_len) - j0;
                    z = (int32_t)(e < 0 ? 0 : e > kb ? kb : e);
                    if (job->mask == MSKV_MASK_WINDOW) {
                        e = mskv__cpu_first_at(ws->qpos[r] - job->window_left, split, shift, kv_len) - j0;
                        a = (int32_t)(e < 0 ? 0 : e > kb ? kb : e);
                    }
                }
                if (r >= nr || a >= z) { /* nothing visible in this block */
                    for (jj = 0; jj < kbp; jj++) srow[jj] = 0.0f;
                    A[r] = 1.0f;
                    continue;
                }
                for (jj = 0; jj < a; jj++) srow[jj] = -INFINITY;
                for (jj = z; jj < kbp; jj++) srow[jj] = -INFINITY;
                for (jj = a; jj < z; jj++) mx = srow[jj] > mx ? srow[jj] : mx;
                mnew = M[r] > mx ? M[r] : mx;
                A[r] = M[r] == -INFINITY ? 0.0f : expf(M[r] - mnew);
                sum = mskv__cpu_exp_row(srow, mnew, kbp);
                L[r] = L[r] * A[r] + sum;
                M[r] = mnew;
            }

            mskv__cpu_pv(ws->o + (size_t)gi * nrp * Dp, S, ws->vrow, A, nrp, kb, Dp, KS);
        }
    }

    for (gi = 0; gi < ng; gi++)
        for (r = 0; r < nr; r++) {
            int32_t R = gi * nrp + r, t = r0 + r, i = t / group, head = (g0 + gi) * group + t % group;
            size_t row = (size_t)(qo0 + i) * (size_t)job->q_heads + (size_t)head;
            float *orow = ws->o + (size_t)R * Dp;
            if (ws->l[R] > 0.0f) {
                float inv = 1.0f / ws->l[R];
                for (d = 0; d < D; d++) orow[d] *= inv;
            } else {
                for (d = 0; d < D; d++) orow[d] = 0.0f;
            }
            mskv__cpu_store((unsigned char *)job->o + row * (size_t)D * qes, job->qt, orow, D);
            if (job->lse) job->lse[row] = ws->l[R] > 0.0f ? ws->m[R] + logf(ws->l[R]) : -INFINITY;
        }
}

static void mskv__cpu_attn_task(void *ctx, mskv__cpu_ws *ws) {
    mskv__cpu_job *job = (mskv__cpu_job *)ctx;
    int32_t b, rb, g, ng;
    while (mskv__cpu_next(job, &b, &rb, &g, &ng)) mskv__cpu_item(job, ws, b, rb, g, ng);
}

/* Checks the plan against the pools before anything is read or written. */
static mskv_result mskv__cpu_check_plan(const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn, double *flops) {
    int32_t b, i, P = pools->page_size;
    int64_t work = 0;
    if (plan->batch < 0 || plan->total_q < 0 || plan->num_page_ids < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != P) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->batch == 0) { *flops = 0; return plan->total_q == 0 ? MSKV_SUCCESS : MSKV_ERROR_INVALID_ARGUMENT; }
    if (!plan->qo_indptr || !plan->kv_indptr || !plan->kv_len || (!plan->kv_indices && plan->num_page_ids > 0))
        return MSKV_ERROR_NULL_POINTER;
    /* kv_indices holds num_page_ids ids and no more: every indptr is checked
       against that count before an id is read (a plan may use a prefix of them) */
    if (plan->qo_indptr[0] != 0 || plan->kv_indptr[0] != 0 || plan->qo_indptr[plan->batch] != plan->total_q)
        return MSKV_ERROR_INVALID_ARGUMENT;
    for (b = 0; b < plan->batch; b++) {
        int64_t qo = (int64_t)plan->qo_indptr[b + 1] - plan->qo_indptr[b];
        int64_t np = (int64_t)plan->kv_indptr[b + 1] - plan->kv_indptr[b];
        int64_t kv = plan->kv_len[b], split, shift;
        if (qo < 0 || np < 0 || kv < 0 || plan->kv_indptr[b + 1] > plan->num_page_ids) return MSKV_ERROR_INVALID_ARGUMENT;
        /* a segment's rows (query x q head of a group) are counted in int32, with room to round up */
        if (qo * (attn->q_heads / pools->kv_heads) > (int64_t)INT32_MAX - 256) return MSKV_ERROR_OVERFLOW;
        if (np == 0 ? kv != 0 : (kv <= (int64_t)(np - 1) * P || kv > (int64_t)np * P)) return MSKV_ERROR_INVALID_ARGUMENT;
        if (plan->kv_last_page_len && np > 0 && plan->kv_last_page_len[b] != kv - (int64_t)(np - 1) * P)
            return MSKV_ERROR_INVALID_ARGUMENT;
        split = plan->kv_pos_split ? plan->kv_pos_split[b] : kv;
        shift = plan->kv_pos_shift ? plan->kv_pos_shift[b] : 0;
        if (split < 0 || shift < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        if (attn->mask != MSKV_MASK_NONE && qo > kv) return MSKV_ERROR_INVALID_ARGUMENT; /* queries without a position */
        for (i = plan->kv_indptr[b]; i < plan->kv_indptr[b + 1]; i++)
            if (plan->kv_indices[i] < 0 || plan->kv_indices[i] >= pools->num_pages) return MSKV_ERROR_OUT_OF_RANGE;
        work += (int64_t)qo * kv;
    }
    *flops = 4.0 * (double)work * (double)attn->q_heads * (double)pools->head_dim;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_attention_pools(mskv_cpu *cpu, const mskv_pools *pools, const mskv_plan *plan,
                                              const mskv_attn *attn, const void *q, void *o, float *lse) {
    mskv__cpu_job job;
    mskv__cpu_ws stack_ws;
    double flops = 0;
    mskv_result res;
    int32_t rows_cap;
    if (!pools || !plan || !attn) return MSKV_ERROR_NULL_POINTER;
    if (!mskv__cpu_dtype_ok(pools->dtype) || !mskv__cpu_dtype_ok(attn->q_dtype)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (pools->num_pages < 1 || pools->page_size < 1 || pools->kv_heads < 1 || pools->head_dim < 1 ||
        pools->head_dim > MSKV__CPU_MAX_DIM)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->q_heads < 1 || attn->q_heads % pools->kv_heads != 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->mask != MSKV_MASK_NONE && attn->mask != MSKV_MASK_CAUSAL && attn->mask != MSKV_MASK_WINDOW)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->mask == MSKV_MASK_WINDOW && attn->window_left < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(attn->scale >= 0.0f) || attn->scale == INFINITY) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((res = mskv__cpu_check_plan(pools, plan, attn, &flops)) != MSKV_SUCCESS) return res;
    if (plan->total_q == 0) return MSKV_SUCCESS;
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    if (plan->kv_indptr[plan->batch] > 0 && (!pools->k || !pools->v)) return MSKV_ERROR_NULL_POINTER;

    memset(&job, 0, sizeof job);
    job.pools = pools;
    job.plan = plan;
    job.q = q;
    job.o = o;
    job.lse = lse;
    job.qt = attn->q_dtype;
    job.mask = attn->mask;
    job.q_heads = attn->q_heads;
    job.group = attn->q_heads / pools->kv_heads;
    job.dim = pools->head_dim;
    job.dimp = (pools->head_dim + MSKV__CPU_KTILE - 1) & ~(MSKV__CPU_KTILE - 1);
    job.window_left = attn->window_left;
    job.scale = attn->scale > 0.0f ? attn->scale : 1.0f / sqrtf((float)pools->head_dim);

    if (!cpu) {
        /* no pool: small tiles on the stack (about 50 KB) */
        enum { ROWS = 8, KEYS = 16 };
        float q_t[ROWS * MSKV__CPU_MAX_DIM], o_t[ROWS * MSKV__CPU_MAX_DIM];
        float kt_t[KEYS * MSKV__CPU_MAX_DIM], v_t[KEYS * MSKV__CPU_MAX_DIM], s_t[ROWS * KEYS];
        float m_t[ROWS], l_t[ROWS], a_t[ROWS];
        int64_t qp_t[ROWS];
        const float *vr_t[KEYS + 1], *kr_t[KEYS + 1];
        size_t el_t[KEYS];
        stack_ws.q = q_t; stack_ws.o = o_t; stack_ws.kt = kt_t; stack_ws.v = v_t; stack_ws.s = s_t;
        stack_ws.m = m_t; stack_ws.l = l_t; stack_ws.alpha = a_t; stack_ws.qpos = qp_t; stack_ws.vrow = vr_t; stack_ws.krow = kr_t; stack_ws.el = el_t;
        stack_ws.rows = ROWS;
        stack_ws.keys = KEYS;
        job.rows = ROWS;
        job.heads_cap = pools->kv_heads;
        mskv__cpu_attn_task(&job, &stack_ws);
        return MSKV_SUCCESS;
    }

    /* rows per item: as many as the tile holds at this head_dim, at most 64 */
    rows_cap = cpu->ws[0].rows * MSKV__CPU_MAX_DIM / job.dimp;
    job.rows = rows_cap < MSKV__CPU_MAX_ROWS ? rows_cap & ~3 : MSKV__CPU_MAX_ROWS;
    /* grouping kv heads must still leave about 4 items per thread */
    job.heads_cap = (int32_t)((int64_t)plan->batch * pools->kv_heads / (4 * (int64_t)cpu->num_threads));
    if (job.heads_cap < 1) job.heads_cap = 1;
#ifndef MSKV_NO_THREADS
    if (cpu->num_threads > 1 && flops >= MSKV__CPU_SMALL_FLOPS) {
        pthread_mutex_lock(&cpu->call_lock);
        job.lock = &cpu->lock;
        pthread_mutex_lock(&cpu->lock);
        cpu->task = mskv__cpu_attn_task;
        cpu->task_ctx = &job;
        cpu->busy = cpu->started;
        cpu->generation++;
        pthread_cond_broadcast(&cpu->wake);
        pthread_mutex_unlock(&cpu->lock);
        mskv__cpu_attn_task(&job, &cpu->ws[0]);
        pthread_mutex_lock(&cpu->lock);
        while (cpu->busy > 0) pthread_cond_wait(&cpu->done, &cpu->lock);
        pthread_mutex_unlock(&cpu->lock);
        pthread_mutex_unlock(&cpu->call_lock);
        return MSKV_SUCCESS;
    }
    /* the caller alone, but still one call at a time on workspace 0 */
    pthread_mutex_lock(&cpu->call_lock);
    mskv__cpu_attn_task(&job, &cpu->ws[0]);
    pthread_mutex_unlock(&cpu->call_lock);
#else
    mskv__cpu_attn_task(&job, &cpu->ws[0]);
#endif
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_attention(mskv_cpu *cpu, mskv_arena *arena, int32_t layer, const mskv_plan *plan,
                                        const mskv_attn *attn, const void *q, void *o, float *lse) {
    mskv_store_info si;
    mskv_pools pools;
    mskv_result res;
    if (!arena || !plan) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv_store_info_get(arena, &si)) != MSKV_SUCCESS) return res;
    if (layer < 0 || layer >= si.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    if ((res = mskv_plan_check(arena, plan)) != MSKV_SUCCESS) return res;
    pools.k = mskv_store_pool(arena, layer, 0);
    pools.v = mskv_store_pool(arena, layer, 1);
    if (!pools.k || !pools.v) return MSKV_ERROR_UNSUPPORTED;
    pools.dtype = si.dtype;
    pools.num_pages = si.num_pages;
    pools.page_size = si.page_size;
    pools.kv_heads = si.kv_heads;
    pools.head_dim = si.head_dim;
    return mskv_cpu_attention_pools(cpu, &pools, plan, attn, q, o, lse);
}
#endif /* MSTAR_KV_IMPLEMENTED */
#endif /* MSTAR_KV_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the mstar_kv developers

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
