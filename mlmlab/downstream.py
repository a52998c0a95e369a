"""Downstream evaluation: for each task, each learning rate of the grid and each fine-tuning seed, fine-tune a fresh
copy of the encoder; choose the lr on validation, report the test split where the task has labelled test data
(otherwise validation, and say so).

Metric keys: ``downstream/<task>/<metric>`` (mean over seeds at the chosen lr), ``..._std`` (sample std), ``..._ci95``
(half-width of the t-distribution 95% interval; with 2+ seeds), ``downstream/<task>/seed_<s>/<metric>`` and
``downstream/score`` (mean over tasks of each task's primary metric). What was reported where (split, chosen lr, the
whole grid) goes to results.json under ``downstream``.

Long inputs: a single text longer than ``max_seq_len`` becomes overlapping windows (``downstream.finetune.stride``
tokens of overlap); each window is a training example with the text's label, and at evaluation the window logits are
averaged. Sentence pairs are truncated, longer side first (as BERT). Token classification (NER) labels the first
sub-token of each word; every word is predicted once, from the window in which it is most central.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, ListConfig
from torch.utils.data import DataLoader

from mlmlab.data.tasks import TaskSpec, hold_out, task_registry
from mlmlab.data.tokenizer import CLS, PAD, SEP
from mlmlab.errors import ConfigError
from mlmlab.lit.finetune import FinetuneModule

log = logging.getLogger(__name__)
IGNORE = -100


# ----------------------------------------------------------------------------------------------------- encoding


def windows(n: int, body: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) spans of at most ``body`` tokens covering ``range(n)``, consecutive spans overlapping by
    ``stride`` tokens (the last one ends at ``n``)."""
    if n <= body:
        return [(0, n)]
    step = max(1, body - stride)
    starts = list(range(0, n - body, step)) + [n - body]
    return [(s, s + body) for s in starts]


def encode_examples(tok, examples: list[dict], max_seq_len: int, stride: int = 0) -> list[dict]:
    """``[CLS] text [SEP]`` windows (``[CLS] a [SEP] b [SEP]`` for pairs, truncated). Each item has ``doc``: the index
    of its example, so window logits can be averaged back."""
    a = tok.encode_batch([e["text"] for e in examples], add_special_tokens=False)
    b = tok.encode_batch([e["text_b"] for e in examples], add_special_tokens=False) if "text_b" in examples[0] else None
    out = []
    for i, e in enumerate(examples):
        ids_a = a[i].ids
        if b is None:
            for s, t in windows(len(ids_a), max_seq_len - 2, stride):
                out.append({"input_ids": [CLS] + ids_a[s:t] + [SEP], "token_type_ids": None, "label": int(e["label"]),
                            "doc": i})
            continue
        ids_a, ids_b, budget = list(ids_a), list(b[i].ids), max_seq_len - 3
        while len(ids_a) + len(ids_b) > budget:  # truncate the longer side first, as BERT does
            (ids_a if len(ids_a) >= len(ids_b) else ids_b).pop()
        ids = [CLS] + ids_a + [SEP] + ids_b + [SEP]
        types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
        out.append({"input_ids": ids, "token_type_ids": types, "label": int(e["label"]), "doc": i})
    return out


def encode_tokens(tok, examples: list[dict], max_seq_len: int, stride: int) -> tuple[list[dict], list[dict]]:
    """NER windows and, per example, where each word is read from: ``(items, index)``; ``index[i]["at"][w]`` is
    ``(item, position)`` of word ``w``'s first sub-token in the window where it is most central, or None for a word
    that produced no token."""
    encs = tok.encode_batch([e["tokens"] for e in examples], is_pretokenized=True, add_special_tokens=False)
    items, index = [], []
    for i, (e, enc) in enumerate(zip(examples, encs)):
        first: dict[int, int] = {}
        for pos, w in enumerate(enc.word_ids):
            if w is not None and w not in first:
                first[w] = pos
        spans = windows(len(enc.ids), max_seq_len - 2, stride)
        at: list = [None] * len(e["tokens"])
        best = [-1.0] * len(e["tokens"])
        for s, t in spans:
            labels = [IGNORE] * (t - s)
            for w, pos in first.items():
                if s <= pos < t:
                    labels[pos - s] = e["tags"][w]
                    centrality = min(pos - s, t - 1 - pos)
                    if centrality > best[w]:
                        best[w], at[w] = centrality, (len(items), pos - s + 1)  # +1: [CLS]
            items.append({"input_ids": [CLS] + enc.ids[s:t] + [SEP], "token_type_ids": None,
                          "labels": [IGNORE] + labels + [IGNORE], "doc": i})
        index.append({"at": at, "tags": e["tags"]})
    return items, index


