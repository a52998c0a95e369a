"""Our masker vs ``transformers.DataCollatorForLanguageModeling`` on the same pre-tokenized batch, and masking as a
share of one training step.

Like with like: BERT's recipe on both sides -- rate 0.15, token units, an independent (Bernoulli) choice per
token, 80/10/10 [MASK]/random/keep, uniform random replacements (``mask=bert``). The batch looks like packed blocks:
``[CLS]`` at 0, ``[SEP]`` at the end, ids uniform in [5, vocab), ``special_tokens_mask`` given to both sides, so HF never
calls the tokenizer per row (its fastest path).

Rows (median time per batch after warmup; CPU at each thread count, then the GPU if there is one):

- ``ours``: ``MLMModule.mask_batch`` -- what ``training_step`` does: schedule, generator seeded from (seed, rank,
  step, micro), ``Masker`` call.
- ``ours+telemetry``: plus ``telemetry(...)``, the realized-rate statistics ``training_step`` logs every step.
- ``ours+collate``: ``default_collate`` of the ``BlockDataset`` items plus ``ours`` (the counterpart of HF's ``__call__``).
- ``hf_mask``: ``collator.torch_mask_tokens(ids, special_tokens_mask)`` on the stacked tensor (HF's masking part).
- ``hf_call``: ``collator(examples)`` on a list of dicts of Python lists (what a ``datasets.Dataset`` yields), and
  ``hf_call_tensors`` on a list of dicts of tensors (a dataset in torch format).
- ``step``: one ``training_step`` (masking included) + backward + gradient clipping (1.0, trainer default) + AdamW +
  LR-scheduler step of the default ``small`` model, built by ``mlmlab.build.build_module`` from the composed config.

HF's collator builds its probability tensors on the CPU, so it has no GPU row (in training it runs in DataLoader
workers); on the GPU we report ours and the step (fp32 and bf16 autocast, as ``trainer=gpu``).

    python benchmarks/bench_masking.py                            # full: ~3-5 min on 2 cores
    python benchmarks/bench_masking.py --quick --out /tmp/bench   # tiny model and batch, ~10 s
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, format_table, machine, versions, write_result  # noqa: E402

FULL = {"batch": 64, "seq": 128, "vocab": [8192, 30522], "threads": [1, 2], "warmup": 10, "iters": 100,
        "step_warmup": 2, "step_iters": 8, "check_batches": 50, "model": "small"}
QUICK = {"batch": 16, "seq": 64, "vocab": [512], "threads": [1], "warmup": 2, "iters": 10,
         "step_warmup": 1, "step_iters": 2, "check_batches": 5, "model": "tiny"}
TARGETS = {"speedup_vs_hf_cpu": 15.0, "mask_frac_of_step": 0.01}  # reported, never asserted
RATE = 0.15


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model, small batch, few iterations (seconds)")
    p.add_argument("--vocab", type=int, nargs="+", help="vocabulary sizes (default 8192 30522)")
    p.add_argument("--threads", type=int, nargs="+", help="CPU thread counts (default 1 2)")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--warmup", type=int, help="untimed masking calls before the timed ones")
    p.add_argument("--iters", type=int, help="timed masking calls (the median is reported)")
    p.add_argument("--step-warmup", type=int, help="untimed training steps")
    p.add_argument("--step-iters", type=int, help="timed training steps")
    p.add_argument("--check-batches", type=int, help="batches for the realized-fraction sanity check")
    p.add_argument("--model", help="conf/model preset of the training step (default small)")
    p.add_argument("--no-step", action="store_true", help="skip the training step (no fraction of step)")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU even when one is available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="result file or directory (default benchmarks/results/bench_masking.json)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for k in ("vocab", "threads", "batch", "seq", "warmup", "iters", "step_warmup", "step_iters", "check_batches",
              "model"):
        if getattr(args, k) is None:
            setattr(args, k, preset[k])
    return args


# ---------------------------------------------------------------------------------------------------------- inputs
def make_blocks(batch: int, seq: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """What a training batch holds (``BlockDataset`` items collated): [CLS] ids [SEP] rows, no padding."""
    from mlmlab.data.tokenizer import CLS, PAD, SEP

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    ids[:, 0], ids[:, -1] = CLS, SEP
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    word_ids = torch.arange(seq).expand(batch, seq).sub(1).masked_fill(special, -1)
    return {"input_ids": ids, "special_tokens_mask": special, "word_ids": word_ids, "attention_mask": ids != PAD,
            "block_id": torch.arange(batch)}


def hf_collator(vocab: int):
    """``DataCollatorForLanguageModeling`` (0.15, 80/10/10) with a fast tokenizer of exactly ``vocab`` ids, the specials
    at mlmlab's ids 0..4."""
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    from mlmlab.data.tokenizer import SPECIAL_TOKENS

    table = {t: i for i, t in enumerate(SPECIAL_TOKENS)} | {f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordPiece(table, unk_token="[UNK]")),
                                  pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                  mask_token="[MASK]")
    assert len(tok) == vocab and tok.mask_token_id == SPECIAL_TOKENS.index("[MASK]")
    return DataCollatorForLanguageModeling(tokenizer=tok, mlm=True, mlm_probability=RATE, mask_replace_prob=0.8,
                                           random_replace_prob=0.1, return_tensors="pt")


