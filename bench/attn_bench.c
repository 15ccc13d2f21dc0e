/* attn_bench: GFLOP/s of the CPU backend's paged attention, on one thread and
   on all of them, against the machine's limits and a plain baseline, all
   measured in the same run on the same threads:
   - the f32 FMA peak with the vector width of the instruction-set path in
     use (12 independent FMA chains per thread; scalar for the portable path);
   - the read bandwidth with the same vector loads (a streaming sum over a
     buffer of 4x the last-level cache);
   - a baseline written here: llama.cpp-style row-at-a-time f16 attention (per
     query row and key, one f16 dot product, an online softmax, one V
     multiply-add), over the same pages, on f16 copies of the same data.
   The limits are the best of short runs that alternate with the shape's own
   calls and the baseline's (five rounds per shape), so a load on a shared
   machine lowers them together; every figure is printed as a ratio to the
   limit and the baseline of its own window. Video shapes are compute-bound
   (a fraction of the FMA peak); decode reads every K/V byte once per call
   (GB/s of K/V read, a fraction of the read bandwidth). A naive triple loop
   on about 1/16 of the rows checks both outputs.

   Build and run:  make bench   (or: cc -std=c99 -O2 bench/attn_bench.c -lpthread -lm,
   the README's own build line: no -march flag is needed for the fast paths)
   An argument WORD runs only the shapes whose name holds it (decode, video, d64).
   MSKV_CPU_ISA=portable|avx2|avx512|neon|avx512_bf16|bf16_emu|amx_bf16 forces a path
   (the limits follow it). On the avx512_bf16 path the bf16 dot peak (vdpbf16ps, 12
   chains a thread), on amx_bf16 the tile peak (TDPBF16PS, 4 tiles a thread), is
   measured beside the FMA peak and video shapes print both ratios; elsewhere
   the bench says why it is not measured.
   FLOPs count 4 * head_dim per (query head, visible key): Q.K and P.V.
   "cores busy" is process CPU time over wall time during the all-thread
   calls: on a shared machine it shows how many cores the threads got. */
#define _POSIX_C_SOURCE 200809L
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

static double ab_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t ab_state = 0x243f6a8885a308d3ull;
static float ab_rand(void) { /* xorshift64*, uniform in [-1, 1) */
    ab_state ^= ab_state >> 12; ab_state ^= ab_state << 25; ab_state ^= ab_state >> 27;
    return (float)((ab_state * 0x2545f4914f6cdd1dull) >> 40) / 8388608.0f - 1.0f;
}

/* Processor time of the whole process (all threads): how many cores a run really got. */
static double ab_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* ---- the machine's own limits, measured here ---------------------------- */

/* 12 independent FMA chains: enough to cover the latency on every core of
   the last decade, so the loop runs at the FMA units' throughput. Named
   registers, not an array: GCC -O2 keeps a loop-indexed array in memory.
   The empty asm keeps the compiler from folding the chains. Returns flops done. */
#define AB_12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static double ab_fma_avx512(long n) {
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
    float out[16];
    long i;
#define AB_DECL(c) __m512 a##c = _mm512_set1_ps((float)(c));
#define AB_FMA(c) a##c = _mm512_fmadd_ps(a##c, x, y);
#define AB_SUM(c) s = _mm512_add_ps(s, a##c);
    AB_12(AB_DECL)
    __m512 s = _mm512_setzero_ps();
    for (i = 0; i < n; i++) {
        AB_12(AB_FMA)
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                              "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    AB_12(AB_SUM)
    _mm512_storeu_ps(out, s);
#undef AB_DECL
#undef AB_FMA
#undef AB_SUM
    return out[0] > 1e30f ? 0 : (double)n * 12 * 32;
}
/* The bf16 dot peak of the avx512_bf16 path: 12 chains of vdpbf16ps, each
   16 lanes x 2 products x (multiply + add) = 64 flops. Built where the
   library builds that path (MSKV__CPU_BF16_X86). */
#if MSKV__CPU_BF16_X86
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static double ab_dpbf16_avx512(long n) {
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3a803a80); /* 1.0, ~1e-3 */
    float out[16];
    long i;
#define AB_DECL(c) __m512 a##c = _mm512_set1_ps((float)(c));
#define AB_DP(c) a##c = _mm512_dpbf16_ps(a##c, x, y);
#define AB_SUM(c) s = _mm512_add_ps(s, a##c);
    AB_12(AB_DECL)
    __m512 s = _mm512_setzero_ps();
    for (i = 0; i < n; i++) {
        AB_12(AB_DP)
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                              "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    AB_12(AB_SUM)
    _mm512_storeu_ps(out, s);
#undef AB_DECL
#undef AB_DP
#undef AB_SUM
    return out[0] > 1e30f ? 0 : (double)n * 12 * 64;
}
#endif
/* The tile peak of the amx_bf16 path: 4 independent accumulator tiles, each
   TDPBF16PS 16 x 16 outputs x 16 pairs x 2 products x (multiply + add) =
   16,384 flops, on operands that stay in the tile registers. */
