/* kernel_stats: the machine code of every shipped mskv_attn and mskv_kv_write
   variant, measured on the CPU (no GPU needed).

   Each variant is compiled through the header's own NVRTC path
   (mskv_cuda_compile, the define set the runtime passes) to CUBIN for sm_80
   and sm_90, then read back with cuobjdump -res-usage (registers, static
   shared memory, local memory) and nvdisasm (the instructions). The tools
   come from the PyPI packages nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump:
   tools/cuda_tools.sh installs them into build/cuda-tools when missing.

   One line per variant ("kstat" then key=value pairs):
     regs, spills          registers per thread; spill bytes from ptxas' report (stores + loads)
     lmem_ops              LDL/STL instructions anywhere in the kernel (0: nothing lives in local memory)
     smem_static           cuobjdump's SHARED (on sm_90 it includes the 1 KiB the system reserves per block)
     smem_dyn              dynamic shared memory the launch wrapper asks for (mskv_cuda_attn_geometry_get)
     blocks_sm, warps_sm   resident blocks and warps per SM on sm_90 (H100/H200: 64K registers in
                           256-register units per warp, 228 KiB shared memory, 2,048 threads, 32 blocks)
     loop_insn             instructions per iteration of the main loop (see below)
     loop_hmma             HMMA per iteration (every HMMA: the attention kernel's include one row-sum
                           mma, P times ones, per 32 of Q K^T and P V; tests/kstats_check.c leaves
                           those out when it holds the targets)
     insn_per_hmma         loop_insn / loop_hmma
     ldsm_per_hmma         LDSM per HMMA
     smem_B_per_hmma       shared bytes moved per HMMA by one warp: LDS/LDSM/STS/LDGSTS of the loop,
                           each counted at its full-warp size (LDSM: 128 B per 8x8 matrix; LDS, STS,
                           LDGSTS: 32 lanes x access width), divided by the loop's HMMA
     int_share             integer instructions / loop_insn, where integer = IADD3, IADD, VIADD, IMAD
                           (every form, IMAD.MOV included), IMUL, LEA, SHF, SHL, SHR, LOP3, LOP,
                           IMNMX, VIMNMX, IABS, ISCADD, SEL, ISETP, POPC, FLO, BREV, SGXT, BMSK, PRMT
                           and their uniform-datapath (U...) forms: the kernels' float math is all
                           FP, so this is an upper bound of the address (and loop-control) arithmetic
     ceiling_tflops        issue-bound ceiling on an H200: 132 SMs x 1.83 GHz x 4 instructions/clk
                           x 4,096 FLOP per HMMA.16816 / insn_per_hmma, capped at the tensor peak
                           132 x 1.83e9 x 4,096 (one HMMA per clock per SM) = 989 TFLOP/s
     loop_branches, inner_loops   forward branches and nested loops inside the main loop
     path_min, path_max    the shortest and longest way through one iteration (branches taken or
                           not; a nested loop counted once)
     insn_per_kflop        loop_insn per 1,000 FLOP the loop's tensor instructions issue (one warp's
                           share: HMMA.16816 4,096 FLOP; HGMMA.64xNx16, a warpgroup's, 2 x 64 x N x 16 / 4)

   The sm_90a kernel (mskv_attn_sm90, compiled for the arch-specific target)
   gets a line of its own ("kstat kernel=mskv_attn_sm90 arch=sm_90a"): its
   main loop is a consumer warp's (HGMMA instead of HMMA), plus
     loop_hgmma            HGMMA per iteration (S = Q K^T and O += P V of one 128-key tile)
     regs_producer, regs_consumer  the setmaxnreg counts in the SASS (USETMAXREG .DEALLOC / .TRY_ALLOC)
     producer_loop_insn, producer_path_min  the producer's tile loop (the loop holding the TMA
                           copies, UTMALDG): its instructions and its shortest way through (the TMA
                           branch, not the cp.async fallback)
     block_insn_per_kflop  per tile and block: 8 consumer warps' loops + one producer warp's shortest
                           path, per 1,000 FLOP of the two consumers' HGMMA
   and "kwan" lines compare the two paths on the Wan chunk shape (4,680 queries
   x 32,760 keys x 12 heads, d128, bf16, no mask): main-loop instructions
   issued over every block and tile (blocks x tiles x per-tile instructions)
   per 1,000 FLOP of the attention itself (4 x 4,680 x 32,760 x 12 x 128).

   Back-edges from code after the function's last EXIT are not loops: the
   compiler moves spin-wait retries (mbarrier try_wait) out of line there,
   with a branch back into the body.

   The main loop is found from the control flow, not from names: every branch
   whose target lies at or before it closes a loop [target, branch]; the main
   loop is the one holding the most HMMA (the key-tile loop holds them all),
   and of several with as many, the one with the fewest instructions (the
   steady-state loop of a peeled pipeline). loop_insn counts every instruction
   in that range, predicated or not, each once: the count issued per iteration
   when the loop has no branches or inner loops (path_min == path_max ==
   loop_insn), an upper bound otherwise.

   Usage: build/kernel-stats [--arch 80|90] [--kernel attn|kv_write] [--head-dim N] [--filter S]
          (make kernel-stats). Tools: $MSKV_NVDISASM / $MSKV_CUOBJDUMP, else
          build/cuda-tools/bin, else PATH, else /usr/local/cuda/bin.
   Kernels are cached in build/nvrtc-cache ($MSKV_CACHE_DIR overrides).

   With KSTATS_NO_MAIN defined this file is a library for tests/kstats_check.c,
   which asserts the targets in make test. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#define KS_H200_SMS 132
#define KS_H200_GHZ 1.83
#define KS_ISSUE_PER_CLK 4
#define KS_FLOP_PER_HMMA 4096.0

typedef struct ks_variant {
    const char *kernel;     /* "mskv_attn", "mskv_kv_write" or "mskv_attn_sm90" */
    int arch, dtype, head_dim, decode, rope, style;
    int sm90a;              /* compiled for sm_90a (the arch-specific target) */
} ks_variant;

