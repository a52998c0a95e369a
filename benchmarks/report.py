"""The README's "Performance" tables, printed as Markdown from the benchmark JSON files (nothing typed by hand).

    python benchmarks/report.py                      # reads benchmarks/results/bench_{masking,step,data,e2e,matmul}.json
    python benchmarks/report.py --dir /tmp/bench     # another results folder
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import RESULTS_DIR

TARGETS = {500: 0.05, 4000: 0.03}  # bench_time_to_pay.py's targets: the gain's lower bound to reach, by label budget


def load(d: Path, name: str) -> dict | None:
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def md(rows: list[list[str]], head: list[str]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def where(p: dict) -> str:
    m, v = p["machine"], p["versions"]
    commit = (v.get("git_commit") or "?")[:7] + (" + local changes" if v.get("git_dirty") else "")
    return (f"{m['processor']}, {m['cpu_count']} cores{', ' + m['gpu'] if m.get('gpu') else ''}; torch {v.get('torch')}, "
            f"transformers {v.get('transformers')}; commit {commit}; {p.get('created_at', '?')}")


def masking(p: dict) -> str:
    rows = []
    for v in p["results"]:
        for r in v["cpu"]:
            rows.append([f"{v['vocab']:,}", str(r["threads"]), f"{r['ours']:.3f}", f"{r['ours+collate']:.3f}",
                         f"{r['hf_mask']:.3f}", f"{r['hf_call']:.3f}", f"{r['speedup_call_vs_mask']:.1f}x",
                         f"{r['speedup_call']:.1f}x", f"{r['speedup_mask']:.1f}x",
                         f"{r['mask_tel_frac_of_step']:.3%}" if "mask_tel_frac_of_step" in r else "-"])
    head = ["vocab", "threads", "ours: mask ms", "ours: collate + mask ms", "HF masking part ms", "HF collator call ms",
            "HF call / our mask", "HF call / our collate + mask", "HF masking part / ours", "mask + telemetry / step"]
    return md(rows, head)


def step(p: dict) -> str:
    rows, base = [], {}
    for r in p["results"]["rows"]:
        if r["model"] == "ours":
            base[r["vocab"]] = r["tokens_per_s"]
    for r in p["results"]["rows"]:
        act = r.get("saved_activation_bytes")
        rows.append([f"{r['vocab']:,}", r["model"], f"{r['tokens_per_s']:,.0f}",
                     "-" if r["speedup_vs_hf"] is None or r["model"] == "hf" else f"{r['speedup_vs_hf']:.2f}x",
                     "-" if r["model"] in ("ours", "hf") else f"{r['tokens_per_s'] / base[r['vocab']]:.2f}x",
                     f"{r['mfu_counted']:.0%}", f"{1e3 * r['step_s']:.0f}",
                     "-" if act is None else f"{act / 2**20:.0f} MiB"])
    peak = p["results"]["matmul_peak"]["used_flops_per_s"] / 1e9
    s = p["settings"]
    impl = "foreach" if s.get("optimizer", {}).get("foreach") else "for-loop"  # ours' optimizer when it was measured
    bf16 = p["results"].get("matmul_peak_bf16")  # files since issue 53: a bf16 row's MFU is against the bf16 peak
    against = (f"the measured fp32 matmul peak ({peak:.0f} GFLOP/s)" if bf16 is None else
               f"the measured matmul peak of the row's precision (fp32 {peak:.0f} GFLOP/s, bf16 "
               f"{bf16['used_flops_per_s'] / 1e9:.0f} GFLOP/s)")
    note = (f"\nbatch {s['batch']} x seq {s['seq']}, {s['shape']['num_layers']} layers x {s['shape']['hidden_size']}, "
            f"{s['threads']} threads, fp32 unless the row says otherwise; MFU against {against}; median of "
            f"{s['iters']} steps after {s['warmup']} warm-up steps")
    head = ["vocab", "model", "tokens/s", "x HF", f"x ours (fp32, {impl} AdamW)", "MFU", "step ms",
            "saved for backward"]
    return md(rows, head) + "\n" + note


PROFILE_HEADS = {"matmul": "matmuls", "attention": "attention (SDPA)", "elementwise": "elementwise", "layer_norm":
                 "layer norm", "softmax_ce": "softmax / CE", "optimizer": "optimizer", "cast": "casts", "python":
                 "between ops", "other": "other"}


def step_profile(p: dict) -> str:
    """bench_step.py --profile: where our step's time goes, by group of ops, ms per step and share of the profiled
    step, per vocab and precision."""
    profiles = p["results"].get("profile")
    if not profiles:
        raise KeyError("this bench_step file has no profile (run benchmarks/bench_step.py --profile)")
    groups = [g for g in PROFILE_HEADS if any(g in q["groups"] for q in profiles)]
    rows = []
    for q in profiles:
        cells = []
        for g in groups:
            v = q["groups"].get(g)
            cells.append("-" if v is None else f"{1e3 * v['s_per_step']:.1f} ({v['share']:.0%})")
        rows.append([f"{q['vocab']:,}", q["precision"], f"{1e3 * q['step_s']:.0f}", f"{1e3 * q['profiled_step_s']:.0f}",
                     *cells])
    head = ["vocab", "precision", "step ms", "profiled step ms", *[f"{PROFILE_HEADS[g]}, ms (share)" for g in groups]]
    s = p["settings"]
    over = [q["profiler_overhead"] for q in profiles]
    note = (f"\nOur step (encoder + sparse MLM head + AdamW), batch {s['batch']} x seq {s['seq']}, "
            f"{s['shape']['num_layers']} layers x {s['shape']['hidden_size']}, {s['threads']} threads; torch.profiler over "
            f"{profiles[0]['steps']} steps after one untimed step, each op's self time in the group of its own name or "
            f"else its caller's; shares of the profiled step time (the profiler adds {min(over):+.0%} to "
            f"{max(over):+.0%} to the timed step). On the CPU in training (attention dropout) SDPA runs its math path: "
            f"its bmm count as matmuls, its softmax as softmax / CE, its dropout as elementwise.")
    return md(rows, head) + "\n" + note


MATMUL_OPS = (("qkv", "Q/K/V/out (h x h)"), ("ffn.in", "FFN in (h x 4h)"), ("ffn.out", "FFN out (4h x h)"),
              ("vocab", "vocab head"), ("attn", "attention bmm"))


def matmul(p: dict) -> str:
    """bench_matmul.py: GFLOP/s fp32 / bf16 per thread count, hidden and tokens: each dense op over its forward and
    both gradient matmuls, attention's batched matmuls at seq 128 (or the longest measured), and the step's mix."""
    r = p["results"]
    seq = max((x["seq"] for x in r["rows"] if "seq" in x), default=None)
    seq = 128 if any(x.get("seq") == 128 for x in r["rows"]) else seq

    def rate(rows: list[dict]) -> float | None:
        return sum(x["flops"] for x in rows) / sum(x["best_s"] for x in rows) / 1e9 if rows else None

    def pair(a: float | None, b: float | None) -> str:
        return " / ".join("-" if v is None else f"{v:,.0f}" for v in (a, b))

    keys = sorted({(x["threads"], x["hidden"], x["tokens"]) for x in r["rows"]})
    mixes = {(m["threads"], m["hidden"], m["tokens"], m["precision"]): m["gflops_s"] for m in r.get("mix", [])}
    rows = []
    for t, h, n in keys:
        these = [x for x in r["rows"] if (x["threads"], x["hidden"], x["tokens"]) == (t, h, n)]
        cells = []
        for op, _ in MATMUL_OPS:
            sel = [x for x in these if (x["op"].startswith("attn.") and x.get("seq") == seq if op == "attn"
                                        else x["op"] == op)]
            cells.append(pair(*(rate([x for x in sel if x["precision"] == pr]) for pr in ("fp32", "bf16"))))
        mf, mb = mixes.get((t, h, n, "fp32")), mixes.get((t, h, n, "bf16"))
        rows.append([str(t), str(h), f"{n:,}", *cells, pair(mf, mb), f"{mb / mf:.2f}x" if mf and mb else "-"])
    head = ["threads", "hidden", "tokens", *[f"{name}, GFLOP/s" for _, name in MATMUL_OPS], "step mix, GFLOP/s",
            "bf16 / fp32 (mix)"]
    s = p["settings"]
    peaks = "; ".join(pr + " " + ", ".join(f"{v['flops_per_s'] / 1e9:,.0f} at {t} thread(s) ({v['where']})"
                                           for t, v in by_t.items()) for pr, by_t in r["peak"].items())
    note = (f"\nEach cell fp32 / bf16: FLOPs over time of the op's forward (`F.linear`), input-gradient and weight-"
            f"gradient matmuls (attention: q k^T, p v and p^T g at seq {seq}, heads of 64), best of the timed calls; "
            f"vocab head: hidden x {s['vocab']:,} on {s['mask_frac']:.0%} of the tokens; step mix: a "
            f"{s['mix']['layers']}-layer step's matmuls at seq {s['mix']['seq']}. Peak (the best of the "
            f"{s['square']} x {s['square']} square matmul and every shape): {peaks}. CPU: {r['cpu_label']} "
            f"(`{r['cpu_kind']}`).")
    return md(rows, head) + "\n" + note


def data(p: dict) -> str:
    r = p["results"]
    rows = [[x["run"], str(x["num_proc"]), f"{x['get_blocks_s']:.2f}", f"{x['process_s']:.2f}",
             "-" if x["tokens_per_s"] is None else f"{x['tokens_per_s']:,.0f}"] for x in r["rows"]]
    note = (f"\n{r['corpus_bytes']:,} bytes -> {r['tokens']:,} tokens (vocab {r['vocab_size']:,}); identical blocks in "
            f"every run: {r['same_blocks_all_runs']}")
    return md(rows, ["cache", "num_proc", "get_blocks s", "whole process s", "tokens/s (cold)"]) + "\n" + note


def e2e(p: dict) -> str:
    r = p["results"]
    row = [f"{r['wall_s']:.0f}", f"{r['startup_s']:.1f}", f"{r['data_s']:.1f}", f"{r['pretrain_s']:.1f}",
           f"{r['eval_s']:.1f}", f"{r['downstream_s']:.1f}", f"{r['other_in_job_s']:.1f}", f"{r['peak_rss_mib']:,.0f}",
           f"{r['metrics']['downstream/score']:.3f}"]
    head = ["wall s", "startup s", "data s", "pretrain s", "eval s", "downstream s", "other s", "peak RSS MiB",
            "downstream/score"]
    if r.get("job_over_step") is not None:  # the job's training tokens/s against bench_step's at its shape
        row += [f"{r['job_tokens_per_s']:,.0f}", f"{r['step']['tokens_per_s']:,.0f}", f"{r['job_over_step']:.3f}"]
        head += ["job tokens/s", "step tokens/s", "job_over_step"]
    return md([row], head)


def _gain(g: dict | None) -> str:
    if not g or g.get("gain") is None:
        return "-"
    iv = f" [{100 * g['low']:+.1f}, {100 * g['high']:+.1f}]" if g.get("low") is not None else ""
    return f"{100 * g['gain']:+.1f}{iv}"


def over_seeds(rows: list[dict], n: int):
    """The gain at ``n`` labels over the pretraining seeds of ``rows``: its 95% t interval (None below 2 seeds) and
    each seed's own lower bound (over fine-tuning seeds, given that encoder)."""
    from mlmlab.stats import mean_interval

    gs = [g for g in ((r["gains"].get(str(n)) or {}) for r in rows) if g.get("gain") is not None]
    return (mean_interval([g["gain"] for g in gs]) if len(gs) >= 2 else None), [g.get("low") for g in gs]


