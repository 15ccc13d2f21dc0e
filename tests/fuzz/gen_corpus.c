/* Writes the seed corpus of the import fuzzer: real exports of requests in
   every state a blob can describe, over each geometry of fuzz_common.h
   (arenas of several layer groups write version-2 blobs; there each group
   gets a state of its own: another prefix, release or retention), and
   requests that mskv_make_room parked.
       gen_corpus OUT_DIR
   Each file is one configuration byte (the geometry index) and the blob.
   Files named v3-* hold the same blob as a version-3 blob with the positions
   record versions 1 and 2 imply (another writer's, which imports accept).
   Deterministic: the same library writes the same files. */
#define MSTAR_KV_IMPLEMENTATION
#include "fuzz_common.h"

static int gc_fail(const char *what, mskv_result r) {
    fprintf(stderr, "gen_corpus: %s: %s\n", what, mskv_result_string(r));
    exit(1);
}
#define GC(call) do { mskv_result gc__r = (call); if (gc__r != MSKV_SUCCESS) gc_fail(#call, gc__r); } while (0)

static void gc_grow(mskv_arena *a, mskv_request r, int64_t n) {
    mskv_segment s;
    s.request = r; s.n_tokens = n;
    GC(mskv_admit(a, &s, 1));
    GC(mskv_commit(a, &s, 1));
}

/* Every element of every pool gets a small value that depends on where it is. */
static void gc_fill(mskv_arena *a, const fz_geom *g) {
    int32_t l, kind;
    size_t i, n = (size_t)g->num_pages * (size_t)g->page_size * (size_t)g->kv_heads * (size_t)g->head_dim;
    for (l = 0; l < g->num_layers; l++)
        for (kind = 0; kind < 2; kind++) {
            void *p = mskv_store_pool(a, l, kind);
            for (i = 0; i < n; i++) {
                float x = (float)((i * 31 + (size_t)l * 7 + (size_t)kind * 3) % 97) / 16.0f - 3.0f;
                if (g->dtype == MSKV_DTYPE_F32) ((float *)p)[i] = x;
                else if (g->dtype == MSKV_DTYPE_F16) ((uint16_t *)p)[i] = mskv_f32_to_f16(x);
                else ((uint16_t *)p)[i] = mskv_f32_to_bf16(x);
            }
        }
}

static void gc_write(const char *dir, const char *state, int gi, mskv_arena *a, mskv_request r) {
    size_t size = 0;
    unsigned char *b;
    char path[1024];
    FILE *fp;
    GC(mskv_request_export(a, r, NULL, 0, &size));
    b = (unsigned char *)malloc(size + 1);
    if (!b) gc_fail("malloc", MSKV_ERROR_OUT_OF_MEMORY);
    b[0] = (unsigned char)gi;
    GC(mskv_request_export(a, r, b + 1, size, &size));
    snprintf(path, sizeof path, "%s/%s-g%d", dir, state, gi);
    fp = fopen(path, "wb");
    if (!fp || fwrite(b, 1, size + 1, fp) != size + 1) { fprintf(stderr, "gen_corpus: cannot write %s\n", path); exit(1); }
    fclose(fp);
    free(b);
}

/* The blob of gc_write rewritten as a version-3 blob with the positions
   record that versions 1 and 2 imply ("v3-" + state): another writer's
   blob, which both imports accept. Skipped when the blob needs version 3. */
static void gc_write_v3(const char *dir, const char *state, int gi, mskv_arena *a, mskv_request r) {
    size_t size = 0, m = 0;
    unsigned char *b, *v3;
    char path[1024];
    FILE *fp;
    const fz_geom *g = &fz_geoms[gi];
    GC(mskv_request_export(a, r, NULL, 0, &size));
    b = (unsigned char *)malloc(size);
    if (!b) gc_fail("malloc", MSKV_ERROR_OUT_OF_MEMORY);
    GC(mskv_request_export(a, r, b, size, &size));
    v3 = fz_blob_as_v3(b, size, (uint32_t)(g->num_groups > 1 ? g->num_groups : 1), &m);
    free(b);
    if (!v3) return;
    snprintf(path, sizeof path, "%s/v3-%s-g%d", dir, state, gi);
    fp = fopen(path, "wb");
    if (!fp || fputc(gi, fp) == EOF || fwrite(v3, 1, m, fp) != m) { fprintf(stderr, "gen_corpus: cannot write %s\n", path); exit(1); }
    fclose(fp);
    free(v3);
}

