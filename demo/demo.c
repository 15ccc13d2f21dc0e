/* demo.c - windowed autoregressive video generation on an mstar_kv paged KV
   cache, streamed to an .mp4.

   A synthetic but honest model (no weights can be downloaded): an analytic
   scene gives the true latent frames (demo_scene.h); the model produces each
   window's frames by attention over the KV cache, starting from seeded noise
   and refining over a few denoise steps; a causal decoder turns latents into
   RGB frames on a second thread while the next window is denoised, and an
   encoder writes them (demo_video.h). Everything that touches the cache goes
   through the public API of mstar_kv.h.

   The model. A token is a 2x2 patch of the 16-channel latent (head_dim 64).
   Keys encode where a token is (frame, row, column); values are its latent
   channels. A query encodes where the token came from: head 0 looks at the
   previous frame (the band's motion, one step back), head 1 at the anchor
   frame (the prompt frame in kv mode, the first conditioning frame in chained
   mode, the motion traced back that far). The output is the mean of both
   heads. The scale makes the softmax pick the exact key, so with a correct
   cache the result reproduces the scene; a wrong, stale or lost K/V entry
   shows up as a PSNR drop against the truth.

   Denoising. A window starts from seeded noise. Every step writes the window's
   K/V into its reserved slots (scratch until the chunk is committed) and
   attends over the committed context plus the window itself (bidirectional),
   then replaces the window's latents with the output: a Jacobi sweep in which
   a window frame becomes exact one step after the frame before it.

   Guidance (--cfg SCALE, kv mode): two branches, a request each, bound into
   a lockstep group and planned as one batch; their outputs combine as
   o_uncond + SCALE (o_cond - o_uncond). See demo_run_cfg for why the guided
   video is still the analytic truth.

   Backends (--backend): the host store and CPU attention of mstar_kv.h, or a
   device store with the GPU kernels of mstar_kv_cuda.h, which loads the CUDA
   driver and NVRTC at run time (no toolkit at build time; without a GPU,
   --backend cuda says why and auto falls back to the CPU). Only the storage
   and attention calls differ; the model, the cache bookkeeping (through the
   arena, whose offload/reload use the device store's ops) and --check are
   the same code for both.

   Build (the Makefile does this):
     cc -std=c99 -O2 $(pkg-config --cflags libavformat libavcodec libswscale libavutil) demo/demo.c \
        -o build/demo $(pkg-config --libs libavformat libavcodec libswscale libavutil) -ldl -lpthread -lm
   Without FFmpeg: cc -std=c99 -O2 -DMSKV_DEMO_NO_FFMPEG demo/demo.c -o build/demo -ldl -lpthread -lm */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "demo_scene.h"
#include "demo_video.h"

#define DEMO_FPS 16
#define DEMO_PSNR_MIN 40.0       /* dB against the analytic truth, both modes */
#define DEMO_OVERLAP_MIN 0.2     /* --check: decode overlapped with denoising, of what could overlap at most (serial: 0) */
#define DEMO_QUEUE_CAP 2         /* finished windows waiting for the decoder */
#define DEMO_MAX_FRAMES 100000
#define DEMO_MAX_SIDE 4096

/* >>cli ----------------------------------------------------------------- */

typedef enum demo_mode { DEMO_MODE_KV = 0, DEMO_MODE_CHAINED = 1 } demo_mode;
typedef enum demo_backend_kind { DEMO_BACKEND_AUTO = 0, DEMO_BACKEND_CPU = 1, DEMO_BACKEND_CUDA = 2 } demo_backend_kind;
typedef enum demo_break { DEMO_BREAK_NONE = 0, DEMO_BREAK_PAGE = 1, DEMO_BREAK_STALE = 2, DEMO_BREAK_SINK = 3,
                          DEMO_BREAK_SERIAL = 4 /* not the cache: each window decoded before the next is denoised */ } demo_break;

typedef struct demo_cfg {
    int frames, width, height, window, overlap, sink, context, steps, threads, page_size;
    int offload, check, quiet;
    int timeline;            /* --timeline: a line per window, when its denoise and its decode ran */
    double progress;         /* --progress: least seconds between denoise-step lines */
    double cfg;              /* --cfg: the guidance scale; 0 = one branch */
    demo_mode mode;
    demo_backend_kind backend;
    int dtype;               /* the cache's mskv_dtype; -1 = the backend's default */
    uint64_t seed;
    const char *out;
    const char *dump_raw;
    demo_break brk;
} demo_cfg;

static void demo_help(void) {
    printf(
"usage: demo [options]\n"
"Generates a video window by window with a small synthetic attention model whose\n"
"memory is an mstar_kv paged KV cache, decodes it with a causal decoder on a second\n"
"thread and writes an .mp4 (H.264 through FFmpeg; .y4m when built without FFmpeg).\n"
"\n"
"  -o FILE              output file, a .mp4 or .y4m name (default demo.mp4; .y4m\n"
"                       writes uncompressed Y4M; without FFmpeg .mp4 becomes .y4m)\n"
"  --frames N           pixel frames (default 81 = 21 latent frames; T latents\n"
"                       decode to 1 + 4(T-1) frames)\n"
"  --width N            pixels, a multiple of 16 (default 320)\n"
"  --height N           pixels, a multiple of 16 (default 192)\n"
"  --mode kv|chained    kv (default): each window attends to the earlier ones through\n"
"                       the cache, which keeps --sink chunks and the last --context\n"
"                       chunks and releases the rest, so memory stays flat;\n"
"                       chained: each window is denoised on its own, conditioned on\n"
"                       the previous window's last --overlap latent frames\n"
"  --window N           latent frames per window (default 3; one chunk in kv mode)\n"
"  --overlap N          chained mode: conditioning frames (default 1, 1..window-1)\n"
"  --sink N             kv mode: leading chunks kept for good (default 1; the first\n"
"                       holds the prompt frame)\n"
"  --context N          kv mode: most recent chunks kept besides the sink (default 2)\n"
"  --steps N            denoise steps per window (default --window + 1, so 4); a\n"
"                       window's j-th new frame is exact after j steps, so fewer\n"
"                       than --window leave noise behind (--check then fails)\n"
"  --backend B          cpu, cuda or auto (default): cuda runs the cache and the\n"
"                       attention on an NVIDIA GPU (mstar_kv_cuda.h: the driver and\n"
"                       NVRTC are loaded at run time); auto uses it when it is\n"
"                       usable and falls back to the CPU (saying so on stderr)\n"
"  --dtype T            the cache's storage: f32, f16 or bf16 (default: f32 on the\n"
"                       CPU; f16 on the GPU, whose tensor-core kernels need 16 bits)\n"
"  --threads N          attention threads (default: online cores, at most 8)\n"
"  --page-size N        tokens per KV cache page (default 16; any N >= 1)\n"
"  --cfg SCALE          kv mode: classifier-free guidance with two branches in\n"
"                       lockstep, o = o_uncond + SCALE (o_cond - o_uncond), SCALE in\n"
"                       (0, 100]; the conditional branch sees the prompt frame / SCALE,\n"
"                       the unconditional one a blank prompt, so the guided video is\n"
"                       the truth (--check judges it the same way)\n"
"  --offload            kv mode: park the cache in host memory between windows and\n"
"                       reload it (the output is bit-identical: compare latent_hash)\n"
"  --seed N             scene and noise seed, an unsigned 64-bit integer (default 1)\n"
"  --check              self-check, exit 1 if any part fails: exact frame count;\n"
"                       windowed decode byte-identical to decoding the whole latent\n"
"                       stream at once; PSNR against the analytic truth >= %.0f dB in every frame;\n"
"                       kv mode: peak KV pages within the sink + window bound;\n"
"                       decoding overlaps denoising (see decode_overlap below)\n"
"  --dump-raw FILE      also write every frame as raw RGB24 (what the tests compare)\n", DEMO_PSNR_MIN);
    printf(
"  --timeline           a line per window on stdout: when its denoise and its\n"
"                       decode ran (seconds from the start of generation)\n"
"  --progress S         at least S seconds between denoise-step progress lines\n"
"                       (default 1; 0: every step); a line per window regardless\n"
"  -q                   no progress lines and no estimate\n"
"  --help               this text\n"
"\n"
"Progress goes to stderr: the work to come, after the first denoise step an\n"
"estimate of the whole run, then a line per window and, at most every --progress\n"
"seconds, one per step. The summary (key=value fields) goes to stdout; in it\n"
"decode_overlap is the part of the decode time (windows with a next one) that ran\n"
"while the next windows were denoised, and overlap_of_possible that time over the\n"
"most that could overlap (the smaller of those decode and denoise times); --check\n"
"wants overlap_of_possible >= %.1f, or else that the generator never waited for\n"
"decoding (a loaded machine may run the short decodes between denoise steps).\n"
"Ctrl-C (SIGINT), SIGTERM or SIGHUP stops at the end of the denoise step in\n"
"progress and finishes the output with the frames written so far (a playable\n"
"file), then the demo dies of that signal; before the first frame it removes\n"
"the output and dies at once. A second signal kills it at once.\n"
"Exit status: 0 success, 1 failure, 2 usage error.\n", DEMO_OVERLAP_MIN);
}

static int demo_usage(const char *fmt, ...) {
    va_list ap;
    fputs("demo: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (try --help)\n", stderr);
    return 2;
}

static int demo_parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || !end || end == s || *end || v < lo || v > hi)
        return demo_usage("%s: expected an integer in [%ld, %ld], got '%s'", opt, lo, hi, s);
    *out = (int)v;
    return 0;
}

static int demo_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

/* The options that take a value (as --name VALUE or --name=VALUE): a name
   known here is checked before the argument after it is taken as its value,
   so a misspelt flag is reported as unknown, whatever follows it. */
static const char *const demo_valued_options[] = {
    "-o", "--output", "--dump-raw", "--progress", "--mode", "--backend", "--dtype", "--cfg", "--seed", "--frames",
    "--width", "--height", "--window", "--overlap", "--sink", "--context", "--steps", "--threads", "--page-size" };
static const char *const demo_flag_options[] = { "--help", "-h", "-q", "--quiet", "--check", "--offload", "--timeline" };

