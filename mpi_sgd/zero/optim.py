"""The optimizer on this rank's shards, and the one place sharded state becomes a checkpoint.

:class:`ShardedOptimizer` runs an ordinary ``torch.optim`` optimizer whose parameters are the
shards (one flat tensor per unit), so its state (momentum; Adam's two moments) exists only for
the shard: 1/R of it per rank. SGD and Adam update every element on its own, so the update of a
shard is element for element the update plain data parallel makes to the same elements.

**Checkpoints: consolidated on rank 0.** :meth:`ShardedOptimizer.full_state_dict` gathers the
shards of parameters and optimizer state to the root and returns them in exactly the format of
``model.state_dict()`` and of a ``torch.optim`` optimizer over ``model.parameters()``: the format
plain data parallel saves. So a sharded checkpoint resumes at any world size and any stage, and
a plain one resumes sharded (and back). The price: while saving, the root holds the full state
once; per-rank files would avoid that, and would tie a checkpoint to its world size.
Per-parameter state that is element-wise (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``) is
sharded; ``step`` and non-tensor entries are the same on every rank and are kept as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .engine import ZeroEngine

REPLICATED = ("step",)  # optimizer-state entries that are one value per parameter, not per element


def _sharded(key: str, value) -> bool:
    return torch.is_tensor(value) and key not in REPLICATED


class ShardedOptimizer:
    """``make_optimizer(shards)`` on this rank's shards; after each step (stages 1-2) the parameters
    are all-gathered so every rank holds the whole updated model again."""

    def __init__(self, engine: ZeroEngine, make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]):
        self.engine = engine
        self.inner = make_optimizer([u.shard for u in engine.units])
        if len(self.inner.param_groups) != 1:
            raise ValueError("a sharded optimizer takes one parameter group")
        self.param_groups = self.inner.param_groups  # shared, so learning-rate schedules work

    @property
    def state(self):
        return self.inner.state

    def step(self) -> None:
        for u in self.engine.units:
            u.shard.grad = u.grad_shard
        self.inner.step()
        if self.engine.stage < 3:
            self.engine.gather_updated()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state (see :meth:`full_state_dict` for a checkpoint)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    # -- checkpoints ------------------------------------------------------------------------
    def _gather(self, shard: torch.Tensor, u) -> torch.Tensor | None:
        comm = self.engine.comm
        out = torch.empty(comm.size, u.shard_numel, dtype=shard.dtype) if comm.is_root else None
        comm.gather(shard.detach().contiguous(), out, root=0)
        return out.reshape(-1) if comm.is_root else None

    def full_state_dict(self) -> tuple[dict | None, dict | None]:
        """(model state, optimizer state) as one unsharded process would save them, on the root.

        A collective: every rank calls it; ranks other than the root get ``(None, None)``.
        """
        model, root = self.engine.model, self.engine.comm.is_root
        name_of = {id(p): n for n, p in model.named_parameters()}
        index = {id(p): i for i, p in enumerate(model.parameters())}
        model_state = model.state_dict() if root else None
        inner = self.inner.state_dict()
        state: dict = {}
        for i, u in enumerate(self.engine.units):
            flat = self._gather(u.shard, u)
            per_param = [{} for _ in u.params]
            for key, value in inner["state"].get(i, {}).items():  # same keys, same order, on every rank
                if _sharded(key, value):
                    full = self._gather(value, u)
                    pieces = u.split(full) if root else None
                else:
                    pieces = [value.clone() if torch.is_tensor(value) else value for _ in u.params]
                if root:
                    for d, piece in zip(per_param, pieces, strict=True):
                        d[key] = piece
            if root:
                for p, t, d in zip(u.params, u.split(flat), per_param, strict=True):
                    model_state[name_of[id(p)]] = t
                    if d:
                        state[index[id(p)]] = d
        if not root:
            return None, None
        group = {k: v for k, v in inner["param_groups"][0].items() if k != "params"}
        group["params"] = list(range(len(index)))
        return model_state, {"state": state, "param_groups": [group]}

    def load_full_state_dict(self, model_state: dict, optimizer_state: dict) -> None:
        """Take this rank's shards of a full (unsharded) state, as :meth:`full_state_dict` returns it."""
        engine, model = self.engine, self.engine.model
        rank = engine.comm.rank
        name_of = {id(p): n for n, p in model.named_parameters()}
        index = {id(p): i for i, p in enumerate(model.parameters())}
        if len(optimizer_state["param_groups"]) != 1:
            raise ValueError("the checkpoint's optimizer has more than one parameter group")
        state = {}
        with torch.no_grad():
            for i, u in enumerate(engine.units):
                lo, hi = rank * u.shard_numel, (rank + 1) * u.shard_numel
                flat = u.flatten([model_state[name_of[id(p)]] for p in u.params])
                if engine.stage == 3:
                    u.shard.copy_(flat[lo:hi])
                else:
                    u.full.copy_(flat)  # the shard is a slice of it
                saved = [optimizer_state["state"].get(index[id(p)], {}) for p in u.params]
                if any(d.keys() != saved[0].keys() for d in saved):
                    raise ValueError(f"the checkpoint has optimizer state for only some parameters of {u.name}")
                state[i] = {
                    key: u.flatten([d[key] for d in saved])[lo:hi].clone() if _sharded(key, value) else value
                    for key, value in saved[0].items()
                }
            for name, buf in model.named_buffers():
                buf.copy_(model_state[name])
        group = {k: v for k, v in optimizer_state["param_groups"][0].items() if k != "params"}
        group["params"] = list(range(len(engine.units)))
        self.inner.load_state_dict({"state": {i: s for i, s in state.items() if s}, "param_groups": [group]})