typedef struct ks_stats {
    int ok;                 /* measured (else why says what failed) */
    mskv_result compiled;   /* mskv_cuda_compile's result */
    char why[2048];
    int regs, stack, local, smem_static;
    long long spills;
    int lmem_ops;
    unsigned smem_dyn;
    int blocks_sm, warps_sm;
    int have_loop, loop_insn, loop_hmma, loop_ldsm, loop_int, loop_branches, inner_loops, path_min, path_max;
    long long loop_smem_bytes;
    int total_insn;
    int loop_hgmma;
    double loop_flop;       /* one warp's share of the loop's tensor FLOP */
    int regs_producer, regs_consumer;   /* setmaxnreg (0: none) */
    int prod_insn, prod_path_min;       /* the TMA producer's tile loop (0: none) */
} ks_stats;

/* ---- tools --------------------------------------------------------------------------- */

static char ks_root[1024] = ".";

static int ks_exists(const char *p) { return access(p, X_OK) == 0; }

/* env override, the local venv, PATH, the CUDA toolkit */
static int ks_find_tool(const char *name, const char *env, char *out, size_t cap) {
    /* cap >= 1100: a 1000-byte PATH entry plus the name fits */
    const char *e = getenv(env), *path = getenv("PATH");
    char buf[1024];
    if (e && e[0]) { snprintf(out, cap, "%s", e); return ks_exists(out); }
    snprintf(out, cap, "%s/build/cuda-tools/bin/%s", ks_root, name);
    if (ks_exists(out)) return 1;
    while (path && *path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        if (n > 0 && n < 1000) {
            memcpy(buf, path, n);
            buf[n] = 0;
            snprintf(out, cap, "%s/%s", buf, name);
            if (ks_exists(out)) return 1;
        }
        path = c ? c + 1 : NULL;
    }
    snprintf(out, cap, "/usr/local/cuda/bin/%s", name);
    return ks_exists(out);
}

/* Runs cmd, returns its stdout (malloc'd, NUL-terminated) or NULL. */
static char *ks_run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!p) return NULL;
    for (;;) {
        size_t got;
        if (cap - n < 65536) {
            char *nb = (char *)realloc(buf, cap + 262144);
            if (!nb) { free(buf); pclose(p); return NULL; }
            buf = nb; cap += 262144;
        }
        got = fread(buf + n, 1, cap - n - 1, p);
        if (got == 0) break;
        n += got;
    }
    if (buf) buf[n] = 0;
    if (pclose(p) != 0) { free(buf); return NULL; }
    return buf;
}

/* ---- compile ------------------------------------------------------------------------- */

/* The variant's options in the runtime's form: every define kernels.cu knows,
   sorted (as mskv__cuda_function sorts them), then the ptxas report. */
static int ks_options(const ks_variant *v, char o[][48], const char **opts) {
    int n = 0, i;
    snprintf(o[n++], 48, "-DMSKV_ATTN_WARP_KEYS=%d", v->decode);
    snprintf(o[n++], 48, "-DMSKV_DTYPE=%d", v->dtype);
    snprintf(o[n++], 48, "-DMSKV_HEAD_DIM=%d", v->head_dim);
    snprintf(o[n++], 48, "-DMSKV_ROPE=%d", v->rope);
    snprintf(o[n++], 48, "-DMSKV_ROPE_D0=0");
    snprintf(o[n++], 48, "-DMSKV_ROPE_D1=0");
    snprintf(o[n++], 48, "-DMSKV_ROPE_D2=0");
    snprintf(o[n++], 48, "-DMSKV_ROPE_STYLE=%d", v->style);
    snprintf(o[n++], 48, "-DMSKV_SRC_DTYPE=%d", v->dtype);   /* K/V sources in the pool dtype */
    snprintf(o[n++], 48, "--ptxas-options=-v");
    for (i = 0; i < n; i++) opts[i] = o[i];
    return n;
}

static void ks_quiet_log(void *user, mskv_log_level level, const char *msg) { (void)user; (void)level; (void)msg; }

