"""Mask-rate schedules: ``rate(step, total_steps) -> float``. ``mask.rate`` is the rate of the constant schedule."""

from __future__ import annotations


class Constant:
    def __init__(self, rate: float):
        self.rate = float(rate)

    def __call__(self, step: int, total_steps: int) -> float:
        return self.rate
