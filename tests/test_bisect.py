"""``matrun bisect`` (issue 29): the search over releases with a planted regression (every
release from one on made slower on purpose, the measurements drawn with noise), the releases it
may measure, a release it cannot measure, and the refusals (good not faster than bad, an end
not offered, the same release twice, more than one workload, bad flags)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from matrun.errors import InputError
from matrun.runner.environments.releases import lock_path, requirements_of
from matrun.runner.sweep.bisect import bisect, releases_between, sentences, to_json_doc

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
RELEASES = ["2.0.0", "2.0.1", "2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.1", "2.2.2", "2.3.0", "2.3.1",
            "2.4.0", "2.4.1", "2.5.0"]


def planted(releases: list[str], slow_from: str, *, slowdown: float = 0.8, cv: float = 0.03, runs: int = 5,
            seed: int = 0, untestable: tuple[str, ...] = ()):
    """A measure function: throughput 1000 img/s with ``cv`` noise, times ``slowdown`` from
    ``slow_from`` on; the releases it was asked for, in order."""
    rng = random.Random(seed)
    asked: list[str] = []

    def measure(release: str):
        asked.append(release)
        if release in untestable:
            return "not measured: the environment could not be built"
        base = 1000.0 * (slowdown if releases.index(release) >= releases.index(slow_from) else 1.0)
        return [base * rng.lognormvariate(0, cv) for _ in range(runs)]

    return measure, asked


def run(releases, measure, **kw):
    return bisect(releases, measure, framework="torch", workload="lenet5", metric="throughput", unit="img/s",
                  larger_is_better=True, **kw)


@pytest.mark.parametrize("n", [len(RELEASES), 8, 9, 3, 2])
def test_bisect_finds_the_planted_regression_wherever_it_is_within_its_bound(n):
    releases = RELEASES[:n]
    for k, slow_from in enumerate(releases[1:], start=1):
        measure, asked = planted(releases, slow_from, seed=k)
        result = run(releases, measure)
        assert result.first_bad == slow_from and result.last_good == releases[k - 1], (n, slow_from)
        assert len(asked) == len(set(asked)) == len(result.measured) <= result.bound, (asked, result.bound)
        assert asked[:2] == [releases[0], releases[-1]]  # both ends first
    assert result.bound == 2 + math.ceil(math.log2(max(1, n - 1)))


def test_the_change_is_reported_with_its_ratio_interval_and_p():
    measure, _ = planted(RELEASES, "2.3.0", slowdown=0.7)
    result = run(RELEASES, measure)
    c = result.change
    assert 0.6 < c["ratio"] < 0.8 and c["ratio_low"] <= c["ratio"] <= c["ratio_high"] and c["p_value"] < 0.05
    text = "\n".join(sentences(result))
    assert "first bad release: 2.3.0 (2.2.2 is the last good one)" in text
    doc = json.loads(json.dumps(to_json_doc(result)))
    assert doc["first_bad"] == "2.3.0" and doc["measured_releases"] <= doc["bound"]
    assert {m["verdict"] for m in doc["measured"]} <= {"good", "bad"}


def test_a_release_that_cannot_be_measured_is_skipped_for_a_neighbour():
    releases = RELEASES[:9]  # 2.0.0 … 2.3.0; the first mid is 2.2.0 (index 4)
    measure, asked = planted(releases, "2.2.1", untestable=("2.1.2",))
    result = run(releases, measure)
    assert result.first_bad == "2.2.1" and result.last_good == "2.2.0"
    assert result.measured["2.1.2"].verdict == "untestable" and "could not be built" in result.measured["2.1.2"].how


def test_when_every_release_between_is_untestable_the_range_is_named():
    releases = RELEASES[:4]
    measure, _ = planted(releases, "2.1.0", untestable=("2.0.1", "2.1.0"))
    result = run(releases, measure)
    assert result.skipped_between == ["2.0.1", "2.1.0"]
    assert "the change lies between 2.0.0 (good) and 2.1.1 (bad)" in "\n".join(sentences(result))


def test_a_good_release_that_is_not_faster_than_the_bad_one_is_refused():
    measure, asked = planted(RELEASES, "2.5.0", slowdown=1.0)  # no regression at all
    with pytest.raises(InputError) as err:
        run(RELEASES, measure)
    assert "--bad 2.5.0 is not slower than --good 2.0.0" in str(err.value) and "nothing to bisect" in str(err.value)
    assert asked == ["2.0.0", "2.5.0"], "nothing between is measured"
    faster, _ = planted(RELEASES, "2.2.0", slowdown=1.3)  # an improvement, not a regression
    with pytest.raises(InputError, match="is not slower"):
        run(RELEASES, faster)


def test_an_end_that_cannot_be_measured_is_refused():
    measure, _ = planted(RELEASES, "2.2.0", untestable=("2.0.0",))
    with pytest.raises(InputError, match="--good 2.0.0: no ok run to compare"):
        run(RELEASES, measure)


def test_the_releases_between_good_and_bad_are_the_offered_ones():
    offered = ["1.13.1", "2.0.0", "2.0.1", "2.1.0rc1", "2.1.0", "2.2.0", "2.13.0+cpu"]
    offered = [v for v in offered if "+" not in v]
    assert releases_between(offered, "2.0.0", "2.2.0") == ["2.0.0", "2.0.1", "2.1.0", "2.2.0"]
    assert releases_between(offered, "2.2.0", "2.0.0") == ["2.2.0", "2.1.0", "2.0.1", "2.0.0"]  # newer was good
    assert "2.1.0rc1" in releases_between(offered, "2.1.0rc1", "2.2.0")
    with pytest.raises(InputError, match=r"--bad 2\.0\.7: not a release the package index offers here; nearest"):
        releases_between(offered, "2.0.0", "2.0.7")
    with pytest.raises(InputError, match="the same release"):
        releases_between(offered, "2.0.0", "2.0")


# -- the command line ----------------------------------------------------------------------------


def _locked(home: Path, framework: str, version: str, package: str) -> None:
    """A lock written where matrun keeps it, so planning needs no package index."""
    requested = requirements_of(framework, "cpu", version)
    path = lock_path(framework, "cpu", version, requested)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "framework": framework, "variant": "cpu", "version": version,
                                "requested": requested, "python": "3.11", "platform": "linux x86_64",
                                "pins": [{"name": package, "version": version, "sha256": "ab" * 32}]}))


@pytest.mark.parametrize("args, words", [
    (["--bad", "2.4.1"], ["--good is missing"]),
    (["--good", "2.0.0", "--bad", "v2"], ["--bad", "expected a release"]),
    (["--good", "2.0.0", "--bad", "2.4.1", "--repeats", "1"], ["--repeats", "at least 2"]),
    (["--good", "2.0.0", "--bad", "2.4.1", "--repeats", "3..9"], ["--repeats", "at least 2"]),
    (["--good", "2.0.0", "--bad", "2.4.1", "--executor", "docker"], ["--executor", "no image per release"]),
    (["--good", "2.0.0", "--bad", "2.4.1", "--metric", "accuracy"], ["--metric"]),
    (["--good", "2.0.0", "--bad", "2.4.1"], ["bisect measures one workload: 2 workloads", "--where"]),
    (["--good", "2.0.0", "--bad", "2.4.1", "--where", "threads=3"], ["--where matches no cell"]),
])
def test_bisect_refuses_bad_flags_and_a_selection_of_other_than_one_workload(tmp_path, monkeypatch, args, words):
    home = tmp_path / "home"
    monkeypatch.setenv("MATRUN_HOME", str(home))
    _locked(home, "torch", "2.0.0", "torch")
    path = tmp_path / "matrix.toml"
    path.write_text('[fixed]\nmodel = "lenet5"\ndataset = "synthetic"\n[axes]\nthreads = [1, 2]\n')
    proc = subprocess.run([*MATRUN, "bisect", str(path), *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "MATRUN_HOME": str(home)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Error:" in proc.stderr and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
