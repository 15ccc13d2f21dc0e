/* demo_video.h - the demo's video writer, included once by demo.c.

   .mp4 through libavcodec + libavformat (libx264 when the build has it,
   mpeg4 otherwise; yuv420p; +faststart so players can start before the file
   is complete), or a .y4m file when the demo is built with
   -DMSKV_DEMO_NO_FFMPEG or asked for a .y4m name. Frames come in as RGB24. */
#ifndef DEMO_VIDEO_H
#define DEMO_VIDEO_H

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef MSKV_DEMO_NO_FFMPEG
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
#endif

typedef struct demo_writer {
    int width, height, fps;
    int64_t frames;
    int y4m;
    FILE *fp;                    /* y4m */
    unsigned char *yuv;          /* y4m: one 4:2:0 frame */
#ifndef MSKV_DEMO_NO_FFMPEG
    AVFormatContext *fmt;
    AVCodecContext *enc;
    AVStream *st;
    AVFrame *frame;
    AVPacket *pkt;
    struct SwsContext *sws;
    int header_written;
#endif
    char codec[48];
    char err[256];
} demo_writer;

static int demo_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* >>y4m ---------------------------------------------------------------- */

static int demo_y4m_open(demo_writer *w, const char *path) {
    size_t luma = (size_t)w->width * w->height;
    w->yuv = (unsigned char *)malloc(luma + luma / 2);
    w->fp = fopen(path, "wb");
    if (!w->yuv || !w->fp) {
        (void)path;
        snprintf(w->err, sizeof(w->err), "cannot open for writing");
        return -1;
    }
    /* C420jpeg: full-range BT.601, chroma centred between the 2x2 luma samples */
    fprintf(w->fp, "YUV4MPEG2 W%d H%d F%d:1 Ip A1:1 C420jpeg\n", w->width, w->height, w->fps);
    snprintf(w->codec, sizeof(w->codec), "y4m/rawvideo");
    return 0;
}

static unsigned char demo_clamp8(double v) {
    return (unsigned char)(v < 0.0 ? 0 : v > 255.0 ? 255 : (int)(v + 0.5));
}

static int demo_y4m_frame(demo_writer *w, const unsigned char *rgb) {
    int W = w->width, H = w->height, x, y;
    unsigned char *Y = w->yuv, *U = Y + (size_t)W * H, *V = U + (size_t)(W / 2) * (H / 2);
    for (y = 0; y < H; y++)
        for (x = 0; x < W; x++) {
            const unsigned char *p = rgb + ((size_t)y * W + x) * 3u;
            Y[(size_t)y * W + x] = demo_clamp8(0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2]);
        }
    for (y = 0; y < H / 2; y++)
        for (x = 0; x < W / 2; x++) {
            double r = 0, g = 0, b = 0;
            int dy, dx;
            for (dy = 0; dy < 2; dy++)
                for (dx = 0; dx < 2; dx++) {
                    const unsigned char *p = rgb + ((size_t)(2 * y + dy) * W + (size_t)(2 * x + dx)) * 3u;
                    r += p[0]; g += p[1]; b += p[2];
                }
            r *= 0.25; g *= 0.25; b *= 0.25;
            U[(size_t)y * (W / 2) + x] = demo_clamp8(128.0 - 0.168736 * r - 0.331264 * g + 0.5 * b);
            V[(size_t)y * (W / 2) + x] = demo_clamp8(128.0 + 0.5 * r - 0.418688 * g - 0.081312 * b);
        }
    if (fputs("FRAME\n", w->fp) < 0 ||
        fwrite(w->yuv, 1, (size_t)W * H * 3u / 2u, w->fp) != (size_t)W * H * 3u / 2u) {
        snprintf(w->err, sizeof(w->err), "write failed");
        return -1;
    }
    return 0;
}

/* >>ffmpeg ------------------------------------------------------------- */
#ifndef MSKV_DEMO_NO_FFMPEG

static void demo_av_err(demo_writer *w, const char *what, int e) {
    char buf[AV_ERROR_MAX_STRING_SIZE];
    av_strerror(e, buf, sizeof(buf));
    snprintf(w->err, sizeof(w->err), "%s: %s", what, buf);
}

