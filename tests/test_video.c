/* test_video.c - the demo end to end: both modes pass their self-check, the
   .mp4 decodes (through libavformat/libavcodec, no ffmpeg CLI) to the frames
   the demo produced, page use stays flat however long the video, offload
   changes nothing, a broken cache makes the self-check fail, --cfg guidance
   with two lockstep branches passes it (one broken branch fails it), and the
   backend choice: --backend cuda without CUDA says why, auto falls back to the CPU,
   and (where build/demo-emu exists) the CUDA backend passes the self-check
   on an emulated device.

   Built only when FFmpeg is found, as its own program:
     gcc -std=c99 -Wall -Wextra -pedantic -Werror -O2 -Itests $(pkg-config --cflags ...) tests/test_video.c \
         -o build/tests-video $(pkg-config --libs libavformat libavcodec libswscale libavutil) -ldl -lpthread -lm
   It runs the demo binary build/demo (MSKV_DEMO_BIN overrides the path), so
   run it from the repository root after `make build/demo`; the emulated-GPU
   tests run build/demo-emu (MSKV_DEMO_EMU_BIN), built as demo/demo_emu.cpp says. */
#define _POSIX_C_SOURCE 200809L
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>

/* only to ask the GPU layer whether CUDA is usable here, as the demo does */
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

/* the small size every run here uses: 8x4 tokens per latent frame */
#define TV_W 128
#define TV_H 64
#define TV_SMALL "--width 128 --height 64 -q"

static char tv_dir[64];
static char tv_out[1 << 15];

static const char *tv_bin = NULL;   /* NULL: the demo; else the program to run */

static const char *tv_demo(void) {
    const char *p = getenv("MSKV_DEMO_BIN");
    if (tv_bin) return tv_bin;
    return p && *p ? p : "build/demo";
}

static const char *tv_emu(void) {
    const char *p = getenv("MSKV_DEMO_EMU_BIN");
    return p && *p ? p : "build/demo-emu";
}

/* 1 when CUDA is usable here (driver, device, NVRTC); else 0 and why */
static int tv_cuda_usable(char *why, size_t cap) {
    return mskv_cuda_probe(NULL, why, cap) == MSKV_SUCCESS;
}

/* the number of lines of tv_out that contain text */
static int tv_lines_with(const char *text) {
    int n = 0;
    const char *s = tv_out;
    while ((s = strstr(s, text)) != NULL) {
        const char *eol = strchr(s, '\n');
        n++;
        if (!eol) break;
        s = eol + 1;
    }
    return n;
}

static void tv_cleanup(void) {
    if (strcmp(tv_dir, "/tmp") != 0) rmdir(tv_dir);   /* each test removed its files */
}

static const char *tv_path(const char *name) {
    static char buf[4][256];
    static int next;
    char *b = buf[next++ & 3];
    if (!tv_dir[0]) {
        snprintf(tv_dir, sizeof(tv_dir), "/tmp/mskv_video_XXXXXX");
        if (!mkdtemp(tv_dir)) snprintf(tv_dir, sizeof(tv_dir), "/tmp");
        atexit(tv_cleanup);
    }
    snprintf(b, sizeof(buf[0]), "%s/%s", tv_dir, name);
    return b;
}

/* Runs the demo with args (env: "NAME=value " prefix or ""), output in
   tv_out (stdout and stderr). Returns its exit status, or -1. */
static int tv_run(const char *env, const char *args) {
    char cmd[2048];
    FILE *p;
    size_t n = 0;
    int st;
    if (access(tv_demo(), X_OK) != 0) {
        snprintf(tv_out, sizeof(tv_out), "demo binary %s not found (make build/demo first)", tv_demo());
        return -1;
    }
    snprintf(cmd, sizeof(cmd), "%s%s %s 2>&1", env, tv_demo(), args);
    p = popen(cmd, "r");
    if (!p) return -1;
    while (n + 1 < sizeof(tv_out)) {
        size_t got = fread(tv_out + n, 1, sizeof(tv_out) - 1 - n, p);
        if (got == 0) break;
        n += got;
    }
    tv_out[n] = 0;
    st = pclose(p);
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

/* tv_run, showing what the demo printed when its exit status is not the expected one */
static int tv_expect(int expected, const char *env, const char *args) {
    int rc = tv_run(env, args);
    if (rc != expected) printf("  %s%s %s exited with %d; it printed:\n%s\n", env, tv_demo(), args, rc, tv_out);
    return rc;
}

/* The number after "key=" in the demo's summary, or -1. */
static double tv_field(const char *key) {
    const char *s = tv_out;
    size_t k = strlen(key);
    while ((s = strstr(s, key)) != NULL) {
        if ((s == tv_out || s[-1] == ' ') && s[k] == '=') return strtod(s + k + 1, NULL);
        s += k;
    }
    return -1.0;
}

static int tv_has(const char *text) { return strstr(tv_out, text) != NULL; }

/* The run got as far as its self-check, and the check failed on PSNR: a
   demo that exits 1 for any other reason (or prints nothing) does not count. */
static int tv_psnr_check_failed(void) {
    double worst = tv_field("worst_frame_psnr_db");
    return tv_has("check: ") && tv_has(">= 40 FAIL") && tv_has(": FAIL") && worst >= 0.0 && worst < 40.0;
}

static unsigned char *tv_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = (unsigned char *)malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
        else *size = (size_t)n;
    }
    fclose(f);
    return buf;
}

/* >>decode ---------------------------------------------------------------- */

typedef struct tv_video {
    int frames, width, height;
    enum AVCodecID codec;
    char format[64];
    double psnr_min;      /* worst frame against the demo's own frames */
    int compared;
    char err[256];
} tv_video;

static double tv_psnr(const unsigned char *a, const unsigned char *b, size_t n) {
    double sse = 0.0;
    size_t i;
    for (i = 0; i < n; i++) { double d = (double)a[i] - (double)b[i]; sse += d * d; }
    return sse == 0.0 ? 99.0 : 10.0 * log10(255.0 * 255.0 * (double)n / sse);
}