/* The last group of a multi-group arena differs from group 0 (the calls
   without a group act on group 0): a longer prefix, a later release, its own
   retention. */
static int32_t gc_last_group(const fz_geom *g) { return g->num_groups > 1 ? g->num_groups - 1 : 0; }

/* Parked by make_room: `old` admitted before `recent`, so with `recent` in
   the batch and room asked for, `old` (or its lockstep group) is parked. */
static void gc_park(mskv_arena *a, mskv_request old, mskv_request recent) {
    mskv_arena_stats st;
    mskv_segment batch;
    mskv_request parked[4];
    int32_t n = 0;
    batch.request = recent; batch.n_tokens = 1;
    GC(mskv_arena_stats_get(a, &st));
    GC(mskv_make_room(a, (int64_t)st.free_pages + 1, UINT64_MAX, &batch, 1, parked, 4, &n));
    if (n < 1 || parked[0].id != old.id) gc_fail("make_room parked another request", MSKV_ERROR_BAD_STATE);
}

static void gc_states(const char *dir, int gi) {
    const fz_geom *g = &fz_geoms[gi];
    mskv_arena_desc d = fz_desc(g, 0);
    mskv_arena *a;
    mskv_request r, c, pair[2];
    mskv_lockstep ls;
    mskv_retention ret;
    mskv_session s;
    int64_t P = g->page_size, k;
    int32_t last = gc_last_group(g);
    GC(mskv_arena_create(&d, &a));
    gc_fill(a, g);

    GC(mskv_request_add(a, &r));
    gc_write(dir, "empty", gi, a, r);
    GC(mskv_request_remove(a, r));

    GC(mskv_request_add(a, &r));
    gc_grow(a, r, P + (P > 1 ? P / 2 : 0) + 1);   /* the last page partly filled */
    gc_write(dir, "partial", gi, a, r);
    gc_write_v3(dir, "partial", gi, a, r);
    GC(mskv_request_fork(a, r, &c));
    gc_grow(a, c, 1);
    gc_write(dir, "fork", gi, a, c);
    GC(mskv_request_remove(a, c));
    GC(mskv_request_remove(a, r));

    GC(mskv_request_add(a, &r));
    gc_grow(a, r, 4 * P + 1);
    GC(mskv_request_protect_prefix(a, r, P + 1));
    if (last) GC(mskv_request_protect_prefix_in_group(a, r, last, 2 * P));
    gc_write(dir, "prefix", gi, a, r);
    GC(mskv_request_release_oldest(a, r, P, NULL));   /* the prefix ends inside page 2: the first live page goes */
    if (last) GC(mskv_request_release_oldest_in_group(a, r, last, P + 1, NULL));
    gc_write(dir, "released-gap", gi, a, r);
    gc_write_v3(dir, "released-gap", gi, a, r);
    GC(mskv_request_offload(a, r));
    gc_write(dir, "offloaded", gi, a, r);
    gc_write_v3(dir, "offloaded", gi, a, r);
    GC(mskv_request_reload(a, r));
    gc_write(dir, "reloaded", gi, a, r);
    GC(mskv_request_remove(a, r));

    GC(mskv_keyed_create(a, 0x5EED0000u + (uint64_t)gi, 2 * P + 1, &r));
    GC(mskv_keyed_seal(a, r));
    gc_write(dir, "keyed-sealed", gi, a, r);
    gc_write_v3(dir, "keyed-sealed", gi, a, r);
    GC(mskv_keyed_remove(a, 0x5EED0000u + (uint64_t)gi));

    memset(&ret, 0, sizeof ret);
    ret.chunk_size = P; ret.sink_chunks = 1; ret.window_chunks = 2;
    GC(mskv_request_add(a, &r));
    GC(mskv_session_init(&s, a, r, &ret));
    if (last) {   /* the last group keeps a window of its own, without a sink */
        mskv_retention other = ret;
        other.sink_chunks = 0; other.window_chunks = 1;
        GC(mskv_request_set_retention_in_group(a, r, last, &other));
    }
    for (k = 0; k < 5; k++) {
        GC(mskv_session_begin_chunk(&s, P));
        GC(mskv_session_commit_chunk(&s, NULL));
    }
    gc_write(dir, "session-window", gi, a, r);
    GC(mskv_request_remove(a, r));

    ret.reset_at_boundary = 1; ret.window_chunks = 1; ret.exact = 1;
    GC(mskv_request_add(a, &r));
    GC(mskv_session_init(&s, a, r, &ret));
    for (k = 0; k < 3; k++) {
        GC(mskv_session_begin_chunk(&s, P));
        GC(mskv_session_commit_chunk(&s, NULL));
    }
    GC(mskv_session_begin_chunk(&s, 1));
    GC(mskv_session_commit_chunk(&s, NULL));       /* a chunk in progress past the reset */
    gc_write(dir, "session-reset", gi, a, r);
    GC(mskv_request_remove(a, r));

    /* version 3: a release point inside a kept page, a position shift */
    GC(mskv_request_add(a, &r));
    gc_grow(a, r, 3 * P + 2);
    GC(mskv_request_protect_prefix(a, r, 1));
    GC(mskv_request_release_oldest(a, r, P + (P > 1 ? 1 : 0), NULL));
    gc_write(dir, "release-point", gi, a, r);
    GC(mskv_request_shift_positions(a, r, -5));
    gc_write(dir, "shifted", gi, a, r);
    GC(mskv_request_remove(a, r));

    GC(mskv_request_add(a, &r));
    gc_grow(a, r, (int64_t)(g->num_pages / 4 / (g->num_groups > 1 ? g->num_groups : 1)) * P);
    gc_write(dir, "large", gi, a, r);
    GC(mskv_request_remove(a, r));

    /* parked by make_room: a request with a prefix and a release, then a lockstep pair */
    GC(mskv_request_add(a, &r));
    gc_grow(a, r, 2 * P + 2);
    GC(mskv_request_protect_prefix(a, r, 1));
    if (last) GC(mskv_request_release_oldest_in_group(a, r, last, P, NULL));
    GC(mskv_request_add(a, &c));
    gc_grow(a, c, 1);
    gc_park(a, r, c);
    gc_write(dir, "make-room-parked", gi, a, r);
    GC(mskv_request_remove(a, r));
    GC(mskv_request_add(a, &pair[0]));
    GC(mskv_request_add(a, &pair[1]));
    GC(mskv_lockstep_create(a, pair, 2, &ls));
    {
        mskv_segment segs[2];
        int32_t n = 0;
        GC(mskv_lockstep_segments(a, ls, P + 1, segs, 2, &n));
        GC(mskv_admit(a, segs, n));
        GC(mskv_commit(a, segs, n));
    }
    GC(mskv_request_remove(a, c));
    GC(mskv_request_add(a, &c));
    gc_grow(a, c, 1);
    gc_park(a, pair[0], c);
    gc_write(dir, "make-room-lockstep", gi, a, pair[1]);
    GC(mskv_lockstep_remove(a, ls));
    GC(mskv_request_remove(a, c));
    mskv_arena_destroy(a);
}

int main(int argc, char **argv) {
    int gi;
    if (argc != 2) { fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]); return 2; }
    for (gi = 0; gi < FZ_NGEOM; gi++) gc_states(argv[1], gi);
    return 0;
}
