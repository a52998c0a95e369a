"""The run record: one JSON per job (``results.json`` in the job's output dir), also pushed to the W&B summary."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

PACKAGES = ("mlmlab", "torch", "pytorch-lightning", "hydra-core", "omegaconf", "wandb", "datasets", "tokenizers",
            "torchmetrics", "numpy", "pandas")
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def git_info(root: Path = PROJECT_ROOT) -> dict[str, object] | None:
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip() != ""
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict[str, object]:
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


class RunRecord:
    """Collects metrics and timings of one job and writes them atomically to ``<output_dir>/results.json``."""

    def __init__(self, output_dir: Path, config: dict, overrides: list[str] | None = None):
        self.output_dir = Path(output_dir)
        self.data: dict = {
            "status": "running", "config": config, "overrides": overrides or [], "metrics": {}, "timings_s": {},
            "versions": versions(), "git": git_info(), "machine": machine(), "argv": sys.argv,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self._t0 = time.perf_counter()
        self.filename = "results.json"  # a DDP rank > 0 writes results.rank<N>.json: results.json is rank 0's

    def timer(self, name: str):
        record = self

        class _T:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                record.data["timings_s"][name] = round(time.perf_counter() - self.t, 3)

        return _T()

    def set(self, **kv) -> None:
        self.data.update(kv)

    def fail(self, exc: BaseException) -> None:
        self.data["status"] = "failed"
        self.data["error"] = {"type": type(exc).__name__, "message": str(exc),
                              "traceback": traceback.format_exception(exc)}

    def write(self) -> Path:
        self.data["timings_s"]["total"] = round(time.perf_counter() - self._t0, 3)
        self.data["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / self.filename
        if self.data["status"] != "ok" and _completed(path):
            path = self.output_dir / "results.failed.json"  # never overwrite a finished run with a failure
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(dumps(self.data, indent=2, default=str))
        os.replace(tmp, path)
        return path


def finite(obj):
    """``obj`` with every NaN / inf float (also numpy's) replaced by None, recursively through dicts, lists and tuples:
    strict JSON has no NaN, so a record says null where a value is missing (the readers take null as missing)."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, float) or type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and obj.dtype.kind == "f" \
            and obj.ndim == 0:
        return float(obj) if math.isfinite(obj) else None
    return obj


def dumps(obj, **kw) -> str:
    """Strict JSON of a record (``results.json``, ``summary.json``, ``sequential.json``): non-finite floats as null
    (:func:`finite`), and ``allow_nan=False`` so one that slips through (through ``default=``) fails loudly."""
    return json.dumps(finite(obj), allow_nan=False, **kw)


def _completed(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("status") == "ok"
    except (OSError, ValueError):
        return False


def load_results(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