def compose(model: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import mlmlab.config  # noqa: F401  (registers the schema)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=["mask=bert", f"model={model}"])


def build(cfg, vocab: int):
    """The pretraining module of the run (``mask=bert``: uniform sampler, constant schedule) and its optimizer."""
    from mlmlab.build import build_module, eval_suffix, recipe_without_data
    from mlmlab.models.encoder import EncoderConfig

    encoder_cfg = EncoderConfig.from_model_cfg(cfg.model, vocab).to_dict()
    module = build_module(cfg.objective, cfg.optim, cfg.seed, eval_suffix(cfg.eval.rate), encoder_cfg,
                          cfg.trainer.max_steps, recipe_without_data(cfg.mask, vocab))
    module.train()
    opt = module.configure_optimizers()
    return module, opt["optimizer"], opt["lr_scheduler"]["scheduler"]


# ---------------------------------------------------------------------------------------------------------- timing
def timed(fn, setup=None, warmup: int = 1, iters: int = 5, sync=None) -> list[float]:
    """Seconds per call of ``fn(setup())`` (``setup`` untimed), after ``warmup`` untimed calls."""
    out = []
    for i in range(warmup + iters):
        arg = setup() if setup else None
        if sync:
            sync()
        t0 = time.perf_counter()
        fn(arg)
        if sync:
            sync()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def ms(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


def step_fn(module, opt, sched, batch, autocast: contextlib.AbstractContextManager | None = None):
    def step(_):
        with autocast or contextlib.nullcontext():
            loss = module.training_step(batch, 0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return step


def mask_rows(module, coll, batch: dict, items: list, lists: list, tensors: list, args, sync=None,
              with_hf: bool = True) -> dict[str, float]:
    from torch.utils.data import default_collate

    from mlmlab.masking import telemetry

    def ours(_):
        return module.mask_batch(batch, 0)

    def ours_tel(_):
        _, out = module.mask_batch(batch, 0)
        return telemetry(batch["input_ids"], batch["special_tokens_mask"], out)

    def ours_collate(_):
        b = default_collate(items)
        return module.mask_batch(b, 0)

    kw = {"warmup": args.warmup, "iters": args.iters, "sync": sync}
    r = {"ours": ms(timed(ours, **kw)), "ours+telemetry": ms(timed(ours_tel, **kw))}
    if items is not None:
        r["ours+collate"] = ms(timed(ours_collate, **kw))
    if with_hf:
        special = batch["special_tokens_mask"]
        r["hf_mask"] = ms(timed(lambda ids: coll.torch_mask_tokens(ids, special_tokens_mask=special),
                                setup=lambda: batch["input_ids"].clone(), **kw))  # it masks in place
        r["hf_call"] = ms(timed(lambda _: coll(lists), **kw))
        r["hf_call_tensors"] = ms(timed(lambda _: coll(tensors), **kw))
    return r


# ------------------------------------------------------------------------------------------------------- sanity
def sanity(module, coll, batch: dict, n: int, mask_id: int) -> dict[str, dict[str, float]]:
    """Realized rates over ``n`` batches: selected fraction (of non-special positions), [MASK]/random/keep split of the
    selected, specials selected, random replacements that are special ids or equal to the original."""
    from mlmlab.masking.masker import MASKED, RANDOM
    from mlmlab.models.encoder import IGNORE_INDEX

    ids, special = batch["input_ids"], batch["special_tokens_mask"]
    acc = {k: torch.zeros(6) for k in ("ours", "hf")}
    torch.manual_seed(0)  # HF's global RNG
    for i in range(n):
        module.seed = i  # a different mask stream per batch (global_step is 0 without a trainer)
        _, o = module.mask_batch(batch, 0)
        new, labels = coll.torch_mask_tokens(ids.clone(), special_tokens_mask=special)
        for k, x, lab, masked, rnd in (("ours", o.input_ids, o.labels, o.kind == MASKED, o.kind == RANDOM),
                                       ("hf", new, labels, None, None)):
            sel = lab != IGNORE_INDEX
            if masked is None:  # HF: a [MASK] where there was none; random: changed to something else
                masked, rnd = sel & (x == mask_id), sel & (x != mask_id) & (x != ids)
            acc[k] += torch.tensor([sel.sum(), (~special).sum(), masked.sum(), rnd.sum(), (sel & special).sum(),
                                    (rnd & (x < 5)).sum()], dtype=torch.float)
    module.seed = 0
    out = {}
    for k, (sel, cand, masked, rnd, sp_sel, rnd_sp) in acc.items():
        out[k] = {"selected_frac": float(sel / cand), "mask_frac": float(masked / sel), "random_frac": float(rnd / sel),
                  "keep_frac": float((sel - masked - rnd) / sel), "special_selected": int(sp_sel),
                  "random_special_frac": float(rnd_sp / rnd.clamp(min=1))}
    out["note"] = ("HF's random_frac counts only replacements that differ from the original (~1/vocab of its draws "
                   "equal it and look kept); HF draws random ids from the whole vocabulary, specials included")
    return out


# --------------------------------------------------------------------------------------------------------- runs
def run_vocab(cfg, vocab: int, args) -> dict:
    from mlmlab.data.tokenizer import MASK

    batch = make_blocks(args.batch, args.seq, vocab, args.seed)
    items = [{k: v[i] for k, v in batch.items()} for i in range(args.batch)]
    lists = [{"input_ids": r.tolist(), "special_tokens_mask": s.int().tolist()}
             for r, s in zip(batch["input_ids"], batch["special_tokens_mask"])]
    tensors = [{"input_ids": r.clone(), "special_tokens_mask": s.long()}
               for r, s in zip(batch["input_ids"], batch["special_tokens_mask"])]
    coll = hf_collator(vocab)
    module, opt, sched = build(cfg, vocab)
    rec = {"vocab": vocab, "parameters": sum(p.numel() for p in module.parameters()), "cpu": [],
           "sanity": sanity(module, coll, batch, args.check_batches, MASK)}
    for t in args.threads:
        torch.set_num_threads(t)
        row = {"threads": t, **mask_rows(module, coll, batch, items, lists, tensors, args)}
        if not args.no_step:
            row["step"] = ms(timed(step_fn(module, opt, sched, batch), warmup=args.step_warmup, iters=args.step_iters))
        rec["cpu"].append(derive(row))
    if torch.cuda.is_available() and not args.no_gpu:
        try:
            rec["gpu"] = run_gpu(module, batch, args)
        except Exception as e:  # keep the CPU numbers; say what went wrong
            rec["gpu"] = {"device": torch.cuda.get_device_name(0), "error": f"{type(e).__name__}: {e}"}
    else:
        rec["gpu"] = None
    return rec


def run_gpu(module, batch: dict, args, dev: torch.device | None = None) -> dict:
    """Ours and the step on an accelerator (``dev``: CUDA by default; any device works, for a dry run on the CPU)."""
    dev = dev or torch.device("cuda")
    cuda = dev.type == "cuda"
    module.to(dev)
    try:
        o = module.configure_optimizers()  # fresh optimizer state on the device
        opt, sched = o["optimizer"], o["lr_scheduler"]["scheduler"]
        b = {k: v.to(dev) for k, v in batch.items()}
        sync = torch.cuda.synchronize if cuda else None
        row = {"device": torch.cuda.get_device_name(dev) if cuda else str(dev),
               **mask_rows(module, None, b, None, None, None, args, sync=sync, with_hf=False)}
        if not args.no_step:
            kw = {"warmup": max(3, args.step_warmup), "iters": max(10, args.step_iters), "sync": sync}
            row["step"] = ms(timed(step_fn(module, opt, sched, b), **kw))
            bf16 = torch.autocast(dev.type, dtype=torch.bfloat16)
            row["step_bf16"] = ms(timed(step_fn(module, opt, sched, b, bf16), **kw))
        row["hf"] = None
        row["hf_note"] = "DataCollatorForLanguageModeling masks on the CPU (torch.full without a device)"
    finally:
        module.to("cpu")
    return derive(row)


def derive(row: dict) -> dict:
    """Ratios (HF / ours: how many times faster ours is) and masking as a share of the step."""
    if "hf_mask" in row:
        row["speedup_mask"] = row["hf_mask"] / row["ours"]
        row["speedup_call"] = row["hf_call"] / row["ours+collate"]
        row["speedup_call_vs_mask"] = row["hf_call"] / row["ours"]  # HF's collator call vs our masking step alone
    for step in ("step", "step_bf16"):
        if step in row:
            sfx = "" if step == "step" else "_bf16"
            row[f"mask_frac_of_step{sfx}"] = row["ours"] / row[step]
            row[f"mask_tel_frac_of_step{sfx}"] = row["ours+telemetry"] / row[step]
    return row


def summarize(results: list[dict]) -> dict:
    cpu = [r for v in results for r in v["cpu"]]
    best = {k: min((r[k] for r in cpu if k in r), default=None)
            for k in ("speedup_mask", "speedup_call", "speedup_call_vs_mask")}
    worst = max((r["mask_tel_frac_of_step"] for r in cpu if "mask_tel_frac_of_step" in r), default=None)
    gpu = [v["gpu"] for v in results if v["gpu"] and "error" not in v["gpu"]]
    gpu_worst = {k: max((r[k] for r in gpu if k in r), default=None)
                 for k in ("mask_tel_frac_of_step", "mask_tel_frac_of_step_bf16")}
    s = TARGETS["speedup_vs_hf_cpu"]
    return {"targets": TARGETS, "min_speedup_mask": best["speedup_mask"], "min_speedup_call": best["speedup_call"],
            "min_speedup_call_vs_mask": best["speedup_call_vs_mask"],
            "speedup_mask_met": None if best["speedup_mask"] is None else best["speedup_mask"] >= s,
            "speedup_call_met": None if best["speedup_call"] is None else best["speedup_call"] >= s,
            "max_mask_tel_frac_of_step": worst,
            "mask_frac_met": None if worst is None else worst < TARGETS["mask_frac_of_step"],
            "max_mask_tel_frac_of_step_gpu": gpu_worst["mask_tel_frac_of_step"],
            "max_mask_tel_frac_of_step_gpu_bf16": gpu_worst["mask_tel_frac_of_step_bf16"]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*self.log.*")  # no Trainer attached: Lightning warns, does nothing
    mach = machine()
    cfg = compose(args.model)
    results = [run_vocab(cfg, v, args) for v in args.vocab]
    settings = {k: getattr(args, k) for k in ("quick", "vocab", "threads", "batch", "seq", "warmup", "iters",
                                              "step_warmup", "step_iters", "check_batches", "model", "seed")}
    settings.update(rate=RATE, replace=[0.8, 0.1, 0.1], mask="bert (token, bernoulli, uniform sampler)",
                    step="training_step + backward + clip_grad_norm(1.0) + AdamW + LR schedule")
    payload = {"machine": mach, "versions": versions(), "settings": settings, "results": results,
               "gpu": next((r["gpu"].get("device") for r in results if r["gpu"]), None),  # null: no GPU row
               "summary": summarize(results)}
    path = write_result("bench_masking", payload, args.out)
    print_tables(results, payload["summary"])
    print(f"\nwrote {path}")
    return payload


def print_tables(results: list[dict], summary: dict) -> None:
    cols = [("vocab", "vocab", "d"), ("threads", "thr", "d"), ("ours", "ours ms", ".3f"),
            ("ours+telemetry", "+telem ms", ".3f"), ("ours+collate", "+collate ms", ".3f"),
            ("hf_mask", "hf_mask ms", ".3f"), ("hf_call", "hf_call ms", ".3f"),
            ("hf_call_tensors", "hf_call_t ms", ".3f"), ("speedup_mask", "x mask", ".1f"),
            ("speedup_call", "x call", ".1f"), ("speedup_call_vs_mask", "x call/mask", ".1f"), ("step", "step ms", ".1f"),
            ("mask_tel_frac_of_step", "mask/step", ".2%")]
    rows = [{"vocab": v["vocab"], **r} for v in results for r in v["cpu"]]
    print("CPU (median per batch; x = HF / ours)")
    print(format_table(rows, cols))
    gpu = [{"vocab": v["vocab"], **v["gpu"]} for v in results if v["gpu"] and "error" not in v["gpu"]]
    if gpu:
        print(f"\nGPU ({gpu[0]['device']})")
        print(format_table(gpu, [("vocab", "vocab", "d"), ("ours", "ours ms", ".3f"),
                                 ("ours+telemetry", "+telem ms", ".3f"), ("step", "step ms", ".2f"),
                                 ("step_bf16", "bf16 step ms", ".2f"), ("mask_tel_frac_of_step", "mask/step", ".2%"),
                                 ("mask_tel_frac_of_step_bf16", "mask/bf16", ".2%")]))
    for v in results:
        if v["gpu"] and "error" in v["gpu"]:
            print(f"GPU vocab {v['vocab']}: {v['gpu']['error']}")
    if all(v["gpu"] is None for v in results):
        print("GPU: none available or --no-gpu (\"gpu\": null)")
    print("\nsanity (realized over the check batches)")
    srows = [{"vocab": v["vocab"], "who": k, **v["sanity"][k]} for v in results for k in ("ours", "hf")]
    print(format_table(srows, [("vocab", "vocab", "d"), ("who", "", "s"), ("selected_frac", "selected", ".4f"),
                               ("mask_frac", "[MASK]", ".3f"), ("random_frac", "random", ".3f"),
                               ("keep_frac", "keep", ".3f"), ("special_selected", "special sel", "d"),
                               ("random_special_frac", "rand=special", ".4f")]))
    t = summary["targets"]
    print(f"\ntargets (reported, not asserted): >= {t['speedup_vs_hf_cpu']:g}x HF on CPU -- masking part "
          f"min {_fmt(summary['min_speedup_mask'], '.1f')}x, full call min {_fmt(summary['min_speedup_call'], '.1f')}x, "
          f"HF call vs our masking min {_fmt(summary['min_speedup_call_vs_mask'], '.1f')}x; "
          f"< {t['mask_frac_of_step']:.0%} of a step -- max {_fmt(summary['max_mask_tel_frac_of_step'], '.2%')} on CPU"
          + (f", GPU {_fmt(summary['max_mask_tel_frac_of_step_gpu'], '.2%')} (bf16 "
             f"{_fmt(summary['max_mask_tel_frac_of_step_gpu_bf16'], '.2%')})"
             if summary["max_mask_tel_frac_of_step_gpu"] is not None else ""))


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
