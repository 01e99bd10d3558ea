#!/usr/bin/env bash
# The shrunken Megatron-LM recipes of examples/megatron/ under mpirun on CPU ranks, each with every
# option its script passes: three steps that save into the directory they --load (empty at
# first: Megatron-LM's rule starts the run fresh), then two more that resume from it.
# Usage: run_recipes.sh TANDEM_BINARY [recipe ...]
set -uo pipefail
export TANDEM=$1; shift
here=$(cd "$(dirname "$0")/../../examples/megatron" && pwd)
recipes=("$@"); [ ${#recipes[@]} -gt 0 ] || recipes=(llama3_8b mixtral_8x7b qwen3_30b_a3b deepseek_v3)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1 SHRINK=1 NPROC=2
failed=0
for r in "${recipes[@]}"; do
  out=$(mktemp -d)
  log=$out/log
  if ! OUT_DIR=$out TRAIN_ITERS=3 bash "$here/$r.sh" > "$log" 2>&1; then
    echo "FAILED: $r (first run)"; tail -20 "$log"; failed=1; continue
  fi
  grep -q "holds no checkpoint yet" "$log" || { echo "FAILED: $r did not start fresh"; cat "$log"; failed=1; }
  if ! OUT_DIR=$out TRAIN_ITERS=5 bash "$here/$r.sh" > "$log.2" 2>&1; then
    echo "FAILED: $r (resumed run)"; tail -20 "$log.2"; failed=1; continue
  fi
  grep -q "resumed from .*iter_0000003 at iteration 3" "$log.2" || { echo "FAILED: $r did not resume"; cat "$log.2"; failed=1; }
  steps="$(grep -c '^iter ' "$log") + $(grep -c '^iter ' "$log.2")"
  [ "$steps" = "3 + 2" ] || { echo "FAILED: $r logged $steps steps, not 3 + 2"; cat "$log" "$log.2"; failed=1; }
  echo "ok: $r: $steps steps logged"
  rm -rf "$out"
done
exit $failed