#if MSKV__CPU_AMX
static double ab_dp_amx(long n) {
    static const uint32_t one[256] = {0};
    float out[256];
    long i;
    mskv__amx_on();
    MSKV__AMX_LOAD(4, one, 64);
    MSKV__AMX_LOAD(5, one, 64);
    MSKV__AMX_LOAD(6, one, 64);
    MSKV__AMX_LOAD(7, one, 64);
    MSKV__AMX_ZERO(0);
    MSKV__AMX_ZERO(1);
    MSKV__AMX_ZERO(2);
    MSKV__AMX_ZERO(3);
    for (i = 0; i < n / 8; i++) {
        MSKV__AMX_DP(0, 4, 6);
        MSKV__AMX_DP(1, 4, 7);
        MSKV__AMX_DP(2, 5, 6);
        MSKV__AMX_DP(3, 5, 7);
    }
    MSKV__AMX_STORE(0, out, 64);
    mskv__amx_off();
    return out[0] != 0.0f ? 0 : (double)(n / 8) * 4 * 16384;
}
#endif
__attribute__((target("avx2,fma"))) static double ab_fma_avx2(long n) {
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
    float out[8];
    long i;
#define AB_DECL(c) __m256 a##c = _mm256_set1_ps((float)(c));
#define AB_FMA(c) a##c = _mm256_fmadd_ps(a##c, x, y);
#define AB_SUM(c) s = _mm256_add_ps(s, a##c);
    AB_12(AB_DECL)
    __m256 s = _mm256_setzero_ps();
    for (i = 0; i < n; i++) {
        AB_12(AB_FMA)
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5),
                              "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
    }
    AB_12(AB_SUM)
    _mm256_storeu_ps(out, s);
#undef AB_DECL
#undef AB_FMA
#undef AB_SUM
    return out[0] > 1e30f ? 0 : (double)n * 12 * 16;
}
#endif
#if defined(__aarch64__)
static double ab_fma_neon(long n) {
    const float32x4_t x = vdupq_n_f32(0.999f), y = vdupq_n_f32(1e-3f);
    long i;
#define AB_DECL(c) float32x4_t a##c = vdupq_n_f32((float)(c));
#define AB_FMA(c) a##c = vfmaq_f32(y, a##c, x);
#define AB_SUM(c) s = vaddq_f32(s, a##c);
    AB_12(AB_DECL)
    float32x4_t s = vdupq_n_f32(0.0f);
    for (i = 0; i < n; i++) {
        AB_12(AB_FMA)
        __asm__ volatile("" : "+w"(a0), "+w"(a1), "+w"(a2), "+w"(a3), "+w"(a4), "+w"(a5),
                              "+w"(a6), "+w"(a7), "+w"(a8), "+w"(a9), "+w"(a10), "+w"(a11));
    }
    AB_12(AB_SUM)
#undef AB_DECL
#undef AB_FMA
#undef AB_SUM
    return vgetq_lane_f32(s, 0) > 1e30f ? 0 : (double)n * 12 * 8;
}
#endif
/* Scalar chains for the portable path (what plain C code can reach). */
static double ab_fma_scalar(long n) {
    volatile float sink;
    float x = 0.999f, y = 1e-3f, s = 0.0f;
    long i;
#define AB_DECL(c) float a##c = (float)(c);
#define AB_FMA(c) a##c = a##c * x + y;
#define AB_SUM(c) s += a##c;
    AB_12(AB_DECL)
    for (i = 0; i < n; i++) { AB_12(AB_FMA) }
    AB_12(AB_SUM)
#undef AB_DECL
#undef AB_FMA
#undef AB_SUM
    sink = s;
    (void)sink;
    return (double)n * 12 * 2;
}

typedef struct ab_thread_arg {
    mskv_cpu_isa isa;
    const float *buf;
    size_t n;
    double flops, sum;
} ab_thread_arg;

#if defined(__x86_64__) || defined(__i386__)
/* The paths whose kernels are 16-float AVX-512 vectors (the limits follow them). */
static int ab_avx512_wide(mskv_cpu_isa isa) {
    return isa == MSKV_CPU_ISA_AVX512 || isa == MSKV_CPU_ISA_AVX512_BF16 || isa == MSKV_CPU_ISA_AMX_BF16;
}
#endif

static void *ab_fma_thread(void *p) {
    ab_thread_arg *a = (ab_thread_arg *)p;
    long n = (long)a->n;
#if defined(__x86_64__) || defined(__i386__)
    if (ab_avx512_wide(a->isa)) { a->flops = ab_fma_avx512(n); return NULL; }
    if (a->isa == MSKV_CPU_ISA_AVX2) { a->flops = ab_fma_avx2(n); return NULL; }
#endif
#if defined(__aarch64__)
    if (a->isa == MSKV_CPU_ISA_NEON) { a->flops = ab_fma_neon(n); return NULL; }
#endif
    a->flops = ab_fma_scalar(n / 4);
    return NULL;
}

/* The bf16 peak, on the avx512_bf16 and amx_bf16 paths only (ab_limits.bf16_why says why not). */
static void *ab_dp_thread(void *p) {
    ab_thread_arg *a = (ab_thread_arg *)p;
    a->flops = 0;
#if MSKV__CPU_BF16_X86
    if (a->isa == MSKV_CPU_ISA_AVX512_BF16) a->flops = ab_dpbf16_avx512((long)a->n);
#endif
#if MSKV__CPU_AMX
    if (a->isa == MSKV_CPU_ISA_AMX_BF16) a->flops = ab_dp_amx((long)a->n);
#endif
    return NULL;
}

