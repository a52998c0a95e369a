"""The random-init baseline of a job: the same downstream protocol on the untrained encoder of the job's seed, its
cache (once per tokenizer, shape, seed, protocol, precision and CPU kind: shared by every arm and sweep), and the
paired gains over it."""

from __future__ import annotations

import logging
from pathlib import Path

from mlmlab.config import plain

log = logging.getLogger(__name__)
# data.* keys that only say how the pretraining corpus is loaded: the random-init row does not depend on them, so arms
# that differ only there (data.batch_size=16 against 32) share it
LOADER_ONLY = ("batch_size", "val_batch_size", "num_workers", "num_proc", "max_val_blocks")


def random_init_baseline(p, data, cache_dir: str, trainer_kw: dict, tok, encoder_cfg: dict, ft: dict, record,
                         seed: int, start=None) -> dict[str, float]:
    """``downstream.random_init_baseline=true``: the same downstream protocol (``p``, a
    :class:`mlmlab.downstream.Protocol`: tasks, lr grid chosen on its own, seeds) on the encoder the pretraining started
    from, with the job's Trainer arguments (``trainer_kw``); cached (``paths.cache_dir``) under a key that holds the
    pretraining ``data.*``. Without ``start`` that encoder is the untrained init of ``seed`` (as ``objective=none``
    gets it): ``random_init/<task>/...`` and the paired gains ``gain/<task>/...`` (mlmlab.downstream.paired_gain).
    With ``start`` (``init.*``, an :class:`mlmlab.init.Start`) it is the start itself ("no continued pretraining"):
    ``start/<task>/...`` and ``gain/<task>/...`` over it, and the untrained init as well, ``random_init/<task>/...``
    with ``gain_random_init/<task>/...``: both gains, each row computed once per sweep (cached)."""
    import torch
    from pytorch_lightning.utilities.seed import isolate_rng

    from mlmlab.models.encoder import BertForMLM, CausalLM, EncoderConfig

    with isolate_rng():
        torch.manual_seed(seed)
        c = EncoderConfig(**encoder_cfg)
        model = CausalLM(c) if c.causal else BertForMLM(c)
        state = {k: v.detach().clone() for k, v in model.bert.state_dict().items()}
    if start is None:
        return _baseline(p, data, cache_dir, trainer_kw, tok, encoder_cfg, ft, record, seed, state, model,
                         ("random_init", "gain", "downstream_random_init"), None)
    out = _baseline(p, data, cache_dir, trainer_kw, tok, encoder_cfg, ft, record, seed, start.encoder_state,
                    start.model(), ("start", "gain", "downstream_start"), start.record["sha256"])
    out.update(_baseline(p, data, cache_dir, trainer_kw, tok, encoder_cfg, ft, record, seed, state, model,
                         ("random_init", "gain_random_init", "downstream_random_init"), None))
    return out


def _baseline(p, data, cache_dir: str, trainer_kw: dict, tok, encoder_cfg: dict, ft: dict, record, seed: int,
              state: dict, model, names: tuple[str, str, str], start_sha: str | None) -> dict[str, float]:
    """One baseline row (``names``: its metrics' prefix, its gains' prefix, its record key) of the encoder ``state``
    (``model``: the whole LM, for zero-shot tasks)."""
    from mlmlab.downstream import paired_gain, run_downstream, task_runs

    rows, gains, rec_key = names

    def compute() -> tuple[dict, dict]:
        return run_downstream(p, tok, encoder_cfg, state, {**trainer_kw, "devices": 1}, lm=model)

    with record.timer(f"finetune_{rows}"):
        if p.ds.reuse_random_init:
            base, report, reused = cached_random_init(p, data, cache_dir, trainer_kw["precision"], tok, encoder_cfg,
                                                      seed, compute, start_sha)
            if reused:
                report = {**report, "reused_from": reused}
                log.info("%s baseline: reused %s (same tokenizer, encoder, seed and protocol)", rows, reused)
        else:
            base, report = compute()
    record.set(**{rec_key: report})
    mains = {key: spec.main_metric for key, spec, _ in task_runs(p)}
    gain = paired_gain(ft, base, mains, list(p.ds.seeds)) if p.ds.protocol != "probe" else {}
    gain.update(zeroshot_gain(record.data.get("downstream") or {}, report))
    gain = {gains + k[len("gain"):]: v for k, v in gain.items()}
    log.info("%s baseline: %s", rows, {k: round(v, 4) for k, v in {**base, **gain}.items() if "seed_" not in k})
    probe_gains = "gain_probe" + gains[len("gain"):]  # gain_probe/, gain_probe_random_init/
    probe = {f"{probe_gains}/{k.split('/', 1)[1]}": ft[k] - base[k] for k in ft if k.startswith("probe/") and k in base}
    renamed = {(f"{rows}_probe/" if k.startswith("probe/") else f"{rows}/") + k.split("/", 1)[1]: v
               for k, v in base.items()}
    return {**renamed, **gain, **probe}


