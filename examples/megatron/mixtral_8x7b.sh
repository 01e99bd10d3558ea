#!/usr/bin/env bash
# Mixtral 8x7B as Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh trains it,
# expert-parallel over the ranks, on mock data.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL_ARGS=(
  --use-mcore-models
  --disable-bias-linear
  --seq-length "$(shrink 4096 64)"
  --max-position-embeddings 32768
  --num-layers "$(shrink 32 2)"
  --hidden-size "$(shrink 4096 64)"
  --ffn-hidden-size "$(shrink 14336 96)"
  --num-attention-heads "$(shrink 32 4)"
  --init-method-std 0.01
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --normalization RMSNorm
  --position-embedding-type rope
  --swiglu
  --untie-embeddings-and-output-weights
  --group-query-attention
  --num-query-groups "$(shrink 8 2)"
  --no-masked-softmax-fusion
  --no-position-embedding
  --rotary-base 1000000
)
MOE_ARGS=(
  --num-experts 8
  --moe-router-topk 2
  --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 1e-2
  --moe-grouped-gemm
  --moe-token-dispatcher-type alltoall
  --overlap-param-gather
  --overlap-grad-reduce
)
DATA_ARGS=(
  --mock-data
  --vocab-size "$(shrink 32000 256)"
  --split 99990,8,2
)
TRAINING_ARGS=(
  --micro-batch-size 1
  --global-batch-size "$(shrink 256 4)"
  --lr 1e-4
  --train-iters "$TRAIN_ITERS"
  --lr-decay-iters "$TRAIN_ITERS"
  --min-lr 1.0e-5
  --weight-decay 0.1
  --lr-warmup-iters 1
  --clip-grad 1.0
  --bf16
)
MODEL_PARALLEL_ARGS=(
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --expert-model-parallel-size "$NPROC"
  --use-distributed-optimizer
  --sequence-parallel
)
LOGGING_ARGS=(
  --log-interval 1
  --save-interval "$TRAIN_ITERS"
  --save "$OUT_DIR/mixtral"
  --load "$OUT_DIR/mixtral"
  --tensorboard-dir "$OUT_DIR/mixtral/tensorboard"
)
launch "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAINING_ARGS[@]}" \
  "${MODEL_PARALLEL_ARGS[@]}" "${LOGGING_ARGS[@]}"
