"""sweeps/: every published-ablation sweep composes and expands to the jobs its file says; the W&B sweep YAMLs run the
same grid; launchers (joblib for real, SLURM composed), the optuna sweeper with in-memory storage, skip_completed,
and parallel jobs sharing one cache."""

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONF_DIR, ROOT, SHARED, TINY_SWEEP, run_cli
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep
from omegaconf import OmegaConf

from mlmlab.analysis import load_runs
from mlmlab.config import validate

SWEEPS = sorted((ROOT / "sweeps" / "sweep").glob("*.yaml"))
NAMES = [p.stem for p in SWEEPS]
PARSER = OverridesParser.create()


def compose_sweep(name: str, *overrides: str, hydra_cfg: bool = True):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[f"+sweep={name}", "paths.output_dir=/tmp/unused", *overrides],
                       return_hydra_config=hydra_cfg)


def sweep_params(cfg) -> dict:
    """{key: parsed sweep value} of hydra.sweeper.params, whitespace in the YAML's folded strings removed."""
    return {k: PARSER.parse_override(f"{k}={''.join(str(v).split())}").value()
            for k, v in cfg.hydra.sweeper.params.items()}


def test_the_published_ablations_are_all_there():
    assert set(NAMES) >= {"devlin_ratios", "wettig_rates", "ankner_schedules", "roberta_static", "mask_units",
                          "replacement_dist", "objectives", "optuna_schedule"}


@pytest.mark.parametrize("name", NAMES)
def test_sweep_file_expands_to_the_jobs_it_says(name):
    path = ROOT / "sweeps" / "sweep" / f"{name}.yaml"
    header = path.read_text()
    assert f"python -m mlmlab.train +sweep={name} -m" in header  # the one-liner is in the file ...
    assert f"python -m mlmlab.train +sweep={name} -m" in (ROOT / "docs" / "analysis.md").read_text()  # ... and the docs
    cfg = compose_sweep(name)
    assert cfg.skip_completed is True and cfg.hydra.sweep.dir == f"multirun/{name}"  # a rerun resumes the sweep
    assert cfg.logger.wandb.group == name
    params = sweep_params(cfg)
    if "optuna" in cfg.hydra.sweeper._target_.lower():
        assert cfg.hydra.sweeper.storage is None and cfg.hydra.sweeper.direction == "maximize"
        assert all(isinstance(v, (ChoiceSweep, IntervalSweep)) for v in params.values())
        return
    assert "seed" in params and len(params["seed"].list) >= 3  # seeds are part of every grid
    parsed = PARSER.parse_overrides([f"{k}={''.join(str(v).split())}" for k, v in cfg.hydra.sweeper.params.items()])
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    assert len(jobs) == math.prod(len(v.list) for v in params.values())
    m = re.search(r"= (\d+) jobs", header)
    assert m and int(m.group(1)) == len(jobs), "the header's job count is wrong"
    # every arm composes (and validates), and the keys it sweeps take the values the file lists
    seen = {k: set() for k in params}
    arms = set()
    for job in jobs:
        arm = tuple(o for o in job if not o.startswith("seed="))
        if arm in arms:  # the seed changes no key a job is validated on: one job per arm composes (a faster suite)
            seen["seed"].add(int(next(o for o in job if o.startswith("seed=")).split("=", 1)[1]))
            continue
        arms.add(arm)
        # these read ../shared/data: validated where it is present
        real = {"replacement_dist": "finance_corpus", "real_en_rates": "imdb", "real_en_fast_rates": "imdb", "real_en_drop_rates": "imdb",
                "real_en_drop_schedules": "imdb", "real_en_drop_keep": "imdb", "real_medical_drop_keep": "medical",
                "real_medical_drop_replacement": "medical",
                "real_en_electra": "imdb",
                "real_en_fast_electra": "imdb", "real_en_fast_electra_mlm": "imdb",
                "real_zh_units": "zh_corpus", "real_en_electra_curriculum": "imdb", "real_en_schedules": "imdb", "real_en_ratios": "imdb",
                "real_finance_ratios": "finance_corpus", "real_medical_ratios": "medical",
                "real_finance_replacement": "finance_corpus", "real_medical_replacement": "medical",
                "dapt_finance": "finance_corpus", "dapt_finance_ratios": "finance_corpus",
                "dapt_finance_replacement": "finance_corpus", "dapt_finance_selection": "finance_corpus",
                "dapt_finance_units": "finance_corpus", "dapt_medical": "medical"}.get(name)
        c = compose_sweep(name, *job, *([f"paths.data_dir={SHARED}"] if real else []), hydra_cfg=False)
        if not real or (SHARED / real).exists():
            validate(c)
        for k in params:
            key = k.replace("/", ".")
            node = OmegaConf.select(c, key)
            if OmegaConf.is_config(node):  # a group choice (mask=..., mask/sampler=...) or a dict value
                node = node.get("name", (node.get("_target_"), node.get("mix"))) if not k.endswith("replace") \
                    else tuple(node[x] for x in ("mask", "random", "keep"))  # a sampler: its class and mix
            seen[k].add(node)
    for k, v in params.items():
        assert len(seen[k]) == len(v.list), (k, seen[k])


