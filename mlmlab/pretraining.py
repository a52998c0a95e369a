"""The pretraining stages of a job (``mlmlab.train``) and their named results (:class:`Data`, :class:`MaskingPlan`,
:class:`Pretraining`), each stage taking the groups it uses -- ``trainer.*`` and
``data.*`` as their typed owners (``TrainerConfig``, ``DataConfig``), the step's cost (:class:`mlmlab.flops.StepCost`),
the module built by the job -- and returning named results: the budget turned into steps (calibrated when it is in
seconds), the Trainer with its guard and evaluation curve (:class:`Pretraining`), the fit and its training metrics,
and the fixed-mask evaluation."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmlab.errors import ConfigError
from mlmlab.flops import StepCost, steps_for_budget
from mlmlab.job import trainer_kwargs, wandb_barrier

log = logging.getLogger(__name__)


@dataclass
class Data:
    """Stage 1's output: the tokenizer, the packed training blocks, the validation blocks (at most
    ``data.max_val_blocks``), the sampler context (unigram counts, domain vocabularies) and the corpus statistics."""
    tok: Any
    train_blocks: dict
    val_blocks: dict
    ctx: Any
    stats: dict
    packing: dict
    source_val: list = field(default_factory=list)  # eval.per_source: each data.mix source's validation blocks

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()


@dataclass
class MaskingPlan:
    """Stage 2's output, the one place a run's masking is decided: the recipe the pretraining module masks with
    (masker, rate schedule, random source, special ids: ``mask.*``) and the fixed evaluation masks of the validation
    blocks (``eval.*``)."""
    recipe: Any  # mlmlab.masking.MaskingRecipe
    fixed: Any  # MaskedBatch of the validation blocks
    val: dict  # what the data module serves for validation
    suffix: str  # the fixed-mask metrics' suffix (r15): val/mlm_loss_<suffix>
    # scored once at the end, {metric suffix: validation dict}: eval.units after the first (r15w), eval.per_source (r15_mix<i>)
    extra_val: dict = field(default_factory=dict)

    @property
    def sampler(self):
        return self.recipe.masker.sampler

    @property
    def schedule(self):
        return self.recipe.schedule


@dataclass
class Pretraining:
    """What :func:`build_trainer` returns: the module, its Trainer, the guard (checkpoints, non-finite losses, resume
    state), the evaluation curve (``eval.zeroshot_every_n_steps``) and the checkpoint a resumed run continues."""
    module: Any
    trainer: Any
    guard: Any
    curve: Any = None
    resume_from: Path | None = None


@dataclass
class StepPlan:
    """How long pretraining runs: the step count and its accounting (``budget`` in results.json: tokens, FLOPs and,
    for ``trainer.budget.seconds``, the calibration that chose the steps)."""

    max_steps: int
    budget: dict


def plan_budget(t, cost: StepCost, record) -> StepPlan:
    """The step count of ``trainer.max_steps`` or of a token / FLOP budget, and its accounting (recorded)."""
    try:
        max_steps, budget = steps_for_budget(t, cost)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    record.set(budget=budget)
    if t.budget.seconds is None and cost.objective.name != "none":
        _say_plan(t, budget)
    return StepPlan(max_steps, budget)


def _say_plan(t, budget: dict, cal: dict | None = None) -> None:
    """The plan before training: steps, tokens, FLOPs and where they came from; for a seconds budget, the expected
    time of fit at the probe's speed."""
    b = t.budget
    source = next((f"trainer.budget.{k}={getattr(b, k):g}" for k in ("tokens", "flops", "seconds")
                   if getattr(b, k) is not None),
                  f"trainer.max_steps={t.max_steps}")
    when = f"; expected {cal['expected_fit_s'] / 60:.1f} min of training at the probe's speed" if cal and \
        "expected_fit_s" in cal else ""
    log.info("pretraining plan (%s): %d steps, %.3g tokens, %.3g FLOPs%s", source, budget["steps"], budget["tokens"],
             budget["flops"], when)


