"""The Lightning layer: LightningModules, callbacks and the helpers around them (masking and models know nothing of
it)."""

from __future__ import annotations

import logging
import warnings


class _DropTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_library_noise() -> None:
    """Silence two messages every job printed that say nothing about the job: Lightning's advertisement for litlogger
    (logged at each Trainer's construction) and the deprecation of ``LeafSpec`` that Lightning's own pytree helper
    triggers inside torch (Lightning's to fix, not ours). Nothing else is filtered; idempotent."""
    lg = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if not any(isinstance(f, _DropTip) for f in lg.filters):
        lg.addFilter(_DropTip())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
