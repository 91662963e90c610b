"""What tests/image/harness.py built and started, handed to the image tests through the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.image import ImageUnderTest


@pytest.fixture(scope="session")
def under_test() -> ImageUnderTest:
    names = ("IMAGE", "CONTAINER", "URL", "MODEL_DIR", "BINDING", "BASE", "BASE_LIBS", "WORK_DIR")
    values = {name: os.environ.get(f"SEMIF_TEST_{name}", "") for name in names}
    missing = [f"SEMIF_TEST_{name}" for name, value in values.items() if not value]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not set: run these through tests/image/harness.py (make test-image)"
        )
    return ImageUnderTest(
        image=values["IMAGE"],
        container=values["CONTAINER"],
        url=values["URL"].rstrip("/"),
        model_dir=Path(values["MODEL_DIR"]),
        binding=values["BINDING"],
        base=values["BASE"],
        base_libs=Path(values["BASE_LIBS"]),
        work_dir=Path(values["WORK_DIR"]),
    )
