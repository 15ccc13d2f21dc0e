/* demo_scene.h - the demo's synthetic world, included once by demo.c.

   Everything here is analytic and needs no library: the scene that defines
   the ground-truth latents, the token layout (patchify), the positional
   features the model's queries and keys are made of, and the causal
   "VAE decoder" that turns latents into RGB frames.

   Scene: a smooth 16-channel texture on the latent torus (periodic in both
   directions, so nothing enters from outside). Horizontal bands of token rows
   slide sideways, each at its own whole-token velocity per latent frame, so
   frame t is an exact rearrangement of frame 0: a model that fetches the right
   tokens reproduces it exactly, and one that reads a wrong or stale cache
   entry visibly does not. */
#ifndef DEMO_SCENE_H
#define DEMO_SCENE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEMO_C 16          /* latent channels */
#define DEMO_P 2           /* patch side, latent pixels per token side */
#define DEMO_UP 8          /* decoder: pixels per latent pixel side */
#define DEMO_TR 4          /* decoder: pixel frames per latent frame (after the first) */
#define DEMO_WAVES 3       /* plane waves per channel */
#define DEMO_PI 3.14159265358979323846

typedef struct demo_geom {
    int width, height;     /* pixels */
    int lw, lh;            /* latent grid */
    int gw, gh;            /* token grid */
    int tpf;               /* tokens per latent frame */
    int dim;               /* head_dim = DEMO_C * DEMO_P * DEMO_P */
    size_t lat_floats;     /* floats in one latent frame */
    size_t rgb_bytes;      /* bytes in one RGB24 pixel frame */
} demo_geom;

/* width and height must be multiples of DEMO_UP * DEMO_P (checked by the CLI) */
static void demo_geom_init(demo_geom *g, int width, int height) {
    g->width = width;
    g->height = height;
    g->lw = width / DEMO_UP;
    g->lh = height / DEMO_UP;
    g->gw = g->lw / DEMO_P;
    g->gh = g->lh / DEMO_P;
    g->tpf = g->gw * g->gh;
    g->dim = DEMO_C * DEMO_P * DEMO_P;
    g->lat_floats = (size_t)g->lw * (size_t)g->lh * DEMO_C;
    g->rgb_bytes = (size_t)width * (size_t)height * 3u;
}

/* T latent frames decode to 1 + 4(T - 1) pixel frames; the inverse rounds up. */
static int64_t demo_latents_for_frames(int64_t frames) {
    return frames <= 1 ? 1 : 1 + (frames - 1 + DEMO_TR - 1) / DEMO_TR;
}

/* >>rng ---------------------------------------------------------------- */

static uint64_t demo_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double demo_unit(uint64_t *state) { /* [0, 1) */
    *state += 0x9E3779B97F4A7C15ull;
    return (double)(demo_mix64(*state) >> 11) * (1.0 / 9007199254740992.0);
}

static float demo_gauss(uint64_t *state) {
    double u1 = demo_unit(state), u2 = demo_unit(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * DEMO_PI * u2));
}

static uint64_t demo_fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001B3ull; }
    return h;
}
#define DEMO_FNV_INIT 0xCBF29CE484222325ull

/* >>scene -------------------------------------------------------------- */

typedef struct demo_scene {
    demo_geom g;
    float *tex0;           /* [lh][lw][C]: the latent frame at t = 0 (the prompt image) */
    int *band_v;           /* [gh] sideways velocity of each token row, tokens per latent frame */
    float mix[3][DEMO_C];  /* decoder colour matrix */
    float bias[3];
} demo_scene;

static void demo_scene_free(demo_scene *s) {
    free(s->tex0);
    free(s->band_v);
    s->tex0 = NULL;
    s->band_v = NULL;
}

