"""What a calibration measured, and its JSON file: sweep points, the step time, the fitted network."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..perfmodel import ALLREDUCE_ALGORITHMS, Compute, Network
from ..report import write_json

FORMAT = "mpi_sgd.calibration/1"


@dataclass(frozen=True)
class SweepPoint:
    """Seconds per all-reduce of ``nbytes`` at ``ranks``: min/avg/max over ranks of each rank's median."""

    nbytes: int
    ranks: int
    min_s: float
    avg_s: float
    max_s: float
    algorithm: str = "ring"  # the cost formula this point is fitted with

    def __post_init__(self):
        if self.nbytes < 1 or self.ranks < 1 or not 0 <= self.min_s <= self.avg_s <= self.max_s:
            raise ValueError(f"not a sweep measurement: {self}")
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}")


@dataclass(frozen=True)
class StepTiming:
    """T_comp: seconds per training step of ``model`` (``params`` parameters) at per-rank ``batch``."""

    seconds: float
    batch: int
    params: int
    model: str
    torch_threads: int = 1

    def __post_init__(self):
        if not self.seconds > 0 or self.batch < 1 or self.params < 1:
            raise ValueError(f"not a step measurement: {self}")

    @property
    def grad_bytes(self) -> int:
        return 4 * self.params  # float32 gradients


@dataclass(frozen=True)
class Calibration:
    network: Network
    algorithm: str = "ring"
    step: StepTiming | None = None
    sweep: tuple[SweepPoint, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}")

    def compute(self) -> Compute:
        if self.step is None:
            raise ValueError("this calibration has no T_comp measurement")
        return Compute(self.step.seconds, self.step.batch)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "network": asdict(self.network),
            "algorithm": self.algorithm,
            "step": asdict(self.step) if self.step else None,
            "sweep": [asdict(p) for p in self.sweep],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a calibration file (format {d.get('format')!r}, expected {FORMAT!r})")
        return cls(
            Network(**d["network"]),
            d["algorithm"],
            StepTiming(**d["step"]) if d.get("step") else None,
            tuple(SweepPoint(**p) for p in d.get("sweep", ())),
            d.get("meta", {}),
        )

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        return cls.from_dict(json.loads(Path(path).read_text()))
