#!/usr/bin/env bash
# CI: every C++ and CUDA source tracked by git is as clang-format (.clang-format) writes it.
# Prints each file that differs and how to fix it; exit 1 when any does.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-format > /dev/null || { echo "check_format: clang-format is not installed (make deps installs it)" >&2; exit 1; }
bad=0
while IFS= read -r f; do
  if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then
    echo "check_format: $f is not formatted: run clang-format -i $f"
    bad=$((bad + 1))
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
[ $bad -eq 0 ] && echo "check_format: every source file is formatted" || exit 1
