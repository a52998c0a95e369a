"""Content-addressed cache: an artefact lives under ``<cache_dir>/<kind>/<hash of the config that made it>/``.

A whole sweep shares one tokenizer and one packed corpus because the hash only covers what produced them. Creation is
guarded by a file lock and published with an atomic rename, so parallel jobs (joblib launcher, DDP ranks) neither
duplicate the work nor read a half-written file. Every entry carries a content manifest (sha256 of its files),
checked when it is used: a corrupted entry is rebuilt with a warning, never used silently.
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


def plain(node) -> dict:
    """A config group as a plain dict, whether it is the composed node (DictConfig) or its typed owner (a dataclass):
    both give the same dict, so the cache keys made of it do not depend on which one a stage was handed."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dataclasses.asdict(node) if dataclasses.is_dataclass(node) else dict(node)


def config_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


MANIFEST = "content.json"
# entries up to this many bytes are fully re-hashed (sha256) each time they are used; larger ones get their sizes and
# a sample of their bytes checked (see README "Reliability" for the measured cost)
VERIFY_MAX_BYTES = 2 << 30
SAMPLE_BYTES = 1 << 20


def _files(target: Path) -> list[Path]:
    if target.is_file():
        return [target]
    return sorted(f for f in target.rglob("*") if f.is_file())


def _sha256(f: Path, sampled: bool) -> str:
    h = hashlib.sha256()
    size = f.stat().st_size
    with open(f, "rb") as fh:
        if not sampled or size <= 4 * SAMPLE_BYTES:
            for chunk in iter(lambda: fh.read(8 << 20), b""):
                h.update(chunk)
        else:  # four fixed 1 MiB windows: start, 1/3, 2/3, end
            for off in (0, size // 3, 2 * size // 3, size - SAMPLE_BYTES):
                fh.seek(off)
                h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()


def content_manifest(target: Path) -> dict:
    """Size, full sha256 and sampled sha256 of every file of a cache entry (a file or a folder), by relative path."""
    files = {}
    for f in _files(target):
        rel = "." if f == target else str(f.relative_to(target))
        files[rel] = {"size": f.stat().st_size, "sha256": _sha256(f, False), "sample_sha256": _sha256(f, True)}
    return {"version": 1, "files": files}


def verify_entry(target: Path, manifest: dict, max_bytes: int | None = None) -> str | None:
    """None if the entry matches its manifest, else what does not. Sizes always; then the full sha256 when the entry
    is at most ``max_bytes`` (env MLMLAB_CACHE_VERIFY_MAX_BYTES, default 2 GiB), else the sampled one."""
    if max_bytes is None:
        max_bytes = int(os.environ.get("MLMLAB_CACHE_VERIFY_MAX_BYTES", VERIFY_MAX_BYTES))
    files = manifest.get("files") or {}
    total = sum(v["size"] for v in files.values())
    sampled = total > max_bytes
    for rel, v in files.items():
        f = target if rel == "." else target / rel
        name = target.name if rel == "." else rel
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != v["size"]:
            return f"{name} has {f.stat().st_size} bytes, {v['size']} when built"
        if _sha256(f, sampled) != v["sample_sha256" if sampled else "sha256"]:
            return f"{name}: {'sampled ' if sampled else ''}sha256 differs from the one recorded when it was built"
    return None


def _read_manifest(d: Path) -> dict | None:
    try:
        return json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def cached_file(cache_dir: str | Path, kind: str, key: dict, filename: str, build: Callable[[Path], None]) -> Path:
    """Return ``<cache_dir>/<kind>/<hash(key)>/<filename>``, calling ``build(tmp_path)`` once if it is missing.

    A content manifest (``content.json``: size and sha256 of each file) is written with the entry and checked on every
    use; an entry that does not match it (a corrupted or truncated file) is rebuilt with a warning, never used. An
    entry from before manifests existed gets one recorded on first use (with a warning)."""
    d = Path(cache_dir).expanduser() / kind / config_hash(key)
    target = d / filename
    if target.exists():
        manifest = _read_manifest(d)
        if manifest is not None and verify_entry(target, manifest) is None:
            return target
    d.mkdir(parents=True, exist_ok=True)
    try:
        return _build_locked(d, kind, key, filename, build)
    except BaseException:  # a failed build (a corpus that is not UTF-8, say) leaves no empty entry or lock behind
        _drop_if_empty(d)
        raise


def _drop_if_empty(d: Path) -> None:
    """Remove an entry folder that holds nothing but its lock file (another job's build in progress keeps it: its
    temporary file is there)."""
    try:
        if {p.name for p in d.iterdir()} <= {".lock"}:
            (d / ".lock").unlink(missing_ok=True)
            d.rmdir()
    except OSError:
        pass


def _build_locked(d: Path, kind: str, key: dict, filename: str, build: Callable[[Path], None]) -> Path:
    target = d / filename
    with FileLock(str(d / ".lock")):
        if target.exists():  # again under the lock: another job may have rebuilt it meanwhile
            manifest = _read_manifest(d)
            if manifest is None:
                log.warning("cache: %s/%s/%s has no content hash (built before they were recorded); recording one",
                            kind, d.name, filename)
                _write_json(d / MANIFEST, content_manifest(target))
                return target
            bad = verify_entry(target, manifest)
            if bad is None:
                return target
            log.warning("cache: %s/%s/%s does not match its content hash (%s); rebuilding it", kind, d.name, filename,
                        bad)
            (d / MANIFEST).unlink(missing_ok=True)
            _remove(target)
        tmp = d / f".{filename}.tmp{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            build(tmp)
        except BaseException:  # a failed build leaves nothing behind (a half-written file or folder)
            _remove(tmp)
            raise
        (d / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
        _write_json(d / MANIFEST, content_manifest(tmp))  # before the entry appears under its name
        os.replace(tmp, target)
        log.info("cache: built %s/%s/%s (pid %d)", kind, d.name, filename, os.getpid())
    return target


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
