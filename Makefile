# tandem's front door. On a fresh Debian 12 machine, as root:
#   make demo   trains the built-in demo model and shows what it learned
#   make test   builds everything and runs every test
# Each target first installs the Debian packages it needs that are missing.
SHELL := /bin/bash
.DEFAULT_GOAL := build

APT_PACKAGES := build-essential cmake ninja-build ccache pkg-config git \
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev \
  libtomlplusplus-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin
JOBS ?= $(shell nproc)
DEMO_DIR ?= demo-run

.PHONY: deps build test test-asan demo clean

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make: installing missing packages:" $$missing; \
	  if [ "$$(id -u)" != 0 ]; then echo "make: run as root (or install them yourself): apt-get install" $$missing >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	cmake --preset release >/dev/null
	cmake --build build -j $(JOBS)

test: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

demo: build
	@echo "== training the demo model (MODEL.md's defaults) on the built-in addition task =="
	mkdir -p $(DEMO_DIR)
	build/tandem train --save $(DEMO_DIR)/model --log-json $(DEMO_DIR)/log.jsonl
	@echo "== sampling held-out problems from the trained model =="
	build/tandem generate --load $(DEMO_DIR)/model

clean:
	rm -rf build build-dev build-asan $(DEMO_DIR)