static int demo_known(const char *const *names, size_t n, const char *name) {
    size_t i;
    for (i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

/* 0 = run, 1 = --help shown, 2 = usage error (already reported) */
static int demo_parse(int argc, char **argv, demo_cfg *c) {
    int i;
    const char *brk = getenv("MSKV_DEMO_BREAK");   /* a deliberately broken cache, to see --check fail */
    memset(c, 0, sizeof(*c));
    c->frames = 81; c->width = 320; c->height = 192; c->window = 3; c->overlap = -1;
    c->sink = 1; c->context = 2; c->steps = 0; c->threads = demo_default_threads(); c->page_size = 16;
    c->seed = 1; c->out = "demo.mp4"; c->dtype = -1; c->progress = 1.0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        char name[32];
        const char *eq = strchr(a, '=');
        int *iv = NULL;
        long lo = 1, hi = INT_MAX;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { demo_help(); return 1; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { c->quiet = 1; continue; }
        if (!strcmp(a, "--check")) { c->check = 1; continue; }
        if (!strcmp(a, "--offload")) { c->offload = 1; continue; }
        if (!strcmp(a, "--timeline")) { c->timeline = 1; continue; }
        if (strncmp(a, "--", 2) != 0 && strcmp(a, "-o") != 0)
            return demo_usage("unexpected argument '%s'", a);
        if (eq && (size_t)(eq - a) < sizeof(name)) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = 0;
            val = eq + 1;
        } else if (eq) {
            return demo_usage("unknown option '%.*s'", (int)(eq - a), a);
        } else {
            snprintf(name, sizeof(name), "%s", a);
        }
        if (!demo_known(demo_valued_options, sizeof(demo_valued_options) / sizeof(demo_valued_options[0]), name)) {
            if (val && demo_known(demo_flag_options, sizeof(demo_flag_options) / sizeof(demo_flag_options[0]), name))
                return demo_usage("%s takes no value", name);
            return demo_usage("unknown option '%s'", val ? name : a);
        }
        if (!val) {
            if (i + 1 >= argc) return demo_usage("%s needs a value", a);
            val = argv[++i];
        }
        if (!strcmp(name, "-o") || !strcmp(name, "--output")) {
            if (!*val) return demo_usage("%s: an empty file name", name);
            c->out = val;
            continue;
        }
        if (!strcmp(name, "--dump-raw")) {   /* RGB24 frames, for the tests */
            if (!*val) return demo_usage("--dump-raw: an empty file name");
            c->dump_raw = val;
            continue;
        }
        if (!strcmp(name, "--progress")) {
            char *end = NULL;
            errno = 0;
            c->progress = strtod(val, &end);
            if (errno || !end || end == val || *end || !(c->progress >= 0.0 && c->progress <= 86400.0))
                return demo_usage("--progress: expected seconds in [0, 86400], got '%s'", val);
            continue;
        }
        if (!strcmp(name, "--mode")) {
            if (!strcmp(val, "kv")) c->mode = DEMO_MODE_KV;
            else if (!strcmp(val, "chained")) c->mode = DEMO_MODE_CHAINED;
            else return demo_usage("--mode: expected kv or chained, got '%s'", val);
            continue;
        }
        if (!strcmp(name, "--backend")) {
            if (!strcmp(val, "cpu")) c->backend = DEMO_BACKEND_CPU;
            else if (!strcmp(val, "cuda")) c->backend = DEMO_BACKEND_CUDA;
            else if (!strcmp(val, "auto")) c->backend = DEMO_BACKEND_AUTO;
            else return demo_usage("--backend: expected cpu, cuda or auto, got '%s'", val);
            continue;
        }
        if (!strcmp(name, "--dtype")) {
            if (!strcmp(val, "f32")) c->dtype = MSKV_DTYPE_F32;
            else if (!strcmp(val, "f16")) c->dtype = MSKV_DTYPE_F16;
            else if (!strcmp(val, "bf16")) c->dtype = MSKV_DTYPE_BF16;
            else return demo_usage("--dtype: expected f32, f16 or bf16, got '%s'", val);
            continue;
        }
        if (!strcmp(name, "--cfg")) {
            char *end = NULL;
            errno = 0;
            c->cfg = strtod(val, &end);
            if (errno || !end || end == val || *end || !(c->cfg > 0.0 && c->cfg <= 100.0))
                return demo_usage("--cfg: expected a guidance scale in (0, 100], got '%s'", val);
            continue;
        }
        if (!strcmp(name, "--seed")) {
            char *end = NULL;
            errno = 0;
            /* strtoull takes "-1" (and " 1", "+1") and wraps: digits only */
            if (*val < '0' || *val > '9') return demo_usage("--seed: expected an unsigned integer, got '%s'", val);
            c->seed = strtoull(val, &end, 0);
            if (errno || !end || end == val || *end) return demo_usage("--seed: expected an unsigned integer, got '%s'", val);
            continue;
        }
        if (!strcmp(name, "--frames")) { iv = &c->frames; hi = DEMO_MAX_FRAMES; }
        else if (!strcmp(name, "--width")) { iv = &c->width; lo = 16; hi = DEMO_MAX_SIDE; }
        else if (!strcmp(name, "--height")) { iv = &c->height; lo = 16; hi = DEMO_MAX_SIDE; }
        else if (!strcmp(name, "--window")) { iv = &c->window; hi = 64; }
        else if (!strcmp(name, "--overlap")) { iv = &c->overlap; lo = 0; hi = 63; }
        else if (!strcmp(name, "--sink")) { iv = &c->sink; lo = 0; hi = 64; }
        else if (!strcmp(name, "--context")) { iv = &c->context; lo = 0; hi = 64; }
        else if (!strcmp(name, "--steps")) { iv = &c->steps; hi = 64; }
        else if (!strcmp(name, "--threads")) { iv = &c->threads; hi = 256; }
        else if (!strcmp(name, "--page-size")) { iv = &c->page_size; hi = 65536; }
        else return demo_usage("unknown option '%s'", name);
        if (demo_parse_int(name, val, lo, hi, iv) != 0) return 2;
    }
    if (!demo_ends_with(c->out, ".mp4") && !demo_ends_with(c->out, ".y4m"))
        return demo_usage("-o: expected a .mp4 or .y4m file name, got '%s'", c->out);
    if (c->steps == 0) c->steps = c->window + 1;   /* a window's last new frame is exact after --window steps */
    if (c->width % (DEMO_UP * DEMO_P) || c->height % (DEMO_UP * DEMO_P))
        return demo_usage("--width and --height must be multiples of %d (8x decoder, 2x2 patches), got %dx%d",
                          DEMO_UP * DEMO_P, c->width, c->height);
    if (c->overlap < 0) c->overlap = c->mode == DEMO_MODE_CHAINED ? 1 : 0;
    if (c->mode == DEMO_MODE_KV) {
        if (c->overlap != 0) return demo_usage("kv mode: windows do not overlap (context comes through the cache); drop --overlap");
        if (c->sink < 1) return demo_usage("kv mode: --sink must be >= 1 (the model anchors to the prompt frame in the sink)");
        if (c->context < 1) return demo_usage("kv mode: --context must be >= 1 (each window reads the frame before it)");
    } else {
        if (c->overlap < 1 || c->overlap >= c->window)
            return demo_usage("chained mode: --overlap must be in [1, window-1] = [1, %d] (a window sees only its conditioning frames)", c->window - 1);
        if (c->window < 2) return demo_usage("chained mode: --window must be >= 2");
        if (c->offload) return demo_usage("--offload needs --mode kv (chained windows keep nothing between windows)");
        if (c->cfg > 0.0) return demo_usage("--cfg needs --mode kv (the branches keep their prompts in the cache)");
    }
    if (c->backend == DEMO_BACKEND_CUDA && c->dtype == MSKV_DTYPE_F32)
        return demo_usage("--backend cuda: the GPU attention kernels need --dtype f16 or bf16");
    if (brk && *brk) {
        if (!strcmp(brk, "page")) c->brk = DEMO_BREAK_PAGE;
        else if (!strcmp(brk, "stale")) c->brk = DEMO_BREAK_STALE;
        else if (!strcmp(brk, "sink")) c->brk = DEMO_BREAK_SINK;
        else if (!strcmp(brk, "serial")) c->brk = DEMO_BREAK_SERIAL;
        else return demo_usage("MSKV_DEMO_BREAK: expected page, sink, stale or serial, got '%s'", brk);
    }
    return 0;
}

/* >>backend ---------------------------------------------------------------
   The model's only calls into a compute backend: the same model code drives
   the host store (mstar_kv.h's CPU backend) and the device store
   (mstar_kv_cuda.h), so --check judges both the same way. */
typedef struct demo_backend {
    const char *name;
    mskv_dtype dtype;        /* the cache's storage type */
    void *impl;
    /* the arena's store fields (geometry, store_ops, retire mode) */
    mskv_result (*arena_desc)(void *impl, mskv_arena_desc *d);
    mskv_result (*bind)(void *impl, mskv_arena *a);
    /* after each plan is built: the kernels read the device copy */
    mskv_result (*plan)(void *impl, const mskv_plan *p);
    mskv_result (*write_kv)(void *impl, mskv_arena *a, const mskv_plan *p, const float *k, const float *v);
    mskv_result (*attend)(void *impl, mskv_arena *a, const mskv_plan *p, const mskv_attn *attn, const float *q, float *o);
    /* end of a step: publish (n may be 0: a step that only freed pages) */
    mskv_result (*publish)(void *impl, mskv_arena *a, const mskv_segment *segs, int32_t n);
    /* a step that the session published itself ended with fence `step` */
    mskv_result (*fence)(void *impl, uint64_t step);
    /* before pages are allocated: pages freed by finished steps become free */
    mskv_result (*retire)(void *impl);
    /* MSKV_DEMO_BREAK: overwrite the V of one page with 3.0 */
    mskv_result (*scribble)(void *impl, mskv_arena *a, int32_t page);
    const char *(*detail)(void *impl);   /* more about the last failure, or "" */
    void (*destroy)(void *impl);
} demo_backend;

/* What a backend needs to size its store. */
typedef struct demo_store_shape {
    int32_t num_pages, page_size, head_dim;
    int32_t max_batch;       /* segments one plan holds: the branches */
    int64_t max_tokens;      /* the most tokens one step writes or queries */
    int dtype;               /* a mskv_dtype, or -1: the backend's default */
    int threads;
} demo_store_shape;

static uint16_t demo_half(mskv_dtype t, float x) {
    return t == MSKV_DTYPE_BF16 ? mskv_f32_to_bf16(x) : mskv_f32_to_f16(x);
}

static float demo_unhalf(mskv_dtype t, uint16_t h) {
    return t == MSKV_DTYPE_BF16 ? mskv_bf16_to_f32(h) : mskv_f16_to_f32(h);
}

/* one element of value x in dtype t at dst */
static void demo_store_elem(mskv_dtype t, float x, unsigned char *dst) {
    if (t == MSKV_DTYPE_F32) {
        memcpy(dst, &x, sizeof(x));
    } else {
        uint16_t h = demo_half(t, x);
        memcpy(dst, &h, sizeof(h));
    }
}

/* >>cpu backend: the host store of the arena */

typedef struct demo_cpu {
    mskv_cpu *cpu;
    mskv_dtype dtype;
} demo_cpu;

static mskv_result demo_cpu_arena_desc(void *impl, mskv_arena_desc *d) {
    d->dtype = ((demo_cpu *)impl)->dtype;
    d->store_ops = NULL;
    d->retire_mode = MSKV_RETIRE_IMMEDIATE;
    return MSKV_SUCCESS;
}

static mskv_result demo_cpu_bind(void *impl, mskv_arena *a) { (void)impl; (void)a; return MSKV_SUCCESS; }
static mskv_result demo_cpu_plan(void *impl, const mskv_plan *p) { (void)impl; (void)p; return MSKV_SUCCESS; }

static mskv_result demo_cpu_write(void *impl, mskv_arena *a, const mskv_plan *p, const float *k, const float *v) {
    (void)impl;
    return mskv_cpu_write_kv(a, 0, p, k, v, MSKV_DTYPE_F32, NULL);
}

static mskv_result demo_cpu_attend(void *impl, mskv_arena *a, const mskv_plan *p, const mskv_attn *attn,
                                   const float *q, float *o) {
    return mskv_cpu_attention(((demo_cpu *)impl)->cpu, a, 0, p, attn, q, o, NULL);
}

static mskv_result demo_cpu_publish(void *impl, mskv_arena *a, const mskv_segment *segs, int32_t n) {
    (void)impl;
    return mskv_publish(a, segs, n, NULL);
}

/* IMMEDIATE retire: freed pages are free at once */
static mskv_result demo_cpu_fence(void *impl, uint64_t step) { (void)impl; (void)step; return MSKV_SUCCESS; }
static mskv_result demo_cpu_retire(void *impl) { (void)impl; return MSKV_SUCCESS; }

static mskv_result demo_cpu_scribble(void *impl, mskv_arena *a, int32_t page) {
    mskv_store_info si;
    unsigned char *pool = (unsigned char *)mskv_store_pool(a, 0, 1);
    mskv_result res = mskv_store_info_get(a, &si);
    size_t i;
    (void)impl;
    if (res != MSKV_SUCCESS) return res;
    if (!pool) return MSKV_ERROR_UNSUPPORTED;
    if (page < 1 || page >= si.num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    for (i = 0; i < si.page_bytes / si.elem_size; i++)
        demo_store_elem(si.dtype, 3.0f, pool + (size_t)page * si.page_bytes + i * si.elem_size);
    return MSKV_SUCCESS;
}

static const char *demo_cpu_detail(void *impl) { (void)impl; return ""; }

static void demo_cpu_destroy(void *impl) {
    demo_cpu *c = (demo_cpu *)impl;
    if (!c) return;
    mskv_cpu_destroy(c->cpu);
    free(c);
}

static int demo_cpu_open(demo_backend *b, const demo_store_shape *s, char *why, size_t cap) {
    mskv_cpu_desc d;
    demo_cpu *c = (demo_cpu *)calloc(1, sizeof(*c));
    mskv_result r;
    if (!c) { snprintf(why, cap, "CPU backend: out of memory"); return -1; }
    memset(&d, 0, sizeof(d));
    d.num_threads = s->threads;
    r = mskv_cpu_create(&d, &c->cpu);
    if (r != MSKV_SUCCESS) {
        free(c);
        snprintf(why, cap, "CPU backend: %s", mskv_result_string(r));
        return -1;
    }
    c->dtype = (mskv_dtype)s->dtype;
    b->name = "cpu";
    b->dtype = c->dtype;
    b->impl = c;
    b->arena_desc = demo_cpu_arena_desc;
    b->bind = demo_cpu_bind;
    b->plan = demo_cpu_plan;
    b->write_kv = demo_cpu_write;
    b->attend = demo_cpu_attend;
    b->publish = demo_cpu_publish;
    b->fence = demo_cpu_fence;
    b->retire = demo_cpu_retire;
    b->scribble = demo_cpu_scribble;
    b->detail = demo_cpu_detail;
    b->destroy = demo_cpu_destroy;
    return 0;
}

/* >>cuda backend: a device store bound to the arena (FENCED retire), plans
   uploaded once per step, K/V written and attended on the device. The model
   works in f32; q, k and v go up and o comes down in the store's 16-bit type
   (the tensor-core kernels read q in the store's type). */

typedef struct demo_gpu {
    mskv_cuda *cu;
    mskv_cuda_store *st;
    mskv_cuda_dplan dplan;
    int have_plan;
    mskv_dtype dtype;
    int32_t head_dim;
    int64_t max_tokens;
    mskv_cu_ptr dq, dk, dv, dout;   /* q and o: [max_tokens][2 heads][dim]; k, v: [max_tokens][dim] */
    uint16_t *host;                 /* conversion buffer, as large as q */
    char log[512];                  /* the runtime's last error message */
} demo_gpu;

/* reasons are printed on one line */
static void demo_one_line(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

static void demo_gpu_log(void *user, mskv_log_level level, const char *message) {
    demo_gpu *g = (demo_gpu *)user;
    if (level < MSKV_LOG_WARN || !message) return;
    snprintf(g->log, sizeof(g->log), "%s", message);
    demo_one_line(g->log);
}

static void demo_gpu_destroy(void *impl) {
    demo_gpu *g = (demo_gpu *)impl;
    if (!g) return;
    if (g->cu) {
        if (g->dq) mskv_cuda_free(g->cu, g->dq);
        if (g->dk) mskv_cuda_free(g->cu, g->dk);
        if (g->dv) mskv_cuda_free(g->cu, g->dv);
        if (g->dout) mskv_cuda_free(g->cu, g->dout);
    }
    mskv_cuda_store_destroy(g->st);   /* waits for the stream first */
    mskv_cuda_destroy(g->cu);
    free(g->host);
    free(g);
}

static mskv_result demo_gpu_arena_desc(void *impl, mskv_arena_desc *d) {
    return mskv_cuda_store_arena_desc(((demo_gpu *)impl)->st, d);
}

static mskv_result demo_gpu_bind(void *impl, mskv_arena *a) { return mskv_cuda_store_bind(((demo_gpu *)impl)->st, a); }

static mskv_result demo_gpu_plan(void *impl, const mskv_plan *p) {
    demo_gpu *g = (demo_gpu *)impl;
    mskv_result r;
    g->have_plan = 0;
    if (p->total_q > g->max_tokens) return MSKV_ERROR_CAPACITY;
    r = mskv_cuda_plan_upload(g->st, p, MSKV_POS_3D, &g->dplan);
    if (r == MSKV_SUCCESS) g->have_plan = 1;
    return r;
}

/* the device plan is the upload of p (the model uploads every plan it builds) */
static int demo_gpu_plan_is(const demo_gpu *g, const mskv_plan *p) {
    return g->have_plan && g->dplan.batch == p->batch && g->dplan.total_q == p->total_q &&
           g->dplan.num_page_ids == p->num_page_ids && g->dplan.step == p->step;
}

/* n f32 values to the store's type, then to the device */
static mskv_result demo_gpu_put(demo_gpu *g, mskv_cu_ptr dst, const float *src, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) g->host[i] = demo_half(g->dtype, src[i]);
    return mskv_cuda_upload(g->st, dst, g->host, n * sizeof(uint16_t));
}

static mskv_result demo_gpu_write(void *impl, mskv_arena *a, const mskv_plan *p, const float *k, const float *v) {
    demo_gpu *g = (demo_gpu *)impl;
    size_t n;
    mskv_result r;
    (void)a;
    if (!demo_gpu_plan_is(g, p)) return MSKV_ERROR_BAD_STATE;
    n = (size_t)p->total_q * (size_t)g->head_dim;
    if ((r = demo_gpu_put(g, g->dk, k, n)) != MSKV_SUCCESS) return r;
    if ((r = demo_gpu_put(g, g->dv, v, n)) != MSKV_SUCCESS) return r;
    return mskv_cuda_write_kv(g->st, 0, &g->dplan, g->dk, g->dv, NULL);
}

static mskv_result demo_gpu_attend(void *impl, mskv_arena *a, const mskv_plan *p, const mskv_attn *attn,
                                   const float *q, float *o) {
    demo_gpu *g = (demo_gpu *)impl;
    mskv_attn at = *attn;
    size_t n, i;
    mskv_result r;
    (void)a;
    if (!demo_gpu_plan_is(g, p)) return MSKV_ERROR_BAD_STATE;
    if (at.q_heads != 2) return MSKV_ERROR_INVALID_ARGUMENT;   /* the buffers hold two heads */
    at.q_dtype = g->dtype;
    n = (size_t)p->total_q * 2u * (size_t)g->head_dim;
    if ((r = demo_gpu_put(g, g->dq, q, n)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_attention(g->st, 0, p, &g->dplan, &at, g->dq, g->dout, 0)) != MSKV_SUCCESS) return r;
    /* on the store's stream, so after the attention */
    if ((r = mskv_cuda_download(g->st, g->host, g->dout, n * sizeof(uint16_t))) != MSKV_SUCCESS) return r;
    for (i = 0; i < n; i++) o[i] = demo_unhalf(g->dtype, g->host[i]);
    return MSKV_SUCCESS;
}

static mskv_result demo_gpu_publish(void *impl, mskv_arena *a, const mskv_segment *segs, int32_t n) {
    (void)a;
    return mskv_cuda_publish(((demo_gpu *)impl)->st, segs, n, NULL);
}

static mskv_result demo_gpu_fence(void *impl, uint64_t step) {
    demo_gpu *g = (demo_gpu *)impl;
    mskv_result r = mskv_cuda_fence_record(g->st, step);
    return r == MSKV_SUCCESS ? mskv_cuda_retire(g->st, 0) : r;
}

/* The arena holds exactly the pages the bound allows, so the pages of the
   previous step are needed now: wait for its fence. (The demo downloads
   every attention output, so the device is nearly idle here anyway.) */
static mskv_result demo_gpu_retire(void *impl) { return mskv_cuda_retire(((demo_gpu *)impl)->st, 1); }

static mskv_result demo_gpu_scribble(void *impl, mskv_arena *a, int32_t page) {
    demo_gpu *g = (demo_gpu *)impl;
    mskv_store_info si;
    unsigned char *buf;
    size_t i;
    mskv_result r = mskv_store_info_get(a, &si);
    if (r != MSKV_SUCCESS) return r;
    if (page < 1 || page >= si.num_pages) return MSKV_ERROR_OUT_OF_RANGE;
    buf = (unsigned char *)malloc(si.page_bytes);
    if (!buf) return MSKV_ERROR_OUT_OF_MEMORY;
    for (i = 0; i < si.page_bytes / si.elem_size; i++) demo_store_elem(si.dtype, 3.0f, buf + i * si.elem_size);
    r = mskv_cuda_upload(g->st, mskv_cuda_store_pool(g->st, 0, 1) + (mskv_cu_ptr)((size_t)page * si.page_bytes), buf,
                         si.page_bytes);
    free(buf);
    return r;
}

static const char *demo_gpu_detail(void *impl) {
    demo_gpu *g = (demo_gpu *)impl;
    const char *e = g->cu ? mskv_cuda_last_error(g->cu) : "";
    return e && *e ? e : g->log;
}

/* 0 = open; -1 = failed, reason in why, *unavailable set when there is no
   usable CUDA (driver, device or NVRTC missing) */
static int demo_gpu_open(demo_backend *b, const demo_store_shape *s, char *why, size_t cap, int *unavailable) {
    mskv_cuda_desc cd;
    mskv_cuda_store_desc sd;
    demo_gpu *g = (demo_gpu *)calloc(1, sizeof(*g));
    size_t q_elems = 0, q_bytes = 0, kv_bytes = 0;
    mskv_result r;
    *unavailable = 0;
    if (!g) { snprintf(why, cap, "CUDA backend: out of memory"); return -1; }
    g->dtype = (mskv_dtype)s->dtype;
    g->head_dim = s->head_dim;
    g->max_tokens = s->max_tokens;
    if (s->max_tokens < 1 || s->max_tokens > INT32_MAX || s->head_dim < 1 ||
        (size_t)s->max_tokens > SIZE_MAX / 4u / (size_t)s->head_dim) {
        free(g);
        snprintf(why, cap, "CUDA backend: %s", mskv_result_string(MSKV_ERROR_OVERFLOW));
        return -1;
    }
    kv_bytes = (size_t)s->max_tokens * (size_t)s->head_dim * sizeof(uint16_t);
    q_elems = (size_t)s->max_tokens * 2u * (size_t)s->head_dim;
    q_bytes = q_elems * sizeof(uint16_t);
    memset(&cd, 0, sizeof(cd));
    cd.log = demo_gpu_log;
    cd.log_user = g;
#ifdef DEMO_CUDA_FUNCTIONS
    cd.functions = DEMO_CUDA_FUNCTIONS;   /* demo_emu.cpp: an emulated device */
    cd.disable_disk_cache = 1;
#endif
#ifdef DEMO_CUDA_DESC_HOOK
    DEMO_CUDA_DESC_HOOK(&cd);             /* tests/gpu_warm_demo.c: the compile-only device, its disk cache on */
#endif
    r = mskv_cuda_create(&cd, &g->cu);
    if (r != MSKV_SUCCESS) {
        *unavailable = r == MSKV_ERROR_CUDA_UNAVAILABLE;
        /* the runtime's reason: what it tried and what was missing */
        if (!*unavailable || mskv_cuda_probe(&cd, why, cap) == MSKV_SUCCESS || !why[0])
            snprintf(why, cap, "%.500s", g->log[0] ? g->log : mskv_result_string(r));
        demo_one_line(why);
        demo_gpu_destroy(g);
        return -1;
    }
    memset(&sd, 0, sizeof(sd));
    sd.num_pages = s->num_pages;
    sd.page_size = s->page_size;
    sd.num_layers = 1;
    sd.kv_heads = 1;
    sd.head_dim = s->head_dim;
    sd.dtype = g->dtype;
    sd.max_batch = s->max_batch;
    sd.max_tokens = (int32_t)s->max_tokens;
    sd.max_page_ids = s->num_pages;
    r = mskv_cuda_store_create(g->cu, &sd, &g->st);
    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(g->cu, q_bytes, &g->dq);
    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(g->cu, q_bytes, &g->dout);
    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(g->cu, kv_bytes, &g->dk);
    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(g->cu, kv_bytes, &g->dv);
    if (r == MSKV_SUCCESS && !(g->host = (uint16_t *)malloc(q_bytes))) r = MSKV_ERROR_OUT_OF_MEMORY;
    if (r != MSKV_SUCCESS) {
        const char *d = demo_gpu_detail(g);
        snprintf(why, cap, "device store: %s%s%.400s", mskv_result_string(r), *d ? ": " : "", d);
        demo_gpu_destroy(g);
        return -1;
    }
    b->name = "cuda";
    b->dtype = g->dtype;
    b->impl = g;
    b->arena_desc = demo_gpu_arena_desc;
    b->bind = demo_gpu_bind;
    b->plan = demo_gpu_plan;
    b->write_kv = demo_gpu_write;
    b->attend = demo_gpu_attend;
    b->publish = demo_gpu_publish;
    b->fence = demo_gpu_fence;
    b->retire = demo_gpu_retire;
    b->scribble = demo_gpu_scribble;
    b->detail = demo_gpu_detail;
    b->destroy = demo_gpu_destroy;
    return 0;
}

/* Opens the backend the options ask for. auto: CUDA when it is usable and
   the cache type is 16-bit, else the CPU (saying why once, unless quiet).
   0 = open, -1 = failed (why says why). */
static int demo_backend_open(demo_backend *b, demo_backend_kind kind, const demo_store_shape *s, int quiet,
                             char *why, size_t cap) {
    demo_store_shape cs = *s;
    int unavailable = 0;
    char reason[512];
    memset(b, 0, sizeof(*b));
    if (kind == DEMO_BACKEND_CUDA || (kind == DEMO_BACKEND_AUTO && s->dtype != MSKV_DTYPE_F32)) {
        demo_store_shape gs = *s;
        if (gs.dtype < 0) gs.dtype = MSKV_DTYPE_F16;
        if (demo_gpu_open(b, &gs, reason, sizeof(reason), &unavailable) == 0) {
            mskv_cuda_info info;
            if (!quiet && mskv_cuda_info_get(((demo_gpu *)b->impl)->cu, &info) == MSKV_SUCCESS)
                fprintf(stderr, "demo: CUDA backend on %s (sm_%d%s, %d SMs)\n", info.name, (int)info.arch,
                        info.ptx_fallback ? " PTX" : "", (int)info.multiprocessors);
            return 0;
        }
        if (kind == DEMO_BACKEND_CUDA || !unavailable) {
            snprintf(why, cap, "--backend %s: %s%s", kind == DEMO_BACKEND_CUDA ? "cuda" : "auto",
                     unavailable ? "CUDA is unavailable: " : "CUDA backend: ", reason);
            return -1;
        }
        if (!quiet) fprintf(stderr, "demo: CUDA is unavailable (%s); using the CPU backend\n", reason);
        memset(b, 0, sizeof(*b));
    }
    if (cs.dtype < 0) cs.dtype = MSKV_DTYPE_F32;
    return demo_cpu_open(b, &cs, why, cap);
}

/* >>signals -------------------------------------------------------------- */

/* The signal that asked the run to stop (SIGINT, SIGTERM, SIGHUP), 0 = none.
   The generator looks at it after every denoise step. */
static volatile sig_atomic_t demo_signal = 0;
/* The output file while it holds no frame yet (demo_frames_out == 0): a
   signal then removes it and the demo dies at once, instead of waiting for
   a denoise step that takes minutes at large sizes to end. */
static char demo_armed_path[4096];
static volatile sig_atomic_t demo_path_armed = 0, demo_frames_out = 0;

static void demo_write_str(const char *s) {   /* write(2) is async-signal-safe, stdio is not */
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static const char *demo_signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

static void demo_on_signal(int sig) {
    demo_signal = sig;
    if (demo_path_armed && !demo_frames_out) {
        unlink(demo_armed_path);
        demo_write_str("\ndemo: interrupted by ");
        demo_write_str(demo_signal_name(sig));
        demo_write_str(" before a frame was written: removed ");
        demo_write_str(demo_armed_path);
        demo_write_str("\n");
        raise(sig);   /* SA_RESETHAND made it fatal: delivered as the handler returns */
    }
}

/* One signal stops the run cleanly (the output gets the frames done so
   far); SA_RESETHAND: a second one of the same kind kills at once. */
static void demo_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = demo_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;   /* RESTART: no EINTR in the output's writes */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}


/* >>queue ---------------------------------------------------------------- */

/* One finished window for the decoder thread: latent frames [first, first+n),
   the first `trim` of them context to decode again and drop. */
typedef struct demo_job {
    int64_t window, first, n, trim;
    float *lat;
} demo_job;

typedef struct demo_queue {
    pthread_mutex_t mu;
    pthread_cond_t not_full, not_empty;
    demo_job *items[DEMO_QUEUE_CAP];
    int head, count, closed;
    int aborted;               /* the output thread failed: generating more is pointless */
    int64_t pushed, done;      /* jobs queued, and finished by the decoder thread (MSKV_DEMO_BREAK=serial waits on them) */
    int64_t gen_waits;         /* times the generator waited for decoding to finish (not for room in the queue) */
} demo_queue;

/* 0, or -1 (the job is not taken) once the consumer has given up */
static int demo_queue_push(demo_queue *q, demo_job *j) {
    pthread_mutex_lock(&q->mu);
    while (q->count == DEMO_QUEUE_CAP && !q->aborted) pthread_cond_wait(&q->not_full, &q->mu);
    if (q->aborted) { pthread_mutex_unlock(&q->mu); return -1; }
    q->items[(q->head + q->count) % DEMO_QUEUE_CAP] = j;
    q->count++;
    q->pushed++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static void demo_queue_abort(demo_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->aborted = 1;
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->mu);
}

static void demo_queue_close(demo_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
}

/* The decoder thread is done with a job (decoded, or skipped after a failure). */
static void demo_queue_done(demo_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->done++;
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->mu);
}

/* MSKV_DEMO_BREAK=serial: wait until every job queued so far is decoded */
static void demo_queue_drain(demo_queue *q) {
    pthread_mutex_lock(&q->mu);
    if (q->done < q->pushed && !q->aborted) q->gen_waits++;
    while (q->done < q->pushed && !q->aborted) pthread_cond_wait(&q->not_full, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* NULL once the queue is closed and empty */
static demo_job *demo_queue_pop(demo_queue *q) {
    demo_job *j = NULL;
    pthread_mutex_lock(&q->mu);
    while (q->count == 0 && !q->closed) pthread_cond_wait(&q->not_empty, &q->mu);
    if (q->count > 0) {
        j = q->items[q->head];
        q->head = (q->head + 1) % DEMO_QUEUE_CAP;
        q->count--;
        pthread_cond_signal(&q->not_full);
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

/* >>output thread --------------------------------------------------------- */

typedef struct demo_out {
    const demo_cfg *cfg;
    const demo_scene *scene;
    const demo_decoder *dec;
    demo_writer *writer;
    FILE *raw;
    demo_queue *queue;
    int64_t frames;            /* pixel frames the video has */
    int64_t next;              /* next pixel frame expected */
    double sse;                /* squared error against the truth, all channels */
    double worst_sse;          /* of the worst frame: the check is per frame, not diluted by the rest */
    int64_t worst_frame;
    unsigned char *kept;       /* --check: every frame written, for the whole-stream comparison */
    unsigned char *truth;      /* truth frames of the current window */
    int64_t truth_first, truth_n, truth_cap;
    float *c3, *tmp, *truth_lat;
    unsigned char *rgb;
    double *dec_t0, *dec_t1;   /* per window: when its decode (truth, decode, encode) began and ended; 0 = never */
    int64_t timed;             /* windows the arrays hold */
    int failed;
    char err[256];
} demo_out;

static double demo_now(void);

static int demo_keep_truth(void *user, int64_t p, const unsigned char *rgb) {
    demo_out *o = (demo_out *)user;
    size_t fb = o->scene->g.rgb_bytes;
    if (o->truth_n == 0) o->truth_first = p;
    if (p != o->truth_first + o->truth_n || o->truth_n >= o->truth_cap) return -1;
    memcpy(o->truth + (size_t)o->truth_n * fb, rgb, fb);
    o->truth_n++;
    return 0;
}

static int demo_emit(void *user, int64_t p, const unsigned char *rgb) {
    demo_out *o = (demo_out *)user;
    size_t fb = o->scene->g.rgb_bytes, i;
    const unsigned char *t;
    if (p != o->next) {
        snprintf(o->err, sizeof(o->err), "decoder produced frame %lld where %lld was due", (long long)p, (long long)o->next);
        return -1;
    }
    if (p < o->truth_first || p >= o->truth_first + o->truth_n) {
        snprintf(o->err, sizeof(o->err), "no truth frame for frame %lld", (long long)p);
        return -1;
    }
    t = o->truth + (size_t)(p - o->truth_first) * fb;
    {
        double fs = 0.0;
        for (i = 0; i < fb; i++) {
            double d = (double)rgb[i] - (double)t[i];
            fs += d * d;
        }
        o->sse += fs;
        if (fs > o->worst_sse || o->worst_frame < 0) { o->worst_sse = fs; o->worst_frame = p; }
    }
    if (demo_writer_frame(o->writer, rgb) != 0) {
        snprintf(o->err, sizeof(o->err), "%s", o->writer->err);
        return -1;
    }
    demo_frames_out = 1;   /* from now on a signal finishes the file instead of removing it */
    if (o->raw && fwrite(rgb, 1, fb, o->raw) != fb) {
        snprintf(o->err, sizeof(o->err), "--dump-raw: write failed");
        return -1;
    }
    if (o->kept) memcpy(o->kept + (size_t)p * fb, rgb, fb);
    o->next++;
    return 0;
}

static void *demo_out_main(void *arg) {
    demo_out *o = (demo_out *)arg;
    const demo_geom *g = &o->scene->g;
    demo_job *j;
    while ((j = demo_queue_pop(o->queue)) != NULL) {
        int timed = !o->failed && !demo_signal && j->window >= 0 && j->window < o->timed;
        if (timed) o->dec_t0[j->window] = demo_now();
        if (!o->failed && !demo_signal) {   /* stopped: the file ends with the frames done so far */
            int64_t i;
            /* the truth through the same decoder, for the PSNR */
            for (i = 0; i < j->n; i++) demo_scene_truth(o->scene, j->first + i, o->truth_lat + (size_t)i * g->lat_floats);
            o->truth_n = 0;
            if (demo_decode(o->dec, o->truth_lat, j->first, j->n, j->trim, o->frames, o->c3, o->tmp, o->rgb,
                            demo_keep_truth, o) != 0) {
                snprintf(o->err, sizeof(o->err), "window %lld: decoding the truth failed", (long long)j->window);
                o->failed = 1;
            } else if (demo_decode(o->dec, j->lat, j->first, j->n, j->trim, o->frames, o->c3, o->tmp, o->rgb,
                                   demo_emit, o) != 0) {
                if (!o->err[0]) snprintf(o->err, sizeof(o->err), "window %lld: decode failed", (long long)j->window);
                o->failed = 1;
            }
            if (o->failed) demo_queue_abort(o->queue);   /* stop the generator too */
        }
        if (timed) o->dec_t1[j->window] = demo_now();
        free(j->lat);
        free(j);
        demo_queue_done(o->queue);
    }
    return NULL;
}

/* >>model ----------------------------------------------------------------- */

typedef struct demo_run {
    demo_cfg cfg;
    demo_geom g;
    demo_scene scene;
    demo_feat feat;
    demo_backend be;
    mskv_arena *arena;
    mskv_plan plan;
    mskv_schedule sched;
    int64_t T;               /* latent frames in the video */
    int64_t T_gen;           /* latent frames generated (the last window may pass T) */
    float *lat;              /* [T_gen][lat_floats] every generated latent frame */
    float *q, *k, *v, *o, *x;   /* q, k, v, o: a row block per branch */
    int nb;                  /* branches: 2 with --cfg */
    float *prompt[2];        /* --cfg: each branch's own prompt frame (conditional, unconditional) */
    int32_t num_pages, peak_pages, page_bound;
    int64_t pages_freed, released_tokens, offloads;
    double t_start;          /* when generation began */
    double *den_t0, *den_t1; /* per window: when its denoise began and ended (0 = never), as demo_out.dec_t0/1 */
    int serial_noted;        /* MSKV_DEMO_BREAK=serial said what it does */
    double units_total, units_done;   /* denoise work, weighted by context (demo_window_units) */
    double last_line;        /* when the last progress line was printed */
    int estimated;           /* the estimate was printed */
    int stale_noted;         /* MSKV_DEMO_BREAK=stale said what it does */
    int interrupted;         /* a signal stopped the generator */
    char err[512];
} demo_run;

static int demo_fail(demo_run *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof(r->err), fmt, ap);
    va_end(ap);
    return -1;
}

#define DEMO_TRY(r, call, what)                                                         \
    do {                                                                                \
        mskv_result demo__res = (call);                                                 \
        if (demo__res != MSKV_SUCCESS)                                                  \
            return demo_fail((r), "%s: %s", (what), mskv_result_string(demo__res));     \
    } while (0)

/* a call that reaches the backend (directly, or through the store's ops):
   with its details (the driver error, the NVRTC log) */
static int demo_fail_be(demo_run *r, const char *what, mskv_result res) {
    const char *d = r->be.detail ? r->be.detail(r->be.impl) : "";
    return demo_fail(r, "%s: %s%s%s%s", what, mskv_result_string(res), *d ? " (" : "", d, *d ? ")" : "");
}

#define DEMO_TRY_BE(r, call, what)                                                      \
    do {                                                                                \
        mskv_result demo__res = (call);                                                 \
        if (demo__res != MSKV_SUCCESS) return demo_fail_be((r), (what), demo__res);     \
    } while (0)

static double demo_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int demo_live_pages(demo_run *r) {
    mskv_arena_stats st;
    if (mskv_arena_stats_get(r->arena, &st) != MSKV_SUCCESS) return -1;
    if (st.live_pages > r->peak_pages) r->peak_pages = st.live_pages;
    return st.live_pages;
}

static int demo_wrap(int64_t v, int n) {
    int64_t m = v % n;
    return (int)(m < 0 ? m + n : m);
}

/* >>progress --------------------------------------------------------------
   A denoise step costs about as much as the keys its queries attend to: in
   kv mode the window itself plus the kept chunks (sink + context, fewer at
   the start); in chained mode the window. The estimate and the time left
   weigh the steps that way. */
static double demo_window_units(const demo_run *r, int64_t k) {
    int64_t kept = (int64_t)r->cfg.sink + r->cfg.context;
    if (r->cfg.mode == DEMO_MODE_CHAINED) return 1.0;
    return 1.0 + (double)(k < kept ? k : kept);
}

/* Says how much work is coming before the first step, which alone can take
   minutes at large sizes. */
static void demo_progress_init(demo_run *r) {
    int64_t k, tokens = (int64_t)r->cfg.window * r->g.tpf, keys = 0;
    r->units_total = 0.0;
    for (k = 0; k < r->sched.count; k++) {
        double u = demo_window_units(r, k);
        r->units_total += (double)r->cfg.steps * u;
        if ((int64_t)u * tokens > keys) keys = (int64_t)u * tokens;
    }
    r->units_done = 0.0;
    if (!r->cfg.quiet)
        fprintf(stderr, "demo: %lld windows x %d denoise steps, each %lld tokens%s attending to up to %lld; "
                "an estimate follows the first step\n", (long long)r->sched.count, r->cfg.steps, (long long)tokens,
                r->nb > 1 ? " per branch" : "", (long long)keys);
    r->t_start = r->last_line = demo_now();
}

static const char *demo_duration(double s, char *buf, size_t cap) {
    if (s < 1.0) snprintf(buf, cap, "%.0f ms", s * 1000.0);
    else if (s < 90.0) snprintf(buf, cap, "%.1f s", s);
    else if (s < 90.0 * 60.0) snprintf(buf, cap, "%.0f min", s / 60.0);
    else snprintf(buf, cap, "%.1f h", s / 3600.0);
    return buf;
}

/* After denoise step s of window k: the estimate of the whole run after the
   first step, then a line at most every --progress seconds. */
static void demo_step_done(demo_run *r, int64_t k, int s) {
    double now = demo_now(), elapsed = now - r->t_start;
    char a[32], b[32];
    r->units_done += demo_window_units(r, k);
    if (r->cfg.quiet) return;
    if (!r->estimated) {
        r->estimated = 1;
        r->last_line = now;
        fprintf(stderr, "demo: estimate: the first denoise step took %s; %lld windows x %d steps: about %s in all "
                "(Ctrl-C stops early and keeps the frames done)\n", demo_duration(elapsed, a, sizeof(a)),
                (long long)r->sched.count, r->cfg.steps,
                demo_duration(elapsed / r->units_done * r->units_total, b, sizeof(b)));
        return;
    }
    /* the window's last step: its window line follows at once */
    if (s + 1 == r->cfg.steps || now - r->last_line < r->cfg.progress) return;
    r->last_line = now;
    fprintf(stderr, "%swindow %lld/%lld  step %d/%d  %s elapsed, about %s left%s", isatty(2) ? "\r" : "",
            (long long)(k + 1), (long long)r->sched.count, s + 1, r->cfg.steps, demo_duration(elapsed, a, sizeof(a)),
            demo_duration(elapsed / r->units_done * (r->units_total - r->units_done), b, sizeof(b)),
            isatty(2) ? "  " : "\n");
    fflush(stderr);
}

/* A line per window: where the video is, the speed, the cache's pages. */
static void demo_progress(demo_run *r, int64_t k, int64_t committed_latents, int live) {
    int64_t px = committed_latents <= 0 ? 0 : 1 + DEMO_TR * (committed_latents - 1);
    double now = demo_now(), dt = now - r->t_start;
    if (r->cfg.quiet) return;
    r->last_line = now;
    if (px > r->cfg.frames) px = r->cfg.frames;
    fprintf(stderr, "%swindow %lld/%lld  frames %lld/%d  %.1f fps  kv pages %d (peak %d)%s",
            isatty(2) ? "\r" : "", (long long)(k + 1), (long long)r->sched.count, (long long)px, r->cfg.frames,
            dt > 0 ? (double)px / dt : 0.0, live, r->peak_pages, isatty(2) ? "  " : "\n");
    fflush(stderr);
}

/* Queries of nfr frames starting at f0: head 0 targets the previous frame,
   head 1 the anchor frame, both where the token's band was then. */
static void demo_build_queries(demo_run *r, int64_t f0, int nfr, int64_t anchor) {
    const demo_geom *g = &r->g;
    int i, row, col;
    for (i = 0; i < nfr; i++)
        for (row = 0; row < g->gh; row++)
            for (col = 0; col < g->gw; col++) {
                int64_t f = f0 + i, vel = r->scene.band_v[row];
                size_t t = (size_t)i * g->tpf + (size_t)row * g->gw + (size_t)col;
                float *q0 = r->q + t * 2u * (size_t)g->dim, *q1 = q0 + g->dim;
                demo_feat_encode(&r->feat, f - 1, row, demo_wrap(col - vel, g->gw), q0);
                demo_feat_encode(&r->feat, anchor, row, demo_wrap(col - vel * (f - anchor), g->gw), q1);
            }
}

/* Keys from the plan's 3-D positions (frame relative to base_frame), after
   checking they are the tokens the model thinks it is writing: in every
   segment (each branch under --cfg holds the same tokens). */
static int demo_build_keys(demo_run *r, const mskv_plan *p, int64_t base_frame, int64_t f0, int nfr) {
    const demo_geom *g = &r->g;
    int64_t n = (int64_t)nfr * g->tpf, t;
    int b;
    char why[256];
    if (p->total_q != n * r->nb || p->batch != r->nb)
        return demo_fail(r, "plan has %d queries in %d segments, expected %lld in %d", p->total_q, p->batch,
                         (long long)n * r->nb, r->nb);
    if (mskv_plan_validate(p, r->num_pages, why, sizeof(why)) != MSKV_SUCCESS)
        return demo_fail(r, "invalid plan: %s", why);
    for (b = 0; b < r->nb; b++)
        for (t = 0; t < n; t++) {
            int64_t at = (int64_t)b * n + t;
            int64_t frame = base_frame + p->positions[3 * at];
            int row = p->positions[3 * at + 1], col = p->positions[3 * at + 2];
            if (p->qo_indptr[b] != b * n || frame != f0 + t / g->tpf || row != (int)((t % g->tpf) / g->gw) || col != (int)(t % g->gw))
                return demo_fail(r, "plan position of token %lld is (%lld,%d,%d), expected frame %lld", (long long)at,
                                 (long long)frame, row, col, (long long)(f0 + t / g->tpf));
            demo_feat_encode(&r->feat, frame, row, col, r->k + (size_t)at * g->dim);
        }
    return 0;
}

/* The window's V rows, one block per branch: the state r->x, except that
   under --cfg each branch's given (clamped) frames are its own prompt. */
static void demo_values(demo_run *r, int nfr, int clamp) {
    const demo_geom *g = &r->g;
    size_t n = (size_t)nfr * g->tpf * (size_t)g->dim;
    int b, f;
    for (b = 0; b < r->nb; b++)
        for (f = 0; f < nfr; f++) {
            const float *src = r->nb > 1 && f < clamp ? r->prompt[b] : r->x + (size_t)f * g->lat_floats;
            demo_patchify(g, src, r->v + (size_t)b * n + (size_t)f * g->tpf * g->dim);
        }
}

/* The model's output per token, into the first block of r->v: the mean of
   the two heads; under --cfg guided, o_uncond + SCALE (o_cond - o_uncond). */
static void demo_outputs(demo_run *r, size_t n) {
    size_t dim = (size_t)r->g.dim, i, d;
    float s = (float)r->cfg.cfg;
    for (i = 0; i < n; i++) {
        const float *c = r->o + i * 2u * dim, *u = r->o + (n + i) * 2u * dim;
        for (d = 0; d < dim; d++) {
            float oc = 0.5f * (c[d] + c[dim + d]);
            r->v[i * dim + d] = r->nb > 1 ? 0.5f * (u[d] + u[dim + d]) + s * (oc - 0.5f * (u[d] + u[dim + d])) : oc;
        }
    }
}

/* Denoises the window state r->x (nfr latent frames from f0, the first
   `clamp` of them given) over the open reservation: session (kv mode) or
   the r->nb segments segs (chained mode, --cfg). clean: write the final K/V
   (the cache keeps them for later windows). */
static int demo_denoise(demo_run *r, mskv_session *sess, const mskv_segment *segs, int64_t base_frame,
                        int64_t f0, int nfr, int clamp, int64_t anchor, int64_t window, int clean) {
    const demo_geom *g = &r->g;
    size_t dim = (size_t)g->dim;
    int64_t n = (int64_t)nfr * g->tpf;
    mskv_plan_desc pd;
    mskv_attn at;
    uint64_t rng = demo_mix64(r->cfg.seed * 0x9E37ull + (uint64_t)window);
    size_t i;
    int s, f;
    if (r->den_t0 && window >= 0 && window < r->sched.count) r->den_t0[window] = demo_now();
    memset(&pd, 0, sizeof(pd));
    pd.kind = MSKV_PLAN_SELF;
    pd.pos_mode = MSKV_POS_3D;
    pd.grid_h = g->gh;
    pd.grid_w = g->gw;
    memset(&at, 0, sizeof(at));
    at.q_heads = 2;
    at.scale = r->feat.scale;
    at.mask = MSKV_MASK_NONE;     /* bidirectional: the window sees itself */
    at.q_dtype = MSKV_DTYPE_F32;
    for (f = clamp; f < nfr; f++)   /* seeded noise */
        for (i = 0; i < g->lat_floats; i++) r->x[(size_t)f * g->lat_floats + i] = demo_gauss(&rng);
    demo_build_queries(r, f0, nfr, anchor);
    for (i = 1; i < (size_t)r->nb; i++)   /* every branch asks the same questions */
        memcpy(r->q + i * (size_t)n * 2u * dim, r->q, (size_t)n * 2u * dim * sizeof(float));
    for (s = 0; s < r->cfg.steps; s++) {
        if (sess) DEMO_TRY(r, mskv_session_plan(sess, &pd, &r->plan), "plan");
        else DEMO_TRY(r, mskv_plan_build(r->arena, segs, r->nb, &pd, &r->plan), "plan");
        DEMO_TRY_BE(r, r->be.plan(r->be.impl, &r->plan), "upload plan");
        if (s == 0 && demo_build_keys(r, &r->plan, base_frame, f0, nfr) != 0) return -1;
        demo_values(r, nfr, clamp);
        if (!(r->cfg.brk == DEMO_BREAK_STALE && s > 0))
            DEMO_TRY_BE(r, r->be.write_kv(r->be.impl, r->arena, &r->plan, r->k, r->v), "write K/V");
        else if (!r->stale_noted) {
            r->stale_noted = 1;
            fprintf(stderr, "demo: MSKV_DEMO_BREAK: K/V written at the first denoise step only (stale afterwards)\n");
        }
        DEMO_TRY_BE(r, r->be.attend(r->be.impl, r->arena, &r->plan, &at, r->q, r->o), "attention");
        demo_outputs(r, (size_t)n);
        for (f = clamp; f < nfr; f++)
            demo_unpatchify(g, r->v + (size_t)f * g->tpf * dim, r->x + (size_t)f * g->lat_floats);
        demo_step_done(r, window, s);
        if (demo_signal) {   /* stop here: what was committed before is already on its way out */
            r->interrupted = 1;
            return demo_fail(r, "interrupted by %s", demo_signal_name((int)demo_signal));
        }
    }
    /* The clean pass: the slots still hold the K/V of the state before the
       last step; later windows must read the final frames, so write those
       (a real model runs one more forward at noise level 0 for this). */
    if (clean && r->cfg.brk != DEMO_BREAK_STALE) {
        demo_values(r, nfr, clamp);
        DEMO_TRY_BE(r, r->be.write_kv(r->be.impl, r->arena, &r->plan, r->k, r->v), "write K/V");
    }
    if (r->den_t1 && window >= 0 && window < r->sched.count) r->den_t1[window] = demo_now();
    return 0;
}

/* MSKV_DEMO_BREAK=page (sink): scribble over the V of the request's newest
   (first) page, the kind of damage a wrong page id or lost offload bytes do. */
static int demo_break_page(demo_run *r, mskv_request req) {
    int32_t pages[4096], count = 0, victim;
    mskv_result res = mskv_request_pages(r->arena, req, pages, 4096, &count);
    if ((res != MSKV_SUCCESS && res != MSKV_ERROR_CAPACITY) || count < 1 || count > 4096)
        return demo_fail(r, "MSKV_DEMO_BREAK=page: no page to break");
    victim = r->cfg.brk == DEMO_BREAK_SINK ? pages[0] : pages[count - 1];
    DEMO_TRY_BE(r, r->be.scribble(r->be.impl, r->arena, victim), "MSKV_DEMO_BREAK");
    fprintf(stderr, "demo: MSKV_DEMO_BREAK: overwrote the V of page %d\n", (int)victim);
    return 0;
}

static int demo_push_window(demo_run *r, demo_queue *q, int64_t k) {
    mskv_decode_span ds;
    demo_job *j;
    DEMO_TRY(r, mskv_schedule_decode_span(&r->sched, k, 1, &ds), "decode span");
    j = (demo_job *)calloc(1, sizeof(*j));
    if (!j) return demo_fail(r, "out of memory");
    j->window = k;
    j->first = ds.in_start;
    j->n = ds.in_end - ds.in_start;
    j->trim = ds.trim;
    j->lat = (float *)malloc((size_t)j->n * r->g.lat_floats * sizeof(float));
    if (!j->lat) { free(j); return demo_fail(r, "out of memory"); }
    memcpy(j->lat, r->lat + (size_t)j->first * r->g.lat_floats, (size_t)j->n * r->g.lat_floats * sizeof(float));
    if (demo_queue_push(q, j) != 0) {   /* the output thread failed; its error is reported at the end */
        free(j->lat);
        free(j);
        return -1;
    }
    if (r->cfg.brk == DEMO_BREAK_SERIAL) {   /* what a demo without the pipeline does: --check's overlap fails */
        if (!r->serial_noted) {
            r->serial_noted = 1;
            fprintf(stderr, "demo: MSKV_DEMO_BREAK: each window is decoded before the next is denoised (serial)\n");
        }
        demo_queue_drain(q);
    }
    return 0;
}

static int demo_audit(demo_run *r) {
    char why[256];
    if (r->cfg.check && mskv_arena_audit(r->arena, why, sizeof(why)) != MSKV_SUCCESS)
        return demo_fail(r, "arena audit: %s", why);
    return 0;
}

static int demo_run_kv(demo_run *r, demo_queue *q) {
    const demo_geom *g = &r->g;
    mskv_retention ret;
    mskv_session sess;
    mskv_request req;
    mskv_window w;
    int64_t chunk = (int64_t)r->cfg.window * g->tpf, k;
    uint64_t step = 0;
    char why[256];
    memset(&ret, 0, sizeof(ret));
    ret.chunk_size = chunk;
    ret.sink_chunks = r->cfg.sink;
    ret.window_chunks = r->cfg.context;
    if (mskv_retention_validate(&ret, r->cfg.page_size, why, sizeof(why)) != MSKV_SUCCESS)
        return demo_fail(r, "retention: %s", why);
    DEMO_TRY(r, mskv_request_add(r->arena, &req), "add request");
    DEMO_TRY(r, mskv_session_init(&sess, r->arena, req, &ret), "session");
    for (k = 0; k < r->sched.count; k++) {
        int before, after, clamp = k == 0 ? 1 : 0;
        DEMO_TRY(r, mskv_schedule_window(&r->sched, k, &w), "schedule");
        DEMO_TRY_BE(r, r->be.retire(r->be.impl), "retire");
        if (r->cfg.offload && k > 0) DEMO_TRY_BE(r, mskv_request_reload(r->arena, req), "reload");
        DEMO_TRY(r, mskv_session_begin_chunk(&sess, chunk), "begin chunk");
        if (clamp) demo_scene_truth(&r->scene, 0, r->x);   /* the prompt frame */
        if (demo_denoise(r, &sess, NULL, 0, w.start, r->cfg.window, clamp, 0, k, 1) != 0) return -1;
        before = demo_live_pages(r);
        DEMO_TRY(r, mskv_session_commit_chunk(&sess, &step), "commit chunk");
        DEMO_TRY_BE(r, r->be.fence(r->be.impl, step), "fence");
        after = demo_live_pages(r);
        if (before > after) r->pages_freed += before - after;
        memcpy(r->lat + (size_t)w.start * g->lat_floats, r->x, (size_t)r->cfg.window * g->lat_floats * sizeof(float));
        if ((r->cfg.brk == DEMO_BREAK_PAGE || r->cfg.brk == DEMO_BREAK_SINK) && k == 1 && demo_break_page(r, req) != 0)
            return -1;
        if (demo_audit(r) != 0 || demo_push_window(r, q, k) != 0) return -1;
        demo_progress(r, k, w.commit_end, after);
        if (r->cfg.offload && k + 1 < r->sched.count) {
            DEMO_TRY_BE(r, mskv_request_offload(r->arena, req), "offload");
            /* the offload freed the pages: end the step so their fence can retire */
            DEMO_TRY_BE(r, r->be.publish(r->be.impl, r->arena, NULL, 0), "publish");
            r->offloads++;
        }
    }
    r->released_tokens = sess.released_total;
    DEMO_TRY(r, mskv_request_remove(r->arena, req), "remove request");
    return 0;
}

/* --cfg: classifier-free guidance, two branches in lockstep. They differ only
   in their prompt frame: the conditional branch sees the true prompt / SCALE,
   the unconditional one a blank (zero) prompt. The model is linear in the
   values its attention picks, so every guided step, o_u + SCALE (o_c - o_u),
   reproduces the scene exactly: what reads the prompt gives
   0 + SCALE (prompt / SCALE) = prompt, and what reads a shared frame gives
   it unchanged. Both branches commit the guided frames; they are admitted,
   planned (one plan, branch b = segment b), committed, published (their
   windows slide together), offloaded and reloaded as one lockstep group. */
static int demo_run_cfg(demo_run *r, demo_queue *q) {
    const demo_geom *g = &r->g;
    mskv_retention ret;
    mskv_request br[2];
    mskv_lockstep ls;
    mskv_segment segs[2];
    mskv_window w;
    int64_t chunk = (int64_t)r->cfg.window * g->tpf, k;
    int32_t n = 0, b;
    size_t i;
    char why[256];
    memset(&ret, 0, sizeof(ret));
    ret.chunk_size = chunk;
    ret.sink_chunks = r->cfg.sink;
    ret.window_chunks = r->cfg.context;
    if (mskv_retention_validate(&ret, r->cfg.page_size, why, sizeof(why)) != MSKV_SUCCESS)
        return demo_fail(r, "retention: %s", why);
    demo_scene_truth(&r->scene, 0, r->prompt[0]);
    for (i = 0; i < g->lat_floats; i++) {
        r->prompt[0][i] /= (float)r->cfg.cfg;   /* conditional: the prompt at 1/SCALE */
        r->prompt[1][i] = 0.0f;                 /* unconditional: no prompt */
    }
    for (b = 0; b < 2; b++) {
        DEMO_TRY(r, mskv_request_add(r->arena, &br[b]), "add branch");
        DEMO_TRY(r, mskv_request_set_retention(r->arena, br[b], &ret), "retention");
    }
    DEMO_TRY(r, mskv_lockstep_create(r->arena, br, 2, &ls), "lockstep");
    for (k = 0; k < r->sched.count; k++) {
        int before, after, clamp = k == 0 ? 1 : 0;
        DEMO_TRY(r, mskv_schedule_window(&r->sched, k, &w), "schedule");
        DEMO_TRY_BE(r, r->be.retire(r->be.impl), "retire");
        if (r->cfg.offload && k > 0) DEMO_TRY_BE(r, mskv_lockstep_reload(r->arena, ls), "reload");
        DEMO_TRY(r, mskv_lockstep_segments(r->arena, ls, chunk, segs, 2, &n), "segments");
        DEMO_TRY(r, mskv_admit(r->arena, segs, n), "admit");
        if (clamp) demo_scene_truth(&r->scene, 0, r->x);   /* the guided prompt frame: what the video shows */
        if (demo_denoise(r, NULL, segs, 0, w.start, r->cfg.window, clamp, 0, k, 1) != 0) return -1;
        before = demo_live_pages(r);
        DEMO_TRY(r, mskv_commit(r->arena, segs, n), "commit");
        DEMO_TRY_BE(r, r->be.publish(r->be.impl, r->arena, segs, n), "publish");
        after = demo_live_pages(r);
        if (before > after) r->pages_freed += before - after;
        memcpy(r->lat + (size_t)w.start * g->lat_floats, r->x, (size_t)r->cfg.window * g->lat_floats * sizeof(float));
        /* a broken branch: the unconditional one's page, the conditional one intact */
        if ((r->cfg.brk == DEMO_BREAK_PAGE || r->cfg.brk == DEMO_BREAK_SINK) && k == 1 && demo_break_page(r, br[1]) != 0)
            return -1;
        if (demo_audit(r) != 0 || demo_push_window(r, q, k) != 0) return -1;
        demo_progress(r, k, w.commit_end, after);
        if (r->cfg.offload && k + 1 < r->sched.count) {
            DEMO_TRY_BE(r, mskv_lockstep_offload(r->arena, ls), "offload");
            /* the offload freed the pages: end the step so their fence can retire */
            DEMO_TRY_BE(r, r->be.publish(r->be.impl, r->arena, NULL, 0), "publish");
            r->offloads++;
        }
    }
    for (b = 0; b < 2; b++) {   /* released tokens of both branches */
        mskv_request_info info;
        DEMO_TRY(r, mskv_request_info_get(r->arena, br[b], &info), "info");
        r->released_tokens += info.live_start - (int64_t)info.prefix_pages * r->cfg.page_size;
    }
    DEMO_TRY(r, mskv_lockstep_remove(r->arena, ls), "remove branches");
    return 0;
}

static int demo_run_chained(demo_run *r, demo_queue *q) {
    const demo_geom *g = &r->g;
    mskv_plan_desc pd;
    mskv_window w;
    int64_t k;
    memset(&pd, 0, sizeof(pd));
    pd.kind = MSKV_PLAN_SELF;
    pd.pos_mode = MSKV_POS_3D;
    pd.grid_h = g->gh;
    pd.grid_w = g->gw;
    for (k = 0; k < r->sched.count; k++) {
        mskv_request req;
        mskv_segment seg;
        int64_t c0, c1, i;
        int nnew, live;
        DEMO_TRY(r, mskv_schedule_window(&r->sched, k, &w), "schedule");
        /* conditioning: the previous window's tail; for window 0, the prompt frame */
        c0 = k == 0 ? 0 : w.cond_start;
        c1 = k == 0 ? 1 : w.cond_end;
        if (k == 0) demo_scene_truth(&r->scene, 0, r->lat);
        nnew = (int)(w.end - c1);
        DEMO_TRY_BE(r, r->be.retire(r->be.impl), "retire");
        DEMO_TRY(r, mskv_request_add(r->arena, &req), "add request");
        seg.request = req;
        seg.n_tokens = (c1 - c0) * g->tpf;
        DEMO_TRY(r, mskv_admit(r->arena, &seg, 1), "admit conditioning");
        DEMO_TRY(r, mskv_plan_build(r->arena, &seg, 1, &pd, &r->plan), "plan conditioning");
        DEMO_TRY_BE(r, r->be.plan(r->be.impl, &r->plan), "upload plan");
        if (demo_build_keys(r, &r->plan, c0, c0, (int)(c1 - c0)) != 0) return -1;
        for (i = c0; i < c1; i++)
            demo_patchify(g, r->lat + (size_t)i * g->lat_floats, r->v + (size_t)(i - c0) * g->tpf * g->dim);
        DEMO_TRY_BE(r, r->be.write_kv(r->be.impl, r->arena, &r->plan, r->k, r->v), "write conditioning K/V");
        DEMO_TRY(r, mskv_commit(r->arena, &seg, 1), "commit conditioning");
        DEMO_TRY_BE(r, r->be.publish(r->be.impl, r->arena, &seg, 1), "publish");
        if ((r->cfg.brk == DEMO_BREAK_PAGE || r->cfg.brk == DEMO_BREAK_SINK) && k == 1 && demo_break_page(r, req) != 0)
            return -1;
        seg.n_tokens = (int64_t)nnew * g->tpf;
        DEMO_TRY_BE(r, r->be.retire(r->be.impl), "retire");
        DEMO_TRY(r, mskv_admit(r->arena, &seg, 1), "admit window");
        live = demo_live_pages(r);
        if (demo_denoise(r, NULL, &seg, c0, c1, nnew, 0, c0, k, 0) != 0) return -1;
        DEMO_TRY(r, mskv_commit(r->arena, &seg, 1), "commit window");
        DEMO_TRY_BE(r, r->be.publish(r->be.impl, r->arena, &seg, 1), "publish");
        memcpy(r->lat + (size_t)c1 * g->lat_floats, r->x, (size_t)nnew * g->lat_floats * sizeof(float));
        if (demo_audit(r) != 0) return -1;
        DEMO_TRY(r, mskv_request_remove(r->arena, req), "remove request");
        /* the removal freed the pages: end the step so their fence can retire */
        DEMO_TRY_BE(r, r->be.publish(r->be.impl, r->arena, NULL, 0), "publish");
        r->pages_freed += live;
        if (demo_push_window(r, q, k) != 0) return -1;
        demo_progress(r, k, w.commit_end, live);
    }
    return 0;
}

/* >>main ------------------------------------------------------------------ */

typedef struct demo_cmp {
    const unsigned char *kept;
    size_t fb;
    int64_t count, first_bad;
} demo_cmp;

static int demo_cmp_frame(void *user, int64_t p, const unsigned char *rgb) {
    demo_cmp *c = (demo_cmp *)user;
    if (p != c->count || memcmp(c->kept + (size_t)p * c->fb, rgb, c->fb) != 0) {
        if (c->first_bad < 0) c->first_bad = p;
    }
    c->count++;
    return 0;
}

/* Everything main holds, so each step below is a function of one thing. */
typedef struct demo_app {
    demo_run run;
    demo_decoder dec;
    demo_queue queue;
    demo_writer writer;
    demo_out out;
    pthread_t thread;
    char path[4096];         /* the output file (.y4m instead of .mp4 without FFmpeg) */
    double secs;             /* generation wall time */
    int thread_started, writer_open, queue_init, backend_open;
} demo_app;

/* The geometry, the window schedule and the page budget (in kv mode exactly
   what the sink + window bound allows, so a cache that failed to release
   would run out of pages). 0, or 2 (a usage error, reported). */
static int demo_size_run(demo_app *app) {
    demo_run *r = &app->run;
    mskv_window last;
    int64_t chunk_tokens;
    demo_geom_init(&r->g, r->cfg.width, r->cfg.height);
    r->T = demo_latents_for_frames(r->cfg.frames);
    if (mskv_schedule_init(&r->sched, r->T, r->cfg.window, r->cfg.mode == DEMO_MODE_CHAINED ? r->cfg.overlap : 0) != MSKV_SUCCESS ||
        mskv_schedule_window(&r->sched, r->sched.count - 1, &last) != MSKV_SUCCESS) {
        fprintf(stderr, "demo: invalid window schedule (window %d, overlap %d)\n", r->cfg.window, r->cfg.overlap);
        return 2;
    }
    r->T_gen = last.end;
    if (demo_feat_init(&r->feat, &r->g, r->T_gen) != 0)
        return demo_usage("%dx%d over %lld latent frames needs more than head_dim %d can encode; use a smaller size",
                          r->cfg.width, r->cfg.height, (long long)r->T_gen, r->g.dim);
    chunk_tokens = (int64_t)r->cfg.window * r->g.tpf;
    r->nb = r->cfg.cfg > 0.0 ? 2 : 1;   /* --cfg: a cache per branch */
    if (r->cfg.mode == DEMO_MODE_KV) {
        int64_t ps = r->cfg.page_size;
        int64_t bound = r->nb * ((r->cfg.sink * chunk_tokens + ps - 1) / ps + ((r->cfg.context + 1) * chunk_tokens + ps - 1) / ps + 2);
        if (bound >= INT32_MAX) { fprintf(stderr, "demo: the KV cache would need %lld pages\n", (long long)bound); return 2; }
        r->page_bound = (int32_t)bound;
    } else {
        r->page_bound = (int32_t)((chunk_tokens + r->g.tpf + r->cfg.page_size - 1) / r->cfg.page_size + 2);
    }
    r->num_pages = r->page_bound + 1;   /* + the null page */
    return 0;
}

/* The model's buffers, the scene and the decoder. 0, or 1 (reported). */
static int demo_alloc(demo_app *app) {
    demo_run *r = &app->run;
    int64_t max_q = (int64_t)r->cfg.window * r->g.tpf * r->nb;
    if (demo_scene_init(&r->scene, &r->g, r->cfg.seed) != 0 || demo_decoder_init(&app->dec, &r->scene) != 0) {
        fprintf(stderr, "demo: out of memory\n");
        return 1;
    }
    r->lat = (float *)calloc((size_t)r->T_gen * r->g.lat_floats, sizeof(float));
    r->q = (float *)malloc((size_t)max_q * 2u * r->g.dim * sizeof(float));
    r->o = (float *)malloc((size_t)max_q * 2u * r->g.dim * sizeof(float));
    r->k = (float *)malloc((size_t)max_q * r->g.dim * sizeof(float));
    r->v = (float *)malloc((size_t)max_q * r->g.dim * sizeof(float));
    r->x = (float *)malloc((size_t)r->cfg.window * r->g.lat_floats * sizeof(float));
    r->prompt[0] = (float *)malloc(r->g.lat_floats * sizeof(float));
    r->prompt[1] = (float *)malloc(r->g.lat_floats * sizeof(float));
    if (!r->lat || !r->q || !r->o || !r->k || !r->v || !r->x || !r->prompt[0] || !r->prompt[1]) {
        fprintf(stderr, "demo: out of memory\n");
        return 1;
    }
    return 0;
}

/* The backend first (a device store decides the arena's store fields), then
   the arena and the plan. 0, or 1 (reported). */
static int demo_open_cache(demo_app *app) {
    demo_run *r = &app->run;
    demo_store_shape shape;
    mskv_arena_desc ad;
    mskv_result res;
    char why[1024];
    int64_t max_q = (int64_t)r->cfg.window * r->g.tpf * r->nb;
    memset(&shape, 0, sizeof(shape));
    shape.num_pages = r->num_pages;
    shape.page_size = r->cfg.page_size;
    shape.head_dim = r->g.dim;
    shape.max_tokens = max_q;
    shape.max_batch = r->nb;
    shape.dtype = r->cfg.dtype;
    shape.threads = r->cfg.threads;
    if (demo_backend_open(&r->be, r->cfg.backend, &shape, r->cfg.quiet, why, sizeof(why)) != 0) {
        fprintf(stderr, "demo: %s\n", why);
        return 1;
    }
    app->backend_open = 1;
    memset(&ad, 0, sizeof(ad));
    ad.num_pages = r->num_pages;
    ad.page_size = r->cfg.page_size;
    ad.num_layers = 1;
    ad.kv_heads = 1;
    ad.head_dim = r->g.dim;
    res = r->be.arena_desc(r->be.impl, &ad);
    if (res == MSKV_SUCCESS) res = mskv_arena_create(&ad, &r->arena);
    if (res == MSKV_SUCCESS) res = r->be.bind(r->be.impl, r->arena);
    if (res == MSKV_SUCCESS) res = mskv_plan_alloc(r->arena, r->nb, (int32_t)max_q, ad.num_pages, &r->plan);
    if (res != MSKV_SUCCESS) { fprintf(stderr, "demo: arena: %s\n", mskv_result_string(res)); return 1; }
    return 0;
}

/* The output file, the decoder thread's buffers and the thread itself.
   Every other output opens first: a run that cannot start leaves -o
   untouched. 0, or 1 (reported). */
static int demo_open_output(demo_app *app) {
    demo_run *r = &app->run;
    demo_out *out = &app->out;
    size_t span = (size_t)r->cfg.window + 1;   /* a window's latents plus one of context */
    size_t plane = (size_t)r->g.lw * r->g.lh * 3u;
    snprintf(app->path, sizeof(app->path), "%s", r->cfg.out);
#ifdef MSKV_DEMO_NO_FFMPEG
    if (demo_ends_with(app->path, ".mp4") && strlen(app->path) + 1 < sizeof(app->path)) {
        strcpy(app->path + strlen(app->path) - 4, ".y4m");
        fprintf(stderr, "demo: built without FFmpeg: writing %s instead of %s\n", app->path, r->cfg.out);
    }
#endif
    if (r->cfg.dump_raw && !(out->raw = fopen(r->cfg.dump_raw, "wb"))) {
        fprintf(stderr, "demo: --dump-raw: cannot open %s\n", r->cfg.dump_raw);
        return 1;
    }
    if (demo_writer_open(&app->writer, app->path, r->g.width, r->g.height, DEMO_FPS) != 0) {
        fprintf(stderr, "demo: %s: %s\n", app->path, app->writer.err);
        demo_writer_close(&app->writer, 0);
        return 1;
    }
    app->writer_open = 1;
    snprintf(demo_armed_path, sizeof(demo_armed_path), "%s", app->path);
    demo_path_armed = 1;
    out->cfg = &r->cfg;
    out->scene = &r->scene;
    out->dec = &app->dec;
    out->writer = &app->writer;
    out->queue = &app->queue;
    out->frames = r->cfg.frames;
    out->truth_cap = (int64_t)span * DEMO_TR + 1;
    out->truth = (unsigned char *)malloc((size_t)out->truth_cap * r->g.rgb_bytes);
    out->truth_lat = (float *)malloc(span * r->g.lat_floats * sizeof(float));
    out->c3 = (float *)malloc(span * plane * sizeof(float));
    out->tmp = (float *)malloc(plane * sizeof(float));
    out->rgb = (unsigned char *)malloc(r->g.rgb_bytes);
    if (r->cfg.check) out->kept = (unsigned char *)malloc((size_t)r->cfg.frames * r->g.rgb_bytes);
    if (!out->truth || !out->truth_lat || !out->c3 || !out->tmp || !out->rgb || (r->cfg.check && !out->kept)) {
        fprintf(stderr, "demo: out of memory\n");
        return 1;
    }
    pthread_mutex_init(&app->queue.mu, NULL);
    pthread_cond_init(&app->queue.not_full, NULL);
    pthread_cond_init(&app->queue.not_empty, NULL);
    app->queue_init = 1;
    if (pthread_create(&app->thread, NULL, demo_out_main, out) != 0) {
        fprintf(stderr, "demo: cannot start the decoder thread\n");
        return 1;
    }
    app->thread_started = 1;
    return 0;
}

/* Generates the video, waits for the decoder thread and finishes the file.
   A run stopped by a signal keeps what was written (a playable file), or
   removes the file when no frame was. 0, or 1 (reported). */
static int demo_generate(demo_app *app) {
    demo_run *r = &app->run;
    int rc, ok = 1;
    size_t nw = (size_t)r->sched.count;
    /* the timeline: set before the first job is queued (the queue's lock hands it to the decoder thread) */
    r->den_t0 = (double *)calloc(nw ? 4 * nw : 1, sizeof(double));
    if (!r->den_t0) { fprintf(stderr, "demo: out of memory\n"); return 1; }
    r->den_t1 = r->den_t0 + nw;
    app->out.dec_t0 = r->den_t0 + 2 * nw;
    app->out.dec_t1 = r->den_t0 + 3 * nw;
    app->out.timed = (int64_t)nw;
    demo_progress_init(r);
    rc = r->cfg.mode == DEMO_MODE_CHAINED ? demo_run_chained(r, &app->queue)
       : r->nb > 1 ? demo_run_cfg(r, &app->queue) : demo_run_kv(r, &app->queue);
    if (!r->cfg.quiet && isatty(2)) fputc('\n', stderr);
    demo_queue_close(&app->queue);
    pthread_join(app->thread, NULL);
    app->thread_started = 0;
    app->secs = demo_now() - r->t_start;
    /* when the output failed, the generator only stopped because of it: one reason */
    if (rc != 0 && !r->interrupted && !app->out.failed) { fprintf(stderr, "demo: %s\n", r->err); ok = 0; }
    if (rc != 0 && !r->interrupted) ok = 0;
    if (app->out.failed) { fprintf(stderr, "demo: %s\n", app->out.err); ok = 0; }
    if (app->out.raw) {
        int bad = fclose(app->out.raw) != 0;
        app->out.raw = NULL;
        if (bad) { fprintf(stderr, "demo: --dump-raw: write failed\n"); ok = 0; }
    }
    if (ok && r->interrupted && app->writer.frames == 0) ok = 0;   /* nothing to keep */
    demo_path_armed = 0;
    app->writer_open = 0;
    if (demo_writer_close(&app->writer, ok) != 0) { fprintf(stderr, "demo: %s: %s\n", app->path, app->writer.err); ok = 0; }
    if (r->interrupted) {
        if (ok) fprintf(stderr, "demo: %s: wrote %s (%s, %lld of %d frames, %dx%d, %d fps)\n", r->err, app->path,
                        app->writer.codec, (long long)app->writer.frames, r->cfg.frames, r->g.width, r->g.height, DEMO_FPS);
        else fprintf(stderr, "demo: %s before a frame was written: removed %s\n", r->err, app->path);
    }
    if (!ok) { remove(app->path); return 1; }   /* no half-written, unplayable file */
    return r->interrupted ? 1 : 0;
}

/* Decoding against denoising, over the windows that have a next one (the
   last window's decode has nothing left to overlap with): the seconds their
   decode ran while the generator was denoising any window; fraction = that
   over their decode seconds; of_possible = that over the most that could
   overlap, the smaller of their decode seconds and the denoise seconds of
   windows 1 on (a pipeline overlaps about all of it whichever side is
   slower; a serial demo none). Both -1 when no such window was decoded. */
typedef struct demo_overlap {
    double decode_s, denoise_s, overlap_s, fraction, of_possible;
    int64_t windows;
} demo_overlap;

static void demo_overlap_get(const demo_app *app, demo_overlap *ov) {
    const demo_run *r = &app->run;
    const demo_out *o = &app->out;
    int64_t k, j, n = o->timed;
    memset(ov, 0, sizeof(*ov));
    ov->fraction = ov->of_possible = -1.0;
    if (!r->den_t0) return;
    for (k = 0; k + 1 < n; k++) {
        double d0 = o->dec_t0[k], d1 = o->dec_t1[k];
        if (d0 <= 0.0 || d1 < d0) continue;   /* not decoded (a failure or a signal) */
        ov->windows++;
        ov->decode_s += d1 - d0;
        for (j = 0; j < n; j++) {
            double a = r->den_t0[j] > d0 ? r->den_t0[j] : d0, b = r->den_t1[j] < d1 ? r->den_t1[j] : d1;
            if (r->den_t0[j] > 0.0 && r->den_t1[j] >= r->den_t0[j] && b > a) ov->overlap_s += b - a;
        }
    }
    for (j = 1; j < n; j++)
        if (r->den_t0[j] > 0.0 && r->den_t1[j] >= r->den_t0[j]) ov->denoise_s += r->den_t1[j] - r->den_t0[j];
    if (ov->windows > 0 && ov->decode_s > 0.0) {
        double possible = ov->decode_s < ov->denoise_s ? ov->decode_s : ov->denoise_s;
        ov->fraction = ov->overlap_s / ov->decode_s;
        ov->of_possible = possible > 0.0 ? ov->overlap_s / possible : 0.0;
    }
}

/* --timeline: when each window's denoise and decode ran, from the start of generation */
static void demo_timeline(const demo_app *app) {
    const demo_run *r = &app->run;
    const demo_out *o = &app->out;
    int64_t k;
    for (k = 0; r->den_t0 && k < o->timed; k++) {
        double t = r->t_start;
        printf("timeline: window=%lld denoise=%.4f..%.4f decode=%.4f..%.4f\n", (long long)k,
               r->den_t0[k] > 0.0 ? r->den_t0[k] - t : -1.0, r->den_t1[k] > 0.0 ? r->den_t1[k] - t : -1.0,
               o->dec_t0[k] > 0.0 ? o->dec_t0[k] - t : -1.0, o->dec_t1[k] > 0.0 ? o->dec_t1[k] - t : -1.0);
    }
}

/* The summary (key=value fields on stdout). */
static void demo_report(demo_app *app, double *worst_psnr) {
    demo_run *r = &app->run;
    char cfg_field[48] = "";
    double mse = app->out.sse / ((double)app->out.next * (double)r->g.rgb_bytes);
    double wmse = app->out.worst_sse / (double)r->g.rgb_bytes;
    double psnr = mse > 0.0 ? 10.0 * log10(255.0 * 255.0 / mse) : INFINITY;
    uint64_t lat_hash = demo_fnv(DEMO_FNV_INIT, r->lat, (size_t)r->T * r->g.lat_floats * sizeof(float));
    *worst_psnr = wmse > 0.0 ? 10.0 * log10(255.0 * 255.0 / wmse) : INFINITY;
    if (r->nb > 1) snprintf(cfg_field, sizeof(cfg_field), " cfg=%g branches=2", r->cfg.cfg);
    printf("demo: mode=%s backend=%s dtype=%s threads=%d size=%dx%d latent=%dx%dx%d tokens_per_frame=%d head_dim=%d "
           "window=%d %s=%d steps=%d%s\n",
           r->cfg.mode == DEMO_MODE_KV ? "kv" : "chained", r->be.name,
           r->be.dtype == MSKV_DTYPE_F16 ? "f16" : r->be.dtype == MSKV_DTYPE_BF16 ? "bf16" : "f32",
           r->cfg.threads, r->g.width, r->g.height,
           r->g.lw, r->g.lh, DEMO_C, r->g.tpf, r->g.dim, r->cfg.window,
           r->cfg.mode == DEMO_MODE_KV ? "sink" : "overlap", r->cfg.mode == DEMO_MODE_KV ? r->cfg.sink : r->cfg.overlap,
           r->cfg.steps, cfg_field);
    printf("demo: frames=%lld latents=%lld windows=%lld seconds=%.2f fps=%.1f\n", (long long)app->out.next,
           (long long)r->T, (long long)r->sched.count, app->secs, app->secs > 0 ? (double)app->out.next / app->secs : 0.0);
    printf("demo: page_size=%d peak_pages=%d page_bound=%d pages_freed=%lld released_tokens=%lld offloads=%lld\n",
           r->cfg.page_size, r->peak_pages, r->page_bound, (long long)r->pages_freed, (long long)r->released_tokens,
           (long long)r->offloads);
    printf("demo: psnr_db=%.2f worst_frame_psnr_db=%.2f worst_frame=%lld psnr_min_db=%.0f latent_hash=%016llx\n", psnr,
           *worst_psnr, (long long)app->out.worst_frame, DEMO_PSNR_MIN, (unsigned long long)lat_hash);
    {
        demo_overlap ov;
        char f[32] = "n/a", p[32] = "n/a";
        demo_overlap_get(app, &ov);
        if (ov.fraction >= 0.0) { snprintf(f, sizeof(f), "%.3f", ov.fraction); snprintf(p, sizeof(p), "%.3f", ov.of_possible); }
        printf("demo: decode_overlap=%s overlap_of_possible=%s overlapped_seconds=%.3f decode_seconds=%.3f denoise_seconds=%.3f "
               "generator_waits=%lld\n", f, p, ov.overlap_s, ov.decode_s, ov.denoise_s, (long long)app->queue.gen_waits);
    }
    if (r->cfg.timeline) demo_timeline(app);
    printf("demo: wrote %s (%s, %lld frames, %dx%d, %d fps)\n", app->path, app->writer.codec, (long long)app->writer.frames,
           r->g.width, r->g.height, DEMO_FPS);
}

/* --check: frame count, the windowed decode against decoding the whole
   latent stream at once, PSNR per frame, pages within the bound.
   0 = pass, 1 = fail. */
static int demo_self_check(demo_app *app, double worst_psnr) {
    demo_run *r = &app->run;
    demo_out *out = &app->out;
    demo_cmp c;
    float *c3 = (float *)malloc((size_t)r->T * r->g.lw * r->g.lh * 3u * sizeof(float));
    int chk_frames, chk_decode, chk_psnr, chk_pages, chk_overlap;
    demo_overlap ov;
    char ovs[160];
    chk_frames = out->next == r->cfg.frames && app->writer.frames == r->cfg.frames;
    c.kept = out->kept;
    c.fb = r->g.rgb_bytes;
    c.count = 0;
    c.first_bad = -1;
    chk_decode = c3 && demo_decode(&app->dec, r->lat, 0, r->T, 0, r->cfg.frames, c3, out->tmp, out->rgb, demo_cmp_frame, &c) == 0 &&
                 c.count == r->cfg.frames && c.first_bad < 0;
    free(c3);
    chk_psnr = worst_psnr >= DEMO_PSNR_MIN;   /* every frame, not the mean: a few ruined frames must fail */
    chk_pages = r->cfg.mode != DEMO_MODE_KV || r->peak_pages <= r->page_bound;
    demo_overlap_get(app, &ov);
    /* Serial is the generator waiting for decoding; the timeline alone cannot
       tell that from a loaded machine whose scheduler ran the short decodes
       between denoise steps (overlap 0 with the generator never waiting), so
       a low overlap fails only with waits behind it. */
    chk_overlap = ov.windows == 0 || ov.of_possible >= DEMO_OVERLAP_MIN || app->queue.gen_waits == 0;
    if (ov.windows == 0) snprintf(ovs, sizeof(ovs), "decode_overlap n/a (one window) ok");
    else if (ov.of_possible >= DEMO_OVERLAP_MIN)
        snprintf(ovs, sizeof(ovs), "decode_overlap %.2f of the possible >= %.1f ok", ov.of_possible, DEMO_OVERLAP_MIN);
    else if (chk_overlap)
        snprintf(ovs, sizeof(ovs), "decode_overlap %.2f of the possible, the generator never waited ok", ov.of_possible);
    else
        snprintf(ovs, sizeof(ovs), "decode_overlap %.2f of the possible, the generator waited %lld times FAIL (decoding ran serially behind denoising)",
                 ov.of_possible, (long long)app->queue.gen_waits);
    printf("check: frames=%lld/%d %s, windowed_decode=%s %s, psnr %.2f (worst frame %lld) >= %.0f %s, kv_pages %d <= %d %s, %s: %s\n",
           (long long)out->next, r->cfg.frames, chk_frames ? "ok" : "FAIL",
           chk_decode ? "identical" : "differs", chk_decode ? "ok" : "FAIL",
           worst_psnr, (long long)out->worst_frame, DEMO_PSNR_MIN, chk_psnr ? "ok" : "FAIL",
           r->peak_pages, r->page_bound, chk_pages ? "ok" : "FAIL", ovs,
           chk_frames && chk_decode && chk_psnr && chk_pages && chk_overlap ? "PASS" : "FAIL");
    return chk_frames && chk_decode && chk_psnr && chk_pages && chk_overlap ? 0 : 1;
}

static void demo_close(demo_app *app) {
    demo_run *r = &app->run;
    demo_out *out = &app->out;
    if (app->thread_started) {   /* only on a failure before the run: nothing was queued */
        demo_queue_close(&app->queue);
        pthread_join(app->thread, NULL);
    }
    if (out->raw) fclose(out->raw);
    demo_path_armed = 0;
    if (app->writer_open) { demo_writer_close(&app->writer, 0); remove(app->path); }
    if (app->queue_init) {
        pthread_mutex_destroy(&app->queue.mu);
        pthread_cond_destroy(&app->queue.not_full);
        pthread_cond_destroy(&app->queue.not_empty);
    }
    mskv_plan_free(r->arena, &r->plan);
    mskv_arena_destroy(r->arena);   /* before the device store its ops point at */
    if (app->backend_open) r->be.destroy(r->be.impl);
    demo_decoder_free(&app->dec);
    demo_scene_free(&r->scene);
    free(r->den_t0);   /* every timeline array */
    free(r->lat); free(r->q); free(r->o); free(r->k); free(r->v); free(r->x); free(r->prompt[0]); free(r->prompt[1]);
    free(out->truth); free(out->truth_lat); free(out->c3); free(out->tmp); free(out->rgb); free(out->kept);
}

int main(int argc, char **argv) {
    static demo_app app;   /* static: large, and zero */
    double worst_psnr = 0.0;
    int status;
    app.out.worst_frame = -1;
    status = demo_parse(argc, argv, &app.run.cfg);
    if (status == 1) return 0;
    if (status != 0) return 2;
    status = demo_size_run(&app);
    if (status == 0) status = demo_alloc(&app);
    if (status == 0) status = demo_open_cache(&app);
    if (status == 0) {
        demo_catch_signals();   /* from here on a signal finishes the file instead of leaving it broken */
        status = demo_open_output(&app);
    }
    if (status == 0) status = demo_generate(&app);
    if (status == 0) {
        demo_report(&app, &worst_psnr);
        if (app.run.cfg.check) status = demo_self_check(&app, worst_psnr);
        fflush(stdout);
    }
    demo_close(&app);
    if (app.run.interrupted) {   /* die of the signal, so a shell or a script sees the interruption */
        int sig = (int)demo_signal;
        fflush(stderr);
        signal(sig, SIG_DFL);
        raise(sig);
        return 128 + sig;
    }
    return status;
}
