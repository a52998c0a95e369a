"""A saved W&B workspace (and optionally a report) for one masking-ablation sweep, built with ``wandb-workspaces``.

``python -m mlmlab.dashboard entity=<e> project=<p> group=<sweep> [axes=[mask.rate,mask.unit]] [name=...]
[report=true]`` saves a workspace over the sweep's pretraining runs (run-set filter ``group == <sweep>`` and
``job_type == "pretrain"``) with:

* ``downstream/score`` against every swept axis: a bar chart grouped by the axis (mean over the runs sharing a value,
  i.e. over seeds, with min-max error bars) and a scatter plot with one point per run and the running mean;
* a parallel-coordinates plot over the swept axes ending in ``downstream/score``;
* ``train/mask_rate`` and ``val/mlm_loss_r15`` over ``trainer/global_step``;
* the realized corruption telemetry logged every step (``train/selected_frac``, ``train/mask_frac`` ...);
* the evaluation curves over pretraining (``eval.zeroshot_every_n_steps``): BLiMP and linear-probe scores by step.

Runs log their whole config nested, so an axis is a dotted config path (``mask.rate``, ``mask.replace.mask``,
``mask.schedule._target_``). ``axes`` defaults to ``DEFAULT_AXES``, the masking axes of ``MaskConfig`` and the
objective; an axis a sweep did not vary just shows one bar. ``report=true`` also saves a report with the same panels.

``build_workspace`` / ``build_report`` only construct the objects (no network). ``main`` needs a reachable W&B server
and credentials: it checks ``WANDB_MODE``, the server's address and the API key first and exits non-zero with a
short message when any is missing (local run dirs are read by ``mlmlab.analysis`` instead).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:  # wandb_workspaces (pydantic, wandb) is imported where it is used: argument errors stay instant
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

SCORE = "downstream/score"
# the masking axes of MaskConfig (conf/mask/*.yaml) and the objective; schedule/sampler are _target_ nodes
DEFAULT_AXES = (
    "mask.name",
    "mask.rate",
    "mask.predict_rate",
    "mask.replace.mask",
    "mask.replace.random",
    "mask.replace.keep",
    "mask.unit",
    "mask.count",
    "mask.dynamic",
    "mask.schedule._target_",
    "mask.sampler._target_",
    "objective.name",
)
TRAIN_CURVES = ("train/mask_rate", "val/mlm_loss_r15")
# realized corruption per training batch: mlmlab.masking.masker.telemetry, logged as train/<key> by mlmlab/lit/mlm.py
TELEMETRY = (
    "train/selected_frac",
    "train/corrupted_frac",
    "train/mask_frac",
    "train/random_frac",
    "train/keep_frac",
    "train/random_equals_original",
    "train/special_selected",
    "train/zero_target_seqs",
)
# the x-axis of every curve: Lightning's WandbLogger logs it with each call (W&B's own Step counts log calls)
STEP = "trainer/global_step"
JOB_TYPE = "pretrain"
# (title, metric regex) of the evaluation curves over pretraining (eval.zeroshot_every_n_steps)
CURVES = (("zero-shot minimal pairs over pretraining (curve/<task>/acc)", r"^curve/[^/]+/acc$"),
          ("linear probe over pretraining (curve/probe/<task>/<metric>)", r"^curve/probe/.+"))
MAX_ROWS = 6  # rows of panels per section page
MAX_RUNS = 100  # runs per panel (W&B's default is 10: a sweep of values x seeds has more)
CONNECT_TIMEOUT_S = 5.0  # the reachability check (name lookup + TCP connect)
API_TIMEOUT_S = 20  # per HTTP request once the server is known to answer
OFFLINE_MODES = ("offline", "dryrun", "disabled")
OPTIONS = ("entity", "project", "group", "axes", "name", "report")
OPTION_HELP = {"entity": "the W&B entity (default: WANDB_ENTITY, else the API key's default entity)",
               "project": "the W&B project (default mlmlab)", "group": "the sweep's W&B group (required)",
               "axes": "the swept config keys to plot against, e.g. [mask.rate,mask.unit]",
               "name": "the workspace's name", "report": "true: also save a W&B report (default false)"}
USAGE = ("usage: python -m mlmlab.dashboard entity=<entity> project=<project> group=<sweep> "
         "[axes=[mask.rate,mask.unit]] [name=<workspace name>] [report=true|false]")


@dataclass(frozen=True)
class Options:
    group: str
    entity: str | None = None
    project: str = "mlmlab"
    axes: tuple[str, ...] = DEFAULT_AXES
    name: str | None = None
    report: bool = False


class DashboardError(Exception):
    """A failure ``main`` reports as one line on stderr: exit status ``code`` (1; 2 for bad arguments)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _label(axis: str) -> str:
    return axis.removesuffix("._target_")


