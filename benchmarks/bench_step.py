"""One optimizer step (forward + backward + AdamW) of mlmlab's encoder + sparse MLM head vs transformers'
``BertForMaskedLM`` at the same shapes, on the same masked batch, from the same weights.

Reports tokens/s (batch x seq / median step time after warmup), the ratio ours/HF, FLOPs per step (the analytical
count of ``mlmlab.flops`` and torch's ``FlopCounterMode`` on one step) and model FLOPs utilisation against the
matmul peak of the row's own precision measured in the same run (fp32 rows against the fp32 peak, bf16 rows against
the bf16 peak). ``--compile`` and ``--bf16`` add rows for our model; ``--profile`` adds where the time of our step
goes (``torch.profiler`` over a few steps, fp32 and with ``--bf16`` bf16, grouped: matmuls, attention, elementwise,
layer norm, softmax / cross-entropy, optimizer, casts, Python and dispatch between ops, other).

    python benchmarks/bench_step.py                  # full: vocab 8192 and 30522, ~2-3 min on 2 idle cores
    python benchmarks/bench_step.py --quick --out /tmp/bench   # tiny shapes, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import time

import torch
from _common import cpu_label, format_table, machine, versions, write_result
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mlmlab.flops import encoder_forward_flops, mlm_head_forward_flops
from mlmlab.hardware import cpu_kind
from mlmlab.lit.optim import adamw_with_schedule
from mlmlab.models.encoder import IGNORE_INDEX, BertForMLM, EncoderConfig

FULL = {"shape": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024},
        "vocab": [8192, 30522], "batch": 32, "seq": 128, "warmup": 3, "iters": 10, "matmul_size": 4096,
        "profile_steps": 3}
QUICK = {"shape": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256},
         "vocab": [512, 2048], "batch": 4, "seq": 32, "warmup": 1, "iters": 3, "matmul_size": 1024,
         "profile_steps": 2}
# the optimizer of conf/optim/adamw.yaml (the schedule's values only change the learning rate, not the cost)
OPTIM = {"lr": 1e-3, "weight_decay": 0.01, "betas": (0.9, 0.98), "eps": 1e-6, "warmup": 40, "total": 400}
TARGETS = {"speedup_vs_hf": {8192: 1.8, 30522: 3.0}, "mfu": 0.6}  # reported, never asserted
MASK_ID = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes and few iterations (a smoke run, seconds)")
    p.add_argument("--vocab", type=int, nargs="+", help="vocabulary sizes (default 8192 30522)")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--warmup", type=int, help="untimed steps before the timed ones")
    p.add_argument("--iters", type=int, help="timed steps (the median is reported)")
    p.add_argument("--matmul-size", type=int, help="n of the n x n matmul that sets each precision's peak "
                   "(default 4096)")
    p.add_argument("--mask-frac", type=float, default=0.15, help="fraction of positions masked (exact count)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="add a row: our step with torch.compile")
    p.add_argument("--bf16", action="store_true", help="add a row: our step under CPU bf16 autocast")
    p.add_argument("--levers", action="store_true", help="add rows: optim.impl=for_loop / fused (the default is foreach), "
                   "model.grad_checkpointing=true (with the activation memory saved for backward)")
    p.add_argument("--profile", action="store_true", help="profile our step (fp32, and bf16 with --bf16) with "
                   "torch.profiler: seconds per step by group of ops")
    p.add_argument("--profile-steps", type=int, help="profiled steps, after one untimed step (default 3)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' model (no ratio)")
    p.add_argument("--out", help="result file or directory (default benchmarks/results/bench_step.json)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for k in ("vocab", "batch", "seq", "warmup", "iters", "matmul_size", "profile_steps"):
        if getattr(args, k) is None:
            setattr(args, k, preset[k])
    args.shape = preset["shape"]
    return args


# --------------------------------------------------------------------------------------------------------- models
def build_models(shape: dict, vocab: int, seq: int, seed: int, with_hf: bool):
    """Ours from ``seed``; HF's BertForMaskedLM with the same config, loaded with our weights (strict)."""
    cfg = EncoderConfig(vocab_size=vocab, max_position_embeddings=max(512, seq), **shape)
    torch.manual_seed(seed)
    ours = BertForMLM(cfg)
    if not with_hf:
        return cfg, ours, None
    import transformers

    hc = transformers.BertConfig(vocab_size=vocab, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                                 num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                                 max_position_embeddings=cfg.max_position_embeddings,
                                 type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.layer_norm_eps,
                                 hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
                                 initializer_range=cfg.initializer_range, hidden_act="gelu",
                                 attn_implementation="sdpa")
    hf = transformers.BertForMaskedLM(hc)
    hf.load_state_dict(ours.state_dict(), strict=True)
    return cfg, ours, hf


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


