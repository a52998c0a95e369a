"""Issue 54, items 1 and 4: analysis refuses to pair runs made under different protocols (naming the keys, unless
ignored), accepts keys that define the arm, and names the finished runs that lack a declared metric (a question whose
primary is missing in one is not decided)."""

import json

import pytest

from mlmlab import analysis as A


def write(root, arm: str, seed: int, score, *, seeds=(0, 1, 2), extra: dict | None = None, status="ok"):
    d = root / f"{arm}_s{seed}"
    d.mkdir(parents=True)
    cfg = {"seed": seed, "mask": {"rate": 0.4 if arm == "hi" else 0.15, "name": f"mask_{arm}"},
           "downstream": {"seeds": list(seeds), "max_train_examples": 1000},
           "paths": {"output_dir": str(d)}, "trainer": {"threads": 1 + seed}}  # where/how a job ran: never matters
    for k, v in (extra or {}).items():
        node = cfg
        *head, last = k.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = v
    metrics = {} if score is None else {"downstream/score": score, "val/mlm_loss_r15": 3.0 - score}
    (d / "results.json").write_text(json.dumps({"status": status, "config": cfg, "metrics": metrics}))


def sweep(root, hi_seeds=(0, 1, 2), **kw):
    for s in range(4):
        write(root, "lo", s, 0.50 + 0.01 * s)
        write(root, "hi", s, 0.52 + 0.012 * s, seeds=hi_seeds, **kw)
    return root


