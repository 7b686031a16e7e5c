"""Every flag of every entry point changes something: each is run and its effect checked.

The entry points (examples, ``mpi-sgd`` commands, ``python -m`` modules) are found from the tree
and their flags read from their own parsers, so a new entry point or flag without a probe in
``tests/flag_probes_*.py`` fails here. A probe runs the entry point in this process with the flag
set to a value other than its default and checks where that value went (:mod:`tests.flag_checks`):
the call that consumes it, what the run printed, or, for an ``mpi-sgd`` command, the configuration
its function is handed, which ``test_every_command_flag_is_read`` also finds read by that command.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from dataclasses import fields

import pytest

from tests.entry_points import entry_points, flags_of, run
from tests.flag_checks import BUILD_ONLY
from tests.flag_probes_commands import PROBES as COMMANDS
from tests.flag_probes_examples import PROBES as EXAMPLES

PROBES = EXAMPLES | COMMANDS


# -- the tests --------------------------------------------------------------------------------------
def write_inputs(tmp_path) -> None:
    """The files some probes read: a calibration (speedup --calibration), a hostfile (doctor), a run's metrics."""
    from mpi_sgd import perfmodel as pm
    from mpi_sgd.calibrate import Calibration, StepTiming, SweepPoint

    cal = Calibration(pm.Network(1e-6, 1e-10), "ring", StepTiming(0.01, 64, 1000, "mlp"), (SweepPoint(4, 2, 1, 1, 1),))
    cal.save(tmp_path / "c.json")
    (tmp_path / "hosts").write_text("x:2\ny:1\n")
    epochs = [{"b_noise": b, "noise": {"g2": 1.0, "trace": b}} for b in (30.0, 50.0)]  # speedup --metrics-json
    (tmp_path / "m.json").write_text(json.dumps({"epochs": epochs}))


def test_every_entry_point_has_probes():
    assert sorted(PROBES) == sorted(entry_points()), "an entry point without probes here, or probes of one gone"


@pytest.mark.parametrize("entry", entry_points())
def test_every_flag_has_a_probe_and_help(entry, monkeypatch):
    flags = flags_of(entry, monkeypatch)
    unprobed, gone = set(flags) - set(PROBES[entry].probes), set(PROBES[entry].probes) - set(flags)
    assert not unprobed and not gone, f"{entry}: flags without a probe {sorted(unprobed)}; gone {sorted(gone)}"
    assert all(action.help for action in flags.values()), f"{entry}: a flag without help"


CASES = [(entry, flag) for entry, spec in PROBES.items() for flag in spec.probes]


@pytest.mark.parametrize("entry, flag", CASES, ids=[f"{e} {f}" for e, f in CASES])
def test_flag_reaches_what_it_controls(entry, flag, monkeypatch, tmp_path):
    spec, p = PROBES[entry], PROBES[entry].probes[flag]
    write_inputs(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in [*(spec.base if p.base else []), *p.argv]]
    recorders = dict(spec.recorders)
    for check in p.checks:  # a call a check looks at is recorded, and made as usual
        target = getattr(check, "target", None)
        if target and target != "init" and not target.startswith("comm.") and target not in recorders:
            recorders[target] = "pass"
    monkeypatch.chdir(tmp_path)  # anything an entry point writes by default lands here
    r = run(entry, argv, monkeypatch, recorders, p.world)
    assert r.code in (None, 0), f"{entry} {' '.join(argv)} exited {r.code}:\n{r.err[-3000:]}"
    for check in p.checks:
        check(r)


def _reads(module, names: set[str], skip: ast.ClassDef | None) -> set[str]:
    tree = ast.parse(inspect.getsource(module))
    inside = {id(n) for n in ast.walk(skip)} if skip else set()
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in names and id(n) not in inside}


@pytest.mark.parametrize("entry", [e for e, spec in PROBES.items() if spec.recorders is BUILD_ONLY])
def test_every_command_flag_is_read(entry, monkeypatch):
    """The configuration a probe saw must also be used: each field is read by the module that declares it."""
    built = run(entry, [], monkeypatch, BUILD_ONLY).built[-1]
    for owner in type(built).__mro__:
        declared = set(owner.__dict__.get("__annotations__", {})) & {f.name for f in fields(built)}
        if not declared:
            continue
        module = sys.modules[owner.__module__]
        body = next(
            n for n in ast.walk(ast.parse(inspect.getsource(module))) if getattr(n, "name", None) == owner.__name__
        )
        unread = declared - _reads(module, declared, body)
        assert not unread, f"{entry}: {owner.__module__} never reads {sorted(unread)}"


# A flag whose value would change nothing beside the others given is refused, in one line.
REFUSED = [
    ("examples/speedup.py", "--t-comp 1 --t-sync 1 --network ib100", "--t-sync is T_sync itself"),
    ("examples/speedup.py", "--t-comp 1 --t-sync 1 --save {tmp}/c2.json", "go with --calibrate"),
    ("examples/speedup.py", "--t-comp 1 --t-sync 1 --max-bytes 1MiB", "go with --calibrate"),
    ("examples/speedup.py", "--t-comp 1 --params 1M --network ib100 --alpha 1e-6 --beta 1e-9", "give --network, or"),
    ("examples/speedup.py", "--t-comp 1 --params 1M --network ib100 --gamma 1e-9", "--gamma goes with --alpha"),
    ("examples/speedup.py", "--calibration {tmp}/c.json --t-comp 1 --t-sync 1", "--calibration would go unused"),
    (
        "examples/which_strategy.py",
        "--params 1M --memory 1GiB --ranks 4 --network 10gbe --alpha 1e-6 --beta 1e-9",
        "give",
    ),
    (
        "examples/which_strategy.py",
        "--params 1M --memory 1GiB --ranks 4 --network 10gbe --slowdown 2",
        "--slowdown scales",
    ),
    ("python -m mpi_sgd.paramserver", "--exit-rank 0", "one process sends no messages"),
    ("python -m mpi_sgd.bench.validate", "--model mlp", "--metrics-json is where the root writes"),
    ("mpi-sgd doctor", "--hosts a --hostfile {tmp}/hosts", "give --hosts or --hostfile, not both"),
    ("python -m mpi_sgd.cluster.netns", "--hosts a,b --", "give the command to run after --"),
]


@pytest.mark.parametrize("entry, argv, message", REFUSED, ids=[f"{e} {a}" for e, a, _ in REFUSED])
def test_a_flag_that_would_change_nothing_is_refused(entry, argv, message, monkeypatch, tmp_path):
    write_inputs(tmp_path)
    r = run(entry, argv.replace("{tmp}", str(tmp_path)).split(), monkeypatch)
    assert r.code == 2 and message in r.err, (r.code, r.err[-2000:])
    assert not r.called("init"), "refused only after communication started"
