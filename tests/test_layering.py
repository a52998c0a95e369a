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