/* ---- SASS ---------------------------------------------------------------------------- */

typedef struct ks_insn {
    unsigned addr;
    char op[48];            /* opcode with modifiers, e.g. HMMA.16816.F32 */
    char base[16];          /* opcode alone */
    int pred;               /* guarded by a predicate other than PT */
    int target;             /* branch target (instruction index), -1 when none */
    char label[24];         /* the label the branch names */
    long long imm;          /* the last 0x... immediate of the operands, -1 when none */
} ks_insn;

typedef struct ks_sass {
    ks_insn *in;
    int n, cap;
    char (*lname)[24];
    int *lidx;
    int nl, lcap;
} ks_sass;

static void ks_sass_free(ks_sass *s) { free(s->in); free(s->lname); free(s->lidx); memset(s, 0, sizeof *s); }

/* Parses nvdisasm's listing of one function (".text.NAME:" up to the next
   section): instruction lines (address comment, optional @P guard, OP
   operands ;) and ".L_x_N:" labels. */
static int ks_sass_parse(const char *listing, const char *fn, ks_sass *s) {
    char head[128];
    const char *p, *end;
    int i;
    memset(s, 0, sizeof *s);
    snprintf(head, sizeof head, ".text.%s:", fn);
    p = strstr(listing, head);
    if (!p) return 0;
    p += strlen(head);
    end = strstr(p, "\n//--");
    if (!end) end = p + strlen(p);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *q = p;
        while (q < le && (*q == ' ' || *q == '\t')) q++;
        if (q < le && *q == '.' && le[-1] == ':') {
            if (s->nl == s->lcap) {
                s->lcap = s->lcap ? 2 * s->lcap : 64;
                s->lname = (char (*)[24])realloc(s->lname, (size_t)s->lcap * sizeof *s->lname);
                s->lidx = (int *)realloc(s->lidx, (size_t)s->lcap * sizeof *s->lidx);
                if (!s->lname || !s->lidx) return 0;
            }
            snprintf(s->lname[s->nl], 24, "%.*s", (int)(le - q - 1), q);
            s->lidx[s->nl++] = s->n;
        } else if (q + 2 < le && q[0] == '/' && q[1] == '*') {
            ks_insn in;
            const char *o, *bt;
            size_t k = 0;
            memset(&in, 0, sizeof in);
            in.target = -1;
            in.addr = (unsigned)strtoul(q + 2, NULL, 16);
            o = strstr(q, "*/");
            if (!o || o >= le) { p = le + 1; continue; }
            o += 2;
            while (o < le && *o == ' ') o++;
            if (*o == '@') {
                in.pred = strncmp(o, "@PT ", 4) != 0;
                while (o < le && *o != ' ') o++;
                while (o < le && *o == ' ') o++;
            }
            while (o + k < le && o[k] != ' ' && o[k] != ';' && k < sizeof in.op - 1) { in.op[k] = o[k]; k++; }
            in.op[k] = 0;
            for (k = 0; in.op[k] && in.op[k] != '.' && k < sizeof in.base - 1; k++) in.base[k] = in.op[k];
            in.base[k] = 0;
            {
                /* the last hexadecimal immediate (USETMAXREG's register count) */
                const char *h = o, *last = NULL;
                while ((h = strstr(h, "0x")) != NULL && h < le) { last = h; h += 2; }
                in.imm = last ? strtoll(last, NULL, 16) : -1;
            }
            bt = strstr(o, "`(");
            if (bt && bt < le) {
                const char *c = strchr(bt, ')');
                if (c && c < le) snprintf(in.label, sizeof in.label, "%.*s", (int)(c - bt - 2), bt + 2);
            }
            if (s->n == s->cap) {
                s->cap = s->cap ? 2 * s->cap : 1024;
                s->in = (ks_insn *)realloc(s->in, (size_t)s->cap * sizeof *s->in);
                if (!s->in) return 0;
            }
            s->in[s->n++] = in;
        }
        p = le + 1;
    }
    for (i = 0; i < s->n; i++) {
        int l;
        if (!s->in[i].label[0]) continue;
        for (l = 0; l < s->nl; l++)
            if (strcmp(s->lname[l], s->in[i].label) == 0) { s->in[i].target = s->lidx[l]; break; }
    }
    return s->n > 0;
}

static int ks_is_branch(const ks_insn *in) { return strcmp(in->base, "BRA") == 0 && in->target >= 0; }

static int ks_is_int(const char *base) {
    static const char *const ops[] = { "IADD3", "IADD", "VIADD", "IMAD", "IMUL", "LEA", "SHF", "SHL", "SHR",
                                       "LOP3", "LOP", "IMNMX", "VIMNMX", "IABS", "ISCADD", "SEL", "ISETP",
                                       "POPC", "FLO", "BREV", "SGXT", "BMSK", "PRMT" };
    size_t i;
    const char *b = base[0] == 'U' && base[1] ? base + 1 : base;
    for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(b, ops[i]) == 0) return 1;
    return 0;
}