static int demo_scene_init(demo_scene *s, const demo_geom *g, uint64_t seed) {
    static const int velocities[3] = { 1, -2, 3 };
    uint64_t rng = demo_mix64(seed ^ 0x5CE4Eull);
    float kx[DEMO_C][DEMO_WAVES], ky[DEMO_C][DEMO_WAVES], ph[DEMO_C][DEMO_WAVES], am[DEMO_C][DEMO_WAVES];
    int c, i, x, y, bands;
    memset(s, 0, sizeof(*s));
    s->g = *g;
    s->tex0 = (float *)malloc(g->lat_floats * sizeof(float));
    s->band_v = (int *)malloc((size_t)g->gh * sizeof(int));
    if (!s->tex0 || !s->band_v) { demo_scene_free(s); return -1; }
    bands = g->gh < 3 ? g->gh : 3;
    for (y = 0; y < g->gh; y++) s->band_v[y] = velocities[(y * bands) / g->gh];
    /* low spatial frequencies only (whole periods on the torus): a smooth texture */
    for (c = 0; c < DEMO_C; c++) {
        for (i = 0; i < DEMO_WAVES; i++) {
            int fx, fy;
            do {
                fx = (int)(demo_unit(&rng) * 7.0) - 3;   /* -3..3 periods across */
                fy = (int)(demo_unit(&rng) * 5.0) - 2;   /* -2..2 periods down */
            } while (fx == 0 && fy == 0);
            kx[c][i] = (float)(2.0 * DEMO_PI * fx / g->lw);
            ky[c][i] = (float)(2.0 * DEMO_PI * fy / g->lh);
            ph[c][i] = (float)(2.0 * DEMO_PI * demo_unit(&rng));
            am[c][i] = (float)(0.3 + 0.3 * demo_unit(&rng));
        }
    }
    for (y = 0; y < g->lh; y++)
        for (x = 0; x < g->lw; x++)
            for (c = 0; c < DEMO_C; c++) {
                double v = 0.0;
                for (i = 0; i < DEMO_WAVES; i++)
                    v += am[c][i] * cos(kx[c][i] * x + ky[c][i] * y + ph[c][i]);
                s->tex0[((size_t)y * g->lw + x) * DEMO_C + c] = (float)v;
            }
    /* colour: three dominant channels, the others add a little detail */
    for (i = 0; i < 3; i++) {
        for (c = 0; c < DEMO_C; c++)
            s->mix[i][c] = (float)((c == i ? 0.34 : 0.0) + 0.04 * (demo_unit(&rng) - 0.5));
        s->bias[i] = 0.5f;
    }
    return 0;
}

/* The true latent frame t: every band of token rows shifted sideways by
   velocity * t whole tokens (wrapping around the torus). */
static void demo_scene_truth(const demo_scene *s, int64_t t, float *out) {
    const demo_geom *g = &s->g;
    int y;
    for (y = 0; y < g->lh; y++) {
        int64_t shift = ((int64_t)s->band_v[y / DEMO_P] * DEMO_P * t) % g->lw;
        int x;
        if (shift < 0) shift += g->lw;
        for (x = 0; x < g->lw; x++) {
            int sx = (int)(((int64_t)x - shift + g->lw) % g->lw);
            memcpy(out + ((size_t)y * g->lw + x) * DEMO_C,
                   s->tex0 + ((size_t)y * g->lw + sx) * DEMO_C, DEMO_C * sizeof(float));
        }
    }
}

/* >>tokens ------------------------------------------------------------- */

/* Token (row r, col c) of a latent frame is its DEMO_P x DEMO_P patch, laid
   out [dy][dx][channel]: head_dim = C x patch area. */
static void demo_patchify(const demo_geom *g, const float *lat, float *tok) {
    int r, c, dy, dx;
    for (r = 0; r < g->gh; r++)
        for (c = 0; c < g->gw; c++) {
            float *t = tok + ((size_t)r * g->gw + c) * (size_t)g->dim;
            for (dy = 0; dy < DEMO_P; dy++)
                for (dx = 0; dx < DEMO_P; dx++)
                    memcpy(t + (dy * DEMO_P + dx) * DEMO_C,
                           lat + ((size_t)(r * DEMO_P + dy) * g->lw + (size_t)(c * DEMO_P + dx)) * DEMO_C,
                           DEMO_C * sizeof(float));
        }
}

