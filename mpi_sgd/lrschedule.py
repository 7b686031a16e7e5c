"""Learning-rate rules for a global batch that grows with the number of ranks.

R ranks at batch B take the steps of one process at batch R·B, so a learning rate tuned at one
batch is wrong at another. The rules here, applied by the trainer before every optimizer step:

* **Scaling** from a reference batch B_ref (``--base-batch``, default the per-rank batch) to the
  global batch R·B, with k = R·B / B_ref: ``linear`` multiplies the rate by k (Goyal et al.,
  "Accurate, Large Minibatch SGD", 2017: the k-fold step makes one update at batch kB do what k
  updates at batch B would, while the gradient changes slowly), ``sqrt`` by √k (keeps the
  update's variance constant; Krizhevsky 2014, Hoffer et al. 2017), ``none`` leaves it.
* **Warm-up** (``--warmup``): the rate rises linearly from the unscaled one to the scaled one over
  the first steps (or epochs), Goyal et al.'s gradual warm-up, since a k-fold rate from the first
  step diverges while the weights still change fast.
* **Schedule** after warm-up: ``constant``, ``cosine`` (half a cosine from the rate down to 0 at
  the end of training; Loshchilov & Hutter 2017) or ``step`` (÷10 at 50% and again at 75%).
* **AdaScale** (``--adascale``; Johnson et al., "AdaScale SGD", ICML 2020, the rule Pollux uses):
  instead of a fixed k, each step's gain r = (σ² + μ²)/(σ²/S + μ²), from the running noise-scale
  estimates (μ² = |G|², σ² = tr Σ / B_ref the variance of a batch-B_ref gradient, S = R·B/B_ref),
  multiplies the rate; r is near S while noise dominates and near 1 once it does not. Progress is
  counted in scale-invariant iterations τ (τ grows by r per step), and warm-up and schedule read
  τ: a schedule written for B_ref runs unchanged at any batch.

The state (steps, τ and the running estimates) goes into checkpoints, so a resumed run applies
the rates the uninterrupted one would have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCALINGS = ("none", "linear", "sqrt")
SCHEDULES = ("constant", "cosine", "step")
EMA = 0.9  # AdaScale's running estimates: weight of the past per step (about 10 steps of memory)


def scale_factor(scaling: str, global_batch: int, base_batch: int) -> float:
    """The rate's multiplier for ``global_batch`` against ``base_batch`` under ``scaling``."""
    k = global_batch / base_batch
    return {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[scaling]


def parse_warmup(text: str) -> tuple[float, str]:
    """``"500"`` -> (500, "steps"); ``"2ep"`` or ``"0.5ep"`` -> (2, "epochs"). Raises ValueError."""
    text = str(text).strip()
    unit = "epochs" if text.endswith("ep") else "steps"
    try:
        n = float(text.removesuffix("ep"))
    except ValueError:
        raise ValueError(f"--warmup takes steps (500) or epochs (2ep), not {text!r}") from None
    if not (n >= 0 and math.isfinite(n)) or (unit == "steps" and n != int(n)):
        raise ValueError(f"--warmup must be a whole number of steps or a number of epochs (2ep), got {text!r}")
    return n, unit


@dataclass
class LRSchedule:
    """The learning rate at each step; :meth:`next_rate` before a step, :meth:`state_dict` to save.

    ``lr`` the rate at ``base_batch``; ``factor`` the scaling rule's multiplier (1 with AdaScale);
    ``warmup_steps`` and ``total_steps`` in steps at ``base_batch`` terms when ``adascale`` (τ),
    else in optimizer steps.
    """

    lr: float
    factor: float = 1.0
    warmup_steps: float = 0
    total_steps: float = 0
    schedule: str = "constant"
    adascale: bool = False
    scale: float = 1.0  # AdaScale's S = global batch / base batch
    step: int = 0  # optimizer steps taken
    tau: float = 0.0  # scale-invariant iterations (= step without AdaScale)
    g2: float | None = None  # running |G|², AdaScale
    var: float | None = None  # running tr Σ / base batch, AdaScale

    def gain(self) -> float:
        """AdaScale's r from the running estimates (1 until there are any; S at most)."""
        if not self.adascale or self.g2 is None or self.var is None:
            return 1.0
        g2, var = max(self.g2, 0.0), max(self.var, 0.0)
        if g2 + var <= 0:
            return 1.0
        return min(self.scale, (var + g2) / (var / self.scale + g2))

    def observe(self, g2: float, trace: float, base_batch: int) -> None:
        """One step's estimates (AdaScale): folded into the running means; non-finite ones ignored."""
        if not (math.isfinite(g2) and math.isfinite(trace)):
            return
        var = trace / base_batch
        self.g2 = g2 if self.g2 is None else EMA * self.g2 + (1 - EMA) * g2
        self.var = var if self.var is None else EMA * self.var + (1 - EMA) * var

    def rate_at(self, t: float) -> float:
        """The rate at progress ``t`` (steps, or τ with AdaScale), before AdaScale's gain."""
        peak = self.lr * self.factor
        if t < self.warmup_steps:
            # Goyal et al.: the first step at the unscaled rate η, then up by equal steps to kη, reached
            # after warmup_steps. With nothing scaled it rises from 0, whose first step is not 0.
            if self.factor > 1:
                return self.lr + (peak - self.lr) * t / self.warmup_steps
            return peak * (t + 1) / self.warmup_steps
        if self.schedule == "constant" or self.total_steps <= self.warmup_steps:
            return peak
        done = min(1.0, (t - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        if self.schedule == "cosine":
            return peak * 0.5 * (1 + math.cos(math.pi * done))
        return peak * (0.1 if done >= 0.5 else 1.0) * (0.1 if done >= 0.75 else 1.0)

    def next_rate(self) -> float:
        """The rate for the step about to be taken; advances the counters."""
        gain = self.gain()
        rate = gain * self.rate_at(self.tau)
        self.step += 1
        self.tau += gain
        return rate

    def state_dict(self) -> dict:
        return {"step": self.step, "tau": self.tau, "g2": self.g2, "var": self.var}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tau = state["step"], state["tau"]
        self.g2, self.var = state.get("g2"), state.get("var")


def set_rate(optimizer, rate: float) -> None:
    """Every parameter group of ``optimizer`` (a sharded one's too) at ``rate``."""
    for group in optimizer.param_groups:
        group["lr"] = rate