def test_arms_with_different_downstream_seeds_are_refused_naming_the_key(tmp_path, capsys):
    df = A.load_runs(sweep(tmp_path, hi_seeds=(0, 1)))
    with pytest.raises(ValueError, match=r"different protocols: downstream.seeds differs across arms "
                                         r"\(mask.rate=0.15: \(0, 1, 2\), mask.rate=0.4: \(0, 1\)\)"):
        A.question(df, "mask.rate", 0.15, ["downstream/score"])
    with pytest.raises(ValueError, match="downstream.seeds"):
        A.compare(df, by="mask.rate", baseline=0.15)
    assert A.main([str(tmp_path), "by=mask.rate", "baseline=0.15"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "downstream.seeds" in err and err.count("\n") == 1
    # declared irrelevant: accepted, by the API and the CLI
    t = A.question(df, "mask.rate", 0.15, ["downstream/score"], ignore=["downstream.seeds"])
    assert int(t["n"].iloc[0]) == 4
    assert A.compare(df, by="mask.rate", baseline=0.15, ignore=["downstream"]).loc[0.4, "n"] == 4
    assert A.main([str(tmp_path), "by=mask.rate", "baseline=0.15", "ignore=[downstream.seeds]"]) == 0


def test_a_key_varying_within_an_arm_is_refused(tmp_path):
    sweep(tmp_path)
    # one seed of the 40% arm fine-tuned on 250 labels: not a function of the arm (and any key, not only protocol)
    res = tmp_path / "hi_s3" / "results.json"
    rec = json.loads(res.read_text())
    rec["config"]["trainer"]["precision"] = "bf16-mixed"
    res.write_text(json.dumps(rec))
    df = A.load_runs(tmp_path)
    with pytest.raises(ValueError, match=r"trainer.precision varies within an arm \(mask.rate=0.15: <unset>, "
                                         r"mask.rate=0.4: <unset> \| bf16-mixed\)"):
        A.question(df, "mask.rate", 0.15, ["downstream/score"])
    assert len(A.question(df, "mask.rate", 0.15, ["downstream/score"], ignore=["trainer.precision"]))


def test_keys_that_define_the_arm_do_not_trip_it(tmp_path):
    # mask.name differs with the arm (what a sampler's parameters do under by=mask.sampler._target_), a non-protocol
    # trainer key is constant within each arm, and where each job ran differs per run: all accepted
    df = A.load_runs(sweep(tmp_path, extra={"trainer.precision": "32"}))
    t = A.question(df, "mask.rate", 0.15, ["downstream/score"])
    assert int(t["n"].iloc[0]) == 4
    # the axis's own keys (a dict-valued by: its parts) and a protocol key beside the axis (objective.* under
    # by=objective.name) are the arm's definition
    write(tmp_path / "obj", "lo", 0, 0.5, extra={"objective.name": "mlm", "objective.temperature": None})
    write(tmp_path / "obj", "lo", 1, 0.6, extra={"objective.name": "mlm", "objective.temperature": None})
    for s, v in ((0, 0.55), (1, 0.66)):
        d = tmp_path / "obj"
        write(d / "e", "lo", s, v, extra={"objective.name": "electra", "objective.temperature": 1.0})
    obj = A.load_runs(tmp_path / "obj")
    assert len(A.question(obj, "objective.name", "mlm", ["downstream/score"])) == 1
    # beside them, a protocol key differing with the arm is refused, and only it is named: not the arm's own keys
    df2 = A.load_runs(sweep(tmp_path / "budget", extra={"trainer.precision": "32",
                                                        "downstream.max_train_examples": 250}))
    with pytest.raises(ValueError, match="different protocols") as e:
        A.question(df2, "mask.rate", 0.15, ["downstream/score"])
    said = str(e.value)
    assert "downstream.max_train_examples differs across arms (mask.rate=0.15: 1000, mask.rate=0.4: 250)" in said
    assert not any(k in said for k in ("mask.name", "trainer.precision", "paths.", "trainer.threads", "seed="))


def test_a_missing_primary_in_a_finished_run_is_named_and_not_decided(tmp_path, capsys):
    root = sweep(tmp_path / "sweep")
    res = root / "hi_s2" / "results.json"
    rec = json.loads(res.read_text())
    del rec["metrics"]["downstream/score"]  # finished (ok), but without the primary: n 4 -> 3, unnamed before
    res.write_text(json.dumps(rec))
    write(root, "hi", 9, None, status="failed")  # not ok: load_runs leaves it out, as before
    df = A.load_runs(root)
    from mlmlab.stats import Question

    q = Question(primary="downstream/score", family=["val/mlm_loss_r15"])
    t = A.question(df, "mask.rate", 0.15, ["downstream/score", "val/mlm_loss_r15"], q)
    assert t.attrs["missing"] == {"downstream/score": [str(root / "hi_s2")]}
    prim = t[t["metric"] == "downstream/score"]
    assert list(prim["verdict"]) == ["not decided: 1 run(s) lack downstream/score"]
    assert int(prim["n"].iloc[0]) == 3
    fam = t[t["metric"] == "val/mlm_loss_r15"]
    assert not fam["verdict"].iloc[0].startswith("not decided") and int(fam["n"].iloc[0]) == 4
    from mlmlab.verdicts import readjust

    assert readjust([t], q)[0]["verdict"].iloc[0].startswith("not decided")  # survives the report's readjustment
    rc = A.main([str(root), "by=mask.rate", "baseline=0.15", "metric=[downstream/score,val/mlm_loss_r15]",
                 "primary=downstream/score", "family=[val/mlm_loss_r15]"])
    out, err = capsys.readouterr()
    assert rc == 0 and "warning: 1 finished run(s) lack downstream/score" in err and "hi_s2" in err
    assert "not decided: 1 run(s) lack downstream/score" in out
    # a record beside it that has the metric (its fine-tuning job's record) is not a missing run
    write(tmp_path / "ft", "hi", 2, 0.55)
    ft = tmp_path / "ft" / "hi_s2" / "results.json"
    rec = json.loads(ft.read_text())
    del rec["metrics"]["val/mlm_loss_r15"]  # the fine-tuning job records only its downstream metrics
    ft.write_text(json.dumps(rec))
    both = A.load_runs([root, tmp_path / "ft"])
    t2 = A.question(both, "mask.rate", 0.15, ["downstream/score", "val/mlm_loss_r15"], q)
    assert t2.attrs["missing"] == {} and not t2["verdict"].iloc[0].startswith("not decided")


@pytest.mark.parametrize("args,message", [
    (["effect=0"], "effect=0.0 must be a difference > 0"),
    (["effect=-0.01"], "effect=-0.01 must be a difference > 0"),
    (["effect=1"], r"effect=1 is on the wrong scale: downstream/score lies in \[0, 1\]"),
])
def test_plan_refuses_an_effect_it_cannot_plan_for(tmp_path, capsys, args, message):
    """Issue 54, item 8: an effect of 0, below 0, or on the wrong scale for a [0, 1] metric is a one-line error."""
    import re

    rc = A.main(["plan", str(sweep(tmp_path)), "by=mask.rate", "baseline=0.15", *args])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(message, err) and len(err.strip().splitlines()) == 1


def test_plan_refuses_a_one_seed_pilot(tmp_path, capsys):
    """Issue 54, item 8: a pilot with one pretraining seed per arm has no sd over seeds: refused, not 'sd 0, None'."""
    write(tmp_path, "lo", 0, 0.50)
    write(tmp_path, "hi", 0, 0.52)
    rc = A.main(["plan", str(tmp_path), "by=mask.rate", "baseline=0.15", "effect=0.01"])
    err = capsys.readouterr().err
    assert rc == 2 and "the pilot pairs 1 pretraining seed(s) (seed) of mask.rate=0.4 with mask.rate=0.15" in err
    assert rc == 2 and "a plan needs >= 2" in err
    assert A.main(["plan", str(sweep(tmp_path / "ok")), "by=mask.rate", "baseline=0.15", "effect=0.01"]) == 0


def test_analysis_while_a_sweep_runs_names_running_jobs_and_compares_nothing_yet(tmp_path, capsys):
    """Issue 54 item 15: a live job is "running", not "failed"; with only the baseline arm finished the analysis says
    there is nothing to compare yet (it crashed with KeyError: 'metric')."""
    for s in range(3):
        write(tmp_path, "lo", s, 0.50 + 0.01 * s)
        write(tmp_path, "hi", s, None, status="running")
    rc = A.main([str(tmp_path), "by=mask.rate", "baseline=0.15"])
    cap = capsys.readouterr()
    assert rc == 2 and "3 running run(s), left out: hi_s0, hi_s1, hi_s2" in cap.out and "failed" not in cap.out
    assert "error: no finished run of an arm besides the baseline mask.rate=0.15 yet (3 finished, 3 running)" in cap.err
