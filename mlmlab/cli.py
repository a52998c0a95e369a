"""One argument style for every ``python -m mlmlab.<entry point>``: ``key=value`` tokens, the syntax Hydra gives
``mlmlab.train`` and ``mlmlab.finetune``. The other entry points (``analysis``, ``export``, ``dashboard``, ``drill``)
parse their tokens here, so they accept and reject the same way:

- ``key=value``; a list is ``key=[a,b]`` (Hydra's list syntax) or a single value; a boolean is ``true`` / ``false``;
- an entry point may take its first bare token as one named value (``python -m mlmlab.analysis <sweep dir>``,
  ``python -m mlmlab.drill resume``), which ``key=value`` can also give;
- an unknown key, a key given twice, a value of the wrong type or outside its choices, a missing required key:
  :class:`UsageError` naming the key and what is allowed (exit status 2); ``help`` / ``-h`` / ``--help`` prints the
  usage (exit status 0).

Hand-written, not argparse: argparse has no ``key=value`` mode, and Hydra's own parser would bring its config
composition to tools that have no config.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class UsageError(Exception):
    """Bad arguments: the message names the key; exit status 2."""


@dataclass(frozen=True)
class Opt:
    help: str
    default: Any = None
    type: Callable[[str], Any] = str
    many: bool = False  # a list: key=[a,b] or key=a
    choices: tuple = ()
    required: bool = False


def _bool(s: str) -> bool:
    if s.lower() not in ("true", "false"):
        raise ValueError("not true or false")
    return s.lower() == "true"


BOOL = _bool


def usage(prog: str, opts: dict[str, Opt], positional: str | None = None) -> str:
    lines = [f"usage: {prog} " + (f"<{positional}> " if positional else "") + "[key=value ...]"]
    for k, o in opts.items():
        what = "[a,b,...]" if o.many else ("|".join(map(str, o.choices)) if o.choices else
                                           "true|false" if o.type is _bool else "<value>")
        extra = " (required)" if o.required else ("" if o.default is None else f" (default {_show(o.default)})")
        lines.append(f"  {k}={what}  {o.help}{extra}")
    return "\n".join(lines)


def _show(v: Any) -> str:
    return "[" + ",".join(map(str, v)) + "]" if isinstance(v, (list, tuple)) else str(v).lower() \
        if isinstance(v, bool) else str(v)


def _convert(key: str, raw: str, o: Opt) -> Any:
    items = [x.strip() for x in raw[1:-1].split(",") if x.strip()] if raw.startswith("[") and raw.endswith("]") \
        else [raw]
    if not o.many and len(items) != 1:
        raise UsageError(f"{key}={raw}: one value expected, not a list")
    out = []
    for item in items:
        try:
            v = o.type(item)
        except ValueError as e:
            raise UsageError(f"{key}={raw}: {item!r} is not a valid {getattr(o.type, '__name__', 'value')} "
                             f"({e})") from None
        if o.choices and v not in o.choices:
            raise UsageError(f"{key}={v!r} is not known; allowed: {', '.join(map(str, o.choices))}")
        out.append(v)
    if o.many and not out:
        raise UsageError(f"{key}={raw}: the list is empty")
    return out if o.many else out[0]


def parse(argv: Sequence[str] | None, opts: dict[str, Opt], prog: str,
          positional: str | None = None) -> SimpleNamespace:
    """``key=value`` tokens -> a namespace with every key of ``opts`` (defaults filled in)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("help", "-h", "--help") for a in argv):
        print(usage(prog, opts, positional))
        raise SystemExit(0)
    given: dict[str, Any] = {}
    for i, token in enumerate(argv):
        key, sep, raw = token.partition("=")
        if positional and i == 0 and sep and key.strip() not in opts and Path(token).expanduser().exists():
            sep = ""  # a path that holds "=" (every multirun job folder's name does): the positional argument
        if not sep:
            if positional and i == 0:
                key, raw = positional, token
            else:
                raise UsageError(f"argument {token!r} is not key=value\n{usage(prog, opts, positional)}")
        key = key.strip()
        if key not in opts:
            hint = (f" (a path? {token!r} does not exist; give it as {positional}=<path>)"
                    if positional and ("/" in key or "\\" in key) else "")
            raise UsageError(f"unknown key {key!r}{hint}; allowed: {', '.join(opts)}\n{usage(prog, opts, positional)}")
        if key in given:
            raise UsageError(f"{key} is given twice")
        given[key] = _convert(key, raw.strip(), opts[key])
    missing = [k for k, o in opts.items() if o.required and k not in given]
    if missing:
        raise UsageError(f"{', '.join(missing)} required\n{usage(prog, opts, positional)}")
    return SimpleNamespace(**{k: given.get(k, list(o.default) if o.many and o.default is not None else o.default)
                              for k, o in opts.items()})


def run(main: Callable[[SimpleNamespace], int], argv: Sequence[str] | None, opts: dict[str, Opt], prog: str,
        positional: str | None = None) -> int:
    """Parse, then ``main(args)``; a UsageError is one line on stderr (``<prog>: <message>``) and exit status 2."""
    try:
        args = parse(argv, opts, prog, positional)
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return main(args)