EVALUATION_SPLITS = {"sst2": "SST-2 GLUE dev"}  # a task's reported split by its usual name (else "<task> <split>")


def evaluation_split(task: str) -> str:
    """The split that reports ``task``'s findings: test where the task has labelled test data, else validation."""
    if task in EVALUATION_SPLITS:
        return EVALUATION_SPLITS[task]
    from mlmlab.data.tasks import TASKS

    spec = TASKS.get(task)
    return f"{task} {'test' if spec is None or 'test' in spec.splits else 'validation'}"


def scored_on(p: dict) -> str:
    """What a time-to-pay file's rows were scored on, which is what its choices (recipe, budget) were made on: the
    selection split (``--score-split selection``, the default since ``downstream.score_split``), the evaluation split
    on purpose (``--score-split reported``: a confirmation of a recipe chosen elsewhere), or -- a file from before
    ``score_split`` existed -- the evaluation split, selected on; a screen (``--screen``) the fixed-mask loss."""
    if p.get("screen"):
        return "selected on the fixed-mask loss (no task split)"
    task = "builtin_sentiment" if p.get("quick") else p.get("task", "sst2")
    split = p.get("score_split")
    if split == "selection":
        return f"selected on the selection split (held out of {task} train)"
    if split == "reported":
        return f"the evaluation split ({evaluation_split(task)}), a confirmation"
    return f"selected on the evaluation split ({evaluation_split(task)})"


