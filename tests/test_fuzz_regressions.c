/* Regression tests for what the fuzzers of tests/fuzz found (outside the
   defects of issue 9, which have their own tests). Each failed before its
   fix under UBSan (tests-asan, or clang's where gcc's has no such check, as
   noted); the input that found it is also in the fuzzer's corpus, which
   make test replays under clang's sanitizers.
   Since issue 20 the fuzz runner (tests/fuzz/run.sh) copies every finding
   into tests/fuzz/regressions/NAME/, and the first test below replays each
   committed file there through its harness (build/fuzz-NAME, clang's ASan
   and UBSan), so a finding stays a test even before it has one by hand. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L   /* popen, dirent */
#endif
#include <stdlib.h>
#include <stdio.h>
#ifndef _WIN32
#include <dirent.h>
#endif
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"
#include "mskv_mock_cuda.h"

/* Every committed finding of tests/fuzz/regressions/NAME, replayed once
   through build/fuzz-NAME (libFuzzer runs each file given as an argument
   once and exits non-zero on a crash or sanitizer report). $B names the
   build directory as for make (default build). The replay must say it ran
   each file, and the plans directory must hold at least the seed-18118
   RoPE finding, so the test cannot pass by finding nothing. */
#ifndef _WIN32
#define TFR_MAX_FILES 256
typedef struct tfr_dir { int n; char path[TFR_MAX_FILES][800]; } tfr_dir;
static void tfr_root(char *out, size_t cap, const char *rel) {
    const char *f = __FILE__, *slash = strrchr(f, '/');
    if (slash) snprintf(out, cap, "%.*s/../%s", (int)(slash - f), f, rel);
    else snprintf(out, cap, "../%s", rel);
}
static int tfr_list(const char *dir, tfr_dir *out) {
    DIR *d = opendir(dir);
    struct dirent *e;
    out->n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL && out->n < TFR_MAX_FILES) {
        if (e->d_name[0] == '.' || strchr(e->d_name, '\'') != NULL) continue;
        snprintf(out->path[out->n++], sizeof out->path[0], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    return 0;
}
#endif

TEST(fuzz_regressions_every_committed_finding_replays_clean_through_its_harness) {
#ifdef _WIN32
    SKIP("the libFuzzer harnesses are built for Linux only (clang -fsanitize=fuzzer)");
#else
    static const char *names[] = { "import", "ops", "plans", "arith" };
    static tfr_dir files;
    char dir[512], bin[512], rel[128], line[1024], last[8][256];
    const char *b = getenv("B");
    size_t k, cmd_len;
    int i, missing = 0, ran = 0, replayed = 0, plans_files = 0;
    for (k = 0; k < sizeof names / sizeof names[0]; k++) {
        char *cmd;
        FILE *p;
        int executed = 0, nlast = 0, status;
        snprintf(rel, sizeof rel, "tests/fuzz/regressions/%s", names[k]);
        tfr_root(dir, sizeof dir, rel);
        if (tfr_list(dir, &files) != 0 || files.n == 0) continue;
        if (k == 2) plans_files = files.n;
        if (b && b[0] == '/') snprintf(bin, sizeof bin, "%.400s/fuzz-%s", b, names[k]);
        else {
            snprintf(rel, sizeof rel, "%.100s/fuzz-%s", b && b[0] ? b : "build", names[k]);
            tfr_root(bin, sizeof bin, rel);
        }
        p = fopen(bin, "rb");
        if (!p) { missing++; continue; }
        fclose(p);
        cmd_len = strlen(bin) + 64 + (size_t)files.n * (sizeof files.path[0] + 3);
        cmd = (char *)malloc(cmd_len);
        ASSERT_TRUE(cmd != NULL);
        snprintf(cmd, cmd_len, "'%s' -timeout=60 -rss_limit_mb=2048", bin);
        for (i = 0; i < files.n; i++) {
            strcat(cmd, " '");
            strcat(cmd, files.path[i]);
            strcat(cmd, "'");
        }
        strcat(cmd, " 2>&1");
        p = popen(cmd, "r");
        free(cmd);
        ran++;
        ASSERT_TRUE(p != NULL);
        while (fgets(line, sizeof line, p)) {
            if (strncmp(line, "Executed ", 9) == 0) executed++;
            snprintf(last[nlast++ % 8], sizeof last[0], "%.250s", line);
        }
        status = pclose(p);
        if (status != 0 || executed != files.n) {
            printf("  fuzz-%s over %s: exit status %d, %d of %d inputs executed; its last lines:\n", names[k], dir, status, executed, files.n);
            for (i = nlast > 8 ? nlast - 8 : 0; i < nlast; i++) printf("    %s", last[i % 8]);
        }
        EXPECT_EQ(0, status);
        EXPECT_EQ(files.n, executed);
        replayed += executed;
    }
    EXPECT_TRUE(plans_files >= 1);   /* at least rope-widths-wrap-seed18118 */
    if (missing && !ran) SKIP("the fuzz harnesses are not built (make %s/fuzz-plans ...): no finding replayed", b && b[0] ? b : "build");
    if (missing) printf("  note: %d harness(es) with committed findings not built; %d findings replayed\n", missing, replayed);
#endif
}

/* fuzz_plans: a plan without page ids may have kv_indices == NULL; the
   attention took kv_indices + kv_indptr[b] anyway (NULL + 0 is undefined in
   C). Only clang's UBSan reports it: this fails before the fix in a clang
   -fsanitize=undefined build, not in tests-asan (gcc). */
TEST(cpu_attention_over_a_plan_without_page_ids_computes_no_pointer_from_null) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_plan p;
    mskv_attn at;
    int32_t qo[2] = { 0, 2 }, kvp[2] = { 0, 0 }, kvl[1] = { 0 };
    float q[2 * 4], o[2 * 4], lse[2];
    int i;
    memset(&d, 0, sizeof d);
    d.num_pages = 4; d.page_size = 2; d.num_layers = 1; d.kv_heads = 1; d.head_dim = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    memset(&p, 0, sizeof p);
    p.batch = 1; p.total_q = 2; p.page_size = 2;
    p.qo_indptr = qo; p.kv_indptr = kvp; p.kv_len = kvl; p.kv_indices = NULL;
    memset(&at, 0, sizeof at);
    at.q_heads = 1;
    for (i = 0; i < 8; i++) { q[i] = 1.0f; o[i] = 7.0f; }
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, 0, &p, &at, q, o, lse));
    for (i = 0; i < 8; i++) EXPECT_EQ(0, (int)o[i]);          /* no key: o = 0 */
    EXPECT_TRUE(lse[0] == -INFINITY && lse[1] == -INFINITY);  /* and lse = -inf */
    mskv_arena_destroy(a);
}