static void demo_unpatchify(const demo_geom *g, const float *tok, float *lat) {
    int r, c, dy, dx;
    for (r = 0; r < g->gh; r++)
        for (c = 0; c < g->gw; c++) {
            const float *t = tok + ((size_t)r * g->gw + c) * (size_t)g->dim;
            for (dy = 0; dy < DEMO_P; dy++)
                for (dx = 0; dx < DEMO_P; dx++)
                    memcpy(lat + ((size_t)(r * DEMO_P + dy) * g->lw + (size_t)(c * DEMO_P + dx)) * DEMO_C,
                           t + (dy * DEMO_P + dx) * DEMO_C, DEMO_C * sizeof(float));
        }
}

/* >>features ------------------------------------------------------------
   Queries and keys are (cos, sin) pairs of positions, so q.k is a sum of
   cos(w * difference) over frame, row and column: the largest score is the
   exact position match. Frames use the frequencies pi / 2^m, so any nonzero
   frame difference below 2^M turns one pair to cos(pi) = -1 (a gap of at
   least 2). Rows and columns use whole harmonics of the torus, so wrapped
   positions match; their worst gap is measured. The attention scale is set
   from the smallest gap so a wrong key weighs at most e^-36 of the right one. */
#define DEMO_MAX_PAIRS 64

typedef struct demo_feat {
    int dim, nf, nr, nc;
    double wf[DEMO_MAX_PAIRS], wr[DEMO_MAX_PAIRS], wc[DEMO_MAX_PAIRS];
    double gap;            /* smallest score difference between the right key and any other */
    float scale;           /* attention scale */
} demo_feat;

static double demo_axis_gap(int n, int pairs, const double *w) {
    double best = 1e30;
    int d, k;
    if (n <= 1) return 1e30;   /* one position: nothing to tell apart */
    for (d = 1; d < n; d++) {
        double gap = 0.0;
        for (k = 0; k < pairs; k++) gap += 1.0 - cos(w[k] * d);
        if (gap < best) best = gap;
    }
    return best;
}

/* 0 on success, -1 when head_dim has too few pairs for this grid and length */
static int demo_feat_init(demo_feat *f, const demo_geom *g, int64_t max_frames) {
    int pairs = g->dim / 2, rem, k;
    double gr, gc;
    memset(f, 0, sizeof(*f));
    f->dim = g->dim;
    if (pairs > DEMO_MAX_PAIRS) pairs = DEMO_MAX_PAIRS;
    /* frame differences run from -1 (a query of frame 0 targets frame -1) to max_frames */
    while (f->nf < 62 && ((int64_t)1 << f->nf) <= max_frames + 1) f->nf++;
    rem = pairs - f->nf;
    if (rem < (g->gh > 1) + (g->gw > 1)) return -1;
    f->nr = g->gh / 2 < rem / 2 ? g->gh / 2 : rem / 2;
    if (g->gh > 1 && f->nr < 1) f->nr = 1;
    f->nc = g->gw / 2 < rem - f->nr ? g->gw / 2 : rem - f->nr;
    if (g->gw > 1 && f->nc < 1) f->nc = 1;
    if (f->nr < g->gh / 2 && f->nr + f->nc < rem) /* leftovers back to the rows */
        f->nr = g->gh / 2 < rem - f->nc ? g->gh / 2 : rem - f->nc;
    if (f->nf + f->nr + f->nc > pairs) return -1;
    for (k = 0; k < f->nf; k++) f->wf[k] = DEMO_PI / (double)((int64_t)1 << k);
    for (k = 0; k < f->nr; k++) f->wr[k] = 2.0 * DEMO_PI * (k + 1) / g->gh;
    for (k = 0; k < f->nc; k++) f->wc[k] = 2.0 * DEMO_PI * (k + 1) / g->gw;
    gr = demo_axis_gap(g->gh, f->nr, f->wr);
    gc = demo_axis_gap(g->gw, f->nc, f->wc);
    f->gap = 2.0;
    if (gr < f->gap) f->gap = gr;
    if (gc < f->gap) f->gap = gc;
    if (f->gap < 1e-3) return -1;
    f->scale = (float)(36.0 / f->gap);
    return 0;
}

