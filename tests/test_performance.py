"""The speed levers keep the science the same: the CPU masker's sparse random-id lookup equals the dense formula,
gradient checkpointing and every AdamW implementation give the same update, compiled training runs, bf16 autocast on
the CPU runs, and real 2-process DDP gives each rank its own reproducible mask stream and an exact synced validation.
(Speed itself is measured in benchmarks/, never asserted here.)"""

import copy
import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from mlmlab import pretrain_job as train
from mlmlab.config import ConfigError, validate
from mlmlab.lit.mlm import TRAIN_STREAM
from mlmlab.lit.optim import adamw_with_schedule
from mlmlab.masking import GeneratorSource, Masker, make_generator
from mlmlab.masking.config import MaskConfig, ReplaceConfig
from mlmlab.masking.masker import IGNORE_INDEX, KEPT, MASKED, NOT_SELECTED, RANDOM
from mlmlab.masking.replacement import SamplerContext, UniformSampler, UnigramSampler
from mlmlab.models.encoder import BertForMLM, EncoderConfig

V, B, L = 300, 16, 64
SPECIALS = (0, 1, 2, 3, 4)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, L), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    ids[5, 40:] = 0  # padding
    return ids, ids < 5


def dense_reference(ids, special, rate, p_mask, p_random, sampler, gen):
    """BERT's recipe written out densely, in the masker's draw order: selection, replacement split, a random id for
    every position (float64) -- what the masker computes on an accelerator."""
    n = ids.shape[1]
    sel = (torch.rand((B, n), generator=gen) < rate) & ~special
    r = torch.rand((B, n), generator=gen)
    to_mask, to_random = sel & (r < p_mask), sel & (r >= p_mask) & (r < p_mask + p_random)
    drawn = sampler.sample(torch.rand((B, n), generator=gen, dtype=torch.float64), ids)
    out = torch.where(to_random, drawn, ids.masked_fill(to_mask, 4))
    kind = torch.full((B, n), NOT_SELECTED, dtype=torch.int8)
    kind[sel], kind[to_mask], kind[to_random] = KEPT, MASKED, RANDOM
    return out, ids.masked_fill(~sel, IGNORE_INDEX), kind


@pytest.mark.parametrize("sampler", ["uniform", "uniform_exclude", "unigram"])
def test_cpu_masker_equals_the_dense_formula(sampler):
    """On the CPU the masker looks up random ids only where they are used; the result must be the dense formula's,
    bit for bit, so CPU and accelerator runs follow the same definition of the mask stream."""
    ctx = SamplerContext(V, SPECIALS, token_counts=lambda: torch.arange(V) % 7)
    s = {"uniform": lambda: UniformSampler(ctx), "uniform_exclude": lambda: UniformSampler(ctx, exclude_original=True),
         "unigram": lambda: UnigramSampler(ctx, alpha=0.5)}[sampler]()
    ids, special = batch()
    m = Masker(4, MaskConfig(replace=ReplaceConfig(0.6, 0.3, 0.1)), s)  # a large random share: many lookups
    for step in range(5):
        got = m(ids, special, 0.3, GeneratorSource(make_generator("cpu", 0, 0, step, 0), B, ids.device))
        want = dense_reference(ids, special, 0.3, 0.6, 0.3, s, make_generator("cpu", 0, 0, step, 0))
        assert torch.equal(got.input_ids, want[0]) and torch.equal(got.labels, want[1])
        assert torch.equal(got.kind, want[2])
        assert (got.kind == RANDOM).sum() > 0


