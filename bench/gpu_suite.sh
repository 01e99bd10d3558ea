#!/usr/bin/env bash
# Runs on the GPU machine from the repository root after tools/stage_device.sh: the GPU tests,
# then the benchmarks named in $SUITE (tests, train, attn, bench-a, bench-b, peer-a, peer-b),
# logs under $OUT (the device tool's output folder).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
SUITE=${SUITE:-tests train}
mkdir -p /tmp/devlib && tar -C /tmp/devlib -xJf devrun/lib.tar.xz
export LD_LIBRARY_PATH=/tmp/devlib/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=devrun/bin
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
SHAPE_A="--num-experts 0 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --num-query-groups 12 --ffn-hidden-size 2048 --vocab-size 50304 --seq-length 1024 --micro-batch-size 8 --num-microbatches 4"
SHAPE_B="--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --num-query-groups 8 --num-experts 8 --moe-router-topk 2 --ffn-hidden-size 2816 --vocab-size 32000 --seq-length 2048 --micro-batch-size 2 --num-microbatches 8"
for s in $SUITE; do
  echo "== $s $(date +%T)"
  case $s in
    tests)
      timeout 300 $B/test_cuda_allocator > "$OUT/test_cuda_allocator.log" 2>&1; echo "allocator rc=$?"
      timeout 300 $B/test_cuda_ops > "$OUT/test_cuda_ops.log" 2>&1; echo "ops rc=$?"
      grep -E "FAILED|PASSED" "$OUT"/test_cuda_*.log | tail -40 ;;
    train)
      timeout 300 $B/tandem train --device cuda --addition-max-digits 2 --micro-batch-size 8 \
        --global-batch-size 8 --train-iters 100 --log-interval 20 --log-json "$OUT/train.jsonl" \
        > "$OUT/train.log" 2>&1; echo "train rc=$?"; tail -8 "$OUT/train.log" ;;
    attn)
      [ -x $B/attention_timing ] && timeout 120 $B/attention_timing > "$OUT/attn.log" 2>&1; cat "$OUT/attn.log" ;;
    bench-a) timeout 300 $B/gpu_train_bench $SHAPE_A --steps 10 --warmup-steps 3 2> "$OUT/bench_a.err" | tee -a "$OUT/results.jsonl"; tail -3 "$OUT/bench_a.err" ;;
    bench-b) timeout 300 $B/gpu_train_bench $SHAPE_B --steps 10 --warmup-steps 3 2> "$OUT/bench_b.err" | tee -a "$OUT/results.jsonl"; tail -3 "$OUT/bench_b.err" ;;
    peer-a) for m in "" "--compile"; do timeout 400 python3 devrun/torch_peer.py --mode single $m $SHAPE_A --steps 10 --warmup-steps 3 2> "$OUT/peer_a$m.err" | grep RESULT | tee -a "$OUT/results.jsonl"; done ;;
    peer-b) for m in "" "--compile"; do timeout 400 python3 devrun/torch_peer.py --mode single $m $SHAPE_B --steps 10 --warmup-steps 3 2> "$OUT/peer_b$m.err" | grep RESULT | tee -a "$OUT/results.jsonl"; done ;;
  esac
done
