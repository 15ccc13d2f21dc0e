/* mskv_test.h - the test harness of mstar_kv: self-registering tests in C99 and C++.

   Do this in exactly one translation unit of a test program:
       #define MSKV_TEST_IMPLEMENTATION
       #define MSKV_TEST_MAIN            (optional: also emit main())
       #include "mskv_test.h"
   Every other file includes it plainly.

   Writing tests:
       TEST(release_frees_whole_pages_only) {
           EXPECT_EQ(3, count);           continues after a failure
           ASSERT_TRUE(ptr != NULL);      returns from the test on failure
           if (!have_gpu) SKIP("no GPU: %s", why);
       }
   EXPECT/ASSERT print file:line, the expression, and expected/actual.

   Running:  prog [--list] [--filter SUBSTRING] [--seed N]
   The last line is "N passed, N failed, N skipped"; the exit status is the
   number of failed tests (at most 255). A skip is not a failure and always
   says why. Randomised tests take their seed from mt_seed(), which is printed.
*/
#ifndef MSKV_TEST_H
#define MSKV_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <math.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MinGW checks "printf" formats against msvcrt's, which lacks %zu; its own
   stdio (the default under -std=c99) has it, and says which one is in use */
#if defined(__MINGW32__) && defined(__MINGW_PRINTF_FORMAT)
#define MT__PRINTF(f, a) __attribute__((format(__MINGW_PRINTF_FORMAT, f, a)))
#elif defined(__GNUC__)
#define MT__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MT__PRINTF(f, a)
#endif

typedef void (*mt_fn)(void);
void mt_register(const char *name, mt_fn fn, const char *file, int line);
void mt_fail(const char *file, int line, const char *fmt, ...) MT__PRINTF(3, 4);
void mt_skip(const char *fmt, ...) MT__PRINTF(1, 2);
int mt_failed_now(void);       /* has the running test failed so far? */
uint64_t mt_seed(void);         /* --seed N, else MSKV_TEST_SEED, else time-based; printed once */
int mt_main(int argc, char **argv);

#ifdef __cplusplus
}
#define MT__REGISTER(name)                                                   \
    static void name(void);                                                  \
    namespace {                                                              \
    struct mt__reg_##name {                                                  \
        mt__reg_##name() { mt_register(#name, name, __FILE__, __LINE__); }   \
    } mt__reg_inst_##name;                                                   \
    }
#else
#define MT__REGISTER(name)                                                   \
    static void name(void);                                                  \
    __attribute__((constructor)) static void mt__reg_##name(void) {          \
        mt_register(#name, name, __FILE__, __LINE__);                        \
    }
#endif

#define TEST(name) MT__REGISTER(name) static void name(void)

#define SKIP(...) do { mt_skip(__VA_ARGS__); return; } while (0)

#define MT__CHECK(cond, onfail, ...)                                         \
    do { if (!(cond)) { mt_fail(__FILE__, __LINE__, __VA_ARGS__); onfail; } } while (0)

