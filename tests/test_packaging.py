"""Packaging: a built wheel runs. conf/ and sweeps/ live at the top of the repo; the wheel carries them inside the
package (mlmlab/conf and mlmlab/sweeps are links to them), so `pip install .` and `python -m mlmlab.train` work from
any directory -- without the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT


def _yaml_files(top: str) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in (ROOT / top).rglob("*.yaml")}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, a python of a fresh venv holding only that wheel, with the dependencies read from this venv's
    site-packages -- where mlmlab itself is an editable install, which a path entry does not activate)."""
    pytest.importorskip("setuptools", reason="the wheel is built offline with this venv's setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("mlmlab-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return wheel, py


def test_the_wheel_carries_every_config_and_sweep(fresh_venv):
    wheel, _ = fresh_venv
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"mlmlab/{f}" for f in _yaml_files("conf") | _yaml_files("sweeps")} <= names
    assert "mlmlab/tasks/blimp.yaml" in names


@pytest.mark.slow
def test_the_installed_wheel_trains_from_another_directory(fresh_venv, cache_dir, tmp_path):
    _, py = fresh_venv
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLMLAB_CACHE_DIR=str(cache_dir), WANDB_MODE="offline")
    where = subprocess.run([str(py), "-c", "import mlmlab, sys; print(mlmlab.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert str(py.parents[1]) in where and str(ROOT) not in where  # the wheel's copy, not the checkout
    out = tmp_path / "run"
    p = subprocess.run([str(py), "-m", "mlmlab.train", "debug=fast", "logger=none", "downstream=none",
                        "data.n_docs=200", "trainer.max_steps=2", f"hydra.run.dir={out}"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "results.json").exists()
    # a sweep file composes from the installed package too (hydra.searchpath -> mlmlab/sweeps)
    p = subprocess.run([str(py), "-m", "mlmlab.train", "+sweep=wettig_rates", "--cfg", "hydra", "-p",
                        "hydra.sweeper.params"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "mask.rate" in p.stdout, p.stderr[-3000:]