static int tv_take_frames(AVCodecContext *ctx, AVFrame *fr, struct SwsContext **sws, unsigned char *rgb,
                          const unsigned char *raw, size_t raw_size, tv_video *v) {
    for (;;) {
        int e = avcodec_receive_frame(ctx, fr);
        if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return 0;
        if (e < 0) { snprintf(v->err, sizeof(v->err), "decode error %d", e); return -1; }
        v->width = fr->width;
        v->height = fr->height;
        if (fr->width == TV_W && fr->height == TV_H && raw) {
            size_t fb = (size_t)TV_W * TV_H * 3u;
            uint8_t *dst[1];
            int dst_stride[1];
            *sws = sws_getCachedContext(*sws, fr->width, fr->height, (enum AVPixelFormat)fr->format, TV_W, TV_H,
                                        AV_PIX_FMT_RGB24, SWS_BICUBIC, NULL, NULL, NULL);
            if (!*sws) { snprintf(v->err, sizeof(v->err), "no converter"); return -1; }
            dst[0] = rgb;
            dst_stride[0] = 3 * TV_W;
            sws_scale(*sws, (const uint8_t *const *)fr->data, fr->linesize, 0, fr->height, dst, dst_stride);
            if ((size_t)(v->frames + 1) * fb <= raw_size) {
                double p = tv_psnr(rgb, raw + (size_t)v->frames * fb, fb);
                if (v->compared == 0 || p < v->psnr_min) v->psnr_min = p;
                v->compared++;
            }
        }
        v->frames++;
        av_frame_unref(fr);
    }
}

/* Decodes every frame of path's best video stream; compares each with the
   RGB24 frames in raw_path (NULL: no comparison). 0 on success. */
static int tv_decode(const char *path, const char *raw_path, tv_video *v) {
    AVFormatContext *fmt = NULL;
    AVCodecContext *ctx = NULL;
    const AVCodec *dec = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *fr = av_frame_alloc();
    struct SwsContext *sws = NULL;
    unsigned char *raw = NULL, *rgb = (unsigned char *)malloc((size_t)TV_W * TV_H * 3u);
    size_t raw_size = 0;
    int si, rc = -1;
    memset(v, 0, sizeof(*v));
    av_log_set_level(AV_LOG_ERROR);
    if (raw_path && !(raw = tv_read_file(raw_path, &raw_size))) { snprintf(v->err, sizeof(v->err), "no raw frames"); goto done; }
    if (!pkt || !fr || !rgb) goto done;
    if (avformat_open_input(&fmt, path, NULL, NULL) < 0 || avformat_find_stream_info(fmt, NULL) < 0) {
        snprintf(v->err, sizeof(v->err), "cannot open %s", path);
        goto done;
    }
    snprintf(v->format, sizeof(v->format), "%s", fmt->iformat->name);
    si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
    if (si < 0 || !dec) { snprintf(v->err, sizeof(v->err), "no video stream"); goto done; }
    v->codec = fmt->streams[si]->codecpar->codec_id;
    ctx = avcodec_alloc_context3(dec);
    if (!ctx || avcodec_parameters_to_context(ctx, fmt->streams[si]->codecpar) < 0) goto done;
    ctx->thread_count = 1;
    if (avcodec_open2(ctx, dec, NULL) < 0) { snprintf(v->err, sizeof(v->err), "cannot open decoder"); goto done; }
    while (av_read_frame(fmt, pkt) >= 0) {
        int bad = 0;
        if (pkt->stream_index == si)
            bad = avcodec_send_packet(ctx, pkt) < 0 || tv_take_frames(ctx, fr, &sws, rgb, raw, raw_size, v) != 0;
        av_packet_unref(pkt);
        if (bad) goto done;
    }
    if (avcodec_send_packet(ctx, NULL) < 0 || tv_take_frames(ctx, fr, &sws, rgb, raw, raw_size, v) != 0) goto done;
    rc = 0;
done:
    sws_freeContext(sws);
    avcodec_free_context(&ctx);
    avformat_close_input(&fmt);
    av_frame_free(&fr);
    av_packet_free(&pkt);
    free(raw);
    free(rgb);
    return rc;
}

/* >>tests ----------------------------------------------------------------- */

TEST(kv_mode_passes_its_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --mode kv --frames 41 --check -o %s", TV_SMALL, tv_path("kv.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has("check: ") && tv_has(": PASS"));
    EXPECT_EQ(41, (long long)tv_field("frames"));
    remove(tv_path("kv.mp4"));
}

