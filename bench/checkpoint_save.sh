#!/usr/bin/env bash
# Times saving a multi-GB checkpoint under mpirun on CPU ranks: the same one-step run saved by
# rank 0 alone (the default) and by every rank writing its own shards
# (--ckpt-fully-parallel-save, Note [Fully parallel save] in src/runtime/checkpoint_parallel.cc).
# Prints tandem's figures for each: the whole save's bytes and seconds, and each writing rank's.
#
#   bash bench/checkpoint_save.sh                      # 4 ranks, PP2 x EP2, ~5 GB a checkpoint
#   NP=2 LAYOUT="--pipeline-model-parallel-size 2" bash bench/checkpoint_save.sh
#
# TANDEM (build/tandem), NP (4), LAYOUT, MODEL and DIR (where the checkpoints go, removed after
# each save; default a new directory under /tmp) may be set.
set -euo pipefail
TANDEM=${TANDEM:-build/tandem}
NP=${NP:-4}
LAYOUT=${LAYOUT:-"--pipeline-model-parallel-size 2 --expert-model-parallel-size 2"}
# 430M parameters: 1.7 GB of f32 weights and 3.4 GB of Adam moments.
MODEL=${MODEL:-"--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --num-query-groups 8 \
--ffn-hidden-size 2048 --num-experts 8 --seq-length 16 --micro-batch-size 1 --global-batch-size 4"}
DIR=${DIR:-$(mktemp -d /tmp/tandem_ckpt_bench.XXXXXX)}
MPIRUN=${MPIRUN:-"mpirun --oversubscribe --allow-run-as-root --bind-to none"}

for mode in rank0 parallel; do
  flags=""
  if [ "$mode" = parallel ]; then flags="--ckpt-fully-parallel-save"; fi
  echo "== $mode: $MPIRUN -np $NP $TANDEM train $MODEL $LAYOUT --train-iters 1 --save DIR $flags"
  # shellcheck disable=SC2086
  OPENBLAS_NUM_THREADS=1 $MPIRUN -np "$NP" "$TANDEM" train $MODEL $LAYOUT --train-iters 1 \
    --comm-timeout 600 --save "$DIR/$mode" $flags | grep "tandem train:.*\(saved\|wrote\)"
  echo "files: $(find "$DIR/$mode/iter_0000001" -type f | wc -l), \
bytes: $(du -sb "$DIR/$mode/iter_0000001" | cut -f1)"
  rm -rf "${DIR:?}/$mode"
done
rmdir "$DIR" 2>/dev/null || true
