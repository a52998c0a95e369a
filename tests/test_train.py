"""End-to-end jobs through ``train(cfg)``: results.json, the offline W&B run, fixed eval masks, the baseline row."""

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from mlmlab import pretrain_job as train
from mlmlab.analysis import load_runs, read_wandb_offline, wandb_run_dirs
from mlmlab.data.corpus import get_blocks
from mlmlab.data.tokenizer import MASK, SPECIAL_TOKENS
from mlmlab.masking import mask_once
from mlmlab.masking.replacement import SamplerContext, UniformSampler


@pytest.fixture(scope="module")
def job(tmp_path_factory, cache_dir):
    from conftest import FAST, make_cfg

    out = tmp_path_factory.mktemp("job")
    cfg = make_cfg([*FAST, "logger.wandb.group=e2e"], out, cache_dir)
    return out, cfg, train(cfg)


def test_results_json(job):
    out, cfg, metrics = job
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "ok"
    assert r["config"]["mask"]["rate"] == cfg.mask.rate and r["config"]["model"]["name"] == "tiny"
    assert "hydra" not in r["config"] and r["config"]["paths"]["output_dir"] == str(out)
    for k in ("train/mlm_loss", "val/mlm_loss_r15", "val/mlm_acc_r15", "downstream/score",
              "downstream/builtin_sentiment/acc", "downstream/builtin_sentiment/acc_std",
              "downstream/builtin_topic/seed_0/acc", "train/selected_frac", "train/special_selected"):
        assert k in r["metrics"], k
    assert r["metrics"] == pytest.approx(metrics)
    assert r["metrics"]["train/special_selected"] == 0
    assert 0 < r["metrics"]["val/mlm_loss_r15"] < 10
    assert {"data", "pretrain", "eval", "finetune", "total"} <= set(r["timings_s"])
    assert r["versions"]["torch"] and r["versions"]["pytorch-lightning"]
    assert (out / "checkpoints" / "last.ckpt").exists()
    df = load_runs(out)
    assert len(df) == 1 and df.loc[0, "mask.rate"] == cfg.mask.rate


def test_offline_wandb_run_is_complete_and_readable(job):
    out, cfg, metrics = job
    (run_dir,) = wandb_run_dirs(out)
    w = read_wandb_offline(run_dir)
    assert w["exit_code"] == 0
    assert w["run"]["group"] == "e2e" and w["run"]["job_type"] == "pretrain"
    # the whole resolved config, not a subset
    assert set(w["config"]) >= {"data", "tokenizer", "model", "mask", "eval", "objective", "optim", "trainer",
                                "downstream", "seed"}
    assert w["config"]["mask"]["rate"] == cfg.mask.rate
    curve = [h["train/mlm_loss"] for h in w["history"] if "train/mlm_loss" in h]
    assert len(curve) >= cfg.trainer.max_steps // cfg.trainer.log_every_n_steps - 1
    assert any("val/mlm_loss_r15" in h for h in w["history"])
    assert w["summary"]["downstream/score"] == pytest.approx(metrics["downstream/score"])


def test_eval_masks_do_not_depend_on_training_mask(cfg_factory):
    a, b = cfg_factory("mask.rate=0.1"), cfg_factory("mask.rate=0.4", "mask.replace.mask=1", "mask.replace.random=0",
                                                     "mask.replace.keep=0", "seed=3")
    masks = []
    for cfg in (a, b):
        tok, blocks = get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir)
        v = blocks["validation"]
        e = cfg.eval
        m = mask_once(v["input_ids"], v["special_tokens_mask"], e.rate, MASK,
                      (e.replace.mask, e.replace.random, e.replace.keep),
                      UniformSampler(SamplerContext(tok.get_vocab_size(), tuple(range(len(SPECIAL_TOKENS))))), e.seed)
        masks.append(m)
    assert torch.equal(masks[0].input_ids, masks[1].input_ids) and torch.equal(masks[0].labels, masks[1].labels)


