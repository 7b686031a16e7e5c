"""The library's floors, read from its source: a lower floor never imports a higher one.

Every import counts, the ones inside functions too. A new module goes on the floor of what it
does (a parallelism strategy beside gradsync, a backend inside comm/); the docs' "How the code
is organised" (docs/contributing/architecture.md) says the same in words and draws FLOORS.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mpi_sgd"

# Bottom to top. A module may import its own floor and those below.
FLOORS = (
    # where a process sits, its launcher; results and their intervals; flags
    ("launch", "launchers", "refusal", "report", "confidence", "args", "cluster"),
    ("comm",),  # the seam and its backends and wrappers
    # built on the seam, or pure
    (
        "collectives",
        "timing",
        "datacache",
        "data",
        "models",
        "checkpoint",
        "amp",
        "perfmodel",
        "guide",
        "nonfinite",
        "lateverdict",
        "buckets",
        "bucketorder",
        "replicas",
        "noisescale",
        "lrschedule",
        "target",
        "preemption",
        "gcpause",
        "optimizers",
    ),
    ("gradsync", "pipeline", "paramserver", "zero"),  # parallelism strategies
    (
        "config",
        "step",
        "trainer",
        "agree",
        "convergence",
        "resumption",
        "metrics",
    ),  # one step, the training loop, and what its ranks must agree on
    ("calibrate",),  # measuring the machine with the trainer's own step
    ("bench", "faultmatrix", "jobdrills", "figures"),  # benchmarks, the fault matrix and its drills, the docs' figures
    ("cli",),  # the `mpi-sgd` entry point, the one module that may import bench
)
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def unit_of(path: Path) -> str:
    """mpi_sgd/comm/backends/mpi.py -> 'comm'; mpi_sgd/trainer.py -> 'trainer'."""
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


RELATIVE = re.compile(r"\.[a-z_]+(\.[a-z_]+)*")


def imported_names(tree: ast.AST) -> set[str]:
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


def imported_units(path: Path) -> set[str]:
    """The mpi_sgd units ``path`` imports, absolute or relative."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # ('mpi_sgd', 'comm')
    units = set()
    tree = ast.parse(path.read_text())
    if "importlib" in imported_names(tree):
        # Modules named to importlib as relative strings (cli.py's lazy command table) count too.
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and RELATIVE.fullmatch(node.value):
                units.add(node.value.lstrip(".").split(".")[0] if len(package) == 1 else package[1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package[: len(package) - node.level + 1]
                names = [".".join([*base, node.module] if node.module else base)]
                if not node.module:  # from . import x, y
                    names = [".".join([*base, alias.name]) for alias in node.names]
            else:
                names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "mpi_sgd" and len(parts) > 1:
                units.add(parts[1])
    return units


def test_every_module_has_a_floor():
    unknown = sorted({unit_of(p) for p in modules()} - set(FLOOR))
    assert not unknown, f"add {unknown} to FLOORS in {Path(__file__).name} (and to docs/contributing/architecture.md)"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_floor(path):
    mine = unit_of(path)
    above = sorted(u for u in imported_units(path) if FLOOR.get(u, -1) > FLOOR.get(mine, -1))
    assert not above, f"{path.relative_to(PACKAGE)} (floor {FLOOR.get(mine)}) imports {above} from a higher floor"


def test_only_the_cli_imports_bench():
    importers = sorted(
        str(p.relative_to(PACKAGE)) for p in modules() if unit_of(p) != "bench" and "bench" in imported_units(p)
    )
    assert importers == ["cli.py"]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_library_never_reaches_into_examples(path):
    # An installed package has no examples/ beside it; code naming that folder breaks there.
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    strings = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]
    assert not [s for s in strings if "examples" in s], "a path into examples/ in library code"
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "parents"], (
        "Path(__file__).parents: library code finding files outside the package"
    )


# Inside comm/, bottom to top: the errors and the rule of a split, which the seam is built on; the
# seam and the helpers that turn tensors into memory; the node-shared all-reduce; the backends (the
# mpi4py one uses shm/); the wrappers, which wrap any communicator and so never name a backend; the
# face, init(), which picks and stacks them.
COMM_FLOORS = (
    ("errors", "split"),
    ("base", "buffers", "gpu", "polling"),
    ("shm",),
    ("backends",),
    ("wrappers",),
    ("__init__",),
)
COMM_FLOOR = {room: level for level, rooms in enumerate(COMM_FLOORS) for room in rooms}
COMM = PACKAGE / "comm"


def comm_room(path: Path) -> str:
    """mpi_sgd/comm/backends/mpi.py -> 'backends'; mpi_sgd/comm/base.py -> 'base'."""
    parts = path.relative_to(COMM).with_suffix("").parts
    return parts[0]


def imported_modules(path: Path) -> set[str]:
    """Every mpi_sgd module ``path`` imports, as a dotted name (``from . import x`` names x)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    if path.name == "__init__.py":
        package = path.relative_to(PACKAGE.parent).parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module
            # `from pkg import sub` imports the module pkg.sub (pkg itself only as its parent, as any
            # import does); `from mod import name` imports mod.
            subs = {f"{mod}.{a.name}" for a in node.names} & MODULES
            out |= subs if len(subs) == len(node.names) else {mod} | subs
    return {m for m in out if m.split(".")[0] == "mpi_sgd"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def comm_modules() -> list[Path]:
    return sorted(COMM.rglob("*.py"))


def test_comm_is_split_into_rooms_by_role():
    rooms = sorted(p.name for p in COMM.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert rooms == ["backends", "shm", "wrappers"]
    unknown = sorted({comm_room(p) for p in comm_modules()} - set(COMM_FLOOR))
    assert not unknown, f"add {unknown} to COMM_FLOORS in {Path(__file__).name}"


@pytest.mark.parametrize("path", comm_modules(), ids=lambda p: str(p.relative_to(COMM)))
def test_no_comm_module_imports_a_higher_room(path):
    mine = COMM_FLOOR[comm_room(path)]
    above = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[:2] != ["mpi_sgd", "comm"]:
            continue
        room = parts[2] if len(parts) > 2 else "__init__"
        if room in COMM_FLOOR and COMM_FLOOR[room] > mine and not (room == "__init__" and len(parts) > 3):
            above.add(room)
    assert not above, f"comm/{path.relative_to(COMM)} imports {sorted(above)} from a higher room"


def test_no_import_circle():
    # Modules as nodes, every import an edge (those inside functions too): a circle means two
    # modules that can only be understood together, and an import order that works by luck.
    names = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in imported_modules(path) if m in names and m != name} for name, path in names.items()}
    # A package's face importing its own submodules is the one allowed direction; a submodule
    # importing its package face back is the circle this test is for.
    state, circles = {}, []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_floors_check_sees_imports():
    # The checks above could pass by reading nothing; they must see what is really there.
    assert imported_units(PACKAGE / "cli.py") >= {"args", "bench"}
    assert "comm" in imported_units(PACKAGE / "comm" / "backends" / "torch_dist.py")  # from ..base import
    assert "mpi_sgd.comm.backends" in imported_modules(PACKAGE / "comm" / "backends" / "torch_dist.py")
    assert {"launch", "comm"} <= imported_units(PACKAGE / "comm" / "__init__.py")
    assert "trainer" in imported_units(PACKAGE / "calibrate" / "measure.py")  # an import inside a function
