/* libFuzzer harness: operation sequences. The input is read as a program:
   one byte of configuration (geometry, among them arenas of several layer
   groups; a starting lockstep pair; FENCED retirement; the debug checks),
   then calls of every public
   function of mstar_kv.h with wild arguments: the request calls and their
   *_in_group twins, lockstep groups formed from live requests, admit_query,
   make_room, reset and flush, plans of any group, the CPU backend with any
   instruction-set path. Request and lockstep handles are mostly picked from
   live ones (so calls get deep), sometimes removed or made up. After every
   call on the arena the audit passes (and mskv_arena_audit_bytes, when the
   debug checks run), and a call that failed left mskv_arena_digest
   unchanged. Events and log messages are checked as they arrive. */
#define _POSIX_C_SOURCE 200809L   /* setenv: the MSKV_CPU_ISA variable */
#define MSTAR_KV_IMPLEMENTATION
#include "fuzz_common.h"

#define FO_REQS 16
#define FO_STALE 8
#define FO_PLANS 2
#define FO_OPS 400
#define FO_LS 4          /* lockstep groups the harness tracks */
#define FO_LS_STALE 4

typedef struct fo_state {
    fz_in in;
    const fz_geom *g;
    mskv_arena *a;
    mskv_request live[FO_REQS];
    int nlive;
    mskv_request stale[FO_STALE];
    int nstale;
    mskv_session sess[2];
    int sess_ok[2];
    mskv_plan plan[FO_PLANS];
    int plan_ok[FO_PLANS];
    mskv_pos_mode plan_pos[FO_PLANS];
    unsigned char *blob;
    size_t blob_size;
    mskv_cpu *cpu;
    long events;
    int32_t G;                         /* the arena's layer groups */
    int debug;                         /* the debug checks run: audit_bytes after every call */
    /* lockstep groups: handle and members (fixed at creation) */
    mskv_lockstep ls[FO_LS];
    mskv_request ls_mem[FO_LS][MSKV_MAX_LOCKSTEP];
    int32_t ls_n[FO_LS];
    int nls;
    mskv_lockstep ls_stale[FO_LS_STALE];
    int nls_stale;
    /* what the plan descs point at: explicit positions, visibility bounds
       (a segment each, up to a lockstep group's members and one more) */
    int32_t pos_buf[MSKV_MAX_LOCKSTEP + 1][3 * 64];
    const int32_t *pos_ptr[MSKV_MAX_LOCKSTEP + 1];
    int64_t vis_se[MSKV_MAX_LOCKSTEP + 1], vis_ws[MSKV_MAX_LOCKSTEP + 1];
} fo_state;

static void fo_on_event(void *user, const mskv_event *e) {
    fo_state *s = (fo_state *)user;
    FZ_CHECK(e->type == MSKV_EVENT_PAGE_STORED || e->type == MSKV_EVENT_PAGE_REMOVED, "event type %d", (int)e->type);
    FZ_CHECK(e->page >= 1 && e->page < s->g->num_pages, "event page %d", (int)e->page);
    FZ_CHECK(e->first_token >= 0 && e->first_token % s->g->page_size == 0, "event first token %lld", (long long)e->first_token);
    s->events++;
}
static void fo_on_log(void *user, mskv_log_level lvl, const char *m) {
    (void)user;
    FZ_CHECK(m != NULL && (int)lvl >= MSKV_LOG_DEBUG && (int)lvl <= MSKV_LOG_ERROR, "log message");
    FZ_CHECK(strlen(m) < 1024, "log message length");
}

/* ---- handles: live ones mostly, so calls get deep ----------------------- */

static mskv_request fo_pick(fo_state *s) {
    uint8_t sel = fz_u8(&s->in);
    mskv_request r;
    if (sel < 200 && s->nlive) return s->live[sel % s->nlive];
    if (sel < 230 && s->nstale) return s->stale[sel % s->nstale];
    r.id = (uint32_t)fz_raw(&s->in, sel & 1 ? 1 : 4);
    return r;
}
static void fo_keep(fo_state *s, mskv_request r) {
    if (s->nlive < FO_REQS) s->live[s->nlive++] = r;
    else {
        /* no room to track it: removing it keeps the harness's view whole */
        FZ_CHECK(mskv_request_remove(s->a, r) == MSKV_SUCCESS, "remove an untracked request");
        fz_audit(s->a, "remove an untracked request");
    }
}
static void fo_forget(fo_state *s, mskv_request r) {
    int i;
    for (i = 0; i < s->nlive; i++)
        if (s->live[i].id == r.id) {
            s->live[i] = s->live[--s->nlive];
            if (s->nstale < FO_STALE) s->stale[s->nstale++] = r;
            else s->stale[fz_u8(&s->in) % FO_STALE] = r;
            return;
        }
}

/* A layer group: mostly one the arena has, sometimes one past the end or wild. */
static int32_t fo_group(fo_state *s) {
    uint8_t sel = fz_u8(&s->in);
    if (sel < 220) return (int32_t)(sel % (uint8_t)s->G);
    if (sel < 240) return sel & 1 ? s->G : -1;
    return fz_wild32(&s->in);
}

static mskv_lockstep fo_pick_ls(fo_state *s) {
    uint8_t sel = fz_u8(&s->in);
    mskv_lockstep l;
    if (sel < 200 && s->nls) return s->ls[sel % s->nls];
    if (sel < 230 && s->nls_stale) return s->ls_stale[sel % s->nls_stale];
    l.id = (uint32_t)fz_raw(&s->in, sel & 1 ? 1 : 4);
    return l;
}
static int fo_ls_index(const fo_state *s, mskv_lockstep l) {
    int i;
    for (i = 0; i < s->nls; i++)
        if (s->ls[i].id == l.id) return i;
    return -1;
}
static void fo_ls_forget(fo_state *s, int i) {
    if (s->nls_stale < FO_LS_STALE) s->ls_stale[s->nls_stale++] = s->ls[i];
    else s->ls_stale[fz_u8(&s->in) % FO_LS_STALE] = s->ls[i];
    s->ls[i] = s->ls[s->nls - 1];
    memcpy(s->ls_mem[i], s->ls_mem[s->nls - 1], sizeof s->ls_mem[i]);
    s->ls_n[i] = s->ls_n[s->nls - 1];
    s->nls--;
}

static int64_t fo_tokens(fo_state *s) {
    uint8_t sel = fz_u8(&s->in);
    if (sel < 200) return (int64_t)(sel % 12);
    return fz_wild64(&s->in);
}
static uint64_t fo_key(fo_state *s) { uint8_t k = fz_u8(&s->in); return k < 240 ? (uint64_t)(k % 6) : (uint64_t)fz_wild64(&s->in); }

static int fo_segments(fo_state *s, mskv_segment *segs) {
    int n = (int)(fz_u8(&s->in) % 5), i;
    for (i = 0; i < n; i++) { segs[i].request = fo_pick(s); segs[i].n_tokens = fo_tokens(s); }
    return n;
}

static void fo_retention(fo_state *s, mskv_retention *r) {
    int64_t P = s->g->page_size;
    memset(r, 0, sizeof *r);
    if (fz_u8(&s->in) < 180) {   /* mostly a sane one */
        r->chunk_size = P * (1 + fz_u8(&s->in) % 3);
        r->sink_chunks = fz_u8(&s->in) % 3;
        r->window_chunks = 1 + fz_u8(&s->in) % 3;
        r->window_tokens = fz_u8(&s->in) & 1 ? r->window_chunks * r->chunk_size : 0;
        r->reset_at_boundary = fz_u8(&s->in) % 4 == 0;
        r->exact = fz_u8(&s->in) & 1;
        return;
    }
    r->chunk_size = fz_wild64(&s->in);
    r->sink_chunks = fz_wild64(&s->in);
    r->window_chunks = fz_wild64(&s->in);
    r->window_tokens = fz_wild64(&s->in);
    r->reset_at_boundary = fz_wild32(&s->in);
    r->exact = fz_wild32(&s->in);
}

