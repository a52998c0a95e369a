"""Linear probes on the frozen encoder (scikit-learn logistic regression, deterministic): pooled features per text,
first sub-token per word."""

from __future__ import annotations

import logging

import torch

from mlmlab.data.tasks import TaskSpec
from mlmlab.downstream.encoding import collate
from mlmlab.downstream.finetuning import resolve_pooling
from mlmlab.downstream.scoring import classification_metrics, split_metrics

log = logging.getLogger(__name__)


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
