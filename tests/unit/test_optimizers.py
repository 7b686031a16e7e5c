"""mpi_sgd.optimizers against torch's own classes: the same bits, state dicts that cross over,
hooks run once, and no import of torch's compiler (the one reason the classes exist).

Bitwise equality is the right comparison: one process, the same torch kernels on the same
tensors in the same order, so no reduction order can differ.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from mpi_sgd import optimizers
from mpi_sgd.config import TrainConfig
from mpi_sgd.step import make_optimizer

CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("SGD", dict(lr=0.1, momentum=0.9, fused=True)),
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, amsgrad=True, weight_decay=1e-3)),
    ("Adam", dict(lr=1e-2, fused=True)),
]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _steps(model, opt, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        x, y = torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("name, kwargs", CASES, ids=[f"{n}-{'-'.join(k)}" for n, k in CASES])
def test_the_same_bits_as_torchs_and_state_dicts_cross_over(name, kwargs):
    # Grad mode is on around every step here: a step that did not turn it off would raise on the
    # in-place update of a parameter (a leaf that requires grad) in the unfused cases.
    ours_model, theirs_model = _model(), _model()
    ours = getattr(optimizers, name)(ours_model.parameters(), **kwargs)
    theirs = getattr(torch.optim, name)(theirs_model.parameters(), **kwargs)
    assert isinstance(ours, getattr(torch.optim, name))
    _steps(ours_model, ours, 4)
    _steps(theirs_model, theirs, 4)
    assert _same(ours_model, theirs_model)
    # Each one's state into a fresh one of the other kind: they go on identically.
    ours2, theirs2 = _model(), _model()
    ours2.load_state_dict(theirs_model.state_dict())
    theirs2.load_state_dict(ours_model.state_dict())
    o2 = getattr(optimizers, name)(ours2.parameters(), **kwargs)
    t2 = getattr(torch.optim, name)(theirs2.parameters(), **kwargs)
    o2.load_state_dict(theirs.state_dict())
    t2.load_state_dict(ours.state_dict())
    _steps(ours2, o2, 3, seed=2)
    _steps(theirs2, t2, 3, seed=2)
    assert _same(ours2, theirs2)


def test_hooks_run_once_and_a_found_inf_skips_the_step():
    model = _model()
    opt = optimizers.SGD(model.parameters(), lr=0.1, fused=True)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    before = [p.detach().clone() for p in model.parameters()]
    opt.found_inf = torch.ones(())  # what the late verdict hands the fused step for a bad one
    _steps(model, opt, 1)
    assert calls == ["pre", "post"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    del opt.found_inf
    _steps(model, opt, 1)
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_a_training_process_never_imports_torchs_compiler():
    # A fresh process: this one may have imported it already (another test's torch optimizer).
    script = textwrap.dedent(
        """
        import sys
        import torch
        from mpi_sgd.config import TrainConfig
        from mpi_sgd.step import make_optimizer
        for kind in ("sgd", "adam"):
            model = torch.nn.Linear(4, 2)
            opt = make_optimizer(TrainConfig(optimizer=kind), model)
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
            opt.load_state_dict(opt.state_dict())
        print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", (
        "this torch's optimizers import torch._dynamo through a wrapper mpi_sgd.optimizers does not know: " + out.stdout
    )


def test_make_optimizer_builds_the_project_classes():
    model = _model()
    assert type(make_optimizer(TrainConfig(optimizer="sgd"), model)) is optimizers.SGD
    assert type(make_optimizer(TrainConfig(optimizer="adam"), model)) is optimizers.Adam
