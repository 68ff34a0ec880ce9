"""Shared setup for the Python tests: the package and tests/python on sys.path, so tests and the
rank processes dist_harness starts import the same modules; the `full` marker.

`full` marks the cases of a long matrix that `make test` leaves out (`-m "not full"`: they show
as deselected) and `make test-full` (which `make bench` runs) runs (`-m full`): every model of the
zoo under every plan kind, 4-rank variants, more launches. Each such matrix keeps a reduced form
in `make test`: one case per plan kind and every model at least once. A fixture that trains all
of a module's cases in one launch trains those the run selected (`selected_cases`)."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full: a case of a long matrix run by `make test-full` (and `make bench`), "
                   "not by `make test` (-m \"not full\"); conftest.py says more")


@pytest.fixture(scope="module")
def selected_cases(request):
    """f(test, *argnames) -> [tuple of those parametrize arguments of `test` (a test function
    of the requesting module; () where it takes none)] for each of its tests this run selected
    (after -m, -k and node ids), in collection order: what a module fixture that runs every
    case in one launch runs. [] when none of them is selected."""
    def cases(test, *argnames):
        return [tuple(item.callspec.params[a] for a in argnames) if argnames else ()
                for item in request.session.items
                if getattr(item, "module", None) is request.module
                and getattr(item, "originalname", None) == test]
    return cases


@pytest.fixture
def hybridplan_cli() -> str:
    """The built `hybridplan` command ($HYBRIDPLAN_CLI, else build/bin/hybridplan); the test is
    skipped when it is not built."""
    path = os.environ.get("HYBRIDPLAN_CLI", os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                         "build", "bin", "hybridplan"))
    if not os.path.exists(path):
        pytest.skip(f"the hybridplan CLI is not built at {path} (make build)")
    return path