def config_column(axis: str) -> str:
    """The runs-table column of a nested config key: ``mask.rate`` -> ``config:mask.value.rate``."""
    top, _, rest = axis.partition(".")
    return f"config:{top}.value" + (f".{rest}" if rest else "")


def parse_axes(value: str) -> tuple[str, ...]:
    """``[mask.rate,mask.unit]`` or ``mask.rate,mask.unit`` -> ``("mask.rate", "mask.unit")``."""
    items = [a.strip().strip("'\"") for a in value.strip().removeprefix("[").removesuffix("]").split(",")]
    axes = tuple(dict.fromkeys(a for a in items if a))
    if not axes:
        raise DashboardError(f"axes={value!r} names no config key; e.g. axes=[mask.rate,mask.unit]", 2)
    bad = [a for a in axes if any(c.isspace() for c in a) or a.startswith(".") or a.endswith(".")]
    if bad:
        raise DashboardError(f"axes: {bad[0]!r} is not a dotted config key like mask.rate", 2)
    return axes


def _parse_bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise DashboardError(f"{key}={value!r}: expected true or false", 2)


def parse_args(argv: Sequence[str]) -> Options:
    """``key=value`` tokens (:mod:`mlmlab.cli`, like every entry point) -> ``Options``; an unknown key, a token without
    ``=`` or a missing group raises ``DashboardError`` (exit status 2) naming it."""
    from mlmlab.cli import Opt, UsageError, parse

    spec = {k: Opt(OPTION_HELP[k], many=k == "axes") for k in OPTIONS}  # values checked below, own messages
    try:
        values = {k: ",".join(v) if isinstance(v, list) else v.strip()
                  for k, v in vars(parse(argv, spec, "python -m mlmlab.dashboard")).items() if v is not None}
    except UsageError as e:
        raise DashboardError(str(e), 2) from None
    if not values.get("group"):
        raise DashboardError(f"group=<sweep> is required (the W&B group of the sweep's runs)\n{USAGE}", 2)
    for key in ("entity", "project", "name"):
        if key in values and not values[key]:
            raise DashboardError(f"{key}= is empty", 2)
    return Options(
        group=check_group(values["group"]),
        entity=values.get("entity"),
        project=values.get("project", "mlmlab"),
        axes=parse_axes(values["axes"]) if "axes" in values else DEFAULT_AXES,
        name=values.get("name"),
        report=_parse_bool("report", values["report"]) if "report" in values else False,
    )


def check_group(group: str) -> str:
    """wandb-workspaces writes filter values into a quoted expression without escaping: refuse what would break it."""
    if not group or any(c in group for c in "'\\\n\r"):
        raise DashboardError(f"group={group!r}: a group name without single quotes, backslashes or newlines is needed", 2)
    return group


def run_filters(group: str):
    """The run set: the sweep's pretraining runs (``group == <group>`` and ``job_type == "pretrain"``)."""
    from wandb_workspaces import expr

    check_group(group)
    return expr.And(expr.Metric("Group") == group, expr.Metric("JobType") == JOB_TYPE)


