"""Hydra entry point: ``python -m mlmlab.train [overrides] [-m]``.

One job = validate the config -> data (cached) -> MLM pretraining with on-device masking -> fixed-mask evaluation ->
downstream fine-tuning over tasks x seeds -> ``results.json`` + W&B run. ``train(cfg)`` does the work and returns the
metrics (usable from tests); ``main`` returns ``downstream/score`` for Hydra sweepers to optimise.
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from mlmlab.baseline import random_init_baseline
from mlmlab.build import build_module, build_recipe, model_record
from mlmlab.checks import check_argv, check_job
from mlmlab.config import typed, validate
from mlmlab.flops import step_cost
from mlmlab.job import (
    Job,
    completed_metrics,
    config_errors_in_one_line,
    finetune_runs,
    start_wandb,
    trainer_kwargs,
    wandb_group,
)
from mlmlab.phase import record_phase
from mlmlab.pretraining import (
    Data,
    build_masking_plan,
    build_trainer,
    calibrate_budget,
    calibrate_seconds,
    datamodule,
    describe,
    evaluate,
    ngram_reference,
    plan_budget,
    prepare_data,
    pretrain,
)

if TYPE_CHECKING:
    from mlmlab.downstream import Protocol

log = logging.getLogger(__name__)  # (W&B offline and silent by default: mlmlab.job)


def train(cfg: DictConfig) -> dict[str, float]:
    """Run one job; returns its metrics. Writes ``results.json`` (ok or failed) and finishes W&B whatever happens.
    ``skip_completed=true``: a job whose output dir already holds a complete record of the same config returns that
    record's metrics without running (re-running a sweep reruns only its failed, partial or changed jobs). An output
    dir that already holds a checkpoint is refused without ``resume=`` or ``overwrite=true`` (never replaced silently;
    in a multirun: a warning, :func:`mlmlab.checkpoint.check_not_overwriting`)."""
    if cfg.get("skip_completed"):
        done = completed_metrics(cfg)
        if done is not None:
            return done
    from mlmlab.checkpoint import check_not_overwriting
    from mlmlab.job import hydra_info

    # before the Job: a refused job writes nothing into the dir (its record and marker stay the earlier run's)
    check_not_overwriting(cfg.paths.output_dir, cfg.get("resume"), cfg.get("overwrite", False),
                          bool(cfg.get("skip_completed")), bool(hydra_info().get("multirun")))
    with Job(cfg, check_job) as job:
        return job.done(_run(cfg, job))


def _run(cfg: DictConfig, job: Job) -> dict[str, float]:
    """The pretraining job, stage by stage: ``cfg`` is made typed once (``c``: ``TrainConfig``) and each stage takes the
    groups it uses."""
    start = init_start(cfg, job)
    c, record, out_dir = typed(cfg), job.record, job.out_dir
    # (resume: the data module's ResumableSampler position travels in the checkpoint, mlmlab.guard)
    for noise in (".*does not have many workers.*", ".*exists and is not empty.*", ".*your dataloader is not resumable.*"):
        warnings.filterwarnings("ignore", noise)
    from mlmlab.downstream import Protocol, save_predictions  # (Lightning: not on the import path of a bad config)

    objective, proto = c.objective.name, Protocol.of(c.paths, c.data, c.downstream)
    with record.timer("data"):
        data = prepare_data(proto, c.data, c.tokenizer, c.paths, c.eval.per_source, start.tok if start else None)
        if c.mask.unit == "pmi":  # high-PMI n-grams as one unit: the training blocks' word ids merged (cached)
            from mlmlab.data.pmi import cached_pmi_units

            data.train_blocks, report = cached_pmi_units(c.data, c.tokenizer, c.paths.cache_dir, data.tok,
                                                         data.train_blocks, c.mask.pmi)
            record.set(pmi_units=report)
        masking = build_masking_plan(build_recipe(c.mask, data.ctx, data.train_blocks), c.eval, data)
        reference = ngram_reference(c.data, c.tokenizer, c.paths, c.eval, data, masking) if objective != "clm" else None
        dm = datamodule(c.data, c.seed, data, masking.val)
    cost = step_cost(c.trainer, c.data, c.model, c.objective, c.mask, data.vocab_size, masking.schedule,
                     data.stats["cand_frac"], data.stats["token_frac"])
    plan = plan_budget(c.trainer, cost, record)
    describe(record, objective, c.data, data, masking, job.info, c.mask.unit)
    job.run = start_logging(c.logger.wandb, c.resume, job) if job.rank == 0 else None
    encoder_cfg, trainer_kw = encoder_config(c.model, data.vocab_size, objective), trainer_kwargs(c.trainer)
    import pytorch_lightning as pl

    pl.seed_everything(c.seed, workers=True, verbose=False)
    make = partial(build_module, c.objective, c.optim, c.seed, masking.suffix, encoder_cfg, recipe=masking.recipe)
    plan = calibrate_budget(c.trainer, c.resume, lambda: calibrate_seconds(c.trainer, c.data, make, dm), cost, record,
                            plan)
    module = make(max_steps=max(1, plan.max_steps))
    if hasattr(masking.recipe.masker.weights, "reset"):  # mask.select.weight=loss: a timing probe may have trained it
        masking.recipe.masker.weights.reset()
    if start is not None:
        from mlmlab.init import load_into

        load_into(module, start, objective)
    record.set(model=model_record(module, encoder_cfg), precision=trainer_kw["precision"])
    w = c.logger.wandb
    curve = eval_curve(c.eval.zeroshot_every_n_steps, c.eval.zeroshot_n_per_paradigm, proto, data.tok, encoder_cfg,
                       trainer_kw["precision"]) if objective != "none" else None
    p = build_trainer(c.trainer, module, dm, out_dir, record, plan.max_steps, plan.budget,
                      run_info(job, data, encoder_cfg, module, w), run=job.run,
                      flush_seconds=w.flush_seconds if w else 2.0, curve=curve,
                      resume_from=resume_check(c.resume, job), trains=objective != "none")
    metrics: dict[str, float] = {}
    if objective != "none":
        d, ckpt = c.data, out_dir / "checkpoints" / "last.ckpt"
        metrics = pretrain(p, d.batch_size * d.max_seq_len * c.trainer.accumulate_grad_batches, dm, record, plan.budget,
                           ckpt if c.callbacks.checkpoint else None)
    metrics.update(evaluate(p, dm, masking.extra_val, lambda val: datamodule(c.data, c.seed, data, val), record))
    if c.objective.name == "none" and start is not None and not start.head_state:
        # the start has no MLM head (a headless or ELECTRA / CLM start): a random head's loss says nothing of it
        dropped = sorted(k for k in metrics if k.startswith("val/mlm_"))
        for k in dropped:
            metrics.pop(k)
        record.set(val_curve=[])
        record.data.setdefault("init", {})["no_mlm_head"] = dropped
        log.warning("objective=none: the start has no MLM head, so it has no fixed-mask loss; not recorded (%s)",
                    ", ".join(dropped))
    if reference is not None:  # val/unigram_loss_r15, val/bigram_loss_r15 and results.json phase (mlmlab.phase)
        metrics.update(record_phase(reference, masking.suffix, metrics, c.eval.phase_margin, record, job.run))
    if not p.trainer.is_global_zero:
        return metrics
    lean = declared_protocols(proto, c.analysis)
    metrics.update(downstream(lean.encoder, job, data, encoder_cfg, module, trainer_kw, w))
    if lean.skipped:
        record.data["downstream"]["skipped"] = lean.skipped
    if proto.ds.random_init_baseline and proto.ds.tasks:  # with init.*: the start (gain/) and random init (gain_init/)
        metrics.update(random_init_baseline(lean.comparator, c.data, c.paths.cache_dir, trainer_kw, data.tok,
                                            encoder_cfg, metrics, record, c.seed, start=start))
    save_predictions(out_dir, record)
    log.info("metrics: %s", {k: round(v, 4) for k, v in metrics.items() if "seed_" not in k})
    return metrics


@dataclass(frozen=True)
class LeanProtocols:
    """The downstream protocols of a job with a declared question (``downstream.only_declared``): the pretrained
    encoder's, the random-init comparator's, and the record of what they leave out (None: nothing)."""
    encoder: Protocol
    comparator: Protocol
    skipped: dict | None


def declared_protocols(proto: Protocol, question) -> LeanProtocols:
    """``downstream.only_declared`` with ``analysis.primary`` set (:meth:`mlmlab.config.DownstreamConfig.declared`):
    the label budgets no declared metric reads are not fine-tuned, the comparator only where the regime gate reads it
    -- logged in one line; results.json ``downstream.skipped`` holds the record."""
    from mlmlab.downstream import Protocol

    d = proto.ds.declared(question.primary, question.family)
    if d.skipped:
        log.info("downstream: only what the question declares (downstream.only_declared=false: everything): %s",
                 "; ".join(f"label budgets {d.skipped['budgets']} not fine-tuned" if k == "budgets" else
                           f"random init at {v['tasks']} x {v['max_train_examples']} only" for k, v in d.skipped.items()
                           if k in ("budgets", "random_init")))
    return LeanProtocols(Protocol(d.encoder, proto.src), Protocol(d.comparator, proto.src), d.skipped)


def init_start(cfg: DictConfig, job: Job):
    """``init.*``: the encoder this job starts from (mlmlab.init.Start; None: random init), recorded in results.json.
    ``init.pretrain`` makes it now (once per cache) and its shape and tokenizer are then adopted and checked, as
    ``init.checkpoint``'s were in :func:`mlmlab.checks.check_job`."""
    from mlmlab import init as init_

    if not init_.is_set(cfg.get("init")):
        return None
    with job.record.timer("init"):
        start = init_.resolve(cfg.init, cfg.paths.cache_dir, cfg.paths.get("data_dir"))
    if cfg.init.pretrain:
        init_.adopt(cfg.model, cfg.tokenizer, start, job.info.get("overrides"))
        validate(cfg)
        from mlmlab.config import to_container

        job.config = to_container(cfg)
        job.record.set(config=job.config)
    job.record.set(init=start.record)
    log.info("init: starting from %s", start.record)
    return start


