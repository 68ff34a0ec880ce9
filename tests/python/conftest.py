"""Shared setup for the Python tests: the package and tests/python on sys.path, so tests and the
rank processes dist_harness starts import the same modules."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture
def hybridplan_cli() -> str:
    """The built `hybridplan` command ($HYBRIDPLAN_CLI, else build/bin/hybridplan); the test is
    skipped when it is not built."""
    path = os.environ.get("HYBRIDPLAN_CLI", os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                         "build", "bin", "hybridplan"))
    if not os.path.exists(path):
        pytest.skip(f"the hybridplan CLI is not built at {path} (make build)")
    return path