static void demo_feat_encode(const demo_feat *f, int64_t frame, int row, int col, float *out) {
    int k, o = 0;
    for (k = 0; k < f->nf; k++) {
        /* frame mod 2^(k+1) keeps the argument small: the period of pi/2^k */
        double a = f->wf[k] * (double)(frame % ((int64_t)2 << k));
        out[o++] = (float)cos(a);
        out[o++] = (float)sin(a);
    }
    for (k = 0; k < f->nr; k++) {
        out[o++] = (float)cos(f->wr[k] * row);
        out[o++] = (float)sin(f->wr[k] * row);
    }
    for (k = 0; k < f->nc; k++) {
        out[o++] = (float)cos(f->wc[k] * col);
        out[o++] = (float)sin(f->wc[k] * col);
    }
    while (o < f->dim) out[o++] = 0.0f;
}

/* >>decoder -------------------------------------------------------------
   A causal "VAE decoder": the first latent frame of a stream gives one pixel
   frame; every later latent frame gives DEMO_TR frames, each a blend of it
   and the frame before (temporal ratio 4), upsampled DEMO_UP times with
   bilinear taps on the torus. A window's frames therefore need one latent
   frame of left context, which is decoded again and trimmed. */
typedef struct demo_decoder {
    const demo_scene *s;
    int *x0, *x1, *y0, *y1;
    float *fx, *fy;
} demo_decoder;

static void demo_decoder_free(demo_decoder *d) {
    free(d->x0); free(d->x1); free(d->y0); free(d->y1); free(d->fx); free(d->fy);
    memset(d, 0, sizeof(*d));
}

static void demo_taps(int out_n, int in_n, int *i0, int *i1, float *f) {
    int i;
    for (i = 0; i < out_n; i++) {
        double u = (i + 0.5) / DEMO_UP - 0.5, fl = floor(u);
        int a = (int)fl;
        f[i] = (float)(u - fl);
        i0[i] = ((a % in_n) + in_n) % in_n;
        i1[i] = (i0[i] + 1) % in_n;
    }
}

static int demo_decoder_init(demo_decoder *d, const demo_scene *s) {
    const demo_geom *g = &s->g;
    memset(d, 0, sizeof(*d));
    d->s = s;
    d->x0 = (int *)malloc((size_t)g->width * sizeof(int));
    d->x1 = (int *)malloc((size_t)g->width * sizeof(int));
    d->fx = (float *)malloc((size_t)g->width * sizeof(float));
    d->y0 = (int *)malloc((size_t)g->height * sizeof(int));
    d->y1 = (int *)malloc((size_t)g->height * sizeof(int));
    d->fy = (float *)malloc((size_t)g->height * sizeof(float));
    if (!d->x0 || !d->x1 || !d->fx || !d->y0 || !d->y1 || !d->fy) { demo_decoder_free(d); return -1; }
    demo_taps(g->width, g->lw, d->x0, d->x1, d->fx);
    demo_taps(g->height, g->lh, d->y0, d->y1, d->fy);
    return 0;
}