def calibrate_budget(t, resume: str | None, probe: Callable[[], dict], cost: StepCost, record,
                     plan: StepPlan) -> StepPlan:
    """``trainer.budget.seconds`` only: the step count that fills the seconds (``probe()``: a timing probe, see
    :func:`calibrate_seconds`), recorded; a resumed run keeps the step count it was calibrated to. Otherwise ``plan``
    as it was."""
    if t.budget.seconds is None or cost.objective.name == "none":
        return plan
    if resume is not None:
        import torch

        from mlmlab.checkpoint import resume_path

        ckpt = torch.load(resume_path(resume), map_location="cpu", weights_only=False, mmap=True)
        cal = {"seconds": float(t.budget.seconds), "resumed": True,
               "steps": int(ckpt["hyper_parameters"]["max_steps"])}
        log.info("trainer.budget.seconds=%g, resumed: the run's calibrated %d steps", cal["seconds"], cal["steps"])
    else:
        with record.timer("calibrate"):
            cal = probe()
        log.info("trainer.budget.seconds=%g: %d steps (%.3f s/step, %.2f s per validation, probe %.1f s)",
                 cal["seconds"], cal["steps"], cal["s_per_step"], cal["val_s"], cal["probe_s"])
    max_steps, budget = steps_for_budget(t, cost, steps=cal["steps"])
    budget["calibration"] = cal
    record.set(budget=budget)
    _say_plan(t, budget, cal)
    return StepPlan(max_steps, budget)


def calibrate_seconds(t, d, make_module: Callable[[int], Any], dm) -> dict:
    """``trainer.budget.seconds`` -> the step count that fills it (mlmlab.lit.calibrate), timed on this machine with
    modules from ``make_module(max_steps)``."""
    from mlmlab.lit.calibrate import calibrate_steps

    kw = {**trainer_kwargs(t), "devices": 1, "gradient_clip_val": t.gradient_clip_val,
          "accumulate_grad_batches": t.accumulate_grad_batches}
    return calibrate_steps(lambda: make_module(1000), dm.train_set, dm.val_set, d.batch_size, d.val_batch_size, kw,
                           float(t.budget.seconds), t.val_check_interval)


def build_trainer(t, module, dm, out_dir: Path, record, max_steps: int, budget: dict, run_info, *, run=None,
                  flush_seconds: float = 2.0, curve=None, resume_from: Path | None = None,
                  trains: bool = True) -> Pretraining:
    """The Trainer of ``trainer.*`` for ``module``: the guard, the run-info callback (``run_info``), the W&B logger
    (``run``; a checkpoint waits ``flush_seconds`` for W&B's log), the throughput meter and the evaluation ``curve``.
    ``trains``: false for objective=none (no budget to reconcile with the real world size)."""
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import WandbLogger

    from mlmlab.guard import Guard
    from mlmlab.lit.calibrate import Throughput
    from mlmlab.lit.faults import fault_callbacks

    if t.compile and trains:
        module.encoder().compile()  # in place: the state dict keeps its keys (checkpoints, export, fine-tuning)
    guard = Guard(out_dir / "checkpoints", t.checkpoint_every_n_steps, t.nonfinite, dm.sampler,
                  out_dir / "train_log.jsonl", t.log_every_n_steps)
    if run is not None:  # what W&B logged before a checkpoint is on disk when the checkpoint is (a SIGKILL keeps it)
        guard.after_save.append(lambda: wandb_barrier(run, flush_seconds))
    before, after = fault_callbacks()  # test-only (MLMLAB_FAULT_*): none in a normal job
    callbacks = [run_info, *before, guard, *after]
    if t.enable_progress_bar:
        from mlmlab.lit.progress import StepProgressBar

        callbacks.append(StepProgressBar())
    callbacks.append(Throughput(log_path=out_dir / "val_log.jsonl"))
    if curve is not None:
        callbacks.append(curve)
    trainer = pl.Trainer(
        **trainer_kwargs(t), devices=t.devices, strategy=t.strategy, num_nodes=t.num_nodes, max_steps=max_steps,
        max_epochs=-1, val_check_interval=t.val_check_interval, check_val_every_n_epoch=None,
        log_every_n_steps=t.log_every_n_steps, gradient_clip_val=t.gradient_clip_val,
        accumulate_grad_batches=t.accumulate_grad_batches, logger=WandbLogger(experiment=run) if run else False,
        enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(out_dir), callbacks=callbacks,
    )
    if trains and trainer.world_size != budget["world_size"]:
        if t.budget.tokens is not None or t.budget.flops is not None:
            raise ConfigError(f"trainer.devices={t.devices} gave {trainer.world_size} processes, but the budget assumed "
                              f"{budget['world_size']}; set trainer.devices to a number of devices")
        scale = trainer.world_size / budget["world_size"]  # no budget: only the accounting needs the real world size
        budget.update(tokens=budget["tokens"] * scale, flops=budget["flops"] * scale,
                      flops_per_step=budget["flops_per_step"] * scale, world_size=trainer.world_size)
        record.set(budget=budget)
    return Pretraining(module, trainer, guard, curve, resume_from)


