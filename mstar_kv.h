/* mstar_kv.h - v0.2.0 - a paged KV cache for windowed autoregressive video
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
   Windows: cl /O2 app.c, or x86_64-w64-mingw32-gcc -std=c99 -O2 app.c; Win32
   threads and locks (Vista or newer), no pthreads. The implementation file
   includes <windows.h> with WIN32_LEAN_AND_MEAN and NOMINMAX (unless already
   defined): include your own Windows headers before it when you need more.

   Options, defined before the implementation include:
     MSKV_STATIC                 make every function static (private copy per file)
     MSKV_DLL                    (in every file, the library's and its users')
                                 a shared library: a Windows DLL exports the
                                 functions where MSKV_BUILD_DLL or the
                                 implementation is defined and imports them
                                 elsewhere (see MSKV_API below; defining
                                 MSKV_API yourself overrides it all)
     MSKV_MALLOC(sz,u) / MSKV_REALLOC(p,sz,u) / MSKV_FREE(p,u)
                                 compile-time allocator; define all three or none.
                                 A run-time allocator (mskv_allocator) in a
                                 descriptor overrides them for that object.
     MSKV_ASSERT(x)              internal consistency checks (default: assert.h's
                                 assert, on unless NDEBUG is defined: a release
                                 build -DNDEBUG runs none; make test builds keep them)
     MSKV_NO_THREADS             no threads: no internal lock, no worker threads
     MSKV_DEBUG                  every arena runs with every debug check
                                 (mskv_arena_desc.debug = MSKV_DEBUG_ALL, whatever
                                 its descriptor says): poisoned free pages,
                                 checksummed host copies

   Example:
       mskv_arena_desc d = MSKV_ZERO_INIT;  // zero means defaults ({0} in C)
       d.num_pages = 1024; d.page_size = 16;
       d.num_layers = 1; d.kv_heads = 8; d.head_dim = 128; d.dtype = MSKV_DTYPE_BF16;
       // host K/V pools: 2 * layers * pages * page_size * heads * dim * 2 B = 64 MiB
       // (num_layers = 0 or a device store's store_ops: none)
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
   (if set) receives the details. Zero-initialised descriptors mean defaults
   (MSKV_ZERO_INIT zero-initialises in C and C++ alike).
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
   step lifecycle, scheduling, cpu backend; then the implementation in the
   same order, after its internals and the platform wrappers (threads,
   locks: the one place where Windows and POSIX differ).

   License: MIT, at the end of this file.
*/
#ifndef MSTAR_KV_H
#define MSTAR_KV_H

#include <stddef.h>
#include <stdint.h>

/* The library's version: major, minor and patch numbers. */
#define MSKV_VERSION_MAJOR 0
#define MSKV_VERSION_MINOR 2
#define MSKV_VERSION_PATCH 0

/* MSKV_API: what every public function of the three headers carries, on its
   declaration and (mstar_kv_cuda.h, mstar_kv_ucx.h) on its definition.
   Defined before the first include, it is used as it is. Otherwise:
     MSKV_STATIC     static: a private copy in each file that defines it
     MSKV_DLL        a shared library (define it in every file that includes
                     the headers, the library's and its users'): on Windows
                     (_WIN32, __CYGWIN__) __declspec(dllexport) where the
                     library is built (MSKV_BUILD_DLL or MSTAR_KV_IMPLEMENTATION
                     defined) and __declspec(dllimport) elsewhere; with gcc or
                     clang elsewhere visibility("default"), so a library built
                     with -fvisibility=hidden still exports them
     neither         extern */
#ifndef MSKV_API
#if defined(MSKV_STATIC)
#if defined(__GNUC__) || defined(__clang__)
#define MSKV_API static __attribute__((unused)) /* a private copy need not use every function */
#else
#define MSKV_API static
#endif
#elif defined(MSKV_DLL) && (defined(_WIN32) || defined(__CYGWIN__))
#if defined(MSKV_BUILD_DLL) || defined(MSTAR_KV_IMPLEMENTATION)
#define MSKV_API __declspec(dllexport) extern
#else
#define MSKV_API __declspec(dllimport) extern
#endif
#elif defined(MSKV_DLL) && ((defined(__GNUC__) && __GNUC__ >= 4) || defined(__clang__))
#define MSKV_API extern __attribute__((visibility("default")))
#else
#define MSKV_API extern
#endif
#endif

/* Zero-initialises any struct of this library (zero means defaults):
       mskv_arena_desc d = MSKV_ZERO_INIT;
   {0} in C; {} in C++, where g++ and clang++ -Wextra warn about {0} in any
   struct of several members (-Wmissing-field-initializers). Plain {0} also
   compiles as C++ (no public struct starts with an enum member). */
#ifdef __cplusplus
#define MSKV_ZERO_INIT {}
#else
#define MSKV_ZERO_INIT {0}
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* // >>results ------------------------------------------------------------ */

/* What every fallible call returns: MSKV_SUCCESS (0) or a negative code, grouped by kind. */
typedef enum mskv_result {
    MSKV_SUCCESS = 0,   /* the call did what it says */
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
    MSKV_ERROR_STALE_VIEW = -27,       /* a prefix view (dense K/V tagged with an epoch) taken before the request's prefix_epoch moved */
    /* resources */
    MSKV_ERROR_OUT_OF_PAGES = -40,     /* not enough free pages: nothing was allocated */
    MSKV_ERROR_OUT_OF_MEMORY = -41,    /* the allocator returned NULL */
    MSKV_ERROR_OVERFLOW = -42,         /* a size product does not fit */
    MSKV_ERROR_TOO_MANY_REQUESTS = -43,   /* every request slot (mskv_arena_desc.max_requests) is in use */
    /* data */
    MSKV_ERROR_BLOB_TRUNCATED = -60,   /* the blob is shorter than its header says */
    MSKV_ERROR_BLOB_CORRUPT = -61,     /* bad magic or checksum */
    MSKV_ERROR_BLOB_VERSION = -62,     /* written by an incompatible version */
    MSKV_ERROR_BLOB_MISMATCH = -63,    /* page size, layers, heads, dim or dtype differ from the arena */
    MSKV_ERROR_AUDIT_FAILED = -64,     /* an invariant does not hold (a library bug, or memory corruption) */
    MSKV_ERROR_HOST_COPY_CORRUPT = -65, /* a host copy's bytes changed since offload or import (debug checksums) */
    MSKV_ERROR_DIVERGED = -66,         /* ranks that must make the same decisions did not (mskv_rank_check) */
    /* platform */
    MSKV_ERROR_UNSUPPORTED = -80,   /* not possible here (a CPU path, a library, host pools: each call's list says) */
    MSKV_ERROR_THREAD = -81,   /* a thread or a lock could not be created */
    MSKV_ERROR_IO = -82,   /* a file could not be created, read or written */
    MSKV_ERROR_CUDA_UNAVAILABLE = -83, /* no driver, no device or no NVRTC: use the CPU backend */
    MSKV_ERROR_CUDA = -84,             /* a driver call failed */
    MSKV_ERROR_NVRTC = -85,            /* kernel compilation failed; the log went to the logger */
    MSKV_ERROR_PEER = -86,             /* the peer of a transfer failed, went away or dropped the connection */
    MSKV_ERROR_TIMEOUT = -87,          /* the peer of a transfer did not answer in time */
    MSKV_ERROR_IN_DOUBT = -88,         /* a hand-over's outcome is unknown to this side: its copy stays frozen until resolved */
    MSKV_ERROR_DENIED = -89            /* a peer without the shared secret, or an offer replayed */
} mskv_result;

/* A static, human-readable description; never NULL. */
MSKV_API const char *mskv_result_string(mskv_result r);
/* XXH64 (xxHash's 64-bit hash, exactly as its specification gives it) of n
   bytes with seed: the checksum of blobs (seed 0; blob format version 4 on),
   host copies and migration, so that xxhsum -H64 or any XXH64 can check a
   blob: its last 8 bytes, little-endian, are XXH64 of everything before. */
MSKV_API uint64_t mskv_xxh64(const void *data, size_t n, uint64_t seed);

/* The severity of a message to the logger (mskv_log_fn). */
typedef enum mskv_log_level {
    MSKV_LOG_DEBUG = 0, MSKV_LOG_INFO = 1, MSKV_LOG_WARN = 2, MSKV_LOG_ERROR = 3   /* least to most severe */
} mskv_log_level;

/* The logger: gets every message with its level; user is the descriptor's log_user. */
typedef void (*mskv_log_fn)(void *user, mskv_log_level level, const char *message);

/* Run-time allocator. All three functions or none (NULL = MSKV_MALLOC etc.). */
typedef struct mskv_allocator {
    void *user;
    void *(*alloc)(void *user, size_t size);
    void *(*realloc)(void *user, void *ptr, size_t size);
    void (*free)(void *user, void *ptr);
} mskv_allocator;

/* The element type of the K/V store and of Q and O. */
typedef enum mskv_dtype {
    MSKV_DTYPE_F32 = 0,   /* the default */
    MSKV_DTYPE_F16 = 1,   /* IEEE binary16 */
    MSKV_DTYPE_BF16 = 2   /* bfloat16, round to nearest even on store */
} mskv_dtype;

MSKV_API size_t mskv_dtype_size(mskv_dtype t);   /* 4, 2, 2; 0 for an unknown dtype */

/* // >>arena -------------------------------------------------------------- */

/* A KV cache: its pages, requests and bookkeeping (opaque; mskv_arena_create). */
typedef struct mskv_arena mskv_arena;

#define MSKV_MAX_GROUPS 32     /* layer groups per arena (mskv_arena_desc.num_groups) */

/* A request handle: slot index + 16-bit generation, so a handle kept after
   remove is caught (until its slot has been reused 65,536 times). The zero
   handle is never valid. */
typedef struct mskv_request { uint32_t id; } mskv_request;

/* What an event (mskv_event.type) reports. */
typedef enum mskv_event_type {
    MSKV_EVENT_PAGE_STORED = 1,   /* a page became full of committed tokens (published) */
    MSKV_EVENT_PAGE_REMOVED = 2   /* a request dropped its reference to a page */
} mskv_event_type;

/* One event, passed to mskv_arena_desc.on_event. */
typedef struct mskv_event {
    int32_t type;          /* an mskv_event_type (an enum first would make {0} an error in C++) */
    mskv_request request;
    int32_t page;          /* physical page id */
    int64_t first_token;   /* absolute position of the page's first slot */
    uint64_t step;         /* the fence of the step in which it happened */
    int32_t group;         /* the layer group whose table held the page */
} mskv_event;

/* The event callback (mskv_arena_desc.on_event); it runs with the arena's lock held. */
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
    /* Optional (NULL: nothing runs asynchronously): return once no kernel or
       copy that may touch a page is still running (mskv_arena_flush). */
    mskv_result (*flush)(void *user);
    /* Optional, debug poisoning only (see above). After flush: fields are
       appended in the order they arrived, so positional initialisers of
       older code stay valid. */
    mskv_result (*fill_pages)(void *user, const int32_t *pages, int32_t n, unsigned char byte);
} mskv_store_ops;

/* When freed pages become reusable (mskv_arena_desc.retire_mode). */
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

/* What mskv_arena_create builds; zero fields mean defaults. */
typedef struct mskv_arena_desc {
    int32_t num_pages;      /* pages in all, including the null page 0; >= 2 */
    int32_t page_size;      /* tokens per page; >= 1, any value */
    int32_t max_requests;   /* 0 = 256; at most 65535 */
    /* Host K/V store. With num_layers > 0 and no store_ops, create allocates
       and zeroes the K and V pools of every layer at once:
         2 * num_layers * num_pages * page_size * kv_heads * head_dim * dtype size
       bytes (30 layers, 12 kv heads, head_dim 128, bf16, 4,096 pages of 16:
       12.1 GB, and tens of seconds of zeroing). num_layers == 0 means
       bookkeeping only (no bytes); with store_ops the bytes live in that
       store (the GPU's) and the arena allocates no pools. */
    int32_t num_layers;
    int32_t kv_heads;
    int32_t head_dim;
    mskv_dtype dtype;
    /* Layer groups (0 = 1, at most MSKV_MAX_GROUPS): every request keeps a
       page table per group, all drawn from these pages. num_layers is then
       the layers of one group (the largest): layer l of group g lives in pool
       l, on pages that group g owns. See "Layer groups" in the README. */
    int32_t num_groups;
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

/* An arena's page and request counts (mskv_arena_stats_get). */
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
   Allocates the page bookkeeping and, unless num_layers is 0 or store_ops is
   set, the host K/V pools (the size is at num_layers above; it can be most of
   a machine's memory: the CPU backend computes on them, a GPU model wants
   store_ops instead). Return value: MSKV_SUCCESS, or INVALID_ARGUMENT (any
   field out of its domain, checked whatever the other fields say: a bad dtype
   without layers too, store_ops missing a function) / OVERFLOW /
   OUT_OF_MEMORY (the pools did not fit; nothing is kept).
   Thread safety: the arena's functions may be called from several threads. */
MSKV_API mskv_result mskv_arena_create(const mskv_arena_desc *desc, mskv_arena **out);
/* Frees the arena with its pools, requests and host copies; NULL is a no-op. */
MSKV_API void mskv_arena_destroy(mskv_arena *arena);
/* Fills out with the arena's counts as they are now. */
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

/* Ranks in agreement. With one process per GPU (tensor or sequence
   parallel), every rank owns an arena over its own head shard and must make
   the same decisions: the same admits succeed, the same pages are released,
   offloaded and retired, in the same order. mskv_rank_check compares the
   ranks' arenas by their digests (the bookkeeping only: host copies hold
   each rank's own heads, so their bytes are left out; retirement is in, so
   ranks must retire deterministically, e.g. waiting for the fence of the
   step before) and names the first step at which two ranks differ.
   Each call records (step, digest) of the arena as it is now. With an
   all-reduce it then compares every record since the last agreeing check
   across the ranks in one collective: count is always 4 * MSKV_RANK_STEPS
   values (the same on every rank), and the callback replaces each
   values[i] by its minimum over all ranks (MPI_Allreduce with MPI_MIN on
   MPI_UINT64_T, ncclAllReduce with ncclMin on ncclUint64); the second
   half of the values is the first's complement, so that one minimum yields
   the maximum too.
   Without one (NULL) it only records: check at least every
   MSKV_RANK_STEPS - 1 steps; every rank must call it at the same steps.
   Parameters: arena, step (the caller's step number, a label), allreduce
   (NULL: record only), user (passed to allreduce), first_divergent (set on
   DIVERGED: the step of the earliest record in which two ranks differ; may
   be NULL).
   Return value: SUCCESS (recorded; with allreduce: every rank's records
   agree, and they are dropped), DIVERGED, CAPACITY (record only, and
   MSKV_RANK_STEPS - 1 records wait for a check), NULL_POINTER, or the
   callback's error. Nothing changes on error: the records wait for the next
   check, so it names the same first step again.
   Thread safety: like every arena call; the all-reduce runs without the
   arena's lock. Cost: one pass over the bookkeeping (pages and tables),
   and one collective of about 4 KiB when it compares. */
#define MSKV_RANK_STEPS 64
/* mskv_rank_check's all-reduce: replaces each of the count values by its minimum over all ranks. */
typedef mskv_result (*mskv_allreduce_min_fn)(void *user, uint64_t *values, int32_t count);
/* Records the arena's digest at step and, with allreduce, compares the ranks' records (see above). */
MSKV_API mskv_result mskv_rank_check(mskv_arena *arena, uint64_t step, mskv_allreduce_min_fn allreduce, void *user,
                                     uint64_t *first_divergent);
/* Frees the host memory the arena keeps for reuse (the last host copy a
   reload or remove gave back; the next offload would have reused it). */
MSKV_API void mskv_arena_trim(mskv_arena *arena);
/* Pages freed during fences <= completed become reusable (FENCED mode). */
MSKV_API mskv_result mskv_arena_retire(mskv_arena *arena, uint64_t completed);
/* The current fence: pages freed now are tagged with it. */
MSKV_API uint64_t mskv_arena_step(mskv_arena *arena);
/* Drops every request (keyed entries and offloaded ones too; lockstep groups
   are dissolved) and returns every page, as if each were removed: a page a
   kernel may still read goes to pending like any free (FENCED mode), and
   comes back at its fence or at mskv_arena_flush. Every request handle is
   stale afterwards. Fences and epochs keep counting up (a GPU's recorded
   events stay valid); the kept host buffer stays (mskv_arena_trim). When no
   page is pending afterwards, the free list and request slots are reordered
   as in a new arena, so the same calls hand out the same page ids again.
   BAD_STATE while a streamed export or import is open (export_begin ..
   export_end, import_begin .. import_commit or import_abort), naming the
   request: its transport still reads or writes the pages, so they cannot go
   back; nothing changes. End or abort the transfer first.
   Parameters: arena. Return value: SUCCESS, NULL_POINTER, BAD_STATE.
   Thread safety: like every arena call; another thread's handles go stale. */
MSKV_API mskv_result mskv_arena_reset(mskv_arena *arena);
/* Waits until no kernel may read a pending page, then makes every pending
   page free: with store_ops, its flush op waits for the device (the GPU
   store's waits for its stream); without, the caller's word that its work
   is done (the CPU backend returns only when it is). The current fence
   counts as completed. Pages an open streamed transfer holds are not
   pending, so a flush while one is open leaves them (and the transfer) alone.
   Parameters: arena. Return value: SUCCESS,
   NULL_POINTER, or the flush op's error (then nothing changes).
   Thread safety: like every arena call; the flush op runs under the lock. */
MSKV_API mskv_result mskv_arena_flush(mskv_arena *arena);

/* Host store geometry and pools (NULL pools when num_layers == 0 or store_ops). */
typedef struct mskv_store_info {
    int32_t num_layers, kv_heads, head_dim, page_size, num_pages;
    mskv_dtype dtype;
    size_t elem_size;
    size_t slot_bytes;    /* kv_heads * head_dim * elem_size */
    size_t page_bytes;    /* page_size * slot_bytes: one page of one layer of K (or V) */
    size_t pool_bytes;    /* num_pages * page_bytes */
} mskv_store_info;

/* Fills out with the host store's geometry and pool sizes. */
MSKV_API mskv_result mskv_store_info_get(mskv_arena *arena, mskv_store_info *out);
/* Pool of one layer, layout [page][slot][kv_head][dim]. kind 0 = K, 1 = V. */
MSKV_API void *mskv_store_pool(mskv_arena *arena, int32_t layer, int kind);

/* // >>requests ----------------------------------------------------------- */

typedef enum mskv_location { MSKV_RESIDENT = 0, MSKV_OFFLOADED = 1 } mskv_location;   /* where a request's K/V are: its pages, or a host copy */

/* A request's state (mskv_request_info_get). */
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
    int32_t lockstep;       /* a member of a lockstep group (mskv_lockstep_create) */
    uint64_t last_admitted; /* the arena's admit count at its last admit, 0 = never (mskv_make_room) */
    int64_t release_point;  /* token-exact end of what was released: the live tokens before it are gone
                               (live_start is where the whole pages ended); 0 = nothing released, or
                               forgotten by a protect that moved the prefix while no page went */
    int64_t pos_shift;      /* added to the request's derived RoPE positions (mskv_request_shift_positions) */
    int64_t pos_shift_pending; /* a shift waiting for the open reservation's commit */
} mskv_request_info;

/* Layer groups (mskv_arena_desc.num_groups > 1). A request's tokens are the
   same in every group (committed, reserved); what is per group is its page
   table, protected prefix, released window, prefix_epoch and retention. The
   calls below without a group act on group 0 (the only group of a one-group
   arena); their *_in_group twins take the group (0 <= group < num_groups,
   else INVALID_ARGUMENT) and otherwise behave, and fail, exactly alike.
   Calls on the whole request (admit, commit, abort, publish, fork, offload,
   reload, export, import, remove, reserve) act on every group at once, all
   or nothing. */

/* A new, empty request (one KV stream). TOO_MANY_REQUESTS when every slot of
   max_requests is in use. */
MSKV_API mskv_result mskv_request_add(mskv_arena *arena, mskv_request *out);
/* Removes a request in any state (an open reservation is dropped, a host copy
   freed). Every page goes back: pending until the current fence retires in
   FENCED mode. The handle is stale from now on. BAD_STATE for a member of a
   lockstep group (mskv_lockstep_remove, or dissolve the group first), or
   one in an open streamed export or import (end, commit or abort it). */
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
/* Ends a pause: admit takes the request again. */
MSKV_API mskv_result mskv_request_resume(mskv_arena *arena, mskv_request req);
/* Size the request's page table for `tokens` tokens now, so steps up to that
   length never allocate. Changes no state. */
MSKV_API mskv_result mskv_request_reserve(mskv_arena *arena, mskv_request req, int64_t tokens);
/* Fills out with the request's tokens, prefix, pages and state (group 0). */
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
/* Release the n oldest still-visible live tokens: the release point moves on
   by n from where the previous release left it (live_start when none), so
   twelve release_oldest(1) calls hide twelve tokens. Only pages whose
   every slot lies before it are freed (page floor), the table is
   front-compacted to [prefix pages][live pages], and *released
   (optional) gets the tokens actually freed (a multiple of page_size).
   The release point itself is kept token-exact (mskv_request_info.
   release_point: it never moves back, and a protect that moves the prefix
   while no page went forgets it), so plans built with MSKV_VIS_EXACT hide
   the released tokens a kept page still holds.
   Return value: OUT_OF_RANGE (past the committed live tokens: reserved
   tokens are never released), INVALID_ARGUMENT (n < 0), OFFLOADED, READ_ONLY,
   BAD_STATE (a lockstep member: mskv_lockstep_release_oldest; an open
   streamed export or import). */
MSKV_API mskv_result mskv_request_release_oldest(mskv_arena *arena, mskv_request req, int64_t n, int64_t *released);
/* Custom position advance (M-RoPE's position delta, or re-indexing RoPE
   positions after releases so they stay bounded over an endless video):
   delta is added to the request's pos_shift, which mskv_plan_build adds to
   the RoPE positions it derives for the request's tokens (plan->positions:
   1-D absolute - pos_offset + pos_shift, 3-D the grid of that; explicit
   positions in mskv_plan_desc are taken as they are). With no reservation
   open it applies at once; with one open it waits for the commit that
   closes it (pos_shift_pending), so every plan of the open chunk (one per
   denoise step) carries the same positions, and an abort drops it.
   Only RoPE positions move. Slots stay on absolute token indices, and so do
   the positions masks compare (kv_pos_split/kv_pos_shift, q_pos, the
   visibility bounds): a shift that applies to keys and queries alike
   changes no mask. K already written keeps the rotation it was written
   with: re-rotate it (mskv_rope_apply with the delta as position) when the
   model expects cached keys at the new positions.
   Return value: SUCCESS, NULL_POINTER, INVALID_HANDLE, READ_ONLY (a keyed
   entry), BAD_STATE (a streamed export of it is open), OVERFLOW (|pos_shift| would pass INT32_MAX; nothing changes).
   Works on an offloaded request too (it is bookkeeping only).
   Thread safety: like every arena call. */
MSKV_API mskv_result mskv_request_shift_positions(mskv_arena *arena, mskv_request req, int64_t delta);
/* slot = page * page_size + offset of absolute position pos (committed or
   reserved). Return value: RELEASED (its page was released), NOT_WRITTEN
   (pos >= committed + reserved), INVALID_ARGUMENT (pos < 0), OFFLOADED. */
MSKV_API mskv_result mskv_request_slot(mskv_arena *arena, mskv_request req, int64_t pos, int64_t *slot);

/* The group's view: info (tokens, and the group's prefix, window, pages,
   kv_len and epoch), page table, slot, protect, release and retention.
   Parameters: as the calls above, plus group. Return value: theirs, plus
   INVALID_ARGUMENT for a group outside [0, num_groups).
   Thread safety: like every arena call. */
MSKV_API mskv_result mskv_request_info_in_group(mskv_arena *arena, mskv_request req, int32_t group, mskv_request_info *out);
/* mskv_request_pages of one layer group. */
MSKV_API mskv_result mskv_request_pages_in_group(mskv_arena *arena, mskv_request req, int32_t group, int32_t *pages, int32_t cap, int32_t *count);
/* mskv_request_slot of one layer group. */
MSKV_API mskv_result mskv_request_slot_in_group(mskv_arena *arena, mskv_request req, int32_t group, int64_t pos, int64_t *slot);
/* mskv_request_protect_prefix of one layer group. */
MSKV_API mskv_result mskv_request_protect_prefix_in_group(mskv_arena *arena, mskv_request req, int32_t group, int64_t n);
/* mskv_request_release_oldest of one layer group. */
MSKV_API mskv_result mskv_request_release_oldest_in_group(mskv_arena *arena, mskv_request req, int32_t group, int64_t n, int64_t *released);

/* // >>offload ------------------------------------------------------------ */

/* Copy every resident page (all layers, K and V) to host memory owned by the
   request (desc.host_allocator; a buffer a reload gave back is reused), then
   free the pages; only once the copy is complete. Token counts, prefix, released window and epoch are kept.
   Return value: OFFLOADED (already), RESERVATION_PENDING, READ_ONLY (keyed
   entry), OUT_OF_MEMORY, or the store ops' error (the request stays resident),
   BAD_STATE (a lockstep member: mskv_lockstep_offload; an open streamed
   export or import).
   With MSKV_DEBUG_CHECKSUMS a checksum of every page is kept with the copy. */
MSKV_API mskv_result mskv_request_offload(mskv_arena *arena, mskv_request req);
/* All or nothing: fresh pages (possibly other ids), bytes copied back,
   prefix_epoch moves, the host copy is freed. Return value: NOT_OFFLOADED,
   OUT_OF_PAGES (nothing changes, the host copy stays), OUT_OF_MEMORY,
   HOST_COPY_CORRUPT (MSKV_DEBUG_CHECKSUMS: a page of the host copy changed
   since offload or import; nothing changes), or the store ops' error (the
   request stays offloaded), BAD_STATE (a lockstep member:
   mskv_lockstep_reload). */
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

/* Streaming: the blob of mskv_request_export without a host copy of it, for
   a transport (mstar_kv_ucx.h) that sends the header and then reads the
   pages straight from the pools, and writes arriving pages straight into
   the receiver's pools. The blob is the same, byte for byte: a streamed
   import of an exported blob and a whole-blob import of a streamed export
   give the same request, and exporting either again gives the same bytes.
   The blob is its header (header_bytes), then range_count ranges of
   range_bytes each in blob order (layer group, page-table entry, layer, K
   then V), then the 8-byte little-endian checksum of everything before it.
   Only for arenas with host pools or bookkeeping only: pages behind
   store_ops (a GPU store) have no host address, so their blobs go through
   mskv_request_export / mskv_request_import (staged in host memory).
   The layout of an import is the arriving blob's (its header_bytes are the
   blob's, also for a version-3 header that an older version could have
   said), so header_bytes + range_count * range_bytes + 8 == blob_bytes, and
   a streamed import accepts exactly the blobs mskv_request_import accepts.
   An open transfer holds its pages (or host copy): no call frees or moves
   them until export_end, import_commit or import_abort. The request's own
   calls that would return BAD_STATE, make_room passes over it, and
   mskv_arena_reset returns BAD_STATE naming it (nothing changes);
   mskv_arena_flush and mskv_arena_retire go on, as they free only pages no
   request holds. */
#define MSKV_BLOB_HEADER_MAX 2384   /* the largest header: 32 layer groups with the positions record (version 3) */

/* Where a blob's header, page ranges and checksum lie (streamed export and import). */
typedef struct mskv_blob_layout {
    size_t header_bytes;    /* the blob's first header_bytes */
    size_t blob_bytes;      /* header + ranges + checksum: mskv_request_export's size */
    int64_t range_count;
    size_t range_bytes;     /* one page of one layer of K or V (mskv_store_info.page_bytes) */
    uint64_t checksum;      /* export: the blob's last 8 bytes, as a number */
} mskv_blob_layout;

/* One range of a blob's payload: where its bytes are (export) or go (import). */
typedef struct mskv_blob_range {
    void *data;             /* a host pool page, or inside an offloaded request's host copy */
    size_t bytes;
    uint64_t offset;        /* where the bytes sit in the blob */
    int32_t page;           /* physical page id; 0 when data is in a host copy */
    int32_t group, layer, kind;   /* kind 0 = K, 1 = V */
} mskv_blob_range;

/* Begins a streamed export: writes the blob header into header (cap bytes;
   MSKV_BLOB_HEADER_MAX is always enough), fills layout (checksum included:
   this call reads every range once) and freezes the request until
   mskv_request_export_end: calls that would change it or its bytes (admit,
   commit, abort, publish, protect, release, set_retention, shift_positions,
   offload, reload, remove, lockstep_create) return BAD_STATE, make_room passes over it, and reads
   (info, pages, plans, export, fork) work as before. A copy may be exported
   by several readers of the ranges, but only one export is open at a time.
   Parameters: arena, req (resident or offloaded, or a sealed keyed entry),
   header, cap, layout. Return value: SUCCESS, CAPACITY (cap too small),
   RESERVATION_PENDING, BAD_STATE (already being exported, a lockstep
   member), UNSUPPORTED (store_ops), OVERFLOW, HOST_COPY_CORRUPT (as
   mskv_request_export). Nothing changes on error.
   Thread safety: like every arena call; the ranges stay valid until
   export_end, and reading them needs no lock. */
MSKV_API mskv_result mskv_request_export_begin(mskv_arena *arena, mskv_request req, void *header, size_t cap, mskv_blob_layout *layout);
/* Ends a streamed export: the request may change again. BAD_STATE when no
   export is open. */
MSKV_API mskv_result mskv_request_export_end(mskv_arena *arena, mskv_request req);
/* Ranges [first, first + n) of a request being exported or imported, in
   blob order. Return value: SUCCESS, OUT_OF_RANGE (past range_count, or
   n < 0), BAD_STATE (neither exporting nor importing). */
MSKV_API mskv_result mskv_request_blob_ranges(mskv_arena *arena, mskv_request req, int64_t first, int64_t n, mskv_blob_range *out);
/* Begins a streamed import from a blob's header (header_size >= its
   header_bytes; the rest of the blob is not needed): checks it as
   mskv_request_import does (all but the checksum, which covers the pages
   yet to come), then takes every page the request needs, all or nothing,
   and returns a handle in the importing state plus the layout; the ranges
   (mskv_request_blob_ranges) say where each page's bytes must land. The
   request is invisible to everything but import_commit, import_abort and
   blob_ranges (other calls with its handle: BAD_STATE; make_room passes
   over it); a keyed entry's key counts as taken.
   Return value: SUCCESS, BLOB_TRUNCATED, BLOB_CORRUPT, BLOB_VERSION,
   BLOB_MISMATCH, DUPLICATE, OUT_OF_PAGES, TOO_MANY_REQUESTS, OUT_OF_MEMORY,
   UNSUPPORTED (store_ops). Nothing changes on error. */
MSKV_API mskv_result mskv_request_import_begin(mskv_arena *arena, const void *header, size_t header_size, mskv_request *out,
                                               mskv_blob_layout *layout);
/* Ends a streamed import: verifies checksum (the blob's last 8 bytes, as a
   number) over the header and the bytes now in the ranges; on a match the
   request exists, resident, with a fresh prefix_epoch. BLOB_CORRUPT on a
   mismatch: the import stays open (abort it; nothing was imported).
   BAD_STATE when the request is not being imported. */
MSKV_API mskv_result mskv_request_import_commit(mskv_arena *arena, mskv_request req, uint64_t checksum);
/* Drops an import: every page goes back exactly as it was taken (the free
   list as before begin), the handle goes stale. BAD_STATE when the request
   is not being imported. */
MSKV_API mskv_result mskv_request_import_abort(mskv_arena *arena, mskv_request req);

/* // >>windows ------------------------------------------------------------ */

/* Window schedule over `total` units (frames or tokens): window k denoises
   [k*stride, k*stride + window), stride = window - overlap. */
typedef struct mskv_schedule {
    int64_t total, window, overlap, stride, count;
} mskv_schedule;

/* One window of a schedule (mskv_schedule_window). */
typedef struct mskv_window {
    int64_t index;
    int64_t start, end;             /* [start, end): what the window denoises; end may pass total */
    int64_t cond_start, cond_end;   /* conditioning: the previous window's tail (empty for window 0) */
    int64_t commit_start, commit_end; /* what it adds, clamped to total; the spans tile [0, total) */
    int64_t pad;                    /* end - total when the last window passes the end, else 0 */
} mskv_window;

/* What a causal decoder decodes for one window (mskv_schedule_decode_span). */
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
   or be 0 = derive it). A window of 0 chunks keeps only the sink (and the
   chunk still being filled), as reset_at_boundary does. */
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
/* Bind a retention policy to a request (NULL clears it); publish applies it.
   BAD_STATE while a streamed export of it is open (its header says the policy). */
MSKV_API mskv_result mskv_request_set_retention(mskv_arena *arena, mskv_request req, const mskv_retention *r);
/* The same for one layer group (e.g. a window for the chunk-window layers,
   none for the full-attention ones). */
MSKV_API mskv_result mskv_request_set_retention_in_group(mskv_arena *arena, mskv_request req, int32_t group, const mskv_retention *r);

/* // >>step lifecycle ----------------------------------------------------- */

/* One request's new tokens in this step. */
typedef struct mskv_segment {
    mskv_request request;
    int64_t n_tokens;
} mskv_segment;

/* All or nothing: every segment gets its tokens reserved (pages allocated), or
   none does. A request may appear once; it must be resident with no open
   reservation. Return value: OUT_OF_PAGES (nothing allocated), DUPLICATE,
   OFFLOADED, RESERVATION_PENDING, READ_ONLY (a write-once keyed entry),
   CAPACITY (a scratch entry past its cap_tokens: mskv_scratch_create),
   INVALID_ARGUMENT (n < 0 or a negative token count), OVERFLOW (past 2^31 tokens),
   OUT_OF_MEMORY (a page table could not grow: see mskv_request_reserve),
   BAD_STATE (a paused request, or some but not all members of a lockstep
   group: admit, commit, abort and publish take a lockstep group whole). */
MSKV_API mskv_result mskv_admit(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* Reserved tokens become committed. Every segment must have an open
   reservation (else NO_RESERVATION, and nothing is committed). */
MSKV_API mskv_result mskv_commit(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* mskv_admit then mskv_commit of the same segments, under one lock: the
   common single-pass step, whose tokens are never aborted (their K/V are
   written after the call, at the slots a plan built after it maps). All or
   nothing: on any error nothing is reserved or committed and the return value
   is the one mskv_admit gives (OUT_OF_PAGES, DUPLICATE, INVALID_HANDLE,
   OFFLOADED, RESERVATION_PENDING, READ_ONLY, CAPACITY, INVALID_ARGUMENT,
   OVERFLOW, OUT_OF_MEMORY, BAD_STATE); on success the state is exactly that
   of the two calls (one admit counted, as make_room's order sees it). */
MSKV_API mskv_result mskv_step(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* Return reservations without committing; the pages they added are freed
   (pending in FENCED mode: a kernel may have written them). NO_RESERVATION
   when a segment has none; BAD_STATE for a request in an open streamed
   export or import. */
MSKV_API mskv_result mskv_abort(mskv_arena *arena, const mskv_segment *segs, int32_t n);
/* End of step: for the given segments' requests, retention policies release
   pages and page-stored events are emitted; then the fence advances (also
   with n == 0). *step_out (optional) gets the fence that ended. */
MSKV_API mskv_result mskv_publish(mskv_arena *arena, const mskv_segment *segs, int32_t n, uint64_t *step_out);
/* The pages mskv_admit(segs, n) would take now (every layer group), into
   *pages; nothing changes. What to ask mskv_make_room for when admit says
   OUT_OF_PAGES. Return value: as mskv_admit's checks (no OUT_OF_PAGES). */
MSKV_API mskv_result mskv_admit_query(mskv_arena *arena, const mskv_segment *segs, int32_t n, int64_t *pages);

/* Which RoPE positions a plan carries (mskv_plan_desc.pos_mode). */
typedef enum mskv_pos_mode {
    MSKV_POS_NONE = 0,   /* no position plan */
    MSKV_POS_1D = 1,     /* positions[i] = absolute position - pos_offset + the request's pos_shift */
    MSKV_POS_3D = 2      /* positions[3i..3i+2] = (frame, row, col) of that on a grid_h x grid_w frame */
} mskv_pos_mode;

/* What a plan's segments attend over (mskv_plan_desc.kind). */
typedef enum mskv_plan_kind {
    MSKV_PLAN_SELF = 0,   /* each segment attends over its own request's stream (incl. its reserved tokens) */
    MSKV_PLAN_CROSS = 1,  /* each segment attends over the keyed entry `cross` */
    MSKV_PLAN_DENSE = 2,  /* no page table: kv_token_indptr over contiguous K/V of kv_len tokens per segment */
    MSKV_PLAN_PREFIX = 3  /* dense over each segment's own protected prefix, as a prefix view holds it
                             (mskv_prefix_view): kv_len = prefix_tokens, keys at positions 0..prefix_tokens-1,
                             queries where they are in the request (q_pos, needed), no slots */
} mskv_plan_kind;

/* Which keys of a segment the plan lets its queries see (on top of the mask).
   The default (0, a zero-initialised mskv_plan_desc, a NULL desc) is
   token-exact: a plan shows exactly what a contiguous rolling cache with the
   same retention holds, whatever the page size. Whole-page visibility is the
   explicit opt-in. (Before version 0.2 the values were PAGES = 0, EXACT = 1.) */
typedef enum mskv_visibility {
    MSKV_VIS_EXACT = 0,  /* token-exact, from the request's state: its protected prefix [0, prefix_tokens) and
                            the live tokens from its release_point on (a retention policy's sink and window:
                            exactly what a contiguous rolling cache keeps, whatever the page size) */
    MSKV_VIS_PAGES = 1,  /* every token of the pages in the table: a release frees whole pages only, so up to
                            page_size - 1 released tokens stay visible at each edge of the window */
    MSKV_VIS_CALLER = 2  /* the caller's bounds: mskv_plan_desc.vis_sink_end / vis_window_start */
} mskv_visibility;

/* How mskv_plan_build plans a step; zero means SELF, no positions, token-exact visibility. */
typedef struct mskv_plan_desc {
    int32_t kind;                /* an mskv_plan_kind (an enum first would make {0} an error in C++) */
    mskv_request cross;          /* for MSKV_PLAN_CROSS */
    const int64_t *dense_kv_len; /* for MSKV_PLAN_DENSE: kv tokens per segment */
    mskv_pos_mode pos_mode;
    int64_t pos_offset;
    int32_t grid_h, grid_w;      /* tokens per frame = grid_h * grid_w (3-D) */
    int32_t group;               /* the layer group whose tables the plan reads (SELF, CROSS, PREFIX) */
    /* Explicit RoPE positions (optional): positions[b] holds segment b's new
       tokens' positions, n_tokens of them (1-D) or 3 * n_tokens (3-D: frame,
       row, col per token), copied into plan->positions as they are (no
       pos_offset, no pos_shift). NULL, or a NULL entry, = derived as pos_mode
       says. Needs pos_mode 1-D or 3-D. Masks do not read them. */
    const int32_t *const *positions;
    /* Which keys the queries see: MSKV_VIS_EXACT (0, the default: the
       rolling cache's window, token-exact, as plan->vis_sink_end /
       vis_window_start), MSKV_VIS_PAGES (every token of the table's pages) or
       MSKV_VIS_CALLER. */
    mskv_visibility visibility;
    const int64_t *vis_sink_end;     /* MSKV_VIS_CALLER: [n], absolute positions in [0, INT32_MAX] */
    const int64_t *vis_window_start; /* MSKV_VIS_CALLER: [n] */
    /* SELF only: hide the protected prefix [0, prefix_tokens), which a
       MSKV_PLAN_PREFIX plan attends over a prefix view instead; the two
       results merged by mskv_cpu_merge equal this plan without the flag.
       INVALID_ARGUMENT when the visible set minus the prefix is not of the
       bounds' form (a visible sink reaching past the prefix before a hole). */
    int32_t exclude_prefix;
    /* Padding to a captured shape, so one CUDA graph replays every step that
       fits it (0 = no padding, each field on its own). The plan gets pad_batch
       segments and pad_tokens queries: the step's segments first, then
       padding segments (no keys, no pages, bounds 0; plan->pad_segments of
       them) that hold the extra queries, spread evenly, with slot -1
       (nothing is written), RoPE position 0 and q_pos by the tail rule. No
       key is read for them; their rows of o and lse are not part of the
       result (the CPU writes 0 and -inf, the GPU only what its captured
       tiles reach). Extra queries need a padding segment: capture over the
       largest step padded to pad_batch = its batch + 1, and every smaller
       step has one. pad_qo_len / pad_kv_len: the captured longest segment's
       queries and keys, copied into the plan, where the GPU attention takes
       them as its launch shape. A step larger than the padded shape is
       CAPACITY, nothing written ("capture again"): more segments or queries,
       a segment with more queries or keys, or extra queries and no padding
       segment to hold them. */
    int32_t pad_batch, pad_tokens, pad_qo_len, pad_kv_len;
} mskv_plan_desc;

/* mskv_plan.features: which optional arrays hold something other than what
   their absence means, so a kernel built without them may ignore them only
   while the bit is clear. */
#define MSKV_PLAN_Q_POS 1u       /* q_pos is not the tail rule */
#define MSKV_PLAN_VISIBILITY 2u  /* some segment's bounds hide keys */

/* The kernels' view of one step. Arrays are caller-owned (fixed capacity, so
   a captured graph replays at the same addresses) or plan-owned (mskv_plan_alloc).

   Positions, all absolute, all int32, per segment b (what a kernel must do):
   - key j (compacted index, 0 <= j < kv_len[b]) is at
       kpos(j) = j < kv_pos_split[b] ? j : j + kv_pos_shift[b],
     which never decreases with j (kv_pos_shift >= 0);
   - query i (0 <= i < qo_len) is at
       qpos(i) = q_pos ? q_pos[qo_indptr[b] + i] : kpos(kv_len[b] - qo_len + i)
     (without q_pos, queries are the tail of their sequence; with it, a part
     of a split-KV computation knows where its queries are);
   - key j is visible to query i iff
       (no vis arrays || kpos(j) < vis_sink_end[b] || kpos(j) >= vis_window_start[b])
       && (mask NONE || kpos(j) <= qpos(i))
       && (mask != WINDOW || qpos(i) - kpos(j) <= window_left).
     As kpos rises with j, the visible keys of a segment are at most two runs
     of compacted indices, [0, first(vis_sink_end)) and
     [first(vis_window_start), kv_len), first(p) being the first j with
     kpos(j) >= p: a kernel skips the pages wholly between them and masks
     only the tiles that straddle a bound (interior tiles pay nothing).
     vis_window_start <= vis_sink_end (build writes 0, 0) hides nothing.
   - a query that sees no key gets o = 0 and lse = -inf.
   RoPE positions (plan->positions) are another matter: what K and Q are
   rotated by; masks never read them. */
typedef struct mskv_plan {
    int32_t batch, total_q, num_page_ids, page_size;
    int32_t *qo_indptr;        /* [batch+1] */
    int32_t *kv_indptr;        /* [batch+1] into kv_indices */
    int32_t *kv_indices;       /* [num_page_ids] physical pages */
    int32_t *kv_last_page_len; /* [batch], 1..page_size (0 only for a sequence with no pages) */
    int32_t *kv_len;           /* [batch] tokens per sequence */
    int32_t *kv_pos_split;     /* [batch] */
    int32_t *kv_pos_shift;     /* [batch] */
    int64_t *kv_token_indptr;  /* [batch+1] dense path: prefix sums of kv_len (rows of a dense K/V) */
    int64_t *slot_mapping;     /* [total_q] page*page_size+offset of each reserved token; -1 for a
                                  committed one (its page may be shared) and in CROSS/DENSE/PREFIX plans */
    int32_t *positions;        /* [total_q] (1-D) or [3*total_q] (3-D): RoPE positions */
    /* capacities of the arrays above (caller-owned mode) */
    int32_t cap_batch, cap_tokens, cap_page_ids;
    uint64_t step;             /* the fence the plan was built in */
    void *owned;               /* set by mskv_plan_alloc */
    /* Stale-plan check (mskv_plan_check), filled by mskv_plan_build: */
    mskv_request *requests;    /* [batch] optional (mskv_plan_alloc provides it): each segment's request, so
                                  only pages leaving these requests make the plan stale; NULL: any
                                  request's pages leaving make it stale */
    mskv_request cross;        /* a CROSS plan's keyed entry (its pages are the ones read); else 0 */
    int32_t group;             /* the layer group whose tables were read (mskv_plan_desc.group) */
    uint64_t generation;       /* the arena's page-table generation at build; 0 = never checked (a
                                  plan not built by an arena, or a DENSE plan) */
    /* Optional (NULL = absent, the rules above); capacities cap_tokens and
       cap_batch. mskv_plan_build fills them when present, and needs them
       when the plan cannot do without (q_pos for PREFIX; the bounds for
       MSKV_VIS_CALLER and exclude_prefix, and for MSKV_VIS_EXACT when a
       window hides tokens its pages still hold: NULL_POINTER then). */
    int32_t *q_pos;            /* [total_q] each query's absolute (mask) position */
    int32_t *vis_sink_end;     /* [batch] */
    int32_t *vis_window_start; /* [batch] */
    uint32_t features;         /* MSKV_PLAN_Q_POS | MSKV_PLAN_VISIBILITY */
    /* The launch shape of a padded plan (mskv_plan_desc.pad_qo_len /
       pad_kv_len; 0 = its own): a GPU launch over the plan is sized as if its
       longest segment had at least this many queries and keys, so an eager
       launch and a graph captured over the padded shape run alike. */
    int32_t pad_qo_len, pad_kv_len;
    /* The last pad_segments segments are padding (mskv_plan_desc.pad_batch):
       no keys, no pages, slots -1; they do not count for the launch shape and
       their rows of o and lse are not part of the result. */
    int32_t pad_segments;
} mskv_plan;

/* The array sizes a plan of a step needs (mskv_plan_query). */
typedef struct mskv_plan_size {
    int32_t batch, total_q, num_page_ids;
} mskv_plan_size;

/* The sizes mskv_plan_build needs for these segments, into out; nothing changes. */
MSKV_API mskv_result mskv_plan_query(mskv_arena *arena, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan_size *out);
/* Fills the plan's arrays for this step's segments. Return value: CAPACITY
   (nothing written) when a cap is too small, NULL_POINTER for a missing
   array (or a missing optional array the desc needs), OUT_OF_RANGE (a
   segment has more queries than its sequence has tokens, or a 1-D position
   / 3-D frame does not fit in int32: positions are exact or refused, never
   truncated), OVERFLOW (position + pos_shift - pos_offset does not fit in
   int64), OFFLOADED, BAD_STATE (CROSS against an entry that is not a sealed
   keyed entry), INVALID_ARGUMENT (kind, pos_mode, grid, visibility, bounds
   outside [0, INT32_MAX], explicit positions without a pos_mode,
   exclude_prefix on another kind than SELF or with bounds it cannot
   express). mskv_plan_query returns the same codes. Nothing is written on
   failure. */
MSKV_API mskv_result mskv_plan_build(mskv_arena *arena, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan *plan);
/* Allocate arrays of the given capacities (through the arena's allocator). */
MSKV_API mskv_result mskv_plan_alloc(mskv_arena *arena, int32_t cap_batch, int32_t cap_tokens, int32_t cap_page_ids, mskv_plan *plan);
/* Frees the arrays mskv_plan_alloc allocated. */
MSKV_API void mskv_plan_free(mskv_arena *arena, mskv_plan *plan);
/* Checks the CSR invariants: monotone indptrs, indices in [1, num_pages),
   last_page_len rule, kv_len consistent with pages, and that features
   covers the optional arrays (with MSKV_PLAN_Q_POS clear, q_pos holds the
   tail rule; with MSKV_PLAN_VISIBILITY clear, no bound hides a key; bounds
   are not negative). A dense sequence (no pages, kv_len > 0) is checked
   through kv_token_indptr instead. why gets the broken rule. */
MSKV_API mskv_result mskv_plan_validate(const mskv_plan *plan, int32_t num_pages, char *why, size_t why_cap);
/* Whether a plan built by mskv_plan_build still describes its requests'
   pages. A plan is stale once pages left the table it read of one of its
   requests (release, retention at publish, offload, abort, remove, reset,
   make_room, the lockstep calls: those pages may now hold another request's
   tokens); a request that only grew (admit, commit) keeps its plans valid.
   Staleness is per request and per layer group: a plan of group g reads
   only group g's tables, so pages leaving another group's table (that
   group's retention, say) leave it valid, and so does another request's
   loss. The arena counts every loss of pages from any table in one
   generation, and each request's table per group remembers the generation
   of its last loss: the check is one compare while nothing lost pages since
   the build, else one per segment (plan->requests; without that array any
   loss in the arena makes the plan stale). A plan with generation 0 (made by the caller,
   or DENSE) is never stale. mskv_cpu_write_kv, mskv_cpu_attention and the
   GPU wrappers call this first; check it yourself before handing a plan to
   your own kernels. Return value: SUCCESS, STALE_PLAN (also for a removed
   request, or a generation this arena never had), NULL_POINTER.
   Thread safety: takes the arena's lock. */
MSKV_API mskv_result mskv_plan_check(mskv_arena *arena, const mskv_plan *plan);

/* Prefix views: the dense fast path keyed by prefix_epoch. A request's
   protected prefix (the prompt, the sink frames) is read every step and
   changes rarely: gathered once into contiguous, caller-owned K/V, it is
   attended without a page table (a MSKV_PLAN_PREFIX plan, on the CPU with
   mskv_cpu_attention_dense), while a SELF plan with exclude_prefix covers
   the rest; mskv_cpu_merge joins the two. The view carries the prefix_epoch
   it was gathered at: once the prefix's length or placement changes
   (protect with another length, reload onto other pages, another request
   imported from a blob) a check refuses it with MSKV_ERROR_STALE_VIEW, and
   gathering again refreshes it in place, into the same buffers.
   The caller sets request, group, k, v and cap_tokens (zero the rest);
   mskv_prefix_view_gather sets the others. Buffers hold the store's dtype,
   layout [num_layers][cap_tokens][kv_heads][head_dim] each for K and V.
   The host gather reads the arena's host pools, or whole pages through
   store_ops (read_pages) for a device store; the GPU layer's
   mskv_cuda_prefix_view_gather fills device buffers of the same layout
   (device = 1) and mskv_cuda_attention_dense attends over them; the epoch
   rules here hold for both. */
typedef struct mskv_prefix_view {
    mskv_request request;
    int32_t group;
    void *k, *v;             /* caller-owned */
    int64_t cap_tokens;      /* tokens per layer the buffers hold */
    int64_t tokens;          /* the prefix gathered: tokens [0, tokens) */
    uint64_t epoch;          /* prefix_epoch at the gather; 0 = never gathered, or a refresh that failed */
    int32_t num_layers, kv_heads, head_dim;
    mskv_dtype dtype;
    int32_t device;          /* 0: host buffers (this header's gather); 1: device buffers (the GPU layer's) */
} mskv_prefix_view;

/* Gathers (or refreshes, in place) the request's protected prefix of group
   `group`, every layer, K and V, and tags the view with its prefix_epoch.
   Return value: SUCCESS, NULL_POINTER (view, a buffer), INVALID_ARGUMENT
   (group, cap_tokens < 0), INVALID_HANDLE, OFFLOADED, CAPACITY (the prefix
   is longer than cap_tokens), OVERFLOW, UNSUPPORTED (the arena keeps no
   bytes: num_layers 0), OUT_OF_MEMORY (a page record for a store_ops read),
   or the store's read error: then the buffers may hold part of the new
   prefix and the view says epoch 0 (stale) rather than pass for either.
   Nothing is written for any other failure.
   Thread safety: like every arena call (the copy runs under the lock). */
MSKV_API mskv_result mskv_prefix_view_gather(mskv_arena *arena, mskv_prefix_view *view);
/* SUCCESS while the view's epoch is the request's prefix_epoch (of its
   group) and its tokens the prefix length; STALE_VIEW otherwise (also a view
   never gathered); INVALID_HANDLE for a removed request; NULL_POINTER;
   INVALID_ARGUMENT (group). */
MSKV_API mskv_result mskv_prefix_view_check(mskv_arena *arena, const mskv_prefix_view *view);

/* Keyed, write-once K/V (cross-attention, e.g. text-encoder output): created
   with its tokens reserved, written through a plan, sealed, then read by any
   number of requests' plans. Removal waits for the fence like any free. */
MSKV_API mskv_result mskv_keyed_create(mskv_arena *arena, uint64_t key, int64_t n_tokens, mskv_request *out);
/* Seals a keyed entry once its K/V are written: plans may read it, nothing may change it. */
MSKV_API mskv_result mskv_keyed_seal(mskv_arena *arena, mskv_request entry);
/* The keyed entry of key, into out (NOT_FOUND when there is none). */
MSKV_API mskv_result mskv_keyed_find(mskv_arena *arena, uint64_t key, mskv_request *out);
/* Removes the keyed entry of key; its pages wait for the fence like any free. */
MSKV_API mskv_result mskv_keyed_remove(mskv_arena *arena, uint64_t key);

/* Keyed scratch: a rewritable keyed entry for a small model that runs a short
   autoregressive loop inside every step of a larger one (a speech or audio
   code predictor): its per-step K/V live in the arena's pages instead of
   private tensors, and are thrown away when the next step starts.
   mskv_scratch_create makes an empty entry under key (found and removed by
   mskv_keyed_find / mskv_keyed_remove, the key taken like any keyed entry's)
   whose page tables are sized for cap_tokens tokens now, and takes no page.
   Each step, mskv_scratch_reset drops its tokens; then it is admitted,
   planned (SELF, like any request: mskv_plan_build, mskv_cpu_write_kv,
   mskv_cpu_attention), committed, aborted and published like any request,
   up to cap_tokens tokens in all. Its pages come from the arena's shared
   budget and go back at each reset (pending on their fence in FENCED mode,
   like any freed page: a kernel of the last step may still read them), so
   the same steps take the same page ids again and no host memory is
   allocated after create. What changes a kept sequence is refused as for a
   keyed entry (READ_ONLY: protect, release, retention, fork, offload,
   shift_positions, lockstep); it is never sealed, exported or parked by
   mskv_make_room (BAD_STATE for seal and export). mskv_request_info says
   keyed = 1, sealed = 0.
   create: Parameters: arena, key, cap_tokens (>= 1), out. Return value:
   SUCCESS, NULL_POINTER, INVALID_ARGUMENT (cap_tokens < 1), OVERFLOW (past
   2^31 tokens), OUT_OF_PAGES (cap_tokens would need more pages, in every
   layer group, than the arena has at all), DUPLICATE (key exists),
   TOO_MANY_REQUESTS, OUT_OF_MEMORY (the page tables); nothing changes on
   error. admit of a scratch entry past cap_tokens is CAPACITY (nothing
   admitted).
   reset: Parameters: arena, entry. Return value: SUCCESS, NULL_POINTER,
   INVALID_HANDLE, BAD_STATE (not a scratch entry), RESERVATION_PENDING (a
   step is open: commit or abort it first); nothing changes on error. A
   plan built before the reset reads pages the entry no longer holds:
   mskv_plan_check says STALE_PLAN.
   Thread safety: like every arena call. */
MSKV_API mskv_result mskv_scratch_create(mskv_arena *arena, uint64_t key, int64_t cap_tokens, mskv_request *out);
/* Drops a scratch entry's tokens before the next step (see above). */
MSKV_API mskv_result mskv_scratch_reset(mskv_arena *arena, mskv_request entry);

/* Windowed session: binds a request to a retention policy and does the
   protect/release bookkeeping. begin_chunk reserves a chunk's tokens (admit);
   the model writes K/V through mskv_session_plan's slots and attends; after
   the last denoise step, commit_chunk commits, protects the sink once it is
   complete and releases what fell out of the window: commit and publish
   under one lock, all or nothing (on an error the chunk stays open and
   neither the arena nor the session changed). */
typedef struct mskv_session {
    mskv_arena *arena;
    mskv_request request;
    mskv_retention retention;
    int64_t chunk_tokens;   /* the open chunk's tokens, 0 when none */
    int64_t chunks_done;
    int64_t released_total; /* tokens released so far */
} mskv_session;

/* Binds policy r to request req (mskv_request_set_retention) and starts session s on it. */
MSKV_API mskv_result mskv_session_init(mskv_session *s, mskv_arena *arena, mskv_request req, const mskv_retention *r);
/* Reserves the next chunk's n_tokens tokens (an admit). */
MSKV_API mskv_result mskv_session_begin_chunk(mskv_session *s, int64_t n_tokens);
/* Plans the open chunk (mskv_plan_build of its one segment). */
MSKV_API mskv_result mskv_session_plan(mskv_session *s, const mskv_plan_desc *desc, mskv_plan *plan);
/* Commits the open chunk and publishes, protecting the sink and releasing the window's past (see above). */
MSKV_API mskv_result mskv_session_commit_chunk(mskv_session *s, uint64_t *step_out);
/* Drops the open chunk's reservation (an abort). */
MSKV_API mskv_result mskv_session_abort_chunk(mskv_session *s);

/* // >>scheduling --------------------------------------------------------- */

/* Lockstep groups: requests that must move together, such as the
   conditional and unconditional branches of classifier-free guidance
   (separate requests: their hidden states differ). The batch calls (admit,
   commit, abort, publish) refuse a batch that holds some but not all of a
   group's members (BAD_STATE), so a group is admitted, committed and
   published (its members' retention releases pages) in one call, all or
   nothing; mskv_lockstep_segments gives the batch, which one mskv_plan_build
   plans (member i is the plan's segment i). Offload, reload, remove and
   release of a member go through the mskv_lockstep_* calls below, all or
   nothing; the single-request calls refuse members (BAD_STATE). Everything
   else stays per request: protect_prefix (a branch's prompt may have its
   own length), retention, pause (a paused member keeps its group from being
   admitted), fork (the child is no member), export. A handle with a
   generation, like a request's. */
typedef struct mskv_lockstep { uint32_t id; } mskv_lockstep;

#define MSKV_MAX_LOCKSTEP 16   /* members of one lockstep group */

/* Binds n (2..MSKV_MAX_LOCKSTEP) requests, in this order, into a group.
   They must all be resident or all offloaded, without open reservations,
   and in no other group. Parameters: arena, members, n, out.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (n), INVALID_HANDLE,
   DUPLICATE (a request twice), READ_ONLY (a keyed entry),
   RESERVATION_PENDING, BAD_STATE (already a member, or mixed locations).
   Thread safety: like every arena call. */
MSKV_API mskv_result mskv_lockstep_create(mskv_arena *arena, const mskv_request *members, int32_t n, mskv_lockstep *out);
/* Unbinds the group; the members stay as they are, now independent.
   Return value: SUCCESS, NULL_POINTER, INVALID_HANDLE (unknown or stale). */
MSKV_API mskv_result mskv_lockstep_dissolve(mskv_arena *arena, mskv_lockstep ls);
/* The members in order; *count gets their number even when cap is too
   small (then CAPACITY). Return value: also NULL_POINTER, INVALID_ARGUMENT
   (cap < 0), INVALID_HANDLE. */
MSKV_API mskv_result mskv_lockstep_members(mskv_arena *arena, mskv_lockstep ls, mskv_request *out, int32_t cap, int32_t *count);
/* The batch of one lockstep step: a segment of n_tokens per member, in
   member order, for mskv_admit / mskv_plan_build / mskv_commit /
   mskv_publish (or part of a larger batch). Return value: SUCCESS,
   NULL_POINTER, INVALID_ARGUMENT (n_tokens < 0), INVALID_HANDLE, CAPACITY. */
MSKV_API mskv_result mskv_lockstep_segments(mskv_arena *arena, mskv_lockstep ls, int64_t n_tokens, mskv_segment *segs, int32_t cap, int32_t *count);
/* Offloads every member, all or nothing: every member's pages are copied
   to host memory first, and only when every copy succeeded are any pages
   freed (a host allocation or store failure for one member leaves all of
   them resident). Return value: as mskv_request_offload. */
MSKV_API mskv_result mskv_lockstep_offload(mskv_arena *arena, mskv_lockstep ls);
/* Reloads every member, all or nothing (OUT_OF_PAGES when the pages of all
   of them do not fit; a store failure for one leaves all offloaded).
   Return value: as mskv_request_reload. */
MSKV_API mskv_result mskv_lockstep_reload(mskv_arena *arena, mskv_lockstep ls);
/* Removes every member and the group. Return value: SUCCESS, NULL_POINTER,
   INVALID_HANDLE. */
MSKV_API mskv_result mskv_lockstep_remove(mskv_arena *arena, mskv_lockstep ls);
/* mskv_request_release_oldest_in_group(group, n) for every member, all or
   nothing (every member is checked first); *released (optional) gets the
   tokens freed, summed over the members. Return value: as that call's
   (OUT_OF_RANGE when any member has fewer live tokens), INVALID_HANDLE. */
MSKV_API mskv_result mskv_lockstep_release_oldest(mskv_arena *arena, mskv_lockstep ls, int32_t group, int64_t n, int64_t *released);

/* Preemption: makes at least pages_needed pages free (or pending on a fence
   in FENCED mode: they come back at the fence or at mskv_arena_flush) by
   offloading idle requests, least recently admitted first (the admit count,
   not a clock: the same calls park the same requests; ties go to the lower
   request slot). Idle means resident, no open reservation, not paused (a
   paused request is parked by its scheduler, not here), not a keyed entry,
   not in an open streamed export or import (its transport holds the pages),
   and not in batch (the step being admitted). A lockstep group is parked
   whole or not at all, as one candidate as recent as its most recent
   member. A candidate is passed over when its host copy (its pages in every
   group, times the page record) would not fit in what is left of
   host_budget_bytes, or when parking it would free no page (every page
   shared with a request that stays). All or nothing: when the candidates
   cannot make room, nothing is parked (OUT_OF_PAGES); when they can, every
   one is copied to host memory before any page is freed. parked gets the
   parked requests in the order chosen, *n_parked their number (0 when
   there was room already). reload (mskv_request_reload,
   mskv_lockstep_reload) brings them back.
   Parameters: arena; pages_needed (e.g. from mskv_admit_query);
   host_budget_bytes; batch, n_batch (may be NULL, 0); parked, cap (may be
   NULL, 0); n_parked.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (a negative count),
   INVALID_HANDLE, DUPLICATE (a request twice in batch), OUT_OF_PAGES,
   CAPACITY (cap < the requests to park: *n_parked says how many; nothing
   parked), OUT_OF_MEMORY or a store ops' error (nothing parked).
   Thread safety: like every arena call. */
MSKV_API mskv_result mskv_make_room(mskv_arena *arena, int64_t pages_needed, uint64_t host_budget_bytes, const mskv_segment *batch, int32_t n_batch, mskv_request *parked, int32_t cap, int32_t *n_parked);

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
/* f16 bits to float. */
MSKV_API float mskv_f16_to_f32(uint16_t h);
/* Float to bf16 bits. */
MSKV_API uint16_t mskv_f32_to_bf16(float x);
/* bf16 bits to float. */
MSKV_API float mskv_bf16_to_f32(uint16_t h);

/* Which dims RoPE rotates together (mskv_rope.style). */
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
    int32_t style;            /* an mskv_rope_style (an enum first would make {0} an error in C++) */
    mskv_pos_mode mode;       /* MSKV_POS_1D or MSKV_POS_3D */
    float theta;              /* 0 = 10000 */
    int32_t dims[3];
} mskv_rope;

/* Rotate x [n][heads][head_dim] (dtype) in place by positions ([n] or [n][3]).
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (mode, style, widths,
   head_dim > MSKV_CPU_MAX_HEAD_DIM). Thread safety: reentrant. */
MSKV_API mskv_result mskv_rope_apply(const mskv_rope *rope, void *x, mskv_dtype dtype, int64_t n, int32_t heads, int32_t head_dim, const int32_t *positions);

/* The instruction-set path of the attention kernels. AUTO picks, once per
   mskv_cpu_create, the fastest one this CPU runs: amx_bf16 where the CPU
   has AMX (its bf16 video calls multiply bf16 tiles and accumulate in f32,
   as GPU attention kernels do; every other call is the AVX-512 path's),
   else the best f32-arithmetic one (AVX-512, then AVX2, NEON on arm64, else
   portable; avx512_bf16 and bf16_emu only when named, being bf16-rounded and
   no faster), unless the environment variable
   MSKV_CPU_ISA names another (portable | avx2 | avx512 | neon | avx512_bf16
   | bf16_emu | amx_bf16 | auto); a value that cannot be honoured is logged
   and ignored. The three bf16 paths differ from the others on bf16 pools
   only, and there in calls of more than 8 rows per kv head (video): Q
   (scaled) and P are rounded to bf16 and the products of bf16 pairs summed
   in f32 (vdpbf16ps; bf16_emu runs the same packing and order in plain C, at
   a fraction of the speed, so the path is testable on any CPU; amx_bf16
   multiplies 16 x 16 tiles with AMX, TDPBF16PS, several times the f32 rate
   where the CPU has it); other calls run the AVX-512 (avx512_bf16,
   amx_bf16) or portable (bf16_emu) kernels. A build needs no flag for any
   path: x86 kernels carry their own target attributes and the AMX tile
   instructions are inline assembly. MSKV_CPU_NO_SIMD compiles the portable
   path (and bf16_emu) only; MSKV_CPU_NO_BF16 leaves out avx512_bf16 (built
   by GCC 10 / Clang 9 on, never by MSVC), MSKV_CPU_NO_AMX amx_bf16 (built
   by GCC 11 / Clang 12 on, for x86-64 Linux, which lends a process the tile
   registers when the first mskv_cpu_isa_available or mskv_cpu_create asks
   for them). Every path gives the same results within the
   tolerances of the tests (f32 1e-5, f16 1e-3, bf16 1e-2 of a double
   reference), not bit-identical ones. */
typedef enum mskv_cpu_isa {
    MSKV_CPU_ISA_AUTO = 0,   /* the fastest path here (amx_bf16, else the best f32 one), or MSKV_CPU_ISA's */
    MSKV_CPU_ISA_PORTABLE = 1,  /* plain C loops */
    MSKV_CPU_ISA_AVX2 = 2,      /* x86 with AVX2, FMA and F16C */
    MSKV_CPU_ISA_AVX512 = 3,    /* x86 with AVX-512 F */
    MSKV_CPU_ISA_NEON = 4,      /* arm64 */
    MSKV_CPU_ISA_AVX512_BF16 = 5, /* x86 with AVX-512 F, BW and AVX512_BF16 (vdpbf16ps) */
    MSKV_CPU_ISA_BF16_EMU = 6,  /* the bf16 path's arithmetic in plain C (tests; any CPU) */
    MSKV_CPU_ISA_AMX_BF16 = 7   /* x86-64 Linux with AVX-512 F, BW, AMX-TILE and AMX-BF16 (tile products) */
} mskv_cpu_isa;

/* "auto", "portable", "avx2", "avx512", "neon", "avx512_bf16", "bf16_emu",
   "amx_bf16"; never NULL. */
MSKV_API const char *mskv_cpu_isa_name(mskv_cpu_isa isa);
/* 1 when this build and CPU can run the path (AUTO: always). */
MSKV_API int mskv_cpu_isa_available(mskv_cpu_isa isa);

/* Thread pool and per-thread scratch for large CPU calls. The caller's thread
   is worker 0; num_threads - 1 threads are started. Calls below a few MFLOP
   run on the caller alone. Concurrent calls on one mskv_cpu are serialised.
   Work items are (sequence, block of up to 64 query rows, kv head). When a
   call has few such units (under 64: one long decode sequence, a small
   batch), the keys of each few-row sequence (at most 8 query rows per kv
   head) are split into up to 8 chunks of at least 512 keys, run as separate
   items and merged by LSE. The split depends on the plan, not on the thread
   count, so a call gives the same bits on any number of threads. */
typedef struct mskv_cpu mskv_cpu;
/* What mskv_cpu_create builds: threads, workspace, instruction-set path. */
typedef struct mskv_cpu_desc {
    int32_t num_threads;      /* 0 = 1 (MSKV_NO_THREADS: always 1) */
    size_t workspace_bytes;   /* per thread; 0 = the largest tiles (about 350 KB); a
                                 smaller budget picks smaller tiles (at least about 76 KB) */
    mskv_allocator allocator;
    mskv_cpu_isa isa;         /* 0 = AUTO; another path must be available (else UNSUPPORTED) */
    mskv_log_fn log;          /* optional: why a path was refused or MSKV_CPU_ISA ignored */
    void *log_user;
} mskv_cpu_desc;
/* Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT, OVERFLOW, OUT_OF_MEMORY,
   THREAD, UNSUPPORTED (desc->isa not available here). */
MSKV_API mskv_result mskv_cpu_create(const mskv_cpu_desc *desc, mskv_cpu **out);
/* Stops the pool's threads and frees it; NULL is a no-op. */
MSKV_API void mskv_cpu_destroy(mskv_cpu *cpu);

/* What a pool runs on. */
typedef struct mskv_cpu_info {
    int32_t num_threads;      /* first: a struct that starts with an enum rejects {0} in C++ */
    mskv_cpu_isa isa;         /* the path in use (never AUTO) */
    size_t workspace_bytes;   /* per thread */
    int64_t last_call_items;  /* work items the last attention call was cut into: how
                                 many threads it could keep busy (read between calls) */
} mskv_cpu_info;
/* Return value: SUCCESS, NULL_POINTER. Thread safety: reentrant. */
MSKV_API mskv_result mskv_cpu_info_get(const mskv_cpu *cpu, mskv_cpu_info *out);

/* Scatter new rows k,v [plan->total_q][kv_heads][head_dim] (dtype `src_dtype`)
   into layer `layer` of the arena's host store through plan->slot_mapping
   (slots < 0 are skipped). rope (optional) is applied to K on the way in,
   at plan->positions ([total_q] for 1-D, [total_q][3] for 3-D).
   Every slot is checked first (inside the pool, not the null page 0):
   OUT_OF_RANGE and nothing written otherwise. UNSUPPORTED when the arena has
   no host pools. STALE_PLAN when the plan's pages changed since it was
   built (mskv_plan_check). */
MSKV_API mskv_result mskv_cpu_write_kv(mskv_arena *arena, int32_t layer, const mskv_plan *plan, const void *k, const void *v, mskv_dtype src_dtype, const mskv_rope *rope);

/* Which keys a query sees by position (mskv_attn.mask). */
typedef enum mskv_mask {
    MSKV_MASK_NONE = 0,    /* bidirectional: every query sees its whole sequence */
    MSKV_MASK_CAUSAL = 1,  /* key position <= query position (absolute positions) */
    MSKV_MASK_WINDOW = 2   /* causal and query - key <= window_left */
} mskv_mask;

/* One attention call's heads, scale, mask and Q/O dtype. */
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
   stack (about 50 KB), no allocation, the AUTO path. A masked plan (CAUSAL, WINDOW) without
   q_pos needs qo_len <= kv_len per segment (the tail rule), and kv_pos_shift >= 0. Masks,
   q_pos and the visibility bounds act as the mskv_plan comment says; keys hidden by the
   bounds are not read (a block never straddles a bound).
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
/* mskv_cpu_attention over raw pools (no arena, so no stale-plan check). */
MSKV_API mskv_result mskv_cpu_attention_pools(mskv_cpu *cpu, const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn, const void *q, void *o, float *lse);
/* mskv_cpu_write_kv on raw pools: pools->k and pools->v must point at writable memory. */
MSKV_API mskv_result mskv_cpu_write_kv_pools(const mskv_pools *pools, const mskv_plan *plan, const void *k, const void *v, mskv_dtype src_dtype, const mskv_rope *rope);

/* Dense K/V in caller memory: the rows of a plan's segments one after
   another, segment b's keys at rows kv_token_indptr[b] .. + kv_len[b]
   (a MSKV_PLAN_PREFIX or DENSE plan, or any plan whose sequences the caller
   gathered). Element (row t, kv head h, dim d) of K is
   k[t * token_stride + h * head_stride + d], of V likewise (a head-major
   [kv_head][row][dim] buffer: token_stride head_dim, head_stride rows *
   head_dim). With arena set,
   the call first checks that request's prefix_epoch in `group` is still
   `epoch` (a prefix view's: mskv_prefix_view_layer fills all of it). */
typedef struct mskv_dense_kv {
    const void *k, *v;
    mskv_dtype dtype;
    int32_t kv_heads, head_dim;
    int64_t tokens;          /* rows k and v hold */
    int64_t token_stride;    /* elements from a row to the next; 0 = kv_heads * head_dim */
    int64_t head_stride;     /* elements from a kv head to the next; 0 = head_dim */
    mskv_arena *arena;       /* optional epoch check (NULL: none) */
    mskv_request request;
    int32_t group;
    uint64_t epoch;
    int32_t device;          /* 0: k and v are host memory (mskv_cpu_attention_dense); 1: device
                                addresses (mskv_cuda_attention_dense); each call refuses the other */
} mskv_dense_kv;

/* The dense K/V of one layer of a prefix view, host or device (device set
   from the view), with its epoch check (arena may be NULL: no check).
   Return value: SUCCESS, NULL_POINTER, OUT_OF_RANGE (layer), STALE_VIEW
   (never gathered). */
MSKV_API mskv_result mskv_prefix_view_layer(const mskv_prefix_view *view, mskv_arena *arena, int32_t layer, mskv_dense_kv *out);
/* The epoch check every dense attention starts with: SUCCESS when kv->arena
   is NULL or kv->epoch is still the prefix_epoch of kv->request in
   kv->group; STALE_VIEW (the message says both epochs), INVALID_HANDLE (a
   removed request), INVALID_ARGUMENT (group), NULL_POINTER. For callers
   that attend over a view with kernels of their own. */
MSKV_API mskv_result mskv_dense_kv_check(const mskv_dense_kv *kv);
/* The pages of a request's protected prefix in `group`, in order, with its
   length and prefix_epoch, read together under the arena's lock: what a
   gather of the prefix into a view needs (the GPU layer's device gather
   uses it). pages may be NULL with cap 0 to learn *n_pages. Pages of a
   protected prefix stay the request's until the prefix changes, which
   moves the epoch, so a copy queued from them and tagged with *epoch is
   either current or refused by the check.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (group, cap < 0),
   INVALID_HANDLE, OFFLOADED, CAPACITY (cap < the page count: *n_pages is
   set, nothing else). */
MSKV_API mskv_result mskv_prefix_pages_get(mskv_arena *arena, mskv_request request, int32_t group, int32_t *pages, int32_t cap,
                                           int32_t *n_pages, int64_t *tokens, uint64_t *epoch);

/* Attention over dense K/V (the plan's page table is not read): the same
   masks, positions (q_pos, kv_pos_split/shift), visibility bounds, GQA,
   dtypes and results as mskv_cpu_attention; cpu may be NULL likewise.
   Return value: SUCCESS, NULL_POINTER, INVALID_ARGUMENT (heads, dtype,
   mask, strides, an inconsistent plan: kv_token_indptr missing, decreasing,
   or not kv_len apart; a device kv), OUT_OF_RANGE (a row past kv->tokens),
   INVALID_HANDLE (kv->request removed), STALE_VIEW (kv->epoch is no longer
   the request's prefix_epoch). Nothing is written on failure. */
MSKV_API mskv_result mskv_cpu_attention_dense(mskv_cpu *cpu, const mskv_dense_kv *kv, const mskv_plan *plan, const mskv_attn *attn, const void *q, void *o, float *lse);

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
/* the >>platform section's system headers, here outside extern "C" */
#if defined(_WIN32) && !defined(MSKV_NO_THREADS)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN  /* keeps winsock.h out, so an application may include winsock2.h */
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#include <process.h>         /* _beginthreadex: threads that may use the C runtime */
#if defined(_WIN32_WINNT) && _WIN32_WINNT < 0x0600
#error "mstar_kv needs Windows Vista or newer (_WIN32_WINNT >= 0x0600) for SRWLOCK and CONDITION_VARIABLE"
#endif
#elif !defined(MSKV_NO_THREADS)
#include <pthread.h>
#endif
/* What must be inlined to be fast (the host core's one-page paths, the CPU
   kernels' shared tails): compilers left them out of line, at a measured cost. */
#if defined(__GNUC__) || defined(__clang__)
#define MSKV__ALWAYS_INLINE __inline__ __attribute__((always_inline))
#elif defined(_MSC_VER)
#define MSKV__ALWAYS_INLINE __forceinline
#else
#define MSKV__ALWAYS_INLINE
#endif
/* The CPU backend's instruction-set paths (see "instruction sets" there):
   x86 kernels with GCC/Clang target attributes or MSVC, NEON on arm64. */
#if !defined(MSKV_CPU_NO_SIMD) && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define MSKV__CPU_X86 1
#define MSKV__CPU_TARGET(t) __attribute__((target(t)))
#include <immintrin.h>
#include <cpuid.h>
#elif !defined(MSKV_CPU_NO_SIMD) && defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#define MSKV__CPU_X86 1
#define MSKV__CPU_TARGET(t)
#include <intrin.h>
#include <immintrin.h>
#else
#define MSKV__CPU_X86 0
#endif
#if !defined(MSKV_CPU_NO_SIMD) && (defined(__aarch64__) || defined(_M_ARM64))
#define MSKV__CPU_NEON 1
#include <arm_neon.h>
#else
#define MSKV__CPU_NEON 0
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
#ifdef NDEBUG
#define MSKV_ASSERT(x) ((void)0)   /* every check is side-effect free: nothing is lost */
#else
#include <assert.h>
#define MSKV_ASSERT(x) assert(x)
#endif
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
    case MSKV_ERROR_STALE_VIEW: return "stale prefix view: the request's prefix_epoch moved since it was gathered";
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
    case MSKV_ERROR_DIVERGED: return "the ranks' arenas diverged: they did not make the same decisions";
    case MSKV_ERROR_UNSUPPORTED: return "unsupported";
    case MSKV_ERROR_THREAD: return "thread error";
    case MSKV_ERROR_IO: return "I/O error";
    case MSKV_ERROR_CUDA_UNAVAILABLE: return "CUDA unavailable";
    case MSKV_ERROR_CUDA: return "CUDA driver error";
    case MSKV_ERROR_NVRTC: return "NVRTC compilation failed";
    case MSKV_ERROR_PEER: return "the peer failed or the connection dropped";
    case MSKV_ERROR_TIMEOUT: return "the peer did not answer in time";
    case MSKV_ERROR_IN_DOUBT: return "the hand-over's outcome is not known here (resolve it)";
    case MSKV_ERROR_DENIED: return "the peer is not authenticated, or its offer was replayed";
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

/* 64-bit digest: four independent lanes over 8-byte words, then a final
   avalanche. Blob versions 1 to 3 were signed with it (mskv__legacy_checksum,
   still read); the arena's state digest uses it. Blobs from version 4 on,
   host copies and migration use XXH64 (below). */
typedef struct mskv__hash { uint64_t v[4]; uint64_t len; unsigned char tail[32]; size_t ntail; } mskv__hash;
#define MSKV__H1 0x9E3779B185EBCA87ull
#define MSKV__H2 0xC2B2AE3D27D4EB4Full
static uint64_t mskv__rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
/* Little-endian 64-bit read, written so that compilers make it one load. */
static uint64_t mskv__rd64(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 |
           (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
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
    if (n >= 32) {
        /* the bulk with the lanes in registers: the same arithmetic as mskv__hash_block */
        uint64_t v0 = h->v[0], v1 = h->v[1], v2 = h->v[2], v3 = h->v[3];
        for (; n >= 32; p += 32, n -= 32) {
            v0 = mskv__rotl(v0 + mskv__rd64(p) * MSKV__H2, 31) * MSKV__H1;
            v1 = mskv__rotl(v1 + mskv__rd64(p + 8) * MSKV__H2, 31) * MSKV__H1;
            v2 = mskv__rotl(v2 + mskv__rd64(p + 16) * MSKV__H2, 31) * MSKV__H1;
            v3 = mskv__rotl(v3 + mskv__rd64(p + 24) * MSKV__H2, 31) * MSKV__H1;
        }
        h->v[0] = v0; h->v[1] = v1; h->v[2] = v2; h->v[3] = v3;
    }
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
static uint64_t mskv__legacy_checksum(const void *p, size_t n) {
    mskv__hash h;
    mskv__hash_init(&h);
    mskv__hash_update(&h, p, n);
    return mskv__hash_final(&h);
}

/* XXH64 exactly, as xxHash's specification (XXH64 algorithm description)
   gives it: four accumulators seeded from the seed over 32-byte stripes,
   merged, plus the length, then the last 8-, 4- and 1-byte pieces and the
   avalanche. Streaming: init, update any number of times, digest. */
typedef struct mskv__xxh { uint64_t v[4], seed, len; unsigned char tail[32]; size_t ntail; } mskv__xxh;
#define MSKV__XP1 0x9E3779B185EBCA87ull
#define MSKV__XP2 0xC2B2AE3D27D4EB4Full
#define MSKV__XP3 0x165667B19E3779F9ull
#define MSKV__XP4 0x85EBCA77C2B2AE63ull
#define MSKV__XP5 0x27D4EB2F165667C5ull
static uint64_t mskv__xxh_round(uint64_t acc, uint64_t in) { return mskv__rotl(acc + in * MSKV__XP2, 31) * MSKV__XP1; }
static uint64_t mskv__xxh_merge(uint64_t acc, uint64_t v) { return (acc ^ mskv__xxh_round(0, v)) * MSKV__XP1 + MSKV__XP4; }
static void mskv__xxh_init(mskv__xxh *h, uint64_t seed) {
    h->v[0] = seed + MSKV__XP1 + MSKV__XP2;
    h->v[1] = seed + MSKV__XP2;
    h->v[2] = seed;
    h->v[3] = seed - MSKV__XP1;
    h->seed = seed;
    h->len = 0;
    h->ntail = 0;
}
/* The bulk loop's 8-byte little-endian load: one plain load where the host
   is little-endian (memcpy, which compilers turn into a single mov and
   which has no alignment or aliasing trouble), the byte-wise read
   elsewhere. Inlined: at -O2 a called load per lane costs half the speed. */
#if defined(_MSC_VER)
#define MSKV__XXH_INLINE static __inline
#else
#define MSKV__XXH_INLINE static inline
#endif
#if (defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) || \
    defined(_M_X64) || defined(_M_IX86) || defined(_M_ARM64)
MSKV__XXH_INLINE uint64_t mskv__xxh_ld(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
#else
MSKV__XXH_INLINE uint64_t mskv__xxh_ld(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 |
           (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}
#endif
/* One round, written out so that the four lanes below are four
   independent chains the CPU runs side by side. */
#define MSKV__XXH_ROUND(acc, p) \
    do { (acc) += mskv__xxh_ld(p) * MSKV__XP2; (acc) = ((acc) << 31 | (acc) >> 33) * MSKV__XP1; } while (0)
/* Whole 32-byte stripes of p (n a multiple of 32) into the four lanes. */
static void mskv__xxh_stripes(uint64_t v[4], const unsigned char *p, size_t n) {
    uint64_t v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
    const unsigned char *end = p + n;
    for (; p + 64 <= end; p += 64) {   /* two stripes a turn: fewer loop branches */
        MSKV__XXH_ROUND(v0, p);
        MSKV__XXH_ROUND(v1, p + 8);
        MSKV__XXH_ROUND(v2, p + 16);
        MSKV__XXH_ROUND(v3, p + 24);
        MSKV__XXH_ROUND(v0, p + 32);
        MSKV__XXH_ROUND(v1, p + 40);
        MSKV__XXH_ROUND(v2, p + 48);
        MSKV__XXH_ROUND(v3, p + 56);
    }
    if (p < end) {
        MSKV__XXH_ROUND(v0, p);
        MSKV__XXH_ROUND(v1, p + 8);
        MSKV__XXH_ROUND(v2, p + 16);
        MSKV__XXH_ROUND(v3, p + 24);
    }
    v[0] = v0; v[1] = v1; v[2] = v2; v[3] = v3;
}
static void mskv__xxh_update(mskv__xxh *h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    h->len += n;
    if (h->ntail) {
        size_t take = 32 - h->ntail;
        if (take > n) take = n;
        memcpy(h->tail + h->ntail, p, take);
        h->ntail += take; p += take; n -= take;
        if (h->ntail < 32) return;
        mskv__xxh_stripes(h->v, h->tail, 32);
        h->ntail = 0;
    }
    if (n >= 32) {
        size_t whole = n & ~(size_t)31;
        mskv__xxh_stripes(h->v, p, whole);
        p += whole;
        n -= whole;
    }
    if (n) { memcpy(h->tail, p, n); h->ntail = n; }
}
static uint64_t mskv__xxh_digest(const mskv__xxh *h) {
    uint64_t x;
    const unsigned char *p = h->tail;
    size_t n = h->ntail;
    if (h->len >= 32) {
        x = mskv__rotl(h->v[0], 1) + mskv__rotl(h->v[1], 7) + mskv__rotl(h->v[2], 12) + mskv__rotl(h->v[3], 18);
        x = mskv__xxh_merge(x, h->v[0]);
        x = mskv__xxh_merge(x, h->v[1]);
        x = mskv__xxh_merge(x, h->v[2]);
        x = mskv__xxh_merge(x, h->v[3]);
    } else {
        x = h->seed + MSKV__XP5;
    }
    x += h->len;
    for (; n >= 8; p += 8, n -= 8) x = mskv__rotl(x ^ mskv__xxh_round(0, mskv__rd64(p)), 27) * MSKV__XP1 + MSKV__XP4;
    if (n >= 4) {
        uint64_t w = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
        x = mskv__rotl(x ^ (w * MSKV__XP1), 23) * MSKV__XP2 + MSKV__XP3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) x = mskv__rotl(x ^ (*p * MSKV__XP5), 11) * MSKV__XP1;
    x ^= x >> 33; x *= MSKV__XP2; x ^= x >> 29; x *= MSKV__XP3; x ^= x >> 32;
    return x;
}
MSKV_IMPL uint64_t mskv_xxh64(const void *data, size_t n, uint64_t seed) {
    mskv__xxh h;
    mskv__xxh_init(&h, seed);
    if (n) mskv__xxh_update(&h, data, n);
    return mskv__xxh_digest(&h);
}
/* The checksum of blobs (version 4 on), host copies and migration: XXH64, seed 0. */
static uint64_t mskv__checksum(const void *p, size_t n) { return mskv_xxh64(p, n, 0); }
/* A blob's checksum as its version says: XXH64 from version 4, the legacy digest before. */
static uint64_t mskv__blob_checksum(const unsigned char *b, size_t n) {
    uint32_t v = n >= 12 ? (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24 : 4u;
    return v >= 1 && v <= 3 ? mskv__legacy_checksum(b, n) : mskv__checksum(b, n);
}
static void mskv__hash_u64(mskv__hash *h, uint64_t v) {
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    mskv__hash_update(h, b, 8);
}

/* // >>platform ------------------------------------------------------------
   Every difference between operating systems lives here, as small static
   wrappers: a mutex, a condition variable, threads and a once flag. Win32
   (SRWLOCK, CONDITION_VARIABLE, _beginthreadex, INIT_ONCE: Vista or newer)
   on _WIN32, pthreads elsewhere. With MSKV_NO_THREADS the lock and the once
   flag still work for the one thread there is, and no thread can be started.
   mstar_kv_cuda.h's own platform section (library loading, files) reuses
   these. Not every build uses every wrapper, hence MSKV__MAYBE_UNUSED. */

#if defined(__GNUC__) || defined(__clang__)
#define MSKV__MAYBE_UNUSED __attribute__((unused))
#else
#define MSKV__MAYBE_UNUSED
#endif

/* A thread runs fn(arg); the object must stay where it is until joined. */
#if defined(MSKV_NO_THREADS)
typedef int mskv__mutex;
typedef int mskv__cond;
typedef int mskv__once_flag;
typedef struct mskv__thread { void (*fn)(void *); void *arg; } mskv__thread;
#define MSKV__MUTEX_INIT 0
#define MSKV__ONCE_INIT 0
#elif defined(_WIN32)
typedef SRWLOCK mskv__mutex;
typedef CONDITION_VARIABLE mskv__cond;
typedef INIT_ONCE mskv__once_flag;
typedef struct mskv__thread { void (*fn)(void *); void *arg; HANDLE handle; } mskv__thread;
#define MSKV__MUTEX_INIT SRWLOCK_INIT
#define MSKV__ONCE_INIT INIT_ONCE_STATIC_INIT
#else
typedef pthread_mutex_t mskv__mutex;
typedef pthread_cond_t mskv__cond;
typedef pthread_once_t mskv__once_flag;
typedef struct mskv__thread { void (*fn)(void *); void *arg; pthread_t id; } mskv__thread;
#define MSKV__MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define MSKV__ONCE_INIT PTHREAD_ONCE_INIT
#endif

#if defined(MSKV_NO_THREADS)

static MSKV__MAYBE_UNUSED int mskv__mutex_init(mskv__mutex *m) { *m = 0; return 1; }
static MSKV__MAYBE_UNUSED void mskv__mutex_destroy(mskv__mutex *m) { (void)m; }
static MSKV__MAYBE_UNUSED void mskv__mutex_lock(mskv__mutex *m) { (void)m; }
static MSKV__MAYBE_UNUSED void mskv__mutex_unlock(mskv__mutex *m) { (void)m; }
static MSKV__MAYBE_UNUSED int mskv__cond_init(mskv__cond *c) { *c = 0; return 1; }
static MSKV__MAYBE_UNUSED void mskv__cond_destroy(mskv__cond *c) { (void)c; }
/* nothing else could change the condition: a caller never waits without threads */
static MSKV__MAYBE_UNUSED void mskv__cond_wait(mskv__cond *c, mskv__mutex *m) { (void)c; (void)m; }
static MSKV__MAYBE_UNUSED void mskv__cond_signal(mskv__cond *c) { (void)c; }
static MSKV__MAYBE_UNUSED void mskv__cond_broadcast(mskv__cond *c) { (void)c; }
static MSKV__MAYBE_UNUSED int mskv__thread_start(mskv__thread *t, void (*fn)(void *), void *arg) {
    t->fn = fn;
    t->arg = arg;
    return 0;
}
static MSKV__MAYBE_UNUSED void mskv__thread_join(mskv__thread *t) { (void)t; }
static MSKV__MAYBE_UNUSED void mskv__once(mskv__once_flag *flag, void (*fn)(void)) {
    if (!*flag) { *flag = 1; fn(); }
}

#elif defined(_WIN32)

static MSKV__MAYBE_UNUSED int mskv__mutex_init(mskv__mutex *m) { InitializeSRWLock(m); return 1; }
static MSKV__MAYBE_UNUSED void mskv__mutex_destroy(mskv__mutex *m) { (void)m; }  /* an SRWLOCK owns nothing */
static MSKV__MAYBE_UNUSED void mskv__mutex_lock(mskv__mutex *m) { AcquireSRWLockExclusive(m); }
static MSKV__MAYBE_UNUSED void mskv__mutex_unlock(mskv__mutex *m) { ReleaseSRWLockExclusive(m); }
static MSKV__MAYBE_UNUSED int mskv__cond_init(mskv__cond *c) { InitializeConditionVariable(c); return 1; }
static MSKV__MAYBE_UNUSED void mskv__cond_destroy(mskv__cond *c) { (void)c; }
static MSKV__MAYBE_UNUSED void mskv__cond_wait(mskv__cond *c, mskv__mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static MSKV__MAYBE_UNUSED void mskv__cond_signal(mskv__cond *c) { WakeConditionVariable(c); }
static MSKV__MAYBE_UNUSED void mskv__cond_broadcast(mskv__cond *c) { WakeAllConditionVariable(c); }
static unsigned __stdcall mskv__thread_entry(void *p) {
    mskv__thread *t = (mskv__thread *)p;
    t->fn(t->arg);
    return 0;
}
static MSKV__MAYBE_UNUSED int mskv__thread_start(mskv__thread *t, void (*fn)(void *), void *arg) {
    t->fn = fn;
    t->arg = arg;
    t->handle = (HANDLE)_beginthreadex(NULL, 0, mskv__thread_entry, t, 0, NULL);
    return t->handle != NULL;
}
static MSKV__MAYBE_UNUSED void mskv__thread_join(mskv__thread *t) {
    WaitForSingleObject(t->handle, INFINITE);
    CloseHandle(t->handle);
}
/* INIT_ONCE hands the callback one pointer: the function travels in a box */
typedef struct mskv__once_box { void (*fn)(void); } mskv__once_box;
static BOOL CALLBACK mskv__once_entry(PINIT_ONCE once, PVOID box, PVOID *ctx) {
    (void)once;
    (void)ctx;
    ((const mskv__once_box *)box)->fn();
    return TRUE;
}
static MSKV__MAYBE_UNUSED void mskv__once(mskv__once_flag *flag, void (*fn)(void)) {
    mskv__once_box box;
    box.fn = fn;
    InitOnceExecuteOnce(flag, mskv__once_entry, &box, NULL);
}

#else

static MSKV__MAYBE_UNUSED int mskv__mutex_init(mskv__mutex *m) { return pthread_mutex_init(m, NULL) == 0; }
static MSKV__MAYBE_UNUSED void mskv__mutex_destroy(mskv__mutex *m) { pthread_mutex_destroy(m); }
static MSKV__MAYBE_UNUSED void mskv__mutex_lock(mskv__mutex *m) { pthread_mutex_lock(m); }
static MSKV__MAYBE_UNUSED void mskv__mutex_unlock(mskv__mutex *m) { pthread_mutex_unlock(m); }
static MSKV__MAYBE_UNUSED int mskv__cond_init(mskv__cond *c) { return pthread_cond_init(c, NULL) == 0; }
static MSKV__MAYBE_UNUSED void mskv__cond_destroy(mskv__cond *c) { pthread_cond_destroy(c); }
static MSKV__MAYBE_UNUSED void mskv__cond_wait(mskv__cond *c, mskv__mutex *m) { pthread_cond_wait(c, m); }
static MSKV__MAYBE_UNUSED void mskv__cond_signal(mskv__cond *c) { pthread_cond_signal(c); }
static MSKV__MAYBE_UNUSED void mskv__cond_broadcast(mskv__cond *c) { pthread_cond_broadcast(c); }
static void *mskv__thread_entry(void *p) {
    mskv__thread *t = (mskv__thread *)p;
    t->fn(t->arg);
    return NULL;
}
static MSKV__MAYBE_UNUSED int mskv__thread_start(mskv__thread *t, void (*fn)(void *), void *arg) {
    t->fn = fn;
    t->arg = arg;
    return pthread_create(&t->id, NULL, mskv__thread_entry, t) == 0;
}
static MSKV__MAYBE_UNUSED void mskv__thread_join(mskv__thread *t) { pthread_join(t->id, NULL); }
static MSKV__MAYBE_UNUSED void mskv__once(mskv__once_flag *flag, void (*fn)(void)) { pthread_once(flag, fn); }

#endif

/* // >>arena (implementation) -------------------------------------------- */

enum { MSKV__PAGE_NULL = 0, MSKV__PAGE_FREE = 1, MSKV__PAGE_LIVE = 2, MSKV__PAGE_PENDING = 3 };

/* One layer group's part of a request: its pages, prefix and window. */
typedef struct mskv__tab {
    int64_t prefix_tokens, live_start;
    int64_t release_point;    /* token-exact end of the releases (live_start is its page floor); 0 = none */
    int32_t prefix_pages;
    int32_t *mem;             /* the table's memory */
    int32_t *pages;           /* mem + head: releases move the head, not the live pages */
    int32_t head, num_pages, cap_pages;
    int32_t host_pages;       /* offloaded: this group's records in the host copy */
    uint64_t epoch;
    uint64_t shrunk;          /* the arena's generation when pages last left this table */
    uint8_t has_ret;
    mskv_retention retention;
} mskv__tab;

typedef struct mskv__req {
    uint16_t gen;
    uint8_t used, location, keyed, sealed, has_res, mark, paused;
    uint8_t xfer;             /* a streamed blob: MSKV__XFER_EXPORT (frozen) or MSKV__XFER_IMPORT (not yet a request) */
    uint8_t xfer_version;     /* importing: the arriving blob's header version (a version 3 header may say what 1 or 2 could) */
    int64_t committed, reserved, published;   /* tokens: the same in every group */
    int64_t pos_shift, pos_pending;           /* added to derived RoPE positions; the part waiting for commit */
    mskv__tab *t;             /* [num_groups], fixed per slot */
    uint64_t key;
    uint64_t last_admit;      /* the arena's admit count at its last admit; 0 = never */
    unsigned char *host;      /* offloaded copy: every group's records, group after group */
    size_t host_cap;          /* bytes allocated at host (it may be a larger reused block) */
    uint64_t *sums;           /* MSKV_DEBUG_CHECKSUMS: a checksum per record of host, all groups */
    int32_t lock;             /* lockstep slot + 1; 0 = none */
    int32_t lock_next;        /* the next member's index; -1 after the last */
    int64_t scratch_cap;      /* a keyed scratch entry (mskv_scratch_create): its tokens at most; 0 = not one */
} mskv__req;
#define MSKV__XFER_EXPORT 1
#define MSKV__XFER_IMPORT 2

typedef struct mskv__lockstep { uint16_t gen; uint8_t used; int32_t first, count; } mskv__lockstep;
typedef struct mskv__rank { uint64_t key; int32_t ri; } mskv__rank;

struct mskv_arena {
    mskv_arena_desc desc;
    mskv_allocator al;
    int32_t P, num_pages, max_req, G;
    uint32_t p_magic;          /* x / P = (x * p_magic) >> p_shift for 0 <= x < 2^31 (mskv__pdiv) */
    int32_t p_shift;
    int32_t *seg_ri;           /* mskv__resolve: each segment's request index, max_req entries (after pick's) */
    uint8_t *state;
    int32_t *refcount;
    int32_t *free_stack;
    int32_t free_top;
    int32_t *pend_page;        /* FIFO ring of pending pages; fences are nondecreasing */
    uint64_t *pend_fence;
    int32_t pend_head, pend_count;
    int32_t *scratch;          /* audit / stats / make_room workspace, num_pages entries */
    mskv__req *reqs;
    mskv__tab *tabs;           /* [max_req][G] */
    int32_t *req_free;
    int32_t req_free_top, nreq;
    mskv__lockstep *ls;        /* lockstep groups: at most max_req / 2 (two members each) */
    int32_t *ls_free;
    int32_t max_ls, ls_free_top, nls;
    mskv__rank *rank;          /* make_room: candidates, max_req entries */
    int32_t *pick;             /* make_room / lockstep calls: request indices, max_req entries */
    uint64_t step, completed, epoch_counter;
    uint64_t admits;           /* successful admit calls: the order make_room parks in */
    uint64_t generation;       /* moves whenever pages leave any table of any request (plans record it) */
    int64_t offloaded_pages;
    mskv_store_info store;
    size_t record_bytes;       /* one page, all layers, K and V: num_layers * 2 * page_bytes */
    unsigned char **pools;     /* [layer*2 + kind] */
    unsigned char *spare;      /* one freed host copy kept for the next offload */
    size_t spare_cap;
    uint32_t debug;            /* MSKV_DEBUG_* in force */
    uint8_t free_now;          /* RETIRE_IMMEDIATE without POISON: a freed page goes straight onto the free stack */
    uint8_t *poisoned;         /* POISON: [num_pages], 1 while a free page holds the poison */
    unsigned char *dbg_rec;    /* POISON: a record of poison, then a record of scratch for the audit */
    /* mskv_rank_check: (step, digest) recorded since the last agreeing check */
    uint64_t agree_step[MSKV_RANK_STEPS], agree_digest[MSKV_RANK_STEPS];
    int32_t agree_count;
    mskv__mutex lock;
    int lock_ok;
};

/* Division by the page size without a divide (the GPU kernels' page divisor,
   mskv_page_of in kernels.cu): l = ceil(log2 P), magic = ceil(2^(31+l) / P),
   shift = 31 + l; for 0 <= x < 2^31, (x * magic) >> shift == x / P exactly
   (the rounding adds x * (magic - 2^(31+l) / P) / 2^(31+l) < 2^-l <= 1 / P).
   A power of two gives magic 2^31: a shift. */
static void mskv__pdiv_init(int32_t P, uint32_t *magic, int32_t *shift) {
    int32_t l = 0;
    while (((int64_t)1 << l) < (int64_t)P) l++;
    *magic = (uint32_t)((((uint64_t)1 << (31 + l)) + (uint64_t)P - 1) / (uint64_t)P);
    *shift = 31 + l;
}
static int64_t mskv__pdiv_by(uint32_t magic, int32_t shift, int32_t P, int64_t x) {
    if ((uint64_t)x < ((uint64_t)1 << 31)) return (int64_t)(((uint64_t)x * magic) >> shift);
    return x / P;   /* out of the exact range (and negative): the divide */
}
static int64_t mskv__pdiv(const struct mskv_arena *a, int64_t x) { return mskv__pdiv_by(a->p_magic, a->p_shift, a->P, x); }
/* Pages covering x >= 0 tokens (x + P - 1 < 2^31 on every path that counts pages). */
static int32_t mskv__pages_for(const struct mskv_arena *a, int64_t x) { return (int32_t)mskv__pdiv(a, x + a->P - 1); }

#define MSKV__LOCK(a) mskv__mutex_lock(&(a)->lock)
#define MSKV__UNLOCK(a) mskv__mutex_unlock(&(a)->lock)

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

static void mskv__emit(mskv_arena *a, mskv_event_type type, int32_t ri, int32_t g, int32_t page, int64_t first) {
    mskv_event e;
    if (!a->desc.on_event) return;
    e.type = type;
    e.request.id = ((uint32_t)a->reqs[ri].gen << 16) | (uint32_t)(ri + 1);
    e.page = page;
    e.first_token = first;
    e.step = a->step;
    e.group = g;
    a->desc.on_event(a->desc.event_user, &e);
}

/* Every page free, handed out in id order (page 1 first), as in a new arena;
   request slots likewise (their generations are kept). */
static void mskv__fresh_lists(mskv_arena *a) {
    int32_t i;
    for (i = 1; i < a->num_pages; i++) {
        a->state[i] = MSKV__PAGE_FREE;
        a->free_stack[a->num_pages - 1 - i] = i;
    }
    a->free_top = a->num_pages - 1;
    for (i = 0; i < a->max_req; i++) a->req_free[i] = a->max_req - 1 - i;
    a->req_free_top = a->max_req;
    for (i = 0; i < a->max_ls; i++) a->ls_free[i] = a->max_ls - 1 - i;
    a->ls_free_top = a->max_ls;
}

/* Every field is checked on its own, whatever the others say (a dtype is a
   dtype even when there is no host store to use it). */
static mskv_result mskv__arena_desc_check(const mskv_arena_desc *d) {
    if (d->num_pages < 2 || d->page_size < 1 || d->max_requests < 0 || d->max_requests > 65535 || d->num_layers < 0 ||
        d->kv_heads < 0 || d->head_dim < 0 || mskv_dtype_size(d->dtype) == 0 || (unsigned)d->retire_mode > 1u ||
        (d->num_layers > 0 && (d->kv_heads < 1 || d->head_dim < 1)) || d->num_groups < 0 || d->num_groups > MSKV_MAX_GROUPS ||
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
    mskv__pdiv_init(a->P, &a->p_magic, &a->p_shift);
    a->num_pages = desc->num_pages;
    a->max_req = desc->max_requests ? desc->max_requests : 256;
    a->G = desc->num_groups ? desc->num_groups : 1;
    a->max_ls = a->max_req / 2 > 0 ? a->max_req / 2 : 1;
    if (!mskv__mutex_init(&a->lock)) {
        mskv__free(&a->al, a);
        return MSKV_ERROR_THREAD;
    }
    a->lock_ok = 1;
    n = (size_t)a->num_pages;
    a->state = (uint8_t *)mskv__alloc(&a->al, n);
    a->refcount = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->free_stack = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->pend_page = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->pend_fence = (uint64_t *)mskv__alloc(&a->al, n * sizeof(uint64_t));
    a->scratch = (int32_t *)mskv__alloc(&a->al, n * sizeof(int32_t));
    a->reqs = (mskv__req *)mskv__alloc(&a->al, (size_t)a->max_req * sizeof(mskv__req));
    a->tabs = (mskv__tab *)mskv__alloc(&a->al, (size_t)a->max_req * (size_t)a->G * sizeof(mskv__tab));
    a->req_free = (int32_t *)mskv__alloc(&a->al, (size_t)a->max_req * sizeof(int32_t));
    a->ls = (mskv__lockstep *)mskv__alloc(&a->al, (size_t)a->max_ls * sizeof(mskv__lockstep));
    a->ls_free = (int32_t *)mskv__alloc(&a->al, (size_t)a->max_ls * sizeof(int32_t));
    a->rank = (mskv__rank *)mskv__alloc(&a->al, (size_t)a->max_req * sizeof(mskv__rank));
    a->pick = (int32_t *)mskv__alloc(&a->al, (size_t)a->max_req * 2 * sizeof(int32_t));
    a->seg_ri = a->pick ? a->pick + a->max_req : NULL;
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
    /* zeroed before the check below: on a failure mskv_arena_destroy frees every request's tables and host copy */
    if (a->reqs) memset(a->reqs, 0, (size_t)a->max_req * sizeof(mskv__req));
    if (a->tabs) memset(a->tabs, 0, (size_t)a->max_req * (size_t)a->G * sizeof(mskv__tab));
    a->debug = desc->debug;
#ifdef MSKV_DEBUG
    a->debug = MSKV_DEBUG_ALL;
#endif
    a->free_now = desc->retire_mode == MSKV_RETIRE_IMMEDIATE && !(a->debug & MSKV_DEBUG_POISON);
    if (a->debug & MSKV_DEBUG_POISON) {
        a->poisoned = (uint8_t *)mskv__alloc(&a->al, n);
        a->dbg_rec = (unsigned char *)mskv__alloc(&a->al, rec * 2);   /* checked above */
        if (a->poisoned) memset(a->poisoned, 0, n);
        if (a->dbg_rec) memset(a->dbg_rec, (int)MSKV_POISON_BYTE, rec);
    }
    if (!a->state || !a->refcount || !a->free_stack || !a->pend_page || !a->pend_fence || !a->scratch ||
        !a->reqs || !a->tabs || !a->req_free || !a->ls || !a->ls_free || !a->rank || !a->pick ||
        (nl > 0 && !desc->store_ops && (!a->pools || !a->pools[nl * 2 - 1])) ||
        ((a->debug & MSKV_DEBUG_POISON) && (!a->poisoned || !a->dbg_rec))) {
        a->store.num_layers = (a->pools ? nl : 0);
        mskv_arena_destroy(a);
        return MSKV_ERROR_OUT_OF_MEMORY;
    }
    for (i = 0; i < a->max_req; i++) {
        a->reqs[i].gen = 1;
        a->reqs[i].t = a->tabs + (size_t)i * (size_t)a->G;
        a->reqs[i].lock_next = -1;
    }
    memset(a->ls, 0, (size_t)a->max_ls * sizeof(mskv__lockstep));
    for (i = 0; i < a->max_ls; i++) a->ls[i].gen = 1;
    memset(a->refcount, 0, n * sizeof(int32_t));
    a->state[0] = MSKV__PAGE_NULL;
    mskv__fresh_lists(a);   /* the stack pops page 1 first, then 2, ...: a fresh arena allocates in id order */
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
            mskv__free(mskv__hal(a), a->reqs[i].host);
            mskv__free(&al, a->reqs[i].sums);
        }
    }
    if (a->tabs) {
        for (i = 0; i < a->max_req * a->G; i++) mskv__free(&al, a->tabs[i].mem);
    }
    mskv__free(&al, a->poisoned);
    mskv__free(&al, a->dbg_rec);
    mskv__free(mskv__hal(a), a->spare);
    if (a->pools) {
        for (i = 0; i < a->store.num_layers * 2; i++) mskv__free(&al, a->pools[i]);
        mskv__free(&al, a->pools);
    }
    if (a->lock_ok) mskv__mutex_destroy(&a->lock);
    mskv__free(&al, a->state);
    mskv__free(&al, a->refcount);
    mskv__free(&al, a->free_stack);
    mskv__free(&al, a->pend_page);
    mskv__free(&al, a->pend_fence);
    mskv__free(&al, a->scratch);
    mskv__free(&al, a->reqs);
    mskv__free(&al, a->tabs);
    mskv__free(&al, a->req_free);
    mskv__free(&al, a->ls);
    mskv__free(&al, a->ls_free);
    mskv__free(&al, a->rank);
    mskv__free(&al, a->pick);
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

/* The n pages on top of the free stack onto out (the top first), the stack
   popped once; the caller checked n <= free_top. The arrays are read through
   locals: the compiler cannot tell the int32 arrays apart, and the loop
   would reload free_top and the array pointers per page. */
static void mskv__take_checked(mskv_arena *a, int32_t n, int32_t *out) {
    const int32_t *stack = a->free_stack + a->free_top - 1;
    uint8_t *state = a->state;
    int32_t *refcount = a->refcount, i;
    for (i = 0; i < n; i++) {
        int32_t p = stack[-i];
        state[p] = MSKV__PAGE_LIVE;
        refcount[p] = 1;
        out[i] = p;
    }
    a->free_top -= n;
    if (a->poisoned)
        for (i = 0; i < n; i++) a->poisoned[out[i]] = 0;
}

/* The single allocation path: either all n pages, or none and OUT_OF_PAGES. */
static mskv_result mskv__take(mskv_arena *a, int64_t n, int32_t *out) {
    if (n > a->free_top)
        return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "need %lld pages, %d free (%d pending)", (long long)n,
                         (int)a->free_top, (int)a->pend_count);
    if (n > 0) mskv__take_checked(a, (int32_t)n, out);
    return MSKV_SUCCESS;
}

/* mskv__unref of pages[count-1] down to pages[0] (the free stack then hands
   them out again in table order). Without fences or poison a freed page goes
   straight onto the free stack, kept in a local for the run. */
static void mskv__unref_run(mskv_arena *a, const int32_t *pages, int32_t count) {
    int32_t i;
    if (a->free_now) {
        int32_t *stack = a->free_stack, *refcount = a->refcount, top = a->free_top;
        uint8_t *state = a->state;
        for (i = count - 1; i >= 0; i--) {
            int32_t p = pages[i];
            MSKV_ASSERT(p > 0 && p < a->num_pages && state[p] == MSKV__PAGE_LIVE && refcount[p] > 0);
            if (--refcount[p] > 0) continue;
            state[p] = MSKV__PAGE_FREE;
            stack[top++] = p;
        }
        a->free_top = top;
        return;
    }
    for (i = count - 1; i >= 0; i--) mskv__unref(a, pages[i]);
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
    for (i = 0; i < a->max_req * a->G; i++) {
        const mskv__tab *t = &a->tabs[i];
        if (!a->reqs[i / a->G].used) continue;
        for (j = 0; j < t->prefix_pages && j < t->num_pages; j++)
            if (!a->scratch[t->pages[j]]) { a->scratch[t->pages[j]] = 1; prot++; }
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

/* Table entries needed to cover absolute tokens [0, total) given the group's prefix and gap. */
static int32_t mskv__entries_for(const mskv_arena *a, const mskv__tab *t, int64_t total) {
    int64_t live = (int64_t)mskv__pages_for(a, total) - mskv__pdiv(a, t->live_start);
    return t->prefix_pages + (int32_t)(live > 0 ? live : 0);
}
static int64_t mskv__kv_len(const mskv_arena *a, const mskv__req *q, const mskv__tab *t) {
    int64_t end = q->committed + q->reserved;
    int64_t split = (int64_t)t->prefix_pages * a->P;
    return split + (end - t->live_start); /* without a gap live_start == split: len == end */
}
/* Pages a resident request holds over every group (shared ones too). */
static int64_t mskv__held_pages(const mskv_arena *a, const mskv__req *q) {
    int64_t n = 0;
    int32_t g;
    for (g = 0; g < a->G; g++) n += q->location == MSKV_RESIDENT ? q->t[g].num_pages : q->t[g].host_pages;
    return n;
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

/* Any live handle, a request being imported too (the streaming calls). */
#define MSKV__GET_ANY(a, h, ri)                                                                   \
    do {                                                                                          \
        (ri) = mskv__lookup((a), (h));                                                            \
        if ((ri) < 0) {                                                                           \
            mskv_result mskv__e = mskv__err((a), MSKV_ERROR_INVALID_HANDLE, "request handle 0x%08x is unknown or removed", (unsigned)(h).id); \
            MSKV__UNLOCK(a);                                                                      \
            return mskv__e;                                                                       \
        }                                                                                         \
    } while (0)
/* A request: one being imported is not one yet (BAD_STATE). */
#define MSKV__GET(a, h, ri)                                                                       \
    do {                                                                                          \
        MSKV__GET_ANY(a, h, ri);                                                                  \
        if ((a)->reqs[ri].xfer == MSKV__XFER_IMPORT) {                                                        \
            mskv_result mskv__e2 = mskv__err((a), MSKV_ERROR_BAD_STATE, "request handle 0x%08x is being imported (import_commit or import_abort)", (unsigned)(h).id); \
            MSKV__UNLOCK(a);                                                                      \
            return mskv__e2;                                                                      \
        }                                                                                         \
    } while (0)

/* The *_in_group calls' group check (before the lock). */
#define MSKV__CHECK_GROUP(a, g)                                                                   \
    do {                                                                                          \
        if ((g) < 0 || (g) >= (a)->G)                                                             \
            return mskv__err((a), MSKV_ERROR_INVALID_ARGUMENT, "layer group %d is not in [0, %d)", (int)(g), (int)(a)->G); \
    } while (0)

/* Room for `need` entries from the head. Moving the entries to the front or
   growing the memory changes no logical state, so a failure here is harmless. */
static mskv_result mskv__reserve_table(mskv_arena *a, mskv__tab *t, int32_t need) {
    int32_t cap;
    int32_t *p;
    size_t bytes;
    if ((int64_t)t->head + need <= t->cap_pages) return MSKV_SUCCESS;  /* need may be near INT32_MAX */
    if (t->head > 0) {
        if (t->num_pages) memmove(t->mem, t->pages, (size_t)t->num_pages * sizeof(int32_t));
        t->head = 0;
        t->pages = t->mem;
        if (need <= t->cap_pages) return MSKV_SUCCESS;
    }
    cap = t->cap_pages ? t->cap_pages : 8;
    while (cap < need) cap = cap > (1 << 29) ? need : cap * 2;
    if (!mskv__mul((size_t)cap, sizeof(int32_t), &bytes)) return mskv__err(a, MSKV_ERROR_OVERFLOW, "page table of %d entries", (int)cap);
    p = (int32_t *)mskv__realloc(&a->al, t->mem, bytes);
    if (!p) return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "page table of %d entries", (int)cap);
    t->mem = t->pages = p;
    t->cap_pages = cap;
    return MSKV_SUCCESS;
}

static int32_t mskv__new_req(mskv_arena *a) {
    int32_t ri, g;
    mskv__req *q;
    mskv__tab *t;
    uint16_t gen;
    if (a->req_free_top == 0) return -1;
    ri = a->req_free[--a->req_free_top];
    q = &a->reqs[ri];
    gen = q->gen;
    t = q->t;
    memset(q, 0, sizeof *q);
    q->gen = gen;
    q->t = t;
    q->lock_next = -1;
    q->used = 1;
    ++a->epoch_counter;
    for (g = 0; g < a->G; g++) {
        int32_t *mem = t[g].mem, cap = t[g].cap_pages;
        memset(&t[g], 0, sizeof t[g]);
        t[g].mem = t[g].pages = mem;   /* keep the table's memory: no allocation in steady state */
        t[g].cap_pages = cap;
        t[g].epoch = a->epoch_counter;
    }
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

static void mskv__drop_pages(mskv_arena *a, int32_t ri, int32_t g, int32_t from, int32_t count);

/* Drop every group's pages, the last group first: one request's admit, then
   drop, then admit gives the same page ids. */
static void mskv__drop_all(mskv_arena *a, int32_t ri) {
    int32_t g;
    for (g = a->G - 1; g >= 0; g--) mskv__drop_pages(a, ri, g, 0, a->reqs[ri].t[g].num_pages);
}

/* Callers unlink a lockstep member first. */
static void mskv__del_req(mskv_arena *a, int32_t ri) {
    mskv__req *q = &a->reqs[ri];
    int32_t g;
    MSKV_ASSERT(q->lock == 0);
    mskv__drop_all(a, ri);
    mskv__host_put(a, q->host, q->host_cap);
    mskv__free(&a->al, q->sums);
    q->sums = NULL;
    for (g = 0; g < a->G; g++) {
        a->offloaded_pages -= q->t[g].host_pages;
        q->t[g].host_pages = 0;
    }
    q->host = NULL;
    q->host_cap = 0;
    q->used = 0;
    q->gen = (uint16_t)(q->gen + 1);
    a->req_free[a->req_free_top++] = ri;
    a->nreq--;
}

/* Absolute position of the first slot of table entry i. */
static int64_t mskv__entry_pos(const mskv_arena *a, const mskv__tab *t, int32_t i) {
    return i < t->prefix_pages ? (int64_t)i * a->P : t->live_start + (int64_t)(i - t->prefix_pages) * a->P;
}

/* Remove group g's table entries [from, from+count), unreferencing their
   pages, and close the gap by moving the shorter side (releases move the few
   prefix pages, not the long live window). Pages are freed last-first, so the
   free stack hands them out again in table order: admit + abort + admit gives
   the same ids. */
static MSKV__ALWAYS_INLINE void mskv__drop_tab(mskv_arena *a, int32_t ri, int32_t g, mskv__tab *t, int32_t from, int32_t count);
static void mskv__drop_pages(mskv_arena *a, int32_t ri, int32_t g, int32_t from, int32_t count) {
    mskv__drop_tab(a, ri, g, &a->reqs[ri].t[g], from, count);
}
/* mskv__drop_pages of group table t (the request's t[g]), inline in release_oldest. */
static MSKV__ALWAYS_INLINE void mskv__drop_tab(mskv_arena *a, int32_t ri, int32_t g, mskv__tab *t, int32_t from, int32_t count) {
    int32_t i, after;
    if (count <= 0) return;
    /* the one place pages leave a table: plans built before now that read them are stale */
    t->shrunk = ++a->generation;
    for (i = from; a->desc.on_event && i < from + count; i++)
        mskv__emit(a, MSKV_EVENT_PAGE_REMOVED, ri, g, t->pages[i], mskv__entry_pos(a, t, i));
    mskv__unref_run(a, t->pages + from, count);
    after = t->num_pages - from - count;
    if (from <= after) {
        if (from) memmove(t->pages + count, t->pages, (size_t)from * sizeof(int32_t));
        t->head += count;
        t->pages += count;
    } else if (after) {
        memmove(t->pages + from, t->pages + from + count, (size_t)after * sizeof(int32_t));
    }
    t->num_pages -= count;
    if (t->num_pages == 0) { t->head = 0; t->pages = t->mem; }
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

/* The single-request calls that free or move pages refuse lockstep members. */
static mskv_result mskv__check_solo(mskv_arena *a, const mskv__req *q, const char *what) {
    if (q->xfer) return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: the request is being exported (mskv_request_export_end first)", what);
    if (q->lock) return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: the request is a lockstep member (use mskv_lockstep_%s)", what, what);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_remove(mskv_arena *a, mskv_request h) {
    int32_t ri;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    r = mskv__check_solo(a, &a->reqs[ri], "remove");
    if (r == MSKV_SUCCESS) mskv__del_req(a, ri);
    MSKV__UNLOCK(a);
    return r;
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

/* Fresh pages for the partial last page of each of the parent's groups,
   with the bytes copied: all or none (on failure nothing is taken). */
static mskv_result mskv__fork_copies(mskv_arena *a, const mskv__req *p, int32_t *fresh, int32_t *n) {
    int32_t g, k = 0, i = 0;
    mskv_result r;
    int partial = p->committed % a->P != 0;
    for (g = 0; g < a->G; g++) k += partial && p->t[g].num_pages > 0;
    *n = k;
    r = mskv__take(a, k, fresh);
    if (r != MSKV_SUCCESS) return r;
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++)
        if (partial && p->t[g].num_pages > 0)
            mskv__copy_page_bytes(a, p->t[g].pages[p->t[g].num_pages - 1], fresh[i++], &r);
    if (r != MSKV_SUCCESS) mskv__untake(a, k, fresh);
    return r;
}

MSKV_IMPL mskv_result mskv_request_fork(mskv_arena *a, mskv_request parent, mskv_request *child) {
    int32_t pi, ci, i, g, k = 0, fresh[MSKV_MAX_GROUPS];
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
    ci = mskv__new_req(a);
    if (ci < 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "fork: no request slot"); }
    p = &a->reqs[pi];
    c = &a->reqs[ci];
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++) r = mskv__reserve_table(a, &c->t[g], p->t[g].num_pages);
    if (r == MSKV_SUCCESS) r = mskv__fork_copies(a, p, fresh, &k);
    if (r != MSKV_SUCCESS) {
        mskv__undo_new_req(a, ci);
        MSKV__UNLOCK(a);
        return r;
    }
    for (g = 0, k = 0; g < a->G; g++) {
        const mskv__tab *pt = &p->t[g];
        mskv__tab *ct = &c->t[g];
        int partial = pt->num_pages > 0 && p->committed % a->P != 0;
        for (i = 0; i < pt->num_pages; i++) {
            ct->pages[i] = pt->pages[i];
            if (!(partial && i == pt->num_pages - 1)) a->refcount[pt->pages[i]]++;
        }
        if (partial) ct->pages[pt->num_pages - 1] = fresh[k++];
        ct->num_pages = pt->num_pages;
        ct->prefix_tokens = pt->prefix_tokens;
        ct->prefix_pages = pt->prefix_pages;
        ct->live_start = pt->live_start;
        ct->release_point = pt->release_point;
    }
    c->committed = p->committed;
    c->pos_shift = p->pos_shift;
    c->published = p->published;
    *child = mskv__handle(a, ci);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

static void mskv__fill_info(const mskv_arena *a, const mskv__req *q, int32_t g, mskv_request_info *o) {
    const mskv__tab *t = &q->t[g];
    o->committed = q->committed;
    o->reserved = q->reserved;
    o->has_reservation = q->has_res;
    o->prefix_tokens = t->prefix_tokens;
    o->prefix_pages = t->prefix_pages;
    o->live_start = t->live_start;
    o->num_pages = q->location == MSKV_RESIDENT ? t->num_pages : t->host_pages;
    o->kv_len = mskv__kv_len(a, q, t);
    o->prefix_epoch = t->epoch;
    o->location = (mskv_location)q->location;
    o->keyed = q->keyed;
    o->sealed = q->sealed;
    o->paused = q->paused;
    o->lockstep = q->lock != 0;
    o->last_admitted = q->last_admit;
    o->release_point = t->release_point;
    o->pos_shift = q->pos_shift;
    o->pos_shift_pending = q->pos_pending;
}

MSKV_IMPL mskv_result mskv_request_info_in_group(mskv_arena *a, mskv_request h, int32_t g, mskv_request_info *out) {
    int32_t ri;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    mskv__fill_info(a, &a->reqs[ri], g, out);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}
MSKV_IMPL mskv_result mskv_request_info_get(mskv_arena *a, mskv_request h, mskv_request_info *out) {
    return mskv_request_info_in_group(a, h, 0, out);
}

MSKV_IMPL mskv_result mskv_request_pages_in_group(mskv_arena *a, mskv_request h, int32_t g, int32_t *pages, int32_t cap, int32_t *count) {
    int32_t ri;
    const mskv__tab *t;
    if (!a || !count) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    t = &a->reqs[ri].t[g];
    if (a->reqs[ri].location != MSKV_RESIDENT) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OFFLOADED, "pages: request is offloaded"); }
    *count = t->num_pages;
    if (!pages && cap == 0) { MSKV__UNLOCK(a); return MSKV_SUCCESS; } /* a size query */
    if (!pages) { MSKV__UNLOCK(a); return MSKV_ERROR_NULL_POINTER; }
    if (cap < t->num_pages) { MSKV__UNLOCK(a); return MSKV_ERROR_CAPACITY; }
    if (t->num_pages) memcpy(pages, t->pages, (size_t)t->num_pages * sizeof(int32_t));
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}
MSKV_IMPL mskv_result mskv_request_pages(mskv_arena *a, mskv_request h, int32_t *pages, int32_t cap, int32_t *count) {
    return mskv_request_pages_in_group(a, h, 0, pages, cap, count);
}

/* Checks shared by the mutators: resident, and writable unless allow_keyed. */
static mskv_result mskv__check_mutable(mskv_arena *a, const mskv__req *q, const char *what) {
    if (q->xfer) return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: the request is being exported (mskv_request_export_end first)", what);
    if (q->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "%s: request is offloaded", what);
    if (q->keyed && q->scratch_cap) return mskv__err(a, MSKV_ERROR_READ_ONLY, "%s: a scratch entry keeps no sequence (admit, commit, abort, mskv_scratch_reset)", what);
    if (q->keyed) return mskv__err(a, MSKV_ERROR_READ_ONLY, "%s: keyed entries are write-once", what);
    return MSKV_SUCCESS;
}

static mskv_result mskv__protect(mskv_arena *a, int32_t ri, int32_t g, int64_t n) {
    mskv__tab *t = &a->reqs[ri].t[g];
    int32_t pp = mskv__pages_for(a, n);
    int gap = t->live_start > (int64_t)t->prefix_pages * a->P;
    if (n == t->prefix_tokens) return MSKV_SUCCESS;
    if (gap && pp > t->prefix_pages)
        return mskv__err(a, MSKV_ERROR_RELEASED, "protect %lld: tokens from %lld on were released", (long long)n,
                         (long long)t->prefix_pages * a->P);
    if (gap && pp < t->prefix_pages)
        return mskv__err(a, MSKV_ERROR_BAD_STATE, "protect %lld: cannot unprotect pages in front of released ones",
                         (long long)n);
    if (!gap) {
        t->live_start = (int64_t)pp * a->P;
        t->release_point = 0;   /* it freed no page, and the tokens it hid are now protected or live again */
    }
    t->prefix_tokens = n;
    t->prefix_pages = pp;
    t->epoch = ++a->epoch_counter;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_reserve(mskv_arena *a, mskv_request h, int64_t tokens) {
    int32_t ri, g;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if (tokens < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (tokens > (int64_t)INT32_MAX - a->P) return MSKV_ERROR_OVERFLOW;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++)
        r = mskv__reserve_table(a, &a->reqs[ri].t[g], mskv__pages_for(a, tokens) + 1);
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

MSKV_IMPL mskv_result mskv_request_protect_prefix_in_group(mskv_arena *a, mskv_request h, int32_t g, int64_t n) {
    int32_t ri;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    r = mskv__check_mutable(a, &a->reqs[ri], "protect");
    if (r == MSKV_SUCCESS && n < 0) r = mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "protect: negative length");
    if (r == MSKV_SUCCESS && n > a->reqs[ri].committed)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "protect %lld: only %lld tokens are committed", (long long)n,
                      (long long)a->reqs[ri].committed);
    if (r == MSKV_SUCCESS) r = mskv__protect(a, ri, g, n);
    MSKV__UNLOCK(a);
    return r;
}
MSKV_IMPL mskv_result mskv_request_protect_prefix(mskv_arena *a, mskv_request h, int64_t n) {
    return mskv_request_protect_prefix_in_group(a, h, 0, n);
}

/* Where the still-visible live tokens start: the previous release point, or
   live_start when nothing was released since the prefix last moved. A
   retention's release point may lie inside the protected prefix's last page
   (below live_start: a sink ending mid-page, the window starting before its
   page ends); it is where the visible tokens start all the same. */
static int64_t mskv__visible_start(const mskv__tab *t) {
    return t->release_point != 0 ? t->release_point : t->live_start;
}

/* Move group g's release point to absolute position point (never back) and
   free the pages whole behind it; returns the tokens freed. */
static int64_t mskv__release_to(mskv_arena *a, int32_t ri, int32_t g, int64_t point) {
    mskv__tab *t = &a->reqs[ri].t[g];
    int32_t count = (int32_t)(mskv__pdiv(a, point) - mskv__pdiv(a, t->live_start));
    if (point > mskv__visible_start(t)) t->release_point = point;  /* exact, even where no page goes */
    if (count <= 0) return 0;
    mskv__drop_pages(a, ri, g, t->prefix_pages, count);
    t->live_start += (int64_t)count * a->P;
    return (int64_t)count * a->P;
}

/* Release the n oldest still-visible tokens of group g. */
static int64_t mskv__release(mskv_arena *a, int32_t ri, int32_t g, int64_t n) {
    return mskv__release_to(a, ri, g, mskv__visible_start(&a->reqs[ri].t[g]) + n);
}

/* What release_oldest(n) of group g checks, without the lockstep rule. */
static mskv_result mskv__check_release(mskv_arena *a, int32_t ri, int32_t g, int64_t n) {
    const mskv__req *q = &a->reqs[ri];
    int64_t live = q->committed - mskv__visible_start(&q->t[g]);
    mskv_result r = mskv__check_mutable(a, q, "release");
    if (live < 0) live = 0;
    if (r == MSKV_SUCCESS && n < 0) r = mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "release: negative count");
    if (r == MSKV_SUCCESS && n > live)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "release %lld: only %lld committed tokens are still visible", (long long)n,
                      (long long)live);
    return r;
}

/* release_oldest of a checked group under the lock: the checks of
   mskv__check_release and mskv__check_solo in their order and with their
   messages, the visible start read once and the pages dropped in one run
   (mskv__release_to's work, inline). */
static MSKV__ALWAYS_INLINE mskv_result mskv__release_oldest_locked(mskv_arena *a, int32_t ri, int32_t g, int64_t n, int64_t *released) {
    mskv__req *q = &a->reqs[ri];
    mskv__tab *t = &q->t[g];
    int64_t vis = mskv__visible_start(t), live = q->committed - vis, point, got = 0;
    int32_t count;
    mskv_result r = mskv__check_mutable(a, q, "release");
    if (r != MSKV_SUCCESS) return r;
    if (live < 0) live = 0;
    if (n < 0) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "release: negative count");
    if (n > live)
        return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "release %lld: only %lld committed tokens are still visible", (long long)n,
                         (long long)live);
    /* check_solo: check_mutable refused a transfer already */
    if (q->lock) return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: the request is a lockstep member (use mskv_lockstep_%s)", "release_oldest", "release_oldest");
    point = vis + n;
    count = (int32_t)(mskv__pdiv(a, point) - mskv__pdiv(a, t->live_start));
    if (point > vis) t->release_point = point;  /* exact, even where no page goes */
    if (count > 0) {
        mskv__drop_tab(a, ri, g, t, t->prefix_pages, count);
        t->live_start += (int64_t)count * a->P;
        got = (int64_t)count * a->P;
    }
    if (released) *released = got;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_release_oldest_in_group(mskv_arena *a, mskv_request h, int32_t g, int64_t n, int64_t *released) {
    int32_t ri;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    r = mskv__release_oldest_locked(a, ri, g, n, released);
    MSKV__UNLOCK(a);
    return r;
}
MSKV_IMPL mskv_result mskv_request_release_oldest(mskv_arena *a, mskv_request h, int64_t n, int64_t *released) {
    return mskv_request_release_oldest_in_group(a, h, 0, n, released);
}

MSKV_IMPL mskv_result mskv_request_shift_positions(mskv_arena *a, mskv_request h, int64_t delta) {
    int32_t ri;
    mskv__req *q;
    int64_t now;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    now = q->pos_shift + q->pos_pending;  /* both within INT32_MAX: no overflow below */
    if (q->keyed) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "shift_positions: keyed entries have no positions of their own");
    else if (q->xfer) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "shift_positions: the request is being exported (its header says the shift)");
    else if (delta > (int64_t)INT32_MAX - now || delta < -(int64_t)INT32_MAX - now)
        r = mskv__err(a, MSKV_ERROR_OVERFLOW, "shift_positions: pos_shift %lld + %lld passes INT32_MAX", (long long)now, (long long)delta);
    else if (q->has_res) q->pos_pending += delta;   /* the open chunk keeps its positions */
    else q->pos_shift += delta;
    MSKV__UNLOCK(a);
    return r;
}

/* The release point agrees with the pages: 0 with nothing released, else
   inside the first live page (whole pages went up to its floor) or, while no
   live page went, inside the prefix's last page; past the prefix, within the
   committed tokens. */
static int mskv__release_point_ok(const mskv_arena *a, const mskv__tab *t, int64_t committed) {
    int no_gap = t->live_start == (int64_t)t->prefix_pages * a->P;
    if (t->release_point == 0) return no_gap;
    /* inside the first live page, or (no live page released yet) inside the prefix's last page */
    return (t->release_point >= t->live_start || no_gap) && t->release_point < t->live_start + a->P &&
           t->release_point > t->prefix_tokens && t->release_point <= committed;
}

/* Compacted index of an absolute position in group table t, with the position's status. */
static mskv_result mskv__compact_index(const mskv_arena *a, const mskv__req *q, const mskv__tab *t, int64_t pos, int64_t *j) {
    int64_t split = (int64_t)t->prefix_pages * a->P;
    if (pos < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (pos >= q->committed + q->reserved) return MSKV_ERROR_NOT_WRITTEN;
    if (pos < split) { *j = pos; return MSKV_SUCCESS; }
    if (pos < t->live_start) return MSKV_ERROR_RELEASED;
    *j = split + (pos - t->live_start);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_slot_in_group(mskv_arena *a, mskv_request h, int32_t g, int64_t pos, int64_t *slot) {
    int32_t ri;
    int64_t j = 0;
    mskv_result r;
    const mskv__req *q;
    if (!a || !slot) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (pos < 0) r = MSKV_ERROR_INVALID_ARGUMENT;   /* a value outside its domain before the state (the header's order) */
    else if (q->location != MSKV_RESIDENT) r = MSKV_ERROR_OFFLOADED;
    else r = mskv__compact_index(a, q, &q->t[g], pos, &j);
    if (r == MSKV_SUCCESS) *slot = (int64_t)q->t[g].pages[j / a->P] * a->P + j % a->P;
    else r = mskv__err(a, r, "slot of position %lld: %s", (long long)pos, mskv_result_string(r));
    MSKV__UNLOCK(a);
    return r;
}
MSKV_IMPL mskv_result mskv_request_slot(mskv_arena *a, mskv_request h, int64_t pos, int64_t *slot) {
    return mskv_request_slot_in_group(a, h, 0, pos, slot);
}

/* // >>offload (implementation) ------------------------------------------ */

static mskv_result mskv__read_pages(mskv_arena *a, const int32_t *pages, int32_t n, unsigned char *dst) {
    int32_t i, l;
    if (n == 0) return MSKV_SUCCESS;
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
    if (n == 0) return MSKV_SUCCESS;
    if (a->desc.store_ops) return a->desc.store_ops->write_pages(a->desc.store_ops->user, pages, n, src);
    if (!a->pools) return MSKV_SUCCESS;
    for (i = 0; i < n; i++)
        for (l = 0; l < a->store.num_layers * 2; l++)
            memcpy(a->pools[l] + (size_t)pages[i] * a->store.page_bytes,
                   src + (size_t)i * a->record_bytes + (size_t)l * a->store.page_bytes, a->store.page_bytes);
    return MSKV_SUCCESS;
}

/* Every group's pages, group after group, into dst (the host copy's layout). */
static mskv_result mskv__read_request(mskv_arena *a, const mskv__req *q, unsigned char *dst) {
    int32_t g;
    size_t at = 0;
    mskv_result r = MSKV_SUCCESS;
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++) {
        r = mskv__read_pages(a, q->t[g].pages, q->t[g].num_pages, dst + at);
        at += (size_t)q->t[g].num_pages * a->record_bytes;
    }
    return r;
}

/* MSKV_DEBUG_CHECKSUMS: one checksum per record of a host copy (every
   group's records), taken when the copy is made and compared before its
   bytes are used again. */
static uint64_t *mskv__sums_of(mskv_arena *a, const unsigned char *host, int64_t n) {
    uint64_t *sums;
    size_t bytes;
    int64_t i;
    if (!mskv__mul((size_t)n, sizeof(uint64_t), &bytes)) return NULL;
    sums = (uint64_t *)mskv__alloc(&a->al, bytes);
    for (i = 0; sums && i < n; i++) sums[i] = mskv__checksum(host + (size_t)i * a->record_bytes, a->record_bytes);
    return sums;
}
/* The first record of offloaded q's host copy whose bytes changed; -1 when none (or no sums). */
static int64_t mskv__sums_bad(const mskv_arena *a, const mskv__req *q) {
    int64_t i, n = q->sums ? mskv__held_pages(a, q) : 0;
    for (i = 0; i < n; i++)
        if (mskv__checksum(q->host + (size_t)i * a->record_bytes, a->record_bytes) != q->sums[i]) return i;
    return -1;
}

/* Parking (offload) of the requests idx[0..n) is all or nothing, in two
   phases. Copy: each request's pages go into a host buffer, held in its host
   field while it stays resident; on any failure every buffer goes back (the
   arena's spare as it was) and nothing has changed. */
static mskv_result mskv__park_copy(mskv_arena *a, const int32_t *idx, int32_t n, const char *what) {
    unsigned char *spare = a->spare;
    size_t spare_cap = a->spare_cap, bytes = 0;
    mskv_result r = MSKV_SUCCESS;
    int32_t i, j;
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        mskv__req *q = &a->reqs[idx[i]];
        if (!mskv__mul((size_t)mskv__held_pages(a, q), a->record_bytes, &bytes)) {
            r = MSKV_ERROR_OVERFLOW;
            break;
        }
        if (bytes == 0) continue;
        q->host = mskv__host_get(a, bytes, &q->host_cap);
        if (!q->host) { r = mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "%s: %zu host bytes", what, bytes); break; }
        r = mskv__read_request(a, q, q->host);
        if (r != MSKV_SUCCESS) { i++; r = mskv__err(a, r, "%s: reading pages failed, the requests stay resident", what); break; }
        if ((a->debug & MSKV_DEBUG_CHECKSUMS) && !(q->sums = mskv__sums_of(a, q->host, mskv__held_pages(a, q)))) {
            i++;
            r = mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "%s: the host copy's checksums", what);
            break;
        }
    }
    if (r == MSKV_SUCCESS) return r;
    for (j = 0; j < i; j++) {
        mskv__req *q = &a->reqs[idx[j]];
        if (q->host && q->host != spare) mskv__free(mskv__hal(a), q->host);
        mskv__free(&a->al, q->sums);
        q->sums = NULL;
        q->host = NULL;
        q->host_cap = 0;
    }
    a->spare = spare;
    a->spare_cap = spare_cap;
    return r;
}

/* Parking, phase 2: every copy is complete, so the pages may go. */
static void mskv__park_commit(mskv_arena *a, const int32_t *idx, int32_t n) {
    int32_t i, g;
    for (i = 0; i < n; i++) {
        mskv__req *q = &a->reqs[idx[i]];
        for (g = 0; g < a->G; g++) {
            q->t[g].host_pages = q->t[g].num_pages;
            a->offloaded_pages += q->t[g].num_pages;
        }
        mskv__drop_all(a, idx[i]);
        q->location = MSKV_OFFLOADED;
    }
}

/* Reload of the offloaded requests idx[0..n), all or nothing: pages for all
   of them, bytes written back; on any failure the pages go back exactly
   (the free stack as it was) and the host copies stay. */
static mskv_result mskv__unpark(mskv_arena *a, const int32_t *idx, int32_t n, const char *what) {
    int64_t need = 0;
    int32_t i, g;
    mskv_result r = MSKV_SUCCESS;
    for (i = 0; i < n; i++) {
        const mskv__req *q = &a->reqs[idx[i]];
        int64_t bad = q->sums ? mskv__sums_bad(a, q) : -1;
        if (bad >= 0)
            return mskv__err(a, MSKV_ERROR_HOST_COPY_CORRUPT, "%s: page %lld of a host copy changed since it was made", what,
                             (long long)bad);
        need += mskv__held_pages(a, q);
    }
    /* out of pages is the common failure: find it before growing the tables */
    if (need > a->free_top)
        return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "%s: need %lld pages, %d free (%d pending)", what, (long long)need,
                         (int)a->free_top, (int)a->pend_count);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++)
        for (g = 0; r == MSKV_SUCCESS && g < a->G; g++)
            r = mskv__reserve_table(a, &a->reqs[idx[i]].t[g], a->reqs[idx[i]].t[g].host_pages);
    if (r != MSKV_SUCCESS) return r;
    for (i = 0; i < n; i++)
        for (g = 0; g < a->G; g++) {
            mskv__tab *t = &a->reqs[idx[i]].t[g];
            r = mskv__take(a, t->host_pages, t->pages);
            MSKV_ASSERT(r == MSKV_SUCCESS); /* the total was checked above */
        }
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q = &a->reqs[idx[i]];
        size_t at = 0;
        for (g = 0; r == MSKV_SUCCESS && g < a->G; g++) {
            if (q->host) r = mskv__write_pages(a, q->t[g].pages, q->t[g].host_pages, q->host + at);
            at += (size_t)q->t[g].host_pages * a->record_bytes;
        }
    }
    if (r != MSKV_SUCCESS) {
        for (i = n - 1; i >= 0; i--)
            for (g = a->G - 1; g >= 0; g--) mskv__untake(a, a->reqs[idx[i]].t[g].host_pages, a->reqs[idx[i]].t[g].pages);
        return mskv__err(a, r, "%s: writing pages failed, the requests stay offloaded", what);
    }
    for (i = 0; i < n; i++) {
        mskv__req *q = &a->reqs[idx[i]];
        ++a->epoch_counter;
        for (g = 0; g < a->G; g++) {
            q->t[g].num_pages = q->t[g].host_pages;
            a->offloaded_pages -= q->t[g].host_pages;
            q->t[g].host_pages = 0;
            q->t[g].epoch = a->epoch_counter;
        }
        mskv__host_put(a, q->host, q->host_cap);
        mskv__free(&a->al, q->sums);
        q->sums = NULL;
        q->host = NULL;
        q->host_cap = 0;
        q->location = MSKV_RESIDENT;
    }
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_request_offload(mskv_arena *a, mskv_request h) {
    int32_t ri;
    mskv__req *q;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    /* the header's order of state codes: location, reservation, keyed */
    r = q->location == MSKV_RESIDENT && q->has_res ? mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "offload: commit or abort first")
                                                   : mskv__check_mutable(a, q, "offload");
    if (r == MSKV_SUCCESS) r = mskv__check_solo(a, q, "offload");
    if (r == MSKV_SUCCESS) r = mskv__park_copy(a, &ri, 1, "offload");
    if (r == MSKV_SUCCESS) mskv__park_commit(a, &ri, 1);   /* the copy is complete: only now may the pages go */
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_request_reload(mskv_arena *a, mskv_request h) {
    int32_t ri;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (q->location != MSKV_OFFLOADED) r = mskv__err(a, MSKV_ERROR_NOT_OFFLOADED, "reload: request is resident");
    if (r == MSKV_SUCCESS) r = mskv__check_solo(a, q, "reload");
    if (r == MSKV_SUCCESS) r = mskv__unpark(a, &ri, 1, "reload");
    MSKV__UNLOCK(a);
    return r;
}

/* Blob format, little-endian, version 1 (one layer group):
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
   Version 2 (G > 1 layer groups): the same first 128 bytes describe group 0;
   then u32 G, u32 0; then for groups 1..G-1 a 64-byte record: u32 pages,
   u32 prefix_pages, u32 flags (4 retention), u32 0, i64 prefix_tokens,
   i64 live_start, retention as above (40 bytes). Header bytes = 136 + 64 (G-1);
   the payload holds group 0's records, then group 1's, ...
   Version 3 (a state versions 1 and 2 cannot say: a position shift, or a
   release point inside a kept page): the version-2 layout for any G >= 1
   (G = 1 too), then a positions record: i64 pos_shift, and per group an i64
   release_point. Header bytes = 136 + 64 (G-1) + 8 + 8 G. Versions 1 and 2
   imply release_point = live_start when pages were released, else 0, and
   pos_shift 0; export writes them whenever that says it all.
   The checksum is verified before the version, so a damaged header reads as corrupt.
   Versions 4, 5 and 6 are versions 1, 2 and 3 (the same layouts) with the
   checksum XXH64 (seed 0) of everything before it, so any XXH64 (xxhsum
   -H64, python's xxhash) verifies a blob; 1 to 3 carry the library's
   earlier digest (mskv__legacy_checksum) and are still read. Export writes
   4 to 6. */
#define MSKV__BLOB_VERSION 1u
#define MSKV__BLOB_VERSION_GROUPS 2u
#define MSKV__BLOB_VERSION_POSITIONS 3u
#define MSKV__BLOB_XXH64 3u            /* written version = layout + 3 (4, 5, 6): the checksum is XXH64 */
#define MSKV__BLOB_VERSION_MAX 6u
/* The layout (1 to 3) of a stored version; anything unknown stays as it is (and is refused). */
static uint32_t mskv__blob_layout_version(uint32_t stored) {
    return stored > MSKV__BLOB_VERSION_POSITIONS && stored <= MSKV__BLOB_VERSION_MAX ? stored - MSKV__BLOB_XXH64 : stored;
}
#define MSKV__BLOB_HEADER 128u
#define MSKV__BLOB_GROUP 64u

static size_t mskv__blob_header_v(int32_t groups, uint32_t version) {
    if (version == MSKV__BLOB_VERSION_POSITIONS)
        return MSKV__BLOB_HEADER + 8u + MSKV__BLOB_GROUP * (size_t)(groups - 1) + 8u + 8u * (size_t)groups;
    return groups == 1 ? MSKV__BLOB_HEADER : MSKV__BLOB_HEADER + 8u + MSKV__BLOB_GROUP * (size_t)(groups - 1);
}

/* What versions 1 and 2 imply for a group's release point. */
static int64_t mskv__implied_release_point(const mskv_arena *a, const mskv__tab *t) {
    return t->live_start > (int64_t)t->prefix_pages * a->P ? t->live_start : 0;
}

/* The version a request's blob needs: 3 only when the older ones cannot say its state. */
static uint32_t mskv__blob_version_of(const mskv_arena *a, const mskv__req *q) {
    int32_t g;
    int extra = q->pos_shift != 0;
    /* an import's blob is the one that arrives: its ranges, and the header
       its checksum covers, follow that header, not the one export would write */
    if (q->xfer == MSKV__XFER_IMPORT && q->xfer_version) return mskv__blob_layout_version(q->xfer_version);
    for (g = 0; g < a->G; g++) extra |= q->t[g].release_point != mskv__implied_release_point(a, &q->t[g]);
    if (extra) return MSKV__BLOB_VERSION_POSITIONS;
    return a->G == 1 ? MSKV__BLOB_VERSION : MSKV__BLOB_VERSION_GROUPS;
}

static void mskv__put32(unsigned char *p, uint32_t v) { int i; for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void mskv__put64(unsigned char *p, uint64_t v) { int i; for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t mskv__get32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t mskv__get64(const unsigned char *p) { return mskv__rd64(p); }


static void mskv__put_retention(unsigned char *p, const mskv_retention *r) {
    mskv__put64(p, (uint64_t)r->chunk_size);
    mskv__put64(p + 8, (uint64_t)r->sink_chunks);
    mskv__put64(p + 16, (uint64_t)r->window_chunks);
    mskv__put32(p + 24, (uint32_t)r->reset_at_boundary);
    mskv__put32(p + 28, (uint32_t)r->exact);
}
static void mskv__get_retention(const unsigned char *p, mskv_retention *r) {
    r->chunk_size = (int64_t)mskv__get64(p);
    r->sink_chunks = (int64_t)mskv__get64(p + 8);
    r->window_chunks = (int64_t)mskv__get64(p + 16);
    r->window_tokens = 0;  /* derived once the policy is known to be valid */
    r->reset_at_boundary = (int32_t)mskv__get32(p + 24);
    r->exact = (int32_t)mskv__get32(p + 28);
}

static void mskv__blob_header_write(const mskv_arena *a, const mskv__req *q, unsigned char *b, size_t total) {
    const mskv__tab *t = &q->t[0];
    int32_t g;
    int res = q->location == MSKV_RESIDENT;
    uint32_t version = mskv__blob_version_of(a, q);
    size_t hdr = mskv__blob_header_v(a->G, version);
    memset(b, 0, hdr);
    memcpy(b, "MSKVBLOB", 8);
    /* as written: XXH64-signed (layout + 3), or, for an import in flight, the arriving blob's own version */
    mskv__put32(b + 8, q->xfer == MSKV__XFER_IMPORT && q->xfer_version ? (uint32_t)q->xfer_version : version + MSKV__BLOB_XXH64);
    mskv__put32(b + 12, (uint32_t)hdr);
    mskv__put64(b + 16, (uint64_t)total);
    mskv__put32(b + 24, (uint32_t)a->P);
    mskv__put32(b + 28, (uint32_t)a->store.num_layers);
    mskv__put32(b + 32, (uint32_t)a->store.kv_heads);
    mskv__put32(b + 36, (uint32_t)a->store.head_dim);
    mskv__put32(b + 40, (uint32_t)(a->store.num_layers ? a->store.dtype : 0));
    mskv__put32(b + 44, (uint32_t)(res ? t->num_pages : t->host_pages));
    mskv__put32(b + 48, (uint32_t)(q->keyed | q->sealed << 1 | t->has_ret << 2));
    mskv__put32(b + 52, (uint32_t)t->prefix_pages);
    mskv__put64(b + 56, (uint64_t)q->committed);
    mskv__put64(b + 64, (uint64_t)t->prefix_tokens);
    mskv__put64(b + 72, (uint64_t)t->live_start);
    mskv__put64(b + 80, (uint64_t)q->published);
    mskv__put_retention(b + 88, &t->retention);
    mskv__put64(b + 120, q->key);
    if (version == MSKV__BLOB_VERSION) return;
    mskv__put32(b + 128, (uint32_t)a->G);
    for (g = 1; g < a->G; g++) {
        unsigned char *p = b + MSKV__BLOB_HEADER + 8 + MSKV__BLOB_GROUP * (size_t)(g - 1);
        t = &q->t[g];
        mskv__put32(p, (uint32_t)(res ? t->num_pages : t->host_pages));
        mskv__put32(p + 4, (uint32_t)t->prefix_pages);
        mskv__put32(p + 8, (uint32_t)t->has_ret << 2);
        mskv__put64(p + 16, (uint64_t)t->prefix_tokens);
        mskv__put64(p + 24, (uint64_t)t->live_start);
        mskv__put_retention(p + 32, &t->retention);
    }
    if (version != MSKV__BLOB_VERSION_POSITIONS) return;
    b += MSKV__BLOB_HEADER + 8 + MSKV__BLOB_GROUP * (size_t)(a->G - 1);
    mskv__put64(b, (uint64_t)q->pos_shift);
    for (g = 0; g < a->G; g++) mskv__put64(b + 8 + 8 * (size_t)g, (uint64_t)q->t[g].release_point);
}

MSKV_IMPL mskv_result mskv_request_export(mskv_arena *a, mskv_request h, void *buf, size_t cap, size_t *size) {
    int32_t ri;
    int64_t bad;
    const mskv__req *q;
    size_t payload, total, hdr;
    unsigned char *b = (unsigned char *)buf;
    mskv_result r = MSKV_SUCCESS;
    if (!a || !size) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    hdr = mskv__blob_header_v(a->G, mskv__blob_version_of(a, q));
    if (q->has_res) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "export: commit or abort first"); }
    if (q->scratch_cap) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_BAD_STATE, "export: a scratch entry is rewritten every step (never exported)"); }
    if (buf && q->location == MSKV_OFFLOADED && q->sums && (bad = mskv__sums_bad(a, q)) >= 0) {
        MSKV__UNLOCK(a);   /* a signed blob of changed bytes would import as valid */
        return mskv__err(a, MSKV_ERROR_HOST_COPY_CORRUPT, "export: page %lld of the host copy changed since it was made", (long long)bad);
    }
    if (!mskv__mul((size_t)mskv__held_pages(a, q), a->record_bytes, &payload) || !mskv__add(payload, hdr + 8, &total)) {
        MSKV__UNLOCK(a);
        return MSKV_ERROR_OVERFLOW;
    }
    *size = total;
    if (!buf) { MSKV__UNLOCK(a); return MSKV_SUCCESS; }
    if (cap < total) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_CAPACITY, "export: need %zu bytes, have %zu", total, cap); }
    if (payload > 0) {
        if (q->location == MSKV_RESIDENT) r = mskv__read_request(a, q, b + hdr);
        else memcpy(b + hdr, q->host, payload);
    }
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return mskv__err(a, r, "export: reading pages failed"); }
    mskv__blob_header_write(a, q, b, total);
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

/* One group's part of a blob header, as read. */
typedef struct mskv__blob_group { uint32_t n, pp, flags; int64_t prefix, live, rp; mskv_retention ret; } mskv__blob_group;

static void mskv__blob_group_read(const unsigned char *b, int32_t g, mskv__blob_group *o) {
    const unsigned char *ret;
    if (g == 0) {
        o->n = mskv__get32(b + 44);
        o->flags = mskv__get32(b + 48) & 4u;
        o->pp = mskv__get32(b + 52);
        o->prefix = (int64_t)mskv__get64(b + 64);
        o->live = (int64_t)mskv__get64(b + 72);
        ret = b + 88;
    } else {
        const unsigned char *p = b + MSKV__BLOB_HEADER + 8 + MSKV__BLOB_GROUP * (size_t)(g - 1);
        o->n = mskv__get32(p);
        o->pp = mskv__get32(p + 4);
        o->flags = mskv__get32(p + 8);
        o->prefix = (int64_t)mskv__get64(p + 16);
        o->live = (int64_t)mskv__get64(p + 24);
        ret = p + 32;
        if (mskv__get32(p + 12) != 0) o->flags |= 0x80000000u;   /* reserved field: must be 0 */
    }
    mskv__get_retention(ret, &o->ret);
    /* a retention its flags leave unused was written as zero: anything else
       is not our blob (and was never validated, whatever arithmetic it would feed) */
    if (!(o->flags & 4u) && !mskv__all_zero(ret, 32)) o->flags |= 0x80000000u;
}

/* A group's state is one this library could have written (a valid checksum
   over nonsense is still nonsense). */
static int mskv__blob_group_ok(const mskv_arena *a, const mskv__blob_group *x, int64_t committed, uint32_t flags) {
    mskv__tab probe;
    if (x->prefix < 0 || x->prefix > committed || x->live < 0 || x->live % a->P != 0 ||
        x->pp != (uint32_t)mskv__ceil_div(x->prefix, a->P) || x->live < (int64_t)x->pp * a->P ||
        (x->live > (int64_t)x->pp * a->P && x->live > committed) /* released past the committed tokens */ ||
        (x->flags & ~4u) != 0 ||
        ((flags & 1u) && ((x->flags & 4u) || x->prefix != 0 || x->live != 0)) /* keyed entries are never protected or released */ ||
        ((x->flags & 4u) && mskv__retention_check(&x->ret, a->P, NULL, 0) != MSKV_SUCCESS))
        return 0;
    memset(&probe, 0, sizeof probe);
    probe.prefix_pages = (int32_t)x->pp;
    probe.prefix_tokens = x->prefix;
    probe.live_start = x->live;
    probe.release_point = x->rp;
    if (!mskv__release_point_ok(a, &probe, committed) || ((flags & 1u) && x->rp != 0)) return 0;
    return (uint32_t)mskv__entries_for(a, &probe, committed) == x->n;
}

/* A blob header as read and checked. */
typedef struct mskv__blob_info {
    uint32_t flags;
    int64_t committed, published;
    uint64_t key, total;
    int64_t pos_shift;
    size_t hdr, payload;
    mskv__blob_group grp[MSKV_MAX_GROUPS];
} mskv__blob_info;

/* Everything a blob's header says, checked against the arena and itself
   (not the checksum, which needs the payload): avail bytes are at b, at
   least the 128 of a version 1 header and the magic checked. */
static mskv_result mskv__blob_header_check(mskv_arena *a, const unsigned char *b, size_t avail, const char *what, mskv__blob_info *o) {
    uint32_t version = mskv__blob_layout_version(mskv__get32(b + 8)), hdr = mskv__get32(b + 12);
    size_t sum = 0;
    int32_t g, blob_groups = 1;
    const unsigned char *pos_at;
    o->total = mskv__get64(b + 16);
    if (version == MSKV__BLOB_VERSION_GROUPS || version == MSKV__BLOB_VERSION_POSITIONS) {
        uint32_t ng = avail >= MSKV__BLOB_HEADER + 8 ? mskv__get32(b + MSKV__BLOB_HEADER) : 0;
        uint32_t least = version == MSKV__BLOB_VERSION_GROUPS ? 2u : 1u;
        if (avail < MSKV__BLOB_HEADER + 8) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "%s: the layer-group header is cut short", what);
        if (ng < least || ng > MSKV_MAX_GROUPS || mskv__get32(b + MSKV__BLOB_HEADER + 4) != 0 ||
            hdr != mskv__blob_header_v((int32_t)ng, version) || o->total < (uint64_t)hdr + 8)
            return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "%s: inconsistent layer-group header", what);
        if (avail < hdr) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "%s: %zu header bytes, the header has %u", what, avail, (unsigned)hdr);
        blob_groups = (int32_t)ng;
    } else if (version != MSKV__BLOB_VERSION || hdr != MSKV__BLOB_HEADER) {
        return mskv__err(a, MSKV_ERROR_BLOB_VERSION, "%s: blob version %u, this library reads %u to %u", what, (unsigned)mskv__get32(b + 8),
                         MSKV__BLOB_VERSION, MSKV__BLOB_VERSION_MAX);
    }
    o->hdr = mskv__blob_header_v(blob_groups, version);
    if (mskv__get32(b + 24) != (uint32_t)a->P || mskv__get32(b + 28) != (uint32_t)a->store.num_layers ||
        mskv__get32(b + 32) != (uint32_t)a->store.kv_heads || mskv__get32(b + 36) != (uint32_t)a->store.head_dim ||
        mskv__get32(b + 40) != (uint32_t)(a->store.num_layers ? a->store.dtype : 0) || blob_groups != a->G)
        return mskv__err(a, MSKV_ERROR_BLOB_MISMATCH, "%s: page size/layers/heads/dim/dtype/layer groups differ from the arena", what);
    o->flags = mskv__get32(b + 48);
    o->committed = (int64_t)mskv__get64(b + 56);
    o->published = (int64_t)mskv__get64(b + 80);
    o->key = mskv__get64(b + 120);
    if (o->committed < 0 || o->committed > INT32_MAX || o->published < 0 || o->published > o->committed ||
        (o->flags & ~7u) != 0 || (o->flags & 1u) != ((o->flags >> 1) & 1u) /* only sealed keyed entries export */)
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "%s: inconsistent header", what);
    if (!(o->flags & 1u) && !mskv__all_zero(b + 120, 8))   /* the key of a request that is not keyed was written as zero */
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "%s: a field its flags leave unused is not zero", what);
    pos_at = b + MSKV__BLOB_HEADER + 8 + MSKV__BLOB_GROUP * (size_t)(blob_groups - 1);
    o->pos_shift = version == MSKV__BLOB_VERSION_POSITIONS ? (int64_t)mskv__get64(pos_at) : 0;
    if (o->pos_shift > INT32_MAX || o->pos_shift < -(int64_t)INT32_MAX || ((o->flags & 1u) && o->pos_shift != 0))
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "%s: position shift out of range", what);
    o->payload = 0;
    for (g = 0; g < a->G; g++) {
        size_t bytes;
        mskv__blob_group *x = &o->grp[g];
        mskv__blob_group_read(b, g, x);
        x->rp = version == MSKV__BLOB_VERSION_POSITIONS ? (int64_t)mskv__get64(pos_at + 8 + 8 * (size_t)g)
              : x->live > (int64_t)x->pp * a->P ? x->live : 0;
        if (!mskv__blob_group_ok(a, x, o->committed, o->flags) || !mskv__mul((size_t)x->n, a->record_bytes, &bytes) ||
            !mskv__add(o->payload, bytes, &o->payload))
            return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "%s: inconsistent header (layer group %d)", what, (int)g);
        if (x->flags & 4u) x->ret.window_tokens = x->ret.window_chunks * x->ret.chunk_size; /* bounded by the check */
    }
    if (!mskv__add(o->payload, o->hdr + 8, &sum) || sum != o->total)
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "%s: page count does not match the size", what);
    return MSKV_SUCCESS;
}

/* The request state a checked header describes (pages and bytes aside). */
static void mskv__blob_apply(mskv_arena *a, mskv__req *q, const mskv__blob_info *x) {
    int32_t g;
    q->committed = x->committed;
    q->published = x->published;
    q->keyed = (uint8_t)(x->flags & 1u);
    q->sealed = (uint8_t)((x->flags >> 1) & 1u);
    q->key = x->key;
    q->pos_shift = x->pos_shift;
    for (g = 0; g < a->G; g++) {
        mskv__tab *t = &q->t[g];
        t->prefix_tokens = x->grp[g].prefix;
        t->prefix_pages = (int32_t)x->grp[g].pp;
        t->live_start = x->grp[g].live;
        t->release_point = x->grp[g].rp;
        t->has_ret = (uint8_t)((x->grp[g].flags >> 2) & 1u);
        if (t->has_ret) t->retention = x->grp[g].ret;
    }
}

MSKV_IMPL mskv_result mskv_request_import(mskv_arena *a, const void *blob, size_t size, mskv_request *out) {
    const unsigned char *b = (const unsigned char *)blob;
    uint64_t total;
    int32_t ri, g;
    mskv__req *q;
    unsigned char *host = NULL;
    mskv__blob_info x;
    mskv_result r;
    uint64_t *sums = NULL;
    if (!a || !blob || !out) return MSKV_ERROR_NULL_POINTER;
    if (size < MSKV__BLOB_HEADER + 8) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "import: %zu bytes is shorter than a header", size);
    if (memcmp(b, "MSKVBLOB", 8) != 0) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: bad magic");
    total = mskv__get64(b + 16);
    if (total > size) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "import: blob says %llu bytes, got %zu", (unsigned long long)total, size);
    if (total < size || total < MSKV__BLOB_HEADER + 8) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: size field %llu does not match %zu", (unsigned long long)total, size);
    if (mskv__blob_checksum(b, size - 8) != mskv__get64(b + size - 8)) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: checksum mismatch");
    r = mskv__blob_header_check(a, b, size, "import", &x);
    if (r != MSKV_SUCCESS) return r;
    MSKV__LOCK(a);
    if ((x.flags & 1u) && mskv__find_key(a, x.key) >= 0) {
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_DUPLICATE, "import: key exists");
    }
    if (x.payload > 0) {
        host = (unsigned char *)mskv__alloc(mskv__hal(a), x.payload);
        if (!host) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "import: %zu host bytes", x.payload); }
        memcpy(host, b + x.hdr, x.payload);
        if ((a->debug & MSKV_DEBUG_CHECKSUMS) && !(sums = mskv__sums_of(a, host, (int64_t)(x.payload / a->record_bytes)))) {
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
    q->host_cap = x.payload;
    mskv__blob_apply(a, q, &x);
    for (g = 0; g < a->G; g++) {
        q->t[g].host_pages = (int32_t)x.grp[g].n;
        a->offloaded_pages += x.grp[g].n;
    }
    *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

/* Streamed blobs. A range is one page of one layer of K or V; range k of a
   request lies in the pools (resident or importing) or in its host copy. */
static int64_t mskv__range_count(const mskv_arena *a, const mskv__req *q) {
    return mskv__held_pages(a, q) * 2 * a->store.num_layers;
}

/* The header size of the blob a request exports now. */
static size_t mskv__blob_header_of(const mskv_arena *a, const mskv__req *q) {
    return mskv__blob_header_v(a->G, mskv__blob_version_of(a, q));
}

static void mskv__ranges(mskv_arena *a, const mskv__req *q, int64_t first, int64_t n, mskv_blob_range *out) {
    int64_t per = 2 * (int64_t)a->store.num_layers, k = first, end = first + n, base = 0;
    size_t hdr = mskv__blob_header_of(a, q), pb = a->store.page_bytes;
    int32_t g = 0;
    int res = q->location == MSKV_RESIDENT;
    for (; k < end; k++) {
        mskv_blob_range *o = &out[k - first];
        int64_t in_group, entry;
        int32_t pool;
        while ((k - base) >= (int64_t)(res ? q->t[g].num_pages : q->t[g].host_pages) * per) {
            base += (int64_t)(res ? q->t[g].num_pages : q->t[g].host_pages) * per;
            g++;
        }
        in_group = k - base;
        entry = in_group / per;
        pool = (int32_t)(in_group % per);
        o->bytes = pb;
        o->offset = (uint64_t)hdr + (uint64_t)k * pb;
        o->group = g;
        o->layer = pool / 2;
        o->kind = pool % 2;
        if (res) {
            o->page = q->t[g].pages[entry];
            o->data = a->pools[pool] + (size_t)o->page * pb;
        } else {
            o->page = 0;
            o->data = q->host + (size_t)k * pb;
        }
    }
}

/* The checksum of a streamed blob: its header, then every range in order;
   the hash its header's version says (XXH64 from version 4). */
static uint64_t mskv__stream_checksum(mskv_arena *a, const mskv__req *q, const unsigned char *header, size_t hdr) {
    mskv_blob_range rg[64];
    int64_t k, n = mskv__range_count(a, q);
    uint32_t v = mskv__get32(header + 8);
    if (v >= 1 && v <= 3) {
        mskv__hash h;
        mskv__hash_init(&h);
        mskv__hash_update(&h, header, hdr);
        for (k = 0; k < n; k += 64) {
            int64_t i, m = n - k < 64 ? n - k : 64;
            mskv__ranges(a, q, k, m, rg);
            for (i = 0; i < m; i++) mskv__hash_update(&h, rg[i].data, rg[i].bytes);
        }
        return mskv__hash_final(&h);
    } else {
        mskv__xxh h;
        mskv__xxh_init(&h, 0);
        mskv__xxh_update(&h, header, hdr);
        for (k = 0; k < n; k += 64) {
            int64_t i, m = n - k < 64 ? n - k : 64;
            mskv__ranges(a, q, k, m, rg);
            for (i = 0; i < m; i++) mskv__xxh_update(&h, rg[i].data, rg[i].bytes);
        }
        return mskv__xxh_digest(&h);
    }
}

static void mskv__layout(const mskv_arena *a, const mskv__req *q, size_t total, mskv_blob_layout *o) {
    o->header_bytes = mskv__blob_header_of(a, q);
    o->blob_bytes = total;
    o->range_count = mskv__range_count(a, q);
    o->range_bytes = a->store.page_bytes;
    o->checksum = 0;
}

/* export_begin; sum 0 leaves layout->checksum 0 instead of hashing every
   byte first (mstar_kv_ucx.h hashes each message as it goes out). */
static mskv_result mskv__export_begin(mskv_arena *a, mskv_request h, void *header, size_t cap, mskv_blob_layout *layout, int sum) {
    int32_t ri;
    int64_t bad;
    mskv__req *q;
    size_t payload = 0, total = 0, hdr;
    mskv_result r = MSKV_SUCCESS;
    if (!a || !header || !layout) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    hdr = mskv__blob_header_of(a, q);
    if (a->desc.store_ops) r = mskv__err(a, MSKV_ERROR_UNSUPPORTED, "export_begin: the pages live behind store_ops (use mskv_request_export)");
    else if (q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "export_begin: commit or abort first");
    else if (q->scratch_cap) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "export_begin: a scratch entry is rewritten every step (never exported)");
    else if (q->xfer) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "export_begin: an export of this request is open");
    else if (q->lock) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "export_begin: a lockstep member (dissolve the group first)");
    else if (q->location == MSKV_OFFLOADED && q->sums && (bad = mskv__sums_bad(a, q)) >= 0)   /* as export: never sign changed bytes */
        r = mskv__err(a, MSKV_ERROR_HOST_COPY_CORRUPT, "export_begin: page %lld of the host copy changed since it was made", (long long)bad);
    else if (!mskv__mul((size_t)mskv__held_pages(a, q), a->record_bytes, &payload) || !mskv__add(payload, hdr + 8, &total))
        r = MSKV_ERROR_OVERFLOW;
    else if (cap < hdr) r = mskv__err(a, MSKV_ERROR_CAPACITY, "export_begin: the header needs %zu bytes, have %zu", hdr, cap);
    if (r == MSKV_SUCCESS) {
        mskv__blob_header_write(a, q, (unsigned char *)header, total);
        mskv__layout(a, q, total, layout);
        if (sum) layout->checksum = mskv__stream_checksum(a, q, (const unsigned char *)header, hdr);
        q->xfer = MSKV__XFER_EXPORT;
    }
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_request_export_begin(mskv_arena *a, mskv_request h, void *header, size_t cap, mskv_blob_layout *layout) {
    return mskv__export_begin(a, h, header, cap, layout, 1);
}

MSKV_IMPL mskv_result mskv_request_export_end(mskv_arena *a, mskv_request h) {
    int32_t ri;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    if (a->reqs[ri].xfer != MSKV__XFER_EXPORT) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "export_end: no export is open");
    else a->reqs[ri].xfer = 0;
    MSKV__UNLOCK(a);
    return r;
}

/* Ranges first, first + stride, ... (n of them) of an open export or
   import; stride 1 is mskv_request_blob_ranges. The streamed transfer's
   messages take one pool's pages in a run (stride = 2 * layers). */
static mskv_result mskv__blob_ranges_strided(mskv_arena *a, mskv_request h, int64_t first, int64_t stride, int64_t n, mskv_blob_range *out) {
    int32_t ri;
    const mskv__req *q;
    int64_t i, count;
    mskv_result r = MSKV_SUCCESS;
    if (!a || (!out && n > 0)) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_ANY(a, h, ri);
    q = &a->reqs[ri];
    count = mskv__range_count(a, q);
    if (!q->xfer) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "blob_ranges: the request is neither being exported nor imported");
    else if (stride == 1 && (first < 0 || n < 0 || first > count - n))
        r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "blob_ranges: [%lld, +%lld) is not within %lld ranges", (long long)first, (long long)n,
                      (long long)count);
    else if (stride < 1 || first < 0 || n < 0 || (n == 0 ? first > count : first >= count || (count - 1 - first) / stride < n - 1))
        r = mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "blob_ranges: %lld ranges from %lld in steps of %lld are not within %lld ranges", (long long)n,
                      (long long)first, (long long)stride, (long long)count);
    else if (stride == 1)
        mskv__ranges(a, q, first, n, out);
    else
        for (i = 0; i < n; i++) mskv__ranges(a, q, first + i * stride, 1, out + i);
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_request_blob_ranges(mskv_arena *a, mskv_request h, int64_t first, int64_t n, mskv_blob_range *out) {
    return mskv__blob_ranges_strided(a, h, first, 1, n, out);
}

MSKV_IMPL mskv_result mskv_request_import_begin(mskv_arena *a, const void *header, size_t header_size, mskv_request *out,
                                                mskv_blob_layout *layout) {
    const unsigned char *b = (const unsigned char *)header;
    mskv__blob_info x;
    int64_t need = 0;
    int32_t ri, g;
    mskv__req *q;
    mskv_result r;
    if (!a || !header || !out || !layout) return MSKV_ERROR_NULL_POINTER;
    if (a->desc.store_ops) return mskv__err(a, MSKV_ERROR_UNSUPPORTED, "import_begin: the pages live behind store_ops (use mskv_request_import)");
    if (header_size < MSKV__BLOB_HEADER) return mskv__err(a, MSKV_ERROR_BLOB_TRUNCATED, "import_begin: %zu bytes is shorter than a header", header_size);
    if (memcmp(b, "MSKVBLOB", 8) != 0) return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import_begin: bad magic");
    r = mskv__blob_header_check(a, b, header_size, "import_begin", &x);
    if (r != MSKV_SUCCESS) return r;
    for (g = 0; g < a->G; g++) need += x.grp[g].n;
    MSKV__LOCK(a);
    if ((x.flags & 1u) && mskv__find_key(a, x.key) >= 0) r = mskv__err(a, MSKV_ERROR_DUPLICATE, "import_begin: key exists");
    else if (need > a->free_top)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "import_begin: need %lld pages, %d free (%d pending)", (long long)need, (int)a->free_top,
                      (int)a->pend_count);
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    ri = mskv__new_req(a);
    if (ri < 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "import_begin: no request slot"); }
    q = &a->reqs[ri];
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++) r = mskv__reserve_table(a, &q->t[g], (int32_t)x.grp[g].n);
    if (r != MSKV_SUCCESS) { mskv__undo_new_req(a, ri); MSKV__UNLOCK(a); return r; }
    for (g = 0; g < a->G; g++) {
        r = mskv__take(a, x.grp[g].n, q->t[g].pages);
        MSKV_ASSERT(r == MSKV_SUCCESS); /* the total was checked above */
        q->t[g].num_pages = (int32_t)x.grp[g].n;
    }
    mskv__blob_apply(a, q, &x);
    q->xfer = MSKV__XFER_IMPORT;
    q->xfer_version = (uint8_t)mskv__get32(b + 8);   /* checked: 1 to 6 */
    MSKV_ASSERT(mskv__blob_header_of(a, q) == x.hdr);
    mskv__layout(a, q, x.hdr + x.payload + 8, layout);
    *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

/* import_commit; verified 1 says the caller checked every byte itself
   (mstar_kv_ucx.h, message by message as they landed): every other check
   is the same, only the pass over the bytes is skipped. */
static mskv_result mskv__import_commit(mskv_arena *a, mskv_request h, uint64_t checksum, int verified) {
    int32_t ri, g;
    mskv__req *q;
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    size_t payload;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_ANY(a, h, ri);
    q = &a->reqs[ri];
    if (q->xfer != MSKV__XFER_IMPORT) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "import_commit: no import is open");
    if (r == MSKV_SUCCESS) {
        /* the header this request exports is the one that arrived: begin checked every field of it */
        payload = (size_t)mskv__held_pages(a, q) * a->record_bytes;
        mskv__blob_header_write(a, q, hdr, mskv__blob_header_of(a, q) + payload + 8);
        if (!verified && mskv__stream_checksum(a, q, hdr, mskv__blob_header_of(a, q)) != checksum)
            r = mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import_commit: checksum mismatch (the import stays open: abort it)");
    }
    if (r == MSKV_SUCCESS) {
        q->xfer = 0;
        q->xfer_version = 0;   /* from now on it exports as mskv_request_import's request would */
        ++a->epoch_counter;
        for (g = 0; g < a->G; g++) q->t[g].epoch = a->epoch_counter;
    }
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_request_import_commit(mskv_arena *a, mskv_request h, uint64_t checksum) {
    return mskv__import_commit(a, h, checksum, 0);
}

MSKV_IMPL mskv_result mskv_request_import_abort(mskv_arena *a, mskv_request h) {
    int32_t ri, g;
    mskv__req *q;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_ANY(a, h, ri);
    q = &a->reqs[ri];
    if (q->xfer != MSKV__XFER_IMPORT) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_BAD_STATE, "import_abort: no import is open"); }
    for (g = a->G - 1; g >= 0; g--) {   /* the free stack exactly as before begin */
        mskv__untake(a, q->t[g].num_pages, q->t[g].pages);
        q->t[g].num_pages = 0;
    }
    q->xfer = 0;
    q->xfer_version = 0;
    mskv__undo_new_req(a, ri);
    q->gen = (uint16_t)(q->gen + 1);    /* the import's handle is stale */
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

MSKV_IMPL mskv_result mskv_request_set_retention_in_group(mskv_arena *a, mskv_request h, int32_t g, const mskv_retention *r) {
    int32_t ri;
    mskv_result res = MSKV_SUCCESS;
    char why[160];
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    if (a->reqs[ri].keyed) res = mskv__err(a, MSKV_ERROR_READ_ONLY, "retention: keyed entries are never released");
    else if (a->reqs[ri].xfer) res = mskv__err(a, MSKV_ERROR_BAD_STATE, "retention: the request is being exported (its header says the policy)");
    else if (r && (res = mskv__retention_check(r, a->P, why, sizeof why)) != MSKV_SUCCESS)
        res = mskv__err(a, res, "retention: %s", why);
    if (res == MSKV_SUCCESS) {
        mskv__tab *t = &a->reqs[ri].t[g];
        t->has_ret = r != NULL;
        if (r) {
            t->retention = *r;
            t->retention.window_tokens = r->window_chunks * r->chunk_size;
        } else {
            memset(&t->retention, 0, sizeof(mskv_retention));
        }
    }
    MSKV__UNLOCK(a);
    return res;
}
MSKV_IMPL mskv_result mskv_request_set_retention(mskv_arena *a, mskv_request h, const mskv_retention *r) {
    return mskv_request_set_retention_in_group(a, h, 0, r);
}

/* // >>step lifecycle (implementation) ----------------------------------- */

/* The argument checks every batch call starts with. */
#define MSKV__CHECK_SEGS(a, segs, n)                              \
    do {                                                          \
        if (!(a)) return MSKV_ERROR_NULL_POINTER;                 \
        if ((n) < 0) return MSKV_ERROR_INVALID_ARGUMENT;          \
        if ((n) > 0 && !(segs)) return MSKV_ERROR_NULL_POINTER;   \
    } while (0)

static void mskv__unmark(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i, ri;
    for (i = 0; i < n; i++)
        if ((ri = mskv__lookup(a, segs[i].request)) >= 0) a->reqs[ri].mark = 0;
}

/* Mark every segment's request, each handle resolved once into a->seg_ri
   (at most max_req distinct requests pass: the one after is unknown or a
   repeat); rejects unknown handles and duplicates, and then leaves no mark. */
static mskv_result mskv__mark(mskv_arena *a, const mskv_segment *segs, int32_t n, const char *what) {
    int32_t i, ri;
    mskv_result r = MSKV_SUCCESS;
    for (i = 0; i < n; i++) {
        ri = mskv__lookup(a, segs[i].request);
        if (ri < 0) { r = mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "%s: segment %d has an unknown or removed request", what, (int)i); break; }
        if (a->reqs[ri].mark) { r = mskv__err(a, MSKV_ERROR_DUPLICATE, "%s: segment %d repeats a request", what, (int)i); break; }
        a->reqs[ri].mark = 1;
        a->seg_ri[i] = ri;
    }
    if (r != MSKV_SUCCESS)
        for (n = i, i = 0; i < n; i++) a->reqs[a->seg_ri[i]].mark = 0;
    return r;
}

/* Checks every segment's request (unknown handles, duplicates) and, when
   whole, that the batch holds every member of each lockstep group it
   touches. Leaves no mark; on success a->seg_ri[i] is segment i's request
   index (valid until the lock is released or the next resolve). */
static mskv_result mskv__resolve(mskv_arena *a, const mskv_segment *segs, int32_t n, int whole, const char *what) {
    int32_t i, m;
    mskv_result r = mskv__mark(a, segs, n, what);
    if (r != MSKV_SUCCESS) return r;
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        uint8_t x = a->reqs[a->seg_ri[i]].xfer;
        if (x == MSKV__XFER_IMPORT || (x && whole))
            r = mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: segment %d's request is being %s", what, (int)i, x == MSKV__XFER_IMPORT ? "imported" : "exported");
    }
    for (i = 0; whole && a->nls > 0 && r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q = &a->reqs[a->seg_ri[i]];
        if (!q->lock) continue;
        for (m = a->ls[q->lock - 1].first; m >= 0; m = a->reqs[m].lock_next)
            if (!a->reqs[m].mark) {
                r = mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: segment %d's lockstep group is not whole in the batch", what, (int)i);
                break;
            }
    }
    for (i = 0; i < n; i++) a->reqs[a->seg_ri[i]].mark = 0;
    return r;
}

/* admit's checks, and the pages it would take (every group's new entries). */
static mskv_result mskv__admit_need(mskv_arena *a, const mskv_segment *segs, int32_t n, int64_t *need) {
    int32_t i, g;
    mskv_result r = mskv__resolve(a, segs, n, 1, "admit");
    *need = 0;
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q = &a->reqs[a->seg_ri[i]];
        if (segs[i].n_tokens < 0) r = mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "admit: segment %d has %lld tokens", (int)i, (long long)segs[i].n_tokens);
        else if (q->location != MSKV_RESIDENT) r = mskv__err(a, MSKV_ERROR_OFFLOADED, "admit: segment %d's request is offloaded", (int)i);
        else if (q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "admit: segment %d's request already has a reservation", (int)i);
        else if (q->keyed && !q->scratch_cap) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "admit: segment %d is a keyed entry", (int)i);
        else if (q->scratch_cap && segs[i].n_tokens > q->scratch_cap - q->committed)
            r = mskv__err(a, MSKV_ERROR_CAPACITY, "admit: segment %d: %lld more tokens pass the scratch entry's %lld (mskv_scratch_reset)", (int)i,
                          (long long)segs[i].n_tokens, (long long)q->scratch_cap);
        else if (q->paused) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "admit: segment %d's request is paused", (int)i);
        else if (segs[i].n_tokens > (int64_t)INT32_MAX - a->P - q->committed)
            r = mskv__err(a, MSKV_ERROR_OVERFLOW, "admit: segment %d would pass 2^31 tokens", (int)i);
        else
            for (g = 0; g < a->G; g++) *need += mskv__entries_for(a, &q->t[g], q->committed + segs[i].n_tokens) - q->t[g].num_pages;
    }
    return r;
}

MSKV_IMPL mskv_result mskv_admit_query(mskv_arena *a, const mskv_segment *segs, int32_t n, int64_t *pages) {
    mskv_result r;
    int64_t need = 0;
    MSKV__CHECK_SEGS(a, segs, n);
    if (!pages) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    r = mskv__admit_need(a, segs, n, &need);
    if (r == MSKV_SUCCESS) *pages = need;
    MSKV__UNLOCK(a);
    return r;
}

/* admit of one segment under the lock (the one-page decode step): the
   checks of mskv__resolve and mskv__admit_need in their order and with their
   messages, the handle looked up once and nothing marked (one request cannot
   repeat; its lockstep group is whole only without other members). */
static mskv_result mskv__admit_one(mskv_arena *a, const mskv_segment *seg) {
    int32_t ri = mskv__lookup(a, seg->request), g, m, ent[MSKV_MAX_GROUPS];
    int64_t need = 0, end;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (ri < 0) return mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "%s: segment %d has an unknown or removed request", "admit", 0);
    q = &a->reqs[ri];
    a->seg_ri[0] = ri;
    if (q->xfer)
        return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: segment %d's request is being %s", "admit", 0,
                         q->xfer == MSKV__XFER_IMPORT ? "imported" : "exported");
    if (a->nls > 0 && q->lock)
        for (m = a->ls[q->lock - 1].first; m >= 0; m = a->reqs[m].lock_next)
            if (m != ri) return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: segment %d's lockstep group is not whole in the batch", "admit", 0);
    if (seg->n_tokens < 0) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "admit: segment %d has %lld tokens", 0, (long long)seg->n_tokens);
    if (q->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "admit: segment %d's request is offloaded", 0);
    if (q->has_res) return mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "admit: segment %d's request already has a reservation", 0);
    if (q->keyed && !q->scratch_cap) return mskv__err(a, MSKV_ERROR_READ_ONLY, "admit: segment %d is a keyed entry", 0);
    if (q->scratch_cap && seg->n_tokens > q->scratch_cap - q->committed)
        return mskv__err(a, MSKV_ERROR_CAPACITY, "admit: segment %d: %lld more tokens pass the scratch entry's %lld (mskv_scratch_reset)", 0,
                         (long long)seg->n_tokens, (long long)q->scratch_cap);
    if (q->paused) return mskv__err(a, MSKV_ERROR_BAD_STATE, "admit: segment %d's request is paused", 0);
    if (seg->n_tokens > (int64_t)INT32_MAX - a->P - q->committed)
        return mskv__err(a, MSKV_ERROR_OVERFLOW, "admit: segment %d would pass 2^31 tokens", 0);
    end = q->committed + seg->n_tokens;
    /* each group's entry count once; room in the tables before any page (growing changes no state) */
    for (g = 0; g < a->G; g++) {
        ent[g] = mskv__entries_for(a, &q->t[g], end);
        need += ent[g] - q->t[g].num_pages;
    }
    if (need > a->free_top)
        return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "admit: need %lld pages, %d free (%d pending)", (long long)need, (int)a->free_top, (int)a->pend_count);
    for (g = 0; g < a->G; g++)
        if ((int64_t)q->t[g].head + ent[g] > q->t[g].cap_pages && (r = mskv__reserve_table(a, &q->t[g], ent[g])) != MSKV_SUCCESS) return r;
    a->admits++;
    for (g = 0; g < a->G; g++) {
        mskv__tab *t = &q->t[g];
        int32_t add = ent[g] - t->num_pages;
        if (add > 0) mskv__take_checked(a, add, t->pages + t->num_pages);   /* the total was checked above */
        t->num_pages += add;
    }
    q->reserved = seg->n_tokens;
    q->has_res = 1;
    q->last_admit = a->admits;
    return MSKV_SUCCESS;
}

/* admit under the lock: every check, then the pages (all or nothing). */
static mskv_result mskv__admit_locked(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i, g;
    int64_t need = 0;
    mskv_result r;
    if (n == 1) return mskv__admit_one(a, segs);
    r = mskv__admit_need(a, segs, n, &need);
    if (r == MSKV_SUCCESS && need > a->free_top)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "admit: need %lld pages, %d free (%d pending)", (long long)need, (int)a->free_top, (int)a->pend_count);
    /* grow tables first: growing changes no state, and cannot fail half-way through pages */
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        mskv__req *q = &a->reqs[a->seg_ri[i]];
        for (g = 0; r == MSKV_SUCCESS && g < a->G; g++)
            r = mskv__reserve_table(a, &q->t[g], mskv__entries_for(a, &q->t[g], q->committed + segs[i].n_tokens));
    }
    if (r == MSKV_SUCCESS && n > 0) a->admits++;
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        mskv__req *q = &a->reqs[a->seg_ri[i]];
        for (g = 0; g < a->G; g++) {
            mskv__tab *t = &q->t[g];
            int32_t add = mskv__entries_for(a, t, q->committed + segs[i].n_tokens) - t->num_pages;
            if (add > 0) r = mskv__take(a, add, t->pages + t->num_pages);
            MSKV_ASSERT(r == MSKV_SUCCESS); /* the total was checked above */
            t->num_pages += add;
        }
        q->reserved = segs[i].n_tokens;
        q->has_res = 1;
        q->last_admit = a->admits;
    }
    return r;
}

MSKV_IMPL mskv_result mskv_admit(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__admit_locked(a, segs, n);
    MSKV__UNLOCK(a);
    return r;
}

static mskv_result mskv__check_open_one(mskv_arena *a, const mskv_segment *seg, const char *what);
static mskv_result mskv__check_open(mskv_arena *a, const mskv_segment *segs, int32_t n, const char *what) {
    int32_t i;
    mskv_result r;
    if (n == 1) return mskv__check_open_one(a, segs, what);
    r = mskv__resolve(a, segs, n, 1, what);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q = &a->reqs[a->seg_ri[i]];
        if (!q->has_res) r = mskv__err(a, MSKV_ERROR_NO_RESERVATION, "%s: segment %d's request has no reservation", what, (int)i);
        else if (q->keyed && !q->scratch_cap) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "%s: segment %d is a keyed entry (use mskv_keyed_seal)", what, (int)i);
    }
    return r;
}

/* mskv__check_open of one segment: the checks of mskv__resolve and then its
   own, in their order and with their messages, the handle looked up once and
   nothing marked (as in mskv__admit_one). */
static mskv_result mskv__check_open_one(mskv_arena *a, const mskv_segment *seg, const char *what) {
    int32_t ri = mskv__lookup(a, seg->request), m;
    const mskv__req *q;
    if (ri < 0) return mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "%s: segment %d has an unknown or removed request", what, 0);
    q = &a->reqs[ri];
    a->seg_ri[0] = ri;
    if (q->xfer)
        return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: segment %d's request is being %s", what, 0,
                         q->xfer == MSKV__XFER_IMPORT ? "imported" : "exported");
    if (a->nls > 0 && q->lock)
        for (m = a->ls[q->lock - 1].first; m >= 0; m = a->reqs[m].lock_next)
            if (m != ri) return mskv__err(a, MSKV_ERROR_BAD_STATE, "%s: segment %d's lockstep group is not whole in the batch", what, 0);
    if (!q->has_res) return mskv__err(a, MSKV_ERROR_NO_RESERVATION, "%s: segment %d's request has no reservation", what, 0);
    if (q->keyed && !q->scratch_cap) return mskv__err(a, MSKV_ERROR_READ_ONLY, "%s: segment %d is a keyed entry (use mskv_keyed_seal)", what, 0);
    return MSKV_SUCCESS;
}

static void mskv__commit_one(mskv__req *q) {
    q->committed += q->reserved;
    q->reserved = 0;
    q->has_res = 0;
    q->pos_shift += q->pos_pending;   /* the custom position advance takes effect after the chunk */
    q->pos_pending = 0;
}

MSKV_IMPL mskv_result mskv_commit(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__check_open(a, segs, n, "commit");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) mskv__commit_one(&a->reqs[a->seg_ri[i]]);
    MSKV__UNLOCK(a);
    return r;
}

/* admit + commit under one lock: admit's checks are commit's too (the
   reservation it makes is open, and a keyed entry without scratch is refused
   by both), so after a successful admit the commits cannot fail. */
MSKV_IMPL mskv_result mskv_step(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__admit_locked(a, segs, n);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) mskv__commit_one(&a->reqs[a->seg_ri[i]]);
    MSKV__UNLOCK(a);
    return r;
}

static void mskv__abort_one(mskv_arena *a, int32_t ri) {
    mskv__req *q = &a->reqs[ri];
    int32_t g;
    for (g = a->G - 1; g >= 0; g--) {
        int32_t keep = mskv__entries_for(a, &q->t[g], q->committed);
        mskv__drop_pages(a, ri, g, keep, q->t[g].num_pages - keep);
    }
    q->reserved = 0;
    q->has_res = 0;
    q->pos_pending = 0;   /* a shift asked for during the chunk goes with it */
}

MSKV_IMPL mskv_result mskv_abort(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i;
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__check_open(a, segs, n, "abort");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) mskv__abort_one(a, a->seg_ri[i]);
    MSKV__UNLOCK(a);
    return r;
}

/* Apply group g's retention policy: protect the sink once complete, release what left the window. */
static void mskv__apply_retention(mskv_arena *a, int32_t ri, int32_t g) {
    mskv__req *q = &a->reqs[ri];
    mskv__tab *t = &q->t[g];
    const mskv_retention *rt = &t->retention;
    int64_t sink = rt->sink_chunks * rt->chunk_size, keep_from, live, skip = 0;
    if (q->committed >= sink && t->prefix_tokens < sink && t->live_start <= (int64_t)t->prefix_pages * a->P)
        (void)mskv__protect(a, ri, g, sink);
    if (t->prefix_tokens < sink) return; /* the sink is not complete (or not protectable): nothing may go yet */
    if (mskv_skipped_tokens_get(rt, q->committed, &skip) != MSKV_SUCCESS) return; /* validated when bound: cannot happen */
    keep_from = sink + skip;
    if (keep_from > q->committed) keep_from = q->committed;
    live = q->committed - t->live_start;
    if (keep_from > t->live_start && live > 0) {
        (void)mskv__release_to(a, ri, g, keep_from);
    } else if (keep_from > t->prefix_tokens && keep_from > t->release_point) {
        /* The window starts at or before the first live page, behind a sink that
           ends mid-page: no page can go, but the tokens between the sink's end
           and the window's start left the window all the same. */
        t->release_point = keep_from;
    }
}

/* What publish checks; nothing it does after them can fail. */
static mskv_result mskv__check_publish(mskv_arena *a, const mskv_segment *segs, int32_t n) {
    int32_t i;
    mskv_result r = mskv__resolve(a, segs, n, 1, "publish");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++)
        if (a->reqs[mskv__lookup(a, segs[i].request)].location != MSKV_RESIDENT)
            r = mskv__err(a, MSKV_ERROR_OFFLOADED, "publish: segment %d's request is offloaded", (int)i);
    return r;
}

/* Publish a checked batch (r: mskv__check_publish's verdict; returned). */
static mskv_result mskv__publish_checked(mskv_arena *a, const mskv_segment *segs, int32_t n, uint64_t *step_out, mskv_result r) {
    int32_t i, g;
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        int32_t ri = mskv__lookup(a, segs[i].request);
        mskv__req *q = &a->reqs[ri];
        int64_t pg;
        /* pages that filled with committed tokens since the last publish, in every group */
        for (g = 0; g < a->G && a->desc.on_event; g++)
            for (pg = q->published / a->P; (pg + 1) * a->P <= q->committed; pg++) {
                int64_t j = 0;
                if ((pg + 1) * a->P <= q->published) continue;
                if (mskv__compact_index(a, q, &q->t[g], pg * a->P, &j) == MSKV_SUCCESS)
                    mskv__emit(a, MSKV_EVENT_PAGE_STORED, ri, g, q->t[g].pages[j / a->P], pg * a->P);
            }
        q->published = q->committed;
        for (g = 0; g < a->G; g++)
            if (q->t[g].has_ret) mskv__apply_retention(a, ri, g);
    }
    if (r == MSKV_SUCCESS) {
        if (step_out) *step_out = a->step;
        a->step++;
        if (a->desc.retire_mode == MSKV_RETIRE_IMMEDIATE) a->completed = a->step - 1;
    }
    return r;
}

MSKV_IMPL mskv_result mskv_publish(mskv_arena *a, const mskv_segment *segs, int32_t n, uint64_t *step_out) {
    mskv_result r;
    MSKV__CHECK_SEGS(a, segs, n);
    MSKV__LOCK(a);
    r = mskv__publish_checked(a, segs, n, step_out, mskv__check_publish(a, segs, n));
    MSKV__UNLOCK(a);
    return r;
}

/* Plans */

/* floor(x / d) for d >= 1 and every int64 x */
static int64_t mskv__floordiv(int64_t x, int64_t d) {
    int64_t q = x / d;
    return x % d != 0 && x < 0 ? q - 1 : q;
}

/* Absolute position of compacted index j of a request's stream in group table t. */
static int64_t mskv__abs_pos(const mskv_arena *a, const mskv__tab *t, int64_t j) {
    int64_t split = (int64_t)t->prefix_pages * a->P;
    return j < split ? j : j + (t->live_start - split);
}

/* A derived RoPE position (pos = absolute + the request's pos_shift) minus
   pos_offset must be exact: OVERFLOW when that does not fit in 64 bits,
   OUT_OF_RANGE when the 1-D position or the 3-D frame does not fit in int32
   (rows and columns always do). */
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

/* Segment b's visibility bounds (see mskv_plan): from the desc's mode, then
   the protected prefix taken out (exclude_prefix), in the canonical form:
   (0, 0) when nothing is hidden. q is the segment's request (NULL for a
   DENSE plan); only a SELF plan's keys are the request's own stream. */
static mskv_result mskv__plan_bounds(mskv_arena *a, const mskv_plan_desc *d, const mskv__req *q, int32_t b,
                                     int64_t *sink_end, int64_t *window_start) {
    const mskv__tab *t = q ? &q->t[d->group] : NULL;
    int64_t se = 0, ws = 0;
    if (d->visibility == MSKV_VIS_CALLER) {
        se = d->vis_sink_end[b];
        ws = d->vis_window_start[b];
        if (se < 0 || se > INT32_MAX || ws < 0 || ws > INT32_MAX)
            return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: segment %d: visibility bounds %lld, %lld outside [0, 2^31)", (int)b,
                             (long long)se, (long long)ws);
    } else if (d->visibility == MSKV_VIS_EXACT && d->kind == MSKV_PLAN_SELF) {
        se = t->prefix_tokens;   /* a keyed entry, a prefix or a dense sequence has released nothing */
        ws = t->release_point;
        /* bounds only where they hide a token the pages hold: none when the sink
           fills its last page and the release point is a page boundary */
        if (se == (int64_t)t->prefix_pages * a->P && ws <= t->live_start) se = ws = 0;
    }
    if (ws <= se) se = ws = 0;
    if (d->exclude_prefix && t->prefix_tokens > 0) {
        if (ws == 0) {
            ws = t->prefix_tokens;
        } else if (se <= t->prefix_tokens) {
            se = 0;
            ws = ws > t->prefix_tokens ? ws : t->prefix_tokens;
        } else {
            return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: segment %d: exclude_prefix: the visible sink (to %lld) reaches past "
                             "the prefix (%lld) before hidden tokens", (int)b, (long long)se, (long long)t->prefix_tokens);
        }
    }
    *sink_end = se;
    *window_start = ws;
    return MSKV_SUCCESS;
}

/* The desc's own checks, before any segment is looked at. */
static mskv_result mskv__plan_desc_check(mskv_arena *a, int32_t n, const mskv_plan_desc *d) {
    if ((unsigned)d->kind > 3u || (unsigned)d->pos_mode > 2u || (unsigned)d->visibility > 2u)
        return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: bad kind, pos_mode or visibility");
    if (d->pos_mode == MSKV_POS_3D && (d->grid_h < 1 || d->grid_w < 1)) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: 3-D positions need grid_h, grid_w >= 1");
    if (d->group < 0 || d->group >= a->G) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: layer group %d is not in [0, %d)", (int)d->group, (int)a->G);
    if (d->positions && d->pos_mode == MSKV_POS_NONE) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: explicit positions need pos_mode 1-D or 3-D");
    if (d->exclude_prefix && d->kind != MSKV_PLAN_SELF) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: exclude_prefix is for SELF plans");
    if (d->kind == MSKV_PLAN_DENSE && n > 0 && !d->dense_kv_len) return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: dense_kv_len");
    if (d->visibility == MSKV_VIS_CALLER && n > 0 && (!d->vis_sink_end || !d->vis_window_start))
        return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: MSKV_VIS_CALLER needs vis_sink_end and vis_window_start");
    return MSKV_SUCCESS;
}

/* The padding segment k of a plan of real_b segments padded to d's shape:
   its share of the extra queries (spread evenly, the first ones one more). */
static int32_t mskv__plan_pad_share(const mskv_plan_desc *d, int32_t real_b, int32_t real_q, int32_t k) {
    int32_t segs = d->pad_batch - real_b, extra = (d->pad_tokens ? d->pad_tokens : real_q) - real_q;
    return extra / segs + (k < extra % segs ? 1 : 0);
}

/* The step's sizes grown to the padded shape (mskv_plan_desc.pad_*), or
   CAPACITY when the step does not fit it. */
static mskv_result mskv__plan_pad_sizes(mskv_arena *a, const mskv_plan_desc *d, mskv_plan_size *sz) {
    int32_t segs, extra;
    if (d->pad_batch < 0 || d->pad_tokens < 0 || d->pad_qo_len < 0 || d->pad_kv_len < 0)
        return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: negative padding");
    if ((d->pad_batch && sz->batch > d->pad_batch) || (d->pad_tokens && sz->total_q > d->pad_tokens))
        return mskv__err(a, MSKV_ERROR_CAPACITY, "plan: the step (batch %d, %d queries) is larger than the padded shape "
                         "(batch %d, %d queries): capture again", (int)sz->batch, (int)sz->total_q, (int)d->pad_batch, (int)d->pad_tokens);
    segs = d->pad_batch ? d->pad_batch - sz->batch : 0;
    extra = d->pad_tokens ? d->pad_tokens - sz->total_q : 0;
    if (extra > 0 && segs == 0)
        return mskv__err(a, MSKV_ERROR_CAPACITY, "plan: %d padding queries and no padding segment: capture again, with "
                         "pad_batch above the largest batch", (int)extra);
    sz->batch += segs;
    sz->total_q += extra;
    return MSKV_SUCCESS;
}

/* Every check of a build, and the sizes: nothing is written before it passes. */
static mskv_result mskv__plan_sizes(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan_desc *d,
                                    mskv_plan_size *sz, int32_t *cross_ri) {
    int32_t i, ri;
    int64_t tq = 0, ids = 0;
    mskv_result r = mskv__plan_desc_check(a, n, d);
    const mskv__req *x = NULL;
    if (r != MSKV_SUCCESS) return r;
    if (d->kind == MSKV_PLAN_CROSS) {
        ri = mskv__lookup(a, d->cross);
        if (ri < 0) return mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "plan: unknown cross entry");
        x = &a->reqs[ri];
        if (!x->keyed || !x->sealed) return mskv__err(a, MSKV_ERROR_BAD_STATE, "plan: the cross entry must be a sealed keyed entry");
        if (x->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "plan: the cross entry is offloaded");
        *cross_ri = ri;
    }
    if (d->kind != MSKV_PLAN_DENSE) r = mskv__resolve(a, segs, n, 0, "plan");
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        int64_t nt = segs[i].n_tokens, first, last, se, ws, keys;  /* first, last: the segment's first and last query's positions */
        const mskv__req *q = NULL;
        if (nt < 0) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: segment %d has %lld tokens", (int)i, (long long)nt);
        if (d->kind == MSKV_PLAN_DENSE) {
            if (d->dense_kv_len[i] < 0 || d->dense_kv_len[i] > INT32_MAX) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: dense kv length");
            if (nt > d->dense_kv_len[i])
                return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "plan: segment %d has %lld queries but only %lld tokens", (int)i, (long long)nt, (long long)d->dense_kv_len[i]);
            first = d->dense_kv_len[i] - nt;
            last = d->dense_kv_len[i] - 1;
            keys = d->dense_kv_len[i];
        } else {
            const mskv__tab *t;
            int64_t len;
            q = &a->reqs[mskv__lookup(a, segs[i].request)];
            t = &q->t[d->group];
            len = mskv__kv_len(a, q, t);
            if (q->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "plan: segment %d's request is offloaded", (int)i);
            if (nt > len)
                return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "plan: segment %d has %lld queries but only %lld tokens", (int)i, (long long)nt, (long long)len);
            ids += d->kind == MSKV_PLAN_SELF ? t->num_pages : d->kind == MSKV_PLAN_CROSS ? x->t[d->group].num_pages : 0;
            keys = d->kind == MSKV_PLAN_SELF ? len : d->kind == MSKV_PLAN_CROSS ? mskv__kv_len(a, x, &x->t[d->group]) : t->prefix_tokens;
            first = mskv__abs_pos(a, t, len - nt) + q->pos_shift;
            last = mskv__abs_pos(a, t, len - 1) + q->pos_shift;
        }
        /* derived positions rise along a segment: its two ends bound every entry (the
           last first: an overflow, from a negative offset, shows there) */
        if (nt > 0 && !(d->positions && d->positions[i]) &&
            ((r = mskv__pos_check(a, d, last, i)) != MSKV_SUCCESS || (r = mskv__pos_check(a, d, first, i)) != MSKV_SUCCESS))
            return r;
        if ((r = mskv__plan_bounds(a, d, q, i, &se, &ws)) != MSKV_SUCCESS) return r;
        if ((d->pad_qo_len && nt > d->pad_qo_len) || (d->pad_kv_len && keys > d->pad_kv_len))
            return mskv__err(a, MSKV_ERROR_CAPACITY, "plan: segment %d has %lld queries and %lld keys, past the padded shape's "
                             "%d and %d: capture again", (int)i, (long long)nt, (long long)keys, (int)d->pad_qo_len, (int)d->pad_kv_len);
        tq += nt;
    }
    if (r != MSKV_SUCCESS) return r;
    if (tq > INT32_MAX || ids > INT32_MAX) return mskv__err(a, MSKV_ERROR_OVERFLOW, "plan: more than 2^31 queries or page ids");
    sz->batch = n;
    sz->total_q = (int32_t)tq;
    sz->num_page_ids = (int32_t)ids;
    return mskv__plan_pad_sizes(a, d, sz);
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

/* The arrays a build writes: the required ones, and the optional ones this desc cannot do without. */
static mskv_result mskv__plan_arrays_check(mskv_arena *a, const mskv_plan_desc *d, const mskv_plan_size *sz, const mskv_plan *p) {
    if (!p->qo_indptr || !p->kv_indptr || !p->kv_last_page_len || !p->kv_len || !p->kv_pos_split || !p->kv_pos_shift ||
        !p->kv_token_indptr || (sz->total_q > 0 && !p->slot_mapping) || (sz->num_page_ids > 0 && !p->kv_indices) ||
        (d->pos_mode != MSKV_POS_NONE && sz->total_q > 0 && !p->positions))
        return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: an output array is NULL");
    if (d->kind == MSKV_PLAN_PREFIX && sz->total_q > 0 && !p->q_pos)
        return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: a PREFIX plan needs q_pos (its queries are not the tail of its keys)");
    /* exact visibility (the default) needs the bounds only where they hide something: mskv__plan_bounds_fit */
    if ((d->visibility == MSKV_VIS_CALLER || d->exclude_prefix) && sz->batch > 0 && (!p->vis_sink_end || !p->vis_window_start))
        return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: visibility bounds need vis_sink_end and vis_window_start");
    if (p->cap_batch < sz->batch || p->cap_tokens < sz->total_q || p->cap_page_ids < sz->num_page_ids)
        return mskv__err(a, MSKV_ERROR_CAPACITY, "plan: needs batch %d, tokens %d, page ids %d; capacity %d, %d, %d", (int)sz->batch,
                         (int)sz->total_q, (int)sz->num_page_ids, (int)p->cap_batch, (int)p->cap_tokens, (int)p->cap_page_ids);
    return MSKV_SUCCESS;
}

/* Segment b's keys: its pages (SELF: its own stream; CROSS: the keyed
   entry's) or a dense length (DENSE: the desc's; PREFIX: the request's
   prefix); returns kv_len and sets the position map. */
static int64_t mskv__plan_keys(mskv_arena *a, const mskv_plan_desc *d, const mskv__req *kv, int32_t b, mskv_plan *p,
                               int32_t *id_at) {
    const mskv__tab *kt = kv ? &kv->t[d->group] : NULL;
    int64_t len, split, shift = 0;
    if (d->kind == MSKV_PLAN_SELF || d->kind == MSKV_PLAN_CROSS) {
        len = mskv__kv_len(a, kv, kt);
        split = (int64_t)kt->prefix_pages * a->P;
        shift = kt->live_start - split;
        if (split > len) split = len;
        if (kt->num_pages) memcpy(p->kv_indices + *id_at, kt->pages, (size_t)kt->num_pages * sizeof(int32_t));
        *id_at += kt->num_pages;
        p->kv_last_page_len[b] = kt->num_pages ? (int32_t)(len - (int64_t)(kt->num_pages - 1) * a->P) : 0;
    } else {
        len = d->kind == MSKV_PLAN_PREFIX ? kt->prefix_tokens : d->dense_kv_len[b];
        split = len;
        p->kv_last_page_len[b] = 0;
    }
    p->kv_len[b] = (int32_t)len;
    p->kv_pos_split[b] = (int32_t)split;
    p->kv_pos_shift[b] = (int32_t)shift;
    p->kv_indptr[b + 1] = *id_at;
    p->kv_token_indptr[b + 1] = p->kv_token_indptr[b] + len;
    return len;
}

/* Segment b's queries, rows [q_at, q_at + nq): the tail of its own stream
   (SELF, CROSS, PREFIX) or of the dense sequence of len keys. Slots for its
   reserved tokens (SELF), mask positions, RoPE positions. Returns whether
   q_pos left the tail rule. */
static int mskv__plan_queries(mskv_arena *a, const mskv_plan_desc *d, const mskv__req *q, int32_t b, int32_t q_at, int32_t nq,
                              int64_t len, mskv_plan *p) {
    const mskv__tab *qt = q ? &q->t[d->group] : NULL;
    const int32_t *expl = d->positions ? d->positions[b] : NULL;
    int64_t own_len = q ? mskv__kv_len(a, q, qt) : len, split = p->kv_pos_split[b], shift = p->kv_pos_shift[b];
    int moved = 0;
    int32_t i;
    for (i = 0; i < nq; i++) {
        int64_t j = own_len - nq + i, pos = q ? mskv__abs_pos(a, qt, j) : j, t = len - nq + i;
        /* only reserved tokens get a slot: a committed page may be shared with a fork */
        p->slot_mapping[q_at + i] = d->kind == MSKV_PLAN_SELF && pos >= q->committed
                                        ? (int64_t)qt->pages[j / a->P] * a->P + j % a->P : -1;
        if (p->q_pos) {
            int64_t tail = t < split ? t : t + shift;
            p->q_pos[q_at + i] = (int32_t)(d->kind == MSKV_PLAN_PREFIX ? pos : tail);
            moved |= (int64_t)p->q_pos[q_at + i] != tail;
        }
        if (d->pos_mode == MSKV_POS_NONE) continue;
        if (expl) {
            int32_t k, w = d->pos_mode == MSKV_POS_1D ? 1 : 3;
            for (k = 0; k < w; k++) p->positions[w * (q_at + i) + k] = expl[w * i + k];
            continue;
        }
        /* in the order mskv__pos_check checked, so no partial sum overflows: (absolute
           + pos_shift) - pos_offset (pos_shift - pos_offset alone may pass int64) */
        if (q) pos += q->pos_shift;
        pos -= d->pos_offset;
        if (d->pos_mode == MSKV_POS_1D) {
            p->positions[q_at + i] = (int32_t)pos;
        } else {
            int64_t tpf = (int64_t)d->grid_h * d->grid_w;
            int64_t f = mskv__floordiv(pos, tpf);
            int64_t rem = pos % tpf < 0 ? pos % tpf + tpf : pos % tpf;  /* f * tpf itself may not fit */
            p->positions[3 * (q_at + i) + 0] = (int32_t)f;
            p->positions[3 * (q_at + i) + 1] = (int32_t)(rem / d->grid_w);
            p->positions[3 * (q_at + i) + 2] = (int32_t)(rem % d->grid_w);
        }
    }
    return moved;
}

/* Padding segment b (mskv_plan_desc.pad_batch): nq queries that read no key
   and write no slot, after the segments before it. */
static void mskv__plan_pad_segment(const mskv_plan_desc *d, int32_t b, int32_t nq, mskv_plan *p) {
    int32_t i, k, w = d->pos_mode == MSKV_POS_3D ? 3 : 1, q_at = p->qo_indptr[b];
    p->kv_indptr[b + 1] = p->kv_indptr[b];
    p->kv_token_indptr[b + 1] = p->kv_token_indptr[b];
    p->kv_last_page_len[b] = 0;
    p->kv_len[b] = 0;
    p->kv_pos_split[b] = 0;
    p->kv_pos_shift[b] = 0;
    if (p->vis_sink_end && p->vis_window_start) p->vis_sink_end[b] = p->vis_window_start[b] = 0;
    if (p->requests) p->requests[b].id = 0;   /* no request: mskv_plan_check has nothing to look at */
    for (i = 0; i < nq; i++) {
        p->slot_mapping[q_at + i] = -1;
        if (p->q_pos) p->q_pos[q_at + i] = i - nq;   /* the tail rule over no keys */
        for (k = 0; d->pos_mode != MSKV_POS_NONE && k < w; k++) p->positions[w * (q_at + i) + k] = 0;
    }
    p->qo_indptr[b + 1] = q_at + nq;
}

/* A plan without the bound arrays (caller-owned arrays from before they
   existed) is fine under exact visibility as long as no segment's window
   hides a token its pages still hold; otherwise the plan cannot say what the
   rolling cache would, and the build refuses rather than show evicted keys. */
static mskv_result mskv__plan_bounds_fit(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan_desc *d, const mskv_plan *p) {
    int32_t b;
    if (d->visibility != MSKV_VIS_EXACT || d->kind != MSKV_PLAN_SELF || (p->vis_sink_end && p->vis_window_start)) return MSKV_SUCCESS;
    for (b = 0; b < n; b++) {
        int64_t se = 0, ws = 0;
        (void)mskv__plan_bounds(a, d, &a->reqs[mskv__lookup(a, segs[b].request)], b, &se, &ws);   /* checked by mskv__plan_sizes */
        if (ws > se)
            return mskv__err(a, MSKV_ERROR_NULL_POINTER, "plan: segment %d: the window hides tokens %lld..%lld that its pages still hold; "
                             "give the plan vis_sink_end and vis_window_start (mskv_plan_alloc does), or ask for MSKV_VIS_PAGES",
                             (int)b, (long long)se, (long long)ws - 1);
    }
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_plan_build(mskv_arena *a, const mskv_segment *segs, int32_t n, const mskv_plan_desc *desc, mskv_plan *p) {
    mskv_plan_desc zero;
    mskv_plan_size sz;
    int32_t cross = -1, b, q_at = 0, id_at = 0;
    mskv_result r;
    if (!a || !p) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
    if (!desc) { memset(&zero, 0, sizeof zero); desc = &zero; }
    MSKV__LOCK(a);
    r = mskv__plan_sizes(a, segs, n, desc, &sz, &cross);
    if (r == MSKV_SUCCESS) r = mskv__plan_arrays_check(a, desc, &sz, p);
    if (r == MSKV_SUCCESS) r = mskv__plan_bounds_fit(a, segs, n, desc, p);
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    p->batch = sz.batch;
    p->total_q = sz.total_q;
    p->num_page_ids = sz.num_page_ids;
    p->page_size = a->P;
    p->step = a->step;
    p->features = 0;
    p->generation = desc->kind == MSKV_PLAN_DENSE || desc->kind == MSKV_PLAN_PREFIX ? 0 : a->generation;   /* dense plans read no pages */
    p->cross.id = desc->kind == MSKV_PLAN_CROSS ? desc->cross.id : 0;
    p->group = desc->group;
    if (p->requests && desc->kind != MSKV_PLAN_DENSE)   /* cap_batch entries, checked above */
        for (b = 0; b < n; b++) p->requests[b] = segs[b].request;
    p->qo_indptr[0] = 0;
    p->kv_indptr[0] = 0;
    p->kv_token_indptr[0] = 0;
    for (b = 0; b < n; b++) {
        const mskv__req *q = desc->kind == MSKV_PLAN_DENSE ? NULL : &a->reqs[mskv__lookup(a, segs[b].request)];
        const mskv__req *kv = desc->kind == MSKV_PLAN_CROSS ? &a->reqs[cross] : q;
        int32_t nq = (int32_t)segs[b].n_tokens;
        int64_t len = mskv__plan_keys(a, desc, kv, b, p, &id_at), se = 0, ws = 0;
        (void)mskv__plan_bounds(a, desc, q, b, &se, &ws);   /* checked by mskv__plan_sizes */
        if (p->vis_sink_end && p->vis_window_start) {
            p->vis_sink_end[b] = (int32_t)se;
            p->vis_window_start[b] = (int32_t)ws;
        }
        if (ws > se) p->features |= MSKV_PLAN_VISIBILITY;
        if (mskv__plan_queries(a, desc, q, b, q_at, nq, len, p)) p->features |= MSKV_PLAN_Q_POS;
        q_at += nq;
        p->qo_indptr[b + 1] = q_at;
    }
    for (b = n; b < sz.batch; b++) mskv__plan_pad_segment(desc, b, mskv__plan_pad_share(desc, n, p->qo_indptr[n], b - n), p);
    p->pad_qo_len = desc->pad_qo_len;
    p->pad_kv_len = desc->pad_kv_len;
    p->pad_segments = sz.batch - n;
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
       Elements: (b + 1) + t eights; 2 (b + 1) + ids + 7 b + 4 t fours (the
       requests' handles are 4 bytes). Checked: with a 32-bit size_t they overflow. */
    if (!mskv__add(b + 1, t, &eights) || !mskv__mul(eights, 8, &eights) || !mskv__mul(b, 9, &fours) ||
        !mskv__add(fours, 2, &fours) || !mskv__add(fours, ids, &fours) || !mskv__mul(t, 4, &total) ||
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
    p->vis_sink_end = (int32_t *)(void *)(mem + off); off += b * 4;
    p->vis_window_start = (int32_t *)(void *)(mem + off); off += b * 4;
    p->positions = (int32_t *)(void *)(mem + off); off += t * 4 * 3;
    p->q_pos = (int32_t *)(void *)(mem + off); off += t * 4;
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

/* mskv_plan_validate's checks of the optional arrays against features. */
static mskv_result mskv__plan_validate_extras(const mskv_plan *p, char *why, size_t cap) {
    int32_t b, i;
#define MSKV__BAD(...) do { mskv__why(why, cap, __VA_ARGS__); return MSKV_ERROR_INVALID_ARGUMENT; } while (0)
    if ((p->features & ~(MSKV_PLAN_Q_POS | MSKV_PLAN_VISIBILITY)) != 0) MSKV__BAD("unknown feature bits 0x%x", (unsigned)p->features);
    if (!p->vis_sink_end != !p->vis_window_start) MSKV__BAD("one of vis_sink_end, vis_window_start without the other");
    if ((p->features & MSKV_PLAN_VISIBILITY) && !p->vis_sink_end) MSKV__BAD("MSKV_PLAN_VISIBILITY without bounds");
    if ((p->features & MSKV_PLAN_Q_POS) && !p->q_pos) MSKV__BAD("MSKV_PLAN_Q_POS without q_pos");
    for (b = 0; b < p->batch; b++) {
        int32_t split = p->kv_pos_split ? p->kv_pos_split[b] : p->kv_len[b], shift = p->kv_pos_shift ? p->kv_pos_shift[b] : 0;
        int32_t qo = p->qo_indptr[b + 1] - p->qo_indptr[b];
        if (p->vis_sink_end) {
            int32_t se = p->vis_sink_end[b], ws = p->vis_window_start[b];
            if (se < 0 || ws < 0) MSKV__BAD("negative visibility bound in sequence %d", (int)b);
            if (!(p->features & MSKV_PLAN_VISIBILITY) && ws > se) MSKV__BAD("sequence %d hides keys without MSKV_PLAN_VISIBILITY", (int)b);
        }
        for (i = 0; p->q_pos && !(p->features & MSKV_PLAN_Q_POS) && i < qo; i++) {
            int64_t t = (int64_t)p->kv_len[b] - qo + i;
            if ((int64_t)p->q_pos[p->qo_indptr[b] + i] != (t < split ? t : t + shift))
                MSKV__BAD("q_pos of query %d of sequence %d is not the tail rule without MSKV_PLAN_Q_POS", (int)i, (int)b);
        }
    }
#undef MSKV__BAD
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_plan_validate(const mskv_plan *p, int32_t num_pages, char *why, size_t cap) {
    int32_t b, i, P;
    mskv_result r;
    if (!p) return MSKV_ERROR_NULL_POINTER;
    P = p->page_size;
#define MSKV__BAD(...) do { mskv__why(why, cap, __VA_ARGS__); return MSKV_ERROR_INVALID_ARGUMENT; } while (0)
    if (p->batch < 0 || p->total_q < 0 || p->num_page_ids < 0 || P < 1) MSKV__BAD("negative sizes or page_size < 1");
    if (p->pad_qo_len < 0 || p->pad_kv_len < 0 || p->pad_segments < 0 || p->pad_segments > p->batch)
        MSKV__BAD("negative pad_qo_len or pad_kv_len, or pad_segments outside [0, batch]");
    if (!p->qo_indptr || !p->kv_indptr || !p->kv_last_page_len || !p->kv_len || (p->num_page_ids > 0 && !p->kv_indices))
        MSKV__BAD("a plan array is NULL");
    if (p->qo_indptr[0] != 0 || p->kv_indptr[0] != 0) MSKV__BAD("indptr[0] must be 0");
    for (b = 0; b < p->batch; b++) {
        int64_t np = (int64_t)p->kv_indptr[b + 1] - p->kv_indptr[b];
        int32_t last = p->kv_last_page_len[b];
        if (p->qo_indptr[b + 1] < p->qo_indptr[b]) MSKV__BAD("qo_indptr decreases at %d", (int)b);
        if (np < 0) MSKV__BAD("kv_indptr decreases at %d", (int)b);
        if (p->kv_len[b] < 0) MSKV__BAD("kv_len[%d] is negative", (int)b);
        /* kv_indices holds num_page_ids ids: nothing past them is read */
        if (p->kv_indptr[b + 1] > p->num_page_ids)
            MSKV__BAD("kv_indptr[%d] = %d is past num_page_ids %d", (int)b + 1, (int)p->kv_indptr[b + 1], (int)p->num_page_ids);
        if (np > 0 && (last < 1 || last > P)) MSKV__BAD("kv_last_page_len[%d] = %d outside [1, %d]", (int)b, (int)last, (int)P);
        if (np == 0 && last != 0) MSKV__BAD("kv_last_page_len[%d] = %d for a sequence without pages", (int)b, (int)last);
        if (np > 0 && (int64_t)p->kv_len[b] != (int64_t)(np - 1) * P + last) MSKV__BAD("kv_len[%d] = %d does not match its pages", (int)b, (int)p->kv_len[b]);
        if (np == 0 && p->kv_len[b] > 0 && !p->kv_token_indptr) MSKV__BAD("sequence %d has keys but no pages and no kv_token_indptr", (int)b);
        if (np == 0 && p->kv_len[b] > 0 &&
            (p->kv_token_indptr[b] < 0 || p->kv_token_indptr[b + 1] < p->kv_token_indptr[b] /* then the difference fits */ ||
             p->kv_token_indptr[b + 1] - p->kv_token_indptr[b] != (int64_t)p->kv_len[b]))
            MSKV__BAD("dense sequence %d: kv_token_indptr[%d..%d] is not kv_len apart", (int)b, (int)b, (int)b + 1);
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
    for (b = p->batch - p->pad_segments; b < p->batch; b++) {
        if (p->kv_len[b] != 0 || p->kv_indptr[b + 1] != p->kv_indptr[b]) MSKV__BAD("padding segment %d has keys", (int)b);
        for (i = p->qo_indptr[b]; p->slot_mapping && i < p->qo_indptr[b + 1]; i++)
            if (p->slot_mapping[i] != -1) MSKV__BAD("padding query %d has a slot", (int)i);
    }
    if (p->kv_indptr[p->batch] != p->num_page_ids) MSKV__BAD("kv_indptr[batch] != num_page_ids");
#undef MSKV__BAD
    if ((r = mskv__plan_validate_extras(p, why, cap)) != MSKV_SUCCESS) return r;
    mskv__why(why, cap, "ok");
    return MSKV_SUCCESS;
}

/* A request a plan reads: still there, and no page left its group-g table since generation gen. */
static int mskv__plan_req_current(const mskv_arena *a, mskv_request h, int32_t g, uint64_t gen) {
    int32_t ri = mskv__lookup(a, h);
    return ri >= 0 && a->reqs[ri].t[g].shrunk <= gen;
}

MSKV_IMPL mskv_result mskv_plan_check(mskv_arena *a, const mskv_plan *p) {
    int ok = 1;
    int32_t b;
    if (!a || !p) return MSKV_ERROR_NULL_POINTER;
    if (p->generation == 0) return MSKV_SUCCESS;
    MSKV__LOCK(a);
    if (p->generation != a->generation) {   /* something lost pages since the build: whose? */
        if (p->generation > a->generation || p->group < 0 || p->group >= a->G) ok = 0;   /* not a plan of this arena */
        else if (p->cross.id) ok = mskv__plan_req_current(a, p->cross, p->group, p->generation);
        else if (!p->requests) ok = 0;
        else
            for (b = 0; ok && b < p->batch; b++)   /* a padding segment (id 0) reads no pages */
                ok = p->requests[b].id == 0 || mskv__plan_req_current(a, p->requests[b], p->group, p->generation);
    }
    MSKV__UNLOCK(a);
    return ok ? MSKV_SUCCESS
              : mskv__err(a, MSKV_ERROR_STALE_PLAN, "plan built at generation %llu is stale: pages left one of its requests since",
                          (unsigned long long)p->generation);
}

/* Prefix views */

/* The checks every view call starts with (before the lock). */
#define MSKV__CHECK_VIEW(a, v)                                                                    \
    do {                                                                                          \
        if (!(a) || !(v)) return MSKV_ERROR_NULL_POINTER;                                         \
        MSKV__CHECK_GROUP(a, (v)->group);                                                         \
    } while (0)

/* Copies prefix page i (rows tokens) of every layer into the view, from the
   host pools or from a page record read through store_ops. */
static void mskv__view_copy_page(const mskv_arena *a, mskv_prefix_view *v, int32_t page, int64_t first, int64_t rows,
                                 const unsigned char *record) {
    const size_t slot = a->store.slot_bytes, n = (size_t)rows * slot;
    int32_t l, kind;
    for (l = 0; l < a->store.num_layers; l++)
        for (kind = 0; kind < 2; kind++) {
            unsigned char *dst = (unsigned char *)(kind ? v->v : v->k) + ((size_t)l * (size_t)v->cap_tokens + (size_t)first) * slot;
            const unsigned char *src = record ? record + (size_t)(l * 2 + kind) * a->store.page_bytes
                                              : a->pools[l * 2 + kind] + (size_t)page * a->store.page_bytes;
            memcpy(dst, src, n);
        }
}

MSKV_IMPL mskv_result mskv_prefix_view_gather(mskv_arena *a, mskv_prefix_view *v) {
    int32_t ri, i;
    const mskv__tab *t;
    size_t bytes;
    unsigned char *record = NULL;
    mskv_result r = MSKV_SUCCESS;
    MSKV__CHECK_VIEW(a, v);
    if (v->cap_tokens < 0) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "prefix view: negative cap_tokens");
    if (v->cap_tokens > 0 && (!v->k || !v->v)) return MSKV_ERROR_NULL_POINTER;
    if (a->record_bytes == 0) return mskv__err(a, MSKV_ERROR_UNSUPPORTED, "prefix view: the arena keeps no K/V bytes (num_layers 0)");
    if (!mskv__mul((size_t)a->store.num_layers, (size_t)v->cap_tokens, &bytes) || !mskv__mul(bytes, a->store.slot_bytes, &bytes))
        return mskv__err(a, MSKV_ERROR_OVERFLOW, "prefix view: %lld tokens per layer do not fit in memory", (long long)v->cap_tokens);
    MSKV__LOCK(a);
    MSKV__GET(a, v->request, ri);
    t = &a->reqs[ri].t[v->group];
    if (a->reqs[ri].location != MSKV_RESIDENT) r = mskv__err(a, MSKV_ERROR_OFFLOADED, "prefix view: the request is offloaded");
    else if (t->prefix_tokens > v->cap_tokens)
        r = mskv__err(a, MSKV_ERROR_CAPACITY, "prefix view: the prefix has %lld tokens, the view room for %lld", (long long)t->prefix_tokens,
                      (long long)v->cap_tokens);
    else if (a->desc.store_ops && t->prefix_pages > 0 && !(record = (unsigned char *)mskv__alloc(&a->al, a->record_bytes)))
        r = mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "prefix view: a page record of %zu bytes", a->record_bytes);
    for (i = 0; r == MSKV_SUCCESS && i < t->prefix_pages; i++) {
        int64_t first = (int64_t)i * a->P, rows = t->prefix_tokens - first < a->P ? t->prefix_tokens - first : a->P;
        if (record) r = a->desc.store_ops->read_pages(a->desc.store_ops->user, &t->pages[i], 1, record);
        if (r == MSKV_SUCCESS) mskv__view_copy_page(a, v, t->pages[i], first, rows, record);
        else v->epoch = 0;   /* part old, part new: refuse it rather than let it pass for either */
    }
    mskv__free(&a->al, record);
    if (r == MSKV_SUCCESS) {
        v->tokens = t->prefix_tokens;
        v->epoch = t->epoch;
        v->num_layers = a->store.num_layers;
        v->kv_heads = a->store.kv_heads;
        v->head_dim = a->store.head_dim;
        v->dtype = a->store.dtype;
        v->device = 0;
    }
    MSKV__UNLOCK(a);
    return r;
}

/* Whether epoch is still request's prefix_epoch in group g (under the lock). */
static mskv_result mskv__epoch_check(mskv_arena *a, mskv_request h, int32_t g, uint64_t epoch, int64_t tokens) {
    int32_t ri;
    const mskv__tab *t;
    mskv_result r = MSKV_SUCCESS;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    t = &a->reqs[ri].t[g];
    if (epoch == 0 || epoch != t->epoch || (tokens >= 0 && tokens != t->prefix_tokens))
        r = mskv__err(a, MSKV_ERROR_STALE_VIEW, "prefix view of epoch %llu, %lld tokens: the request's prefix is at epoch %llu, %lld tokens",
                      (unsigned long long)epoch, (long long)tokens, (unsigned long long)t->epoch, (long long)t->prefix_tokens);
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_prefix_view_check(mskv_arena *a, const mskv_prefix_view *v) {
    MSKV__CHECK_VIEW(a, v);
    return mskv__epoch_check(a, v->request, v->group, v->epoch, v->tokens);
}

MSKV_IMPL mskv_result mskv_prefix_view_layer(const mskv_prefix_view *v, mskv_arena *a, int32_t layer, mskv_dense_kv *out) {
    size_t off, es;
    if (!v || !out) return MSKV_ERROR_NULL_POINTER;
    if (v->epoch == 0) return MSKV_ERROR_STALE_VIEW;   /* never gathered */
    if (layer < 0 || layer >= v->num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    es = mskv_dtype_size(v->dtype);
    off = (size_t)layer * (size_t)v->cap_tokens * (size_t)v->kv_heads * (size_t)v->head_dim * es;  /* inside the buffers the gather filled */
    memset(out, 0, sizeof *out);
    /* a device view's buffers are addresses, not host memory: offset as integers */
    out->k = (const void *)((uintptr_t)v->k + off);
    out->v = (const void *)((uintptr_t)v->v + off);
    out->device = v->device ? 1 : 0;
    out->dtype = v->dtype;
    out->kv_heads = v->kv_heads;
    out->head_dim = v->head_dim;
    out->tokens = v->tokens;
    out->arena = a;
    out->request = v->request;
    out->group = v->group;
    out->epoch = v->epoch;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_dense_kv_check(const mskv_dense_kv *kv) {
    if (!kv) return MSKV_ERROR_NULL_POINTER;
    if (!kv->arena) return MSKV_SUCCESS;
    return mskv__epoch_check(kv->arena, kv->request, kv->group, kv->epoch, -1);
}

MSKV_IMPL mskv_result mskv_prefix_pages_get(mskv_arena *a, mskv_request h, int32_t g, int32_t *pages, int32_t cap,
                                           int32_t *n_pages, int64_t *tokens, uint64_t *epoch) {
    int32_t ri;
    const mskv__tab *t;
    mskv_result r = MSKV_SUCCESS;
    if (!a || !n_pages || !tokens || !epoch || (cap > 0 && !pages)) return MSKV_ERROR_NULL_POINTER;
    if (cap < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    t = &a->reqs[ri].t[g];
    if (a->reqs[ri].location != MSKV_RESIDENT) r = mskv__err(a, MSKV_ERROR_OFFLOADED, "prefix pages: the request is offloaded");
    else {
        *n_pages = t->prefix_pages;
        if (t->prefix_pages > cap) r = MSKV_ERROR_CAPACITY;
        else {
            if (t->prefix_pages > 0) memcpy(pages, t->pages, (size_t)t->prefix_pages * sizeof *pages);
            *tokens = t->prefix_tokens;
            *epoch = t->epoch;
        }
    }
    MSKV__UNLOCK(a);
    return r;
}

/* Keyed entries */

/* A keyed entry has pages in every layer group: each group's cross-attention
   layers keep their K/V on the group's pages. */
MSKV_IMPL mskv_result mskv_keyed_create(mskv_arena *a, uint64_t key, int64_t n_tokens, mskv_request *out) {
    int32_t ri, need, g;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    if (n_tokens < 1) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n_tokens > (int64_t)INT32_MAX - a->P) return MSKV_ERROR_OVERFLOW;
    MSKV__LOCK(a);
    if (mskv__find_key(a, key) >= 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_DUPLICATE, "keyed_create: key exists"); }
    need = mskv__ceil_div(n_tokens, a->P);
    /* the header's order of resources: a request slot before pages */
    if (a->req_free_top == 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "keyed_create: no request slot"); }
    if ((int64_t)need * a->G > a->free_top) {
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "keyed_create: need %lld pages, %d free", (long long)need * a->G, (int)a->free_top);
    }
    ri = mskv__new_req(a);
    if (ri < 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "keyed_create: no request slot"); }
    q = &a->reqs[ri];
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++) r = mskv__reserve_table(a, &q->t[g], need);
    if (r != MSKV_SUCCESS) {
        mskv__undo_new_req(a, ri);
        MSKV__UNLOCK(a);
        return r;
    }
    for (g = 0; g < a->G; g++) {
        r = mskv__take(a, need, q->t[g].pages);
        MSKV_ASSERT(r == MSKV_SUCCESS);
        q->t[g].num_pages = need;
    }
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
    else if (q->scratch_cap) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "keyed_seal: a scratch entry is never sealed (mskv_scratch_reset)");
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
    if (ri >= 0 && a->reqs[ri].xfer == MSKV__XFER_IMPORT) ri = -1;   /* not an entry until its import commits */
    if (ri >= 0) *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return ri >= 0 ? MSKV_SUCCESS : MSKV_ERROR_NOT_FOUND;
}

MSKV_IMPL mskv_result mskv_keyed_remove(mskv_arena *a, uint64_t key) {
    int32_t ri;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    ri = mskv__find_key(a, key);
    if (ri >= 0 && a->reqs[ri].xfer) {
        mskv_result r = mskv__err(a, a->reqs[ri].xfer == MSKV__XFER_IMPORT ? MSKV_ERROR_NOT_FOUND : MSKV_ERROR_BAD_STATE,
                                  "keyed_remove: the entry is being %s", a->reqs[ri].xfer == MSKV__XFER_IMPORT ? "imported" : "exported");
        MSKV__UNLOCK(a);
        return r;
    }
    if (ri >= 0) mskv__del_req(a, ri);   /* keyed entries are never lockstep members */
    MSKV__UNLOCK(a);
    return ri >= 0 ? MSKV_SUCCESS : mskv__err(a, MSKV_ERROR_NOT_FOUND, "keyed_remove: no such key");
}

/* Keyed scratch entries: a keyed request whose tokens are dropped at each
   step (mskv_scratch_reset) while its tables keep their size. */
MSKV_IMPL mskv_result mskv_scratch_create(mskv_arena *a, uint64_t key, int64_t cap_tokens, mskv_request *out) {
    int32_t ri, need, g;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (!a || !out) return MSKV_ERROR_NULL_POINTER;
    if (cap_tokens < 1) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "scratch_create: cap_tokens %lld < 1", (long long)cap_tokens);
    if (cap_tokens > (int64_t)INT32_MAX - a->P) return mskv__err(a, MSKV_ERROR_OVERFLOW, "scratch_create: cap_tokens %lld passes 2^31", (long long)cap_tokens);
    need = mskv__ceil_div(cap_tokens, a->P);
    MSKV__LOCK(a);
    if ((int64_t)need * a->G > a->num_pages - 1) r = mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "scratch_create: %lld tokens need %lld pages, the arena has %d",
                                                            (long long)cap_tokens, (long long)need * a->G, (int)a->num_pages - 1);
    else if (mskv__find_key(a, key) >= 0) r = mskv__err(a, MSKV_ERROR_DUPLICATE, "scratch_create: key exists");
    else if (a->req_free_top == 0) r = mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "scratch_create: no request slot");
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    ri = mskv__new_req(a);
    q = &a->reqs[ri];
    for (g = 0; r == MSKV_SUCCESS && g < a->G; g++) r = mskv__reserve_table(a, &q->t[g], need);   /* the only allocation */
    if (r != MSKV_SUCCESS) {
        mskv__undo_new_req(a, ri);   /* a table grown already keeps its memory for the slot's next request */
        MSKV__UNLOCK(a);
        return r;
    }
    q->keyed = 1;
    q->key = key;
    q->scratch_cap = cap_tokens;
    *out = mskv__handle(a, ri);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_scratch_reset(mskv_arena *a, mskv_request h) {
    int32_t ri;
    mskv__req *q;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    if (!q->scratch_cap) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "scratch_reset: not a scratch entry (mskv_scratch_create)");
    else if (q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "scratch_reset: a step is open (commit or abort it first)");
    if (r == MSKV_SUCCESS) {
        mskv__drop_all(a, ri);   /* the last group first, as remove: the next step takes the same ids */
        q->committed = 0;
        q->published = 0;
    }
    MSKV__UNLOCK(a);
    return r;
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

/* Commit and publish under one lock, every check of both first: a failed
   call changes neither the arena nor the session (the chunk stays open). */
MSKV_IMPL mskv_result mskv_session_commit_chunk(mskv_session *s, uint64_t *step_out) {
    mskv_segment seg;
    mskv_arena *a;
    const mskv__tab *t;
    int64_t before;
    mskv_result r;
    if (!s || !s->arena) return MSKV_ERROR_NULL_POINTER;
    if (s->chunk_tokens == 0) return MSKV_ERROR_NO_RESERVATION;
    a = s->arena;
    seg.request = s->request;
    seg.n_tokens = s->chunk_tokens;
    MSKV__LOCK(a);
    r = mskv__check_open(a, &seg, 1, "session commit");
    if (r == MSKV_SUCCESS) r = mskv__check_publish(a, &seg, 1);
    if (r == MSKV_SUCCESS) {
        t = &a->reqs[mskv__lookup(a, seg.request)].t[0];
        before = t->live_start - (int64_t)t->prefix_pages * a->P;
        mskv__commit_one(&a->reqs[mskv__lookup(a, seg.request)]);
        r = mskv__publish_checked(a, &seg, 1, step_out, r);
        MSKV_ASSERT(r == MSKV_SUCCESS);   /* checked above, under the same lock */
        s->released_total += (t->live_start - (int64_t)t->prefix_pages * a->P) - before;
        s->chunk_tokens = 0;
        s->chunks_done++;
    }
    MSKV__UNLOCK(a);
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

/* // >>scheduling (implementation) ---------------------------------------- */

/* Lockstep groups */

static int32_t mskv__ls_lookup(const mskv_arena *a, mskv_lockstep h) {
    uint32_t s = h.id & 0xFFFFu;
    if (s == 0 || s > (uint32_t)a->max_ls) return -1;
    s -= 1;
    if (!a->ls[s].used || a->ls[s].gen != (uint16_t)(h.id >> 16)) return -1;
    return (int32_t)s;
}

#define MSKV__GET_LS(a, h, s)                                                                     \
    do {                                                                                          \
        (s) = mskv__ls_lookup((a), (h));                                                          \
        if ((s) < 0) {                                                                            \
            mskv_result mskv__e = mskv__err((a), MSKV_ERROR_INVALID_HANDLE, "lockstep handle 0x%08x is unknown or dissolved", (unsigned)(h).id); \
            MSKV__UNLOCK(a);                                                                      \
            return mskv__e;                                                                       \
        }                                                                                         \
    } while (0)

/* The members' request indices, in order, into idx; their number. */
static int32_t mskv__ls_members(const mskv_arena *a, int32_t s, int32_t *idx) {
    int32_t n = 0, ri;
    for (ri = a->ls[s].first; ri >= 0; ri = a->reqs[ri].lock_next) idx[n++] = ri;
    return n;
}

static void mskv__ls_unlink(mskv_arena *a, int32_t s) {
    int32_t ri = a->ls[s].first, next;
    while (ri >= 0) {
        next = a->reqs[ri].lock_next;
        a->reqs[ri].lock = 0;
        a->reqs[ri].lock_next = -1;
        ri = next;
    }
    a->ls[s].used = 0;
    a->ls[s].gen = (uint16_t)(a->ls[s].gen + 1);
    a->ls[s].first = -1;
    a->ls[s].count = 0;
    a->ls_free[a->ls_free_top++] = s;
    a->nls--;
}

static mskv_lockstep mskv__ls_handle(const mskv_arena *a, int32_t s) {
    mskv_lockstep h;
    h.id = ((uint32_t)a->ls[s].gen << 16) | (uint32_t)(s + 1);
    return h;
}

MSKV_IMPL mskv_result mskv_lockstep_create(mskv_arena *a, const mskv_request *members, int32_t n, mskv_lockstep *out) {
    int32_t i, s, idx[MSKV_MAX_LOCKSTEP];
    mskv_result r = MSKV_SUCCESS;
    if (!a || !members || !out) return MSKV_ERROR_NULL_POINTER;
    if (n < 2 || n > MSKV_MAX_LOCKSTEP)
        return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "lockstep_create: %d members, not in [2, %d]", (int)n, MSKV_MAX_LOCKSTEP);
    MSKV__LOCK(a);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        const mskv__req *q;
        idx[i] = mskv__lookup(a, members[i]);
        if (idx[i] < 0) { r = mskv__err(a, MSKV_ERROR_INVALID_HANDLE, "lockstep_create: member %d is unknown or removed", (int)i); break; }
        q = &a->reqs[idx[i]];
        if (q->mark) r = mskv__err(a, MSKV_ERROR_DUPLICATE, "lockstep_create: member %d repeats a request", (int)i);
        else if (q->keyed) r = mskv__err(a, MSKV_ERROR_READ_ONLY, "lockstep_create: member %d is a keyed entry", (int)i);
        else if (q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "lockstep_create: member %d has an open reservation", (int)i);
        else if (q->lock) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "lockstep_create: member %d is in another lockstep group", (int)i);
        else if (q->xfer) r = mskv__err(a, MSKV_ERROR_BAD_STATE, "lockstep_create: member %d is being exported or imported", (int)i);
        else if (q->location != a->reqs[idx[0]].location)
            r = mskv__err(a, MSKV_ERROR_BAD_STATE, "lockstep_create: members must all be resident or all offloaded");
        else a->reqs[idx[i]].mark = 1;
    }
    for (s = 0; s < i && s < n; s++) if (idx[s] >= 0) a->reqs[idx[s]].mark = 0;
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    MSKV_ASSERT(a->ls_free_top > 0);   /* two members each: max_requests / 2 groups always fit */
    s = a->ls_free[--a->ls_free_top];
    a->ls[s].used = 1;
    a->ls[s].first = idx[0];
    a->ls[s].count = n;
    for (i = 0; i < n; i++) {
        a->reqs[idx[i]].lock = s + 1;
        a->reqs[idx[i]].lock_next = i + 1 < n ? idx[i + 1] : -1;
    }
    a->nls++;
    *out = mskv__ls_handle(a, s);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_lockstep_dissolve(mskv_arena *a, mskv_lockstep h) {
    int32_t s;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    mskv__ls_unlink(a, s);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_lockstep_members(mskv_arena *a, mskv_lockstep h, mskv_request *out, int32_t cap, int32_t *count) {
    int32_t s, i, n, idx[MSKV_MAX_LOCKSTEP];
    if (!a || !count) return MSKV_ERROR_NULL_POINTER;
    if (cap < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (cap > 0 && !out) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    n = mskv__ls_members(a, s, idx);
    *count = n;
    if (cap < n) { MSKV__UNLOCK(a); return MSKV_ERROR_CAPACITY; }
    for (i = 0; i < n; i++) out[i] = mskv__handle(a, idx[i]);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_lockstep_segments(mskv_arena *a, mskv_lockstep h, int64_t n_tokens, mskv_segment *segs, int32_t cap, int32_t *count) {
    int32_t s, i, n, idx[MSKV_MAX_LOCKSTEP];
    if (!a || !count) return MSKV_ERROR_NULL_POINTER;
    if (n_tokens < 0 || cap < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (cap > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    n = mskv__ls_members(a, s, idx);
    *count = n;
    if (cap < n) { MSKV__UNLOCK(a); return MSKV_ERROR_CAPACITY; }
    for (i = 0; i < n; i++) {
        segs[i].request = mskv__handle(a, idx[i]);
        segs[i].n_tokens = n_tokens;
    }
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_lockstep_offload(mskv_arena *a, mskv_lockstep h) {
    int32_t s, i, n, idx[MSKV_MAX_LOCKSTEP];
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    n = mskv__ls_members(a, s, idx);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++) {
        r = mskv__check_mutable(a, &a->reqs[idx[i]], "lockstep_offload");
        if (r == MSKV_SUCCESS && a->reqs[idx[i]].has_res)
            r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "lockstep_offload: commit or abort first");
    }
    if (r == MSKV_SUCCESS) r = mskv__park_copy(a, idx, n, "lockstep_offload");
    if (r == MSKV_SUCCESS) mskv__park_commit(a, idx, n);   /* every copy is complete: only now may pages go */
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_lockstep_reload(mskv_arena *a, mskv_lockstep h) {
    int32_t s, i, n, idx[MSKV_MAX_LOCKSTEP];
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    n = mskv__ls_members(a, s, idx);
    for (i = 0; r == MSKV_SUCCESS && i < n; i++)
        if (a->reqs[idx[i]].location != MSKV_OFFLOADED)
            r = mskv__err(a, MSKV_ERROR_NOT_OFFLOADED, "lockstep_reload: member %d is resident", (int)i);
    if (r == MSKV_SUCCESS) r = mskv__unpark(a, idx, n, "lockstep_reload");
    MSKV__UNLOCK(a);
    return r;
}

MSKV_IMPL mskv_result mskv_lockstep_remove(mskv_arena *a, mskv_lockstep h) {
    int32_t s, i, n, idx[MSKV_MAX_LOCKSTEP];
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    n = mskv__ls_members(a, s, idx);
    mskv__ls_unlink(a, s);
    for (i = 0; i < n; i++) mskv__del_req(a, idx[i]);
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_lockstep_release_oldest(mskv_arena *a, mskv_lockstep h, int32_t g, int64_t n, int64_t *released) {
    int32_t s, i, m, idx[MSKV_MAX_LOCKSTEP];
    int64_t got = 0;
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__CHECK_GROUP(a, g);
    MSKV__LOCK(a);
    MSKV__GET_LS(a, h, s);
    m = mskv__ls_members(a, s, idx);
    for (i = 0; r == MSKV_SUCCESS && i < m; i++) r = mskv__check_release(a, idx[i], g, n);
    for (i = 0; r == MSKV_SUCCESS && i < m; i++) got += mskv__release(a, idx[i], g, n);
    if (r == MSKV_SUCCESS && released) *released = got;
    MSKV__UNLOCK(a);
    return r;
}

/* Preemption */

static int mskv__rank_cmp(const void *x, const void *y) {
    const mskv__rank *p = (const mskv__rank *)x, *q = (const mskv__rank *)y;
    if (p->key != q->key) return p->key < q->key ? -1 : 1;
    return p->ri < q->ri ? -1 : p->ri > q->ri;
}

/* The requests make_room may park: one entry per standalone request or per
   lockstep group (its first member), keyed by the most recent admit among
   them. Expects the batch marked. */
static int32_t mskv__candidates(mskv_arena *a) {
    int32_t ri, m, nc = 0;
    for (ri = 0; ri < a->max_req; ri++) {
        const mskv__req *q = &a->reqs[ri];
        uint64_t key = 0;
        int idle = 1;
        if (!q->used || (q->lock && a->ls[q->lock - 1].first != ri)) continue;
        for (m = ri; m >= 0; m = q->lock ? a->reqs[m].lock_next : -1) {
            const mskv__req *x = &a->reqs[m];
            if (x->location != MSKV_RESIDENT || x->has_res || x->paused || x->keyed || x->mark || x->xfer) idle = 0;
            if (x->last_admit > key) key = x->last_admit;
        }
        if (!idle) continue;
        a->rank[nc].key = key;
        a->rank[nc].ri = ri;
        nc++;
    }
    qsort(a->rank, (size_t)nc, sizeof(mskv__rank), mskv__rank_cmp);
    return nc;
}

/* Pages freed if request ri (and, for a lockstep group, its partners) let
   go of its pages now, counting down a->scratch (the references left);
   undo counts them back up. */
static int64_t mskv__sim_drop(mskv_arena *a, int32_t ri, int undo) {
    int64_t freed = 0;
    int32_t m, g, i;
    for (m = ri; m >= 0; m = a->reqs[ri].lock ? a->reqs[m].lock_next : -1)
        for (g = 0; g < a->G; g++) {
            const mskv__tab *t = &a->reqs[m].t[g];
            for (i = 0; i < t->num_pages; i++) {
                if (undo) a->scratch[t->pages[i]]++;
                else if (--a->scratch[t->pages[i]] == 0) freed++;
            }
        }
    return freed;
}

/* Chooses whom to park, least recently admitted first, into a->pick; their
   number into *np. 0 when that makes room. */
static int mskv__choose(mskv_arena *a, int64_t need, uint64_t budget, int32_t *np) {
    int32_t c, nc = mskv__candidates(a), m;
    int64_t avail = (int64_t)a->free_top + a->pend_count;
    *np = 0;
    memcpy(a->scratch, a->refcount, (size_t)a->num_pages * sizeof(int32_t));
    for (c = 0; c < nc && avail < need; c++) {
        int32_t ri = a->rank[c].ri;
        uint64_t bytes = 0;
        int64_t pages = 0, freed;
        for (m = ri; m >= 0; m = a->reqs[ri].lock ? a->reqs[m].lock_next : -1) pages += mskv__held_pages(a, &a->reqs[m]);
        if (a->record_bytes && (uint64_t)pages > UINT64_MAX / a->record_bytes) continue;
        bytes = (uint64_t)pages * a->record_bytes;
        if (bytes > budget) continue;               /* its host copy would not fit */
        freed = mskv__sim_drop(a, ri, 0);
        if (freed == 0) { (void)mskv__sim_drop(a, ri, 1); continue; }   /* every page shared with one who stays */
        budget -= bytes;
        avail += freed;
        for (m = ri; m >= 0; m = a->reqs[ri].lock ? a->reqs[m].lock_next : -1) a->pick[(*np)++] = m;
    }
    return avail >= need;
}

MSKV_IMPL mskv_result mskv_make_room(mskv_arena *a, int64_t need, uint64_t budget, const mskv_segment *batch, int32_t nb,
                                     mskv_request *parked, int32_t cap, int32_t *n_parked) {
    int32_t np = 0, i;
    int ok;
    mskv_result r;
    if (!a || !n_parked) return MSKV_ERROR_NULL_POINTER;
    if (need < 0 || nb < 0 || cap < 0) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "make_room: a negative count");
    if ((nb > 0 && !batch) || (cap > 0 && !parked)) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    r = mskv__mark(a, batch, nb, "make_room");
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    ok = mskv__choose(a, need, budget, &np);
    mskv__unmark(a, batch, nb);
    if (!ok)
        r = mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "make_room: %lld pages needed; parking every idle request that fits %llu host bytes leaves fewer",
                      (long long)need, (unsigned long long)budget);
    else if (np > cap)
        r = mskv__err(a, MSKV_ERROR_CAPACITY, "make_room: %d requests to park, room for %d", (int)np, (int)cap);
    if (r == MSKV_SUCCESS) r = mskv__park_copy(a, a->pick, np, "make_room");
    if (r == MSKV_SUCCESS) {
        mskv__park_commit(a, a->pick, np);   /* every copy is complete: only now may pages go */
        for (i = 0; i < np; i++) parked[i] = mskv__handle(a, a->pick[i]);
    }
    if (r == MSKV_SUCCESS || r == MSKV_ERROR_CAPACITY) *n_parked = np;
    MSKV__UNLOCK(a);
    return r;
}

/* Reset and flush (declared with the arena) */

MSKV_IMPL mskv_result mskv_arena_reset(mskv_arena *a) {
    int32_t i;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    for (i = 0; i < a->max_req; i++)   /* a transport still reads or writes through the ranges it holds */
        if (a->reqs[i].used && a->reqs[i].xfer) {
            mskv_result r = mskv__err(a, MSKV_ERROR_BAD_STATE, "arena_reset: request handle 0x%08x has an open streamed %s (%s first); nothing changed",
                                      (unsigned)mskv__handle(a, i).id, a->reqs[i].xfer == MSKV__XFER_IMPORT ? "import" : "export",
                                      a->reqs[i].xfer == MSKV__XFER_IMPORT ? "mskv_request_import_commit or _abort" : "mskv_request_export_end");
            MSKV__UNLOCK(a);
            return r;
        }
    for (i = 0; i < a->max_ls; i++)
        if (a->ls[i].used) mskv__ls_unlink(a, i);
    for (i = 0; i < a->max_req; i++)
        if (a->reqs[i].used) mskv__del_req(a, i);
    if (a->pend_count == 0) {
        MSKV_ASSERT(a->free_top == a->num_pages - 1);
        mskv__fresh_lists(a);
    }
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_arena_flush(mskv_arena *a) {
    mskv_result r = MSKV_SUCCESS;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    if (a->desc.store_ops && a->desc.store_ops->flush) r = a->desc.store_ops->flush(a->desc.store_ops->user);
    if (r == MSKV_SUCCESS) (void)mskv__retire(a, a->step);
    else r = mskv__err(a, r, "flush: the store could not wait for its work; nothing was retired");
    MSKV__UNLOCK(a);
    return r;
}

/* // >>audit ------------------------------------------------------------- */

MSKV_IMPL mskv_result mskv_arena_audit(mskv_arena *a, char *why, size_t cap) {
    int32_t i, j, nfree = 0, nlive = 0, npend = 0, nreq = 0, nls = 0, nmembers = 0, lmembers = 0;
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
        int64_t end, held = 0;
        int32_t g;
        if (!q->used) continue;
        nreq++;
        nmembers += q->lock != 0;
        end = q->committed + q->reserved;
        if (q->committed < 0 || q->reserved < 0 || (q->reserved > 0 && !q->has_res)) MSKV__FAIL("request %d: bad token counts", (int)i);
        if (q->published > q->committed) MSKV__FAIL("request %d: published past committed", (int)i);
        if (q->keyed && q->sealed && q->has_res) MSKV__FAIL("request %d: sealed entry with a reservation", (int)i);
        if (q->scratch_cap && (!q->keyed || q->sealed || end > q->scratch_cap || q->location != MSKV_RESIDENT))
            MSKV__FAIL("request %d: scratch entry keyed %d sealed %d with %lld of %lld tokens", (int)i, (int)q->keyed, (int)q->sealed, (long long)end, (long long)q->scratch_cap);
        if (q->last_admit > a->admits) MSKV__FAIL("request %d: admitted after the last admit", (int)i);
        if (q->location == MSKV_OFFLOADED && q->has_res) MSKV__FAIL("request %d: offloaded with a reservation", (int)i);
        if (q->pos_pending != 0 && !q->has_res) MSKV__FAIL("request %d: a position shift waits without a reservation", (int)i);
        if (q->pos_shift + q->pos_pending > INT32_MAX || q->pos_shift + q->pos_pending < -(int64_t)INT32_MAX) MSKV__FAIL("request %d: position shift out of range", (int)i);
        if (q->location == MSKV_RESIDENT && q->host) MSKV__FAIL("request %d: resident but holds a host copy", (int)i);
        for (g = 0; g < a->G; g++) {
            const mskv__tab *t = &q->t[g];
            int32_t want = mskv__entries_for(a, t, end);
            if (t->prefix_tokens < 0 || t->prefix_tokens > q->committed) MSKV__FAIL("request %d group %d: prefix %lld beyond committed %lld", (int)i, (int)g, (long long)t->prefix_tokens, (long long)q->committed);
            if (t->prefix_pages != mskv__ceil_div(t->prefix_tokens, a->P)) MSKV__FAIL("request %d group %d: prefix pages %d do not cover the prefix", (int)i, (int)g, (int)t->prefix_pages);
            if (t->live_start % a->P != 0 || t->live_start < (int64_t)t->prefix_pages * a->P) MSKV__FAIL("request %d group %d: live_start %lld misplaced", (int)i, (int)g, (long long)t->live_start);
            if (t->live_start > (int64_t)t->prefix_pages * a->P && t->live_start > q->committed) MSKV__FAIL("request %d group %d: released past the committed tokens", (int)i, (int)g);
            if (!mskv__release_point_ok(a, t, q->committed)) MSKV__FAIL("request %d group %d: release point %lld disagrees with live_start %lld", (int)i, (int)g, (long long)t->release_point, (long long)t->live_start);
            if (q->location == MSKV_OFFLOADED) {
                if (t->num_pages != 0) MSKV__FAIL("request %d group %d: offloaded but holds pages", (int)i, (int)g);
                if (t->host_pages != want) MSKV__FAIL("request %d group %d: host copy has %d pages, expected %d", (int)i, (int)g, (int)t->host_pages, (int)want);
                held += t->host_pages;
                continue;
            }
            if (t->host_pages) MSKV__FAIL("request %d group %d: resident but holds a host copy", (int)i, (int)g);
            if (t->num_pages != want) MSKV__FAIL("request %d group %d: table has %d pages, tokens need %d", (int)i, (int)g, (int)t->num_pages, (int)want);
            for (j = 0; j < t->num_pages; j++) {
                int32_t p = t->pages[j], k;
                if (p <= 0 || p >= a->num_pages) MSKV__FAIL("request %d group %d: table entry %d is page %d (null or out of range)", (int)i, (int)g, (int)j, (int)p);
                if (a->state[p] != MSKV__PAGE_LIVE) MSKV__FAIL("request %d group %d: table holds page %d which is not live", (int)i, (int)g, (int)p);
                for (k = 0; k < j; k++) if (t->pages[k] == p) MSKV__FAIL("request %d group %d: page %d twice in its table", (int)i, (int)g, (int)p);
                a->scratch[p]++;
            }
        }
        if (q->location == MSKV_OFFLOADED) {
            if ((q->host == NULL) != (held == 0 || a->record_bytes == 0)) MSKV__FAIL("request %d: host copy missing", (int)i);
            off += held;
        }
    }
    if (nreq != a->nreq || nreq + a->req_free_top != a->max_req) MSKV__FAIL("request count %d disagrees (%d used, %d free slots)", (int)nreq, (int)a->nreq, (int)a->req_free_top);
    /* lockstep groups: members linked both ways, moving together */
    for (i = 0; i < a->max_ls; i++) {
        const mskv__lockstep *l = &a->ls[i];
        int32_t m, count = 0;
        if (!l->used) continue;
        nls++;
        for (m = l->first; m >= 0 && count <= MSKV_MAX_LOCKSTEP; m = a->reqs[m].lock_next, count++) {
            const mskv__req *x = &a->reqs[m], *y = &a->reqs[l->first];
            if (m >= a->max_req || !x->used || x->lock != i + 1) MSKV__FAIL("lockstep group %d: member %d is not linked to it", (int)i, (int)m);
            if (x->location != y->location || x->has_res != y->has_res) MSKV__FAIL("lockstep group %d: members disagree on location or reservation", (int)i);
        }
        if (count != l->count || count < 2) MSKV__FAIL("lockstep group %d: %d members linked, %d recorded", (int)i, (int)count, (int)l->count);
        lmembers += count;
    }
    if (nls != a->nls || nls + a->ls_free_top != a->max_ls || lmembers != nmembers)
        MSKV__FAIL("lockstep groups disagree: %d used of %d recorded, %d members of %d", (int)nls, (int)a->nls, (int)lmembers, (int)nmembers);
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
        int64_t bad = a->reqs[i].used ? mskv__sums_bad(a, &a->reqs[i]) : -1;
        if (bad >= 0) {
            mskv__why(why, cap, "request %d: page %lld of its host copy changed since it was made", (int)i, (long long)bad);
            r = MSKV_ERROR_AUDIT_FAILED;
        }
    }
    if (r == MSKV_SUCCESS) mskv__why(why, cap, "ok");
    MSKV__UNLOCK(a);
    return r;
}

/* The digest, under the lock; host copies' bytes only with_bytes (ranks
   hold different heads in theirs). */
static uint64_t mskv__digest(const mskv_arena *a, int with_bytes) {
    mskv__hash h;
    int32_t i;
    mskv__hash_init(&h);
    mskv__hash_u64(&h, a->step);
    mskv__hash_u64(&h, a->completed);
    mskv__hash_u64(&h, a->epoch_counter);
    mskv__hash_u64(&h, a->admits);
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
        int32_t g;
        int64_t held = 0;
        mskv__hash_u64(&h, (uint64_t)q->gen << 8 | q->used);
        if (!q->used) continue;
        mskv__hash_u64(&h, (uint64_t)q->location | (uint64_t)q->keyed << 8 | (uint64_t)q->sealed << 16 |
                               (uint64_t)q->has_res << 24 | (uint64_t)q->paused << 40 |
                               (uint64_t)q->xfer << 48 | (uint64_t)(q->scratch_cap != 0) << 56);
        if (q->scratch_cap) mskv__hash_u64(&h, (uint64_t)q->scratch_cap);
        mskv__hash_u64(&h, (uint64_t)q->committed);
        mskv__hash_u64(&h, (uint64_t)q->reserved);
        mskv__hash_u64(&h, (uint64_t)q->published);
        mskv__hash_u64(&h, q->key);
        mskv__hash_u64(&h, q->last_admit);
        mskv__hash_u64(&h, (uint64_t)(uint32_t)q->lock << 32 | (uint32_t)q->lock_next);
        mskv__hash_u64(&h, (uint64_t)q->pos_shift);
        mskv__hash_u64(&h, (uint64_t)q->pos_pending);
        for (g = 0; g < a->G; g++) {
            const mskv__tab *t = &q->t[g];
            mskv__hash_u64(&h, (uint64_t)t->prefix_tokens);
            mskv__hash_u64(&h, (uint64_t)t->live_start);
            mskv__hash_u64(&h, (uint64_t)t->release_point);
            mskv__hash_u64(&h, (uint64_t)t->prefix_pages);
            mskv__hash_u64(&h, t->epoch);
            mskv__hash_u64(&h, t->shrunk);
            mskv__hash_u64(&h, t->has_ret);
            mskv__hash_update(&h, &t->retention, sizeof t->retention);
            mskv__hash_u64(&h, (uint64_t)t->num_pages);
            if (t->num_pages) mskv__hash_update(&h, t->pages, (size_t)t->num_pages * sizeof(int32_t));
            mskv__hash_u64(&h, (uint64_t)t->host_pages);
            held += t->host_pages;
        }
        if (q->host && with_bytes) mskv__hash_update(&h, q->host, (size_t)held * a->record_bytes);
    }
    for (i = 0; i < a->max_ls; i++) {
        mskv__hash_u64(&h, (uint64_t)a->ls[i].gen << 8 | a->ls[i].used);
        if (a->ls[i].used) mskv__hash_u64(&h, (uint64_t)(uint32_t)a->ls[i].first << 32 | (uint32_t)a->ls[i].count);
    }
    return mskv__hash_final(&h);
}

MSKV_IMPL uint64_t mskv_arena_digest(mskv_arena *a) {
    uint64_t d;
    if (!a) return 0;
    MSKV__LOCK(a);
    d = mskv__digest(a, 1);
    MSKV__UNLOCK(a);
    return d;
}

/* The records of mskv_rank_check as all-reduce values: (step, digest) per
   record in order, UINT64_MAX and 0 where a rank has none (so the minimum
   step of a record is a real one), then the bitwise complement of all that
   (its minimum is the complement of the maximum). */
static void mskv__agree_values(const mskv_arena *a, uint64_t step, uint64_t digest, uint64_t *v) {
    int32_t i, n = a->agree_count;
    for (i = 0; i < MSKV_RANK_STEPS; i++) {
        v[2 * i] = i < n ? a->agree_step[i] : i == n ? step : UINT64_MAX;
        v[2 * i + 1] = i < n ? a->agree_digest[i] : i == n ? digest : 0;
    }
    for (i = 0; i < 2 * MSKV_RANK_STEPS; i++) v[2 * MSKV_RANK_STEPS + i] = ~v[i];
}

MSKV_IMPL mskv_result mskv_rank_check(mskv_arena *a, uint64_t step, mskv_allreduce_min_fn allreduce, void *user,
                                      uint64_t *first_divergent) {
    uint64_t v[4 * MSKV_RANK_STEPS], digest;
    const int32_t half = 2 * MSKV_RANK_STEPS;
    int32_t i, n;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    digest = mskv__digest(a, 0);
    if (!allreduce) {
        /* one place stays free for the record of the check that compares them */
        if (a->agree_count >= MSKV_RANK_STEPS - 1)
            r = mskv__err(a, MSKV_ERROR_CAPACITY, "rank check: %d steps recorded without a check (at most %d)",
                          (int)a->agree_count, MSKV_RANK_STEPS - 1);
        else {
            a->agree_step[a->agree_count] = step;
            a->agree_digest[a->agree_count++] = digest;
            r = MSKV_SUCCESS;
        }
        MSKV__UNLOCK(a);
        return r;
    }
    n = a->agree_count;
    mskv__agree_values(a, step, digest, v);
    MSKV__UNLOCK(a);
    /* the collective waits for the other ranks: never under the arena's lock */
    r = allreduce(user, v, 4 * MSKV_RANK_STEPS);
    if (r != MSKV_SUCCESS) return mskv__err(a, r, "rank check: the all-reduce failed; the records wait for the next check");
    for (i = 0; i < half; i += 2) {
        if (v[i] != ~v[half + i] || v[i + 1] != ~v[half + i + 1]) {
            if (first_divergent) *first_divergent = v[i];
            return mskv__err(a, MSKV_ERROR_DIVERGED, "rank check: the ranks' arenas differ first at step %llu (record %d of %d)",
                             (unsigned long long)v[i], (int)(i / 2 + 1), (int)(n + 1));
        }
    }
    MSKV__LOCK(a);
    /* drop the records just compared, keep any another thread added meanwhile */
    a->agree_count -= n;
    for (i = 0; i < a->agree_count; i++) {
        a->agree_step[i] = a->agree_step[n + i];
        a->agree_digest[i] = a->agree_digest[n + i];
    }
    MSKV__UNLOCK(a);
    return MSKV_SUCCESS;
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
   every row. With more than 8 rows (video), Q and O are held transposed, a
   row per vector lane: S^T = K.Q^T and O^T += V^T.P^T are one register-
   blocked micro-kernel (broadcast an element of the K or V rows as stored,
   multiply a vector of rows), and the online softmax (running max and sum)
   runs across rows in the same lanes, so nothing is transposed per block.
   With 8 rows or fewer (decode) the scores are dot products over K rows
   instead, and one item takes several KV heads so that whole slot rows
   stream from memory in address order; when a call has few such units the
   keys are split into chunks merged by LSE (see mskv_cpu_desc).
   The arithmetic lives in small per-instruction-set kernels behind one
   table (mskv__cpu_kern): AVX-512, AVX2+FMA, NEON and portable loops,
   chosen at run time; which keys a row sees is decided in one place
   (mskv__cpu_row_keys) and the kernels only apply the intervals. */

#include <string.h>
#include <math.h>
#include <stdlib.h>

#if defined(__cplusplus) || defined(_MSC_VER)
#define MSKV__CPU_RESTRICT __restrict  /* MSVC's C has no restrict before /std:c11 */
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
    /* each width against what is left of the head before it is added: the
       running sum stays within head_dim and cannot wrap (two widths near
       2^31 once summed with 8 to 4, and the angle table overflowed) */
    for (k = 0; k < out->nparts; k++) {
        if (out->width[k] < 0 || (out->width[k] & 1) || out->width[k] > head_dim - sum) return MSKV_ERROR_INVALID_ARGUMENT;
        out->off[k] = sum;
        sum += out->width[k];
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

/* ---- instruction sets -------------------------------------------------------- */

/* Each path is one table of small kernels; the attention loop above them is
   shared and never asks which path it runs. x86 kernels are compiled with
   per-function target attributes (GCC/Clang) or need nothing (MSVC), so any
   build carries them and the CPU is asked at run time. */
typedef void (*mskv__cpu_cvt_fn)(float *MSKV__CPU_RESTRICT dst, const uint16_t *MSKV__CPU_RESTRICT src, int bf16, int32_t n);
/* C[i][:] = (alpha ? alpha (*) C[i][:] : 0) + sum_k A[i*ais + k*aks] * B[k][:], i < n,
   k < kd; B and C rows hold rp floats (rows of the transposed tiles, rp a
   multiple of the path's row width). */
typedef void (*mskv__cpu_gemm_fn)(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                  const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                  const float *MSKV__CPU_RESTRICT alpha, int32_t n, int32_t kd, int32_t rp);
/* Online softmax over a transposed score block S[j][r] (j < kb, r < rp): row r
   sees keys [a[r], z[r]) of the block (all of them when full); p replaces s,
   m/l are the running max and sum, alpha[r] the factor for the old O. */
typedef void (*mskv__cpu_softmax_fn)(float *MSKV__CPU_RESTRICT S, int32_t rp, int32_t kb, const int32_t *a,
                                     const int32_t *z, int full, float *m, float *l, float *alpha);
/* S[r][j] = Q[r] . krow[j] for r < nrp (multiple of 4), j < kbe (multiple of 4); dp
   (multiple of 16) floats per row; S stride ks. */
typedef void (*mskv__cpu_qk_rows_fn)(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                                     float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks);
/* O[r][:] = O[r][:] * alpha[r] + sum_{j < kb} P[r][j] * vrow[j][:], r < nrp, dp dims. */
typedef void (*mskv__cpu_pv_rows_fn)(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                     const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                                     int32_t nrp, int32_t kb, int32_t dp, int32_t ks);
/* s[j] = exp(s[j] - m), exactly 0 where s = -inf, for j < n (multiple of 16); returns the sum. */
typedef float (*mskv__cpu_exp_row_fn)(float *MSKV__CPU_RESTRICT s, float m, int32_t n);
/* qk_rows and pv_rows over 16-bit K/V rows read where they lie (bf16 when
   bf16 is set, else f16), each converted in registers: the rows hold d
   elements (any d; nothing past it is read, the vector tails see zeros), Q
   and O rows dp floats (O's dims past d stay 0). */
typedef void (*mskv__cpu_qk_rows16_fn)(const float *MSKV__CPU_RESTRICT Q, const uint16_t *const *MSKV__CPU_RESTRICT krow, int bf16,
                                       float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t d, int32_t dp, int32_t ks);
typedef void (*mskv__cpu_pv_rows16_fn)(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                       const uint16_t *const *MSKV__CPU_RESTRICT vrow, int bf16, const float *MSKV__CPU_RESTRICT alpha,
                                       int32_t nrp, int32_t kb, int32_t d, int32_t dp, int32_t ks);
/* C[i][r] = (alpha ? alpha[r] * C[i][r] : 0) + sum_{k < kp} dot2(A[i * ais + k], B[k * rp + r])
   for i < n, r < rp (a multiple of the path's row width): A and B hold bf16
   pairs (element 2k in the low half, as a bf16 array reads on little-endian
   machines), dot2 is vdpbf16ps on one lane (see "bf16 arithmetic"). */
typedef void (*mskv__cpu_gemm_bf16_fn)(const uint32_t *MSKV__CPU_RESTRICT A, ptrdiff_t ais, const uint32_t *MSKV__CPU_RESTRICT B,
                                       float *MSKV__CPU_RESTRICT C, const float *MSKV__CPU_RESTRICT alpha, int32_t n,
                                       int32_t kp, int32_t rp);

typedef struct mskv__cpu_kern {
    mskv_cpu_isa isa;
    int32_t rw;                  /* rows per vector in the transposed tiles */
    mskv__cpu_cvt_fn cvt;
    mskv__cpu_gemm_fn gemm;
    mskv__cpu_softmax_fn softmax;
    mskv__cpu_qk_rows_fn qk_rows;
    mskv__cpu_pv_rows_fn pv_rows;
    mskv__cpu_exp_row_fn exp_row;
    mskv__cpu_qk_rows16_fn qk_rows16;
    mskv__cpu_pv_rows16_fn pv_rows16;
    mskv__cpu_gemm_bf16_fn gemm_bf16;  /* NULL: no bf16 arithmetic (bf16 pools run the f32 kernels) */
} mskv__cpu_kern;

/* e^x for x <= 0: 2^k * e^r with k = round(x / ln 2), |r| <= ln2/2 and e^r by
   a degree-6 polynomial (relative error ~1e-7); x under -87 (and -inf) gives
   exactly 0. The constants, shared by every path: */
#define MSKV__EXP_LO (-87.0f)
#define MSKV__EXP_LOG2E 1.44269504f
#define MSKV__EXP_MAGIC 12582912.0f       /* 1.5 * 2^23: adding it rounds to an integer */
#define MSKV__EXP_LN2HI 0.693145752f
#define MSKV__EXP_LN2LO 1.42860677e-6f
#define MSKV__EXP_C6 (1.0f / 720)
#define MSKV__EXP_C5 (1.0f / 120)
#define MSKV__EXP_C4 (1.0f / 24)
#define MSKV__EXP_C3 (1.0f / 6)

/* The micro-kernels spell out their accumulators (M4/M6/M8 repeat a statement
   per register): arrays indexed in loops stay in memory at -O2. */
#define MSKV__M4(M) M(0) M(1) M(2) M(3)
#define MSKV__M6(M) M(0) M(1) M(2) M(3) M(4) M(5)
#define MSKV__M8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

/* ---- portable path: plain loops, any compiler ---- */

static void mskv__cpu_cvt_portable(float *MSKV__CPU_RESTRICT dst, const uint16_t *MSKV__CPU_RESTRICT src, int bf16, int32_t n) {
    int32_t i;
    if (bf16) for (i = 0; i < n; i++) dst[i] = mskv__cpu_bitsf((uint32_t)src[i] << 16);
    else for (i = 0; i < n; i++) dst[i] = mskv_f16_to_f32(src[i]);
}

static void mskv__cpu_gemm_portable(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                    const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                    const float *MSKV__CPU_RESTRICT alpha, int32_t n, int32_t kd, int32_t rp) {
    int32_t i, k, r;
    for (i = 0; i < n; i++) {
        float *c = C + (size_t)i * (size_t)rp;
        for (r = 0; r < rp; r++) c[r] = alpha ? c[r] * alpha[r] : 0.0f;
        for (k = 0; k < kd; k++) {
            float x = A[i * ais + k * aks];
            const float *b = B + (size_t)k * (size_t)rp;
            for (r = 0; r < rp; r++) c[r] += x * b[r];
        }
    }
}

static float mskv__cpu_exp_portable(float x) { return x == -INFINITY ? 0.0f : expf(x); }

static void mskv__cpu_softmax_portable(float *MSKV__CPU_RESTRICT S, int32_t rp, int32_t kb, const int32_t *a,
                                       const int32_t *z, int full, float *m, float *l, float *alpha) {
    int32_t r, j;
    for (r = 0; r < rp; r++) {
        int32_t lo = full ? 0 : a[r], hi = full ? kb : z[r];
        float mx = -INFINITY, mn, sum = 0.0f;
        for (j = lo; j < hi; j++) mx = S[(size_t)j * rp + r] > mx ? S[(size_t)j * rp + r] : mx;
        mn = m[r] > mx ? m[r] : mx;
        alpha[r] = m[r] == mn ? 1.0f : mskv__cpu_exp_portable(m[r] - mn);
        for (j = 0; j < kb; j++) {
            float *s = S + (size_t)j * rp + r;
            *s = j >= lo && j < hi ? mskv__cpu_exp_portable(*s - mn) : 0.0f;
            sum += *s;
        }
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mn;
    }
}

static void mskv__cpu_qk_rows_portable(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                                       float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks) {
    int32_t r, j, d;
    for (r = 0; r < nrp; r++)
        for (j = 0; j < kbe; j++) {
            float acc = 0.0f;
            for (d = 0; d < dp; d++) acc += Q[(size_t)r * dp + d] * krow[j][d];
            S[(size_t)r * ks + j] = acc;
        }
}

static void mskv__cpu_pv_rows_portable(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                       const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                                       int32_t nrp, int32_t kb, int32_t dp, int32_t ks) {
    int32_t r, j, d;
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
}

static float mskv__cpu_exp_row_portable(float *MSKV__CPU_RESTRICT s, float m, int32_t n) {
    int32_t j;
    float sum = 0.0f;
    for (j = 0; j < n; j++) {
        s[j] = mskv__cpu_exp_portable(s[j] - m);
        sum += s[j];
    }
    return sum;
}

static float mskv__cpu_h2f(const uint16_t *p, int bf16) { return bf16 ? mskv__cpu_bitsf((uint32_t)*p << 16) : mskv_f16_to_f32(*p); }

static void mskv__cpu_qk_rows16_portable(const float *MSKV__CPU_RESTRICT Q, const uint16_t *const *MSKV__CPU_RESTRICT krow, int bf16,
                                         float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dim, int32_t dp, int32_t ks) {
    int32_t r, j, d;
    for (r = 0; r < nrp; r++)
        for (j = 0; j < kbe; j++) {
            float acc = 0.0f;
            for (d = 0; d < dim; d++) acc += Q[(size_t)r * dp + d] * mskv__cpu_h2f(krow[j] + d, bf16);
            S[(size_t)r * ks + j] = acc;
        }
}

static void mskv__cpu_pv_rows16_portable(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                         const uint16_t *const *MSKV__CPU_RESTRICT vrow, int bf16, const float *MSKV__CPU_RESTRICT alpha,
                                         int32_t nrp, int32_t kb, int32_t dim, int32_t dp, int32_t ks) {
    int32_t r, j, d;
    for (r = 0; r < nrp; r++) {
        float *orow = O + (size_t)r * dp;
        const float *prow = P + (size_t)r * ks;
        for (d = 0; d < dim; d++) orow[d] *= alpha[r];
        for (j = 0; j < kb; j++)
            for (d = 0; d < dim; d++) orow[d] += prow[j] * mskv__cpu_h2f(vrow[j] + d, bf16);
    }
}

static const mskv__cpu_kern mskv__cpu_kern_portable = {
    MSKV_CPU_ISA_PORTABLE, 4, mskv__cpu_cvt_portable, mskv__cpu_gemm_portable, mskv__cpu_softmax_portable,
    mskv__cpu_qk_rows_portable, mskv__cpu_pv_rows_portable, mskv__cpu_exp_row_portable,
    mskv__cpu_qk_rows16_portable, mskv__cpu_pv_rows16_portable, NULL};

/* ---- AVX-512 path (16 floats a vector) ---- */
#if MSKV__CPU_X86
#if defined(__GNUC__) && !defined(__clang__)
/* GCC 12's AVX-512 intrinsics start from an "undefined" register that
   -W(maybe-)uninitialized reports in C++ (fixed in GCC 13) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define MSKV__CPU_AVX512 MSKV__CPU_TARGET("avx512f,avx2,fma,f16c")

static MSKV__CPU_AVX512 __m512 mskv__cpu_exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(MSKV__EXP_LO), magic = _mm512_set1_ps(MSKV__EXP_MAGIC);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GT_OQ);
    __m512 t, kf, r, p;
    __m512i ki;
    x = _mm512_max_ps(x, lo);
    t = _mm512_fmadd_ps(x, _mm512_set1_ps(MSKV__EXP_LOG2E), magic);
    kf = _mm512_sub_ps(t, magic);
    r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(MSKV__EXP_LN2HI), x);
    r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(MSKV__EXP_LN2LO), r);
    p = _mm512_fmadd_ps(_mm512_set1_ps(MSKV__EXP_C6), r, _mm512_set1_ps(MSKV__EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MSKV__EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MSKV__EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    ki = _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic)),
                                            _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(ki));
}

static MSKV__CPU_AVX512 void mskv__cpu_cvt_avx512(float *MSKV__CPU_RESTRICT dst, const uint16_t *MSKV__CPU_RESTRICT src, int bf16, int32_t n) {
    int32_t i = 0;
    if (bf16)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(src + i))), 16)));
    else
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(src + i))));
    mskv__cpu_cvt_portable(dst + i, src + i, bf16, n - i);
}

/* 64 rows (4 vectors) x 4 outputs: 16 accumulators. */
static MSKV__CPU_AVX512 void mskv__cpu_gemm512_4x4(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                                   const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                   const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
#define MSKV__DECL(u) __m512 c##u##0, c##u##1, c##u##2, c##u##3;
#define MSKV__INIT(u) \
    c##u##0 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp), a0) : z; \
    c##u##1 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp + 16), a1) : z; \
    c##u##2 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp + 32), a2) : z; \
    c##u##3 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp + 48), a3) : z;
#define MSKV__STEP(u) { __m512 s = _mm512_set1_ps(a[(u) * ais]); \
    c##u##0 = _mm512_fmadd_ps(s, y0, c##u##0); c##u##1 = _mm512_fmadd_ps(s, y1, c##u##1); \
    c##u##2 = _mm512_fmadd_ps(s, y2, c##u##2); c##u##3 = _mm512_fmadd_ps(s, y3, c##u##3); }
#define MSKV__STORE(u) \
    _mm512_storeu_ps(C + (u) * rp, c##u##0); _mm512_storeu_ps(C + (u) * rp + 16, c##u##1); \
    _mm512_storeu_ps(C + (u) * rp + 32, c##u##2); _mm512_storeu_ps(C + (u) * rp + 48, c##u##3);
    const __m512 z = _mm512_setzero_ps();
    const __m512 a0 = alpha ? _mm512_loadu_ps(alpha) : z, a1 = alpha ? _mm512_loadu_ps(alpha + 16) : z;
    const __m512 a2 = alpha ? _mm512_loadu_ps(alpha + 32) : z, a3 = alpha ? _mm512_loadu_ps(alpha + 48) : z;
    int32_t k;
    MSKV__M4(MSKV__DECL)
    MSKV__M4(MSKV__INIT)
    for (k = 0; k < kd; k++) {
        const float *b = B + (size_t)k * rp, *a = A + k * aks;
        __m512 y0 = _mm512_loadu_ps(b), y1 = _mm512_loadu_ps(b + 16), y2 = _mm512_loadu_ps(b + 32), y3 = _mm512_loadu_ps(b + 48);
        MSKV__M4(MSKV__STEP)
    }
    MSKV__M4(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__INIT
#undef MSKV__STEP
#undef MSKV__STORE
}

/* 16 rows (1 vector) x 8 outputs: 8 accumulators. */
static MSKV__CPU_AVX512 void mskv__cpu_gemm512_1x8(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                                   const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                   const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
#define MSKV__DECL(u) __m512 c##u = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp), a0) : z;
#define MSKV__STEP(u) c##u = _mm512_fmadd_ps(_mm512_set1_ps(a[(u) * ais]), y0, c##u);
#define MSKV__STORE(u) _mm512_storeu_ps(C + (u) * rp, c##u);
    const __m512 z = _mm512_setzero_ps(), a0 = alpha ? _mm512_loadu_ps(alpha) : z;
    int32_t k;
    MSKV__M8(MSKV__DECL)
    for (k = 0; k < kd; k++) {
        const float *a = A + k * aks;
        __m512 y0 = _mm512_loadu_ps(B + (size_t)k * rp);
        MSKV__M8(MSKV__STEP)
    }
    MSKV__M8(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__STEP
#undef MSKV__STORE
}

/* One output, one vector of rows (the tails). */
static MSKV__CPU_AVX512 void mskv__cpu_gemm512_1x1(const float *MSKV__CPU_RESTRICT A, ptrdiff_t aks, const float *MSKV__CPU_RESTRICT B,
                                                   float *MSKV__CPU_RESTRICT C, const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
    __m512 c = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C), _mm512_loadu_ps(alpha)) : _mm512_setzero_ps();
    int32_t k;
    for (k = 0; k < kd; k++) c = _mm512_fmadd_ps(_mm512_set1_ps(A[k * aks]), _mm512_loadu_ps(B + (size_t)k * rp), c);
    _mm512_storeu_ps(C, c);
}

static MSKV__CPU_AVX512 void mskv__cpu_gemm_avx512(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                                   const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                   const float *MSKV__CPU_RESTRICT alpha, int32_t n, int32_t kd, int32_t rp) {
    int32_t v = 0, i, x;
    for (; v + 64 <= rp; v += 64) {
        for (i = 0; i + 4 <= n; i += 4)
            mskv__cpu_gemm512_4x4(A + i * ais, ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
        for (; i < n; i++)
            for (x = 0; x < 64; x += 16)
                mskv__cpu_gemm512_1x1(A + i * ais, aks, B + v + x, C + (size_t)i * rp + v + x, alpha ? alpha + v + x : NULL, kd, rp);
    }
    for (; v < rp; v += 16) {
        for (i = 0; i + 8 <= n; i += 8)
            mskv__cpu_gemm512_1x8(A + i * ais, ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
        for (; i < n; i++)
            mskv__cpu_gemm512_1x1(A + i * ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
    }
}

/* The lanes (rows v .. v + 15 of S^T) that see key j of the block: a <= j < z. */
static MSKV__CPU_AVX512 MSKV__ALWAYS_INLINE __mmask16 mskv__cpu_vis512(__m512i av, __m512i zv, int32_t j) {
    const __m512i jv = _mm512_set1_epi32(j);
    return _mm512_cmp_epi32_mask(av, jv, _MM_CMPINT_LE) & _mm512_cmp_epi32_mask(jv, zv, _MM_CMPINT_LT);
}
/* The online softmax's first pass over rows v .. v + 15 of S^T ([kb][rp]):
   the visible intervals (av, zv; every key when full), the new running max
   mn and the rescale al of the old state. Shared by the AVX-512 softmax and
   the AMX path's. */
static MSKV__CPU_AVX512 MSKV__ALWAYS_INLINE void mskv__cpu_softmax_max512(const float *S, int32_t rp, int32_t kb, const int32_t *a,
                                                                          const int32_t *z, int full, const float *m, int32_t v,
                                                                          __m512i *av, __m512i *zv, __m512 *mn, __m512 *al) {
    const __m512 mo = _mm512_loadu_ps(m + v);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int32_t j;
    *av = full ? _mm512_setzero_si512() : _mm512_loadu_si512((const void *)(a + v));
    *zv = full ? _mm512_set1_epi32(kb) : _mm512_loadu_si512((const void *)(z + v));
    if (full)
        for (j = 0; j < kb; j++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + (size_t)j * rp + v));
    else
        for (j = 0; j < kb; j++) mx = _mm512_mask_max_ps(mx, mskv__cpu_vis512(*av, *zv, j), mx, _mm512_loadu_ps(S + (size_t)j * rp + v));
    *mn = _mm512_max_ps(mo, mx);
    *al = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mo, *mn, _CMP_EQ_OQ), mskv__cpu_exp512(_mm512_sub_ps(mo, *mn)), _mm512_set1_ps(1.0f));
}
/* Its end: l = l al + sum, m = mn, alpha = al. */
static MSKV__CPU_AVX512 MSKV__ALWAYS_INLINE void mskv__cpu_softmax_end512(float *m, float *l, float *alpha, int32_t v, __m512 mn,
                                                                          __m512 al, __m512 sum) {
    _mm512_storeu_ps(l + v, _mm512_fmadd_ps(_mm512_loadu_ps(l + v), al, sum));
    _mm512_storeu_ps(m + v, mn);
    _mm512_storeu_ps(alpha + v, al);
}

static MSKV__CPU_AVX512 void mskv__cpu_softmax_avx512(float *MSKV__CPU_RESTRICT S, int32_t rp, int32_t kb, const int32_t *a,
                                                      const int32_t *z, int full, float *m, float *l, float *alpha) {
    int32_t v, j;
    for (v = 0; v < rp; v += 16) {
        __m512 mn, al, sum = _mm512_setzero_ps();
        __m512i av, zv;
        mskv__cpu_softmax_max512(S, rp, kb, a, z, full, m, v, &av, &zv, &mn, &al);
        for (j = 0; j < kb; j++) {
            float *s = S + (size_t)j * rp + v;
            __m512 p = _mm512_maskz_mov_ps(mskv__cpu_vis512(av, zv, j), mskv__cpu_exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mn)));
            _mm512_storeu_ps(s, p);
            sum = _mm512_add_ps(sum, p);
        }
        mskv__cpu_softmax_end512(m, l, alpha, v, mn, al, sum);
    }
}

/* [sum a, sum b, sum c, sum d] of four vectors. */
static MSKV__CPU_AVX512 __m128 mskv__cpu_sum4x512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  /* a b a b per 128 bits */
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));  /* c d c d */
    __m512 x = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd)))); /* a b c d */
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4e));
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));
    return _mm512_castps512_ps128(x);
}

/* The tail of the qk_rows kernels (f32 and 16-bit rows): 4 rows x 4 keys of
   sums, c<row><key>, each row's four reduced together (mskv__cpu_sum4x512)
   and stored at S[row * ks + key]. */
static MSKV__CPU_AVX512 MSKV__ALWAYS_INLINE void mskv__cpu_qk_tail_avx512(float *S, int32_t ks, __m512 c00, __m512 c01, __m512 c02, __m512 c03,
                                                                          __m512 c10, __m512 c11, __m512 c12, __m512 c13, __m512 c20, __m512 c21,
                                                                          __m512 c22, __m512 c23, __m512 c30, __m512 c31, __m512 c32, __m512 c33) {
    _mm_storeu_ps(S, mskv__cpu_sum4x512(c00, c01, c02, c03));
    _mm_storeu_ps(S + ks, mskv__cpu_sum4x512(c10, c11, c12, c13));
    _mm_storeu_ps(S + 2 * (size_t)ks, mskv__cpu_sum4x512(c20, c21, c22, c23));
    _mm_storeu_ps(S + 3 * (size_t)ks, mskv__cpu_sum4x512(c30, c31, c32, c33));
}

/* The tail of the pv_rows kernels: 4 rows' 32 dims of O (16 unless two),
   c<row>0 and c<row>1, stored at O + row * dp. */
static MSKV__CPU_AVX512 MSKV__ALWAYS_INLINE void mskv__cpu_pv_tail_avx512(float *O, int32_t dp, int two, __m512 c00, __m512 c01, __m512 c10, __m512 c11,
                                                                          __m512 c20, __m512 c21, __m512 c30, __m512 c31) {
    _mm512_storeu_ps(O, c00);
    _mm512_storeu_ps(O + (size_t)dp, c10);
    _mm512_storeu_ps(O + 2 * (size_t)dp, c20);
    _mm512_storeu_ps(O + 3 * (size_t)dp, c30);
    if (!two) return;
    _mm512_storeu_ps(O + 16, c01);
    _mm512_storeu_ps(O + (size_t)dp + 16, c11);
    _mm512_storeu_ps(O + 2 * (size_t)dp + 16, c21);
    _mm512_storeu_ps(O + 3 * (size_t)dp + 16, c31);
}

/* 4 rows x 4 keys of dot products: 16 accumulators, then each row's four
   sums reduced together (unpack and add, then across the 128-bit lanes) at
   a third of the cost of four separate horizontal sums. kbe is a multiple of 4. */
static MSKV__CPU_AVX512 void mskv__cpu_qk_rows_avx512(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                                                      float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m512 c##u##0 = _mm512_setzero_ps(), c##u##1 = c##u##0, c##u##2 = c##u##0, c##u##3 = c##u##0;
#define MSKV__STEP(u) { __m512 q = _mm512_loadu_ps(Q + (size_t)(r + (u)) * dp + d); \
    c##u##0 = _mm512_fmadd_ps(q, x0, c##u##0); c##u##1 = _mm512_fmadd_ps(q, x1, c##u##1); \
    c##u##2 = _mm512_fmadd_ps(q, x2, c##u##2); c##u##3 = _mm512_fmadd_ps(q, x3, c##u##3); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (j = 0; j < kbe; j += 4) {
            const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
            MSKV__M4(MSKV__DECL)
            for (d = 0; d < dp; d += 16) {
                __m512 x0 = _mm512_loadu_ps(k0 + d), x1 = _mm512_loadu_ps(k1 + d);
                __m512 x2 = _mm512_loadu_ps(k2 + d), x3 = _mm512_loadu_ps(k3 + d);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_qk_tail_avx512(S + (size_t)r * ks + j, ks, c00, c01, c02, c03, c10, c11, c12, c13,
                                     c20, c21, c22, c23, c30, c31, c32, c33);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static MSKV__CPU_AVX512 void mskv__cpu_pv_rows_avx512(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                                      const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                                                      int32_t nrp, int32_t kb, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m512 c##u##0 = _mm512_mul_ps(_mm512_loadu_ps(O + (size_t)(r + (u)) * dp + d), _mm512_set1_ps(alpha[r + (u)])), \
    c##u##1 = two ? _mm512_mul_ps(_mm512_loadu_ps(O + (size_t)(r + (u)) * dp + d + 16), _mm512_set1_ps(alpha[r + (u)])) : c##u##0;
#define MSKV__STEP(u) { __m512 p = _mm512_set1_ps(P[(size_t)(r + (u)) * ks + j]); \
    c##u##0 = _mm512_fmadd_ps(p, y0, c##u##0); c##u##1 = _mm512_fmadd_ps(p, y1, c##u##1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (d = 0; d < dp; d += 32) {
            const int two = d + 32 <= dp;  /* else the last 16 dims (c*1 then run spare) */
            MSKV__M4(MSKV__DECL)
            for (j = 0; j < kb; j++) {
                const float *vr = vrow[j] + d;
                __m512 y0 = _mm512_loadu_ps(vr), y1 = two ? _mm512_loadu_ps(vr + 16) : y0;
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_pv_tail_avx512(O + (size_t)r * dp + d, dp, two, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static MSKV__CPU_AVX512 float mskv__cpu_exp_row_avx512(float *MSKV__CPU_RESTRICT s, float m, int32_t n) {
    __m512 mv = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    int32_t j;
    for (j = 0; j < n; j += 16) {
        __m512 p = mskv__cpu_exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
        _mm512_storeu_ps(s + j, p);
        acc = _mm512_add_ps(acc, p);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Elements [at, at + 16) of a 16-bit row of dim elements as floats; those
   past dim read as 0 (and are not read). */
static MSKV__CPU_AVX512 __m512 mskv__cpu_h16_avx512(const uint16_t *row, int32_t at, int32_t dim, int bf16) {
    __m256i h;
    if (at + 16 <= dim) {
        h = _mm256_loadu_si256((const __m256i *)(const void *)(row + at));
    } else {
        uint16_t t[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        if (at < dim) memcpy(t, row + at, (size_t)(dim - at) * 2);
        h = _mm256_loadu_si256((const __m256i *)(const void *)t);
    }
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* 16 whole elements at p, converted in line (the helper above is for tails). */
#define MSKV__H16_AVX512(p, bf16) ((bf16) ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32( \
    _mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)) : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p))))

/* As qk_rows_avx512, each K element converted once for the 4 rows. */
static MSKV__CPU_AVX512 void mskv__cpu_qk_rows16_avx512(const float *MSKV__CPU_RESTRICT Q, const uint16_t *const *MSKV__CPU_RESTRICT krow, int bf16,
                                                        float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dim, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m512 c##u##0 = _mm512_setzero_ps(), c##u##1 = c##u##0, c##u##2 = c##u##0, c##u##3 = c##u##0;
#define MSKV__STEP(u) { __m512 q = _mm512_loadu_ps(Q + (size_t)(r + (u)) * dp + d); \
    c##u##0 = _mm512_fmadd_ps(q, x0, c##u##0); c##u##1 = _mm512_fmadd_ps(q, x1, c##u##1); \
    c##u##2 = _mm512_fmadd_ps(q, x2, c##u##2); c##u##3 = _mm512_fmadd_ps(q, x3, c##u##3); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (j = 0; j < kbe; j += 4) {
            const uint16_t *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
            MSKV__M4(MSKV__DECL)
            for (d = 0; d + 16 <= dim; d += 16) {
                __m512 x0 = MSKV__H16_AVX512(k0 + d, bf16), x1 = MSKV__H16_AVX512(k1 + d, bf16);
                __m512 x2 = MSKV__H16_AVX512(k2 + d, bf16), x3 = MSKV__H16_AVX512(k3 + d, bf16);
                MSKV__M4(MSKV__STEP)
            }
            if (d < dim) {
                __m512 x0 = mskv__cpu_h16_avx512(k0, d, dim, bf16), x1 = mskv__cpu_h16_avx512(k1, d, dim, bf16);
                __m512 x2 = mskv__cpu_h16_avx512(k2, d, dim, bf16), x3 = mskv__cpu_h16_avx512(k3, d, dim, bf16);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_qk_tail_avx512(S + (size_t)r * ks + j, ks, c00, c01, c02, c03, c10, c11, c12, c13,
                                     c20, c21, c22, c23, c30, c31, c32, c33);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

/* As pv_rows_avx512, each V element converted once for the 4 rows. */
static MSKV__CPU_AVX512 void mskv__cpu_pv_rows16_avx512(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                                        const uint16_t *const *MSKV__CPU_RESTRICT vrow, int bf16, const float *MSKV__CPU_RESTRICT alpha,
                                                        int32_t nrp, int32_t kb, int32_t dim, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m512 c##u##0 = _mm512_mul_ps(_mm512_loadu_ps(O + (size_t)(r + (u)) * dp + d), _mm512_set1_ps(alpha[r + (u)])), \
    c##u##1 = two ? _mm512_mul_ps(_mm512_loadu_ps(O + (size_t)(r + (u)) * dp + d + 16), _mm512_set1_ps(alpha[r + (u)])) : c##u##0;
#define MSKV__STEP(u) { __m512 p = _mm512_set1_ps(P[(size_t)(r + (u)) * ks + j]); \
    c##u##0 = _mm512_fmadd_ps(p, y0, c##u##0); c##u##1 = _mm512_fmadd_ps(p, y1, c##u##1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (d = 0; d < dim; d += 32) {
            const int two = d + 16 < dim;  /* else only the first 16 dims (c*1 then run spare) */
            MSKV__M4(MSKV__DECL)
            if (d + 32 <= dim)
                for (j = 0; j < kb; j++) {
                    __m512 y0 = MSKV__H16_AVX512(vrow[j] + d, bf16), y1 = MSKV__H16_AVX512(vrow[j] + d + 16, bf16);
                    MSKV__M4(MSKV__STEP)
                }
            else  /* the last dims: whole and partial vectors through the helper */
                for (j = 0; j < kb; j++) {
                    __m512 y0 = mskv__cpu_h16_avx512(vrow[j], d, dim, bf16), y1 = two ? mskv__cpu_h16_avx512(vrow[j], d + 16, dim, bf16) : y0;
                    MSKV__M4(MSKV__STEP)
                }
            mskv__cpu_pv_tail_avx512(O + (size_t)r * dp + d, dp, two, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static const mskv__cpu_kern mskv__cpu_kern_avx512 = {
    MSKV_CPU_ISA_AVX512, 16, mskv__cpu_cvt_avx512, mskv__cpu_gemm_avx512, mskv__cpu_softmax_avx512,
    mskv__cpu_qk_rows_avx512, mskv__cpu_pv_rows_avx512, mskv__cpu_exp_row_avx512,
    mskv__cpu_qk_rows16_avx512, mskv__cpu_pv_rows16_avx512, NULL};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* MSKV__CPU_X86 */

/* ---- bf16 arithmetic: vdpbf16ps (AVX512_BF16), and the same in plain C ---- */

/* The contract of vdpbf16ps on one f32 lane, as Intel's description states
   it: acc += a.hi * b.hi, then acc += a.lo * b.lo (the odd element of each
   pair first), each step a fused multiply-add rounded to nearest even
   whatever MXCSR says; denormal inputs (the bf16 elements and, assumed
   here, the accumulator) count as zeros of their sign and a denormal result
   is flushed to zero. The plain C version below assumes a bf16 x bf16
   product is exact in f32 (two 8-bit significands), which holds unless it
   falls under 2^-126, so its unfused sum is the fused one for every
   product of at least that size (smaller ones may differ by far less than
   any tolerance); NaN payloads are not reproduced (a NaN still gives a NaN). */
static float mskv__cpu_bf16_ftz(float x) {
    uint32_t u = mskv__cpu_fbits(x);
    return (u & 0x7f800000u) ? x : mskv__cpu_bitsf(u & 0x80000000u);
}
/* Element hi (1) or lo (0) of a pair as f32, a denormal as zero. */
static float mskv__cpu_bf16_elem(uint32_t pair, int hi) {
    uint32_t u = hi ? pair & 0xffff0000u : pair << 16;
    return mskv__cpu_bitsf((u & 0x7f800000u) ? u : u & 0x80000000u);
}
static float mskv__cpu_dot2_emu(float acc, uint32_t a, uint32_t b) {
    acc = mskv__cpu_bf16_ftz(acc);
    acc = mskv__cpu_bf16_ftz(acc + mskv__cpu_bf16_elem(a, 1) * mskv__cpu_bf16_elem(b, 1));
    return mskv__cpu_bf16_ftz(acc + mskv__cpu_bf16_elem(a, 0) * mskv__cpu_bf16_elem(b, 0));
}

/* One accumulator per (i, r), pairs in order k = 0, 1, ...: the order the
   AVX-512 kernel keeps in each lane. */
static void mskv__cpu_gemm_bf16_emu(const uint32_t *MSKV__CPU_RESTRICT A, ptrdiff_t ais, const uint32_t *MSKV__CPU_RESTRICT B,
                                    float *MSKV__CPU_RESTRICT C, const float *MSKV__CPU_RESTRICT alpha, int32_t n,
                                    int32_t kp, int32_t rp) {
    int32_t i, k, r;
    for (i = 0; i < n; i++) {
        float *c = C + (size_t)i * (size_t)rp;
        const uint32_t *a = A + i * ais;
        for (r = 0; r < rp; r++) c[r] = alpha ? c[r] * alpha[r] : 0.0f;
        for (k = 0; k < kp; k++) {
            const uint32_t x = a[k], *b = B + (size_t)k * (size_t)rp;
            for (r = 0; r < rp; r++) c[r] = mskv__cpu_dot2_emu(c[r], x, b[r]);
        }
    }
}

/* The emulation runs the portable kernels elsewhere, with the AVX-512 path's
   row width so its tiles are the real path's. */
static const mskv__cpu_kern mskv__cpu_kern_bf16_emu = {
    MSKV_CPU_ISA_BF16_EMU, 16, mskv__cpu_cvt_portable, mskv__cpu_gemm_portable, mskv__cpu_softmax_portable,
    mskv__cpu_qk_rows_portable, mskv__cpu_pv_rows_portable, mskv__cpu_exp_row_portable,
    mskv__cpu_qk_rows16_portable, mskv__cpu_pv_rows16_portable, mskv__cpu_gemm_bf16_emu};

/* The real instruction: GCC 10 and Clang 9 on (their first with the
   AVX512_BF16 intrinsics); MSVC builds, older compilers and MSKV_CPU_NO_BF16
   lack the path. */
#if MSKV__CPU_X86 && !defined(MSKV_CPU_NO_BF16) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define MSKV__CPU_BF16_X86 1
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  /* GCC 12 and the AVX-512 intrinsics, as above */
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define MSKV__CPU_AVX512BF16 MSKV__CPU_TARGET("avx512f,avx512bw,avx512bf16,avx2,fma,f16c")
#define MSKV__BF16_BCAST(x) ((__m512bh)_mm512_set1_epi32((int)(x)))
#define MSKV__BF16_LOAD(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))

/* 4 outputs x 64 rows (4 vectors): 16 accumulators. */
static MSKV__CPU_AVX512BF16 void mskv__cpu_gemmbf16_4x4(const uint32_t *MSKV__CPU_RESTRICT A, ptrdiff_t ais,
                                                        const uint32_t *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                        const float *MSKV__CPU_RESTRICT alpha, int32_t kp, int32_t rp) {
#define MSKV__DECL(u) __m512 c##u##0, c##u##1, c##u##2, c##u##3;
#define MSKV__INIT(u) \
    c##u##0 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp), a0) : z; \
    c##u##1 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp + 16), a1) : z; \
    c##u##2 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp + 32), a2) : z; \
    c##u##3 = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C + (u) * rp + 48), a3) : z;
#define MSKV__STEP(u) { __m512bh s = MSKV__BF16_BCAST(A[(u) * ais + k]); \
    c##u##0 = _mm512_dpbf16_ps(c##u##0, s, y0); c##u##1 = _mm512_dpbf16_ps(c##u##1, s, y1); \
    c##u##2 = _mm512_dpbf16_ps(c##u##2, s, y2); c##u##3 = _mm512_dpbf16_ps(c##u##3, s, y3); }
#define MSKV__STORE(u) \
    _mm512_storeu_ps(C + (u) * rp, c##u##0); _mm512_storeu_ps(C + (u) * rp + 16, c##u##1); \
    _mm512_storeu_ps(C + (u) * rp + 32, c##u##2); _mm512_storeu_ps(C + (u) * rp + 48, c##u##3);
    const __m512 z = _mm512_setzero_ps();
    const __m512 a0 = alpha ? _mm512_loadu_ps(alpha) : z, a1 = alpha ? _mm512_loadu_ps(alpha + 16) : z;
    const __m512 a2 = alpha ? _mm512_loadu_ps(alpha + 32) : z, a3 = alpha ? _mm512_loadu_ps(alpha + 48) : z;
    int32_t k;
    MSKV__M4(MSKV__DECL)
    MSKV__M4(MSKV__INIT)
    for (k = 0; k < kp; k++) {
        const uint32_t *b = B + (size_t)k * rp;
        __m512bh y0 = MSKV__BF16_LOAD(b), y1 = MSKV__BF16_LOAD(b + 16), y2 = MSKV__BF16_LOAD(b + 32), y3 = MSKV__BF16_LOAD(b + 48);
        MSKV__M4(MSKV__STEP)
    }
    MSKV__M4(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__INIT
#undef MSKV__STEP
#undef MSKV__STORE
}

/* One output, one vector of rows (the tails). */
static MSKV__CPU_AVX512BF16 void mskv__cpu_gemmbf16_1x1(const uint32_t *MSKV__CPU_RESTRICT A, const uint32_t *MSKV__CPU_RESTRICT B,
                                                        float *MSKV__CPU_RESTRICT C, const float *MSKV__CPU_RESTRICT alpha,
                                                        int32_t kp, int32_t rp) {
    __m512 c = alpha ? _mm512_mul_ps(_mm512_loadu_ps(C), _mm512_loadu_ps(alpha)) : _mm512_setzero_ps();
    int32_t k;
    for (k = 0; k < kp; k++) c = _mm512_dpbf16_ps(c, MSKV__BF16_BCAST(A[k]), MSKV__BF16_LOAD(B + (size_t)k * rp));
    _mm512_storeu_ps(C, c);
}

static MSKV__CPU_AVX512BF16 void mskv__cpu_gemm_bf16_avx512(const uint32_t *MSKV__CPU_RESTRICT A, ptrdiff_t ais,
                                                            const uint32_t *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                            const float *MSKV__CPU_RESTRICT alpha, int32_t n, int32_t kp, int32_t rp) {
    int32_t v = 0, i, x;
    for (; v + 64 <= rp; v += 64) {
        for (i = 0; i + 4 <= n; i += 4)
            mskv__cpu_gemmbf16_4x4(A + i * ais, ais, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kp, rp);
        for (; i < n; i++)
            for (x = 0; x < 64; x += 16)
                mskv__cpu_gemmbf16_1x1(A + i * ais, B + v + x, C + (size_t)i * rp + v + x, alpha ? alpha + v + x : NULL, kp, rp);
    }
    for (; v < rp; v += 16)
        for (i = 0; i < n; i++)
            mskv__cpu_gemmbf16_1x1(A + i * ais, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kp, rp);
}
#undef MSKV__BF16_BCAST
#undef MSKV__BF16_LOAD

/* The AVX-512 path with the bf16 products for bf16 pools' video items. */
static const mskv__cpu_kern mskv__cpu_kern_avx512_bf16 = {
    MSKV_CPU_ISA_AVX512_BF16, 16, mskv__cpu_cvt_avx512, mskv__cpu_gemm_avx512, mskv__cpu_softmax_avx512,
    mskv__cpu_qk_rows_avx512, mskv__cpu_pv_rows_avx512, mskv__cpu_exp_row_avx512,
    mskv__cpu_qk_rows16_avx512, mskv__cpu_pv_rows16_avx512, mskv__cpu_gemm_bf16_avx512};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
#define MSKV__CPU_BF16_X86 0
#endif

/* ---- AMX-BF16 path (x86-64 Linux; GCC 11 / Clang 12 on) ----
   Q.K and P.V of bf16 pools' video items as AMX tile products (TDPBF16PS:
   C[16][16] f32 += A[16][16 bf16 pairs] . B[16 pairs][16], each pair's two
   products summed into C in f32, denormals as zero, round to nearest even);
   everything else is the AVX-512 path. Linux lends a process the tile
   registers only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA,
   kernel 5.16 on): mskv__cpu_has asks once. The tile instructions are
   written as inline assembly (AT&T and Intel spellings), so no compiler
   flag or AMX intrinsic header is needed. MSKV_CPU_NO_AMX leaves it out. */
#if MSKV__CPU_X86 && defined(__x86_64__) && defined(__linux__) && !defined(MSKV_CPU_NO_AMX) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define MSKV__CPU_AMX 1
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  /* GCC 12 and the AVX-512 intrinsics, as above */
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define MSKV__AMX_LOAD(t, p, s) \
    __asm__ __volatile__("{tileloadd (%0,%1,1), %%tmm" #t "|tileloadd tmm" #t ", [%0+%1*1]}" ::"r"(p), "r"((long)(s)) : "memory")
#define MSKV__AMX_STORE(t, p, s) \
    __asm__ __volatile__("{tilestored %%tmm" #t ", (%0,%1,1)|tilestored [%0+%1*1], tmm" #t "}" ::"r"(p), "r"((long)(s)) : "memory")
#define MSKV__AMX_ZERO(t) __asm__ __volatile__("tilezero %%tmm" #t ::)
/* c += a . b (tile numbers) */
#define MSKV__AMX_DP(c, a, b) __asm__ __volatile__("{tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c "|tdpbf16ps tmm" #c ", tmm" #a ", tmm" #b "}" ::)

/* Every tile 16 rows of 64 bytes (palette 1): tmm0-3 hold C, tmm4-5 A,
   tmm6-7 B. Callers pad every operand to whole tiles. */
static void mskv__amx_on(void) {
    static const unsigned char cfg[64] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0};
    __asm__ __volatile__("{ldtilecfg (%0)|ldtilecfg [%0]}" ::"r"(cfg) : "memory");
}
/* Gives the tile state back (a thread's context switches save less). */
static void mskv__amx_off(void) { __asm__ __volatile__("tilerelease" ::: "memory"); }

/* C[16 mt][16 nt] = (acc ? C : 0) + A[16 mt][16 kt] . B[16 kt][16 nt] in
   tiles, A and B bf16 pairs (uint32), C f32; lda, ldb, ldc in elements.
   Two by two C tiles at a time (four independent accumulators). */
static void mskv__amx_gemm(const uint32_t *A, size_t lda, const uint32_t *B, size_t ldb, float *C, size_t ldc, int32_t mt,
                           int32_t nt, int32_t kt, int acc) {
    const long sa = (long)lda * 4, sb = (long)ldb * 4, sc = (long)ldc * 4;
    int32_t i, j, k;
    for (i = 0; i < mt; i += 2)
        for (j = 0; j < nt; j += 2) {
            const int m2 = i + 1 < mt, n2 = j + 1 < nt;
            float *c0 = C + (size_t)i * 16 * ldc + (size_t)j * 16, *c2 = c0 + 16 * ldc;
            if (acc) {
                MSKV__AMX_LOAD(0, c0, sc);
                if (n2) MSKV__AMX_LOAD(1, c0 + 16, sc);
                if (m2) MSKV__AMX_LOAD(2, c2, sc);
                if (m2 && n2) MSKV__AMX_LOAD(3, c2 + 16, sc);
            } else {
                MSKV__AMX_ZERO(0);
                MSKV__AMX_ZERO(1);
                MSKV__AMX_ZERO(2);
                MSKV__AMX_ZERO(3);
            }
            for (k = 0; k < kt; k++) {
                const uint32_t *a = A + (size_t)i * 16 * lda + (size_t)k * 16, *b = B + (size_t)k * 16 * ldb + (size_t)j * 16;
                MSKV__AMX_LOAD(4, a, sa);
                MSKV__AMX_LOAD(6, b, sb);
                MSKV__AMX_DP(0, 4, 6);
                if (n2) { MSKV__AMX_LOAD(7, b + 16, sb); MSKV__AMX_DP(1, 4, 7); }
                if (m2) { MSKV__AMX_LOAD(5, a + 16 * lda, sa); MSKV__AMX_DP(2, 5, 6); }
                if (m2 && n2) MSKV__AMX_DP(3, 5, 7);
            }
            MSKV__AMX_STORE(0, c0, sc);
            if (n2) MSKV__AMX_STORE(1, c0 + 16, sc);
            if (m2) MSKV__AMX_STORE(2, c2, sc);
            if (m2 && n2) MSKV__AMX_STORE(3, c2 + 16, sc);
        }
}

/* f32 lanes to bf16 (round to nearest even, a NaN stays a quiet NaN) in the
   upper 16 bits of each lane, the lower 16 bits left as they come. */
static MSKV__CPU_AVX512 __m512i mskv__amx_bf16_hi(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
}

/* The online softmax of mskv__cpu_softmax_avx512 (running max m and sum l
   per row, alpha the rescale of O) that leaves P^T as bf16 pairs along the
   key axis in place of the scores: row p becomes pairs (P[2p], P[2p + 1])
   (a missing 2p + 1 as 0) as soon as its two exponentials are made, rows kh
   .. kh16 - 1 zero. Row p is written after rows 2p and 2p + 1 are read, and
   no later pair reads a row under p. */
static MSKV__CPU_AVX512 void mskv__amx_softmax_pack(float *S, int32_t rp, int32_t kb, int32_t kh16, const int32_t *a, const int32_t *z,
                                                    int full, float *m, float *l, float *alpha) {
    uint32_t *P = (uint32_t *)(void *)S;
    const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000u);
    const int32_t kh = (kb + 1) / 2;
    int32_t v, p;
    for (v = 0; v < rp; v += 16) {
        __m512 mn, al, sum = _mm512_setzero_ps();
        __m512i av, zv;
        mskv__cpu_softmax_max512(S, rp, kb, a, z, full, m, v, &av, &zv, &mn, &al);
        for (p = 0; p < kh; p++) {
            const float *s0 = S + (size_t)(2 * p) * rp + v;
            __m512 p0 = _mm512_maskz_mov_ps(mskv__cpu_vis512(av, zv, 2 * p), mskv__cpu_exp512(_mm512_sub_ps(_mm512_loadu_ps(s0), mn))), p1;
            sum = _mm512_add_ps(sum, p0);
            if (2 * p + 1 < kb) {
                p1 = _mm512_maskz_mov_ps(mskv__cpu_vis512(av, zv, 2 * p + 1), mskv__cpu_exp512(_mm512_sub_ps(_mm512_loadu_ps(s0 + rp), mn)));
                sum = _mm512_add_ps(sum, p1);
            } else {
                p1 = _mm512_setzero_ps();
            }
            _mm512_storeu_si512((void *)(P + (size_t)p * (size_t)rp + v),
                                _mm512_or_si512(_mm512_srli_epi32(mskv__amx_bf16_hi(p0), 16), _mm512_and_si512(mskv__amx_bf16_hi(p1), hi16)));
        }
        for (; p < kh16; p++) _mm512_storeu_si512((void *)(P + (size_t)p * (size_t)rp + v), _mm512_setzero_si512());
        mskv__cpu_softmax_end512(m, l, alpha, v, mn, al, sum);
    }
}

/* 16 x 16 32-bit transpose: r[i] holds row i; on return r[i] holds column i. */
static MSKV__CPU_AVX512 MSKV__ALWAYS_INLINE void mskv__amx_transpose16(__m512i *r) {
    __m512i t[16], u[16];
    int i, e;
    for (i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (i = 0; i < 16; i += 4) { /* u[i + e]: lane L holds column 4L + e of rows i .. i + 3 */
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (e = 0; e < 4; e++) {
        __m512i v = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), w = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88), w2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
        r[e] = _mm512_shuffle_i32x4(v, v2, 0x88);
        r[8 + e] = _mm512_shuffle_i32x4(v, v2, 0xdd);
        r[4 + e] = _mm512_shuffle_i32x4(w, w2, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(w, w2, 0xdd);
    }
}

/* V^T of one key block into bf16 pairs along the key axis: vt[d][p] =
   (V[2p][d], V[2p + 1][d]) for d < D16, p < kh16 (kh16 a multiple of 16),
   zero past the block's keys and past D. vrow[j] is key j's row (kb rows). */
static MSKV__CPU_AVX512 void mskv__amx_pack_vt(uint32_t *vt, const uint16_t *const *vrow, int32_t kb, int32_t D, int32_t kh16) {
    const int32_t D16 = (D + 15) & ~15;
    int32_t p0, d0, i;
    for (p0 = 0; p0 < kh16; p0 += 16)
        for (d0 = 0; d0 < D16; d0 += 16) {
            __m512i r[16];
            for (i = 0; i < 16; i++) {  /* r[i]: pair p0 + i over dims d0 .. d0 + 15 */
                const int32_t ja = 2 * (p0 + i), jb = ja + 1;
                if (d0 + 16 <= D) {
                    __m512i a = ja < kb ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(vrow[ja] + d0)))
                                        : _mm512_setzero_si512();
                    __m512i b = jb < kb ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(vrow[jb] + d0)))
                                        : _mm512_setzero_si512();
                    r[i] = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
                } else {  /* the last dims of a head_dim that is not a multiple of 16 */
                    uint32_t w[16];
                    int32_t d;
                    for (d = 0; d < 16; d++)
                        w[d] = d0 + d < D ? (ja < kb ? (uint32_t)vrow[ja][d0 + d] : 0u) | (jb < kb ? (uint32_t)vrow[jb][d0 + d] << 16 : 0u) : 0u;
                    r[i] = _mm512_loadu_si512((const void *)w);
                }
            }
            mskv__amx_transpose16(r);
            for (i = 0; i < 16; i++) _mm512_storeu_si512((void *)(vt + (size_t)(d0 + i) * (size_t)kh16 + p0), r[i]);
        }
}

/* O^T[d][r] *= alpha[r] for d < D (nothing to do where alpha is 1: a row
   whose running max did not move). */
static MSKV__CPU_AVX512 void mskv__amx_scale_o(float *O, const float *alpha, int32_t D, int32_t rp) {
    int32_t d, v;
    for (v = 0; v < rp; v += 16) {
        const __m512 a = _mm512_loadu_ps(alpha + v);
        if (_mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_EQ_OQ) == 0xffff) continue;
        for (d = 0; d < D; d++) _mm512_storeu_ps(O + (size_t)d * (size_t)rp + v, _mm512_mul_ps(_mm512_loadu_ps(O + (size_t)d * (size_t)rp + v), a));
    }
}

/* The AVX-512 path with AMX tile products for bf16 pools' video items
   (mskv__cpu_item_wide_amx). */
static const mskv__cpu_kern mskv__cpu_kern_amx_bf16 = {
    MSKV_CPU_ISA_AMX_BF16, 16, mskv__cpu_cvt_avx512, mskv__cpu_gemm_avx512, mskv__cpu_softmax_avx512,
    mskv__cpu_qk_rows_avx512, mskv__cpu_pv_rows_avx512, mskv__cpu_exp_row_avx512,
    mskv__cpu_qk_rows16_avx512, mskv__cpu_pv_rows16_avx512, NULL};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
#define MSKV__CPU_AMX 0
#endif

/* ---- AVX2 path (8 floats a vector; needs FMA and F16C, which every AVX2 CPU has) ---- */
#if MSKV__CPU_X86
#define MSKV__CPU_AVX2 MSKV__CPU_TARGET("avx2,fma,f16c")

static MSKV__CPU_AVX2 __m256 mskv__cpu_exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(MSKV__EXP_LO), magic = _mm256_set1_ps(MSKV__EXP_MAGIC);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GT_OQ), t, kf, r, p;
    __m256i ki;
    x = _mm256_max_ps(x, lo);
    t = _mm256_fmadd_ps(x, _mm256_set1_ps(MSKV__EXP_LOG2E), magic);
    kf = _mm256_sub_ps(t, magic);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(MSKV__EXP_LN2HI), x);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(MSKV__EXP_LN2LO), r);
    p = _mm256_fmadd_ps(_mm256_set1_ps(MSKV__EXP_C6), r, _mm256_set1_ps(MSKV__EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MSKV__EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MSKV__EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    ki = _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic)),
                                            _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(ki)), keep);
}

static MSKV__CPU_AVX2 float mskv__cpu_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static MSKV__CPU_AVX2 void mskv__cpu_cvt_avx2(float *MSKV__CPU_RESTRICT dst, const uint16_t *MSKV__CPU_RESTRICT src, int bf16, int32_t n) {
    int32_t i = 0;
    if (bf16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i))), 16)));
    else
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    mskv__cpu_cvt_portable(dst + i, src + i, bf16, n - i);
}

/* 16 rows (2 vectors) x 6 outputs: 12 accumulators of the 16 registers. */
static MSKV__CPU_AVX2 void mskv__cpu_gemm256_2x6(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                                 const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                 const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
#define MSKV__DECL(u) __m256 c##u##0 = alpha ? _mm256_mul_ps(_mm256_loadu_ps(C + (u) * rp), a0) : z, \
    c##u##1 = alpha ? _mm256_mul_ps(_mm256_loadu_ps(C + (u) * rp + 8), a1) : z;
#define MSKV__STEP(u) { __m256 s = _mm256_broadcast_ss(a + (u) * ais); \
    c##u##0 = _mm256_fmadd_ps(s, y0, c##u##0); c##u##1 = _mm256_fmadd_ps(s, y1, c##u##1); }
#define MSKV__STORE(u) _mm256_storeu_ps(C + (u) * rp, c##u##0); _mm256_storeu_ps(C + (u) * rp + 8, c##u##1);
    const __m256 z = _mm256_setzero_ps();
    const __m256 a0 = alpha ? _mm256_loadu_ps(alpha) : z, a1 = alpha ? _mm256_loadu_ps(alpha + 8) : z;
    int32_t k;
    MSKV__M6(MSKV__DECL)
    for (k = 0; k < kd; k++) {
        const float *b = B + (size_t)k * rp, *a = A + k * aks;
        __m256 y0 = _mm256_loadu_ps(b), y1 = _mm256_loadu_ps(b + 8);
        MSKV__M6(MSKV__STEP)
    }
    MSKV__M6(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__STEP
#undef MSKV__STORE
}

/* 8 rows (1 vector) x 8 outputs: 8 accumulators. */
static MSKV__CPU_AVX2 void mskv__cpu_gemm256_1x8(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                                 const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                                 const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
#define MSKV__DECL(u) __m256 c##u = alpha ? _mm256_mul_ps(_mm256_loadu_ps(C + (u) * rp), a0) : z;
#define MSKV__STEP(u) c##u = _mm256_fmadd_ps(_mm256_broadcast_ss(a + (u) * ais), y0, c##u);
#define MSKV__STORE(u) _mm256_storeu_ps(C + (u) * rp, c##u);
    const __m256 z = _mm256_setzero_ps(), a0 = alpha ? _mm256_loadu_ps(alpha) : z;
    int32_t k;
    MSKV__M8(MSKV__DECL)
    for (k = 0; k < kd; k++) {
        const float *a = A + k * aks;
        __m256 y0 = _mm256_loadu_ps(B + (size_t)k * rp);
        MSKV__M8(MSKV__STEP)
    }
    MSKV__M8(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__STEP
#undef MSKV__STORE
}

static MSKV__CPU_AVX2 void mskv__cpu_gemm256_1x1(const float *MSKV__CPU_RESTRICT A, ptrdiff_t aks, const float *MSKV__CPU_RESTRICT B,
                                                 float *MSKV__CPU_RESTRICT C, const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
    __m256 c = alpha ? _mm256_mul_ps(_mm256_loadu_ps(C), _mm256_loadu_ps(alpha)) : _mm256_setzero_ps();
    int32_t k;
    for (k = 0; k < kd; k++) c = _mm256_fmadd_ps(_mm256_broadcast_ss(A + k * aks), _mm256_loadu_ps(B + (size_t)k * rp), c);
    _mm256_storeu_ps(C, c);
}

static MSKV__CPU_AVX2 void mskv__cpu_gemm_avx2(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                               const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                               const float *MSKV__CPU_RESTRICT alpha, int32_t n, int32_t kd, int32_t rp) {
    int32_t v = 0, i, x;
    for (; v + 16 <= rp; v += 16) {
        for (i = 0; i + 6 <= n; i += 6)
            mskv__cpu_gemm256_2x6(A + i * ais, ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
        for (; i < n; i++)
            for (x = 0; x < 16; x += 8)
                mskv__cpu_gemm256_1x1(A + i * ais, aks, B + v + x, C + (size_t)i * rp + v + x, alpha ? alpha + v + x : NULL, kd, rp);
    }
    for (; v < rp; v += 8) {
        for (i = 0; i + 8 <= n; i += 8)
            mskv__cpu_gemm256_1x8(A + i * ais, ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
        for (; i < n; i++)
            mskv__cpu_gemm256_1x1(A + i * ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
    }
}

static MSKV__CPU_AVX2 void mskv__cpu_softmax_avx2(float *MSKV__CPU_RESTRICT S, int32_t rp, int32_t kb, const int32_t *a,
                                                  const int32_t *z, int full, float *m, float *l, float *alpha) {
    int32_t v, j;
    for (v = 0; v < rp; v += 8) {
        __m256 mo = _mm256_loadu_ps(m + v), mx = _mm256_set1_ps(-INFINITY), mn, al, sum = _mm256_setzero_ps();
        /* visible: a <= j < z, as a - 1 < j and j < z */
        __m256i am1 = full ? _mm256_set1_epi32(-1) : _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(a + v)), _mm256_set1_epi32(1));
        __m256i zv = full ? _mm256_set1_epi32(kb) : _mm256_loadu_si256((const __m256i *)(const void *)(z + v));
        for (j = 0; j < kb; j++) {
            __m256i jv = _mm256_set1_epi32(j);
            __m256 vis = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(jv, am1), _mm256_cmpgt_epi32(zv, jv)));
            mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, _mm256_loadu_ps(S + (size_t)j * rp + v)), vis);
        }
        mn = _mm256_max_ps(mo, mx);
        al = _mm256_blendv_ps(mskv__cpu_exp256(_mm256_sub_ps(mo, mn)), _mm256_set1_ps(1.0f), _mm256_cmp_ps(mo, mn, _CMP_EQ_OQ));
        for (j = 0; j < kb; j++) {
            __m256i jv = _mm256_set1_epi32(j);
            __m256 vis = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(jv, am1), _mm256_cmpgt_epi32(zv, jv)));
            float *s = S + (size_t)j * rp + v;
            __m256 p = _mm256_and_ps(mskv__cpu_exp256(_mm256_sub_ps(_mm256_loadu_ps(s), mn)), vis);
            _mm256_storeu_ps(s, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_storeu_ps(l + v, _mm256_fmadd_ps(_mm256_loadu_ps(l + v), al, sum));
        _mm256_storeu_ps(m + v, mn);
        _mm256_storeu_ps(alpha + v, al);
    }
}

/* The tail of the qk_rows kernels (f32 and 16-bit rows): 4 rows x 2 keys of
   sums, c<row><key>, reduced together with horizontal adds (rows 0,1 then
   2,3: [r k0, r k1, r' k0, r' k1] per 128 bits, then the halves added) and
   stored at S[row * ks + key]. */
static MSKV__CPU_AVX2 MSKV__ALWAYS_INLINE void mskv__cpu_qk_tail_avx2(float *S, int32_t ks, __m256 c00, __m256 c01, __m256 c10, __m256 c11,
                                                                      __m256 c20, __m256 c21, __m256 c30, __m256 c31) {
    __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(c00, c01), _mm256_hadd_ps(c10, c11));
    __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(c20, c21), _mm256_hadd_ps(c30, c31));
    __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(g0), _mm256_extractf128_ps(g0, 1));
    __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(g1), _mm256_extractf128_ps(g1, 1));
    _mm_storel_pi((__m64 *)(void *)S, s0);
    _mm_storeh_pi((__m64 *)(void *)(S + ks), s0);
    _mm_storel_pi((__m64 *)(void *)(S + 2 * (size_t)ks), s1);
    _mm_storeh_pi((__m64 *)(void *)(S + 3 * (size_t)ks), s1);
}

/* The tail of the pv_rows kernels (f32 and 16-bit rows): 4 rows' 16 dims
   of O, c<row>0 and c<row>1, stored at O + row * dp. */
static MSKV__CPU_AVX2 MSKV__ALWAYS_INLINE void mskv__cpu_pv_tail_avx2(float *O, int32_t dp, __m256 c00, __m256 c01, __m256 c10, __m256 c11,
                                                                      __m256 c20, __m256 c21, __m256 c30, __m256 c31) {
    _mm256_storeu_ps(O, c00); _mm256_storeu_ps(O + 8, c01);
    _mm256_storeu_ps(O + (size_t)dp, c10); _mm256_storeu_ps(O + (size_t)dp + 8, c11);
    _mm256_storeu_ps(O + 2 * (size_t)dp, c20); _mm256_storeu_ps(O + 2 * (size_t)dp + 8, c21);
    _mm256_storeu_ps(O + 3 * (size_t)dp, c30); _mm256_storeu_ps(O + 3 * (size_t)dp + 8, c31);
}

/* 4 rows x 2 keys of dot products; the 8 sums reduced together with
   horizontal adds. kbe is even. */
static MSKV__CPU_AVX2 void mskv__cpu_qk_rows_avx2(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                                                  float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m256 c##u##0 = _mm256_setzero_ps(), c##u##1 = c##u##0;
#define MSKV__STEP(u) { __m256 q = _mm256_loadu_ps(Q + (size_t)(r + (u)) * dp + d); \
    c##u##0 = _mm256_fmadd_ps(q, x0, c##u##0); c##u##1 = _mm256_fmadd_ps(q, x1, c##u##1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (j = 0; j < kbe; j += 2) {
            const float *k0 = krow[j], *k1 = krow[j + 1];
            MSKV__M4(MSKV__DECL)
            for (d = 0; d < dp; d += 8) {
                __m256 x0 = _mm256_loadu_ps(k0 + d), x1 = _mm256_loadu_ps(k1 + d);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_qk_tail_avx2(S + (size_t)r * ks + j, ks, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static MSKV__CPU_AVX2 void mskv__cpu_pv_rows_avx2(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                                  const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                                                  int32_t nrp, int32_t kb, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m256 c##u##0 = _mm256_mul_ps(_mm256_loadu_ps(O + (size_t)(r + (u)) * dp + d), _mm256_set1_ps(alpha[r + (u)])), \
    c##u##1 = _mm256_mul_ps(_mm256_loadu_ps(O + (size_t)(r + (u)) * dp + d + 8), _mm256_set1_ps(alpha[r + (u)]));
#define MSKV__STEP(u) { __m256 p = _mm256_broadcast_ss(P + (size_t)(r + (u)) * ks + j); \
    c##u##0 = _mm256_fmadd_ps(p, y0, c##u##0); c##u##1 = _mm256_fmadd_ps(p, y1, c##u##1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (d = 0; d < dp; d += 16) {
            MSKV__M4(MSKV__DECL)
            for (j = 0; j < kb; j++) {
                const float *vr = vrow[j] + d;
                __m256 y0 = _mm256_loadu_ps(vr), y1 = _mm256_loadu_ps(vr + 8);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_pv_tail_avx2(O + (size_t)r * dp + d, dp, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static MSKV__CPU_AVX2 float mskv__cpu_exp_row_avx2(float *MSKV__CPU_RESTRICT s, float m, int32_t n) {
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int32_t j;
    for (j = 0; j < n; j += 8) {
        __m256 p = mskv__cpu_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, p);
        acc = _mm256_add_ps(acc, p);
    }
    return mskv__cpu_hsum256(acc);
}

/* Elements [at, at + 8) of a 16-bit row of dim elements as floats; those
   past dim read as 0 (and are not read). */
static MSKV__CPU_AVX2 __m256 mskv__cpu_h8_avx2(const uint16_t *row, int32_t at, int32_t dim, int bf16) {
    __m128i h;
    if (at + 8 <= dim) {
        h = _mm_loadu_si128((const __m128i *)(const void *)(row + at));
    } else {
        uint16_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (at < dim) memcpy(t, row + at, (size_t)(dim - at) * 2);
        h = _mm_loadu_si128((const __m128i *)(const void *)t);
    }
    return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

/* 8 whole elements at p, converted in line (the helper above is for tails). */
#define MSKV__H8_AVX2(p, bf16) ((bf16) ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32( \
    _mm_loadu_si128((const __m128i *)(const void *)(p))), 16)) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p))))

/* As qk_rows_avx2, each K element converted once for the 4 rows. */
static MSKV__CPU_AVX2 void mskv__cpu_qk_rows16_avx2(const float *MSKV__CPU_RESTRICT Q, const uint16_t *const *MSKV__CPU_RESTRICT krow, int bf16,
                                                    float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dim, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m256 c##u##0 = _mm256_setzero_ps(), c##u##1 = c##u##0;
#define MSKV__STEP(u) { __m256 q = _mm256_loadu_ps(Q + (size_t)(r + (u)) * dp + d); \
    c##u##0 = _mm256_fmadd_ps(q, x0, c##u##0); c##u##1 = _mm256_fmadd_ps(q, x1, c##u##1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (j = 0; j < kbe; j += 2) {
            const uint16_t *k0 = krow[j], *k1 = krow[j + 1];
            MSKV__M4(MSKV__DECL)
            for (d = 0; d + 8 <= dim; d += 8) {
                __m256 x0 = MSKV__H8_AVX2(k0 + d, bf16), x1 = MSKV__H8_AVX2(k1 + d, bf16);
                MSKV__M4(MSKV__STEP)
            }
            if (d < dim) {
                __m256 x0 = mskv__cpu_h8_avx2(k0, d, dim, bf16), x1 = mskv__cpu_h8_avx2(k1, d, dim, bf16);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_qk_tail_avx2(S + (size_t)r * ks + j, ks, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

/* As pv_rows_avx2, each V element converted once for the 4 rows. */
static MSKV__CPU_AVX2 void mskv__cpu_pv_rows16_avx2(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                                    const uint16_t *const *MSKV__CPU_RESTRICT vrow, int bf16, const float *MSKV__CPU_RESTRICT alpha,
                                                    int32_t nrp, int32_t kb, int32_t dim, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) __m256 c##u##0 = _mm256_mul_ps(_mm256_loadu_ps(O + (size_t)(r + (u)) * dp + d), _mm256_set1_ps(alpha[r + (u)])), \
    c##u##1 = _mm256_mul_ps(_mm256_loadu_ps(O + (size_t)(r + (u)) * dp + d + 8), _mm256_set1_ps(alpha[r + (u)]));
#define MSKV__STEP(u) { __m256 p = _mm256_broadcast_ss(P + (size_t)(r + (u)) * ks + j); \
    c##u##0 = _mm256_fmadd_ps(p, y0, c##u##0); c##u##1 = _mm256_fmadd_ps(p, y1, c##u##1); }
    int32_t r, j, d;
    (void)dp;
    for (r = 0; r < nrp; r += 4)
        for (d = 0; d < dim; d += 16) {
            MSKV__M4(MSKV__DECL)
            if (d + 16 <= dim)
                for (j = 0; j < kb; j++) {
                    __m256 y0 = MSKV__H8_AVX2(vrow[j] + d, bf16), y1 = MSKV__H8_AVX2(vrow[j] + d + 8, bf16);
                    MSKV__M4(MSKV__STEP)
                }
            else  /* the last dims: whole and partial vectors through the helper */
                for (j = 0; j < kb; j++) {
                    __m256 y0 = mskv__cpu_h8_avx2(vrow[j], d, dim, bf16), y1 = mskv__cpu_h8_avx2(vrow[j], d + 8, dim, bf16);
                    MSKV__M4(MSKV__STEP)
                }
            mskv__cpu_pv_tail_avx2(O + (size_t)r * dp + d, dp, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static const mskv__cpu_kern mskv__cpu_kern_avx2 = {
    MSKV_CPU_ISA_AVX2, 8, mskv__cpu_cvt_avx2, mskv__cpu_gemm_avx2, mskv__cpu_softmax_avx2,
    mskv__cpu_qk_rows_avx2, mskv__cpu_pv_rows_avx2, mskv__cpu_exp_row_avx2,
    mskv__cpu_qk_rows16_avx2, mskv__cpu_pv_rows16_avx2, NULL};

/* GCC ends target-attributed AVX functions without vzeroupper, so a call on
   an AVX path returned with the upper halves of the vector registers dirty,
   and the caller's SSE code after it (libm's exp, the application's own)
   ran several times slower. Every thread clears them when its share of a
   call is done. */
static MSKV__CPU_AVX2 void mskv__cpu_zeroupper(void) { _mm256_zeroupper(); }
#endif /* MSKV__CPU_X86 */

/* ---- NEON path (arm64: 4 floats a vector, 32 registers) ---- */
#if MSKV__CPU_NEON
static float32x4_t mskv__cpu_exp_neon4(float32x4_t x) {
    const float32x4_t lo = vdupq_n_f32(MSKV__EXP_LO), magic = vdupq_n_f32(MSKV__EXP_MAGIC);
    uint32x4_t keep = vcgtq_f32(x, lo);
    float32x4_t t, kf, r, p;
    int32x4_t ki;
    x = vmaxq_f32(x, lo);
    t = vfmaq_f32(magic, x, vdupq_n_f32(MSKV__EXP_LOG2E));
    kf = vsubq_f32(t, magic);
    r = vfmsq_f32(x, kf, vdupq_n_f32(MSKV__EXP_LN2HI));
    r = vfmsq_f32(r, kf, vdupq_n_f32(MSKV__EXP_LN2LO));
    p = vfmaq_f32(vdupq_n_f32(MSKV__EXP_C5), vdupq_n_f32(MSKV__EXP_C6), r);
    p = vfmaq_f32(vdupq_n_f32(MSKV__EXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(MSKV__EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    ki = vshlq_n_s32(vaddq_s32(vsubq_s32(vreinterpretq_s32_f32(t), vreinterpretq_s32_f32(magic)), vdupq_n_s32(127)), 23);
    p = vmulq_f32(p, vreinterpretq_f32_s32(ki));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(p), keep));
}

static void mskv__cpu_cvt_neon(float *MSKV__CPU_RESTRICT dst, const uint16_t *MSKV__CPU_RESTRICT src, int bf16, int32_t n) {
    int32_t i = 0;
    if (bf16)
        for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(src + i), 16)));
    else
        for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
    mskv__cpu_cvt_portable(dst + i, src + i, bf16, n - i);
}

/* 16 rows (4 vectors) x 4 outputs: 16 accumulators. */
static void mskv__cpu_gemm_neon_4x4(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                    const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                    const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
#define MSKV__DECL(u) float32x4_t c##u##0, c##u##1, c##u##2, c##u##3;
#define MSKV__INIT(u) \
    c##u##0 = alpha ? vmulq_f32(vld1q_f32(C + (u) * rp), a0) : z; \
    c##u##1 = alpha ? vmulq_f32(vld1q_f32(C + (u) * rp + 4), a1) : z; \
    c##u##2 = alpha ? vmulq_f32(vld1q_f32(C + (u) * rp + 8), a2) : z; \
    c##u##3 = alpha ? vmulq_f32(vld1q_f32(C + (u) * rp + 12), a3) : z;
#define MSKV__STEP(u) { float s = a[(u) * ais]; \
    c##u##0 = vfmaq_n_f32(c##u##0, y0, s); c##u##1 = vfmaq_n_f32(c##u##1, y1, s); \
    c##u##2 = vfmaq_n_f32(c##u##2, y2, s); c##u##3 = vfmaq_n_f32(c##u##3, y3, s); }
#define MSKV__STORE(u) \
    vst1q_f32(C + (u) * rp, c##u##0); vst1q_f32(C + (u) * rp + 4, c##u##1); \
    vst1q_f32(C + (u) * rp + 8, c##u##2); vst1q_f32(C + (u) * rp + 12, c##u##3);
    const float32x4_t z = vdupq_n_f32(0.0f);
    const float32x4_t a0 = alpha ? vld1q_f32(alpha) : z, a1 = alpha ? vld1q_f32(alpha + 4) : z;
    const float32x4_t a2 = alpha ? vld1q_f32(alpha + 8) : z, a3 = alpha ? vld1q_f32(alpha + 12) : z;
    int32_t k;
    MSKV__M4(MSKV__DECL)
    MSKV__M4(MSKV__INIT)
    for (k = 0; k < kd; k++) {
        const float *b = B + (size_t)k * rp, *a = A + k * aks;
        float32x4_t y0 = vld1q_f32(b), y1 = vld1q_f32(b + 4), y2 = vld1q_f32(b + 8), y3 = vld1q_f32(b + 12);
        MSKV__M4(MSKV__STEP)
    }
    MSKV__M4(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__INIT
#undef MSKV__STEP
#undef MSKV__STORE
}

/* 4 rows (1 vector) x 8 outputs: 8 accumulators. */
static void mskv__cpu_gemm_neon_1x8(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                    const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                    const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
#define MSKV__DECL(u) float32x4_t c##u = alpha ? vmulq_f32(vld1q_f32(C + (u) * rp), a0) : z;
#define MSKV__STEP(u) c##u = vfmaq_n_f32(c##u, y0, a[(u) * ais]);
#define MSKV__STORE(u) vst1q_f32(C + (u) * rp, c##u);
    const float32x4_t z = vdupq_n_f32(0.0f), a0 = alpha ? vld1q_f32(alpha) : z;
    int32_t k;
    MSKV__M8(MSKV__DECL)
    for (k = 0; k < kd; k++) {
        const float *a = A + k * aks;
        float32x4_t y0 = vld1q_f32(B + (size_t)k * rp);
        MSKV__M8(MSKV__STEP)
    }
    MSKV__M8(MSKV__STORE)
#undef MSKV__DECL
#undef MSKV__STEP
#undef MSKV__STORE
}

static void mskv__cpu_gemm_neon_1x1(const float *MSKV__CPU_RESTRICT A, ptrdiff_t aks, const float *MSKV__CPU_RESTRICT B,
                                    float *MSKV__CPU_RESTRICT C, const float *MSKV__CPU_RESTRICT alpha, int32_t kd, int32_t rp) {
    float32x4_t c = alpha ? vmulq_f32(vld1q_f32(C), vld1q_f32(alpha)) : vdupq_n_f32(0.0f);
    int32_t k;
    for (k = 0; k < kd; k++) c = vfmaq_n_f32(c, vld1q_f32(B + (size_t)k * rp), A[k * aks]);
    vst1q_f32(C, c);
}

static void mskv__cpu_gemm_neon(const float *MSKV__CPU_RESTRICT A, ptrdiff_t ais, ptrdiff_t aks,
                                const float *MSKV__CPU_RESTRICT B, float *MSKV__CPU_RESTRICT C,
                                const float *MSKV__CPU_RESTRICT alpha, int32_t n, int32_t kd, int32_t rp) {
    int32_t v = 0, i, x;
    for (; v + 16 <= rp; v += 16) {
        for (i = 0; i + 4 <= n; i += 4)
            mskv__cpu_gemm_neon_4x4(A + i * ais, ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
        for (; i < n; i++)
            for (x = 0; x < 16; x += 4)
                mskv__cpu_gemm_neon_1x1(A + i * ais, aks, B + v + x, C + (size_t)i * rp + v + x, alpha ? alpha + v + x : NULL, kd, rp);
    }
    for (; v < rp; v += 4) {
        for (i = 0; i + 8 <= n; i += 8)
            mskv__cpu_gemm_neon_1x8(A + i * ais, ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
        for (; i < n; i++)
            mskv__cpu_gemm_neon_1x1(A + i * ais, aks, B + v, C + (size_t)i * rp + v, alpha ? alpha + v : NULL, kd, rp);
    }
}

static void mskv__cpu_softmax_neon(float *MSKV__CPU_RESTRICT S, int32_t rp, int32_t kb, const int32_t *a,
                                   const int32_t *z, int full, float *m, float *l, float *alpha) {
    int32_t v, j;
    for (v = 0; v < rp; v += 4) {
        float32x4_t mo = vld1q_f32(m + v), mx = vdupq_n_f32(-INFINITY), mn, al, sum = vdupq_n_f32(0.0f);
        int32x4_t av = full ? vdupq_n_s32(0) : vld1q_s32(a + v), zv = full ? vdupq_n_s32(kb) : vld1q_s32(z + v);
        for (j = 0; j < kb; j++) {
            int32x4_t jv = vdupq_n_s32(j);
            uint32x4_t vis = vandq_u32(vcleq_s32(av, jv), vcltq_s32(jv, zv));
            mx = vbslq_f32(vis, vmaxq_f32(mx, vld1q_f32(S + (size_t)j * rp + v)), mx);
        }
        mn = vmaxq_f32(mo, mx);
        al = vbslq_f32(vceqq_f32(mo, mn), vdupq_n_f32(1.0f), mskv__cpu_exp_neon4(vsubq_f32(mo, mn)));
        for (j = 0; j < kb; j++) {
            int32x4_t jv = vdupq_n_s32(j);
            uint32x4_t vis = vandq_u32(vcleq_s32(av, jv), vcltq_s32(jv, zv));
            float *s = S + (size_t)j * rp + v;
            float32x4_t p = mskv__cpu_exp_neon4(vsubq_f32(vld1q_f32(s), mn));
            p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(p), vis));
            vst1q_f32(s, p);
            sum = vaddq_f32(sum, p);
        }
        vst1q_f32(l + v, vfmaq_f32(sum, vld1q_f32(l + v), al));
        vst1q_f32(m + v, mn);
        vst1q_f32(alpha + v, al);
    }
}

/* The tails of the qk_rows and pv_rows kernels (f32 and 16-bit rows): 4
   rows x 2 keys of sums, c<row><key>, each summed across its lanes and
   stored at S[row * ks + key]; one row's 16 dims of O stored at O. */
static MSKV__ALWAYS_INLINE void mskv__cpu_qk_tail_neon(float *S, int32_t ks, float32x4_t c00, float32x4_t c01, float32x4_t c10, float32x4_t c11,
                                                       float32x4_t c20, float32x4_t c21, float32x4_t c30, float32x4_t c31) {
    S[0] = vaddvq_f32(c00); S[1] = vaddvq_f32(c01);
    S[ks] = vaddvq_f32(c10); S[ks + 1] = vaddvq_f32(c11);
    S[2 * (size_t)ks] = vaddvq_f32(c20); S[2 * (size_t)ks + 1] = vaddvq_f32(c21);
    S[3 * (size_t)ks] = vaddvq_f32(c30); S[3 * (size_t)ks + 1] = vaddvq_f32(c31);
}

static MSKV__ALWAYS_INLINE void mskv__cpu_pv_tail_neon(float *O, float32x4_t c0, float32x4_t c1, float32x4_t c2, float32x4_t c3) {
    vst1q_f32(O, c0); vst1q_f32(O + 4, c1); vst1q_f32(O + 8, c2); vst1q_f32(O + 12, c3);
}

static void mskv__cpu_qk_rows_neon(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                                   float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) float32x4_t c##u##0 = vdupq_n_f32(0.0f), c##u##1 = c##u##0;
#define MSKV__STEP(u) { float32x4_t q = vld1q_f32(Q + (size_t)(r + (u)) * dp + d); \
    c##u##0 = vfmaq_f32(c##u##0, q, x0); c##u##1 = vfmaq_f32(c##u##1, q, x1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (j = 0; j < kbe; j += 2) {
            const float *k0 = krow[j], *k1 = krow[j + 1];
            MSKV__M4(MSKV__DECL)
            for (d = 0; d < dp; d += 4) {
                float32x4_t x0 = vld1q_f32(k0 + d), x1 = vld1q_f32(k1 + d);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_qk_tail_neon(S + (size_t)r * ks + j, ks, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

static void mskv__cpu_pv_rows_neon(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                   const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                                   int32_t nrp, int32_t kb, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) float32x4_t c##u##0 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d), alpha[r + (u)]), \
    c##u##1 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d + 4), alpha[r + (u)]), \
    c##u##2 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d + 8), alpha[r + (u)]), \
    c##u##3 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d + 12), alpha[r + (u)]);
#define MSKV__STEP(u) { float p = P[(size_t)(r + (u)) * ks + j]; \
    c##u##0 = vfmaq_n_f32(c##u##0, y0, p); c##u##1 = vfmaq_n_f32(c##u##1, y1, p); \
    c##u##2 = vfmaq_n_f32(c##u##2, y2, p); c##u##3 = vfmaq_n_f32(c##u##3, y3, p); }
#define MSKV__STORE(u) mskv__cpu_pv_tail_neon(O + (size_t)(r + (u)) * dp + d, c##u##0, c##u##1, c##u##2, c##u##3);
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (d = 0; d < dp; d += 16) {
            MSKV__M4(MSKV__DECL)
            for (j = 0; j < kb; j++) {
                const float *vr = vrow[j] + d;
                float32x4_t y0 = vld1q_f32(vr), y1 = vld1q_f32(vr + 4), y2 = vld1q_f32(vr + 8), y3 = vld1q_f32(vr + 12);
                MSKV__M4(MSKV__STEP)
            }
            MSKV__M4(MSKV__STORE)
        }
#undef MSKV__DECL
#undef MSKV__STEP
#undef MSKV__STORE
}

static float mskv__cpu_exp_row_neon(float *MSKV__CPU_RESTRICT s, float m, int32_t n) {
    float32x4_t mv = vdupq_n_f32(m), acc = vdupq_n_f32(0.0f);
    int32_t j;
    for (j = 0; j < n; j += 4) {
        float32x4_t p = mskv__cpu_exp_neon4(vsubq_f32(vld1q_f32(s + j), mv));
        vst1q_f32(s + j, p);
        acc = vaddq_f32(acc, p);
    }
    return vaddvq_f32(acc);
}

/* Elements [at, at + 4) of a 16-bit row of dim elements as floats; those
   past dim read as 0 (and are not read). */
static float32x4_t mskv__cpu_h4_neon(const uint16_t *row, int32_t at, int32_t dim, int bf16) {
    uint16x4_t h;
    if (at + 4 <= dim) {
        h = vld1_u16(row + at);
    } else {
        uint16_t t[4] = {0, 0, 0, 0};
        if (at < dim) memcpy(t, row + at, (size_t)(dim - at) * 2);
        h = vld1_u16(t);
    }
    return bf16 ? vreinterpretq_f32_u32(vshll_n_u16(h, 16)) : vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* 4 whole elements at p, converted in line (the helper above is for tails). */
#define MSKV__H4_NEON(p, bf16) ((bf16) ? vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)) \
                                       : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))))

/* As qk_rows_neon, each K element converted once for the 4 rows. */
static void mskv__cpu_qk_rows16_neon(const float *MSKV__CPU_RESTRICT Q, const uint16_t *const *MSKV__CPU_RESTRICT krow, int bf16,
                                     float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dim, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) float32x4_t c##u##0 = vdupq_n_f32(0.0f), c##u##1 = c##u##0;
#define MSKV__STEP(u) { float32x4_t q = vld1q_f32(Q + (size_t)(r + (u)) * dp + d); \
    c##u##0 = vfmaq_f32(c##u##0, q, x0); c##u##1 = vfmaq_f32(c##u##1, q, x1); }
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (j = 0; j < kbe; j += 2) {
            const uint16_t *k0 = krow[j], *k1 = krow[j + 1];
            MSKV__M4(MSKV__DECL)
            for (d = 0; d + 4 <= dim; d += 4) {
                float32x4_t x0 = MSKV__H4_NEON(k0 + d, bf16), x1 = MSKV__H4_NEON(k1 + d, bf16);
                MSKV__M4(MSKV__STEP)
            }
            if (d < dim) {
                float32x4_t x0 = mskv__cpu_h4_neon(k0, d, dim, bf16), x1 = mskv__cpu_h4_neon(k1, d, dim, bf16);
                MSKV__M4(MSKV__STEP)
            }
            mskv__cpu_qk_tail_neon(S + (size_t)r * ks + j, ks, c00, c01, c10, c11, c20, c21, c30, c31);
        }
#undef MSKV__DECL
#undef MSKV__STEP
}

/* As pv_rows_neon, each V element converted once for the 4 rows. */
static void mskv__cpu_pv_rows16_neon(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                                     const uint16_t *const *MSKV__CPU_RESTRICT vrow, int bf16, const float *MSKV__CPU_RESTRICT alpha,
                                     int32_t nrp, int32_t kb, int32_t dim, int32_t dp, int32_t ks) {
#define MSKV__DECL(u) float32x4_t c##u##0 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d), alpha[r + (u)]), \
    c##u##1 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d + 4), alpha[r + (u)]), \
    c##u##2 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d + 8), alpha[r + (u)]), \
    c##u##3 = vmulq_n_f32(vld1q_f32(O + (size_t)(r + (u)) * dp + d + 12), alpha[r + (u)]);
#define MSKV__STEP(u) { float p = P[(size_t)(r + (u)) * ks + j]; \
    c##u##0 = vfmaq_n_f32(c##u##0, y0, p); c##u##1 = vfmaq_n_f32(c##u##1, y1, p); \
    c##u##2 = vfmaq_n_f32(c##u##2, y2, p); c##u##3 = vfmaq_n_f32(c##u##3, y3, p); }
#define MSKV__STORE(u) mskv__cpu_pv_tail_neon(O + (size_t)(r + (u)) * dp + d, c##u##0, c##u##1, c##u##2, c##u##3);
    int32_t r, j, d;
    for (r = 0; r < nrp; r += 4)
        for (d = 0; d < dim; d += 16) {
            MSKV__M4(MSKV__DECL)
            if (d + 16 <= dim)
                for (j = 0; j < kb; j++) {
                    const uint16_t *vr = vrow[j] + d;
                    float32x4_t y0 = MSKV__H4_NEON(vr, bf16), y1 = MSKV__H4_NEON(vr + 4, bf16);
                    float32x4_t y2 = MSKV__H4_NEON(vr + 8, bf16), y3 = MSKV__H4_NEON(vr + 12, bf16);
                    MSKV__M4(MSKV__STEP)
                }
            else  /* the last dims: whole and partial vectors through the helper */
                for (j = 0; j < kb; j++) {
                    const uint16_t *vr = vrow[j];
                    float32x4_t y0 = mskv__cpu_h4_neon(vr, d, dim, bf16), y1 = mskv__cpu_h4_neon(vr, d + 4, dim, bf16);
                    float32x4_t y2 = mskv__cpu_h4_neon(vr, d + 8, dim, bf16), y3 = mskv__cpu_h4_neon(vr, d + 12, dim, bf16);
                    MSKV__M4(MSKV__STEP)
                }
            MSKV__M4(MSKV__STORE)
        }
#undef MSKV__DECL
#undef MSKV__STEP
#undef MSKV__STORE
}

static const mskv__cpu_kern mskv__cpu_kern_neon = {
    MSKV_CPU_ISA_NEON, 4, mskv__cpu_cvt_neon, mskv__cpu_gemm_neon, mskv__cpu_softmax_neon,
    mskv__cpu_qk_rows_neon, mskv__cpu_pv_rows_neon, mskv__cpu_exp_row_neon,
    mskv__cpu_qk_rows16_neon, mskv__cpu_pv_rows16_neon, NULL};
#endif /* MSKV__CPU_NEON */

/* ---- choosing a path ---- */

/* The platform helper: what the CPU (and the OS, for the wider registers)
   supports, asked once per create. Only cpuid/xgetbv on x86, nothing to ask
   on arm64 (NEON is baseline there). */
#if MSKV__CPU_X86
static void mskv__cpu_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
#if defined(_MSC_VER) && !defined(__clang__)
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    r[0] = (uint32_t)v[0]; r[1] = (uint32_t)v[1]; r[2] = (uint32_t)v[2]; r[3] = (uint32_t)v[3];
#else
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#endif
}
static uint64_t mskv__cpu_xgetbv0(void) {
#if defined(_MSC_VER) && !defined(__clang__)
    return (uint64_t)_xgetbv(0);
#else
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#endif
}
#endif

static int mskv__cpu_has(mskv_cpu_isa isa) {
    if (isa == MSKV_CPU_ISA_PORTABLE || isa == MSKV_CPU_ISA_BF16_EMU) return 1;
#if MSKV__CPU_BF16_X86
    if (isa == MSKV_CPU_ISA_AVX512_BF16) {
        /* the AVX-512 path's needs, AVX-512 BW (leaf 7 EBX bit 30: the target
           the kernels are built for implies it) and AVX512_BF16 (leaf 7
           subleaf 1 EAX bit 5; subleaf 1 exists when subleaf 0's EAX >= 1) */
        uint32_t r7[4], r71[4];
        if (!mskv__cpu_has(MSKV_CPU_ISA_AVX512)) return 0;
        mskv__cpu_cpuid(7, 0, r7);
        if (!(r7[1] & (1u << 30)) || r7[0] < 1) return 0;
        mskv__cpu_cpuid(7, 1, r71);
        return (r71[0] & (1u << 5)) != 0;
    }
#endif
#if MSKV__CPU_AMX
    if (isa == MSKV_CPU_ISA_AMX_BF16) {
        /* the AVX-512 path's needs and AVX-512 BW (leaf 7 EBX bit 30), AMX-BF16
           and AMX-TILE (leaf 7 EDX bits 22 and 24), the OS saving the tile
           state (XCR0 bits 17 and 18), tiles of 16 rows of 64 bytes in
           palette 1 (leaf 0x1d subleaf 1) and the tile registers lent to this
           process (arch_prctl ARCH_REQ_XCOMP_PERM = 0x1023 for feature 18,
           XTILEDATA; syscall 158), asked for once */
        static int lent;  /* 0: not asked yet, 1: lent, -1: refused */
        uint32_t r0[4], r7[4], r1d[4];
        if (!mskv__cpu_has(MSKV_CPU_ISA_AVX512)) return 0;
        mskv__cpu_cpuid(0, 0, r0);
        if (r0[0] < 0x1d) return 0;
        mskv__cpu_cpuid(7, 0, r7);
        if (!(r7[1] & (1u << 30)) || !(r7[3] & (1u << 22)) || !(r7[3] & (1u << 24))) return 0;
        if ((mskv__cpu_xgetbv0() & 0x60000u) != 0x60000u) return 0;
        mskv__cpu_cpuid(0x1d, 0, r1d);
        if (r1d[0] < 1) return 0;
        mskv__cpu_cpuid(0x1d, 1, r1d);
        if ((r1d[1] & 0xffffu) < 64 || (r1d[1] >> 16) < 8 || (r1d[2] & 0xffffu) < 16) return 0;
        if (lent == 0) {
            long rc;
            __asm__ __volatile__("syscall" : "=a"(rc) : "0"(158L), "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
            lent = rc == 0 ? 1 : -1;
        }
        return lent == 1;
    }
#endif
#if MSKV__CPU_X86
    if (isa == MSKV_CPU_ISA_AVX2 || isa == MSKV_CPU_ISA_AVX512) {
        uint32_t r0[4], r1[4], r7[4];
        uint64_t xcr0;
        mskv__cpu_cpuid(0, 0, r0);
        if (r0[0] < 7) return 0;
        mskv__cpu_cpuid(1, 0, r1);
        /* FMA (bit 12), OSXSAVE (27), AVX (28), F16C (29): the OS must save the
           ymm (and for AVX-512 the zmm and mask) registers, per XCR0 */
        if ((r1[2] & 0x38001000u) != 0x38001000u) return 0;
        xcr0 = mskv__cpu_xgetbv0();
        mskv__cpu_cpuid(7, 0, r7);
        if (isa == MSKV_CPU_ISA_AVX2) return (xcr0 & 0x6) == 0x6 && (r7[1] & (1u << 5));
        return (xcr0 & 0xe6) == 0xe6 && (r7[1] & (1u << 5)) && (r7[1] & (1u << 16));
    }
#endif
#if MSKV__CPU_NEON
    if (isa == MSKV_CPU_ISA_NEON) return 1;
#endif
    return 0;
}

static const mskv__cpu_kern *mskv__cpu_kern_of(mskv_cpu_isa isa) {
    if (isa == MSKV_CPU_ISA_BF16_EMU) return &mskv__cpu_kern_bf16_emu;
#if MSKV__CPU_BF16_X86
    if (isa == MSKV_CPU_ISA_AVX512_BF16) return &mskv__cpu_kern_avx512_bf16;
#endif
#if MSKV__CPU_AMX
    if (isa == MSKV_CPU_ISA_AMX_BF16) return &mskv__cpu_kern_amx_bf16;
#endif
#if MSKV__CPU_X86
    if (isa == MSKV_CPU_ISA_AVX512) return &mskv__cpu_kern_avx512;
    if (isa == MSKV_CPU_ISA_AVX2) return &mskv__cpu_kern_avx2;
#endif
#if MSKV__CPU_NEON
    if (isa == MSKV_CPU_ISA_NEON) return &mskv__cpu_kern_neon;
#endif
    (void)isa;
    return &mskv__cpu_kern_portable;
}

#define MSKV__CPU_ISA_LAST MSKV_CPU_ISA_AMX_BF16  /* the highest mskv_cpu_isa */

static mskv_cpu_isa mskv__cpu_best(void) {
    /* amx_bf16 rounds Q and P to bf16 on bf16 pools (errors near 1e-3 of the
       f32 paths' 1e-7, far under the bf16 K/V's own rounding) and is about
       twice as fast as f32 products there, so it comes first; avx512_bf16
       rounds the same but is no faster than f32 FMA where measured, so it is
       chosen by name only, like bf16_emu (MSKV_CPU_ISA or mskv_cpu_desc.isa) */
    static const mskv_cpu_isa order[4] = {MSKV_CPU_ISA_AMX_BF16, MSKV_CPU_ISA_AVX512, MSKV_CPU_ISA_AVX2, MSKV_CPU_ISA_NEON};
    int i;
    for (i = 0; i < 4; i++)
        if (mskv__cpu_has(order[i])) return order[i];
    return MSKV_CPU_ISA_PORTABLE;
}

MSKV_IMPL const char *mskv_cpu_isa_name(mskv_cpu_isa isa) {
    switch (isa) {
    case MSKV_CPU_ISA_AUTO: return "auto";
    case MSKV_CPU_ISA_PORTABLE: return "portable";
    case MSKV_CPU_ISA_AVX2: return "avx2";
    case MSKV_CPU_ISA_AVX512: return "avx512";
    case MSKV_CPU_ISA_NEON: return "neon";
    case MSKV_CPU_ISA_AVX512_BF16: return "avx512_bf16";
    case MSKV_CPU_ISA_BF16_EMU: return "bf16_emu";
    case MSKV_CPU_ISA_AMX_BF16: return "amx_bf16";
    }
    return "unknown";
}

MSKV_IMPL int mskv_cpu_isa_available(mskv_cpu_isa isa) {
    return isa == MSKV_CPU_ISA_AUTO || mskv__cpu_has(isa);
}

/* AUTO: MSKV_CPU_ISA from the environment when it names a path this CPU
   runs, else the best path; a name that cannot be honoured is logged (why)
   and the best path is used, so a stale setting never stops a program. */
static mskv_cpu_isa mskv__cpu_resolve_auto(char *why, size_t cap) {
    const char *env = getenv("MSKV_CPU_ISA");
    mskv_cpu_isa best = mskv__cpu_best(), isa;
    why[0] = 0;
    if (!env || !env[0] || strcmp(env, "auto") == 0) return best;
    for (isa = MSKV_CPU_ISA_PORTABLE; isa <= MSKV__CPU_ISA_LAST; isa = (mskv_cpu_isa)(isa + 1))
        if (strcmp(env, mskv_cpu_isa_name(isa)) == 0) break;
    if (isa > MSKV__CPU_ISA_LAST) {
        mskv__why(why, cap, "MSKV_CPU_ISA=%.32s is not one of portable, avx2, avx512, neon, avx512_bf16, bf16_emu, amx_bf16, auto; using %s", env,
                  mskv_cpu_isa_name(best));
        return best;
    }
    if (!mskv__cpu_has(isa)) {
        mskv__why(why, cap, "MSKV_CPU_ISA=%s: this CPU or build lacks it; using %s", env, mskv_cpu_isa_name(best));
        return best;
    }
    return isa;
}

/* ---- thread pool --------------------------------------------------------------- */

/* A per-thread workspace: row tiles (Q, O: rows x MAX_DIM, as rows or
   transposed), key tiles (K, V: keys x MAX_DIM f32 rows), scores (rows x
   keys), row state, and the partial results of split segments. */
typedef struct mskv__cpu_ws {
    float *q, *o, *k, *v, *s, *m, *l, *alpha;
    int64_t *klo, *khi;  /* each row's visible keys (see masks) */
    int32_t *a, *z;      /* the same, relative to the current block */
    size_t *el;          /* element offset of each key row of the block */
    const float **vrow, **krow;
    const uint16_t **vrow16, **krow16;  /* 16-bit pool rows read where they lie (few-row items) */
    float *part;         /* partial states of one split unit: chunks x MSKV__CPU_PART floats */
    int32_t rows, keys, chunks;  /* tile capacities */
} mskv__cpu_ws;

/* Q and O hold rows * MAX_DIM floats: more rows at a smaller head_dim, up to
   MSKV__CPU_MAX_ROWS, for which the scores and row state are sized. */
#define MSKV__CPU_MAX_ROWS 64
/* Most row tiles of one many-row item: each key block is converted once and
   used by all of them (their Q^T and O^T share the Q and O tiles, their row
   state is sized for this many). */
#define MSKV__CPU_MAX_TILES 4
/* A split segment's rows per kv head (few-row segments only) and the floats
   of one chunk's partial state: O rows, then m and l per row. */
#define MSKV__CPU_SPLIT_ROWS 8
#define MSKV__CPU_PART (MSKV__CPU_SPLIT_ROWS * (MSKV__CPU_MAX_DIM + 2))
#define MSKV__CPU_SPLIT_MIN_KEYS 512  /* no chunk of a split segment is shorter */
#define MSKV__CPU_SPLIT_UNITS 64      /* a call with fewer (segment, kv head) units splits keys */

static size_t mskv__cpu_ws_bytes(int32_t rows, int32_t keys, int32_t chunks) {
    size_t f = 2 * (size_t)rows * MSKV__CPU_MAX_DIM + 2 * (size_t)keys * MSKV__CPU_MAX_DIM +
               (size_t)MSKV__CPU_MAX_ROWS * (size_t)keys + (2 * MSKV__CPU_MAX_TILES + 1) * (size_t)MSKV__CPU_MAX_ROWS +
               (size_t)chunks * MSKV__CPU_PART;
    return f * 4 + (size_t)MSKV__CPU_MAX_ROWS * (2 * 8 * MSKV__CPU_MAX_TILES + 2 * 4) + 2 * ((size_t)keys + 4) * sizeof(float *) +
           2 * ((size_t)keys + 4) * sizeof(uint16_t *) + (size_t)keys * sizeof(size_t) + 64;
}

static void mskv__cpu_ws_carve(mskv__cpu_ws *w, void *mem, int32_t rows, int32_t keys, int32_t chunks) {
    unsigned char *p = (unsigned char *)mem;
    p += (64 - ((uintptr_t)p & 63)) & 63;  /* the tiles start on a cache line */
    w->rows = rows;
    w->keys = keys;
    w->chunks = chunks;
    w->q = (float *)(void *)p; p += (size_t)rows * MSKV__CPU_MAX_DIM * 4;
    w->o = (float *)(void *)p; p += (size_t)rows * MSKV__CPU_MAX_DIM * 4;
    w->k = (float *)(void *)p; p += (size_t)keys * MSKV__CPU_MAX_DIM * 4;
    w->v = (float *)(void *)p; p += (size_t)keys * MSKV__CPU_MAX_DIM * 4;
    w->part = (float *)(void *)p; p += (size_t)chunks * MSKV__CPU_PART * 4;
    w->s = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * (size_t)keys * 4;
    w->klo = (int64_t *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * MSKV__CPU_MAX_TILES * 8;
    w->khi = (int64_t *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * MSKV__CPU_MAX_TILES * 8;
    w->m = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * MSKV__CPU_MAX_TILES * 4;
    w->l = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * MSKV__CPU_MAX_TILES * 4;
    w->alpha = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->a = (int32_t *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->z = (int32_t *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->vrow = (const float **)(void *)p; p += ((size_t)keys + 4) * sizeof(float *);
    w->krow = (const float **)(void *)p; p += ((size_t)keys + 4) * sizeof(float *);  /* + spares for key groups */
    w->vrow16 = (const uint16_t **)(void *)p; p += ((size_t)keys + 4) * sizeof(uint16_t *);
    w->krow16 = (const uint16_t **)(void *)p; p += ((size_t)keys + 4) * sizeof(uint16_t *);
    w->el = (size_t *)(void *)p;
}

/* A split unit in flight: its partial states sit in one workspace's part
   tile; busy until its last chunk has merged them. */
typedef struct mskv__cpu_slot { int32_t busy, done; } mskv__cpu_slot;

typedef void (*mskv__cpu_task_fn)(void *ctx, mskv__cpu_ws *ws);

struct mskv_cpu {
    mskv_allocator allocator;
    int32_t num_threads;
    size_t workspace_bytes;     /* per thread */
    const mskv__cpu_kern *kern; /* the instruction-set path, chosen at create */
    void *ws_mem;
    mskv__cpu_ws *ws;
    mskv__cpu_slot *slots;      /* split units in flight (one per thread suffices) */
    int64_t last_items;         /* work items of the last attention call */
#ifndef MSKV_NO_THREADS
    mskv__thread *threads;
    int32_t started;
    mskv__mutex lock;
    mskv__mutex call_lock;  /* one call at a time per pool (also with one thread: one workspace) */
    int32_t call_lock_ok;
    int32_t sync_ok;          /* the worker pool's lock (1), wake (2) and done (4) made: teardown destroys these */
    mskv__cond wake, done;
    uint64_t generation;
    int32_t busy, shutdown;
    mskv__cpu_task_fn task;
    void *task_ctx;
#endif
};

#ifndef MSKV_NO_THREADS
typedef struct mskv__cpu_worker_arg { mskv_cpu *cpu; int32_t index; } mskv__cpu_worker_arg;

static void mskv__cpu_worker(void *arg) {
    mskv_cpu *cpu = ((mskv__cpu_worker_arg *)arg)->cpu;
    int32_t index = ((mskv__cpu_worker_arg *)arg)->index;
    uint64_t seen = 0;
    for (;;) {
        mskv__cpu_task_fn fn;
        void *ctx;
        mskv__mutex_lock(&cpu->lock);
        while (!cpu->shutdown && cpu->generation == seen) mskv__cond_wait(&cpu->wake, &cpu->lock);
        if (cpu->shutdown) { mskv__mutex_unlock(&cpu->lock); break; }
        seen = cpu->generation;
        fn = cpu->task;
        ctx = cpu->task_ctx;
        mskv__mutex_unlock(&cpu->lock);
        fn(ctx, &cpu->ws[index]);
        mskv__mutex_lock(&cpu->lock);
        if (--cpu->busy == 0) mskv__cond_signal(&cpu->done);
        mskv__mutex_unlock(&cpu->lock);
    }
}
#endif

static void mskv__cpu_teardown(mskv_cpu *cpu) {
#ifndef MSKV_NO_THREADS
    int32_t i;
    if (cpu->started > 0) {
        mskv__mutex_lock(&cpu->lock);
        cpu->shutdown = 1;
        mskv__cond_broadcast(&cpu->wake);
        mskv__mutex_unlock(&cpu->lock);
        for (i = 0; i < cpu->started; i++) mskv__thread_join(&cpu->threads[i]);
    }
    if (cpu->threads) {
        if (cpu->sync_ok & 2) mskv__cond_destroy(&cpu->wake);
        if (cpu->sync_ok & 4) mskv__cond_destroy(&cpu->done);
        if (cpu->sync_ok & 1) mskv__mutex_destroy(&cpu->lock);
        mskv__free(&cpu->allocator, cpu->threads);
    }
    if (cpu->call_lock_ok) mskv__mutex_destroy(&cpu->call_lock);
#endif
    mskv__free(&cpu->allocator, cpu->ws_mem);
    mskv__free(&cpu->allocator, cpu->ws);
}

MSKV_IMPL mskv_result mskv_cpu_create(const mskv_cpu_desc *desc, mskv_cpu **out) {
    /* rows, keys and split chunks of the tiles, largest first */
    static const int32_t ladder[4][3] = {{64, 64, 8}, {32, 64, 8}, {16, 32, 4}, {8, 16, 2}};
    mskv_cpu_desc d;
    mskv_cpu *cpu;
    mskv_cpu_isa isa;
    size_t per = 0, stride;
    int32_t i, rows = 0, keys = 0, chunks = 0;
    char why[200];
    if (!out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    if (d.num_threads < 0 || d.num_threads > 1024) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((d.allocator.alloc || d.allocator.free) && !(d.allocator.alloc && d.allocator.free))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (d.isa < MSKV_CPU_ISA_AUTO || d.isa > MSKV__CPU_ISA_LAST) {
        if (d.log) {
            mskv__why(why, sizeof why, "mskv_cpu_create: desc->isa = %d is not a path (0 = auto .. %d = %s)", (int)d.isa,
                      (int)MSKV__CPU_ISA_LAST, mskv_cpu_isa_name(MSKV__CPU_ISA_LAST));
            d.log(d.log_user, MSKV_LOG_ERROR, why);
        }
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if (d.isa == MSKV_CPU_ISA_AUTO) {
        isa = mskv__cpu_resolve_auto(why, sizeof why);
        if (why[0] && d.log) d.log(d.log_user, MSKV_LOG_WARN, why);
    } else if (!mskv__cpu_has(d.isa)) {
        if (d.log) {
            mskv__why(why, sizeof why, "mskv_cpu_create: this CPU or build has no %s path (best: %s)",
                      mskv_cpu_isa_name(d.isa), mskv_cpu_isa_name(mskv__cpu_best()));
            d.log(d.log_user, MSKV_LOG_ERROR, why);
        }
        return MSKV_ERROR_UNSUPPORTED;
    } else {
        isa = d.isa;
    }
    if (d.num_threads == 0) d.num_threads = 1;
#ifdef MSKV_NO_THREADS
    d.num_threads = 1;
#endif
    /* the largest tiles the per-thread budget allows */
    for (i = 0; i < 4; i++) {
        per = mskv__cpu_ws_bytes(ladder[i][0], ladder[i][1], ladder[i][2]);
        if (d.workspace_bytes == 0 || per <= d.workspace_bytes) { rows = ladder[i][0]; keys = ladder[i][1]; chunks = ladder[i][2]; break; }
    }
    if (!rows) return MSKV_ERROR_INVALID_ARGUMENT;
    stride = (per + 63) & ~(size_t)63;
    if (stride > SIZE_MAX / (size_t)d.num_threads) return MSKV_ERROR_OVERFLOW;
    cpu = (mskv_cpu *)mskv__alloc(&d.allocator, sizeof(mskv_cpu));
    if (!cpu) return MSKV_ERROR_OUT_OF_MEMORY;
    memset(cpu, 0, sizeof(*cpu));
    cpu->allocator = d.allocator;
    cpu->num_threads = d.num_threads;
    cpu->workspace_bytes = per;
    cpu->kern = mskv__cpu_kern_of(isa);
    cpu->ws = (mskv__cpu_ws *)mskv__alloc(&d.allocator, (sizeof(mskv__cpu_ws) + sizeof(mskv__cpu_slot)) * (size_t)d.num_threads);
    cpu->ws_mem = mskv__alloc(&d.allocator, stride * (size_t)d.num_threads);
    if (!cpu->ws || !cpu->ws_mem) { mskv__cpu_teardown(cpu); mskv__free(&d.allocator, cpu); return MSKV_ERROR_OUT_OF_MEMORY; }
    cpu->slots = (mskv__cpu_slot *)(void *)(cpu->ws + d.num_threads);
    memset(cpu->slots, 0, sizeof(mskv__cpu_slot) * (size_t)d.num_threads); /* every call leaves them free */
    for (i = 0; i < d.num_threads; i++)
        mskv__cpu_ws_carve(&cpu->ws[i], (unsigned char *)cpu->ws_mem + stride * (size_t)i, rows, keys, chunks);
#ifndef MSKV_NO_THREADS
    if (!mskv__mutex_init(&cpu->call_lock)) {
        mskv__cpu_teardown(cpu);
        mskv__free(&d.allocator, cpu);
        return MSKV_ERROR_THREAD;
    }
    cpu->call_lock_ok = 1;
    if (d.num_threads > 1) {
        mskv__cpu_worker_arg *args;
        int ok = 1;
        cpu->threads = (mskv__thread *)mskv__alloc(&d.allocator, (sizeof(mskv__thread) + sizeof(*args)) * (size_t)d.num_threads);
        if (!cpu->threads) { mskv__cpu_teardown(cpu); mskv__free(&d.allocator, cpu); return MSKV_ERROR_OUT_OF_MEMORY; }
        args = (mskv__cpu_worker_arg *)(void *)(cpu->threads + d.num_threads);
        if (mskv__mutex_init(&cpu->lock)) cpu->sync_ok |= 1;
        if (mskv__cond_init(&cpu->wake)) cpu->sync_ok |= 2;
        if (mskv__cond_init(&cpu->done)) cpu->sync_ok |= 4;
        if (cpu->sync_ok != 7) { mskv__cpu_teardown(cpu); mskv__free(&d.allocator, cpu); return MSKV_ERROR_THREAD; }
        /* thread 0 is the caller; workers 1..n-1 */
        for (i = 1; i < d.num_threads && ok; i++) {
            args[i].cpu = cpu;
            args[i].index = i;
            if (!mskv__thread_start(&cpu->threads[cpu->started], mskv__cpu_worker, &args[i])) ok = 0;
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
    const mskv__cpu_kern *kern;
    const void *q;
    void *o;
    float *lse;
    mskv_dtype qt;
    mskv_mask mask;
    int32_t q_heads, group, dim, dimp, window_left;
    int32_t dense;      /* keys are rows of dense K/V (kv_token_indptr), not pages */
    size_t tstride, hstride; /* elements from a key row to the next (dense) and from a kv head to the next */
    uint32_t p_magic;   /* key j's page is (j * p_magic) >> p_shift (mskv__pdiv_init; 0 below 2^31) */
    int32_t p_shift;
    int32_t rows;       /* rows per item (per row tile of a many-row item) */
    int32_t tiles;      /* row tiles per many-row item (1 unless wide); results do not depend on it */
    int32_t wide;       /* items of more than 8 rows use the transposed tiles (rows a multiple of kern->rw) */
    int32_t heads_cap;  /* most kv heads per item (few-row segments), so threads still get items */
    int32_t row_keys;   /* keys per block of few-row items, whatever their kv heads */
    int32_t chunks;     /* most chunks per split unit; 1 = no split in this call */
    float scale;
    mskv__cpu_ws *all_ws;  /* every thread's workspace: split units keep their partial states in one */
    mskv__cpu_slot *slots;
    int32_t nslots;
    /* next work item, (segment, row block, kv head, chunk); taken under the pool lock */
    int32_t cur_b, cur_rb, cur_g, cur_c, cur_slot;
    int64_t items;      /* items taken so far */
#ifndef MSKV_NO_THREADS
    mskv__mutex *lock;
#endif
} mskv__cpu_job;

/* A work item: rows [rb * job->rows, ...) of segment b for kv heads
   [g0, g0 + ng); of a split unit, chunk c of nch whose state goes to slot. */
typedef struct mskv__cpu_work { int32_t b, rb, g0, ng, c, nch, slot; } mskv__cpu_work;

/* What an item needs of its segment. */
typedef struct mskv__cpu_seg {
    int32_t qo0, qo_len;
    int64_t kv_len, split, shift;
    const int32_t *pages;      /* paged keys */
    int64_t tok0;              /* dense keys: the segment's first row */
    const int32_t *q_pos;      /* its queries' positions, NULL: the tail rule */
    int64_t run_lo[2], run_hi[2];  /* the keys the visibility bounds leave: runs of compacted indices */
    int32_t nruns;
    int64_t visible;           /* keys in the runs */
} mskv__cpu_seg;

static void mskv__cpu_seg_runs(const mskv__cpu_job *job, int32_t b, mskv__cpu_seg *sg);

static void mskv__cpu_seg_of(const mskv__cpu_job *job, int32_t b, mskv__cpu_seg *sg) {
    const mskv_plan *plan = job->plan;
    sg->qo0 = plan->qo_indptr[b];
    sg->qo_len = plan->qo_indptr[b + 1] - sg->qo0;
    sg->kv_len = plan->kv_len[b];
    sg->split = plan->kv_pos_split ? plan->kv_pos_split[b] : sg->kv_len;
    sg->shift = plan->kv_pos_shift ? plan->kv_pos_shift[b] : 0;
    /* NULL for dense keys, and for a plan without page ids (no NULL + offset) */
    sg->pages = job->dense || !plan->kv_indices ? NULL : plan->kv_indices + plan->kv_indptr[b];
    sg->tok0 = job->dense ? plan->kv_token_indptr[b] : 0;
    sg->q_pos = plan->q_pos ? plan->q_pos + sg->qo0 : NULL;
    mskv__cpu_seg_runs(job, b, sg);
}

static void mskv__cpu_lock(const mskv__cpu_job *job) {
#ifndef MSKV_NO_THREADS
    if (job->lock) mskv__mutex_lock(job->lock);
#else
    (void)job;
#endif
}
static void mskv__cpu_unlock(const mskv__cpu_job *job) {
#ifndef MSKV_NO_THREADS
    if (job->lock) mskv__mutex_unlock(job->lock);
#else
    (void)job;
#endif
}

/* ---- masks ---- */

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

/* Which keys a query sees is decided here and nowhere else: for query i of
   the segment, the interval [lo, hi) of compacted key indices the mask
   leaves, intersected with the segment's runs (mskv__cpu_seg_runs: what the
   visibility bounds leave). Everything below only applies these (blocks are
   cut inside one run, and clipped per row by mskv__cpu_block_mask), so a new
   kind of mask changes these two functions. */
static void mskv__cpu_row_keys(const mskv__cpu_job *job, const mskv__cpu_seg *sg, int32_t i, int64_t *lo, int64_t *hi) {
    int64_t qpos = sg->q_pos ? sg->q_pos[i] : mskv__cpu_kpos(sg->kv_len - sg->qo_len + i, sg->split, sg->shift);
    *lo = 0;
    *hi = sg->kv_len;
    if (job->mask == MSKV_MASK_NONE) return;
    *hi = mskv__cpu_first_at(qpos + 1, sg->split, sg->shift, sg->kv_len);
    if (job->mask == MSKV_MASK_WINDOW) *lo = mskv__cpu_first_at(qpos - job->window_left, sg->split, sg->shift, sg->kv_len);
}

/* The visible runs of segment b: a key at position p is hidden iff
   vis_sink_end <= p < vis_window_start, a range of compacted indices since
   positions rise with the index; the keys on either side are the runs. */
static void mskv__cpu_seg_runs(const mskv__cpu_job *job, int32_t b, mskv__cpu_seg *sg) {
    const mskv_plan *plan = job->plan;
    int64_t h0 = 0, h1 = 0;
    int32_t n = 0;
    if (plan->vis_sink_end && plan->vis_window_start && plan->vis_window_start[b] > plan->vis_sink_end[b]) {
        h0 = mskv__cpu_first_at(plan->vis_sink_end[b], sg->split, sg->shift, sg->kv_len);
        h1 = mskv__cpu_first_at(plan->vis_window_start[b], sg->split, sg->shift, sg->kv_len);
    }
    if (h0 > 0) { sg->run_lo[n] = 0; sg->run_hi[n] = h0; n++; }
    if (h1 < sg->kv_len) { sg->run_lo[n] = h1; sg->run_hi[n] = sg->kv_len; n++; }
    sg->nruns = n;
    sg->visible = h0 + (sg->kv_len - h1);
}

/* The compacted index of the v-th visible key (0 <= v < sg->visible). */
static int64_t mskv__cpu_visible_at(const mskv__cpu_seg *sg, int64_t v) {
    int64_t first = sg->nruns > 0 ? sg->run_hi[0] - sg->run_lo[0] : 0;
    return v < first ? sg->run_lo[0] + v : sg->run_lo[1] + (v - first);
}

/* Each row's interval relative to the block [j0, j0 + kb): a[r] <= j < z[r];
   padding rows nr..rp-1 see nothing. Returns 1 when every real row sees the
   whole block (the kernels then skip the masking). */
static int mskv__cpu_block_mask(const int64_t *lo, const int64_t *hi, int32_t nr, int32_t rp, int64_t j0, int32_t kb,
                                int32_t *a, int32_t *z) {
    int32_t r, full = 1;
    for (r = 0; r < rp; r++) {
        int64_t x = r < nr ? lo[r] - j0 : 0, y = r < nr ? hi[r] - j0 : 0;
        a[r] = (int32_t)(x < 0 ? 0 : x > kb ? kb : x);
        z[r] = (int32_t)(y < 0 ? 0 : y > kb ? kb : y);
        if (r < nr && (a[r] != 0 || z[r] != kb)) full = 0;
    }
    return full;
}

/* ---- scheduling ---- */

static int32_t mskv__cpu_rows_of(const mskv__cpu_job *job, int32_t b) {
    return (job->plan->qo_indptr[b + 1] - job->plan->qo_indptr[b]) * job->group;
}

/* Chunks of a few-row segment's keys in a splitting call: enough for the
   threads, none shorter than MSKV__CPU_SPLIT_MIN_KEYS. Depends on the plan
   and the workspace only, so the result does not depend on the thread count. */
static int32_t mskv__cpu_chunks_of(const mskv__cpu_job *job, int32_t b) {
    mskv__cpu_seg sg;
    int64_t n;
    mskv__cpu_seg_of(job, b, &sg);
    n = (sg.visible + MSKV__CPU_SPLIT_MIN_KEYS - 1) / MSKV__CPU_SPLIT_MIN_KEYS;
    return n < 1 ? 1 : n > job->chunks ? job->chunks : (int32_t)n;
}

/* Chunk c of nch: visible keys [n * c / nch, n * (c + 1) / nch). */
static int64_t mskv__cpu_chunk_at(int64_t n, int32_t c, int32_t nch) { return n / nch * c + n % nch * c / nch; }

/* Takes the next item; 0 when none is left. A segment with few rows per kv
   head (decode) takes several kv heads per item, so whole slot rows stream
   in one pass; in a splitting call each of its kv heads is a unit of chunks,
   and the unit's first chunk takes a free slot for the partial states. */
static int mskv__cpu_next(mskv__cpu_job *job, mskv__cpu_work *w) {
    int ok = 0;
    int32_t kvh = job->pools->kv_heads;
    mskv__cpu_lock(job);
    while (job->cur_b < job->plan->batch) {
        int32_t rows = mskv__cpu_rows_of(job, job->cur_b), nrp = (rows + 3) & ~3, nrb, step = 1, nch = 1;
        if (nrp <= 8) {
            nrb = rows > 0;
            if (job->chunks > 1) nch = mskv__cpu_chunks_of(job, job->cur_b);
            if (nch == 1) {
                step = job->rows / (nrp > 0 ? nrp : 4);
                if (step > job->heads_cap) step = job->heads_cap;
                if (step < 1) step = 1;
            }
        } else {
            nrb = ((rows + job->rows - 1) / job->rows + job->tiles - 1) / job->tiles;
        }
        if (job->cur_rb >= nrb) { job->cur_b++; job->cur_rb = 0; job->cur_g = 0; continue; }
        w->b = job->cur_b; w->rb = job->cur_rb; w->g0 = job->cur_g; w->c = job->cur_c; w->nch = nch; w->slot = -1;
        w->ng = kvh - job->cur_g < step ? kvh - job->cur_g : step;
        if (nch > 1) {
            if (job->cur_c == 0) {
                /* never full: a busy slot's unit has a chunk running on another thread */
                int32_t s = 0;
                while (job->slots[s].busy) s++;
                job->slots[s].busy = 1;
                job->slots[s].done = 0;
                job->cur_slot = s;
            }
            w->slot = job->cur_slot;
            if (++job->cur_c < nch) { ok = 1; break; }
            job->cur_c = 0;
        }
        job->cur_g += w->ng;
        if (job->cur_g == kvh) { job->cur_g = 0; job->cur_rb++; }
        ok = 1;
        break;
    }
    job->items += ok;
    mskv__cpu_unlock(job);
    return ok;
}

/* ---- one item ---- */

/* Normalises an output row (O unnormalised, running max m and sum l) into o
   and lse: row t of segment rows (query t / group, q head g * group + t % group). */
static void mskv__cpu_emit(const mskv__cpu_job *job, const mskv__cpu_seg *sg, int32_t t, int32_t g, float *orow, float m, float l) {
    int32_t d, D = job->dim, head = g * job->group + t % job->group;
    size_t row = (size_t)(sg->qo0 + t / job->group) * (size_t)job->q_heads + (size_t)head;
    size_t qes = mskv__cpu_esize(job->qt);
    if (l > 0.0f) {
        float inv = 1.0f / l;
        for (d = 0; d < D; d++) orow[d] *= inv;
    } else {
        for (d = 0; d < D; d++) orow[d] = 0.0f;
    }
    mskv__cpu_store((unsigned char *)job->o + row * (size_t)D * qes, job->qt, orow, D);
    if (job->lse) job->lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* Query row t of the segment, f32 and scaled, into dst (D floats). */
static void mskv__cpu_query(const mskv__cpu_job *job, const mskv__cpu_seg *sg, int32_t t, int32_t g, float *dst) {
    int32_t d, head = g * job->group + t % job->group;
    size_t qes = mskv__cpu_esize(job->qt);
    const unsigned char *src = (const unsigned char *)job->q + ((size_t)(sg->qo0 + t / job->group) * (size_t)job->q_heads + (size_t)head) * (size_t)job->dim * qes;
    if (job->qt == MSKV_DTYPE_F32) memcpy(dst, src, (size_t)job->dim * 4);
    else job->kern->cvt(dst, (const uint16_t *)(const void *)src, job->qt == MSKV_DTYPE_BF16, job->dim);
    for (d = 0; d < job->dim; d++) dst[d] *= job->scale;
}

/* Key rows of one kv head (D elements at element offset el) to f32. */
static void mskv__cpu_key_row(const mskv__cpu_job *job, const void *pool, size_t el, float *dst) {
    const mskv_pools *p = job->pools;
    if (p->dtype == MSKV_DTYPE_F32) memcpy(dst, (const float *)pool + el, (size_t)job->dim * 4);
    else job->kern->cvt(dst, (const uint16_t *)pool + el, p->dtype == MSKV_DTYPE_BF16, job->dim);
}

/* Element offsets (kv head 0) of keys [j0, j0 + kb) into el, and a prefetch
   of the next block's rows of kv heads [g0, g0 + ng): rows scattered over
   pages are not followed by the hardware prefetcher, and they arrive while
   this block computes. Addresses go a page at a time: the page of j0 from
   the job's divisor (no divide), each page's base once, then its slots in
   order; a page whose slots hold only the heads asked for is one span. */
static void mskv__cpu_block_rows(const mskv__cpu_job *job, const mskv__cpu_seg *sg, int64_t j0, int32_t kb, int64_t hi,
                                 int32_t g0, int32_t ng, size_t *el) {
    const int32_t P = job->pools->page_size, D = job->dim;
    const size_t ts = job->tstride;
    int64_t pi, off;
    int32_t jj;
    if (job->dense) { /* dense rows: in order, which the hardware prefetches by itself */
        for (jj = 0; jj < kb; jj++) el[jj] = (size_t)(sg->tok0 + j0 + jj) * ts;
        return;
    }
    pi = mskv__pdiv_by(job->p_magic, job->p_shift, P, j0);
    off = j0 - pi * P;
    for (jj = 0; jj < kb;) {
        size_t base = (size_t)sg->pages[pi] * (size_t)P * ts;   /* once per page */
        int32_t n = (int32_t)((int64_t)P - off < (int64_t)(kb - jj) ? (int64_t)P - off : (int64_t)(kb - jj)), t;
        for (t = 0; t < n; t++) el[jj + t] = base + (size_t)(off + t) * ts;
        jj += n;
        off += n;
        if (off == P) { off = 0; pi++; }
    }
#if defined(__GNUC__)
    {
        size_t pes = mskv__cpu_esize(job->pools->dtype), bytes = (size_t)ng * (size_t)D * pes, at;
        const char *k = (const char *)job->pools->k, *v = (const char *)job->pools->v;
        int64_t left = hi - (j0 + kb) < (int64_t)kb ? hi - (j0 + kb) : (int64_t)kb;  /* the next block's keys */
        int whole = (size_t)ng * job->hstride == ts && (size_t)D == job->hstride; /* slots hold just these heads */
        while (left > 0) {
            int32_t n = (int32_t)((int64_t)P - off < left ? (int64_t)P - off : left), t;
            size_t e = ((size_t)sg->pages[pi] * (size_t)P + (size_t)off) * ts + (size_t)g0 * job->hstride;
            if (whole) {  /* the page's n slots: one contiguous span */
                size_t span = (size_t)n * bytes;
                for (at = 0; at < span; at += 64) { __builtin_prefetch(k + e * pes + at); __builtin_prefetch(v + e * pes + at); }
            } else {
                for (t = 0; t < n; t++, e += ts)
                    for (at = 0; at < bytes; at += 64) { __builtin_prefetch(k + e * pes + at); __builtin_prefetch(v + e * pes + at); }
            }
            left -= n;
            off += n;
            if (off == P) { off = 0; pi++; }
        }
    }
#else
    (void)hi; (void)g0; (void)ng; (void)D;
#endif
}

static void mskv__cpu_item_rows(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t r0, int32_t nr,
                                int32_t g0, int32_t ng, int64_t klo, int64_t khi, float *part);
/* Row t of the segment in a row tile: its scaled query into row (zeros for
   a padding row, !real) and, for a real row, its visible keys [klo, khi),
   widening the tile's [lo, hi). Every many-row item starts its tiles so. */
static void mskv__cpu_tile_row(const mskv__cpu_job *job, const mskv__cpu_seg *sg, int32_t t, int real, int32_t g, float *row,
                               int64_t *klo, int64_t *khi, int64_t *lo, int64_t *hi) {
    int32_t d;
    if (!real) {
        for (d = 0; d < job->dim; d++) row[d] = 0.0f;
        return;
    }
    mskv__cpu_query(job, sg, t, g, row);
    mskv__cpu_row_keys(job, sg, t / job->group, klo, khi);
    if (*klo < *khi) {
        *lo = *klo < *lo ? *klo : *lo;
        *hi = *khi > *hi ? *khi : *hi;
    }
}

/* The end of a many-row item: the rows of its nt row tiles of job->rows
   (rows r0 .. r0 + nr - 1 of the segment), tile t's O^T at ws->o + t * ts
   ([d][rp] floats, rp its rows rounded up to the path's row width) and its
   row state at t * job->rows, normalised and written. */
static void mskv__cpu_emit_tiles(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t r0, int32_t nr, int32_t g,
                                 int32_t nt, size_t ts) {
    const int32_t D = job->dim, TR = job->rows, rw = job->kern->rw;
    int32_t t, r, d;
    for (t = 0; t < nt; t++) {
        const int32_t tnr = nr - t * TR < TR ? nr - t * TR : TR, rp = (tnr + rw - 1) / rw * rw;
        const float *o = ws->o + (size_t)t * ts;
        for (r = 0; r < tnr; r++) {
            for (d = 0; d < D; d++) ws->v[d] = o[(size_t)d * rp + r];
            mskv__cpu_emit(job, sg, r0 + t * TR + r, g, ws->v, ws->m[t * TR + r], ws->l[t * TR + r]);
        }
    }
}

/* ---- bf16 items (paths with kern->gemm_bf16, bf16 pools) ---- */

/* The transposed tiles of mskv__cpu_item_wide with bf16 products, packed for
   vdpbf16ps: Q^T as pairs along head_dim ([D/2][rp] pairs, Q scaled then
   rounded), K rows as they are stored (pairs along head_dim),
   P (the softmax, f32) rounded into pairs along the key axis ([kb/2][rp], in
   the K tile once the scores are made) and V^T into pairs along the key
   axis ([D][kb/2]). An odd head_dim or block ends in a pair whose second
   element is 0. Scores and O accumulate in f32; the packing is the same
   for every path with gemm_bf16, only the product kernel differs. */
static uint32_t mskv__cpu_bf16_pair(float lo, float hi) {
    return (uint32_t)mskv_f32_to_bf16(lo) | (uint32_t)mskv_f32_to_bf16(hi) << 16;
}

static void mskv__cpu_item_wide_bf16(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t r0, int32_t nr, int32_t g) {
    const mskv__cpu_kern *kn = job->kern;
    const int32_t D = job->dim, Dh = (D + 1) / 2, KS = ws->keys, rp = (nr + kn->rw - 1) / kn->rw * kn->rw;
    const size_t goff = (size_t)g * job->hstride;
    const uint16_t *kpool = (const uint16_t *)job->pools->k, *vpool = (const uint16_t *)job->pools->v;
    uint32_t *qt = (uint32_t *)(void *)ws->q, *kt = (uint32_t *)(void *)ws->k, *vt = (uint32_t *)(void *)ws->v;
    int64_t lo = INT64_MAX, hi = 0, j0, end;
    int32_t r, d, jj, p, run;
    for (r = 0; r < rp; r++) {
        float *row = ws->v;  /* scratch for one query row, D + 1 floats */
        mskv__cpu_tile_row(job, sg, r0 + r, r < nr, g, row, &ws->klo[r], &ws->khi[r], &lo, &hi);
        row[D] = 0.0f;
        for (p = 0; p < Dh; p++) qt[(size_t)p * rp + r] = mskv__cpu_bf16_pair(row[2 * p], row[2 * p + 1]);
        ws->m[r] = -INFINITY;
        ws->l[r] = 0.0f;
    }
    memset(ws->o, 0, (size_t)D * (size_t)rp * sizeof(float));
    for (run = 0; run < sg->nruns; run++)
    for (j0 = lo > sg->run_lo[run] ? lo : sg->run_lo[run], end = hi < sg->run_hi[run] ? hi : sg->run_hi[run]; j0 < end; j0 += KS) {
        int32_t kb = (int32_t)(end - j0 < KS ? end - j0 : KS), kh = (kb + 1) / 2, full;
        mskv__cpu_block_rows(job, sg, j0, kb, end, g, 1, ws->el);
        for (jj = 0; jj < kb; jj++) {  /* pairs spelt out: any byte order, nothing read past the row */
            const uint16_t *kr = kpool + ws->el[jj] + goff;
            uint32_t *kd = kt + (size_t)jj * Dh;
            for (p = 0; p < D / 2; p++) kd[p] = (uint32_t)kr[2 * p] | (uint32_t)kr[2 * p + 1] << 16;
            if (D & 1) kd[Dh - 1] = kr[D - 1];
        }
        for (p = 0; p < kh; p++) {
            const uint16_t *va = vpool + ws->el[2 * p] + goff, *vb = 2 * p + 1 < kb ? vpool + ws->el[2 * p + 1] + goff : NULL;
            for (d = 0; d < D; d++) vt[(size_t)d * kh + p] = (uint32_t)va[d] | (vb ? (uint32_t)vb[d] << 16 : 0u);
        }
        full = mskv__cpu_block_mask(ws->klo, ws->khi, nr, rp, j0, kb, ws->a, ws->z);
        kn->gemm_bf16(kt, Dh, qt, ws->s, NULL, kb, Dh, rp);              /* S^T = K Q^T */
        kn->softmax(ws->s, rp, kb, ws->a, ws->z, full, ws->m, ws->l, ws->alpha);
        for (p = 0; p < kh; p++) {                                       /* P^T into pairs of keys */
            const float *sa = ws->s + (size_t)(2 * p) * rp, *sb = 2 * p + 1 < kb ? sa + rp : NULL;
            for (r = 0; r < rp; r++) kt[(size_t)p * rp + r] = mskv__cpu_bf16_pair(sa[r], sb ? sb[r] : 0.0f);
        }
        kn->gemm_bf16(vt, kh, kt, ws->o, ws->alpha, D, kh, rp);         /* O^T = alpha O^T + V^T P^T */
    }
    mskv__cpu_emit_tiles(job, ws, sg, r0, nr, g, 1, 0);
}

#if MSKV__CPU_AMX
/* A bf16 pool's many-row item on the AMX path: the tiles of
   mskv__cpu_item_wide (row tiles of job->rows, each key block packed once
   for all of them, blocks on the key tile's grid from each run's start, a
   tile skipping a block none of its rows sees), with S^T = K Q^T and
   O^T = alpha O^T + V^T P^T as tile products on operands padded to whole
   tiles with zeros: Q^T as pairs along head_dim ([Dh16][rp], Q scaled then
   rounded), K rows as stored ([kb16][Dh16] pairs), P^T rounded into pairs
   of keys in place of the scores ([kh16][rp]) and V^T into pairs of keys
   ([D16][kh16]); the softmax is the AVX-512 path's, writing P^T's pairs. */
static void mskv__cpu_item_wide_amx(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t r0, int32_t nr,
                                    int32_t g, int32_t nt) {
    const int32_t D = job->dim, Dh = (D + 1) / 2, Dh16 = (Dh + 15) & ~15, D16 = (D + 15) & ~15, KS = ws->keys, TR = job->rows;
    const size_t goff = (size_t)g * job->hstride, tq = (size_t)Dh16 * (size_t)TR, to = (size_t)D16 * (size_t)TR;
    const uint16_t *kpool = (const uint16_t *)job->pools->k, *vpool = (const uint16_t *)job->pools->v;
    uint32_t *kt = (uint32_t *)(void *)ws->k, *vt = (uint32_t *)(void *)ws->v;
    int64_t lo = INT64_MAX, hi = 0, j0, end, tlo[MSKV__CPU_MAX_TILES], thi[MSKV__CPU_MAX_TILES];
    int32_t r, jj, p, run, t;
    for (t = 0; t < nt; t++) {
        const int32_t tnr = nr - t * TR < TR ? nr - t * TR : TR, rp = (tnr + 15) & ~15;
        uint32_t *qt = (uint32_t *)(void *)ws->q + (size_t)t * tq;
        int64_t *klo = ws->klo + t * TR, *khi = ws->khi + t * TR;
        float *row = ws->v;  /* scratch for one query row, D + 1 floats */
        tlo[t] = INT64_MAX;
        thi[t] = 0;
        for (r = 0; r < rp; r++) {
            mskv__cpu_tile_row(job, sg, r0 + t * TR + r, r < tnr, g, row, &klo[r], &khi[r], &tlo[t], &thi[t]);
            row[D] = 0.0f;
            for (p = 0; p < Dh; p++) qt[(size_t)p * rp + r] = mskv__cpu_bf16_pair(row[2 * p], row[2 * p + 1]);
            for (; p < Dh16; p++) qt[(size_t)p * rp + r] = 0;
            ws->m[t * TR + r] = -INFINITY;
            ws->l[t * TR + r] = 0.0f;
        }
        memset(ws->o + (size_t)t * to, 0, (size_t)D16 * (size_t)rp * sizeof(float));
        lo = tlo[t] < lo ? tlo[t] : lo;
        hi = thi[t] > hi ? thi[t] : hi;
    }
    mskv__amx_on();
    for (run = 0; run < sg->nruns; run++) {
        int64_t first = lo > sg->run_lo[run] ? lo : sg->run_lo[run];
        end = hi < sg->run_hi[run] ? hi : sg->run_hi[run];
        if (first >= end) continue;
        for (j0 = sg->run_lo[run] + (first - sg->run_lo[run]) / KS * KS; j0 < end; j0 += KS) {
            const int32_t kb = (int32_t)(end - j0 < KS ? end - j0 : KS), kb16 = (kb + 15) & ~15, kh16 = ((kb + 1) / 2 + 15) & ~15;
            mskv__cpu_block_rows(job, sg, j0, kb, end, g, 1, ws->el);
            for (jj = 0; jj < kb; jj++) {  /* once, for every tile: K rows as stored, V^T */
                uint32_t *kd = kt + (size_t)jj * (size_t)Dh16;
                ws->vrow16[jj] = vpool + ws->el[jj] + goff;
                memcpy(kd, kpool + ws->el[jj] + goff, (size_t)D * 2);
                memset((unsigned char *)kd + (size_t)D * 2, 0, (size_t)Dh16 * 4 - (size_t)D * 2);
            }
            memset(kt + (size_t)kb * (size_t)Dh16, 0, (size_t)(kb16 - kb) * (size_t)Dh16 * 4);
            mskv__amx_pack_vt(vt, ws->vrow16, kb, D, kh16);
            for (t = 0; t < nt; t++) {
                const int32_t tnr = nr - t * TR < TR ? nr - t * TR : TR, rp = (tnr + 15) & ~15;
                float *m = ws->m + t * TR, *l = ws->l + t * TR, *o = ws->o + (size_t)t * to;
                int full;
                if (thi[t] <= j0 || tlo[t] >= j0 + kb) continue;  /* no row of this tile sees the block */
                full = mskv__cpu_block_mask(ws->klo + t * TR, ws->khi + t * TR, tnr, rp, j0, kb, ws->a, ws->z);
                mskv__amx_gemm(kt, (size_t)Dh16, (const uint32_t *)(void *)ws->q + (size_t)t * tq, (size_t)rp, ws->s, (size_t)rp,
                               kb16 / 16, rp / 16, Dh16 / 16, 0);                      /* S^T = K Q^T */
                mskv__amx_softmax_pack(ws->s, rp, kb, kh16, ws->a, ws->z, full, m, l, ws->alpha);
                mskv__amx_scale_o(o, ws->alpha, D, rp);
                mskv__amx_gemm(vt, (size_t)kh16, (const uint32_t *)(void *)ws->s, (size_t)rp, o, (size_t)rp, D16 / 16, rp / 16,
                               kh16 / 16, 1);                                          /* O^T = alpha O^T + V^T P^T */
            }
        }
    }
    mskv__amx_off();
    mskv__cpu_emit_tiles(job, ws, sg, r0, nr, g, nt, to);
}
#endif

/* Many rows (video): Q and O transposed (a row per lane), so scores, softmax
   and P.V are all wide over rows and K/V rows are read as they are stored.
   Rows r < nr are t = r0 + r of the segment, for kv head g, in row tiles of
   job->rows: each key block is converted once and used by every tile (the
   tiles' Q^T, O^T and row state side by side in the workspace). Blocks lie
   on a grid of the key tile from each run's start and a tile skips a block
   none of its rows sees, so a row's arithmetic is the same whatever tiles
   share its item (and so on any number of threads). A last tile of 8 rows or
   fewer goes to the few-row kernels, as it would alone. */
static void mskv__cpu_item_wide(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t r0, int32_t nr, int32_t g) {
    const mskv__cpu_kern *kn = job->kern;
    const int32_t D = job->dim, Dp = job->dimp, KS = ws->keys, TR = job->rows;
    const size_t goff = (size_t)g * job->hstride, tq = (size_t)D * (size_t)TR;
    int64_t lo = INT64_MAX, hi = 0, j0, end, tlo[MSKV__CPU_MAX_TILES], thi[MSKV__CPU_MAX_TILES];
    int32_t r, d, jj, run, t, nt = (nr + TR - 1) / TR, nw = nr, small = 0;
    if (nt > 1 && nr - (nt - 1) * TR <= 8) { small = nr - (nt - 1) * TR; nt--; nw = nt * TR; }
#if MSKV__CPU_AMX
    if (kn->isa == MSKV_CPU_ISA_AMX_BF16 && job->pools->dtype == MSKV_DTYPE_BF16) {
        mskv__cpu_item_wide_amx(job, ws, sg, r0, nw, g, nt);
        if (small) mskv__cpu_item_rows(job, ws, sg, r0 + nw, small, g, 1, 0, sg->kv_len, NULL);
        return;
    }
#endif
    if (kn->gemm_bf16 && job->pools->dtype == MSKV_DTYPE_BF16) {
        /* bf16 products: the same tiles, each packing its blocks itself */
        for (t = 0; t < nt; t++) mskv__cpu_item_wide_bf16(job, ws, sg, r0 + t * TR, nw - t * TR < TR ? nw - t * TR : TR, g);
        if (small) mskv__cpu_item_rows(job, ws, sg, r0 + nw, small, g, 1, 0, sg->kv_len, NULL);
        return;
    }
    for (t = 0; t < nt; t++) {
        const int32_t tnr = nw - t * TR < TR ? nw - t * TR : TR, rp = (tnr + kn->rw - 1) / kn->rw * kn->rw;
        float *q = ws->q + (size_t)t * tq;
        int64_t *klo = ws->klo + t * TR, *khi = ws->khi + t * TR;
        tlo[t] = INT64_MAX;
        thi[t] = 0;
        for (r = 0; r < rp; r++) {
            mskv__cpu_tile_row(job, sg, r0 + t * TR + r, r < tnr, g, ws->v, &klo[r], &khi[r], &tlo[t], &thi[t]);
            for (d = 0; d < D; d++) q[(size_t)d * rp + r] = ws->v[d];
            ws->m[t * TR + r] = -INFINITY;
            ws->l[t * TR + r] = 0.0f;
        }
        memset(ws->o + (size_t)t * tq, 0, (size_t)D * (size_t)rp * sizeof(float));
        lo = tlo[t] < lo ? tlo[t] : lo;
        hi = thi[t] > hi ? thi[t] : hi;
    }
    for (run = 0; run < sg->nruns; run++) {
        int64_t first = lo > sg->run_lo[run] ? lo : sg->run_lo[run];
        end = hi < sg->run_hi[run] ? hi : sg->run_hi[run];
        if (first >= end) continue;
        for (j0 = sg->run_lo[run] + (first - sg->run_lo[run]) / KS * KS; j0 < end; j0 += KS) {
            int32_t kb = (int32_t)(end - j0 < KS ? end - j0 : KS), full;
            mskv__cpu_block_rows(job, sg, j0, kb, end, g, 1, ws->el);
            for (jj = 0; jj < kb; jj++) {  /* converted once, for every tile */
                mskv__cpu_key_row(job, job->pools->k, ws->el[jj] + goff, ws->k + (size_t)jj * Dp);
                mskv__cpu_key_row(job, job->pools->v, ws->el[jj] + goff, ws->v + (size_t)jj * Dp);
            }
            for (t = 0; t < nt; t++) {
                const int32_t tnr = nw - t * TR < TR ? nw - t * TR : TR, rp = (tnr + kn->rw - 1) / kn->rw * kn->rw;
                float *m = ws->m + t * TR, *l = ws->l + t * TR, *o = ws->o + (size_t)t * tq;
                if (thi[t] <= j0 || tlo[t] >= j0 + kb) continue;  /* no row of this tile sees the block */
                full = mskv__cpu_block_mask(ws->klo + t * TR, ws->khi + t * TR, tnr, rp, j0, kb, ws->a, ws->z);
                kn->gemm(ws->k, Dp, 1, ws->q + (size_t)t * tq, ws->s, NULL, kb, D, rp);   /* S^T = K Q^T */
                kn->softmax(ws->s, rp, kb, ws->a, ws->z, full, m, l, ws->alpha);
                kn->gemm(ws->v, 1, Dp, ws->s, o, ws->alpha, D, kb, rp);                   /* O^T = alpha O^T + V^T P^T */
            }
        }
    }
    mskv__cpu_emit_tiles(job, ws, sg, r0, nw, g, nt, tq);
    if (small) mskv__cpu_item_rows(job, ws, sg, r0 + nw, small, g, 1, 0, sg->kv_len, NULL);
}

/* Few rows (decode, small GQA groups): scores as dot products over K rows
   (transposing K would cost more than the products), several kv heads per
   item (the ng heads' row sets follow each other, nrp rows each). A chunk of
   a split unit covers keys [klo, khi) and leaves its state in part. */
static void mskv__cpu_item_rows(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t r0, int32_t nr,
                                int32_t g0, int32_t ng, int64_t klo, int64_t khi, float *part) {
    const mskv__cpu_kern *kn = job->kern;
    const mskv_pools *pools = job->pools;
    const int32_t D = job->dim, Dp = job->dimp, KS = ws->keys, nrp = (nr + 3) & ~3;
    const int32_t KB = nrp <= 8 ? job->row_keys : KS;  /* the same blocks for any ng: results do not depend on grouping */
    const int direct = pools->dtype == MSKV_DTYPE_F32 && D == Dp; /* pool rows usable as they are */
    const int half = pools->dtype != MSKV_DTYPE_F32, bf16 = pools->dtype == MSKV_DTYPE_BF16; /* 16-bit rows, converted in registers */
    int64_t lo = khi, hi = klo, j0, end;
    int32_t r, d, gi, jj, run;
    for (gi = 0; gi < ng; gi++)
        for (r = 0; r < nrp; r++) {
            int32_t R = gi * nrp + r;
            float *qr = ws->q + (size_t)R * Dp;
            if (r < nr) {
                mskv__cpu_query(job, sg, r0 + r, g0 + gi, qr);
                if (gi == 0) {
                    mskv__cpu_row_keys(job, sg, (r0 + r) / job->group, &ws->klo[r], &ws->khi[r]);
                    if (ws->klo[r] < klo) ws->klo[r] = klo;
                    if (ws->khi[r] > khi) ws->khi[r] = khi;
                    if (ws->klo[r] < ws->khi[r]) {
                        lo = ws->klo[r] < lo ? ws->klo[r] : lo;
                        hi = ws->khi[r] > hi ? ws->khi[r] : hi;
                    }
                }
            } else {
                for (d = 0; d < D; d++) qr[d] = 0.0f;
            }
            for (d = D; d < Dp; d++) qr[d] = 0.0f;
            for (d = 0; d < Dp; d++) ws->o[(size_t)R * Dp + d] = 0.0f;
            ws->m[R] = -INFINITY;
            ws->l[R] = 0.0f;
        }

    for (run = 0; run < sg->nruns; run++)
    for (j0 = lo > sg->run_lo[run] ? lo : sg->run_lo[run], end = hi < sg->run_hi[run] ? hi : sg->run_hi[run]; j0 < end; j0 += KB) {
        int32_t kb = (int32_t)(end - j0 < KB ? end - j0 : KB), full;
        mskv__cpu_block_rows(job, sg, j0, kb, end, g0, ng, ws->el);
        full = mskv__cpu_block_mask(ws->klo, ws->khi, nr, nrp, j0, kb, ws->a, ws->z);
        if (!direct && !half)
            /* all heads' rows of each slot in address order (one contiguous
               run per slot), so the hardware streams them */
            for (jj = 0; jj < kb; jj++)
                for (gi = 0; gi < ng; gi++) {
                    size_t el = ws->el[jj] + (size_t)(g0 + gi) * job->hstride, at = ((size_t)gi * KB + (size_t)jj) * Dp;
                    mskv__cpu_key_row(job, pools->k, el, ws->k + at);
                    mskv__cpu_key_row(job, pools->v, el, ws->v + at);
                    for (d = D; d < Dp; d++) ws->k[at + d] = ws->v[at + d] = 0.0f;
                }
        for (gi = 0; gi < ng; gi++) {
            const size_t goff = (size_t)(g0 + gi) * job->hstride;
            float *S = ws->s + (size_t)gi * nrp * KS, *M = ws->m + gi * nrp, *L = ws->l + gi * nrp;
            float *A = ws->alpha + gi * nrp;
            if (half) {
                /* straight from the pool: el already holds each page's base plus the slot */
                const uint16_t *kp = (const uint16_t *)pools->k + goff, *vp = (const uint16_t *)pools->v + goff;
                for (jj = 0; jj < kb; jj++) {
                    ws->krow16[jj] = kp + ws->el[jj];
                    ws->vrow16[jj] = vp + ws->el[jj];
                }
                for (jj = kb; jj < ((kb + 3) & ~3); jj++) ws->krow16[jj] = ws->krow16[kb - 1];
                /* a head's rows lie a slot apart (a few KB), too far for the
                   hardware to follow: the next head's K and V rows are asked
                   for while this head's are used (its 2 to 4 cache lines a
                   row), one head's work ahead, in L1 by the time it starts */
#if defined(__GNUC__)
                if (gi + 1 < ng) {
                    size_t at;
                    for (jj = 0; jj < kb; jj++)
                        for (at = 0; at < (size_t)D; at += 32) {
                            __builtin_prefetch(kp + job->hstride + ws->el[jj] + at);
                            __builtin_prefetch(vp + job->hstride + ws->el[jj] + at);
                        }
                }
#endif
                kn->qk_rows16(ws->q + (size_t)gi * nrp * Dp, ws->krow16, bf16, S, nrp, (kb + 3) & ~3, D, Dp, KS);
            } else {
                for (jj = 0; jj < kb; jj++) {
                    if (direct) {
                        ws->krow[jj] = (const float *)pools->k + ws->el[jj] + goff;
                        ws->vrow[jj] = (const float *)pools->v + ws->el[jj] + goff;
                    } else {
                        ws->krow[jj] = ws->k + ((size_t)gi * KB + (size_t)jj) * Dp;
                        ws->vrow[jj] = ws->v + ((size_t)gi * KB + (size_t)jj) * Dp;
                    }
                }
                /* up to 3 spare scores fill the kernels' key groups, masked below like the padding */
                for (jj = kb; jj < ((kb + 3) & ~3); jj++) ws->krow[jj] = ws->krow[kb - 1];
                kn->qk_rows(ws->q + (size_t)gi * nrp * Dp, ws->krow, S, nrp, (kb + 3) & ~3, Dp, KS);
            }
            /* online softmax: running max M and sum L per row; A rescales O */
            for (r = 0; r < nrp; r++) {
                float *srow = S + (size_t)r * KS, mx = -INFINITY, mnew, sum;
                int32_t a = full ? 0 : ws->a[r], z = full ? kb : ws->z[r], kbp = (kb + 15) & ~15;
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
                sum = kn->exp_row(srow, mnew, kbp);
                L[r] = L[r] * A[r] + sum;
                M[r] = mnew;
            }
            if (half) kn->pv_rows16(ws->o + (size_t)gi * nrp * Dp, S, ws->vrow16, bf16, A, nrp, kb, D, Dp, KS);
            else kn->pv_rows(ws->o + (size_t)gi * nrp * Dp, S, ws->vrow, A, nrp, kb, Dp, KS);
        }
    }

    for (gi = 0; gi < ng; gi++)
        for (r = 0; r < nr; r++) {
            int32_t R = gi * nrp + r;
            float *orow = ws->o + (size_t)R * Dp;
            if (part) { /* a chunk: unnormalised O, m, l for the merge */
                memcpy(part + (size_t)r * MSKV__CPU_MAX_DIM, orow, (size_t)D * 4);
                part[MSKV__CPU_SPLIT_ROWS * MSKV__CPU_MAX_DIM + r] = ws->m[R];
                part[MSKV__CPU_SPLIT_ROWS * (MSKV__CPU_MAX_DIM + 1) + r] = ws->l[R];
            } else {
                mskv__cpu_emit(job, sg, r0 + r, g0 + gi, orow, ws->m[R], ws->l[R]);
            }
        }
}

/* The last chunk of a split unit merges the unit's partial states in chunk
   order (the same order on any number of threads) and writes the rows. */
static void mskv__cpu_merge_unit(const mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_seg *sg, int32_t nr, int32_t g,
                                 const float *part, int32_t nch) {
    const size_t M = MSKV__CPU_SPLIT_ROWS * MSKV__CPU_MAX_DIM, L = M + MSKV__CPU_SPLIT_ROWS;
    int32_t r, c, d, D = job->dim;
    for (r = 0; r < nr; r++) {
        float *acc = ws->o, m = -INFINITY, l = 0.0f;
        for (d = 0; d < D; d++) acc[d] = 0.0f;
        for (c = 0; c < nch; c++) {
            const float *p = part + (size_t)c * MSKV__CPU_PART;
            float mc = p[M + r], lc = p[L + r], mn, wa, wc;
            if (lc <= 0.0f) continue;  /* the chunk saw no key of this row */
            mn = m > mc ? m : mc;
            wa = l > 0.0f ? expf(m - mn) : 0.0f;
            wc = expf(mc - mn);
            for (d = 0; d < D; d++) acc[d] = acc[d] * wa + p[(size_t)r * MSKV__CPU_MAX_DIM + d] * wc;
            l = l * wa + lc * wc;
            m = mn;
        }
        mskv__cpu_emit(job, sg, r, g, acc, m, l);
    }
}

static void mskv__cpu_item(mskv__cpu_job *job, mskv__cpu_ws *ws, const mskv__cpu_work *w) {
    mskv__cpu_seg sg;
    int32_t r0 = w->rb * job->rows * job->tiles, nr;
    mskv__cpu_seg_of(job, w->b, &sg);
    nr = sg.qo_len * job->group - r0;
    if (nr > job->rows * job->tiles) nr = job->rows * job->tiles;
    if (w->nch > 1) {
        float *part = job->all_ws[w->slot].part;
        int64_t v0 = mskv__cpu_chunk_at(sg.visible, w->c, w->nch), v1 = mskv__cpu_chunk_at(sg.visible, w->c + 1, w->nch);
        int last;
        /* the chunk's visible keys, as a range of compacted indices that may span the hidden ones */
        mskv__cpu_item_rows(job, ws, &sg, r0, nr, w->g0, 1, mskv__cpu_visible_at(&sg, v0),
                            mskv__cpu_visible_at(&sg, v1 - 1) + 1, part + (size_t)w->c * MSKV__CPU_PART);
        mskv__cpu_lock(job);
        last = ++job->slots[w->slot].done == w->nch;
        mskv__cpu_unlock(job);
        if (!last) return;
        mskv__cpu_merge_unit(job, ws, &sg, nr, w->g0, part, w->nch);
        mskv__cpu_lock(job);
        job->slots[w->slot].busy = 0;
        mskv__cpu_unlock(job);
    } else if (job->wide && nr > 8) {
        mskv__cpu_item_wide(job, ws, &sg, r0, nr, w->g0);
    } else {
        mskv__cpu_item_rows(job, ws, &sg, r0, nr, w->g0, w->ng, 0, sg.kv_len, NULL);
    }
}

static void mskv__cpu_attn_task(void *ctx, mskv__cpu_ws *ws) {
    mskv__cpu_job *job = (mskv__cpu_job *)ctx;
    mskv__cpu_work w;
    while (mskv__cpu_next(job, &w)) mskv__cpu_item(job, ws, &w);
#if MSKV__CPU_X86
    if (job->kern->isa == MSKV_CPU_ISA_AVX2 || job->kern->isa == MSKV_CPU_ISA_AVX512 || job->kern->isa == MSKV_CPU_ISA_AVX512_BF16 ||
        job->kern->isa == MSKV_CPU_ISA_AMX_BF16)
        mskv__cpu_zeroupper();
#endif
}

/* The plan's checks shared by the paged and dense paths, per segment: counts,
   rows that fit in int32, the position map, and queries without a position
   for a masked call. The callers checked the arrays and indptr[0]. */
static mskv_result mskv__cpu_check_segments(const mskv_plan *plan, const mskv_attn *attn, int32_t kv_heads, double *work) {
    int32_t b;
    *work = 0;
    if (!plan->vis_sink_end != !plan->vis_window_start) return MSKV_ERROR_NULL_POINTER;  /* one bound without the other */
    for (b = 0; b < plan->batch; b++) {
        int64_t qo = (int64_t)plan->qo_indptr[b + 1] - plan->qo_indptr[b];
        int64_t kv = plan->kv_len[b], split, shift;
        if (qo < 0 || kv < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        /* a segment's rows (query x q head of a group) are counted in int32, with room to round up */
        if (qo * (attn->q_heads / kv_heads) > (int64_t)INT32_MAX - 256) return MSKV_ERROR_OVERFLOW;
        split = plan->kv_pos_split ? plan->kv_pos_split[b] : kv;
        shift = plan->kv_pos_shift ? plan->kv_pos_shift[b] : 0;
        if (split < 0 || shift < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        /* queries without a position (a segment with no keys, padding, sees nothing whatever its positions) */
        if (attn->mask != MSKV_MASK_NONE && !plan->q_pos && qo > kv && kv > 0) return MSKV_ERROR_INVALID_ARGUMENT;
        *work += (double)qo * (double)kv;
    }
    return MSKV_SUCCESS;
}

/* Checks the plan against the pools before anything is read or written. */
static mskv_result mskv__cpu_check_plan(const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn, double *work) {
    int32_t b, i, P = pools->page_size;
    mskv_result r;
    *work = 0;
    if (plan->batch < 0 || plan->total_q < 0 || plan->num_page_ids < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != P) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->batch == 0) return plan->total_q == 0 ? MSKV_SUCCESS : MSKV_ERROR_INVALID_ARGUMENT;
    if (!plan->qo_indptr || !plan->kv_indptr || !plan->kv_len || (!plan->kv_indices && plan->num_page_ids > 0))
        return MSKV_ERROR_NULL_POINTER;
    /* kv_indices holds num_page_ids ids and no more: every indptr is checked
       against that count before an id is read (a plan may use a prefix of them) */
    if (plan->qo_indptr[0] != 0 || plan->kv_indptr[0] != 0 || plan->qo_indptr[plan->batch] != plan->total_q)
        return MSKV_ERROR_INVALID_ARGUMENT;
    for (b = 0; b < plan->batch; b++) {
        int64_t np = (int64_t)plan->kv_indptr[b + 1] - plan->kv_indptr[b];
        int64_t kv = plan->kv_len[b];
        if (np < 0 || plan->kv_indptr[b + 1] > plan->num_page_ids) return MSKV_ERROR_INVALID_ARGUMENT;
        if (np == 0 ? kv != 0 : (kv <= (int64_t)(np - 1) * P || kv > (int64_t)np * P)) return MSKV_ERROR_INVALID_ARGUMENT;
        if (plan->kv_last_page_len && np > 0 && plan->kv_last_page_len[b] != kv - (int64_t)(np - 1) * P)
            return MSKV_ERROR_INVALID_ARGUMENT;
    }
    if ((r = mskv__cpu_check_segments(plan, attn, pools->kv_heads, work)) != MSKV_SUCCESS) return r;
    for (b = 0; b < plan->batch; b++)
        for (i = plan->kv_indptr[b]; i < plan->kv_indptr[b + 1]; i++)
            if (plan->kv_indices[i] < 0 || plan->kv_indices[i] >= pools->num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    return MSKV_SUCCESS;
}

/* The same for dense K/V: each segment's rows lie inside kv->tokens. */
static mskv_result mskv__cpu_check_dense(const mskv_dense_kv *kv, const mskv_plan *plan, const mskv_attn *attn, double *work) {
    int32_t b;
    mskv_result r;
    *work = 0;
    if (plan->batch < 0 || plan->total_q < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->batch == 0) return plan->total_q == 0 ? MSKV_SUCCESS : MSKV_ERROR_INVALID_ARGUMENT;
    if (!plan->qo_indptr || !plan->kv_len) return MSKV_ERROR_NULL_POINTER;
    if (plan->qo_indptr[0] != 0 || plan->qo_indptr[plan->batch] != plan->total_q) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((r = mskv__cpu_check_segments(plan, attn, kv->kv_heads, work)) != MSKV_SUCCESS) return r;
    if (!plan->kv_token_indptr) return MSKV_ERROR_INVALID_ARGUMENT;
    for (b = 0; b < plan->batch; b++) {
        int64_t t0 = plan->kv_token_indptr[b], t1 = plan->kv_token_indptr[b + 1];
        if (t0 < 0 || t1 < t0 /* then t1 - t0 fits */ || t1 - t0 != (int64_t)plan->kv_len[b]) return MSKV_ERROR_INVALID_ARGUMENT;
        if (t1 > kv->tokens) return MSKV_ERROR_OUT_OF_RANGE;
    }
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_info_get(const mskv_cpu *cpu, mskv_cpu_info *out) {

    if (!cpu || !out) return MSKV_ERROR_NULL_POINTER;
    memset(out, 0, sizeof(*out));
    out->isa = cpu->kern->isa;
    out->num_threads = cpu->num_threads;
    out->workspace_bytes = cpu->workspace_bytes;
    out->last_call_items = cpu->last_items;
    return MSKV_SUCCESS;
}

/* Tile use for this call: rows per item (transposed tiles when the path's
   row width fits), keys per block of few-row items, and whether few-row
   segments split their keys (only when the call has few units of work, a
   rule that does not look at the thread count). */
static void mskv__cpu_job_tiles(mskv__cpu_job *job, const mskv__cpu_ws *ws, int split_ok) {
    const int32_t kvh = job->pools->kv_heads, rw = job->kern->rw;
    int32_t rows_cap = ws->rows * MSKV__CPU_MAX_DIM / job->dimp, b;
    int64_t units = 0;
    if (rows_cap > MSKV__CPU_MAX_ROWS) rows_cap = MSKV__CPU_MAX_ROWS;
    job->wide = rows_cap >= rw && rows_cap > 8;
    job->rows = job->wide ? rows_cap / rw * rw : rows_cap & ~3;
    job->row_keys = (int32_t)(((size_t)ws->keys * MSKV__CPU_MAX_DIM / ((size_t)job->dimp * (size_t)kvh)) & ~(size_t)1);
    if (job->row_keys > ws->keys) job->row_keys = ws->keys;
    if (job->row_keys < 2) job->row_keys = 2;
    /* the heads whose blocks fit the key tiles together (also with 16-bit
       rows read in place: a longer block of the same heads would outrun the
       next block's prefetch) */
    if (job->heads_cap > ws->keys * MSKV__CPU_MAX_DIM / (job->row_keys * job->dimp))
        job->heads_cap = ws->keys * MSKV__CPU_MAX_DIM / (job->row_keys * job->dimp);
    if (job->heads_cap < 1) job->heads_cap = 1;
    for (b = 0; b < job->plan->batch; b++) {
        int32_t rows = mskv__cpu_rows_of(job, b);
        units += (rows <= 8 ? 1 : (rows + job->rows - 1) / job->rows) * (int64_t)kvh;
    }
    job->chunks = split_ok && ws->chunks > 1 && units < MSKV__CPU_SPLIT_UNITS ? ws->chunks : 1;
}

/* Row tiles per many-row item: as many as the Q and O tiles hold (each key
   block is then converted once for all of them), while the call keeps at
   least 3 items per thread to balance. A row's result does not depend on
   this choice (see mskv__cpu_item_wide), so it may look at the threads. */
static void mskv__cpu_job_wide_tiles(mskv__cpu_job *job, const mskv__cpu_ws *ws, int32_t threads) {
    const int64_t kvh = job->pools->kv_heads;
    int32_t t = (int32_t)((size_t)ws->rows * MSKV__CPU_MAX_DIM / ((size_t)job->dimp * (size_t)job->rows)), b;
    job->tiles = 1;
    if (!job->wide) return;
    if (t > MSKV__CPU_MAX_TILES) t = MSKV__CPU_MAX_TILES;
    for (; t > 1; t--) {
        int64_t items = 0;
        for (b = 0; b < job->plan->batch; b++) {
            int32_t rows = mskv__cpu_rows_of(job, b);
            items += (rows <= 8 ? 1 : ((rows + job->rows - 1) / job->rows + t - 1) / t) * kvh;
        }
        if (items >= 3 * (int64_t)threads) { job->tiles = t; return; }
    }
}

/* The call's arguments other than the plan (pools stands for dense K/V too). */
static mskv_result mskv__cpu_check_args(const mskv_pools *pools, const mskv_attn *attn) {
    if (!mskv__cpu_dtype_ok(pools->dtype) || !mskv__cpu_dtype_ok(attn->q_dtype)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (pools->num_pages < 1 || pools->page_size < 1 || pools->kv_heads < 1 || pools->head_dim < 1 ||
        pools->head_dim > MSKV__CPU_MAX_DIM)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->q_heads < 1 || attn->q_heads % pools->kv_heads != 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->mask != MSKV_MASK_NONE && attn->mask != MSKV_MASK_CAUSAL && attn->mask != MSKV_MASK_WINDOW)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->mask == MSKV_MASK_WINDOW && attn->window_left < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(attn->scale >= 0.0f) || attn->scale == INFINITY) return MSKV_ERROR_INVALID_ARGUMENT;
    return MSKV_SUCCESS;
}

/* Runs a checked call: the job's fields from the arguments, then the work
   on the pool's threads (or the caller's alone, or on stack tiles without a pool). */
static void mskv__cpu_run(mskv_cpu *cpu, mskv__cpu_job *job, double work) {
    const mskv_pools *pools = job->pools;
    double flops = 4.0 * work * (double)job->q_heads * (double)pools->head_dim;
    job->group = job->q_heads / pools->kv_heads;
    job->dim = pools->head_dim;
    job->dimp = (pools->head_dim + MSKV__CPU_KTILE - 1) & ~(MSKV__CPU_KTILE - 1);
    if (!cpu) {
        /* no pool: small tiles on the stack (about 50 KB), few-row kernels only */
        enum { ROWS = 8, KEYS = 16 };
        float q_t[ROWS * MSKV__CPU_MAX_DIM], o_t[ROWS * MSKV__CPU_MAX_DIM];
        float k_t[KEYS * MSKV__CPU_MAX_DIM], v_t[KEYS * MSKV__CPU_MAX_DIM], s_t[ROWS * KEYS];
        float m_t[ROWS], l_t[ROWS], a_t[ROWS];
        int64_t lo_t[ROWS], hi_t[ROWS];
        int32_t ba_t[ROWS], bz_t[ROWS];
        const float *vr_t[KEYS + 4], *kr_t[KEYS + 4];
        const uint16_t *vh_t[KEYS + 4], *kh_t[KEYS + 4];
        size_t el_t[KEYS];
        char why[160];
        mskv__cpu_ws ws;
        memset(&ws, 0, sizeof ws);
        ws.q = q_t; ws.o = o_t; ws.k = k_t; ws.v = v_t; ws.s = s_t; ws.m = m_t; ws.l = l_t; ws.alpha = a_t;
        ws.klo = lo_t; ws.khi = hi_t; ws.a = ba_t; ws.z = bz_t; ws.vrow = vr_t; ws.krow = kr_t; ws.el = el_t;
        ws.vrow16 = vh_t; ws.krow16 = kh_t;
        ws.rows = ROWS;
        ws.keys = KEYS;
        job->kern = mskv__cpu_kern_of(mskv__cpu_resolve_auto(why, sizeof why));
        job->heads_cap = pools->kv_heads;
        mskv__cpu_job_tiles(job, &ws, 0);
        job->wide = 0;
        job->rows = ROWS;
        mskv__cpu_attn_task(job, &ws);
        return;
    }
    job->kern = cpu->kern;
    job->all_ws = cpu->ws;
    job->slots = cpu->slots;
    job->nslots = cpu->num_threads;
    /* grouping kv heads must still leave about 4 items per thread */
    job->heads_cap = (int32_t)((int64_t)job->plan->batch * pools->kv_heads / (4 * (int64_t)cpu->num_threads));
    mskv__cpu_job_tiles(job, &cpu->ws[0], 1);
    mskv__cpu_job_wide_tiles(job, &cpu->ws[0], cpu->num_threads);
#ifndef MSKV_NO_THREADS
    if (cpu->num_threads > 1 && flops >= MSKV__CPU_SMALL_FLOPS) {
        mskv__mutex_lock(&cpu->call_lock);
        job->lock = &cpu->lock;
        mskv__mutex_lock(&cpu->lock);
        cpu->task = mskv__cpu_attn_task;
        cpu->task_ctx = job;
        cpu->busy = cpu->started;
        cpu->generation++;
        mskv__cond_broadcast(&cpu->wake);
        mskv__mutex_unlock(&cpu->lock);
        mskv__cpu_attn_task(job, &cpu->ws[0]);
        mskv__mutex_lock(&cpu->lock);
        while (cpu->busy > 0) mskv__cond_wait(&cpu->done, &cpu->lock);
        mskv__mutex_unlock(&cpu->lock);
        cpu->last_items = job->items;
        mskv__mutex_unlock(&cpu->call_lock);
        return;
    }
    /* the caller alone, but still one call at a time on workspace 0 */
    mskv__mutex_lock(&cpu->call_lock);
    mskv__cpu_attn_task(job, &cpu->ws[0]);
    cpu->last_items = job->items;
    mskv__mutex_unlock(&cpu->call_lock);
#else
    (void)flops;
    mskv__cpu_attn_task(job, &cpu->ws[0]);
    cpu->last_items = job->items;
#endif
}

/* The job of a checked call, before mskv__cpu_run. */
static void mskv__cpu_job_init(mskv__cpu_job *job, const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn,
                               const void *q, void *o, float *lse) {
    memset(job, 0, sizeof *job);
    job->pools = pools;
    job->plan = plan;
    job->q = q;
    job->o = o;
    job->lse = lse;
    job->qt = attn->q_dtype;
    job->mask = attn->mask;
    job->q_heads = attn->q_heads;
    job->window_left = attn->window_left;
    job->scale = attn->scale > 0.0f ? attn->scale : 1.0f / sqrtf((float)pools->head_dim);
    job->tstride = (size_t)pools->kv_heads * (size_t)pools->head_dim;
    job->hstride = (size_t)pools->head_dim;
    job->tiles = 1;
    job->p_magic = 0;
    job->p_shift = 31;
    if (pools->page_size > 0) mskv__pdiv_init(pools->page_size, &job->p_magic, &job->p_shift);
}

MSKV_IMPL mskv_result mskv_cpu_attention_pools(mskv_cpu *cpu, const mskv_pools *pools, const mskv_plan *plan,
                                              const mskv_attn *attn, const void *q, void *o, float *lse) {
    mskv__cpu_job job;
    double work = 0;
    mskv_result res;
    if (!pools || !plan || !attn) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv__cpu_check_args(pools, attn)) != MSKV_SUCCESS) return res;
    if ((res = mskv__cpu_check_plan(pools, plan, attn, &work)) != MSKV_SUCCESS) return res;
    if (plan->total_q == 0) return MSKV_SUCCESS;
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    if (plan->kv_indptr[plan->batch] > 0 && (!pools->k || !pools->v)) return MSKV_ERROR_NULL_POINTER;
    mskv__cpu_job_init(&job, pools, plan, attn, q, o, lse);
    mskv__cpu_run(cpu, &job, work);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_attention_dense(mskv_cpu *cpu, const mskv_dense_kv *kv, const mskv_plan *plan,
                                              const mskv_attn *attn, const void *q, void *o, float *lse) {
    mskv__cpu_job job;
    mskv_pools pools;  /* the geometry the kernels read; no pages */
    double work = 0;
    mskv_result res;
    if (!kv || !plan || !attn) return MSKV_ERROR_NULL_POINTER;
    memset(&pools, 0, sizeof pools);
    pools.k = kv->k;
    pools.v = kv->v;
    pools.dtype = kv->dtype;
    pools.num_pages = 1;
    pools.page_size = 1;
    pools.kv_heads = kv->kv_heads;
    pools.head_dim = kv->head_dim;
    if ((res = mskv__cpu_check_args(&pools, attn)) != MSKV_SUCCESS) return res;
    if (kv->tokens < 0 || kv->token_stride < 0 || kv->head_stride < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (kv->device) return MSKV_ERROR_INVALID_ARGUMENT;   /* device addresses: mskv_cuda_attention_dense reads those */
    if ((res = mskv_dense_kv_check(kv)) != MSKV_SUCCESS) return res;   /* a stale view first: it explains the rest */
    if ((res = mskv__cpu_check_dense(kv, plan, attn, &work)) != MSKV_SUCCESS) return res;
    if (plan->total_q == 0) return MSKV_SUCCESS;
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    if (plan->kv_token_indptr[plan->batch] > plan->kv_token_indptr[0] && (!kv->k || !kv->v)) return MSKV_ERROR_NULL_POINTER;
    mskv__cpu_job_init(&job, &pools, plan, attn, q, o, lse);
    job.dense = 1;
    if (kv->token_stride) job.tstride = (size_t)kv->token_stride;
    if (kv->head_stride) job.hstride = (size_t)kv->head_stride;
    mskv__cpu_run(cpu, &job, work);
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
