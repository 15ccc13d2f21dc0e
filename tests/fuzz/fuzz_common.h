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
   bookkeeping-only arena, and arenas of 2 and 3 layer groups (blob version
   2): blobs and plans differ in every one of them. New geometries go at the
   end, so a committed seed keeps naming the geometry it was made for. */
typedef struct fz_geom {
    int32_t num_pages, page_size, num_layers, kv_heads, head_dim;
    mskv_dtype dtype;
    int32_t num_groups;   /* 0 = 1 */
} fz_geom;

static const fz_geom fz_geoms[] = {
    { 32, 4, 1, 1, 4, MSKV_DTYPE_F32, 0 },
    { 40, 3, 2, 2, 8, MSKV_DTYPE_F16, 0 },
    { 24, 16, 1, 2, 16, MSKV_DTYPE_BF16, 0 },
    { 48, 5, 0, 0, 0, MSKV_DTYPE_F32, 0 },
    { 64, 1, 1, 1, 2, MSKV_DTYPE_F32, 0 },
    { 48, 4, 1, 1, 4, MSKV_DTYPE_F32, 2 },
    { 60, 3, 2, 2, 8, MSKV_DTYPE_BF16, 3 },
    { 40, 5, 0, 0, 0, MSKV_DTYPE_F32, 2 },
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
    d.num_groups = g->num_groups;
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

/* ---- version 3 saying what versions 1 and 2 imply ----------------------- */

/* A version-3 header may carry a positions record that versions 1 and 2
   imply (pos_shift 0; each group's release point live_start when pages were
   released, else 0): another writer may send it, and both imports accept it;
   this library exports the state with the older version. */
static inline uint32_t fz_get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static inline uint64_t fz_get64(const uint8_t *p) { uint64_t v = 0; int i; for (i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static inline void fz_put64(uint8_t *p, uint64_t v) { int i; for (i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void fz_put32(uint8_t *p, uint32_t v) { int i; for (i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
/* The release point versions 1 and 2 imply for group g of a blob header. */
static inline uint64_t fz_implied_rp(const uint8_t *b, uint32_t g) {
    const uint8_t *p = b + 136 + 64 * (size_t)(g ? g - 1 : 0);
    uint64_t live = g == 0 ? fz_get64(b + 72) : fz_get64(p + 24);
    uint32_t pp = g == 0 ? fz_get32(b + 52) : fz_get32(p + 4);
    return live > (uint64_t)pp * fz_get32(b + 24) ? live : 0;
}
/* A version 1 or 2 blob of `groups` groups rewritten as version 3 with the
   implied positions, re-signed (malloc'd); NULL for anything else. */
static inline uint8_t *fz_blob_as_v3(const uint8_t *blob, size_t n, uint32_t groups, size_t *out_n) {
    size_t old_hdr, base = 136 + 64 * (size_t)(groups - 1), hdr = base + 8 + 8 * (size_t)groups, m;
    uint32_t g, v;
    uint8_t *b;
    if (n < 136 || groups < 1 || groups > MSKV_MAX_GROUPS) return NULL;
    v = fz_get32(blob + 8);
    old_hdr = fz_get32(blob + 12);
    if (!(v == 1 && groups == 1 && old_hdr == 128) && !(v == 2 && groups > 1 && old_hdr == base)) return NULL;
    if (n < old_hdr + 8) return NULL;
    m = n - old_hdr + hdr;
    b = (uint8_t *)calloc(1, m);
    if (!b) return NULL;
    memcpy(b, blob, old_hdr);
    fz_put32(b + 8, 3);
    fz_put32(b + 12, (uint32_t)hdr);
    fz_put64(b + 16, (uint64_t)m);
    fz_put32(b + 128, groups);
    fz_put32(b + 132, 0);
    for (g = 0; g < groups; g++) fz_put64(b + base + 8 + 8 * (size_t)g, fz_implied_rp(blob, g));
    memcpy(b + hdr, blob + old_hdr, n - old_hdr);
    fz_put64(b + m - 8, mskv__blob_checksum(b, m - 8));
    *out_n = m;
    return b;
}
/* What this library exports for a blob it imported (malloc'd; NULL when
   that is the blob itself): versions 1 to 3 (the old digest) come back as 4
   to 6 (the same layouts signed with XXH64), and a version 3 or 6 whose
   positions record is the implied one as 4 or 5 (the shorter layouts). */
static inline uint8_t *fz_blob_canonical(const uint8_t *blob, size_t n, size_t *out_n) {
    uint32_t G, g, v;
    size_t base, hdr, nh, m;
    uint8_t *b;
    if (n < 136) return NULL;
    v = fz_get32(blob + 8);
    if (v == 1 || v == 2) {                      /* the same layout, the new version and hash */
        b = (uint8_t *)malloc(n);
        if (!b) return NULL;
        memcpy(b, blob, n);
        fz_put32(b + 8, v + 3);
        fz_put64(b + n - 8, mskv__blob_checksum(b, n - 8));
        *out_n = n;
        return b;
    }
    if (n < 160 || (v != 3 && v != 6)) return NULL;
    G = fz_get32(blob + 128);
    if (G < 1 || G > MSKV_MAX_GROUPS) return NULL;
    base = 136 + 64 * (size_t)(G - 1);
    hdr = base + 8 + 8 * (size_t)G;
    if (fz_get32(blob + 12) != hdr || n < hdr + 8) return NULL;
    for (g = 0; g < G && fz_get64(blob + base) == 0; g++)
        if (fz_get64(blob + base + 8 + 8 * (size_t)g) != fz_implied_rp(blob, g)) break;
    if (fz_get64(blob + base) != 0 || g < G) {   /* needs the positions layout: version 6 */
        if (v == 6) return NULL;
        b = (uint8_t *)malloc(n);
        if (!b) return NULL;
        memcpy(b, blob, n);
        fz_put32(b + 8, 6);
        fz_put64(b + n - 8, mskv__blob_checksum(b, n - 8));
        *out_n = n;
        return b;
    }
    nh = G == 1 ? 128 : base;
    m = n - hdr + nh;
    b = (uint8_t *)malloc(m);
    if (!b) return NULL;
    memcpy(b, blob, nh);
    fz_put32(b + 8, G == 1 ? 4u : 5u);
    fz_put32(b + 12, (uint32_t)nh);
    fz_put64(b + 16, (uint64_t)m);
    memcpy(b + nh, blob + hdr, n - hdr);
    fz_put64(b + m - 8, mskv__blob_checksum(b, m - 8));
    *out_n = m;
    return b;
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
