#!/usr/bin/env bash
# Qwen3-30B-A3B with the options of Megatron-LM's Qwen3-MoE configurations (128 experts of width
# 768, top-8, q/k norms), expert-parallel over the ranks, on mock data.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL_ARGS=(
  --bf16
  --no-masked-softmax-fusion
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --position-embedding-type rope
  --no-rope-fusion
  --normalization RMSNorm
  --norm-epsilon 1e-6
  --swiglu
  --num-layers "$(shrink 48 2)"
  --hidden-size "$(shrink 2048 64)"
  --ffn-hidden-size "$(shrink 6144 96)"
  --num-attention-heads "$(shrink 32 4)"
  --group-query-attention
  --num-query-groups "$(shrink 4 2)"
  --kv-channels "$(shrink 128 16)"
  --qk-layernorm
  --num-experts "$(shrink 128 8)"
  --moe-ffn-hidden-size "$(shrink 768 32)"
  --moe-router-topk "$(shrink 8 4)"
  --moe-router-dtype fp32
  --moe-aux-loss-coeff 1e-3
  --moe-token-dispatcher-type alltoall
  --moe-router-load-balancing-type aux_loss
  --moe-grouped-gemm
  --moe-permute-fusion
  --moe-layer-freq "'([1]*$(shrink 48 2))'"
  --seq-length "$(shrink 4096 64)"
  --max-position-embeddings 40960
  --make-vocab-size-divisible-by "$(shrink 1187 1)"
  --vocab-size "$(shrink 151936 256)"
  --use-mcore-models
  --rotary-percent 1.0
  --rotary-base 1000000
  --no-bias-swiglu-fusion
  --sequence-parallel
  --attention-dropout 0.0
  --hidden-dropout 0.0
)
TRAINING_ARGS=(
  --mock-data
  --micro-batch-size 1
  --global-batch-size "$(shrink 1024 4)"
  --train-iters "$TRAIN_ITERS"
  --lr 1.2e-4
  --min-lr 1.2e-5
  --lr-warmup-iters 1
  --lr-decay-iters "$TRAIN_ITERS"
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
  --clip-grad 1.0
  --init-method-std 0.02
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --expert-model-parallel-size "$NPROC"
  --expert-tensor-parallel-size 1
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --overlap-moe-expert-parallel-comm
  --delay-wgrad-compute
  --log-interval 1
  --save "$OUT_DIR/qwen3"
  --load "$OUT_DIR/qwen3"
  --save-interval "$TRAIN_ITERS"
  --ckpt-format torch_dist
)
launch "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}"