def test_eval_units_score_whole_word_masks_at_the_end(cfg_factory, tmp_path):
    """eval.units=[token,word]: the token-level fixed-mask loss as before, plus val/mlm_loss_r15w on whole-word masks of
    the same validation blocks (scored once, at the end); a resume may add units (evaluation only)."""
    from mlmlab.checkpoint import RESUME_FREE, config_diff

    base = ("logger=none", "downstream=none", "callbacks.checkpoint=false")
    one = train(cfg_factory(*base, output_dir=tmp_path / "token"))
    both = train(cfg_factory(*base, "eval.units=[token,word]", output_dir=tmp_path / "both"))
    assert both["val/mlm_loss_r15"] == one["val/mlm_loss_r15"] and both["train/mlm_loss"] == one["train/mlm_loss"]
    assert "val/mlm_loss_r15w" in both and "val/mlm_acc_r15w" in both and "val/mlm_loss_r15w" not in one
    assert both["val/mlm_loss_r15w"] != both["val/mlm_loss_r15"]
    assert {"val/mlm_loss_at_mask_r15w", "val/mlm_loss_at_random_r15w", "val/mlm_loss_at_keep_r15w"} <= set(both)
    before = OmegaConf.to_container(cfg_factory(*base))
    assert config_diff(before, OmegaConf.to_container(cfg_factory(*base, "eval.units=[token,word]")), RESUME_FREE) == []


def test_fixed_mask_loss_split_by_what_the_masks_showed(cfg_factory, tmp_path):
    """val/mlm_loss_at_{mask,random,keep}_r15: the fixed-mask loss at the positions the masks showed as [MASK], a random
    token or the original; their mean weighted by each kind's count is the loss itself. A kind the eval masks do not
    use has no loss (not a NaN)."""
    from conftest import prepared

    from mlmlab import build_recipe
    from mlmlab.data.tokenizer import MASK
    from mlmlab.pretraining import build_masking_plan

    base = ("logger=none", "downstream=none", "callbacks.checkpoint=false")
    cfg = cfg_factory(*base, output_dir=tmp_path / "a")
    m = train(cfg)
    data = prepared(cfg)
    fixed = build_masking_plan(build_recipe(cfg.mask, data.ctx, data.train_blocks), cfg.eval, data).fixed
    sel = fixed.labels != -100
    shown, target = fixed.input_ids[sel], fixed.labels[sel]
    counts = {"mask": int((shown == MASK).sum()), "keep": int((shown == target).sum())}
    counts["random"] = int(sel.sum()) - counts["mask"] - counts["keep"]
    assert min(counts.values()) > 0
    pooled = sum(m[f"val/mlm_loss_at_{k}_r15"] * n for k, n in counts.items()) / sum(counts.values())
    assert pooled == pytest.approx(m["val/mlm_loss_r15"], rel=1e-4)
    only = train(cfg_factory(*base, "eval.replace.mask=1.0", "eval.replace.random=0.0", "eval.replace.keep=0.0",
                             output_dir=tmp_path / "b"))
    assert only["val/mlm_loss_at_mask_r15"] == pytest.approx(only["val/mlm_loss_r15"], rel=1e-6)
    assert "val/mlm_loss_at_random_r15" not in only and "val/mlm_loss_at_keep_r15" not in only


def test_objective_none_skips_pretraining_and_same_val_set(cfg_factory, tmp_path, job):
    _, _, pretrained = job
    cfg = cfg_factory("objective=none", "logger=none", output_dir=tmp_path / "none")
    metrics = train(cfg)
    r = json.loads((tmp_path / "none" / "results.json").read_text())
    assert "pretrain" not in r["timings_s"] and "train/mlm_loss" not in metrics
    assert not (tmp_path / "none" / "wandb").exists()
    # same fixed eval set: random init sits near log(vocab), the pretrained run below it
    assert metrics["val/mlm_loss_r15"] > pretrained["val/mlm_loss_r15"]
    assert set(k for k in metrics if k.startswith("downstream/")) == set(
        k for k in pretrained if k.startswith("downstream/"))


def test_same_seed_same_run(cfg_factory, tmp_path):
    runs = [train(cfg_factory("logger=none", "downstream=none", "callbacks.checkpoint=false",
                              output_dir=tmp_path / f"r{i}")) for i in range(2)]
    assert runs[0]["train/mlm_loss"] == runs[1]["train/mlm_loss"]
    assert runs[0]["val/mlm_loss_r15"] == runs[1]["val/mlm_loss_r15"]