static int demo_ff_drain(demo_writer *w) {
    for (;;) {
        int e = avcodec_receive_packet(w->enc, w->pkt);
        if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return 0;
        if (e < 0) { demo_av_err(w, "encode", e); return -1; }
        /* the encoder leaves duration 0: without it the mp4 loses its last frame */
        if (w->pkt->duration <= 0) w->pkt->duration = 1;
        av_packet_rescale_ts(w->pkt, w->enc->time_base, w->st->time_base);
        w->pkt->stream_index = w->st->index;
        e = av_interleaved_write_frame(w->fmt, w->pkt);
        av_packet_unref(w->pkt);
        if (e < 0) { demo_av_err(w, "write", e); return -1; }
    }
}

static int demo_ff_open(demo_writer *w, const char *path) {
    const AVCodec *codec = avcodec_find_encoder_by_name("libx264");
    AVDictionary *opts = NULL;
    int e;
    av_log_set_level(AV_LOG_ERROR);
    if (!codec) codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
    if (!codec) { snprintf(w->err, sizeof(w->err), "no H.264 or MPEG-4 encoder in this FFmpeg"); return -1; }
    {   /* guess quietly (allocating with an unknown extension logs an error), else mp4 */
        const AVOutputFormat *of = av_guess_format(NULL, path, NULL);
        e = avformat_alloc_output_context2(&w->fmt, of, of ? NULL : "mp4", path);
    }
    if (e < 0 || !w->fmt) { demo_av_err(w, "output format", e); return -1; }
    w->st = avformat_new_stream(w->fmt, NULL);
    w->enc = avcodec_alloc_context3(codec);
    w->frame = av_frame_alloc();
    w->pkt = av_packet_alloc();
    if (!w->st || !w->enc || !w->frame || !w->pkt) { snprintf(w->err, sizeof(w->err), "out of memory"); return -1; }
    w->enc->width = w->width;
    w->enc->height = w->height;
    w->enc->pix_fmt = AV_PIX_FMT_YUV420P;
    w->enc->time_base.num = 1;
    w->enc->time_base.den = w->fps;
    w->enc->framerate.num = w->fps;
    w->enc->framerate.den = 1;
    w->enc->gop_size = 2 * w->fps;
    w->enc->thread_count = 1;      /* the model's threads own the cores */
    w->enc->color_range = AVCOL_RANGE_MPEG;
    w->enc->colorspace = AVCOL_SPC_SMPTE170M;
    w->enc->color_primaries = AVCOL_PRI_SMPTE170M;
    w->enc->color_trc = AVCOL_TRC_SMPTE170M;
    if (codec->id == AV_CODEC_ID_H264) {
        av_opt_set(w->enc->priv_data, "preset", "veryfast", 0);
        av_opt_set(w->enc->priv_data, "crf", "18", 0);
    } else {
        w->enc->flags |= AV_CODEC_FLAG_QSCALE;
        w->enc->global_quality = FF_QP2LAMBDA * 2;
    }
    if (w->fmt->oformat->flags & AVFMT_GLOBALHEADER) w->enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    if ((e = avcodec_open2(w->enc, codec, NULL)) < 0) { demo_av_err(w, "open encoder", e); return -1; }
    if ((e = avcodec_parameters_from_context(w->st->codecpar, w->enc)) < 0) { demo_av_err(w, "stream parameters", e); return -1; }
    w->st->time_base = w->enc->time_base;
    if (!(w->fmt->oformat->flags & AVFMT_NOFILE) &&
        (e = avio_open(&w->fmt->pb, path, AVIO_FLAG_WRITE)) < 0) {
        demo_av_err(w, "cannot open for writing", e);
        return -1;
    }
    av_dict_set(&opts, "movflags", "+faststart", 0);
    e = avformat_write_header(w->fmt, &opts);
    av_dict_free(&opts);
    if (e < 0) { demo_av_err(w, "write header", e); return -1; }
    w->header_written = 1;
    w->frame->format = AV_PIX_FMT_YUV420P;
    w->frame->width = w->width;
    w->frame->height = w->height;
    if ((e = av_frame_get_buffer(w->frame, 0)) < 0) { demo_av_err(w, "frame buffer", e); return -1; }
    w->sws = sws_getContext(w->width, w->height, AV_PIX_FMT_RGB24, w->width, w->height,
                            AV_PIX_FMT_YUV420P, SWS_BICUBIC, NULL, NULL, NULL);
    if (!w->sws) { snprintf(w->err, sizeof(w->err), "no RGB to YUV converter"); return -1; }
    snprintf(w->codec, sizeof(w->codec), "%s/%s", codec->id == AV_CODEC_ID_H264 ? "h264" : "mpeg4", codec->name);
    return 0;
}