def make_batch(vocab: int, batch: int, seq: int, frac: float, seed: int) -> dict:
    """Random ids; exactly round(frac x batch x seq) positions masked ([MASK]), labels -100 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    n = round(frac * batch * seq)
    sel = torch.zeros(batch * seq, dtype=torch.bool)
    sel[torch.randperm(batch * seq, generator=g)[:n]] = True
    sel = sel.view(batch, seq)
    return {"input_ids": torch.where(sel, MASK_ID, ids), "attention_mask": torch.ones_like(ids),
            "labels": torch.where(sel, ids, IGNORE_INDEX), "n_masked": n}


def ours_loss(model, b):
    """What MLMModule.training_step does: the sparse head runs on the labelled positions only."""
    return model.mlm_loss(b["input_ids"], b["attention_mask"], b["labels"])[0]


def ours_loss_no_attn_mask(model, b):
    """The same step without the key-padding mask (packed blocks have no padding): SDPA gets attn_mask=None."""
    return model.mlm_loss(b["input_ids"], None, b["labels"])[0]


def hf_loss(model, b):
    """HF's normal path: the decoder on every position, cross-entropy with ignore_index -100."""
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss


def parity(ours, hf, b) -> dict:
    ours_tied = ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    out = {"params_ours": n_params(ours), "params_hf": None if hf is None else n_params(hf), "ours_tied": ours_tied}
    if hf is None:
        return out
    ours.eval(), hf.eval()
    with torch.no_grad():
        la, lb = ours_loss(ours, b).item(), hf_loss(hf, b).item()
    ours.train(), hf.train()
    out.update({"same_param_count": out["params_ours"] == out["params_hf"],
                "hf_tied": hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight,
                "loss_ours": la, "loss_hf": lb, "loss_abs_diff": abs(la - lb)})
    return out


# --------------------------------------------------------------------------------------------------------- FLOPs
def analytic_flops(cfg: EncoderConfig, batch: int, seq: int, n_predicted: int) -> float:
    """mlmlab.flops' training FLOPs (3 x forward): encoder + MLM head on ``n_predicted`` positions."""
    enc = encoder_forward_flops(batch, seq, cfg.hidden_size, cfg.num_layers, cfg.intermediate_size)
    return 3.0 * (enc + mlm_head_forward_flops(n_predicted, cfg.hidden_size, cfg.vocab_size))