/* fuzz_plans: mskv_cuda_plan_upload measured the longest segment (for graph
   replay) from qo_indptr steps it had not checked; a step past int32
   (qo_indptr {-2^31 + 1, 2}) overflowed. Upload now checks the table a
   replayed graph trusts (h9-core): such a plan is refused, with no
   arithmetic on it first. */
TEST(cuda_plan_upload_refuses_a_plan_whose_query_steps_do_not_fit_int32) {
    mskv_cuda_functions fn = mmc_table();
    mskv_cuda_desc cd;
    mskv_cuda_store_desc sd;
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_cuda_dplan dp;
    mskv_plan p;
    int32_t qo[2] = { INT32_MIN + 1, 2 }, kvp[2] = { 0, 0 }, kvl[1] = { 0 }, last[1] = { 0 }, split[1] = { 0 }, shift[1] = { 0 };
    int64_t tok[2] = { 0, 0 };
    mmc_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    memset(&sd, 0, sizeof sd);
    sd.num_pages = 8; sd.page_size = 4; sd.num_layers = 1; sd.kv_heads = 1; sd.head_dim = 64;
    sd.dtype = MSKV_DTYPE_F16; sd.max_batch = 4; sd.max_tokens = 16; sd.max_page_ids = 16; sd.staging_bytes = 1 << 16;
    if (mskv_cuda_store_create(cu, &sd, &st) != MSKV_SUCCESS) {
        mskv_cuda_destroy(cu);
        ASSERT_TRUE(!"mock store");
    }
    memset(&p, 0, sizeof p);
    p.batch = 1; p.total_q = 0; p.page_size = 4;
    p.qo_indptr = qo; p.kv_indptr = kvp; p.kv_len = kvl; p.kv_last_page_len = last;
    p.kv_pos_split = split; p.kv_pos_shift = shift; p.kv_token_indptr = tok;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(st, &p, MSKV_POS_NONE, &dp));
    qo[0] = 0; qo[1] = INT32_MAX;   /* from 0, but past total_q */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(st, &p, MSKV_POS_NONE, &dp));
    qo[1] = 0;                      /* the same plan made consistent uploads */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &p, MSKV_POS_NONE, &dp));
    EXPECT_EQ(1, dp.batch);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
    EXPECT_TRUE(mmc_nothing_live());
}

