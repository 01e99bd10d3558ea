# tandem's front door. On a fresh Debian 12 machine, as root:
#   make demo   trains the built-in demo model and shows what it learned
#   make test   builds everything and runs every test (the GPU tests only with make test-gpu)
#   make fuzz   builds the safetensors fuzzer with clang (build-fuzz/) and runs it for a bounded
#               time (FUZZ_SECONDS)
# Each target first installs the Debian packages it needs that are missing.
SHELL := /bin/bash
.DEFAULT_GOAL := build

APT_PACKAGES := build-essential cmake ninja-build ccache pkg-config git \
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev \
  libtomlplusplus-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin \
  clang libclang-rt-14-dev libprotobuf-dev protobuf-compiler
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

# The demo builds only the program (not the tests) so that it finishes in a few minutes.
DEMO_DIGITS ?= 2
DEMO_ARGS ?= --micro-batch-size 8 --global-batch-size 8 --train-iters 200

demo: deps
	cmake --preset release >/dev/null
	cmake --build build -j $(JOBS) --target tandem
	@echo "== training the demo model (MODEL.md's defaults) on the built-in addition task =="
	mkdir -p $(DEMO_DIR)
	rm -rf $(DEMO_DIR)/model
	build/tandem train --addition-max-digits $(DEMO_DIGITS) $(DEMO_ARGS) --save $(DEMO_DIR)/model --log-json $(DEMO_DIR)/log.jsonl
	@echo "== sampling held-out problems from the trained model =="
	build/tandem generate --load $(DEMO_DIR)/model --max-digits $(DEMO_DIGITS)

clean:
	rm -rf build build-dev build-asan build-fuzz $(DEMO_DIR)
