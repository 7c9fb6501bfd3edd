"""The ``images`` table: what ``matrun build`` built and what the probe found in each image."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from matrun.warehouse import materialise
from matrun.warehouse.db import open_warehouse

COLUMNS = ("tag", "image_id", "framework", "variant", "content_hash", "recipe_hash", "base_image",
           "size_bytes", "build_seconds", "recorded_at", "framework_version", "python", "cuda", "cudnn",
           "blas", "onednn", "openmp", "pins", "probe")


def _utc(moment: datetime) -> datetime:
    """A time as the warehouse stores it: TIMESTAMP in UTC, without a time zone."""
    return moment.astimezone(timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


def image_row(built: Any, *, now: datetime | None = None) -> dict[str, Any]:
    """One row of the table from a ``BuiltImage`` of ``matrun build`` (``runner/environments/``)."""
    probe = built.probe
    pins = json.dumps(dict(getattr(built, "pins", {}) or {}), sort_keys=True)
    return {
        "tag": built.tag, "image_id": built.image_id, "framework": built.framework, "variant": built.variant,
        "content_hash": built.content_hash, "recipe_hash": built.recipe_hash or None,
        "base_image": built.base_image or None, "size_bytes": built.size_bytes,
        "build_seconds": built.build_seconds, "recorded_at": _utc(now or datetime.now(timezone.utc)),
        "framework_version": getattr(probe, "framework_version", None), "python": getattr(probe, "python", None),
        "cuda": getattr(probe, "cuda", None), "cudnn": getattr(probe, "cudnn", None),
        "blas": getattr(probe, "blas", None), "onednn": getattr(probe, "onednn", None),
        "openmp": getattr(probe, "openmp", None), "pins": pins,
        "probe": None if probe is None else json.dumps(dict(probe.raw), sort_keys=True, default=str),
    }


def record_images(warehouse: Path | str, built: Iterable[Any]) -> int:
    """Insert or replace the images (by tag) in one transaction; returns how many.

    An image found already built (``build_seconds`` None) keeps the build time recorded
    when it was built; a probe that was skipped keeps the earlier probe's findings.
    """
    rows = [image_row(b) for b in built]
    if not rows:
        return 0
    placeholders = ", ".join("?" for _ in COLUMNS)
    keep = ("build_seconds", "framework_version", "python", "cuda", "cudnn", "blas", "onednn", "openmp", "probe")
    with open_warehouse(warehouse, wait_s=30.0) as wh:
        wh.con.execute("BEGIN")
        try:
            for row in rows:  # the lake has no upsert: read the old row, delete it, insert
                cur = wh.con.execute(f"SELECT {', '.join(keep)} FROM images WHERE tag = ?", [row["tag"]])
                old = cur.fetchone()
                if old is not None:
                    row = {**row, **{c: v for c, v in zip(keep, old) if row[c] is None}}
                    wh.con.execute("DELETE FROM images WHERE tag = ?", [row["tag"]])
                wh.con.execute(f"INSERT INTO images ({', '.join(COLUMNS)}) VALUES ({placeholders})",
                               [row[c] for c in COLUMNS])
            materialise.refresh(wh.con)  # an image's BLAS is part of its cells' statistics
            wh.con.execute("COMMIT")
        except BaseException:
            wh.con.execute("ROLLBACK")
            raise
    return len(rows)


def list_images(warehouse: Path | str) -> list[dict[str, Any]]:
    """The recorded images, newest first, as dictionaries."""
    with open_warehouse(warehouse, read_only=True, wait_s=30.0) as wh:
        cur = wh.con.execute(
            "SELECT tag, framework, variant, framework_version, python, blas, onednn, cuda, cudnn, "
            "size_bytes, build_seconds, recorded_at, image_id, base_image FROM images "
            "ORDER BY framework, variant, recorded_at DESC")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]
