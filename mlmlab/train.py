"""Hydra entry point: ``python -m mlmlab.train [overrides] [-m]``.

One job = validate the config -> data (cached) -> MLM pretraining with on-device masking -> fixed-mask evaluation ->
downstream fine-tuning over tasks x seeds -> ``results.json`` + W&B run. ``train(cfg)`` does the work and returns the
metrics (usable from tests); ``main`` returns ``downstream/score`` for Hydra sweepers to optimise.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from mlmlab.baseline import random_init_baseline, unigram_reference
from mlmlab.build import build_module, build_recipe, eval_suffix, model_record
from mlmlab.config import ConfigError, eval_units, validate
from mlmlab.job import (
    Job,
    completed_metrics,
    config_errors_in_one_line,
    finetune_runs,
    start_wandb,
    trainer_kwargs,
    wandb_barrier,
    wandb_group,
)

log = logging.getLogger(__name__)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def train(cfg: DictConfig) -> dict[str, float]:
    """Run one job; returns its metrics. Writes ``results.json`` (ok or failed) and finishes W&B whatever happens.
    ``skip_completed=true``: a job whose output dir already holds a complete record of the same config returns that
    record's metrics without running (re-running a sweep reruns only its failed, partial or changed jobs)."""
    if cfg.get("skip_completed"):
        done = completed_metrics(cfg)
        if done is not None:
            return done
    with Job(cfg, check_job) as job:
        return job.done(_run(cfg, job))