/* Sums floats with 8 independent accumulators (named, so they stay in
   registers; the loop is bound by the loads), with the vector width of the
   instruction-set path in use: the same loads the kernels issue. */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static double ab_read_avx512(const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    float out[16];
    size_t i;
    for (i = 0; i + 128 <= n; i += 128) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(b + i)); s1 = _mm512_add_ps(s1, _mm512_loadu_ps(b + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(b + i + 32)); s3 = _mm512_add_ps(s3, _mm512_loadu_ps(b + i + 48));
        s4 = _mm512_add_ps(s4, _mm512_loadu_ps(b + i + 64)); s5 = _mm512_add_ps(s5, _mm512_loadu_ps(b + i + 80));
        s6 = _mm512_add_ps(s6, _mm512_loadu_ps(b + i + 96)); s7 = _mm512_add_ps(s7, _mm512_loadu_ps(b + i + 112));
    }
    s0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)), _mm512_add_ps(_mm512_add_ps(s4, s5), _mm512_add_ps(s6, s7)));
    _mm512_storeu_ps(out, s0);
    return out[0];
}
__attribute__((target("avx2"))) static double ab_read_avx2(const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    float out[8];
    size_t i;
    for (i = 0; i + 64 <= n; i += 64) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(b + i)); s1 = _mm256_add_ps(s1, _mm256_loadu_ps(b + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(b + i + 16)); s3 = _mm256_add_ps(s3, _mm256_loadu_ps(b + i + 24));
        s4 = _mm256_add_ps(s4, _mm256_loadu_ps(b + i + 32)); s5 = _mm256_add_ps(s5, _mm256_loadu_ps(b + i + 40));
        s6 = _mm256_add_ps(s6, _mm256_loadu_ps(b + i + 48)); s7 = _mm256_add_ps(s7, _mm256_loadu_ps(b + i + 56));
    }
    s0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)), _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    _mm256_storeu_ps(out, s0);
    return out[0];
}
#endif
#if defined(__aarch64__)
static double ab_read_neon(const float *b, size_t n) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t i;
    for (i = 0; i + 32 <= n; i += 32) {
        s0 = vaddq_f32(s0, vld1q_f32(b + i)); s1 = vaddq_f32(s1, vld1q_f32(b + i + 4));
        s2 = vaddq_f32(s2, vld1q_f32(b + i + 8)); s3 = vaddq_f32(s3, vld1q_f32(b + i + 12));
        s4 = vaddq_f32(s4, vld1q_f32(b + i + 16)); s5 = vaddq_f32(s5, vld1q_f32(b + i + 20));
        s6 = vaddq_f32(s6, vld1q_f32(b + i + 24)); s7 = vaddq_f32(s7, vld1q_f32(b + i + 28));
    }
    s0 = vaddq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)), vaddq_f32(vaddq_f32(s4, s5), vaddq_f32(s6, s7)));
    return vgetq_lane_f32(s0, 0);
}
#endif
static void *ab_read_thread(void *p) {
    ab_thread_arg *a = (ab_thread_arg *)p;
    const float *b = a->buf;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    size_t i;
#if defined(__x86_64__) || defined(__i386__)
    if (ab_avx512_wide(a->isa)) { a->sum = ab_read_avx512(b, a->n); return NULL; }
    if (a->isa == MSKV_CPU_ISA_AVX2) { a->sum = ab_read_avx2(b, a->n); return NULL; }
#endif
#if defined(__aarch64__)
    if (a->isa == MSKV_CPU_ISA_NEON) { a->sum = ab_read_neon(b, a->n); return NULL; }
#endif
    for (i = 0; i + 8 <= a->n; i += 8) {
        s0 += b[i]; s1 += b[i + 1]; s2 += b[i + 2]; s3 += b[i + 3];
        s4 += b[i + 4]; s5 += b[i + 5]; s6 += b[i + 6]; s7 += b[i + 7];
    }
    a->sum = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    return NULL;
}

/* Runs fn on `threads` threads (the caller is one), each on its share of buf;
   returns wall seconds. */
static double ab_parallel(void *(*fn)(void *), int32_t threads, mskv_cpu_isa isa, const float *buf, size_t n, double *flops) {
    pthread_t th[64];
    ab_thread_arg args[64];
    double t0;
    int32_t i;
    if (threads > 64) threads = 64;
    for (i = 0; i < threads; i++) {
        args[i].isa = isa;
        args[i].buf = buf ? buf + n / (size_t)threads * (size_t)i : NULL;
        args[i].n = n / (size_t)threads;
        args[i].flops = args[i].sum = 0;
    }
    t0 = ab_now();
    for (i = 1; i < threads; i++) pthread_create(&th[i], NULL, fn, &args[i]);
    fn(&args[0]);
    for (i = 1; i < threads; i++) pthread_join(th[i], NULL);
    t0 = ab_now() - t0;
    if (flops) for (*flops = 0, i = 0; i < threads; i++) *flops += args[i].flops;
    return t0;
}

/* The machine's limits, kept as the best of short runs that alternate with
   the kernel being measured (ab_limits_round), so a load that slows one
   slows the other too. One FMA run is 4 million iterations of 12 chains a
   thread (a few milliseconds); *per_core is GFLOP per second of CPU time the
   threads got (one core's peak, which a busy machine lowers less). */
typedef struct ab_limits {
    int32_t threads;
    mskv_cpu_isa isa;
    float *buf;          /* the read-bandwidth buffer */
    size_t bytes;
    double fma, fma_core, bw;
    double bf16;         /* the bf16 peak (avx512_bf16: vdpbf16ps, amx_bf16: tiles), GFLOP/s; 0 when bf16_why */
    const char *bf16_why;
    int runs;
} ab_limits;

