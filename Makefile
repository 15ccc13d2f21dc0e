# Convenience only: every program here builds with one cc line (see README.md).
#   make test     build the tests as C99 and C++ with gcc and clang (clang++
#                 compile-only), and under ASan+UBSan, then run them, JOBS at a
#                 time (the command CI runs); with mingw-w64 also for Windows,
#                 run under wine; with a CUDA toolkit (CUDA_HOME) the GPU
#                 layer's mirrored types, constants and prototypes against
#                 its headers and libraries (tests-cuda-abi, tests-cuda-sig)
#   make demo     build and run the video demo (writes demo.mp4)
#   make bench    build and run the benchmarks
#   make api      regenerate docs/api.md from the headers (tools/gen_api.py; make test
#                 fails while it is stale or a public declaration has no doc comment)
#   make gpu-check  the GPU check (needs an NVIDIA GPU; stages and budgets: tests/gpu_check.sh)
#   make gpu-warm   no GPU needed: builds the check's programs and fills the kernel cache
#                 (build/nvrtc-cache, or $MSKV_CACHE_DIR) with every variant the check loads
#                 for sm_90 and sm_90a; carry both to the GPU machine
#   make python   install the Python package into build/venv (make test runs its tests);
#                 MSKV_TORCH=1 adds PyTorch from PyPI (what CI does), so the torch
#                 tests and the example model run instead of skipping with the reason
#   make install PREFIX=/usr/local   the three headers into $(PREFIX)/include,
#                 mstar_kv.pc into $(PREFIX)/lib/pkgconfig and the CMake package
#                 (find_package(mstar_kv): the INTERFACE target mstar_kv::mstar_kv)
#                 into $(PREFIX)/lib/cmake/mstar_kv (DESTDIR is honoured);
#                 make uninstall removes them
#   make install-python   pip install ./python (into the active venv; PIP_FLAGS adds options)
#   make check-neon the CPU backend's NEON path, cross-built and run under qemu
#   make fuzz     every libFuzzer harness of tests/fuzz for FUZZ_SECONDS each
#                 (make test runs them for 20 s each), each with a fresh seed
#                 it prints (FUZZ_SEED=N repeats one; FUZZ_RUNS=N bounds by
#                 executions); a finding is copied into tests/fuzz/regressions/
#   make stress   the ThreadSanitizer stress with 10x the operations of make test
#   make kernel-stats  the machine-code figures of every attention and K/V
#                 write variant (NVRTC + nvdisasm on the CPU; no GPU)

CC      ?= cc
WARN    := -Wall -Wextra -pedantic -Werror
OPT     := -O2 -g
LIBS    := -ldl -lpthread -lm
B       := build
HDRS    := mstar_kv.h $(wildcard mstar_kv_cuda.h) $(wildcard mstar_kv_ucx.h) tests/mskv_test.h tests/mskv_test_util.h tests/mskv_test_states.h \
           tests/gpu_check.c tests/mskv_mock_cuda.h
TEST_SRC := tests/main.c $(filter-out tests/test_video%.c tests/test_ucx%.c,$(wildcard tests/test_*.c))
EMU_SRC := $(wildcard tests/emu_*.cpp)
FFMPEG_PKGS := libavformat libavcodec libswscale libavutil
FFMPEG_CFLAGS := $(shell pkg-config --cflags $(FFMPEG_PKGS) 2>/dev/null)
FFMPEG_LIBS := $(shell pkg-config --libs $(FFMPEG_PKGS) 2>/dev/null)
ifeq ($(strip $(FFMPEG_LIBS)),)
DEMO_DEFS := -DMSKV_DEMO_NO_FFMPEG
VIDEO_TEST :=
else
DEMO_DEFS :=
VIDEO_TEST := $(B)/tests-video
endif

TEST_BINS := $(B)/tests-gcc-c99 $(B)/tests-gcc-cxx $(B)/tests-clang-c99 $(B)/tests-asan $(B)/tests-debug \
             $(B)/kstats-check $(B)/kstats-sm90-check