def check_job(cfg: DictConfig) -> None:
    """``validate(cfg)``, and what only the composition shows: ``downstream=none`` chosen on the command line while a
    preset (``experiment=real_en`` ...) sets its own ``downstream.tasks`` after the group, so the job would still
    fine-tune."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().runtime.choices.get("downstream") == "none" \
            and cfg.downstream.get("tasks"):
        raise ConfigError(f"downstream=none was chosen, but a preset sets downstream.tasks={list(cfg.downstream.tasks)}"
                          " after it; for pretraining only use downstream.tasks=[]")
    validate(cfg)


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
    # scored once at the end, {metric suffix: validation dict}: eval.units after the first (r15w), eval.per_source (r15_mix<i>)
    extra_val: dict = field(default_factory=dict)

    @property
    def sampler(self):
        return self.recipe.masker.sampler

    @property
    def schedule(self):
        return self.recipe.schedule


def _run(cfg: DictConfig, job: Job) -> dict[str, float]:
    """The pretraining job, stage by stage."""
    config, info, out_dir, record = job.config, job.info, job.out_dir, job.record
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*exists and is not empty.*")
    # resume: the data module's ResumableSampler position travels in the checkpoint (mlmlab.guard)
    warnings.filterwarnings("ignore", ".*your dataloader is not resumable.*")
    rank = job.rank

    with record.timer("data"):
        data = prepare_data(cfg)
        masking = build_masking_plan(cfg, data)
        dm = datamodule(cfg, data, masking)
    max_steps, budget = plan_budget(cfg, data, masking, record, info)
    run = job.run = start_logging(cfg, config, info, out_dir, record) if rank == 0 else None
    encoder_cfg = encoder_config(cfg, data)
    import pytorch_lightning as pl

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    max_steps, budget = calibrate_budget(cfg, encoder_cfg, data, masking, dm, record, max_steps, budget)
    module, trainer, guard, curve, ckpt_path = build_pretraining(cfg, config, info, out_dir, record, data, masking,
                                                                 dm, encoder_cfg, max_steps, budget, run)
    metrics = pretrain(cfg, out_dir, record, trainer, module, dm, guard, curve, ckpt_path, budget)
    metrics.update(evaluate(record, trainer, module, dm, cfg, data, masking))
    if not trainer.is_global_zero:
        return metrics
    metrics.update(downstream(cfg, config, info, out_dir, record, data, encoder_cfg, module))
    log.info("metrics: %s", {k: round(v, 4) for k, v in metrics.items() if "seed_" not in k})
    return metrics


def prepare_data(cfg: DictConfig) -> Data:
    """Stage 1: every downstream task loaded (and checked) first -- a bad file or an unreachable hub fails before the
    corpus is tokenized -- then the tokenizer and the packed blocks (cached), and the sampler context."""
    from mlmlab.data.corpus import block_stats, get_blocks, source_val_blocks
    from mlmlab.data.tasks import task_registry
    from mlmlab.data.vocab_stats import make_sampler_context
    from mlmlab.downstream import check_label_budgets

    for name in cfg.downstream.tasks:
        task_registry(cfg)[name].load(cfg)
    check_label_budgets(cfg)
    packing: dict = {}
    tok, blocks = get_blocks(cfg, packing)
    train_blocks = blocks["train"]
    n_train = len(train_blocks["input_ids"])
    if n_train < cfg.data.batch_size:
        raise ConfigError(f"data.batch_size={cfg.data.batch_size} is larger than the {n_train} training blocks; "
                          f"allowed: 1..{n_train}")
    val_blocks = {k: v[: cfg.data.max_val_blocks] for k, v in blocks["validation"].items()}
    ctx = make_sampler_context(cfg, tok, blocks)
    source_val = source_val_blocks(cfg, tok) if cfg.eval.get("per_source") else []
    return Data(tok, train_blocks, val_blocks, ctx, block_stats(train_blocks), packing, source_val)


def build_masking_plan(cfg: DictConfig, data: Data) -> MaskingPlan:
    """Stage 2: ``mask.*`` -> the replacement sampler (data-dependent checks: ConfigError naming the key) and the rate
    schedule; ``eval.*`` -> the fixed evaluation masks (Bernoulli per unit of ``eval.units``, uniform replacements), of
    the validation blocks and (``eval.per_source``) of each mixture source's."""
    from mlmlab.data.tokenizer import MASK, PAD
    from mlmlab.masking import mask_once
    from mlmlab.masking.replacement import UniformSampler

    recipe = build_recipe(cfg, data.ctx, data.train_blocks)
    e, units = cfg.eval, eval_units(cfg)

    def masked(vb: dict, unit: str):
        fixed = mask_once(vb["input_ids"], vb["special_tokens_mask"], e.rate, MASK,
                          (e.replace.mask, e.replace.random, e.replace.keep), UniformSampler(data.ctx), e.seed,
                          unit=unit, word_ids=vb.get("word_ids") if unit == "word" else None)
        return fixed, {"input_ids": fixed.input_ids, "labels": fixed.labels, "attention_mask": vb["input_ids"] != PAD,
                       "original_ids": vb["input_ids"], "special_tokens_mask": vb["special_tokens_mask"]}

    fixed, val = masked(data.val_blocks, units[0])
    extra = {eval_suffix(e.rate, u): masked(data.val_blocks, u)[1] for u in units[1:]}
    extra.update({f"{eval_suffix(e.rate, units[0])}_mix{i}": masked(vb, units[0])[1]
                  for i, vb in enumerate(data.source_val)})
    return MaskingPlan(recipe, fixed, val, extra)


def datamodule(cfg: DictConfig, data: Data, masking: MaskingPlan):
    from mlmlab.data.datamodule import PretrainDataModule

    return PretrainDataModule(data.train_blocks, masking.val, cfg.data.batch_size, cfg.data.val_batch_size, cfg.seed,
                              cfg.data.num_workers)


