"""The downstream protocol: every task of ``downstream.tasks`` at each label budget, learning rate and fine-tuning seed
(or probed, or scored zero-shot); the lr chosen on the selection split; the metrics and the report."""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from mlmlab.data.tasks import TaskSource, TaskSpec, hold_out, task_registry
from mlmlab.downstream.encoding import encode_split
from mlmlab.downstream.finetuning import finetune_one
from mlmlab.downstream.minimal_pairs import zeroshot_task
from mlmlab.downstream.probes import probe_task
from mlmlab.downstream.scoring import mean_ci95
from mlmlab.errors import ConfigError

log = logging.getLogger(__name__)
UNK_WARN = 0.02  # a share of [UNK] tokens in a task's training inputs above which the job warns


def unk_fraction(items: list[dict]) -> float:
    """The share of [UNK] among the tokens of encoded items ([CLS] and [SEP] left out)."""
    from mlmlab.data.tokenizer import CLS, SEP, UNK

    ids = [i for it in items for i in it["input_ids"] if i not in (CLS, SEP)]
    return sum(1 for i in ids if i == UNK) / max(1, len(ids))


PROTOCOL_VERSION = 1  # bump when a change to the fine-tuning code changes its numbers: it keys the random-init cache


PROTOCOLS = ("finetune", "probe", "both")


@dataclass
class Protocol:
    """What the downstream stage reads of a job's config: ``downstream.*`` (``ds``: tasks, seeds, label budgets, the
    fine-tuning settings, the protocol) and where the tasks' data comes from (``src``)."""
    ds: Any
    src: TaskSource

    @classmethod
    def of(cls, paths, data, downstream) -> Protocol:
        """From the ``paths``, ``data`` and ``downstream`` groups (typed, or composed nodes, which become their typed
        owner here: below, ``ds`` is always a ``DownstreamConfig``)."""
        if isinstance(downstream, DictConfig):
            downstream = OmegaConf.to_object(downstream)
        return cls(downstream, TaskSource.of(paths, data, downstream))

    @property
    def tasks(self) -> dict[str, TaskSpec]:
        """The task registry with ``downstream.task_dirs``."""
        return task_registry(self.ds.task_dirs)


def learning_rates(lr) -> list[float]:
    return [float(x) for x in lr] if isinstance(lr, (list, tuple, ListConfig)) else [float(lr)]


def label_budgets(value) -> list[int | None]:
    """``downstream.max_train_examples``: null (all), N, or a list of label budgets [250, 1000, 4000]."""
    return [int(x) for x in value] if isinstance(value, (list, tuple, ListConfig)) else [value]


def task_runs(p: Protocol) -> list[tuple[str, TaskSpec, int | None]]:
    """``(key, spec, label budget)`` for every task of ``downstream.tasks``: the key is the task's name, or
    ``<task>@<N>`` for each budget when ``downstream.max_train_examples`` is a list (a label-budget curve, one score
    per budget: ``downstream/sst2@250/acc`` ...). Zero-shot tasks take no labels and run once."""
    tasks = p.tasks
    value = p.ds.max_train_examples
    curve = isinstance(value, (list, tuple, ListConfig))
    out = []
    for name in p.ds.tasks:
        spec = tasks[name]
        if spec.kind == "minimal_pairs" or not curve:
            out.append((name, spec, None if curve else value))
        else:
            out += [(f"{name}@{n}", spec, n) for n in label_budgets(value)]
    return out


def selection_from_train(f, data: dict) -> bool:
    """Whether the selection split (``downstream.finetune.*``, ``f``: an lr grid or early stopping) comes out of train."""
    selection = len(learning_rates(f.lr)) > 1 or f.early_stopping_patience is not None
    return selection and not ("test" in data and "validation" in data)


def check_label_budgets(p: Protocol) -> None:
    """A label budget larger than a task's training examples (after a selection split held out of train): a
    ConfigError naming the key, the task and the number available. Call after the tasks are loaded."""
    f = p.ds.finetune
    for _key, spec, n in task_runs(p):
        if n is None or spec.kind == "minimal_pairs":
            continue
        data = spec.load(p.src)
        have = len(data["train"])
        held = p.ds.score_split == "selection" or selection_from_train(f, data)
        if held:
            have = len(hold_out(data["train"], p.ds.val_fraction, spec.phrases)[0])
        if n > have:
            raise ConfigError(f"downstream.max_train_examples: {n} for task {spec.name} is more than its {have} "
                              f"training examples" + (" (after the selection split held out of train)"
                                                      if held else ""))


