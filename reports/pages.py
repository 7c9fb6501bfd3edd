"""HTML writing: escaping, tables, embedded figures, the page template, the site on disk.

Everything that comes from the data is escaped here.  ``Html`` marks a string that is
already markup; any other value put into a table or a tag is escaped, so a caller cannot
forget.  Figures are embedded as JSON inside ``<script>`` with ``<``, ``>``, ``&`` written
as ``\\u003c`` and so on, so no label can close the script element.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import secrets
import shutil
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any, Iterable, Mapping, Sequence

import plotly.graph_objects as go
import plotly.io as pio

from matrun.errors import InputError

ASSETS = "assets"
PLOTLY_JS = f"{ASSETS}/plotly.min.js"
STYLESHEET = f"{ASSETS}/report.css"
# Marks a directory as a matrun report, so a rebuild may replace it and nothing else.
MARKER = ".matrun-report"


class Html(str):
    """A string that is already HTML: inserted as is, never escaped again."""


def esc(value: Any) -> Html:
    """``value`` as HTML text: escaped unless it already is ``Html``; None shows as a dash."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("–")
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Html:
    """Concatenate, escaping every part that is not ``Html``."""
    return Html(sep.join(esc(p) for p in parts))


def tag(name: str, content: Any = "", **attrs: Any) -> Html:
    """``<name attrs>content</name>``; attribute values and non-Html content escaped.

    ``class_`` is written ``class``; attributes whose value is None or False are left out.
    """
    rendered = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{html.escape(str(value), quote=True)}"'
        for key, value in attrs.items()
        if value is not None and value is not False
    )
    return Html(f"<{name}{rendered}>{esc(content)}</{name}>")


def table(
    headers: Sequence[Any],
    rows: Iterable[Sequence[Any]],
    *,
    row_classes: Iterable[str | None] | None = None,
    after: Iterable[Any] | None = None,
    class_: str = "data",
    id: str | None = None,
) -> Html:
    """A ``<table>``: a header row, then one row per sequence of cells (escaped unless Html).

    Numeric cells (numbers, or ``Html`` made by a ``num`` helper) are right-aligned, and so
    is the header of a column whose first row is numeric.  ``after`` gives, per row,
    content for a full-width row below it (None for none), such as an error tail.
    """
    rows = [list(row) for row in rows]
    numeric = [_numeric(cell) for cell in rows[0]] if rows else []
    head = join(
        tag("th", h, class_="num" if i < len(numeric) and numeric[i] else None)
        for i, h in enumerate(headers)
    )
    classes = list(row_classes) if row_classes is not None else None
    extras = list(after) if after is not None else None
    body: list[Html] = []
    for i, row in enumerate(rows):
        cells = join(tag("td", cell, class_="num" if _numeric(cell) else None) for cell in row)
        row_class = classes[i] if classes else None
        body.append(tag("tr", cells, class_=row_class))
        if extras and extras[i] is not None:
            body.append(tag("tr", tag("td", extras[i], colspan=len(headers)),
                            class_=f"tail-row {row_class or ''}".strip()))
    return tag(
        "table",
        Html(f"<thead><tr>{head}</tr></thead><tbody>{join(body)}</tbody>"),
        class_=class_, id=id,
    )


def _numeric(cell: Any) -> bool:
    if isinstance(cell, bool):
        return False
    if isinstance(cell, (int, float)):
        return True
    return isinstance(cell, Html) and cell.startswith('<span class="n">')


