/* Request migration over UCX (mstar_kv_ucx.h) against UCX's own
   ucx_perftest and a plain memcpy of the same bytes, in the same run.

   For each transport (UCX_TLS=tcp, then shared memory) a forked receiver
   on 127.0.0.1 takes requests until the sender hangs up. Each of the
   rounds runs, one after the other (alternating, so a busy machine slows
   every contender alike): one migration of the large request (the time of
   mskv_ucx_send from its start to the receiver's acknowledgement: offer,
   pages straight from the pools into the receiver's, per-message hashes,
   PREPARED, COMMIT, ACK; the sender keeps its copy with MSKV_UCX_KEEP so
   every round moves the same request), ucx_perftest on the same UCX_TLS
   and message size (tag_bw; over TCP with -e, endpoints with error
   handling as the layer's; for shared memory tag_bw and ucp_put_bw, which
   UCX 1.13 runs only without -e), and a memcpy of the same bytes. It
   prints the best and median of each and the ratios. Then latency: 1-token
   and 1-page requests, median of their send + receive times, against
   ucx_perftest tag_lat (its median one-way latency) of the same bytes.

   ucx_perftest is Debian's ucx-utils; without it those rows say why they
   are skipped. Also printed: the machine, the build, XXH64 and memcpy
   speed on 256 MiB, and the sender's gather entries per message (computed
   from the request's ranges, for the page order of protocol 3 with 1 MiB
   messages and the pool runs of protocol 4).

   Usage: ucx_bench [--quick] [tokens [message_bytes]]   (default 16384
   tokens: 384 MiB of K/V; message_bytes: mskv_ucx_desc.message_bytes,
   default 4 MiB; --quick: 1024 tokens, 1 round, no perftest) */
#if !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_UCX_IMPLEMENTATION
#include "../mstar_kv_ucx.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <signal.h>
#include <time.h>
#include <fcntl.h>
#include <spawn.h>

extern char **environ;

#ifndef UB_OPT
#if defined(__OPTIMIZE__) && defined(NDEBUG)
#define UB_OPT "optimized, NDEBUG"
#elif defined(__OPTIMIZE__)
#define UB_OPT "optimized (the Makefile's -O2), asserts on"
#else
#define UB_OPT "not optimized"
#endif
#endif
#define UB_MAX_ROUNDS 3
#define UB_LAT_ROUNDS 15

static int ub_rounds = UB_MAX_ROUNDS, ub_quick;
static size_t ub_message_bytes;   /* 0: the library's default */

static double ub_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int ub_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* best (smallest) and median of n values, in place */
static double ub_best(double *v, int n) { qsort(v, (size_t)n, sizeof *v, ub_cmp); return v[0]; }
static double ub_median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, ub_cmp); return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); }

/* Wan-like geometry: 4 layers here (the bytes per token scale with layers), 12 KV heads of 128, bf16. */
static mskv_arena *ub_arena(int64_t tokens) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.page_size = 16;
    d.num_pages = (int32_t)(tokens / 16 + 64);
    d.num_layers = 4;
    d.kv_heads = 12;
    d.head_dim = 128;
    d.dtype = MSKV_DTYPE_BF16;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

static mskv_ucx_desc ub_desc(void) {
    mskv_ucx_desc d;
    memset(&d, 0, sizeof d);
    d.message_bytes = ub_message_bytes;
    d.timeout_ms = 120000;   /* the receiver idles while ucx_perftest runs */
    return d;
}

/* The receiver: takes requests until the sender hangs up (PEER), removing each. */
static int ub_receiver(int64_t tokens, int port_fd) {
    mskv_arena *a = ub_arena(tokens);
    mskv_ucx_desc d = ub_desc();
    mskv_ucx *u = NULL;
    mskv_request r;
    mskv_result e;
    uint16_t port = 0;
    if (!a || mskv_ucx_listen(&d, "127.0.0.1", 0, &u) != MSKV_SUCCESS || mskv_ucx_port(u, &port) != MSKV_SUCCESS) port = 0;
    if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port || port == 0) return 1;
    if (mskv_ucx_accept(u) != MSKV_SUCCESS) return 1;
    while ((e = mskv_ucx_recv(u, a, &r)) == MSKV_SUCCESS) mskv_request_remove(a, r);
    mskv_ucx_destroy(u);
    mskv_arena_destroy(a);
    return e == MSKV_ERROR_PEER ? 0 : 1;
}

