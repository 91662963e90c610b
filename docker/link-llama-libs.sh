#!/bin/sh
# Build-time helper: expose the DLC's own llama.cpp shared libraries at a fixed path.
#
# llama-cpp-python loads <LLAMA_CPP_LIB_PATH>/libllama.so, and the engine loads ggml's backend plugins
# (libggml-cpu-*.so, libggml-cuda.so) from GGML_BACKEND_DIR. Both point at /opt/semif/llama-lib,
# which this script fills with symlinks to the directory that holds the DLC's libllama. Pass
# LLAMA_LIB_DIR to skip the search (see docs/deployment.md for how to list the libraries of a base).
set -eu

target="${SEMIF_LLAMA_LIB_TARGET:-/opt/semif/llama-lib}"  # overridable for tests
dir="${LLAMA_LIB_DIR:-}"

if [ -z "$dir" ]; then
    found=$(find / -xdev \( -path /proc -o -path /sys -o -path /opt/semif \) -prune -o \
        \( -name 'libllama.so' -o -name 'libllama.so.*' \) -print 2>/dev/null | sort | head -n 1)
    if [ -z "$found" ]; then
        echo "error: no libllama.so in the base image; is BASE_IMAGE a llama.cpp DLC? Set LLAMA_LIB_DIR." >&2
        exit 1
    fi
    dir=$(dirname "$found")
fi

if ! ls "$dir"/libllama.so* >/dev/null 2>&1; then
    echo "error: LLAMA_LIB_DIR=$dir holds no libllama.so*" >&2
    exit 1
fi

mkdir -p "$target"
for lib in "$dir"/libllama.so* "$dir"/libggml*.so*; do
    if [ -e "$lib" ]; then ln -sf "$lib" "$target/$(basename "$lib")"; fi
done
# llama-cpp-python opens exactly "libllama.so" and the engine "libggml.so"; a base that ships only the
# versioned names (libllama.so.0) still works.
for name in libllama libggml libggml-base; do
    if [ ! -e "$target/$name.so" ]; then
        versioned=$(find "$dir" -maxdepth 1 -name "$name.so.*" | sort | head -n 1)
        if [ -n "$versioned" ]; then ln -sf "$versioned" "$target/$name.so"; fi
    fi
done

echo "llama.cpp libraries from $dir:"
ls -l "$target"
