"""The library's floors, read from its source: a lower floor never imports a higher one.

Every import counts, the ones inside functions too. A new module goes on the floor of what it
does (a parallelism strategy beside gradsync, a backend inside comm/); the README's "How the code
is organised" says the same in words.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mpi_sgd"

# Bottom to top. A module may import its own floor and those below.
FLOORS = (
    ("launch", "report", "args", "cluster"),  # where a process sits and on which hosts; results; flags
    ("comm",),  # the seam and its backends and wrappers
    # built on the seam, or pure
    ("collectives", "timing", "data", "models", "checkpoint", "amp", "perfmodel", "guide", "nonfinite"),
    ("gradsync", "pipeline", "paramserver", "zero"),  # parallelism strategies
    ("config", "step", "trainer", "agree"),  # one step, the training loop, and what its ranks must agree on
    ("calibrate",),  # measuring the machine with the trainer's own step
    ("bench", "faultmatrix"),  # benchmarks and the fault matrix: jobs started and measured
    ("cli",),  # the `mpi-sgd` entry point, the one module that may import bench
)
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def unit_of(path: Path) -> str:
    """mpi_sgd/comm/mpi.py -> 'comm'; mpi_sgd/trainer.py -> 'trainer'."""
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
    assert not unknown, f"add {unknown} to FLOORS in {Path(__file__).name} (and to the README's layout)"


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


def test_the_floors_check_sees_imports():
    # The checks above could pass by reading nothing; they must see what is really there.
    assert imported_units(PACKAGE / "cli.py") >= {"args", "bench"}
    assert "comm" in imported_units(PACKAGE / "comm" / "torch_dist.py")  # from . import TORCH_BACKENDS
    assert {"launch", "comm"} <= imported_units(PACKAGE / "comm" / "__init__.py")
    assert "trainer" in imported_units(PACKAGE / "calibrate" / "measure.py")  # an import inside a function