/* fuzz_plans, seed 18118 (issue 20; the input is
   tests/fuzz/regressions/plans/rope-widths-wrap-seed18118): a 3-D RoPE of
   widths {8, 2^31 - 2, 2^31 - 2} summed in int32 to 4 (signed overflow),
   passed the head_dim check, and the angle table on the stack (head_dim / 2
   entries) was written for 2^31 pairs. Each width is now checked against
   what is left of the head before it is added. Fails before the fix under
   UBSan (tests-asan), and segfaults in a plain -O2 build. */
static void tfr_wrap_rope(mskv_rope *r, int32_t d0, int32_t d1, int32_t d2) {
    memset(r, 0, sizeof *r);
    r->style = MSKV_ROPE_HALF;
    r->mode = MSKV_POS_3D;
    r->dims[0] = d0; r->dims[1] = d1; r->dims[2] = d2;
}

TEST(rope_widths_whose_int32_sum_wraps_are_refused_by_rope_apply_with_no_write) {
    /* the sums that wrap: to 4 (<= head_dim), to a negative, to exactly head_dim */
    static const int32_t bad[][3] = {
        { 8, INT32_MAX - 1, INT32_MAX - 1 }, { 2, INT32_MAX - 1, INT32_MAX - 1 },
        { 8, INT32_MAX - 1, INT32_MAX - 3 }, { 0, INT32_MAX - 1, 2 }, { 4, 2, 4 },
    };
    mskv_rope r;
    float x[2 * 8], x0[2 * 8];
    int32_t pos[2 * 3] = { 1, 2, 3, 4, 5, 6 };
    size_t i;
    for (i = 0; i < 16; i++) x[i] = x0[i] = (float)i + 0.5f;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tfr_wrap_rope(&r, bad[i][0], bad[i][1], bad[i][2]);
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 2, 1, 8, pos));
        EXPECT_TRUE(memcmp(x, x0, sizeof x) == 0);
    }
    /* widths that fill the head exactly still rotate */
    tfr_wrap_rope(&r, 4, 2, 2);
    EXPECT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 2, 1, 8, pos));
    EXPECT_TRUE(memcmp(x, x0, sizeof x) != 0);
}

