#!/usr/bin/env bash
# Llama 3 8B as Megatron-LM's examples/llama/train_llama3_8b_h200_bf16.sh trains it (a dense
# model: the script passes no --num-experts), data-parallel over the ranks, on mock data. That
# script passes --apply-layernorm-1p and no --normalization (Megatron-LM's LayerNorm); tandem's
# norms are RMSNorm, so this one passes --normalization RMSNorm in their place (docs/megatron.md).
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL_ARGS=(
  --use-mcore-models
  --num-layers "$(shrink 32 2)"
  --hidden-size "$(shrink 4096 64)"
  --ffn-hidden-size "$(shrink 14336 96)"
  --num-attention-heads "$(shrink 32 4)"
  --group-query-attention
  --num-query-groups "$(shrink 8 2)"
  --kv-channels "$(shrink 128 16)"
  --seq-length "$(shrink 8192 64)"
  --max-position-embeddings 8192
  --position-embedding-type rope
  --rotary-base 1000000
  --rotary-percent 1.0
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --swiglu
  --normalization RMSNorm
  --init-method-std 0.0134
  --attention-backend fused
  --untie-embeddings-and-output-weights
  --disable-bias-linear
)
TRAINING_ARGS=(
  --micro-batch-size 1
  --global-batch-size "$(shrink 128 4)"
  --train-iters "$TRAIN_ITERS"
  --lr 0.00015
  --min-lr 0.00001
  --decoupled-lr 5.0e-4
  --decoupled-min-lr 4.5e-5
  --lr-decay-style cosine
  --clip-grad 1.0
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
  --bf16
  --grad-reduce-in-bf16
  --cross-entropy-loss-fusion
  --manual-gc
  --empty-unused-memory-level 1
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
)
MODEL_PARALLEL_ARGS=(
  --tensor-model-parallel-size 1
  --context-parallel-size 1
  --sequence-parallel
)
# As the published script writes them: one string per option, split by the shell where the
# array is expanded, so the quotes of '99,1,0' reach the program.
DATA_ARGS=(
  "--mock-data"
  "--tokenizer-type NullTokenizer"
  "--vocab-size $(shrink 128256 256)"
  "--tiktoken-pattern v2"
  "--data-cache-path $OUT_DIR/cache"
  "--split '99,1,0'"
  "--no-create-attention-mask-in-dataloader"
  "--no-mmap-bin-files"
  "--num-workers 1"
)
EVAL_AND_LOGGING_ARGS=(
  --log-interval 1
  --save-interval "$TRAIN_ITERS"
  --ckpt-format torch_dist
  --save "$OUT_DIR/llama3"
  --load "$OUT_DIR/llama3"
  --tensorboard-dir "$OUT_DIR/llama3/tensorboard"
)
# Data parallel over the ranks: the global batch splits over them.
launch "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" ${DATA_ARGS[@]} \
  "${EVAL_AND_LOGGING_ARGS[@]}"
