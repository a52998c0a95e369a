"""Hydra entry point: ``python -m mlmlab.finetune checkpoint=<path> task=sst2 [downstream.* overrides] [-m]``.

Fine-tunes the encoder of an existing pretraining checkpoint (an explicit path, never "the newest file") with the same
task code and protocol as a pretraining job's downstream phase, and writes ``results.json`` + a W&B run with
``job_type=finetune`` in the pretraining run's group.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from mlmlab.config import ConfigError, FinetuneJobConfig, check_known_keys, typed, validate_downstream
from mlmlab.job import Job, config_errors_in_one_line, finetune_runs, start_wandb, trainer_kwargs

log = logging.getLogger(__name__)


def prepare(cfg: DictConfig, loaded: dict) -> None:
    """Read the checkpoint (once: into ``loaded`` for the job body), put its data settings and the task into ``cfg``,
    validate."""
    from mlmlab.checkpoint import checkpoint_tokenizer, load_checkpoint

    check_known_keys(cfg, FinetuneJobConfig)
    info, state_dict = load_checkpoint(cfg.checkpoint)
    loaded.update(info=info, state_dict=state_dict, tokenizer=checkpoint_tokenizer(info))
    with open_dict(cfg):
        cfg.data = OmegaConf.merge(cfg.data, info["config"]["data"])
        if cfg.task is not None:
            cfg.downstream.tasks = [cfg.task]
    if not cfg.downstream.tasks:
        raise ConfigError("no task to fine-tune on: give task=<name> or downstream.tasks=[...]")
    validate_downstream(cfg, info["objective"], info["encoder_config"]["max_position_embeddings"],
                        task_key="task" if cfg.task is not None else None)


def finetune(cfg: DictConfig) -> dict[str, float]:
    """Run one fine-tuning job; returns its metrics (``downstream/...``)."""
    loaded: dict = {}
    with Job(cfg, lambda c: prepare(c, loaded)) as job:
        return job.done(_body(cfg, job, loaded))


def _body(cfg: DictConfig, job: Job, loaded: dict) -> dict[str, float]:
    from mlmlab.checkpoint import encoder_state, language_model
    from mlmlab.downstream import Protocol, check_label_budgets, run_downstream, save_predictions

    c = typed(cfg)  # FinetuneJobConfig, with the checkpoint's data.* (prepare); below, each stage takes its groups
    config, info, out_dir, record = job.config, job.info, job.out_dir, job.record
    ckpt_info, tok = loaded["info"], loaded["tokenizer"]
    proto = Protocol.of(c.paths, c.data, c.downstream)
    tasks = proto.tasks
    zero_shot = any(tasks[n].kind == "minimal_pairs" for n in c.downstream.tasks)
    lm = language_model(ckpt_info, loaded["state_dict"]) if zero_shot else None
    encoder_cfg, enc_state = ckpt_info["encoder_config"], encoder_state(ckpt_info, loaded.pop("state_dict"))
    ckpt_path = Path(c.checkpoint).expanduser().resolve()
    record.set(source_checkpoint={"path": str(ckpt_path), "objective": ckpt_info["objective"],
                                  "encoder_key": ckpt_info["encoder_key"], "pretrain_config": ckpt_info["config"]})
    with record.timer("data"):
        for name in c.downstream.tasks:
            tasks[name].load(proto.src)
        check_label_budgets(proto)
    # named after the pretraining run dir, so the fine-tunes of a sweep's checkpoints stay apart in its group
    w, trainer_kw = c.logger.wandb, trainer_kwargs(c.trainer)
    job.run = start_wandb(w, config, info, out_dir, job_type="finetune", group=ckpt_info.get("wandb_group"),
                               name_prefix=f"ft:{ckpt_path.parent.parent.name}:")
    with record.timer("finetune"):
        metrics, report = run_downstream(proto, tok, encoder_cfg, enc_state, {**trainer_kw, "devices": 1},
                                         finetune_runs(w, c.downstream.wandb_runs, config, info, out_dir,
                                                       ckpt_info.get("wandb_group"),
                                                       f"ft:{ckpt_path.parent.parent.name}",
                                                       prefix=f"ft:{ckpt_path.parent.parent.name}:"),
                                         lm=lm)
    record.set(downstream=report)
    if c.downstream.random_init_baseline:  # the untrained encoder the checkpoint's pretraining started from
        from mlmlab.baseline import random_init_baseline

        metrics.update(random_init_baseline(proto, c.data, c.paths.cache_dir, trainer_kw, tok, encoder_cfg, metrics,
                                            record, ckpt_info["config"]["seed"]))
    save_predictions(out_dir, record)
    log.info("metrics: %s", {k: round(v, 4) for k, v in metrics.items() if "seed_" not in k})
    return metrics


@hydra.main(version_base="1.3", config_path="conf", config_name="finetune")
@config_errors_in_one_line
def main(cfg: DictConfig) -> float:
    return finetune(cfg)["downstream/score"]


if __name__ == "__main__":
    main()