#define MT__CMP_I(a, op, b, onfail)                                          \
    do {                                                                     \
        long long mt__a = (long long)(a), mt__b = (long long)(b);            \
        MT__CHECK(mt__a op mt__b, onfail, "%s %s %s: expected %lld, got %lld", \
                  #a, #op, #b, mt__a, mt__b);                                \
    } while (0)

#define MT__CMP_U(a, op, b, onfail)                                          \
    do {                                                                     \
        unsigned long long mt__a = (unsigned long long)(a),                  \
                           mt__b = (unsigned long long)(b);                  \
        MT__CHECK(mt__a op mt__b, onfail, "%s %s %s: expected 0x%llx, got 0x%llx", \
                  #a, #op, #b, mt__a, mt__b);                                \
    } while (0)

#define MT__NEAR(a, b, tol, onfail)                                          \
    do {                                                                     \
        double mt__a = (double)(a), mt__b = (double)(b), mt__t = (double)(tol); \
        MT__CHECK(fabs(mt__a - mt__b) <= mt__t, onfail,                      \
                  "%s ~ %s: expected %.9g, got %.9g (|diff| %.3g > %.3g)",   \
                  #a, #b, mt__a, mt__b, fabs(mt__a - mt__b), mt__t);         \
    } while (0)

#define MT__STREQ(a, b, onfail)                                              \
    do {                                                                     \
        const char *mt__a = (a), *mt__b = (b);                               \
        MT__CHECK(mt__a && mt__b && strcmp(mt__a, mt__b) == 0, onfail,      \
                  "%s == %s: expected \"%s\", got \"%s\"", #a, #b,           \
                  mt__a ? mt__a : "(null)", mt__b ? mt__b : "(null)");       \
    } while (0)

/* Expectations take (expected, actual) in that order, as the messages say. */
#define EXPECT_TRUE(c)        MT__CHECK((c), (void)0, "expected true: %s", #c)
#define EXPECT_FALSE(c)       MT__CHECK(!(c), (void)0, "expected false: %s", #c)
#define EXPECT_EQ(a, b)       MT__CMP_I(a, ==, b, (void)0)
#define EXPECT_NE(a, b)       MT__CMP_I(a, !=, b, (void)0)
#define EXPECT_LE(a, b)       MT__CMP_I(a, <=, b, (void)0)
#define EXPECT_LT(a, b)       MT__CMP_I(a, <, b, (void)0)
#define EXPECT_GE(a, b)       MT__CMP_I(a, >=, b, (void)0)
#define EXPECT_GT(a, b)       MT__CMP_I(a, >, b, (void)0)
#define EXPECT_EQ_U64(a, b)   MT__CMP_U(a, ==, b, (void)0)
#define EXPECT_NE_U64(a, b)   MT__CMP_U(a, !=, b, (void)0)
#define EXPECT_NEAR(a, b, t)  MT__NEAR(a, b, t, (void)0)
#define EXPECT_STREQ(a, b)    MT__STREQ(a, b, (void)0)
#define ASSERT_TRUE(c)        MT__CHECK((c), return, "expected true: %s", #c)
#define ASSERT_FALSE(c)       MT__CHECK(!(c), return, "expected false: %s", #c)
#define ASSERT_EQ(a, b)       MT__CMP_I(a, ==, b, return)
#define ASSERT_NE(a, b)       MT__CMP_I(a, !=, b, return)
#define ASSERT_LE(a, b)       MT__CMP_I(a, <=, b, return)
#define ASSERT_LT(a, b)       MT__CMP_I(a, <, b, return)
#define ASSERT_GE(a, b)       MT__CMP_I(a, >=, b, return)
#define ASSERT_GT(a, b)       MT__CMP_I(a, >, b, return)
#define ASSERT_EQ_U64(a, b)   MT__CMP_U(a, ==, b, return)
#define ASSERT_NEAR(a, b, t)  MT__NEAR(a, b, t, return)
#define ASSERT_STREQ(a, b)    MT__STREQ(a, b, return)

#endif /* MSKV_TEST_H */

#ifdef MSKV_TEST_IMPLEMENTATION
#ifndef MSKV_TEST_IMPLEMENTED
#define MSKV_TEST_IMPLEMENTED
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#define MT__MAX_TESTS 2048

typedef struct mt__test { const char *name, *file; mt_fn fn; int line; } mt__test;
static mt__test mt__tests[MT__MAX_TESTS];
static int mt__count, mt__overflow;
static int mt__cur_failed, mt__cur_skipped;
static const char *mt__cur_name = "";
static uint64_t mt__seed_value;
static int mt__seed_set, mt__seed_printed;

#ifdef __cplusplus
extern "C" {
#endif

void mt_register(const char *name, mt_fn fn, const char *file, int line) {
    if (mt__count >= MT__MAX_TESTS) { mt__overflow = 1; return; }
    mt__tests[mt__count].name = name;
    mt__tests[mt__count].fn = fn;
    mt__tests[mt__count].file = file;
    mt__tests[mt__count].line = line;
    mt__count++;
}

void mt_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    mt__cur_failed = 1;
    fprintf(stdout, "  %s:%d: [%s] ", file, line, mt__cur_name);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

void mt_skip(const char *fmt, ...) {
    va_list ap;
    mt__cur_skipped = 1;
    fprintf(stdout, "  skip [%s]: ", mt__cur_name);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
}

int mt_failed_now(void) { return mt__cur_failed; }

uint64_t mt_seed(void) {
    if (!mt__seed_set) {
        const char *env = getenv("MSKV_TEST_SEED");
        if (env && *env) mt__seed_value = strtoull(env, NULL, 0);
        else mt__seed_value = ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)clock();
        mt__seed_set = 1;
    }
    if (!mt__seed_printed) {
        printf("  seed %llu (rerun with --seed %llu)\n",
               (unsigned long long)mt__seed_value, (unsigned long long)mt__seed_value);
        mt__seed_printed = 1;
    }
    return mt__seed_value;
}

/* processor time, not wall time: portable C99, and what a test's cost is */
static double mt__now_ms(void) { return (double)clock() * 1e3 / (double)CLOCKS_PER_SEC; }

static int mt__cmp(const void *a, const void *b) {
    const mt__test *x = (const mt__test *)a, *y = (const mt__test *)b;
    int c = strcmp(x->file, y->file);
    return c ? c : x->line - y->line;
}

int mt_main(int argc, char **argv) {
    const char *filter = NULL;
    int list = 0, i, passed = 0, failed = 0, skipped = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            mt__seed_value = strtoull(argv[++i], NULL, 0);
            mt__seed_set = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--list] [--filter SUBSTRING] [--seed N]\n", argv[0]);
            return 0;
        } else {
            fprintf(stderr, "%s: unknown argument '%s' (try --help)\n", argv[0], argv[i]);
            return 2;
        }
    }
    if (mt__overflow) {
        fprintf(stderr, "too many tests: raise MT__MAX_TESTS\n");
        return 2;
    }
    /* registration order differs between C and C++ and between linkers: run in source order */
    qsort(mt__tests, (size_t)mt__count, sizeof(mt__tests[0]), mt__cmp);
    for (i = 0; i < mt__count; i++) {
        const mt__test *t = &mt__tests[i];
        double t0;
        if (filter && !strstr(t->name, filter)) continue;
        if (list) { printf("%s\n", t->name); continue; }
        mt__cur_name = t->name;
        mt__cur_failed = 0;
        mt__cur_skipped = 0;
        mt__seed_printed = 0;
        printf("[ RUN  ] %s\n", t->name);
        fflush(stdout);
        t0 = mt__now_ms();
        t->fn();
        if (mt__cur_failed) { failed++; printf("[ FAIL ] %s\n", t->name); }
        else if (mt__cur_skipped) { skipped++; printf("[ SKIP ] %s\n", t->name); }
        else { passed++; printf("[  OK  ] %s (%.0f ms cpu)\n", t->name, mt__now_ms() - t0); }
        fflush(stdout);
    }
    if (list) return 0;
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed > 255 ? 255 : failed;
}

#ifdef __cplusplus
}
#endif

#ifdef MSKV_TEST_MAIN
int main(int argc, char **argv) { return mt_main(argc, argv); }
#endif
#endif /* MSKV_TEST_IMPLEMENTED */
#endif /* MSKV_TEST_IMPLEMENTATION */