/* Bytes one warp moves through shared memory with this instruction (0 if none). */
static long long ks_smem_bytes(const ks_insn *in) {
    const char *op = in->op;
    if (strcmp(in->base, "LDSM") == 0) {
        if (strstr(op, ".4")) return 512;
        if (strstr(op, ".2")) return 256;
        return 128;
    }
    if (strcmp(in->base, "LDS") == 0 || strcmp(in->base, "STS") == 0 || strcmp(in->base, "LDGSTS") == 0) {
        int w = 4;
        if (strstr(op, ".128")) w = 16;
        else if (strstr(op, ".64")) w = 8;
        else if (strstr(op, ".U16") || strstr(op, ".S16")) w = 2;
        else if (strstr(op, ".U8") || strstr(op, ".S8")) w = 1;
        return 32LL * w;
    }
    return 0;
}

/* Shortest and longest way from the loop head to its back-edge, over the
   body's forward edges (nested back-edges ignored: an inner loop counts once). */
static void ks_paths(const ks_sass *s, int t, int e, int *pmin, int *pmax) {
    int n = e - t + 1, i;
    int *lo = (int *)malloc((size_t)n * sizeof(int)), *hi = (int *)malloc((size_t)n * sizeof(int));
    *pmin = *pmax = -1;
    if (!lo || !hi) { free(lo); free(hi); return; }
    for (i = 0; i < n; i++) { lo[i] = 0x3fffffff; hi[i] = -1; }
    lo[0] = hi[0] = 1;
    for (i = 0; i < n - 1; i++) {
        const ks_insn *in = &s->in[t + i];
        int fall = 1;
        if (hi[i] < 0) continue;
        if (strcmp(in->base, "EXIT") == 0 && !in->pred) fall = 0;
        if (ks_is_branch(in)) {
            int tg = in->target - t;
            if (!in->pred) fall = 0;
            if (tg > i && tg < n) {
                if (lo[i] + 1 < lo[tg]) lo[tg] = lo[i] + 1;
                if (hi[i] + 1 > hi[tg]) hi[tg] = hi[i] + 1;
            }
        }
        if (fall) {
            if (lo[i] + 1 < lo[i + 1]) lo[i + 1] = lo[i] + 1;
            if (hi[i] + 1 > hi[i + 1]) hi[i + 1] = hi[i] + 1;
        }
    }
    if (hi[n - 1] >= 0) { *pmin = lo[n - 1]; *pmax = hi[n - 1]; }
    free(lo); free(hi);
}

/* FLOP of one warp's share of a tensor instruction: HMMA.16816 4,096; HGMMA.64xNx16 is a
   warpgroup's (all four warps issue it), 2 x 64 x N x 16 / 4; 0 for anything else */
static double ks_tensor_flop(const ks_insn *in) {
    if (strcmp(in->base, "HMMA") == 0) return KS_FLOP_PER_HMMA;
    if (strcmp(in->base, "HGMMA") == 0) {
        int m = 0, n = 0, k = 0;
        if (sscanf(in->op, "HGMMA.%dx%dx%d", &m, &n, &k) == 3) return 2.0 * m * n * k / 4.0;
    }
    return 0.0;
}

/* A loop [t, e] closed by the branch at e: not when the branch sits in the
   out-of-line code after the last EXIT and jumps back into the body. */
static int ks_is_loop(const ks_sass *s, int t, int e, int last_exit) {
    (void)s;
    return !(last_exit >= 0 && e > last_exit && t <= last_exit);
}

static void ks_loop_stats(const ks_sass *s, ks_stats *st) {
    int i, best_t = -1, best_e = -1, best_h = 0, j, last_exit = -1, pt = -1, pe = -1;
    for (i = 0; i < s->n; i++)
        if (strcmp(s->in[i].base, "EXIT") == 0 && !s->in[i].pred) last_exit = i;
    for (i = 0; i < s->n; i++) {
        int t = s->in[i].target, h = 0, tma = 0;
        if (!ks_is_branch(&s->in[i]) || t > i || !ks_is_loop(s, t, i, last_exit)) continue;
        for (j = t; j <= i; j++) {
            h += ks_tensor_flop(&s->in[j]) > 0;
            tma += strcmp(s->in[j].base, "UTMALDG") == 0;
        }
        if (h > best_h || (h == best_h && h > 0 && i - t < best_e - best_t)) { best_h = h; best_t = t; best_e = i; }
        /* the producer's tile loop: the outermost loop of TMA copies without tensor work */
        if (tma > 0 && h == 0 && i - t > pe - pt) { pt = t; pe = i; }
    }
    for (i = 0; i < s->n; i++) {
        if (strcmp(s->in[i].base, "USETMAXREG") == 0 && s->in[i].imm > 0) {
            if (strstr(s->in[i].op, "DEALLOC")) st->regs_producer = (int)s->in[i].imm;
            else st->regs_consumer = (int)s->in[i].imm;
        }
    }
    if (pe >= 0) {
        int pmax;
        st->prod_insn = pe - pt + 1;
        ks_paths(s, pt, pe, &st->prod_path_min, &pmax);
    }
    for (i = 0; i < s->n; i++) st->lmem_ops += strcmp(s->in[i].base, "LDL") == 0 || strcmp(s->in[i].base, "STL") == 0;
    st->total_insn = s->n;
    if (best_h == 0) return;
    st->have_loop = 1;
    st->loop_insn = best_e - best_t + 1;
    for (j = best_t; j <= best_e; j++) {
        const ks_insn *in = &s->in[j];
        st->loop_hmma += strcmp(in->base, "HMMA") == 0;
        st->loop_hgmma += strcmp(in->base, "HGMMA") == 0;
        st->loop_flop += ks_tensor_flop(in);
        st->loop_ldsm += strcmp(in->base, "LDSM") == 0;
        st->loop_int += ks_is_int(in->base);
        st->loop_smem_bytes += ks_smem_bytes(in);
        if (ks_is_branch(in) && j < best_e) {
            if (in->target > j) st->loop_branches++;
            else if (in->target >= best_t) st->inner_loops++;
        }
    }
    ks_paths(s, best_t, best_e, &st->path_min, &st->path_max);
}