/* segs (may be NULL): explicit positions only for segments of at most 64
   tokens (the arrays must hold n_tokens entries, which no callee can check) */
static void fo_plan_desc(fo_state *s, mskv_plan_desc *d, int64_t *dense, const mskv_segment *segs, int nseg) {
    int i, k;
    memset(d, 0, sizeof *d);
    d->kind = (mskv_plan_kind)(fz_u8(&s->in) % 5);   /* 4: invalid */
    d->cross = fo_pick(s);
    d->pos_mode = (mskv_pos_mode)(fz_u8(&s->in) % 4);
    d->pos_offset = fz_u8(&s->in) < 200 ? (int64_t)(fz_u8(&s->in) % 8) : fz_wild64(&s->in);
    d->grid_h = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % 4) : fz_wild32(&s->in);
    d->grid_w = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % 4) : fz_wild32(&s->in);
    for (i = 0; i < nseg; i++) dense[i] = fo_tokens(s);
    d->dense_kv_len = fz_u8(&s->in) < 240 ? dense : NULL;
    d->group = fo_group(s);
    if (segs && fz_u8(&s->in) < 48) {
        for (i = 0; i < nseg; i++) {
            s->pos_ptr[i] = NULL;
            if (segs[i].n_tokens < 0 || segs[i].n_tokens > 64 || fz_u8(&s->in) < 64) continue;
            for (k = 0; k < 3 * (int)segs[i].n_tokens; k++) s->pos_buf[i][k] = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % 16) : fz_wild32(&s->in);
            s->pos_ptr[i] = s->pos_buf[i];
        }
        d->positions = s->pos_ptr;
    }
    d->visibility = (mskv_visibility)(fz_u8(&s->in) % 8 < 5 ? 0 : fz_u8(&s->in) % 4);   /* 3: invalid */
    for (i = 0; i < nseg; i++) {
        s->vis_se[i] = fz_u8(&s->in) < 220 ? (int64_t)(fz_u8(&s->in) % 16) : fz_wild64(&s->in);
        s->vis_ws[i] = fz_u8(&s->in) < 220 ? (int64_t)(fz_u8(&s->in) % 32) : fz_wild64(&s->in);
    }
    if (fz_u8(&s->in) < 240) { d->vis_sink_end = s->vis_se; d->vis_window_start = s->vis_ws; }
    d->exclude_prefix = fz_u8(&s->in) % 4 == 0;
}

/* ---- the calls ------------------------------------------------------------ */

/* Runs an arena call and checks what every call must keep. */
#define FO_CALL(s, what, expr)                                                                       \
    do {                                                                                             \
        uint64_t fo__d = mskv_arena_digest((s)->a);                                                  \
        mskv_result fo__r = (expr);                                                                  \
        fz_audit((s)->a, what);                                                                      \
        if ((s)->debug) fo_audit_bytes((s), what);                                                   \
        FZ_CHECK(mskv_result_string(fo__r) != NULL, "result string");                                \
        if (fo__r != MSKV_SUCCESS)                                                                   \
            FZ_CHECK(mskv_arena_digest((s)->a) == fo__d, "%s failed (%s) and changed the arena", what, \
                     mskv_result_string(fo__r));                                                     \
        last = fo__r;                                                                                \
    } while (0)

/* The debug checks' bytes: free pages still poisoned, host copies as made. */
static void fo_audit_bytes(fo_state *s, const char *after) {
    char why[256];
    mskv_result r;
    why[0] = '\0';
    r = mskv_arena_audit_bytes(s->a, why, sizeof why);
    FZ_CHECK(r == MSKV_SUCCESS, "audit_bytes after %s: %s (%s)", after, mskv_result_string(r), why);
}

static void fo_free_plan(fo_state *s, int i) {
    if (s->plan_ok[i]) mskv_plan_free(s->a, &s->plan[i]);
    s->plan_ok[i] = 0;
    memset(&s->plan[i], 0, sizeof s->plan[i]);
}

static void fo_cpu_plan_call(fo_state *s, int pi, int op) {
    const fz_geom *g = s->g;
    mskv_plan *p = &s->plan[pi];
    int32_t layer = fz_u8(&s->in) < 220 ? (int32_t)(fz_u8(&s->in) % 3) - (g->num_layers == 0) : fz_wild32(&s->in);
    mskv_result last = MSKV_SUCCESS;
    size_t heads_kv = g->kv_heads ? (size_t)g->kv_heads : 1, dim = g->head_dim ? (size_t)g->head_dim : 1;
    if (!s->plan_ok[pi] || p->total_q > 4096) return;
    if (op == 0) {
        size_t n = (size_t)p->total_q * heads_kv * dim;
        mskv_dtype dt = (mskv_dtype)(fz_u8(&s->in) % 4);
        size_t es = mskv_dtype_size(dt) ? mskv_dtype_size(dt) : 4;
        unsigned char *k = (unsigned char *)calloc(n ? n : 1, es), *v = (unsigned char *)calloc(n ? n : 1, es);
        mskv_rope rope;
        int use_rope = fz_u8(&s->in) % 3 == 0;
        memset(&rope, 0, sizeof rope);
        rope.mode = s->plan_pos[pi] == MSKV_POS_NONE ? (mskv_pos_mode)(fz_u8(&s->in) % 3) : s->plan_pos[pi];
        rope.style = (mskv_rope_style)(fz_u8(&s->in) % 3);
        FO_CALL(s, "cpu_write_kv", mskv_cpu_write_kv(s->a, layer, p, k, v, dt, use_rope ? &rope : NULL));
        free(k); free(v);
    } else {
        mskv_attn at;
        size_t nq, es;
        unsigned char *q, *o;
        float *lse;
        memset(&at, 0, sizeof at);
        at.q_heads = (int32_t)(heads_kv * (1 + fz_u8(&s->in) % 3)) - (fz_u8(&s->in) % 16 == 0);
        at.mask = (mskv_mask)(fz_u8(&s->in) % 4);
        at.window_left = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % 9) : fz_wild32(&s->in);
        at.q_dtype = (mskv_dtype)(fz_u8(&s->in) % 4);
        at.scale = fz_u8(&s->in) < 200 ? 0.0f : (float)fz_wild32(&s->in);
        if (at.q_heads < 0) at.q_heads = 0;
        es = mskv_dtype_size(at.q_dtype) ? mskv_dtype_size(at.q_dtype) : 4;
        nq = (size_t)p->total_q * (size_t)at.q_heads * dim;
        q = (unsigned char *)calloc(nq ? nq : 1, es);
        o = (unsigned char *)calloc(nq ? nq : 1, es);
        lse = (float *)calloc((size_t)p->total_q * (size_t)at.q_heads + 1, sizeof(float));
        FO_CALL(s, "cpu_attention", mskv_cpu_attention(fz_u8(&s->in) & 1 ? s->cpu : NULL, s->a, layer, p, &at, q, o,
                                                       fz_u8(&s->in) & 1 ? lse : NULL));
        free(q); free(o); free(lse);
    }
    (void)last;
}
static void fo_cpu_calls(fo_state *s, int op) { fo_cpu_plan_call(s, fz_u8(&s->in) % FO_PLANS, op); }

