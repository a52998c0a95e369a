"""Hydra entry point: ``python -m mlmlab.train [overrides] [-m]``.

One job = validate the config -> data (cached) -> MLM pretraining with on-device masking -> fixed-mask evaluation ->
downstream fine-tuning over tasks x seeds -> ``results.json`` + W&B run. ``train(cfg)`` does the work and returns the
metrics (usable from tests); ``main`` returns ``downstream/score`` for Hydra sweepers to optimise.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from mlmlab.config import ConfigError, eval_units, to_container, validate
from mlmlab.sweep import clear_running, global_rank, mark_running

log = logging.getLogger(__name__)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def hydra_info() -> dict:
    """What Hydra knows about this job (empty outside Hydra, e.g. when a test calls ``train`` directly)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    n_jobs = hc.launcher.get("n_jobs") if multirun else None  # the joblib launcher: jobs at once (-1: one per core)
    return {"overrides": list(hc.overrides.task), "override_dirname": hc.job.override_dirname, "multirun": multirun,
            "sweep_dir": hc.sweep.dir if multirun else None, "job_num": hc.job.num if multirun else None,
            "parallel_jobs": (os.cpu_count() if n_jobs == -1 else n_jobs) if isinstance(n_jobs, int) else None}


def eval_suffix(rate: float, unit: str = "token") -> str:
    """The fixed-mask metrics' suffix: ``r15`` (token masks at 15%), ``r15w`` (whole-word masks)."""
    return f"r{round(rate * 100, 2):g}" + {"token": "", "word": "w"}[unit]


def wandb_group(cfg: DictConfig, info: dict) -> str:
    w = cfg.logger.wandb
    return (w.group if w is not None and w.group else
            "sweep_" + str(info["sweep_dir"]).strip("/").replace("/", "_") if info.get("multirun") else "single")


def start_wandb(cfg: DictConfig, config: dict, info: dict, out_dir: Path, job_type: str = "pretrain",
                group: str | None = None, name_prefix: str = "", run_id: str | None = None):
    """The job's W&B run. ``run_id``: a resumed job continues the W&B run of the checkpoint it resumes -- online with
    ``resume="allow"``; offline W&B cannot resume (it warns and ignores it), so the resumed job writes a second offline
    log under the same id, which ``wandb sync`` uploads into the same run and mlmlab.analysis reads as one history."""
    w = cfg.logger.wandb
    if w is None or w.mode == "disabled":
        return None
    import wandb

    group = group or wandb_group(cfg, info)
    name = name_prefix + (w.name or info.get("override_dirname") or "default")
    resume = {"id": run_id, **({"resume": "allow"} if w.mode == "online" else {})} if run_id else {}
    return wandb.init(project=w.project, entity=w.entity, mode=w.mode, group=group, job_type=job_type, name=name,
                      tags=list(w.tags), config=config, dir=str(out_dir), reinit="create_new", **resume,
                      settings=wandb.Settings(console="off", x_disable_stats=True,
                                              x_transaction_log_flush_interval=float(w.get("flush_seconds", 2.0))))


def wandb_barrier(run, flush_seconds: float) -> None:
    """Return once what the job logged to W&B so far is in the run's ``.wandb`` file on disk: reading the summary is a
    round trip to the W&B service (which handles records in order, so every earlier history row has been handled),
    then one flush interval of the service's log writer passes."""
    try:
        list(run.summary.keys())
    except Exception as e:  # never fail a checkpoint over W&B
        log.debug("W&B summary round trip failed (%s: %s)", type(e).__name__, e)
    time.sleep(flush_seconds + 0.1)


def finish_wandb(run, exit_code: int) -> None:
    """Finish the job's W&B run and wait until its files are complete on disk. ``run.finish()`` only informs the W&B
    service, which closes (and flushes) the run's ``.wandb`` log asynchronously, so a reader right after the job could
    find it truncated; tearing the service down (when no other run is active in this process) waits for that."""
    import wandb

    run.finish(exit_code=exit_code)
    wl = getattr(run, "_wl", None)
    if getattr(wl, "most_recent_active_run", None) is None:  # a property: the newest unfinished run
        wandb.teardown()


