/* A stand-in libnvrtc for the loader tests (tests/test_cuda.c puts it where
   PyPI's wheels put theirs): every function the loader resolves; it
   "compiles" to PTX text that names it and its version, so a test can tell
   which library a fresh process loaded. Built by make as
   build/fake-nvrtc/libnvrtc.so (NVRTC 12.34) and, with FAKE_NVRTC_MAJOR=13
   and FAKE_NVRTC_MINOR=0, build/fake-nvrtc13/libnvrtc.so (13.0). */
#include <stddef.h>
#include <string.h>

#ifndef FAKE_NVRTC_MAJOR
#define FAKE_NVRTC_MAJOR 12
#define FAKE_NVRTC_MINOR 34
#endif
#define FAKE_STR2(x) #x
#define FAKE_STR(x) FAKE_STR2(x)
#define FAKE_TEXT "// fake libnvrtc of the mstar_kv loader tests\n// version " FAKE_STR(FAKE_NVRTC_MAJOR) "." \
    FAKE_STR(FAKE_NVRTC_MINOR) "\n"

static int fake_program;

int nvrtcVersion(int *major, int *minor) { *major = FAKE_NVRTC_MAJOR; *minor = FAKE_NVRTC_MINOR; return 0; }
const char *nvrtcGetErrorString(int r) { (void)r; return "fake NVRTC error"; }
int nvrtcGetNumSupportedArchs(int *n) { *n = 1; return 0; }
int nvrtcGetSupportedArchs(int *archs) { archs[0] = 80; return 0; }
int nvrtcCreateProgram(void **p, const char *src, const char *name, int n, const char *const *h, const char *const *in) {
    (void)src; (void)name; (void)n; (void)h; (void)in;
    *p = &fake_program;
    return 0;
}
int nvrtcDestroyProgram(void **p) { *p = NULL; return 0; }
int nvrtcCompileProgram(void *p, int n, const char *const *opts) { (void)p; (void)n; (void)opts; return 0; }
int nvrtcGetProgramLogSize(void *p, size_t *n) { (void)p; *n = 1; return 0; }
int nvrtcGetProgramLog(void *p, char *log) { (void)p; log[0] = 0; return 0; }
int nvrtcGetPTXSize(void *p, size_t *n) { (void)p; *n = sizeof(FAKE_TEXT); return 0; }
int nvrtcGetPTX(void *p, char *out) { (void)p; memcpy(out, FAKE_TEXT, sizeof(FAKE_TEXT)); return 0; }
int nvrtcGetCUBINSize(void *p, size_t *n) { (void)p; *n = sizeof(FAKE_TEXT); return 0; }
int nvrtcGetCUBIN(void *p, char *out) { (void)p; memcpy(out, FAKE_TEXT, sizeof(FAKE_TEXT)); return 0; }