@pytest.mark.parametrize("name", NAMES)
def test_wandb_sweep_runs_the_same_grid(name):
    w = yaml.safe_load((ROOT / "sweeps" / "wandb_sweeps" / f"{name}.yaml").read_text())
    assert "${args_no_hyphens}" in w["command"] and f"+sweep={name}" in w["command"]
    assert w["command"][:4] == ["${env}", "${interpreter}", "-m", "mlmlab.train"]
    params = sweep_params(compose_sweep(name))
    assert set(w["parameters"]) == set(params)
    for k, v in params.items():
        wp = w["parameters"][k]
        if isinstance(v, IntervalSweep):
            assert (wp["min"], wp["max"]) == (v.start, v.end)
            continue
        want = [str(x).replace(" ", "").replace("'", "") if isinstance(x, dict) else x for x in v.list]
        assert wp["values"] == want, k
    if w["method"] == "grid":  # the W&B grid holds as many runs as the Hydra sweep has jobs
        assert math.prod(len(p["values"]) for p in w["parameters"].values()) == \
            math.prod(len(v.list) for v in params.values())


def test_sweep_value_reaches_the_job_as_a_command_line_override():
    """W&B's agent calls `python -m mlmlab.train +sweep=<name> key=value ...`: the swept value must win over the file."""
    c = compose_sweep("devlin_ratios", "mask.replace={mask:0.0,random:0.8,keep:0.2}", "seed=2", hydra_cfg=False)
    assert (c.mask.replace.mask, c.mask.replace.random, c.mask.replace.keep, c.seed) == (0.0, 0.8, 0.2, 2)


def test_sweep_file_with_an_unknown_key_fails_before_any_job(tmp_path, cache_dir):
    d = tmp_path / "extra" / "sweep"
    d.mkdir(parents=True)
    (d / "bad_key.yaml").write_text("# @package _global_\nmask:\n  rat: 0.3\n")
    (d / "bad_param.yaml").write_text("# @package _global_\nhydra:\n  sweeper:\n    params:\n"
                                      "      mask.rat: 0.1,0.2\n      seed: 0,1\n")
    search = f"hydra.searchpath=[file://{tmp_path / 'extra'}]"
    for name, msg in (("bad_key", "rat"), ("bad_param", "mask.rat")):
        out = tmp_path / f"sweep_{name}"
        p = run_cli(["-m", f"+sweep={name}", search, "debug=fast", f"hydra.sweep.dir={out}"], cache_dir)
        assert p.returncode != 0 and msg in p.stderr, p.stderr[-2000:]
        assert "not in" in p.stderr or "Could not override" in p.stderr
        assert not list(out.rglob("results.json"))  # nothing ran