def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
    n = max(len(x["input_ids"]) for x in batch)
    ids = torch.full((len(batch), n), PAD, dtype=torch.long)
    types = torch.zeros((len(batch), n), dtype=torch.long)
    token_labels = torch.full((len(batch), n), IGNORE, dtype=torch.long) if "labels" in batch[0] else None
    for i, x in enumerate(batch):
        ids[i, : len(x["input_ids"])] = torch.tensor(x["input_ids"])
        if x["token_type_ids"] is not None:
            types[i, : len(x["token_type_ids"])] = torch.tensor(x["token_type_ids"])
        if token_labels is not None:
            token_labels[i, : len(x["labels"])] = torch.tensor(x["labels"])
    out = {"input_ids": ids, "attention_mask": ids != PAD, "token_type_ids": types}
    out["labels"] = token_labels if token_labels is not None else torch.tensor([x["label"] for x in batch])
    return out


# ----------------------------------------------------------------------------------------------------- metrics


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


PROTOCOL_VERSION = 1  # bump when a change to the fine-tuning code changes its numbers: it keys the random-init cache


def mean_ci95(values: list[float]) -> tuple[float, float, float | None]:
    """Mean, sample std (0 for one value) and the half-width of the t-distribution 95% interval (None for one)
    (:func:`mlmlab.stats.mean_interval`)."""
    from mlmlab.stats import mean_interval

    iv = mean_interval(values)
    return iv.mean, iv.sd, (iv.half if iv.n > 1 else None)


# ----------------------------------------------------------------------------------------------------- evaluation


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


class LengthBucketBatches(torch.utils.data.Sampler):
    """Shuffled batches of similar-length items: each epoch, the items are shuffled (by ``generator``), cut into pools
    of ``pool`` batches, each pool sorted by length and cut into batches, and the batches shuffled. Every item is seen
    once per epoch, as with ``shuffle=True``, at a fraction of the padding (SST-2's training phrases run from 1 to 60
    tokens)."""

    def __init__(self, lengths: list[int], batch_size: int, generator: torch.Generator, pool: int = 50):
        self.lengths, self.bs, self.g, self.pool = lengths, batch_size, generator, pool

    def __iter__(self):
        perm = torch.randperm(len(self.lengths), generator=self.g).tolist()
        batches = []
        for i in range(0, len(perm), self.bs * self.pool):
            chunk = sorted(perm[i : i + self.bs * self.pool], key=lambda j: self.lengths[j])
            batches += [chunk[k : k + self.bs] for k in range(0, len(chunk), self.bs)]
        for k in torch.randperm(len(batches), generator=self.g).tolist():
            yield batches[k]

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.bs)


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


def split_metrics(spec: TaskSpec, split: dict, label_names: list[str], preds: list) -> dict[str, float]:
    """The task's metrics of ``predict``'s output on an encoded split."""
    if spec.kind == "token":
        return entity_f1([[label_names[t] for t in ex["tags"]] for ex in split["index"]],
                         [[label_names[t] for t in p] for p in preds])
    return classification_metrics(torch.tensor(preds), torch.tensor(split["labels"]), len(label_names), spec.metrics)


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


# ----------------------------------------------------------------------------------------------------- protocol


def encode_split(tok, spec: TaskSpec, records: list[dict], f) -> dict:
    if spec.kind == "token":
        items, index = encode_tokens(tok, records, f.max_seq_len, f.stride)
        return {"items": items, "index": index, "n": len(records)}
    items = encode_examples(tok, records, f.max_seq_len, f.stride)
    return {"items": items, "labels": [r["label"] for r in records], "n": len(records)}


