"""Content-addressed cache: an artefact lives under ``<cache_dir>/<kind>/<hash of the config that made it>/``.

A whole sweep shares one tokenizer and one packed corpus because the hash only covers what produced them. Creation is
guarded by a file lock and published with an atomic rename, so parallel jobs (joblib launcher, DDP ranks) neither
duplicate the work nor read a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def config_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_file(cache_dir: str | Path, kind: str, key: dict, filename: str, build: Callable[[Path], None]) -> Path:
    """Return ``<cache_dir>/<kind>/<hash(key)>/<filename>``, calling ``build(tmp_path)`` once if it is missing."""
    d = Path(cache_dir).expanduser() / kind / config_hash(key)
    target = d / filename
    if target.exists():
        return target
    d.mkdir(parents=True, exist_ok=True)
    with FileLock(str(d / ".lock")):
        if not target.exists():
            tmp = d / f".{filename}.tmp{os.getpid()}"
            build(tmp)
            (d / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
            os.replace(tmp, target)
    return target