def plan_budget(cfg: DictConfig, data: Data, masking: MaskingPlan, record, info: dict) -> tuple[int, dict]:
    """Stage 3: the step count of ``trainer.max_steps`` or a token / FLOP budget, and what the record says about the
    masking and the data."""
    from mlmlab.flops import steps_for_budget

    stats = data.stats
    try:
        max_steps, budget = steps_for_budget(cfg, data.vocab_size, masking.schedule, stats["cand_frac"],
                                             stats["token_frac"])
    except ValueError as err:
        raise ConfigError(str(err)) from err
    record.set(budget=budget)
    if cfg.objective.name == "clm":
        record.set(masking={"note": "objective=clm does not mask; mask.* is not used"})
        ignored = [o for o in info.get("overrides") or [] if o.lstrip("+~").startswith("mask")]
        if ignored:
            log.warning("objective=clm does not mask: %s change nothing in this job", ", ".join(ignored))
    else:
        report = getattr(masking.sampler, "report", None)
        record.set(masking={"sampler": getattr(masking.sampler, "name", type(masking.sampler).__name__),
                            "schedule": masking.schedule.describe(), **({"sampler_report": report} if report else {})})
    log.info("masking: %s", record.data["masking"])
    record.set(data={"vocab_size": data.vocab_size, "train_blocks": len(data.train_blocks["input_ids"]),
                     "val_blocks": len(masking.val["input_ids"]), "train_tokens": stats["tokens"],
                     "eval_masked_tokens": int((masking.fixed.labels != -100).sum()),
                     # documents longer than a block: packed over consecutive blocks, never cut off (counted)
                     **({"long_docs": {k: v["long_docs"] for k, v in data.packing.items()},
                         "packing": data.packing} if data.packing else {}),
                     # eval.per_source: which source each val/mlm_loss_r15_mix<i> scores, on how many blocks
                     **({"val_sources": [{"suffix": f"mix{i}", "source": str(s.get("val_path") or s.path),
                                          "blocks": len(vb["input_ids"])}
                                         for i, (s, vb) in enumerate(zip(cfg.data.mix, data.source_val))]}
                        if data.source_val else {})})
    if cfg.objective.name != "clm":
        record.data["data"].update(unigram_reference(data.ctx.token_counts(), masking.fixed.labels))
    log.info("data: %s", record.data["data"])
    return max_steps, budget


def start_logging(cfg: DictConfig, config: dict, info: dict, out_dir: Path, record):
    """Stage 4: the W&B run (rank 0), continuing the W&B run of a ``resume=`` checkpoint. W&B is never the only copy:
    when it fails to start, the job logs and records why and goes on without it."""
    from mlmlab.checkpoint import resume_wandb_id

    try:
        return start_wandb(cfg, config, info, out_dir, run_id=resume_wandb_id(cfg.get("resume")))
    except Exception as e:
        log.error("W&B failed to start (%s: %s); continuing without W&B (results.json is still written)",
                  type(e).__name__, e)
        record.set(wandb_error=f"{type(e).__name__}: {e}")
        return None


def encoder_config(cfg: DictConfig, data: Data) -> dict:
    from mlmlab.models.encoder import EncoderConfig

    return EncoderConfig.from_model_cfg(cfg.model, data.vocab_size, causal=cfg.objective.name == "clm").to_dict()


def calibrate_budget(cfg: DictConfig, encoder_cfg: dict, data: Data, masking: MaskingPlan, dm, record, max_steps: int,
                     budget: dict) -> tuple[int, dict]:
    """Stage 5, ``trainer.budget.seconds`` only: the step count that fills the seconds (a timing probe), recorded;
    a resumed run keeps the step count it was calibrated to."""
    if cfg.trainer.budget.seconds is None or cfg.objective.name == "none":
        return max_steps, budget
    from mlmlab.flops import steps_for_budget

    if cfg.get("resume") is not None:
        import torch

        from mlmlab.checkpoint import resume_path

        ckpt = torch.load(resume_path(cfg.resume), map_location="cpu", weights_only=False, mmap=True)
        cal = {"seconds": float(cfg.trainer.budget.seconds), "resumed": True,
               "steps": int(ckpt["hyper_parameters"]["max_steps"])}
        log.info("trainer.budget.seconds=%g, resumed: the run's calibrated %d steps", cal["seconds"], cal["steps"])
    else:
        with record.timer("calibrate"):
            cal = calibrate_seconds(cfg, encoder_cfg, masking.recipe, dm)
        log.info("trainer.budget.seconds=%g: %d steps (%.3f s/step, %.2f s per validation, probe %.1f s)",
                 cal["seconds"], cal["steps"], cal["s_per_step"], cal["val_s"], cal["probe_s"])
    max_steps, budget = steps_for_budget(cfg, data.vocab_size, masking.schedule, data.stats["cand_frac"],
                                         data.stats["token_frac"], steps=cal["steps"])
    budget["calibration"] = cal
    record.set(budget=budget)
    return max_steps, budget


