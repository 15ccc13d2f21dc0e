/* Window schedules and chunk-window retention: pure arithmetic, checked
   exhaustively over small parameter grids against definitions written out
   independently of the library. */
#include "mskv_test.h"
#include "../mstar_kv.h"

/* Every (total, window, overlap) with total <= 200, window <= 24 is walked
   once; the callback checks one property per test. */
typedef int (*mtw_check_fn)(const mskv_schedule *s, int64_t total, int64_t window, int64_t overlap);

static void mtw_for_all(mtw_check_fn check) {
    int64_t total, window, overlap;
    for (total = 1; total <= 200; total++)
        for (window = 1; window <= 24; window++)
            for (overlap = 0; overlap < window; overlap++) {
                mskv_schedule s;
                mskv_result r = mskv_schedule_init(&s, total, window, overlap);
                if (r != MSKV_SUCCESS) {
                    mt_fail(__FILE__, __LINE__, "schedule_init(%lld, %lld, %lld) = %d",
                            (long long)total, (long long)window, (long long)overlap, (int)r);
                    return;
                }
                if (!check(&s, total, window, overlap)) {
                    mt_fail(__FILE__, __LINE__, "first failure at total %lld window %lld overlap %lld",
                            (long long)total, (long long)window, (long long)overlap);
                    return;
                }
            }
}

/* The fewest windows whose commit spans reach total. */
static int64_t mtw_expected_count(int64_t total, int64_t window, int64_t stride) {
    if (total <= window) return 1;
    return 1 + (total - window + stride - 1) / stride;
}

static int mtw_check_fields(const mskv_schedule *s, int64_t total, int64_t window, int64_t overlap) {
    return s->total == total && s->window == window && s->overlap == overlap &&
           s->stride == window - overlap &&
           s->count == mtw_expected_count(total, window, window - overlap);
}

TEST(schedule_stride_is_window_minus_overlap_and_count_is_minimal) {
    mtw_for_all(mtw_check_fields);
}

static int mtw_check_extent(const mskv_schedule *s, int64_t total, int64_t window, int64_t overlap) {
    int64_t k;
    (void)overlap;
    for (k = 0; k < s->count; k++) {
        mskv_window w;
        if (mskv_schedule_window(s, k, &w) != MSKV_SUCCESS) return 0;
        if (w.index != k || w.start != k * s->stride || w.end != w.start + window) return 0;
        /* only the last window may pass the end, and it says by how much */
        if (k < s->count - 1 && (w.end > total || w.pad != 0)) return 0;
        if (k == s->count - 1 && (w.end < total || w.pad != w.end - total)) return 0;
    }
    return 1;
}

TEST(schedule_window_k_denoises_k_stride_plus_window_and_only_the_last_pads) {
    mtw_for_all(mtw_check_extent);
}

static int mtw_check_tiling(const mskv_schedule *s, int64_t total, int64_t window, int64_t overlap) {
    int64_t k, next = 0;
    (void)window; (void)overlap;
    for (k = 0; k < s->count; k++) {
        mskv_window w;
        if (mskv_schedule_window(s, k, &w) != MSKV_SUCCESS) return 0;
        if (w.commit_start != next) return 0;          /* no gap, no overlap */
        if (w.commit_end <= w.commit_start) return 0;  /* every window adds something */
        if (w.commit_end > total) return 0;
        if (w.commit_start < w.start || w.commit_end > w.end) return 0;
        next = w.commit_end;
    }
    return next == total;
}

TEST(schedule_commit_spans_tile_zero_to_total_exactly) {
    mtw_for_all(mtw_check_tiling);
}

static int mtw_check_conditioning(const mskv_schedule *s, int64_t total, int64_t window, int64_t overlap) {
    int64_t k;
    mskv_window prev;
    (void)total; (void)window;
    memset(&prev, 0, sizeof prev);
    for (k = 0; k < s->count; k++) {
        mskv_window w;
        if (mskv_schedule_window(s, k, &w) != MSKV_SUCCESS) return 0;
        if (k == 0) {
            if (w.cond_start != w.cond_end) return 0;
            if (w.commit_start != w.start) return 0;
        } else {
            /* the leading overlap is the previous window's tail, not committed again */
            if (w.cond_start != w.start || w.cond_end != w.start + overlap) return 0;
            if (w.cond_end != prev.end || w.cond_start < prev.start) return 0;
            if (w.commit_start != w.cond_end) return 0;
        }
        prev = w;
    }
    return 1;
}

