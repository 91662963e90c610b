"""Fixtures for the eval tests: the devset and a real local stand-in server (tests/helpers/evalserver.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from semif_adapter.eval.tasks import Task, load_tasks
from tests.helpers.evalserver import DEVSET, LocalServer, ServerState, oracle_logits, serve


@pytest.fixture(scope="session")
def devset() -> list[Task]:
    return load_tasks(DEVSET)


@pytest.fixture
def server(devset: list[Task]) -> Iterator[LocalServer]:
    state = ServerState(logits=oracle_logits(devset), tasks={t.id: t for t in devset})
    with serve(state) as running:
        yield running
