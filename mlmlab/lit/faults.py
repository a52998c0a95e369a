"""Test-only fault injection for the reliability tests and drills (never set these variables otherwise).

``MLMLAB_FAULT_SIGTERM_AT_STEP=N`` sends the job a SIGTERM at the end of optimizer step N, before the training guard
looks for one (as if it arrived during that step); ``MLMLAB_FAULT_KILL_AT_STEP=N`` SIGKILLs it at the end of step N,
after the guard's checkpoint of that step. :func:`fault_callbacks` returns the callbacks to put before and after the
guard in the Trainer's list (Lightning calls callbacks in list order), and none when neither variable is set.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytorch_lightning as pl

log = logging.getLogger(__name__)

SIGTERM_VAR, KILL_VAR = "MLMLAB_FAULT_SIGTERM_AT_STEP", "MLMLAB_FAULT_KILL_AT_STEP"


class SignalAtStep(pl.Callback):
    """Send ``sig`` to this process at the end of optimizer step ``step`` (once; gradient-accumulation micro-batches
    of that step do not count)."""

    def __init__(self, step: int, sig: signal.Signals):
        self.step, self.sig, self._done = step, sig, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._done or trainer.global_step != self.step:
            return
        self._done = True
        log.warning("fault injection: sending %s to myself at step %d", self.sig.name, self.step)
        os.kill(os.getpid(), self.sig)
        time.sleep(0.1)  # let the handler run before going on


def fault_callbacks(environ=os.environ) -> tuple[list[pl.Callback], list[pl.Callback]]:
    """(callbacks before the guard, callbacks after it) for the fault variables that are set."""
    before = [SignalAtStep(int(environ[SIGTERM_VAR]), signal.SIGTERM)] if environ.get(SIGTERM_VAR) else []
    after = [SignalAtStep(int(environ[KILL_VAR]), signal.SIGKILL)] if environ.get(KILL_VAR) else []
    return before, after