/* The functions that take no arena, with wild sizes: buffers are allocated
   at the size the arguments declare when that is small; otherwise only
   arguments the call must refuse before touching memory are passed. */
static void fo_pure_calls(fo_state *s) {
    uint8_t which = fz_u8(&s->in) % 6;
    int64_t n = fz_u8(&s->in) < 200 ? (int64_t)(fz_u8(&s->in) % 6) : fz_wild64(&s->in);
    int32_t heads = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % 4) : fz_wild32(&s->in);
    int32_t dim = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % 9) : fz_wild32(&s->in);
    int small = n >= 0 && n <= 8 && heads >= 0 && heads <= 4 && dim >= 0 && dim <= 300;
    /* sizes whose element count does not fit int64 must be refused, never multiplied out */
    int huge = n > 0 && heads > 0 && dim > 0 && n > INT64_MAX / heads / dim;
    mskv_result r;
    FZ_CHECK(mskv_result_string((mskv_result)fz_wild32(&s->in)) != NULL, "result string");
    (void)mskv_dtype_size((mskv_dtype)fz_wild32(&s->in));
    {
        mskv_cpu_isa isa = (mskv_cpu_isa)fz_wild32(&s->in);
        FZ_CHECK(mskv_cpu_isa_name(isa) != NULL, "isa name");
        (void)mskv_cpu_isa_available(isa);
    }
    if (which == 0) {
        uint32_t bits = (uint32_t)fz_raw(&s->in, 4);
        float x;
        memcpy(&x, &bits, 4);
        (void)mskv_f16_to_f32(mskv_f32_to_f16(x));
        (void)mskv_bf16_to_f32(mskv_f32_to_bf16(x));
    } else if (which == 1 && (small || huge)) {
        size_t rows = small ? (size_t)n * (size_t)heads : 1, el = small ? rows * (size_t)dim : 1;
        float *oa = (float *)calloc(el + !el, 4), *ob = (float *)calloc(el + !el, 4);
        float *la = (float *)calloc(rows + !rows, 4), *lb = (float *)calloc(rows + !rows, 4);
        r = mskv_cpu_merge(n, heads, dim, oa, la, ob, lb, oa, la);
        FZ_CHECK(!huge || r != MSKV_SUCCESS, "merge of %lld x %d x %d elements succeeded", (long long)n, (int)heads, (int)dim);
        free(oa); free(ob); free(la); free(lb);
    } else if (which == 2 && (small || huge)) {
        mskv_rope rope;
        mskv_dtype dt = (mskv_dtype)(fz_u8(&s->in) % 4);
        size_t es = mskv_dtype_size(dt) ? mskv_dtype_size(dt) : 4;
        size_t el = small ? (size_t)n * (size_t)heads * (size_t)dim : 1;
        unsigned char *x = (unsigned char *)calloc(el + !el, es);
        int32_t *pos = (int32_t *)calloc(small ? (size_t)n * 3 + 1 : 1, 4);
        memset(&rope, 0, sizeof rope);
        rope.mode = (mskv_pos_mode)(fz_u8(&s->in) % 3);
        rope.style = (mskv_rope_style)(fz_u8(&s->in) % 3);
        if (fz_u8(&s->in) < 60) { rope.dims[0] = fz_wild32(&s->in); rope.dims[1] = fz_wild32(&s->in); rope.dims[2] = fz_wild32(&s->in); }
        rope.theta = fz_u8(&s->in) < 200 ? 0.0f : (float)fz_wild32(&s->in);
        r = mskv_rope_apply(&rope, x, dt, n, heads, dim, pos);
        FZ_CHECK(!huge || r != MSKV_SUCCESS, "rope over %lld x %d x %d elements succeeded", (long long)n, (int)heads, (int)dim);
        free(x); free(pos);
    } else if (which == 3) {
        mskv_schedule sc;
        mskv_window w;
        mskv_decode_span ds;
        if (mskv_schedule_init(&sc, fz_wild64(&s->in), fz_wild64(&s->in), fz_wild64(&s->in)) == MSKV_SUCCESS) {
            (void)mskv_schedule_window(&sc, fz_wild64(&s->in), &w);
            (void)mskv_schedule_decode_span(&sc, fz_wild64(&s->in), fz_wild64(&s->in), &ds);
        }
    } else if (which == 4) {
        mskv_retention ret;
        int64_t skip = 0;
        char why[64];
        fo_retention(s, &ret);
        (void)mskv_retention_validate(&ret, fz_wild32(&s->in), why, fz_u8(&s->in) % 65);
        (void)mskv_skipped_tokens_get(&ret, fz_wild64(&s->in), &skip);
        (void)mskv_skipped_tokens(&ret, fz_wild64(&s->in));
    } else if (which == 5) {
        char why[256];
        uint64_t d = mskv_arena_digest(s->a);
        (void)mskv_arena_step(s->a);
        why[0] = '\0';
        r = mskv_arena_audit_bytes(s->a, why, sizeof why);
        FZ_CHECK(r == MSKV_SUCCESS || r == MSKV_ERROR_UNSUPPORTED, "audit_bytes: %s (%s)", mskv_result_string(r), why);
        FZ_CHECK(mskv_arena_digest(s->a) == d, "audit_bytes changed the bookkeeping");
    }
}

/* The *_in_group twins, with groups mostly in range. */
static void fo_group_calls(fo_state *s, int which) {
    mskv_result last = MSKV_SUCCESS;
    mskv_request r = fo_pick(s);
    int32_t g = fo_group(s);
    if (which == 0) {
        mskv_request_info info, info0;
        FO_CALL(s, "request_info_in_group", mskv_request_info_in_group(s->a, r, g, &info));
        if (last == MSKV_SUCCESS) {
            FZ_CHECK(g >= 0 && g < s->G, "info of group %d succeeded", (int)g);
            FZ_CHECK(mskv_request_info_get(s->a, r, &info0) == MSKV_SUCCESS, "info of group 0");
            /* tokens, location and flags are the request's, the same in every group */
            FZ_CHECK(info.committed == info0.committed && info.reserved == info0.reserved && info.location == info0.location &&
                         info.lockstep == info0.lockstep && info.last_admitted == info0.last_admitted && info.paused == info0.paused,
                     "groups disagree on what is the request's");
            FZ_CHECK(info.kv_len >= 0 && info.num_pages >= 0 && info.prefix_tokens <= info.committed, "group info values");
        }
    } else if (which == 1) {
        int32_t pages[64], count = -1, cap = (int32_t)(fz_u8(&s->in) % 66) - 1;
        int given = cap > 0 && cap <= 64, i;
        FO_CALL(s, "request_pages_in_group", mskv_request_pages_in_group(s->a, r, g, given ? pages : NULL, cap, &count));
        if (last == MSKV_SUCCESS && given)
            for (i = 0; i < count; i++) FZ_CHECK(pages[i] >= 1 && pages[i] < s->g->num_pages, "page id %d", (int)pages[i]);
    } else if (which == 2) {
        int64_t slot = -1;
        FO_CALL(s, "request_slot_in_group", mskv_request_slot_in_group(s->a, r, g, fo_tokens(s), &slot));
        if (last == MSKV_SUCCESS)
            FZ_CHECK(slot >= s->g->page_size && slot < (int64_t)s->g->num_pages * s->g->page_size, "slot %lld", (long long)slot);
    } else if (which == 3) {
        FO_CALL(s, "protect_prefix_in_group", mskv_request_protect_prefix_in_group(s->a, r, g, fo_tokens(s)));
    } else if (which == 4) {
        int64_t got = -1;
        FO_CALL(s, "release_oldest_in_group", mskv_request_release_oldest_in_group(s->a, r, g, fo_tokens(s), fz_u8(&s->in) & 1 ? &got : NULL));
    } else {
        mskv_retention ret;
        fo_retention(s, &ret);
        FO_CALL(s, "set_retention_in_group", mskv_request_set_retention_in_group(s->a, r, g, fz_u8(&s->in) < 20 ? NULL : &ret));
    }
}

