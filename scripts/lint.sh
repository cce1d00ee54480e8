#!/usr/bin/env bash
# The format check and the linter, as CI runs them (.ci/run): ruff (lint + format, configured in
# pyproject.toml) and clang-format (.clang-format) over every tracked Python, C++ and CUDA file.
# Exit 1 on any finding. FIX=1 rewrites the files instead of checking them.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t cxx < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${FIX:-0}" = 1 ]; then
  ruff check --fix .
  ruff format .
  clang-format -i "${cxx[@]}"
  exit 0
fi
status=0
ruff check . || status=1
ruff format --check . || status=1
clang-format --dry-run --Werror "${cxx[@]}" || status=1
[ "$status" = 0 ] && echo "lint: ruff check, ruff format and clang-format found nothing"
exit "$status"
