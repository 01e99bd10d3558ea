#!/usr/bin/env bash
# DeepSeek-V3 with the options of Megatron-LM's DeepSeek-V3 recipes: multi-head latent attention
# with YaRN, the sigmoid router with its expert bias, groups and scaling, the sequence-level
# load-balancing loss, shared experts, the first layers dense, one multi-token prediction
# module; expert-parallel over the ranks, on mock data.
set -euo pipefail
source "$(dirname "$0")/common.sh"
LAYERS=$(shrink 61 3)
DENSE=$(shrink 3 1)
MODEL_ARGS=(
  --use-mcore-models
  --transformer-impl transformer_engine
  --num-layers "$LAYERS"
  --hidden-size "$(shrink 7168 64)"
  --ffn-hidden-size "$(shrink 18432 128)"
  --num-attention-heads "$(shrink 128 4)"
  --seq-length "$(shrink 4096 64)"
  --max-position-embeddings 163840
  --multi-latent-attention
  --q-lora-rank "$(shrink 1536 24)"
  --kv-lora-rank "$(shrink 512 16)"
  --qk-head-dim "$(shrink 128 16)"
  --qk-pos-emb-head-dim "$(shrink 64 8)"
  --v-head-dim "$(shrink 128 16)"
  --kv-channels "$(shrink 128 16)"
  --qk-layernorm
  --rotary-base 10000
  --rotary-scaling-factor 40
  --mscale 1.0
  --mscale-all-dim 1.0
  --normalization RMSNorm
  --norm-epsilon 1e-6
  --swiglu
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --position-embedding-type rope
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --init-method-std 0.008
  --vocab-size "$(shrink 129280 256)"
  --mtp-num-layers 1
  --mtp-loss-scaling-factor 0.1
)
MOE_ARGS=(
  --num-experts "$(shrink 256 8)"
  --moe-layer-freq "([0]*$DENSE+[1]*$((LAYERS - DENSE)))"
  --moe-ffn-hidden-size "$(shrink 2048 32)"
  --moe-shared-expert-intermediate-size "$(shrink 2048 32)"
  --moe-router-topk "$(shrink 8 4)"
  --moe-router-score-function sigmoid
  --moe-router-enable-expert-bias
  --moe-router-bias-update-rate 1e-3
  --moe-router-topk-scaling-factor 2.5
  --moe-router-num-groups "$(shrink 8 4)"
  --moe-router-group-topk "$(shrink 4 2)"
  --moe-router-load-balancing-type seq_aux_loss
  --moe-aux-loss-coeff 1e-4
  --moe-router-dtype fp32
  --moe-token-dispatcher-type alltoall
  --moe-grouped-gemm
  --moe-permute-fusion
  --moe-shared-expert-overlap
)
TRAINING_ARGS=(
  --mock-data
  --micro-batch-size 1
  --global-batch-size "$(shrink 2048 4)"
  --train-iters "$TRAIN_ITERS"
  --lr 2.2e-4
  --min-lr 2.2e-5
  --lr-decay-style cosine
  --lr-warmup-iters 1
  --lr-decay-iters "$TRAIN_ITERS"
  --adam-beta1 0.9
  --adam-beta2 0.95
  --weight-decay 0.1
  --clip-grad 1.0
  --bf16
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --expert-model-parallel-size "$NPROC"
  --expert-tensor-parallel-size 1
  --context-parallel-size 1
  --recompute-granularity selective
  --recompute-modules mla_up_proj moe_act layernorm
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --log-interval 1
  --save "$OUT_DIR/deepseek_v3"
  --load "$OUT_DIR/deepseek_v3"
  --save-interval "$TRAIN_ITERS"
  --ckpt-format torch_dist
  --dist-ckpt-strictness log_all
)
launch "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${TRAINING_ARGS[@]}"
