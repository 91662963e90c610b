#!/bin/sh
# Build-time guard for the final stage: the serving image must carry no compiler toolchain.
set -eu
status=0
for tool in gcc g++ cc c++ clang clang++ cmake make nvcc; do
    if command -v "$tool" >/dev/null 2>&1; then
        echo "error: compiler/build tool '$tool' present in the final image ($(command -v "$tool"))" >&2
        status=1
    fi
done
exit "$status"
