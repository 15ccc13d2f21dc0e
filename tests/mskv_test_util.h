/* Small helpers shared by the host-core test files (one test program, many files). */
#ifndef MSKV_TEST_UTIL_H
#define MSKV_TEST_UTIL_H
#include "mskv_test.h"
#include "../mstar_kv.h"

/* xorshift64: the next state of *s (never 0 when it starts non-zero), returned */
static inline uint64_t mtu_xorshift(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* admit + commit n tokens for one request */
static inline mskv_result mtu_grow(mskv_arena *a, mskv_request r, int64_t n) {
    mskv_segment s;
    mskv_result e;
    s.request = r;
    s.n_tokens = n;
    e = mskv_admit(a, &s, 1);
    if (e != MSKV_SUCCESS) return e;
    return mskv_commit(a, &s, 1);
}

/* the arena's audit; a failure fails the running test with the broken invariant */
static inline int mtu_audit_at(mskv_arena *a, const char *file, int line) {
    char why[256];
    why[0] = '\0';
    if (mskv_arena_audit(a, why, sizeof why) != MSKV_SUCCESS) {
        mt_fail(file, line, "audit failed: %s", why);
        return 0;
    }
    return 1;
}
#define mtu_audit(a) mtu_audit_at((a), __FILE__, __LINE__)

/* the blob checksum (tests/main.c): re-sign a blob after editing its header */
#ifdef __cplusplus
extern "C" {
#endif
uint64_t mtu_blob_checksum(const void *p, size_t n);          /* as the blob's version says: XXH64 from 4 */
uint64_t mtu_blob_legacy_checksum(const void *p, size_t n);   /* versions 1 to 3's digest */
int64_t mtu_page_div(int32_t page_size, int64_t x);   /* the host core's x / page_size (tests/main.c) */
/* The platform, for tests that start threads or touch files the same way on
   POSIX and Windows (tests/main.c: threads, locks and the once flag are the
   library's own wrappers). */
typedef struct mtu_thread mtu_thread;
mtu_thread *mtu_thread_start(void (*fn)(void *), void *arg);   /* NULL when it cannot start */
void mtu_thread_join(mtu_thread *t);
typedef struct mtu_mutex mtu_mutex;
mtu_mutex *mtu_mutex_new(void);
void mtu_mutex_lock(mtu_mutex *m);
void mtu_mutex_unlock(mtu_mutex *m);
void mtu_mutex_free(mtu_mutex *m);
typedef struct mtu_barrier mtu_barrier;                         /* n threads meet, round after round */
mtu_barrier *mtu_barrier_new(int n);
void mtu_barrier_wait(mtu_barrier *b);
void mtu_barrier_free(mtu_barrier *b);
void mtu_once(void (*fn)(void));                                /* one once flag for the program */
unsigned long mtu_pid(void);
int mtu_nvrtc_candidates(char (*paths)[512], int max);      /* the GPU layer's NVRTC names after the caller's */
int mtu_setenv(const char *name, const char *value);           /* value NULL: unset; 0 on success */
int mtu_rm_dir(const char *dir);                                /* a directory and its files; 0 on success */
int mtu_dir_count(const char *dir, const char *substring);     /* entries whose name contains it; -1 unreadable */
#ifdef __cplusplus
}
#endif
static inline void mtu_put64(unsigned char *p, uint64_t v) { int i; for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static inline void mtu_put32(unsigned char *p, uint32_t v) { int i; for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static inline void mtu_blob_sign(unsigned char *b, size_t n) { mtu_put64(b + n - 8, mtu_blob_checksum(b, n - 8)); }

#endif