def run_task(p: Protocol, tok, spec: TaskSpec, encoder_cfg: dict, encoder_state: dict,
             trainer_kwargs: dict, run_factory: Callable | None = None, key: str | None = None,
             budget: int | None = None) -> tuple[dict[str, float], dict]:
    """One task (or one label budget of it: ``key`` names its metrics, ``budget`` caps its training examples)."""
    ds, f = p.ds, p.ds.finetune
    key = key or spec.name
    data = spec.load(p.src)
    lrs = learning_rates(f.lr)
    selection = len(lrs) > 1 or f.early_stopping_patience is not None
    has_test = "test" in data
    reported = "test" if has_test else "validation"
    # internally "test" is the reported split and "validation" the selection split (lr grid, early stopping); a task
    # without labelled test data reports its official validation split, so selection then uses a part of train
    records = {"train": data["train"], "test": data[reported]}
    from_train = False
    if ds.score_split == "selection":  # a screen: score the selection split (held out of train), never the reported
        records["train"], records["test"] = hold_out(data["train"], ds.val_fraction, spec.phrases)
        reported, from_train = "selection", True
        if selection:  # an lr grid / early stopping selects on the same held-out part: all of the job is selection
            records["validation"] = records["test"]
    elif selection:
        if has_test and "validation" in data:
            records["validation"] = data["validation"]
        else:
            records["train"], records["validation"] = hold_out(data["train"], ds.val_fraction, spec.phrases)
            from_train = True
    if budget is not None:
        records["train"] = records["train"][:budget]
    if "validation" in records and ds.max_selection_examples is not None:  # scored after every epoch of every run
        records["validation"] = records["validation"][: ds.max_selection_examples]
    splits = {s: encode_split(tok, spec, r, f) for s, r in records.items()}
    unk = unk_fraction(splits["train"]["items"])
    if unk > UNK_WARN:  # a tokenizer trained on other text (mlmlab.finetune of another corpus's checkpoint)
        log.warning("%s: %.1f%% of the training inputs' tokens are [UNK] under this encoder's tokenizer; its text is "
                    "not the text the tokenizer was trained on", key, 100 * unk)
    names_of = {"train": "train", "validation": "selection", "test": reported}
    if reported == "selection":  # the scored part and the lr grid's (its first max_selection_examples) apart
        names_of["validation"] = "selection (lr grid / early stopping)"
    metrics: dict[str, float] = {}
    report: dict = {"reported_split": reported if reported != "selection" else
                    f"selection (held out of train, n={len(records['test'])})", "main_metric": spec.main_metric,
                    "source": data.get("source", "generated"), "label_names": data["label_names"],
                    "n": {names_of[s]: v["n"] for s, v in splits.items()}, "unk_frac": unk}
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
            grid.setdefault(lr, {})[seed] = finetune_one(f, spec, encoder_cfg, encoder_state, data["label_names"],
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
                   "selection_split": None if not selection else (
                       ("train (held out by sentence)" if spec.phrases else "train (held out)") if from_train
                       else "validation"),
                   "grid": {str(lr): {str(s): {names_of[k]: v for k, v in r.items()} for s, r in by_seed.items()}
                            for lr, by_seed in grid.items()}})
    return metrics, report


def run_downstream(p: Protocol, tok, encoder_cfg: dict, encoder_state: dict, trainer_kwargs: dict,
                   run_factory: Callable | None = None, lm=None,
                   unigram_counts=None) -> tuple[dict[str, float], dict]:
    """Every task of ``downstream.tasks``: fine-tuned / probed from ``encoder_state``, or, for a minimal-pairs task,
    scored zero-shot with ``lm`` (the whole pretrained language model; ``unigram_counts``: also the unigram floor)."""
    metrics: dict[str, float] = {}
    report: dict = {}
    main_scores: dict[str, float] = {}  # per task: its largest label budget's score (the last in task_runs order)
    z = p.ds.zeroshot
    for key, spec, budget in sorted(task_runs(p), key=lambda r: (r[2] is not None, r[2] or 0)):
        if spec.kind == "minimal_pairs":
            m, report[key] = zeroshot_task(z, p.src, tok, spec, lm, str(trainer_kwargs.get("precision", "32-true")),
                                           unigram_counts if z.unigram_floor else None)
        else:
            m, report[key] = run_task(p, tok, spec, encoder_cfg, encoder_state, trainer_kwargs, run_factory, key,
                                      budget)
        metrics.update(m)
        # the score follows the protocol: fine-tuning where it ran, else the probe
        main_scores[spec.name] = m.get(f"downstream/{key}/{spec.main_metric}", m.get(f"probe/{key}/{spec.main_metric}"))
    metrics["downstream/score"] = statistics.fmean(main_scores.values()) if main_scores else float("nan")
    return metrics, report


def curve_evaluator(p: Protocol, n_per_paradigm: int | None, tok, encoder_cfg: dict, precision: str) -> Callable:
    """``eval.zeroshot_every_n_steps``: what mlmlab.lit.curves.EvalCurve runs on the module being pretrained -- each
    minimal-pairs task of ``downstream.tasks`` zero-shot (``eval.zeroshot_n_per_paradigm`` pairs per paradigm, no
    unigram floor) and the linear probe of each classification task (at the largest label budget)."""
    zeroshot = dataclasses.replace(p.ds.zeroshot, n_per_paradigm=n_per_paradigm, unigram_floor=False)
    sub = Protocol(dataclasses.replace(p.ds, protocol="probe", zeroshot=zeroshot), p.src)
    budgets = label_budgets(p.ds.max_train_examples)
    budget = None if None in budgets else max(budgets)
    tasks = p.tasks

    def evaluate(module) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in p.ds.tasks:
            spec = tasks[name]
            if spec.kind == "minimal_pairs":
                m, _ = zeroshot_task(sub.ds.zeroshot, p.src, tok, spec, module.model, precision)
                out[f"curve/{name}/acc"] = m[f"downstream/{name}/acc"]
            elif spec.kind != "token":
                state = {k: v.detach().cpu().clone() for k, v in module.encoder().state_dict().items()}
                m, _ = run_task(sub, tok, spec, encoder_cfg, state, {"precision": precision}, budget=budget)
                out.update({f"curve/{k}": v for k, v in m.items()})
        return out

    return evaluate