# Windows: built when the mingw-w64 cross compilers are installed (tests/run.sh
# runs the test program under wine, and says so with a skip when it cannot)
MINGW := x86_64-w64-mingw32-
ifneq ($(shell command -v $(MINGW)gcc 2>/dev/null),)
WIN_TEST := $(B)/tests-mingw.exe
WIN_CHECKS := $(B)/static-check-mingw-c.exe
ifneq ($(shell command -v $(MINGW)g++ 2>/dev/null),)
WIN_CHECKS += $(B)/static-check-mingw-cxx.exe
endif
endif
# what tests/test_cuda.c's NVRTC search tests run: a fresh process per layout, a stand-in libnvrtc
# (NVRTC 12.34 and 13.0), and a stand-in libcuda whose version a test sets (the NVRTC choice)
LOADER_AIDS := $(B)/nvrtc-find $(B)/fake-nvrtc/libnvrtc.so $(B)/fake-nvrtc13/libnvrtc.so $(B)/fake-cuda/libcuda.so.1
ifneq ($(strip $(EMU_SRC)),)
TEST_BINS += $(B)/tests-emu
endif
TEST_BINS += $(B)/tests-python $(B)/tests-user
# the headers as a shared library through MSKV_API/MSKV_DLL: ELF under gcc,
# g++, clang, clang++; a mingw-w64 DLL and its consumer under wine (each
# skips, saying why, without mingw-w64 or wine)
TEST_BINS += $(B)/tests-dll
# UCX migration: two processes over loopback (skips without libucp.so.0), and
# the mirrored UCP types against the real headers (skips without libucx-dev)
TEST_BINS += $(B)/tests-ucx $(B)/tests-ucx-abi
# the GPU check's stage runner (tests/gpu_check.sh) and gpu-warm, on the mock driver
TEST_BINS += $(B)/tests-gpu-check
UCX_HEADERS := $(if $(wildcard /usr/include/ucp/api/ucp.h),-DMSKV_HAVE_UCX_HEADERS)
# the GPU layer's mirrors of cuda.h and nvrtc.h against a CUDA toolkit's own
# ($(CUDA_HOME), default /usr/local/cuda; each skips, saying why, without its
# cuda.h and nvrtc.h): constants, type sizes, the stub libcuda and the real
# libnvrtc through the loader (tests-cuda-abi); every function table entry's
# prototype and symbol (tests-cuda-sig, compile-time)
CUDA_HOME ?= /usr/local/cuda
TEST_BINS += $(B)/tests-cuda-abi $(B)/tests-cuda-sig
CUDA_ABI_FLAGS := -DMTA_CUDA_HOME='"$(CUDA_HOME)"' -DMTA_HEADER='"$(CURDIR)/mstar_kv_cuda.h"' \
    $(if $(and $(wildcard $(CUDA_HOME)/include/cuda.h),$(wildcard $(CUDA_HOME)/include/nvrtc.h)),-DMSKV_HAVE_CUDA_HEADERS -isystem $(CUDA_HOME)/include)

# Hardening (issue 9): libFuzzer harnesses, a ThreadSanitizer build of the
# thread tests plus a stress, and allocation-failure injection under ASan.
FUZZ_SECONDS ?= 20
FUZZ_NAMES := import import_stream ops plans arith
FUZZ_BINS := $(FUZZ_NAMES:%=$(B)/fuzz-%)
FUZZ_CC := clang -std=c99 $(WARN) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_SRC := tests/main.c tests/test_threads.c tests/stress_threads.c
HARDEN_BINS := $(FUZZ_BINS) $(B)/gen-corpus $(B)/tests-tsan $(B)/alloc-fail $(B)/sync-fail

