"""Matmul throughput in fp32 and bf16 at the shapes one encoder training step runs, and the peak each precision
reaches on this CPU: the bound a step's MFU is read against (issue 53, "the machine's limit").

Each shape is called as the encoder calls it, at ``--hidden`` (256 384 512 768) x ``--tokens`` per batch (2048 4096
8192); every dense layer three times, as an ``nn.Linear`` forward and backward run it -- ``fwd`` ``F.linear(x, w, b)``
(addmm with ``w`` transposed), ``dgrad`` ``g @ w`` (the input's gradient), ``wgrad`` ``g.t() @ x`` (the weight's):

  qkv        hidden -> hidden: Q, K, V and the attention output projection (4 per layer)
  ffn.in     hidden -> 4 x hidden;   ffn.out  4 x hidden -> hidden
  vocab      hidden -> 8192, the tied decoder, on the masked positions only (``--mask-frac`` 0.15 of the tokens)

and attention's batched matmuls (``torch.matmul``) at ``--seq`` 64 and 128 with heads of 64 (batch x heads = tokens
/ seq x hidden / 64): ``attn.score`` q @ k^T (also the shape of dP = g @ v^T), ``attn.context`` p @ v (also dQ = dS @
k), ``attn.context_t`` p^T @ g (dV and dK). Plus an n x n ``square`` matmul (``--square``, 4096; ``out=``, no
allocation). GFLOP/s = 2 m n k / the best time of the timed calls (after one warm-up call), at each ``--threads``.

Reported per precision and thread count: the peak (the best over the square and the encoder shapes, and where it was
reached), and ``mix``: the rate of one 4-layer encoder step made only of its matmuls at seq 128 (every layer's
shapes, forward and backward, plus the vocab head; total FLOPs over total best time) -- the rate a step's matmuls
can reach at that hidden and batch, before anything else the step does.

    python benchmarks/bench_matmul.py                          # ~2-4 min on 2 idle cores -> results/bench_matmul.json
    python benchmarks/bench_matmul.py --threads 2 --suffix x   # -> results/bench_matmul_x.json
    python benchmarks/bench_matmul.py --quick --out /tmp/bench # tiny shapes: seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_label, format_table, machine, versions, write_result  # noqa: E402

FULL = {"hidden": [256, 384, 512, 768], "tokens": [2048, 4096, 8192], "seq": [64, 128], "vocab": 8192,
        "square": 4096, "threads": [1, 2], "min_time": 0.1, "min_reps": 3, "max_reps": 50}
QUICK = {"hidden": [64, 128], "tokens": [256], "seq": [32], "vocab": 512, "square": 256, "threads": [1, 2],
         "min_time": 0.0, "min_reps": 2, "max_reps": 2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HEAD_DIM = 64
MIX_LAYERS, MIX_SEQ = 4, 128  # the "mix": a 4-layer encoder step at sequence 128 (the default `small` model's)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, two calls each (a smoke run, seconds)")
    p.add_argument("--hidden", type=int, nargs="+", help="hidden sizes (default 256 384 512 768)")
    p.add_argument("--tokens", type=int, nargs="+", help="tokens per batch (default 2048 4096 8192)")
    p.add_argument("--seq", type=int, nargs="+", help="sequence lengths of the attention matmuls (default 64 128)")
    p.add_argument("--vocab", type=int, help="the decoder's output size (default 8192)")
    p.add_argument("--mask-frac", type=float, default=0.15, help="share of the tokens the vocab projection runs on")
    p.add_argument("--square", type=int, help="n of the n x n matmul (default 4096)")
    p.add_argument("--threads", type=int, nargs="+", help="torch.set_num_threads values (default 1 2)")
    p.add_argument("--precisions", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    p.add_argument("--min-time", type=float, help="keep calling a shape until its timed calls add up to this (s)")
    p.add_argument("--min-reps", type=int, help="timed calls per shape at least")
    p.add_argument("--max-reps", type=int, help="timed calls per shape at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suffix", help="write results/bench_matmul_<suffix>.json")
    p.add_argument("--out", help="result file or directory (default benchmarks/results/bench_matmul[_<suffix>].json)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for k in ("hidden", "tokens", "seq", "vocab", "square", "threads", "min_time", "min_reps", "max_reps"):
        if getattr(args, k) is None:
            setattr(args, k, preset[k])
    for h in args.hidden:
        if h % HEAD_DIM and h > HEAD_DIM:
            p.error(f"--hidden {h} is not a multiple of the head size {HEAD_DIM}")
    return args


# --------------------------------------------------------------------------------------------------------- shapes
def linear_shapes(name: str, tokens: int, d_in: int, d_out: int) -> list[dict]:
    """An nn.Linear(d_in, d_out) over ``tokens`` rows: forward, input gradient, weight gradient (m, n, k of each)."""
    return [{"op": name, "pass": "fwd", "kind": "linear", "m": tokens, "n": d_out, "k": d_in,
             "call": f"F.linear(x[{tokens},{d_in}], w[{d_out},{d_in}], b)"},
            {"op": name, "pass": "dgrad", "kind": "mm", "m": tokens, "n": d_in, "k": d_out,
             "call": f"g[{tokens},{d_out}] @ w[{d_out},{d_in}]"},
            {"op": name, "pass": "wgrad", "kind": "mm_t", "m": d_out, "n": d_in, "k": tokens,
             "call": f"g[{tokens},{d_out}].t() @ x[{tokens},{d_in}]"}]


def attention_shapes(tokens: int, hidden: int, seq: int) -> list[dict]:
    """SDPA's math as batched matmuls: batch x heads = tokens / seq x hidden / 64, each [seq, 64]."""
    bh, d = max(1, tokens // seq) * max(1, hidden // HEAD_DIM), min(hidden, HEAD_DIM)
    return [{"op": "attn.score", "pass": "fwd+dP", "kind": "bmm_nt", "batch": bh, "m": seq, "n": seq, "k": d,
             "call": f"q[{bh},{seq},{d}] @ k.transpose(-2, -1)"},
            {"op": "attn.context", "pass": "fwd+dQ", "kind": "bmm", "batch": bh, "m": seq, "n": d, "k": seq,
             "call": f"p[{bh},{seq},{seq}] @ v[{bh},{seq},{d}]"},
            {"op": "attn.context_t", "pass": "dV+dK", "kind": "bmm_tn", "batch": bh, "m": seq, "n": d, "k": seq,
             "call": f"p[{bh},{seq},{seq}].transpose(-2, -1) @ g[{bh},{seq},{d}]"}]


def encoder_shapes(hidden: int, tokens: int, seqs: list[int], vocab: int, mask_frac: float) -> list[dict]:
    masked = max(1, round(mask_frac * tokens))
    out = (linear_shapes("qkv", tokens, hidden, hidden) + linear_shapes("ffn.in", tokens, hidden, 4 * hidden)
           + linear_shapes("ffn.out", tokens, 4 * hidden, hidden) + linear_shapes("vocab", masked, hidden, vocab))
    for s in seqs:
        out += [{**a, "seq": s} for a in attention_shapes(tokens, hidden, s)]
    return [{**s, "hidden": hidden, "tokens": tokens, "flops": 2 * s.get("batch", 1) * s["m"] * s["n"] * s["k"]}
            for s in out]


def make_call(shape: dict, dtype: torch.dtype, g: torch.Generator):
    """The tensors of ``shape`` (random, contiguous, as autograd holds them) and a function that runs its matmul."""
    r = lambda *size: torch.randn(*size, generator=g).to(dtype)  # noqa: E731
    m, n, k, kind = shape["m"], shape["n"], shape["k"], shape["kind"]
    if kind == "linear":  # y = x w^T + b, w [out, in]
        x, w, b = r(m, k), r(n, k), r(n)
        return lambda: F.linear(x, w, b)
    if kind == "mm":  # dX = g w
        a, w = r(m, k), r(k, n)
        return lambda: torch.mm(a, w)
    if kind == "mm_t":  # dW = g^T x: g [tokens, out] read transposed
        gr, x = r(k, m), r(k, n)
        return lambda: torch.mm(gr.t(), x)
    bh = shape["batch"]
    if kind == "bmm_nt":
        q, kk = r(bh, m, k), r(bh, n, k)
        return lambda: torch.matmul(q, kk.transpose(-2, -1))
    if kind == "bmm":
        p, v = r(bh, m, k), r(bh, k, n)
        return lambda: torch.matmul(p, v)
    if kind == "bmm_tn":
        p, gg = r(bh, k, m), r(bh, k, n)
        return lambda: torch.matmul(p.transpose(-2, -1), gg)
    raise ValueError(kind)


def time_call(fn, flops: float, min_time: float, min_reps: int, max_reps: int) -> dict:
    fn()  # warm-up: first-call allocations, oneDNN primitive creation
    times: list[float] = []
    while len(times) < min_reps or (sum(times) < min_time and len(times) < max_reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    best, med = min(times), statistics.median(times)
    return {"best_s": best, "median_s": med, "reps": len(times), "gflops_s": flops / best / 1e9,
            "gflops_s_median": flops / med / 1e9}


def square_peak(n: int, dtype: torch.dtype, reps: int = 5, seed: int = 0) -> dict:
    """n x n matmul into a preallocated output: 2 n^3 / best of ``reps`` (after a warm-up) -- the kernel alone."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    c = torch.empty(n, n, dtype=dtype)
    t = time_call(lambda: torch.mm(a, b, out=c), 2.0 * n**3, 0.0, reps, reps)
    return {"op": "square", "pass": "-", "kind": "mm", "m": n, "n": n, "k": n, "flops": 2 * n**3,
            "call": f"torch.mm(a[{n},{n}], b[{n},{n}], out=c)", **t}


def mix(rows: list[dict], hidden: int, tokens: int, layers: int = MIX_LAYERS, seq: int = MIX_SEQ) -> dict | None:
    """One ``layers``-layer encoder step made only of its matmuls at ``seq``: per layer Q, K, V, out (4 x qkv) and
    the FFN, each fwd + dgrad + wgrad, attention's score-shaped (q k^T, dP) and context-shaped (p v, dQ) matmuls once
    each and the transposed one (dV, dK) twice; plus the vocab head's three. Rate = total FLOPs / total best time."""
    count = {("qkv", p): 4 for p in ("fwd", "dgrad", "wgrad")}
    count.update({(o, p): 1 for o in ("ffn.in", "ffn.out") for p in ("fwd", "dgrad", "wgrad")})
    count.update({("attn.score", "fwd+dP"): 2, ("attn.context", "fwd+dQ"): 2, ("attn.context_t", "dV+dK"): 2})
    head = {("vocab", p): 1 for p in ("fwd", "dgrad", "wgrad")}
    flops = secs = 0.0
    for want, times in ((count, layers), (head, 1)):
        for key, c in want.items():
            r = next((r for r in rows if (r["op"], r["pass"]) == key and r["hidden"] == hidden
                      and r["tokens"] == tokens and r.get("seq", seq) == seq), None)
            if r is None:
                return None
            flops += times * c * r["flops"]
            secs += times * c * r["best_s"]
    return {"hidden": hidden, "tokens": tokens, "layers": layers, "seq": seq, "flops": flops, "matmul_s": secs,
            "gflops_s": flops / secs / 1e9}


# --------------------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    args = parse_args(argv)
    shapes = [s for h in args.hidden for t in args.tokens
              for s in encoder_shapes(h, t, args.seq, args.vocab, args.mask_frac)]
    kind = None
    try:
        from mlmlab.hardware import cpu_bf16_supported, cpu_kind

        kind, native_bf16 = cpu_kind(), cpu_bf16_supported()
    except ImportError:  # run outside the package's environment
        native_bf16 = None
    label = cpu_label(kind) if kind else "unknown"
    print(f"CPU: {label} ({kind}); {len(shapes)} shapes x {args.precisions} x threads {args.threads}", flush=True)
    rows, squares, peaks, mixes = [], [], {}, []
    mix_seq = MIX_SEQ if MIX_SEQ in args.seq else max(args.seq)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for prec in args.precisions:
            dtype = DTYPES[prec]
            sq = {**square_peak(args.square, dtype, seed=args.seed), "precision": prec, "threads": threads}
            squares.append(sq)
            g = torch.Generator().manual_seed(args.seed)
            these = []
            for s in shapes:
                fn = make_call(s, dtype, g)
                these.append({**s, "precision": prec, "threads": threads,
                              **time_call(fn, s["flops"], args.min_time, args.min_reps, args.max_reps)})
                del fn
            rows += these
            best = max(these, key=lambda r: r["gflops_s"])
            top = max((sq, best), key=lambda r: r["gflops_s"])
            peaks.setdefault(prec, {})[str(threads)] = {
                "flops_per_s": top["gflops_s"] * 1e9, "where": "square" if top is sq else
                f"{best['op']} {best['pass']} h{best['hidden']} t{best['tokens']}: {best['call']}",
                "square_flops_per_s": sq["gflops_s"] * 1e9, "encoder_shapes_flops_per_s": best["gflops_s"] * 1e9}
            mixes += [{"precision": prec, "threads": threads, **m} for h in args.hidden for t in args.tokens
                      if (m := mix(these, h, t, seq=mix_seq)) is not None]
            print(f"{threads} thread(s) {prec}: square {sq['gflops_s']:.0f} GFLOP/s, best encoder shape "
                  f"{best['gflops_s']:.0f} ({best['op']} {best['pass']} h{best['hidden']} t{best['tokens']})",
                  flush=True)
    ratio = {t: peaks["bf16"][t]["flops_per_s"] / peaks["fp32"][t]["flops_per_s"]
             for t in peaks.get("bf16", {}) if t in peaks.get("fp32", {})}
    settings = {k: getattr(args, k) for k in ("quick", "hidden", "tokens", "seq", "vocab", "mask_frac", "square",
                                              "threads", "precisions", "min_time", "min_reps", "max_reps", "seed")}
    settings.update({"head_dim": HEAD_DIM, "mix": {"layers": MIX_LAYERS, "seq": mix_seq},
                     "timed": "best (and median) of the timed calls after one warm-up call; outputs allocated per "
                              "call as in the encoder, except the square (out=)",
                     "flops": "2 x m x n x k (x batch for bmm); the bias add of F.linear is not counted"})
    payload = {"machine": machine(), "versions": versions(), "settings": settings,
               "results": {"cpu_kind": kind, "cpu_label": label, "native_bf16": native_bf16,
                           "mkldnn_bf16": _mkldnn_bf16(), "peak": peaks, "bf16_over_fp32_peak": ratio,
                           "square": squares, "mix": mixes, "rows": rows}}
    name = "bench_matmul" + (f"_{args.suffix}" if args.suffix else "")
    path = write_result(name, payload, args.out)
    print_summary(payload["results"])
    print(f"wrote {path}")
    return payload


def _mkldnn_bf16() -> bool | None:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


def print_summary(res: dict) -> None:
    print()
    by_key = {}
    for r in res["rows"]:
        by_key.setdefault((r["op"], r["pass"], r["hidden"], r["tokens"], r.get("seq"), r["threads"]), {})[
            r["precision"]] = r["gflops_s"]
    table = [{"op": k[0], "pass": k[1], "hidden": k[2], "tokens": k[3], "seq": k[4], "threads": k[5],
              "fp32": v.get("fp32"), "bf16": v.get("bf16"),
              "x": v["bf16"] / v["fp32"] if v.get("fp32") and v.get("bf16") else None} for k, v in by_key.items()]
    cols = [("threads", "thr", "d"), ("hidden", "hidden", "d"), ("tokens", "tokens", "d"), ("op", "op", "s"),
            ("pass", "pass", "s"), ("seq", "seq", "d"), ("fp32", "fp32 GFLOP/s", ".0f"),
            ("bf16", "bf16 GFLOP/s", ".0f"), ("x", "bf16/fp32", ".2f")]
    print(format_table(table, cols))
    print()
    for prec, by_t in res["peak"].items():
        for t, pk in by_t.items():
            print(f"peak {prec} {t} thread(s): {pk['flops_per_s'] / 1e9:.0f} GFLOP/s ({pk['where']})")
    for m in res["mix"]:
        print(f"mix {m['precision']} {m['threads']} thread(s) h{m['hidden']} t{m['tokens']}: "
              f"{m['gflops_s']:.0f} GFLOP/s")
    print(f"CPU: {res['cpu_label']}; bf16/fp32 peak: " +
          ", ".join(f"{v:.2f}x at {t} thread(s)" for t, v in res["bf16_over_fp32_peak"].items()))


if __name__ == "__main__":
    main()
