"""How good are `matrun studies`' time estimates?  Leave-one-study-out over a warehouse where
study profiles ran: for each (study, profile) with ok runs, the estimate the catalogue would
have given before it ran (the cost model built from every OTHER study's runs, so none of the
study's own cells is known) against the wall time its runs really took.  Prints the ratio
estimate / measured per study profile and their median; no pass / fail.

    .venv/bin/python benchmarks/study_estimates.py --warehouse matrun.duckdb --studies studies
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.planning.studies import CostModel, study_files
from matrun.warehouse.db import open_warehouse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", type=Path, required=True)
    ap.add_argument("--studies", type=Path, default=Path("studies"))
    ap.add_argument("--matrix", type=Path, action="append", default=[], help="more study files (e.g. matrix.toml)")
    args = ap.parse_args()
    with open_warehouse(args.warehouse, read_only=True) as wh:
        done = wh.con.execute("""
            SELECT sc.study, sc.profile, list(DISTINCT sc.cell_id), sum(r.wall_seconds), count(*)
            FROM study_cells sc JOIN runs r USING (cell_id)
            WHERE r.status = 'ok' GROUP BY ALL""").fetchall()
    files = {}
    for path in [*study_files(args.studies), *args.matrix]:
        m = load_matrix(path)
        if m.study is not None:
            files[m.study.id] = path
    print(f"{'study':<20} {'profile':<8} {'runs':>5} {'measured':>9} {'estimate':>9} {'ratio':>6}  basis")
    ratios = []
    for study, profile, cells, measured, n in sorted(done):
        if study not in files:
            continue
        model = CostModel.read(args.warehouse, exclude=cells)
        matrix = load_matrix(files[study], None if profile == "(base)" else profile)
        runner, _ = get_executor(matrix.sweep.executor)
        planned = [pc for pc in plan_cells(matrix, runner.env_id)]
        estimate, basis = model.estimate(matrix, planned)
        ratio = estimate / measured if estimate else None
        if ratio:
            ratios.append(ratio)
        shown = f"{estimate:9.0f}" if estimate else "  unknown"
        print(f"{study:<20} {profile:<8} {n:>5} {measured:9.0f} {shown} {ratio or float('nan'):6.2f}  {basis}")
    if ratios:
        print(f"median estimate / measured over {len(ratios)} study profiles: {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
