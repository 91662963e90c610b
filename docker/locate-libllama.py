"""Print the directory of the first libllama.so* in the root filesystem (build time, the base's Python).

The DLC's base image (Amazon Linux 2023) ships no findutils; Python is the one tool every supported base has.
Exits 1 with nothing printed when there is none. Skips pseudo filesystems and the image's own folders.
"""

import os
import sys

SKIP = {"/proc", "/sys", "/dev", "/opt/semif", "/src"}


def main(root: str = "/") -> int:
    root_dev = os.stat(root).st_dev
    skip = {os.path.join(root, s.lstrip("/")) for s in SKIP}
    hits = []
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs
            if os.path.join(top, d) not in skip and os.lstat(os.path.join(top, d)).st_dev == root_dev
        )
        hits += [os.path.join(top, f) for f in files if f == "libllama.so" or f.startswith("libllama.so.")]
    if not hits:
        return 1
    print(os.path.dirname(sorted(hits)[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
