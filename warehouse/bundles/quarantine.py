"""Setting a damaged bundle aside: ``matrun ingest --quarantine`` (docs/BUNDLE.md "Quarantine").

A bundle an ingest skipped (damaged, in conflict with a run already in the warehouse, refused
by it) stays where it is, so every later ingest and sweep of its folder skips it again and
exits 1.  :func:`quarantine` moves it, once, into the folder ``.quarantine`` beside it
(``<results>/<sweep>/<cell_id>/.quarantine/<repeat>-<attempt>/``), which no ingest or sweep
reads (``read.find_bundles`` does not enter it), and writes ``quarantine.json`` into it: the
reason it was skipped, where it was, when.  Its attempt number stays taken
(``write.next_attempt`` counts the quarantined attempts), so no later run gets its run id.

Nothing is lost: the bundle is moved with one ``rename`` or not at all.  A quarantine folder
that cannot be made or written (a file in its place, a read-only directory, a symbolic link,
another file system) raises :class:`QuarantineError` naming it, and the bundle stays where
it was.  A name already taken in the quarantine folder gets a suffix (``0-1.2``): nothing
there is replaced.  Standard library only.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from matrun.errors import BundleError
from matrun.warehouse.bundles.layout import QUARANTINE, QUARANTINE_NOTE
from matrun.warehouse.bundles.write import fsync_dir, write_json_atomic

#: The most suffixes tried for a name already taken in the quarantine folder.
MAX_SUFFIX = 1000


class QuarantineError(BundleError):
    """A bundle could not be set aside; it stays where it was."""


@dataclass(frozen=True)
class Quarantined:
    """A bundle moved from ``source`` to ``target`` because of ``reason``."""

    source: Path
    target: Path
    reason: str


def quarantine(bundle: Path, reason: str) -> Quarantined:
    """Move ``bundle`` into ``.quarantine`` beside it, with ``quarantine.json`` saying why.

    Raises :class:`QuarantineError` (the bundle where it was, nothing written in it) when
    the quarantine folder cannot be made or the bundle cannot be moved there.  A bundle
    already in a quarantine folder stays there (``target`` is ``source``).
    """
    bundle = Path(bundle)
    if bundle.parent.name == QUARANTINE:  # set aside already (an ingest of the quarantine folder)
        return Quarantined(bundle, bundle, reason)
    folder = bundle.parent / QUARANTINE
    if folder.is_symlink():
        raise _refused(bundle, folder, "is a symbolic link (a quarantine folder is a real directory "
                                       "beside the bundle)")
    if os.path.lexists(folder) and not folder.is_dir():
        raise _refused(bundle, folder, "is not a directory")
    try:
        folder.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        raise _refused(bundle, folder, _why(exc)) from None
    target = _free_name(folder, bundle.name)
    try:
        os.rename(bundle, target)
    except OSError as exc:
        where = folder if exc.errno != errno.ENOENT else bundle
        raise _refused(bundle, where, _why(exc)) from None
    note = {"reason": reason, "from": str(bundle),
            "quarantined_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        write_json_atomic(target / QUARANTINE_NOTE, note)
        fsync_dir(folder)
        fsync_dir(bundle.parent)
    except OSError as exc:  # the note cannot be written: put the bundle back as it was
        try:
            os.rename(target, bundle)
        except OSError:
            raise QuarantineError(f"cannot write {target / QUARANTINE_NOTE}: {_why(exc)}; the bundle is in "
                                  f"{target} without it (the reason was: {reason})") from None
        raise _refused(bundle, folder, _why(exc)) from None
    return Quarantined(bundle, target, reason)


def quarantine_all(skipped: Iterable[tuple[Path, str]]) -> tuple[list[Quarantined], list[str]]:
    """:func:`quarantine` each ``(bundle, reason)``: the bundles moved, and the message of each
    one that could not be (it stays where it was; the others are moved all the same)."""
    moved: list[Quarantined] = []
    failed: list[str] = []
    for bundle, reason in skipped:
        try:
            moved.append(quarantine(bundle, reason))
        except QuarantineError as exc:
            failed.append(str(exc))
    return moved, failed


def _free_name(folder: Path, name: str) -> Path:
    """``folder / name``, or ``name.2``, ``name.3``… when taken: nothing is replaced."""
    for n in range(1, MAX_SUFFIX + 1):
        target = folder / (name if n == 1 else f"{name}.{n}")
        if not os.path.lexists(target):
            return target
    raise QuarantineError(f"cannot quarantine {folder.parent / name}: {folder} already holds {MAX_SUFFIX} "
                          f"bundles named {name}; the bundle stays where it was")


def _refused(bundle: Path, folder: Path, why: str) -> QuarantineError:
    return QuarantineError(f"cannot quarantine {bundle}: {folder}: {why}; the bundle stays where it was")


def _why(exc: OSError) -> str:
    if exc.errno == errno.EXDEV:
        return "on another file system than the bundle (it is moved with one rename, never copied)"
    return exc.strerror or str(exc)