/* ---- resources ----------------------------------------------------------------------- */

/* "Function NAME:\n  REG:n STACK:n SHARED:n LOCAL:n ..." */
static int ks_res_usage(const char *text, const char *fn, ks_stats *st) {
    char head[128];
    const char *p;
    snprintf(head, sizeof head, "Function %s:", fn);
    p = strstr(text, head);
    if (!p) return 0;
    p += strlen(head);
    return sscanf(p, " REG:%d STACK:%d SHARED:%d LOCAL:%d", &st->regs, &st->stack, &st->smem_static, &st->local) == 4;
}

/* ptxas -v: "Function properties for NAME\n    S bytes stack frame, A bytes spill stores, B bytes spill loads" */
static long long ks_spills(const char *log, const char *fn) {
    char head[128];
    const char *p;
    long long frame, a, b;
    snprintf(head, sizeof head, "Function properties for %s\n", fn);
    p = log ? strstr(log, head) : NULL;
    if (!p) return -1;
    p += strlen(head);
    while (*p && *p != '\n' && (*p < '0' || *p > '9')) p++;   /* NVRTC prefixes "ptxas   .   " */
    if (sscanf(p, " %lld bytes stack frame, %lld bytes spill stores, %lld bytes spill loads", &frame, &a, &b) != 3) return -1;
    return a + b;
}

/* Resident blocks per SM on sm_90 from the documented limits. */
static int ks_blocks_sm90(int regs, unsigned smem_block, int threads) {
    int warps = (threads + 31) / 32, by_regs, by_smem, by_threads = 2048 / threads, b;
    int per_warp = (regs * 32 + 255) / 256 * 256;
    unsigned smem = (smem_block + 127) / 128 * 128;
    by_regs = per_warp > 0 ? (65536 / per_warp) / warps : 32;
    by_smem = smem > 0 ? (int)((228u * 1024u) / smem) : 32;
    if (smem > 227u * 1024u + 1024u) by_smem = 0;
    b = by_regs < by_smem ? by_regs : by_smem;
    if (by_threads < b) b = by_threads;
    return b < 32 ? b : 32;
}

/* ---- one variant --------------------------------------------------------------------- */

static const char *ks_dtype_name(int dt) { return dt == 0 ? "f32" : dt == 1 ? "f16" : "bf16"; }

