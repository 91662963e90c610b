"""Build-time check: the venv's llama-cpp-python must be bindings only (the image uses the base's libllama).

A wheel that carries its own libllama/libggml would be loaded instead of the DLC's and silently bypass the
layout probe. Python instead of ``find`` because the DLC's base (Amazon Linux 2023) has no findutils.
"""

import pathlib
import sys


def main(venv: str) -> int:
    bundled = sorted(
        str(p) for p in pathlib.Path(venv).rglob("lib*.so*") if p.name.startswith(("libllama", "libggml"))
    )
    if bundled:
        print(
            "error: the llama-cpp-python wheel carries its own llama.cpp "
            f"({', '.join(bundled[:3])}); it must be bindings only (make image-context builds that wheel)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
