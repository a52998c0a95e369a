"""Per-item predictions: every evaluation writes them (predictions/<arm>.json), and mlmlab.analysis pairs two runs or
two arms on the same items (paired bootstrap CI, McNemar, minimal detectable difference)."""

from __future__ import annotations

import json

import pytest
from scipy.stats import binomtest

from mlmlab import pretrain_job as train
from mlmlab.analysis import compare_items, load_predictions
from mlmlab.analysis import main as analysis_main


def test_compare_items_against_scipy_on_a_known_table():
    truth = [1] * 20
    a = {"t": {"split": "test", "truth": truth, "seeds": {"0": [1] * 18 + [0] * 2, "1": [1] * 20}}}
    b = {"t": {"split": "test", "truth": truth, "seeds": {"0": [1] * 10 + [0] * 10, "1": [1] * 20}}}
    row = compare_items(a, b).loc[("t", "finetune")]
    assert row["a"] == pytest.approx(0.95) and row["b"] == pytest.approx(0.75)
    assert row["diff"] == pytest.approx(0.2) and row["ci_low"] <= 0.2 <= row["ci_high"] and row["ci_low"] > 0
    # seed 0: 8 items right only in a, none only in b; seed 1: no discordant items
    assert row["mcnemar_p"] == f"{binomtest(8, 8, 0.5).pvalue:.3g}, 1"
    assert row["n_items"] == 20 and row["runs_paired"] == 2 and row["mdd"] > 0
    z = compare_items({"bl": {"items": "11-0"}}, {"bl": {"items": "0110"}}).loc[("bl", "zeroshot")]
    assert z["n_items"] == 3 and z["diff"] == pytest.approx(1 / 3)  # the tie (item 2) dropped from both sides
    with pytest.raises(ValueError, match="different items"):
        compare_items(a, {"t": {**b["t"], "truth": [0] * 20}})


def test_a_job_writes_per_item_predictions_that_pair_its_two_arms(cfg_factory, tmp_path, capsys):
    out = tmp_path / "run"
    m = train(cfg_factory("downstream.tasks=[builtin_sentiment]", "downstream.protocol=both",
                          "downstream.random_init_baseline=true", "logger=none", output_dir=out))
    pre, rnd = load_predictions(out), load_predictions(f"{out}:random_init")
    p = pre["builtin_sentiment"]
    assert p["split"] == "test" and len(p["truth"]) >= 32 and set(p["seeds"]) == {"0"}
    acc0 = sum(x == t for x, t in zip(p["seeds"]["0"], p["truth"])) / len(p["truth"])
    assert acc0 == pytest.approx(m["downstream/builtin_sentiment/seed_0/acc"])
    assert sum(x == t for x, t in zip(p["probe"], p["truth"])) / len(p["truth"]) == pytest.approx(m["probe/builtin_sentiment/acc"])
    t = compare_items(pre, rnd)
    assert t.loc[("builtin_sentiment", "finetune"), "diff"] == pytest.approx(m["gain/builtin_sentiment/acc"])
    assert "predictions" not in json.loads((out / "results.json").read_text())["downstream"]["builtin_sentiment"]
    assert analysis_main([str(out), f"items_vs={out}:random_init"]) == 0
    assert "per-item comparison" in capsys.readouterr().out