/* A request of n tokens, each pool filled with its own byte. */
static mskv_result ub_request(mskv_arena *a, int64_t n, mskv_request *r) {
    mskv_segment seg;
    mskv_result e = mskv_request_add(a, r);
    seg.request = *r;
    seg.n_tokens = n;
    if (e == MSKV_SUCCESS) e = mskv_admit(a, &seg, 1);
    if (e == MSKV_SUCCESS) e = mskv_commit(a, &seg, 1);
    return e;
}

/* The sender's gather entries per message, from the request's ranges:
   pool_runs 0 in range order (protocol 3), 1 pool by pool (protocol 4). */
static double ub_iov_per_message(mskv_arena *a, mskv_request r, size_t message_bytes, int pool_runs) {
    unsigned char hdr[MSKV_BLOB_HEADER_MAX];
    mskv_blob_layout lay;
    mskv_store_info si;
    mskv_blob_range *rg;
    int64_t per, j, pools, entries, messages, pieces = 0;
    const unsigned char *end = NULL;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS || si.num_layers < 1) return 0;
    if (mskv_request_export_begin(a, r, hdr, sizeof hdr, &lay) != MSKV_SUCCESS) return 0;
    rg = (mskv_blob_range *)malloc(sizeof *rg * (size_t)(lay.range_count ? lay.range_count : 1));
    if (!rg || mskv_request_blob_ranges(a, r, 0, lay.range_count, rg) != MSKV_SUCCESS) {
        free(rg);
        mskv_request_export_end(a, r);
        return 0;
    }
    per = (int64_t)(message_bytes / lay.range_bytes);
    if (per < 1) per = 1;
    if (per > 1024) per = 1024;
    pools = 2 * (int64_t)si.num_layers;
    entries = lay.range_count / pools;
    messages = (lay.range_count + per - 1) / per;
    for (j = 0; j < lay.range_count; j++) {
        int64_t k = pool_runs ? (j % entries) * pools + j / entries : j;
        const unsigned char *p = (const unsigned char *)rg[k].data;
        if (j % per == 0 || p != end) pieces++;
        end = p + rg[k].bytes;
    }
    free(rg);
    mskv_request_export_end(a, r);
    return (double)pieces / (double)messages;
}

/* ucx_perftest (test, with -e or not) on tls with msg-byte messages, iters of them:
   its Final line's bandwidth in GB/s (bw 1) or median latency in us (bw 0); 0 and why. */
static double ub_perftest(const char *tls, const char *test, int errmode, size_t msg, int iters, int bw, char *why, size_t cap) {
    char cmd[512], line[512];
    FILE *f;
    pid_t srv;
    double got = 0;
    static int next_port;
    int port = 20000 + (int)(getpid() % 20000) + next_port++;
    if (system("command -v ucx_perftest >/dev/null 2>&1") != 0) {
        snprintf(why, cap, "ucx_perftest not found (Debian: apt-get install ucx-utils)");
        return 0;
    }
    fflush(stdout);
    {
        /* spawned, not forked: a fork would mark this process's pages copy-on-write,
           and the memcpy timed next would pay a fault per page */
        char ps[16], *args[4], *old = getenv("UCX_TLS"), saved[64];
        posix_spawn_file_actions_t fa;
        snprintf(saved, sizeof saved, "%s", old ? old : "");
        snprintf(ps, sizeof ps, "%d", port);
        args[0] = (char *)"ucx_perftest";
        args[1] = (char *)"-p";
        args[2] = ps;
        args[3] = NULL;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        setenv("UCX_TLS", tls, 1);
        if (posix_spawnp(&srv, "ucx_perftest", &fa, NULL, args, environ) != 0) srv = -1;
        setenv("UCX_TLS", saved, 1);
        posix_spawn_file_actions_destroy(&fa);
        if (srv < 0) {
            snprintf(why, cap, "ucx_perftest could not be started");
            return 0;
        }
    }
    {
        struct timespec nap;   /* the server's listener up */
        nap.tv_sec = 0;
        nap.tv_nsec = 300 * 1000 * 1000L;
        nanosleep(&nap, NULL);
    }
    snprintf(cmd, sizeof cmd, "UCX_TLS=%s timeout 60 ucx_perftest 127.0.0.1 -p %d -t %s %s -s %zu -n %d -w %d 2>&1", tls, port, test,
             errmode ? "-e" : "", msg, iters, iters / 10 + 1);
    f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f)) {
        double it, p50, avg, all, bw_avg, bw_all;
        if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &all, &bw_avg, &bw_all) == 6)
            got = bw ? bw_all * 1048576.0 * 1e-9 : p50;   /* it prints MB/s of 2^20 bytes; latency in us */
    }
    if (f) pclose(f);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (got <= 0) snprintf(why, cap, "ucx_perftest -t %s printed no Final line (UCX_TLS=%s%s)", test, tls, errmode ? ", -e" : "");
    return got;
}

