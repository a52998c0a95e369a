"""Checkpoints: what a pretraining checkpoint carries besides Lightning's state, so that it can be fine-tuned
(``python -m mlmlab.finetune``) or exported (``python -m mlmlab.export``) on its own -- the tokenizer, the encoder's
config, where the encoder sits in the state dict, the objective, the whole resolved run config and the W&B run id --
and how checkpoints are written (atomically) and resumed (``resume=``: the path, the config diff, the global RNG
states a checkpoint carries beyond Lightning's own).

Exact resume needs five things to continue where they were: the global step, optimizer and LR-scheduler state (Lightning
saves them), the mask stream and the schedule position (keyed by the global step, see ``mlmlab.lit.mlm``), the data order
(``mlmlab.data.datamodule.ResumableSampler``: a fixed permutation per (seed, epoch), restarted at the batch after the
last one trained) and the global RNG states that dropout draws from (saved and restored by ``mlmlab.guard.Guard``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import uuid
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch

from mlmlab.errors import ConfigError

log = logging.getLogger(__name__)

FORMAT = 1


def run_info(config: dict, tok, encoder_cfg: dict, module, wandb_group: str | None = None,
             wandb_id: str | None = None) -> dict:
    enc = module.encoder()
    key = next(name for name, m in module.named_modules() if m is enc)
    return {"format": FORMAT, "objective": config["objective"]["name"], "encoder_config": encoder_cfg,
            "encoder_key": key, "tokenizer": tok.to_str(), "config": config, "wandb_group": wandb_group,
            "wandb_id": wandb_id}


class RunInfo(pl.Callback):
    """Puts :func:`run_info` into every checkpoint the Trainer saves (under ``"mlmlab"``)."""

    def __init__(self, info: dict):
        self.info = info

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["mlmlab"] = self.info


def load_checkpoint(path: str, key: str = "checkpoint") -> tuple[dict, dict]:
    """``(info, state_dict)`` of a pretraining checkpoint; ConfigError naming ``key`` when it is not one."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError(f"{key}={path!r} does not exist (give the explicit path of a .ckpt file, e.g. "
                          "<run dir>/checkpoints/last.ckpt)")
    try:  # a trusted local file written by mlmlab.train (it holds plain Python objects besides tensors)
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"{key}={path!r} could not be read as a checkpoint ({type(e).__name__}: {e})") from e
    info = ckpt.get("mlmlab") if isinstance(ckpt, dict) else None
    if not info or "encoder_key" not in info:
        raise ConfigError(f"{key}={path!r} is not an mlmlab pretraining checkpoint (no 'mlmlab' entry)")
    # where the checkpoint stands in its run (Lightning's own entries): a start records it (mlmlab.init)
    info = {**info, "global_step": ckpt.get("global_step"),
            "max_steps": (ckpt.get("hyper_parameters") or {}).get("max_steps")}
    return info, ckpt["state_dict"]


def encoder_state(info: dict, state_dict: dict) -> dict:
    prefix = info["encoder_key"] + "."
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def checkpoint_tokenizer(info: dict, key: str = "checkpoint"):
    """The tokenizer the checkpoint was pretrained with; ConfigError if it does not fit the embedding matrix."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(info["tokenizer"])
    vocab, emb = tok.get_vocab_size(), info["encoder_config"]["vocab_size"]
    if vocab != emb:
        raise ConfigError(f"{key}: the tokenizer has {vocab} tokens but the encoder's embedding matrix has {emb} rows "
                          "(tokenizer and checkpoint do not match)")
    return tok


def language_model(info: dict, state_dict: dict):
    """The whole pretrained language model of a checkpoint (encoder + LM head; ELECTRA: discriminator + generator),
    for zero-shot scoring (mlmlab.zeroshot). ``objective=none`` checkpoints carry the untrained MLM head."""
    from mlmlab.data.tokenizer import SPECIAL_TOKENS
    from mlmlab.models.electra import ElectraForPretraining
    from mlmlab.models.encoder import BertForMLM, CausalLM, EncoderConfig

    c = EncoderConfig(**info["encoder_config"])
    objective = info["objective"]
    if objective == "electra":
        o = info["config"]["objective"]
        model = ElectraForPretraining(c, o["generator_size"], o.get("generator_layers"),
                                      tuple(range(len(SPECIAL_TOKENS))))
    else:
        model = CausalLM(c) if c.causal else BertForMLM(c)
    prefix = info["encoder_key"].rsplit(".", 1)[0] + "."
    model.load_state_dict({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)})
    return model.eval()


# ------------------------------------------------------------------------------------------- writing and resuming


def atomic_save_checkpoint(trainer: pl.Trainer, path: str | Path) -> Path:
    """``trainer.save_checkpoint`` to a temporary file in the same folder, then ``os.replace``: a kill at any moment
    leaves either the previous checkpoint or the new one, never a truncated file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{uuid.uuid4().hex[:6]}")
    trainer.save_checkpoint(tmp)  # all ranks call it; rank 0 writes
    if trainer.is_global_zero:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    trainer.strategy.barrier("atomic_save_checkpoint")
    return path


def resume_path(resume: str) -> Path:
    """``resume=<run dir or .ckpt file>``: a run dir means ``<dir>/checkpoints/last.ckpt``."""
    p = Path(str(resume)).expanduser()
    return p / "checkpoints" / "last.ckpt" if p.is_dir() else p