def build_pretraining(cfg: DictConfig, config: dict, info: dict, out_dir: Path, record, data: Data, masking: MaskingPlan,
                      dm, encoder_cfg: dict, max_steps: int, budget: dict, run):
    """Stage 6: the pretraining module, its guard (checkpoints, non-finite losses, resume state), the evaluation
    curve, and the Trainer. Returns (module, trainer, guard, curve or None, the checkpoint to resume from or None)."""
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import WandbLogger

    from mlmlab.checkpoint import RunInfo, check_resume, run_info
    from mlmlab.guard import Guard

    objective = cfg.objective.name
    module = build_module(cfg, encoder_cfg, max(1, max_steps), masking.recipe)
    record.set(model=model_record(module, encoder_cfg), precision=trainer_kwargs(cfg)["precision"])
    if cfg.trainer.compile and objective != "none":
        module.encoder().compile()  # in place: the state dict keeps its keys (checkpoints, export, fine-tuning)
    t = cfg.trainer
    guard = Guard(out_dir / "checkpoints", t.checkpoint_every_n_steps, t.nonfinite, dm.sampler,
                  out_dir / "train_log.jsonl", t.log_every_n_steps)
    ckpt_path = None
    if cfg.get("resume") is not None:
        ckpt_path = check_resume(cfg.resume, config)
        record.set(resumed_from=str(ckpt_path))
    if run is not None:  # what W&B logged before a checkpoint is on disk when the checkpoint is (a SIGKILL keeps it)
        guard.after_save.append(lambda: wandb_barrier(run, float(cfg.logger.wandb.get("flush_seconds", 2.0))))
    from mlmlab.lit.faults import fault_callbacks

    before, after = fault_callbacks()  # test-only (MLMLAB_FAULT_*): none in a normal job
    callbacks = [RunInfo(run_info(config, data.tok, encoder_cfg, module, wandb_group(cfg, info),
                                  run.id if run is not None else None)), *before, guard, *after]
    if t.enable_progress_bar:
        from mlmlab.lit.progress import StepProgressBar

        callbacks.append(StepProgressBar())
    from mlmlab.lit.calibrate import Throughput

    callbacks.append(Throughput())
    curve = None
    if cfg.eval.zeroshot_every_n_steps is not None and objective != "none":
        from mlmlab.lit.curves import EvalCurve

        curve = EvalCurve(cfg.eval.zeroshot_every_n_steps,
                          curve_evaluator(cfg, data.tok, encoder_cfg, trainer_kwargs(cfg)["precision"]))
        callbacks.append(curve)
    trainer = pl.Trainer(
        **trainer_kwargs(cfg), devices=t.devices, strategy=t.strategy, num_nodes=t.num_nodes, max_steps=max_steps,
        max_epochs=-1, val_check_interval=t.val_check_interval, check_val_every_n_epoch=None,
        log_every_n_steps=t.log_every_n_steps, gradient_clip_val=t.gradient_clip_val,
        accumulate_grad_batches=t.accumulate_grad_batches, logger=WandbLogger(experiment=run) if run else False,
        enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(out_dir), callbacks=callbacks,
    )
    if objective != "none" and trainer.world_size != budget["world_size"]:
        b = cfg.trainer.budget
        if b.tokens is not None or b.flops is not None:
            raise ConfigError(f"trainer.devices={t.devices} gave {trainer.world_size} processes, but the budget assumed "
                              f"{budget['world_size']}; set trainer.devices to a number of devices")
        scale = trainer.world_size / budget["world_size"]  # no budget: only the accounting needs the real world size
        budget.update(tokens=budget["tokens"] * scale, flops=budget["flops"] * scale,
                      flops_per_step=budget["flops_per_step"] * scale, world_size=trainer.world_size)
        record.set(budget=budget)
    return module, trainer, guard, curve, ckpt_path


