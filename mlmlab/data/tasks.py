"""Downstream task registry: name -> how to load its splits, how many labels, which metrics.

A task yields ``{"train": [...], "test": [...]}`` lists of ``{"text": str, "label": int}`` (``"text_b"`` for pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from mlmlab.data import builtin


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # "single" | "pair"
    metrics: tuple[str, ...]
    num_labels: Callable[[DictConfig], int]
    load: Callable[[DictConfig], dict[str, list[dict]]]
    main_metric: str = "acc"

    def check_available(self, cfg: DictConfig) -> None:
        """Raise ConfigError early when the task cannot run with this config (missing files etc.)."""


def _builtin(name: str) -> TaskSpec:
    def load(cfg: DictConfig) -> dict[str, list[dict]]:
        d, ds = cfg.data, cfg.downstream
        n_topics = d.n_topics if d.name == "builtin" else 8
        return {
            split: builtin.generate_task(name, split, n, seed=0, n_topics=n_topics)
            for split, n in (("train", ds.builtin_n_train), ("test", ds.builtin_n_test))
        }

    def num_labels(cfg: DictConfig) -> int:
        return builtin.task_num_labels(name, cfg.data.n_topics if cfg.data.name == "builtin" else 8)

    return TaskSpec(name=name, kind="single", metrics=("acc",), num_labels=num_labels, load=load)


TASKS: dict[str, TaskSpec] = {name: _builtin(name) for name in builtin.TASK_NAMES}