TEST(schedule_conditioning_is_the_previous_windows_tail_and_empty_for_window_zero) {
    mtw_for_all(mtw_check_conditioning);
}

static int mtw_check_decode(const mskv_schedule *s, int64_t total, int64_t window, int64_t overlap) {
    int64_t k, ctx;
    (void)total; (void)window; (void)overlap;
    for (ctx = 0; ctx <= 5; ctx++)
        for (k = 0; k < s->count; k++) {
            mskv_window w;
            mskv_decode_span d;
            int64_t want_start;
            if (mskv_schedule_window(s, k, &w) != MSKV_SUCCESS) return 0;
            if (mskv_schedule_decode_span(s, k, ctx, &d) != MSKV_SUCCESS) return 0;
            want_start = w.commit_start - ctx < 0 ? 0 : w.commit_start - ctx;
            if (d.in_start != want_start || d.in_end != w.commit_end) return 0;
            if (d.trim != w.commit_start - d.in_start) return 0;
        }
    return 1;
}

TEST(schedule_decode_span_adds_up_to_ctx_units_of_left_context_and_trims_them) {
    mtw_for_all(mtw_check_decode);
}

TEST(schedule_window_index_out_of_range_is_rejected) {
    mskv_schedule s;
    mskv_window w;
    mskv_decode_span d;
    ASSERT_EQ(MSKV_SUCCESS, mskv_schedule_init(&s, 100, 16, 4));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_window(&s, s.count, &w));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_window(&s, -1, &w));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_schedule_decode_span(&s, s.count, 2, &d));
    EXPECT_EQ(MSKV_SUCCESS, mskv_schedule_window(&s, s.count - 1, &w));
}

TEST(schedule_rejects_overlap_not_below_window_and_empty_window) {
    mskv_schedule s;
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 100, 8, 8));
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 100, 8, 9));
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 100, 8, -1));
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_schedule_init(&s, 100, 0, 0));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_schedule_init(NULL, 100, 8, 2));
}

/* ---- chunk-window retention ---- */

/* Brute force: which tokens of [0, n) does the policy keep?  The sink is
   kept; a later token goes when its whole chunk lies before the window
   (sliding mode), or once its chunk is complete (reset mode). */
static int mtw_keeps(const mskv_retention *r, int64_t n, int64_t t) {
    int64_t C = r->chunk_size, sink = r->sink_chunks * C, W = r->window_chunks * C;
    int64_t chunk_end = (t / C + 1) * C;
    if (t < sink) return 1;
    if (r->reset_at_boundary) return chunk_end > n;
    return chunk_end > n - W;
}

TEST(skipped_tokens_equals_the_tokens_a_window_plus_sink_policy_drops) {
    int64_t C, S, Wc, n;
    int reset;
    for (reset = 0; reset <= 1; reset++)
        for (C = 1; C <= 7; C++)
            for (S = 0; S <= 3; S++)
                for (Wc = 0; Wc <= 4; Wc++) {   /* 0: only the sink, in both modes */
                    mskv_retention r;
                    memset(&r, 0, sizeof r);
                    r.chunk_size = C; r.sink_chunks = S; r.window_chunks = Wc;
                    r.window_tokens = (Wc & 1) ? 0 : Wc * C;  /* 0 = derived: both forms */
                    r.reset_at_boundary = reset;
                    for (n = 0; n <= (S + Wc + 6) * C + 3; n++) {
                        int64_t t, dropped = 0, first_kept_after_sink = n;
                        int64_t sink = S * C, got = mskv_skipped_tokens(&r, n);
                        for (t = 0; t < n; t++) {
                            if (!mtw_keeps(&r, n, t)) dropped++;
                            else if (t >= sink && t < first_kept_after_sink) first_kept_after_sink = t;
                        }
                        /* the brute-force kept set must be [0,sink) + [sink+skipped, n) */
                        if (dropped && first_kept_after_sink != (n < sink ? n : sink) + dropped) {
                            mt_fail(__FILE__, __LINE__, "brute force not contiguous (test bug)");
                            return;
                        }
                        if (mskv_skipped_tokens_get(&r, n, &t) != MSKV_SUCCESS || t != got) {
                            mt_fail(__FILE__, __LINE__, "mskv_skipped_tokens_get disagrees at n %lld", (long long)n);
                            return;
                        }
                        if (got != dropped) {
                            mt_fail(__FILE__, __LINE__,
                                    "skipped_tokens(chunk %lld sink %lld window %lld reset %d, n %lld): expected %lld, got %lld",
                                    (long long)C, (long long)S, (long long)Wc, reset, (long long)n,
                                    (long long)dropped, (long long)got);
                            return;
                        }
                    }
                }
}

