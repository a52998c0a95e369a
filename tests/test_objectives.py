"""Baseline objectives: ELECTRA replaced-token detection and causal LM, and equal-FLOP budgets across objectives."""

import json
import math

import pytest
import torch
from conftest import run_cli
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mlmlab import pretrain_job as train
from mlmlab.analysis import read_wandb_offline, wandb_run_dirs
from mlmlab.config import ConfigError, validate
from mlmlab.flops import clm_step_flops, electra_step_flops
from mlmlab.lit.electra import ElectraModule
from mlmlab.lit.optim import param_groups
from mlmlab.masking import Constant, GeneratorSource, MaskingRecipe, make_generator
from mlmlab.masking.masker import BertMasker
from mlmlab.masking.replacement import SamplerContext, UniformSampler
from mlmlab.models.electra import ElectraForPretraining
from mlmlab.models.encoder import CausalLM, EncoderConfig, SequenceClassifier

SPECIAL = (0, 1, 2, 3, 4)
MASK_ID = 4


def tiny(vocab=64, **kw) -> EncoderConfig:
    return EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                         max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, **kw)


def batch(vocab=64, b=6, t=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), vocab, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    ids[0, -5:] = 0  # right padding in one row
    special = torch.isin(ids, torch.tensor(SPECIAL))
    attention = ids != 0
    masker = BertMasker(MASK_ID, 0.85, 0.0, 0.15, sampler=UniformSampler(SamplerContext(vocab, SPECIAL)))
    out = masker(ids, special, 0.3, GeneratorSource(make_generator("cpu", seed), b, ids.device))
    return ids, special, attention, out


def rtd(model, ids, special, attention, masked, seed=0, **kw):
    return model(masked.input_ids, masked.labels, ids, attention, special, generator=make_generator("cpu", 99, seed), **kw)


# ------------------------------------------------------------------------------------------------------- ELECTRA


def test_rtd_targets_are_exactly_token_differs_from_original():
    torch.manual_seed(0)
    model = ElectraForPretraining(tiny(vocab=12), 0.25, special_ids=SPECIAL)  # 7 drawable ids: samples often hit
    ids, special, attention, masked = batch(vocab=12)
    out = rtd(model, ids, special, attention, masked)
    sel = masked.labels != -100
    assert torch.equal(out.corrupted_ids[~sel], ids[~sel].long())  # only the generator's positions change
    assert torch.equal(out.disc_positions, attention & ~special)
    assert torch.equal(out.disc_targets, (out.corrupted_ids != ids)[out.disc_positions].float())
    same = sel & (out.corrupted_ids == ids)  # sampled the original token: labelled "original"
    assert same.any() and (sel & ~same).any()
    assert out.disc_targets.sum() == (sel & ~same).sum()
    assert not torch.isin(out.corrupted_ids[sel], torch.tensor(SPECIAL)).any()  # specials are never sampled


def test_no_gradient_from_the_discriminator_loss_into_the_generator():
    model = ElectraForPretraining(tiny(), 0.25, special_ids=SPECIAL)
    ids, special, attention, masked = batch()
    out = rtd(model, ids, special, attention, masked)
    out.disc_loss.backward(retain_graph=True)
    gen_only = [(n, p) for n, p in model.generator.named_parameters()
                if p is not model.discriminator.embeddings.word_embeddings.weight]
    assert gen_only and all(p.grad is None or not p.grad.any() for _, p in gen_only)
    assert model.discriminator.embeddings.word_embeddings.weight.grad.abs().sum() > 0  # the shared tensor learns
    out.gen_loss.backward()  # and the generator does get gradients from its own loss
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in gen_only if "bias" not in n)


def test_tied_embeddings_are_one_tensor():
    model = ElectraForPretraining(tiny(), 0.25, special_ids=SPECIAL)
    word = model.discriminator.embeddings.word_embeddings.weight
    assert model.generator.cls.predictions.decoder.weight is word
    assert model.embeddings is model.discriminator.embeddings  # the generator reads the discriminator's embeddings
    assert not any(isinstance(m, torch.nn.Embedding) for m in model.generator.modules())
    # the optimizer the run uses holds the tied tensor once, undecayed; every other matrix (the generator's projection
    # included) is decayed
    decay, no_decay = (g["params"] for g in param_groups(model, 0.01))
    ids_ = [id(p) for p in decay + no_decay]
    assert len(ids_) == len(set(ids_)) == len({id(p) for p in model.parameters()})
    assert any(p is word for p in no_decay) and not any(p is word for p in decay)
    assert any(p is model.generator.embeddings_project.weight for p in decay)
    assert {id(p) for p in decay} == {id(p) for n, p in model.named_parameters() if p.ndim == 2
                                      and "embeddings" not in n.split(".")}
    # a training step moves the one tensor, and the generator's decoder sees the update
    before = word.detach().clone()
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-2)
    ids, special, attention, masked = batch()
    rtd(model, ids, special, attention, masked).loss.backward()
    opt.step()
    assert not torch.equal(before, word) and torch.equal(model.generator.cls.predictions.decoder.weight, word)