def cached_random_init(p, data, cache_dir: str, precision: str, tok, encoder_cfg: dict, seed: int,
                       compute, start_sha: str | None = None) -> tuple[dict, dict, str | None]:
    """The random-init row once per sweep: its metrics and report (per-item predictions included) cached under a hash
    of everything it depends on -- the tokenizer, the encoder's shape, the init seed, the data config (built-in tasks
    are generated from it), the whole downstream protocol and its code's version, the precision and the CPU kind
    (:func:`mlmlab.hardware.cpu_kind`) -- so the jobs of a sweep that share them
    (15% vs 40% masking at the same seed, say) fine-tune the untrained encoder once. Returns (metrics, report, the
    cache path when it was reused, else None)."""
    import hashlib
    import json

    from mlmlab.data.cache import cached_file

    # (only_declared: which tasks and budgets this row has is already in tasks / max_train_examples)
    ds = {k: v for k, v in plain(p.ds).items() if k not in ("wandb_runs", "reuse_random_init", "only_declared")}
    if ds.get("finetune", {}).get("layer_decay") is None:  # the option's default: the keys of earlier rows still hold
        ds["finetune"] = {k: v for k, v in ds["finetune"].items() if k != "layer_decay"}
    if ds.get("score_split") == "reported":  # likewise: a screen's rows (score_split=selection) are keyed apart
        del ds["score_split"]
    from mlmlab.downstream import PROTOCOL_VERSION
    from mlmlab.hardware import cpu_kind

    key = {"kind": "random_init_v2", "tokenizer_sha": hashlib.sha256(tok.to_str().encode()).hexdigest(),
           "encoder": encoder_cfg, "seed": seed, "downstream": ds,
           "data": {k: v for k, v in plain(data).items() if k not in LOADER_ONLY},
           "data_dir": str(p.src.root), "precision": precision,
           "protocol": PROTOCOL_VERSION, "cpu": cpu_kind()}  # the same job moves ~1 point between CPU kinds
    if start_sha is not None:  # init.*: the start's row -- its weights, the same whatever this job's seed
        key = {**{k: v for k, v in key.items() if k != "seed"}, "start_sha256": start_sha}
    built = False

    def build(tmp: Path) -> None:
        nonlocal built
        base, report = compute()
        tmp.write_text(json.dumps({"metrics": base, "report": report}, default=str))
        built = True

    path = cached_file(cache_dir, "random_init", key, "random_init.json", build)
    data = json.loads(path.read_text())
    return data["metrics"], data["report"], None if built else str(path)


def zeroshot_gain(pretrained: dict, baseline: dict) -> dict[str, float]:
    """Minimal-pairs tasks: ``gain/<task>/acc`` (pretrained minus random init) and ``gain/<task>/acc_p``, the exact
    McNemar test on the same pairs (mlmlab.zeroshot.mcnemar)."""
    from mlmlab.zeroshot import mcnemar

    out: dict[str, float] = {}
    for task, rep in pretrained.items():
        if rep.get("kind") != "minimal_pairs" or task not in baseline:
            continue
        parse = lambda items: [None if c == "-" else int(c) for c in items]  # noqa: E731
        test = mcnemar(parse(rep["predictions"]["items"]), parse(baseline[task]["predictions"]["items"]))
        out[f"gain/{task}/acc"] = rep["acc"] - baseline[task]["acc"]
        out[f"gain/{task}/acc_p"] = test["p"]
        rep["vs_random_init"] = test
    return out


def unigram_reference(counts, labels) -> dict[str, float]:
    """The unigram plateau an MLM must leave: ``unigram_entropy`` of the training tokens (nats) and ``unigram_loss_eval``,
    the cross-entropy of that unigram distribution (add-one smoothed) on the fixed evaluation targets -- what
    ``val/mlm_loss_*`` would read for a model that ignores the context."""

    c = counts.double()
    p = c[c > 0] / c.sum()
    targets = labels[labels != -100].long()
    q = (c + 1) / (c.sum() + len(c))
    return {"unigram_entropy": float(-(p * p.log()).sum()),
            "unigram_loss_eval": float(-q[targets].log().mean()) if targets.numel() else float("nan")}