# The Python package (python/): a venv under build/ (no system pip, so no
# "externally-managed-environment") with NumPy, pytest and the build tools
# from PyPI (wheel: a setuptools older than 70.1 needs it to build without
# isolation), the package installed the way a user installs it (pip install
# ./python), and a test program that runs its pytest suite and prints the
# common totals line.
PYTHON  ?= python3
VENV    := $(B)/venv
PY_SRC  := $(wildcard python/mstar_kv/*.py python/mstar_kv/*.c) python/setup.py python/pyproject.toml

.PHONY: all test tests demo bench gpu-check embed clean python install uninstall install-python check-neon fuzz sweep stress fuzz-corpus kernel-stats cuda-tools
all: tests $(B)/demo

tests: $(TEST_BINS) $(B)/tests-api $(B)/tests-clang-cxx.checked $(VIDEO_TEST) $(B)/demo $(B)/demo-emu $(B)/static-check-c $(B)/static-check-cxx \
       $(WIN_TEST) $(WIN_CHECKS) $(LOADER_AIDS) $(HARDEN_BINS)

$(B):
	mkdir -p $(B)

$(B)/nvrtc-find: tests/nvrtc_find.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 tests/nvrtc_find.c -o $@ $(LIBS)
$(B)/fake-nvrtc/libnvrtc.so: tests/fake_nvrtc.c | $(B)
	mkdir -p $(B)/fake-nvrtc
	gcc -std=c99 $(WARN) -O1 -shared -fPIC tests/fake_nvrtc.c -o $@
$(B)/fake-nvrtc13/libnvrtc.so: tests/fake_nvrtc.c | $(B)
	mkdir -p $(B)/fake-nvrtc13
	gcc -std=c99 $(WARN) -O1 -shared -fPIC -DFAKE_NVRTC_MAJOR=13 -DFAKE_NVRTC_MINOR=0 tests/fake_nvrtc.c -o $@
$(B)/fake-cuda/libcuda.so.1: tests/fake_cuda.c tests/mskv_mock_cuda.h mstar_kv.h mstar_kv_cuda.h | $(B)
	mkdir -p $(B)/fake-cuda
	gcc -std=c99 $(WARN) -O1 -shared -fPIC tests/fake_cuda.c -o $@

# The test program as C99 and as C++17 under gcc and clang, -Werror. Three
# of the four run the suite: each language and each compiler's code run at
# least once. clang++ is compiled without code generation: what it alone
# could add is a warning or an error, which -fsyntax-only finds at a small
# part of an -O2 build plus a run of the whole suite. The NVRTC sweep over
# kernels.cu is the same whatever built the program: only gcc C99 runs it.
NO_SWEEP := -DMSKV_TEST_NO_NVRTC_SWEEP
$(TEST_BINS): | $(LOADER_AIDS)
$(B)/tests-gcc-c99: $(TEST_SRC) $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-gcc-cxx: $(TEST_SRC) $(HDRS) | $(B)
	g++ -x c++ -std=c++17 $(WARN) $(OPT) $(NO_SWEEP) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-clang-c99: $(TEST_SRC) $(HDRS) | $(B)
	clang -std=c99 $(WARN) $(OPT) $(NO_SWEEP) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-clang-cxx.checked: $(TEST_SRC) $(HDRS) | $(B)
	clang++ -x c++ -std=c++17 $(WARN) -fsyntax-only -Itests $(TEST_SRC)
	touch $@
$(B)/tests-asan: $(TEST_SRC) $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	    -fno-omit-frame-pointer -DMSKV_TEST_SANITIZED $(NO_SWEEP) -Itests $(TEST_SRC) -o $@ $(LIBS)
# MSKV_DEBUG is compile time: its own small program (under ASan + UBSan)
$(B)/tests-debug: tests/debug_check.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -Itests tests/debug_check.c -o $@ $(LIBS)
$(B)/tests-emu: $(EMU_SRC) kernels.cu bench/gpu_bench.c $(HDRS) $(wildcard tests/emu/*) | $(B)
	g++ -std=c++17 $(WARN) -O2 -g -Itests $(EMU_SRC) -o $@ $(LIBS)
# the attention kernel's machine-code targets (bench/kernel_stats.c in a test harness)
$(B)/kstats-check: tests/kstats_check.c bench/kernel_stats.c kernels.cu $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests tests/kstats_check.c -o $@ $(LIBS)
# the sm_90a kernel's machine code, and both paths on the Wan chunk shape
$(B)/kstats-sm90-check: tests/kstats_sm90_check.c bench/kernel_stats.c kernels.cu $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests tests/kstats_sm90_check.c -o $@ $(LIBS)
$(B)/tests-ucx: tests/test_ucx.c tests/mskv_test_states.h $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests tests/test_ucx.c -o $@ $(LIBS)
$(B)/tests-ucx-abi: tests/test_ucx_abi.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 $(UCX_HEADERS) -Itests tests/test_ucx_abi.c -o $@
# C11 (_Static_assert, _Generic, CUtensorMap's alignment); the checks are in the build
$(B)/tests-cuda-abi: tests/cuda_abi_check.c $(HDRS) | $(B)
	gcc -std=c11 $(WARN) -O1 $(CUDA_ABI_FLAGS) -Itests tests/cuda_abi_check.c -o $@ $(LIBS)
$(B)/tests-cuda-sig: tests/cuda_sig_check.cpp $(HDRS) | $(B)
	g++ -std=c++17 $(WARN) -O1 $(CUDA_ABI_FLAGS) -Itests tests/cuda_sig_check.cpp -o $@
$(B)/tests-video: tests/test_video.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests $(FFMPEG_CFLAGS) tests/test_video.c -o $@ $(FFMPEG_LIBS) $(LIBS)

$(B)/fuzz-%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h tests/mskv_mock_cuda.h $(HDRS) | $(B)
	$(FUZZ_CC) $< -o $@ $(LIBS)
$(B)/gen-corpus: tests/fuzz/gen_corpus.c tests/fuzz/fuzz_common.h $(HDRS) | $(B)
	clang -std=c99 $(WARN) -O1 -g $< -o $@ $(LIBS)
# the thread tests under TSan: a tenth of the plain build's operations (TSan
# sees a missing lock from the ordering of accesses, without having to lose
# the race), and the stress of stress_threads.c (MSKV_STRESS_OPS per thread)
$(B)/tests-tsan: $(TSAN_SRC) $(HDRS) | $(B)
	clang -std=c99 $(WARN) -O1 -g -fsanitize=thread -DMTT_OPS=100000L -Itests $(TSAN_SRC) -o $@ $(LIBS)
# lock and condition creation failing in turn (GNU ld's --wrap): under ASan, so a leak fails it
$(B)/sync-fail: tests/sync_fail.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
	    -Wl,--wrap=pthread_mutex_init,--wrap=pthread_cond_init -Itests tests/sync_fail.c -o $@ $(LIBS)
$(B)/alloc-fail: tests/alloc_fail.c tests/mskv_mock_cuda.h $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
	    -Itests tests/alloc_fail.c -o $@ $(LIBS)

# MSKV_STATIC builds (the C++ one also without threads): a private copy must
# compile warning-free even where unused
$(B)/static-check-c: tests/static_check.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 tests/static_check.c -o $@ $(LIBS)
$(B)/static-check-cxx: tests/static_check.c $(HDRS) | $(B)
	clang++ -x c++ -std=c++17 $(WARN) -O1 -DMSKV_NO_THREADS tests/static_check.c -o $@ $(LIBS)

# Windows, cross-compiled: the same test program (linked statically, so wine
# needs no MinGW DLLs; the random walk at one seed, the native builds run it
# in full), and the MSKV_STATIC check as C99 without threads (the GPU layer's
# Windows calls alone) and as C++ with Win32 threads
$(B)/tests-mingw.exe: $(TEST_SRC) $(HDRS) | $(B)
	$(MINGW)gcc -std=c99 $(WARN) -O2 -DMSKV_TEST_QUICK -Itests $(TEST_SRC) -o $@ -static
$(B)/static-check-mingw-c.exe: tests/static_check.c $(HDRS) | $(B)
	$(MINGW)gcc -std=c99 $(WARN) -O1 -DMSKV_NO_THREADS tests/static_check.c -o $@ -static
$(B)/static-check-mingw-cxx.exe: tests/static_check.c $(HDRS) | $(B)
	$(MINGW)g++ -x c++ -std=c++17 $(WARN) -O1 tests/static_check.c -o $@ -static

# the demo against the emulated GPU (kernels.cu on the CPU behind the real mstar_kv_cuda.h)
$(B)/demo-emu: demo/demo_emu.cpp $(wildcard demo/*.c demo/*.h) kernels.cu $(HDRS) $(wildcard tests/emu/*) | $(B)
	g++ -std=c++17 $(WARN) -O2 -DMSKV_DEMO_NO_FFMPEG demo/demo_emu.cpp -o $@ $(LIBS)

$(B)/demo: $(wildcard demo/*.c demo/*.h) $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) $(DEMO_DEFS) $(FFMPEG_CFLAGS) demo/demo.c -o $@ $(FFMPEG_LIBS) $(LIBS)

$(VENV)/ready: | $(B)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check numpy pytest setuptools wheel build
	touch $@
# PyTorch in the venv only when asked (MSKV_TORCH=1): a machine without it keeps
# a working make test, its torch tests skipped with the reason
MSKV_TORCH ?= 0
TORCH_READY := $(if $(filter 1,$(MSKV_TORCH)),$(VENV)/torch-ready)
$(VENV)/torch-ready: $(VENV)/ready
	@echo "python: installing torch from PyPI into $(VENV) (MSKV_TORCH=1; a few minutes)"; start=$$(date +%s); \
	  $(VENV)/bin/python -m pip install -q --disable-pip-version-check torch \
	  || { echo "python: torch install failed; retrying once"; $(VENV)/bin/python -m pip install -q --disable-pip-version-check torch; } \
	  && echo "python: torch $$($(VENV)/bin/python -c 'import torch; print(torch.__version__)') in $$(( $$(date +%s) - start )) s"
	touch $@
$(B)/python-installed: $(VENV)/ready $(TORCH_READY) $(PY_SRC) mstar_kv.h mstar_kv_cuda.h mstar_kv_ucx.h
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation ./python
	touch $@
# A test program that is a Python script, as a wrapper tests/run.sh can start:
# $(call py_test,SCRIPT [FIXED ARGUMENTS],what it checks, without commas)
py_test = printf '\#!/bin/sh\n\# made by make: %s (%s)\ncd "%s" && exec "%s" %s "$$@"\n' '$(1)' '$(2)' "$(CURDIR)" "$(PYTHON)" '$(1)' > $@ && chmod +x $@
$(B)/tests-python: $(B)/python-installed
	printf '#!/bin/sh\n# made by make: the Python package tests against the copy installed in %s\ncd "%s" && exec env -u MSKV_LIBRARY "%s/bin/python" -m pytest -q -p no:cacheprovider python/tests "$$@"\n' \
	    "$(VENV)" "$(CURDIR)" "$(CURDIR)/$(VENV)" > $@
	chmod +x $@
python: $(B)/python-installed

# docs/api.md against the headers: tools/gen_api.py --check (fresh, every
# public function, type and constant documented, the generator's fixture)
$(B)/tests-api: tools/gen_api.py | $(B)
	$(call py_test,tools/gen_api.py --check,docs/api.md; doc comments; the generator)
.PHONY: api
api:
	$(PYTHON) tools/gen_api.py
$(B)/tests-dll: tests/dll_check.py | $(B)
	$(call py_test,tests/dll_check.py,the headers as a shared library and a Windows DLL)

# README blocks, struct initialisation and make install, as a user meets them
$(B)/tests-user: tests/user_checks.py | $(B)
	$(call py_test,tests/user_checks.py,README and manual C blocks; struct initialisation; make install)

# Build what builds (-k), then run everything: a compile error is one more
# failure in the totals line, not a run that ends without one. The build's
# CPU time goes to run.sh, which prints it beside the programs' own. JOBS
# compiles and test programs at a time (default: the online cores). Programs start in
# RUN_ORDER, longest first: on a fresh clone tests-gcc-c99 by far (its NVRTC
# sweep compiles every kernel variant, minutes of one core), then the fixed
# 5 x 20 s of the fuzzers and the TSan build; the others together fit beside
# them.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
RUN_FIRST := $(B)/tests-gcc-c99
RUN_ORDER := $(RUN_FIRST) tests/fuzz/run.sh $(B)/tests-tsan $(filter-out $(RUN_FIRST),$(TEST_BINS)) $(VIDEO_TEST) $(WIN_TEST) \
             tests/test_sdpa_peer.py $(B)/tests-api $(B)/alloc-fail $(B)/sync-fail
test:
	@mkdir -p $(B); date +%s.%N > $(B)/build-start; \
	  bash -c 'TIMEFORMAT="%U %S"; { time $(MAKE) -k -j$(JOBS) -Otarget --no-print-directory tests 2>&1; } 2> $(B)/build-cpu'; \
	  echo $$? > $(B)/build-status
	-sh tools/cuda_tools.sh
	-sh tools/embed_kernels.sh --check
	FUZZ_SECONDS=20 B=$(B) bash tests/run.sh -j $(JOBS) --build-status $(B)/build-status --started "$$(cat $(B)/build-start)" \
	    --build-cpu $(B)/build-cpu $(RUN_ORDER)

fuzz: $(FUZZ_BINS) $(B)/gen-corpus
	FUZZ_SECONDS=$(FUZZ_SECONDS) B=$(B) bash tests/fuzz/run.sh

# every kernel variant compiled for every architecture (make test: all for
# sm_90, a drawn quarter for sm_80 and sm_89)
sweep: $(B)/tests-gcc-c99
	MSKV_TEST_SWEEP=full ./$(B)/tests-gcc-c99 --filter cuda_every_shipped_variant

stress: $(B)/tests-tsan
	MSKV_STRESS_OPS=1000000 ./$(B)/tests-tsan --filter stress

# refresh the committed seeds of the import fuzzer (after a blob format change)
fuzz-corpus: $(B)/gen-corpus
	./$(B)/gen-corpus tests/fuzz/corpus/import

# after editing kernels.cu: refresh the copy embedded in mstar_kv_cuda.h
embed:
	sh tools/embed_kernels.sh

demo: $(B)/demo
	./$(B)/demo -o demo.mp4

$(B)/host_bench: bench/host_bench.c $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O3 -march=native -DNDEBUG bench/host_bench.c -o $@ $(LIBS)
$(B)/attn_bench: bench/attn_bench.c $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O2 -DNDEBUG bench/attn_bench.c -o $@ $(LIBS)

# -O2 without -march=native: valgrind (callgrind) must be able to run it
$(B)/cuda_host_bench: bench/cuda_host_bench.c $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O2 -g bench/cuda_host_bench.c -o $@ $(LIBS)

$(B)/ucx_bench: bench/ucx_bench.c $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O2 bench/ucx_bench.c -o $@ $(LIBS)

bench: $(B)/host_bench $(B)/attn_bench $(B)/cuda_host_bench $(B)/ucx_bench
	./$(B)/host_bench
	./$(B)/attn_bench
	MSKV_CPU_ISA=avx512 ./$(B)/attn_bench video
	./$(B)/cuda_host_bench
	./$(B)/ucx_bench

gpu-check:
	bash tests/gpu_check.sh

# The GPU check's programs: the stages (tests/gpu_check.c with bench/gpu_bench.c),
# the demo on the device, and for gpu-warm the demo on the compile-only device
# of tests/gpu_warm.h; the stage program on the mock driver for the tests.
GPU_CHECK_SRC := tests/gpu_check.c bench/gpu_bench.c tests/gpu_warm.h $(HDRS)
$(B)/gpu_check: $(GPU_CHECK_SRC) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) -Itests tests/gpu_check.c -o $@ $(LIBS)
$(B)/gpu_check-mock: $(GPU_CHECK_SRC) | $(B)
	gcc -std=c99 $(WARN) -O1 -g -DGPC_MOCK -DGPW_MOCK_NVRTC -Itests tests/gpu_check.c -o $@ $(LIBS)
$(B)/demo-gpu: $(wildcard demo/*.c demo/*.h) $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O2 -DMSKV_DEMO_NO_FFMPEG demo/demo.c -o $@ $(LIBS)
$(B)/demo-warm: tests/gpu_warm_demo.c tests/gpu_warm.h $(wildcard demo/*.c demo/*.h) $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O1 -DMSKV_DEMO_NO_FFMPEG -Itests tests/gpu_warm_demo.c -o $@ $(LIBS)
# (the real stage program and the demo's warm build too: a compile error in them fails make test)
$(B)/tests-gpu-check: tests/test_gpu_check.sh tests/gpu_check.sh $(B)/gpu_check-mock $(B)/gpu_check $(B)/demo-warm | $(B)
	printf '#!/bin/sh\n# made by make: tests/test_gpu_check.sh (the GPU check on the mock driver)\ncd "%s" && B="%s" exec bash tests/test_gpu_check.sh "$$@"\n' \
	    "$(CURDIR)" "$(B)" > $@
	chmod +x $@

# Every variant the check's stages load, compiled by their own code on a
# device that runs nothing (tests/gpu_warm.h): two processes (both cores),
# the attention stages and a third of kv_write in one, the rest of kv_write
# and the demo's three runs in the other. The cache serves a GPU run whose
# NVRTC has the version used here (MSKV_NVRTC_PATH chooses).
.PHONY: gpu-warm
gpu-warm: $(B)/gpu_check $(B)/demo-gpu $(B)/demo-warm
	@export MSKV_CACHE_DIR="$${MSKV_CACHE_DIR:-$(CURDIR)/$(B)/nvrtc-cache}"; echo "gpu-warm: into $$MSKV_CACHE_DIR"; \
	  start=$$(date +%s); \
	  ./$(B)/gpu_check --warm --stage mma,sm90a,selftest,figures,kvwrite --part 0/3 > $(B)/gpu-warm-1.log 2>&1 & p1=$$!; \
	  { ./$(B)/gpu_check --warm --stage kvwrite --part 1/3 && ./$(B)/gpu_check --warm --stage kvwrite --part 2/3 && \
	    for m in "" "--offload" "--mode chained"; do \
	        ./$(B)/demo-warm --backend cuda $$m --check -q -o $(B)/demo-warm.y4m > /dev/null 2>&1; \
	        echo "gpu warm: demo $$m done (its --check is meaningless here: nothing ran)"; done; } > $(B)/gpu-warm-2.log 2>&1; r2=$$?; \
	  wait $$p1; r1=$$?; grep -h '^gpu warm\|^jit' $(B)/gpu-warm-1.log $(B)/gpu-warm-2.log; \
	  echo "gpu-warm: $$(ls "$$MSKV_CACHE_DIR" | grep -c 'cubin$$') cached kernel images, $$(( $$(date +%s) - start )) s"; \
	  if [ $$r1 -ne 0 ] || [ $$r2 -ne 0 ]; then echo "gpu-warm: FAILED (logs: $(B)/gpu-warm-1.log $(B)/gpu-warm-2.log)"; exit 1; fi

# Install: the headers are the library. kernels.cu is not installed: the
# GPU header carries it embedded (mskv_cuda_desc.kernel_source takes another).
PREFIX ?= /usr/local
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(PREFIX)/lib/pkgconfig
# find_package(mstar_kv) looks in <prefix>/lib/cmake/mstar_kv (CMAKE_PREFIX_PATH)
CMAKEDIR ?= $(PREFIX)/lib/cmake/mstar_kv
VERSION := $(shell awk '/^.define MSKV_VERSION_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $$3} END {print v}' mstar_kv.h)
PIP_FLAGS ?=
# relative to prefix when it can be (a relocated tree still works)
PC_INCLUDEDIR = $(if $(filter $(PREFIX)/include,$(INCLUDEDIR)),$${prefix}/include,$(INCLUDEDIR))

install:
	mkdir -p "$(DESTDIR)$(INCLUDEDIR)" "$(DESTDIR)$(PKGCONFIGDIR)" "$(DESTDIR)$(CMAKEDIR)"
	cp mstar_kv.h mstar_kv_cuda.h mstar_kv_ucx.h "$(DESTDIR)$(INCLUDEDIR)/"
	printf 'prefix=%s\nincludedir=%s\n\nName: mstar_kv\nDescription: %s\nVersion: %s\nCflags: -I$${includedir}\nLibs: -ldl -lpthread -lm\n' \
	    "$(PREFIX)" '$(PC_INCLUDEDIR)' "paged KV cache for windowed video diffusion and LLM decode (single-header C, optional CUDA and UCX layers)" \
	    "$(VERSION)" > "$(DESTDIR)$(PKGCONFIGDIR)/mstar_kv.pc"
	sed -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' tools/cmake/mstar_kvConfig.cmake.in > "$(DESTDIR)$(CMAKEDIR)/mstar_kvConfig.cmake"
	sed -e 's|@VERSION@|$(VERSION)|g' tools/cmake/mstar_kvConfigVersion.cmake.in > "$(DESTDIR)$(CMAKEDIR)/mstar_kvConfigVersion.cmake"

uninstall:
	rm -f "$(DESTDIR)$(INCLUDEDIR)/mstar_kv.h" "$(DESTDIR)$(INCLUDEDIR)/mstar_kv_cuda.h" "$(DESTDIR)$(INCLUDEDIR)/mstar_kv_ucx.h" \
	    "$(DESTDIR)$(PKGCONFIGDIR)/mstar_kv.pc" "$(DESTDIR)$(CMAKEDIR)/mstar_kvConfig.cmake" \
	    "$(DESTDIR)$(CMAKEDIR)/mstar_kvConfigVersion.cmake"
	-rmdir "$(DESTDIR)$(CMAKEDIR)" 2>/dev/null

install-python:
	$(PYTHON) -m pip install $(PIP_FLAGS) ./python

# The CPU backend's NEON path from an x86 machine: the CPU tests cross-built
# for arm64 and run under qemu (apt-get install gcc-aarch64-linux-gnu
# libc6-dev-arm64-cross qemu-user). Not part of make test: minutes under qemu.
check-neon: | $(B)
	aarch64-linux-gnu-gcc -std=c99 $(WARN) -O2 -Itests tests/main.c tests/test_cpu.c -o $(B)/tests-cpu-arm64 $(LIBS)
	qemu-aarch64 -L /usr/aarch64-linux-gnu $(B)/tests-cpu-arm64 --filter path

$(B)/kernel-stats: bench/kernel_stats.c kernels.cu $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) bench/kernel_stats.c -o $@ $(LIBS)

# nvdisasm/cuobjdump from PyPI into build/cuda-tools (when missing)
cuda-tools:
	sh tools/cuda_tools.sh

kernel-stats: $(B)/kernel-stats cuda-tools
	./$(B)/kernel-stats

clean:
	rm -rf $(B)
