"""One argument style for every ``python -m mlmlab.<entry point>``: ``key=value`` (mlmlab/cli.py for the tools,
Hydra for train and finetune), with the same errors: the key named, the allowed ones listed, exit status 2."""

import pytest

from mlmlab import analysis, dashboard, drill, export
from mlmlab.cli import BOOL, Opt, UsageError, parse

OPTS = {"source": Opt("where", required=True), "by": Opt("columns", many=True), "n": Opt("count", 3, int),
        "kind": Opt("which", "a", choices=("a", "b")), "flag": Opt("on/off", False, BOOL)}


def test_values_lists_defaults_and_a_leading_bare_value():
    a = parse(["runs/x", "by=[mask.rate, mask.unit]", "n=5", "flag=true"], OPTS, "prog", positional="source")
    assert (a.source, a.by, a.n, a.kind, a.flag) == ("runs/x", ["mask.rate", "mask.unit"], 5, "a", True)
    a = parse(["source=runs/y", "by=mask.rate"], OPTS, "prog", positional="source")
    assert (a.source, a.by, a.n) == ("runs/y", ["mask.rate"], 3)


@pytest.mark.parametrize("argv, message", [
    (["runs/x", "colour=red"], "unknown key 'colour'; allowed: source, by, n, kind, flag"),
    (["runs/x", "n=many"], "n=many: 'many' is not a valid int"),
    (["runs/x", "kind=c"], "kind='c' is not known; allowed: a, b"),
    (["runs/x", "flag=maybe"], "flag=maybe"),
    (["runs/x", "n=1", "n=2"], "n is given twice"),
    (["runs/x", "by=[]"], "by=[]: the list is empty"),
    (["runs/x", "n=[1,2]"], "n=[1,2]: one value expected"),
    (["by=mask.rate"], "source required"),
    (["runs/x", "stray"], "argument 'stray' is not key=value"),
])
def test_bad_arguments_name_the_key(argv, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(argv, OPTS, "prog", positional="source")


@pytest.mark.parametrize("main, argv", [
    (analysis.main, ["runs/x", "bye=mask.rate"]),
    (export.main, ["checkpoint=x.ckpt", "out=o", "outt=p"]),
    (dashboard.main, ["group=g", "colour=red"]),
    (drill.main, ["verify", "mb=1"]),
])
def test_every_tool_rejects_an_unknown_key_the_same_way(main, argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    bad = argv[-1].split("=")[0]
    assert f"unknown key '{bad}'; allowed:" in err and "Traceback" not in err


def test_help_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as e:
        analysis.main(["help"])
    assert e.value.code == 0 and "label_budget=" in capsys.readouterr().out


def test_a_job_folder_whose_name_holds_an_equals_sign_is_the_source(tmp_path):
    """Issue 54 item 15: every multirun job folder's name holds "=": an existing path is the positional argument; a
    path-like key that does not exist gets a hint to use source=."""
    job = tmp_path / "multirun" / "mask.rate=0.15,seed=0"
    job.mkdir(parents=True)
    assert parse([str(job), "n=2"], OPTS, "prog", positional="source").source == str(job)
    with pytest.raises(UsageError, match=r"unknown key '.*/gone/mask.rate' \(a path\? '.*' does not exist; give it as "
                                         r"source=<path>\)"):
        parse([str(tmp_path / "gone" / "mask.rate=0.15")], OPTS, "prog", positional="source")


def test_finetune_names_task_and_an_unset_data_dir(tmp_path, cache_dir, monkeypatch):
    """Issue 54 item 15: mlmlab.finetune task=<bad> names task= (not downstream.tasks[0]); a task that needs local
    files, with no data dir set and the hub unreachable, says MLMLAB_DATA_DIR is unset."""
    from mlmlab.config import ConfigError
    from mlmlab.data.tasks import TaskSource, task_registry

    monkeypatch.delenv("MLMLAB_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"point MLMLAB_DATA_DIR \(or paths.data_dir\) at the data dir \(neither is set\)"):
        task_registry(None)["rte"].load(TaskSource(None))
    from conftest import make_cfg

    from mlmlab.config import validate_downstream

    cfg = make_cfg(["debug=fast", "downstream.tasks=[sst9]"], tmp_path / "r", cache_dir)
    with pytest.raises(ConfigError, match=r"^task='sst9' is not known; allowed: "):
        validate_downstream(cfg, "mlm", 128, task_key="task")
