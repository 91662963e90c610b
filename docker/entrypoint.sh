#!/bin/sh
# Container entrypoint. SageMaker starts containers as `docker run IMAGE serve`; `docker run IMAGE` does the
# same. Any other command runs as given (e.g. `docker run IMAGE python -m semif_adapter --help`).
set -eu

if [ "$#" -eq 0 ] || [ "$1" = "serve" ]; then
    [ "$#" -gt 0 ] && shift
    exec python -m semif_adapter serve "$@"
fi
exec "$@"
