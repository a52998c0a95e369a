"""Shared fixtures: compose configs with Hydra's compose API into tmp dirs; one tokenizer/corpus cache per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import mlmlab.config  # noqa: F401  (registers the schema)

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
ROOT = Path(__file__).resolve().parents[1]
# ../shared/data (or $MLMLAB_DATA_DIR): real data sets; tests that need them skip with a reason when absent
SHARED = Path(os.environ.get("MLMLAB_DATA_DIR") or ROOT.parent / "shared" / "data")

def pytest_configure(config):
    """Under pytest-xdist (``-n auto``, the default), each worker and the jobs it starts get an equal share of the cores
    (1 thread each on a 2-core machine): workers that all took every core would slow each other 2-20x here."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        from mlmlab.hardware import apply_threads

        apply_threads(max(1, (os.cpu_count() or 1) // int(workers)))


# what makes a test end-to-end: it runs a real job (in process or through the CLI) or uses a fixture that ran one
_E2E_CALLS = ("run_cli(", "train(", "finetune(", "pretrain_job(", "finetune_job(", "subprocess.run(")
_E2E_FIXTURES = {"tiny_sweep"}


def _runs_a_job(src: str) -> bool:
    return any(c in src for c in _E2E_CALLS)


def _source(obj) -> str:
    import inspect

    obj = getattr(obj, "__wrapped__", None) or getattr(obj, "_fixture_function", None) or obj
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def pytest_collection_modifyitems(config, items):
    """The ``e2e`` marker, on every test that runs a real job -- from its source, the helpers of its module it calls
    and the fixtures it uses -- so ``pytest -m "not e2e"`` is the unit tests alone and ``-m e2e`` the end-to-end ones;
    ``slow`` marks the longest of those."""
    import inspect

    helpers: dict[str, set[str]] = {}  # module -> names of its functions and fixtures that run a job
    for item in items:
        mod = getattr(item, "module", None)
        if mod is None:
            continue
        if mod.__name__ not in helpers:
            names = set()
            for name, obj in vars(mod).items():
                if (inspect.isfunction(obj) or hasattr(obj, "_fixture_function") or hasattr(obj, "__wrapped__")) \
                        and not name.startswith("test_") and _runs_a_job(_source(obj)):
                    names.add(name)
            helpers[mod.__name__] = names | _E2E_FIXTURES
        src = _source(getattr(item, "function", None))
        own = helpers[mod.__name__]
        if _runs_a_job(src) or any(f"{h}(" in src for h in own) or own & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


# Fast, offline, quiet defaults for every test job (tiny model, few steps, small built-in corpus).
FAST = ["debug=fast"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mlmlab_cache")
    os.environ["MLMLAB_CACHE_DIR"] = str(d)
    return d


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")


def make_cfg(overrides: list[str], output_dir: Path, cache: Path):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(
            config_name="train",
            overrides=[f"paths.output_dir={output_dir}", f"paths.cache_dir={cache}", *overrides],
        )


def blocks_of(cfg, report: dict | None = None):
    """``mlmlab.data.corpus.get_blocks`` of a composed config: its data, tokenizer and cache."""
    from mlmlab.data.corpus import get_blocks

    return get_blocks(cfg.data, cfg.tokenizer, cfg.paths.cache_dir, report)


def prepared(cfg):
    """Stage 1 of a pretraining job (``mlmlab.pretraining.prepare_data``) for a composed config."""
    from mlmlab.downstream import Protocol
    from mlmlab.pretraining import prepare_data

    return prepare_data(Protocol.of(cfg.paths, cfg.data, cfg.downstream), cfg.data, cfg.tokenizer, cfg.paths,
                        cfg.eval.per_source)


@pytest.fixture
def bf16_host(monkeypatch):
    """The host counts as having native CPU bf16, for tests about a preset or a setting rather than the host (CI may
    run on a CPU without it; the host check itself: test_budget_recipe)."""
    import mlmlab.hardware as hw

    monkeypatch.setattr(hw, "cpu_bf16_supported", lambda: True)


@pytest.fixture
def cfg_factory(tmp_path, cache_dir):
    def factory(*overrides: str, output_dir: Path | None = None):
        return make_cfg([*FAST, *overrides], output_dir or tmp_path / "run", cache_dir)

    return factory


def run_cli(args: list[str], cache: Path, timeout: int = 600, module: str = "mlmlab.train",
            full_error: bool = True) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` in a subprocess, offline, with the session's cache (``full_error``: Hydra's
    tracebacks, ``HYDRA_FULL_ERROR=1``; False: what a user sees)."""
    env = {**os.environ, "MLMLAB_CACHE_DIR": str(cache), "WANDB_MODE": "offline",
           "HYDRA_FULL_ERROR": "1" if full_error else "0"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# the shared test sweep: 2 rates x 2 seeds, with 2 label budgets and probe curves (the notebook's panels)
TINY_SWEEP = ["-m", "+sweep=wettig_rates", "mask.rate=0.15,0.4", "mask=bert", "seed=0,1", "debug=fast",
              "downstream.max_train_examples=[16,32]", "eval.zeroshot_every_n_steps=10"]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, cache_dir, worker_id) -> Path:
    """A real 2 rates x 2 seeds multirun of the wettig_rates sweep on the built-in corpus, through the core-splitting
    joblib launcher preset (2 parallel jobs), with 2 label budgets and probe curves every 10 steps; shared by the sweep,
    analysis and notebook tests -- and by the xdist workers of one run: the first to need it runs it (under a file
    lock), the others read it (tests copy it before changing anything)."""
    from filelock import FileLock

    root = tmp_path_factory.mktemp("tiny_sweep") if worker_id == "master" else \
        tmp_path_factory.getbasetemp().parent / "tiny_sweep"  # the run's base dir: one per pytest run
    root.mkdir(exist_ok=True)
    sweep, done = root / "wettig", root / "done"
    with FileLock(str(root / ".lock")):
        if not done.exists():
            p = run_cli([*TINY_SWEEP, "hydra/launcher=cores", f"hydra.sweep.dir={sweep}"], cache_dir)  # joblib, 2
            # jobs x cores/2 threads each
            assert p.returncode == 0, p.stderr[-3000:]
            done.write_text("ok")
    return sweep
