"""mlmlab: masking ablations for masked language models.

The public API (what tests, notebooks and scripts import; loaded on first use, so ``import mlmlab`` stays light)::

    from mlmlab import pretrain_job, finetune_job        # one job from a composed config (python -m mlmlab.train / .finetune)
    from mlmlab import compose, typed                     # a job's config as the CLI composes it; typed: as dataclasses
    from mlmlab import load_runs, aggregate, question     # a sweep's records -> tables -> verdicts over pretraining seeds
    from mlmlab import build_recipe, build_module, Job    # the pieces: masking recipe, pretraining module, job frame

(``mlmlab.train`` and ``mlmlab.finetune`` are the CLI modules, so their job functions are exported under other names.)
"""

from __future__ import annotations

from importlib import import_module

_API = {
    "pretrain_job": ("mlmlab.train", "train"),
    "finetune_job": ("mlmlab.finetune", "finetune"),
    "load_runs": ("mlmlab.analysis", "load_runs"),
    "aggregate": ("mlmlab.analysis", "aggregate"),
    "question": ("mlmlab.analysis", "question"),
    "plan": ("mlmlab.analysis", "plan"),
    "build_recipe": ("mlmlab.build", "build_recipe"),
    "build_module": ("mlmlab.build", "build_module"),
    "Job": ("mlmlab.job", "Job"),
    "typed": ("mlmlab.config", "typed"),
    "random_init_baseline": ("mlmlab.baseline", "random_init_baseline"),
    "unigram_reference": ("mlmlab.baseline", "unigram_reference"),
}

__all__ = [*_API, "compose"]


def compose(*overrides: str, config: str = "train", hydra: bool = False):
    """The config ``python -m mlmlab.<config>`` would run with these overrides (``hydra=True``: with its ``hydra``
    node), composed from the package's conf/ outside any Hydra app."""
    from pathlib import Path

    from hydra import compose as _compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import mlmlab.config  # noqa: F401  (registers the schema and the resolvers)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "conf"), version_base="1.3"):
        return _compose(config, overrides=list(overrides), return_hydra_config=hydra)


def __getattr__(name: str):
    if name in _API:
        module, attr = _API[name]
        value = getattr(import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mlmlab' has no attribute {name!r}")
