/* libFuzzer harness: mskv_request_import on arbitrary bytes.
   Input: one byte of configuration, then the blob. The byte picks the arena
   geometry (low bits), the debug checks (0x20), FENCED retirement (0x40), and (0x80) re-signs the
   blob, its size field and checksum made to match, so mutations reach the
   state checks behind the checksum instead of stopping at it.
   A failed import must change nothing. A successful one must pass the audit,
   export to the same bytes (a version-3 blob whose positions record says
   only what versions 1 and 2 imply: to the same blob in that version), and be usable: reload, plan + validate + K/V
   write + attention in every layer group (a keyed entry through a cross
   plan), release in every group, offload, reload again (same bytes once
   more), remove. */
#define MSTAR_KV_IMPLEMENTATION
#include "fuzz_common.h"

/* One layer group's plan of the open step: query, build, validate, K/V write
   (a self plan) and attention. */
static void fz_plan_group(mskv_arena *a, const mskv_segment *s, const mskv_request *cross, const fz_geom *g, int32_t group) {
    mskv_plan_desc pd;
    mskv_plan_size ps;
    mskv_plan plan;
    mskv_result r;
    char why[256];
    memset(&pd, 0, sizeof pd);
    memset(&plan, 0, sizeof plan);
    pd.group = group;
    if (cross) { pd.kind = MSKV_PLAN_CROSS; pd.cross = *cross; }
    else pd.pos_mode = MSKV_POS_1D;
    FZ_CHECK(mskv_plan_query(a, s, 1, &pd, &ps) == MSKV_SUCCESS, "plan query");
    FZ_CHECK(mskv_plan_alloc(a, ps.batch, ps.total_q, ps.num_page_ids, &plan) == MSKV_SUCCESS, "plan alloc");
    r = mskv_plan_build(a, s, 1, &pd, &plan);
    FZ_CHECK(r == MSKV_SUCCESS, "plan build: %s", mskv_result_string(r));
    why[0] = '\0';
    FZ_CHECK(mskv_plan_validate(&plan, g->num_pages, why, sizeof why) == MSKV_SUCCESS, "validate: %s", why);
    if (g->num_layers > 0) {
        /* exact sizes: GQA with two q heads per kv head */
        size_t kn = (size_t)plan.total_q * (size_t)g->kv_heads * (size_t)g->head_dim, qn = kn * 2;
        float *k = (float *)calloc(kn, sizeof(float)), *v = (float *)calloc(kn, sizeof(float));
        float *q = (float *)calloc(qn, sizeof(float)), *o = (float *)calloc(qn, sizeof(float));
        float *lse = (float *)calloc((size_t)plan.total_q * (size_t)g->kv_heads * 2, sizeof(float));
        mskv_attn at;
        size_t i;
        for (i = 0; i < kn; i++) { k[i] = (float)(i % 7) * 0.25f; v[i] = (float)(i % 5); }
        for (i = 0; i < qn; i++) q[i] = 0.5f;
        memset(&at, 0, sizeof at);
        at.q_heads = g->kv_heads * 2;
        at.q_dtype = MSKV_DTYPE_F32;
        if (!cross) {
            r = mskv_cpu_write_kv(a, g->num_layers - 1, &plan, k, v, MSKV_DTYPE_F32, NULL);
            FZ_CHECK(r == MSKV_SUCCESS, "write_kv: %s", mskv_result_string(r));
        }
        r = mskv_cpu_attention(NULL, a, 0, &plan, &at, q, o, lse);
        FZ_CHECK(r == MSKV_SUCCESS, "attention: %s", mskv_result_string(r));
        free(k); free(v); free(q); free(o); free(lse);
    }
    FZ_CHECK(mskv_plan_check(a, &plan) == MSKV_SUCCESS, "a plan of the open step is stale");
    mskv_plan_free(a, &plan);
}

/* Admit two tokens, plan and attend in every layer group, commit. */
static void fz_plan_and_attend(mskv_arena *a, mskv_request self, const mskv_request *cross, const fz_geom *g) {
    mskv_segment s;
    mskv_result r;
    int32_t group;
    s.request = self;
    s.n_tokens = 2;
    r = mskv_admit(a, &s, 1);
    if (r != MSKV_SUCCESS) {
        FZ_CHECK(r == MSKV_ERROR_OUT_OF_PAGES, "admit 2 tokens on a usable request: %s", mskv_result_string(r));
        return;
    }
    for (group = 0; group < (g->num_groups > 1 ? g->num_groups : 1); group++) fz_plan_group(a, &s, cross, g, group);
    FZ_CHECK(mskv_commit(a, &s, 1) == MSKV_SUCCESS, "commit");
    fz_audit(a, "commit");
}

