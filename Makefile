# tandem's front door. On a fresh Debian 12 machine, as root:
#   make demo   trains the built-in demo model and shows what it learned
#   make test   builds everything and runs every test (the GPU tests only with make test-gpu)
#   make fuzz   builds the safetensors and data fuzzers with clang (build-fuzz/) and runs each
#               for a bounded time (FUZZ_SECONDS)
# Each target first installs the Debian packages it needs that are missing.
SHELL := /bin/bash
.DEFAULT_GOAL := build

APT_PACKAGES := build-essential cmake ninja-build ccache pkg-config git \
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev \
  libtomlplusplus-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin \
  clang clang-format libclang-rt-14-dev libprotobuf-dev protobuf-compiler \
  libsentencepiece-dev
JOBS ?= $(shell nproc)
DEMO_DIR ?= demo-run
FUZZ_SECONDS ?= 20

.PHONY: deps build test test-gpu test-asan fuzz demo clean

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make: installing missing packages:" $$missing; \
	  if [ "$$(id -u)" != 0 ]; then echo "make: run as root (or install them yourself): apt-get install" $$missing >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	cmake --preset release -DTANDEM_GPU_TESTS=OFF >/dev/null
	cmake --build build -j $(JOBS)

test: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

# On a machine with a GPU: the GPU tests (tests/cuda) through ctest as well.
test-gpu: deps
	cmake --preset release -DTANDEM_GPU_TESTS=ON >/dev/null
	cmake --build build -j $(JOBS)
	ctest --test-dir build --output-on-failure -L gpu

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

fuzz: deps
	cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
	  -DTANDEM_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build build-fuzz -j $(JOBS)
	ctest --test-dir build-fuzz --output-on-failure

# The demo builds only the program (not the tests) so that it finishes in a few minutes. Its model
# is a small MoE (DEMO_MODEL: 2 layers, hidden 128, 4 experts top-2; the options' own defaults
# are Megatron-LM's, a dense model), with the demo's own warm-up, weight decay, beta2 and
# load-balancing weight (DEMO_ARGS), trained on one problem per sample (DEMO_SEQ: "38+42=080\n" is 10 bytes), 100 samples per
# step: on 2 cores it learns 2-digit addition in about two minutes (README, "The demo").
# Its products are small (1000 x 128 by 128 x 256 and the like): OpenBLAS's second thread saved no
# time on them (1 min 47 s either way, idle) and costs a lot while the other core is busy, so the
# demo runs one BLAS thread unless OPENBLAS_NUM_THREADS says otherwise.
# DEMO_DEVICE=auto trains on the GPU (--device cuda) when nvidia-smi sees one and build/tandem
# has the CUDA backend (CMake found nvcc), else on the CPU; cpu or cuda chooses.
DEMO_DIGITS ?= 2
DEMO_ITERS ?= 1500
DEMO_DEVICE ?= auto
DEMO_SEQ ?= $(shell echo $$((3 * $(DEMO_DIGITS) + 4)))
DEMO_MODEL ?= --num-layers 2 --hidden-size 128 --num-attention-heads 4 --num-query-groups 4 \
  --ffn-hidden-size 256 --num-experts 4 --moe-router-topk 2 --untie-embeddings-and-output-weights
DEMO_ARGS ?= --seq-length $(DEMO_SEQ) --micro-batch-size 100 --global-batch-size 100 \
  --train-iters $(DEMO_ITERS) --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 30 \
  --weight-decay 0.1 --adam-beta2 0.95 --moe-aux-loss-coeff 0.01 --keep-checkpoints 2 \
  --log-interval 100

demo: deps
	cmake --preset release >/dev/null
	cmake --build build -j $(JOBS) --target tandem
	mkdir -p $(DEMO_DIR)
	rm -rf $(DEMO_DIR)/model
	@device=$(DEMO_DEVICE); \
	if [ "$$device" = auto ]; then \
	  device=cpu; \
	  if nvidia-smi -L >/dev/null 2>&1 && \
	     grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' build/CMakeCache.txt; then device=cuda; fi; \
	fi; \
	echo "== training the demo model on the built-in addition task ($(DEMO_DIGITS) digits," \
	  "--device $$device) =="; \
	set -x; \
	OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} build/tandem train --device $$device \
	  --addition-max-digits $(DEMO_DIGITS) $(DEMO_MODEL) $(DEMO_ARGS) \
	  --save $(DEMO_DIR)/model --log-json $(DEMO_DIR)/log.jsonl
	@echo "== asking the trained model held-out problems (pairs it never saw) =="
	OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} build/tandem generate --load $(DEMO_DIR)/model \
	  --max-digits $(DEMO_DIGITS)

clean:
	rm -rf build build-dev build-asan build-fuzz $(DEMO_DIR)
