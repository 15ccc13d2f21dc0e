/* The test program: the harness, both headers' implementations, and main().
   Every tests/test_*.c file is compiled beside it (as C, or as C++). */
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

/* For blob tests: sign a hand-edited blob the way export does (the checksum
   is private to the implementation, which lives in this file). */
#ifdef __cplusplus
extern "C" {
#endif
uint64_t mtu_blob_checksum(const void *p, size_t n);
uint64_t mtu_blob_checksum(const void *p, size_t n) { return mskv__checksum(p, n); }
#ifdef __cplusplus
}
#endif