def pretrain(p: Pretraining, tokens_per_batch: int, dm, record, budget: dict,
             checkpoint: Path | None) -> dict[str, float]:
    """``trainer.fit``, then the run's training metrics -- realized corruption as run means (the last batch's value
    as ``<key>_last``) -- and the final checkpoint (``checkpoint``: where; None: none). ``tokens_per_batch``: one
    process's tokens per optimizer step (the throughput record)."""
    from mlmlab.checkpoint import atomic_save_checkpoint
    from mlmlab.lit.calibrate import Throughput

    trainer, module, guard = p.trainer, p.module, p.guard
    with record.timer("pretrain"):
        try:
            trainer.fit(module, datamodule=dm, ckpt_path=str(p.resume_from) if p.resume_from else None)
        except BaseException as e:
            if guard.last_ckpt.exists():  # the last good checkpoint (nothing is saved after a bad step)
                record.set(checkpoint=str(guard.last_ckpt))
            if type(e).__name__ == "SIGTERMException":  # Lightning's own SIGTERM exit (exit code 0): say so
                raise guard.preempted(trainer.global_step) from e
            raise
    if p.curve is not None:
        record.set(curves=p.curve.rows)
    speed = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    if speed is not None:  # the job's own tokens/s (benchmarks/bench_e2e.py compares it with bench_step's)
        record.set(throughput=speed.record(tokens_per_batch * trainer.world_size))
        speed.tokens_per_step = tokens_per_batch * trainer.world_size  # for the val curve (evaluate)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
    for k, v in (module.telemetry_means() if hasattr(module, "telemetry_means") else {}).items():
        if k in metrics:
            metrics[f"{k}_last"] = metrics[k]
        metrics[k] = v
    metrics["train/steps"] = trainer.global_step
    metrics["train/skipped_nonfinite"] = float(guard.skipped)
    metrics["budget/tokens"], metrics["budget/flops"] = float(budget["tokens"]), float(budget["flops"])
    if checkpoint is not None:
        atomic_save_checkpoint(trainer, checkpoint)
        record.set(checkpoint=str(checkpoint))
    return metrics


def evaluate(p: Pretraining, dm, extra_val: dict, datamodule_for: Callable[[dict], Any], record) -> dict[str, float]:
    """The fixed-mask validation losses (``val/mlm_loss_r<rate>``), then those of each further fixed-mask set of
    ``extra_val`` ({metric suffix: validation dict}, served by ``datamodule_for(val)``): further ``eval.units``
    (``val/mlm_loss_r<rate>w``: whole-word masks) and ``eval.per_source`` (``val/mlm_loss_r<rate>_mix<i>``); each also
    split by what the masks showed at the predicted position (``val/mlm_loss_at_{mask,random,keep}_r<rate>``)."""
    from mlmlab.lit.calibrate import Throughput

    trainer, module = p.trainer, p.module
    with record.timer("eval"):
        (val_metrics,) = trainer.validate(module, datamodule=dm, verbose=False)
        out = {k: float(v) for k, v in val_metrics.items()}
        for suffix, val in extra_val.items():  # objective=mlm only (validated): CLM modules have no suffix
            main_suffix, module.eval_suffix = module.eval_suffix, suffix
            try:
                (extra,) = trainer.validate(module, datamodule=datamodule_for(val), verbose=False)
            finally:
                module.eval_suffix = main_suffix
            out.update({k: float(v) for k, v in extra.items() if k.endswith(f"_{suffix}")})
    speed = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    if speed is not None and getattr(speed, "tokens_per_step", None):
        speed.final(trainer, out)  # the fixed-mask loss at each validation pass and at the end: steps, tokens, seconds
        record.set(val_curve=speed.curve(speed.tokens_per_step))
    # a corruption kind the fixed masks do not use (eval.replace.random=0: no random positions) has no loss
    return {k: v for k, v in out.items() if not ("/mlm_loss_at_" in k and math.isnan(v))}


