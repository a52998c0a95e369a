"""Hub access inside a job: an unreachable hub fails (or falls back to the cache) at once, and each library warning
is printed once (mlmlab/data/hub.py)."""

import logging

import datasets
import datasets.config
import pytest
from huggingface_hub import constants

from mlmlab.config import ConfigError
from mlmlab.data import hub
from mlmlab.data.tasks import TASKS, _hub_split


@pytest.fixture
def unreachable(monkeypatch):
    monkeypatch.setattr(hub, "hub_problem", lambda timeout=hub.PROBE_TIMEOUT_S: "cannot connect (test)")


def test_unreachable_hub_runs_offline_and_says_why(unreachable, monkeypatch):
    seen = {}

    def fake_load(path, name=None, **kw):  # what datasets would see: offline mode on, no retries
        seen["offline"] = (constants.is_offline_mode(), datasets.config.HF_HUB_OFFLINE)
        raise ConnectionError("offline mode is enabled")

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    before = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    with pytest.raises(hub.HubUnreachable, match=r"unreachable \(cannot connect \(test\)\) and nyu-mll/glue/sst2 is "
                                                 r"not in the local datasets cache"):
        hub.load_dataset("nyu-mll/glue", "sst2", split="train")
    assert seen["offline"] == (True, True)
    assert (constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE) == before  # restored


def test_unreachable_hub_still_serves_the_local_cache(unreachable, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name=None, **kw: ["cached rows"])
    assert hub.load_dataset("nyu-mll/glue", "sst2", split="train") == ["cached rows"]


def test_a_task_from_an_unreachable_hub_is_a_config_error_naming_the_task(unreachable, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **kw: (_ for _ in ()).throw(ConnectionError("offline mode is enabled")))
    with pytest.raises(ConfigError, match=r"task sst2: could not load nyu-mll/glue/sst2 .*the hub is unreachable"):
        _hub_split(TASKS["sst2"], "train")


def test_library_warnings_print_once_under_a_configured_root_logger(unreachable, monkeypatch):
    root, lib = logging.getLogger(), logging.getLogger("huggingface_hub")
    own = logging.StreamHandler()  # what huggingface_hub attaches to its own root logger at import
    lib.addHandler(own)
    job = logging.StreamHandler()  # what Hydra attaches to the root logger
    root.addHandler(job)
    seen = {}

    def fake_load(path, name=None, **kw):
        seen["handlers"] = list(lib.handlers)
        return []

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    try:
        hub.load_dataset("nyu-mll/glue", "sst2", split="train")
        assert own not in seen["handlers"]  # records reach the console once, through the job's handler
        assert own in lib.handlers  # and the library's handler is back afterwards
    finally:
        lib.removeHandler(own)
        root.removeHandler(job)


def test_a_local_folder_does_not_probe_the_hub(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "hub_problem", lambda timeout=0: pytest.fail("probed the hub for a local folder"))
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name=None, **kw: "local")
    assert hub.load_dataset(str(tmp_path), None, split="train") == "local"
