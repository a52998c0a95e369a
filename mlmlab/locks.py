"""One live process per sweep folder and per job folder: an OS lock (``fcntl.flock``) on a file in the folder.

A leaf module (stdlib and :mod:`mlmlab.errors` only), so the sweeper, the sweep callback and the job record can all
take it without importing each other."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlmlab.errors import ConfigError

# Two identical multiruns into one sweep dir (or two runs into one job dir) would both run every job: each step logged
# twice, two W&B runs per job. An OS lock (flock) on a file in the folder says who holds it; the kernel drops it when
# the process exits or is killed, so a crash leaves no stale lock (a pid file would). Not ``filelock``: its lock file
# cannot say who holds it, and the refusal names the other process. On NFS, Linux maps flock onto the server's locks.

SWEEP_LOCK = ".sweep.lock"  # <sweep dir>/.sweep.lock: the multirun's parent process, for its lifetime
JOB_LOCK = ".job.lock"  # <job dir>/.job.lock: the job (rank 0), while it runs; another name than the sweep's, so a
#                         launcher's worker processes never wait on their parent's lock
_locks: dict[str, int] = {}  # lock file -> its open descriptor, while this process holds it


class FolderBusy(ConfigError):
    """A sweep or job folder is in use by another live process (named in the message)."""


def lock_folder(folder: Path, name: str, what: str) -> bool:
    """Take the lock ``<folder>/<name>`` for this process (non-blocking) and write who holds it (pid, host, start time)
    into the lock file. Returns False when this process already holds it (nothing to release then), True when taken;
    :class:`FolderBusy` naming the other process (pid, host) when another live process holds it."""
    import fcntl
    import socket
    import time

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = str((folder / name).resolve())
    if path in _locks:
        return False
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = json.loads(Path(path).read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        os.close(fd)
        who = (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started_at', '?')}"
               if holder else "a process that has not written its name yet")
        raise FolderBusy(f"{folder} is in use by another {what} ({who}); wait for it to end (or stop it), or write "
                         f"into another folder") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
    _locks[path] = fd
    return True


def unlock_folder(folder: Path, name: str) -> None:
    """Release this process's lock ``<folder>/<name>`` (the file stays: removing it would race a waiting process)."""
    fd = _locks.pop(str((Path(folder) / name).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor releases the flock


def lock_sweep(sweep_dir: Path) -> None:
    """Hold ``<sweep dir>/.sweep.lock`` for the rest of this (the multirun's parent) process; another multirun into
    the same dir: one line naming the process that holds it, exit code 2, before any job."""
    try:
        lock_folder(sweep_dir, SWEEP_LOCK, "multirun")
    except FolderBusy as e:
        import sys

        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