static void fz_reexport_same(mskv_arena *a, mskv_request h, const uint8_t *blob, size_t size, const char *when) {
    size_t need = 0, cn = 0;
    uint8_t *out, *canon = fz_blob_canonical(blob, size, &cn);   /* what export writes for it */
    mskv_result r;
    if (canon) { blob = canon; size = cn; }
    r = mskv_request_export(a, h, NULL, 0, &need);
    FZ_CHECK(r == MSKV_SUCCESS, "export size %s: %s", when, mskv_result_string(r));
    FZ_CHECK(need == size, "export %s: %zu bytes, the blob had %zu", when, need, size);
    out = (uint8_t *)malloc(need);
    FZ_CHECK(out && mskv_request_export(a, h, out, need, &need) == MSKV_SUCCESS, "export %s", when);
    if (memcmp(out, blob, size) != 0) {
        size_t i = 0;
        while (out[i] == blob[i]) i++;
        FZ_FAIL("re-export %s differs at byte %zu (0x%02x, the blob has 0x%02x)", when, i, out[i], blob[i]);
    }
    free(out);
    free(canon);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const fz_geom *g;
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request h, other;
    mskv_request_info info;
    uint8_t *blob;
    uint64_t before;
    mskv_result r;
    int fenced;
    if (size < 1) return 0;
    g = &fz_geoms[(data[0] & 0x1F) % FZ_NGEOM];
    fenced = (data[0] & 0x40) != 0;
    d = fz_desc(g, fenced);
    if (data[0] & 0x20) d.debug = MSKV_DEBUG_POISON | MSKV_DEBUG_CHECKSUMS;   /* checksummed host copies, poisoned free pages */
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) FZ_FAIL("arena_create");
    size--;
    blob = (uint8_t *)malloc(size ? size : 1);   /* exactly the blob: an over-read is an ASan report */
    memcpy(blob, data + 1, size);
    if ((data[0] & 0x80) && size >= 136) {
        uint64_t c;
        int i;
        for (i = 0; i < 8; i++) blob[16 + i] = (uint8_t)((uint64_t)size >> (8 * i));
        c = mskv__blob_checksum(blob, size - 8);
        for (i = 0; i < 8; i++) blob[size - 8 + i] = (uint8_t)(c >> (8 * i));
    }
    /* a live neighbour, so a bad import could hurt someone else's state */
    FZ_CHECK(mskv_request_add(a, &other) == MSKV_SUCCESS, "add");
    {
        mskv_segment s;
        s.request = other; s.n_tokens = 5;
        FZ_CHECK(mskv_admit(a, &s, 1) == MSKV_SUCCESS && mskv_commit(a, &s, 1) == MSKV_SUCCESS, "grow");
    }
    before = mskv_arena_digest(a);
    r = mskv_request_import(a, blob, size, &h);
    fz_audit(a, "import");
    if (r != MSKV_SUCCESS) {
        FZ_CHECK(mskv_arena_digest(a) == before, "a failed import (%s) changed the arena", mskv_result_string(r));
        goto done;
    }
    FZ_CHECK(mskv_request_info_get(a, h, &info) == MSKV_SUCCESS, "info");
    FZ_CHECK(info.location == MSKV_OFFLOADED, "an import is offloaded");
    fz_reexport_same(a, h, blob, size, "after import");

    r = mskv_request_reload(a, h);
    fz_audit(a, "reload");
    if (r == MSKV_ERROR_OUT_OF_PAGES) goto remove;  /* a blob larger than the arena is legal */
    FZ_CHECK(r == MSKV_SUCCESS, "reload: %s", mskv_result_string(r));
    fz_reexport_same(a, h, blob, size, "after reload");
    FZ_CHECK(mskv_request_info_get(a, h, &info) == MSKV_SUCCESS, "info");
    if (info.keyed) fz_plan_and_attend(a, other, &h, g);
    else fz_plan_and_attend(a, h, NULL, g);
    if (!info.keyed) {
        int64_t got = -1;
        int32_t group;
        for (group = 0; group < (g->num_groups > 1 ? g->num_groups : 1); group++) {   /* each group's own window */
            FZ_CHECK(mskv_request_info_in_group(a, h, group, &info) == MSKV_SUCCESS, "info");
            if (info.release_point > info.live_start) info.live_start = info.release_point;   /* where the visible tokens start */
            r = mskv_request_release_oldest_in_group(a, h, group, (info.committed - info.live_start) / 2 > 0 ? (info.committed - info.live_start) / 2 : 0, &got);
            FZ_CHECK(r == MSKV_SUCCESS, "release half the live tokens of group %d: %s", (int)group, mskv_result_string(r));
            fz_audit(a, "release");
        }
        r = mskv_request_offload(a, h);
        FZ_CHECK(r == MSKV_SUCCESS, "offload: %s", mskv_result_string(r));
        fz_audit(a, "offload");
        if (fenced) {
            uint64_t step = 0;
            FZ_CHECK(mskv_publish(a, NULL, 0, &step) == MSKV_SUCCESS, "publish");
            FZ_CHECK(mskv_arena_retire(a, step) == MSKV_SUCCESS, "retire");
        }
        r = mskv_request_reload(a, h);
        FZ_CHECK(r == MSKV_SUCCESS, "reload of what was just offloaded: %s", mskv_result_string(r));
        fz_audit(a, "second reload");
    }
remove:
    FZ_CHECK(mskv_request_remove(a, h) == MSKV_SUCCESS, "remove");
    fz_audit(a, "remove");
done:
    FZ_CHECK(mskv_request_remove(a, other) == MSKV_SUCCESS, "remove the neighbour");
    {
        mskv_arena_stats st;
        uint64_t step = 0;
        FZ_CHECK(mskv_publish(a, NULL, 0, &step) == MSKV_SUCCESS && mskv_arena_retire(a, step) == MSKV_SUCCESS, "retire");
        FZ_CHECK(mskv_arena_stats_get(a, &st) == MSKV_SUCCESS, "stats");
        FZ_CHECK(st.free_pages == st.num_pages - 1 && st.requests == 0 && st.offloaded_pages == 0,
                 "pages not conserved: %d free of %d, %d requests", st.free_pages, st.num_pages, st.requests);
    }
    if (d.debug) {
        char why[256];
        why[0] = '\0';
        FZ_CHECK(mskv_arena_audit_bytes(a, why, sizeof why) == MSKV_SUCCESS, "audit_bytes: %s", why);
    }
    mskv_arena_destroy(a);
    free(blob);
    return 0;
}
