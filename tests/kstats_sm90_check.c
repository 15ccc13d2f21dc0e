/* The machine code of the sm_90a attention kernel (mskv_attn_sm90), checked
   on the CPU like tests/kstats_check.c checks mskv_attn: bench/kernel_stats.c
   compiles every variant through mskv_cuda_compile for sm_90a and reads the
   SASS back with nvdisasm / cuobjdump (PyPI packages, installed by
   tools/cuda_tools.sh; without them these tests skip and say so).
     every variant runs wgmma (HGMMA, no HMMA in its main loop), moves
       registers from the producer to the consumers (setmaxnreg 40 / 232 in
       the SASS: ptxas honoured it), and neither spills nor touches local memory;
     the consumer's main loop is one straight path;
     on the Wan chunk shape (4,680 queries x 32,760 keys x 12 heads, d128,
       bf16) the wgmma path issues at least 2x fewer instructions per FLOP
       than the sm_90 mma.sync kernel (main loops over every block and tile,
       the producer warp included; see kernel_stats.c). */
#define KSTATS_NO_MAIN
#include "../bench/kernel_stats.c"
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"

typedef struct kh_table {
    int done, have;
    char why[2100];
    ks_variant v[8], mma;
    ks_stats s[8], mma_s;
    int n;
} kh_table;

/* Measures the sm_90a variants and the sm_90 mma.sync prefill d128 bf16 once. */
static kh_table *kh_get(void) {
    static kh_table t;
    ks_env env;
    int i;
    if (t.done) return &t;
    t.done = 1;
    ks_env_init(&env);
    if (!env.have_tools) { snprintf(t.why, sizeof t.why, "%s", env.why); return &t; }
    t.n = ks_variants_sm90a(t.v, 8);
    for (i = 0; i < t.n; i++) {
        ks_measure(&t.v[i], env.cache, env.nvdisasm, env.cuobjdump, &t.s[i]);
        ks_print(stdout, &t.v[i], &t.s[i]);
        if (t.s[i].compiled == MSKV_ERROR_CUDA_UNAVAILABLE) {
            snprintf(t.why, sizeof t.why, "libnvrtc is not installed (mskv_cuda_compile: %s)",
                     mskv_result_string(t.s[i].compiled));
            return &t;
        }
    }
    memset(&t.mma, 0, sizeof t.mma);
    t.mma.kernel = "mskv_attn"; t.mma.arch = 90; t.mma.dtype = 2; t.mma.head_dim = 128;
    ks_measure(&t.mma, env.cache, env.nvdisasm, env.cuobjdump, &t.mma_s);
    ks_print(stdout, &t.mma, &t.mma_s);
    t.have = 1;
    return &t;
}

#define KH_NEED(t)                                   \
    do {                                             \
        if (!(t)->have) SKIP("%s", (t)->why);        \
    } while (0)

TEST(sm90a_every_variant_runs_hgmma_with_setmaxnreg_and_no_spills) {
    kh_table *t = kh_get();
    int i;
    KH_NEED(t);
    EXPECT_EQ(6, t->n);
    for (i = 0; i < t->n; i++) {
        const ks_stats *s = &t->s[i];
        const char *dt = ks_dtype_name(t->v[i].dtype);
        if (!s->ok) { mt_fail(__FILE__, __LINE__, "%s d%d: %s", dt, t->v[i].head_dim, s->why); continue; }
        if (!s->have_loop || s->loop_hgmma == 0 || s->loop_hmma != 0)
            mt_fail(__FILE__, __LINE__, "%s d%d: main loop with %d HGMMA and %d HMMA", dt, t->v[i].head_dim, s->loop_hgmma, s->loop_hmma);
        if (s->regs_producer != 40 || s->regs_consumer != 232)
            mt_fail(__FILE__, __LINE__, "%s d%d: setmaxnreg %d / %d in the SASS, want 40 / 232", dt, t->v[i].head_dim,
                    s->regs_producer, s->regs_consumer);
        if (s->spills != 0 || s->lmem_ops != 0 || s->local != 0)
            mt_fail(__FILE__, __LINE__, "%s d%d: spills %lld, %d LDL/STL, %d bytes local", dt, t->v[i].head_dim, s->spills,
                    s->lmem_ops, s->local);
    }
}