def start_logging(w, resume: str | None, job: Job):
    """Stage 4: the W&B run of ``logger.wandb`` (``w``; rank 0), continuing the W&B run of a ``resume=`` checkpoint.
    W&B is never the only copy: when it fails to start, the job logs and records why and goes on without it."""
    from mlmlab.checkpoint import resume_wandb_id

    try:
        return start_wandb(w, job.config, job.info, job.out_dir, run_id=resume_wandb_id(resume))
    except Exception as e:
        log.error("W&B failed to start (%s: %s); continuing without W&B (results.json is still written)",
                  type(e).__name__, e)
        job.record.set(wandb_error=f"{type(e).__name__}: {e}")
        return None


def encoder_config(model, vocab_size: int, objective: str) -> dict:
    """The encoder's shape from ``model.*`` and the tokenizer's vocabulary (causal for objective=clm)."""
    from mlmlab.models.encoder import EncoderConfig

    return EncoderConfig.from_model_cfg(model, vocab_size, causal=objective == "clm").to_dict()


def resume_check(resume: str | None, job: Job):
    """``resume=``: the checkpoint to continue, checked against this job's config (recorded), else None."""
    if resume is None:
        return None
    from mlmlab.checkpoint import check_resume

    path = check_resume(resume, job.config)
    job.record.set(resumed_from=str(path))
    return path