/* admit_query and make_room: what make_room parks is within the budget, in
   no batch segment, and afterwards there is room. */
static void fo_preempt_calls(fo_state *s, int which) {
    mskv_result last = MSKV_SUCCESS;
    mskv_segment segs[4];
    int n = fo_segments(s, segs), i, k;
    if (which == 0) {
        int64_t pages = -1;
        FO_CALL(s, "admit_query", mskv_admit_query(s->a, n || fz_u8(&s->in) < 250 ? segs : NULL, n, fz_u8(&s->in) < 250 ? &pages : NULL));
        if (last == MSKV_SUCCESS) {
            uint64_t d = mskv_arena_digest(s->a);
            mskv_result r = mskv_admit(s->a, segs, n);
            FZ_CHECK(pages >= 0, "admit_query: %lld pages", (long long)pages);
            /* admit agrees: it fits exactly when the free pages cover the count */
            if (r == MSKV_SUCCESS) {
                FZ_CHECK(mskv_abort(s->a, segs, n) == MSKV_SUCCESS || n == 0, "abort what was just admitted");
            } else {
                mskv_arena_stats st;
                FZ_CHECK(mskv_arena_digest(s->a) == d, "a failed admit changed the arena");
                FZ_CHECK(mskv_arena_stats_get(s->a, &st) == MSKV_SUCCESS, "stats");
                FZ_CHECK(r == MSKV_ERROR_OUT_OF_PAGES || r == MSKV_ERROR_OUT_OF_MEMORY, "admit_query passed, admit says %s",
                         mskv_result_string(r));
                if (r == MSKV_ERROR_OUT_OF_PAGES) FZ_CHECK(pages > st.free_pages, "admit needs %lld pages, %d free", (long long)pages, (int)st.free_pages);
            }
            fz_audit(s->a, "admit_query's admit");
        }
    } else {
        mskv_request parked[FO_REQS];
        mskv_arena_stats st;
        mskv_store_info si;
        int32_t np = -1, cap = fz_u8(&s->in) < 200 ? (int32_t)(fz_u8(&s->in) % (FO_REQS + 1)) : fz_wild32(&s->in);
        int64_t need;
        uint64_t budget, used = 0;
        uint8_t sel = fz_u8(&s->in);
        FZ_CHECK(mskv_arena_stats_get(s->a, &st) == MSKV_SUCCESS, "stats");
        need = sel < 200 ? (int64_t)st.free_pages + st.pending_pages + (int64_t)(sel % 8) - 2 : fz_wild64(&s->in);
        sel = fz_u8(&s->in);
        budget = sel < 128 ? UINT64_MAX : sel < 224 ? (uint64_t)fz_raw(&s->in, 2) : (uint64_t)fz_wild64(&s->in);
        if (cap > FO_REQS) cap = FO_REQS;   /* the array's real size */
        FO_CALL(s, "make_room", mskv_make_room(s->a, need, budget, n || fz_u8(&s->in) < 250 ? segs : NULL, n,
                                               cap > 0 || fz_u8(&s->in) < 128 ? parked : NULL, cap, &np));
        if (last != MSKV_SUCCESS) {
            if (last == MSKV_ERROR_CAPACITY) FZ_CHECK(np > cap, "make_room: CAPACITY with %d to park in %d", (int)np, (int)cap);
            return;
        }
        FZ_CHECK(np >= 0 && np <= cap, "make_room parked %d with room for %d", (int)np, (int)cap);
        FZ_CHECK(mskv_arena_stats_get(s->a, &st) == MSKV_SUCCESS && mskv_store_info_get(s->a, &si) == MSKV_SUCCESS, "stats");
        FZ_CHECK((int64_t)st.free_pages + st.pending_pages >= need, "make_room succeeded: %d free + %d pending < %lld",
                 (int)st.free_pages, (int)st.pending_pages, (long long)need);
        for (i = 0; i < np; i++) {
            mskv_request_info info;
            int32_t g;
            FZ_CHECK(mskv_request_info_get(s->a, parked[i], &info) == MSKV_SUCCESS && info.location == MSKV_OFFLOADED && !info.paused &&
                         !info.keyed, "a parked request is not an offloaded, unpaused request");
            for (k = 0; k < n; k++) FZ_CHECK(segs[k].request.id != parked[i].id, "make_room parked a request of the batch");
            for (k = 0; k < i; k++) FZ_CHECK(parked[k].id != parked[i].id, "make_room parked a request twice");
            for (g = 0; g < s->G; g++) {
                FZ_CHECK(mskv_request_info_in_group(s->a, parked[i], g, &info) == MSKV_SUCCESS, "info");
                used += (uint64_t)info.num_pages * si.page_bytes * 2 * (uint64_t)si.num_layers;
            }
        }
        FZ_CHECK(used <= budget, "make_room parked %llu host bytes over a budget of %llu", (unsigned long long)used,
                 (unsigned long long)budget);
    }
}