def finetune_runs(cfg: DictConfig, config: dict, info: dict, out_dir: Path, group: str | None, parent: str,
                  prefix: str = ""):
    """``downstream.wandb_runs=true``: a factory of one W&B run per fine-tuning (task, lr, seed), else None."""
    if not cfg.downstream.get("wandb_runs") or cfg.logger.wandb is None or cfg.logger.wandb.mode == "disabled":
        return None

    def make(task: str, lr: float, seed: int):
        c = {**config, "finetune_run": {"task": task, "lr": lr, "seed": seed, "parent": parent}}
        try:
            return start_wandb(cfg, c, info, out_dir, job_type="finetune", group=group,
                               name_prefix=f"{prefix}{task}:lr{lr:g}:seed{seed}:")
        except Exception as e:  # W&B is never the only copy: the fine-tuning goes on without its run
            log.error("W&B run for %s lr=%g seed=%d failed to start (%s: %s); continuing without it", task, lr, seed,
                      type(e).__name__, e)
            return None

    return make


def trainer_kwargs(cfg: DictConfig) -> dict:
    t = cfg.trainer
    from mlmlab.hardware import resolve_precision

    return {"accelerator": t.accelerator, "precision": resolve_precision(t.precision, t.accelerator),
            "deterministic": t.deterministic,
            "enable_progress_bar": t.enable_progress_bar}


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


def completed_metrics(cfg: DictConfig) -> dict[str, float] | None:
    """The metrics of ``<paths.output_dir>/results.json`` if it is a finished run of this same config, else None."""
    import json

    path = Path(cfg.paths.output_dir).expanduser() / "results.json"
    if not path.exists():
        return None
    try:
        r = json.loads(path.read_text())
        now = to_container(cfg)
    except Exception as e:  # a truncated record (results.json is written atomically, so only by hand) or a bad config
        log.warning("skip_completed: %s is not readable (%s); running the job", path, e)
        return None
    if r.get("status") != "ok" or "downstream/score" not in (r.get("metrics") or {}):
        log.info("skip_completed: %s is %s; running the job again", path, r.get("status"))
        return None
    from mlmlab.checkpoint import COMPLETED_FREE, config_diff

    changed = config_diff(r.get("config"), now, COMPLETED_FREE)
    if changed:
        log.warning("skip_completed: %s was run with a different config (%s differ); running the job again", path,
                    ", ".join(k for k, _, _ in changed))
        return None
    log.info("skip_completed: %s is complete; not running this job again", path)
    return r["metrics"]


class Job:
    """The frame of every job (pretraining, fine-tuning a checkpoint), as a context manager::

        with Job(cfg, validate) as job:      # check(cfg) before any work; a bad config: failed record, ConfigError
            metrics = ...                     # job.config, job.info, job.out_dir, job.record; job.run = the W&B run
            return job.done(metrics)          # results.json ok, written before W&B is finished

    Leaving the block with an exception writes a failed ``results.json`` (the error and whatever was recorded) and
    re-raises; W&B is finished whatever happens, and a W&B failure never fails a finished job."""

    def __init__(self, cfg: DictConfig, check):
        from mlmlab.results import RunRecord

        self.cfg, self.check = cfg, check
        self.info = hydra_info()
        self.out_dir = Path(cfg.paths.output_dir).expanduser()
        from mlmlab.lit import quiet_library_noise

        quiet_library_noise()
        set_job_threads(cfg, self.info)  # before the record notes torch's threads
        self.record = RunRecord(self.out_dir, _safe_container(cfg), self.info.get("overrides"))
        self.rank = global_rank()
        if self.rank:  # results.json and the running marker are rank 0's; another rank's outcome is kept beside them
            self.record.filename = f"results.rank{self.rank}.json"
        self.config: dict = {}
        self.run = None  # the W&B run, once the job has started it
        self.ok = False

    def __enter__(self) -> Job:
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.rank == 0:  # first: a sweep's summary tells this running job (even while checking) from a killed one
                mark_running(self.out_dir)
            self.check(self.cfg)  # fail fast: nothing below runs on a bad config
            self.config = to_container(self.cfg)
            self.record.set(config=self.config)
        except BaseException as e:
            self._failed(e)
            if self.rank == 0:
                clear_running(self.out_dir)
            raise
        return self

    def done(self, metrics: dict[str, float]) -> dict[str, float]:
        self.record.set(status="ok", metrics=metrics)
        self.record.write()  # before W&B is finished: the local record never depends on W&B
        self.ok = True
        return metrics

    def _failed(self, e: BaseException) -> None:
        self.record.fail(e)
        path = self.record.write()
        log.error("job failed (%s: %s); record written to %s", type(e).__name__, e, path)

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc is not None:
                self._failed(exc)
        finally:
            if self.rank == 0:
                clear_running(self.out_dir)
            self._finish_wandb()
        return False

    def _finish_wandb(self) -> None:
        if self.run is None:
            return
        try:
            if self.ok:
                self.run.summary.update({k: v for k, v in self.record.data["metrics"].items()})
                self.run.summary.update({f"timings/{k}": v for k, v in self.record.data["timings_s"].items()})
        except Exception as e:  # results.json is already written: a W&B failure must not fail a finished job
            log.error("W&B summary failed (%s: %s); results.json has the record", type(e).__name__, e)
        finally:
            try:
                finish_wandb(self.run, 0 if self.ok else 1)
            except Exception as e:
                log.error("W&B finish failed (%s: %s); results.json has the record", type(e).__name__, e)