TEST(skipped_tokens_is_a_whole_number_of_chunks) {
    mskv_retention r;
    int64_t n;
    memset(&r, 0, sizeof r);
    r.chunk_size = 5; r.sink_chunks = 1; r.window_chunks = 2;
    for (n = 0; n < 200; n++) EXPECT_EQ(0, mskv_skipped_tokens(&r, n) % 5);
    r.reset_at_boundary = 1;
    for (n = 0; n < 200; n++) EXPECT_EQ(0, mskv_skipped_tokens(&r, n) % 5);
}

/* 0 means "nothing to skip"; an invalid policy is an error, never 0 */
TEST(skipped_tokens_of_an_invalid_policy_is_an_error_not_zero) {
    mskv_retention r;
    int64_t out = 12345;
    memset(&r, 0, sizeof r);
    r.chunk_size = 0; r.sink_chunks = 1; r.window_chunks = 2;
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_skipped_tokens_get(&r, 1000, &out));
    EXPECT_EQ(12345, out);   /* untouched on failure */
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_skipped_tokens(&r, 1000));
    r.chunk_size = 4; r.window_tokens = 9;  /* != 2 * 4 */
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_skipped_tokens_get(&r, 1000, &out));
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_skipped_tokens(&r, 1000));
    r.window_tokens = 8;  /* the same policy made valid does skip */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_skipped_tokens_get(&r, -1, &out));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_skipped_tokens(&r, -1));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_skipped_tokens_get(NULL, 1000, &out));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_skipped_tokens_get(&r, 1000, NULL));
    EXPECT_EQ(MSKV_SUCCESS, mskv_skipped_tokens_get(&r, 1000, &out));
    EXPECT_EQ(1000 - 4 - 8, out);
    EXPECT_EQ(out, mskv_skipped_tokens(&r, 1000));
    EXPECT_EQ(MSKV_SUCCESS, mskv_skipped_tokens_get(&r, 10, &out));   /* a valid zero */
    EXPECT_EQ(0, out);
}

static int mtw_nonempty(const char *s) { return s[0] != '\0'; }

TEST(retention_validation_rejects_zero_chunk_size_with_a_message) {
    mskv_retention r;
    char why[256];
    memset(&r, 0, sizeof r);
    r.sink_chunks = 1; r.window_chunks = 2;
    why[0] = '\0';
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 16, why, sizeof why));
    EXPECT_TRUE(mtw_nonempty(why));
}

TEST(retention_validation_rejects_window_tokens_not_window_chunks_times_chunk) {
    mskv_retention r;
    char why[256];
    memset(&r, 0, sizeof r);
    r.chunk_size = 16; r.sink_chunks = 1; r.window_chunks = 2; r.window_tokens = 33;
    why[0] = '\0';
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 16, why, sizeof why));
    EXPECT_TRUE(mtw_nonempty(why));
    r.window_tokens = 32;
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&r, 16, why, sizeof why));
    r.window_tokens = 0;  /* derived */
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&r, 16, why, sizeof why));
}

TEST(retention_validation_exact_needs_page_aligned_chunks_and_sink) {
    mskv_retention r;
    char why[256];
    memset(&r, 0, sizeof r);
    r.chunk_size = 1560; r.sink_chunks = 1; r.window_chunks = 3; r.exact = 1;
    why[0] = '\0';
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 16, why, sizeof why));  /* 1560 % 16 = 8 */
    EXPECT_TRUE(mtw_nonempty(why));
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&r, 8, why, sizeof why));
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&r, 0, why, sizeof why));  /* 0 = no alignment rules */
    r.exact = 0;  /* inexact eviction accepts any page size */
    EXPECT_EQ(MSKV_SUCCESS, mskv_retention_validate(&r, 16, why, sizeof why));
}

TEST(retention_validation_message_fits_a_small_buffer) {
    mskv_retention r;
    char why[8];
    memset(&r, 0, sizeof r);
    memset(why, 'x', sizeof why);
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 16, why, sizeof why));
    EXPECT_TRUE(memchr(why, '\0', sizeof why) != NULL);
    EXPECT_EQ(MSKV_ERROR_INVALID_SPEC, mskv_retention_validate(&r, 16, NULL, 0));
}