/* Lockstep groups formed from live requests, and every call on them. */
static void fo_lockstep_calls(fo_state *s, int which) {
    mskv_result last = MSKV_SUCCESS;
    mskv_lockstep l = fo_pick_ls(s);
    int li = fo_ls_index(s, l), i;
    if (which == 0) {
        mskv_request m[MSKV_MAX_LOCKSTEP + 1];
        uint8_t sel = fz_u8(&s->in);
        int32_t n = sel < 200 ? 2 + sel % 3 : (int32_t)(sel % (MSKV_MAX_LOCKSTEP + 2)) - 1;
        int32_t k = n < 0 ? 0 : n > MSKV_MAX_LOCKSTEP + 1 ? MSKV_MAX_LOCKSTEP + 1 : n, at = fz_u8(&s->in);
        /* mostly distinct live requests, so groups form; sometimes any handle */
        for (i = 0; i < k; i++) m[i] = s->nlive && fz_u8(&s->in) < 220 ? s->live[(at + i) % s->nlive] : fo_pick(s);
        if (n > k) n = k;   /* only as many as the array holds */
        FO_CALL(s, "lockstep_create", mskv_lockstep_create(s->a, fz_u8(&s->in) < 250 ? m : NULL, n, &l));
        if (last != MSKV_SUCCESS) return;
        if (s->nls == FO_LS) {   /* no room to track it */
            FZ_CHECK(mskv_lockstep_dissolve(s->a, l) == MSKV_SUCCESS, "dissolve an untracked lockstep group");
            fz_audit(s->a, "dissolve an untracked lockstep group");
            return;
        }
        s->ls[s->nls] = l;
        memcpy(s->ls_mem[s->nls], m, (size_t)n * sizeof(mskv_request));
        s->ls_n[s->nls++] = n;
    } else if (which == 1) {
        mskv_request out[MSKV_MAX_LOCKSTEP];
        int32_t count = -1, cap = (int32_t)(fz_u8(&s->in) % (MSKV_MAX_LOCKSTEP + 2)) - 1;
        if (fz_u8(&s->in) < 64) {
            FO_CALL(s, "lockstep_dissolve", mskv_lockstep_dissolve(s->a, l));
            if (last == MSKV_SUCCESS && li >= 0) fo_ls_forget(s, li);
            return;
        }
        FO_CALL(s, "lockstep_members", mskv_lockstep_members(s->a, l, cap > 0 || fz_u8(&s->in) < 128 ? out : NULL, cap, &count));
        if (last == MSKV_SUCCESS && li >= 0) {
            FZ_CHECK(count == s->ls_n[li], "lockstep_members: %d members, made with %d", (int)count, (int)s->ls_n[li]);
            for (i = 0; i < count; i++) FZ_CHECK(out[i].id == s->ls_mem[li][i].id, "lockstep member %d", i);
        }
    } else if (which == 2) {
        /* a lockstep step: the group's segments (plus, sometimes, another segment) into a batch call */
        mskv_segment segs[MSKV_MAX_LOCKSTEP + 1];
        int32_t count = -1, cap = fz_u8(&s->in) < 220 ? MSKV_MAX_LOCKSTEP : (int32_t)(fz_u8(&s->in) % 4) - 1;
        int64_t nt = fo_tokens(s);
        uint8_t call = fz_u8(&s->in) % 6;
        FO_CALL(s, "lockstep_segments", mskv_lockstep_segments(s->a, l, nt, cap > 0 || fz_u8(&s->in) < 128 ? segs : NULL, cap, &count));
        if (last != MSKV_SUCCESS) {
            if (last == MSKV_ERROR_CAPACITY) FZ_CHECK(count > cap, "lockstep_segments: CAPACITY for %d in %d", (int)count, (int)cap);
            return;
        }
        for (i = 0; i < count; i++) FZ_CHECK(segs[i].n_tokens == nt, "lockstep segment tokens");
        if (li >= 0) for (i = 0; i < count; i++) FZ_CHECK(segs[i].request.id == s->ls_mem[li][i].id, "lockstep segment %d", i);
        if (fz_u8(&s->in) < 64) { segs[count].request = fo_pick(s); segs[count].n_tokens = fo_tokens(s); count++; }
        else if (count > 0 && fz_u8(&s->in) < 32) count--;   /* a member missing */
        if (call == 0) FO_CALL(s, "admit (lockstep)", mskv_admit(s->a, segs, count));
        else if (call == 1) FO_CALL(s, "commit (lockstep)", mskv_commit(s->a, segs, count));
        else if (call == 2) FO_CALL(s, "abort (lockstep)", mskv_abort(s->a, segs, count));
        else if (call == 3) FO_CALL(s, "publish (lockstep)", mskv_publish(s->a, segs, count, NULL));
        else {
            mskv_plan_desc d;
            int64_t dense[MSKV_MAX_LOCKSTEP + 1];
            int pi = fz_u8(&s->in) % FO_PLANS;
            fo_plan_desc(s, &d, dense, segs, count);
            if (!s->plan_ok[pi]) return;
            FO_CALL(s, "plan_build (lockstep)", mskv_plan_build(s->a, segs, count, &d, &s->plan[pi]));
            if (last == MSKV_SUCCESS) s->plan_pos[pi] = d.pos_mode;
        }
    } else if (which == 3) {
        FO_CALL(s, "lockstep_offload", mskv_lockstep_offload(s->a, l));
    } else if (which == 4) {
        FO_CALL(s, "lockstep_reload", mskv_lockstep_reload(s->a, l));
    } else if (which == 5) {
        FO_CALL(s, "lockstep_remove", mskv_lockstep_remove(s->a, l));
        if (last == MSKV_SUCCESS && li >= 0) {
            for (i = 0; i < s->ls_n[li]; i++) fo_forget(s, s->ls_mem[li][i]);
            fo_ls_forget(s, li);
        }
    } else {
        int64_t got = -1;
        FO_CALL(s, "lockstep_release_oldest", mskv_lockstep_release_oldest(s->a, l, fo_group(s), fo_tokens(s), fz_u8(&s->in) & 1 ? &got : NULL));
    }
}

/* A whole step, so the calls deep in it are reached: admit the segments,
   plan them in a layer group, write K/V, attend, then commit or abort and
   publish. Each call is checked like any other. */
static void fo_whole_step(fo_state *s, mskv_segment *segs, int n) {
    mskv_result last = MSKV_SUCCESS;
    mskv_plan_desc d;
    mskv_plan_size ps;
    int pi = fz_u8(&s->in) % FO_PLANS, i;
    FO_CALL(s, "admit (step)", mskv_admit(s->a, segs, n));
    if (last != MSKV_SUCCESS) return;
    memset(&d, 0, sizeof d);
    d.pos_mode = (mskv_pos_mode)(fz_u8(&s->in) % 3);
    d.grid_h = 1 + fz_u8(&s->in) % 3;
    d.grid_w = 1 + fz_u8(&s->in) % 3;
    d.group = fz_u8(&s->in) < 240 ? (int32_t)(fz_u8(&s->in) % (uint8_t)s->G) : fo_group(s);
    FO_CALL(s, "plan_query (step)", mskv_plan_query(s->a, segs, n, &d, &ps));
    if (last == MSKV_SUCCESS && ps.total_q <= 4096 && ps.num_page_ids <= 4096) {
        fo_free_plan(s, pi);
        FO_CALL(s, "plan_alloc (step)", mskv_plan_alloc(s->a, ps.batch, ps.total_q, ps.num_page_ids, &s->plan[pi]));
        if (last == MSKV_SUCCESS) {
            s->plan_ok[pi] = 1;
            FO_CALL(s, "plan_build (step)", mskv_plan_build(s->a, segs, n, &d, &s->plan[pi]));
            s->plan_pos[pi] = last == MSKV_SUCCESS ? d.pos_mode : MSKV_POS_NONE;
            if (last == MSKV_SUCCESS) {
                int writes = fz_u8(&s->in) % 3;
                for (i = 0; i < writes; i++) fo_cpu_plan_call(s, pi, 0);
                for (i = 0; i < 1 + writes; i++) fo_cpu_plan_call(s, pi, 1);
            }
        }
    }
    if (fz_u8(&s->in) < 200) FO_CALL(s, "commit (step)", mskv_commit(s->a, segs, n));
    else FO_CALL(s, "abort (step)", mskv_abort(s->a, segs, n));
    if (fz_u8(&s->in) < 160) FO_CALL(s, "publish (step)", mskv_publish(s->a, segs, n, NULL));
}

static void fo_step_calls(fo_state *s, int lockstep) {
    mskv_segment segs[MSKV_MAX_LOCKSTEP];
    int32_t n = 0, i;
    int64_t nt = 1 + fz_u8(&s->in) % (uint8_t)(3 * s->g->page_size);
    if (!lockstep) {
        n = 1 + fz_u8(&s->in) % 3;
        for (i = 0; i < n; i++) { segs[i].request = fo_pick(s); segs[i].n_tokens = i == 0 ? nt : 1 + fz_u8(&s->in) % 4; }
    } else {
        mskv_lockstep l;
        if (!s->nls) return;
        l = s->ls[fz_u8(&s->in) % s->nls];
        if (mskv_lockstep_segments(s->a, l, nt, segs, MSKV_MAX_LOCKSTEP, &n) != MSKV_SUCCESS) FZ_FAIL("segments of a tracked lockstep group");
    }
    fo_whole_step(s, segs, n);
}

