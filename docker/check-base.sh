#!/bin/sh
# Build-time check of every assumption the image makes about its base, run first in the builder stage.
#
#   check-base.sh <context.json of the wheelhouse> <plugin prefix: libggml-cpu | libggml-cuda> <out env file>
#
# - Python: $PYTHON if given, else python3.12, else the highest python3.N on PATH, else python3; its
#   major.minor must be the one the wheelhouse was prepared for, and its machine the wheelhouse's.
# - libllama: in $LLAMA_LIB_DIR if given, else the first libllama.so* in the root filesystem (locate-libllama.py);
#   libggml-base and the backend plugin(s) must sit in the same directory (GGML_BACKEND_DL layout).
# Each failure is one line saying what was found. On success the findings go to <out env file> (sourced by
# the later steps) and are printed.
set -eu

context="$1"
plugin="$2"
out="$3"

fail() {
    echo "error: base image check: $*" >&2
    exit 1
}

[ -f "$context" ] || fail "no $context in the build context; prepare it first: make image-context (semif-ops image context)"
want_python=$(sed -n 's/.*"python": *"\([0-9.]*\)".*/\1/p' "$context")
want_arch=$(sed -n 's/.*"arch": *"\([^"]*\)".*/\1/p' "$context")

python="${PYTHON:-}"
if [ -z "$python" ]; then
    if command -v python3.12 >/dev/null 2>&1; then
        python=python3.12
    else
        python=$(for dir in $(echo "$PATH" | tr ':' ' '); do ls "$dir" 2>/dev/null; done \
            | grep -E '^python3\.[0-9]+$' | sort -t. -k2 -n -u | tail -n 1)
        python="${python:-python3}"
    fi
fi
python_path=$(command -v "$python" 2>/dev/null) || fail "no Python interpreter '$python' on PATH ($PATH)"
have_python=$("$python_path" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$have_python" = "$want_python" ] \
    || fail "Python at $python_path is $have_python but the wheelhouse is for $want_python; run: make image-context IMAGE_PYTHON=$have_python"
"$python_path" -c 'import venv' 2>/dev/null || fail "Python at $python_path has no venv module"
have_arch=$(uname -m)
[ "$have_arch" = "$want_arch" ] \
    || fail "the base is $have_arch but the wheelhouse is for $want_arch; run: make image-context IMAGE_ARCH=$have_arch"

dir="${LLAMA_LIB_DIR:-}"
if [ -z "$dir" ]; then
    # The DLC's base (Amazon Linux 2023) has no findutils: the base's own Python walks the root filesystem.
    dir=$("$python_path" "$(dirname "$0")/locate-libllama.py") \
        || fail "no libllama.so anywhere in the base; is BASE_IMAGE a llama.cpp DLC? (or set LLAMA_LIB_DIR)"
fi
ls "$dir"/libllama.so* >/dev/null 2>&1 || fail "LLAMA_LIB_DIR=$dir holds no libllama.so*"
listing=$(cd "$dir" && ls | grep -E '^lib(llama|ggml)' | tr '\n' ' ')
ls "$dir"/libggml-base.so* >/dev/null 2>&1 || fail "no libggml-base.so* beside libllama in $dir (found: $listing)"
ls "$dir"/"$plugin"*.so >/dev/null 2>&1 \
    || fail "no ggml backend plugin $plugin*.so beside libllama in $dir (found: $listing); the image expects a GGML_BACKEND_DL=ON build"

{
    echo "PYTHON=$python_path"
    echo "LLAMA_LIB_DIR=$dir"
} > "$out"
echo "base: Python $have_python at $python_path, $have_arch, llama.cpp libraries in $dir: $listing"
