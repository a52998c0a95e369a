"""The layering is a checked contract, not a hope: import-linter's contracts in pyproject.toml (no import cycles
between mlmlab's modules; masking/, models/, zeroshot and errors free of Lightning, Hydra, OmegaConf and W&B; the pure
layers never import the job layers; mlmlab.stats is numpy and scipy only)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


def test_import_contracts_hold():
    pytest.importorskip("importlinter")
    p = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken." in p.stdout


def test_config_error_lives_in_a_leaf_module():
    import mlmlab.config
    import mlmlab.errors

    assert mlmlab.config.ConfigError is mlmlab.errors.ConfigError


def test_ruff_finds_nothing():
    """The lint rules in pyproject.toml (notebooks included) hold for the whole tree, so a new finding fails here
    instead of piling up (two had sat in analysis/ notebooks unnoticed)."""
    pytest.importorskip("ruff")
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]


# The functions that take the whole composed config (a parameter named ``cfg``): the entry points (train, finetune)
# and the job frame, the validation and the conversions of the config (to_container, typed). The list only shrinks: a
# new function taking the whole config fails here.
WHOLE_CONFIG = {
    "config": {"check_known_keys", "validate_downstream", "validate", "validate_reliability", "to_container", "typed"},
    "finetune": {"prepare", "finetune", "_body", "main"},
    "job": {"completed_metrics", "set_job_threads", "_safe_container", "__init__", "wrapper"},
    "masking.masker": {"__init__", "from_config"},  # there ``cfg`` is the mask group (MaskConfig), not the job's
    "checks": {"check_job"},  # what only the command line shows, then validate
    "sweep": {"check_start"},  # a grid's job: its start checked as the job will check it
    "train": {"train", "_run", "main", "init_start"},  # init_start: adopts the start, validates again
}


def test_the_whole_config_reaches_only_the_listed_functions():
    """Below the entry points each stage takes the groups it uses (issue 41): an ``ast`` walk of mlmlab/ finds every
    function with a ``cfg`` parameter and compares it with WHOLE_CONFIG."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "mlmlab").rglob("*.py")):
        mod = ".".join(path.relative_to(ROOT / "mlmlab").with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "cfg" in [
                    a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]:
                found.setdefault(mod, set()).add(node.name)
    assert found == WHOLE_CONFIG