TEST(sm90a_consumer_main_loop_is_one_straight_path) {
    kh_table *t = kh_get();
    int i;
    KH_NEED(t);
    for (i = 0; i < t->n; i++) {
        const ks_stats *s = &t->s[i];
        if (!s->ok) continue;
        /* branches out of line (a spin-wait's retry) do not split the path */
        if (s->inner_loops != 0 || s->path_min != s->loop_insn || s->path_max != s->loop_insn)
            mt_fail(__FILE__, __LINE__, "%s d%d: %d inner loops, paths %d..%d of %d instructions", ks_dtype_name(t->v[i].dtype),
                    t->v[i].head_dim, s->inner_loops, s->path_min, s->path_max, s->loop_insn);
    }
}

TEST(wgmma_path_issues_at_least_2x_fewer_instructions_per_flop_than_mma_sync_on_the_wan_chunk) {
    kh_table *t = kh_get();
    int i;
    double w_mma, w_sm90 = 0;
    KH_NEED(t);
    ASSERT_TRUE(t->mma_s.ok);
    w_mma = ks_wan_insn_per_kflop(&t->mma, &t->mma_s);
    for (i = 0; i < t->n; i++)
        if (t->v[i].dtype == 2 && t->v[i].head_dim == 128) w_sm90 = ks_wan_insn_per_kflop(&t->v[i], &t->s[i]);
    printf("  Wan chunk, instructions per 1,000 FLOP: mma.sync (sm_90) %.3f, wgmma (sm_90a) %.3f: %.2fx\n", w_mma, w_sm90,
           w_sm90 > 0 ? w_mma / w_sm90 : 0.0);
    ASSERT_TRUE(w_sm90 > 0.0);
    if (!(w_mma >= 2.0 * w_sm90))
        mt_fail(__FILE__, __LINE__, "wgmma %.3f vs mma.sync %.3f instructions per 1,000 FLOP: %.2fx, want >= 2x", w_sm90, w_mma,
                w_mma / w_sm90);
}

/* ---- the analysis, on a listing written here (no tools needed) ---- */

static const char kh_listing[] =
    ".text.k:\n"
    "        /*0000*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;\n"
    ".L_x_1:\n"
    "        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x28000], R2 ;\n"
    "        /*0020*/              @!P0 BRA `(.L_x_9) ;\n"
    ".L_x_2:\n"
    "        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24 ;\n"
    "        /*0040*/                   HGMMA.64x136x16.F32.BF16 R88, R20, gdesc[UR20].tnspB, R88, gsb0 ;\n"
    "        /*0050*/                   FMUL R1, R1, R2 ;\n"
    "        /*0060*/              @!P1 BRA `(.L_x_1) ;\n"
    "        /*0070*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;\n"
    "        /*0080*/                   EXIT ;\n"
    ".L_x_9:\n"
    "        /*0090*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x28000], R2 ;\n"
    "        /*00a0*/              @!P0 BRA `(.L_x_9) ;\n"
    "        /*00b0*/                   BRA `(.L_x_2) ;\n";

TEST(kstats_counts_hgmma_flop_and_setmaxnreg_and_skips_out_of_line_waits) {
    ks_sass s;
    ks_stats st;
    memset(&st, 0, sizeof st);
    ASSERT_TRUE(ks_sass_parse(kh_listing, "k", &s));
    ks_loop_stats(&s, &st);
    EXPECT_EQ(1, st.have_loop);
    EXPECT_EQ(6, st.loop_insn);       /* .L_x_1 .. its back-edge; not the stub's jump back to .L_x_2 */
    EXPECT_EQ(2, st.loop_hgmma);
    EXPECT_EQ(0, st.loop_hmma);
    EXPECT_NEAR(2.0 * 64 * 128 * 16 / 4 + 2.0 * 64 * 136 * 16 / 4, st.loop_flop, 1e-9);   /* a warp's share */
    EXPECT_EQ(232, st.regs_consumer);
    EXPECT_EQ(40, st.regs_producer);
    EXPECT_EQ(6, st.path_min);
    EXPECT_EQ(6, st.path_max);
    ks_sass_free(&s);
}

TEST(kstats_lists_the_sm90a_variants_apart_from_the_mma_sync_ones) {
    ks_variant v[64];
    int n = ks_variants(90, 1, 0, v, 64), i;
    EXPECT_EQ(12, n);   /* f16/bf16 x d64/128/256 x prefill/decode: tests/kstats_check.c's targets */
    for (i = 0; i < n; i++) EXPECT_TRUE(strcmp(v[i].kernel, "mskv_attn") == 0 && !v[i].sm90a);
    n = ks_variants_sm90a(v, 64);
    EXPECT_EQ(6, n);
    for (i = 0; i < n; i++) EXPECT_TRUE(strcmp(v[i].kernel, "mskv_attn_sm90") == 0 && v[i].sm90a && v[i].arch == 90);
}
