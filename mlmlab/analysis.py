"""Load runs into pandas: from local job dirs (``results.json``) or from an offline W&B run's transaction log.

``load_runs(root)`` gives one row per job with flattened ``config.*`` columns and every metric, so a sweep becomes
``df.groupby("config.mask.rate")["downstream/score"].agg(["mean", "std"])``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of (crc32, length, type) framed records
_HEADER = 7  # ":W&B" + magic (2 bytes) + version (1 byte)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_runs(root: str | Path, include_failed: bool = False) -> pd.DataFrame:
    """One row per ``results.json`` found under ``root`` (a job dir, a sweep dir, or a folder of them)."""
    rows = []
    for path in sorted(Path(root).rglob("results.json")):
        r = json.loads(path.read_text())
        if r.get("status") != "ok" and not include_failed:
            continue
        row = {"run_dir": str(path.parent), "status": r.get("status"), "overrides": " ".join(r.get("overrides", []))}
        row.update(_flatten(r.get("config", {}), "config."))
        row.update(r.get("metrics", {}))
        row.update({f"timings.{k}": v for k, v in r.get("timings_s", {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _records(path: Path):
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, buf = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0 and length == 0:  # zero padding to the end of a block
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            buf = chunk
        elif kind == _MIDDLE:
            buf += chunk
        elif kind == _LAST:
            yield buf + chunk
            buf = b""


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def read_wandb_offline(run_dir: str | Path) -> dict:
    """Config, summary, history rows and exit code of an offline W&B run dir (``.../wandb/offline-run-*``), read from
    its ``run-*.wandb`` log -- the same file ``wandb sync`` uploads."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("run-*.wandb")
    out: dict = {"config": {}, "summary": {}, "history": [], "exit_code": None, "run": {}}
    for raw in _records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "config":  # later config updates wrap each value as {"value": ..., "desc": ...}
            for it in rec.config.update:
                v = json.loads(it.value_json)
                out["config"][_key(it)] = v["value"] if isinstance(v, dict) and "value" in v else v
        elif kind == "summary":
            for it in rec.summary.update:
                out["summary"][_key(it)] = json.loads(it.value_json)
        elif kind == "history":
            out["history"].append({_key(it): json.loads(it.value_json) for it in rec.history.item})
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
        elif kind == "run":  # the config given to wandb.init travels inside the run record
            for it in rec.run.config.update:
                out["config"][_key(it)] = json.loads(it.value_json)
            out["run"] = {"id": rec.run.run_id, "project": rec.run.project, "group": rec.run.run_group,
                          "job_type": rec.run.job_type, "name": rec.run.display_name}
    return out


def wandb_run_dirs(job_dir: str | Path) -> list[Path]:
    return sorted(Path(job_dir).glob("wandb/offline-run-*"))