def pretrain(cfg: DictConfig, out_dir: Path, record, trainer, module, dm, guard, curve, ckpt_path,
             budget: dict) -> dict[str, float]:
    """Stage 7: ``trainer.fit`` (nothing for objective=none), then the run's training metrics -- realized corruption
    as run means (the last batch's value as ``<key>_last``) -- and the final checkpoint."""
    from mlmlab.checkpoint import atomic_save_checkpoint

    metrics: dict[str, float] = {}
    if cfg.objective.name == "none":
        return metrics
    with record.timer("pretrain"):
        try:
            trainer.fit(module, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path else None)
        except BaseException as e:
            if guard.last_ckpt.exists():  # the last good checkpoint (nothing is saved after a bad step)
                record.set(checkpoint=str(guard.last_ckpt))
            if type(e).__name__ == "SIGTERMException":  # Lightning's own SIGTERM exit (exit code 0): say so
                raise guard.preempted(trainer.global_step) from e
            raise
    if curve is not None:
        record.set(curves=curve.rows)
    from mlmlab.lit.calibrate import Throughput

    speed = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    if speed is not None:  # the job's own tokens/s (benchmarks/bench_e2e.py compares it with bench_step's)
        d, t = cfg.data, cfg.trainer
        record.set(throughput=speed.record(d.batch_size * d.max_seq_len * t.accumulate_grad_batches
                                           * trainer.world_size))
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
    for k, v in (module.telemetry_means() if hasattr(module, "telemetry_means") else {}).items():
        if k in metrics:
            metrics[f"{k}_last"] = metrics[k]
        metrics[k] = v
    metrics["train/steps"] = trainer.global_step
    metrics["train/skipped_nonfinite"] = float(guard.skipped)
    metrics["budget/tokens"], metrics["budget/flops"] = float(budget["tokens"]), float(budget["flops"])
    if cfg.callbacks.checkpoint:
        atomic_save_checkpoint(trainer, out_dir / "checkpoints" / "last.ckpt")
        record.set(checkpoint=str(out_dir / "checkpoints" / "last.ckpt"))
    return metrics


def evaluate(record, trainer, module, dm, cfg: DictConfig, data: Data, masking: MaskingPlan) -> dict[str, float]:
    """Stage 8: the fixed-mask validation losses (``val/mlm_loss_r<rate>``), then those of each further unit of
    ``eval.units`` (``val/mlm_loss_r<rate>w``: the same validation blocks, whole-word masks) and, with
    ``eval.per_source``, of each ``data.mix`` source's own validation blocks (``val/mlm_loss_r<rate>_mix<i>``); each also
    split by what the masks showed at the predicted position (``val/mlm_loss_at_{mask,random,keep}_r<rate>``)."""
    with record.timer("eval"):
        (val_metrics,) = trainer.validate(module, datamodule=dm, verbose=False)
        out = {k: float(v) for k, v in val_metrics.items()}
        for suffix, val in masking.extra_val.items():  # objective=mlm only (validated): CLM modules have no suffix
            main_suffix, module.eval_suffix = module.eval_suffix, suffix
            try:
                (extra,) = trainer.validate(module, datamodule=datamodule(cfg, data, replace(masking, val=val)),
                                            verbose=False)
            finally:
                module.eval_suffix = main_suffix
            out.update({k: float(v) for k, v in extra.items() if k.endswith(f"_{suffix}")})
    # a corruption kind the fixed masks do not use (eval.replace.random=0: no random positions) has no loss
    return {k: v for k, v in out.items() if not ("/mlm_loss_at_" in k and math.isnan(v))}


