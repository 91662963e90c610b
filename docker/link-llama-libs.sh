#!/bin/sh
# Build-time helper: expose the DLC's own llama.cpp shared libraries at a fixed path.
#
# llama-cpp-python loads <LLAMA_CPP_LIB_PATH>/libllama.so, and the engine loads ggml's backend plugins
# (libggml-cpu-*.so, libggml-cuda.so) from GGML_BACKEND_DIR. Both point at /opt/semif/llama-lib, which this
# script fills with symlinks into LLAMA_LIB_DIR, the directory check-base.sh found (or was given). Only shell
# globs and coreutils: the DLC's base has no findutils.
set -eu

target="${SEMIF_LLAMA_LIB_TARGET:-/opt/semif/llama-lib}"  # overridable for tests
dir="${LLAMA_LIB_DIR:-}"

if [ -z "$dir" ]; then
    echo "error: LLAMA_LIB_DIR is not set (docker/check-base.sh finds it and writes it to base.env)" >&2
    exit 1
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
# versioned names (libllama.so.0) still works: the first versioned name in glob (sorted) order is linked.
for name in libllama libggml libggml-base; do
    if [ ! -e "$target/$name.so" ]; then
        for versioned in "$dir/$name".so.*; do
            if [ -e "$versioned" ]; then
                ln -sf "$versioned" "$target/$name.so"
                break
            fi
        done
    fi
done

echo "llama.cpp libraries from $dir:"
ls -l "$target"
