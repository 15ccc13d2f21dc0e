/* The machine-code targets of the attention kernel, checked on the CPU:
   bench/kernel_stats.c compiles every sm_90 attention variant through
   mskv_cuda_compile and reads the SASS back with nvdisasm / cuobjdump (PyPI
   packages, installed by tools/cuda_tools.sh; without them these tests skip
   and say so). Targets (sm_90, head_dim 128, f16 and bf16):
     prefill main loop <= 4.5 instructions and <= 200 shared bytes per HMMA,
     decode main loop: integer arithmetic <= 15% of its instructions,
     no variant spills or touches local memory.
   HMMA counts here leave out the row-sum mma (P times a ones matrix, one per
   32 of the attention's own; see kernels.cu), so they count only the FLOPs
   of Q K^T and P V. */
#define KSTATS_NO_MAIN
#include "../bench/kernel_stats.c"
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"

typedef struct kc_table {
    int done, have;
    char why[2100];
    ks_variant v[16];
    ks_stats s[16];
    int n;
} kc_table;

/* Measures the sm_90 attention variants once for all the tests. */
static kc_table *kc_get(void) {
    static kc_table t;
    ks_env env;
    int i;
    if (t.done) return &t;
    t.done = 1;
    ks_env_init(&env);
    if (!env.have_tools) { snprintf(t.why, sizeof t.why, "%s", env.why); return &t; }
    t.n = ks_variants(90, 1, 0, t.v, 16);
    for (i = 0; i < t.n; i++) {
        ks_measure(&t.v[i], env.cache, env.nvdisasm, env.cuobjdump, &t.s[i]);
        ks_print(stdout, &t.v[i], &t.s[i]);
        if (t.s[i].compiled == MSKV_ERROR_CUDA_UNAVAILABLE) {
            snprintf(t.why, sizeof t.why, "libnvrtc is not installed (mskv_cuda_compile: %s)",
                     mskv_result_string(t.s[i].compiled));
            return &t;
        }
    }
    t.have = 1;
    return &t;
}

#define KC_NEED(t)                                   \
    do {                                             \
        if (!(t)->have) SKIP("%s", (t)->why);        \
    } while (0)

static double kc_attn_hmma(const ks_stats *s) { return s->loop_hmma - s->loop_hmma / 33.0; }

TEST(kstats_finds_one_branch_free_key_loop_in_every_attention_variant) {
    kc_table *t = kc_get();
    int i;
    KC_NEED(t);
    for (i = 0; i < t->n; i++) {
        const ks_stats *s = &t->s[i];
        if (!s->ok) { mt_fail(__FILE__, __LINE__, "d%d %s: %s", t->v[i].head_dim, t->v[i].decode ? "decode" : "prefill", s->why); continue; }
        /* the static count is the issued count only for a straight loop */
        if (!s->have_loop || s->loop_hmma == 0 || s->loop_branches != 0 || s->inner_loops != 0 ||
            s->path_min != s->loop_insn || s->path_max != s->loop_insn)
            mt_fail(__FILE__, __LINE__, "%s d%d %s: loop hmma %d branches %d inner %d paths %d..%d of %d",
                    ks_dtype_name(t->v[i].dtype), t->v[i].head_dim, t->v[i].decode ? "decode" : "prefill", s->loop_hmma,
                    s->loop_branches, s->inner_loops, s->path_min, s->path_max, s->loop_insn);
    }
}

TEST(prefill_d128_main_loop_issues_at_most_4_5_instructions_per_hmma) {
    kc_table *t = kc_get();
    int i, seen = 0;
    KC_NEED(t);
    for (i = 0; i < t->n; i++) {
        if (t->v[i].head_dim != 128 || t->v[i].decode || !t->s[i].ok) continue;
        seen++;
        if (t->s[i].loop_insn > 4.5 * kc_attn_hmma(&t->s[i]))
            mt_fail(__FILE__, __LINE__, "%s: %d instructions for %.0f HMMA", ks_dtype_name(t->v[i].dtype),
                    t->s[i].loop_insn, kc_attn_hmma(&t->s[i]));
    }
    EXPECT_EQ(2, seen);
}

TEST(prefill_d128_main_loop_moves_at_most_200_shared_bytes_per_hmma) {
    kc_table *t = kc_get();
    int i, seen = 0;
    KC_NEED(t);
    for (i = 0; i < t->n; i++) {
        if (t->v[i].head_dim != 128 || t->v[i].decode || !t->s[i].ok) continue;
        seen++;
        if ((double)t->s[i].loop_smem_bytes > 200.0 * kc_attn_hmma(&t->s[i]))
            mt_fail(__FILE__, __LINE__, "%s: %lld shared bytes for %.0f HMMA", ks_dtype_name(t->v[i].dtype),
                    t->s[i].loop_smem_bytes, kc_attn_hmma(&t->s[i]));
    }
    EXPECT_EQ(2, seen);
}

TEST(decode_d128_main_loop_spends_at_most_15_percent_on_integer_arithmetic) {
    kc_table *t = kc_get();
    int i, seen = 0;
    KC_NEED(t);
    for (i = 0; i < t->n; i++) {
        if (t->v[i].head_dim != 128 || !t->v[i].decode || !t->s[i].ok) continue;
        seen++;
        if (t->s[i].loop_int * 100 > 15 * t->s[i].loop_insn)
            mt_fail(__FILE__, __LINE__, "%s: %d integer instructions of %d", ks_dtype_name(t->v[i].dtype),
                    t->s[i].loop_int, t->s[i].loop_insn);
    }
    EXPECT_EQ(2, seen);
}