def finetune_one(cfg: DictConfig, spec: TaskSpec, encoder_cfg: dict, encoder_state: dict, label_names: list[str],
                 splits: dict, lr: float, seed: int, trainer_kwargs: dict,
                 run_factory: Callable | None = None, reported: str = "test") -> dict[str, dict[str, float]]:
    """Fine-tune one copy; returns the metrics on each evaluated split (``validation`` if present, ``test`` if
    present). ``run_factory(task, lr, seed)``: a W&B run for this fine-tuning (or None)."""
    run = run_factory(spec.name, lr, seed) if run_factory is not None else None
    ok = False
    try:
        out = _finetune_one(cfg, spec, encoder_cfg, encoder_state, label_names, splits, lr, seed, trainer_kwargs, run)
        if run is not None:
            names = {"validation": "selection", "test": reported}
            run.summary.update({f"{names[s]}/{k}": v for s, m in out.items() if s in names for k, v in m.items()})
        ok = True
        return out
    finally:
        if run is not None:
            run.finish(exit_code=0 if ok else 1)


def _finetune_one(cfg: DictConfig, spec: TaskSpec, encoder_cfg: dict, encoder_state: dict, label_names: list[str],
                  splits: dict, lr: float, seed: int, trainer_kwargs: dict, run) -> dict[str, dict[str, float]]:
    f = cfg.downstream.finetune
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
                            token_level=spec.kind == "token")
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


PROTOCOLS = ("finetune", "probe", "both")
PROBE_CS = (0.01, 0.1, 1.0, 10.0)  # inverse L2 strengths tried by the probe's 5-fold cross-validation


@torch.no_grad()
def pooled_features(encoder_cfg: dict, encoder_state: dict, split: dict, pooling: str, precision: str,
                    batch_size: int = 256) -> torch.Tensor:
    """One vector per example of a frozen encoder: the pooled final hidden states of each window (mean over real
    tokens; the last token for a causal encoder; [CLS] with pooling=cls), windows of a long text averaged."""
    from mlmlab.models.encoder import Encoder, EncoderConfig
    from mlmlab.models.heads import pool

    enc = Encoder(EncoderConfig(**encoder_cfg))
    enc.load_state_dict(encoder_state)
    enc.eval()
    items = split["items"]
    feats = torch.zeros(split["n"], enc.config.hidden_size)
    counts = torch.zeros(split["n"])
    order = sorted(range(len(items)), key=lambda i: -len(items[i]["input_ids"]))
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.startswith("bf16"))
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        b = collate([items[j] for j in idx])
        with amp:
            h = enc(b["input_ids"], b["attention_mask"], b["token_type_ids"]).float()
        for j, x in zip(idx, pool(h, b["attention_mask"], pooling)):
            feats[items[j]["doc"]] += x
            counts[items[j]["doc"]] += 1
    return feats / counts.clamp(min=1)[:, None]


@torch.no_grad()
def word_features(encoder_cfg: dict, encoder_state: dict, split: dict, precision: str,
                  batch_size: int = 256) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """NER probe: the frozen encoder's final hidden state at each word's first sub-token, read from the window where the
    word is most central (as fine-tuning predicts it). Returns (features, [(example, word)] of each row); words that
    produced no token have no row."""
    from mlmlab.models.encoder import Encoder, EncoderConfig

    enc = Encoder(EncoderConfig(**encoder_cfg))
    enc.load_state_dict(encoder_state)
    enc.eval()
    items = split["items"]
    wanted: dict[int, list[tuple[int, int, int]]] = {}  # item -> [(position, example, word)]
    for e, ex in enumerate(split["index"]):
        for w, at in enumerate(ex["at"]):
            if at is not None:
                wanted.setdefault(at[0], []).append((at[1], e, w))
    rows: list[tuple[int, int]] = []
    feats: list[torch.Tensor] = []
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.startswith("bf16"))
    order = sorted(wanted, key=lambda i: -len(items[i]["input_ids"]))
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        b = collate([items[j] for j in idx])
        with amp:
            h = enc(b["input_ids"], b["attention_mask"], b["token_type_ids"]).float()
        for k, j in enumerate(idx):
            for pos, e, w in wanted[j]:
                feats.append(h[k, pos])
                rows.append((e, w))
    order_rows = sorted(range(len(rows)), key=lambda r: rows[r])
    x = torch.stack([feats[r] for r in order_rows]) if feats else torch.zeros(0, enc.config.hidden_size)
    return x, [rows[r] for r in order_rows]