/* flush, reset (which forgets every handle), and the stale-plan check. */
static void fo_arena_calls(fo_state *s, int which) {
    mskv_result last = MSKV_SUCCESS;
    mskv_arena_stats st;
    if (which == 0) {
        FO_CALL(s, "arena_flush", mskv_arena_flush(s->a));
        FZ_CHECK(mskv_arena_stats_get(s->a, &st) == MSKV_SUCCESS && st.pending_pages == 0, "pages pending after a flush");
    } else if (which == 1 && fz_u8(&s->in) < 48) {
        FO_CALL(s, "arena_reset", mskv_arena_reset(s->a));
        FZ_CHECK(mskv_arena_stats_get(s->a, &st) == MSKV_SUCCESS, "stats");
        FZ_CHECK(st.requests == 0 && st.live_pages == 0 && st.offloaded_pages == 0 &&
                     st.free_pages + st.pending_pages == st.num_pages - 1, "reset left %d requests, %d live pages", (int)st.requests,
                 (int)st.live_pages);
        while (s->nlive) fo_forget(s, s->live[0]);
        while (s->nls) fo_ls_forget(s, 0);
    } else {
        int pi = fz_u8(&s->in) % FO_PLANS;
        uint64_t d = mskv_arena_digest(s->a);
        mskv_result r;
        if (!s->plan_ok[pi]) return;
        r = mskv_plan_check(s->a, &s->plan[pi]);
        FZ_CHECK(r == MSKV_SUCCESS || r == MSKV_ERROR_STALE_PLAN, "plan_check: %s", mskv_result_string(r));
        FZ_CHECK(mskv_arena_digest(s->a) == d, "plan_check changed the arena");
    }
    (void)last;
}

