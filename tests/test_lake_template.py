"""The empty warehouse new warehouses copy (warehouse/db.py ``_template``): built once per
user and schema, kept in matrun's home (``lake-templates/<key>``), so a process that creates a
warehouse applies no migration and creates no view; a template half made, of another user or
an unwritable home never stops a creation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from matrun.warehouse import db

CREATE = """
import sys
from matrun.warehouse import db
with db.open_warehouse(sys.argv[1]) as w:
    print(w.con.execute("SELECT count(*) FROM runs").fetchone()[0])
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("MATRUN_HOME", str(home))
    monkeypatch.setattr(db, "_TEMPLATES", {})  # this process has made none yet
    return home


def create_in_a_process(path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CREATE, str(path)], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=300)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "0\n", "")


def newest_schema(path: Path) -> int:
    with db.open_warehouse(path, read_only=True) as w:
        return w.con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]


def test_a_later_process_copies_the_template_an_earlier_one_kept(home: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    create_in_a_process(tmp_path / "first")
    key = db._template_key()
    kept = home / db.SHARED_TEMPLATES / key
    assert (kept / ".matrun-template").read_text() == key and (kept / "lake" / "catalog.sqlite").is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("a process with the template kept must not build one")

    monkeypatch.setattr(db, "apply_migrations", refuse)
    monkeypatch.setattr(db, "create_views", refuse)
    assert db._template(tmp_path / "second") == kept / "lake"
    monkeypatch.undo()
    monkeypatch.setenv("MATRUN_HOME", str(home))
    create_in_a_process(tmp_path / "second")  # the copy is a whole, current warehouse
    assert newest_schema(tmp_path / "second") == db.migrations()[-1].version
    assert sorted(p.name for p in (home / db.SHARED_TEMPLATES).iterdir()) == [key]  # nothing else left there


@pytest.mark.parametrize("damage", ["no mark", "another key's mark", "no catalog", "a file"])
def test_a_template_folder_that_is_not_whole_is_never_copied_and_is_replaced(home: Path, tmp_path: Path,
                                                                            damage: str) -> None:
    key = db._template_key()
    folder = home / db.SHARED_TEMPLATES / key
    folder.parent.mkdir(parents=True)
    if damage == "a file":
        folder.write_text("not a template\n")
    else:
        (folder / "lake").mkdir(parents=True)
        if damage != "no catalog":
            (folder / "lake" / "catalog.sqlite").write_text("garbage, not SQLite\n")
        if damage != "no mark":
            (folder / ".matrun-template").write_text("0" * 16 if damage == "another key's mark" else key)
    assert db._shared_template(key) is None
    create_in_a_process(tmp_path / "w")
    assert newest_schema(tmp_path / "w") == db.migrations()[-1].version
    assert db._shared_template(key) == folder / "lake"  # a whole one took its place


def test_a_template_another_user_owns_is_never_copied(home: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    create_in_a_process(tmp_path / "first")
    key = db._template_key()
    folder = home / db.SHARED_TEMPLATES / key
    os.chown(folder, 65534, 65534)
    assert db._shared_template(key) is None
    monkey_template = db._template(tmp_path / "second")
    assert monkey_template != folder / "lake" and monkey_template.is_dir()  # one of this process's own


def test_an_unwritable_home_only_means_each_process_builds_its_own(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("matrun's home cannot be made under a file\n")
    monkeypatch.setenv("MATRUN_HOME", str(blocker / "home"))
    monkeypatch.setattr(db, "_TEMPLATES", {})
    create_in_a_process(tmp_path / "w")
    assert newest_schema(tmp_path / "w") == db.migrations()[-1].version
    assert blocker.read_text() == "matrun's home cannot be made under a file\n"


SETTINGS = """
import sys
from matrun.warehouse import catalog, db
setting = "SELECT current_setting('enable_progress_bar')"
seen = [catalog.lake_connect().execute(setting).fetchone()[0]]
for read_only in (False, True):
    db.forget_instances()
    with db.open_warehouse(sys.argv[1], read_only=read_only) as w:
        seen.append(w.con.execute(setting).fetchone()[0])
        seen += [base.execute(setting).fetchone()[0] for base, _ in db._INSTANCES.values()]
print(seen)
"""


def test_no_connection_matrun_opens_prints_a_progress_bar(home: Path, tmp_path: Path) -> None:
    # DuckDB prints its progress bar to the process's stdout once a query passes 2 s: on a loaded
    # host a script's count(*) through db.open_warehouse came out as "100% ▕███▏ (…) 0".  The bar is
    # on by default in a script whose stdout is a pipe (pytest's own process has it off), on the
    # instance's own connection (attaching, migrating, the views ran there); the cursors matrun
    # hands out had it off.  Lowering progress_bar_time to show a bar would turn it on again: the
    # setting itself is checked.
    proc = subprocess.run([sys.executable, "-c", SETTINGS, str(tmp_path / "w.duckdb")], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    assert proc.stdout == "[False, False, False, False, False]\n"


def test_the_view_order_is_the_word_rule_of_every_view():
    """Each view comes after every view whose name is a word of its SQL (``\\b name \\b``)."""
    views = db.created_views()
    order = db._dependency_order(views)
    assert sorted(order) == sorted(views)
    place = {name: i for i, name in enumerate(order)}
    live = {c.live for c in db.materialise.CACHED}
    for name, sql in views.items():
        for other in views:
            if other != name and re.search(rf"\b{other}\b", sql) and not (other in {c.view for c in db.materialise.CACHED}
                                                                         and name in live):
                assert place[other] < place[name], (other, name)