def counted_flops(model, loss_fn, b) -> int:
    """FlopCounterMode on one forward + backward. The math SDPA backend decomposes attention into bmm, which the
    counter sees (it has no formula for the fused CPU kernel). The optimizer adds no matmul FLOPs."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        loss_fn(model, b).backward()
    model.zero_grad(set_to_none=True)
    return fc.get_total_flops()


def matmul_peak(n: int, reps: int = 5, dtype: torch.dtype = torch.float32) -> dict:
    """n x n matmul (fp32 unless ``dtype``): peak FLOP/s = 2 n^3 / (best time of ``reps``), after one warm-up."""
    a, c = torch.randn(n, n).to(dtype), torch.empty(n, n, dtype=dtype)
    bm = torch.randn(n, n).to(dtype)
    torch.mm(a, bm, out=c)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, bm, out=c)
        times.append(time.perf_counter() - t)
    return {"n": n, "best_s": min(times), "median_s": statistics.median(times),
            "flops_per_s": 2 * n**3 / min(times), "flops_per_s_median": 2 * n**3 / statistics.median(times)}


# --------------------------------------------------------------------------------------------------------- timing
def saved_activation_bytes(model, loss_fn, b) -> int:
    """Bytes of the tensors autograd saves for backward in one forward (what gradient checkpointing reduces); a
    tensor saved twice (e.g. a parameter) is counted once."""
    seen: dict[int, int] = {}

    def pack(t):
        seen.setdefault(id(t), t.numel() * t.element_size())  # parameters are shared, activations are not
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, b)
    params = {id(p) for p in model.parameters()}
    del loss
    return sum(v for k, v in seen.items() if k not in params)


def time_steps(model, loss_fn, b, warmup: int, iters: int, autocast: bool = False, impl: str = "auto") -> dict:
    """``warmup + iters`` full steps (zero_grad, forward, backward, AdamW + scheduler); medians of the timed ones."""
    model.train()
    opt_d = adamw_with_schedule(model, OPTIM["lr"], OPTIM["weight_decay"], OPTIM["betas"], OPTIM["eps"],
                                OPTIM["warmup"], OPTIM["total"], impl=impl)
    opt, sched = opt_d["optimizer"], opt_d["lr_scheduler"]["scheduler"]
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    phases: dict[str, list[float]] = {"fwd": [], "bwd": [], "opt": [], "step": []}
    first = None
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = loss_fn(model, b)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        sched.step()
        t3 = time.perf_counter()
        if i == 0:
            first = t3 - t0
        if i >= warmup:
            for k, v in zip(("fwd", "bwd", "opt", "step"), (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                phases[k].append(v)
    if not torch.isfinite(loss):
        raise RuntimeError(f"non-finite loss {loss.item()}")
    out = {f"{k}_s": statistics.median(v) for k, v in phases.items()}
    out.update({"step_s_min": min(phases["step"]), "step_s_max": max(phases["step"]), "first_step_s": first,
                "final_loss": loss.item()})
    return out


# --------------------------------------------------------------------------------------------------------- profile
PROFILE_GROUPS = ("matmul", "attention", "elementwise", "layer_norm", "softmax_ce", "optimizer", "cast", "python",
                  "other")
PROFILE_GROUP_NOTE = {
    "matmul": "aten::mm / addmm / bmm / matmul / linear and their autograd nodes (+ what they call: views, bias sums)",
    "attention": "scaled_dot_product_attention's own time and its fused kernel with its backward; in training on the "
                 "CPU (attention dropout > 0) SDPA runs its math path, whose bmm count as matmul, softmax as "
                 "softmax_ce and dropout as elementwise",
    "elementwise": "GELU, dropout (bernoulli_), add / mul / div / where ... and their backward",
    "layer_norm": "native_layer_norm and its backward", "softmax_ce": "softmax (attention's, on SDPA's math path), "
    "log_softmax / nll_loss (the MLM loss) and their backward",
    "optimizer": "zero_grad + AdamW step + LR scheduler, everything they call", "cast": "aten::to / _to_copy "
    "(autocast's casts, the loss's .float()) and ToCopyBackward0", "python": "time between ops inside forward / "
    "backward: Python, module calls, dispatch, the autograd engine", "other": "embedding, indexing of the masked "
    "positions, reshapes and copies, gradient accumulation, ..."}
_WRAPPERS = {"mlmlab::forward", "mlmlab::backward"}  # their self time is the time between ops ("python")
_OPTIMIZER = re.compile(r"^(mlmlab::optimizer|optimizer\.)|_foreach_")
_BY_NAME = (("attention", re.compile(r"scaleddotproduct|flashattention|efficientattention")),
            ("layer_norm", re.compile(r"layernorm")),
            ("softmax_ce", re.compile(r"softmax|nllloss|crossentropy")),
            ("cast", re.compile(r"^(to|tocopy)$")),
            ("matmul", re.compile(r"^(mm|addmm|bmm|matmul|linear|baddbmm|addbmm|addmmactivation|mv|addmv)$")),
            ("elementwise", re.compile(r"^(gelu|relu|tanh|add|sub|rsub|mul|div|neg|exp|pow|sqrt|rsqrt|clamp|where|"
                                       r"dropout|nativedropout|bernoulli|maskedfill|lerp|addcmul|addcdiv)$")))


def op_group(name: str) -> str | None:
    """The group an op (or autograd node) belongs to by its own name; None: it takes its caller's group."""
    if _OPTIMIZER.search(name.lower()):
        return "optimizer"
    base = name.split("evaluate_function: ", 1)[-1].removeprefix("aten::").removeprefix("torch::autograd::")
    base = re.sub(r"backward\d*(data)?$", "", base.replace("_", "").lower())
    return next((g for g, rx in _BY_NAME if rx.search(base)), None)


