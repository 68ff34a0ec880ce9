"""The road from a plan to a running job, traced: one hybridplan.parallelize call and one step on
one process (the graph already cached, so the call plans and applies only), with every Python
call inside the hybridplan package recorded (sys.setprofile) and the plan's serialisations
counted. Prints, for the code checked out where this script lies:

  modules entered       hybridplan modules that ran during the call
  module pairs crossed  pairs of modules that called each other in both directions (A -> B and
                        B -> A) during the call (a callback or a class's roles in two modules
                        count too), and pairs of the modules entered that import each other
  edges                 distinct caller module -> callee module pairs
  plan handling         json.dumps / json.loads of a whole plan, deep copies, the core's plan
                        validation and search, broadcasts (tests/python/test_plan_object.py's
                        counters, which the test holds at 1 parse and 0 broadcasts)
  largest class         the longest class in the executor package, and its line count

    python bench/trace_parallelize.py [--checkout DIR] [--json OUT]

--checkout traces another checkout's package (DIR/python, its hybridplan._C built or copied in)
with this checkout's counters: the same measure before and after a restructure. The executor's
layout is documented in docs/design.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _checkout() -> Path:
    if "--checkout" in sys.argv:
        return Path(sys.argv[sys.argv.index("--checkout") + 1]).resolve()
    return HERE


ROOT = _checkout()  # the package traced; the counters are always this checkout's
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(HERE / "tests" / "python"))

import torch  # noqa: E402


def imports_of(package: Path) -> dict:
    """module -> the hybridplan modules it imports (at its top or inside functions), by name
    relative to the package ("executor.recipe")."""
    out = {}
    for path in package.rglob("*.py"):
        name = str(path.relative_to(package))[:-3].replace(os.sep, ".")
        parts = name.split(".")
        targets = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # annotations only: not an import at run time
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package upwards
                    base = parts[:-1] if not name.endswith("__init__") else parts[:-1]
                    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    stem = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.startswith("hybridplan"):
                    stem = node.module[len("hybridplan"):].lstrip(".")
                else:
                    continue
                for alias in node.names:  # "from . import x" names a module x
                    targets.add(f"{stem}.{alias.name}".lstrip(".") if not node.module
                                else stem)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("hybridplan."):
                        targets.add(alias.name[len("hybridplan."):])
        out[name] = {t for t in targets if t and t != name}
    return out


def largest_class(package: Path):
    best = ("", 0)
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > best[1]:
                    best = (f"{path.relative_to(ROOT)}:{node.name}", size)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", help="the checkout whose package is traced (default: this one)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    try:
        from test_plan_object import count_plan_handling, _parallelize
    except ImportError as e:
        sys.exit(f"trace_parallelize: tests/python/test_plan_object.py is needed ({e})")
    torch.set_num_threads(1)
    package = str(ROOT / "python" / "hybridplan")
    entered = set()
    edges = defaultdict(int)

    def module_of(frame):
        name = frame.f_code.co_filename
        if not name.startswith(package):
            return None
        return os.path.relpath(name, package)[:-3].replace(os.sep, ".")

    def profiler(frame, event, arg):
        if event != "call":
            return
        callee = module_of(frame)
        if callee is None:
            return
        entered.add(callee)
        caller = frame.f_back
        while caller is not None and module_of(caller) is None:
            caller = caller.f_back  # through torch's frames to the hybridplan code above
        if caller is not None and module_of(caller) != callee:
            edges[(module_of(caller), callee)] += 1

    with tempfile.TemporaryDirectory() as cache:
        hp, x, y = _parallelize(Path(cache))  # profiles and caches the graph
        hp.close()
        counts = count_plan_handling()
        sys.setprofile(profiler)
        try:
            hp, x, y = _parallelize(Path(cache))
            hp.step(*hp.shard(x, y))
            hp.close()
        finally:
            sys.setprofile(None)
    both = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
    imports = imports_of(ROOT / "python" / "hybridplan")
    static_both = sorted({tuple(sorted((a, b))) for a in entered for b in imports.get(a, ())
                          if b in entered and a in imports.get(b, ())})
    cls, size = largest_class(ROOT / "python" / "hybridplan" / "executor")
    figures = {"modules_entered": len(entered), "edges": len(edges),
               "pairs_crossed_both_ways": len(both), "pairs": [" <-> ".join(b) for b in both],
               "pairs_importing_each_other": len(static_both),
               "import_pairs": [" <-> ".join(b) for b in static_both],
               "plan_handling": dict(counts), "largest_executor_class": cls,
               "largest_executor_class_lines": size}
    print(f"modules entered: {len(entered)}")
    print(f"caller -> callee module edges: {len(edges)}")
    print(f"module pairs crossed both ways: {len(both)}")
    for pair in figures["pairs"]:
        print(f"  {pair}")
    print(f"module pairs that import each other (top or inside functions): {len(static_both)}")
    for pair in figures["import_pairs"]:
        print(f"  {pair}")
    print(f"plan handling: {dict(counts)}")
    print(f"largest class in the executor: {cls} ({size} lines)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
