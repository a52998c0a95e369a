"""Every ``datasets.load_dataset`` that may reach the Hugging Face hub goes through :func:`load_dataset` here.

Two things the libraries do badly inside a job:

- **Unreachable hub:** ``huggingface_hub`` retries each request 5 times with backoff (~25 s per file) before
  ``datasets`` falls back to its local cache or fails. Here a 3-second TCP connect to the hub endpoint (``HF_ENDPOINT``)
  is tried once per process; when it fails, the call runs in the libraries' offline mode: a data set already in the
  local cache (``HF_DATASETS_CACHE``) loads at once, anything else fails at once, and the error says the hub was
  unreachable. ``HF_HUB_OFFLINE=1`` skips the probe (offline from the start).
- **Every warning twice:** ``datasets`` and ``huggingface_hub`` each attach their own console handler to their root
  logger and also propagate to the root logger, which a Hydra job has configured (console + the job's log file).
  During the call their own handlers are detached, so each record is printed once, by the job's handlers.

The offline switch sets the two libraries' module-level flags (``huggingface_hub.constants.HF_HUB_OFFLINE``, read by
``is_offline_mode()``, and ``datasets.config.HF_HUB_OFFLINE``) for the call and restores them after: there is no
per-call offline argument in datasets 5.x.
"""

from __future__ import annotations

import logging
import os
import socket
from contextlib import contextmanager
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0
_LIBRARY_LOGGERS = ("huggingface_hub", "datasets")
_probe: dict[str, str | None] = {}  # endpoint -> None (reachable) or why not, once per process


def hub_problem(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the hub endpoint accepts a TCP connection, else a short reason (cached per process)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = constants.ENDPOINT
    if endpoint not in _probe:
        url = urlparse(endpoint)
        host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                _probe[endpoint] = None
        except OSError as e:
            _probe[endpoint] = f"cannot connect to {host}:{port} ({e.strerror or type(e).__name__})"
    return _probe[endpoint]


@contextmanager
def _offline(on: bool):
    if not on:
        yield
        return
    import datasets.config
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


@contextmanager
def _records_printed_once():
    """Detach the libraries' own console handlers while the root logger has handlers of its own (a Hydra job)."""
    if not logging.getLogger().handlers:
        yield
        return
    detached = [(lg, h) for lg in map(logging.getLogger, _LIBRARY_LOGGERS) for h in list(lg.handlers)
                if type(h) is logging.StreamHandler]
    for lg, h in detached:
        lg.removeHandler(h)
    try:
        yield
    finally:
        for lg, h in detached:
            lg.addHandler(h)


class HubUnreachable(ConnectionError):
    """The hub did not answer and the data set is not in the local cache."""


def load_dataset(path: str, name: str | None = None, **kw):
    """``datasets.load_dataset(path, name, **kw)``, offline at once when the hub is unreachable (module docstring).
    Raises :class:`HubUnreachable` (naming the reason) when that is why it failed."""
    import datasets

    with _records_printed_once():
        problem = None if os.path.exists(path) else hub_problem()  # a local folder or script needs no hub
        with _offline(problem is not None):
            try:
                return datasets.load_dataset(path, name, **kw)
            except Exception as e:
                if problem is None:
                    raise
                raise HubUnreachable(f"the hub is unreachable ({problem}) and {path}"
                                     f"{'/' + name if name else ''} is not in the local datasets cache "
                                     f"({type(e).__name__})") from e
