"""Helpers shared by the benchmark scripts: machine and version records, the JSON result file, a compact table."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def machine() -> dict[str, object]:
    """Where the numbers came from: platform, processor, cores, torch threads, GPU name (None without one)."""
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def cpu_label(kind: str | None = None) -> str:
    """A short name for ``mlmlab.hardware.cpu_kind()`` (or the ``kind`` string a result file recorded) as it bears on
    matmul speed: the best bf16 instruction set, then the product line -- "AMX Xeon", "avx512_bf16 EPYC", "avx2 EPYC"."""
    if kind is None:
        from mlmlab.hardware import cpu_kind

        kind = cpu_kind()
    parts = kind.split(" | ")
    if len(parts) != 3:  # not Linux: cpu_kind is "<system>-<machine>-<processor>"
        return kind
    vendor, model, isa = parts[0], parts[1], set(parts[2].split())
    best = next((name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "avx512_bf16"), ("avx512f", "avx512"),
                                         ("avx2", "avx2")) if flag in isa), "no avx2")
    line = next((w for w in ("Xeon", "EPYC", "Ryzen", "Core") if w in model), None)
    line = line or {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(vendor, vendor or model or "CPU")
    return f"{best} {line}"


def git_commit(root: Path = REPO_ROOT) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_dirty(root: Path = REPO_ROOT) -> bool | None:
    try:
        return subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return None


def versions(packages: tuple[str, ...] = ("torch", "transformers")) -> dict[str, object]:
    """python, the given packages (None when not installed) and the git commit of the checkout."""
    out: dict[str, object] = {"python": platform.python_version()}
    for p in packages:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    out["git_commit"] = git_commit()
    out["git_dirty"] = git_dirty()
    return out


def write_result(name: str, payload: dict, out: str | Path | None = None) -> Path:
    """Write ``payload`` (plus a timestamp) to ``out`` or ``benchmarks/results/<name>.json``; returns the path."""
    path = Path(out) if out is not None else RESULTS_DIR / f"{name}.json"
    if path.suffix != ".json":  # a directory was given
        path = path / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": name, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **payload}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns``: (key, header, format spec); a missing or None value prints as '-'."""
    def cell(row, key, fmt):
        v = row.get(key)
        return "-" if v is None else format(v, fmt)

    cells = [[cell(r, k, f) for k, _, f in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(columns)]
    lines = ["  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
