"""Fixtures the Dagster wiring tests share."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[DagsterInstance]:
    """A real (SQLite) instance under the test's own DAGSTER_HOME, closed after the test."""
    with DagsterInstance.get() as inst:
        yield inst
