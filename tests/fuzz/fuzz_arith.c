/* libFuzzer harness: the pure arithmetic of mstar_kv.h (window schedules,
   decode spans, retention policies, skipped tokens) with wild int64 values.
   UBSan makes every signed overflow a finding; whatever a call returns with
   success must satisfy the documented definitions, and where the numbers
   are small a brute-force model (walking the windows or chunks one by one)
   must give the same answer. */
#define MSTAR_KV_IMPLEMENTATION
#include "fuzz_common.h"

#define FA_SMALL 4096   /* brute force below this many windows / chunks */

static void fa_window_rules(const mskv_schedule *s, int64_t k, const mskv_window *w) {
    FZ_CHECK(w->index == k, "index");
    FZ_CHECK(w->end - w->start == s->window, "window %lld: end - start != window", (long long)k);
    FZ_CHECK(w->start >= 0 && w->commit_start >= 0 && w->commit_start <= w->commit_end && w->commit_end <= s->total,
             "window %lld: commit span [%lld, %lld) outside [0, %lld)", (long long)k, (long long)w->commit_start,
             (long long)w->commit_end, (long long)s->total);
    FZ_CHECK(w->commit_end <= w->end && (k == 0 ? w->commit_start == 0 : w->commit_start == w->start + s->overlap),
             "window %lld: commit span vs window", (long long)k);
    FZ_CHECK(w->cond_start == w->start && w->cond_end == (k == 0 ? w->start : w->start + s->overlap), "conditioning span");
    FZ_CHECK(w->pad >= 0 && w->pad == (w->end > s->total ? w->end - s->total : 0), "pad");
    if (k == s->count - 1) FZ_CHECK(w->commit_end == s->total, "the last window does not reach the end");
    else FZ_CHECK(w->pad == 0, "padding before the last window");
}

static void fa_schedule(fz_in *in) {
    mskv_schedule s;
    mskv_window w, prev;
    mskv_decode_span ds;
    int64_t total = fz_wild64(in), window = fz_wild64(in), overlap = fz_wild64(in), ctx = fz_wild64(in), k, i;
    mskv_result r = mskv_schedule_init(&s, total, window, overlap);
    if (r != MSKV_SUCCESS) {
        FZ_CHECK(r == MSKV_ERROR_INVALID_SPEC || r == MSKV_ERROR_OVERFLOW || r == MSKV_ERROR_OUT_OF_RANGE,
                 "schedule_init: %s", mskv_result_string(r));
        FZ_CHECK(total < 0 || window < 1 || overlap < 0 || overlap >= window || r != MSKV_ERROR_INVALID_SPEC,
                 "a valid spec (%lld, %lld, %lld) refused", (long long)total, (long long)window, (long long)overlap);
        return;
    }
    FZ_CHECK(total >= 0 && window >= 1 && overlap >= 0 && overlap < window, "an invalid spec accepted");
    FZ_CHECK(s.stride == window - overlap && s.count >= (total > 0), "stride / count");
    /* a few windows anywhere, plus the first and the last */
    for (i = 0; i < 4; i++) {
        k = i == 0 ? 0 : i == 1 ? s.count - 1 : i == 2 ? fz_wild64(in) : (s.count > 0 ? (int64_t)(fz_raw(in, 8) % (uint64_t)s.count) : 0);
        r = mskv_schedule_window(&s, k, &w);
        if (k < 0 || k >= s.count) { FZ_CHECK(r == MSKV_ERROR_OUT_OF_RANGE, "window %lld of %lld", (long long)k, (long long)s.count); continue; }
        if (r != MSKV_SUCCESS) {
            /* only a window whose numbers do not fit may be refused */
            FZ_CHECK(r == MSKV_ERROR_OVERFLOW || r == MSKV_ERROR_OUT_OF_RANGE, "window %lld: %s", (long long)k, mskv_result_string(r));
            continue;
        }
        fa_window_rules(&s, k, &w);
        if (k > 0 && mskv_schedule_window(&s, k - 1, &prev) == MSKV_SUCCESS)
            FZ_CHECK(prev.commit_end == w.commit_start, "commit spans %lld and %lld leave a gap or overlap", (long long)k - 1, (long long)k);
        r = mskv_schedule_decode_span(&s, k, ctx, &ds);
        if (ctx < 0) { FZ_CHECK(r == MSKV_ERROR_INVALID_ARGUMENT, "negative ctx"); continue; }
        if (r != MSKV_SUCCESS) { FZ_CHECK(r == MSKV_ERROR_OVERFLOW || r == MSKV_ERROR_OUT_OF_RANGE, "decode span"); continue; }
        FZ_CHECK(ds.in_end == w.commit_end && ds.in_start >= 0 && ds.in_start <= w.commit_start &&
                 ds.trim == w.commit_start - ds.in_start && ds.trim <= ctx &&
                 (ds.trim == ctx || ds.in_start == 0), "decode span of window %lld", (long long)k);
    }
    /* brute force: walk every window of a small schedule */
    if (s.count <= FA_SMALL) {
        int64_t covered = 0;
        for (k = 0; k < s.count; k++) {
            FZ_CHECK(mskv_schedule_window(&s, k, &w) == MSKV_SUCCESS, "window %lld of a small schedule", (long long)k);
            FZ_CHECK(w.commit_start == covered, "commit spans do not tile [0, total) at window %lld", (long long)k);
            FZ_CHECK(w.commit_end > w.commit_start, "window %lld adds nothing", (long long)k);
            covered = w.commit_end;
        }
        FZ_CHECK(covered == total, "commit spans cover %lld of %lld", (long long)covered, (long long)total);
    }
}

