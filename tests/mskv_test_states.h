/* Requests in every state a blob carries, built the same way in any arena
   (and so in two processes): the streamed-blob tests (test_stream.c) and the
   UCX migration tests (test_ucx.c) move them and compare the bytes. */
#ifndef MSKV_TEST_STATES_H
#define MSKV_TEST_STATES_H
#include <stdlib.h>
#include <string.h>
#include "../mstar_kv.h"

typedef enum mts_state {
    MTS_PLAIN = 0,      /* committed tokens, nothing else */
    MTS_PREFIX,         /* a protected prefix */
    MTS_GAP,            /* a protected prefix and a released gap behind it */
    MTS_KEYED,          /* a sealed keyed (cross-attention) entry */
    MTS_RETENTION,      /* a retention policy (sink + window chunks) */
    MTS_OFFLOADED,      /* prefix and gap, then parked in host memory */
    MTS_GROUPS,         /* two layer groups with their own prefix and window (a 2-group arena) */
    MTS_POSITIONS,      /* a release point inside a page and a position shift (a version-3 blob) */
    MTS_COUNT
} mts_state;

static const char *const mts_names[MTS_COUNT] = { "plain", "prefix", "gap", "keyed", "retention", "offloaded", "groups", "positions" };

#define MTS_LAYERS 2
#define MTS_HEADS 2
#define MTS_DIM 8
#define MTS_KEY 0x5EEDC0DEull

static inline mskv_arena *mts_arena(int32_t num_pages, int32_t page_size, int32_t groups) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    d.num_layers = MTS_LAYERS;
    d.kv_heads = MTS_HEADS;
    d.head_dim = MTS_DIM;
    d.dtype = MSKV_DTYPE_BF16;
    d.num_groups = groups;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

/* A store standing in for a GPU's (store_ops): page records in host
   memory the arena cannot see, so blobs of it are staged. One per arena,
   found by arena (a few at a time per process). */
typedef struct mts_store {
    mskv_arena *arena;
    unsigned char *mem;
    size_t record, page_bytes;
    mskv_store_ops ops;
} mts_store;
static mts_store mts_stores[4];

static inline mskv_result mts_store_read(void *u, const int32_t *p, int32_t n, void *dst) {
    mts_store *s = (mts_store *)u;
    int32_t i;
    for (i = 0; i < n; i++) memcpy((unsigned char *)dst + (size_t)i * s->record, s->mem + (size_t)p[i] * s->record, s->record);
    return MSKV_SUCCESS;
}
static inline mskv_result mts_store_write(void *u, const int32_t *p, int32_t n, const void *src) {
    mts_store *s = (mts_store *)u;
    int32_t i;
    for (i = 0; i < n; i++) memcpy(s->mem + (size_t)p[i] * s->record, (const unsigned char *)src + (size_t)i * s->record, s->record);
    return MSKV_SUCCESS;
}
static inline mskv_result mts_store_copy(void *u, int32_t from, int32_t to) {
    mts_store *s = (mts_store *)u;
    memcpy(s->mem + (size_t)to * s->record, s->mem + (size_t)from * s->record, s->record);
    return MSKV_SUCCESS;
}

/* The arena of mts_arena with its pages behind store_ops; NULL when all
   slots are in use. Destroy it with mts_arena_destroy. */
static inline mskv_arena *mts_arena_ops(int32_t num_pages, int32_t page_size, int32_t groups) {
    mskv_arena_desc d;
    mts_store *s = NULL;
    int i;
    for (i = 0; i < 4 && !s; i++)
        if (!mts_stores[i].arena) s = &mts_stores[i];
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->page_bytes = (size_t)page_size * MTS_HEADS * MTS_DIM * 2;   /* bf16 */
    s->record = 2 * MTS_LAYERS * s->page_bytes;
    s->mem = (unsigned char *)calloc((size_t)num_pages, s->record);
    s->ops.user = s;
    s->ops.read_pages = mts_store_read;
    s->ops.write_pages = mts_store_write;
    s->ops.copy_page = mts_store_copy;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages;
    d.page_size = page_size;
    d.num_layers = MTS_LAYERS;
    d.kv_heads = MTS_HEADS;
    d.head_dim = MTS_DIM;
    d.dtype = MSKV_DTYPE_BF16;
    d.num_groups = groups;
    d.store_ops = &s->ops;
    if (!s->mem || mskv_arena_create(&d, &s->arena) != MSKV_SUCCESS) { free(s->mem); memset(s, 0, sizeof *s); return NULL; }
    return s->arena;
}

static inline mts_store *mts_store_of(const mskv_arena *a) {
    int i;
    for (i = 0; a && i < 4; i++)
        if (mts_stores[i].arena == a) return &mts_stores[i];
    return NULL;
}

/* Destroys an arena of mts_arena or mts_arena_ops. */
static inline void mts_arena_destroy(mskv_arena *a) {
    mts_store *s = mts_store_of(a);
    mskv_arena_destroy(a);
    if (s) { free(s->mem); memset(s, 0, sizeof *s); }
}