def set_job_threads(cfg: DictConfig, info: dict) -> None:
    """``trainer.threads`` (mlmlab.hardware.job_threads)."""
    from mlmlab.config import valid_threads
    from mlmlab.hardware import apply_threads, job_threads

    setting = cfg.trainer.get("threads", "auto") if "trainer" in cfg else "auto"
    if valid_threads(setting):  # a bad value fails in the job's check(cfg)
        threads, warning = job_threads(setting, info.get("parallel_jobs"))
        if warning:
            log.warning("trainer.threads=%s: %s", setting, warning)
        if threads is not None:
            apply_threads(threads)


def _safe_container(cfg: DictConfig) -> dict:
    try:
        return to_container(cfg)
    except Exception:  # an unresolvable interpolation must not hide the real error
        return OmegaConf.to_container(cfg, resolve=False)


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


def random_init_baseline(cfg: DictConfig, tok, encoder_cfg: dict, ft: dict, record, seed: int) -> dict[str, float]:
    """``downstream.random_init_baseline=true``: the same downstream protocol (tasks, lr grid chosen on its own, seeds)
    on the encoder the pretraining started from, untrained (the init of ``seed``, as ``objective=none`` gets it). Returns
    ``random_init/<task>/...`` and the paired gains ``gain/<task>/...`` (mlmlab.downstream.paired_gain)."""
    import torch
    from pytorch_lightning.utilities.seed import isolate_rng

    from mlmlab.downstream import paired_gain, run_downstream, task_runs
    from mlmlab.models.encoder import BertForMLM, CausalLM, EncoderConfig

    with isolate_rng():
        torch.manual_seed(seed)
        c = EncoderConfig(**encoder_cfg)
        model = CausalLM(c) if c.causal else BertForMLM(c)
        state = {k: v.detach().clone() for k, v in model.bert.state_dict().items()}
    def compute() -> tuple[dict, dict]:
        return run_downstream(cfg, tok, encoder_cfg, state, {**trainer_kwargs(cfg), "devices": 1}, lm=model)

    with record.timer("finetune_random_init"):
        if cfg.downstream.reuse_random_init:
            base, report, reused = cached_random_init(cfg, tok, encoder_cfg, seed, compute)
            if reused:
                report = {**report, "reused_from": reused}
                log.info("random-init baseline: reused %s (same tokenizer, encoder, seed and protocol)", reused)
        else:
            base, report = compute()
    record.set(downstream_random_init=report)
    mains = {key: spec.main_metric for key, spec, _ in task_runs(cfg)}
    gain = paired_gain(ft, base, mains, list(cfg.downstream.seeds)) if cfg.downstream.protocol != "probe" else {}
    gain.update(zeroshot_gain(record.data.get("downstream") or {}, report))
    log.info("random-init baseline: %s", {k: round(v, 4) for k, v in {**base, **gain}.items() if "seed_" not in k})
    probe = {f"gain_probe/{k.split('/', 1)[1]}": ft[k] - base[k] for k in ft if k.startswith("probe/") and k in base}
    renamed = {("random_init_probe/" if k.startswith("probe/") else "random_init/") + k.split("/", 1)[1]: v
               for k, v in base.items()}
    return {**renamed, **gain, **probe}


