"""Shared fixtures of the test suite."""

from __future__ import annotations

from typing import Iterator, List

import pytest

from tests.agent import Agent


@pytest.fixture
def agents() -> Iterator[List[Agent]]:
    """A list to put :class:`tests.agent.Agent` runs in; every one still running is killed at the end."""
    made: List[Agent] = []
    yield made
    for a in made:
        a.close()