def run_info(job: Job, data: Data, encoder_cfg: dict, module, w):
    """The callback that puts what a checkpoint needs to be used alone (config, tokenizer, encoder, W&B run) in it."""
    from mlmlab.checkpoint import RunInfo
    from mlmlab.checkpoint import run_info as info

    return RunInfo(info(job.config, data.tok, encoder_cfg, module, wandb_group(w, job.info),
                        job.run.id if job.run is not None else None))


def eval_curve(every: int | None, n_per_paradigm: int | None, proto: Protocol, tok, encoder_cfg: dict, precision: str):
    """``eval.zeroshot_every_n_steps``: BLiMP and the probes every n steps of pretraining (mlmlab.lit.curves), or None."""
    if every is None:
        return None
    from mlmlab.downstream import curve_evaluator
    from mlmlab.lit.curves import EvalCurve

    return EvalCurve(every, curve_evaluator(proto, n_per_paradigm, tok, encoder_cfg, precision))


def downstream(proto: Protocol, job: Job, data: Data, encoder_cfg: dict, module, trainer_kw: dict, w) -> dict[str, float]:
    """Stage 9 (rank 0): every downstream task x seed on the pretrained encoder (W&B runs per fine-tuning with
    ``downstream.wandb_runs`` and ``logger.wandb``, ``w``)."""
    from mlmlab.downstream import run_downstream

    record, info = job.record, job.info
    encoder_state = {k: v.detach().cpu().clone() for k, v in module.encoder().state_dict().items()}
    with record.timer("finetune"):
        metrics, report = run_downstream(
            proto, data.tok, encoder_cfg, encoder_state, {**trainer_kw, "devices": 1},
            finetune_runs(w, proto.ds.wandb_runs, job.config, info, job.out_dir, wandb_group(w, info),
                          info.get("override_dirname") or "default"),
            lm=module.model, unigram_counts=data.ctx.token_counts())
    record.set(downstream=report)
    return metrics


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@config_errors_in_one_line
def main(cfg: DictConfig) -> float:
    return train(cfg).get("downstream/score", float("nan"))  # DDP ranks > 0 do no downstream work


if __name__ == "__main__":
    bad = check_argv(sys.argv[1:])
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        raise SystemExit(2)
    main()