typedef struct ub_row { const char *name; double v[UB_MAX_ROUNDS]; int n; char why[200]; } ub_row;

static void ub_print(const char *tls, const ub_row *row, double lib_median) {
    double v[UB_MAX_ROUNDS], best, med;
    memcpy(v, row->v, sizeof v);
    if (row->n == 0) { printf("  %-8s %-34s skipped: %s\n", tls, row->name, row->why); return; }
    best = v[0];
    { int i; for (i = 1; i < row->n; i++) if (v[i] > best) best = v[i]; }
    med = ub_median(v, row->n);
    if (lib_median > 0)
        printf("  %-8s %-34s best %6.2f GB/s  median %6.2f GB/s   migration / this (medians) = %.2f\n", tls, row->name, best, med, lib_median / med);
    else
        printf("  %-8s %-34s best %6.2f GB/s  median %6.2f GB/s\n", tls, row->name, best, med);
}

static int ub_run(const char *tls, const char *perf_tls, int shm, int64_t tokens) {
    int fds[2], status = 0, i;
    char lanes[256] = "not known (no transfer)";
    mskv_result le;
    pid_t pid;
    uint16_t port = 0;
    mskv_arena *a;
    mskv_ucx *u = NULL;
    mskv_request big, one_token, one_page;
    mskv_store_info si;
    mskv_ucx_desc d = ub_desc();
    size_t bytes = 0, small_bytes = 0, msg = ub_message_bytes ? ub_message_bytes : (size_t)4 << 20;
    unsigned char *src, *dst;
    ub_row lib = { "migration (mstar_kv)", { 0 }, 0, "" }, copy = { "memcpy of the same bytes", { 0 }, 0, "" };
    ub_row tag = { NULL, { 0 }, 0, "" }, put = { NULL, { 0 }, 0, "" };
    char tag_name[64], put_name[64];
    double lat[2][UB_LAT_ROUNDS], perf_lat = 0, lib_med;
    char lat_why[200] = "";
    mskv_result e = MSKV_SUCCESS;
    int iters;
    snprintf(tag_name, sizeof tag_name, "ucx_perftest tag_bw%s %zu B", shm ? "" : " -e", msg);
    snprintf(put_name, sizeof put_name, "ucx_perftest ucp_put_bw %zu B", msg);
    tag.name = tag_name;
    put.name = put_name;
    setenv("UCX_TLS", tls, 1);
    if (pipe(fds) != 0) return 1;
    fflush(stdout);
    pid = fork();
    if (pid == 0) _exit(ub_receiver(tokens + 64, fds[1]));
    if (read(fds[0], &port, sizeof port) != (ssize_t)sizeof port || port == 0) { printf("UCX_TLS=%s: the receiver did not start\n", tls); return 1; }
    a = ub_arena(tokens + 64);
    if (!a || ub_request(a, tokens, &big) != MSKV_SUCCESS || ub_request(a, 1, &one_token) != MSKV_SUCCESS ||
        ub_request(a, 16, &one_page) != MSKV_SUCCESS)
        return 1;
    mskv_store_info_get(a, &si);
    for (i = 0; i < 2 * si.num_layers; i++) memset(mskv_store_pool(a, i / 2, i % 2), 0x3C + i, si.pool_bytes);
    mskv_request_export(a, big, NULL, 0, &bytes);
    mskv_request_export(a, one_page, NULL, 0, &small_bytes);
    e = mskv_ucx_connect(&d, "127.0.0.1", port, &u);
    src = (unsigned char *)malloc(bytes);
    dst = (unsigned char *)malloc(bytes);
    if (!src || !dst) return 1;
    memset(src, 0x5A, bytes);
    memset(dst, 1, bytes);   /* not 0: malloc + memset 0 may become calloc, leaving the pages untouched */
    iters = (int)(bytes / msg);
    if (iters < 256) iters = 256;   /* past its start-up: fewer give a figure far below its steady state */
    for (i = 0; e == MSKV_SUCCESS && i < ub_rounds; i++) {
        double t0 = ub_now(), t;
        e = mskv_ucx_send(u, a, big, MSKV_UCX_KEEP);
        t = ub_now() - t0;
        if (e != MSKV_SUCCESS) break;
        lib.v[lib.n++] = bytes / t * 1e-9;
        if (!ub_quick) {
            double g = ub_perftest(perf_tls, "tag_bw", !shm, msg, iters, 1, tag.why, sizeof tag.why);
            if (g > 0) tag.v[tag.n++] = g;
            if (shm) {
                g = ub_perftest(perf_tls, "ucp_put_bw", 0, msg, iters, 1, put.why, sizeof put.why);
                if (g > 0) put.v[put.n++] = g;
            }
        }
        t0 = ub_now();
        memcpy(dst, src, bytes);
        t = ub_now() - t0;
        copy.v[copy.n++] = bytes / t * 1e-9;
    }
    /* what UCX really used, once the pages went (the data endpoint is made at the first page) */
    if (e == MSKV_SUCCESS && (le = mskv_ucx_lanes(u, lanes, sizeof lanes)) != MSKV_SUCCESS)
        snprintf(lanes, sizeof lanes, "not known (%s)", mskv_result_string(le));
    if (ub_quick) {
        snprintf(tag.why, sizeof tag.why, "--quick");
        snprintf(put.why, sizeof put.why, "--quick");
    }
    /* latency: the small requests, alternating */
    for (i = 0; e == MSKV_SUCCESS && i < UB_LAT_ROUNDS; i++) {
        double t0 = ub_now();
        e = mskv_ucx_send(u, a, one_token, MSKV_UCX_KEEP);
        lat[0][i] = ub_now() - t0;
        t0 = ub_now();
        if (e == MSKV_SUCCESS) e = mskv_ucx_send(u, a, one_page, MSKV_UCX_KEEP);
        lat[1][i] = ub_now() - t0;
    }
    mskv_ucx_destroy(u);
    waitpid(pid, &status, 0);
    close(fds[0]);
    close(fds[1]);
    if (e != MSKV_SUCCESS) {
        printf("  %-8s migration failed: %s\n", tls, mskv_result_string(e));
        mskv_arena_destroy(a);
        return 1;
    }
    if (!ub_quick) perf_lat = ub_perftest(perf_tls, "tag_lat", !shm, small_bytes, 2000, 0, lat_why, sizeof lat_why);
    printf("  %-8s %lld tokens, %.1f MiB blob, %zu-byte messages, %d rounds (UCX_TLS=%s for the library, %s for ucx_perftest)\n", tls,
           (long long)tokens, bytes / 1048576.0, msg, lib.n, tls, perf_tls);
    printf("  %-8s lanes the library used (mskv_ucx_lanes): %s\n", tls, lanes);
    {
        double v[UB_MAX_ROUNDS];
        memcpy(v, lib.v, sizeof v);
        lib_med = ub_median(v, lib.n);
    }
    ub_print(tls, &lib, 0);
    ub_print(tls, &tag, lib_med);
    if (shm) ub_print(tls, &put, lib_med);
    ub_print(tls, &copy, lib_med);
    {
        double m0 = ub_median(lat[0], UB_LAT_ROUNDS) * 1e6, m1 = ub_median(lat[1], UB_LAT_ROUNDS) * 1e6;
        double b0 = ub_best(lat[0], UB_LAT_ROUNDS) * 1e6, b1 = ub_best(lat[1], UB_LAT_ROUNDS) * 1e6;
        printf("  %-8s latency, send to ACK (median / best of %d): 1-token request %.0f / %.0f us, 1-page request (%.0f KiB) %.0f / %.0f us\n", tls,
               UB_LAT_ROUNDS, m0, b0, small_bytes / 1024.0, m1, b1);
        if (perf_lat > 0)
            printf("  %-8s ucx_perftest tag_lat%s %zu B: median %.0f us one way; 1-page request / tag_lat = %.1f\n", tls, shm ? "" : " -e",
                   small_bytes, perf_lat, m1 / perf_lat);
        else
            printf("  %-8s ucx_perftest tag_lat: skipped: %s\n", tls, ub_quick ? "--quick" : lat_why);
    }
    free(src);
    free(dst);
    mskv_arena_destroy(a);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

/* The machine: the CPU's model name and the cores online. */
static void ub_machine(void) {
    char line[256], model[256] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && c) {
            snprintf(model, sizeof model, "%s", c + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    }
    if (f) fclose(f);
    printf("machine: %s, %ld cores online\n", model, sysconf(_SC_NPROCESSORS_ONLN));
#if defined(__clang__)
    printf("build: clang %s, %s\n", __clang_version__, UB_OPT);
#elif defined(__GNUC__)
    printf("build: gcc %s, %s\n", __VERSION__, UB_OPT);
#else
    printf("build: %s\n", UB_OPT);
#endif
}

/* XXH64 (the per-message hash) and memcpy over 256 MiB, best of 3, in the same run. */
static void ub_hash_speed(void) {
    size_t n = (size_t)256 << 20;
    unsigned char *a = (unsigned char *)malloc(n), *b = (unsigned char *)malloc(n);
    double bx = 1e30, bm = 1e30;
    uint64_t h = 0;
    int i;
    if (!a || !b) { free(a); free(b); return; }
    memset(a, 0xA5, n);
    memset(b, 1, n);
    for (i = 0; i < 3; i++) {
        double t0 = ub_now(), t;
        h ^= mskv_xxh64(a, n, 0);
        t = ub_now() - t0;
        if (t < bx) bx = t;
        t0 = ub_now();
        memcpy(b, a, n);
        t = ub_now() - t0;
        if (t < bm) bm = t;
    }
    printf("xxh64 GB/s %.2f, memcpy GB/s %.2f (256 MiB, best of 3; digest %016llx)\n", n / bx * 1e-9, n / bm * 1e-9, (unsigned long long)h);
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    char why[512];
    int64_t tokens = 16384;
    int bad = 0, argi = 1;
    if (argc > 1 && strcmp(argv[1], "--quick") == 0) {
        ub_quick = 1;
        ub_rounds = 1;
        tokens = 1024;
        argi = 2;
    }
    if (argc > argi) {
        char *end = NULL, *end2 = NULL;
        long long t = strtoll(argv[argi], &end, 10), m = 0;
        if (argc > argi + 1) m = strtoll(argv[argi + 1], &end2, 10);
        if (t < 1 || t > 1000000 || m < 0 || *end || (end2 && *end2) || argc > argi + 2) {
            fprintf(stderr, "usage: %s [--quick] [TOKENS (1 to 1000000; default 16384) [MESSAGE_BYTES (0: 4 MiB)]]\n", argv[0]);
            return 2;
        }
        tokens = t;
        ub_message_bytes = (size_t)m;
    }
    ub_machine();
    if (mskv_ucx_probe(NULL, why, sizeof why) != MSKV_SUCCESS) {
        printf("ucx_bench: skipped: %s\n", why);
        return 0;
    }
    printf("ucx_bench: %s; 4 layers x 12 KV heads x 128 x bf16, page 16\n", why);
    ub_hash_speed();
    {
        mskv_arena *a = ub_arena(tokens);
        mskv_request r;
        if (a && ub_request(a, tokens, &r) == MSKV_SUCCESS)
            printf("sender's gather entries per message, %lld tokens: page order with 1 MiB messages (protocol 3) %.1f, "
                   "pool runs with %zu-byte messages (protocol 4) %.1f\n",
                   (long long)tokens, ub_iov_per_message(a, r, (size_t)1 << 20, 0), ub_message_bytes ? ub_message_bytes : (size_t)4 << 20,
                   ub_iov_per_message(a, r, ub_message_bytes ? ub_message_bytes : (size_t)4 << 20, 1));
        mskv_arena_destroy(a);
    }
    bad |= ub_run("tcp", "tcp", 0, tokens);
    bad |= ub_run("shm,tcp", "shm", 1, tokens);
    return bad;
}
