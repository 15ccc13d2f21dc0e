/* Shared by the libFuzzer harnesses of tests/fuzz and by gen_corpus.c: the
   arena geometries the harnesses know (a seed names its geometry in its first
   byte), a reader that turns fuzz bytes into wild argument values, and the
   checks every harness makes (audit passes, a failed call changes nothing).
   A broken check aborts, which libFuzzer reports as a crash with the input. */
#ifndef MSKV_FUZZ_COMMON_H
#define MSKV_FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../mstar_kv.h"

/* Several page sizes (1, 3, 4, 5, 16), dtypes and layer counts, including a
   bookkeeping-only arena: blobs and plans differ in every one of them. */
typedef struct fz_geom {
    int32_t num_pages, page_size, num_layers, kv_heads, head_dim;
    mskv_dtype dtype;
} fz_geom;

static const fz_geom fz_geoms[] = {
    { 32, 4, 1, 1, 4, MSKV_DTYPE_F32 },
    { 40, 3, 2, 2, 8, MSKV_DTYPE_F16 },
    { 24, 16, 1, 2, 16, MSKV_DTYPE_BF16 },
    { 48, 5, 0, 0, 0, MSKV_DTYPE_F32 },
    { 64, 1, 1, 1, 2, MSKV_DTYPE_F32 },
};
#define FZ_NGEOM ((int)(sizeof fz_geoms / sizeof fz_geoms[0]))

/* The harnesses' allocator: a machine with 64 MiB to give per allocation.
   A wild capacity or token count asks for more than any test machine has;
   the library must turn the refusal into OUT_OF_MEMORY (or refuse first). */
#define FZ_ALLOC_LIMIT ((size_t)64 << 20)
static void *fz_alloc(void *u, size_t n) { (void)u; return n > FZ_ALLOC_LIMIT ? NULL : malloc(n); }
static void *fz_realloc(void *u, void *p, size_t n) { (void)u; return n > FZ_ALLOC_LIMIT ? NULL : realloc(p, n); }
static void fz_free(void *u, void *p) { (void)u; free(p); }
static inline mskv_allocator fz_allocator(void) {
    mskv_allocator al;
    al.user = NULL; al.alloc = fz_alloc; al.realloc = fz_realloc; al.free = fz_free;
    return al;
}

static inline mskv_arena_desc fz_desc(const fz_geom *g, int fenced) {
    mskv_arena_desc d;
    memset(&d, 0, sizeof d);
    d.num_pages = g->num_pages;
    d.page_size = g->page_size;
    d.max_requests = 24;
    d.num_layers = g->num_layers;
    d.kv_heads = g->kv_heads;
    d.head_dim = g->head_dim;
    d.dtype = g->dtype;
    d.retire_mode = fenced ? MSKV_RETIRE_FENCED : MSKV_RETIRE_IMMEDIATE;
    d.allocator = fz_allocator();
    return d;
}

#define FZ_FAIL(...)                                                     \
    do {                                                                 \
        fprintf(stderr, "FUZZ FINDING %s:%d: ", __FILE__, __LINE__);     \
        fprintf(stderr, __VA_ARGS__);                                    \
        fputc('\n', stderr);                                             \
        abort();                                                         \
    } while (0)
#define FZ_CHECK(cond, ...) do { if (!(cond)) FZ_FAIL(__VA_ARGS__); } while (0)

static inline void fz_audit(mskv_arena *a, const char *after) {
    char why[256];
    why[0] = '\0';
    if (mskv_arena_audit(a, why, sizeof why) != MSKV_SUCCESS) FZ_FAIL("audit failed after %s: %s", after, why);
}

/* ---- the byte reader: every read succeeds (zeros past the end) ---------- */

typedef struct fz_in { const uint8_t *p; size_t n; } fz_in;

static inline int fz_more(const fz_in *in) { return in->n > 0; }
static inline uint8_t fz_u8(fz_in *in) {
    uint8_t v;
    if (!in->n) return 0;
    v = *in->p++;
    in->n--;
    return v;
}
static inline uint64_t fz_raw(fz_in *in, int bytes) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < bytes; i++) v |= (uint64_t)fz_u8(in) << (8 * i);
    return v;
}
/* A value in [0, n) (n >= 1). */
static inline uint32_t fz_below(fz_in *in, uint32_t n) { return (uint32_t)(fz_raw(in, n > 256 ? 2 : 1) % n); }

/* Boundaries that break arithmetic, and small values that get calls deep. */
static inline int64_t fz_wild64(fz_in *in) {
    static const int64_t edge[] = {
        0, 1, 2, 3, -1, -2, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1,
        INT32_MAX, (int64_t)INT32_MAX + 1, INT32_MIN, (int64_t)INT32_MIN - 1,
        (int64_t)1 << 31, (int64_t)1 << 32, (int64_t)1 << 40, (int64_t)1 << 49, (int64_t)1 << 62,
        -((int64_t)1 << 62), UINT32_MAX, 65535, 65536, 4, 5, 16, 17, 4680,
    };
    uint8_t sel = fz_u8(in);
    if (sel < 96) return (int64_t)(sel % 24);                         /* small */
    if (sel < 160) return (int64_t)fz_raw(in, 2) - 256;               /* moderate, some negative */
    if (sel < 224) return edge[sel % (sizeof edge / sizeof edge[0])];
    if (sel < 240) {                                                  /* next to an edge */
        int64_t e = edge[sel % (sizeof edge / sizeof edge[0])], d = (int64_t)(fz_u8(in) % 5) - 2;
        if ((e > INT64_MAX - 2 && d > 0) || (e < INT64_MIN + 2 && d < 0)) d = -d;
        return e + d;
    }
    return (int64_t)fz_raw(in, 8);
}
static inline int32_t fz_wild32(fz_in *in) {
    int64_t v = fz_wild64(in);
    if (v > INT32_MAX || v < INT32_MIN) return (int32_t)(uint32_t)(uint64_t)v;
    return (int32_t)v;
}
static inline size_t fz_wildsize(fz_in *in) {
    uint8_t sel = fz_u8(in);
    if (sel < 200) return (size_t)fz_raw(in, 2);
    if (sel < 230) return (size_t)-1 - (size_t)(sel - 200);
    return (size_t)fz_raw(in, 8);
}

#endif
