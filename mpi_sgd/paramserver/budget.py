"""Server 0's gradient budget: how many gradients are handed out, which are owed, who waits.

Pure bookkeeping, no communication. A worker *asks* for work after its HELLO and after each of
its gradients is applied, and is answered with the tag of the reply (:mod:`.protocol`):

* ``PARAMS`` (the parameters to compute on) while fewer than ``evaluations`` gradients are
  handed out, counting those applied and those still *owed* (granted, not yet applied);
* ``HOLD`` once all are handed out but another worker still owes one: that worker may yet be
  lost, its gradient returned to the budget, and then someone must compute it in its place;
* ``STOP`` once every gradient handed out has been applied.

Stopping a worker as soon as the last gradient is handed out would lose one whenever the worker
that owes it dies: its grant comes back after the survivors were stopped, and nobody is left to
compute it. Holding them instead keeps ``applied == evaluations`` exact whatever the order in
which a death is noticed.
"""

from __future__ import annotations

from .protocol import HOLD, PARAMS, STOP


class Budget:
    def __init__(self, evaluations: int):
        self.evaluations = evaluations
        self.applied = 0
        self.owed: set[int] = set()  # workers computing a granted gradient that is not applied yet
        self.held: list[int] = []  # workers waiting for an answer, first come first served

    @property
    def granted(self) -> int:
        return self.applied + len(self.owed)

    @property
    def open(self) -> bool:
        """Whether a gradient is left to hand out."""
        return self.granted < self.evaluations

    def ask(self, worker: int) -> str:
        """``worker`` wants work (its last gradient, if any, is applied): PARAMS, HOLD or STOP."""
        if worker in self.owed or worker in self.held:
            raise ValueError(f"worker {worker} asked for work while it still owes a gradient or waits")
        if self.open:
            self.owed.add(worker)
            return PARAMS
        if self.owed:
            self.held.append(worker)
            return HOLD
        return STOP

    def apply(self, worker: int) -> None:
        """``worker``'s owed gradient was applied."""
        self.owed.remove(worker)
        self.applied += 1

    def drop(self, worker: int) -> bool:
        """``worker`` computes no more (lost, or done); True if it owed a gradient, now returned."""
        if worker in self.held:
            self.held.remove(worker)
        owed = worker in self.owed
        self.owed.discard(worker)
        return owed

    def settle(self) -> list[tuple[int, str]]:
        """The held workers whose answer is now known: PARAMS for a returned gradient, STOP once
        nothing is owed any more. Call it after every :meth:`apply` and :meth:`drop`."""
        answers = []
        while self.held and self.open:
            worker = self.held.pop(0)
            self.owed.add(worker)
            answers.append((worker, PARAMS))
        if not self.owed:
            answers += [(worker, STOP) for worker in self.held]
            self.held.clear()
        return answers