def group_profile(events) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Self CPU time (s) of every profiled event, summed by group: an op's own name decides its group, else the
    nearest caller's that has one (a copy inside ``_to_copy`` is a cast, a view inside ``linear`` a matmul), else
    "other"; everything under the optimizer is the optimizer's; the forward / backward wrappers' own time (between
    their ops) is "python". Self times do not overlap, so the groups add up to the profiled time."""
    groups = dict.fromkeys(PROFILE_GROUPS, 0.0)
    by_op: dict[tuple[str, str], float] = {}
    memo: dict[int, str] = {}

    def group_of(e) -> str:
        if id(e) in memo:
            return memo[id(e)]
        chain, x, found = [], e, None
        while x is not None and id(x) not in memo:
            chain.append(x)
            x = x.cpu_parent
        inherited = memo[id(x)] if x is not None else None
        for y in reversed(chain):  # from the outermost caller inwards
            own = "python" if y.name in _WRAPPERS else op_group(y.name)
            if inherited == "optimizer":
                found = "optimizer"
            elif own is not None:
                found = own
            else:
                found = inherited if inherited not in (None, "python") else "other"
            memo[id(y)] = found
            inherited = found if own != "python" else None
        return memo[id(e)]

    for e in events:
        g, s = group_of(e), e.self_cpu_time_total / 1e6
        groups[g] += s
        by_op[(e.name, g)] = by_op.get((e.name, g), 0.0) + s
    return groups, by_op


def profile_steps(model, loss_fn, b, steps: int, autocast: bool = False, impl: str = "auto") -> dict:
    """``torch.profiler`` (CPU) over ``steps`` full steps after one untimed step: seconds per step by group of ops
    (:func:`group_profile`), each group's share of the profiled step time, and the ops that take the most."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model.train()
    opt_d = adamw_with_schedule(model, OPTIM["lr"], OPTIM["weight_decay"], OPTIM["betas"], OPTIM["eps"],
                                OPTIM["warmup"], OPTIM["total"], impl=impl)
    opt, sched = opt_d["optimizer"], opt_d["lr_scheduler"]["scheduler"]
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

    def step():
        with record_function("mlmlab::optimizer"):
            opt.zero_grad(set_to_none=True)
        with record_function("mlmlab::forward"), ctx():
            loss = loss_fn(model, b)
        with record_function("mlmlab::backward"):
            loss.backward()
        with record_function("mlmlab::optimizer"):
            opt.step()
            sched.step()

    step()  # the optimizer's state is created in its first step
    times = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    events = prof.events()
    groups, by_op = group_profile(events)
    sdpa = sum(e.cpu_time_total for e in events if e.name == "aten::scaled_dot_product_attention") / 1e6
    wall = sum(times) / steps
    per_step = {g: s / steps for g, s in groups.items()}
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
    return {"steps": steps, "profiled_step_s": wall, "profiled_step_s_max": max(times),
            "groups": {g: {"s_per_step": s, "share": s / wall} for g, s in per_step.items()},
            "groups_sum_s": sum(per_step.values()), "coverage": sum(per_step.values()) / wall,
            "sdpa_forward_inclusive_s": sdpa / steps,  # the SDPA calls of the forward with all they call
            "top_ops": [{"op": n, "group": g, "s_per_step": s / steps} for (n, g), s in top]}


