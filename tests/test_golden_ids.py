"""Cell identity is a contract: the ids of every cell of matrix.toml and of every study.

tests/golden/cell_ids.json was computed before the code was reshaped (issue 10) and pins, for
each matrix file, every cell's id under the docker executor (identity parameters + recipe
hash) and under the local executor (identity parameters + pins, Python version and harness
protocol).  A change that moves any of them re-runs every user's finished work: it needs a
migration and a reason, never a silent edit of the golden file.  When the repository's own
matrix changes (new cells, not a new way to compute ids), its previous version moves to
tests/golden/ with its pins (tests/golden/matrix-before-jax.toml: the three-framework demo),
and the new cells get pins of their own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from matrun.errors import InputError
from matrun.runner.environments.releases import env_variant
from matrun.runner.executors.registry import EXECUTORS
from matrun.runner.planning.identity import cell_id
from matrun.runner.planning.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "cell_ids.json").read_text())
MATRICES = sorted(GOLDEN["matrices"])


def test_every_pinned_matrix_is_still_in_the_repository():
    # A study renamed or removed would silently drop its pins: rename it here too, on purpose.
    missing = [name for name in MATRICES if not (ROOT / name).is_file()]
    assert not missing, f"pinned matrices no longer in the repository: {missing}"


@pytest.mark.parametrize("name", MATRICES)
def test_cell_ids_are_unchanged(name: str):
    matrix = load_matrix(ROOT / name)
    docker, local = EXECUTORS["docker"](), EXECUTORS["local"]()
    expected = GOLDEN["matrices"][name]
    assert len(matrix.cells) == len(expected)
    same_python = GOLDEN["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    for cell, want in zip(matrix.cells, expected):
        fw, variant = cell.values["framework"], env_variant(cell.values)  # variant@version for a release
        d_env = docker.env_id(fw, variant)
        assert (d_env, cell_id(cell.identity, d_env)) == (want["docker_env"], want["docker"]), cell.values
        try:
            l_env = local.env_id(fw, variant)
        except InputError:  # an image-only variant has no local environment
            l_env = None
        if l_env is None or not same_python:
            assert l_env is None or want["local"] is not None
            continue
        assert (l_env, cell_id(cell.identity, l_env)) == (want["local_env"], want["local"]), cell.values