static void fo_step(fo_state *s) {
    mskv_result last = MSKV_SUCCESS;
    mskv_request r, h;
    mskv_segment segs[4];
    int n, i;
    uint8_t op = fz_u8(&s->in) % 69;
    switch (op) {
    case 0: case 1:
        FO_CALL(s, "request_add", mskv_request_add(s->a, &r));
        if (last == MSKV_SUCCESS) fo_keep(s, r);
        break;
    case 2:
        r = fo_pick(s);
        FO_CALL(s, "request_remove", mskv_request_remove(s->a, r));
        if (last == MSKV_SUCCESS) fo_forget(s, r);
        break;
    case 3:
        FO_CALL(s, "request_fork", mskv_request_fork(s->a, fo_pick(s), &h));
        if (last == MSKV_SUCCESS) fo_keep(s, h);
        break;
    case 4: FO_CALL(s, "request_pause", mskv_request_pause(s->a, fo_pick(s))); break;
    case 5: FO_CALL(s, "request_resume", mskv_request_resume(s->a, fo_pick(s))); break;
    case 6: FO_CALL(s, "request_reserve", mskv_request_reserve(s->a, fo_pick(s), fo_tokens(s))); break;
    case 7: {
        mskv_request_info info;
        FO_CALL(s, "request_info_get", mskv_request_info_get(s->a, fo_pick(s), &info));
        if (last == MSKV_SUCCESS)
            FZ_CHECK(info.committed >= 0 && info.reserved >= 0 && info.num_pages >= 0 && info.kv_len >= 0, "info values");
        break;
    }
    case 8: {
        int32_t pages[64], count = -1, cap = (int32_t)(fz_u8(&s->in) % 66) - 1;
        int given = cap > 0 && cap <= 64;
        FO_CALL(s, "request_pages", mskv_request_pages(s->a, fo_pick(s), given ? pages : NULL, cap, &count));
        if (last == MSKV_SUCCESS && given) for (i = 0; i < count; i++) FZ_CHECK(pages[i] >= 0 && pages[i] < s->g->num_pages, "page id");
        break;
    }
    case 9: FO_CALL(s, "protect_prefix", mskv_request_protect_prefix(s->a, fo_pick(s), fo_tokens(s))); break;
    case 10: {
        int64_t got = -1;
        FO_CALL(s, "release_oldest", mskv_request_release_oldest(s->a, fo_pick(s), fo_tokens(s), fz_u8(&s->in) & 1 ? &got : NULL));
        break;
    }
    case 11: {
        int64_t slot = -1;
        FO_CALL(s, "request_slot", mskv_request_slot(s->a, fo_pick(s), fo_tokens(s), &slot));
        if (last == MSKV_SUCCESS)
            FZ_CHECK(slot >= s->g->page_size && slot < (int64_t)s->g->num_pages * s->g->page_size, "slot %lld", (long long)slot);
        break;
    }
    case 12: FO_CALL(s, "offload", mskv_request_offload(s->a, fo_pick(s))); break;
    case 13: FO_CALL(s, "reload", mskv_request_reload(s->a, fo_pick(s))); break;
    case 14: {
        size_t size = 0, cap;
        unsigned char *b;
        r = fo_pick(s);
        FO_CALL(s, "export size", mskv_request_export(s->a, r, NULL, 0, &size));
        if (last != MSKV_SUCCESS || size > (1u << 22)) break;
        cap = fz_u8(&s->in) < 230 ? size : size - 1;
        b = (unsigned char *)malloc(cap ? cap : 1);
        FO_CALL(s, "export", mskv_request_export(s->a, r, b, cap, &size));
        if (last == MSKV_SUCCESS) { free(s->blob); s->blob = b; s->blob_size = size; }
        else free(b);
        break;
    }
    case 15: {
        unsigned char *b;
        size_t sz = s->blob_size;
        if (!s->blob) break;
        b = (unsigned char *)malloc(sz);
        memcpy(b, s->blob, sz);
        if (fz_u8(&s->in) < 100) {   /* a damaged copy, sometimes re-signed */
            b[fz_raw(&s->in, 2) % sz] ^= (unsigned char)(1u << (fz_u8(&s->in) % 8));
            if (fz_u8(&s->in) & 1) { uint64_t c = mskv__blob_checksum(b, sz - 8); mskv__put64(b + sz - 8, c); }
        }
        FO_CALL(s, "import", mskv_request_import(s->a, b, fz_u8(&s->in) < 240 ? sz : sz - 1 - fz_u8(&s->in) % 8, &r));
        if (last == MSKV_SUCCESS) fo_keep(s, r);
        free(b);
        break;
    }
    case 16: {
        mskv_retention ret;
        fo_retention(s, &ret);
        FO_CALL(s, "set_retention", mskv_request_set_retention(s->a, fo_pick(s), fz_u8(&s->in) < 20 ? NULL : &ret));
        break;
    }
    case 17: case 18:
        n = fo_segments(s, segs);
        FO_CALL(s, "admit", mskv_admit(s->a, n || fz_u8(&s->in) < 250 ? segs : NULL, n));
        break;
    case 19: n = fo_segments(s, segs); FO_CALL(s, "commit", mskv_commit(s->a, segs, n)); break;
    case 20: n = fo_segments(s, segs); FO_CALL(s, "abort", mskv_abort(s->a, segs, n)); break;
    case 21: {
        uint64_t step = 0;
        n = fo_segments(s, segs);
        FO_CALL(s, "publish", mskv_publish(s->a, segs, n, fz_u8(&s->in) & 1 ? &step : NULL));
        break;
    }
    case 22: case 23: {
        mskv_plan_desc d;
        int64_t dense[4];
        mskv_plan_size ps;
        int pi = fz_u8(&s->in) % FO_PLANS;
        n = fo_segments(s, segs);
        fo_plan_desc(s, &d, dense, segs, n);
        FO_CALL(s, "plan_query", mskv_plan_query(s->a, segs, n, &d, &ps));
        if (last == MSKV_SUCCESS) {
            if (ps.batch > 64 || ps.total_q > 4096 || ps.num_page_ids > 4096) break;
            fo_free_plan(s, pi);
            FO_CALL(s, "plan_alloc", mskv_plan_alloc(s->a, ps.batch + (fz_u8(&s->in) % 2), ps.total_q - (fz_u8(&s->in) % 8 == 0),
                                                     ps.num_page_ids, &s->plan[pi]));
            if (last != MSKV_SUCCESS) break;
            s->plan_ok[pi] = 1;
        } else if (!s->plan_ok[pi]) break;
        FO_CALL(s, "plan_build", mskv_plan_build(s->a, segs, n, &d, &s->plan[pi]));
        if (last == MSKV_SUCCESS) {
            char why[256];
            s->plan_pos[pi] = d.pos_mode;
            why[0] = '\0';
            if (d.kind != MSKV_PLAN_DENSE)
                FZ_CHECK(mskv_plan_validate(&s->plan[pi], s->g->num_pages, why, sizeof why) == MSKV_SUCCESS,
                         "a built plan does not validate: %s", why);
        }
        break;
    }
    case 24: {
        int pi = fz_u8(&s->in) % FO_PLANS;
        int32_t cb = fz_u8(&s->in) < 220 ? (int32_t)(fz_u8(&s->in) % 8) : fz_wild32(&s->in);
        int32_t ct = fz_u8(&s->in) < 220 ? (int32_t)(fz_u8(&s->in) % 64) : fz_wild32(&s->in);
        int32_t cp = fz_u8(&s->in) < 220 ? (int32_t)(fz_u8(&s->in) % 64) : fz_wild32(&s->in);
        fo_free_plan(s, pi);
        FO_CALL(s, "plan_alloc", mskv_plan_alloc(s->a, cb, ct, cp, &s->plan[pi]));
        s->plan_ok[pi] = last == MSKV_SUCCESS;
        s->plan_pos[pi] = MSKV_POS_NONE;
        break;
    }
    case 25: {
        int pi = fz_u8(&s->in) % FO_PLANS;
        char why[64];
        if (s->plan_ok[pi]) (void)mskv_plan_validate(&s->plan[pi], fz_u8(&s->in) < 200 ? s->g->num_pages : fz_wild32(&s->in), why, fz_u8(&s->in) % 65);
        break;
    }
    case 26:
        FO_CALL(s, "keyed_create", mskv_keyed_create(s->a, fo_key(s), fo_tokens(s), &r));
        if (last == MSKV_SUCCESS) fo_keep(s, r);
        break;
    case 27: FO_CALL(s, "keyed_seal", mskv_keyed_seal(s->a, fo_pick(s))); break;
    case 28: FO_CALL(s, "keyed_find", mskv_keyed_find(s->a, fo_key(s), &r)); break;
    case 29: {
        uint64_t key = fo_key(s);
        if (mskv_keyed_find(s->a, key, &r) != MSKV_SUCCESS) r.id = 0;
        FO_CALL(s, "keyed_remove", mskv_keyed_remove(s->a, key));
        if (last == MSKV_SUCCESS) fo_forget(s, r);
        break;
    }
    case 30: {
        mskv_retention ret;
        int si = fz_u8(&s->in) & 1;
        fo_retention(s, &ret);
        FO_CALL(s, "session_init", mskv_session_init(&s->sess[si], s->a, fo_pick(s), &ret));
        if (last == MSKV_SUCCESS) s->sess_ok[si] = 1;
        break;
    }
    case 31: case 32: {
        int si = fz_u8(&s->in) & 1;
        if (!s->sess_ok[si]) break;
        FO_CALL(s, "session_begin_chunk", mskv_session_begin_chunk(&s->sess[si], fo_tokens(s)));
        break;
    }
    case 33: {
        int si = fz_u8(&s->in) & 1, pi = fz_u8(&s->in) % FO_PLANS;
        mskv_plan_desc d;
        int64_t dense[1];
        if (!s->sess_ok[si] || !s->plan_ok[pi]) break;
        fo_plan_desc(s, &d, dense, NULL, 1);
        FO_CALL(s, "session_plan", mskv_session_plan(&s->sess[si], &d, &s->plan[pi]));
        if (last == MSKV_SUCCESS) s->plan_pos[pi] = d.pos_mode;
        break;
    }
    case 34: {
        int si = fz_u8(&s->in) & 1;
        uint64_t step;
        if (!s->sess_ok[si]) break;
        FO_CALL(s, "session_commit_chunk", mskv_session_commit_chunk(&s->sess[si], fz_u8(&s->in) & 1 ? &step : NULL));
        break;
    }
    case 35: {
        int si = fz_u8(&s->in) & 1;
        if (!s->sess_ok[si]) break;
        FO_CALL(s, "session_abort_chunk", mskv_session_abort_chunk(&s->sess[si]));
        break;
    }
    case 36: {
        uint64_t at = fz_u8(&s->in) < 200 ? mskv_arena_step(s->a) - (uint64_t)(fz_u8(&s->in) % 3) : (uint64_t)fz_wild64(&s->in);
        FO_CALL(s, "arena_retire", mskv_arena_retire(s->a, at));
        break;
    }
    case 37: {
        uint64_t d = mskv_arena_digest(s->a);
        mskv_arena_stats st;
        mskv_store_info si;
        mskv_arena_trim(s->a);
        FZ_CHECK(mskv_arena_digest(s->a) == d, "trim changed the bookkeeping");
        FZ_CHECK(mskv_arena_stats_get(s->a, &st) == MSKV_SUCCESS, "stats");
        FZ_CHECK(st.num_pages == st.free_pages + st.live_pages + st.pending_pages + 1, "pages not conserved");
        FZ_CHECK(mskv_store_info_get(s->a, &si) == MSKV_SUCCESS, "store info");
        (void)mskv_store_pool(s->a, fz_wild32(&s->in), (int)fz_wild32(&s->in));
        FZ_CHECK(mskv_arena_digest(s->a) == d, "reading stats changed the bookkeeping");
        break;
    }
    case 38: case 39: fo_cpu_calls(s, 0); break;
    case 40: case 41: fo_cpu_calls(s, 1); break;
    case 42: {
        static const char *env[] = { "portable", "avx2", "avx512", "neon", "auto", "bogus", "", "avx512_bf16", "bf16_emu", "amx_bf16" };
        mskv_cpu_desc cd;
        mskv_cpu_info ci;
        uint8_t e = fz_u8(&s->in);
        mskv_result r;
        memset(&cd, 0, sizeof cd);
        cd.allocator = fz_allocator();
        cd.num_threads = (int32_t)(fz_u8(&s->in) % 3);
        cd.workspace_bytes = fz_u8(&s->in) < 200 ? 0 : fz_wildsize(&s->in);
        cd.isa = fz_u8(&s->in) < 200 ? (mskv_cpu_isa)(fz_u8(&s->in) % 9) : (mskv_cpu_isa)fz_wild32(&s->in);
        cd.log = fo_on_log;
        /* the environment's choice too (AUTO reads it); reset for every input */
        if (e < 9 * 16) setenv("MSKV_CPU_ISA", env[e % 9], 1);
        else unsetenv("MSKV_CPU_ISA");
        if (s->cpu) { mskv_cpu_destroy(s->cpu); s->cpu = NULL; }
        r = mskv_cpu_create(&cd, &s->cpu);
        FZ_CHECK(r != MSKV_SUCCESS || s->cpu != NULL, "cpu_create succeeded without a pool");
        if (r == MSKV_ERROR_UNSUPPORTED) FZ_CHECK(!mskv_cpu_isa_available(cd.isa), "isa %d refused but available", (int)cd.isa);
        if (r == MSKV_SUCCESS) {
            FZ_CHECK(mskv_cpu_info_get(s->cpu, &ci) == MSKV_SUCCESS, "cpu_info_get");
            FZ_CHECK(ci.isa != MSKV_CPU_ISA_AUTO && mskv_cpu_isa_available(ci.isa) &&
                         (cd.isa == MSKV_CPU_ISA_AUTO || ci.isa == cd.isa),
                     "cpu asked for isa %d runs %d", (int)cd.isa, (int)ci.isa);
            FZ_CHECK(ci.num_threads == (cd.num_threads ? cd.num_threads : 1) && ci.workspace_bytes > 0, "cpu_info threads %d",
                     (int)ci.num_threads);
            FZ_CHECK(cd.workspace_bytes == 0 || ci.workspace_bytes <= cd.workspace_bytes, "workspace %zu over the budget %zu",
                     ci.workspace_bytes, cd.workspace_bytes);
        } else {
            FZ_CHECK(s->cpu == NULL, "a failed cpu_create handed out a pool");
        }
        FZ_CHECK(mskv_cpu_info_get(NULL, &ci) == MSKV_ERROR_NULL_POINTER, "cpu_info_get(NULL)");
        break;
    }
    case 43: fo_pure_calls(s); break;
    case 44: FO_CALL(s, "shift_positions", mskv_request_shift_positions(s->a, fo_pick(s), fz_u8(&s->in) < 200 ? (int64_t)(fz_u8(&s->in) % 9) - 4 : fz_wild64(&s->in))); break;
    case 45: {
        /* a prefix view of up to 64 tokens per layer, gathered, checked, and one layer of it */
        mskv_prefix_view v;
        mskv_dense_kv kv;
        size_t row = (size_t)(s->g->kv_heads ? s->g->kv_heads : 1) * (size_t)(s->g->head_dim ? s->g->head_dim : 1) * 4;
        size_t bytes = (size_t)(s->g->num_layers ? s->g->num_layers : 1) * 64 * row;
        memset(&v, 0, sizeof v);
        v.request = fo_pick(s);
        v.group = fo_group(s);
        v.cap_tokens = fz_u8(&s->in) < 230 ? (int64_t)(fz_u8(&s->in) % 65) : fz_wild64(&s->in);
        if (v.cap_tokens > 64) v.cap_tokens = -1;   /* the buffers hold 64: more would be the caller's lie */
        v.k = malloc(bytes);
        v.v = malloc(bytes);
        FO_CALL(s, "prefix_view_gather", mskv_prefix_view_gather(s->a, &v));
        FO_CALL(s, "prefix_view_check", mskv_prefix_view_check(s->a, &v));
        (void)mskv_prefix_view_layer(&v, s->a, fz_u8(&s->in) % 3, &kv);
        free(v.k);
        free(v.v);
        break;
    }
    case 46: case 47: case 48: case 49: case 50: case 51: fo_group_calls(s, op - 46); break;
    case 52: case 53: fo_preempt_calls(s, op - 52); break;
    case 54: case 55: case 56: case 57: case 58: case 59: case 60: fo_lockstep_calls(s, op - 54); break;
    case 61: case 62: case 63: fo_arena_calls(s, op - 61); break;
    case 64: case 65: fo_step_calls(s, 0); break;
    case 66: fo_step_calls(s, 1); break;
    default: {
        int pi = fz_u8(&s->in) % FO_PLANS;
        fo_free_plan(s, pi);
        break;
    }
    }
}

