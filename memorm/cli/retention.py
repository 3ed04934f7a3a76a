"""`memorm purge` and `memorm forget`: retention from the command line, or from cron.

The deletions live in [`memorm.retention`][memorm.retention]; this module parses durations
(`30d`) and meta conditions (`user_id=u42`, `n:=42`), draws progress
bars (on stderr, only on a terminal) and prints one summary line per kind of
row: `removed 12 sessions` (`would remove …` with `--dry-run`).  With
`--tenant NAME` they run in that tenant; without it, across every tenant.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, cast

from memorm.cli.tenant_option import add_tenant_option
from memorm.errors import ValidationError
from memorm.progress import Reporter

if TYPE_CHECKING:
    from memorm.retention import Removed

__all__ = ["duration", "meta_condition", "register"]

_DURATION = re.compile(r"([0-9]{1,12})([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Keys as memorm.search.filters takes them, so neither ':' nor '=' can be in one.
_META = re.compile(r"([A-Za-z0-9_-]{1,64})(:?=)(.*)", re.DOTALL)


def duration(text: str) -> timedelta:
    """`90m`, `12h`, `30d`, `2w`: a positive whole number and a unit (s, m, h, d, w)."""
    from memorm.validation import check_duration

    found = _DURATION.fullmatch(text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"expected a whole number and a unit s, m, h, d or w (90m, 12h, 30d, 2w), got {text!r}"
        )
    number, unit = int(found.group(1)), found.group(2)
    try:
        return check_duration(timedelta(**{_UNITS[unit]: number}), "duration")
    except (OverflowError, ValidationError):  # 0, or past 1,000 years (or timedelta's range)
        raise argparse.ArgumentTypeError(
            f"expected a positive duration of at most 1,000 years, got {text!r}"
        ) from None


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def meta_condition(text: str) -> tuple[str, Any]:
    """`key=value` (the string `value`) or `key:=JSON` (a typed value: `42`, `true`, `null`)."""
    from memorm.validation import check_json

    found = _META.fullmatch(text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE or KEY:=JSON, the key 1-64 letters, digits, '_' or '-', got {text!r}"
        )
    key, operator, raw = found.groups()
    if key == "created_at":
        raise argparse.ArgumentTypeError("created_at is a column, not a meta key")
    value: Any = raw
    if operator == ":=":
        try:
            value = json.loads(raw, parse_constant=_reject_constant)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{key}:= expects a JSON value, got {raw!r} ({error})") from None
        except RecursionError:  # Python's parser recurses once per level
            raise argparse.ArgumentTypeError(
                f"{key}:= compares with a string, number, true, false or null, not a value nested that deep"
            ) from None
        if isinstance(value, (dict, list)):
            raise argparse.ArgumentTypeError(
                f"{key}:= compares with a string, number, true, false or null, not {raw!r}"
            )
    try:
        check_json(value, key)  # what memorm can store: 64-bit integers, finite floats, no NUL
    except ValidationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return key, value


class _Where(argparse.Action):
    """Collects repeated `--meta` conditions into one filter dict (all must match)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        key, value = cast("tuple[str, Any]", values)  # one condition, parsed by meta_condition
        where = dict(getattr(namespace, self.dest) or {})
        if key in where:
            raise argparse.ArgumentError(self, f"{key!r} given twice (every condition must match)")
        where[key] = value
        setattr(namespace, self.dest, where)


def _whole_number(text: str, most: int) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= most:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {most:,}, got {text!r}")
    return int(text)


def _batch(text: str) -> int:
    from memorm.removal import MAX_BATCH

    return _whole_number(text, MAX_BATCH)


def _keep_last(text: str) -> int:
    from memorm.removal import MAX_KEEP_LAST

    return _whole_number(text, MAX_KEEP_LAST)


class _Labelled:
    """A reporter naming its bars `"<label> <task>"`: both purges have a `messages` task."""

    def __init__(self, reporter: Reporter, label: str) -> None:
        self.reporter = reporter
        self.label = label

    def start(self, task: str, total: int) -> None:
        self.reporter.start(f"{self.label} {task}", total)

    def advance(self, task: str, rows: int) -> None:
        self.reporter.advance(f"{self.label} {task}", rows)


def _summary(removed: Removed, kinds: Sequence[str], *, dry_run: bool) -> None:
    verb = "would remove" if dry_run else "removed"
    for kind in kinds:
        print(f"{verb} {getattr(removed, kind):,} {kind}")