static void ks_measure(const ks_variant *v, const char *cache_dir, const char *nvdisasm, const char *cuobjdump,
                       ks_stats *st) {
    char o[12][48], cubin[1400], cmd[4096];
    const char *opts[12];
    mskv_cuda_desc cd;
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    mskv_result r;
    char *sass = NULL, *res = NULL;
    ks_sass s;
    FILE *f;
    memset(st, 0, sizeof *st);
    memset(&cd, 0, sizeof cd);
    cd.cache_dir = cache_dir;
    cd.log = ks_quiet_log;
    memset(&ci, 0, sizeof ci);
    ci.arch = v->arch;
    ci.arch_specific = v->sm90a;
    ci.options = opts;
    ci.num_options = ks_options(v, o, opts);
    r = mskv_cuda_compile(&cd, &ci, &img);
    st->compiled = r;
    if (r != MSKV_SUCCESS) {
        snprintf(st->why, sizeof st->why, "compile: %s %.300s", mskv_result_string(r), img.log ? img.log : "");
        mskv_cuda_image_free(&cd, &img);
        return;
    }
    st->spills = ks_spills(img.log, v->kernel);
    snprintf(cubin, sizeof cubin, "%s/ks-%016llx.cubin", cache_dir, (unsigned long long)img.key);
    f = fopen(cubin, "wb");
    if (!f || fwrite(img.data, 1, img.size, f) != img.size) {
        if (f) fclose(f);
        snprintf(st->why, sizeof st->why, "cannot write %s", cubin);
        mskv_cuda_image_free(&cd, &img);
        return;
    }
    fclose(f);
    mskv_cuda_image_free(&cd, &img);
    snprintf(cmd, sizeof cmd, "'%s' -res-usage '%s' 2>&1", cuobjdump, cubin);
    res = ks_run(cmd);
    snprintf(cmd, sizeof cmd, "'%s' -c '%s' 2>&1", nvdisasm, cubin);
    sass = ks_run(cmd);
    remove(cubin);
    if (!res || !ks_res_usage(res, v->kernel, st)) {
        snprintf(st->why, sizeof st->why, "cuobjdump -res-usage gave no figures for %s", v->kernel);
    } else if (!sass || !ks_sass_parse(sass, v->kernel, &s)) {
        snprintf(st->why, sizeof st->why, "nvdisasm gave no listing of %s", v->kernel);
    } else {
        ks_loop_stats(&s, st);
        ks_sass_free(&s);
        st->ok = 1;
    }
    free(res);
    free(sass);
    if (!st->ok) return;
    if (v->sm90a) {
        mskv_cuda_attn_geometry g;
        if (mskv__cuda_attn_geometry_sm90(1, 4096, 4096, 4096, 8, 8, v->head_dim, 132, 227 * 1024, &g) == MSKV_SUCCESS)
            st->smem_dyn = g.smem_bytes;
        st->blocks_sm = ks_blocks_sm90(st->regs, st->smem_dyn + (unsigned)st->smem_static, 384);
        st->warps_sm = st->blocks_sm * 12;
        return;
    }
    if (strcmp(v->kernel, "mskv_attn") == 0) {
        mskv_cuda_attn_geometry g;
        /* a decode call (one query, no GQA) or a prefill chunk selects the layout */
        if (mskv_cuda_attn_geometry_get(1, v->decode ? 1 : 4096, v->decode ? 1 : 4096, 4096, 8, 8, v->head_dim, 132,
                                        227 * 1024, 0, &g) == MSKV_SUCCESS && g.decode == v->decode)
            st->smem_dyn = g.smem_bytes;
        else
            snprintf(st->why, sizeof st->why, "geometry has no %s layout", v->decode ? "decode" : "prefill");
    }
    /* sm_90's SHARED already holds the 1 KiB reserved per block; sm_80's does not */
    st->blocks_sm = ks_blocks_sm90(st->regs, st->smem_dyn + (unsigned)st->smem_static + (v->arch >= 90 ? 0u : 1024u), 128);
    st->warps_sm = st->blocks_sm * 4;
}

static double ks_ceiling(const ks_stats *st) {
    double peak = KS_H200_SMS * KS_H200_GHZ * 1e9 * KS_FLOP_PER_HMMA / 1e12, c;
    if (!st->have_loop || st->loop_hmma == 0) return 0.0;
    c = KS_H200_SMS * KS_H200_GHZ * 1e9 * KS_ISSUE_PER_CLK * KS_FLOP_PER_HMMA * st->loop_hmma / st->loop_insn / 1e12;
    return c < peak ? c : peak;
}

static double ks_block_insn_per_kflop(const ks_stats *st) {
    return st->loop_flop > 0 ? 1000.0 * (8.0 * st->loop_insn + st->prod_path_min) / (8.0 * st->loop_flop) : 0.0;
}

static void ks_print_sm90a(FILE *out, const ks_variant *v, const ks_stats *st) {
    fprintf(out, "kstat kernel=%s arch=sm_90a dtype=%s d=%d layout=prefill", v->kernel, ks_dtype_name(v->dtype), v->head_dim);
    if (!st->ok) { fprintf(out, " error=\"%s\"\n", st->why); return; }
    fprintf(out, " regs=%d regs_producer=%d regs_consumer=%d spills=%lld lmem_ops=%d smem_static=%d smem_dyn=%u"
                 " blocks_sm=%d warps_sm=%d", st->regs, st->regs_producer, st->regs_consumer, st->spills, st->lmem_ops,
            st->smem_static, st->smem_dyn, st->blocks_sm, st->warps_sm);
    if (st->have_loop)
        fprintf(out, " loop_insn=%d loop_hgmma=%d insn_per_kflop=%.3f int_share=%.3f loop_branches=%d inner_loops=%d"
                     " path_min=%d path_max=%d producer_loop_insn=%d producer_path_min=%d block_insn_per_kflop=%.3f",
                st->loop_insn, st->loop_hgmma, 1000.0 * st->loop_insn / st->loop_flop, (double)st->loop_int / st->loop_insn,
                st->loop_branches, st->inner_loops, st->path_min, st->path_max, st->prod_insn, st->prod_path_min,
                ks_block_insn_per_kflop(st));
    else
        fprintf(out, " loop=none insn=%d", st->total_insn);
    fprintf(out, "\n");
}

