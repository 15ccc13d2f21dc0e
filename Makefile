# Convenience only: every program here builds with one cc line (see README.md).
#   make test     build the tests as C99 and C++ with gcc and clang, and under
#                 ASan+UBSan, then run them all (the command CI runs)
#   make demo     build and run the video demo (writes demo.mp4)
#   make bench    build and run the benchmarks
#   make gpu-check  the GPU check (needs an NVIDIA GPU)
#   make kernel-stats  the machine-code figures of every attention and K/V
#                 write variant (NVRTC + nvdisasm on the CPU; no GPU)

CC      ?= cc
WARN    := -Wall -Wextra -pedantic -Werror
OPT     := -O2 -g
LIBS    := -ldl -lpthread -lm
B       := build
HDRS    := mstar_kv.h $(wildcard mstar_kv_cuda.h) tests/mskv_test.h tests/mskv_test_util.h
TEST_SRC := tests/main.c $(filter-out tests/test_video%.c,$(wildcard tests/test_*.c))
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

TEST_BINS := $(B)/tests-gcc-c99 $(B)/tests-gcc-cxx $(B)/tests-clang-c99 $(B)/tests-clang-cxx $(B)/tests-asan \
             $(B)/kstats-check $(B)/kstats-sm90-check
ifneq ($(strip $(EMU_SRC)),)
TEST_BINS += $(B)/tests-emu
endif

.PHONY: all test tests demo bench gpu-check embed clean kernel-stats cuda-tools
all: tests $(B)/demo

tests: $(TEST_BINS) $(VIDEO_TEST) $(B)/demo $(B)/demo-emu $(B)/static-check-c $(B)/static-check-cxx

$(B):
	mkdir -p $(B)

$(B)/tests-gcc-c99: $(TEST_SRC) $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-gcc-cxx: $(TEST_SRC) $(HDRS) | $(B)
	g++ -x c++ -std=c++17 $(WARN) $(OPT) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-clang-c99: $(TEST_SRC) $(HDRS) | $(B)
	clang -std=c99 $(WARN) $(OPT) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-clang-cxx: $(TEST_SRC) $(HDRS) | $(B)
	clang++ -x c++ -std=c++17 $(WARN) $(OPT) -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-asan: $(TEST_SRC) $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	    -fno-omit-frame-pointer -DMSKV_TEST_SANITIZED -Itests $(TEST_SRC) -o $@ $(LIBS)
$(B)/tests-emu: $(EMU_SRC) kernels.cu $(HDRS) $(wildcard tests/emu/*) | $(B)
	g++ -std=c++17 $(WARN) -O2 -g -Itests $(EMU_SRC) -o $@ $(LIBS)
# the attention kernel's machine-code targets (bench/kernel_stats.c in a test harness)
$(B)/kstats-check: tests/kstats_check.c bench/kernel_stats.c kernels.cu $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests tests/kstats_check.c -o $@ $(LIBS)
# the sm_90a kernel's machine code, and both paths on the Wan chunk shape
$(B)/kstats-sm90-check: tests/kstats_sm90_check.c bench/kernel_stats.c kernels.cu $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests tests/kstats_sm90_check.c -o $@ $(LIBS)
$(B)/tests-video: tests/test_video.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) $(OPT) -Itests $(FFMPEG_CFLAGS) tests/test_video.c -o $@ $(FFMPEG_LIBS) $(LIBS)

# MSKV_STATIC builds (the C++ one also without threads): a private copy must
# compile warning-free even where unused
$(B)/static-check-c: tests/static_check.c $(HDRS) | $(B)
	gcc -std=c99 $(WARN) -O1 tests/static_check.c -o $@ $(LIBS)
$(B)/static-check-cxx: tests/static_check.c $(HDRS) | $(B)
	clang++ -x c++ -std=c++17 $(WARN) -O1 -DMSKV_NO_THREADS tests/static_check.c -o $@ $(LIBS)

# the demo against the emulated GPU (kernels.cu on the CPU behind the real mstar_kv_cuda.h)
$(B)/demo-emu: demo/demo_emu.cpp $(wildcard demo/*.c demo/*.h) kernels.cu $(HDRS) $(wildcard tests/emu/*) | $(B)
	g++ -std=c++17 $(WARN) -O2 -DMSKV_DEMO_NO_FFMPEG demo/demo_emu.cpp -o $@ $(LIBS)

$(B)/demo: $(wildcard demo/*.c demo/*.h) $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) $(DEMO_DEFS) $(FFMPEG_CFLAGS) demo/demo.c -o $@ $(FFMPEG_LIBS) $(LIBS)

# Build what builds (-k), then run everything: a compile error is one more
# failure in the totals line, not a run that ends without one.
test:
	@mkdir -p $(B); $(MAKE) -k tests; echo $$? > $(B)/build-status
	-sh tools/cuda_tools.sh
	-sh tools/embed_kernels.sh --check
	bash tests/run.sh --build-status $(B)/build-status $(TEST_BINS) $(VIDEO_TEST)

# after editing kernels.cu: refresh the copy embedded in mstar_kv_cuda.h
embed:
	sh tools/embed_kernels.sh

demo: $(B)/demo
	./$(B)/demo -o demo.mp4

$(B)/host_bench: bench/host_bench.c $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O3 -march=native bench/host_bench.c -o $@ $(LIBS)
$(B)/attn_bench: bench/attn_bench.c $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) -O3 -march=native bench/attn_bench.c -o $@ $(LIBS)

bench: $(B)/host_bench $(B)/attn_bench
	./$(B)/host_bench
	./$(B)/attn_bench

gpu-check:
	bash tests/gpu_check.sh

$(B)/kernel-stats: bench/kernel_stats.c kernels.cu $(HDRS) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) bench/kernel_stats.c -o $@ $(LIBS)

# nvdisasm/cuobjdump from PyPI into build/cuda-tools (when missing)
cuda-tools:
	sh tools/cuda_tools.sh

kernel-stats: $(B)/kernel-stats cuda-tools
	./$(B)/kernel-stats

clean:
	rm -rf $(B)