def panel_sections(axes: Sequence[str] = DEFAULT_AXES) -> list[tuple[str, int, list]]:
    """(section title, panels per row, panels) for the workspace and the report; fresh panel objects every call."""
    import wandb_workspaces.reports.v2 as wr

    wide = wr.Layout(w=24, h=9)
    overview = wr.ParallelCoordinatesPlot(
        title=f"swept axes -> {SCORE}",
        columns=[wr.ParallelCoordinatesPlotColumn(metric=wr.Config(a), display_name=_label(a)) for a in axes]
        + [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(SCORE), display_name=SCORE)],
        layout=wide,
    )
    by_axis = []
    for a in axes:
        by_axis.append(wr.BarPlot(
            title=f"{SCORE} by {_label(a)} (mean, min-max over seeds)", metrics=[SCORE], orientation="v",
            groupby=wr.Config(a), groupby_aggfunc="mean", groupby_rangefunc="minmax", max_runs_to_show=MAX_RUNS,
            title_x=_label(a), title_y=SCORE,
        ))
        by_axis.append(wr.ScatterPlot(
            title=f"{SCORE} vs {_label(a)} (one point per run)", x=wr.Config(a), y=wr.SummaryMetric(SCORE),
            running_ymean=True,
        ))

    def curve(key: str):
        return wr.LinePlot(title=key, x=STEP, y=[key], max_runs_to_show=MAX_RUNS)

    return [
        ("Swept axes", 1, [overview]),
        (f"{SCORE} by axis", 2, by_axis),  # one row per axis: grouped bars, then the runs
        ("Training", 2, [curve(k) for k in TRAIN_CURVES]),
        ("Realized corruption", 4, [curve(k) for k in TELEMETRY]),
        # eval.zeroshot_every_n_steps (mlmlab/lit/curves.py): BLiMP and probe scores over pretraining, any task
        ("Evaluation curves", 2, [wr.LinePlot(title=title, x=STEP, metric_regex=regex, max_runs_to_show=MAX_RUNS)
                                  for title, regex in CURVES]),
    ]


