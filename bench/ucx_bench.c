/* Request migration throughput over UCX (mstar_kv_ucx.h) against a plain
   memcpy of the same bytes, in the same run: a forked receiver on
   127.0.0.1, UCX_TLS=tcp and then shared memory. The migration time runs
   from mskv_ucx_send's start to the receiver's acknowledgement (offer,
   pages straight from the pools into the receiver's, the receiver's
   checksum over them, acknowledgement); the sender keeps its copy
   (MSKV_UCX_KEEP) so every round moves the same request.
   After each transport's migration rounds it runs UCX's own ucx_perftest
   (Debian's ucx-utils; skipped, saying so, when it is not on PATH) on the
   same UCX_TLS and message size, tag_bw with -e (endpoints with error
   handling, as the layer's), and prints its bandwidth and the ratio.
   Usage: ucx_bench [tokens [message_bytes]]   (default 16384 tokens: 384 MiB
   of K/V; message_bytes: mskv_ucx_desc.message_bytes, default 1 MiB) */
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
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <signal.h>
#include <time.h>

#define UB_ROUNDS 3

static double ub_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* Wan-like geometry: 4 layers here (the bytes per token scale with layers), 12 KV heads of 128, bf16. */
static mskv_arena *ub_arena(int64_t tokens) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.page_size = 16;
    d.num_pages = (int32_t)(tokens / 16 + 8);
    d.num_layers = 4;
    d.kv_heads = 12;
    d.head_dim = 128;
    d.dtype = MSKV_DTYPE_BF16;
    return mskv_arena_create(&d, &a) == MSKV_SUCCESS ? a : NULL;
}

static int ub_receiver(int64_t tokens, int port_fd) {
    mskv_arena *a = ub_arena(tokens);
    mskv_ucx *u = NULL;
    mskv_request r;
    uint16_t port = 0;
    int i, bad = 0;
    if (!a || mskv_ucx_listen(NULL, "127.0.0.1", 0, &u) != MSKV_SUCCESS || mskv_ucx_port(u, &port) != MSKV_SUCCESS) port = 0;
    if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port || port == 0) return 1;
    if (mskv_ucx_accept(u) != MSKV_SUCCESS) return 1;
    for (i = 0; i < UB_ROUNDS; i++) {
        if (mskv_ucx_recv(u, a, &r) != MSKV_SUCCESS) { bad = 1; break; }
        mskv_request_remove(a, r);
    }
    mskv_ucx_destroy(u);
    mskv_arena_destroy(a);
    return bad;
}

static size_t ub_message_bytes;

/* ucx_perftest tag_bw on tls, messages of msg bytes, bytes in all: its
   overall bandwidth in GB/s (it prints MB/s of 2^20 bytes), or 0 and why. */
static double ub_perftest(const char *tls, size_t msg, size_t bytes, char *why, size_t cap) {
    char cmd[512], line[512];
    FILE *f;
    pid_t srv;
    double mbs = 0;
    int port = 20000 + (int)(getpid() % 20000), iters = (int)(bytes / (msg ? msg : 1));
    if (iters < 512) iters = 512;   /* past its start-up: fewer give a figure far below its steady state */
    if (system("command -v ucx_perftest >/dev/null 2>&1") != 0) {
        snprintf(why, cap, "ucx_perftest not found (Debian: apt-get install ucx-utils)");
        return 0;
    }
    fflush(stdout);
    srv = fork();
    if (srv == 0) {
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        setenv("UCX_TLS", tls, 1);
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        execlp("ucx_perftest", "ucx_perftest", "-p", ps, (char *)NULL);
        _exit(127);
    }
    {
        struct timespec nap;   /* the server's listener up */
        nap.tv_sec = 0;
        nap.tv_nsec = 300 * 1000 * 1000L;
        nanosleep(&nap, NULL);
    }
    snprintf(cmd, sizeof cmd, "UCX_TLS=%s ucx_perftest 127.0.0.1 -p %d -t tag_bw -e -s %zu -n %d 2>&1", tls, port, msg, iters);
    f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f)) {
        double it, p50, avg, ovh, bw_avg, bw_all;
        if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &ovh, &bw_avg, &bw_all) == 6) mbs = bw_all;
    }
    if (f) pclose(f);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (mbs <= 0) snprintf(why, cap, "ucx_perftest printed no Final line");
    return mbs * 1048576.0 * 1e-9;
}