static void ab_limits_round(ab_limits *l) {
    double flops, t, c;
    c = ab_cpu_now();
    t = ab_parallel(ab_fma_thread, l->threads, l->isa, NULL, (size_t)4000000 * (size_t)l->threads, &flops);
    c = ab_cpu_now() - c;
    if (flops / t * 1e-9 > l->fma) l->fma = flops / t * 1e-9;
    if (c > 0 && flops / c * 1e-9 > l->fma_core) l->fma_core = flops / c * 1e-9;
    if (!l->bf16_why) {
        t = ab_parallel(ab_dp_thread, l->threads, l->isa, NULL, (size_t)4000000 * (size_t)l->threads, &flops);
        if (flops / t * 1e-9 > l->bf16) l->bf16 = flops / t * 1e-9;
    }
    if (l->buf) {
        t = ab_parallel(ab_read_thread, l->threads, l->isa, l->buf, l->bytes / 4, NULL);
        if ((double)l->bytes / t * 1e-9 > l->bw) l->bw = (double)l->bytes / t * 1e-9;
    }
    l->runs++;
}

/* The read-bandwidth buffer: 4x the last-level cache (at least 512 MiB, at
   most 2 GiB), every page touched before it is timed. */
static int ab_limits_init(ab_limits *l, int32_t threads, mskv_cpu_isa isa) {
    long llc = 0;
    size_t i;
    memset(l, 0, sizeof *l);
    l->threads = threads;
    l->isa = isa;
    if (isa == MSKV_CPU_ISA_BF16_EMU)
        l->bf16_why = "the bf16_emu path emulates vdpbf16ps in plain C: no instruction peak to compare with";
    else if (isa != MSKV_CPU_ISA_AVX512_BF16 && isa != MSKV_CPU_ISA_AMX_BF16)
        l->bf16_why = mskv_cpu_isa_available(MSKV_CPU_ISA_AVX512_BF16)
                          ? "the path in use has no bf16 products (MSKV_CPU_ISA forces another)"
                          : "this CPU or build lacks AVX512_BF16 (vdpbf16ps): speed on such hardware is unmeasured";
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    l->bytes = llc > 0 ? 4 * (size_t)llc : (size_t)1 << 30;
    if (l->bytes < ((size_t)512 << 20)) l->bytes = (size_t)512 << 20;
    if (l->bytes > ((size_t)2 << 30)) l->bytes = (size_t)2 << 30;
    l->buf = (float *)malloc(l->bytes);
    if (!l->buf) return 0;
    for (i = 0; i < l->bytes / 4; i++) l->buf[i] = (float)(i & 7);
    return 1;
}

typedef struct ab_shape {
    const char *name;
    int32_t batch, qo, kv, q_heads, kv_heads, dim, page_size;
    mskv_dtype dtype;
    mskv_mask mask;
} ab_shape;

typedef struct ab_case {
    mskv_pools pools;
    mskv_plan plan;
    void *k, *v, *q;
    float *o, *lse;
    int32_t *qo_indptr, *kv_indptr, *indices, *last, *kv_len, *split, *shift;
} ab_case;

static int ab_setup(const ab_shape *s, ab_case *c) {
    int32_t pages_per = (s->kv + s->page_size - 1) / s->page_size, b, i;
    int64_t num_pages = (int64_t)s->batch * pages_per + 1, n, e;
    size_t es = mskv_dtype_size(s->dtype);
    memset(c, 0, sizeof(*c));
    n = num_pages * s->page_size * s->kv_heads * s->dim;
    c->k = malloc((size_t)n * es);
    c->v = malloc((size_t)n * es);
    e = (int64_t)s->batch * s->qo * s->q_heads * s->dim;
    c->q = malloc((size_t)e * es);
    c->o = (float *)malloc((size_t)e * 4);
    c->lse = (float *)malloc((size_t)s->batch * s->qo * s->q_heads * 4);
    c->qo_indptr = (int32_t *)malloc(sizeof(int32_t) * (size_t)(s->batch + 1));
    c->kv_indptr = (int32_t *)malloc(sizeof(int32_t) * (size_t)(s->batch + 1));
    c->indices = (int32_t *)malloc(sizeof(int32_t) * (size_t)(num_pages));
    c->last = (int32_t *)malloc(sizeof(int32_t) * (size_t)s->batch * 4);
    if (!c->k || !c->v || !c->q || !c->o || !c->lse || !c->qo_indptr || !c->kv_indptr || !c->indices || !c->last) return 0;
    c->kv_len = c->last + s->batch;
    c->split = c->kv_len + s->batch;
    c->shift = c->split + s->batch;
    for (i = 0; i < n; i++) {
        if (s->dtype == MSKV_DTYPE_F32) { ((float *)c->k)[i] = ab_rand(); ((float *)c->v)[i] = ab_rand(); }
        else if (s->dtype == MSKV_DTYPE_BF16) { ((uint16_t *)c->k)[i] = mskv_f32_to_bf16(ab_rand()); ((uint16_t *)c->v)[i] = mskv_f32_to_bf16(ab_rand()); }
        else { ((uint16_t *)c->k)[i] = mskv_f32_to_f16(ab_rand()); ((uint16_t *)c->v)[i] = mskv_f32_to_f16(ab_rand()); }
    }
    for (i = 0; i < e; i++) {
        float x = 2.0f * ab_rand();
        if (s->dtype == MSKV_DTYPE_F32) ((float *)c->q)[i] = x;
        else if (s->dtype == MSKV_DTYPE_BF16) ((uint16_t *)c->q)[i] = mskv_f32_to_bf16(x);
        else ((uint16_t *)c->q)[i] = mskv_f32_to_f16(x);
    }
    /* pages interleaved across sequences, as a busy arena hands them out */
    c->qo_indptr[0] = c->kv_indptr[0] = 0;
    for (b = 0; b < s->batch; b++) {
        for (i = 0; i < pages_per; i++) c->indices[b * pages_per + i] = 1 + i * s->batch + b;
        c->qo_indptr[b + 1] = c->qo_indptr[b] + s->qo;
        c->kv_indptr[b + 1] = c->kv_indptr[b] + pages_per;
        c->last[b] = s->kv - (pages_per - 1) * s->page_size;
        c->kv_len[b] = s->kv;
        c->split[b] = s->kv;
        c->shift[b] = 0;
    }
    c->plan.batch = s->batch;
    c->plan.total_q = s->batch * s->qo;
    c->plan.num_page_ids = s->batch * pages_per;
    c->plan.page_size = s->page_size;
    c->plan.qo_indptr = c->qo_indptr;
    c->plan.kv_indptr = c->kv_indptr;
    c->plan.kv_indices = c->indices;
    c->plan.kv_last_page_len = c->last;
    c->plan.kv_len = c->kv_len;
    c->plan.kv_pos_split = c->split;
    c->plan.kv_pos_shift = c->shift;
    c->pools.k = c->k; c->pools.v = c->v; c->pools.dtype = s->dtype;
    c->pools.num_pages = (int32_t)num_pages; c->pools.page_size = s->page_size;
    c->pools.kv_heads = s->kv_heads; c->pools.head_dim = s->dim;
    return 1;
}

