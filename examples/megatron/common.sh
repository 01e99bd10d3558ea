# Shared by the recipe scripts beside it: how tandem is launched, and the shrunken sizes.
#   TANDEM    the program (default: build/tandem of this checkout)
#   NPROC     ranks; more than 1 runs under mpirun (default 2)
#   DEVICE    cpu or cuda (default cpu)
#   SHRINK=1  the model at a few layers and a small width, for a quick check (the recipes' CI
#             runs); 0 keeps the published sizes
#   TRAIN_ITERS, OUT_DIR
# Each recipe lists its options as Megatron-LM's script does, in arrays; tandem takes them all
# (docs/megatron.md).
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TANDEM=${TANDEM:-$HERE/../../build/tandem}
NPROC=${NPROC:-2}
DEVICE=${DEVICE:-cpu}
SHRINK=${SHRINK:-1}
TRAIN_ITERS=${TRAIN_ITERS:-3}
OUT_DIR=${OUT_DIR:-$(mktemp -d)}
launch() {
  if [ "$NPROC" -gt 1 ]; then
    mpirun --oversubscribe ${MPI_EXTRA:-} -np "$NPROC" "$TANDEM" train --device "$DEVICE" "$@"
  else
    "$TANDEM" train --device "$DEVICE" "$@"
  fi
}
# shrink PUBLISHED SMALL: the size a shrunken run uses.
shrink() { if [ "$SHRINK" = 1 ]; then echo "$2"; else echo "$1"; fi; }