/* latent frame -> 3 colour planes at latent resolution, [lh][lw][3] */
static void demo_colour(const demo_scene *s, const float *lat, float *c3) {
    size_t n = (size_t)s->g.lw * s->g.lh, p;
    int i, c;
    for (p = 0; p < n; p++)
        for (i = 0; i < 3; i++) {
            float v = s->bias[i];
            for (c = 0; c < DEMO_C; c++) v += s->mix[i][c] * lat[p * DEMO_C + c];
            c3[p * 3 + i] = v;
        }
}

static unsigned char demo_tone(float v) {
    if (!(v > 0.0f)) return 0;      /* also NaN */
    if (v >= 1.0f) return 255;
    return (unsigned char)(v * 255.0f + 0.5f);
}

/* One pixel frame from colour planes a and b: (1 - wb) a + wb b, upsampled. */
static void demo_render(const demo_decoder *d, const float *a, const float *b, float wb,
                        float *tmp /* lh*lw*3 */, unsigned char *rgb) {
    const demo_geom *g = &d->s->g;
    size_t n = (size_t)g->lw * g->lh * 3u, i;
    int X, Y;
    for (i = 0; i < n; i++) tmp[i] = (1.0f - wb) * a[i] + wb * b[i];
    for (Y = 0; Y < g->height; Y++) {
        const float *r0 = tmp + (size_t)d->y0[Y] * g->lw * 3u;
        const float *r1 = tmp + (size_t)d->y1[Y] * g->lw * 3u;
        float fy = d->fy[Y];
        unsigned char *o = rgb + (size_t)Y * g->width * 3u;
        for (X = 0; X < g->width; X++) {
            int x0 = d->x0[X] * 3, x1 = d->x1[X] * 3, k;
            float fx = d->fx[X];
            for (k = 0; k < 3; k++) {
                float top = (1.0f - fx) * r0[x0 + k] + fx * r0[x1 + k];
                float bot = (1.0f - fx) * r1[x0 + k] + fx * r1[x1 + k];
                o[X * 3 + k] = demo_tone((1.0f - fy) * top + fy * bot);
            }
        }
    }
}

/* Called with each pixel frame a decode produces; a nonzero return stops it. */
typedef int (*demo_emit_fn)(void *user, int64_t pixel_index, const unsigned char *rgb);

/* Decodes latent frames lat[0..n) (absolute indices first..first+n) as one
   causal stream, drops the outputs of the first `trim` latents (context) and
   any pixel frame at or past max_frames, and passes the rest to emit with
   their absolute pixel index. The stream's first output (a causal start)
   only has an absolute index when first == 0; elsewhere it must be trimmed.
   c3 is scratch for n colour planes, tmp and rgb for one frame. */
static int demo_decode(const demo_decoder *d, const float *lat, int64_t first, int64_t n, int64_t trim,
                       int64_t max_frames, float *c3, float *tmp, unsigned char *rgb,
                       demo_emit_fn emit, void *user) {
    const demo_geom *g = &d->s->g;
    size_t plane = (size_t)g->lw * g->lh * 3u;
    int64_t i;
    int j, rc;
    if (n < 1 || trim < 0 || trim > n || (first > 0 && trim < 1)) return -1;
    for (i = 0; i < n; i++) demo_colour(d->s, lat + (size_t)i * g->lat_floats, c3 + (size_t)i * plane);
    if (trim == 0 && max_frames > 0) {
        demo_render(d, c3, c3, 0.0f, tmp, rgb);
        if ((rc = emit(user, 0, rgb)) != 0) return rc;
    }
    for (i = (trim > 1 ? trim : 1); i < n; i++) {
        int64_t u = first + i;
        for (j = 1; j <= DEMO_TR; j++) {
            int64_t p = DEMO_TR * (u - 1) + j;
            if (p >= max_frames) return 0;
            demo_render(d, c3 + (size_t)(i - 1) * plane, c3 + (size_t)i * plane,
                        (float)j / (float)DEMO_TR, tmp, rgb);
            if ((rc = emit(user, p, rgb)) != 0) return rc;
        }
    }
    return 0;
}

#endif /* DEMO_SCENE_H */
