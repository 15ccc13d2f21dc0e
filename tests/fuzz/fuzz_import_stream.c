/* libFuzzer harness: the streamed import (import_begin, bytes through the
   ranges, import_commit) against the whole-blob import (mskv_request_import)
   on the same bytes. Both must accept exactly the same blobs and give the
   same request.
   Input: one byte of configuration (as fuzz_import: geometry in the low
   bits, debug checks 0x20, re-sign 0x80; 0x40 = the header handed to
   import_begin is followed by garbage instead of the blob's next bytes),
   then the blob, then (when the blob's size field is below the input's
   length) a piece schedule: the bytes past the size field's end. So an
   import seed is a seed here too, delivered in order.
   The schedule: byte 0 = flags (0x01 truncate the blob by byte 1 + 1 bytes,
   0x02 shuffle the pieces, 0x04 drop some, 0x08 some arrive as garbage first,
   0x10 some arrive twice, 0x20 some get garbage after their bytes, 0x40
   extra header bytes for import_begin), bytes 1..8 seed the choices (piece
   sizes among them).
   The receiver sees what arrived: its pages hold the pieces as delivered,
   and whatever they held before where nothing arrived. The whole import is
   given exactly that blob (the sender's header and checksum, the payload
   as it landed), so the two verdicts must agree: begin refuses only what
   import refuses (OUT_OF_PAGES aside: a streamed import needs its pages
   now, a whole one when reloaded), commit accepts what import accepts, and
   both requests export the same bytes. While the import is open,
   mskv_arena_reset refuses and changes nothing; a failed import leaves the
   arena as it was; the neighbour's bytes never change. */
#define MSTAR_KV_IMPLEMENTATION
#include "fuzz_common.h"