def prepare_data(proto, d, t, paths, per_source: bool, tok=None) -> Data:
    """Stage 1: every downstream task loaded (and checked) first -- a bad file or an unreachable hub fails before the
    corpus is tokenized -- then the tokenizer and the packed blocks of ``data.*`` / ``tokenizer.*`` (``d``, ``t``;
    cached under ``paths.cache_dir``), the sampler context and (``eval.per_source``) each mixture source's blocks.
    ``tok``: the start's tokenizer (``init.*``) instead of one trained on the corpus; ``proto``: the job's downstream
    protocol (mlmlab.downstream.Protocol)."""
    from mlmlab.data.corpus import block_stats, get_blocks, source_val_blocks
    from mlmlab.data.vocab_stats import make_sampler_context
    from mlmlab.downstream import check_label_budgets

    for name in proto.ds.tasks:
        proto.tasks[name].load(proto.src)
    check_label_budgets(proto)
    packing: dict = {}
    tok, blocks = get_blocks(d, t, paths.cache_dir, packing, tok)
    train_blocks = blocks["train"]
    n_train = len(train_blocks["input_ids"])
    if n_train < d.batch_size:
        raise ConfigError(f"data.batch_size={d.batch_size} is larger than the {n_train} training blocks; "
                          f"allowed: 1..{n_train}")
    val_blocks = {k: v[: d.max_val_blocks] for k, v in blocks["validation"].items()}
    ctx = make_sampler_context(d, t, paths, tok, blocks)
    source_val = source_val_blocks(d, t, paths.cache_dir, tok) if per_source else []
    return Data(tok, train_blocks, val_blocks, ctx, block_stats(train_blocks), packing, source_val)


def build_masking_plan(recipe, e, data: Data) -> MaskingPlan:
    """Stage 2: the run's masking ``recipe`` (mlmlab.build.build_recipe of ``mask.*``: the replacement sampler, the
    rate schedule, the masker) with the fixed evaluation masks of ``eval.*`` (``e``: Bernoulli per unit of
    ``eval.units``, uniform replacements) of the validation blocks and (``eval.per_source``) of each mixture source's."""
    from mlmlab.build import eval_masks, eval_suffix
    from mlmlab.config import eval_units
    from mlmlab.data.tokenizer import PAD

    units = eval_units(e)

    def masked(vb: dict, unit: str):
        fixed = eval_masks(vb, e, data.ctx, unit)
        return fixed, {"input_ids": fixed.input_ids, "labels": fixed.labels, "attention_mask": vb["input_ids"] != PAD,
                       "original_ids": vb["input_ids"], "special_tokens_mask": vb["special_tokens_mask"]}

    fixed, val = masked(data.val_blocks, units[0])
    extra = {eval_suffix(e.rate, u): masked(data.val_blocks, u)[1] for u in units[1:]}
    extra.update({f"{eval_suffix(e.rate, units[0])}_mix{i}": masked(vb, units[0])[1]
                  for i, vb in enumerate(data.source_val)})
    return MaskingPlan(recipe, fixed, val, eval_suffix(e.rate, units[0]), extra)