static int ub_run(const char *tls, int64_t tokens) {
    int fds[2], status = 0, i;
    pid_t pid;
    uint16_t port = 0;
    mskv_arena *a;
    mskv_ucx *u = NULL;
    mskv_request r;
    mskv_segment seg;
    mskv_store_info si;
    size_t bytes = 0;
    double best = 1e30, best_copy = 1e30;
    unsigned char *src, *dst;
    mskv_result e = MSKV_SUCCESS;
    setenv("UCX_TLS", tls, 1);
    if (pipe(fds) != 0) return 1;
    fflush(stdout);
    pid = fork();
    if (pid == 0) _exit(ub_receiver(tokens, fds[1]));
    if (read(fds[0], &port, sizeof port) != (ssize_t)sizeof port || port == 0) { printf("UCX_TLS=%s: the receiver did not start\n", tls); return 1; }
    a = ub_arena(tokens);
    if (!a || mskv_request_add(a, &r) != MSKV_SUCCESS) return 1;
    seg.request = r;
    seg.n_tokens = tokens;
    if (mskv_admit(a, &seg, 1) != MSKV_SUCCESS || mskv_commit(a, &seg, 1) != MSKV_SUCCESS) return 1;
    mskv_store_info_get(a, &si);
    for (i = 0; i < 2 * si.num_layers; i++) memset(mskv_store_pool(a, i / 2, i % 2), 0x3C + i, si.pool_bytes);
    mskv_request_export(a, r, NULL, 0, &bytes);
    {
        mskv_ucx_desc d;
        memset(&d, 0, sizeof d);
        d.message_bytes = ub_message_bytes;
        e = mskv_ucx_connect(&d, "127.0.0.1", port, &u);
    }
    for (i = 0; e == MSKV_SUCCESS && i < UB_ROUNDS; i++) {
        double t0 = ub_now(), t;
        e = mskv_ucx_send(u, a, r, MSKV_UCX_KEEP);
        t = ub_now() - t0;
        if (t < best) best = t;
    }
    mskv_ucx_destroy(u);
    waitpid(pid, &status, 0);
    close(fds[0]);
    close(fds[1]);
    if (e != MSKV_SUCCESS) { printf("UCX_TLS=%s: %s\n", tls, mskv_result_string(e)); mskv_arena_destroy(a); return 1; }
    /* the same bytes, copied once by memcpy between two warm buffers */
    src = (unsigned char *)malloc(bytes);
    dst = (unsigned char *)malloc(bytes);
    if (!src || !dst) return 1;
    memset(src, 0x5A, bytes);
    memset(dst, 0, bytes);
    for (i = 0; i < UB_ROUNDS; i++) {
        double t0 = ub_now(), t;
        memcpy(dst, src, bytes);
        t = ub_now() - t0;
        if (t < best_copy) best_copy = t;
    }
    printf("UCX_TLS=%-8s %lld tokens, %.1f MiB blob: migration %.2f GB/s (%.1f ms), memcpy %.2f GB/s (%.1f ms): %.0f%% of memcpy%s\n", tls,
           (long long)tokens, bytes / 1048576.0, bytes / best * 1e-9, best * 1e3, bytes / best_copy * 1e-9, best_copy * 1e3,
           100.0 * best_copy / best, dst[bytes / 2] == 0x5A ? "" : " (copy check failed)");
    {
        char why[200] = "";
        size_t msg = ub_message_bytes ? ub_message_bytes : (size_t)1 << 20;
        double pt = ub_perftest(tls, msg, bytes, why, sizeof why);
        if (pt > 0)
            printf("UCX_TLS=%-8s ucx_perftest tag_bw -e, %zu-byte messages: %.2f GB/s; migration / perftest = %.2f\n", tls, msg, pt,
                   bytes / best * 1e-9 / pt);
        else
            printf("UCX_TLS=%-8s ucx_perftest: skipped: %s\n", tls, why);
    }
    free(src);
    free(dst);
    mskv_arena_destroy(a);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    char why[512];
    int64_t tokens = argc > 1 ? atoll(argv[1]) : 16384;
    int bad = 0;
    ub_message_bytes = argc > 2 ? (size_t)atoll(argv[2]) : 0;
    if (mskv_ucx_probe(NULL, why, sizeof why) != MSKV_SUCCESS) {
        printf("ucx_bench: skipped: %s\n", why);
        return 0;
    }
    printf("ucx_bench: %s, best of %d rounds each; 4 layers x 12 KV heads x 128 x bf16, page 16\n", why, UB_ROUNDS);
    bad |= ub_run("tcp", tokens);
    bad |= ub_run("shm,tcp", tokens);
    return bad;
}
