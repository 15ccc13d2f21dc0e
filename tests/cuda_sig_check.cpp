/* Every entry of mstar_kv_cuda.h's function tables
   (MSKV_CUDA_DRIVER_FUNCTIONS, MSKV_CUDA_NVRTC_FUNCTIONS) against the
   prototype in a CUDA toolkit's cuda.h / nvrtc.h, at compile time: the
   tables are expanded here, one static_assert per entry, so an entry added
   to a table is checked with no change to this file.

   For each X(ret, name, sym, params):
   - the real header's function that `name` means. cuda.h #defines many
     names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2); expanded
     after cuda.h, `name` is that function, as it is for a program built
     against cuda.h;
   - sym, the symbol the loader looks up with dlsym, is that versioned
     name: the function it finds is the one whose prototype is checked;
   - ret (*)params and the real function's type are the same parameter by
     parameter, after mapping the layer's handles to cuda.h's (both are
     pointers to distinct incomplete structs), up to the differences listed
     in mta_accepted below, each with its reason. Nothing else may differ.

   A name the toolkit's header maps to a symbol newer than the version the
   loader asks cuGetProcAddress_v2 for (MSKV__CUDA_ABI_VERSION, 12.0) fails
   the symbol check by design (CUDA 13's cuda.h has cuEventElapsedTime ->
   cuEventElapsedTime_v2, cuCtxCreate -> cuCtxCreate_v4): the driver would
   hand back the older function and dlsym the newer one. Such an entry needs
   a decision (raise the version, or list it here with the older prototype),
   not a silent pass.

   The constants, sizes and the loader are checked by
   tests/cuda_abi_check.c. Without cuda.h and nvrtc.h (make builds this
   without MSKV_HAVE_CUDA_HEADERS) it skips, saying why. */
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"

#ifndef MTA_CUDA_HOME
#define MTA_CUDA_HOME "/usr/local/cuda"
#endif

#ifndef MSKV_HAVE_CUDA_HEADERS

TEST(cuda_function_tables_match_the_real_prototypes) {
    SKIP("no CUDA toolkit: cuda.h and nvrtc.h not found in %s/include (set CUDA_HOME)", MTA_CUDA_HOME);
}

#else
/* after the layer's header: its table stays as written there */
#include <cuda.h>
#include <nvrtc.h>
#include <type_traits>

