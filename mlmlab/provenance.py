"""When each findings question was declared, against when its data ran: provenance as data, from git and the records.

For every row of a ``kind: findings`` table in ``docs/results/tables.yaml`` (a sweep and its compare table), this
tool dates the declaration of the question the verdict is made on (its ``primary`` metric and ``family``) and sets
it beside the jobs::

    python -m mlmlab.provenance               # rewrite docs/results/provenance.json
    python -m mlmlab.provenance check=true    # exit 1, naming the sweep, where the JSON differs from git + records

- ``declared_at``: the commit at which the question's current primary and family first appeared as they are now, in
  the sweep file's history (``sweeps/sweep/<name>.yaml``, its ``analysis:`` block, inherited through a
  ``defaults: [/sweep/<parent>]`` entry as Hydra composes it); a question that the sweep file does not declare (the
  compare table's ``question:`` differs, e.g. a 250-label re-scoring) is dated by ``docs/results/tables.yaml``'s
  history of that table's ``question:``, and ``declared_in`` says so. Commit times are committer times.
- ``first_job_at`` / ``last_job_at``: the earliest ``started_at`` and latest ``finished_at`` of the sweep's records
  in the compare table's ``source`` folders (its ``where`` / ``exclude`` applied): those whose ``overrides`` /
  ``argv`` name ``+sweep=<name>``, or, where no record of the source names a sweep, all of them (``records.scope``
  says which).
- ``changes``: every change of primary or family after the first job or after a screen of the question (the screens
  are listed per sweep in ``docs/results/provenance_screens.yaml``: record folders or benchmark JSON files).
- ``status``: ``"before the first job"`` (declared before the first job, unchanged since any screen or job),
  ``"changed after a screen"``, or ``"after the data"``; ``"no records"`` / ``"not committed"`` where it cannot be
  dated.
- ``declared_not_run``: the arms of the sweep file's grid (its swept keys other than ``seed``, crossed) that no
  record of the compare table has.

:func:`load` and :func:`cell` read the committed JSON only (no git), for the tables of :mod:`mlmlab.report`. The
check needs the full git history; without it (no ``.git``, a shallow clone) it says so and exits 0.
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from mlmlab.cli import BOOL, Opt
from mlmlab.cli import run as cli_run

PROG = "python -m mlmlab.provenance"
OUT = Path("docs/results/provenance.json")
SPEC = Path("docs/results/tables.yaml")
SCREENS = Path("docs/results/provenance_screens.yaml")
RESULTS = Path("docs/results")
SWEEPS = Path("sweeps/sweep")

BEFORE = "before the first job"
AFTER = "after the data"
SCREENED = "changed after a screen"
NO_RECORDS = "no records"
UNCOMMITTED = "not committed"

CELL_MAX = 90

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ProvenanceError(ValueError):
    """A findings row or screen that names a missing file, or a spec this tool cannot read."""


@dataclass(frozen=True)
class Provenance:
    """One findings question: when it was declared, when its data ran, and what changed in between."""

    sweep: str
    table: str
    primary: str
    family: list[str]
    declared_in: str                # the file whose history dates the declaration (and why, for tables.yaml)
    declared_at: dict | None        # {"sha", "time"}: the commit where primary + family became what they are now
    first_job_at: str | None        # ISO, UTC
    last_job_at: str | None
    records: dict                   # {"n", "scope", "folders", "other_sweeps"}
    status: str
    changes: list[dict] = field(default_factory=list)   # {"sha", "time", "fields", "old", "new", "after"}
    screens: list[dict] = field(default_factory=list)   # {"path", "first", "last"}
    declared_not_run: list[str] = field(default_factory=list)
    in_overrides: bool = False      # every record's own overrides carry this primary (declared at launch, uncommitted)


# ------------------------------------------------------------------------------------------------------------ times
def _time(s: str | None) -> datetime | None:
    """An ISO time as written by records (``+0000``), git (``+00:00``) or benchmarks, as an aware UTC datetime."""
    if not s:
        return None
    t = str(s).strip().replace("Z", "+00:00")
    if len(t) > 5 and t[-5] in "+-" and t[-4:].isdigit():  # +0000 -> +00:00 (Python 3.10's fromisoformat)
        t = t[:-2] + ":" + t[-2:]
    d = datetime.fromisoformat(t)
    return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _iso(d: datetime | None) -> str | None:
    return None if d is None else d.isoformat()


# -------------------------------------------------------------------------------------------------------------- git
class GitUnavailable(RuntimeError):
    """No usable git history (git missing, not a repository, or a shallow clone)."""


class _Git:
    def __init__(self, root: Path):
        self.root = root
        try:
            shallow = self("rev-parse", "--is-shallow-repository").strip()
            top = Path(self("rev-parse", "--show-toplevel").strip())
            order = self("rev-list", "--topo-order", "--reverse", "HEAD").split()
        except (OSError, subprocess.CalledProcessError) as e:
            why = (getattr(e, "stderr", "") or str(e)).strip().splitlines()
            raise GitUnavailable(f"no git history at {root} ({why[0] if why else 'git failed'})") from None
        if top.resolve() != root.resolve():  # a copy of the tree inside some other repository
            raise GitUnavailable(f"no git history at {root} (it is not the top of a git work tree)")
        if shallow == "true":
            raise GitUnavailable("a shallow clone: the history that dates the declarations is not here")
        self.index = {sha: i for i, sha in enumerate(order)}
        self._shown: dict[tuple[str, str], str | None] = {}

    def __call__(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, text=True,
                              check=True).stdout

    def show(self, sha: str, path: str) -> str | None:
        key = (sha, path)
        if key not in self._shown:
            p = subprocess.run(["git", "-C", str(self.root), "show", f"{sha}:{path}"],
                               capture_output=True, text=True)
            self._shown[key] = p.stdout if p.returncode == 0 else None
        return self._shown[key]

    def log(self, path: str) -> list[tuple[str, datetime, str]]:
        """(sha, committer time, the file's path at that commit) of the commits that touched ``path``, oldest first,
        through renames."""
        out = self("log", "--follow", "--format=%x00%H %cI", "--name-only", "--", path)
        rows, last = [], path
        for chunk in out.split("\x00")[1:]:
            lines = [x for x in chunk.splitlines() if x.strip()]
            sha, when = lines[0].split(" ", 1)
            if len(lines) > 1:
                last = lines[1]
            if sha in self.index:
                rows.append((sha, _time(when), last))
        return sorted(rows, key=lambda r: self.index[r[0]])


# ------------------------------------------------------------------------------------------------------- questions
Question = tuple  # (primary, (family, ...))


def _parse(text: str | None):
    if text is None:
        return None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return None


def _parents(doc: dict) -> list[str | None]:
    """The sweep's defaults in order: a parent sweep's name, or None for ``_self_`` (appended when not listed)."""
    out: list[str | None] = []
    for d in doc.get("defaults") or []:
        if d == "_self_":
            out.append(None)
        elif isinstance(d, str) and d.startswith("/sweep/"):
            out.append(d[len("/sweep/"):])
        elif isinstance(d, dict) and len(d) == 1 and next(iter(d)) in ("/sweep", "sweep") \
                and isinstance(next(iter(d.values())), str):
            out.append(next(iter(d.values())))
    return out if None in out else [*out, None]


def _composed(read: Callable[[str], str | None], name: str, key: Callable[[dict], dict | None],
              first_path: str | None = None, depth: int = 0) -> dict | None:
    """A sweep file's mapping ``key(doc)`` as Hydra composes it through ``defaults: [/sweep/<parent>]`` (the later
    entry wins, ``_self_`` last unless listed); None where the file is missing."""
    doc = _parse(read(first_path or str(SWEEPS / f"{name}.yaml")))
    if not isinstance(doc, dict):
        return None
    merged: dict = {}
    for parent in _parents(doc):
        part = key(doc) if parent is None else (_composed(read, parent, key, None, depth + 1) if depth < 8 else None)
        if isinstance(part, dict):
            merged.update(part)
    return merged


def _sweep_question(read: Callable[[str], str | None], name: str, path: str | None = None) -> Question | None:
    a = _composed(read, name, lambda d: d.get("analysis") if isinstance(d.get("analysis"), dict) else None, path)
    return _question(a)


def _question(q) -> Question | None:
    if not isinstance(q, dict) or not q.get("primary"):
        return None
    fam = q.get("family") or []
    return (str(q["primary"]), tuple(map(str, [fam] if isinstance(fam, str) else fam)))


def _table_question(read: Callable[[str], str | None], table: str) -> Question | None:
    spec = _parse(read(str(SPEC)))
    return _question((spec.get(table) or {}).get("question")) if isinstance(spec, dict) else None


def _history(git: _Git, paths: list[str], at: Callable[[str, str], Question | None]) -> list[tuple]:
    """(sha, time, question) at each commit that touched any of ``paths``, oldest first; ``at(sha, path_of_first)``."""
    seen: dict[str, tuple] = {}
    first_names: list[tuple[int, str]] = []
    for i, p in enumerate(paths):
        for sha, when, name in git.log(p):
            seen.setdefault(sha, (sha, when))
            if i == 0:
                first_names.append((git.index[sha], name))
    out = []
    for sha, when in sorted(seen.values(), key=lambda r: git.index[r[0]]):
        idx = git.index[sha]
        name = next((n for i, n in reversed(first_names) if i <= idx), paths[0])
        out.append((sha, when, at(sha, name)))
    return out


def _chain(read: Callable[[str], str | None], name: str, depth: int = 0) -> list[str]:
    """The sweep file and its parents' files (``defaults: [/sweep/<parent>]``), as paths."""
    doc = _parse(read(str(SWEEPS / f"{name}.yaml")))
    out = [str(SWEEPS / f"{name}.yaml")]
    if isinstance(doc, dict) and depth < 8:
        for p in _parents(doc):
            if p is not None:
                out += [x for x in _chain(read, p, depth + 1) if x not in out]
    return out