@pytest.mark.parametrize("method", ["gumbel", "multinomial"])
def test_sampling_follows_the_tempered_softmax(method):
    model = ElectraForPretraining(tiny(vocab=8), 0.25, special_ids=SPECIAL)
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, -1.0]]).repeat(40000, 1)
    for temp in (1.0, 2.0):
        draws = model.sample(logits, temp, torch.Generator().manual_seed(1), method)
        expect = torch.softmax(logits[0, 5:] / temp, -1)
        freq = torch.bincount(draws, minlength=8)[5:].float() / len(draws)
        assert torch.bincount(draws, minlength=8)[:5].sum() == 0
        assert torch.allclose(freq, expect, atol=0.01), (freq, expect)
    a = model.sample(logits[:50], 1.0, torch.Generator().manual_seed(3), method)
    b = model.sample(logits[:50], 1.0, torch.Generator().manual_seed(3), method)
    assert torch.equal(a, b)


@pytest.mark.parametrize("end", [None, 1.0])
def test_temperature_curriculum_is_geometric_from_start_to_end(end):
    """objective.temperature_end: the sampling temperature goes geometrically from temperature (step 0) to
    temperature_end (the last step); validation samples at the end temperature; null keeps it constant."""
    recipe = MaskingRecipe(BertMasker(MASK_ID, 0.85, 0.0, 0.15, sampler=None), Constant(0.15), SPECIAL)
    module = ElectraModule({k: v for k, v in tiny().to_dict().items()}, recipe, {}, 0, 11,
                           objective={"generator_size": 0.25, "disc_weight": 50.0, "temperature": 100.0,
                                      "temperature_end": end, "sampling": "gumbel"})
    got = [module.sampling_temperature(s) for s in range(11)]
    if end is None:
        assert got == [100.0] * 11 and module.sampling_temperature(None) == 100.0
        return
    assert got[0] == pytest.approx(100.0) and got[5] == pytest.approx(10.0) and got[10] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(got, got[1:]))
    assert module.sampling_temperature(None) == pytest.approx(1.0) and module.sampling_temperature(50) == pytest.approx(1.0)


def test_downstream_gets_the_discriminator():
    c = tiny()
    enc = {k: v for k, v in c.to_dict().items()}
    recipe = MaskingRecipe(BertMasker(MASK_ID, 0.85, 0.0, 0.15, sampler=None), Constant(0.15), SPECIAL)
    module = ElectraModule(enc, recipe, {}, 0, 10,
                           objective={"generator_size": 0.25, "disc_weight": 50.0, "temperature": 1.0,
                                      "sampling": "gumbel"})
    assert module.encoder() is module.model.discriminator
    clf = SequenceClassifier(c, 2)
    clf.bert.load_state_dict(module.encoder().state_dict(), strict=True)  # same keys as an MLM encoder


# ------------------------------------------------------------------------------------------------------- causal LM


def test_causal_encoder_does_not_see_the_future_and_reads_the_last_token():
    model = CausalLM(tiny(causal=True)).eval()
    ids = torch.randint(5, 64, (2, 16))
    changed = ids.clone()
    changed[:, 10:] = torch.randint(5, 64, (2, 6))
    h1, h2 = model.bert(ids), model.bert(changed)
    assert torch.allclose(h1[:, :10], h2[:, :10], atol=1e-5) and not torch.allclose(h1[:, 10:], h2[:, 10:])
    clf = SequenceClassifier(tiny(causal=True), 3, dropout=0.0, pooling="last").eval()
    short = torch.randint(5, 64, (1, 9))
    padded = torch.cat([short, torch.zeros(1, 7, dtype=torch.long)], 1)
    assert torch.allclose(clf(short, short != 0), clf(padded, padded != 0), atol=1e-5)  # right padding is invisible


