"""Make ``matrun-c04bc4d.duckdb`` (kept gzipped): a warehouse in the single-file format, as
matrun c04bc4d (the last release before the DuckLake warehouse) writes it with the DuckDB it
installs (2.0.0).  tests/test_warehouse_upgrade.py upgrades it.  Run with that matrun and DuckDB:

    git worktree add /tmp/oldmatrun c04bc4d
    python -m venv /tmp/d2 && /tmp/d2/bin/pip install duckdb==2.0.0 /tmp/oldmatrun
    cd /tmp/oldmatrun && /tmp/d2/bin/python <this file> OUT.duckdb && gzip -9 OUT.duckdb

It ingests six bundles (two sweeps; ok, failed and layer-profile runs), records an image and
registers study A6 with its quick profile's cells.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, "tests")

from bundle_factory import make_bundle  # noqa: E402

from matrun.runner.planning.matrix import load_matrix  # noqa: E402
from matrun.runner.planning.identity import plan_cells  # noqa: E402
from matrun.warehouse.db import open_warehouse  # noqa: E402
from matrun.warehouse.findings import register_study  # noqa: E402
from matrun.warehouse.images import record_images  # noqa: E402
from matrun.warehouse.ingest import ingest  # noqa: E402


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        for repeat in range(2):
            make_bundle(results, sweep="old-a", cell_id="a" * 16, repeat=repeat,
                        params={"framework": "torch", "threads": 2, "batch_size": 64})
            make_bundle(results, sweep="old-b", cell_id="b" * 16, repeat=repeat,
                        params={"framework": "torch", "threads": 4, "batch_size": 64})
        make_bundle(results, sweep="old-b", cell_id="c" * 16, status="failed", exit_code=1,
                    error_tail="boom")
        make_bundle(results, sweep="old-b", cell_id="d" * 16, params={"layer_profile": True},
                    layers=[{"name": "conv1", "kind": "conv", "index": 0, "forward_seconds": 0.001,
                             "backward_seconds": 0.002, "repeats": 5, "params": 156, "flops": 117600}])
        report = ingest([results], warehouse=out)
        assert len(report.ingested) == 6, report.summary()
    image = SimpleNamespace(tag="matrun/torch:cpu-0123456789ab", image_id="sha256:" + "1" * 64,
                            framework="torch", variant="cpu", content_hash="0123456789ab",
                            recipe_hash="r" * 12, base_image="matrun/base:bookworm", size_bytes=10**9,
                            build_seconds=321.5, probe=None, pins={"torch": "2.13.0"})
    assert record_images(out, [image]) == 1
    matrix = load_matrix(Path("studies/A6-threads.toml"), profile="quick")
    cells = plan_cells(matrix, lambda framework, variant: f"{framework}-{variant}-000000000000")
    with open_warehouse(out) as wh:
        register_study(wh.con, matrix.study, profile="quick", matrix="studies/A6-threads.toml",
                       cell_ids=[c.cell_id for c in cells])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
