/* The test program: the harness, both headers' implementations, and main().
   Every tests/test_*.c file is compiled beside it (as C, or as C++). */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L   /* setenv, dirent */
#endif
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"

/* The GPU layer builds every message through MSKV_CUDA_VSNPRINTF: counted
   here, so a test can tell that the per-call launch path formats nothing. */
#include <stdarg.h>
#ifdef __cplusplus
extern "C" {
#endif
long mtu_format_count(void);
static long mtu_formats;
static int mtu_vsnprintf(char *buf, size_t cap, const char *fmt, va_list ap) {
    mtu_formats++;
    return vsnprintf(buf, cap, fmt, ap);
}
long mtu_format_count(void) { return mtu_formats; }
#ifdef __cplusplus
}
#endif
#define MSKV_CUDA_VSNPRINTF mtu_vsnprintf
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"
#define MSTAR_KV_UCX_IMPLEMENTATION
#include "../mstar_kv_ucx.h"
#include "mskv_test_util.h"
#ifndef _WIN32
#include <dirent.h>
#endif

/* For blob tests: sign a hand-edited blob the way export does (the checksum
   is private to the implementation, which lives in this file). */
#ifdef __cplusplus
extern "C" {
#endif
uint64_t mtu_blob_checksum(const void *p, size_t n) { return mskv__blob_checksum((const unsigned char *)p, n); }
uint64_t mtu_blob_legacy_checksum(const void *p, size_t n) { return mskv__legacy_checksum(p, n); }
/* x / P the way the host core divides by its page size (no divide below 2^31) */
int64_t mtu_page_div(int32_t P, int64_t x) {
    uint32_t magic;
    int32_t shift;
    mskv__pdiv_init(P, &magic, &shift);
    return mskv__pdiv_by(magic, shift, P, x);
}

/* ---- the platform, for tests that start threads or touch files ----------------
   Threads, locks and the once flag are the library's own wrappers (so these
   tests exercise them too); the rest is what only the tests need. */

struct mtu_thread { mskv__thread t; };
mtu_thread *mtu_thread_start(void (*fn)(void *), void *arg) {
    mtu_thread *t = (mtu_thread *)malloc(sizeof *t);
    if (t && !mskv__thread_start(&t->t, fn, arg)) { free(t); t = NULL; }
    return t;
}
void mtu_thread_join(mtu_thread *t) {
    mskv__thread_join(&t->t);
    free(t);
}

struct mtu_mutex { mskv__mutex m; };
mtu_mutex *mtu_mutex_new(void) {
    mtu_mutex *m = (mtu_mutex *)malloc(sizeof *m);
    if (m && !mskv__mutex_init(&m->m)) { free(m); m = NULL; }
    return m;
}
void mtu_mutex_lock(mtu_mutex *m) { mskv__mutex_lock(&m->m); }
void mtu_mutex_unlock(mtu_mutex *m) { mskv__mutex_unlock(&m->m); }
void mtu_mutex_free(mtu_mutex *m) { mskv__mutex_destroy(&m->m); free(m); }

/* n threads wait until all n have arrived; reusable round after round */
struct mtu_barrier { mskv__mutex m; mskv__cond c; int n, waiting; unsigned long round; };
mtu_barrier *mtu_barrier_new(int n) {
    mtu_barrier *b = (mtu_barrier *)calloc(1, sizeof *b);
    if (!b) return NULL;
    if (!mskv__mutex_init(&b->m)) { free(b); return NULL; }
    if (!mskv__cond_init(&b->c)) { mskv__mutex_destroy(&b->m); free(b); return NULL; }
    b->n = n;
    return b;
}
void mtu_barrier_wait(mtu_barrier *b) {
    unsigned long round;
    mskv__mutex_lock(&b->m);
    round = b->round;
    if (++b->waiting == b->n) {
        b->waiting = 0;
        b->round++;
        mskv__cond_broadcast(&b->c);
    } else {
        while (b->round == round) mskv__cond_wait(&b->c, &b->m);
    }
    mskv__mutex_unlock(&b->m);
}
void mtu_barrier_free(mtu_barrier *b) {
    mskv__cond_destroy(&b->c);
    mskv__mutex_destroy(&b->m);
    free(b);
}

static mskv__once_flag mtu_once_flag = MSKV__ONCE_INIT;
void mtu_once(void (*fn)(void)) { mskv__once(&mtu_once_flag, fn); }

unsigned long mtu_pid(void) { return mskv__cuda_pid(); }
int mtu_nvrtc_candidates(char (*paths)[512], int max) { return mskv__cuda_nvrtc_candidates(paths, max); }

int mtu_setenv(const char *name, const char *value) {
#ifdef _WIN32
    return SetEnvironmentVariableA(name, value) ? 0 : -1;   /* the library reads the process environment */
#else
    return value ? setenv(name, value, 1) : unsetenv(name);
#endif
}

/* Calls fn(path of each entry, user) for the entries of dir; -1 when it cannot be read. */
static int mtu_each_entry(const char *dir, void (*fn)(const char *name, const char *path, void *user), void *user) {
    char path[1024];
#ifdef _WIN32
    WIN32_FIND_DATAA fd;
    HANDLE h;
    snprintf(path, sizeof path, "%s\\*", dir);
    h = FindFirstFileA(path, &fd);
    if (h == INVALID_HANDLE_VALUE) return -1;
    do {
        if (strcmp(fd.cFileName, ".") == 0 || strcmp(fd.cFileName, "..") == 0) continue;
        snprintf(path, sizeof path, "%s\\%s", dir, fd.cFileName);
        fn(fd.cFileName, path, user);
    } while (FindNextFileA(h, &fd));
    FindClose(h);
#else
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fn(e->d_name, path, user);
    }
    closedir(d);
#endif
    return 0;
}

int mtu_rm_dir(const char *dir);
/* a file or link goes at once; a folder (remove refuses it while it has
   entries) goes with everything below it */
static void mtu_remove_entry(const char *name, const char *path, void *user) {
    (void)name;
    if (remove(path) != 0 && mtu_rm_dir(path) != 0) ++*(int *)user;
}
int mtu_rm_dir(const char *dir) {
    int failed = 0;
    if (mtu_each_entry(dir, mtu_remove_entry, &failed) != 0) return -1;
#ifdef _WIN32
    if (!RemoveDirectoryA(dir)) failed++;
#else
    if (rmdir(dir) != 0) failed++;
#endif
    return failed ? -1 : 0;
}

typedef struct mtu_count_ctx { const char *sub; int n; } mtu_count_ctx;
static void mtu_count_entry(const char *name, const char *path, void *user) {
    mtu_count_ctx *c = (mtu_count_ctx *)user;
    (void)path;
    if (strstr(name, c->sub)) c->n++;
}
int mtu_dir_count(const char *dir, const char *substring) {
    mtu_count_ctx c;
    c.sub = substring;
    c.n = 0;
    return mtu_each_entry(dir, mtu_count_entry, &c) != 0 ? -1 : c.n;
}
#ifdef __cplusplus
}
#endif
