"""The Python package's layers: every module imports only what stands on a lower layer (or in its
own part of the package), so no import runs back up and no two parts import each other; and no
module imports another part's private names. Read from the source (every import, those inside
functions included), so the test needs neither torch nor the compiled planner and takes well
under a second."""

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "hybridplan"

# The package's parts (its top-level modules and subpackages), lowest layer first. A part may
# import the parts on the layers below its own, and none on its own layer or above. "__init__"
# is the package's face: it imports nothing itself (it loads the public names lazily).
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("__init__", "_C", "files", "factories", "models", "net", "datasets", "plot", "schedules",
     "autograd"),
    ("planner",),
    ("pipedream", "trace", "trainers", "gradient_noise", "profiler"),
    ("executor", "hand_plans"),
    ("convergence", "front_door"),
    ("measure",),
    ("__main__",),
)
LAYER = {part: i for i, layer in enumerate(LAYERS) for part in layer}

# Imports that still run back up, each with why it stands and where it goes. The test fails
# once one is gone, so that its entry goes with it.
PENDING: Dict[Tuple[str, str], str] = {}


def _part_of(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _modules() -> Iterator[Tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE), ast.parse(path.read_text(), str(path))


def _imports(rel: Path, tree: ast.Module) -> Iterator[Tuple[int, str, str, str]]:
    """(line, imported part, imported module, name or "") for each import of the package; the
    names a `from` import takes from the package's face are parts themselves (submodules)
    unless they are dunder names (`__version__`: the face's)."""
    package = ["hybridplan", *rel.parts[:-1]]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                dotted = alias.name.split(".")
                if dotted[0] == "hybridplan":
                    yield node.lineno, dotted[1] if len(dotted) > 1 else "__init__", alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = (package[:len(package) - node.level + 1] if node.level else [])
            base += node.module.split(".") if node.module else []
            if base[0] != "hybridplan":
                continue
            for alias in node.names:
                if len(base) > 1:
                    yield node.lineno, base[1], ".".join(base), alias.name
                elif alias.name.startswith("__"):
                    yield node.lineno, "__init__", "hybridplan", alias.name
                else:
                    yield node.lineno, alias.name, f"hybridplan.{alias.name}", ""


def test_every_part_of_the_package_stands_on_one_layer():
    parts = {_part_of(rel) for rel, _ in _modules()}
    unplaced = sorted(parts - set(LAYER))
    assert not unplaced, f"place {unplaced} on a layer of LAYERS (what each imports decides where)"
    gone = sorted(set(LAYER) - parts - {"_C"})  # _C: the compiled planner, once built
    assert not gone, f"LAYERS names parts that no longer exist: {gone}"
    assert len(LAYER) == sum(map(len, LAYERS)), "a part stands on two layers"


def test_no_import_runs_back_up_or_across_a_layer():
    upward: List[str] = []
    pending_seen = set()
    for rel, tree in _modules():
        part = _part_of(rel)
        for line, target, module, _ in _imports(rel, tree):
            if target == part or target not in LAYER or part not in LAYER:
                continue  # an unplaced part: the test above names it
            if LAYER[target] < LAYER[part]:
                continue
            if (part, module) in PENDING:
                pending_seen.add((part, module))
                continue
            upward.append(f"{rel}:{line} imports {module} ({target}, layer {LAYER[target]}) "
                          f"from {part} (layer {LAYER[part]})")
    assert not upward, ("imports that run back up or across a layer; move what both sides "
                        "need below both:\n" + "\n".join(upward))
    stale = sorted(set(PENDING) - pending_seen)
    assert not stale, f"no longer imported, remove from PENDING: {stale}"


def test_no_private_name_is_imported_from_another_part():
    private = [f"{rel}:{line} imports {name} from {module}"
               for rel, tree in _modules()
               for line, target, module, name in _imports(rel, tree)
               if name.startswith("_") and not name.startswith("__")
               and target != _part_of(rel)]
    assert not private, ("private names taken from another part of the package; make the name "
                         "public where it is defined:\n" + "\n".join(private))


def test_the_scan_sees_an_import_that_runs_back_up():
    # the rules above are only as good as _imports' resolution of relative imports
    tree = ast.parse("def f():\n    from ..executor.recompute import saves\n"
                     "from .. import planner, __version__\nimport hybridplan.measure\n")
    found = [(target, module, name)
             for _, target, module, name in _imports(Path("profiler/x.py"), tree)]
    assert found == [("planner", "hybridplan.planner", ""), ("__init__", "hybridplan",
                                                             "__version__"),
                     ("measure", "hybridplan.measure", ""),
                     ("executor", "hybridplan.executor.recompute", "saves")]