def cached_random_init(cfg: DictConfig, tok, encoder_cfg: dict, seed: int, compute) -> tuple[dict, dict, str | None]:
    """The random-init row once per sweep: its metrics and report (per-item predictions included) cached under a hash
    of everything it depends on -- the tokenizer, the encoder's shape, the init seed, the data config (built-in tasks
    are generated from it), the whole downstream protocol and its code's version, the precision and the CPU kind
    (:func:`mlmlab.hardware.cpu_kind`) -- so the jobs of a sweep that share them
    (15% vs 40% masking at the same seed, say) fine-tune the untrained encoder once. Returns (metrics, report, the
    cache path when it was reused, else None)."""
    import hashlib
    import json

    from mlmlab.data.cache import cached_file
    from mlmlab.data.tasks import data_root

    ds = {k: v for k, v in to_container(cfg)["downstream"].items() if k not in ("wandb_runs", "reuse_random_init")}
    from mlmlab.downstream import PROTOCOL_VERSION
    from mlmlab.hardware import cpu_kind

    key = {"kind": "random_init_v2", "tokenizer_sha": hashlib.sha256(tok.to_str().encode()).hexdigest(),
           "encoder": encoder_cfg, "seed": seed, "downstream": ds, "data": to_container(cfg)["data"],
           "data_dir": str(data_root(cfg)), "precision": trainer_kwargs(cfg)["precision"],
           "protocol": PROTOCOL_VERSION, "cpu": cpu_kind()}  # the same job moves ~1 point between CPU kinds
    built = False

    def build(tmp: Path) -> None:
        nonlocal built
        base, report = compute()
        tmp.write_text(json.dumps({"metrics": base, "report": report}, default=str))
        built = True

    path = cached_file(cfg.paths.cache_dir, "random_init", key, "random_init.json", build)
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


def build_module(cfg: DictConfig, encoder_cfg: dict, max_steps: int, recipe=None):
    """The pretraining LightningModule of ``cfg.objective`` (objective=none: an MLM module that is never trained, so the
    random-init encoder gets the same fixed-mask evaluation and downstream path). ``recipe``: the run's
    ``MaskingRecipe`` (stage 2); None builds it from ``mask.*`` without data (samplers that need no corpus statistics)."""
    from mlmlab.lit.clm import CLMModule
    from mlmlab.lit.electra import ElectraModule
    from mlmlab.lit.mlm import MLMModule

    optim = OmegaConf.to_container(cfg.optim)
    if cfg.objective.name == "clm":
        from mlmlab.data.tokenizer import PAD

        return CLMModule(encoder_cfg, optim, max_steps, PAD)
    if recipe is None:
        recipe = recipe_without_data(cfg, encoder_cfg["vocab_size"])
    cls = ElectraModule if cfg.objective.name == "electra" else MLMModule
    return cls(encoder_cfg, recipe, optim, cfg.seed, max_steps, eval_suffix(cfg.eval.rate, eval_units(cfg)[0]),
               objective=OmegaConf.to_container(cfg.objective))


