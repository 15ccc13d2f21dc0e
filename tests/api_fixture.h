/* api_fixture.h - a small header in the layout of mstar_kv.h whose entries
   are known: tools/gen_api.py --check (api_generator_fixture) reads it and
   checks each entry, doc comment and section it must produce. Not a real
   header of the library; nothing includes it. */
#ifndef MSKV_FIXTURE_H
#define MSKV_FIXTURE_H

#include <stdint.h>

#ifndef MSKV_API
#if defined(MSKV_FX_DLL)
#define MSKV_API __declspec(dllimport)   /* whatever it expands to */
#else
#define MSKV_API extern
#endif
#endif

/* The version. */
#define MSKV_FX_VERSION 3

#define MSKV__FX_INTERNAL 1

#ifdef __cplusplus
extern "C" {
#endif

/* // >>alpha -------------------------------------------------------------
   The alpha section's intro. */

/* A note that documents nothing. */

/* Opaque thing. */
typedef struct mskv_fx mskv_fx;

/* Colours. */
typedef enum mskv_fx_color {
    /* warm */
    MSKV_FX_RED = 1,     /* red, a warm colour */
    MSKV_FX_ORANGE = 2,
    /* cold */
    MSKV_FX_BLUE = 4     /* blue: a cold colour,
                            on two lines */
} mskv_fx_color;

typedef enum mskv_fx_flag { MSKV_FX_ON = 0, MSKV_FX_OFF = 1 } mskv_fx_flag;   /* on or off */

enum { MSKV_FX_MODE_A = 0, MSKV_FX_MODE_B = (1 << 2) };   /* modes */

/* The fields of an X-macro. */
#define MSKV_FX_FIELDS(X) X(int, first) X(int, second)

/* A struct. */
typedef struct mskv_fx_desc {
    int32_t size;           /* bytes */
    /* The callback. */
    int (*cb)(void *user, int x);
    int32_t a, b;           /* two at once */
    struct { int x; int y; } inner;   /* nested */
    const char *name;
#define MSKV__FX_MEMBER(type, name) type name;
    MSKV_FX_FIELDS(MSKV__FX_MEMBER)   /* generated fields */
#undef MSKV__FX_MEMBER
} mskv_fx_desc;

typedef void (*mskv_fx_fn)(void *user);   /* a callback */

/* An id. */
typedef struct mskv_fx_id { uint32_t id; } mskv_fx_id;

/* Flags of mskv_fx_open. */
#define MSKV_FX_READ 1u
#define MSKV_FX_WRITE 2u       /* writable */
#define MSKV_FX_EXEC 4u

/* A list macro. */
#define MSKV_FX_LIST(X) \
    X(one)              \
    X(two)

/* Opens a thing, on
   two lines. */
MSKV_API int mskv_fx_open(const mskv_fx_desc *desc,
                          mskv_fx **out);
MSKV_API void mskv_fx_close(mskv_fx *fx);

/* // >>beta --------------------------------------------------------------- */

MSKV_API int mskv_fx_count(void);   /* how many */

/* Zero-initialises. */
#ifdef __cplusplus
#define MSKV_FX_INIT {}
#else
#define MSKV_FX_INIT {0}
#endif

#ifdef __cplusplus
}
#endif
#endif /* MSKV_FIXTURE_H */

#ifdef MSKV_FIXTURE_IMPLEMENTATION
MSKV_API int mskv_fx_hidden(void);
int mskv_fx_count(void) { return 0; }
#define MSKV_FX_IMPL_ONLY 1
#endif