/* Every byte of every page the request holds: a pattern of (tag, group,
   table entry, pool, byte), so a page in the wrong place shows. */
static inline int mts_fill(mskv_arena *a, mskv_request r, int32_t groups, uint32_t tag) {
    mskv_store_info si;
    int32_t g, i, n, pool;
    size_t b;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return 0;
    for (g = 0; g < groups; g++) {
        int32_t *pages;
        if (mskv_request_pages_in_group(a, r, g, NULL, 0, &n) != MSKV_SUCCESS && n == 0) return 0;
        if (n == 0) continue;
        pages = (int32_t *)malloc((size_t)n * sizeof(int32_t));
        if (!pages || mskv_request_pages_in_group(a, r, g, pages, n, &n) != MSKV_SUCCESS) { free(pages); return 0; }
        for (i = 0; i < n; i++)
            for (pool = 0; pool < 2 * si.num_layers; pool++) {
                mts_store *st = mts_store_of(a);
                unsigned char *p = st ? st->mem + (size_t)pages[i] * st->record + (size_t)pool * st->page_bytes
                                      : (unsigned char *)mskv_store_pool(a, pool / 2, pool % 2) + (size_t)pages[i] * si.page_bytes;
                for (b = 0; b < si.page_bytes; b++) {
                    uint32_t x = tag * 2654435761u ^ (uint32_t)g * 97u ^ (uint32_t)i * 40503u ^ (uint32_t)pool * 977u ^ (uint32_t)b * 7u;
                    x ^= x >> 13;
                    p[b] = (unsigned char)(x * 31u >> 3);
                }
            }
        free(pages);
    }
    return 1;
}

/* A request of `tokens` tokens (>= 1) in state s, its bytes from tag.
   MTS_GROUPS needs an arena of two layer groups, the others one group.
   Returns MSKV_SUCCESS or the first failing call's code. */
static inline mskv_result mts_build(mskv_arena *a, mts_state s, int64_t tokens, uint32_t tag, mskv_request *out) {
    mskv_result e;
    mskv_segment seg;
    int32_t groups = s == MTS_GROUPS ? 2 : 1, P;
    mskv_store_info si;
    int64_t released;
    if ((e = mskv_store_info_get(a, &si)) != MSKV_SUCCESS) return e;
    P = si.page_size;
    if (s == MTS_KEYED) {
        if ((e = mskv_keyed_create(a, MTS_KEY + tag, tokens, out)) != MSKV_SUCCESS) return e;
        if (!mts_fill(a, *out, 1, tag)) return MSKV_ERROR_AUDIT_FAILED;
        return mskv_keyed_seal(a, *out);
    }
    if ((e = mskv_request_add(a, out)) != MSKV_SUCCESS) return e;
    seg.request = *out;
    seg.n_tokens = tokens;
    if ((e = mskv_admit(a, &seg, 1)) != MSKV_SUCCESS) return e;
    if ((e = mskv_commit(a, &seg, 1)) != MSKV_SUCCESS) return e;
    if ((e = mskv_publish(a, &seg, 1, NULL)) != MSKV_SUCCESS) return e;
    if (!mts_fill(a, *out, groups, tag)) return MSKV_ERROR_AUDIT_FAILED;
    if (s == MTS_PREFIX || s == MTS_GAP || s == MTS_OFFLOADED || s == MTS_GROUPS || s == MTS_POSITIONS) {
        if ((e = mskv_request_protect_prefix(a, *out, tokens / 4)) != MSKV_SUCCESS) return e;
    }
    if (s == MTS_GAP || s == MTS_OFFLOADED || s == MTS_GROUPS) {
        /* release about half of the live tokens: whole pages only */
        if ((e = mskv_request_release_oldest(a, *out, (tokens - tokens / 4) / 2, &released)) != MSKV_SUCCESS) return e;
    }
    if (s == MTS_GROUPS) {
        if ((e = mskv_request_protect_prefix_in_group(a, *out, 1, tokens / 8)) != MSKV_SUCCESS) return e;
        if ((e = mskv_request_release_oldest_in_group(a, *out, 1, (tokens - tokens / 8) / 3, &released)) != MSKV_SUCCESS) return e;
    }
    if (s == MTS_RETENTION) {
        mskv_retention r;
        memset(&r, 0, sizeof r);
        r.chunk_size = P;
        r.sink_chunks = 1;
        r.window_chunks = 2;
        r.window_tokens = 2 * (int64_t)P;
        if ((e = mskv_request_set_retention(a, *out, &r)) != MSKV_SUCCESS) return e;
    }
    if (s == MTS_POSITIONS) {
        /* a release that ends inside a page (its pages go whole, the point stays exact), then positions moved back */
        int64_t n = (tokens - tokens / 4) / 2;
        if (n % P == 0) n++;
        if ((e = mskv_request_release_oldest(a, *out, n, &released)) != MSKV_SUCCESS) return e;
        if ((e = mskv_request_shift_positions(a, *out, -released - 3)) != MSKV_SUCCESS) return e;
    }
    if (s == MTS_OFFLOADED) return mskv_request_offload(a, *out);
    return MSKV_SUCCESS;
}

#endif