def ngram_reference(d, t, paths, e, data: Data, masking: MaskingPlan) -> dict:
    """Stage 2's references: the unigram and bigram models' loss on the fixed evaluation masks (``masking.fixed``,
    ``eval.*``: ``e``), counted on the training blocks of ``data.*`` / ``tokenizer.*`` (``d``, ``t``), once per corpus,
    tokenizer and masks (cached under ``paths.cache_dir``; :mod:`mlmlab.data.ngram`)."""
    from mlmlab.config import eval_units
    from mlmlab.data.ngram import cached_reference
    from mlmlab.masking.replacement import UniformSampler

    return cached_reference(d, t, paths.cache_dir, data.tok, data.train_blocks, masking.fixed, e, eval_units(e)[0],
                            data.ctx, UniformSampler(data.ctx).probs)


def datamodule(d, seed: int, data: Data, val: dict):
    """The data module of ``data.*`` (``d``): the training blocks in a seeded, resumable order; ``val`` for validation."""
    from mlmlab.data.datamodule import PretrainDataModule

    return PretrainDataModule(data.train_blocks, val, d.batch_size, d.val_batch_size, seed, d.num_workers)


def dead_mask_keys(overrides: list[str] | None, unit: str) -> list[str]:
    """Command-line ``mask.span.*`` / ``mask.pmi.*`` overrides that ``mask.unit`` does not read (span lengths belong
    to unit=span, the n-gram table to unit=pmi): recorded and ignored by the job, so said."""
    owners = {"mask.span.": "span", "mask.pmi.": "pmi"}
    return [o for o in overrides or [] for prefix, owner in owners.items()
            if o.lstrip("+~").startswith(prefix) and unit != owner]


def describe(record, objective: str, d, data: Data, masking: MaskingPlan, info: dict, unit: str = "token") -> None:
    """Stage 3's record: what the run masks with, and the data (``d``: ``data.*``) it trains and is scored on;
    ``unit``: ``mask.unit`` (overrides of keys it does not read are said and recorded)."""
    if objective == "clm":
        record.set(masking={"note": "objective=clm does not mask; mask.* is not used"})
        ignored = [o for o in info.get("overrides") or [] if o.lstrip("+~").startswith("mask")]
        if ignored:
            log.warning("objective=clm does not mask: %s change nothing in this job", ", ".join(ignored))
    else:
        report = getattr(masking.sampler, "report", None)
        weights = masking.recipe.masker.weights  # mask.select: which weights, and their summary
        record.set(masking={"sampler": getattr(masking.sampler, "name", type(masking.sampler).__name__),
                            "schedule": masking.schedule.describe(), **({"sampler_report": report} if report else {}),
                            **({"select": {"weight": weights.name, **weights.report}} if weights is not None else {})})
        dead = dead_mask_keys(info.get("overrides"), unit)
        if dead:
            record.data["masking"]["ignored"] = dead
            log.warning("mask.unit=%s does not read %s: they change nothing in this job", unit, ", ".join(dead))
    log.info("masking: %s", record.data["masking"])
    stats = data.stats
    record.set(data={"vocab_size": data.vocab_size, "train_blocks": len(data.train_blocks["input_ids"]),
                     "val_blocks": len(masking.val["input_ids"]), "train_tokens": stats["tokens"],
                     "eval_masked_tokens": int((masking.fixed.labels != -100).sum()),
                     # documents longer than a block: packed over consecutive blocks, never cut off (counted)
                     **({"long_docs": {k: v["long_docs"] for k, v in data.packing.items()},
                         "packing": data.packing} if data.packing else {}),
                     # eval.per_source: which source each val/mlm_loss_r15_mix<i> scores, on how many blocks
                     **({"val_sources": [{"suffix": f"mix{i}", "source": str(s.get("val_path") or s.get("path")),
                                          "blocks": len(vb["input_ids"])}
                                         for i, (s, vb) in enumerate(zip(d.mix, data.source_val))]}
                        if data.source_val else {})})
    if objective != "clm":
        from mlmlab.baseline import unigram_reference

        record.data["data"].update(unigram_reference(data.ctx.token_counts(), masking.fixed.labels))
    log.info("data: %s", record.data["data"])
