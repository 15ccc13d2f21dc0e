/* Host core: implementation (inlined into mstar_kv.h's implementation section). */
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
    case MSKV_ERROR_OUT_OF_PAGES: return "out of pages";
    case MSKV_ERROR_OUT_OF_MEMORY: return "out of memory";
    case MSKV_ERROR_OVERFLOW: return "size overflow";
    case MSKV_ERROR_TOO_MANY_REQUESTS: return "too many requests";
    case MSKV_ERROR_BLOB_TRUNCATED: return "blob is truncated";
    case MSKV_ERROR_BLOB_CORRUPT: return "blob is corrupt (magic or checksum)";
    case MSKV_ERROR_BLOB_VERSION: return "blob version not supported";
    case MSKV_ERROR_BLOB_MISMATCH: return "blob layout differs from the arena";
    case MSKV_ERROR_AUDIT_FAILED: return "audit failed: an invariant does not hold";
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
    uint8_t used, location, keyed, sealed, has_res, has_ret, mark;
    int64_t committed, reserved, prefix_tokens, live_start, published;
    int32_t prefix_pages;
    int32_t *tab;             /* the table's memory */
    int32_t *pages;           /* tab + head: releases move the head, not the live pages */
    int32_t head, num_pages, cap_pages;
    uint64_t epoch, key;
    mskv_retention retention;
    unsigned char *host;      /* offloaded copy: host_pages records */
    int32_t host_pages;
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
    int64_t offloaded_pages;
    mskv_store_info store;
    size_t record_bytes;       /* one page, all layers, K and V: num_layers * 2 * page_bytes */
    unsigned char **pools;     /* [layer*2 + kind] */
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

MSKV_IMPL mskv_result mskv_arena_create(const mskv_arena_desc *desc, mskv_arena **out) {
    mskv_arena *a;
    size_t n, sz, page_bytes = 0, pool_bytes = 0, rec = 0;
    int32_t i, nl;
    if (!desc || !out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    if (desc->num_pages < 2 || desc->page_size < 1 || desc->max_requests < 0 || desc->max_requests > 65535 ||
        desc->num_layers < 0 || (unsigned)desc->retire_mode > 1u ||
        (desc->allocator.alloc || desc->allocator.realloc || desc->allocator.free) !=
            (desc->allocator.alloc && desc->allocator.realloc && desc->allocator.free) ||
        (desc->host_allocator.alloc || desc->host_allocator.realloc || desc->host_allocator.free) !=
            (desc->host_allocator.alloc && desc->host_allocator.realloc && desc->host_allocator.free))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if ((int64_t)desc->num_pages * desc->page_size > ((int64_t)1 << 62)) return MSKV_ERROR_OVERFLOW;
    nl = desc->num_layers;
    if (nl > 0) {
        if (desc->kv_heads < 1 || desc->head_dim < 1 || mskv_dtype_size(desc->dtype) == 0)
            return MSKV_ERROR_INVALID_ARGUMENT;
        if (!mskv__mul((size_t)desc->kv_heads, (size_t)desc->head_dim, &sz) ||
            !mskv__mul(sz, mskv_dtype_size(desc->dtype), &sz) ||
            !mskv__mul(sz, (size_t)desc->page_size, &page_bytes) ||
            !mskv__mul(page_bytes, (size_t)desc->num_pages, &pool_bytes) ||
            !mskv__mul(page_bytes, (size_t)nl * 2, &rec))
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
    if (!a->state || !a->refcount || !a->free_stack || !a->pend_page || !a->pend_fence || !a->scratch ||
        !a->reqs || !a->req_free || (nl > 0 && !desc->store_ops && (!a->pools || !a->pools[nl * 2 - 1]))) {
        a->store.num_layers = (a->pools ? nl : 0);
        mskv_arena_destroy(a);
        return MSKV_ERROR_OUT_OF_MEMORY;
    }
    memset(a->reqs, 0, (size_t)a->max_req * sizeof(mskv__req));
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
        }
    }
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
}

