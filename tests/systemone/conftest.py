"""The System One tests' HTTP client on the shared live gemma server (``live_server``, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest


@pytest.fixture(scope="session")
def s1(live_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=120) as client:
        yield client