def downstream(cfg: DictConfig, config: dict, info: dict, out_dir: Path, record, data: Data, encoder_cfg: dict,
               module) -> dict[str, float]:
    """Stage 9 (rank 0): every downstream task x seed on the pretrained encoder, the random-init row on the same
    protocol with the paired gains, and the per-item predictions."""
    from mlmlab.downstream import run_downstream, save_predictions

    metrics: dict[str, float] = {}
    encoder_state = {k: v.detach().cpu().clone() for k, v in module.encoder().state_dict().items()}
    with record.timer("finetune"):
        ft, report = run_downstream(cfg, data.tok, encoder_cfg, encoder_state,
                                    {**trainer_kwargs(cfg), "devices": 1},
                                    finetune_runs(cfg, config, info, out_dir, wandb_group(cfg, info),
                                                  info.get("override_dirname") or "default"),
                                    lm=module.model, unigram_counts=data.ctx.token_counts())
    metrics.update(ft)
    record.set(downstream=report)
    if cfg.downstream.random_init_baseline and cfg.downstream.tasks:
        metrics.update(random_init_baseline(cfg, data.tok, encoder_cfg, ft, record, cfg.seed))
    save_predictions(out_dir, record)
    return metrics


def curve_evaluator(cfg: DictConfig, tok, encoder_cfg: dict, precision: str):
    """``eval.zeroshot_every_n_steps``: what mlmlab.lit.curves.EvalCurve runs on the module being pretrained -- each
    minimal-pairs task of ``downstream.tasks`` zero-shot (``eval.zeroshot_n_per_paradigm`` pairs per paradigm, no
    unigram floor) and the linear probe of each classification task (at the largest label budget)."""
    from mlmlab.data.tasks import task_registry
    from mlmlab.downstream import label_budgets, run_task, zeroshot_task

    sub = OmegaConf.merge(cfg, {"downstream": {"protocol": "probe", "zeroshot": {
        "n_per_paradigm": cfg.eval.zeroshot_n_per_paradigm, "unigram_floor": False}}})
    budgets = label_budgets(cfg.downstream.max_train_examples)
    budget = None if None in budgets else max(budgets)
    tasks = task_registry(cfg)

    def evaluate(module) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in cfg.downstream.tasks:
            spec = tasks[name]
            if spec.kind == "minimal_pairs":
                m, _ = zeroshot_task(sub, tok, spec, module.model, precision)
                out[f"curve/{name}/acc"] = m[f"downstream/{name}/acc"]
            elif spec.kind != "token":
                state = {k: v.detach().cpu().clone() for k, v in module.encoder().state_dict().items()}
                m, _ = run_task(sub, tok, spec, encoder_cfg, state, {"precision": precision}, budget=budget)
                out.update({f"curve/{k}": v for k, v in m.items()})
        return out

    return evaluate


def calibrate_seconds(cfg: DictConfig, encoder_cfg: dict, recipe, dm) -> dict:
    """``trainer.budget.seconds`` -> the step count that fills it (mlmlab.lit.calibrate), timed on this machine."""
    from mlmlab.lit.calibrate import calibrate_steps

    t = cfg.trainer
    kw = {**trainer_kwargs(cfg), "devices": 1, "gradient_clip_val": t.gradient_clip_val,
          "accumulate_grad_batches": t.accumulate_grad_batches}
    return calibrate_steps(lambda: build_module(cfg, encoder_cfg, 1000, recipe), dm.train_set, dm.val_set,
                           cfg.data.batch_size, cfg.data.val_batch_size, kw, float(t.budget.seconds),
                           t.val_check_interval)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@config_errors_in_one_line
def main(cfg: DictConfig) -> float:
    return train(cfg).get("downstream/score", float("nan"))  # DDP ranks > 0 do no downstream work


if __name__ == "__main__":
    main()
