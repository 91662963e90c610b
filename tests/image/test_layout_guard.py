"""The build refuses a base whose llama.cpp lays out a by-value struct differently from the bindings."""

from __future__ import annotations

import re

from conftest import ImageUnderTest
from imagectl import podman

from scripts.test_image import podman_build


def test_older_llama_cpp_base_fails_the_build_naming_llama_model_params(under_test: ImageUnderTest) -> None:
    """llama-cpp-python 0.3.35's llama.cpp has no ``lazy_mode`` in llama_model_params (72 bytes, not 80)."""
    log_path = under_test.work_dir / "build-old-base.log"
    tag = "localhost/semif-adapter:image-test-old-base"
    podman("rmi", "--force", "--ignore", tag)
    build = podman_build(under_test.old_context, under_test.old_base, tag, log_path)
    text = log_path.read_text(errors="replace")
    assert build.returncode != 0, f"the build on {under_test.old_base} succeeded; log: {log_path}"
    # the layout proof (scripts/llama_abi.py verify) stops it, naming struct, field and both offsets
    errors = [line for line in text.splitlines() if "struct layout mismatch" in line]
    assert errors, f"the build failed before the layout proof; log: {log_path}"
    named = r"llama_model_params: field '\w+' at offset \d+ in llama.h but \d+ in binding"
    assert re.search(named, errors[0]), errors[0]
    assert podman("image", "exists", tag, check=False).returncode != 0, "a refused build left an image"
