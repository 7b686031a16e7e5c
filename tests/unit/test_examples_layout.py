"""The examples read as a course: each opens with its exact launch line, then "Step N:" for the
nine steps (01_hello ... 09_parameter_server, and sync_sgd.py, which users run by that name, in
its place); each step once, each about 120 lines at most."""

from __future__ import annotations

import ast
import re

from tests.entry_points import EXAMPLES

LAUNCH = re.compile(r"# (?:mpiexec -n \d+ )?python examples/(\S+)( .*)?\n")


def docstring(path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_every_example_opens_with_its_own_launch_line():
    for path in sorted(EXAMPLES.glob("*.py")):
        first = path.read_text().splitlines(keepends=True)[0]
        m = LAUNCH.fullmatch(first)
        assert m and m.group(1) == path.name, f"{path.name} opens with {first!r}"


def test_the_steps_are_one_to_nine_each_once():
    steps = {}
    for path in sorted(EXAMPLES.glob("*.py")):
        m = re.match(r"Step (\d+): ", docstring(path))
        if m:
            steps.setdefault(int(m.group(1)), []).append(path.name)
    assert sorted(steps) == list(range(1, 10)) and all(len(v) == 1 for v in steps.values()), steps
    for step, (name,) in steps.items():
        assert name == "sync_sgd.py" or name.startswith(f"{step:02d}_"), f"step {step} is {name}"
    numbered = {p.name for p in EXAMPLES.glob("[0-9][0-9]_*.py")}
    assert numbered <= {name for (name,) in steps.values()}, "a numbered example that is no step"


def test_steps_are_short():
    for path in EXAMPLES.glob("*.py"):
        if re.match(r"Step \d+: ", docstring(path)):
            assert len(path.read_text().splitlines()) <= 120, path.name