def script_json(text: str) -> Html:
    """JSON text made safe inside ``<script>``: no ``</script>``, ``<!--`` or ``&`` survive.

    The escapes are JSON string escapes, so the value the script reads is unchanged
    (outside strings, JSON never contains these characters).
    """
    return Html(
        text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


_PLOT_CONFIG = '{"responsive": true, "displaylogo": false}'


def figure(fig: go.Figure, div_id: str) -> Html:
    """A figure as a ``<div>`` plus the ``<script>`` that draws it with the shared plotly.js."""
    spec = script_json(pio.to_json(fig, validate=False))
    return Html(
        f'<div class="figure" id="{html.escape(div_id)}"></div>\n'
        f'<script>(function () {{ var fig = {spec};\n'
        f'Plotly.newPlot("{html.escape(div_id)}", fig.data, fig.layout, {_PLOT_CONFIG});'
        f" }})();</script>"
    )


def _read_template(name: str) -> Template:
    return Template(resources.files("matrun.reports").joinpath("templates", name).read_text("utf-8"))


def render_page(*, title: str, subtitle: Html, nav: Sequence[tuple[str, str]], body: Html,
                generated: datetime | None = None,
                site_nav: Sequence[tuple[str, str]] = (), current: str | None = None) -> str:
    """The whole page from the template: ``nav`` is (anchor, text) pairs; body is Html.

    ``site_nav`` is (page file, text) pairs: the links between the pages of a site, all
    relative; the one named ``current`` is marked as the page being read.
    """
    when = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    links = join(tag("a", text, href=f"#{anchor}") for anchor, text in nav)
    pages = join(
        tag("a", text, href=href, class_="current" if href == current else None,
            aria_current="page" if href == current else None)
        for href, text in site_nav
    )
    return _read_template("page.html").substitute(
        title=esc(title), subtitle=subtitle, nav=links, body=body, generated=esc(when),
        plotly_js=PLOTLY_JS, stylesheet=STYLESHEET, site_nav=pages,
    )


# --- CSV downloads ------------------------------------------------------------------------

# A spreadsheet treats a cell that starts with one of these as a formula (CSV injection).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_value(value: Any) -> str:
    """One CSV cell: numbers as Python writes them, None empty, lists and dicts as JSON.

    Text that a spreadsheet would run as a formula (it starts with ``= + - @``, a tab or a
    carriage return) gets a leading apostrophe, so it is shown, never evaluated; numbers,
    negative ones included, are written as numbers.
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "" if isinstance(value, float) and math.isnan(value) else repr(value)
    if isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, default=str, ensure_ascii=False)
    elif hasattr(value, "isoformat"):
        text = value.isoformat()
    else:
        text = str(value)
    return f"'{text}" if text.startswith(FORMULA_PREFIXES) else text


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A CSV file (header row, then ``rows``), every cell through ``csv_value``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_value(c) for c in columns])
    for row in rows:
        writer.writerow([csv_value(v) for v in row])
    return buf.getvalue()


def download_link(href: str, text: str = "Download CSV") -> Html:
    """A relative link to a file of the site, offered as a download."""
    return tag("a", text, href=href, download=href.rsplit("/", 1)[-1], class_="download")


def plotly_js_source() -> Path:
    """The plotly.js bundled with the installed plotly package (never a CDN)."""
    source = resources.files("plotly").joinpath("package_data", "plotly.min.js")
    path = Path(str(source))
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js is missing from the plotly package ({path})")
    return path


def write_site(out_dir: Path, pages: Mapping[str, str]) -> Path:
    """Write ``pages`` (relative path -> HTML) and the assets into ``out_dir``, whole or not at all.

    The site is built in a sibling temporary directory, then swapped in by renames, so a
    failed build leaves the previous report as it was.  An existing ``out_dir`` is
    replaced only when it is empty or a previous matrun report.  Returns ``index.html``.
    """
    out_dir = Path(os.path.abspath(out_dir))
    _check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        (tmp / ASSETS).mkdir()
        shutil.copyfile(plotly_js_source(), tmp / PLOTLY_JS)
        css = resources.files("matrun.reports").joinpath("static", "report.css")
        (tmp / STYLESHEET).write_text(css.read_text("utf-8"), encoding="utf-8")
        for rel, text in pages.items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (tmp / MARKER).write_text("written by matrun report; safe to replace\n", encoding="utf-8")
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir / "index.html"


def check_replaceable(out_dir: Path) -> None:
    """Raise ``InputError`` unless ``out_dir`` is new, empty or a previous matrun report."""
    _check_replaceable(Path(os.path.abspath(out_dir)))


def _check_replaceable(out_dir: Path) -> None:
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(f"report directory {out_dir} exists and is not a directory")
    if (out_dir / MARKER).exists() or not any(out_dir.iterdir()):
        return
    raise InputError(
        f"report directory {out_dir} exists and is not a matrun report (no {MARKER} in it); "
        "choose a new or empty directory"
    )


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``, moving a previous report aside first and then away."""
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)