@pytest.mark.slow
def test_joblib_multirun_and_skip_completed(tiny_sweep, cache_dir):
    df = load_runs(tiny_sweep)
    assert sorted(zip(df["mask.rate"], df["seed"])) == [(0.15, 0), (0.15, 1), (0.4, 0), (0.4, 1)]
    assert (df["status"] == "ok").all()
    multirun = yaml.safe_load((tiny_sweep / "multirun.yaml").read_text())
    assert multirun["hydra"]["launcher"]["_target_"].endswith("JoblibLauncher")
    jobs = sorted(p for p in tiny_sweep.iterdir() if p.is_dir())
    # hydra/launcher=cores: 2 jobs at once, each with half the cores (trainer.threads=auto), none sharing a core
    assert {json.loads((j / "results.json").read_text())["machine"]["torch_threads"] for j in jobs} == \
        {max(1, os.cpu_count() // 2)}
    before = {j.name: json.loads((j / "results.json").read_text())["finished_at"] for j in jobs}

    # rerun in a copy: one job lost its record, one has a truncated record, one failed -> those three run again
    import shutil

    again = tiny_sweep.parent / "wettig_again"
    shutil.copytree(tiny_sweep, again)
    jobs_again = sorted(p for p in again.iterdir() if p.is_dir())
    (jobs_again[0] / "results.json").unlink()
    text = (jobs_again[1] / "results.json").read_text()
    (jobs_again[1] / "results.json").write_text(text[: len(text) // 2])
    r = json.loads((jobs_again[2] / "results.json").read_text())
    (jobs_again[2] / "results.json").write_text(json.dumps({**r, "status": "failed"}))
    p = run_cli([*TINY_SWEEP, f"hydra.sweep.dir={again}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    skipped = re.findall(r"skip_completed: (.*)/results.json is complete", p.stderr + p.stdout)
    assert [Path(s).name for s in skipped] == [jobs_again[3].name]
    after = {j.name: json.loads((j / "results.json").read_text()) for j in jobs_again}
    assert after[jobs_again[3].name]["finished_at"] == before[jobs[3].name]  # untouched
    for j in jobs_again[:3]:
        assert after[j.name]["status"] == "ok" and after[j.name]["finished_at"] != before[j.name]
    assert len(load_runs(again)) == 4


@pytest.mark.slow
def test_skip_completed_reruns_a_job_whose_config_changed(tmp_path, cache_dir):
    out = tmp_path / "job"
    args = ["debug=fast", "downstream.tasks=[builtin_sentiment]", "skip_completed=true", f"hydra.run.dir={out}"]
    assert run_cli(args, cache_dir).returncode == 0
    first = json.loads((out / "results.json").read_text())["finished_at"]
    p = run_cli([*args, "trainer.max_steps=10"], cache_dir)
    assert p.returncode == 0 and "different config (trainer.max_steps differ)" in p.stdout + p.stderr
    r = json.loads((out / "results.json").read_text())
    assert r["finished_at"] != first and r["config"]["trainer"]["max_steps"] == 10


@pytest.mark.slow  # in `pytest -m slow` (CI runs it): keeps the default suite under 6 minutes
def test_optuna_sweeper_with_in_memory_storage(tmp_path, cache_dir):
    out = tmp_path / "optuna"
    p = run_cli(["-m", "+sweep=optuna_schedule", "hydra.sweeper.n_trials=2", "debug=fast", "downstream.tasks=[builtin_sentiment]",
                 f"hydra.sweep.dir={out}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    best = yaml.safe_load((out / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"mask/schedule", "mask.rate"}
    df = load_runs(out)
    assert len(df) == 2 and df["mask.rate"].between(0.15, 0.5).all()


@pytest.mark.parametrize("launcher", ["submitit_slurm", "slurm"])
def test_slurm_launcher_composes(launcher):
    from hydra.utils import get_class

    c = compose_sweep("wettig_rates", f"hydra/launcher={launcher}", "hydra.launcher.partition=gpu")
    lc = c.hydra.launcher
    assert lc._target_.endswith("SlurmLauncher") and lc.partition == "gpu"
    assert get_class(lc._target_).__name__ == "SlurmLauncher"
    if launcher == "slurm":  # our preset: one task per GPU (Lightning DDP reads the SLURM env), a time limit
        assert lc.gpus_per_node == lc.tasks_per_node and lc.timeout_min > 0


@pytest.mark.slow
def test_parallel_jobs_build_one_cache(tmp_path):
    """Two jobs started together on an empty cache: the tokenizer, tokenized corpus, blocks and token counts are built
    once, and both jobs use them (file lock + atomic rename)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "MLMLAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "mlmlab.train", "debug=fast", "downstream=none",
                               "data.n_docs=3000", f"hydra.run.dir={tmp_path / f'job{i}'}"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    logs = ["".join(p.communicate(timeout=600)) for p in procs]  # Hydra logs to stdout
    assert all(p.returncode == 0 for p in procs), logs[0][-2000:] + logs[1][-2000:]
    built = [line for log in logs for line in log.splitlines() if "cache: built" in line]
    made = [re.search(r"cache: built (\w+)/(\w+)/", line).groups() for line in built]
    assert len(made) == len(set(made)), built  # each artefact once, whichever job won the lock
    # token_counts: the unigram plateau reference every MLM job records (results.json data.unigram_entropy)
    assert {k for k, _ in made} == {"tokenizer", "tokens", "blocks", "token_counts", "ngram_reference"}
    for kind in {k for k, _ in made}:
        assert sorted(p.name for p in (cache / kind).iterdir()) == sorted(h for k, h in made if k == kind)
    a, b = (json.loads((tmp_path / f"job{i}" / "results.json").read_text()) for i in range(2))
    assert a["metrics"]["val/mlm_loss_r15"] == pytest.approx(b["metrics"]["val/mlm_loss_r15"], abs=1e-6)


def test_every_combination_of_a_grid_is_distinct():
    for name in NAMES:
        cfg = compose_sweep(name)
        params = sweep_params(cfg)
        if all(isinstance(v, ChoiceSweep) for v in params.values()):
            combos = list(itertools.product(*[[str(x) for x in v.list] for v in params.values()]))
            assert len(combos) == len(set(combos)), name


@pytest.mark.slow
def test_submitit_launcher_runs_jobs(tmp_path, cache_dir):
    """submitit's local executor: the same launcher code path as SLURM (pickled job, submitit folder, results
    collected), without a cluster."""
    out = tmp_path / "submitit"
    p = run_cli(["-m", "debug=fast", "downstream=none", "seed=0,1", "hydra/launcher=submitit_local",
                 "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={out}"], cache_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    df = load_runs(out)
    assert sorted(df["seed"]) == [0, 1] and (df["status"] == "ok").all()
    assert list((out / ".submitit").iterdir())  # submitit's job folders: it really went through submitit