def test_one_wandb_run_per_finetuning(cache_dir, tmp_path):
    """downstream.wandb_runs=true: each (task, lr, seed) fine-tuning is its own offline W&B run, job_type=finetune, in
    the pretraining run's group, with its loss curve, per-epoch selection score and final scores."""
    from conftest import FAST, make_cfg

    out = tmp_path / "job"
    cfg = make_cfg([*FAST, "logger.wandb.group=ftg", "downstream.wandb_runs=true", "downstream.tasks=[builtin_sentiment]",
                    "downstream.seeds=[0,1]", "downstream.finetune.lr=[1e-4,1e-3]", "downstream.finetune.epochs=2",
                    "downstream.finetune.early_stopping_patience=1", "callbacks.checkpoint=false"], out, cache_dir)
    metrics = train(cfg)
    runs = [read_wandb_offline(d) for d in wandb_run_dirs(out)]
    assert all(r["exit_code"] == 0 for r in runs)
    assert sorted(r["run"]["job_type"] for r in runs) == ["finetune"] * 4 + ["pretrain"]
    assert {r["run"]["group"] for r in runs} == {"ftg"}
    ft = [r for r in runs if r["run"]["job_type"] == "finetune"]
    assert sorted((r["config"]["finetune_run"]["lr"], r["config"]["finetune_run"]["seed"]) for r in ft) == [
        (1e-4, 0), (1e-4, 1), (1e-3, 0), (1e-3, 1)]
    for r in ft:
        assert any("finetune/loss" in h for h in r["history"])
        assert len([h for h in r["history"] if "finetune/selection_acc" in h]) >= 1
    rec = json.loads((out / "results.json").read_text())["downstream"]["builtin_sentiment"]
    best = rec["best_lr"]
    for r in ft:  # each run's summary is the score results.json has for that (lr, seed)
        lr, seed = r["config"]["finetune_run"]["lr"], r["config"]["finetune_run"]["seed"]
        assert r["summary"]["test/acc"] == pytest.approx(rec["grid"][str(lr)][str(seed)]["test"]["acc"])
        if lr == best:
            assert r["summary"]["test/acc"] == pytest.approx(metrics[f"downstream/builtin_sentiment/seed_{seed}/acc"])


def test_realized_corruption_in_results_is_the_run_mean(cfg_factory, tmp_path):
    from mlmlab.analysis import load_history

    out = tmp_path / "run"
    m = train(cfg_factory("downstream=none", "trainer.max_steps=12", "trainer.log_every_n_steps=1", output_dir=out))
    h = load_history(out, ["train/selected_frac"]).dropna(subset=["train/selected_frac"])
    assert len(h) == 12
    assert m["train/selected_frac"] == pytest.approx(h["train/selected_frac"].mean(), abs=1e-6)
    assert m["train/selected_frac_last"] == pytest.approx(h.sort_values("step")["train/selected_frac"].iloc[-1])
    speed = json.loads((out / "results.json").read_text())["throughput"]  # the job's own step speed (bench_e2e)
    assert speed["steps_timed"] == 12 - 3 - 1  # 9 steps after 3 warm-up ones, less the interval over step 10's validation
    assert speed["tokens_per_step"] == 16 * 64 and speed["tokens_per_s"] == pytest.approx(
        speed["tokens_per_step"] / speed["step_s_median"])
    assert 0 < speed["busy_s_median"] <= speed["step_s_median"] * 1.5
    rec = json.loads((out / "results.json").read_text())
    curve, live = rec["val_curve"], [json.loads(x) for x in (out / "val_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [r["step"] for r in live] == [10, 12]  # each validation pass, then the end
    row, end = curve
    assert row["tokens"] == 10 * 16 * 64 and 0 < row["train_s"] < end["train_s"] < rec["timings_s"]["pretrain"]
    assert row["val/mlm_loss_r15"] == pytest.approx(live[0]["val/mlm_loss_r15"]) and math.isfinite(row["val/mlm_loss_r15"])
    assert end["final"] and end["val/mlm_loss_r15"] == pytest.approx(rec["metrics"]["val/mlm_loss_r15"])


def test_progress_bars_show_pretraining_steps_and_each_fine_tuning(cfg_factory, tmp_path, capsys):
    train(cfg_factory("trainer.enable_progress_bar=true", "downstream.tasks=[builtin_sentiment]", "logger=none",
                      "downstream.finetune.epochs=2", output_dir=tmp_path / "run"))
    cap = capsys.readouterr()
    text = cap.out + cap.err  # tqdm writes where Lightning points it
    assert "pretraining: 100%" in text and "20/20" in text and "Epoch 0/-" not in text
    assert "builtin_sentiment lr 0.0003 seed 0 (run 1/1): epoch 2/2" in text