def time_to_pay(payloads: dict | list[dict], summary: bool = False, recipes: dict | None = None,
                targets: dict | None = None) -> str:
    """``bench_time_to_pay.py``: one row per (recipe, budget, pretraining seed) -- minutes actually pretrained, steps,
    the fixed-mask loss, and per label budget the gain over random init in points with its 95% interval over
    fine-tuning seeds (given that encoder) -- then per (recipe, budget, split scored), over every file that ran it (a
    confirmation on other seeds joins the seeds it confirms), the gain's 95% t interval over the pretraining seeds (the
    unit) and whether it pays by the one rule, :func:`mlmlab.stats.pays` (that interval above 0; the target: above
    +5 / +3 points); how many seeds' own intervals reach 0 is description only. Every row names the split it was
    scored on (:func:`scored_on`): a row selected on the evaluation split says so until re-run on the selection split.
    ``summary``: the rows over seeds alone (the README's curve). ``recipes``: a name for a recipe's overrides
    (``experiment=real_en_fast`` and the overrides it stands for are one recipe: their rows join). ``targets``: {label
    budget: gain to reach} in place of :data:`TARGETS` (issue 53's regime: +10 points at 500, +3 at 4,000)."""
    from mlmlab.stats import pays

    payloads = payloads if isinstance(payloads, list) else [payloads]
    labels = sorted({n for p in payloads if not p.get("screen") for n in p.get("labels", [])})
    head = ["recipe", "split", "budget, min", "seed", "pretrained, min", "steps", "val/mlm_loss_r15",
            *[f"gain @ {n:,} labels, points" for n in labels]]
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for p in payloads:
        recipe = " ".join(p["overrides"]) or "(defaults)"
        recipe = (recipes or {}).get(recipe, recipe)
        for r in p["rows"]:  # gains scored on different splits never share an interval
            groups.setdefault((recipe, scored_on(p), r["minutes"]), []).append(r)
    rows = []
    for (recipe, split, minutes), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        for r in [] if summary else rs:
            rows.append([recipe, split, f"{minutes:g}", str(r["seed"]), f"{r['pretrain_min']:.1f}", f"{r['steps']:,}",
                         f"{r['val_loss']:.3f}", *[_gain(r["gains"].get(str(n))) for n in labels]])
        cells = []
        for n in labels:
            iv, lows = over_seeds(rs, n)
            if iv is None:
                cells.append("-")
                continue
            gains = [g["gain"] for g in ((r["gains"].get(str(n)) or {}) for r in rs) if g.get("gain") is not None]
            reach = sum(1 for low in lows if low is None or low <= 0)
            if not pays(gains, threshold=0.0):
                verdict = "does not pay"
            else:  # the seeds' own intervals (each given its encoder) describe; they do not decide
                verdict = "**pays**" + (f"; {reach} of {len(lows)} seeds' own intervals reach 0" if reach else "")
            target = {int(k): float(v) for k, v in (targets or TARGETS).items()}.get(n)
            goal = (f"; target +{100 * target:g}: {'met' if pays(gains, threshold=target) else 'not met'}"
                    if target is not None and pays(gains, threshold=0.0) else "")
            cells.append(f"{100 * iv.mean:+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}] over {len(lows)} seeds: "
                         f"{verdict}{goal}")
        if any(c != "-" for c in cells):
            rows.append([recipe, split, f"{minutes:g}", str(len({r["seed"] for r in rs})), *cells] if summary else
                        [recipe, split, f"{minutes:g}", "all", "", "", "", *cells])
    if summary:
        head = ["recipe", "split", "budget, min", "pretraining seeds", *head[7:]]
    cpus = "; ".join(sorted({p.get("cpu") or p["machine"]["processor"] for p in payloads}))
    return md(rows, head) + f"\n\nEach job pinned to one core with one torch thread ({cpus})."


