/* Failing lock and condition-variable creation (build/sync-fail): the
   program is linked with -Wl,--wrap=pthread_mutex_init,--wrap=
   pthread_cond_init, so the N-th creation fails. mskv_cpu_create with
   worker threads makes one lock for calls and, for its workers, a lock and
   two condition variables: each one failing in turn makes the call return
   MSKV_ERROR_THREAD, hand out nothing, and leave nothing behind (ASan's
   leak check at exit, and no destroy of an object that was never made);
   the same call succeeds once creation works again. Linux (GNU ld) only. */
#define MSKV_TEST_IMPLEMENTATION
#define MSKV_TEST_MAIN
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "mskv_test.h"
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"

static int sf_fail_at;   /* 1-based over every mutex and cond creation; 0 = none */
static int sf_count;

int __real_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a);
int __real_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a);
int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
    if (++sf_count == sf_fail_at) return 12;   /* ENOMEM */
    return __real_pthread_mutex_init(m, a);
}
int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a) {
    if (++sf_count == sf_fail_at) return 12;
    return __real_pthread_cond_init(c, a);
}

TEST(cpu_create_with_workers_returns_THREAD_when_any_lock_or_condition_cannot_be_made) {
    mskv_cpu_desc d;
    mskv_cpu *cpu;
    int n, made;
    memset(&d, 0, sizeof d);
    d.num_threads = 2;
    sf_fail_at = 0;
    sf_count = 0;
    cpu = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&d, &cpu));
    mskv_cpu_destroy(cpu);
    made = sf_count;   /* every creation a successful create makes */
    EXPECT_LE(4, made);
    for (n = 1; n <= made; n++) {
        sf_fail_at = n;
        sf_count = 0;
        cpu = (mskv_cpu *)(void *)&d;
        EXPECT_EQ(MSKV_ERROR_THREAD, mskv_cpu_create(&d, &cpu));
        EXPECT_TRUE(cpu == NULL);   /* no pool handed out */
        sf_fail_at = 0;
        cpu = NULL;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&d, &cpu));   /* and works once creation does */
        mskv_cpu_destroy(cpu);
    }
    printf("  %d lock/condition creations, each failed in turn\n", made);
}
