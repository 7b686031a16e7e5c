"""torch's SGD and Adam, stepping exactly as torch's do, without importing torch's compiler.

Every method of a torch optimizer that a training loop calls (``step``, ``zero_grad``,
``state_dict``, ``load_state_dict``, and ``add_param_group``, which the constructor calls) is
wrapped so that ``torch.compile`` leaves it alone or breaks its graph around it, and each wrapper
imports ``torch._dynamo`` when it first runs, compiled or not. That import is about as large as
``import torch`` itself, paid by every rank of every job for a compiler this project never runs;
on a shared filesystem it is hundreds more files read by every rank at once.

So the classes here call the methods those wrappers wrap (``functools.wraps`` keeps each as
``__wrapped__``, which :func:`inspect.unwrap` follows), keeping the one thing the wrappers do
outside the compiler: ``step`` runs with gradients off unless the optimizer is ``differentiable``.
The arithmetic is torch's own, line for line, and an instance *is* a ``torch.optim.SGD`` or
``Adam``: the fused implementations, ``found_inf``, step hooks, and state dicts (checkpoints)
that load into either kind. tests/unit/test_optimizers.py steps both side by side and compares
the bits, and starts a fresh process to check that ``torch._dynamo`` stays unimported: a torch
version that wraps these methods some other way fails there, not silently.

An optimizer whose steps run inside ``torch.compile`` should be torch's own class: compiling is
what the wrappers are for. The trainer and the benchmarks never compile.
"""

from __future__ import annotations

from inspect import unwrap

import torch
from torch.optim import Optimizer

# The bodies, taken once. A torch optimizer class's own ``step`` also gains a profiler-and-hooks
# wrapper when its first instance is made; unwrapping goes through that too, and the classes
# below get their own, so hooks registered on an instance still run, once.
_ZERO_GRAD, _ADD_GROUP = unwrap(Optimizer.zero_grad), unwrap(Optimizer.add_param_group)
_STATE_DICT, _LOAD_STATE_DICT = unwrap(Optimizer.state_dict), unwrap(Optimizer.load_state_dict)


class _WithoutCompiler:
    """The optimizer methods, minus their compiler wrappers; mixed in ahead of a torch optimizer."""

    _torch_step = None  # the torch class's step body, set by each class below

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults.get("differentiable", False)):
            return type(self)._torch_step(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        _ADD_GROUP(self, param_group)

    def state_dict(self) -> dict:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict) -> None:
        _LOAD_STATE_DICT(self, state_dict)


class SGD(_WithoutCompiler, torch.optim.SGD):
    """``torch.optim.SGD``, same arguments and arithmetic (see the module)."""

    _torch_step = staticmethod(unwrap(torch.optim.SGD.step))


class Adam(_WithoutCompiler, torch.optim.Adam):
    """``torch.optim.Adam``, same arguments and arithmetic (see the module)."""

    _torch_step = staticmethod(unwrap(torch.optim.Adam.step))