TEST(no_attention_variant_spills_or_uses_local_memory) {
    kc_table *t = kc_get();
    int i;
    KC_NEED(t);
    for (i = 0; i < t->n; i++) {
        if (!t->s[i].ok) continue;
        if (t->s[i].spills != 0 || t->s[i].lmem_ops != 0 || t->s[i].local != 0)
            mt_fail(__FILE__, __LINE__, "%s d%d %s: spills %lld, %d LDL/STL, %d bytes local", ks_dtype_name(t->v[i].dtype),
                    t->v[i].head_dim, t->v[i].decode ? "decode" : "prefill", t->s[i].spills, t->s[i].lmem_ops,
                    t->s[i].local);
    }
}

TEST(prefill_d128_keeps_two_blocks_per_sm) {
    kc_table *t = kc_get();
    int i;
    KC_NEED(t);
    for (i = 0; i < t->n; i++)
        if (t->v[i].head_dim == 128 && !t->v[i].decode && t->s[i].ok) EXPECT_LE(2, t->s[i].blocks_sm);
}

/* ---- the analysis itself, on a listing written here (no tools needed) ---- */

static const char kc_listing[] =
    "//--------------------- .text.k           --------------------------\n"
    ".text.k:\n"
    "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
    ".L_x_1:\n"
    "        /*0010*/                   LDSM.16.M88.4 R4, [R2+UR4] ;\n"
    "        /*0020*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR6][R8.64] ;\n"
    "        /*0030*/                   HMMA.16816.F32 R12, R4, R8, R12 ;\n"
    "        /*0040*/                   HMMA.16816.F32 R16, R4, R10, R16 ;\n"
    "        /*0050*/                   LOP3.LUT R2, R2, 0x20, RZ, 0x3c, !PT ;\n"
    "        /*0060*/                   UIADD3 UR4, UR4, 0x100, URZ ;\n"
    "        /*0070*/                   LDS.64 R20, [R3] ;\n"
    "        /*0080*/                   ISETP.GE.AND P0, PT, R2, R5, PT ;\n"
    "        /*0090*/              @!P0 BRA `(.L_x_1) ;\n"
    ".L_x_2:\n"
    "        /*00a0*/                   EXIT ;\n"
    "//--------------------- .text.other       --------------------------\n";

TEST(kstats_measures_the_loop_of_a_known_listing) {
    ks_sass s;
    ks_stats st;
    memset(&st, 0, sizeof st);
    ASSERT_TRUE(ks_sass_parse(kc_listing, "k", &s));
    ks_loop_stats(&s, &st);
    EXPECT_EQ(11, s.n);
    EXPECT_EQ(1, st.have_loop);
    EXPECT_EQ(9, st.loop_insn);          /* LDSM .. BRA */
    EXPECT_EQ(2, st.loop_hmma);
    EXPECT_EQ(1, st.loop_ldsm);
    EXPECT_EQ(3, st.loop_int);           /* LOP3, UIADD3, ISETP */
    EXPECT_EQ(512 + 512 + 256, (int)st.loop_smem_bytes);   /* LDSM x4, LDGSTS.128, LDS.64 */
    EXPECT_EQ(0, st.loop_branches);
    EXPECT_EQ(9, st.path_min);
    EXPECT_EQ(9, st.path_max);
    ks_sass_free(&s);
}

TEST(kstats_reports_no_loop_without_hmma) {
    static const char listing[] =
        ".text.k:\n"
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
        ".L_x_0:\n"
        "        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;\n"
        "        /*0020*/              @!P0 BRA `(.L_x_0) ;\n"
        "        /*0030*/                   STL [R1], R2 ;\n"
        "        /*0040*/                   EXIT ;\n";
    ks_sass s;
    ks_stats st;
    memset(&st, 0, sizeof st);
    ASSERT_TRUE(ks_sass_parse(listing, "k", &s));
    ks_loop_stats(&s, &st);
    EXPECT_EQ(0, st.have_loop);
    EXPECT_EQ(1, st.lmem_ops);
    ks_sass_free(&s);
}

TEST(kstats_counts_both_ways_through_a_branching_loop) {
    static const char listing[] =
        ".text.k:\n"
        ".L_x_0:\n"
        "        /*0000*/                   HMMA.16816.F32 R12, R4, R8, R12 ;\n"
        "        /*0010*/               @P1 BRA `(.L_x_1) ;\n"
        "        /*0020*/                   FMUL R1, R1, R1 ;\n"
        "        /*0030*/                   FMUL R1, R1, R1 ;\n"
        ".L_x_1:\n"
        "        /*0040*/              @!P0 BRA `(.L_x_0) ;\n"
        "        /*0050*/                   EXIT ;\n";
    ks_sass s;
    ks_stats st;
    memset(&st, 0, sizeof st);
    ASSERT_TRUE(ks_sass_parse(listing, "k", &s));
    ks_loop_stats(&s, &st);
    EXPECT_EQ(5, st.loop_insn);
    EXPECT_EQ(1, st.loop_branches);
    EXPECT_EQ(3, st.path_min);
    EXPECT_EQ(5, st.path_max);
    ks_sass_free(&s);
}

TEST(kstats_sm90_occupancy_follows_registers_and_shared_memory) {
    EXPECT_EQ(2, ks_blocks_sm90(255, 98304 + 1024, 128));   /* 96 KiB: shared memory and registers allow 2 */
    EXPECT_EQ(1, ks_blocks_sm90(168, 139264 + 1024, 128));  /* 136 KiB: one */
    EXPECT_EQ(4, ks_blocks_sm90(128, 1024, 128));           /* 128 registers x 128 threads: 4 */
    EXPECT_EQ(16, ks_blocks_sm90(16, 1024, 128));           /* 2,048 threads */
}