def probe_task(spec: TaskSpec, encoder_cfg: dict, encoder_state: dict, splits: dict, label_names: list[str], f,
               trainer_kwargs: dict, key: str | None = None) -> tuple[dict[str, float], dict]:
    """``downstream.protocol=probe|both``: a linear probe on the frozen encoder. Pooled features of the training
    examples -> standardised -> scikit-learn's multinomial logistic regression with L2 strength chosen by 5-fold
    cross-validation on train (``PROBE_CS``); scored on the reported split. Deterministic: no seed noise, so two
    encoders' probe scores differ only by what their features hold. Keys ``probe/<task>/<metric>``."""
    import time

    import numpy as np

    t0 = time.perf_counter()
    pooling = resolve_pooling(f.pooling, encoder_cfg)
    precision = str(trainer_kwargs.get("precision", "32-true"))
    if spec.kind == "token":
        return _token_probe(spec, encoder_cfg, encoder_state, splits, label_names, precision, key, t0)
    x_train = pooled_features(encoder_cfg, encoder_state, splits["train"], pooling, precision).numpy()
    x_test = pooled_features(encoder_cfg, encoder_state, splits["test"], pooling, precision).numpy()
    y_train = splits["train"]["labels"]
    clf = _probe_classifier(y_train)
    clf.fit(x_train, y_train)
    preds = torch.as_tensor(clf.predict(x_test))
    m = classification_metrics(preds, torch.tensor(splits["test"]["labels"]), len(label_names), spec.metrics)
    c = float(np.ravel(clf[-1].C_)[0])
    log.info("probe %s (C=%g, %.1f s): %s", key or spec.name, c, time.perf_counter() - t0, m)
    return ({f"probe/{key or spec.name}/{k}": v for k, v in m.items()},
            {"C": c, "Cs": list(PROBE_CS), "pooling": pooling, "seconds": time.perf_counter() - t0, **m,
             "preds": preds.tolist()})


def _probe_classifier(y_train: list[int], scoring: str = "accuracy"):
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    folds = min(5, min(y_train.count(c) for c in set(y_train)))
    return make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=list(PROBE_CS), cv=max(2, folds), max_iter=2000,
                                                                l1_ratios=(0.0,), scoring=scoring,
                                                                use_legacy_attributes=False))


def _token_probe(spec: TaskSpec, encoder_cfg: dict, encoder_state: dict, splits: dict, label_names: list[str],
                 precision: str, key: str | None, t0: float) -> tuple[dict[str, float], dict]:
    """The NER probe: a per-word logistic regression on the frozen encoder's features (``word_features``), scored by
    entity F1 (seqeval) on the reported split; words without a token get ``O``, as in fine-tuning."""
    import time

    import numpy as np

    x_train, rows_train = word_features(encoder_cfg, encoder_state, splits["train"], precision)
    y_train = [splits["train"]["index"][e]["tags"][w] for e, w in rows_train]
    clf = _probe_classifier(y_train)
    clf.fit(x_train.numpy(), y_train)
    x_test, rows_test = word_features(encoder_cfg, encoder_state, splits["test"], precision)
    fallback = label_names.index("O") if "O" in label_names else 0
    preds = [[fallback] * len(ex["tags"]) for ex in splits["test"]["index"]]
    if rows_test:
        for (e, w), t in zip(rows_test, clf.predict(x_test.numpy())):
            preds[e][w] = int(t)
    m = split_metrics(spec, splits["test"], label_names, preds)
    c = float(np.ravel(clf[-1].C_)[0])
    log.info("probe %s (per word, C=%g, %.1f s): %s", key or spec.name, c, time.perf_counter() - t0, m)
    return ({f"probe/{key or spec.name}/{k}": v for k, v in m.items()},
            {"C": c, "Cs": list(PROBE_CS), "pooling": "first sub-token of each word", "words": len(y_train),
             "seconds": time.perf_counter() - t0, **m, "preds": preds})


def subsample_pairs(pairs: list[dict], n: int | None) -> list[dict]:
    """The same ``n`` pairs of each paradigm in every run (a seeded draw per paradigm, file order kept); None: all."""
    import random

    if n is None:
        return pairs
    by_par: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_par.setdefault(p["paradigm"], []).append(i)
    keep: list[int] = []
    for par, idx in by_par.items():
        keep += idx if len(idx) <= n else sorted(random.Random(f"{par}:0").sample(idx, n))
    return [pairs[i] for i in sorted(keep)]