typedef struct fs_rng { uint64_t s; } fs_rng;
static uint64_t fs_next(fs_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

typedef struct fs_piece { size_t off, len; int garbage_first, garbage_after, twice; } fs_piece;

static uint64_t fs_get64(const uint8_t *p) { uint64_t v = 0; int i; for (i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint32_t fs_get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* The exported bytes of a request (malloc'd); *n gets the size. */
static uint8_t *fs_export(mskv_arena *a, mskv_request h, size_t *n) {
    uint8_t *b;
    mskv_result r = mskv_request_export(a, h, NULL, 0, n);
    FZ_CHECK(r == MSKV_SUCCESS, "export size: %s", mskv_result_string(r));
    b = (uint8_t *)malloc(*n ? *n : 1);
    FZ_CHECK(b && mskv_request_export(a, h, b, *n, n) == MSKV_SUCCESS, "export");
    return b;
}

/* len bytes at blob offset off, delivered into the ranges that hold them. */
static void fs_land(const mskv_blob_layout *L, const mskv_blob_range *rg, size_t off, const uint8_t *src, size_t len) {
    while (len > 0) {
        int64_t k = (int64_t)((off - L->header_bytes) / L->range_bytes);
        size_t in, m;
        FZ_CHECK(k >= 0 && k < L->range_count, "offset %zu is past the ranges", off);
        FZ_CHECK(rg[k].offset <= off && off < rg[k].offset + rg[k].bytes, "range %lld does not hold blob offset %zu", (long long)k, off);
        in = off - (size_t)rg[k].offset;
        m = rg[k].bytes - in < len ? rg[k].bytes - in : len;
        memcpy((uint8_t *)rg[k].data + in, src, m);
        off += m;
        src += m;
        len -= m;
    }
}

static void fs_garbage(fs_rng *r, uint8_t *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = (uint8_t)(fs_next(r) >> 56);
}

/* An aborted import gives every page back (its slot's generation moves on,
   so the digest does not stay). */
static void fs_same_stats(mskv_arena *a, const mskv_arena_stats *s0, const char *what) {
    mskv_arena_stats s1;
    FZ_CHECK(mskv_arena_stats_get(a, &s1) == MSKV_SUCCESS, "stats");
    FZ_CHECK(s0->free_pages == s1.free_pages && s0->live_pages == s1.live_pages && s0->requests == s1.requests &&
             s0->pending_pages == s1.pending_pages, "%s changed the arena: %d free pages, %d before", what, s1.free_pages, s0->free_pages);
}

static void fs_arena(const mskv_arena_desc *d, mskv_arena **a, mskv_request *other) {
    mskv_segment s;
    if (mskv_arena_create(d, a) != MSKV_SUCCESS) FZ_FAIL("arena_create");
    FZ_CHECK(mskv_request_add(*a, other) == MSKV_SUCCESS, "add");
    s.request = *other;
    s.n_tokens = 5;
    FZ_CHECK(mskv_admit(*a, &s, 1) == MSKV_SUCCESS && mskv_commit(*a, &s, 1) == MSKV_SUCCESS, "grow");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const fz_geom *g;
    mskv_arena_desc d;
    mskv_arena *A = NULL, *W = NULL;
    mskv_request oa, ow, hs, hw;
    mskv_blob_layout L;
    mskv_blob_range *rg = NULL;
    fs_piece *pc = NULL;
    fs_rng rng;
    const uint8_t *sched = NULL;
    uint8_t *S, *E = NULL, *hbuf, *nb0, *nb1, *tmp = NULL;
    size_t n, sched_n = 0, hsize, hdr_field, nbn0, nbn1, npc = 0, i;
    uint64_t before, opened;
    uint8_t flags = 0;
    mskv_arena_stats st0;
    mskv_result rb, rc, re;
    if (size < 1) return 0;
    g = &fz_geoms[(data[0] & 0x1F) % FZ_NGEOM];
    d = fz_desc(g, 0);
    if (data[0] & 0x20) d.debug = MSKV_DEBUG_POISON | MSKV_DEBUG_CHECKSUMS;
    n = size - 1;
    if (n >= 24) {   /* the blob ends where its size field says; the rest is the schedule */
        uint64_t t = fs_get64(data + 1 + 16);
        if (t >= 136 && t < n) { sched = data + 1 + t; sched_n = n - (size_t)t; n = (size_t)t; }
    }
    if (sched_n > 0) flags = sched[0];
    rng.s = 0x9E3779B97F4A7C15ull;
    for (i = 1; i < 9; i++) rng.s ^= (uint64_t)(i < sched_n ? sched[i] : 0) << (8 * (i - 1));
    if (!rng.s) rng.s = 1;
    if (flags & 0x01) n -= (sched_n > 1 ? sched[1] + 1u : 1u) < n ? (sched_n > 1 ? sched[1] + 1u : 1u) : n;
    S = (uint8_t *)malloc(n ? n : 1);   /* exactly the blob: an over-read is an ASan report */
    memcpy(S, data + 1, n);
    if ((data[0] & 0x80) && n >= 136) {
        uint64_t c;
        for (i = 0; i < 8; i++) S[16 + i] = (uint8_t)((uint64_t)n >> (8 * i));
        c = mskv__blob_checksum(S, n - 8);
        for (i = 0; i < 8; i++) S[n - 8 + i] = (uint8_t)(c >> (8 * i));
    }
    fs_arena(&d, &A, &oa);
    fs_arena(&d, &W, &ow);
    nb0 = fs_export(A, oa, &nbn0);

    /* the header as a transport hands it over: at least its own length (when there is one) */
    hdr_field = n >= 16 ? fs_get32(S + 12) : 0;
    if (hdr_field < MSKV__BLOB_HEADER) hdr_field = MSKV__BLOB_HEADER;
    if (hdr_field > MSKV_BLOB_HEADER_MAX) hdr_field = MSKV_BLOB_HEADER_MAX;
    hsize = hdr_field < n ? hdr_field : n;
    if (flags & 0x40) hsize += (size_t)(fs_next(&rng) % 64);
    hbuf = (uint8_t *)malloc(hsize ? hsize : 1);
    for (i = 0; i < hsize; i++) hbuf[i] = i < n ? S[i] : 0;
    if (data[0] & 0x40) {
        size_t from = hdr_field < hsize ? hdr_field : hsize;
        fs_garbage(&rng, hbuf + from, hsize - from);
    }
    before = mskv_arena_digest(A);
    FZ_CHECK(mskv_arena_stats_get(A, &st0) == MSKV_SUCCESS, "stats");
    rb = mskv_request_import_begin(A, hbuf, hsize, &hs, &L);
    fz_audit(A, "import_begin");
    free(hbuf);
    if (rb != MSKV_SUCCESS) {
        FZ_CHECK(mskv_arena_digest(A) == before, "a failed import_begin (%s) changed the arena", mskv_result_string(rb));
        re = mskv_request_import(W, S, n, &hw);
        if (rb == MSKV_ERROR_OUT_OF_PAGES) {
            /* the whole import takes its pages at reload */
            if (re == MSKV_SUCCESS) {
                mskv_result rl = mskv_request_reload(W, hw);
                FZ_CHECK(rl == MSKV_ERROR_OUT_OF_PAGES, "import_begin had too few pages, reload of the whole import: %s", mskv_result_string(rl));
            }
        } else {
            FZ_CHECK(re != MSKV_SUCCESS, "import_begin refused (%s) a blob mskv_request_import accepts", mskv_result_string(rb));
        }
        goto done;
    }
    /* the layout is the blob's own */
    FZ_CHECK(L.header_bytes == fs_get32(S + 12), "layout: header_bytes %zu, the blob's header has %u", L.header_bytes, (unsigned)fs_get32(S + 12));
    FZ_CHECK(L.blob_bytes == fs_get64(S + 16), "layout: blob_bytes %zu, the size field says %llu", L.blob_bytes, (unsigned long long)fs_get64(S + 16));
    FZ_CHECK(L.range_count >= 0 && L.blob_bytes == L.header_bytes + (size_t)L.range_count * L.range_bytes + 8,
             "layout: %zu header + %lld ranges of %zu + 8 != %zu", L.header_bytes, (long long)L.range_count, L.range_bytes, L.blob_bytes);
    rg = (mskv_blob_range *)malloc((size_t)(L.range_count + 1) * sizeof *rg);
    FZ_CHECK(rg && mskv_request_blob_ranges(A, hs, 0, L.range_count, rg) == MSKV_SUCCESS, "blob_ranges");
    for (i = 0; i < (size_t)L.range_count; i++)
        FZ_CHECK(rg[i].offset == L.header_bytes + i * L.range_bytes && rg[i].bytes == L.range_bytes, "range %zu is not where the layout puts it", i);
    opened = mskv_arena_digest(A);
    FZ_CHECK(mskv_arena_reset(A) == MSKV_ERROR_BAD_STATE, "arena_reset with an import open");
    FZ_CHECK(mskv_arena_digest(A) == opened, "a refused arena_reset changed the arena");
    if (n != L.blob_bytes) {   /* the stream ended early (or runs on): the transport gives up */
        FZ_CHECK(mskv_request_import_abort(A, hs) == MSKV_SUCCESS, "import_abort");
        fs_same_stats(A, &st0, "an aborted import");
        re = mskv_request_import(W, S, n, &hw);
        FZ_CHECK(re != MSKV_SUCCESS, "a blob of %zu bytes whose header says %zu imports whole", n, L.blob_bytes);
        goto done;
    }
    /* E: what the receiver will hold, the sender's header and checksum around what the pages hold now */
    E = (uint8_t *)malloc(n);
    memcpy(E, S, L.header_bytes);
    memcpy(E + n - 8, S + n - 8, 8);
    for (i = 0; i < (size_t)L.range_count; i++) memcpy(E + rg[i].offset, rg[i].data, rg[i].bytes);
    /* the pieces of the payload, then their order */
    if (L.range_count > 0) {
        size_t payload = n - 8 - L.header_bytes, off = L.header_bytes, least = payload / 2048 + 1;
        pc = (fs_piece *)calloc(payload / least + 2, sizeof *pc);
        FZ_CHECK(pc != NULL, "pieces");
        while (off < n - 8) {
            size_t len = (size_t)(fs_next(&rng) % (3 * L.range_bytes)) + 1;
            if (sched_n == 0) len = L.range_bytes;   /* a seed: one piece per range */
            if (len < least) len = least;
            if (len > n - 8 - off) len = n - 8 - off;
            pc[npc].off = off;
            pc[npc].len = len;
            pc[npc].garbage_first = (flags & 0x08) && fs_next(&rng) % 4 == 0;
            pc[npc].garbage_after = (flags & 0x20) && fs_next(&rng) % 8 == 0;
            pc[npc].twice = (flags & 0x10) && fs_next(&rng) % 4 == 0;
            if ((flags & 0x04) && fs_next(&rng) % 4 == 0) pc[npc].len = 0;   /* never arrives */
            npc++;
            off += len;
        }
        if (flags & 0x02)
            for (i = npc; i > 1; i--) {
                size_t j = (size_t)(fs_next(&rng) % i);
                fs_piece t = pc[i - 1];
                pc[i - 1] = pc[j];
                pc[j] = t;
            }
        tmp = (uint8_t *)malloc(3 * L.range_bytes + least);
        FZ_CHECK(tmp != NULL, "scratch");
        for (i = 0; i < npc; i++) {
            const fs_piece *p = &pc[i];
            if (!p->len) continue;
            if (p->garbage_first) {
                fs_garbage(&rng, tmp, p->len);
                fs_land(&L, rg, p->off, tmp, p->len);
                memcpy(E + p->off, tmp, p->len);
            }
            fs_land(&L, rg, p->off, S + p->off, p->len);
            memcpy(E + p->off, S + p->off, p->len);
            if (p->garbage_after) {
                fs_garbage(&rng, tmp, p->len);
                fs_land(&L, rg, p->off, tmp, p->len);
                memcpy(E + p->off, tmp, p->len);
            }
        }
        for (i = 0; i < npc; i++)   /* the duplicates, late */
            if (pc[i].len && pc[i].twice) {
                fs_land(&L, rg, pc[i].off, S + pc[i].off, pc[i].len);
                memcpy(E + pc[i].off, S + pc[i].off, pc[i].len);
            }
        for (i = 0; i < (size_t)L.range_count; i++)
            FZ_CHECK(memcmp(E + rg[i].offset, rg[i].data, rg[i].bytes) == 0, "range %zu does not hold what landed at its offset", i);
    }
    rc = mskv_request_import_commit(A, hs, fs_get64(S + n - 8));
    fz_audit(A, "import_commit");
    re = mskv_request_import(W, E, n, &hw);
    fz_audit(W, "import");
    FZ_CHECK((rc == MSKV_SUCCESS) == (re == MSKV_SUCCESS), "streamed import: %s, whole import of the same bytes: %s", mskv_result_string(rc),
             mskv_result_string(re));
    if (rc != MSKV_SUCCESS) {
        FZ_CHECK(rc == MSKV_ERROR_BLOB_CORRUPT && re == MSKV_ERROR_BLOB_CORRUPT, "a checksum mismatch is BLOB_CORRUPT on both paths");
        FZ_CHECK(mskv_request_import_abort(A, hs) == MSKV_SUCCESS, "import_abort");
        fs_same_stats(A, &st0, "an aborted import");
    } else {
        mskv_request_info ia, iw;
        uint8_t *xa, *xw;
        size_t na = 0, nw = 0;
        mskv_result rl = mskv_request_reload(W, hw);
        FZ_CHECK(rl == MSKV_SUCCESS, "the streamed import had its pages, reloading the whole one: %s", mskv_result_string(rl));
        FZ_CHECK(mskv_request_info_get(A, hs, &ia) == MSKV_SUCCESS && mskv_request_info_get(W, hw, &iw) == MSKV_SUCCESS, "info");
        FZ_CHECK(ia.committed == iw.committed && ia.num_pages == iw.num_pages && ia.kv_len == iw.kv_len && ia.live_start == iw.live_start &&
                 ia.prefix_tokens == iw.prefix_tokens && ia.keyed == iw.keyed && ia.location == iw.location,
                 "the two imports differ: committed %lld/%lld, live_start %lld/%lld", (long long)ia.committed, (long long)iw.committed,
                 (long long)ia.live_start, (long long)iw.live_start);
        xa = fs_export(A, hs, &na);
        xw = fs_export(W, hw, &nw);
        if (na != nw || memcmp(xa, xw, na) != 0) FZ_FAIL("the two imports export different blobs (%zu and %zu bytes)", na, nw);
        free(xa);
        free(xw);
        FZ_CHECK(mskv_request_remove(A, hs) == MSKV_SUCCESS && mskv_request_remove(W, hw) == MSKV_SUCCESS, "remove");
    }
done:
    nb1 = fs_export(A, oa, &nbn1);
    FZ_CHECK(nbn0 == nbn1 && memcmp(nb0, nb1, nbn0) == 0, "the neighbour's bytes changed");
    fz_audit(A, "the end");
    fz_audit(W, "the end");
    if (d.debug) {
        char why[256];
        why[0] = '\0';
        FZ_CHECK(mskv_arena_audit_bytes(A, why, sizeof why) == MSKV_SUCCESS, "audit_bytes: %s", why);
    }
    free(nb0);
    free(nb1);
    free(tmp);
    free(pc);
    free(rg);
    free(E);
    free(S);
    mskv_arena_destroy(A);
    mskv_arena_destroy(W);
    return 0;
}