def test_clm_loss_is_next_token_and_skips_padding():
    model = CausalLM(tiny(causal=True))
    ids = torch.randint(5, 64, (3, 12))
    ids[1, 8:] = 0
    loss, logits, targets = model.clm_loss(ids, ids != 0, pad_id=0)
    assert targets.numel() == 3 * 11 - 4 and torch.equal(targets[:11], ids[0, 1:])
    assert torch.isfinite(loss) and logits.shape == (targets.numel(), 64)


# ------------------------------------------------------------------------------------------------------- FLOPs


SHAPE = OmegaConf.create({"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 256})


def counted_flops(fn) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        fn().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("size,layers", [(0.25, None), (0.5, 1), (1.0, None)])
def test_electra_formula_matches_flop_counter(size, layers):
    vocab, b, t = 1024, 4, 64
    c = EncoderConfig(vocab_size=vocab, **SHAPE, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    model = ElectraForPretraining(c, size, layers, special_ids=SPECIAL)
    ids, special, attention, masked = batch(vocab, b, t)
    n_pred = int((masked.labels != -100).sum())
    n_cand = int((attention & ~special).sum())
    flops = counted_flops(lambda: rtd(model, ids, special, attention, masked).loss)
    obj = OmegaConf.create({"generator_size": size, "generator_layers": layers})
    predicted = electra_step_flops(SHAPE, obj, vocab, b, t, n_pred / (b * t), n_cand / (b * t))
    assert abs(predicted - flops) / flops < 1e-3, (predicted, flops)  # tight: the RTD head alone is ~2%


def test_clm_formula_matches_flop_counter():
    vocab, b, t = 2048, 4, 64
    model = CausalLM(EncoderConfig(vocab_size=vocab, **SHAPE, max_position_embeddings=64, causal=True, dropout=0.0,
                                   attention_dropout=0.0))
    ids = torch.randint(5, vocab, (b, t))
    ids[0, -8:] = 0
    flops = counted_flops(lambda: model.clm_loss(ids, ids != 0, 0)[0])
    predicted = clm_step_flops(SHAPE, vocab, b, t, float((ids[:, 1:] != 0).float().mean()))
    assert abs(predicted - flops) / flops < 1e-3, (predicted, flops)  # tight: the RTD head alone is ~2%


# ------------------------------------------------------------------------------------------------------- end to end

BUDGET = 2.5e10


@pytest.fixture(scope="module")
def budget_runs(tmp_path_factory, cache_dir):
    """The README's equal-compute command, short variant: one real Hydra multirun over the three objectives."""
    sweep = tmp_path_factory.mktemp("objectives")
    p = run_cli(["debug=fast", "objective=mlm,electra,clm", f"trainer.budget.flops={BUDGET}",
                 "trainer.val_check_interval=5", "callbacks.checkpoint=false", f"hydra.sweep.dir={sweep}", "-m"],
                cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = {}
    for path in sweep.rglob("results.json"):
        rec = json.loads(path.read_text())
        runs[rec["config"]["objective"]["name"]] = (rec["metrics"], rec, path.parent)
    assert sorted(runs) == ["clm", "electra", "mlm"]
    return runs


def test_budget_stops_each_objective_at_the_same_flops(budget_runs):
    steps = {}
    for obj, (m, rec, _) in budget_runs.items():
        b = rec["budget"]
        assert m["train/steps"] == b["steps"] >= 1
        assert BUDGET - b["flops_per_step"] < m["budget/flops"] == b["flops"] <= BUDGET, obj  # within one step
        steps[obj] = b["steps"]
    assert steps["electra"] < steps["mlm"] and steps["clm"] < steps["mlm"]  # costlier steps, fewer of them


def test_tiny_electra_run_end_to_end(budget_runs):
    m, rec, job = budget_runs["electra"]
    for k in ("gen_mlm_loss", "gen_acc", "disc_loss", "disc_acc", "disc_acc_replaced", "disc_acc_original",
              "replaced_frac", "selected_frac"):
        assert math.isfinite(m[f"train/{k}"]), k
    assert 0 < m["val/replaced_frac_r15"] < 0.2 and m["val/gen_mlm_loss_r15"] > 0 and m["val/disc_loss_r15"] > 0
    assert m["train/temperature"] == 1.0  # constant: objective.temperature_end is null
    assert m["train/special_selected"] == 0 and math.isfinite(m["downstream/score"])
    assert rec["config"]["mask"]["name"] == "electra" and rec["config"]["mask"]["replace"]["random"] == 0.0
    assert rec["model"]["generator"]["hidden_size"] == 16 and rec["model"]["generator_parameters"] > 0
    (w,) = wandb_run_dirs(job)
    info = read_wandb_offline(w)
    assert info["exit_code"] == 0 and info["run"]["job_type"] == "pretrain"
    assert info["config"]["objective"]["name"] == "electra"


def test_tiny_clm_run_end_to_end(budget_runs):
    m, rec, job = budget_runs["clm"]
    assert m["val/clm_loss"] > 0 and 0 <= m["val/clm_acc"] <= 1 and math.isfinite(m["downstream/score"])
    assert rec["model"]["causal"] is True and "mask.* is not used" in rec["masking"]["note"]
    assert not any(k.startswith("train/mlm") for k in m)
    (w,) = wandb_run_dirs(job)
    assert read_wandb_offline(w)["exit_code"] == 0


def test_electra_selects_its_mask_preset_unless_overridden(cfg_factory):
    assert cfg_factory("objective=electra").mask.name == "electra"
    c = cfg_factory("objective=electra", "mask=bert", "mask.rate=0.25")
    assert c.mask.name == "bert" and c.mask.rate == 0.25 and c.objective.disc_weight == 50.0
    assert cfg_factory("objective=mlm").mask.name == "bert"


def test_a_presets_mask_replacing_electras_is_an_error_before_any_work(cache_dir):
    """experiment=real_en* sets mask=wettig40 after objective=electra's mask=electra: a one-line error, not ELECTRA
    silently trained at 40% 80/10/10 (mask=... on the command line says which is meant)."""
    p = run_cli(["experiment=real_en_fast", "objective=electra", "paths.data_dir=/nonexistent"], cache_dir,
                full_error=False)
    assert p.returncode != 0
    assert "objective=electra with experiment=real_en_fast: the preset's mask=wettig40 replaces ELECTRA's; add " \
           "mask=electra" in p.stderr, p.stderr[-1500:]


BAD = [
    (["objective=electra", "objective.generator_size=0"], "objective.generator_size=0.0 must be in (0, 1]"),
    (["objective=electra", "objective.generator_size=1.5"], "objective.generator_size=1.5 must be in (0, 1]"),
    (["objective=electra", "objective.disc_weight=-1"], "objective.disc_weight=-1.0 must be >= 0"),
    (["objective=electra", "objective.temperature=0"], "objective.temperature=0.0 must be > 0"),
    (["objective=electra", "objective.sampling=argmax"], "allowed: gumbel, multinomial"),
    (["objective=electra", "objective.temperature_end=0"], "objective.temperature_end=0.0 must be > 0 or null"),
    (["objective=mlm", "objective.temperature_end=1"], "applies to objective=electra only"),
    (["objective=electra", "objective.generator_layers=0"], "objective.generator_layers=0 must be in [1, "),
    (["objective=electra", "objective.generator_layers=99"], "objective.generator_layers=99 must be in [1, "),
    (["objective=electra", "objective.generator_size=0.77"], "must be divisible by the heads"),
    (["objective=mlm", "objective.disc_weight=10"], "applies to objective=electra only"),
    (["objective=electra", "objective.generator_size=0.01"], "a head size of 1 < 8"),
    (["objective=clm", "downstream.finetune.pooling=cls"], "allowed: auto (= last), last, mean"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_objective_config_rejected(overrides, message, cfg_factory):
    with pytest.raises(ConfigError) as e:
        validate(cfg_factory(*overrides))
    assert message in str(e.value)


@pytest.mark.parametrize("obj", ["electra", "clm"])
def test_budget_smaller_than_one_step_rejected(obj, cfg_factory):
    with pytest.raises(ConfigError, match=f"smaller than one step of objective={obj}"):
        train(cfg_factory(f"objective={obj}", "trainer.budget.flops=1e6", "logger=none"))


# ------------------------------------------------------------------------------- ELECTRA learns (issue 42, item 2)

RTD_STEPS = 150  # built-in corpus, debug=fast's tiny model, temperature 1: both implementations are below the base
# rate's entropy from ~100 steps on (benchmarks/bench_electra_reference.py --quick, docs/objectives.md)


def _bernoulli_entropy(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def _rtd_run(cfg_factory, tmp_path, monkeypatch, cut: str | None) -> dict:
    """A tiny ELECTRA job on the built-in corpus at temperature 1; ``cut``: the discriminator's gradient is cut below
    its head ("encoder": the head learns on frozen random features) or entirely ("all": nothing learns to detect)."""
    from mlmlab.models.heads import RTDHead

    forward = RTDHead.forward
    if cut == "encoder":
        monkeypatch.setattr(RTDHead, "forward", lambda self, x: forward(self, x.detach()))
    elif cut == "all":
        monkeypatch.setattr(RTDHead, "forward", lambda self, x: forward(self, x).detach())
    cfg = cfg_factory("objective=electra", f"trainer.max_steps={RTD_STEPS}", "trainer.val_check_interval=1000",
                      "downstream.tasks=[]", "callbacks.checkpoint=false", output_dir=tmp_path / (cut or "whole"))
    m = train(cfg)
    base = m["val/replaced_frac_r15"]
    return {"bce": m["val/disc_loss_r15"], "entropy": _bernoulli_entropy(base), "base": base,
            "recall": m["val/disc_acc_replaced_r15"]}


@pytest.mark.parametrize("cut", [None, pytest.param("encoder", marks=pytest.mark.slow),
                                 pytest.param("all", marks=pytest.mark.slow)])
@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_discriminator_beats_the_base_rate_at_temperature_1(cut, cfg_factory, tmp_path, monkeypatch):
    """The discriminator's validation BCE on the generator's own (temperature-1) samples falls below the entropy of
    the base rate (what always answering "replaced with probability p" scores) and it finds some replaced tokens;
    with its gradient cut (rows "encoder", "all") the same criterion fails: the test can fail."""
    r = _rtd_run(cfg_factory, tmp_path, monkeypatch, cut)
    learns = r["bce"] < r["entropy"] - 0.005 and r["recall"] > 0.01
    assert learns == (cut is None), r


# ------------------------------------------------- the reference implementation (benchmarks/bench_electra_reference.py)

def _reference_bench():
    from pathlib import Path

    from mlmlab.report import load_bench_module

    return load_bench_module(Path(__file__).resolve().parents[1], "bench_electra_reference.py", "bench_electra_reference")


def test_reference_electra_shares_embeddings_as_the_paper():
    """transformers' generator reads the discriminator's embedding module (one object: token, position, type, their
    LayerNorm), its decoder is the word-embedding tensor, and a forward gives the same RTD fields as ours."""
    ref = _reference_bench()
    m = ref.HFElectra(tiny(), 0.25, None, 0)
    d, g = m.discriminator.electra, m.generator.electra
    assert g.embeddings is d.embeddings
    assert m.generator.generator_lm_head.weight is d.embeddings.word_embeddings.weight
    assert g.embeddings_project.in_features == 32 and g.embeddings_project.out_features == 8  # 1/4 width
    ids, special, attention, masked = batch()
    out = rtd(m, ids, special, attention, masked, disc_weight=50.0, temperature=1.0)
    assert out.disc_logits.shape == out.disc_targets.shape == (int((attention & ~special).sum()),)
    assert torch.equal(out.disc_targets.bool(), (out.corrupted_ids != ids)[attention & ~special])
    out.loss.backward()
    assert d.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_reference_bench_ours_is_the_job(tmp_path, cache_dir):
    """The bench's loop with mlmlab's model trains what the job trains: after 30 steps of debug=fast ELECTRA, its
    validation metrics equal the job's (same blocks, order, masks, samples, init, optimizer, clipping)."""
    ref = _reference_bench()
    cfg = ["debug=fast", "trainer.val_check_interval=1000", "downstream.tasks=[]", "callbacks.checkpoint=false"]
    p = run_cli(["objective=electra", "trainer.max_steps=30", f"hydra.run.dir={tmp_path / 'job'}", *cfg], cache_dir)
    assert p.returncode == 0, p.stderr[-2000:]
    job = json.loads((tmp_path / "job" / "results.json").read_text())["metrics"]
    args = ref.parse_args(["--impl", "ours", "--steps", "30", "--eval-every", "30", "--overrides", *cfg])
    last = ref.run(args)["curve"][-1]["val"]
    assert last["disc_loss"] == pytest.approx(job["val/disc_loss_r15"], abs=2e-3)
    assert last["gen_mlm_loss"] == pytest.approx(job["val/gen_mlm_loss_r15"], abs=2e-3)
    assert last["replaced_frac"] == pytest.approx(job["val/replaced_frac_r15"], abs=1e-3)
    hf = ref.run(ref.parse_args(["--impl", "hf", "--steps", "4", "--eval-every", "2", "--overrides", *cfg]))
    assert [c["step"] for c in hf["curve"]] == [0, 2, 4] and math.isfinite(hf["curve"][-1]["val"]["disc_loss"])
