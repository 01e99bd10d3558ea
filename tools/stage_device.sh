#!/usr/bin/env bash
# Stages what a run on the GPU machine needs into devrun/ (ignored by git): stripped binaries
# from build/, the Debian libraries that machine lacks (xz-compressed) and the peer script.
# The machine has CUDA 13, NCCL, Open MPI and PyTorch but none of our Debian -dev packages.
# Usage: tools/stage_device.sh [binary ...]   (paths relative to build/)
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(tandem tandem-tokenize bench/gpu_train_bench tests/cuda/test_cuda_allocator tests/cuda/test_gpu_pipeline
                               tests/cuda/test_cuda_ops tests/cuda/test_cuda_memory tests/cuda/test_cuda_hf)
rm -rf devrun && mkdir -p devrun/bin devrun/lib
for b in "${bins[@]}"; do
  [ -f "build/$b" ] || { echo "stage_device: build/$b is missing; build it first" >&2; exit 1; }
  strip -s -o "devrun/bin/$(basename "$b")" "build/$b"
done
libs=(libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libtomlplusplus.so.3 libprotobuf.so.32
      libsentencepiece.so.0)
for l in "${libs[@]}"; do cp -L "/lib/x86_64-linux-gnu/$l" devrun/lib/; done
tar -C devrun -cJf devrun/lib.tar.xz lib && rm -rf devrun/lib
# The peer: PEER=path picks another copy of it (e.g. one with options the shape needs).
PEER=${PEER:-../shared/peers/torch_peer.py}
[ -f "$PEER" ] && cp "$PEER" devrun/torch_peer.py
mkdir -p devrun/tools && cp tools/hf_tokenize.py devrun/tools/  # beside bin/: tandem convert finds it
cp bench/gpu_suite.sh bench/hf_peer.py bench/compare_losses.py bench/kernel_summary.py bench/exposed_gaps.py bench/host_paced.py tests/python/check_hf_load.py tests/python/check_tokenizer_vocab.py tests/fixtures/tokenizers/spm.model devrun/
du -sh devrun
