"""The page of ``matrun compare --html``: one self-contained HTML file, every value escaped.

The comparison itself (matching, statistics, CSV and JSON) is ``matrun.warehouse.compare``;
this module only renders a ``Comparison`` with ``pages``' escaping helpers and writes it.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from matrun.errors import InputError
from matrun.reports.pages import Html, esc, join, table, tag
from matrun.warehouse.compare import (Comparison, Selection, fmt_noisy, fmt_num, fmt_p, fmt_points, fmt_ratio,
                                      fmt_ratio_ci)


def write_html(result: Comparison, path: Path | str) -> Path:
    """Write the comparison as one self-contained HTML page (every value escaped), atomically."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"--html {path}: is a directory; give a file name")
    text = html_page(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2433; margin: 24px 32px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #dde2ea; padding: 4px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.faster td { background: #e7f6ea; } tr.slower td { background: #fdecea; }
p.note { color: #5c6577; } code { background: #f0f2f5; padding: 0 3px; }
"""


def html_page(result: Comparison) -> str:
    """The comparison as HTML text (``pages``' escaping helpers; no script)."""
    def selection(sel: Selection) -> Html:
        return tag("li", join([tag("b", sel.side), f": {sel.describe()} ({len(sel.run_ids)} runs)"]))

    headers = ("cell", "A cells", "B cells", "A env", "B env", "runs A", "runs B", "train s A",
               "train s B", "time B/A", "img/s A", "img/s B", "img/s B/A", "accuracy Δ pts",
               "p", "test", "verdict", "noisy")
    rows = [(c["label"], " ".join(c["a_cells"] or []), " ".join(c["b_cells"] or []),
             " ".join(c["a_envs"] or []), " ".join(c["b_envs"] or []),
             c["a_runs"], c["b_runs"], fmt_num(c["a_train_s"], 2), fmt_num(c["b_train_s"], 2),
             fmt_ratio(c["time_ratio"]), fmt_num(c["a_throughput"]), fmt_num(c["b_throughput"]),
             fmt_ratio_ci(c["throughput_ratio"], c["throughput_ratio_low"], c["throughput_ratio_high"],
                          c["throughput_ratio_level"]), fmt_points(c["accuracy_change"]), fmt_p(c["p_value"]),
             c["test"] or "-", c["verdict"] or "not compared", fmt_noisy(c))
            for c in result.matched]
    body = [
        tag("h1", "matrun compare"),
        tag("ul", join([selection(result.a), selection(result.b)])),
        tag("p", result.summary()),
        tag("p", "Matched on every identity parameter"
            + (f" except {', '.join(result.ignored)}" if result.ignored else "")
            + "; the environment (env_id) is not part of the match. Ratios are B / A: time below "
              "1× and throughput above 1× mean B is faster; img/s B/A is the ratio of medians with "
              "its Hodges–Lehmann interval (95 %, or the level it reaches with few runs). The test "
              "is a two-sided Mann–Whitney U of the runs' throughput; with too few repeats it "
              "cannot reach p < 0.05 and the cell is 'not significant' whatever the medians say.",
            class_="note"),
        tag("h2", "Matched cells"),
        table(headers, rows, row_classes=[(c["verdict"] or "not-compared").replace(" ", "-")
                                          for c in result.matched]) if rows
        else tag("p", "No cell of A matches a cell of B.", class_="note"),
    ]
    for side, cells in (("A", result.only_a), ("B", result.only_b)):
        if cells:
            body.append(tag("h2", f"Only in {side} (no match on the other side)"))
            body.append(table(("cell", "cells", "envs", "ok runs", "img/s", "params"), [
                (c["label"], " ".join(c[f"{side.lower()}_cells"] or []),
                 " ".join(c[f"{side.lower()}_envs"] or []), c[f"{side.lower()}_runs"],
                 fmt_num(c[f"{side.lower()}_throughput"]), json.dumps(c["params"], sort_keys=True))
                for c in cells]))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc('matrun compare: ' + result.a.text + ' vs ' + result.b.text)}</title>\n"
            f"<style>{_CSS}</style>\n</head>\n<body>\n{join(body, chr(10))}\n</body>\n</html>\n")
