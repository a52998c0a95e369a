"""The training step on an accelerator: mlmlab's encoder with everything a GPU wants against transformers'
``BertForMaskedLM`` (sdpa) on the same device, at the `small` and `bert-base` shapes, sequence 128.

Ours: bf16 autocast, SDPA with no attention mask (packed blocks have no padding, so PyTorch may pick its flash /
memory-efficient kernels), fused AdamW, and with ``--compile`` a row with the encoder compiled. HF: bf16 autocast,
``attn_implementation="sdpa"``, the same weights and batch, torch's default AdamW on the device. Reported per row:
tokens/s, the ratio to HF, and MFU = the analytical training FLOPs per step (``mlmlab.flops``) / step time / the
device's bf16 dense matmul peak measured in the same run (an n x n bf16 matmul, best of 10).

Written for a GPU (``benchmarks/gpu_check.sh`` runs it there); without one it runs the same code on the CPU
(``--quick``: tiny shapes, seconds), which is how the tests keep it working.

    python benchmarks/bench_gpu.py                     # on the GPU: ~1-2 min
    python benchmarks/bench_gpu.py --quick --out /tmp/bench   # CPU smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import machine, versions, write_result
from bench_step import MASK_ID, OPTIM, analytic_flops, build_models, hf_loss, ours_loss_no_attn_mask

from mlmlab.lit.optim import adamw_with_schedule
from mlmlab.models.encoder import IGNORE_INDEX

SHAPES = {  # name -> (encoder shape, vocab, batch on a GPU)
    "small": ({"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024}, 8192, 256),
    "bert-base": ({"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072}, 30522, 64),
}
QUICK = {"tiny": ({"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256}, 1024, 4)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one tiny shape, few steps (the CPU smoke run)")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--compile", action="store_true", help="add a row: ours with the encoder compiled")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' model (no ratio)")
    p.add_argument("--out", help="result file or directory (default benchmarks/results/bench_gpu.json)")
    a = p.parse_args(argv)
    a.device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 5)
    a.iters = a.iters if a.iters is not None else (3 if a.quick else 20)
    return a


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bf16_peak(device: torch.device, n: int, reps: int = 10) -> dict:
    """bf16 n x n matmul: 2 n^3 / best time of ``reps`` (after one warm-up): the dense peak this device reaches."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    torch.mm(a, b)
    sync(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        times.append(time.perf_counter() - t)
    return {"n": n, "best_s": min(times), "flops_per_s": 2 * n**3 / min(times)}


def batch(vocab: int, b: int, seq: int, device: torch.device, seed: int = 0) -> dict:
    """Random ids, 15% of the positions [MASK] with labels, no padding (a packed block)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (b, seq), generator=g)
    sel = torch.rand(b, seq, generator=g) < 0.15
    out = {"input_ids": torch.where(sel, MASK_ID, ids), "attention_mask": torch.ones_like(ids),
           "labels": torch.where(sel, ids, IGNORE_INDEX)}
    out = {k: v.to(device) for k, v in out.items()}
    out["n_masked"] = int(sel.sum())
    return out


def time_steps(model, loss_fn, b, device, warmup: int, iters: int, impl: str) -> dict:
    """``warmup + iters`` steps under bf16 autocast (zero_grad, forward, backward, AdamW + scheduler), synchronised
    around each; the median of the timed ones."""
    model.to(device).train()
    o = adamw_with_schedule(model, OPTIM["lr"], OPTIM["weight_decay"], OPTIM["betas"], OPTIM["eps"], OPTIM["warmup"],
                            OPTIM["total"], impl=impl)
    opt, sched = o["optimizer"], o["lr_scheduler"]["scheduler"]
    times, first = [], None
    for i in range(warmup + iters):
        sync(device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        sched.step()
        sync(device)
        dt = time.perf_counter() - t
        first = first if first is not None else dt
        if i >= warmup:
            times.append(dt)
    if not torch.isfinite(loss):
        raise RuntimeError(f"non-finite loss {loss.item()}")
    return {"step_s": statistics.median(times), "first_step_s": first, "final_loss": loss.item(),
            "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None}


def main(argv=None) -> dict:
    a = parse_args(argv)
    dev = a.device
    peak = bf16_peak(dev, 1024 if a.quick else 8192)
    print(f"{dev}: bf16 matmul peak {peak['flops_per_s'] / 1e12:.1f} TFLOP/s", flush=True)
    rows = []
    for name, (shape, vocab, bsz) in (QUICK if a.quick else SHAPES).items():
        b = batch(vocab, bsz, a.seq, dev)
        cfg, ours, hf = build_models(shape, vocab, a.seq, 0, not a.no_hf)
        flops_ours = analytic_flops(cfg, bsz, a.seq, b["n_masked"])
        runs = [("ours", ours, ours_loss_no_attn_mask, "fused", flops_ours)]
        if hf is not None:  # HF as it runs on the device by default: torch's AdamW choice there
            runs.append(("hf", hf, hf_loss, "for_loop" if dev.type == "cpu" else "foreach",
                         analytic_flops(cfg, bsz, a.seq, bsz * a.seq)))
        if a.compile:
            _, comp, _ = build_models(shape, vocab, a.seq, 0, False)
            comp.bert.compile()  # as trainer.compile=true: the encoder compiled in place, the sparse head eager
            runs.append(("ours+compile", comp, ours_loss_no_attn_mask, "fused", flops_ours))
        for label, model, fn, impl, flops in runs:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            t = time_steps(model, fn, b, dev, a.warmup, a.iters, impl)
            model.cpu()
            tok = bsz * a.seq / t["step_s"]
            rows.append({"shape": name, "model": label, "vocab": vocab, "batch": bsz, "seq": a.seq, "adamw": impl,
                         **t, "tokens_per_s": tok, "flops_per_step": flops,
                         "mfu_bf16": flops / t["step_s"] / peak["flops_per_s"]})
            print(f"{name} {label}: {tok:,.0f} tok/s, MFU {rows[-1]['mfu_bf16']:.0%}", flush=True)
        hf_row = next((r for r in rows if r["shape"] == name and r["model"] == "hf"), None)
        for r in rows:
            if r["shape"] == name and hf_row is not None:
                r["speedup_vs_hf"] = r["tokens_per_s"] / hf_row["tokens_per_s"]
        del ours, hf
    payload = {"machine": machine(), "versions": versions(),
               "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "settings": {"quick": a.quick, "seq": a.seq, "warmup": a.warmup, "iters": a.iters,
                            "precision": "bf16 autocast", "ours": "SDPA without attention mask, fused AdamW",
                            "hf": "BertForMaskedLM, attn_implementation=sdpa, all-ones attention mask"},
               "results": {"bf16_peak": peak, "rows": rows}}
    path = write_result("bench_gpu", payload, a.out)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