def zeroshot_task(cfg: DictConfig, tok, spec: TaskSpec, lm, precision: str,
                  unigram_counts=None) -> tuple[dict[str, float], dict]:
    """A minimal-pairs task (mlmlab.zeroshot): accuracy overall (mean over paradigms), per field and per paradigm
    (``downstream/<task>/acc``, ``.../field/<field>/acc``, ``.../paradigm/<paradigm>/acc``); with ``unigram_counts``
    also the unigram floor (``unigram/<task>/...``). The report keeps the per-pair outcomes as one string
    (``items``: ``1`` right, ``0`` wrong, ``-`` tie, in the order of the subsample) for paired per-item tests."""
    import time

    from mlmlab import zeroshot as zs

    if lm is None:
        raise ValueError(f"task {spec.name} is scored zero-shot and needs the pretrained language model")
    z = cfg.downstream.zeroshot
    pairs = subsample_pairs(spec.load(cfg)["pairs"], z.n_per_paradigm)
    t0 = time.perf_counter()
    kind = zs.lm_kind(lm)
    scores = zs.sentence_scores(lm, tok, [p["good"] for p in pairs] + [p["bad"] for p in pairs], z.pll,
                                z.batch_size, precision)
    right = zs.judge(scores[: len(pairs)], scores[len(pairs):], pairs)
    summary = zs.summarize(pairs, right)
    seconds = time.perf_counter() - t0
    scorer = ("summed next-token log-probability (causal LM)" if kind == "clm" else
              f"pseudo-log-likelihood, {z.pll}" + (" (ELECTRA: the generator)" if hasattr(lm, "generator") else ""))
    metrics = _zeroshot_keys(f"downstream/{spec.name}", summary)
    report = {"kind": "minimal_pairs", "scorer": scorer, "n_per_paradigm": z.n_per_paradigm, "pairs": len(pairs),
              "ties": summary["ties"], "unk_pairs": zs.unk_pairs(tok, pairs), "acc": summary["acc"],
              "fields": summary["fields"], "paradigms": summary["paradigms"], "seconds": seconds,
              "source": spec.load(cfg).get("source"),
              "predictions": {"items": "".join("-" if r is None else str(r) for r in right),
                              "pair_ids": [[p["paradigm"], p["pair_id"]] for p in pairs]}}
    if unigram_counts is not None:
        uni = zs.unigram_scores(unigram_counts, tok, [p["good"] for p in pairs] + [p["bad"] for p in pairs])
        u_right = zs.judge(uni[: len(pairs)], uni[len(pairs):], pairs)
        u = zs.summarize(pairs, u_right)
        metrics.update(_zeroshot_keys(f"unigram/{spec.name}", u))
        report["unigram"] = {"acc": u["acc"], "fields": u["fields"], "vs_unigram": zs.mcnemar(right, u_right)}
        report["predictions"]["unigram_items"] = "".join("-" if r is None else str(r) for r in u_right)
    log.info("zero-shot %s: acc %.4f over %d pairs (%d ties, %d with [UNK]) in %.1f s", spec.name, summary["acc"],
             len(pairs), summary["ties"], report["unk_pairs"], seconds)
    return metrics, report


def _zeroshot_keys(prefix: str, summary: dict) -> dict[str, float]:
    from mlmlab.zeroshot import slug

    out = {f"{prefix}/acc": summary["acc"]}
    out.update({f"{prefix}/field/{slug(k)}/acc": v for k, v in summary["fields"].items()})
    out.update({f"{prefix}/paradigm/{k}/acc": v for k, v in summary["paradigms"].items()})
    return out


def learning_rates(lr) -> list[float]:
    return [float(x) for x in lr] if isinstance(lr, (list, tuple, ListConfig)) else [float(lr)]


def label_budgets(value) -> list[int | None]:
    """``downstream.max_train_examples``: null (all), N, or a list of label budgets [250, 1000, 4000]."""
    return [int(x) for x in value] if isinstance(value, (list, tuple, ListConfig)) else [value]


