"""mlmlab's Hydra sweeper (``hydra/sweeper: basic`` or ``mlmlab``, the default): Hydra's basic sweeper (the
grid of the command line and of a ``+sweep=`` file's ``hydra.sweeper.params``) with three additions:

- a multirun never silently redoes finished work: each job runs with ``skip_completed=true`` unless the command line
  says ``skip_completed=false`` (which forces every job to run again);
- a sweep that declares ``analysis.sequential.max_seeds`` runs its pretraining seeds in rounds and stops when the
  question is settled (:mod:`mlmlab.rounds`), under the plan its folder's ``sequential.json`` declares (another one
  only with ``analysis.sequential.replan=true``);
- one multirun per sweep dir: the parent process holds ``<sweep dir>/.sweep.lock`` (:func:`mlmlab.locks.lock_sweep`).

Hydra loads sweepers only from the ``hydra_plugins`` namespace package; the logic lives in :mod:`mlmlab.rounds`."""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from mlmlab.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class MlmlabSweeperConf:
    _target_: str = "hydra_plugins.mlmlab_sweeper.mlmlab_sweeper.MlmlabSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


# Hydra's default sweeper (``basic``) is this one: every grid of `python -m mlmlab.train ... -m` gets it, while a sweep
# file can still choose another (``override /hydra/sweeper: optuna``), which an override in conf/train.yaml would block
# (Hydra keeps the first override of a group, and the primary config's comes first). This module imports
# basic_sweeper above, so Hydra's own node is stored before, and replaced by, this one.
for _name in ("basic", "mlmlab"):
    ConfigStore.instance().store(group="hydra/sweeper", name=_name, node=MlmlabSweeperConf, provider="mlmlab")


def split_grid(overrides) -> tuple[list[str], dict[str, list[str]]]:
    """Parsed overrides -> (fixed ``key=value`` overrides, swept key -> its values in order)."""
    fixed, swept = [], {}
    for o in overrides:
        key = o.get_key_element()
        if o.is_sweep_override():
            swept[key] = list(o.sweep_string_iterator())
        else:
            fixed.append(f"{key}={o.get_value_element_as_str()}")
    return fixed, swept


def question(config):
    """The sweep's declared question (``analysis``), None when it declares no sequential rule."""
    from mlmlab.stats import Question

    a = config.get("analysis")
    if a is None or a.get("sequential") is None or a.sequential.get("max_seeds") is None:
        return None
    return Question(**OmegaConf.to_container(a, resolve=True))


def grid_overrides(config, arguments: list[str], config_loader=None):
    """The grid's parsed overrides as the basic sweeper reads them: a ``+sweep=`` file's ``hydra.sweeper.params``,
    then the command line's."""
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    return OverridesParser.create(config_loader=config_loader).parse_overrides([*params, *arguments])


def sequential_plan(config, arguments: list[str], config_loader=None):
    """The :class:`mlmlab.rounds.Plan` of a multirun whose config declares ``analysis.sequential`` (None otherwise)."""
    from mlmlab import rounds

    q = question(config)
    if q is None:
        return None
    return rounds.plan(*split_grid(grid_overrides(config, arguments, config_loader)), q)


def _output_dir(ret) -> Path:
    raw = OmegaConf.to_container(ret.cfg.paths, resolve=False).get("output_dir")
    if isinstance(raw, str) and raw.startswith("${hydra:"):
        return Path(ret.hydra_cfg.hydra.runtime.output_dir)
    return Path(str(OmegaConf.select(ret.cfg, "paths.output_dir")))


class MlmlabSweeper(BasicSweeper):
    def _forced(self) -> bool:
        """``skip_completed=...`` given on the command line: the user's word, not the sweeper's default."""
        return any(o.split("=", 1)[0].lstrip("+") == "skip_completed" for o in self.config.hydra.overrides.task)

    def _with_skip(self, jobs):
        """``skip_completed=true`` on every job of a ``mlmlab.train`` multirun (a config without the key, e.g.
        ``mlmlab.finetune``'s, is left as it is), unless the command line set it."""
        if "skip_completed" not in self.config or self._forced():
            return [list(j) for j in jobs]
        return [[*j, "skip_completed=true"] for j in jobs]

    def sweep(self, arguments: list[str]) -> Any:
        from mlmlab import rounds
        from mlmlab.locks import lock_sweep

        lock_sweep(Path(self.config.hydra.sweep.dir))  # one multirun per sweep dir (a no-op where the callback took it)
        p = sequential_plan(self.config, arguments, self.hydra_context.config_loader)
        if p is None:
            launch = self.launcher.launch
            self.launcher.launch = lambda batch, initial_job_idx: launch(self._with_skip(batch), initial_job_idx)
            return super().sweep(arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        try:  # the folder's declared plan (its sequential.json) is the plan: another one only with replan=true
            replans = rounds.check_plan(sweep_dir, p)
        except ConfigError as e:
            import sys

            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns = []

        def launch(batch, first):
            results = self.launcher.launch(self._with_skip(batch), initial_job_idx=first)
            for r in results:
                _ = r.return_value  # a failed job: its exception, as the basic sweeper raises it
            returns.append(results)
            return [_output_dir(r) for r in results]

        log.info("sequential sweep: %d arms, seeds %s in rounds (looks at %s seeds), decided on %s", len(p.arms),
                 p.seeds, list(p.looks), p.question.primary)
        rounds.run(p, launch, sweep_dir, log=log.info, replans=replans)
        return returns