/* Configuration bit 0x20: the program starts with a lockstep pair of two
   requests a few tokens long, so the lockstep calls have a group to act on. */
static void fo_start_pair(fo_state *s) {
    mskv_request m[2];
    mskv_segment segs[2];
    int32_t n = 0;
    FZ_CHECK(mskv_request_add(s->a, &m[0]) == MSKV_SUCCESS && mskv_request_add(s->a, &m[1]) == MSKV_SUCCESS, "add a pair");
    FZ_CHECK(mskv_lockstep_create(s->a, m, 2, &s->ls[0]) == MSKV_SUCCESS, "lockstep_create of a fresh pair");
    FZ_CHECK(mskv_lockstep_segments(s->a, s->ls[0], s->g->page_size + 1, segs, 2, &n) == MSKV_SUCCESS && n == 2, "segments");
    FZ_CHECK(mskv_admit(s->a, segs, n) == MSKV_SUCCESS && mskv_commit(s->a, segs, n) == MSKV_SUCCESS, "grow the pair");
    fz_audit(s->a, "the starting pair");
    s->live[s->nlive++] = m[0];
    s->live[s->nlive++] = m[1];
    memcpy(s->ls_mem[0], m, sizeof m);
    s->ls_n[0] = 2;
    s->nls = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fo_state s;
    mskv_arena_desc d;
    mskv_arena_stats st;
    int i, ops;
    uint64_t step;
    memset(&s, 0, sizeof s);
    s.in.p = data;
    s.in.n = size;
    i = fz_u8(&s.in);
    s.g = &fz_geoms[(i & 0x1F) % FZ_NGEOM];
    d = fz_desc(s.g, (i & 0x40) != 0);
    d.max_requests = 12;   /* below FO_REQS: TOO_MANY_REQUESTS is reachable */
    /* with the debug checks too: poisoned free pages must stay poisoned (no call
       writes a freed page), and host copies keep their checksums */
    if (i & 0x80) d.debug = MSKV_DEBUG_POISON | MSKV_DEBUG_CHECKSUMS;
    d.on_event = fo_on_event;
    d.event_user = &s;
    d.log = fo_on_log;
    s.G = s.g->num_groups > 1 ? s.g->num_groups : 1;
    s.debug = d.debug != 0;
    unsetenv("MSKV_CPU_ISA");   /* a previous input may have set it */
    if (mskv_arena_create(&d, &s.a) != MSKV_SUCCESS) FZ_FAIL("arena_create");
    if (i & 0x20) fo_start_pair(&s);
    for (ops = 0; ops < FO_OPS && fz_more(&s.in); ops++) fo_step(&s);
    /* everything the harness made goes back: lockstep groups first (their members refuse remove) */
    for (i = 0; i < FO_PLANS; i++) fo_free_plan(&s, i);
    for (i = 0; i < s.nls; i++) FZ_CHECK(mskv_lockstep_dissolve(s.a, s.ls[i]) == MSKV_SUCCESS, "final dissolve");
    for (i = 0; i < s.nlive; i++) FZ_CHECK(mskv_request_remove(s.a, s.live[i]) == MSKV_SUCCESS, "final remove");
    FZ_CHECK(mskv_publish(s.a, NULL, 0, &step) == MSKV_SUCCESS && mskv_arena_retire(s.a, step) == MSKV_SUCCESS, "final retire");
    fz_audit(s.a, "removing everything");
    FZ_CHECK(mskv_arena_stats_get(s.a, &st) == MSKV_SUCCESS, "stats");
    FZ_CHECK(st.free_pages == st.num_pages - 1 && st.requests == 0 && st.offloaded_pages == 0,
             "pages not conserved at the end: %d free of %d, %d requests", st.free_pages, st.num_pages, st.requests);
    if (s.debug) fo_audit_bytes(&s, "removing everything");
    mskv_cpu_destroy(s.cpu);
    mskv_arena_destroy(s.a);
    free(s.blob);
    unsetenv("MSKV_CPU_ISA");
    return 0;
}