def _rows(n_panels: int, columns: int) -> int:
    return max(1, min(MAX_ROWS, -(-n_panels // columns)))  # a section pages beyond MAX_ROWS rows


def default_name(group: str) -> str:
    return f"mlmlab: {group}"


def build_workspace(entity: str, project: str, group: str, axes: Sequence[str] = DEFAULT_AXES,
                    name: str | None = None) -> ws.Workspace:
    """The workspace object (nothing is sent anywhere until ``.save()``)."""
    import wandb_workspaces.workspaces as ws

    axes = tuple(axes)
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name or default_name(group),
        sections=[ws.Section(name=title, panels=panels, is_open=True,
                             layout_settings=ws.SectionLayoutSettings(columns=columns, rows=_rows(len(panels), columns)))
                  for title, columns, panels in panel_sections(axes)],
        settings=ws.WorkspaceSettings(x_axis=STEP, max_runs=MAX_RUNS),
        runset_settings=ws.RunsetSettings(
            filters=run_filters(group),
            pinned_columns=[config_column(a) for a in axes] + [f"summary:{SCORE}"],
        ),
    )


def build_report(entity: str, project: str, group: str, axes: Sequence[str] = DEFAULT_AXES,
                 name: str | None = None) -> wr.Report:
    """The report object: one panel grid per workspace section, each over the same run set (no network)."""
    import wandb_workspaces.reports.v2 as wr

    blocks: list = [wr.P(f"Pretraining runs (job_type={JOB_TYPE}) of the W&B group {group!r}; "
                         f"swept axes: {', '.join(_label(a) for a in axes)}. Built by mlmlab.dashboard.")]
    for title, _, panels in panel_sections(tuple(axes)):
        blocks.append(wr.H2(title))
        blocks.append(wr.PanelGrid(
            runsets=[wr.Runset(entity=entity, project=project, name=group, filters=run_filters(group))],
            panels=panels,
        ))
    return wr.Report(entity=entity, project=project, title=(name or default_name(group))[:128],
                     description=f"mlmlab sweep {group}", blocks=blocks, width="fluid")


def _unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP connection to host:port fails within ``timeout`` seconds, or None when it succeeds. The name lookup
    takes no timeout, so the attempt runs in a daemon thread that is abandoned (not waited for at exit) after it."""
    outcome: list[str | None] = []

    def attempt():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(e.strerror or str(e) or type(e).__name__)

    thread = threading.Thread(target=attempt, name="mlmlab.dashboard-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _brief(e: Exception, limit: int = 300) -> str:
    """An exception as one short line (server errors can carry a whole HTML page)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _needs_server(reason: str) -> DashboardError:
    return DashboardError(f"needs a W&B server: {reason}; set WANDB_API_KEY / run `wandb login` (and WANDB_BASE_URL "
                          "for a private server), or use `python -m mlmlab.analysis` on local run dirs")


def check_server() -> str:
    """Fail fast (within ``CONNECT_TIMEOUT_S``) when no W&B server can be used; returns its base URL."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in OFFLINE_MODES:
        raise _needs_server(f"WANDB_MODE={mode}")
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("true", "1"):
        raise _needs_server("WANDB_DISABLED is set")
    from wandb import env
    from wandb.sdk import wandb_setup

    settings = wandb_setup.singleton().settings  # environment + wandb settings files (`wandb offline`, login host)
    if str(settings.mode).lower() in OFFLINE_MODES:
        raise _needs_server(f"wandb mode is {settings.mode} (`wandb online` to change it)")
    base_url = env.get_base_url(settings.base_url).rstrip("/")
    url = urlparse(base_url)
    if not url.hostname:
        raise _needs_server(f"bad W&B base URL {base_url!r}")
    problem = _unreachable(url.hostname, url.port or (443 if url.scheme == "https" else 80), CONNECT_TIMEOUT_S)
    if problem:
        raise _needs_server(f"cannot reach {base_url} ({problem})")
    try:
        from wandb.sdk.lib import wbauth
    except ImportError:  # internal module: without it the API call below reports missing credentials itself
        return base_url
    if wbauth.authenticate_session(host=base_url, source="mlmlab.dashboard", prompt=False,
                                   update_session=False) is None:
        raise _needs_server(f"no API key for {base_url}")
    return base_url


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, check the server, build, save; returns the exit status (an error: a short message on stderr)."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except DashboardError as e:
        print(f"mlmlab.dashboard: {e}", file=sys.stderr)
        return e.code


def _main(argv: list[str]) -> int:
    if any(a in ("-h", "--help", "help") for a in argv):
        print(__doc__.split("\n\n")[0] + "\n\n" + USAGE)
        return 0
    opts = parse_args(argv)
    base_url = check_server()
    import wandb

    entity = opts.entity or os.environ.get("WANDB_ENTITY")
    try:
        api = wandb.Api(timeout=API_TIMEOUT_S)  # verifies the API key against the server
        entity = entity or api.default_entity
    except Exception as e:
        raise _needs_server(f"logging in to {base_url} failed ({_brief(e)})") from None
    if not entity:
        raise DashboardError("no entity: pass entity=<entity> or set WANDB_ENTITY", 2)

    what = "workspace"
    try:
        workspace = build_workspace(entity, opts.project, opts.group, opts.axes, opts.name).save()
        print(f"workspace {workspace.name!r}: {workspace.url}")
        if opts.report:
            what = "report"
            report = build_report(entity, opts.project, opts.group, opts.axes, opts.name).save()
            print(f"report {report.title!r}: {report.url}")
    except Exception as e:
        raise DashboardError(f"saving the {what} to {base_url} ({entity}/{opts.project}) failed: "
                             f"{_brief(e)}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