def resume_wandb_id(resume: str | None) -> str | None:
    """The W&B run id a ``resume=`` checkpoint was logged under (None without resume, W&B or a readable checkpoint):
    the resumed job continues that run."""
    if resume is None:
        return None
    try:
        ckpt = torch.load(resume_path(resume), map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # check_resume names the key when the checkpoint is unreadable
        return None
    return (ckpt.get("mlmlab") or {}).get("wandb_id") if isinstance(ckpt, dict) else None


def folder_checkpoints(output_dir: Path) -> list[Path]:
    """The checkpoints a job's output dir already holds (``checkpoints/last.ckpt`` first, then any other ``*.ckpt`` in
    it or in ``checkpoints/``, by name)."""
    d, last = Path(output_dir), Path(output_dir) / "checkpoints" / "last.ckpt"
    found = sorted({*d.glob("*.ckpt"), *(d / "checkpoints").glob("*.ckpt")})
    return sorted((p for p in found if p.is_file()), key=lambda p: p != last)


def check_not_overwriting(output_dir, resume: str | None, overwrite: bool, skip_completed: bool = False,
                          multirun: bool = False) -> None:
    """A job started without ``resume=`` into an output dir that already holds a checkpoint would start again at step 0
    and replace it: refused before any work (ConfigError, one line giving the exact ``resume=`` that continues it and
    ``overwrite=true`` that starts again). A fresh dir, ``resume=`` or ``overwrite=true``: nothing to check. Not
    refused, but logged as a warning with the same line: a multirun's job (a sweep's replay reruns its failed, missing
    and changed jobs in their dirs, and no one ``resume=`` fits every job) and, with ``skip_completed=true``, a
    finished (ok) record's dir that ``skip_completed`` decided to run again (a changed config; it said so)."""
    if resume is not None or overwrite:
        return
    out = Path(str(output_dir)).expanduser()
    ckpts = folder_checkpoints(out)
    if not ckpts:
        return
    path = ckpts[0]
    try:
        status = json.loads((out / "results.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):  # killed before its record: none
        status = None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        step = f", global step {ckpt['global_step']}" if isinstance(ckpt, dict) and "global_step" in ckpt else ""
    except Exception:  # an unreadable checkpoint is still not overwritten silently
        step = ""
    what = ("a finished run (results.json: ok; skip_completed=true keeps it when the config is the same)"
            if status == "ok" else f"a run that did not finish ok (results.json: {status or 'none'})")
    more = f" (and {len(ckpts) - 1} more .ckpt)" if len(ckpts) > 1 else ""
    msg = (f"paths.output_dir={out} already holds a checkpoint ({path}{step}){more} of {what}; continue it with "
           f"resume={out if path == out / 'checkpoints' / 'last.ckpt' else path}, or start again from step 0 "
           "(replacing it) with overwrite=true")
    if multirun or (status == "ok" and skip_completed):
        why = "a multirun job" if multirun else "skip_completed"
        log.warning("%s; %s: running the job again from step 0", msg, why)
        return
    raise ConfigError(msg)


# what may differ between a checkpoint's run and the run that resumes it (nothing of the pretraining itself)
RESUME_FREE = ("paths", "resume", "skip_completed", "overwrite", "logger", "downstream",
               "trainer.checkpoint_every_n_steps", "trainer.nonfinite", "trainer.enable_progress_bar",
               "data.num_workers", "data.num_proc",
               "eval.zeroshot_every_n_steps", "eval.zeroshot_n_per_paradigm", "eval.units",
               "eval.per_source", "eval.phase_margin")


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# what may differ between a finished run and a rerun that skips it (skip_completed=true)
# analysis.*: what is asked, not what ran; eval.phase_margin: how the record is read (mlmlab.phase), so records from
# before the key are not rerun for it
COMPLETED_FREE = ("paths", "skip_completed", "resume", "overwrite", "analysis", "eval.phase_margin")


def config_diff(before: dict | None, now: dict, free: tuple[str, ...]) -> list[tuple[str, object, object]]:
    """The dotted keys whose values differ between two resolved configs, leaving out the ``free`` keys and everything
    under them: ``[(key, before, now)]``. The one comparison behind resume (``RESUME_FREE``) and skip_completed
    (``COMPLETED_FREE``)."""
    is_free = lambda k: any(k == f or k.startswith(f + ".") for f in free)  # noqa: E731
    a, b = _flatten(before), _flatten(now)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if not is_free(k) and a.get(k) != b.get(k)]


def check_resume(resume: str, config: dict) -> Path:
    """The checkpoint ``resume=`` names, after checking it is a pretraining checkpoint of this same config (ConfigError
    naming ``resume`` and the keys that differ otherwise: an exact resume cannot change the run it continues)."""

    path = resume_path(resume)  # that it exists was checked by mlmlab.config.validate_reliability
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:
        raise ConfigError(f"resume={resume!r}: {path} could not be read as a checkpoint ({type(e).__name__}: {e})") \
            from e
    before = ((ckpt.get("mlmlab") or {}).get("config")) if isinstance(ckpt, dict) else None
    if before is None:
        raise ConfigError(f"resume={resume!r}: {path} is not an mlmlab pretraining checkpoint")
    changed = config_diff(before, config, RESUME_FREE)
    if changed:
        raise ConfigError(f"resume={resume!r}: the checkpoint was made with a different config ("
                          + ", ".join(f"{k}: {x!r} -> {y!r}" for k, x, y in changed[:8])
                          + (" ..." if len(changed) > 8 else "") + "); resume with the same overrides")
    log.info("resuming from %s (global step %s)", path, ckpt.get("global_step"))
    return path


def rng_state() -> dict:  # plain types and tensors only: Lightning loads checkpoints with weights_only=True
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    s = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
         "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