static void ab_free(ab_case *c) {
    free(c->k); free(c->v); free(c->q); free(c->o); free(c->lse);
    free(c->qo_indptr); free(c->kv_indptr); free(c->indices); free(c->last);
}

static float ab_get(const void *p, mskv_dtype t, size_t i) {
    if (t == MSKV_DTYPE_F32) return ((const float *)p)[i];
    if (t == MSKV_DTYPE_BF16) return mskv_bf16_to_f32(((const uint16_t *)p)[i]);
    return mskv_f16_to_f32(((const uint16_t *)p)[i]);
}

/* The naive loop over the first `rows` (query, head) rows, in row-major order;
   bidirectional only (the shapes here are). Output f32 into out. */
static void ab_naive(const ab_shape *s, const ab_case *c, int64_t rows, float *out, float *scores) {
    int64_t r;
    int32_t D = s->dim, P = s->page_size, group = s->q_heads / s->kv_heads;
    float scale = 1.0f / sqrtf((float)D);
    for (r = 0; r < rows; r++) {
        int64_t tok = r / s->q_heads;
        int32_t h = (int32_t)(r % s->q_heads), b = (int32_t)(tok / s->qo), g = h / group, j, d;
        const int32_t *pages = c->indices + c->kv_indptr[b];
        float mx = -INFINITY, sum = 0.0f, *o = out + r * D;
        for (j = 0; j < s->kv; j++) {
            size_t el = (((size_t)pages[j / P] * P + (size_t)(j % P)) * (size_t)s->kv_heads + (size_t)g) * (size_t)D;
            float dot = 0.0f;
            for (d = 0; d < D; d++) dot += ab_get(c->q, s->dtype, (size_t)r * D + d) * ab_get(c->k, s->dtype, el + d);
            scores[j] = dot * scale;
            if (scores[j] > mx) mx = scores[j];
        }
        for (d = 0; d < D; d++) o[d] = 0.0f;
        for (j = 0; j < s->kv; j++) {
            size_t el = (((size_t)pages[j / P] * P + (size_t)(j % P)) * (size_t)s->kv_heads + (size_t)g) * (size_t)D;
            float p = expf(scores[j] - mx);
            sum += p;
            for (d = 0; d < D; d++) o[d] += p * ab_get(c->v, s->dtype, el + d);
        }
        for (d = 0; d < D; d++) o[d] /= sum;
    }
}

/* ---- the plain baseline: llama.cpp-style row-at-a-time f16 attention ----
   Written here for this bench (not ggml's code; the same kind of loop as
   ggml's CPU flash attention): per (query, head) row, for each key, the page
   and slot from the page table, one f16 dot product of the query row with the
   K row (F16C conversion + FMA, 8 lanes, with 4 accumulators; scalar on other
   paths), an online-softmax update, and one multiply-add of the V row into an
   f32 accumulator. K, V and Q are f16 copies of the bench's bf16 data. Rows
   are split evenly across the same threads. */
typedef struct ab_base {
    const ab_shape *s;
    const ab_case *c;
    const uint16_t *k, *v, *q;
    float *out;
    int64_t r0, r1;
    int simd;
} ab_base;

