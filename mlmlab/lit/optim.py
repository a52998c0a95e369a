"""AdamW with BERT's no-decay groups and a warmup + decay learning-rate schedule (shared by pretraining and fine-tuning)."""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        parts = name.split(".")  # whole name segments: "embeddings_project" (ELECTRA's generator) is a normal weight
        (no_decay if p.ndim < 2 or "LayerNorm" in parts or "embeddings" in parts else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def layer_depth(name: str, num_layers: int) -> int:
    """ELECTRA's depth of an encoder parameter for layer-wise lr decay: the embeddings 0, layer ``i`` (``...layer.<i>.``)
    ``i + 1``, everything above the layers (a pre-LN encoder's last LayerNorm, the task head) ``num_layers + 1``."""
    parts = name.split(".")
    if "embeddings" in parts:
        return 0
    for a, b in zip(parts, parts[1:]):
        if a == "layer" and b.isdigit():
            return int(b) + 1
    return num_layers + 1


def layer_decay_groups(model: nn.Module, weight_decay: float, lr: float, decay: float, num_layers: int) -> list[dict]:
    """:func:`param_groups` split by depth (:func:`layer_depth`), each at ``lr x decay^(num_layers + 1 - depth)``."""
    depth = {id(p): layer_depth(n, num_layers) for n, p in model.named_parameters()}
    groups = []
    for g in param_groups(model, weight_decay):
        for d in sorted({depth[id(p)] for p in g["params"]}):
            groups.append({"params": [p for p in g["params"] if depth[id(p)] == d], "weight_decay": g["weight_decay"],
                           "lr": lr * decay ** (num_layers + 1 - d), "depth": d})
    return groups


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float = 0.0,
              decay_frac: float | None = None) -> float:
    """The lr multiplier at ``step``: linear warmup over ``warmup`` steps, then ``schedule`` -- linear or cosine decay
    to ``min_ratio`` at ``total``, constant, or wsd (warmup-stable-decay: constant until the last ``decay_frac`` of
    the run, then linear to ``min_ratio`` at ``total``; Hu et al. 2024, MiniCPM; ``decay_frac`` from ``optim.decay_frac``,
    whose default is in ``OptimConfig``)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        if decay_frac is None:
            raise ValueError("schedule='wsd' needs decay_frac (optim.decay_frac)")
        decay = max(1, round(decay_frac * total))
        start = max(warmup, total - decay)
        progress = min(1.0, max(0, step - start) / max(1, total - start))
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * decay


def impl_kwargs(impl: str = "auto") -> dict:
    """``optim.impl`` -> torch.optim.AdamW's switches. auto (the default): foreach on every device -- torch's own default
    on CUDA; on the CPU, where torch would take the single-tensor loop, foreach gives bitwise the same parameters
    (tests/test_performance.py) and a faster step at large vocabularies (docs/performance.md); for_loop: the
    single-tensor loop; foreach: one multi-tensor op per update stage; fused: one fused kernel (CPU and CUDA; not
    bitwise equal to the loop)."""
    kw = {"auto": {"foreach": True}, "for_loop": {"foreach": False, "fused": False}, "foreach": {"foreach": True},
          "fused": {"fused": True}}
    if impl not in kw:
        raise ValueError(f"optim.impl={impl!r} is not known; allowed: {', '.join(kw)}")
    return kw[impl]


def adamw_with_schedule(model: nn.Module, lr: float, weight_decay: float, betas, eps: float, warmup: int, total: int,
                        schedule: str = "linear", min_ratio: float = 0.0, impl: str = "auto",
                        decay_frac: float | None = None, layer_decay: tuple[float, int] | None = None):
    """AdamW with BERT's no-decay groups and the lr schedule; ``layer_decay=(decay, num_layers)``: ELECTRA's layer-wise
    lr decay (:func:`layer_decay_groups`), the schedule multiplying each group's own lr."""
    groups = (param_groups(model, weight_decay) if layer_decay is None
              else layer_decay_groups(model, weight_decay, lr, *layer_decay))
    opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **impl_kwargs(impl))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total, schedule, min_ratio, decay_frac))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def warmup_steps(o: dict, total: int) -> int:
    """``optim.warmup_frac`` x the run's steps (rounded) when set, else ``optim.warmup_steps``."""
    frac = o.get("warmup_frac")
    return o["warmup_steps"] if frac is None else int(round(frac * total))


def adamw_from_cfg(model: nn.Module, o: dict, total: int):
    """``adamw_with_schedule`` from an ``optim.*`` dict (pretraining modules)."""
    return adamw_with_schedule(model, o["lr"], o["weight_decay"], o["betas"], o["eps"], warmup_steps(o, total), total,
                               o["schedule"], o["min_lr_ratio"], o.get("impl", "auto"), o.get("decay_frac"))
