"""Shared setup for the Python tests: the package and tests/python on sys.path, so tests and the
rank processes dist_harness starts import the same modules."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)