/* The documented rule, one chunk at a time: the largest chunk multiple that
   may go (reset: all completed chunks past the sink; else all but the last
   window_chunks*chunk_size tokens). */
static int64_t fa_skip_model(const mskv_retention *r, int64_t n) {
    int64_t sink = r->sink_chunks * r->chunk_size, after, s = 0;
    if (n <= sink) return 0;
    after = n - sink;
    while (s + r->chunk_size <= after && (r->reset_at_boundary || after - (s + r->chunk_size) >= r->window_chunks * r->chunk_size))
        s += r->chunk_size;
    return s;
}

static void fa_retention(fz_in *in) {
    mskv_retention r;
    char why[128];
    int32_t page = fz_u8(in) < 200 ? (int32_t)(fz_u8(in) % 20) : fz_wild32(in);
    mskv_result v;
    int i;
    memset(&r, 0, sizeof r);
    if (fz_u8(in) < 128) {
        r.chunk_size = (int64_t)(fz_u8(in) % 9);
        r.sink_chunks = (int64_t)(fz_u8(in) % 4);
        r.window_chunks = (int64_t)(fz_u8(in) % 4);
        r.window_tokens = fz_u8(in) & 1 ? r.window_chunks * r.chunk_size : 0;
    } else {
        r.chunk_size = fz_wild64(in);
        r.sink_chunks = fz_wild64(in);
        r.window_chunks = fz_wild64(in);
        r.window_tokens = fz_wild64(in);
    }
    r.reset_at_boundary = fz_u8(in) < 200 ? fz_u8(in) & 1 : fz_wild32(in);
    r.exact = fz_u8(in) < 200 ? fz_u8(in) & 1 : fz_wild32(in);
    why[0] = '\0';
    v = mskv_retention_validate(&r, page, why, fz_u8(in) & 1 ? sizeof why : 0);
    FZ_CHECK(v == MSKV_SUCCESS || v == MSKV_ERROR_INVALID_SPEC || v == MSKV_ERROR_INVALID_ARGUMENT || v == MSKV_ERROR_OVERFLOW,
             "retention_validate: %s", mskv_result_string(v));
    if (v == MSKV_SUCCESS)
        FZ_CHECK(r.chunk_size > 0 && r.sink_chunks >= 0 && r.window_chunks >= 0 &&
                 (r.window_tokens == 0 || r.window_tokens == r.window_chunks * r.chunk_size), "an invalid policy accepted");
    for (i = 0; i < 4; i++) {
        int64_t n = i < 2 ? fz_wild64(in) : (int64_t)fz_raw(in, 2), got = -7, old;
        mskv_result g = mskv_skipped_tokens_get(&r, n, &got);
        old = mskv_skipped_tokens(&r, n);
        if (mskv_retention_validate(&r, 0, NULL, 0) != MSKV_SUCCESS || n < 0) {
            /* an invalid call is told apart from "nothing to skip" by both entry points */
            FZ_CHECK(g != MSKV_SUCCESS && got == -7 && old == (int64_t)g, "skipped tokens of an invalid call: %d, %lld",
                     (int)g, (long long)old);
            continue;
        }
        FZ_CHECK(g == MSKV_SUCCESS && old == got, "skipped_tokens_get: %s", mskv_result_string(g));
        FZ_CHECK(got >= 0 && got % r.chunk_size == 0, "skipped %lld is not a whole number of chunks", (long long)got);
        FZ_CHECK(got == 0 || r.sink_chunks * r.chunk_size + got <= n, "skipped past the computed tokens");
        if (r.chunk_size > 0 && n / r.chunk_size <= FA_SMALL) {
            int64_t want = fa_skip_model(&r, n);
            FZ_CHECK(got == want, "skipped_tokens(%lld) = %lld, the chunk-by-chunk model says %lld", (long long)n, (long long)got, (long long)want);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in;
    in.p = data;
    in.n = size;
    while (fz_more(&in)) {
        if (fz_u8(&in) & 1) fa_schedule(&in);
        else fa_retention(&in);
    }
    return 0;
}
