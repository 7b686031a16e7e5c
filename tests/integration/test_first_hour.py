"""What a new user meets first, run the way they run it: the scripts the documentation shows, copied
out of its pages and launched at the ranks their first line says. (A script whose page also shows
its output, as a session, is run by tests/integration/test_docs_commands.py, which reads that output.)"""

from __future__ import annotations

import re

import pytest

from tests import pages

from .conftest import run_mpi

ENV = {"OMP_NUM_THREADS": "1"}
LAUNCH = re.compile(r"# mpiexec -n (\d+) python (\S+)\n")


def docs_scripts() -> dict[str, tuple[int, str, str]]:
    """Every ```python block of the pages, opening with its launch line: file -> (ranks, code, page)."""
    scripts = {}
    for page in pages.pages():
        # what tests/integration/test_docs_commands.py runs in make test: bash blocks and sessions, not slow
        run_there = {
            c for b in pages.blocks(page) if (b.lang == "bash" or b.is_session) and not b.slow for c in b.commands()
        }
        for block in pages.blocks(page):
            if block.lang != "python":
                continue
            code = "\n".join(block.lines) + "\n"
            launch = LAUNCH.match(code)
            assert launch, f"{block.id}: a python block that does not open with its launch line"
            if code.splitlines()[0][2:] not in run_there:
                scripts[launch.group(2)] = (int(launch.group(1)), code, pages.name(page))
    return scripts


SCRIPTS = docs_scripts()


def test_the_own_script_page_has_a_script_and_a_trainer_script():
    own = {name for name, (_, _, page) in SCRIPTS.items() if page == "docs/use/own-script.md"}
    assert own == {"my_sgd.py", "my_trainer.py"}, SCRIPTS.keys()
    code = SCRIPTS["my_sgd.py"][1]
    for piece in ("nn.Module", "broadcast_parameters", "gradsync.make", "accumulate", "loss_scale", ".wait()"):
        assert piece in code, piece


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_docs_script_runs_as_written(name, tmp_path):
    ranks, code, _ = SCRIPTS[name]
    (tmp_path / name).write_text(code)  # verbatim, run from a folder of its own as a user would
    out = run_mpi(ranks, str(tmp_path / name), env=ENV).stdout
    if name == "my_sgd.py":
        losses = [float(v) for v in re.findall(r"^epoch \d+  loss (\S+)$", out, re.M)]
        assert len(losses) == 5 and losses[-1] < 0.1 * losses[0], out  # it learns (0.89 -> 0.012 measured)
    elif name == "my_trainer.py":
        assert float(re.search(r"held-out accuracy (\S+)", out).group(1)) > 0.9, out
    elif name == "pipe.py":  # printed by the last stage only; the step is the unsplit model's, so it learns
        losses = [float(v) for v in re.findall(r"^step \d+  loss (\S+)$", out, re.M)]
        assert len(losses) == 3 and losses[0] > losses[1] > losses[2], out
    elif name == "ddp_over_mpi.py":
        assert out.split() == [str(float(ranks * (ranks - 1) // 2))], out
    elif name == "seam.py":
        # 1 + 2 + ... + R, and the mean of the ranks 0 .. R-1
        assert out.split() == [str(float(ranks * (ranks + 1) // 2)), str((ranks - 1) / 2)], out
