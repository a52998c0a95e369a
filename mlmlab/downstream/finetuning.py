"""The fine-tuning loop: one fresh copy of the encoder fine-tuned on one task at one lr and seed (early stopping on the
selection split), and its predictions."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from mlmlab.data.tasks import TaskSpec
from mlmlab.downstream.encoding import LengthBucketBatches, collate
from mlmlab.downstream.scoring import split_metrics
from mlmlab.lit.finetune import FinetuneModule


@torch.no_grad()
def predict_logits(model, items: list[dict], batch_size: int, by_length: bool = True) -> list[torch.Tensor]:
    """Logits per item, in the items' order. ``by_length``: items are run longest first in batches of similar length
    (little padding; a padded position never changes a real one's output), then put back in order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = list(range(len(items)))
    if by_length:
        order.sort(key=lambda i: -len(items[i]["input_ids"]))
    out: list = [None] * len(items)
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        b = {k: v.to(device) for k, v in collate([items[j] for j in idx]).items()}
        for j, lg in zip(idx, model(b).float().cpu()):
            out[j] = lg[: len(items[j]["input_ids"])] if lg.dim() > 1 else lg  # token logits: drop the batch padding
    model.train(was_training)
    return out


def predict(model, spec: TaskSpec, split: dict, label_names: list[str], batch_size: int,
            by_length: bool = True) -> list:
    """Per example of an encoded split: the predicted label id (window logits averaged), or for NER the predicted
    tag id of each word (read once, from the window where it is most central)."""
    logits = predict_logits(model, split["items"], batch_size, by_length)
    if spec.kind == "token":
        fallback = label_names.index("O") if "O" in label_names else 0
        return [[int(logits[a[0]][a[1]].argmax()) if a is not None else fallback for a in ex["at"]]
                for ex in split["index"]]
    n_docs = split["n"]
    sums = torch.zeros(n_docs, len(label_names))
    counts = torch.zeros(n_docs)
    for item, lg in zip(split["items"], logits):
        sums[item["doc"]] += lg
        counts[item["doc"]] += 1
    return (sums / counts[:, None]).argmax(-1).tolist()


def evaluate(model, spec: TaskSpec, split: dict, label_names: list[str], batch_size: int,
             by_length: bool = True) -> dict[str, float]:
    """The task's metrics on an encoded split (windows averaged per example; NER words read once)."""
    return split_metrics(spec, split, label_names, predict(model, spec, split, label_names, batch_size, by_length))


class BestOnValidation(pl.Callback):
    """Early stopping on the validation primary metric: evaluate after every epoch, keep the best weights, stop after
    ``patience`` epochs without improvement; the best weights are restored when training ends."""

    def __init__(self, spec: TaskSpec, split: dict, label_names: list[str], batch_size: int, patience: int,
                 by_length: bool = True):
        self.spec, self.split, self.names, self.bs, self.patience = spec, split, label_names, batch_size, patience
        self.by_length = by_length
        self.best, self.best_state, self.bad, self.history = -math.inf, None, 0, []

    def on_train_epoch_end(self, trainer, module):
        score = evaluate(module, self.spec, self.split, self.names, self.bs, self.by_length)[self.spec.main_metric]
        self.history.append(score)
        if trainer.logger:  # the per-epoch selection curve of a per-fine-tuning W&B run
            trainer.logger.log_metrics({f"finetune/selection_{self.spec.main_metric}": score,
                                        "finetune/epoch": trainer.current_epoch}, step=trainer.global_step)
        if score > self.best:
            self.best, self.bad = score, 0
            self.best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        else:
            self.bad += 1
            if self.bad >= self.patience:
                trainer.should_stop = True

    def on_train_end(self, trainer, module):
        if self.best_state is not None:
            module.load_state_dict(self.best_state)


def finetune_one(f, spec: TaskSpec, encoder_cfg: dict, encoder_state: dict, label_names: list[str],
                 splits: dict, lr: float, seed: int, trainer_kwargs: dict,
                 run_factory: Callable | None = None, reported: str = "test") -> dict[str, dict[str, float]]:
    """Fine-tune one copy; returns the metrics on each evaluated split (``validation`` if present, ``test`` if
    present). ``f``: ``downstream.finetune.*``; ``run_factory(task, lr, seed)``: a W&B run for this fine-tuning (or None)."""
    run = run_factory(spec.name, lr, seed) if run_factory is not None else None
    ok = False
    try:
        out = _finetune_one(f, spec, encoder_cfg, encoder_state, label_names, splits, lr, seed, trainer_kwargs, run)
        if run is not None:
            names = {"validation": "selection", "test": reported}
            run.summary.update({f"{names[s]}/{k}": v for s, m in out.items() if s in names for k, v in m.items()})
        ok = True
        return out
    finally:
        if run is not None:
            run.finish(exit_code=0 if ok else 1)


def _finetune_one(f, spec: TaskSpec, encoder_cfg: dict, encoder_state: dict, label_names: list[str],
                  splits: dict, lr: float, seed: int, trainer_kwargs: dict, run) -> dict[str, dict[str, float]]:
    trainer_kwargs = dict(trainer_kwargs)
    label = trainer_kwargs.pop("label", f"{spec.name} lr {lr:g} seed {seed}")
    pl.seed_everything(seed, workers=True, verbose=False)
    g = torch.Generator().manual_seed(seed)
    items = splits["train"]["items"]
    if f.length_buckets:
        train_dl = DataLoader(items, collate_fn=collate,
                              batch_sampler=LengthBucketBatches([len(x["input_ids"]) for x in items], f.batch_size, g))
    else:
        train_dl = DataLoader(items, batch_size=f.batch_size, shuffle=True, collate_fn=collate, generator=g)
    total = f.epochs * len(train_dl)
    module = FinetuneModule({**encoder_cfg, "dropout": f.dropout}, len(label_names), lr, f.weight_decay, f.warmup_frac,
                            total, f.dropout, encoder_state, resolve_pooling(f.pooling, encoder_cfg),
                            token_level=spec.kind == "token", layer_decay=f.layer_decay)
    # length_buckets: large no-grad batches of similar length (predict_logits); else in-order batches as before
    eval_bs = max(256, f.batch_size) if f.length_buckets else max(64, f.batch_size)
    callbacks = []
    if trainer_kwargs.get("enable_progress_bar"):
        from mlmlab.lit.progress import FinetuneProgressBar

        callbacks.append(FinetuneProgressBar(label))
    if f.early_stopping_patience is not None and "validation" in splits:
        callbacks.append(BestOnValidation(spec, splits["validation"], label_names, eval_bs, f.early_stopping_patience,
                                          f.length_buckets))
    logger = False
    if run is not None:
        from pytorch_lightning.loggers import WandbLogger

        logger = WandbLogger(experiment=run)
    trainer = pl.Trainer(max_epochs=f.epochs, logger=logger, enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=callbacks, log_every_n_steps=max(1, min(10, len(train_dl))),
                         **trainer_kwargs)
    trainer.fit(module, train_dataloaders=train_dl)
    out: dict = {}
    for s in ("validation", "test"):
        if s in splits:
            preds = predict(module, spec, splits[s], label_names, eval_bs, f.length_buckets)
            out[s] = split_metrics(spec, splits[s], label_names, preds)
            if s == "test":
                out["test_preds"] = preds  # per-item predictions of the reported split (popped by run_task)
    return out


def resolve_pooling(pooling: str, encoder_cfg: dict) -> str:
    """``auto``: the last real token for a causal encoder (the only position that has read the whole input), else the
    mean over real tokens."""
    if pooling != "auto":
        return pooling
    return "last" if encoder_cfg.get("causal") else "mean"