def split_overlap(p: dict) -> str:
    """``bench_split_overlap.py``: per split, how many examples (of at least ``min_words`` words) occur verbatim inside
    a training example."""
    rows = [[name, f"{r['examples']:,}", f"{r['at_least_min_words']:,}", f"{r['inside_train']:,}",
             "-" if r["share"] is None else f"{100 * r['share']:.1f}%"] for name, r in p["rows"].items()]
    return md(rows, ["split", "examples", f"with >= {p['min_words']} words", "of those inside a training example",
                     "share"])


def _variant(p: dict) -> str:
    """What a run changed from the ELECTRA defaults (generator 1/4 width, full depth, disc_weight 50)."""
    o = p["objective"]
    out = [f"generator {o['generator_size']:g}"] if o["generator_size"] != 0.25 else []
    out += [f"{o['generator_layers']} generator layer(s)"] if o.get("generator_layers") else []
    out += [f"disc_weight {o['disc_weight']:g}"] if o["disc_weight"] != 50 else []
    return "".join(f", {x}" for x in out)


def electra_reference(payloads: dict | list[dict], labels: list[str] | None = None,
                      steps: list[int] | None = None) -> str:
    """bench_electra_reference.py's curves side by side: for each run (``labels``, default its impl and norm) the
    discriminator's recall on replaced tokens and its BCE less the base rate's entropy (negative: it beats always
    answering the base rate) on the fixed validation masks, at ``steps`` (default every evaluation), then the
    generator's MLM loss at the last step, the base rate and the run's seconds per step."""
    runs = payloads if isinstance(payloads, list) else [payloads]
    # transformers' ELECTRA is post-LN whatever model.norm says (earlier records wrote the config's norm)
    labels = labels or [f"transformers (post-LN{_variant(p)})" if p["impl"] == "hf" else
                        f"mlmlab ({p['norm']}-LN{_variant(p)})" for p in runs]
    curves = [{c["step"]: c["val"] for c in p["curve"]} for p in runs]
    at = steps or sorted(set().union(*curves))
    head = ["step"] + [f"{lab}: {what}" for lab in labels for what in ("recall", "BCE - H(base)")]
    rows = []
    for s in at:
        row = [f"{s:,}"]
        for c in curves:
            v = c.get(s)
            row += (["-", "-"] if v is None else
                    [f"{v['disc_recall_replaced']:.3f}", f"{v['disc_loss'] - v['base_rate_entropy']:+.3f}"])
        rows.append(row)
    last = [c[max(c)] for c in curves]
    rows.append(["last: gen. loss / base rate"] + [x for v in last for x in (f"{v['gen_mlm_loss']:.3f}",
                                                                               f"{v['replaced_frac']:.3f}")])
    rows.append(["s per step"] + [x for p in runs for x in (f"{p['s_per_step']:.2f}", "")])
    return md(rows, head)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=str(RESULTS_DIR))
    d = Path(ap.parse_args(argv).dir)
    for name, fn in (("bench_masking", masking), ("bench_step", step), ("bench_data", data), ("bench_e2e", e2e),
                     ("bench_matmul", matmul)):
        p = load(d, name)
        print(f"### {name}\n")
        if p is None:
            print(f"(no {name}.json in {d})\n")
            continue
        print(f"{where(p)}\n")
        print(fn(p) + "\n")
        if name == "bench_step" and p["results"].get("profile"):
            print(f"### bench_step profile\n\n{step_profile(p)}\n")


if __name__ == "__main__":
    main()