def _fields(old: Question | None, new: Question | None) -> str:
    if old is None:
        return "declared"
    if new is None:
        return "removed"
    return " and ".join(f for f, a, b in (("primary", old[0], new[0]), ("family", old[1], new[1])) if a != b)


# --------------------------------------------------------------------------------------------------------- records
def _tokens(rec: dict) -> list[str]:
    return [str(t) for t in (rec.get("overrides") or []) + (rec.get("argv") or [])]


def _sweeps_named(rec: dict) -> set[str]:
    return {t.split("=", 1)[1] for t in _tokens(rec) if t.startswith(("+sweep=", "sweep="))}


def _read_records(folder: Path) -> list[tuple[str, dict]]:
    out = []
    for p in sorted(folder.rglob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("started_at"):
            out.append((str(p), d))
    return out


def _split(s: str) -> list[str]:
    """Top-level comma split (braces, brackets, parentheses and quotes kept whole)."""
    out, cur, depth, quote = [], "", 0, ""
    for ch in s:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return [*out, cur.strip()] if cur.strip() or out else out


def _canon(v) -> str:
    """A value written as its override text, numbers and dicts normalized: ``{mask:0.8,...}`` == {"mask": 0.8, ...}."""
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_canon(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_canon(x) for x in v) + "]"
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    s = str(v).strip().strip("'\"")
    if s.startswith("{") and s.endswith("}"):
        return "{" + ",".join(f"{k.strip()}:{_canon(x)}" for k, _, x in
                              (p.partition(":") for p in _split(s[1:-1]))) + "}"
    if s.startswith("[") and s.endswith("]"):
        return "[" + ",".join(_canon(x) for x in _split(s[1:-1])) + "]"
    try:
        return repr(float(s))
    except ValueError:
        return {"True": "true", "False": "false", "None": "null", "~": "null"}.get(s, s)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _config(rec: dict, key: str):
    """A dotted config key of a record; a fine-tuning job of a checkpoint takes the keys its own config lacks
    (``mask.*``, ``seed``) from the pretraining run's (``source_checkpoint.pretrain_config``), as mlmlab.runs does."""
    pre = (rec.get("source_checkpoint") or {}).get("pretrain_config")
    cur = _merge(pre, rec.get("config") or {}) if isinstance(pre, dict) else rec.get("config") or {}
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


_MISSING = object()


def _matches(rec: dict, cond: dict) -> bool:
    for k, v in cond.items():
        got = _config(rec, k)
        if got is _MISSING or _canon(got) != _canon(v):
            return False
    return True


def _has_value(rec: dict, key: str, value: str, root: Path) -> bool:
    """Does this record set the swept ``key`` to ``value``: its override says so, or its config (a config group
    ``a/b=name``: the group file's plain values, e.g. its ``_target_``, are those of the record's ``a.b``)."""
    for t in rec.get("overrides") or []:
        k, sep, v = str(t).lstrip("+~").partition("=")
        if sep and k == key:
            return _canon(v) == _canon(value)
    if "/" not in key:
        got = _config(rec, key)
        return got is not _MISSING and _canon(got) == _canon(value)
    plain = _group_values(root / "conf" / key / f"{value}.yaml")
    got = _config(rec, key.replace("/", "."))
    if not plain or not isinstance(got, dict) or ("_target_" in plain and "_target_" not in got):
        return False
    for k, v in plain.items():  # a key the record lacks (added to the group since) is not evidence either way
        if k not in got:
            continue
        if isinstance(v, str) and v.startswith("${data_file:") and v.endswith("}"):  # a data file: its tail
            if not str(got[k]).endswith(v[len("${data_file:"):-1]):
                return False
        elif _canon(got[k]) != _canon(v):
            return False
    return True


def _group_values(path: Path, depth: int = 0) -> dict:
    """A config group file's top-level plain values and ``${data_file:...}`` paths (its same-group defaults first;
    other interpolations left out)."""
    doc = _parse(path.read_text()) if path.is_file() else None
    if not isinstance(doc, dict):
        return {}
    out: dict = {}
    for d in doc.get("defaults") or []:
        if isinstance(d, str) and d != "_self_" and "/" not in d and depth < 8:
            out.update(_group_values(path.parent / f"{d}.yaml", depth + 1))
    out.update({k: v for k, v in doc.items() if k != "defaults" and not isinstance(v, (dict, list))
                and not (isinstance(v, str) and "${" in v and not v.startswith("${data_file:"))})
    return out


def _grid(root: Path, name: str) -> dict[str, list[str]]:
    """The sweep's swept keys other than ``seed`` and their values (hydra.sweeper.params, through its parents)."""
    def params(d: dict):
        p = ((d.get("hydra") or {}).get("sweeper") or {}).get("params")
        return p if isinstance(p, dict) else None

    merged = _composed(lambda p: _read(root, p), name, params) or {}
    out = {}
    for k, v in merged.items():
        if k == "seed" or v is None:
            continue
        s = str(v).strip()
        if s.startswith("choice(") and s.endswith(")"):
            s = s[len("choice("):-1]
        if s.startswith("range(") and s.endswith(")"):
            a = [int(float(x)) for x in _split(s[len("range("):-1])]
            vals = [str(x) for x in range(*a)]
        else:
            vals = _split(s)
        out[str(k)] = vals
    return out


def _arm_label(key: str, value: str) -> str:
    c = _canon(value)
    if c.startswith("{") and key.endswith("replace"):  # a split: {mask:0.8,random:0.1,keep:0.1} -> 80/10/10
        try:
            return "/".join(f"{float(p.partition(':')[2]) * 100:g}" for p in _split(c[1:-1]))
        except ValueError:
            pass
    return value if "/" in key else f"{key.split('.')[-1]} {value}"  # a config group's option is its own name


def _read(root: Path, path: str) -> str | None:
    p = root / path
    return p.read_text() if p.is_file() else None


# -------------------------------------------------------------------------------------------------------- compute
def _rows(spec: dict) -> list[dict]:
    """Every row of every ``kind: findings`` table, once per (sweep, table)."""
    seen, out = set(), []
    for v in spec.values():
        if isinstance(v, dict) and v.get("kind") == "findings":
            for r in v.get("rows") or []:
                if (r["sweep"], r["table"]) not in seen:
                    seen.add((r["sweep"], r["table"]))
                    out.append(r)
    return out


def _screen_times(root: Path, entry) -> dict:
    path = entry if isinstance(entry, str) else entry.get("path")
    p = root / str(path)
    if not path or not p.exists():
        raise ProvenanceError(f"{SCREENS}: screen {path!r} is not in the repo")
    starts, ends = [], []
    if p.is_dir():
        for _, r in _read_records(p):
            starts.append(_time(r["started_at"]))
            ends.append(_time(r.get("finished_at") or r["started_at"]))
    else:
        d = json.loads(p.read_text())
        if d.get("created_at"):
            starts.append(_time(d["created_at"]))
            ends.append(_time(d["created_at"]))
        if isinstance(d.get("records"), str) and (root / d["records"]).is_dir():
            for _, r in _read_records(root / d["records"]):
                starts.append(_time(r["started_at"]))
                ends.append(_time(r.get("finished_at") or r["started_at"]))
    if not starts:
        raise ProvenanceError(f"{SCREENS}: screen {path!r} has no timestamp (started_at or created_at)")
    return {"path": str(path), "first": _iso(min(starts)), "last": _iso(max(ends))}


def _records_of(root: Path, sweep: str, table: str, t_spec: dict) -> tuple[list, list, str, dict]:
    """The records of a compare table's ``source`` folders (its ``where`` / ``exclude`` applied), the sweep's among
    them (those naming ``+sweep=<sweep>``, with any that name no sweep; all where none does), what that choice was,
    and the other sweeps' records by name."""
    sources = t_spec.get("source") or []
    recs = []
    for folder in [sources] if isinstance(sources, str) else sources:
        if not (root / RESULTS / folder).is_dir():
            raise ProvenanceError(f"table {table}: source {RESULTS / folder} is not a folder")
        recs += [r for _, r in _read_records(root / RESULTS / folder)]
    where, exclude = t_spec.get("where") or {}, t_spec.get("exclude") or []
    recs = [r for r in recs if _matches(r, where) and not any(_matches(r, x) for x in exclude)]
    mine = [r for r in recs if sweep in _sweeps_named(r)]
    untold = [r for r in recs if not _sweeps_named(r)]
    others: dict[str, list] = {}
    for r in recs:
        for n in sorted(_sweeps_named(r) - {sweep}):
            others.setdefault(n, []).append(r)
    scope = (f"records naming +sweep={sweep}, and {len(untold)} that name no sweep" if mine and untold else
             f"records naming +sweep={sweep}" if mine else
             "all records of the source folders (none names its sweep)" if untold else "none")
    return recs, mine + untold, scope, others


def compute(root: Path) -> dict[str, Provenance]:
    """Every findings question's provenance from git and the records (:class:`GitUnavailable` without history)."""
    root = Path(root)
    git = _Git(root)
    spec = _parse(_read(root, str(SPEC)))
    if not isinstance(spec, dict):
        raise ProvenanceError(f"{SPEC} is missing or unreadable")
    screens_spec = _parse(_read(root, str(SCREENS))) or {}
    if not isinstance(screens_spec, dict):
        raise ProvenanceError(f"{SCREENS}: a mapping sweep -> [paths] expected")
    tree = functools.partial(_read, root)  # the working tree: the question as it is now
    out: dict[str, Provenance] = {}
    for row in _rows(spec):
        sweep, table = row["sweep"], row["table"]
        if not (root / SWEEPS / f"{sweep}.yaml").is_file():
            raise ProvenanceError(f"findings row {row.get('question')!r}: no sweep file {SWEEPS / sweep}.yaml")
        t_spec = spec.get(table)
        if not isinstance(t_spec, dict):
            raise ProvenanceError(f"findings row {row.get('question')!r}: no table {table!r} in {SPEC}")
        asked = _question(t_spec.get("question"))
        own = _sweep_question(tree, sweep)
        if asked is None:
            asked = own
        if asked is None:
            raise ProvenanceError(f"{sweep}: neither its sweep file nor table {table!r} declares a question")
        key = sweep if asked == own else f"{sweep}:{table}"
        if key in out:
            continue
        if asked == own:
            chain = _chain(tree, sweep)
            declared_in = chain[0] if len(chain) == 1 or "analysis" in (_parse(tree(chain[0])) or {}) \
                else f"{chain[0]} (analysis: inherited from {', '.join(chain[1:])})"
            hist = _history(git, chain, lambda sha, path, s=sweep: _sweep_question(
                lambda p, sha=sha: git.show(sha, p), s, path))
        else:
            declared_in = (f"{SPEC} (table {table}'s question: the sweep file declares "
                           f"{own[0] if own else 'none'})")
            hist = _history(git, [str(SPEC)], lambda sha, path, t=table: _table_question(
                lambda p, sha=sha: git.show(sha, path if p == str(SPEC) else p), t))

        # the declaration: the start of the last unbroken stretch of commits whose question is the current one
        declared = None
        if hist and hist[-1][2] == asked:
            i = len(hist) - 1
            while i > 0 and hist[i - 1][2] == asked:
                i -= 1
            declared = hist[i]
        transitions, prev = [], None
        for sha, when, q in hist:
            if q != prev:
                transitions.append((sha, when, prev, q))
                prev = q

        recs, used, scope, others = _records_of(root, sweep, table, t_spec)
        first = min((_time(r["started_at"]) for r in used), default=None)
        last = max((_time(r.get("finished_at") or r["started_at"]) for r in used), default=None)

        screens = [_screen_times(root, e) for e in (screens_spec.get(sweep) or [])]
        after_screen = min((_time(s["first"]) for s in screens), default=None)
        changes = []
        for sha, when, old, new in transitions:
            if old is None:
                continue
            after = "the first job" if first is not None and when >= first else \
                "a screen" if after_screen is not None and when >= after_screen else None
            if after:
                changes.append({"sha": sha, "time": _iso(when), "fields": _fields(old, new), "after": after,
                                "old": None if old is None else {"primary": old[0], "family": list(old[1])},
                                "new": None if new is None else {"primary": new[0], "family": list(new[1])}})

        if not used:
            status = NO_RECORDS
        elif declared is None:
            status = UNCOMMITTED
        elif declared[1] >= first or any(c["after"] == "the first job" for c in changes):
            status = AFTER
        elif changes:
            status = SCREENED
        else:
            status = BEFORE

        grid = _grid(root, sweep)
        not_run = [] if grid or recs else ["every job"]
        for combo in itertools.product(*grid.values()) if grid else ():
            arm = dict(zip(grid, combo))
            if not any(all(_has_value(r, k, v, root) for k, v in arm.items()) for r in recs):
                not_run.append(", ".join(_arm_label(k, v) for k, v in arm.items()))

        in_overrides = bool(used) and all(f"analysis.primary={asked[0]}" in (r.get("overrides") or []) for r in used)
        out[key] = Provenance(
            sweep=sweep, table=table, primary=asked[0], family=list(asked[1]), declared_in=declared_in,
            declared_at=None if declared is None else {"sha": declared[0], "time": _iso(declared[1]),
                                                        "what": _fields(*next((o, n) for s, _, o, n in transitions
                                                                              if s == declared[0]))},
            first_job_at=_iso(first), last_job_at=_iso(last),
            records={"n": len(used), "scope": scope,
                     "folders": [src] if isinstance(src := t_spec.get("source") or [], str) else list(src),
                     "other_sweeps": {n: {"n": len(rs),
                                          "first_job_at": _iso(min(_time(r["started_at"]) for r in rs))}
                                      for n, rs in sorted(others.items())}},
            status=status, changes=changes, screens=screens, declared_not_run=not_run, in_overrides=in_overrides)
    return out


def to_json(provs: dict[str, Provenance]) -> str:
    doc = {"generated_by": PROG,
           "about": "per findings question: when its primary + family were declared (git) against its records' "
                    "times; keys are sweeps, or sweep:table where the table asks a question its sweep file does not",
           "questions": {k: asdict(p) for k, p in sorted(provs.items())}}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------------------- readers
def load(root: str | Path = ".") -> dict[str, Provenance]:
    """The committed provenance (``docs/results/provenance.json``; no git needed), keyed by sweep, or by
    ``"<sweep>:<table>"`` for a findings row whose table asks a question its sweep file does not (see :func:`for_row`).
    An empty dict where the file is absent."""
    p = Path(root) / OUT
    if not p.is_file():
        return {}
    return {k: Provenance(**v) for k, v in json.loads(p.read_text())["questions"].items()}


def for_row(provs: dict[str, Provenance], row: dict) -> Provenance | None:
    """The provenance of a findings row (``{sweep, table, ...}`` from tables.yaml): its table's own question where
    it has one, else its sweep's."""
    return provs.get(f"{row['sweep']}:{row['table']}") or provs.get(row["sweep"])


def _when(d: datetime, ref: datetime | None = None) -> str:
    return d.strftime("%H:%M") if ref is not None and ref.date() == d.date() else d.strftime("%Y-%m-%d %H:%M")


def cell(p: Provenance | None) -> str:
    """The short text of the README's provenance column (under ~90 characters), e.g. ``before the first job`` or
    ``after the data (primary 2026-12-05 16:30, first job 15:58); declared, not run: 100/0/0``."""
    if p is None:
        return "-"
    text = p.status
    first = _time(p.first_job_at)
    if p.status == AFTER and p.declared_at is not None and first is not None:
        late = [c for c in p.changes if c["after"] == "the first job"]
        what, when = p.declared_at.get("what", "declared").split(" and ")[0], _time(p.declared_at["time"])
        if when < first and late:  # declared before the first job, changed after it
            what, when = late[-1]["fields"].split(" and ")[0], _time(late[-1]["time"])
        text += f" ({what} {_when(when)}, first job {_when(first, when)}"
        text += "; in the jobs' overrides)" if p.in_overrides else ")"
    elif p.status == SCREENED and p.changes:
        c = p.changes[-1]
        when = _time(c["time"])
        screen = min((_time(s["first"]) for s in p.screens), default=None)
        text += f" ({c['fields'].split(' and ')[0]} {_when(when)}" + (f", screen {_when(screen, when)})" if screen else ")")
    if p.declared_not_run:
        arms, tail = list(p.declared_not_run), "; declared, not run: "
        while len(arms) > 1 and len(text + tail + ", ".join(arms)) > CELL_MAX:
            arms = arms[:-1]
        more = len(p.declared_not_run) - len(arms)
        text += tail + ", ".join(arms) + (f" +{more}" if more else "")
    return text


# ------------------------------------------------------------------------------------------------------------- main
def update(root: Path, check: bool = False) -> list[str]:
    """Rewrite (or compare) the JSON; the keys that differ. :class:`GitUnavailable` without history."""
    new = compute(root)
    path = root / OUT
    old = json.loads(path.read_text()).get("questions", {}) if path.is_file() else {}
    fresh = json.loads(to_json(new))["questions"]
    changed = sorted(k for k in set(old) | set(fresh) if old.get(k) != fresh.get(k))
    if changed and not check:
        path.write_text(to_json(new))
    return changed


OPTIONS = {
    "check": Opt("compare only: exit 1 when docs/results/provenance.json differs from git + records", False, BOOL),
    "root": Opt("the repo root (a git work tree with its full history)", "."),
}


def _main(a) -> int:
    root = Path(a.root)
    try:
        changed = update(root, check=a.check)
    except GitUnavailable as e:
        if a.check:
            print(f"provenance not checked: {e}; {OUT} is taken as committed")
            return 0
        print(f"error: cannot date the declarations: {e}", file=sys.stderr)
        return 1
    except ProvenanceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for k in changed:
        print(("differs from git + records: " if a.check else "rewrote: ") + k)
    if a.check and changed:
        print(f"run `{PROG}` to regenerate {OUT}", file=sys.stderr)
        return 1
    if not changed:
        print(f"{OUT}: up to date")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate (or check) docs/results/provenance.json (``key=value`` arguments, :mod:`mlmlab.cli`)."""
    return cli_run(_main, argv, OPTIONS, PROG)


if __name__ == "__main__":
    sys.exit(main())