def optimizer_info(model) -> dict:
    opt = adamw_with_schedule(model, OPTIM["lr"], OPTIM["weight_decay"], OPTIM["betas"], OPTIM["eps"],
                              OPTIM["warmup"], OPTIM["total"])["optimizer"]
    d = opt.defaults
    return {"class": type(opt).__name__, "foreach": d.get("foreach"), "fused": d.get("fused"), **OPTIM,
            "note": "ours: optim.impl=auto (foreach); hf: the single-tensor loop (torch's CPU default, what HF's "
                    "Trainer gets on a CPU)"}


def row(name, vocab, timing, tokens, flops_analytic, flops_counted, precision: str = "fp32") -> dict:
    step = timing["step_s"]
    return {"model": name, "vocab": vocab, "precision": precision, **timing, "tokens_per_s": tokens / step,
            "flops_analytic": flops_analytic, "flops_counted": flops_counted,
            "achieved_flops_s_counted": flops_counted / step, "achieved_flops_s_analytic": flops_analytic / step}


# --------------------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokens = args.batch * args.seq
    peak_before = matmul_peak(args.matmul_size)
    print(f"matmul peak ({args.matmul_size}^3 fp32, {args.threads} threads): {peak_before['flops_per_s'] / 1e9:.1f} "
          "GFLOP/s", flush=True)
    bf16_before = matmul_peak(args.matmul_size, dtype=torch.bfloat16) if args.bf16 else None
    if bf16_before is not None:
        print(f"matmul peak ({args.matmul_size}^3 bf16, {args.threads} threads): "
              f"{bf16_before['flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
    rows, parities, opt_info, profiles = [], {}, None, []
    for vocab in args.vocab:
        cfg, ours, hf = build_models(args.shape, vocab, args.seq, args.seed, not args.no_hf)
        b = make_batch(vocab, args.batch, args.seq, args.mask_frac, args.seed)
        parities[vocab] = parity(ours, hf, b)
        opt_info = opt_info or optimizer_info(ours)
        fa_ours = analytic_flops(cfg, args.batch, args.seq, b["n_masked"])
        fc_ours = counted_flops(ours, ours_loss, b)
        t = time_steps(ours, ours_loss, b, args.warmup, args.iters)
        rows.append(row("ours", vocab, t, tokens, fa_ours, fc_ours))
        print(f"vocab {vocab}: ours {tokens / t['step_s']:.0f} tok/s", flush=True)
        if hf is not None:
            fa_hf = analytic_flops(cfg, args.batch, args.seq, tokens)  # the decoder on every position
            fc_hf = counted_flops(hf, hf_loss, b)
            # HF as its Trainer runs it on a CPU: torch's default AdamW there, the single-tensor loop
            t = time_steps(hf, hf_loss, b, args.warmup, args.iters, impl="for_loop")
            rows.append(row("hf", vocab, t, tokens, fa_hf, fc_hf))
            print(f"vocab {vocab}: hf   {tokens / t['step_s']:.0f} tok/s", flush=True)
            del hf
        if args.bf16:
            _, m, _ = build_models(args.shape, vocab, args.seq, args.seed, False)
            t = time_steps(m, ours_loss, b, args.warmup, args.iters, autocast=True)
            rows.append(row("ours+bf16", vocab, t, tokens, fa_ours, fc_ours, precision="bf16"))
            print(f"vocab {vocab}: ours+bf16 {tokens / t['step_s']:.0f} tok/s", flush=True)
        if args.profile:  # where the time of our step goes, fp32 (and bf16): a fresh model each
            for name, prec in (("ours", "fp32"), ("ours+bf16", "bf16"))[:2 if args.bf16 else 1]:
                _, m, _ = build_models(args.shape, vocab, args.seq, args.seed, False)
                prof = profile_steps(m, ours_loss, b, args.profile_steps, autocast=prec == "bf16")
                timed = next(r for r in rows if r["model"] == name and r["vocab"] == vocab)
                profiles.append({"model": name, "vocab": vocab, "precision": prec, "step_s": timed["step_s"],
                                 "profiler_overhead": prof["profiled_step_s"] / timed["step_s"] - 1, **prof})
                print(f"vocab {vocab}: profiled {name}: " + ", ".join(
                    f"{g} {100 * v['share']:.0f}%" for g, v in prof["groups"].items() if v["share"] >= 0.005),
                    flush=True)
        if args.levers:
            base = next(r for r in rows if r["model"] == "ours" and r["vocab"] == vocab)
            base["saved_activation_bytes"] = saved_activation_bytes(ours, ours_loss, b)
            for impl in ("for_loop", "fused"):  # the default (auto) is foreach
                _, m, _ = build_models(args.shape, vocab, args.seq, args.seed, False)
                t = time_steps(m, ours_loss, b, args.warmup, args.iters, impl=impl)
                rows.append(row(f"ours+{impl}", vocab, t, tokens, fa_ours, fc_ours))
                print(f"vocab {vocab}: ours+{impl} {tokens / t['step_s']:.0f} tok/s", flush=True)
            _, m, _ = build_models(args.shape, vocab, args.seq, args.seed, False)
            t = time_steps(m, ours_loss_no_attn_mask, b, args.warmup, args.iters)
            rows.append(row("ours, no attn mask", vocab, t, tokens, fa_ours, fc_ours))
            print(f"vocab {vocab}: ours, no attn mask {tokens / t['step_s']:.0f} tok/s", flush=True)
            _, m, _ = build_models({**args.shape, "grad_checkpointing": True}, vocab, args.seq, args.seed, False)
            t = time_steps(m, ours_loss, b, args.warmup, args.iters)
            rows.append(row("ours+ckpt", vocab, t, tokens, fa_ours, fc_ours))
            rows[-1]["saved_activation_bytes"] = saved_activation_bytes(m, ours_loss, b)
            print(f"vocab {vocab}: ours+ckpt {tokens / t['step_s']:.0f} tok/s", flush=True)
        if args.compile:  # as trainer.compile=true: the encoder compiled in place, the sparse head eager
            _, m, _ = build_models(args.shape, vocab, args.seq, args.seed, False)
            m.bert.compile()
            t = time_steps(m, ours_loss, b, max(args.warmup, 2), args.iters)
            t["compile_note"] = "first_step_s includes compilation"
            rows.append(row("ours+compile", vocab, t, tokens, fa_ours, fc_ours))
            print(f"vocab {vocab}: ours+compile {tokens / t['step_s']:.0f} tok/s", flush=True)
    peak_after = matmul_peak(args.matmul_size)
    peak = max(peak_before["flops_per_s"], peak_after["flops_per_s"])  # the higher one: a conservative MFU
    peaks = {"fp32": peak}
    bf16_peak = None
    if bf16_before is not None:
        bf16_after = matmul_peak(args.matmul_size, dtype=torch.bfloat16)
        peaks["bf16"] = max(bf16_before["flops_per_s"], bf16_after["flops_per_s"])
        bf16_peak = {"before": bf16_before, "after": bf16_after, "used_flops_per_s": peaks["bf16"]}

    hf_tps = {r["vocab"]: r["tokens_per_s"] for r in rows if r["model"] == "hf"}
    for r in rows:  # MFU against the peak of the row's own precision; bf16 rows also against fp32's (the old MFU)
        r["peak_flops_s"] = peaks[r["precision"]]
        r["mfu_counted"] = r["achieved_flops_s_counted"] / r["peak_flops_s"]
        r["mfu_analytic"] = r["achieved_flops_s_analytic"] / r["peak_flops_s"]
        if r["precision"] != "fp32":
            r["mfu_counted_vs_fp32_peak"] = r["achieved_flops_s_counted"] / peak
        r["speedup_vs_hf"] = r["tokens_per_s"] / hf_tps[r["vocab"]] if r["vocab"] in hf_tps else None
        target = TARGETS["speedup_vs_hf"].get(r["vocab"]) if r["model"] != "hf" else None
        r["target_speedup_vs_hf"] = target
        r["meets_speedup_target"] = None if target is None or r["speedup_vs_hf"] is None else r["speedup_vs_hf"] >= target
        r["meets_mfu_target"] = r["mfu_counted"] >= TARGETS["mfu"] if r["model"] != "hf" else None

    settings = {k: getattr(args, k) for k in ("quick", "vocab", "batch", "seq", "warmup", "iters", "matmul_size",
                                              "mask_frac", "threads", "seed", "compile", "bf16", "levers", "profile",
                                              "profile_steps")}
    settings.update({"shape": args.shape, "dtype": "float32", "optimizer": opt_info,
                     "timed": "median of the timed steps: zero_grad + forward + loss + backward + AdamW + LR scheduler",
                     "mfu": "FLOPs per step / median step time / the matmul peak of the row's precision (fp32 rows: the "
                            "fp32 n x n matmul, bf16 rows: the bf16 one; the higher of the peaks measured before and "
                            "after)"})
    if args.profile:
        settings["profile_groups"] = PROFILE_GROUP_NOTE
    kind = cpu_kind()
    results = {"matmul_peak": {"before": peak_before, "after": peak_after, "used_flops_per_s": peak}}
    if bf16_peak is not None:
        results["matmul_peak_bf16"] = bf16_peak
    results.update({"cpu_kind": kind, "cpu_label": cpu_label(kind), "parity": parities, "rows": rows,
                    "targets": TARGETS})
    if args.profile:
        results["profile"] = profiles
    payload = {"machine": machine(), "versions": versions(), "settings": settings, "results": results}
    path = write_result("bench_step", payload, args.out)
    print_summary(rows, parities, peak_before, peak_after, bf16_peak, profiles)
    print(f"wrote {path}")
    return payload


def print_summary(rows, parities, peak_before, peak_after, bf16_peak=None, profiles=()) -> None:
    table = [{**r, "step_ms": 1e3 * r["step_s"], "fwd_ms": 1e3 * r["fwd_s"], "bwd_ms": 1e3 * r["bwd_s"],
              "opt_ms": 1e3 * r["opt_s"], "gflop": r["flops_counted"] / 1e9,
              "gflops_s": r["achieved_flops_s_counted"] / 1e9, "mfu_c": 100 * r["mfu_counted"],
              "mfu_a": 100 * r["mfu_analytic"]} for r in rows]
    cols = [("vocab", "vocab", "d"), ("model", "model", "s"), ("step_ms", "step ms", ".0f"), ("fwd_ms", "fwd", ".0f"),
            ("bwd_ms", "bwd", ".0f"), ("opt_ms", "opt", ".0f"), ("tokens_per_s", "tok/s", ".0f"),
            ("speedup_vs_hf", "x HF", ".2f"), ("gflop", "GFLOP/step", ".2f"), ("gflops_s", "GFLOP/s", ".1f"),
            ("mfu_c", "MFU% cnt", ".1f"), ("mfu_a", "MFU% ana", ".1f")]
    print()
    print(format_table(table, cols))
    print(f"fp32 matmul peak: {peak_before['flops_per_s'] / 1e9:.1f} GFLOP/s before, "
          f"{peak_after['flops_per_s'] / 1e9:.1f} after (MFU uses the higher)")
    if bf16_peak is not None:
        print(f"bf16 matmul peak: {bf16_peak['before']['flops_per_s'] / 1e9:.1f} GFLOP/s before, "
              f"{bf16_peak['after']['flops_per_s'] / 1e9:.1f} after (the bf16 rows' MFU uses the higher)")
    for p in profiles:
        print(f"profile vocab {p['vocab']} {p['model']} ({p['steps']} steps, {1e3 * p['profiled_step_s']:.0f} ms/step "
              f"profiled, {1e3 * p['step_s']:.0f} timed): " + ", ".join(
                  f"{g} {1e3 * v['s_per_step']:.1f} ms ({100 * v['share']:.0f}%)" for g, v in p["groups"].items()))
    for v, p in parities.items():
        if p.get("params_hf") is None:
            print(f"parity vocab {v}: params ours {p['params_ours']:,} (no HF model)")
            continue
        print(f"parity vocab {v}: params ours {p['params_ours']:,} hf {p['params_hf']:,}, decoder tied "
              f"{p['ours_tied']}/{p['hf_tied']}; same weights, eval loss |ours - hf| = {p['loss_abs_diff']:.2e}")
    print(f"targets (not asserted): >= {TARGETS['speedup_vs_hf']} x HF by vocab, MFU >= {100 * TARGETS['mfu']:.0f}%")


if __name__ == "__main__":
    main()
