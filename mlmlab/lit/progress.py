"""Progress bars that say where a job is: pretraining as steps of ``max_steps`` (an endless-epoch run has no useful
epoch count), fine-tuning as ``<task> lr <lr> seed <s> (run i/n): epoch e/E`` with tqdm's rate and time left."""

from __future__ import annotations

from pytorch_lightning.callbacks import TQDMProgressBar
from pytorch_lightning.callbacks.progress.tqdm_progress import _update_n


class StepProgressBar(TQDMProgressBar):
    """Pretraining: one bar over optimizer steps, ``pretraining: 1200/4138 [..<time left, it/s]``."""

    def on_train_epoch_start(self, trainer, *_) -> None:
        super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.total = trainer.max_steps
        _update_n(bar, trainer.global_step)
        bar.set_description("pretraining")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar, n = self.train_progress_bar, trainer.global_step
        if bar is not None and self._should_update(n, bar.total):
            _update_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))


class FinetuneProgressBar(TQDMProgressBar):
    """One fine-tuning run: the bar of each epoch is labelled with the task, lr, seed, run and epoch."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def on_train_epoch_start(self, trainer, *_) -> None:
        super().on_train_epoch_start(trainer)
        self.train_progress_bar.set_description(f"{self.label}: epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")