async def _purge(fail: Callable[[str], NoReturn], args: argparse.Namespace) -> int:
    if args.checkpoints:
        if args.keep_last is None and args.older_than is None:
            fail("--checkpoints needs --keep-last N, --older-than DURATION, or both")
    elif args.keep_last is not None:
        fail("--keep-last counts checkpoints: give it with --checkpoints")
    elif not args.expired and args.older_than is None:
        fail("give --expired, --older-than DURATION, --checkpoints, or a combination")
    if args.agent is not None and not args.checkpoints and (args.expired or args.older_than is None):
        fail(
            "--agent scopes --older-than and --checkpoints only "
            "(--expired purges every agent's expired sessions)"
        )
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.cli.tenant_option import tenant_scope
    from memorm.retention import Removed, purge_checkpoints, purge_expired, purge_older_than
    from memorm.types import utcnow

    batch: dict[str, Any] = {} if args.batch is None else {"batch": args.batch}
    now = utcnow()
    cutoff = None if args.older_than is None else now - args.older_than
    removed = Removed()
    async with open_database(args.url) as db:
        view, every = await tenant_scope(db, args.tenant, "purge")
        with progress_bar() as progress:
            bars = Bars(progress)
            if args.expired:
                removed += await purge_expired(
                    view,
                    now=now,
                    dry_run=args.dry_run,
                    reporter=_Labelled(bars, "expired"),
                    all_tenants=every,
                    **batch,
                )
            if args.checkpoints:
                removed += await purge_checkpoints(
                    view,
                    keep_last=args.keep_last,
                    before=cutoff,
                    agent=args.agent,
                    dry_run=args.dry_run,
                    reporter=_Labelled(bars, "checkpoints of"),
                    all_tenants=every,
                )
            elif cutoff is not None:
                old = await purge_older_than(
                    view,
                    cutoff,
                    agent=args.agent,
                    dry_run=args.dry_run,
                    reporter=_Labelled(bars, "old"),
                    after_expired=now if args.expired else None,
                    all_tenants=every,
                    **batch,
                )
                removed += old
            if args.scrub and not args.dry_run:
                await db.scrub()
    if args.checkpoints:
        _summary(
            removed,
            (["sessions", "messages"] if args.expired else []) + ["checkpoints"],
            dry_run=args.dry_run,
        )
        return 0
    kinds = ["sessions", "messages"] if args.expired else ["messages"]
    _summary(removed, kinds + (["passages"] if cutoff is not None else []), dry_run=args.dry_run)
    return 0


async def _forget(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.cli.tenant_option import tenant_scope
    from memorm.retention import forget

    async with open_database(args.url) as db:
        view, every = await tenant_scope(db, args.tenant, "forget")
        with progress_bar() as progress:
            removed = await forget(
                view,
                args.meta,
                dry_run=args.dry_run,
                scrub=not args.no_scrub,
                reindex=args.reindex,
                reporter=Bars(progress),
                all_tenants=every,
            )
    _summary(removed, ("agents", "sessions", "messages", "passages"), dry_run=args.dry_run)
    return 0


def register(commands: Any) -> None:
    purge = commands.add_parser(
        "purge",
        help="delete expired sessions, history older than a duration, or old graph checkpoints",
        description="Delete expired sessions (--expired) and/or messages and archival passages "
        "created more than DURATION ago (--older-than); with both, expired sessions go first. "
        "With --checkpoints, old LangGraph checkpoints instead of messages (--keep-last, --older-than).",
    )
    purge.add_argument("--expired", action="store_true", help="sessions whose expires_at has passed")
    purge.add_argument(
        "--older-than",
        type=duration,
        metavar="DURATION",
        help="messages and passages created more than DURATION ago: 90m, 12h, 30d, 2w (sessions stay)",
    )
    purge.add_argument(
        "--checkpoints",
        action="store_true",
        help="LangGraph's graph state instead of messages: each thread's checkpoints but the newest "
        "--keep-last N of each namespace and those younger than --older-than (what a kept one "
        "needs stays)",
    )
    purge.add_argument(
        "--keep-last",
        type=_keep_last,
        metavar="N",
        help="with --checkpoints: the newest checkpoints kept in each namespace of a thread",
    )
    purge.add_argument(
        "--agent",
        metavar="NAME",
        help="only this agent's history (with --older-than); without --tenant, the agent of that "
        "name in every tenant",
    )
    purge.add_argument(
        "--batch",
        type=_batch,
        metavar="N",
        help="rows per transaction: sessions for --expired (default 1,000), "
        "messages or passages for --older-than (default 10,000)",
    )
    purge.add_argument(
        "--scrub",
        action="store_true",
        help="then clear the deleted rows' traces from the files (merges the full-text indexes; VACUUM)",
    )
    purge.set_defaults(handler=partial(_purge, purge.error))
    forget_ = commands.add_parser(
        "forget",
        help="erase every agent, session, message and passage whose meta matches",
        description="Erase everything whose meta matches all the --meta conditions (an agent with "
        "its sessions, messages and passages; a session with its messages), then scrub the files.",
    )
    forget_.add_argument(
        "--meta",
        type=meta_condition,
        action=_Where,
        required=True,
        metavar="KEY=VALUE|KEY:=JSON",
        help="a condition (repeat for several, all must match): user_id=u42 matches the string "
        "'u42'; n:=42, vip:=true, x:=null match typed JSON values",
    )
    forget_.add_argument(
        "--no-scrub", action="store_true", help="skip clearing the deleted rows' traces from the files"
    )
    forget_.add_argument(
        "--reindex",
        action="store_true",
        help="Postgres: also rebuild the full-text indexes, which keep deleted words as keys",
    )
    forget_.set_defaults(handler=_forget)
    add_tenant_option(purge, "sessions and history")
    add_tenant_option(forget_, "agents, sessions, messages and passages")
    for command in (purge, forget_):
        command.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")
        command.add_argument("--url", help="database URL")