static float ab_dot_f16(const uint16_t *x, const uint16_t *y, int32_t n) {
    float s = 0.0f;
    int32_t i;
    for (i = 0; i < n; i++) s += mskv_f16_to_f32(x[i]) * mskv_f16_to_f32(y[i]);
    return s;
}
static void ab_mad_f16(float *acc, const uint16_t *v, float w, int32_t n) {
    int32_t i;
    for (i = 0; i < n; i++) acc[i] += w * mskv_f16_to_f32(v[i]);
}
#if defined(__x86_64__) || defined(__i386__)
#define AB_H8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
__attribute__((target("avx2,fma,f16c"))) static float ab_dot_f16_avx2(const uint16_t *x, const uint16_t *y, int32_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    float out[8], s;
    int32_t i;
    for (i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(AB_H8(x + i), AB_H8(y + i), s0);
        s1 = _mm256_fmadd_ps(AB_H8(x + i + 8), AB_H8(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(AB_H8(x + i + 16), AB_H8(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(AB_H8(x + i + 24), AB_H8(y + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(AB_H8(x + i), AB_H8(y + i), s0);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    s = out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
    return s + ab_dot_f16(x + i, y + i, n - i);
}
__attribute__((target("avx2,fma,f16c"))) static void ab_mad_f16_avx2(float *acc, const uint16_t *v, float w, int32_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    int32_t i;
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(AB_H8(v + i), wv, _mm256_loadu_ps(acc + i)));
    ab_mad_f16(acc + i, v + i, w, n - i);
}
#undef AB_H8
#endif

static void *ab_base_thread(void *p) {
    const ab_base *w = (const ab_base *)p;
    const ab_shape *s = w->s;
    int32_t D = s->dim, P = s->page_size, group = s->q_heads / s->kv_heads, j, d;
    float scale = 1.0f / sqrtf((float)D), acc[512];
    int64_t r;
    for (r = w->r0; r < w->r1; r++) {
        int64_t tok = r / s->q_heads;
        int32_t h = (int32_t)(r % s->q_heads), b = (int32_t)(tok / s->qo), g = h / group;
        const int32_t *pages = w->c->indices + w->c->kv_indptr[b];
        const uint16_t *q = w->q + (size_t)r * (size_t)D;
        float m = -INFINITY, l = 0.0f;
        for (d = 0; d < D; d++) acc[d] = 0.0f;
        for (j = 0; j < s->kv; j++) {
            size_t el = (((size_t)pages[j / P] * (size_t)P + (size_t)(j % P)) * (size_t)s->kv_heads + (size_t)g) * (size_t)D;
            float x, e;
#if defined(__x86_64__) || defined(__i386__)
            x = (w->simd ? ab_dot_f16_avx2(q, w->k + el, D) : ab_dot_f16(q, w->k + el, D)) * scale;
#else
            x = ab_dot_f16(q, w->k + el, D) * scale;
#endif
            if (x > m) {  /* a new maximum: rescale what is summed so far */
                float ms = expf(m - x);
                for (d = 0; d < D; d++) acc[d] *= ms;
                l *= ms;
                m = x;
                e = 1.0f;
            } else {
                e = expf(x - m);
            }
            l += e;
#if defined(__x86_64__) || defined(__i386__)
            if (w->simd) ab_mad_f16_avx2(acc, w->v + el, e, D);
            else ab_mad_f16(acc, w->v + el, e, D);
#else
            ab_mad_f16(acc, w->v + el, e, D);
#endif
        }
        for (d = 0; d < D; d++) w->out[(size_t)r * (size_t)D + (size_t)d] = acc[d] / l;
    }
    return NULL;
}

/* Seconds for one baseline call over every row on `threads` threads. */
static double ab_baseline(const ab_base *proto, int32_t threads, int64_t rows) {
    pthread_t th[64];
    ab_base w[64];
    double t0;
    int32_t i;
    if (threads > 64) threads = 64;
    for (i = 0; i < threads; i++) {
        w[i] = *proto;
        w[i].r0 = rows * i / threads;
        w[i].r1 = rows * (i + 1) / threads;
    }
    t0 = ab_now();
    for (i = 1; i < threads; i++) pthread_create(&th[i], NULL, ab_base_thread, &w[i]);
    ab_base_thread(&w[0]);
    for (i = 1; i < threads; i++) pthread_join(th[i], NULL);
    return ab_now() - t0;
}

/* An f16 copy of n values of dtype t. */
static uint16_t *ab_to_f16(const void *p, mskv_dtype t, size_t n) {
    uint16_t *h = (uint16_t *)malloc(n * 2 + 2);
    size_t i;
    if (h) for (i = 0; i < n; i++) h[i] = mskv_f32_to_f16(ab_get(p, t, i));
    return h;
}

static int ab_reps; /* calls the last ab_time_attention made */

/* Best seconds per call over repeats lasting at least min_s in all. */
static double ab_time_attention(mskv_cpu *cpu, const ab_shape *s, ab_case *c, double min_s) {
    mskv_attn at;
    double best = 1e30, t0 = ab_now();
    int reps = 0;
    memset(&at, 0, sizeof at);
    at.q_heads = s->q_heads; at.mask = s->mask; at.q_dtype = s->dtype;
    while (reps < 2 || ab_now() - t0 < min_s) {
        double t = ab_now(), dt;
        mskv_result r = mskv_cpu_attention_pools(cpu, &c->pools, &c->plan, &at, c->q, c->o, c->lse);
        dt = ab_now() - t;
        if (r != MSKV_SUCCESS) { fprintf(stderr, "attention failed: %s\n", mskv_result_string(r)); return -1; }
        if (dt < best) best = dt;
        reps++;
    }
    ab_reps = reps;
    return best;
}

/* K/V bytes one call reads: every visible key's K and V rows of every kv head, once. */
static double ab_kv_bytes(const ab_shape *s) {
    return 2.0 * (double)s->batch * (double)s->kv * (double)s->kv_heads * (double)s->dim * (double)mskv_dtype_size(s->dtype);
}

int main(int argc, char **argv) {
    static const ab_shape shapes[] = {
        {"video  d64   1 head,   720 q x 3840 k", 1, 720, 3840, 1, 1, 64, 16, MSKV_DTYPE_BF16, MSKV_MASK_NONE},
        {"video  d128  GQA 4:2, 1560 q x 4680 k", 1, 1560, 4680, 4, 2, 128, 40, MSKV_DTYPE_BF16, MSKV_MASK_NONE},
        {"decode d128  GQA 32:8, 64 seq x 1 q x 4096 k", 64, 1, 4096, 32, 8, 128, 16, MSKV_DTYPE_BF16, MSKV_MASK_NONE},
    };
    const int rounds = 5;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int32_t threads = nproc > 0 ? (int32_t)nproc : 1;
    mskv_cpu *probe = NULL;
    mskv_cpu_info info;
    ab_limits lim;
    size_t si;
    int base_simd = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);   /* each line as it is made, into a pipe too */
    if (argc > 2 || (argc == 2 && (argv[1][0] == '-' || !argv[1][0]))) {
        fprintf(stderr, "usage: %s [WORD]   (only the shapes whose name holds WORD, e.g. decode, video, d64)\n", argv[0]);
        return 2;
    }
    if (mskv_cpu_create(NULL, &probe) != MSKV_SUCCESS || mskv_cpu_info_get(probe, &info) != MSKV_SUCCESS) return 1;
    mskv_cpu_destroy(probe);
    {   /* a path named but not run here (the library logs it and runs AUTO's): say so, measure nothing */
        const char *want = getenv("MSKV_CPU_ISA");
        if (want && *want && strcmp(want, "auto") != 0 && strcmp(want, mskv_cpu_isa_name(info.isa)) != 0) {
            printf("attn_bench: MSKV_CPU_ISA=%s cannot run here (this CPU or build lacks the path; AUTO would run %s): nothing measured\n",
                   want, mskv_cpu_isa_name(info.isa));
            return 0;
        }
    }
#if defined(__x86_64__) || defined(__i386__)
    base_simd = info.isa == MSKV_CPU_ISA_AVX2 || ab_avx512_wide(info.isa);
#endif
    if (!ab_limits_init(&lim, threads, info.isa)) { fprintf(stderr, "out of memory\n"); return 1; }
    printf("attn_bench: paged attention, bf16 storage and Q/O, f32 accumulation; %d threads; ISA path %s\n", (int)threads,
           mskv_cpu_isa_name(info.isa));
    printf("limits, measured in the same run on the same %d threads with the path's vector width (%s): f32 FMA peak "
           "(12 chains a thread) and a streaming read of %.0f MiB, best of %d short runs alternating with each shape's "
           "calls\n", (int)threads, info.isa == MSKV_CPU_ISA_PORTABLE || info.isa == MSKV_CPU_ISA_BF16_EMU ? "scalar" : mskv_cpu_isa_name(info.isa),
           (double)lim.bytes / 1048576.0, rounds);
    if (lim.bf16_why) printf("bf16 dot peak: not measured (%s)\n", lim.bf16_why);
    else if (info.isa == MSKV_CPU_ISA_AMX_BF16)
        printf("bf16 dot peak: AMX tiles (TDPBF16PS), 4 accumulator tiles a thread, same threads and runs as the FMA peak\n");
    else printf("bf16 dot peak: vdpbf16ps, 12 chains a thread, same threads and runs as the FMA peak\n");
    printf("baseline: row-at-a-time f16 dot attention written here (llama.cpp-style; %s), same threads, same pages\n",
           base_simd ? "F16C + FMA, 8 lanes" : "scalar");
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const ab_shape *s = &shapes[si];
        ab_case c;
        ab_base bw;
        mskv_cpu *one = NULL, *all = NULL;
        mskv_cpu_desc cd;
        int64_t rows = (int64_t)s->batch * s->qo * s->q_heads, naive_rows;
        size_t nkv = (size_t)(s->batch * ((s->kv + s->page_size - 1) / s->page_size) + 1) * (size_t)s->page_size *
                     (size_t)s->kv_heads * (size_t)s->dim;
        double flops = 4.0 * (double)rows * (double)s->kv * (double)s->dim, t1, tn = 1e30, tb = 1e30;
        double maxdiff = 0, basediff = 0, tb_sum = 0, cpu_s = 0, wall_s = 0, util, gf;
        int decode = s->qo == 1, r, reps = 0;
        float *naive_o, *scores, *base_o;
        int64_t i;
        if (argc == 2 && !strstr(s->name, argv[1])) continue;
        if (!ab_setup(s, &c)) { fprintf(stderr, "out of memory\n"); return 1; }
        memset(&cd, 0, sizeof cd);
        cd.num_threads = 1;
        if (mskv_cpu_create(&cd, &one) != MSKV_SUCCESS) return 1;
        cd.num_threads = threads;
        if (mskv_cpu_create(&cd, &all) != MSKV_SUCCESS) return 1;
        /* the naive loop checks both, on about 1/16 of the rows (never fewer than q_heads) */
        naive_rows = rows / 16 > s->q_heads ? rows / 16 : (rows < s->q_heads ? rows : s->q_heads);
        naive_o = (float *)malloc((size_t)naive_rows * (size_t)s->dim * 4);
        scores = (float *)malloc((size_t)s->kv * 4);
        base_o = (float *)malloc((size_t)rows * (size_t)s->dim * 4);
        memset(&bw, 0, sizeof bw);
        bw.s = s; bw.c = &c; bw.out = base_o; bw.simd = base_simd;
        bw.k = ab_to_f16(c.k, s->dtype, nkv);
        bw.v = ab_to_f16(c.v, s->dtype, nkv);
        bw.q = ab_to_f16(c.q, s->dtype, (size_t)rows * (size_t)s->dim);
        if (!naive_o || !scores || !base_o || !bw.k || !bw.v || !bw.q) { fprintf(stderr, "out of memory\n"); return 1; }
        ab_naive(s, &c, naive_rows, naive_o, scores);
        t1 = ab_time_attention(one, s, &c, 0.5);
        if (t1 < 0) return 1;
        lim.fma = lim.fma_core = lim.bw = 0;   /* this shape's window */
        lim.runs = 0;
        for (r = 0; r < rounds; r++) {  /* limits, kernel, baseline, in turn */
            double c0, w0, t;
            ab_limits_round(&lim);
            c0 = ab_cpu_now();
            w0 = ab_now();
            t = ab_time_attention(all, s, &c, 0.2);
            cpu_s += ab_cpu_now() - c0;
            wall_s += ab_now() - w0;
            reps += ab_reps;
            if (t < 0) return 1;
            if (t < tn) tn = t;
            if (tb_sum < 2.0) {  /* a slow (scalar) baseline: fewer rounds */
                t = ab_baseline(&bw, threads, rows);
                tb_sum += t;
                if (t < tb) tb = t;
            }
        }
        util = cpu_s / wall_s;
        /* the all-thread run leaves its output in c.o */
        for (i = 0; i < naive_rows * s->dim; i++) {
            double d = fabs((double)naive_o[i] - (double)ab_get(c.o, s->dtype, (size_t)i));
            double e = fabs((double)naive_o[i] - (double)base_o[i]);
            if (d > maxdiff) maxdiff = d;
            if (e > basediff) basediff = e;
        }
        gf = flops / tn * 1e-9;
        printf("\n%s\n", s->name);
        printf("  limits in this window: f32 FMA peak %.1f GFLOP/s (%.1f per CPU-second), read %.1f GB/s\n", lim.fma,
               lim.fma_core, lim.bw);
        if (!lim.bf16_why) printf("  bf16 dot peak in this window: %.1f GFLOP/s\n", lim.bf16);
        printf("  %-28s %8s %10s %10s %10s %12s\n", "", "threads", "ms/call", "GFLOP/s", "x baseline",
               decode ? "of read bw" : "of FMA peak");
        if (decode) {
            double kv = ab_kv_bytes(s);
            printf("  %-28s %8d %10.2f %10.2f %10s %11.0f%%   K/V read at %.1f GB/s\n", "baseline (f16 rows)", (int)threads,
                   tb * 1e3, flops / tb * 1e-9, "1.0", 100.0 * kv / tb * 1e-9 / lim.bw, kv / tb * 1e-9);
            printf("  %-28s %8d %10.2f %10.2f %9.2fx %11s\n", "mstar_kv", 1, t1 * 1e3, flops / t1 * 1e-9, tb / t1, "");
            printf("  %-28s %8d %10.2f %10.2f %9.2fx %11.0f%%   K/V read at %.1f GB/s\n", "mstar_kv", (int)threads,
                   tn * 1e3, gf, tb / tn, 100.0 * kv / tn * 1e-9 / lim.bw, kv / tn * 1e-9);
        } else {
            printf("  %-28s %8d %10.2f %10.2f %10s %11.0f%%\n", "baseline (f16 rows)", (int)threads, tb * 1e3,
                   flops / tb * 1e-9, "1.0", 100.0 * flops / tb * 1e-9 / lim.fma);
            printf("  %-28s %8d %10.2f %10.2f %9.2fx %11s\n", "mstar_kv", 1, t1 * 1e3, flops / t1 * 1e-9, tb / t1, "");
            /* and per second of CPU time, against the peak's: the fraction a busy machine distorts least */
            printf("  %-28s %8d %10.2f %10.2f %9.2fx %11.0f%%   (mean per CPU-second: %.0f%%)\n", "mstar_kv", (int)threads,
                   tn * 1e3, gf, tb / tn, 100.0 * gf / lim.fma, 100.0 * flops * reps / cpu_s * 1e-9 / lim.fma_core);
            if (!lim.bf16_why && lim.bf16 > 0)
                printf("  %-28s %8s %10s %10s %10s %11.0f%%   of the bf16 dot peak (bf16 pool: Q.K and P.V as bf16 products)\n",
                       "", "", "", "", "", 100.0 * gf / lim.bf16);
        }
        printf("  cores busy %.2f; max |mstar_kv - naive| %.2g, max |baseline - naive| %.2g (%lld of %lld rows)\n", util,
               maxdiff, basediff, (long long)naive_rows, (long long)rows);
        if (threads > 1 && util < 0.75 * (double)threads)
            printf("  (the threads got %.2f of %d cores: the machine is busy, the all-thread figures are low)\n", util,
                   (int)threads);
        free(naive_o); free(scores); free(base_o);
        free((void *)bw.k); free((void *)bw.v); free((void *)bw.q);
        mskv_cpu_destroy(one);
        mskv_cpu_destroy(all);
        ab_free(&c);
    }
    free(lim.buf);
    return 0;
}