static void ks_print(FILE *out, const ks_variant *v, const ks_stats *st) {
    if (v->sm90a) { ks_print_sm90a(out, v, st); return; }
    fprintf(out, "kstat kernel=%s arch=sm_%d dtype=%s d=%d", v->kernel, v->arch, ks_dtype_name(v->dtype), v->head_dim);
    if (strcmp(v->kernel, "mskv_attn") == 0) fprintf(out, " layout=%s", v->decode ? "decode" : "prefill");
    else fprintf(out, " rope=%d style=%d", v->rope, v->style);
    if (!st->ok) { fprintf(out, " error=\"%s\"\n", st->why); return; }
    fprintf(out, " regs=%d spills=%lld lmem_ops=%d smem_static=%d smem_dyn=%u blocks_sm=%d warps_sm=%d", st->regs,
            st->spills, st->lmem_ops, st->smem_static, st->smem_dyn, st->blocks_sm, st->warps_sm);
    if (st->have_loop) {
        double h = (double)st->loop_hmma;
        fprintf(out, " loop_insn=%d loop_hmma=%d insn_per_hmma=%.2f ldsm_per_hmma=%.3f smem_B_per_hmma=%.0f"
                     " int_share=%.3f ceiling_tflops=%.0f loop_branches=%d inner_loops=%d path_min=%d path_max=%d"
                     " insn_per_kflop=%.3f",
                st->loop_insn, st->loop_hmma, st->loop_insn / h, st->loop_ldsm / h, (double)st->loop_smem_bytes / h,
                (double)st->loop_int / st->loop_insn, ks_ceiling(st), st->loop_branches, st->inner_loops,
                st->path_min, st->path_max, 1000.0 * st->loop_insn / st->loop_flop);
    } else {
        fprintf(out, " loop=none insn=%d", st->total_insn);
    }
    fprintf(out, "\n");
}

/* Every shipped variant of the two kernels for one arch: attention for the
   16-bit dtypes, each head_dim and layout; kv_write for every dtype, head_dim
   and RoPE mode/style. */
static int ks_variants(int arch, int want_attn, int want_kv, ks_variant *out, int cap) {
    static const int dims[3] = { 64, 128, 256 };
    int n = 0, dt, d, lay, rope, style;
    for (dt = 1; want_attn && dt <= 2; dt++)
        for (d = 0; d < 3; d++)
            for (lay = 0; lay < 2; lay++)
                if (n < cap) {
                    ks_variant v = { "mskv_attn", 0, 0, 0, 0, 0, 0, 0 };
                    v.arch = arch; v.dtype = dt; v.head_dim = dims[d]; v.decode = lay;
                    out[n++] = v;
                }
    for (dt = 0; want_kv && dt <= 2; dt++)
        for (d = 0; d < 3; d++)
            for (rope = 0; rope <= 2; rope++)
                for (style = 0; style < (rope ? 2 : 1); style++)
                    if (n < cap) {
                        ks_variant v = { "mskv_kv_write", 0, 0, 0, 0, 0, 0, 0 };
                        v.arch = arch; v.dtype = dt; v.head_dim = dims[d]; v.rope = rope; v.style = style;
                        out[n++] = v;
                    }
    return n;
}

/* The sm_90a kernel's shipped variants: f16 and bf16 at head_dim 64, 128, 256. */
MSKV__CUDA_MAYBE_UNUSED static int ks_variants_sm90a(ks_variant *out, int cap) {
    static const int dims[3] = { 64, 128, 256 };
    int n = 0, dt, d;
    for (dt = 1; dt <= 2; dt++)
        for (d = 0; d < 3; d++)
            if (n < cap) {
                ks_variant v = { "mskv_attn_sm90", 90, 0, 0, 0, 0, 0, 1 };
                v.dtype = dt; v.head_dim = dims[d];
                out[n++] = v;
            }
    return n;
}

/* Main-loop instructions issued per 1,000 FLOP of the Wan chunk (4,680
   queries x 32,760 keys x 12 heads, head_dim 128, no mask, one kv head per q
   head): blocks x key tiles x the instructions of one tile in a block. */
MSKV__CUDA_MAYBE_UNUSED static double ks_wan_insn_per_kflop(const ks_variant *v, const ks_stats *st) {
    const double q = 4680, k = 32760, heads = 12, flop = 4.0 * q * k * heads * 128;
    mskv_cuda_attn_geometry g;
    double per_tile;
    mskv_result r;
    if (!st->ok || !st->have_loop) return 0.0;
    if (v->sm90a) {
        r = mskv__cuda_attn_geometry_sm90(1, 4680, 4680, 32760, 12, 12, 128, 132, 227 * 1024, &g);
        per_tile = 8.0 * st->loop_insn + st->prod_path_min;   /* two consumer warpgroups, one producer warp */
    } else {
        r = mskv_cuda_attn_geometry_get(1, 4680, 4680, 32760, 12, 12, 128, 132, 227 * 1024, 0, &g);
        per_tile = 4.0 * st->loop_insn;
    }
    if (r != MSKV_SUCCESS || g.block_rows <= 0 || g.block_keys <= 0) return 0.0;
    return 1000.0 * ceil(q / g.block_rows) * heads * ceil(k / g.block_keys) * per_tile / flop;
}