TEST(chained_mode_passes_its_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --mode chained --window 4 --overlap 2 --frames 41 --check -o %s", TV_SMALL,
             tv_path("chained.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has("check: ") && tv_has(": PASS"));
    EXPECT_EQ(41, (long long)tv_field("frames"));
    remove(tv_path("chained.mp4"));
}

TEST(mp4_decodes_to_the_frames_the_demo_wrote) {
    char args[512];
    tv_video v;
    const AVCodec *x264 = avcodec_find_encoder_by_name("libx264");
    snprintf(args, sizeof(args), "%s --frames 45 -o %s --dump-raw %s", TV_SMALL, tv_path("rt.mp4"), tv_path("rt.rgb"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    ASSERT_EQ(0, tv_decode(tv_path("rt.mp4"), tv_path("rt.rgb"), &v));
    EXPECT_TRUE(strstr(v.format, "mp4") != NULL);
    EXPECT_EQ(x264 ? AV_CODEC_ID_H264 : AV_CODEC_ID_MPEG4, v.codec);
    EXPECT_EQ(45, v.frames);
    EXPECT_EQ(TV_W, v.width);
    EXPECT_EQ(TV_H, v.height);
    EXPECT_EQ(45, v.compared);
    /* lossy 4:2:0 coding of a smooth texture: every frame well above 30 dB */
    EXPECT_GE(v.psnr_min, 30.0);
    printf("  %d frames, worst frame %.1f dB against the demo's frames\n", v.frames, v.psnr_min);
    remove(tv_path("rt.mp4"));
    remove(tv_path("rt.rgb"));
}

TEST(mp4_has_its_index_before_the_media_data) {
    char args[512];
    unsigned char *f;
    size_t size = 0, at = 0;
    long long moov = -1, mdat = -1;
    snprintf(args, sizeof(args), "%s --frames 9 -o %s", TV_SMALL, tv_path("fs.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    f = tv_read_file(tv_path("fs.mp4"), &size);
    ASSERT_TRUE(f != NULL);
    while (at + 8 <= size) {   /* top-level boxes: 32-bit size (1 = 64-bit follows, 0 = to the end), type */
        uint64_t len = ((uint64_t)f[at] << 24) | ((uint64_t)f[at + 1] << 16) | ((uint64_t)f[at + 2] << 8) | f[at + 3];
        if (!memcmp(f + at + 4, "moov", 4) && moov < 0) moov = (long long)at;
        if (!memcmp(f + at + 4, "mdat", 4) && mdat < 0) mdat = (long long)at;
        if (len == 1 && at + 16 <= size) {
            int i;
            len = 0;
            for (i = 0; i < 8; i++) len = (len << 8) | f[at + 8 + i];
        } else if (len == 0) {
            len = size - at;
        }
        if (len < 8) break;
        at += (size_t)len;
    }
    free(f);
    EXPECT_EQ((long long)size, (long long)at);
    ASSERT_GE(moov, 0);
    ASSERT_GE(mdat, 0);
    EXPECT_LT(moov, mdat);   /* +faststart */
    remove(tv_path("fs.mp4"));
}

TEST(y4m_output_holds_exactly_the_requested_frames) {
    char args[512];
    unsigned char *f;
    size_t size = 0, at, fb = (size_t)TV_W * TV_H * 3u / 2u;
    int frames = 0;
    snprintf(args, sizeof(args), "%s --frames 13 -o %s", TV_SMALL, tv_path("out.y4m"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    f = tv_read_file(tv_path("out.y4m"), &size);
    ASSERT_TRUE(f != NULL);
    ASSERT_TRUE(size > 10 && !memcmp(f, "YUV4MPEG2 W128 H64 ", 19));
    for (at = 0; at < size && f[at] != '\n'; at++) {}
    at++;
    while (at + 6 <= size && !memcmp(f + at, "FRAME\n", 6)) { at += 6 + fb; frames++; }
    free(f);
    EXPECT_EQ((long long)size, (long long)at);
    EXPECT_EQ(13, frames);
    remove(tv_path("out.y4m"));
}

TEST(kv_peak_pages_do_not_grow_with_video_length) {
    char args[512];
    double peak81, peak381, freed81, freed381, bound;
    snprintf(args, sizeof(args), "%s --frames 81 --check -o %s", TV_SMALL, tv_path("short.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    peak81 = tv_field("peak_pages");
    freed81 = tv_field("pages_freed");
    snprintf(args, sizeof(args), "%s --frames 381 --check -o %s", TV_SMALL, tv_path("long.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    peak381 = tv_field("peak_pages");
    freed381 = tv_field("pages_freed");
    bound = tv_field("page_bound");
    printf("  peak pages: %.0f for 81 frames, %.0f for 381 (bound %.0f); freed %.0f and %.0f\n", peak81, peak381,
           bound, freed81, freed381);
    ASSERT_GT(peak81, 0.0);
    EXPECT_EQ((long long)peak81, (long long)peak381);
    EXPECT_LE((long long)peak381, (long long)bound);
    EXPECT_GT(freed381, freed81);   /* the window really slid: the long run released more */
    remove(tv_path("short.mp4"));
    remove(tv_path("long.mp4"));
}

TEST(offload_round_trip_leaves_the_output_bit_identical) {
    char args[512];
    double h1, h2;
    char hash1[32] = "", hash2[32] = "";
    const char *s;
    snprintf(args, sizeof(args), "%s --frames 41 --check -o %s", TV_SMALL, tv_path("off0.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    if ((s = strstr(tv_out, "latent_hash=")) != NULL) sscanf(s + 12, "%31s", hash1);
    h1 = tv_field("offloads");
    snprintf(args, sizeof(args), "%s --frames 41 --check --offload -o %s", TV_SMALL, tv_path("off1.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    if ((s = strstr(tv_out, "latent_hash=")) != NULL) sscanf(s + 12, "%31s", hash2);
    h2 = tv_field("offloads");
    EXPECT_EQ(0, (long long)h1);
    EXPECT_GT(h2, 0.0);
    ASSERT_TRUE(hash1[0] != 0);
    EXPECT_STREQ(hash1, hash2);
    remove(tv_path("off0.mp4"));
    remove(tv_path("off1.mp4"));
}

/* --cfg: two branches in lockstep whose guided combination is the truth; the
   same check judges it, also with both branches parked and reloaded. */
TEST(cfg_guidance_passes_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --cfg 3 --check -o %s", TV_SMALL, tv_path("cfg.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(" cfg=3 branches=2") && tv_has(": PASS"));
    EXPECT_TRUE(tv_field("worst_frame_psnr_db") >= 40.0);   /* inf: exact on the CPU's f32 cache */
    snprintf(args, sizeof(args), "%s --frames 41 --cfg 7.5 --offload --check -o %s", TV_SMALL, tv_path("cfg.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(": PASS"));
    EXPECT_GT(tv_field("offloads"), 0.0);
    remove(tv_path("cfg.mp4"));
}

/* One broken branch (the unconditional one's sink page; the conditional
   branch is intact) ruins the guided output, and the check says so. */
TEST(a_broken_cfg_branch_fails_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --cfg 3 --check -o %s", TV_SMALL, tv_path("cfgbrk.mp4"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=sink ", args));
    EXPECT_TRUE(tv_psnr_check_failed());
    remove(tv_path("cfgbrk.mp4"));
}

TEST(cfg_usage_errors_exit_2_with_a_one_line_reason) {
    size_t n;
    EXPECT_EQ(2, tv_expect(2, "", "--cfg 0 -o /nonexistent-dir/usage.mp4"));
    n = strlen(tv_out);
    EXPECT_TRUE(n > 0 && strchr(tv_out, '\n') == tv_out + n - 1);
    EXPECT_TRUE(tv_has("--cfg"));
    EXPECT_EQ(2, tv_expect(2, "", "--cfg 101 -o /nonexistent-dir/usage.mp4"));
    EXPECT_EQ(2, tv_expect(2, "", "--cfg x -o /nonexistent-dir/usage.mp4"));
    EXPECT_EQ(2, tv_expect(2, "", "--cfg 3 --mode chained -o /nonexistent-dir/usage.mp4"));
}

TEST(a_scribbled_cache_page_fails_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --check -o %s", TV_SMALL, tv_path("brk.mp4"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=page ", args));
    EXPECT_TRUE(tv_has("psnr") && tv_has("FAIL"));
    EXPECT_TRUE(tv_psnr_check_failed());
    snprintf(args, sizeof(args), "%s --mode chained --frames 41 --check -o %s", TV_SMALL, tv_path("brk.mp4"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=page ", args));
    EXPECT_TRUE(tv_psnr_check_failed());
    remove(tv_path("brk.mp4"));
}

TEST(a_scribbled_sink_page_fails_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --check -o %s", TV_SMALL, tv_path("sink.mp4"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=sink ", args));
    EXPECT_TRUE(tv_psnr_check_failed());
    remove(tv_path("sink.mp4"));
}

TEST(stale_kv_fails_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --check -o %s", TV_SMALL, tv_path("stale.mp4"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=stale ", args));
    EXPECT_TRUE(tv_psnr_check_failed());
    remove(tv_path("stale.mp4"));
}

/* Window k decodes while window k+1 denoises: the summary measures it
   (decode_overlap, overlap_of_possible), --timeline gives every window's
   intervals, and --check passes on it. In both modes. */
TEST(decoding_overlaps_denoising_and_the_check_passes_on_it) {
    static const char *const modes[2] = { "--mode kv", "--mode chained --window 4 --overlap 2" };
    char args[512];
    int m;
    for (m = 0; m < 2; m++) {
        const char *s;
        double n0[64], n1[64], d0[64], d1[64], ov = 0.0;
        long long windows, lines = 0, k, j;
        snprintf(args, sizeof(args), "%s %s --frames 81 --check --timeline -o %s", TV_SMALL, modes[m], tv_path("overlap.y4m"));
        ASSERT_EQ(0, tv_expect(0, "", args));
        EXPECT_TRUE(tv_has("check: ") && tv_has(": PASS"));
        /* how much overlaps is the scheduler's to say on a loaded machine (CI runs
           two test programs at a time): the check passes on the overlap, or on
           a generator that never waited for decoding */
        EXPECT_TRUE(tv_has(" of the possible >= 0.2 ok") || tv_has(" of the possible, the generator never waited ok"));
        EXPECT_EQ(0, (int)tv_field("generator_waits"));
        EXPECT_TRUE(tv_field("overlap_of_possible") >= 0.0 && tv_field("overlap_of_possible") <= 1.0);
        EXPECT_TRUE(tv_field("decode_seconds") > 0.0);
        printf("  %s: decode_overlap %.3f, overlap_of_possible %.3f\n", modes[m], tv_field("decode_overlap"),
               tv_field("overlap_of_possible"));
        windows = (long long)tv_field("windows");
        ASSERT_TRUE(windows >= 3 && windows <= 64);
        for (s = tv_out; (s = strstr(s, "timeline: window=")) != NULL && lines < 64; s++) {
            if (sscanf(s, "timeline: window=%lld denoise=%lf..%lf decode=%lf..%lf", &k, &n0[lines], &n1[lines], &d0[lines], &d1[lines]) != 5 ||
                k != lines) {
                mt_fail(__FILE__, __LINE__, "timeline line %lld does not parse: %.80s", lines, s);
                break;
            }
            EXPECT_TRUE(n0[k] >= 0.0 && n1[k] >= n0[k] && d1[k] >= d0[k]);
            EXPECT_TRUE(k == 0 || n0[k] >= n1[k - 1]);   /* one generator: denoises follow each other */
            EXPECT_TRUE(d0[k] >= n1[k]);                 /* a window is decoded after it is denoised */
            lines++;
        }
        ASSERT_EQ(windows, lines);
        /* the summary's overlapped seconds, from the timeline: each decode (but the last) against every denoise */
        for (k = 0; k + 1 < lines; k++)
            for (j = 0; j < lines; j++) {
                double a = n0[j] > d0[k] ? n0[j] : d0[k], b = n1[j] < d1[k] ? n1[j] : d1[k];
                if (b > a) ov += b - a;
            }
        EXPECT_NEAR(tv_field("overlapped_seconds"), ov, 0.002 + 0.01 * ov);
    }
    remove(tv_path("overlap.y4m"));
}

/* MSKV_DEMO_BREAK=serial decodes each window before denoising the next: no
   overlap at all, and --check fails on that alone (the video is as good). */
TEST(serial_decoding_fails_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --check -o %s", TV_SMALL, tv_path("serial.y4m"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=serial ", args));
    EXPECT_TRUE(tv_has("demo: MSKV_DEMO_BREAK: each window is decoded before the next is denoised"));
    EXPECT_TRUE(tv_field("decode_seconds") > 0.0);
    EXPECT_TRUE(tv_field("decode_overlap") == 0.0 && tv_field("overlapped_seconds") == 0.0);
    EXPECT_TRUE(tv_field("generator_waits") >= 1.0);
    EXPECT_TRUE(tv_has("FAIL (decoding ran serially behind denoising): FAIL"));
    EXPECT_TRUE(tv_has("frames=41/41 ok") && tv_has("windowed_decode=identical ok") && tv_has(">= 40 ok"));
    remove(tv_path("serial.y4m"));
}

TEST(too_few_denoise_steps_leave_noise_that_fails_the_self_check) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --steps 2 --check -o %s", TV_SMALL, tv_path("steps.mp4"));
    EXPECT_EQ(1, tv_expect(1, "", args));
    EXPECT_TRUE(tv_psnr_check_failed());
    remove(tv_path("steps.mp4"));
}

/* The PSNR check is per frame: a few bad frames in a long, otherwise exact
   video fail it even when the mean over the video is above the threshold
   (here: the first window gets fewer denoise steps than it has new frames,
   4 where the default, --window + 1, would give 8). */
TEST(a_few_bad_frames_fail_the_self_check_even_when_the_mean_passes) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 100 --mode chained --window 7 --overlap 3 --steps 4 --check -o %s", TV_SMALL,
             tv_path("few.mp4"));
    EXPECT_EQ(1, tv_expect(1, "", args));
    EXPECT_GE(tv_field("psnr_db"), 40.0);           /* the mean alone would pass */
    EXPECT_TRUE(tv_psnr_check_failed());
    remove(tv_path("few.mp4"));
}

/* A run that fails does not leave a half-written, unplayable file behind,
   and one that cannot start (its --dump-raw cannot be opened) does not touch -o. */
TEST(a_failed_run_leaves_no_broken_output_file) {
    char args[512];
    FILE *f = fopen(tv_path("keep.mp4"), "wb");
    ASSERT_TRUE(f != NULL);
    fputs("an earlier file", f);
    fclose(f);
    snprintf(args, sizeof(args), "%s --frames 9 --dump-raw /nonexistent-dir/r.rgb -o %s", TV_SMALL, tv_path("keep.mp4"));
    EXPECT_EQ(1, tv_expect(1, "", args));
    {
        size_t n = 0;
        unsigned char *b = tv_read_file(tv_path("keep.mp4"), &n);
        EXPECT_TRUE(b != NULL && n == 15 && memcmp(b, "an earlier file", 15) == 0);
        free(b);
    }
    remove(tv_path("keep.mp4"));
}

/* When the output fails (here: the file size limit), the generator stops
   within a queue's length of windows instead of generating the whole video,
   and the run exits 1 with the output's reason. */
TEST(an_output_failure_stops_the_generator_early) {
    char args[512];
    snprintf(args, sizeof(args), "--width 128 --height 64 --frames 401 -o %s", tv_path("lim.y4m"));
    EXPECT_EQ(1, tv_expect(1, "trap '' XFSZ; ulimit -f 16; ", args));
    EXPECT_TRUE(tv_has("window 1/34"));
    EXPECT_FALSE(tv_has("window 10/34"));       /* the queue holds 2: it stops within a few windows */
    EXPECT_FALSE(tv_has("window 34/34"));
    EXPECT_TRUE(tv_has("write"));
    remove(tv_path("lim.y4m"));
}

TEST(usage_errors_exit_2_with_a_one_line_reason) {
    size_t n;
    EXPECT_EQ(2, tv_expect(2, "", "--width 100 -o /nonexistent-dir/usage.mp4"));
    n = strlen(tv_out);
    EXPECT_TRUE(n > 0 && strchr(tv_out, '\n') == tv_out + n - 1);
    EXPECT_TRUE(tv_has("--width"));
    EXPECT_EQ(2, tv_expect(2, "", "--mode sideways"));
    EXPECT_EQ(2, tv_expect(2, "", "--frames"));
    EXPECT_EQ(2, tv_expect(2, "", "--mode kv --overlap 1"));
    EXPECT_EQ(2, tv_expect(2, "", "--dtype f64"));
    EXPECT_EQ(2, tv_expect(2, "", "--backend cuda --dtype f32"));
    EXPECT_TRUE(tv_has("f16 or bf16"));
}

TEST(cuda_backend_without_cuda_exits_1_with_a_one_line_reason) {
    char why[1024], args[512];
    size_t n;
    if (tv_cuda_usable(why, sizeof(why))) SKIP("CUDA is usable here: cuda_backend_passes_the_self_check_on_the_gpu covers it");
    snprintf(args, sizeof(args), "--backend cuda -q -o %s", tv_path("cuda.mp4"));
    EXPECT_EQ(1, tv_expect(1, "", args));
    n = strlen(tv_out);
    EXPECT_TRUE(n > 0 && strchr(tv_out, '\n') == tv_out + n - 1);
    EXPECT_TRUE(tv_has("--backend cuda: CUDA is unavailable: "));
    /* the runtime's reason, not a generic one */
    EXPECT_TRUE(strstr(tv_out, why) != NULL);
    printf("  %s", tv_out);
    EXPECT_NE(0, access(tv_path("cuda.mp4"), F_OK));   /* nothing was written */
}

TEST(auto_backend_without_cuda_falls_back_to_the_cpu_and_says_so_once) {
    char why[1024], args[512];
    if (tv_cuda_usable(why, sizeof(why))) SKIP("CUDA is usable here: auto picks it");
    snprintf(args, sizeof(args), "--width 128 --height 64 --frames 41 --check --backend auto -o %s", tv_path("auto.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_EQ(1, tv_lines_with("demo: CUDA is unavailable ("));
    EXPECT_EQ(1, tv_lines_with("using the CPU backend"));
    EXPECT_TRUE(tv_has("check: ") && tv_has(": PASS"));
    EXPECT_TRUE(tv_has(" backend=cpu dtype=f32 "));
    remove(tv_path("auto.mp4"));
}

TEST(quiet_auto_fallback_prints_no_note) {
    char why[1024], args[512];
    if (tv_cuda_usable(why, sizeof(why))) SKIP("CUDA is usable here: auto picks it");
    snprintf(args, sizeof(args), "%s --frames 9 --backend auto -o %s", TV_SMALL, tv_path("autoq.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_FALSE(tv_has("CUDA"));
    EXPECT_TRUE(tv_has(" backend=cpu "));
    remove(tv_path("autoq.mp4"));
}

TEST(summary_names_the_cpu_backend_and_its_f32_cache) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 9 --backend cpu -o %s", TV_SMALL, tv_path("cpu.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has("demo: mode=kv backend=cpu dtype=f32 "));
    remove(tv_path("cpu.mp4"));
}

/* The GPU's cache type on the CPU: the same model through 16-bit K/V stays
   far above the 40 dB threshold (it is not exact: the PSNR is finite). */
TEST(sixteen_bit_caches_pass_the_self_check_on_the_cpu) {
    static const char *const types[2] = { "f16", "bf16" };
    char args[512], want[64];
    int i;
    for (i = 0; i < 2; i++) {
        double psnr;
        snprintf(args, sizeof(args), "%s --frames 41 --backend cpu --dtype %s --check -o %s", TV_SMALL, types[i],
                 tv_path("half.mp4"));
        ASSERT_EQ(0, tv_expect(0, "", args));
        snprintf(want, sizeof(want), " backend=cpu dtype=%s ", types[i]);
        EXPECT_TRUE(tv_has(want));
        psnr = tv_field("psnr_db");
        printf("  %s cache: %.2f dB\n", types[i], psnr);
        EXPECT_GE(psnr, 50.0);
        EXPECT_LT(psnr, 99.0);
    }
    remove(tv_path("half.mp4"));
}

/* kv mode (with offload: the reload goes through the device store's ops) and
   chained mode, on the device; the GPU check runs the same command lines.
   Y4M output: the emulated build has no FFmpeg. */
static void tv_cuda_modes(void) {
    char args[512];
    char h1[32] = "", h2[32] = "";
    const char *s;
    snprintf(args, sizeof(args), "%s --backend cuda --frames 41 --check -o %s", TV_SMALL, tv_path("gpu.y4m"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(" backend=cuda dtype=f16 ") && tv_has(": PASS"));
    if ((s = strstr(tv_out, "latent_hash=")) != NULL) sscanf(s + 12, "%31s", h1);
    snprintf(args, sizeof(args), "%s --backend cuda --frames 41 --offload --check -o %s", TV_SMALL, tv_path("gpu.y4m"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_GT(tv_field("offloads"), 0.0);
    if ((s = strstr(tv_out, "latent_hash=")) != NULL) sscanf(s + 12, "%31s", h2);
    ASSERT_TRUE(h1[0] != 0);
    EXPECT_STREQ(h1, h2);
    snprintf(args, sizeof(args), "%s --backend cuda --mode chained --window 4 --overlap 2 --frames 41 --check -o %s",
             TV_SMALL, tv_path("gpu.y4m"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(" backend=cuda ") && tv_has(": PASS"));
    remove(tv_path("gpu.y4m"));
}

TEST(cuda_backend_passes_the_self_check_on_the_gpu) {
    char why[1024];
    if (!tv_cuda_usable(why, sizeof(why))) SKIP("no usable CUDA here: %s", why);
    tv_cuda_modes();
}

TEST(cuda_backend_passes_the_self_check_on_the_emulated_device) {
    if (access(tv_emu(), X_OK) != 0)
        SKIP("%s not built (g++ -std=c++17 -O2 -DMSKV_DEMO_NO_FFMPEG demo/demo_emu.cpp -o build/demo-emu -ldl -lpthread -lm)",
             tv_emu());
    tv_bin = tv_emu();
    tv_cuda_modes();
    tv_bin = NULL;
}

TEST(a_scribbled_device_page_fails_the_self_check_on_the_emulated_device) {
    char args[512];
    if (access(tv_emu(), X_OK) != 0) SKIP("%s not built (see the test above)", tv_emu());
    tv_bin = tv_emu();
    snprintf(args, sizeof(args), "%s --backend cuda --frames 41 --check -o %s", TV_SMALL, tv_path("gbrk.y4m"));
    EXPECT_EQ(1, tv_expect(1, "MSKV_DEMO_BREAK=sink ", args));
    EXPECT_TRUE(tv_psnr_check_failed());
    tv_bin = NULL;
    remove(tv_path("gbrk.y4m"));
}

/* The GPU path of --cfg: both branches in one device plan, parked and
   reloaded through the device store as one lockstep group. */
TEST(cfg_guidance_passes_the_self_check_on_the_emulated_device) {
    char args[512];
    if (access(tv_emu(), X_OK) != 0) SKIP("%s not built (see the tests above)", tv_emu());
    tv_bin = tv_emu();
    snprintf(args, sizeof(args), "%s --backend cuda --frames 41 --cfg 3 --offload --check -o %s", TV_SMALL, tv_path("gcfg.y4m"));
    EXPECT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(" backend=cuda ") && tv_has(" cfg=3 branches=2") && tv_has(": PASS"));
    EXPECT_GT(tv_field("offloads"), 0.0);
    tv_bin = NULL;
    remove(tv_path("gcfg.y4m"));
}

TEST(help_exits_0_and_states_the_psnr_threshold) {
    EXPECT_EQ(0, tv_expect(0, "", "--help"));
    EXPECT_TRUE(tv_has("--check") && tv_has("40 dB"));
}

/* >>newcomer's path: usage, progress, interruption ---------------------------- */

/* the usage error's output is one line that names what was wrong */
static void tv_expect_usage_error(const char *args, const char *names) {
    size_t n;
    EXPECT_EQ(2, tv_expect(2, "", args));
    n = strlen(tv_out);
    EXPECT_TRUE(n > 0 && strchr(tv_out, '\n') == tv_out + n - 1);
    EXPECT_TRUE(tv_has(names));
}

TEST(a_negative_seed_is_a_usage_error) {
    tv_expect_usage_error("--seed -1 -o /nonexistent-dir/usage.mp4", "--seed");
    tv_expect_usage_error("--seed ' 1' -o /nonexistent-dir/usage.mp4", "--seed");
    tv_expect_usage_error("--seed 18446744073709551616 -o /nonexistent-dir/usage.mp4", "--seed");
}

/* A misspelt flag is unknown whatever follows it: the parser used to take
   the next argument (or its absence) as the value of any unknown --name and
   said "--bogus needs a value" */
TEST(an_unknown_option_is_reported_as_unknown_whatever_follows_it) {
    static const char *const cases[][2] = {
        { "--bogus", "unknown option '--bogus'" },
        { "--bogus x -o /nonexistent-dir/usage.mp4", "unknown option '--bogus'" },
        { "--chek", "unknown option '--chek'" },
        { "--chek --frames 9 -o /nonexistent-dir/usage.mp4", "unknown option '--chek'" },
        { "--bogus=3 -o /nonexistent-dir/usage.mp4", "unknown option '--bogus'" },
        { "--check=1 -o /nonexistent-dir/usage.mp4", "--check takes no value" },
        { "--frames", "--frames needs a value" } };
    size_t i;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tv_expect_usage_error(cases[i][0], cases[i][1]);
        if (tv_has("needs a value") && !strstr(cases[i][1], "needs a value"))
            mt_fail(__FILE__, __LINE__, "demo %s: %s", cases[i][0], tv_out);
    }
}

TEST(an_empty_output_name_is_a_usage_error) {
    tv_expect_usage_error("-o ''", "-o");
    tv_expect_usage_error("--output= --frames 9", "--output");
    tv_expect_usage_error("--dump-raw '' -o /nonexistent-dir/usage.mp4", "--dump-raw");
}

TEST(an_output_name_without_mp4_or_y4m_is_a_usage_error) {
    tv_expect_usage_error("-o /nonexistent-dir/out.avi", ".mp4 or .y4m");
    tv_expect_usage_error("-o /nonexistent-dir/out", ".mp4 or .y4m");
    tv_expect_usage_error("-o /dev/null", ".mp4 or .y4m");
}

/* --window 6 without --steps: the default follows the window (--window + 1),
   so the check passes instead of failing by design */
TEST(the_default_denoise_steps_follow_the_window) {
    char args[512];
    snprintf(args, sizeof(args), "%s --frames 41 --window 6 --check -o %s", TV_SMALL, tv_path("win6.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(" window=6 ") && tv_has(" steps=7") && tv_has(": PASS"));
    snprintf(args, sizeof(args), "%s --frames 41 --mode chained --window 5 --overlap 2 --check -o %s", TV_SMALL,
             tv_path("win6.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));
    EXPECT_TRUE(tv_has(" steps=6") && tv_has(": PASS"));
    remove(tv_path("win6.mp4"));
}

/* Every option demo.c's parser compares against is in --help (read from the
   source, so an option added later without its line fails here). */
TEST(every_option_the_demo_parses_is_in_its_help) {
    size_t size = 0;
    unsigned char *src = tv_read_file("demo/demo.c", &size);
    const char *s;
    char help[sizeof(tv_out)];
    int options = 0;
    if (!src) SKIP("demo/demo.c not found: run from the repository root");
    ASSERT_EQ(0, tv_expect(0, "", "--help"));
    memcpy(help, tv_out, sizeof(help));
    src[size] = 0;
    for (s = (const char *)src; (s = strstr(s, "strcmp(name, \"")) != NULL; s++) {
        char opt[40], want[48];
        size_t len = 0;
        s += 14;
        while (s[len] && s[len] != '"' && len + 1 < sizeof(opt)) { opt[len] = s[len]; len++; }
        opt[len] = 0;
        if (!strcmp(opt, "--output")) continue;   /* the long name of -o */
        snprintf(want, sizeof(want), "  %s ", opt);
        if (!strstr(help, want)) mt_fail(__FILE__, __LINE__, "demo.c parses %s, --help does not list it", opt);
        options++;
    }
    free(src);
    EXPECT_GE(options, 18);
    EXPECT_TRUE(strstr(help, "  --page-size ") && strstr(help, "  --dump-raw ") && strstr(help, "  --progress "));
}

/* page, sink, stale and serial each say once what they broke (stale used to be silent) */
TEST(every_deliberate_cache_break_prints_one_note) {
    static const char *const kinds[4] = { "page", "sink", "stale", "serial" };
    char args[512], env[64];
    int i;
    snprintf(args, sizeof(args), "%s --frames 41 -o %s", TV_SMALL, tv_path("note.mp4"));
    for (i = 0; i < 4; i++) {
        snprintf(env, sizeof(env), "MSKV_DEMO_BREAK=%s ", kinds[i]);
        EXPECT_EQ(0, tv_expect(0, env, args));   /* without --check a broken cache is not a failure */
        if (tv_lines_with("demo: MSKV_DEMO_BREAK: ") != 1)
            mt_fail(__FILE__, __LINE__, "MSKV_DEMO_BREAK=%s printed %d notes:\n%s", kinds[i],
                    tv_lines_with("demo: MSKV_DEMO_BREAK: "), tv_out);
    }
    remove(tv_path("note.mp4"));
}

/* After the first denoise step: one estimate of the whole run (instead of
   that step's line). Then a line per step (--progress 0), except a window's
   last step, whose window line follows at once. */
TEST(progress_gives_an_estimate_then_a_line_per_denoise_step) {
    char args[512];
    snprintf(args, sizeof(args), "--width 128 --height 64 --frames 21 --progress 0 -o %s", tv_path("prog.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));   /* 6 latents: 2 windows of 4 steps */
    EXPECT_EQ(1, tv_lines_with("demo: 2 windows x 4 denoise steps, each 96 tokens attending to up to 192; "));
    EXPECT_EQ(1, tv_lines_with("demo: estimate: the first denoise step took "));
    EXPECT_EQ(1, tv_lines_with("2 windows x 4 steps: about "));
    EXPECT_EQ(5, tv_lines_with(" left\n"));
    EXPECT_EQ(0, tv_lines_with("window 1/2  step 1/4  "));
    EXPECT_EQ(1, tv_lines_with("window 1/2  step 2/4  "));
    EXPECT_EQ(1, tv_lines_with("window 2/2  step 1/4  "));
    EXPECT_EQ(1, tv_lines_with("window 2/2  step 3/4  "));
    EXPECT_EQ(0, tv_lines_with("step 4/4"));
    EXPECT_EQ(2, tv_lines_with(" kv pages "));
    remove(tv_path("prog.mp4"));
}

/* The default --progress 1: step lines at most one a second, however fast
   the steps (the summary's seconds bound how many there may be). */
TEST(progress_lines_are_at_least_the_interval_apart) {
    char args[512];
    double secs;
    snprintf(args, sizeof(args), "--width 128 --height 64 --frames 121 -o %s", tv_path("prog.mp4"));
    ASSERT_EQ(0, tv_expect(0, "", args));   /* 31 latents: 11 windows x 4 steps */
    secs = tv_field("seconds");
    ASSERT_GE(secs, 0.0);
    EXPECT_LE((double)tv_lines_with(" left\n"), secs + 1.0);
    EXPECT_EQ(11, tv_lines_with(" kv pages "));
    remove(tv_path("prog.mp4"));
}

/* The demo with argv (NULL-terminated), its stdout and stderr into *fd. */
static pid_t tv_spawn(char *const argv[], int *fd) {
    int p[2];
    pid_t pid;
    if (pipe(p) != 0) return -1;
    pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    if (pid < 0) { close(p[0]); return -1; }
    *fd = p[0];
    return pid;
}

/* Appends what fd gives to tv_out until text appears (1) or the end (0). */
static int tv_read_until(int fd, size_t *n, const char *text) {
    for (;;) {
        ssize_t got;
        if (text && strstr(tv_out, text)) return 1;
        if (*n + 1 >= sizeof(tv_out)) *n = 0;   /* keep reading; the tail is what counts */
        got = read(fd, tv_out + *n, sizeof(tv_out) - 1 - *n);
        if (got <= 0) return 0;
        *n += (size_t)got;
        tv_out[*n] = 0;
    }
}

static double tv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs a long demo, sends sig once "wait_for" has been printed, and returns
   the wait status (-1 when it could not run); the output is in tv_out,
   the seconds from the signal to the exit in *after (optional). */
static int tv_interrupt(int sig, const char *size, const char *frames, const char *out, const char *raw,
                        const char *wait_for, int *saw, double *after) {
    double t_kill;
    char w[8], h[8];
    char *argv[16];
    int fd = -1, st = 0, a = 0;
    size_t n = 0;
    pid_t pid;
    if (access(tv_demo(), X_OK) != 0) return -1;
    if (sscanf(size, "%7[0-9]x%7[0-9]", w, h) != 2) return -1;
    argv[a++] = (char *)tv_demo();
    argv[a++] = (char *)"--width"; argv[a++] = w;
    argv[a++] = (char *)"--height"; argv[a++] = h;
    argv[a++] = (char *)"--frames"; argv[a++] = (char *)frames;
    argv[a++] = (char *)"-o"; argv[a++] = (char *)out;
    if (raw) { argv[a++] = (char *)"--dump-raw"; argv[a++] = (char *)raw; }
    argv[a] = NULL;
    tv_out[0] = 0;
    pid = tv_spawn(argv, &fd);
    if (pid < 0) return -1;
    *saw = tv_read_until(fd, &n, wait_for);
    t_kill = tv_now();
    kill(pid, sig);
    tv_read_until(fd, &n, NULL);
    close(fd);
    if (waitpid(pid, &st, 0) != pid) return -1;
    if (after) *after = tv_now() - t_kill;
    return st;
}

/* Ctrl-C or SIGTERM in the middle of a run: the demo stops at the next
   denoise step, finishes the .mp4 with the frames written so far (the
   encoder flushed, the index written), says how many, and dies of the
   signal. The file decodes to exactly those frames, the ones it produced. */
static void tv_signal_keeps_a_playable_file(int sig) {
    tv_video v;
    const char *s;
    long written = -1, of = -1;
    int saw = 0, st;
    /* window 4 is queued only once window 1 is decoded: some frames are done */
    st = tv_interrupt(sig, "128x64", "4001", tv_path("sig.mp4"), tv_path("sig.rgb"), "window 4/", &saw, NULL);
    ASSERT_TRUE(st != -1);
    EXPECT_TRUE(saw);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig);
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == sig)) printf("  status %d; it printed:\n%s\n", st, tv_out);
    s = strstr(tv_out, sig == SIGINT ? "demo: interrupted by SIGINT: wrote " : "demo: interrupted by SIGTERM: wrote ");
    ASSERT_TRUE(s != NULL);
    s = strstr(s, "libx264, ");
    ASSERT_TRUE(s != NULL && sscanf(s, "libx264, %ld of %ld frames", &written, &of) == 2);
    EXPECT_EQ(4001, of);
    EXPECT_GE(written, 9);       /* window 1's frames at least */
    EXPECT_LT(written, 4001);
    ASSERT_EQ(0, tv_decode(tv_path("sig.mp4"), tv_path("sig.rgb"), &v));
    EXPECT_EQ(written, v.frames);
    EXPECT_EQ(written, v.compared);
    EXPECT_GE(v.psnr_min, 30.0);
    printf("  %s after %ld frames: the .mp4 decodes to all %d, worst %.1f dB against the demo's own\n",
           sig == SIGINT ? "SIGINT" : "SIGTERM", written, v.frames, v.psnr_min);
    remove(tv_path("sig.mp4"));
    remove(tv_path("sig.rgb"));
}

TEST(ctrl_c_finishes_the_mp4_with_the_frames_written_so_far) { tv_signal_keeps_a_playable_file(SIGINT); }

TEST(sigterm_finishes_the_mp4_with_the_frames_written_so_far) { tv_signal_keeps_a_playable_file(SIGTERM); }

/* Stopped before a single frame was written: no file at all (an .mp4 with no
   frames would not play), and at once, not at the end of the denoise step
   in progress: at 3072x3072 the first step takes minutes on a 2-core CPU
   (over 10 s at 500 GFLOP/s), so waiting for it would show. */
TEST(a_signal_before_the_first_frame_removes_the_file_at_once) {
    int saw = 0, st;
    double after = -1.0;
    st = tv_interrupt(SIGTERM, "3072x3072", "81", tv_path("early.mp4"), NULL, "an estimate follows the first step",
                      &saw, &after);
    ASSERT_TRUE(st != -1);
    EXPECT_TRUE(saw);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    EXPECT_TRUE(tv_has("demo: interrupted by SIGTERM before a frame was written: removed "));
    EXPECT_NE(0, access(tv_path("early.mp4"), F_OK));
    EXPECT_LT(after, 5.0);
    printf("  gone %.2f s after the signal\n", after);
    if (!tv_has("removed")) printf("  it printed:\n%s\n", tv_out);
    remove(tv_path("early.mp4"));
}