def build_recipe(cfg: DictConfig, ctx, train_blocks: dict | None = None):
    """``mask.*`` -> the run's MaskingRecipe: the one builder (the replacement sampler with its data-dependent checks,
    the rate schedule, the masker). ``ctx``: the data context (``mlmlab.data.vocab_stats.make_sampler_context``) or,
    without data, a plain ``SamplerContext`` (samplers that need no corpus statistics: uniform). ConfigError naming the
    key."""
    from mlmlab.config import build_schedule
    from mlmlab.data.tokenizer import MASK
    from mlmlab.masking import MaskingRecipe

    sampler = build_sampler(cfg, ctx, train_blocks) if train_blocks is not None else instantiate_sampler(cfg, ctx)
    try:
        return MaskingRecipe.from_config(OmegaConf.to_container(cfg.mask), MASK, ctx.special_ids, sampler,
                                         build_schedule(cfg.mask))
    except ValueError as err:
        raise ConfigError(str(err)) from err


def recipe_without_data(cfg: DictConfig, vocab_size: int):
    """A MaskingRecipe with no corpus behind it (benchmarks and standalone use; uniform-style samplers only)."""
    from mlmlab.data.tokenizer import SPECIAL_TOKENS
    from mlmlab.masking.replacement import SamplerContext

    return build_recipe(cfg, SamplerContext(vocab_size, tuple(range(len(SPECIAL_TOKENS)))))


def model_record(module, encoder_cfg: dict) -> dict:
    """Parameter counts: the encoder being studied (what is fine-tuned), and the whole pretraining model."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731  (parameters() counts a tied tensor once)
    rec = {"parameters": count(module.model), "encoder_parameters": count(module.encoder()), **encoder_cfg}
    gen = getattr(module.model, "generator", None)
    if gen is not None:
        shared = {id(p) for p in module.encoder().parameters()}
        rec["generator_parameters"] = sum(p.numel() for p in gen.parameters() if id(p) not in shared)
        rec["generator"] = {k: getattr(gen.config, k) for k in ("hidden_size", "num_layers", "num_heads",
                                                                 "intermediate_size")}
    return rec


def build_sampler(cfg: DictConfig, ctx, train_blocks: dict):
    """The run's replacement sampler, with data-dependent checks of mask.*; raises ConfigError before training."""
    from mlmlab.data.corpus import iter_rows

    m = cfg.mask
    if m.unit in ("word", "span"):
        w = train_blocks.get("word_ids")
        if w is None or not any(bool((c >= 0).any()) for c in iter_rows(w)):
            raise ConfigError(f"mask.unit={m.unit} needs word ids, but the tokenized corpus has none; "
                              "allowed with this data: mask.unit=token")
    return instantiate_sampler(cfg, ctx)


def instantiate_sampler(cfg: DictConfig, ctx):
    """``mask.sampler`` (a ``_target_`` node) with the data context ``ctx``; ConfigError naming the sampler."""
    from hydra.utils import instantiate

    try:
        return instantiate(cfg.mask.sampler, _partial_=True)(ctx=ctx)  # partial: ctx must not go through OmegaConf
    except Exception as e:
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from e
        raise ConfigError(f"mask.sampler ({cfg.mask.sampler.get('_target_')}): {cause}") from e


class OneLineConfigError(ConfigError, CompactHydraException):
    """A job's ConfigError leaving a multirun: Hydra prints a CompactHydraException as its message, without a traceback."""


def config_errors_in_one_line(fn):
    """A single run's ``ConfigError`` as one line on stderr (and the failed record's path) with exit code 2, instead of
    Hydra's traceback; ``HYDRA_FULL_ERROR=1`` keeps the traceback. In a multirun the error is raised as before, so the
    launcher records that job as failed and goes on with the others, and Hydra prints the error as one line (no
    traceback) when the sweep ends."""
    import functools
    import sys

    @functools.wraps(fn)
    def wrapper(cfg):
        try:
            return fn(cfg)
        except ConfigError as e:
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            if multirun:  # the launcher records the job as failed; Hydra prints this class as its message alone
                raise OneLineConfigError(str(e)) from None
            record = Path(cfg.paths.output_dir).expanduser() / "results.json"
            where = f" (record: {record})" if record.exists() else ""
            print(f"error: {e}{where}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@config_errors_in_one_line
def main(cfg: DictConfig) -> float:
    return train(cfg).get("downstream/score", float("nan"))  # DDP ranks > 0 do no downstream work


if __name__ == "__main__":
    main()