static int demo_ff_frame(demo_writer *w, const unsigned char *rgb) {
    const uint8_t *src[1];
    int stride[1], e;
    src[0] = rgb;
    stride[0] = 3 * w->width;
    if ((e = av_frame_make_writable(w->frame)) < 0) { demo_av_err(w, "frame", e); return -1; }
    sws_scale(w->sws, src, stride, 0, w->height, w->frame->data, w->frame->linesize);
    w->frame->pts = w->frames;
    if ((e = avcodec_send_frame(w->enc, w->frame)) < 0) { demo_av_err(w, "encode", e); return -1; }
    return demo_ff_drain(w);
}

static int demo_ff_close(demo_writer *w, int ok) {
    int rc = 0, e;
    if (ok && w->enc && w->header_written) {
        if ((e = avcodec_send_frame(w->enc, NULL)) < 0) { demo_av_err(w, "flush", e); rc = -1; }
        if (rc == 0 && demo_ff_drain(w) != 0) rc = -1;
        /* the trailer writes the moov atom (and moves it to the front) */
        if (rc == 0 && (e = av_write_trailer(w->fmt)) < 0) { demo_av_err(w, "write trailer", e); rc = -1; }
    }
    if (w->fmt && !(w->fmt->oformat->flags & AVFMT_NOFILE) && w->fmt->pb) avio_closep(&w->fmt->pb);
    sws_freeContext(w->sws);
    av_packet_free(&w->pkt);
    av_frame_free(&w->frame);
    avcodec_free_context(&w->enc);
    avformat_free_context(w->fmt);
    w->fmt = NULL;
    w->sws = NULL;
    return rc;
}
#endif

/* >>writer ------------------------------------------------------------- */

/* Opens path for width x height RGB frames at fps. Returns 0, or -1 with w->err set. */
static int demo_writer_open(demo_writer *w, const char *path, int width, int height, int fps) {
    memset(w, 0, sizeof(*w));
    w->width = width;
    w->height = height;
    w->fps = fps;
#ifdef MSKV_DEMO_NO_FFMPEG
    w->y4m = 1;
    return demo_y4m_open(w, path);
#else
    w->y4m = demo_ends_with(path, ".y4m");
    return w->y4m ? demo_y4m_open(w, path) : demo_ff_open(w, path);
#endif
}

static int demo_writer_frame(demo_writer *w, const unsigned char *rgb) {
    int rc;
#ifdef MSKV_DEMO_NO_FFMPEG
    rc = demo_y4m_frame(w, rgb);
#else
    rc = w->y4m ? demo_y4m_frame(w, rgb) : demo_ff_frame(w, rgb);
#endif
    if (rc == 0) w->frames++;
    return rc;
}

/* ok = 0 abandons the file (no trailer). Returns 0, or -1 with w->err set. */
static int demo_writer_close(demo_writer *w, int ok) {
    int rc = 0;
    if (w->y4m) {
        if (w->fp && fclose(w->fp) != 0 && ok) {
            snprintf(w->err, sizeof(w->err), "write failed");
            rc = -1;
        }
        w->fp = NULL;
    }
#ifndef MSKV_DEMO_NO_FFMPEG
    else
        rc = demo_ff_close(w, ok);
#endif
    free(w->yuv);
    w->yuv = NULL;
    return rc;
}

#endif /* DEMO_VIDEO_H */
