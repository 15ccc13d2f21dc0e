/* Where mstar_kv_cuda.h's loader looks for PyPI's NVRTC wheels
   (nvidia-cuda-nvrtc 13.x and nvidia-cuda-nvrtc-cu12), on Windows as on
   Linux: fake wheel files in a temporary tree, the environment pointed at
   it, and the candidate list (tests/main.c's mtu_nvrtc_candidates) read
   back. Nothing is loaded: the paths alone are checked.
     Windows: %VIRTUAL_ENV%\Lib\site-packages, %CONDA_PREFIX%\Lib\site-packages
     and each %PYTHONPATH% entry (';') before the bare DLL names; the user's
     %APPDATA%\Python\Python3X\site-packages and the installer's
     %LOCALAPPDATA%\Programs\Python\Python3X\Lib\site-packages after the
     toolkit's folders; the wheels' DLLs in nvidia\cu13\bin\x86_64 and
     nvidia\cuda_nvrtc\bin.
     POSIX: $VIRTUAL_ENV/lib/python3.X/site-packages, $CONDA_PREFIX's and
     $PYTHONPATH's (':') first; ~/.local's after /usr/local/cuda. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#else
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#endif
#include "mskv_test.h"
#include "mskv_test_util.h"

#ifdef _WIN32
#define TNW_SEP "\\"
#define TNW_LIST ";"
#define TNW_VENV_SITE "venv\\Lib\\site-packages"
#define TNW_CONDA_SITE "conda\\Lib\\site-packages"
#define TNW_WHEEL13 "nvidia\\cu13\\bin\\x86_64\\nvrtc64_130_0.dll"
#define TNW_WHEEL12 "nvidia\\cuda_nvrtc\\bin\\nvrtc64_120_0.dll"
#define TNW_BARE_FIRST "nvrtc64_130_0.dll"
#define TNW_BARE 3
#else
#define TNW_SEP "/"
#define TNW_LIST ":"
#define TNW_VENV_SITE "venv/lib/python3.11/site-packages"
#define TNW_CONDA_SITE "conda/lib/python3.12/site-packages"
#define TNW_WHEEL13 "nvidia/cu13/lib/libnvrtc.so.13"
#define TNW_WHEEL12 "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
#define TNW_BARE_FIRST "libnvrtc.so.13"
#define TNW_BARE 4
#endif

/* every variable the search reads, saved and cleared for a test, then put back */
static const char *const tnw_vars[] = { "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "CUDA_PATH", "HOME",
                                        "APPDATA", "LOCALAPPDATA", "ProgramFiles" };
#define TNW_NVARS (sizeof(tnw_vars) / sizeof(tnw_vars[0]))
typedef struct tnw_env { char value[TNW_NVARS][1024]; int set[TNW_NVARS]; } tnw_env;

static void tnw_env_clear(tnw_env *e) {
    size_t i;
    for (i = 0; i < TNW_NVARS; i++) {
        const char *v = getenv(tnw_vars[i]);
        e->set[i] = v != NULL;
        snprintf(e->value[i], sizeof(e->value[i]), "%s", v ? v : "");
        mtu_setenv(tnw_vars[i], NULL);
    }
}

static void tnw_env_restore(const tnw_env *e) {
    size_t i;
    for (i = 0; i < TNW_NVARS; i++) mtu_setenv(tnw_vars[i], e->set[i] ? e->value[i] : NULL);
}

static int tnw_mkdir(const char *path) {
#ifdef _WIN32
    return CreateDirectoryA(path, NULL) || GetLastError() == ERROR_ALREADY_EXISTS ? 0 : -1;
#else
    struct stat st;
    return mkdir(path, 0700) == 0 || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) ? 0 : -1;
#endif
}

/* base/rel as an empty file, making its folders; 0 on success */
static int tnw_touch(const char *base, const char *rel) {
    char path[1024];
    size_t i, n;
    FILE *f;
    n = (size_t)snprintf(path, sizeof(path), "%s" TNW_SEP "%s", base, rel);
    if (n >= sizeof(path)) return -1;
    for (i = strlen(base) + 1; i < n; i++)
        if (path[i] == TNW_SEP[0]) {
            path[i] = 0;
            if (tnw_mkdir(path) != 0) return -1;
            path[i] = TNW_SEP[0];
        }
    if ((f = fopen(path, "wb")) == NULL) return -1;
    fclose(f);
    return 0;
}

