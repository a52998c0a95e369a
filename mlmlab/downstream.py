"""Downstream evaluation: for each task and each fine-tuning seed, fine-tune a fresh copy of the encoder.

Metric keys: ``downstream/<task>/<metric>`` (mean over seeds), ``downstream/<task>/<metric>_std`` (sample std over
seeds, 0 for one seed), ``downstream/<task>/seed_<s>/<metric>`` (per seed) and ``downstream/score`` (mean over tasks of
each task's main metric).
"""

from __future__ import annotations

import logging
import statistics

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from mlmlab.data.tasks import TASKS
from mlmlab.data.tokenizer import CLS, PAD, SEP
from mlmlab.lit.finetune import FinetuneModule

log = logging.getLogger(__name__)


def encode_examples(tok, examples: list[dict], max_seq_len: int) -> list[dict]:
    """``[CLS] text [SEP]`` (``[CLS] a [SEP] b [SEP]`` for pairs), truncated to ``max_seq_len``."""
    a = tok.encode_batch([e["text"] for e in examples], add_special_tokens=False)
    b = tok.encode_batch([e["text_b"] for e in examples], add_special_tokens=False) if "text_b" in examples[0] else None
    out = []
    for i, e in enumerate(examples):
        ids_a = a[i].ids
        if b is None:
            ids, types = [CLS] + ids_a[: max_seq_len - 2] + [SEP], None
        else:
            ids_b, budget = b[i].ids, max_seq_len - 3
            while len(ids_a) + len(ids_b) > budget:  # truncate the longer side first, as BERT does
                (ids_a if len(ids_a) >= len(ids_b) else ids_b).pop()
            ids = [CLS] + ids_a + [SEP] + ids_b + [SEP]
            types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
        out.append({"input_ids": ids, "token_type_ids": types, "label": int(e["label"])})
    return out


def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
    n = max(len(x["input_ids"]) for x in batch)
    ids = torch.full((len(batch), n), PAD, dtype=torch.long)
    types = torch.zeros((len(batch), n), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, : len(x["input_ids"])] = torch.tensor(x["input_ids"])
        if x["token_type_ids"] is not None:
            types[i, : len(x["token_type_ids"])] = torch.tensor(x["token_type_ids"])
    return {"input_ids": ids, "attention_mask": ids != PAD, "token_type_ids": types,
            "labels": torch.tensor([x["label"] for x in batch])}


def resolve_pooling(pooling: str, encoder_cfg: dict) -> str:
    """``auto``: the last real token for a causal encoder (the only position that has read the whole input), else the
    mean over real tokens."""
    if pooling != "auto":
        return pooling
    return "last" if encoder_cfg.get("causal") else "mean"


def finetune_one(cfg: DictConfig, encoder_cfg: dict, encoder_state: dict, num_labels: int, train, test,
                 seed: int, trainer_kwargs: dict) -> dict[str, float]:
    f = cfg.downstream.finetune
    pl.seed_everything(seed, workers=True, verbose=False)
    g = torch.Generator().manual_seed(seed)
    train_dl = DataLoader(train, batch_size=f.batch_size, shuffle=True, collate_fn=collate, generator=g)
    test_dl = DataLoader(test, batch_size=max(64, f.batch_size), shuffle=False, collate_fn=collate)
    total = f.epochs * len(train_dl)
    module = FinetuneModule({**encoder_cfg, "dropout": f.dropout}, num_labels, f.lr, f.weight_decay, f.warmup_frac,
                            total, f.dropout, encoder_state, resolve_pooling(f.pooling, encoder_cfg))
    trainer = pl.Trainer(max_epochs=f.epochs, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, **trainer_kwargs)
    trainer.fit(module, train_dataloaders=train_dl)
    (res,) = trainer.test(module, dataloaders=test_dl, verbose=False)
    return {"acc": float(res["test/acc"])}


def run_downstream(cfg: DictConfig, tok, encoder_cfg: dict, encoder_state: dict, trainer_kwargs: dict) -> dict[str, float]:
    metrics: dict[str, float] = {}
    main_scores = []
    for name in cfg.downstream.tasks:
        spec = TASKS[name]
        splits = spec.load(cfg)
        train = encode_examples(tok, splits["train"], cfg.downstream.finetune.max_seq_len)
        test = encode_examples(tok, splits["test"], cfg.downstream.finetune.max_seq_len)
        per_seed: dict[str, list[float]] = {m: [] for m in spec.metrics}
        for seed in cfg.downstream.seeds:
            res = finetune_one(cfg, encoder_cfg, encoder_state, spec.num_labels(cfg), train, test, seed, trainer_kwargs)
            for m in spec.metrics:
                per_seed[m].append(res[m])
                metrics[f"downstream/{name}/seed_{seed}/{m}"] = res[m]
            log.info("downstream %s seed %s: %s", name, seed, res)
        for m, vals in per_seed.items():
            metrics[f"downstream/{name}/{m}"] = statistics.fmean(vals)
            metrics[f"downstream/{name}/{m}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        main_scores.append(metrics[f"downstream/{name}/{spec.main_metric}"])
    metrics["downstream/score"] = statistics.fmean(main_scores) if main_scores else float("nan")
    return metrics
