"""Matrix profiles (``[profiles.<name>]``, ``--profile``), study files refused on a host without
the GPUs they need, and ``matrun studies`` (the catalogue): malformed and hostile values too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from matrun.errors import MatrixError
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix

STUDY = """
[study]
id = "A6"
title = "Threads"
seed = "000_55992cd604dc8adf.txt"
source = "Table XII"
needs = "cpu"

[[findings]]
id = "oversubscription"
claim = "More threads than cores slows training"
cite = "Table XII"
check = "oversubscription"
x = "threads"
metric = "throughput"
"""

BASE = """
[sweep]
name = "threads"
repeats = 3

[fixed]
epochs = 10
batch_size = 64

[axes]
threads = [1, 2, 4, 8, 16]

[[zip]]
framework = ["torch", "tensorflow"]
lr = [0.01, 0.05]
layout = ["nchw", "nhwc"]
"""


def write(tmp_path: Path, text: str, name: str = "study.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def values(matrix, *keys):
    return [tuple(c.values[k] for k in keys) for c in matrix.cells]


def test_a_profile_overrides_sweep_fixed_axes_and_names_its_own_sweep(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + """
[profiles.quick]
about = "one epoch, 1 to 4 threads"
sweep = { repeats = 4 }
fixed = { epochs = 1, train_limit = 3000 }
axes = { threads = [1, 4] }
""")
    base = load_matrix(path)
    assert base.profile is None and base.profiles == {"quick": "one epoch, 1 to 4 threads"}
    assert base.sweep.repeats == 3 and len(base.cells) == 10 and {c.values["epochs"] for c in base.cells} == {10}
    quick = load_matrix(path, "quick")
    assert quick.profile == "quick" and quick.sweep.name == "threads-quick" and quick.sweep.repeats == 4
    assert values(quick, "threads", "framework", "epochs", "train_limit") == [
        (1, "torch", 1, 3000), (1, "tensorflow", 1, 3000), (4, "torch", 1, 3000), (4, "tensorflow", 1, 3000)]
    # the base's cells are the same with the profiles section present or not
    plain = load_matrix(write(tmp_path, BASE, "plain.toml"))
    assert [c.identity for c in plain.cells] == [c.identity for c in base.cells]


def test_a_profile_may_fix_what_the_base_varies_and_vary_what_it_fixes(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + """
[profiles.one]
fixed = { threads = 2, framework = "torch" }
axes = { epochs = [1, 2] }
sweep = { name = "mine" }
""")
    m = load_matrix(path, "one")
    assert m.sweep.name == "mine"
    # the zip lost framework: its remaining keys (lr, layout) stay zipped, two rows
    assert values(m, "threads", "framework", "epochs", "lr", "layout") == [
        (2, "torch", 1, 0.01, "nchw"), (2, "torch", 1, 0.05, "nhwc"),
        (2, "torch", 2, 0.01, "nchw"), (2, "torch", 2, 0.05, "nhwc")]


def test_a_zip_that_loses_keys_drops_its_repeated_rows_and_profile_zips_are_added(tmp_path: Path) -> None:
    path = write(tmp_path, """