def task_runs(cfg: DictConfig) -> list[tuple[str, TaskSpec, int | None]]:
    """``(key, spec, label budget)`` for every task of ``downstream.tasks``: the key is the task's name, or
    ``<task>@<N>`` for each budget when ``downstream.max_train_examples`` is a list (a label-budget curve, one score
    per budget: ``downstream/sst2@250/acc`` ...). Zero-shot tasks take no labels and run once."""
    tasks = task_registry(cfg)
    value = cfg.downstream.max_train_examples
    curve = isinstance(value, (list, tuple, ListConfig))
    out = []
    for name in cfg.downstream.tasks:
        spec = tasks[name]
        if spec.kind == "minimal_pairs" or not curve:
            out.append((name, spec, None if curve else value))
        else:
            out += [(f"{name}@{n}", spec, n) for n in label_budgets(value)]
    return out


def selection_from_train(cfg: DictConfig, data: dict) -> bool:
    f = cfg.downstream.finetune
    selection = len(learning_rates(f.lr)) > 1 or f.early_stopping_patience is not None
    return selection and not ("test" in data and "validation" in data)


def check_label_budgets(cfg: DictConfig) -> None:
    """A label budget larger than a task's training examples (after a selection split held out of train): a
    ConfigError naming the key, the task and the number available. Call after the tasks are loaded."""
    for _key, spec, n in task_runs(cfg):
        if n is None or spec.kind == "minimal_pairs":
            continue
        data = spec.load(cfg)
        have = len(data["train"])
        if selection_from_train(cfg, data):
            have -= max(1, int(round(cfg.downstream.val_fraction * have)))
        if n > have:
            raise ConfigError(f"downstream.max_train_examples: {n} for task {spec.name} is more than its {have} "
                              f"training examples" + (" (after the selection split held out of train)"
                                                      if selection_from_train(cfg, data) else ""))


def run_task(cfg: DictConfig, tok, spec: TaskSpec, encoder_cfg: dict, encoder_state: dict,
             trainer_kwargs: dict, run_factory: Callable | None = None, key: str | None = None,
             budget: int | None = None) -> tuple[dict[str, float], dict]:
    """One task (or one label budget of it: ``key`` names its metrics, ``budget`` caps its training examples)."""
    ds, f = cfg.downstream, cfg.downstream.finetune
    key = key or spec.name
    data = spec.load(cfg)
    lrs = learning_rates(f.lr)
    selection = len(lrs) > 1 or f.early_stopping_patience is not None
    has_test = "test" in data
    reported = "test" if has_test else "validation"
    # internally "test" is the reported split and "validation" the selection split (lr grid, early stopping); a task
    # without labelled test data reports its official validation split, so selection then uses a part of train
    records = {"train": data["train"], "test": data[reported]}
    from_train = False
    if selection:
        if has_test and "validation" in data:
            records["validation"] = data["validation"]
        else:
            records["train"], records["validation"] = hold_out(data["train"], ds.val_fraction)
            from_train = True
    if budget is not None:
        records["train"] = records["train"][:budget]
    if "validation" in records and ds.max_selection_examples is not None:  # scored after every epoch of every run
        records["validation"] = records["validation"][: ds.max_selection_examples]
    splits = {s: encode_split(tok, spec, r, f) for s, r in records.items()}
    names_of = {"train": "train", "validation": "selection", "test": reported}
    metrics: dict[str, float] = {}
    report: dict = {"reported_split": reported, "main_metric": spec.main_metric,
                    "source": data.get("source", "generated"), "label_names": data["label_names"],
                    "n": {names_of[s]: v["n"] for s, v in splits.items()}}
    report["predictions"] = {"split": reported, "truth": [ex["tags"] for ex in splits["test"]["index"]]
                             if spec.kind == "token" else splits["test"]["labels"]}
    if ds.protocol in ("probe", "both"):
        pm, report["probe"] = probe_task(spec, encoder_cfg, encoder_state, splits, data["label_names"], f, trainer_kwargs,
                                         key)
        metrics.update(pm)
        report["predictions"]["probe"] = report["probe"].pop("preds")
    if ds.protocol == "probe":
        return metrics, report
    grid: dict[float, dict[int, dict]] = {}
    preds: dict[float, dict[int, list]] = {}
    import time

    t0, total, done = time.perf_counter(), len(lrs) * len(ds.seeds), 0
    for lr in lrs:
        for seed in ds.seeds:
            label = f"{key} lr {lr:g} seed {seed} (run {done + 1}/{total})"
            grid.setdefault(lr, {})[seed] = finetune_one(cfg, spec, encoder_cfg, encoder_state, data["label_names"],
                                                         splits, lr, seed, {**trainer_kwargs, "label": label},
                                                         run_factory, reported)
            preds.setdefault(lr, {})[seed] = grid[lr][seed].pop("test_preds", None)
            done += 1
            per_run = (time.perf_counter() - t0) / done
            log.info("downstream %s: %s (%.0f s per run, %.0f s left for this task)", label, grid[lr][seed], per_run,
                     per_run * (total - done))
    main = spec.main_metric
    best_lr = lrs[0] if len(lrs) == 1 else max(
        lrs, key=lambda lr: statistics.fmean(r["validation"][main] for r in grid[lr].values()))
    names = list(next(iter(grid[best_lr].values()))["test"])
    for m in names:
        vals = [grid[best_lr][s]["test"][m] for s in ds.seeds]
        mean, std, ci = mean_ci95(vals)
        metrics[f"downstream/{key}/{m}"], metrics[f"downstream/{key}/{m}_std"] = mean, std
        if ci is not None:
            metrics[f"downstream/{key}/{m}_ci95"] = ci
        for s, v in zip(ds.seeds, vals):
            metrics[f"downstream/{key}/seed_{s}/{m}"] = v
    report.setdefault("predictions", {}).update(
        split=reported, lr=best_lr, seeds={str(sd): preds[best_lr][sd] for sd in ds.seeds})
    report.update({"best_lr": best_lr, "lrs": lrs,
                   "selection_split": None if not selection else ("train (held out)" if from_train else "validation"),
                   "grid": {str(lr): {str(s): {names_of[k]: v for k, v in r.items()} for s, r in by_seed.items()}
                            for lr, by_seed in grid.items()}})
    return metrics, report