TEST(rope_widths_whose_int32_sum_wraps_are_refused_by_write_kv_and_write_kv_pools_with_no_write) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_plan p;
    mskv_pools pools;
    mskv_rope r;
    int64_t slots[2] = { 2, 3 };   /* page 1 (page 0 is the null page) */
    int32_t pos[2 * 3] = { 1, 2, 3, 4, 5, 6 };
    float k[2 * 8], v[2 * 8], kp[4 * 2 * 8], vp[4 * 2 * 8], snap[4 * 2 * 8];
    size_t pool_bytes = 4 * 2 * 8 * sizeof(float), i;
    uint64_t dg;
    void *ak, *av;
    memset(&d, 0, sizeof d);
    d.num_pages = 4; d.page_size = 2; d.num_layers = 1; d.kv_heads = 1; d.head_dim = 8;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ak = mskv_store_pool(a, 0, 0);
    av = mskv_store_pool(a, 0, 1);
    ASSERT_TRUE(ak != NULL && av != NULL);
    memset(&p, 0, sizeof p);
    p.batch = 0; p.total_q = 2; p.page_size = 2;
    p.slot_mapping = slots; p.positions = pos;
    for (i = 0; i < 16; i++) { k[i] = (float)i + 1.0f; v[i] = -(float)i; }
    memcpy(snap, ak, pool_bytes);
    dg = mskv_arena_digest(a);
    tfr_wrap_rope(&r, 8, INT32_MAX - 1, INT32_MAX - 1);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv(a, 0, &p, k, v, MSKV_DTYPE_F32, &r));
    EXPECT_TRUE(memcmp(ak, snap, pool_bytes) == 0 && memcmp(av, snap, pool_bytes) == 0);
    EXPECT_EQ(dg, mskv_arena_digest(a));
    tfr_wrap_rope(&r, 2, INT32_MAX - 1, INT32_MAX - 1);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv(a, 0, &p, k, v, MSKV_DTYPE_F32, &r));
    EXPECT_TRUE(memcmp(ak, snap, pool_bytes) == 0 && memcmp(av, snap, pool_bytes) == 0);
    /* the raw-pools form (also with a source dtype to convert from) */
    memset(kp, 0, sizeof kp); memset(vp, 0, sizeof vp);
    memset(&pools, 0, sizeof pools);
    pools.k = kp; pools.v = vp; pools.dtype = MSKV_DTYPE_F32;
    pools.num_pages = 4; pools.page_size = 2; pools.kv_heads = 1; pools.head_dim = 8;
    tfr_wrap_rope(&r, 8, INT32_MAX - 1, INT32_MAX - 1);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv_pools(&pools, &p, k, v, MSKV_DTYPE_F32, &r));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv_pools(&pools, &p, k, v, MSKV_DTYPE_BF16, &r));
    for (i = 0; i < 4 * 2 * 8; i++) EXPECT_TRUE(kp[i] == 0.0f && vp[i] == 0.0f);
    /* the same calls with widths that fit write both rows */
    tfr_wrap_rope(&r, 4, 2, 2);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&pools, &p, k, v, MSKV_DTYPE_F32, &r));
    EXPECT_TRUE(vp[2 * 8] == v[0] && vp[3 * 8 + 7] == v[15]);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, 0, &p, k, v, MSKV_DTYPE_F32, &r));
    EXPECT_TRUE(memcmp((float *)av + 2 * 8, v, sizeof v) == 0);
    mskv_arena_destroy(a);
}

/* The GPU layer's check of the same widths (mskv__cuda_check_rope, for
   mskv_cuda_rope and mskv_cuda_write_kv): it bounded each width by head_dim
   first, so its sum could not wrap; now each is bounded by what is left, as
   on the CPU. A guard, not a regression: this passed before. */
TEST(cuda_rope_refuses_widths_whose_int32_sum_would_wrap_and_launches_nothing) {
    static const int32_t bad[][3] = {
        { 8, INT32_MAX - 1, INT32_MAX - 1 }, { 2, INT32_MAX - 1, INT32_MAX - 1 }, { 32, 32, 2 }, { -2, 2, 2 },
    };
    mskv_cuda_functions fn = mmc_table();
    mskv_cuda_desc cd;
    mskv_cuda_store_desc sd;
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_cu_ptr x = 0, pos = 0;
    mskv_rope r;
    long launches;
    size_t i;
    mmc_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;
    cd.disable_disk_cache = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    memset(&sd, 0, sizeof sd);
    sd.num_pages = 8; sd.page_size = 4; sd.num_layers = 1; sd.kv_heads = 1; sd.head_dim = 64;
    sd.dtype = MSKV_DTYPE_F16; sd.max_batch = 4; sd.max_tokens = 16; sd.max_page_ids = 16; sd.staging_bytes = 1 << 16;
    if (mskv_cuda_store_create(cu, &sd, &st) != MSKV_SUCCESS) {
        mskv_cuda_destroy(cu);
        ASSERT_TRUE(!"mock store");
    }
    if (mskv_cuda_malloc(cu, 4 * 64 * 2, &x) != MSKV_SUCCESS || mskv_cuda_malloc(cu, 4 * 3 * 4, &pos) != MSKV_SUCCESS) {
        mskv_cuda_store_destroy(st);
        mskv_cuda_destroy(cu);
        ASSERT_TRUE(!"mock malloc");
    }
    launches = mmc.launches;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tfr_wrap_rope(&r, bad[i][0], bad[i][1], bad[i][2]);
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_rope(st, &r, x, 4, 1, pos));
    }
    EXPECT_EQ(launches, mmc.launches);
    mskv_cuda_free(cu, x);
    mskv_cuda_free(cu, pos);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
    EXPECT_TRUE(mmc_nothing_live());
}
