"""Where `export` writes: a new regular file, complete before it takes its name, replacing nothing else.

The export is written beside its target under a name of its own
(`FILE.<random>.partial`, made with `O_EXCL`: never an existing file, nor
through a symbolic link), flushed to disk, then given the target's name: by
a hard link, which fails if the name was taken meanwhile, or (to replace
an existing export, `overwrite`) by a rename.  A target that exists is
refused unless `overwrite`, and one that is not a regular file (a symbolic
link, a FIFO, a device, a directory, a socket) always: an export makes
regular files and replaces nothing else, whoever runs it.
"""

from __future__ import annotations

import gzip
import io
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from memorm.errors import ValidationError

__all__ = ["check_target", "new_file"]

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_target(target: Path, *, overwrite: bool) -> None:
    """Refuse a `target` that is there, unless it is a regular file and `overwrite`.

    Raises:
        ValidationError: `target` is not a regular file, or is one and not
            `overwrite`.
        OSError: `target` cannot be looked at (a folder without permission).
    """
    try:
        found = target.lstat()
    except FileNotFoundError:
        return
    for test, kind in _KINDS:
        if test(found.st_mode):
            raise ValidationError(f"{target} is {kind}: an export writes a new regular file, nothing else")
    if not stat.S_ISREG(found.st_mode):
        raise ValidationError(f"{target} is not a regular file: an export writes a new regular file")
    if not overwrite:
        raise ValidationError(f"{target} exists: replace it with --force (overwrite=True)")


@contextmanager
def new_file(target: Path, *, overwrite: bool) -> Iterator[IO[str]]:
    """A text file to write that appears as `target` once the block ends without error.

    gzip-compressed if `target` ends in `.gz`.  An error in the block
    leaves no file behind, and `target` as it was.

    Raises:
        ValidationError: `check_target` refuses `target`, before or after
            the block (a file put there meanwhile is not replaced).
    """
    check_target(target, overwrite=overwrite)
    descriptor, partial = _beside(target)
    try:
        with os.fdopen(descriptor, "wb") as raw:
            packed = (
                gzip.GzipFile(filename=target.name, mode="wb", fileobj=raw)
                if target.name.endswith(".gz")
                else None
            )
            binary: Any = raw if packed is None else packed  # typeshed has no common type for both
            text = io.TextIOWrapper(binary, encoding="utf-8", newline="\n")
            try:
                yield text
            finally:
                text.detach()  # flushed into the layer below, which it leaves open
                if packed is not None:
                    packed.close()  # gzip's trailer; `raw` stays open
            raw.flush()
            os.fsync(raw.fileno())
        _publish(partial, target, overwrite=overwrite)
    finally:
        partial.unlink(missing_ok=True)


def _beside(target: Path) -> tuple[int, Path]:
    """A new file in `target`'s folder, opened to write: its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        partial = target.with_name(f"{target.name}.{secrets.token_hex(4)}.partial")
        try:
            return os.open(partial, flags, 0o666), partial  # permissions as the umask makes them
        except FileExistsError:
            continue


def _publish(partial: Path, target: Path, *, overwrite: bool) -> None:
    if overwrite:
        check_target(target, overwrite=True)  # a link or FIFO put there meanwhile stays
        os.replace(partial, target)
        return
    try:
        os.link(partial, target)  # fails, rather than replaces, if the name is taken
    except FileExistsError:
        raise ValidationError(f"{target} appeared while the export ran: left as it is") from None
    except OSError:  # a file system without hard links
        check_target(target, overwrite=False)
        os.replace(partial, target)
