"""The pinned upstream source distributions: downloaded once, checked, and unpacked into a cache.

Nothing upstream is kept in the repository.  The first test run downloads each
sdist with pip (exact version, source only), checks its sha256 against the pin
below, and unpacks only the files the suites run into
``<repo>/.cache/upstream/<name>-<version>/`` (or ``$MEMORM_UPSTREAM_CACHE``),
which git ignores; later runs reuse it.  xdist workers that start at once take
turns on a file lock, and every file lands by an atomic rename, so a worker
never sees half a download or half a tree.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CACHE", "Sdist", "UnavailableError", "unpacked"]

CACHE = Path(
    os.environ.get("MEMORM_UPSTREAM_CACHE") or Path(__file__).resolve().parents[2] / ".cache" / "upstream"
)


class UnavailableError(RuntimeError):
    """An sdist could not be downloaded, or was not the one pinned."""


@dataclass(frozen=True)
class Sdist:
    """One pinned source distribution on PyPI, and the files of it the suites need."""

    name: str  # the PyPI project, as pip takes it
    version: str
    sha256: str
    members: tuple[str, ...]  # paths under the sdist's top folder, e.g. "tests/test_store.py"

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def folder(self) -> Path:
        """Where the members are unpacked: a ``tests/`` tree as the sdist has it."""
        return CACHE / f"{self.name}-{self.version}"


def unpacked(sdist: Sdist) -> Path:
    """The folder holding ``sdist``'s members, downloading and unpacking them on first use."""
    if _complete(sdist):
        return sdist.folder
    CACHE.mkdir(parents=True, exist_ok=True)
    with _locked(CACHE / ".lock"):
        if not _complete(sdist):  # another worker may have finished while this one waited
            _unpack(sdist, _download(sdist))
    return sdist.folder


def _complete(sdist: Sdist) -> bool:
    return all((sdist.folder / member).is_file() for member in sdist.members)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(sdist: Sdist) -> Path:
    """The checked sdist archive in the cache (downloaded unless an earlier run kept it)."""
    archives = CACHE / "sdists"
    archives.mkdir(exist_ok=True)
    for kept in archives.glob(f"*-{sdist.version}.tar.gz"):
        if _sha256(kept) == sdist.sha256:
            return kept
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += ["--disable-pip-version-check", "--quiet", "-d", scratch, sdist.spec]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        got = list(Path(scratch).glob("*.tar.gz"))
        if done.returncode != 0 or len(got) != 1:
            said = (done.stderr or done.stdout).strip().splitlines() or ["no archive"]
            raise UnavailableError(f"pip download {sdist.spec} failed: {said[-1]}")
        digest = _sha256(got[0])
        if digest != sdist.sha256:
            raise UnavailableError(f"{got[0].name}: sha256 {digest}, pinned {sdist.sha256}")
        kept = archives / got[0].name
        os.replace(got[0], kept)
    return kept


def _unpack(sdist: Sdist, archive: Path) -> None:
    """Extract only ``sdist.members`` into a scratch folder, then rename it into place."""
    shutil.rmtree(sdist.folder, ignore_errors=True)  # a tree from an older member list
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch, tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/", 1)[0]
        for member in sdist.members:
            source = tar.extractfile(f"{top}/{member}")
            if source is None:
                raise UnavailableError(f"{archive.name} has no {member}")
            target = Path(scratch, "tree", member)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
        os.replace(Path(scratch, "tree"), sdist.folder)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
