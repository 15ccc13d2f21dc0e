/* Regression tests for what the fuzzers of tests/fuzz found (outside the
   defects of issue 9, which have their own tests). Each failed before its
   fix under UBSan (tests-asan, or clang's where gcc's has no such check, as
   noted); the input that found it is also in the fuzzer's corpus, which
   make test replays under clang's sanitizers. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"
#include "mskv_mock_cuda.h"

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
