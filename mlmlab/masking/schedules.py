"""Mask-rate schedules: ``rate = schedule(global_step, total_steps)``.

A schedule is a pure function of the optimizer step and the run length, so it is exact under DDP (every rank sees the
same ``global_step``), gradient accumulation (micro-batches of one step share a rate) and resume (no state). Positions
in time are fractions of ``total_steps`` (``trainer.max_steps``), so a preset means the same thing at any budget.

Each schedule is instantiated by Hydra from ``conf/mask/schedule/<name>.yaml`` (``_target_``); ``mask.rate`` is the rate of
the default constant schedule and the starting rate of ``linear`` / ``cosine``. A new schedule is one class here plus one
YAML there.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


class Schedule:
    """Base: subclasses implement :meth:`at` on training progress in [0, 1] and :meth:`extremes`."""

    key = "mask.schedule"

    def __call__(self, step: int, total_steps: int) -> float:
        progress = min(1.0, max(0.0, step / max(1, total_steps)))
        return float(self.at(progress))

    def at(self, progress: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def extremes(self) -> list[float]:
        """Rates that bound the schedule over the whole run (it is piecewise monotone between them)."""
        raise NotImplementedError  # pragma: no cover

    def check(self) -> None:
        """Raise ``ValueError`` when the rate leaves (0, 1) anywhere on [0, total_steps]."""
        for r in self.extremes():
            if not (0.0 < r < 1.0) or not math.isfinite(r):
                raise ValueError(f"{self.key} ({self.describe()}) reaches rate {r:g}; every rate must be in (0, 1)")

    def describe(self) -> str:
        return type(self).__name__.lower()


class Constant(Schedule):
    def __init__(self, rate: float):
        self.rate = float(rate)

    def at(self, progress: float) -> float:
        return self.rate

    def extremes(self) -> list[float]:
        return [self.rate]

    def describe(self) -> str:
        return f"constant {self.rate:g}"


class Linear(Schedule):
    """``start`` at step 0 to ``end`` at the last step (Ankner et al.'s decreasing 30% -> 15% with start=0.3, end=0.15)."""

    def __init__(self, start: float, end: float):
        self.start, self.end = float(start), float(end)

    def at(self, progress: float) -> float:
        return self.start + (self.end - self.start) * progress

    def extremes(self) -> list[float]:
        return [self.start, self.end]

    def describe(self) -> str:
        return f"linear {self.start:g} -> {self.end:g}"


class Cosine(Linear):
    """Half-cosine from ``start`` to ``end``: flat at both ends, fastest change mid-run."""

    def at(self, progress: float) -> float:
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def describe(self) -> str:
        return f"cosine {self.start:g} -> {self.end:g}"


class Step(Schedule):
    """``rates[i]`` from milestone i-1 to milestone i; ``milestones`` are strictly increasing fractions in (0, 1) and
    there is one more rate than milestones (e.g. rates=[0.3, 0.2, 0.15], milestones=[0.33, 0.66])."""

    def __init__(self, rates: Sequence[float], milestones: Sequence[float]):
        self.rates, self.milestones = [float(r) for r in rates], [float(m) for m in milestones]
        if len(self.rates) != len(self.milestones) + 1:
            raise ValueError(f"{self.key}.rates has {len(self.rates)} values; need len(milestones) + 1 = "
                             f"{len(self.milestones) + 1}")
        if any(not 0.0 < m < 1.0 for m in self.milestones):
            raise ValueError(f"{self.key}.milestones={self.milestones} must be fractions of the run in (0, 1)")
        if any(b <= a for a, b in zip(self.milestones, self.milestones[1:])):
            raise ValueError(f"{self.key}.milestones={self.milestones} must be strictly increasing (sorted)")

    def at(self, progress: float) -> float:
        return self.rates[bisect.bisect_right(self.milestones, progress)]

    def extremes(self) -> list[float]:
        return list(self.rates)

    def describe(self) -> str:
        return f"step {self.rates} at {self.milestones}"


class Piecewise(Schedule):
    """Linear interpolation through ``points = [[progress, rate], ...]`` (progress in [0, 1], strictly increasing);
    constant before the first and after the last point."""

    def __init__(self, points: Sequence[Sequence[float]]):
        pts = [(float(p[0]), float(p[1])) for p in points]
        if not pts or any(len(p) != 2 for p in points):
            raise ValueError(f"{self.key}.points must be a non-empty list of [progress, rate] pairs, got {points}")
        xs = [x for x, _ in pts]
        if any(not 0.0 <= x <= 1.0 for x in xs) or any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError(f"{self.key}.points progress values {xs} must be strictly increasing within [0, 1]")
        self.points = pts

    def at(self, progress: float) -> float:
        xs = [x for x, _ in self.points]
        i = bisect.bisect_right(xs, progress)
        if i == 0:
            return self.points[0][1]
        if i == len(xs):
            return self.points[-1][1]
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (progress - x0) / (x1 - x0)

    def extremes(self) -> list[float]:
        return [y for _, y in self.points]

    def describe(self) -> str:
        return f"piecewise {self.points}"