[[zip]]
framework = ["torch", "torch", "tensorflow"]
lr = [0.01, 0.05, 0.05]
[profiles.q]
fixed = { lr = 0.02 }
zip = [ { batch_size = [32, 64], epochs = [1, 2] } ]
""")
    m = load_matrix(path, "q")
    assert values(m, "framework", "lr", "batch_size", "epochs") == [
        ("torch", 0.02, 32, 1), ("torch", 0.02, 64, 2), ("tensorflow", 0.02, 32, 1), ("tensorflow", 0.02, 64, 2)]


def test_an_unknown_profile_names_the_declared_ones(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "[profiles.quick]\nfixed = { epochs = 1 }\n[profiles.tiny]\nfixed = { epochs = 1 }\n")
    with pytest.raises(MatrixError, match=r"\[profiles -> fast\] no such profile; this file declares: quick, tiny"):
        load_matrix(path, "fast")
    with pytest.raises(MatrixError, match=r"declares: none"):
        load_matrix(write(tmp_path, BASE, "none.toml"), "quick")


@pytest.mark.parametrize("text, message", [
    ("[profiles.quick]\nfixed = { epochs = 0 }", r"\[profiles -> quick -> fixed -> epochs\] expected a positive integer"),
    ("[profiles.quick]\naxes = { threads = [] }", r"\[profiles -> quick -> axes -> threads\] is empty"),
    ("[profiles.quick]\naxes = { threads = 4 }", r"\[profiles -> quick -> axes -> threads\] expected a list"),
    ("[profiles.quick]\nsweep = { repeats = -1 }", r"\[profiles -> quick -> sweep -> repeats\] expected a repeat count"),
    ("[profiles.quick]\nsweep = { name = \"../x\" }", r"\[profiles -> quick -> sweep -> name\] expected a name"),
    ("[profiles.quick]\nfixed = { bogus = 1 }", r"\[profiles -> quick -> fixed -> bogus\] unknown parameter"),
    ("[profiles.quick]\nzip = [ { lr = [0.1, 0.2], epochs = [1] } ]", r"\[profiles -> quick -> zip -> 0\] zipped lists"),
    ("[profiles.quick]\nfixed = { epochs = 1 }\naxes = { epochs = [1, 2] }", r"\[profiles -> quick -> axes -> epochs\] is also set"),
    ("[profiles.quick]\nrepeats = 3", r"\[profiles -> quick -> repeats\] unknown key; a profile may set about, sweep"),
    ("[profiles.quick]\nabout = 3", r"\[profiles -> quick -> about\] expected a line of text"),
    ("[profiles.quick]\nabout = \"a\\u0000b\"", r"\[profiles -> quick -> about\] expected a line of text"),
    ("[profiles.Quick]\nfixed = { epochs = 1 }", r"\[profiles -> Quick\] expected a profile name"),
    ('[profiles."$(rm -rf /)"]\nfixed = { epochs = 1 }', r"\[profiles -> \$\(rm -rf /\)\] expected a profile name"),
    ("profiles = 3", r"\[profiles\] expected tables \[profiles.<name>\], got 3"),
    ("[profiles]\nquick = 3", r"\[profiles -> quick\] expected a table"),
    ("[profiles.quick]\nfixed = [1, 2]", r"\[profiles -> quick -> fixed\] expected a table"),
    ("[profiles.quick]\nzip = 5", r"\[profiles -> quick -> zip\] expected \[\[zip\]\] tables"),
])
def test_every_profile_is_checked_even_when_not_applied(tmp_path: Path, text: str, message: str) -> None:
    # (a top-level key must come before the base's tables)
    path = write(tmp_path, text + "\n" + BASE if text.startswith("profiles =") else BASE + text + "\n")
    with pytest.raises(MatrixError, match=message):
        load_matrix(path)


def test_too_many_profiles_are_refused(tmp_path: Path) -> None:
    text = BASE + "".join(f"[profiles.p{i}]\nfixed = {{ epochs = 1 }}\n" for i in range(40))
    with pytest.raises(MatrixError, match=r"\[profiles\] declares 40 profiles; at most 32"):
        load_matrix(write(tmp_path, text))


def test_a_profile_whose_cells_cannot_run_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + '[profiles.bad]\nfixed = { conv_algo = "autotune" }\n')
    load_matrix(path)  # the base is fine
    with pytest.raises(MatrixError, match="autotune"):
        load_matrix(path, "bad")


def run_matrun(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "matrun.runner.cli.main", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_plan_with_a_profile_and_an_unknown_one(tmp_path: Path) -> None:
    path = write(tmp_path, STUDY + BASE + "[profiles.quick]\naxes = { threads = [1, 2] }\n")
    done = run_matrun("plan", path, "--profile", "quick", "--where", "framework=torch", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "6 runs: 0 done, 6 to run" in done.stdout and "--profile quick" in done.stdout
    bad = run_matrun("plan", path, "--profile", "nope", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("Error: study.toml: [profiles -> nope] no such profile")
    assert "Traceback" not in bad.stderr


def test_a_gpu_study_is_refused_on_a_host_without_gpus_before_anything_runs(tmp_path: Path) -> None:
    if list(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this host has GPUs")
    text = STUDY.replace('needs = "cpu"', 'needs = "gpu"\ngpus = 4').replace('id = "A6"', 'id = "E-multi-gpu"') + """
[sweep]
name = "multi"
[fixed]
device = "gpu"
variant = "cuda"
[axes]
gpus = [1, 2, 4]
[profiles.quick]
axes = { gpus = [1, 2] }
"""
    path = write(tmp_path, text)
    for extra in ((), ("--profile", "quick")):
        done = run_matrun("sweep", path, "--executor", "local", *extra, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        needed = 2 if extra else 4
        assert f"needs a GPU host with {needed} NVIDIA GPU(s)" in done.stderr and "this host has 0" in done.stderr
        assert "study E-multi-gpu" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("spec.json"))
    assert not (tmp_path / "matrun.duckdb").exists()


def test_studies_lists_the_catalogue_and_an_unreadable_file_beside_the_good_ones(tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    studies.mkdir()
    write(studies, STUDY + BASE + '[profiles.quick]\nsweep = { repeats = 4 }\naxes = { threads = [1, 2] }\n'
                                  'about = "two thread counts"\n', "A6-threads.toml")
    write(studies, STUDY.replace('"A6"', '"A10"') + BASE, "A10-lr.toml")
    write(studies, STUDY.replace('"A6"', '"A2"') + BASE + "[fixed]\nepochs = 2\n", "A2-broken.toml")
    write(studies, BASE, "B1-plain.toml")  # a matrix, not a study
    done = run_matrun("studies", studies, "--format", "json", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    rows = json.loads(done.stdout)
    assert [r["file"].rsplit("/", 1)[1] for r in rows] == ["A2-broken.toml", "A6-threads.toml", "A10-lr.toml",
                                                          "B1-plain.toml"]
    broken, a6, a10, plain = rows
    assert "invalid TOML" in broken["error"] and "not a study file" in plain["error"]
    assert a6["id"] == "A6" and a6["source"] == "Table XII" and a6["needs"] == "cpu"
    assert a6["varies"] == ["framework", "threads", "lr", "layout"] or set(a6["varies"]) == {
        "framework", "threads", "lr", "layout"}
    assert a6["findings"] == ["oversubscription"]
    assert [(p["name"], p["cells"], p["runs"]) for p in a6["profiles"]] == [("(base)", 10, 30), ("quick", 4, 16)]
    assert a6["profiles"][1]["about"] == "two thread counts"
    assert all(p["estimate_s"] is None and p["basis"].startswith("no earlier runs") for p in a6["profiles"])
    assert [p["name"] for p in a10["profiles"]] == ["(base)"]
    table = run_matrun("studies", studies, cwd=tmp_path)
    assert table.returncode == 1 and "A6-threads.toml" in table.stdout and "Table XII" in table.stdout
    assert "quick" in table.stdout and "4 × 4 = 16" in table.stdout
    assert "cannot read" in table.stderr and "A2-broken.toml" in table.stderr and "Traceback" not in table.stderr
    missing = run_matrun("studies", tmp_path / "nowhere", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("Error: ") and "no such studies directory" in missing.stderr
