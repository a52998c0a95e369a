"""ELECTRA (objective=electra) against an independent implementation: transformers' ``ElectraForMaskedLM`` as the
generator and ``ElectraForPreTraining`` as the discriminator, embeddings shared as in the paper (one embedding module,
the generator's MLM decoder tied to its word embeddings), trained in a plain loop on exactly what the job trains on.

Shared with the job, from the composed config (``--overrides``, e.g. ``experiment=real_en_fast``): the tokenizer and the
packed blocks (mlmlab.data), the batch order (the job's data module: same seed, same sampler), the masks (the job's
masker with its per-step generator: stream, seed, rank 0, step, micro-batch 0), the optimizer and the lr schedule
(``optim.*``: AdamW with BERT's no-decay groups, warm-up and decay over ``--steps``), gradient clipping
(``trainer.gradient_clip_val``), precision (``trainer.precision`` as it resolves: CPU bf16 autocast where native) and the
ELECTRA settings (``objective.generator_size`` / ``generator_layers`` / ``disc_weight`` / ``temperature``).

Independent in the reference (``--impl hf``): the models, their initialisation (transformers' own), the generator's
MLM loss and the discriminator's BCE (transformers' heads and losses: BCE over every attended token, [CLS]/[SEP]
included, as the paper's code), and the sampling (``torch.multinomial`` over the whole softmax). transformers' ELECTRA
is post-LayerNorm only; run ours with ``model.norm=post`` for the architecture match and with the preset's norm for
the job's curve (``--impl ours``: mlmlab's ``ElectraForPretraining`` through the same loop and metrics). The masking is
ELECTRA's (``mask=electra``: 15%, 85% [MASK] / 15% kept) unless a ``mask=`` override is given.

Curves (every ``--eval-every`` steps and at the last): on the job's fixed validation masks (``eval.*``), with the
generator's samples drawn from a fixed per-batch stream at the end temperature, the discriminator's recall on
replaced tokens, accuracy on original tokens, BCE and the base rate (fraction replaced) with its entropy (the loss of
always answering the base rate), and the generator's MLM loss and accuracy -- all on the same positions (real,
non-special tokens) for both implementations; also the training batches' means over each interval.

    python benchmarks/bench_electra_reference.py --impl hf --steps 1800 --overrides experiment=real_en_fast
    python benchmarks/bench_electra_reference.py --impl ours --steps 1800 --overrides experiment=real_en_fast model.norm=post
    python benchmarks/bench_electra_reference.py --quick --out /tmp/bench     # built-in corpus, tiny model: seconds

One torch thread by default (``--threads``): run two at once pinned one per core (``taskset -c N``). Writes
``benchmarks/results/electra_reference_<name>.json`` (``--name``, default ``<impl>_<steps>``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import torch
import torch.nn.functional as F
from _common import REPO_ROOT, format_table, machine, versions, write_result
from torch import nn

QUICK = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=256",
         "data.max_seq_len=64", "data.batch_size=16"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=("ours", "hf"), default="hf")
    p.add_argument("--steps", type=int, help="optimizer steps, the lr schedule decays over them (default 1800)")
    p.add_argument("--eval-every", type=int, help="validation every n steps (default 100)")
    p.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides of the job (objective=electra is added)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--name", help="result name (default <impl>_<steps>)")
    p.add_argument("--quick", action="store_true", help="built-in corpus, tiny model, 60 steps (a smoke run)")
    p.add_argument("--out", help="result file or directory (default benchmarks/results/)")
    args = p.parse_args(argv)
    if args.quick:
        args.overrides = QUICK + args.overrides
    quick = args.quick
    args.steps = args.steps or (60 if quick else 1800)
    args.eval_every = args.eval_every or (30 if quick else 100)
    return args


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import mlmlab.config  # noqa: F401  (registers the config's resolvers)

    with initialize_config_dir(config_dir=str(REPO_ROOT / "mlmlab" / "conf"), version_base="1.3"):
        # no job runs, so nothing is written under paths.output_dir (it only has to resolve without Hydra's run).
        # mask=electra unless a mask is given: a preset's mask (experiment=real_en*: 40%, 80/10/10) would win over the
        # one objective=electra selects, as it does in a job (the sweeps say mask=electra for that reason)
        mask = [] if any(o.lstrip("+~").startswith("mask=") for o in overrides) else ["mask=electra"]
        return hydra_compose(config_name="train", overrides=["objective=electra", "paths.output_dir=/tmp/electra_reference",
                                                             *overrides, *mask])


def job_pieces(cfg):
    """What the job itself builds from the config: typed config, data (tokenizer, blocks, sampler context), the
    masking plan (recipe + fixed validation masks) and the data module (the job's batch order)."""
    from mlmlab.build import build_recipe
    from mlmlab.config import typed, validate
    from mlmlab.data.corpus import block_stats, get_blocks
    from mlmlab.data.vocab_stats import make_sampler_context
    from mlmlab.pretraining import Data, build_masking_plan, datamodule

    validate(cfg)
    c = typed(cfg)
    tok, blocks = get_blocks(c.data, c.tokenizer, c.paths.cache_dir, {})
    val_blocks = {k: v[: c.data.max_val_blocks] for k, v in blocks["validation"].items()}
    ctx = make_sampler_context(c.data, c.tokenizer, c.paths, tok, blocks)
    data = Data(tok, blocks["train"], val_blocks, ctx, block_stats(blocks["train"]), {})
    masking = build_masking_plan(build_recipe(c.mask, ctx, data.train_blocks), c.eval, data)
    return c, data, masking, datamodule(c.data, c.seed, data, masking.val)


class HFElectra(nn.Module):
    """transformers' generator + discriminator with ELECTRA's sharing: the generator uses the discriminator's embedding
    module (token, position, type embeddings and their LayerNorm) and its decoder is tied to the word embeddings."""

    def __init__(self, e, generator_size: float, generator_layers: int | None, pad_id: int):
        super().__init__()
        from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

        from mlmlab.models.electra import generator_shape

        common = {"vocab_size": e.vocab_size, "embedding_size": e.hidden_size,
                  "max_position_embeddings": e.max_position_embeddings, "type_vocab_size": e.type_vocab_size,
                  "hidden_dropout_prob": e.dropout, "attention_probs_dropout_prob": e.attention_dropout,
                  "layer_norm_eps": e.layer_norm_eps, "initializer_range": e.initializer_range, "pad_token_id": pad_id,
                  "hidden_act": "gelu"}
        g = generator_shape(e.hidden_size, e.num_heads, e.intermediate_size, e.num_layers, generator_size,
                            generator_layers)
        self.discriminator = ElectraForPreTraining(ElectraConfig(
            hidden_size=e.hidden_size, num_hidden_layers=e.num_layers, num_attention_heads=e.num_heads,
            intermediate_size=e.intermediate_size, **common))
        self.generator = ElectraForMaskedLM(ElectraConfig(
            hidden_size=g["hidden_size"], num_hidden_layers=g["num_layers"], num_attention_heads=g["num_heads"],
            intermediate_size=g["intermediate_size"], **common))
        self.generator.electra.embeddings = self.discriminator.electra.embeddings
        self.generator.generator_lm_head.weight = self.discriminator.electra.embeddings.word_embeddings.weight

    def forward(self, masked_ids, labels, original_ids, attention_mask, special_tokens_mask, *, disc_weight,
                temperature, generator, sampling=None):
        from mlmlab.models.electra import RTDOutput

        original_ids = original_ids.long()
        g = self.generator(input_ids=masked_ids, attention_mask=attention_mask, labels=labels)
        sel = labels != -100
        gen_logits = g.logits[sel]
        with torch.no_grad():
            probs = torch.softmax(gen_logits.detach().float() / temperature, -1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1) if sel.any() else gen_logits.new_zeros(
                0, dtype=torch.long)
        corrupted = original_ids.clone()
        corrupted[sel] = sampled
        replaced = (corrupted != original_ids).long()
        d = self.discriminator(input_ids=corrupted, attention_mask=attention_mask, labels=replaced)
        positions = attention_mask.bool() & ~special_tokens_mask.bool()
        return RTDOutput(g.loss + disc_weight * d.loss, g.loss, d.loss, gen_logits, labels[sel], corrupted, positions,
                         replaced[positions].float(), d.logits[positions])


def build(c, impl: str, vocab_size: int, max_steps: int):
    """The model (seeded as the job seeds it) and the job's optimizer + lr schedule for it."""
    from mlmlab.config import plain
    from mlmlab.data.tokenizer import PAD
    from mlmlab.lit.optim import adamw_from_cfg
    from mlmlab.models.encoder import EncoderConfig
    from mlmlab.train import encoder_config

    torch.manual_seed(c.seed)
    enc = encoder_config(c.model, vocab_size, "electra")
    if impl == "ours":
        model = _ours(c, enc)
    else:
        model = HFElectra(EncoderConfig(**enc), c.objective.generator_size, c.objective.generator_layers, PAD)
    opt = adamw_from_cfg(model, plain(c.optim), max_steps)
    return model, opt["optimizer"], opt["lr_scheduler"]["scheduler"]


def _ours(c, enc: dict):
    from mlmlab.data.tokenizer import SPECIAL_TOKENS
    from mlmlab.models.electra import ElectraForPretraining
    from mlmlab.models.encoder import EncoderConfig

    return ElectraForPretraining(EncoderConfig(**enc), c.objective.generator_size, c.objective.generator_layers,
                                 tuple(range(len(SPECIAL_TOKENS))))


def entropy(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log(p) + (1 - p) * math.log(1 - p))


class Sums:
    """Token-weighted sums of the RTD metrics over batches (the same arithmetic for both implementations)."""

    def __init__(self):
        self.s = {k: 0.0 for k in ("gen_loss", "gen_right", "n_gen", "disc_bce", "n_disc", "rep_right", "n_rep",
                                   "orig_right", "n_orig", "batches")}

    @torch.no_grad()
    def add(self, out) -> None:
        s = self.s
        n_gen = out.gen_targets.numel()
        if n_gen:
            s["gen_loss"] += float(F.cross_entropy(out.gen_logits.float(), out.gen_targets, reduction="sum"))
            s["gen_right"] += float((out.gen_logits.argmax(-1) == out.gen_targets).sum())
        t, z = out.disc_targets.float(), out.disc_logits.float()
        right = (z > 0).float() == t
        rep = t.bool()
        s["disc_bce"] += float(F.binary_cross_entropy_with_logits(z, t, reduction="sum"))
        s["rep_right"] += float((right & rep).sum())
        s["orig_right"] += float((right & ~rep).sum())
        s["n_gen"] += n_gen
        s["n_disc"] += t.numel()
        s["n_rep"] += float(rep.sum())
        s["n_orig"] += float((~rep).sum())
        s["batches"] += 1

    def means(self) -> dict[str, float]:
        s, d = self.s, lambda a, b: a / b if b else float("nan")
        base = d(s["n_rep"], s["n_disc"])
        return {"gen_mlm_loss": d(s["gen_loss"], s["n_gen"]), "gen_acc": d(s["gen_right"], s["n_gen"]),
                "disc_loss": d(s["disc_bce"], s["n_disc"]), "disc_recall_replaced": d(s["rep_right"], s["n_rep"]),
                "disc_acc_original": d(s["orig_right"], s["n_orig"]), "replaced_frac": base,
                "base_rate_entropy": entropy(base),
                "disc_acc": d(s["rep_right"] + s["orig_right"], s["n_disc"])}


def validate_curve(model, val_loader, o, seed: int, autocast) -> dict[str, float]:
    from mlmlab.lit.mlm import EVAL_SAMPLE_STREAM
    from mlmlab.masking import make_generator

    model.eval()
    sums = Sums()
    temperature = float(o.temperature_end if o.temperature_end is not None else o.temperature)
    with torch.no_grad():
        for i, b in enumerate(val_loader):
            with autocast():
                out = model(b["input_ids"], b["labels"], b["original_ids"], b["attention_mask"],
                            b["special_tokens_mask"], disc_weight=o.disc_weight, temperature=temperature,
                            generator=make_generator("cpu", EVAL_SAMPLE_STREAM, i), sampling=o.sampling)
            sums.add(out)
    model.train()
    return sums.means()


def run(args) -> dict:
    from torch.utils.data import DataLoader

    from mlmlab.data.datamodule import DictDataset
    from mlmlab.job import trainer_kwargs
    from mlmlab.lit.mlm import SAMPLE_STREAM, TRAIN_STREAM
    from mlmlab.masking import GeneratorSource, make_generator

    torch.set_num_threads(args.threads)
    cfg = compose(args.overrides)
    c, data, masking, dm = job_pieces(cfg)
    o, recipe = c.objective, masking.recipe
    precision = trainer_kwargs(c.trainer)["precision"]
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if "bf16" in str(precision)
                else contextlib.nullcontext)
    model, opt, sched = build(c, args.impl, data.vocab_size, args.steps)
    params = [p for p in model.parameters() if p.requires_grad]
    val_loader = DataLoader(DictDataset(masking.val), batch_size=c.data.val_batch_size, shuffle=False)
    clip = c.trainer.gradient_clip_val

    def temperature(step: int) -> float:
        start, end = float(o.temperature), o.temperature_end
        return start if end is None else start * (float(end) / start) ** min(1.0, step / max(1, args.steps - 1))

    curve, window, step, t0, train_s = [], Sums(), 0, time.perf_counter(), 0.0
    curve.append({"step": 0, "val": validate_curve(model, val_loader, o, c.seed, autocast), "train": None})
    while step < args.steps:
        for batch in dm.train_dataloader():
            if step >= args.steps:
                break
            ts = time.perf_counter()
            ids, special = batch["input_ids"], batch["special_tokens_mask"]
            rate = recipe.schedule(step, args.steps)
            m = recipe.masker(ids, special, rate, GeneratorSource(make_generator("cpu", TRAIN_STREAM, c.seed, 0, step, 0),
                                                                  ids.shape[0], ids.device),
                              word_ids=batch.get("word_ids"))
            with autocast():
                out = model(m.input_ids, m.labels, ids, batch["attention_mask"], special, disc_weight=o.disc_weight,
                            temperature=temperature(step), generator=make_generator("cpu", SAMPLE_STREAM, c.seed, 0,
                                                                                     step, 0),
                            sampling=o.sampling)
            out.loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            window.add(out)
            step += 1
            train_s += time.perf_counter() - ts
            if step % args.eval_every == 0 or step == args.steps:
                point = {"step": step, "val": validate_curve(model, val_loader, o, c.seed, autocast),
                         "train": window.means()}
                curve.append(point)
                window = Sums()
                v = point["val"]
                print(f"[{args.impl}] step {step}: recall {v['disc_recall_replaced']:.3f} disc_loss "
                      f"{v['disc_loss']:.4f} (base-rate entropy {v['base_rate_entropy']:.4f}) gen_loss "
                      f"{v['gen_mlm_loss']:.3f}", flush=True)
    return {"impl": args.impl, "steps": args.steps, "eval_every": args.eval_every, "overrides": args.overrides,
            "precision": str(precision), "norm": "post" if args.impl == "hf" else c.model.norm, "objective": {
                k: getattr(o, k) for k in ("generator_size", "generator_layers", "disc_weight", "temperature",
                                           "temperature_end", "sampling")},
            "parameters": sum(p.numel() for p in params), "train_s": train_s, "s_per_step": train_s / max(1, step),
            "wall_s": time.perf_counter() - t0, "curve": curve}


def main(argv=None) -> None:
    args = parse_args(argv)
    res = run(args)
    name = args.name or f"{args.impl}_{args.steps}"
    path = write_result(f"electra_reference_{name}", {"machine": machine(), "versions": versions(), **res}, args.out)
    rows = [{"step": p["step"], **p["val"]} for p in res["curve"]]
    print(format_table(rows, [("step", "step", "d"), ("disc_recall_replaced", "recall", ".3f"),
                              ("disc_acc_original", "orig acc", ".3f"), ("disc_loss", "disc BCE", ".4f"),
                              ("base_rate_entropy", "H(base)", ".4f"), ("replaced_frac", "replaced", ".3f"),
                              ("gen_mlm_loss", "gen loss", ".3f"), ("gen_acc", "gen acc", ".3f")]))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
