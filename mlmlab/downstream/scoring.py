"""Scores of predictions (accuracy, F1, MCC, entity F1), their mean and t interval over fine-tuning seeds, and the
paired gain over the random-init encoder."""

from __future__ import annotations

import torch

from mlmlab.data.tasks import TaskSpec


def classification_metrics(preds: torch.Tensor, target: torch.Tensor, num_classes: int,
                           names: tuple[str, ...]) -> dict[str, float]:
    """acc; f1 (binary: of class 1; multi-class: macro); mcc (Matthews). torchmetrics' functional forms."""
    from torchmetrics.functional.classification import (
        binary_f1_score,
        multiclass_accuracy,
        multiclass_f1_score,
        multiclass_matthews_corrcoef,
    )

    out = {}
    for m in names:
        if m == "acc":
            v = multiclass_accuracy(preds, target, num_classes=num_classes, average="micro")
        elif m == "f1":
            v = (binary_f1_score(preds, target) if num_classes == 2
                 else multiclass_f1_score(preds, target, num_classes=num_classes, average="macro"))
        elif m == "mcc":
            v = multiclass_matthews_corrcoef(preds, target, num_classes=num_classes)
        else:
            raise ValueError(f"metric {m!r} is not a classification metric")
        out[m] = float(v)
    return out


def entity_f1(true_tags: list[list[str]], pred_tags: list[list[str]]) -> dict[str, float]:
    """Entity-level micro F1 (seqeval's default, conlleval semantics), with precision and recall."""
    from seqeval.metrics import f1_score, precision_score, recall_score

    kw = {"zero_division": 0}  # no predicted entity: precision 0, not a warning
    return {"entity_f1": float(f1_score(true_tags, pred_tags, **kw)),
            "precision": float(precision_score(true_tags, pred_tags, **kw)),
            "recall": float(recall_score(true_tags, pred_tags, **kw))}


def mean_ci95(values: list[float]) -> tuple[float, float, float | None]:
    """Mean, sample std (0 for one value) and the half-width of the t-distribution 95% interval (None for one)
    (:func:`mlmlab.stats.mean_interval`)."""
    from mlmlab.stats import mean_interval

    iv = mean_interval(values)
    return iv.mean, iv.sd, (iv.half if iv.n > 1 else None)


def split_metrics(spec: TaskSpec, split: dict, label_names: list[str], preds: list) -> dict[str, float]:
    """The task's metrics of ``predict``'s output on an encoded split."""
    if spec.kind == "token":
        return entity_f1([[label_names[t] for t in ex["tags"]] for ex in split["index"]],
                         [[label_names[t] for t in p] for p in preds])
    return classification_metrics(torch.tensor(preds), torch.tensor(split["labels"]), len(label_names), spec.metrics)


def paired_gain(metrics: dict[str, float], baseline: dict[str, float], mains: dict[str, str],
                seeds: list[int]) -> dict[str, float]:
    """Pretrained minus baseline, paired by fine-tuning seed, for each task's primary metric: ``gain/<task>/<metric>``
    (mean difference), ``_std``, ``_ci95`` (t interval of the mean difference; it excludes 0 when the gain is
    significant at 5%), ``_p`` (two-sided paired t-test, mlmlab.stats.paired_t) and ``gain/<task>/seed_<s>/<metric>``."""
    from mlmlab.stats import paired_t

    out: dict[str, float] = {}
    for task, m in mains.items():
        if f"downstream/{task}/seed_{seeds[0]}/{m}" not in metrics:  # zero-shot / probe-only: no seeds to pair
            continue
        a = [metrics[f"downstream/{task}/seed_{s}/{m}"] for s in seeds]
        b = [baseline[f"downstream/{task}/seed_{s}/{m}"] for s in seeds]
        diffs = [x - y for x, y in zip(a, b)]
        iv = paired_t(a, b)
        key = f"gain/{task}/{m}"
        out[key], out[f"{key}_std"] = iv.mean, iv.sd
        if iv.n > 1:
            out[f"{key}_ci95"] = iv.half
            if iv.sd > 0:
                out[f"{key}_p"] = iv.p
        for s, d in zip(seeds, diffs):
            out[f"gain/{task}/seed_{s}/{m}"] = d
    return out