/* The root of the repository (this file's ../), the cache directory, the tools. */
typedef struct ks_env {
    char cache[1100], nvdisasm[1100], cuobjdump[1100];
    int have_tools;
    char why[2048];
} ks_env;

static void ks_env_init(ks_env *e) {
    const char *c = getenv("MSKV_CACHE_DIR");
    const char *r = getenv("MSKV_ROOT");
    memset(e, 0, sizeof *e);
    if (r && r[0]) snprintf(ks_root, sizeof ks_root, "%s", r);
    if (c && c[0]) snprintf(e->cache, sizeof e->cache, "%s", c);
    else snprintf(e->cache, sizeof e->cache, "%s/build/nvrtc-cache", ks_root);
    {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", e->cache);
        if (system(cmd) != 0) { /* the compile reports an unwritable cache */ }
    }
    e->have_tools = ks_find_tool("nvdisasm", "MSKV_NVDISASM", e->nvdisasm, sizeof e->nvdisasm) &&
                    ks_find_tool("cuobjdump", "MSKV_CUOBJDUMP", e->cuobjdump, sizeof e->cuobjdump);
    if (!e->have_tools)
        snprintf(e->why, sizeof e->why,
                 "nvdisasm/cuobjdump not found (run sh tools/cuda_tools.sh: it installs the PyPI packages "
                 "nvidia-cuda-nvdisasm and nvidia-cuda-cuobjdump into build/cuda-tools)");
}

#ifndef KSTATS_NO_MAIN
int main(int argc, char **argv) {
    int archs[2] = { 80, 90 }, na = 2, want_attn = 1, want_kv = 1, want_sm90a = 1, head_dim = 0, i, a, bad = 0;
    const char *filter = NULL;
    ks_env env;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc) { archs[0] = atoi(argv[++i]); na = 1; }
        else if (strcmp(argv[i], "--kernel") == 0 && i + 1 < argc) {
            i++;
            want_attn = strcmp(argv[i], "attn") == 0;
            want_kv = strcmp(argv[i], "kv_write") == 0;
            want_sm90a = strcmp(argv[i], "attn_sm90") == 0;
        } else if (strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc) head_dim = atoi(argv[++i]);
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--arch 80|90] [--kernel attn|attn_sm90|kv_write] [--head-dim N] [--filter S]\n", argv[0]);
            return 2;
        }
    }
    ks_env_init(&env);
    if (!env.have_tools) { fprintf(stderr, "kernel_stats: %s\n", env.why); return 1; }
    printf("# kernel_stats: %s, %s; H200 assumed at %.2f GHz x %d SMs (989 dense TFLOP/s)\n", env.nvdisasm,
           env.cuobjdump, KS_H200_GHZ, KS_H200_SMS);
    for (a = 0; a < na; a++) {
        ks_variant vs[64];
        int nv = ks_variants(archs[a], want_attn, want_kv, vs, 64);
        for (i = 0; i < nv; i++) {
            ks_stats st;
            char line[2048];
            FILE *m;
            if (head_dim && vs[i].head_dim != head_dim) continue;
            ks_measure(&vs[i], env.cache, env.nvdisasm, env.cuobjdump, &st);
            m = fmemopen(line, sizeof line, "w");
            if (!m) continue;
            ks_print(m, &vs[i], &st);
            fclose(m);
            if (filter && !strstr(line, filter)) continue;
            fputs(line, stdout);
            fflush(stdout);
            bad += !st.ok;
        }
    }
    /* the sm_90a kernel, then both paths on the Wan chunk (d128 bf16) */
    if (want_sm90a && (na == 2 || archs[0] == 90)) {
        ks_variant vs[8], mma = { "mskv_attn", 90, 2, 128, 0, 0, 0, 0 };
        ks_stats st, mst;
        double w_mma = 0, w_sm90 = 0;
        int nv = ks_variants_sm90a(vs, 8);
        for (i = 0; i < nv; i++) {
            if (head_dim && vs[i].head_dim != head_dim) continue;
            ks_measure(&vs[i], env.cache, env.nvdisasm, env.cuobjdump, &st);
            if (!filter || strstr(vs[i].kernel, filter)) ks_print(stdout, &vs[i], &st);
            bad += !st.ok;
            if (vs[i].dtype == 2 && vs[i].head_dim == 128) w_sm90 = ks_wan_insn_per_kflop(&vs[i], &st);
        }
        if (!head_dim || head_dim == 128) {
            ks_measure(&mma, env.cache, env.nvdisasm, env.cuobjdump, &mst);
            w_mma = ks_wan_insn_per_kflop(&mma, &mst);
            printf("kwan path=mma.sync kernel=mskv_attn arch=sm_90 insn_per_kflop=%.3f\n", w_mma);
            printf("kwan path=wgmma kernel=mskv_attn_sm90 arch=sm_90a insn_per_kflop=%.3f ratio=%.2f\n", w_sm90,
                   w_sm90 > 0 ? w_mma / w_sm90 : 0.0);
        }
        fflush(stdout);
    }
    return bad ? 1 : 0;
}
#endif