static mskv_result mskv__retire(mskv_arena *a, uint64_t completed) {
    while (a->pend_count > 0 && a->pend_fence[a->pend_head] <= completed) {
        int32_t p = a->pend_page[a->pend_head];
        a->state[p] = MSKV__PAGE_FREE;
        a->free_stack[a->free_top++] = p;
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
    if (q->head + need <= q->cap_pages) return MSKV_SUCCESS;
    if (q->head > 0) {
        if (q->num_pages) memmove(q->tab, q->pages, (size_t)q->num_pages * sizeof(int32_t));
        q->head = 0;
        q->pages = q->tab;
        if (need <= q->cap_pages) return MSKV_SUCCESS;
    }
    cap = q->cap_pages ? q->cap_pages : 8;
    while (cap < need) cap = cap > (1 << 29) ? need : cap * 2;
    p = (int32_t *)mskv__realloc(&a->al, q->tab, (size_t)cap * sizeof(int32_t));
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

static void mskv__drop_pages(mskv_arena *a, int32_t ri, int32_t from, int32_t count);

static void mskv__del_req(mskv_arena *a, int32_t ri) {
    mskv__req *q = &a->reqs[ri];
    mskv__drop_pages(a, ri, 0, q->num_pages);
    if (q->host) mskv__free(mskv__hal(a), q->host);
    a->offloaded_pages -= q->host_pages;
    q->host = NULL;
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
        /* give the slot back exactly as it was taken */
        c->used = 0;
        a->req_free[a->req_free_top++] = ci;
        a->nreq--;
        a->epoch_counter--;
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
    if (q->location != MSKV_RESIDENT) r = MSKV_ERROR_OFFLOADED;
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

MSKV_IMPL mskv_result mskv_request_offload(mskv_arena *a, mskv_request h) {
    int32_t ri, n;
    mskv__req *q;
    mskv_result r;
    unsigned char *host = NULL;
    size_t bytes;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    MSKV__LOCK(a);
    MSKV__GET(a, h, ri);
    q = &a->reqs[ri];
    r = mskv__check_mutable(a, q, "offload");
    if (r == MSKV_SUCCESS && q->has_res) r = mskv__err(a, MSKV_ERROR_RESERVATION_PENDING, "offload: commit or abort first");
    if (r != MSKV_SUCCESS) { MSKV__UNLOCK(a); return r; }
    n = q->num_pages;
    if (!mskv__mul((size_t)n, a->record_bytes, &bytes)) { MSKV__UNLOCK(a); return MSKV_ERROR_OVERFLOW; }
    if (bytes > 0) {
        host = (unsigned char *)mskv__alloc(mskv__hal(a), bytes);
        if (!host) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OUT_OF_MEMORY, "offload: %zu host bytes", bytes); }
        r = mskv__read_pages(a, q->pages, n, host);
        if (r != MSKV_SUCCESS) {
            mskv__free(mskv__hal(a), host);
            MSKV__UNLOCK(a);
            return mskv__err(a, r, "offload: reading pages failed, request stays resident");
        }
    }
    /* the copy is complete: only now may the pages go */
    mskv__drop_pages(a, ri, 0, n);
    q->host = host;
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
    n = q->host_pages;
    r = mskv__reserve_table(a, q, n);
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
    mskv__free(mskv__hal(a), q->host);
    q->host = NULL;
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

static uint64_t mskv__checksum(const void *p, size_t n) {
    mskv__hash h;
    mskv__hash_init(&h);
    mskv__hash_update(&h, p, n);
    return mskv__hash_final(&h);
}

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

MSKV_IMPL mskv_result mskv_request_import(mskv_arena *a, const void *blob, size_t size, mskv_request *out) {
    const unsigned char *b = (const unsigned char *)blob;
    uint64_t total;
    uint32_t n, flags, pp;
    int64_t committed, prefix, live, published;
    size_t payload;
    int32_t ri;
    mskv__req *q;
    unsigned char *host = NULL;
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
    ret.window_tokens = ret.chunk_size * ret.window_chunks;
    ret.reset_at_boundary = (int32_t)mskv__get32(b + 112);
    ret.exact = (int32_t)mskv__get32(b + 116);
    /* a valid checksum over nonsense is still nonsense: check the state is one we could have written */
    if (!mskv__mul((size_t)n, a->record_bytes, &payload) || payload + MSKV__BLOB_HEADER + 8 != total ||
        committed < 0 || committed > INT32_MAX || prefix < 0 || prefix > committed || live < 0 || live % a->P != 0 ||
        pp != (uint32_t)mskv__ceil_div(prefix, a->P) || live < (int64_t)pp * a->P || published < 0 || published > committed ||
        (flags & ~7u) != 0 || (flags & 1u) != ((flags >> 1) & 1u) /* only sealed keyed entries export */)
        return mskv__err(a, MSKV_ERROR_BLOB_CORRUPT, "import: inconsistent header");
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
    }
    ri = mskv__new_req(a);
    if (ri < 0) {
        mskv__free(mskv__hal(a), host);
        MSKV__UNLOCK(a);
        return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "import: no request slot");
    }
    q = &a->reqs[ri];
    q->location = MSKV_OFFLOADED;
    q->host = host;
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
    if (!s) return MSKV_ERROR_NULL_POINTER;
    if (total < 0 || window < 1 || overlap < 0 || overlap >= window) return MSKV_ERROR_INVALID_SPEC;
    s->total = total;
    s->window = window;
    s->overlap = overlap;
    s->stride = window - overlap;
    if (total == 0) s->count = 0;
    else if (total <= window) s->count = 1;
    else s->count = 1 + (total - window + s->stride - 1) / s->stride;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_schedule_window(const mskv_schedule *s, int64_t k, mskv_window *w) {
    if (!s || !w) return MSKV_ERROR_NULL_POINTER;
    if (s->window < 1 || s->overlap < 0 || s->overlap >= s->window || s->stride != s->window - s->overlap)
        return MSKV_ERROR_INVALID_SPEC;
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

MSKV_IMPL int64_t mskv_skipped_tokens(const mskv_retention *r, int64_t num_computed) {
    int64_t sink, after, raw;
    if (mskv__retention_check(r, 0, NULL, 0) != MSKV_SUCCESS || num_computed < 0) return 0;
    sink = r->sink_chunks * r->chunk_size;
    if (num_computed <= sink) return 0;
    after = num_computed - sink;
    if (r->reset_at_boundary) return after / r->chunk_size * r->chunk_size;
    raw = after - r->window_chunks * r->chunk_size;
    if (raw <= 0) return 0;
    return raw / r->chunk_size * r->chunk_size;
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
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
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
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
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
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
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
    int64_t sink = rt->sink_chunks * rt->chunk_size, keep_from, live;
    if (q->committed >= sink && q->prefix_tokens < sink && q->live_start <= (int64_t)q->prefix_pages * a->P)
        (void)mskv__protect(a, ri, sink);
    if (q->prefix_tokens < sink) return; /* the sink is not complete (or not protectable): nothing may go yet */
    keep_from = sink + mskv_skipped_tokens(rt, q->committed);
    live = q->committed - q->live_start;
    if (keep_from > q->live_start && live > 0)
        (void)mskv__release(a, ri, keep_from - q->live_start < live ? keep_from - q->live_start : live);
}

MSKV_IMPL mskv_result mskv_publish(mskv_arena *a, const mskv_segment *segs, int32_t n, uint64_t *step_out) {
    int32_t i;
    mskv_result r;
    if (!a) return MSKV_ERROR_NULL_POINTER;
    if (n < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n > 0 && !segs) return MSKV_ERROR_NULL_POINTER;
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
        if (d->kind == MSKV_PLAN_DENSE) {
            if (d->dense_kv_len[i] < 0 || d->dense_kv_len[i] > INT32_MAX) return mskv__err(a, MSKV_ERROR_INVALID_ARGUMENT, "plan: dense kv length");
        } else {
            const mskv__req *q = &a->reqs[mskv__lookup(a, segs[i].request)];
            if (q->location != MSKV_RESIDENT) return mskv__err(a, MSKV_ERROR_OFFLOADED, "plan: segment %d's request is offloaded", (int)i);
            if (nt > mskv__kv_len(a, q))
                return mskv__err(a, MSKV_ERROR_OUT_OF_RANGE, "plan: segment %d has %lld queries but only %lld tokens", (int)i, (long long)nt, (long long)mskv__kv_len(a, q));
            ids += d->kind == MSKV_PLAN_SELF ? q->num_pages : x->num_pages;
        }
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

static int32_t mskv__floordiv(int64_t x, int64_t d) { return (int32_t)(x >= 0 ? x / d : -((-x + d - 1) / d)); }

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
            int64_t j = own_len - nq + i, pos;
            if (q) {
                int64_t qsplit = (int64_t)q->prefix_pages * a->P;
                pos = j < qsplit ? j : j + (q->live_start - qsplit);
            } else {
                pos = j;
            }
            p->slot_mapping[q_at + i] = desc->kind == MSKV_PLAN_SELF ? (int64_t)q->pages[j / a->P] * a->P + j % a->P : -1;
            pos -= desc->pos_offset;
            if (desc->pos_mode == MSKV_POS_1D) {
                p->positions[q_at + i] = (int32_t)pos;
            } else if (desc->pos_mode == MSKV_POS_3D) {
                int64_t tpf = (int64_t)desc->grid_h * desc->grid_w;
                int32_t f = mskv__floordiv(pos, tpf);
                int64_t rem = pos - (int64_t)f * tpf;
                p->positions[3 * (q_at + i) + 0] = f;
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
    size_t b, t, ids, total = 0, off = 0;
    unsigned char *mem;
    if (!a || !p) return MSKV_ERROR_NULL_POINTER;
    if (cap_batch < 0 || cap_tokens < 0 || cap_page_ids < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    b = (size_t)cap_batch;
    t = (size_t)cap_tokens;
    ids = (size_t)cap_page_ids;
    /* 8-byte arrays first, then 4-byte ones: natural alignment without padding */
    total = (b + 1) * 8 + t * 8 + (b + 1) * 4 * 2 + ids * 4 + b * 4 * 4 + t * 4 * 3;
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
        int32_t np = p->kv_indptr[b + 1] - p->kv_indptr[b], last = p->kv_last_page_len[b];
        if (p->qo_indptr[b + 1] < p->qo_indptr[b]) MSKV__BAD("qo_indptr decreases at %d", (int)b);
        if (np < 0) MSKV__BAD("kv_indptr decreases at %d", (int)b);
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
    if (need > a->free_top) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_OUT_OF_PAGES, "keyed_create: need %d pages, %d free", (int)need, (int)a->free_top); }
    ri = mskv__new_req(a);
    if (ri < 0) { MSKV__UNLOCK(a); return mskv__err(a, MSKV_ERROR_TOO_MANY_REQUESTS, "keyed_create: no request slot"); }
    q = &a->reqs[ri];
    r = mskv__reserve_table(a, q, need);
    if (r != MSKV_SUCCESS) {
        q->used = 0;
        a->req_free[a->req_free_top++] = ri;
        a->nreq--;
        a->epoch_counter--;
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

MSKV_IMPL uint64_t mskv_arena_digest(mskv_arena *a) {
    mskv__hash h;
    int32_t i;
    if (!a) return 0;
    MSKV__LOCK(a);
    mskv__hash_init(&h);
    mskv__hash_u64(&h, a->step);
    mskv__hash_u64(&h, a->completed);
    mskv__hash_u64(&h, a->epoch_counter);
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
                               (uint64_t)q->has_res << 24 | (uint64_t)q->has_ret << 32);
        mskv__hash_u64(&h, (uint64_t)q->committed);
        mskv__hash_u64(&h, (uint64_t)q->reserved);
        mskv__hash_u64(&h, (uint64_t)q->prefix_tokens);
        mskv__hash_u64(&h, (uint64_t)q->live_start);
        mskv__hash_u64(&h, (uint64_t)q->published);
        mskv__hash_u64(&h, (uint64_t)q->prefix_pages);
        mskv__hash_u64(&h, q->epoch);
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