def test_grad_checkpointing_same_gradients_less_saved_memory():
    c = EncoderConfig(vocab_size=V, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    plain = BertForMLM(c)
    ckpt = BertForMLM(EncoderConfig(**{**c.to_dict(), "grad_checkpointing": True}))
    ckpt.load_state_dict(plain.state_dict())
    ids, special = batch()
    labels = ids.masked_fill(special | (torch.rand(ids.shape) > 0.2), IGNORE_INDEX)
    saved = {}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        model.train()
        torch.manual_seed(1)  # the same dropout masks: checkpoint() replays them from the saved RNG state
        n = [0]

        def pack(t, n=n):
            n[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model.mlm_loss(ids, ids != 0, labels)[0]
        loss.backward()
        saved[name] = (loss.item(), n[0])
    assert saved["ckpt"][0] == pytest.approx(saved["plain"][0], abs=1e-6)
    for (k, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=k)
    assert saved["ckpt"][1] < 0.5 * saved["plain"][1]  # only layer inputs are kept for backward


def test_every_adamw_implementation_gives_the_same_update():
    c = EncoderConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, dropout=0.0,
                      attention_dropout=0.0)
    torch.manual_seed(0)
    base = BertForMLM(c)
    ids, special = batch()
    labels = ids.masked_fill(special | (torch.rand(ids.shape) > 0.2), IGNORE_INDEX)
    params = {}
    for impl in ("for_loop", "foreach", "fused", "auto"):
        model = copy.deepcopy(base)
        o = adamw_with_schedule(model, 1e-3, 0.01, (0.9, 0.98), 1e-6, 2, 10, impl=impl)
        opt, sched = o["optimizer"], o["lr_scheduler"]["scheduler"]
        assert opt.defaults.get("fused") is (True if impl == "fused" else False if impl == "for_loop" else None)
        assert opt.defaults.get("foreach") is (impl in ("foreach", "auto") or (False if impl == "for_loop" else None))
        for _ in range(3):
            opt.zero_grad()
            model.mlm_loss(ids, ids != 0, labels)[0].backward()
            opt.step()
            sched.step()
        params[impl] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(params["auto"], torch.cat([p.detach().flatten() for p in base.parameters()]))
    for impl in ("foreach", "auto"):  # the default: bitwise the loop's parameters on the CPU, so the switch changed
        assert torch.equal(params[impl], params["for_loop"]), impl  # no figure
    torch.testing.assert_close(params["fused"], params["for_loop"], rtol=1e-5, atol=1e-6)  # one kernel: rounding


@pytest.mark.parametrize("overrides,message", [
    (["optim.impl=fast"], "optim.impl='fast'.*allowed: auto, for_loop, foreach, fused"),
    (["trainer.precision=8-mixed"], "trainer.precision='8-mixed'.*allowed: 32-true, bf16-mixed"),
    (["optim.impl=fused", "trainer.precision=bf16-mixed"], "optim.impl=fused cannot be combined with trainer.precision"),
])
def test_bad_speed_settings_fail_early(cfg_factory, overrides, message, bf16_host):
    with pytest.raises(ConfigError, match=message):
        validate(cfg_factory(*overrides))


@pytest.mark.slow
def test_compiled_bf16_training_runs_and_checkpoints_plain_keys(cfg_factory, tmp_path, bf16_host):
    """``trainer.compile=true`` compiles the encoder in place (the checkpoint keeps the plain keys that fine-tuning
    and export read), together with CPU bf16 autocast, the foreach AdamW and gradient checkpointing. On a CPU without
    native bf16 the run is allowed here (emulated: slower, the same code path), so the test runs on every host."""
    from torch._dynamo.utils import counters

    counters.clear()
    out = tmp_path / "c"
    m = train(cfg_factory("trainer.compile=true", "trainer.precision=bf16-mixed", "optim.impl=foreach",
                          "model.grad_checkpointing=true", "trainer.max_steps=3", "trainer.val_check_interval=3",
                          "logger=none", "downstream=none", output_dir=out))
    assert m["train/steps"] == 3 and torch.isfinite(torch.tensor(m["val/mlm_loss_r15"]))
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo did compile the encoder
    r = json.loads((out / "results.json").read_text())
    assert r["config"]["trainer"]["compile"] is True and r["model"]["grad_checkpointing"] is True
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert not any("_orig_mod" in k for k in state)
    enc = EncoderConfig(**{k: v for k, v in r["model"].items() if k in EncoderConfig.__dataclass_fields__})
    BertForMLM(enc).load_state_dict({k.removeprefix("model."): v for k, v in state.items()})


@pytest.mark.slow
def test_ddp_two_processes_distinct_reproducible_masks_and_exact_synced_validation(tmp_path, cache_dir):
    """A real Lightning DDP fit with 2 processes (gloo): each rank draws its own masks for the same probe blocks, each
    stream is the one (seed, rank, step) defines, and the synced fixed-mask validation equals one process's."""
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "ddp_probe.py"), str(tmp_path), str(cache_dir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    traces = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert sorted(traces[0]) == sorted(traces[1]) == [0, 1, 2]
    from conftest import FAST, make_cfg

    from mlmlab import build_recipe
    from mlmlab.data.corpus import get_blocks
    from mlmlab.data.vocab_stats import make_sampler_context

    cfg = make_cfg([*FAST], tmp_path / "ref", cache_dir)
    tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
    masker = build_recipe(cfg.mask, make_sampler_context(cfg.data, cfg.tokenizer, cfg.paths, tok, blocks), blocks["train"]).masker
    probe = {k: v[:8] for k, v in blocks["train"].items()}
    for step in range(3):
        assert not torch.equal(traces[0][step]["labels"], traces[1][step]["labels"])
        for rank in (0, 1):
            g = make_generator("cpu", TRAIN_STREAM, cfg.seed, rank, step, 0)
            want = masker(probe["input_ids"], probe["special_tokens_mask"], cfg.mask.rate, GeneratorSource(g, 8, "cpu"))
            assert torch.equal(traces[rank][step]["input_ids"], want.input_ids)
            assert torch.equal(traces[rank][step]["labels"], want.labels)
    val = json.loads((tmp_path / "val.json").read_text())
    assert val["eval_tokens"] % 2 == 1 or val["val_blocks"] % 2 == 1  # uneven shards: the case that used to skew
    assert val["synced"]["val/mlm_loss_r15"] == pytest.approx(val["one_process_loss"], rel=1e-6)


@pytest.mark.slow
def test_gpu_check_runs_on_its_cpu_path(tmp_path, cache_dir):
    """benchmarks/gpu_check.sh, prepared for a GPU, runs its three parts on the CPU at smoke size and writes its JSON
    (the step against HF, the default job end to end, a 1-device DDP job)."""
    env = {**__import__("os").environ, "MLMLAB_CACHE_DIR": str(cache_dir), "WANDB_MODE": "offline"}
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    out = json.loads((tmp_path / "gpu_check.json").read_text())
    assert out["status"] == {"step": "ok", "e2e": "ok", "ddp": "ok"}
    step = out["step"]
    assert step["device"] == "cpu" and step["results"]["bf16_peak"]["flops_per_s"] > 0
    rows = {r["model"]: r for r in step["results"]["rows"]}
    assert set(rows) == {"ours", "hf"} and rows["ours"]["adamw"] == "fused"
    assert rows["hf"]["speedup_vs_hf"] == 1.0 and rows["ours"]["tokens_per_s"] > 0 and 0 < rows["ours"]["mfu_bf16"]
    assert out["e2e"]["results"]["status"] == "ok" and out["ddp"]["status"] == "ok"


def test_time_to_pay_is_the_first_budget_whose_gain_is_above_zero_over_pretraining_seeds():
    """benchmarks/bench_time_to_pay.py's rule on planted rows: a budget pays when the interval over pretraining seeds
    is above the threshold (mlmlab.stats.pays, the one rule); each seed's own interval over fine-tuning seeds is
    described, never decides; the table renders it with the split each row was scored on."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_time_to_pay as ttp
        import report as bench_report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    a = ttp.parse_args(["--name", "t", "--labels", "500"])

    def row(minutes, seed, gain, half):
        return {"minutes": minutes, "seed": seed, "pretrain_min": minutes + 0.2, "steps": 100 * minutes,
                "val_loss": 6.0, "gains": {"500": {"gain": gain, "low": gain - half, "high": gain + half}}}

    rows = [row(5, 0, 0.02, 0.03), row(5, 1, 0.03, 0.03),   # each seed's interval covers 0: no
            row(10, 0, 0.10, 0.02), row(10, 1, 0.30, 0.02),  # each above, but over 2 seeds [-1.07, +1.47]: no
            row(20, 0, 0.15, 0.02), row(20, 1, 0.16, 0.02)]  # both: pays (above 0 and above the +5-point target)
    s = ttp.summarize(a, rows)["by_labels"]["500"]
    assert [b["pays_above_0"] for b in s["budgets"]] == [False, False, True]
    assert s["time_to_pay"] == {"above_0": 20.2, "above_0.05": 20.2}
    table = bench_report.time_to_pay({"overrides": ["experiment=real_en"], "labels": [500], "rows": rows,
                                      "summary": {"by_labels": {"500": s}}, "machine": {"processor": "x"}})
    assert "+15.5 [+9.1, +21.9] over 2 seeds: **pays**; target +5: met" in table and table.count("does not pay") == 2
    # a file from before downstream.score_split scored (and chose on) the evaluation split: every row says so
    assert table.count("| selected on the evaluation split (SST-2 GLUE dev) |") == len(rows) + 3
    # one seed's own interval reaches 0, the interval over seeds does not: it pays, and the table says how many reach 0
    wide = [row(5, 0, 0.10, 0.12), row(5, 1, 0.11, 0.02), row(5, 2, 0.12, 0.02)]
    s = ttp.summarize(a, wide)["by_labels"]["500"]
    assert s["budgets"][0]["pays_above_0"] is True and s["budgets"][0]["seeds_reaching_0"] == 1
    new = {"overrides": ["experiment=real_en"], "labels": [500], "rows": wide, "machine": {"processor": "x"},
           "score_split": "selection"}
    table = bench_report.time_to_pay(new, summary=True)
    assert "+11.0 [+8.5, +13.5] over 3 seeds: **pays**; 1 of 3 seeds' own intervals reach 0; target +5: met" in table
    assert "| selected on the selection split (held out of sst2 train) |" in table
    # gains scored on different splits never share an interval
    both = bench_report.time_to_pay([new, {**new, "score_split": "reported"}], summary=True)
    assert both.count("over 3 seeds") == 2 and "| the evaluation split (SST-2 GLUE dev), a confirmation |" in both
    a.overrides = ["experiment=real_en"]
    assert ttp.job_args(a, 5, 0)[-1] == "downstream.score_split=selection"  # the benchmark's default
    b = ttp.parse_args(["--name", "t", "--score-split", "reported", "--overrides", "experiment=real_en"])
    assert ttp.job_args(b, 5, 0)[-1] == "downstream.score_split=reported"


def _run_bench(script: str, *args: str, out) -> dict:
    """A benchmark script at its ``--quick`` size, in its own process (it sets torch's thread count), into ``out``."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", *args, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return json.loads(out.read_text())


def _bench_report():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import report as bench_report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return bench_report


def test_bench_matmul_quick_reports_both_precisions_and_a_peak_each(tmp_path):
    """benchmarks/bench_matmul.py: every encoder shape in fp32 and bf16 at each thread count, a peak per precision
    and thread count (the best of the square and the shapes), the step mix, the CPU named; its table renders."""
    r = _run_bench("bench_matmul.py", out=tmp_path / "m.json")["results"]
    assert {x["precision"] for x in r["rows"]} == {"fp32", "bf16"} and {x["threads"] for x in r["rows"]} == {1, 2}
    assert {x["op"] for x in r["rows"]} == {"qkv", "ffn.in", "ffn.out", "vocab", "attn.score", "attn.context",
                                           "attn.context_t"}
    for x in r["rows"]:
        assert x["gflops_s"] == pytest.approx(x["flops"] / x["best_s"] / 1e9) and x["gflops_s"] > 0
    for prec in ("fp32", "bf16"):
        for t in ("1", "2"):
            best = max(x["gflops_s"] for x in r["rows"] + r["square"] if (x["precision"], x["threads"]) == (prec, int(t)))
            assert r["peak"][prec][t]["flops_per_s"] == pytest.approx(best * 1e9)
    assert {(m["precision"], m["threads"]) for m in r["mix"]} == {(p, t) for p in ("fp32", "bf16") for t in (1, 2)}
    assert r["cpu_label"] and r["cpu_kind"]
    table = _bench_report().matmul(json.loads((tmp_path / "m.json").read_text()))
    assert table.count("\n| ") == 1 + 4 and "Peak (the best of the" in table  # rule + 2 hidden x 1 tokens x 2 threads


def test_bench_step_quick_mfu_per_precision_and_a_profile_that_adds_up(tmp_path):
    """benchmarks/bench_step.py --bf16 --profile: each row's MFU against the peak of its own precision (the bf16 row
    also against fp32's, the old meaning); the profile's groups of ops add up to the profiled step time (self times
    do not overlap; within 10%), matmuls, the optimizer and (bf16) casts among them; both tables render."""
    p = _run_bench("bench_step.py", "--bf16", "--profile", "--no-hf", "--vocab", "512", "--threads", "1",
                   out=tmp_path / "s.json")
    r = p["results"]
    peaks = {"fp32": r["matmul_peak"]["used_flops_per_s"], "bf16": r["matmul_peak_bf16"]["used_flops_per_s"]}
    rows = {x["model"]: x for x in r["rows"]}
    assert rows["ours"]["precision"] == "fp32" and rows["ours+bf16"]["precision"] == "bf16"
    for x in rows.values():
        assert x["peak_flops_s"] == peaks[x["precision"]]
        assert x["mfu_counted"] == pytest.approx(x["achieved_flops_s_counted"] / peaks[x["precision"]])
    assert rows["ours+bf16"]["mfu_counted_vs_fp32_peak"] == pytest.approx(
        rows["ours+bf16"]["achieved_flops_s_counted"] / peaks["fp32"])
    prof = {q["precision"]: q for q in r["profile"]}
    assert set(prof) == {"fp32", "bf16"}
    for q in prof.values():
        groups = {g: v["s_per_step"] for g, v in q["groups"].items()}
        assert list(groups) == ["matmul", "attention", "elementwise", "layer_norm", "softmax_ce", "optimizer", "cast",
                                "python", "other"]
        assert min(groups.values()) >= 0 and groups["matmul"] > 0 and groups["optimizer"] > 0
        assert sum(groups.values()) == pytest.approx(q["profiled_step_s"], rel=0.1)
        assert sum(v["share"] for v in q["groups"].values()) == pytest.approx(1.0, abs=0.1)
    assert prof["bf16"]["groups"]["cast"]["s_per_step"] > 0
    bench_report = _bench_report()
    assert "bf16 " in bench_report.step(p) and "the measured matmul peak of the row's precision" in bench_report.step(p)
    assert bench_report.step_profile(p).count("\n| ") == 1 + 2  # the rule + a row per precision


def test_time_to_drop_reads_each_record_s_validation_curve(tmp_path):
    """benchmarks/bench_time_to_drop.py on a planted record: the step-budget job it would run (pinned, one thread,
    pretraining only, validation every n steps), then tokens and minutes to the target and to the bigram mark, and the
    loss at 5/10/20 minutes, from results.json val_curve."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_time_to_drop as ttd
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    a = ttd.parse_args(["--name", "t", "--steps", "600", "--val-every", "200", "--arm", "rope",
                        "experiment=real_en_fast model.position=rope"])
    cmd, env = ttd.job_cmd(a, a.arm[0][1], 3, tmp_path / "j", core=1)
    assert cmd[:3] == ["taskset", "-c", "1"] and env["OMP_NUM_THREADS"] == "1" and "trainer.threads=1" in cmd
    assert {"model.position=rope", "trainer.max_steps=600", "trainer.val_check_interval=200", "seed=3",
            "downstream.tasks=[]", "trainer.budget.seconds=null"} <= set(cmd)
    with pytest.raises(SystemExit):
        ttd.parse_args(["--name", "t", "--steps", "6", "--arm", "a", "x=1", "--arm", "a", "x=2"])
    curve = [{"step": s, "tokens": 2048 * s, "train_s": 0.3 * s, "val/mlm_loss_r15": v}
             for s, v in ((200, 6.0), (400, 5.0), (600, 4.0))]
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "results.json").write_text(json.dumps({
        "metrics": {"train/steps": 600, "val/mlm_loss_r15": 4.0}, "val_curve": curve, "machine": {"torch_threads": 1},
        "phase": {"label": "past the drop", "unigram": 6.1, "bigram": 4.85, "margin": 0.1}}))
    r = ttd.row(a, {"arm": "rope", "overrides": "x", "seed": 3, "core": 1, "dir": str(tmp_path / "j")})
    assert r["reach_target"] == pytest.approx({"step": 500, "tokens": 2048 * 500, "train_s": 150.0})
    assert r["reach_bigram"]["step"] == pytest.approx(400 + 200 * (5.0 - 4.75))
    assert r["loss_at_min"]["5"] is None  # the curve ends at 3 minutes
    assert r["tokens"] == 2048 * 600 and r["phase"] == "past the drop"


def test_split_overlap_counts_held_out_text_inside_training_text():
    """benchmarks/bench_split_overlap.py on planted texts: a held-out phrase counts when it occurs, between word
    boundaries, inside a training text; shorter ones than min_words are left out."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_split_overlap as so
        import report as bench_report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    train = ["a truly great and moving film", "the plot is thin"]
    held = ["truly great and moving", "great and moving film", "the plot is thin", "is thin", "plot is thinner than air"]
    r = so.overlap(held, train, min_words=4)
    assert r == {"examples": 5, "at_least_min_words": 4, "inside_train": 3, "share": 0.75}
    assert so.overlap(["ruly great and moving"], train, 4)["inside_train"] == 0  # word boundaries
    table = bench_report.split_overlap({"min_words": 4, "rows": {"selection": r}})
    assert "| selection | 5 | 4 | 3 | 75.0% |" in table