namespace {

/* The layer's handle types as cuda.h's: T, with every mskv handle struct
   replaced by the real one, through pointers and const. */
template <class T> struct mta_to_cuda { typedef T type; };
template <class T> struct mta_to_cuda<T *> { typedef typename mta_to_cuda<T>::type *type; };
template <class T> struct mta_to_cuda<const T> { typedef const typename mta_to_cuda<T>::type type; };
#define MTA_HANDLE(mine, theirs)                                                                        \
    template <> struct mta_to_cuda<std::remove_pointer<mine>::type> {                                   \
        typedef std::remove_pointer<theirs>::type type;                                                 \
    };                                                                                                  \
    static_assert(std::is_pointer<mine>::value && std::is_pointer<theirs>::value, #mine " and " #theirs \
                  " are both opaque pointers");
MTA_HANDLE(mskv_cu_context, CUcontext)
MTA_HANDLE(mskv_cu_module, CUmodule)
MTA_HANDLE(mskv_cu_function, CUfunction)
MTA_HANDLE(mskv_cu_stream, CUstream)
MTA_HANDLE(mskv_cu_event, CUevent)
MTA_HANDLE(mskv_cu_graph, CUgraph)
MTA_HANDLE(mskv_cu_graph_exec, CUgraphExec)
MTA_HANDLE(mskv_nvrtc_program, nvrtcProgram)
/* the integer typedefs are the real ones already (cuda_abi_check.c checks it) */
static_assert(std::is_same<mskv_cu_device, CUdevice>::value, "mskv_cu_device is CUdevice");
static_assert(std::is_same<mskv_cu_ptr, CUdeviceptr>::value, "mskv_cu_ptr is CUdeviceptr");

/* The accepted differences between a table's type (Mine, after the
   mapping) and the real one (Theirs). Nothing else is accepted.

   1. void * for CUtensorMap * (cuTensorMapEncodeTiled's first parameter):
      the layer keeps its maps as 128 raw bytes at 64-byte alignment (the
      encode call's requirement) and needs no CUtensorMap type.
   2. int for one of the C enums listed in mta_int_enum (CUresult and
      nvrtcResult as results; attributes, capture mode and the tensor-map
      enums as parameters): the layer names the values it uses as
      constants (cuda_abi_check.c checks each). A C enum is passed and
      returned as an int-sized integer; each listed one is asserted to be
      int-sized with an int-sized underlying type.
   3. const unsigned long long * for const cuuint64_t * (the tensor map's
      dimensions and strides): cuuint64_t is uint64_t, unsigned long on
      64-bit Linux, a distinct C++ type of the same size and
      representation as unsigned long long. */
template <class E> struct mta_int_enum : std::false_type {};
#define MTA_INT_ENUM(E)                                                                               \
    template <> struct mta_int_enum<E> : std::true_type {};                                           \
    static_assert(std::is_enum<E>::value && sizeof(E) == sizeof(int) &&                               \
                      sizeof(std::underlying_type<E>::type) == sizeof(int),                           \
                  #E " is an int-sized enum");
MTA_INT_ENUM(CUresult)
MTA_INT_ENUM(nvrtcResult)
MTA_INT_ENUM(CUdevice_attribute)
MTA_INT_ENUM(CUfunction_attribute)
MTA_INT_ENUM(CUstreamCaptureMode)
MTA_INT_ENUM(CUtensorMapDataType)
MTA_INT_ENUM(CUtensorMapInterleave)
MTA_INT_ENUM(CUtensorMapSwizzle)
MTA_INT_ENUM(CUtensorMapL2promotion)
MTA_INT_ENUM(CUtensorMapFloatOOBfill)

template <class Mine, class Theirs> struct mta_accepted : std::false_type {};
template <> struct mta_accepted<void *, CUtensorMap *> : std::true_type {};
template <class E> struct mta_accepted<int, E> : mta_int_enum<E> {};
template <> struct mta_accepted<const unsigned long long *, const cuuint64_t *>
    : std::integral_constant<bool, sizeof(unsigned long long) == sizeof(cuuint64_t) &&
                                       std::is_unsigned<cuuint64_t>::value> {};

template <class Mine, class Theirs>
struct mta_same : std::integral_constant<bool, std::is_same<typename mta_to_cuda<Mine>::type, Theirs>::value ||
                                                   mta_accepted<typename mta_to_cuda<Mine>::type, Theirs>::value> {};

/* parameter lists, pairwise; lists of different lengths differ */
template <class... T> struct mta_list {};
template <class A, class B> struct mta_params_same : std::false_type {};
template <> struct mta_params_same<mta_list<>, mta_list<>> : std::true_type {};
template <class M, class... Ms, class T, class... Ts>
struct mta_params_same<mta_list<M, Ms...>, mta_list<T, Ts...>>
    : std::integral_constant<bool, mta_same<M, T>::value && mta_params_same<mta_list<Ms...>, mta_list<Ts...>>::value> {};

template <class Mine, class Theirs> struct mta_sig_same : std::false_type {};
template <class RM, class... PM, class RT, class... PT>
struct mta_sig_same<RM (*)(PM...), RT (*)(PT...)>
    : std::integral_constant<bool, mta_same<RM, RT>::value && mta_params_same<mta_list<PM...>, mta_list<PT...>>::value> {};

constexpr bool mta_streq(const char *a, const char *b) { return *a == *b && (*a == 0 || mta_streq(a + 1, b + 1)); }

#define MTA_STR_(x) #x
#define MTA_STR(x) MTA_STR_(x)   /* x macro-expanded first: cuMemAlloc -> "cuMemAlloc_v2" */

/* name: as the table writes it (#name, unexpanded) and as cuda.h means it */
#define MTA_CHECK(ret, name, sym, params)                                                              \
    static_assert(mta_sig_same<ret(*) params, decltype(&::name)>::value,                               \
                  #name ": the table's prototype differs from the real header's");                     \
    static_assert(mta_streq(sym, MTA_STR(name)),                                                       \
                  #name ": the table's symbol is not the one the real header maps the name to");
MSKV_CUDA_DRIVER_FUNCTIONS(MTA_CHECK)
MSKV_CUDA_NVRTC_FUNCTIONS(MTA_CHECK)

/* the checker itself tells a different prototype from an equal one */
static_assert(!mta_sig_same<int (*)(unsigned int), decltype(&::cuDriverGetVersion)>::value, "checker: types");
static_assert(!mta_sig_same<int (*)(int *, int), decltype(&::cuDriverGetVersion)>::value, "checker: arity");
static_assert(!mta_sig_same<int (*)(mskv_cu_module *), decltype(&::cuCtxSetCurrent)>::value, "checker: handles");
static_assert(!mta_sig_same<int (*)(mskv_cu_context), decltype(&::cuStreamSynchronize)>::value, "checker: handles");
static_assert(!mta_sig_same<int (*)(mskv_cu_stream, int), decltype(&::cuFuncSetAttribute)>::value, "checker: arity");
static_assert(!mta_sig_same<int (*)(mskv_cu_ptr *, unsigned int), decltype(&::cuMemAlloc)>::value, "checker: size_t");
static_assert(mta_sig_same<int (*)(mskv_cu_ptr *, size_t), decltype(&::cuMemAlloc)>::value, "checker: equal");

struct mta_row { const char *name, *sym, *header_name; };
#define MTA_ROW(ret, name, sym, params) { #name, sym, MTA_STR(name) },
const mta_row mta_driver_rows[] = { MSKV_CUDA_DRIVER_FUNCTIONS(MTA_ROW) };
const mta_row mta_nvrtc_rows[] = { MSKV_CUDA_NVRTC_FUNCTIONS(MTA_ROW) };

} // namespace

/* What the compile checked, at run time: each entry is listed with the
   symbol the loader looks up, and the versioned ones are said. */
TEST(cuda_function_tables_match_the_real_prototypes) {
    size_t i, versioned = 0;
    const size_t nd = sizeof mta_driver_rows / sizeof *mta_driver_rows, nn = sizeof mta_nvrtc_rows / sizeof *mta_nvrtc_rows;
    for (i = 0; i < nd; i++) {
        EXPECT_STREQ(mta_driver_rows[i].sym, mta_driver_rows[i].header_name);
        if (strcmp(mta_driver_rows[i].name, mta_driver_rows[i].sym) != 0) {
            printf("  %s -> %s\n", mta_driver_rows[i].name, mta_driver_rows[i].sym);
            versioned++;
        }
    }
    for (i = 0; i < nn; i++) EXPECT_STREQ(mta_nvrtc_rows[i].sym, mta_nvrtc_rows[i].header_name);
    printf("  %d driver and %d NVRTC prototypes equal cuda.h's and nvrtc.h's (CUDA_VERSION %d), %d by a versioned symbol\n",
           (int)nd, (int)nn, CUDA_VERSION, (int)versioned);
    /* the layer's own count of the members it fills */
    EXPECT_EQ((long)sizeof(mskv_cuda_functions), (long)((nd + nn) * sizeof(void (*)(void))));
}

#endif