def run_downstream(cfg: DictConfig, tok, encoder_cfg: dict, encoder_state: dict, trainer_kwargs: dict,
                   run_factory: Callable | None = None, lm=None,
                   unigram_counts=None) -> tuple[dict[str, float], dict]:
    """Every task of ``downstream.tasks``: fine-tuned / probed from ``encoder_state``, or, for a minimal-pairs task,
    scored zero-shot with ``lm`` (the whole pretrained language model; ``unigram_counts``: also the unigram floor)."""
    metrics: dict[str, float] = {}
    report: dict = {}
    main_scores: dict[str, float] = {}  # per task: its largest label budget's score (the last in task_runs order)
    for key, spec, budget in sorted(task_runs(cfg), key=lambda r: (r[2] is not None, r[2] or 0)):
        if spec.kind == "minimal_pairs":
            m, report[key] = zeroshot_task(cfg, tok, spec, lm, str(trainer_kwargs.get("precision", "32-true")),
                                           unigram_counts if cfg.downstream.zeroshot.unigram_floor else None)
        else:
            m, report[key] = run_task(cfg, tok, spec, encoder_cfg, encoder_state, trainer_kwargs, run_factory, key,
                                      budget)
        metrics.update(m)
        # the score follows the protocol: fine-tuning where it ran, else the probe
        main_scores[spec.name] = m.get(f"downstream/{key}/{spec.main_metric}", m.get(f"probe/{key}/{spec.main_metric}"))
    metrics["downstream/score"] = statistics.fmean(main_scores.values()) if main_scores else float("nan")
    return metrics, report


def save_predictions(out_dir, record) -> None:
    """Move the per-item predictions out of the run record into ``<run dir>/predictions/<arm>.json`` (arm: pretrained,
    random_init), one entry per task key: the reported split, its truth, the chosen lr and each fine-tuning seed's
    predicted labels (NER: tag ids per word), the probe's, or a zero-shot task's outcomes (``1`` right, ``0`` wrong,
    ``-`` tie per pair). ``mlmlab.analysis`` pairs two such files item by item (McNemar, paired bootstrap)."""
    import json
    from pathlib import Path

    for arm, section in (("pretrained", "downstream"), ("random_init", "downstream_random_init")):
        report = record.data.get(section) or {}
        preds = {k: r.pop("predictions") for k, r in report.items() if isinstance(r, dict) and "predictions" in r}
        if preds:
            d = Path(out_dir) / "predictions"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{arm}.json").write_text(json.dumps(preds, separators=(",", ":")))


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