/* a fresh temporary folder; 0 on success */
static int tnw_base(char *out, size_t cap) {
#ifdef _WIN32
    char tmp[MAX_PATH];
    DWORD n = GetTempPathA((DWORD)sizeof(tmp), tmp);
    if (n == 0 || n >= sizeof(tmp)) return -1;
    snprintf(out, cap, "%smskv_wheels_%lu", tmp, mtu_pid());
    mtu_rm_dir(out);   /* a folder left by an earlier process of the same id */
    return CreateDirectoryA(out, NULL) ? 0 : -1;
#else
    const char *t = getenv("TMPDIR");
    snprintf(out, cap, "%s/mskv_wheels_XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(out) ? 0 : -1;
#endif
}

static int tnw_index(char (*paths)[512], int n, const char *want) {
    int i;
    for (i = 0; i < n; i++)
        if (!strcmp(paths[i], want)) return i;
    return -1;
}

/* The active environment's wheels come first, the newer CUDA first within
   one site-packages, $VIRTUAL_ENV before $CONDA_PREFIX before each
   $PYTHONPATH entry in order, and only the files that exist. */
TEST(nvrtc_wheels_of_the_active_python_environment_are_tried_before_the_bare_names) {
    char base[512], want[8][1024], list[2048], env[1024];
    char paths[24][512];
    tnw_env saved;
    int n, i;
    ASSERT_EQ(0, tnw_base(base, sizeof(base)));
    ASSERT_EQ(0, tnw_touch(base, TNW_VENV_SITE TNW_SEP TNW_WHEEL13));
    ASSERT_EQ(0, tnw_touch(base, TNW_VENV_SITE TNW_SEP TNW_WHEEL12));
    ASSERT_EQ(0, tnw_touch(base, TNW_CONDA_SITE TNW_SEP TNW_WHEEL12));
    ASSERT_EQ(0, tnw_touch(base, "pp2" TNW_SEP TNW_WHEEL13));
    ASSERT_EQ(0, tnw_touch(base, "pp1" TNW_SEP "unrelated.txt"));   /* a PYTHONPATH entry without a wheel adds nothing */
    snprintf(want[0], sizeof(want[0]), "%s" TNW_SEP TNW_VENV_SITE TNW_SEP TNW_WHEEL13, base);
    snprintf(want[1], sizeof(want[1]), "%s" TNW_SEP TNW_VENV_SITE TNW_SEP TNW_WHEEL12, base);
    snprintf(want[2], sizeof(want[2]), "%s" TNW_SEP TNW_CONDA_SITE TNW_SEP TNW_WHEEL12, base);
    snprintf(want[3], sizeof(want[3]), "%s" TNW_SEP "pp2" TNW_SEP TNW_WHEEL13, base);
    tnw_env_clear(&saved);
    snprintf(env, sizeof(env), "%s" TNW_SEP "venv", base);
    mtu_setenv("VIRTUAL_ENV", env);
    snprintf(env, sizeof(env), "%s" TNW_SEP "conda", base);
    mtu_setenv("CONDA_PREFIX", env);
    snprintf(list, sizeof(list), "%s" TNW_SEP "pp1" TNW_LIST TNW_LIST "%s" TNW_SEP "pp2", base, base);
    mtu_setenv("PYTHONPATH", list);
    n = mtu_nvrtc_candidates(paths, 24);
    tnw_env_restore(&saved);
    ASSERT_GE(n, 4 + TNW_BARE);
    for (i = 0; i < 4; i++) EXPECT_STREQ(want[i], paths[i]);
    EXPECT_STREQ(TNW_BARE_FIRST, paths[4]);                        /* then the loader's own search */
    EXPECT_EQ(-1, tnw_index(paths, n, "unrelated.txt"));
    EXPECT_EQ(0, mtu_rm_dir(base));
}

/* Without an active environment nothing of the wheels comes first; the
   user's site-packages (Windows: %APPDATA%\Python\Python3X; POSIX:
   ~/.local/lib/python3.X) are searched after the bare names and the
   toolkit's folders, and on Windows the installer's per-user Python too. */
TEST(nvrtc_wheels_in_the_user_site_packages_come_after_the_toolkit_folders) {
    char base[512], env[1024], user[1024];
    char paths[24][512];
    tnw_env saved;
    int n, at_user, at_bare;
#ifdef _WIN32
    char installer[1024];
    int at_installer, at_toolkit;
    const char *user_rel = "appdata\\Python\\Python312\\site-packages\\" TNW_WHEEL12;
    const char *installer_rel = "localappdata\\Programs\\Python\\Python311\\Lib\\site-packages\\" TNW_WHEEL13;
#else
    const char *user_rel = "home/.local/lib/python3.11/site-packages/" TNW_WHEEL12;
#endif
    ASSERT_EQ(0, tnw_base(base, sizeof(base)));
    ASSERT_EQ(0, tnw_touch(base, user_rel));
    snprintf(user, sizeof(user), "%s" TNW_SEP "%s", base, user_rel);
    tnw_env_clear(&saved);
#ifdef _WIN32
    ASSERT_EQ(0, tnw_touch(base, installer_rel));
    snprintf(installer, sizeof(installer), "%s\\%s", base, installer_rel);
    snprintf(env, sizeof(env), "%s\\appdata", base);
    mtu_setenv("APPDATA", env);
    snprintf(env, sizeof(env), "%s\\localappdata", base);
    mtu_setenv("LOCALAPPDATA", env);
    mtu_setenv("CUDA_PATH", "C:\\cuda");
#else
    snprintf(env, sizeof(env), "%s/home", base);
    mtu_setenv("HOME", env);
#endif
    n = mtu_nvrtc_candidates(paths, 24);
    tnw_env_restore(&saved);
    at_user = tnw_index(paths, n, user);
    at_bare = tnw_index(paths, n, TNW_BARE_FIRST);
    EXPECT_EQ(0, at_bare);                                          /* no active environment: nothing before */
    EXPECT_GT(at_user, at_bare);
#ifdef _WIN32
    at_toolkit = tnw_index(paths, n, "C:\\cuda\\bin\\nvrtc64_112_0.dll");
    at_installer = tnw_index(paths, n, installer);
    EXPECT_EQ(TNW_BARE + 5, at_toolkit);                           /* bare names, then bin\x64 and bin */
    EXPECT_EQ(at_toolkit + 1, at_user);
    EXPECT_EQ(at_user + 1, at_installer);
#else
    EXPECT_EQ(2 * TNW_BARE, at_user);                               /* after /usr/local/cuda/lib64 */
#endif
    EXPECT_EQ(0, mtu_rm_dir(base));
}
