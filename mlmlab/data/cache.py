"""Content-addressed cache: an artefact lives under ``<cache_dir>/<kind>/<hash of the config that made it>/``.

A whole sweep shares one tokenizer and one packed corpus because the hash only covers what produced them. Creation is
guarded by a file lock and published with an atomic rename, so parallel jobs (joblib launcher, DDP ranks) neither
duplicate the work nor read a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

log = logging.getLogger(__name__)


def config_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


def cached_file(cache_dir: str | Path, kind: str, key: dict, filename: str, build: Callable[[Path], None]) -> Path:
    """Return ``<cache_dir>/<kind>/<hash(key)>/<filename>``, calling ``build(tmp_path)`` once if it is missing."""
    d = Path(cache_dir).expanduser() / kind / config_hash(key)
    target = d / filename
    if target.exists():
        return target
    d.mkdir(parents=True, exist_ok=True)
    with FileLock(str(d / ".lock")):
        if not target.exists():
            tmp = d / f".{filename}.tmp{os.getpid()}.{uuid.uuid4().hex[:8]}"
            try:
                build(tmp)
            except BaseException:  # a failed build leaves nothing behind (a half-written file or folder)
                _remove(tmp)
                raise
            (d / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
            os.replace(tmp, target)
            log.info("cache: built %s/%s/%s (pid %d)", kind, d.name, filename, os.getpid())
    return target
