"""The probe's "which BLAS is really loaded" (``probe.blas_loaded``): fake maps files and fake
Debian alternatives trees first, then the real thing inside the Debian python3-torch images
(images/torch/Dockerfile.debian, one per BLAS).

Helpers for other tests (``from test_probe_blas import ...``): ``DEBIAN_BLAS``,
``debian_blas_image(client, blas)`` (the image to test, or a skip reason) and
``check_debian_blas_image(client, tag, blas)`` (probe it, assert the provider, return the fields).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from matrun.runner.harness import probe

TRIPLET = "x86_64-linux-gnu"
DEBIAN_BLAS = ("openblas", "blis", "reference")
# Where each Debian provider puts libblas.so.3 / liblapack.so.3 (bookworm), and its package.
DEBIAN_LAYOUT = {
    "openblas": ("openblas-pthread", "openblas-pthread", "libopenblas0-pthread", "0.3.21+ds-4"),
    "blis": ("blis-pthread", "lapack", "libblis4-pthread", "0.9.0-1"),
    "reference": ("blas", "lapack", "libblas3", "3.11.0-2"),
}
DEV_IMAGE = "matrun-dev/torch-debian:{blas}"  # what a hand build of Dockerfile.debian is tagged


def maps_line(path: str, *, deleted: bool = False, address: str = "7f0000000000-7f0000001000") -> str:
    suffix = " (deleted)" if deleted else ""
    return f"{address} r-xp 00000000 08:01 123456                     {path}{suffix}"


class FakeSystem:
    """A Debian-like tree under ``root``: provider files, /etc/alternatives links, the
    managed links in /usr/lib/<triplet>, update-alternatives' admin files and dpkg's lists."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lib = root / "usr" / "lib" / TRIPLET
        self.etc_alt = root / "etc" / "alternatives"
        self.admin = root / "var" / "lib" / "dpkg" / "alternatives"
        self.dpkg = root / "var" / "lib" / "dpkg"
        for d in (self.lib, self.etc_alt, self.admin, self.dpkg / "info"):
            d.mkdir(parents=True, exist_ok=True)
        self.status: list[str] = []

    def provider_file(self, folder: str, name: str, package: str | None = None, version: str | None = None) -> Path:
        path = self.lib / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF fake")
        if package:
            with open(self.dpkg / "info" / f"{package}:amd64.list", "a", encoding="utf-8") as fh:
                fh.write(f"/.\n{path.parent}\n{path}\n")
            self.status.append(f"Package: {package}\nStatus: install ok installed\nVersion: {version}\n")
            (self.dpkg / "status").write_text("\n".join(self.status), encoding="utf-8")
        return path

    def alternative(self, soname: str, target: Path, mode: str = "manual") -> Path:
        """``/usr/lib/<triplet>/<soname>`` -> ``/etc/alternatives/<soname>-<triplet>`` -> target."""
        name = f"{soname}-{TRIPLET}"
        alt = self.etc_alt / name
        link = self.lib / soname
        for p in (alt, link):
            if p.is_symlink() or p.exists():
                p.unlink()
        alt.symlink_to(target)
        link.symlink_to(alt)
        (self.admin / name).write_text(f"{mode}\n{link}\n\n{target}\n100\n\n", encoding="utf-8")
        return link

    def debian(self, blas: str) -> tuple[Path, Path]:
        """Install ``blas`` the way its Debian package does and select it; (libblas, liblapack)."""
        blas_dir, lapack_dir, package, version = DEBIAN_LAYOUT[blas]
        lib = self.provider_file(blas_dir, "libblas.so.3", package, version)
        if lapack_dir == blas_dir:
            lapack = self.provider_file(lapack_dir, "liblapack.so.3", package, version)
        else:
            lapack = self.provider_file(lapack_dir, "liblapack.so.3", "liblapack3", "3.11.0-2")
        self.alternative("libblas.so.3", lib)
        self.alternative("liblapack.so.3", lapack)
        return lib, lapack

    def maps(self, *paths: str | Path, extra: str = "") -> Path:
        text = "\n".join([maps_line("/usr/bin/python3.11"), *(maps_line(str(p)) for p in paths),
                          "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]",
                          "7f0000002000-7f0000003000 rw-p 00000000 00:00 0 ", extra])
        path = self.root / "maps"
        path.write_text(text + "\n", encoding="utf-8")
        return path

    def loaded(self, maps: Path, **kw):
        return probe.blas_loaded(str(maps), admin_dir=str(self.admin), dpkg_dir=str(self.dpkg), ask=False, **kw)


@pytest.fixture()
def fake(tmp_path: Path) -> FakeSystem:
    return FakeSystem(tmp_path / "root")


# --- parsing /proc/self/maps -----------------------------------------------------------------

def test_parse_maps_paths_with_spaces_deleted_and_noise():
    text = "\n".join([
        maps_line("/opt/my libs/libopenblas.so.0"),
        maps_line("/opt/my libs/libopenblas.so.0", address="7f0000001000-7f0000002000"),  # same file again
        maps_line("/tmp/old lib/libblas.so.3", deleted=True),
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]",
        "7f0000002000-7f0000003000 rw-p 00000000 00:00 0 ",
        "garbage",
        "",
        "7f0000004000-7f0000005000 r--p 00000000 08:01 99 relative/not-a-path.so",
    ])
    assert probe.parse_maps(text) == [
        {"path": "/opt/my libs/libopenblas.so.0", "deleted": False},
        {"path": "/tmp/old lib/libblas.so.3", "deleted": True},
    ]


def test_missing_or_unreadable_maps_is_nothing(tmp_path: Path):
    assert probe.mapped_files(str(tmp_path / "nope")) == []
    assert probe.mapped_files(str(tmp_path)) == []  # a directory
    assert probe.blas_loaded(str(tmp_path / "nope"), admin_dir=str(tmp_path), dpkg_dir=str(tmp_path)) is None
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00\x01" * 100)
    assert probe.blas_loaded(str(tmp_path / "binary"), admin_dir=str(tmp_path), dpkg_dir=str(tmp_path)) is None


@pytest.mark.parametrize("path, expected", [
    (f"/usr/lib/{TRIPLET}/openblas-pthread/libblas.so.3", ("openblas", "pthread")),
    (f"/usr/lib/{TRIPLET}/openblas-openmp/liblapack.so.3", ("openblas", "openmp")),
    (f"/usr/lib/{TRIPLET}/openblas-pthread/libopenblasp-r0.3.21.so", ("openblas", "pthread")),
    ("/opt/venv/lib/python3.11/site-packages/mxnet/libopenblas.so.0", ("openblas", None)),
    ("/x/numpy.libs/libopenblas64_p-r0-742d56dc.3.20.so", ("openblas", None)),
    ("/x/libopenblaso-r0.3.21.so", ("openblas", "openmp")),
    (f"/usr/lib/{TRIPLET}/blis-pthread/libblas.so.3", ("blis", "pthread")),
    (f"/usr/lib/{TRIPLET}/blis-serial/libblis.so.4", ("blis", "serial")),
    (f"/usr/lib/{TRIPLET}/blas/libblas.so.3", ("reference", None)),
    (f"/usr/lib/{TRIPLET}/blas/libblas.so.3.11.0", ("reference", None)),
    (f"/usr/lib/{TRIPLET}/lapack/liblapack.so.3", ("reference", None)),
    ("/opt/intel/lib/libmkl_rt.so.2", ("mkl", None)),
    (f"/usr/lib/{TRIPLET}/atlas/libblas.so.3", ("atlas", None)),
    (f"/usr/lib/{TRIPLET}/libflexiblas.so.3", ("flexiblas", None)),
    ("/somewhere/else/libblas.so.3", ("unknown", None)),
])
def test_provider_from_path(path, expected):
    assert probe.provider_from_path(path) == expected


@pytest.mark.parametrize("debian, upstream", [
    ("3.11.0-2", "3.11.0"), ("0.3.21+ds-4", "0.3.21"), ("1:1.24.2-1+deb12u1", "1.24.2"),
    ("0.9.0-1", "0.9.0"), ("2.6.3", "2.6.3"), ("1.13.1+dfsg-4", "1.13.1"), ("1.0~rc1-1", "1.0"),
])
def test_upstream_version(debian, upstream):
    assert probe.upstream_version(debian) == upstream


# --- Debian alternatives, faked --------------------------------------------------------------

@pytest.mark.parametrize("blas", DEBIAN_BLAS)
def test_each_debian_provider_through_its_alternative(fake: FakeSystem, blas: str):
    lib, lapack = fake.debian(blas)
    # The kernel names the file really opened: the provider's own path, not the link.
    found = fake.loaded(fake.maps(lib, lapack, f"/usr/lib/{TRIPLET}/libgomp.so.1.0.0"))
    blas_dir, lapack_dir, package, version = DEBIAN_LAYOUT[blas]
    assert found["provider"] == blas and found["path"] == str(lib) and found["source"] == "path"
    assert found["alternative"]["name"] == f"libblas.so.3-{TRIPLET}"
    assert found["alternative"]["mode"] == "manual"
    assert found["alternative"]["chain"] == [str(fake.lib / "libblas.so.3"),
                                            str(fake.etc_alt / f"libblas.so.3-{TRIPLET}"), str(lib)]
    assert found["package"] == {"name": package, "version": version}
    assert found["version"] == probe.upstream_version(version)
    assert found["others"] == []
    assert found["lapack"]["path"] == str(lapack)
    assert found["lapack"]["provider"] == ("openblas" if blas == "openblas" else "reference")
    assert found["lapack"]["alternative"]["name"] == f"liblapack.so.3-{TRIPLET}"


def test_switching_the_alternative_switches_the_answer(fake: FakeSystem):
    """Both providers installed (as with apt's `libblas3 | libblas.so.3`): only the mapped
    one, the one the alternative selects, is the answer; a stale second mapping is an other."""
    blis, _ = fake.debian("blis")
    openblas, _ = fake.debian("openblas")
    found = fake.loaded(fake.maps(blis, openblas))
    assert found["provider"] == "openblas" and found["others"] == [str(blis)]
    fake.alternative("libblas.so.3", blis)
    found = fake.loaded(fake.maps(blis, openblas))
    assert found["provider"] == "blis" and found["others"] == [str(openblas)]


def test_mapped_through_the_link_is_resolved(fake: FakeSystem):
    """Were a maps file to name the managed link itself, the chain is still followed."""
    fake.debian("blis")
    found = fake.loaded(fake.maps(fake.lib / "libblas.so.3"))
    assert found["provider"] == "blis" and found["mapped_as"] == str(fake.lib / "libblas.so.3")
    assert found["path"] == str(fake.lib / "blis-pthread" / "libblas.so.3")


def test_numpy_bundled_openblas_alone_is_no_framework_blas(fake: FakeSystem):
    """PyPI torch (MKL linked statically) with a numpy wheel: only numpy's OpenBLAS is mapped."""
    numpy_blas = "/opt/venv/lib/python3.11/site-packages/numpy.libs/libscipy_openblas64_-ff651d7f.so"
    assert fake.loaded(fake.maps(numpy_blas)) is None


def test_bundled_framework_blas_without_alternatives(fake: FakeSystem):
    """MXNet's own OpenBLAS beside numpy's: the framework's comes first, numpy's is an other."""
    mx = "/opt/venv/lib/python3.11/site-packages/mxnet/libopenblas.so.0"
    numpy_blas = "/opt/venv/lib/python3.11/site-packages/numpy.libs/libopenblas64_p-r0-742d56dc.3.20.so"
    found = fake.loaded(fake.maps(numpy_blas, mx))
    assert found["provider"] == "openblas" and found["path"] == mx and found["others"] == [numpy_blas]
    assert "alternative" not in found and "package" not in found and "lapack" not in found


def test_spaces_deleted_and_missing_files(fake: FakeSystem):
    odd = fake.root / "opt" / "my blas dir" / "blis-pthread"
    odd.mkdir(parents=True)
    target = odd / "libblas.so.3"
    target.write_bytes(b"fake")
    fake.alternative("libblas.so.3", target)
    found = fake.loaded(fake.maps(target))
    assert found["provider"] == "blis" and found["path"] == str(target)
    assert found["alternative"]["chain"][-1] == str(target)

    # Deleted since it was mapped (an upgrade under a running process): still reported, marked.
    target.unlink()
    found = fake.loaded(fake.maps(extra=maps_line(str(target), deleted=True)))
    assert found["provider"] == "blis" and found["deleted"] is True and found["path"] == str(target)

    # A mapped path that no longer exists and no alternative names: classified by its path.
    found = fake.loaded(fake.maps(f"/gone/{TRIPLET}/openblas-serial/libblas.so.3"))
    assert found["provider"] == "openblas" and found["threading"] == "serial"


def test_hostile_alternatives_never_raise(fake: FakeSystem):
    lib, _ = fake.debian("reference")
    # A symlink loop, a dangling alternative, binary garbage and an empty admin file.
    loop_a, loop_b = fake.etc_alt / "loop-a", fake.etc_alt / "loop-b"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    (fake.admin / "libblas.so.3-loop").write_text(f"auto\n{loop_a}\n", encoding="utf-8")
    (fake.admin / "libblas.so.3-dangling").write_text(f"auto\n{fake.etc_alt / 'missing'}\n", encoding="utf-8")
    (fake.admin / "libblas.so.3-garbage").write_bytes(b"\x00\xff\xfe\n\x00\n")
    (fake.admin / "liblapack.so.3-empty").write_text("", encoding="utf-8")
    (fake.admin / "libblas.so.3-dir").mkdir()
    assert probe.resolve_links(str(loop_a)) == [str(loop_a), str(loop_b)]
    found = fake.loaded(fake.maps(lib))
    assert found["provider"] == "reference" and found["alternative"]["name"] == f"libblas.so.3-{TRIPLET}"
    names = {a["name"] for a in probe.alternatives(str(fake.admin))}
    assert {"libblas.so.3-loop", "libblas.so.3-dangling"} <= names
    assert not names & {"libblas.so.3-garbage", "liblapack.so.3-empty", "libblas.so.3-dir"}


def test_no_admin_dir_and_no_dpkg(fake: FakeSystem, tmp_path: Path):
    lib, _ = fake.debian("openblas")
    found = probe.blas_loaded(str(fake.maps(lib)), admin_dir=str(tmp_path / "none"),
                              dpkg_dir=str(tmp_path / "none"), ask=False)
    assert found["provider"] == "openblas" and "alternative" not in found and "package" not in found
    assert "version" not in found


def test_dpkg_owner_merged_usr_spelling(fake: FakeSystem):
    lib = fake.provider_file("blas", "libblas.so.3", "libblas3", "3.11.0-2")
    # dpkg's list may name /lib/... where the kernel says /usr/lib/... (or the other way round).
    listing = fake.dpkg / "info" / "libblas3:amd64.list"
    listing.write_text(listing.read_text().replace(str(lib), "/lib/x/blas/libblas.so.3"), encoding="utf-8")
    assert probe.dpkg_owner("/usr/lib/x/blas/libblas.so.3", str(fake.dpkg)) == {"name": "libblas3",
                                                                              "version": "3.11.0-2"}
    assert probe.dpkg_owner("/nowhere/libblas.so.3", str(fake.dpkg)) is None
    assert probe.dpkg_owner(str(lib), str(fake.root / "no-dpkg")) is None


def test_ask_library_loads_nothing(tmp_path: Path):
    """RTLD_NOLOAD: a library that is not already mapped is not loaded to be asked."""
    fake = tmp_path / "libopenblas.so.0"
    fake.write_bytes(b"not an ELF")
    assert probe.ask_library(str(fake)) == {}
    assert probe.ask_library(str(tmp_path / "missing.so")) == {}
    libc = next((p["path"] for p in probe.mapped_files() if "/libc.so" in p["path"]), None)
    if libc:
        assert probe.ask_library(libc) == {}  # loaded, but no BLAS entry point


def test_collect_has_blas_loaded():
    fields = probe.collect("torch", {}, {})
    assert "blas_loaded" in fields and "libraries" in fields
    # This test process maps no framework BLAS of its own, or reports one without raising.
    assert fields["blas_loaded"] is None or "provider" in fields["blas_loaded"]


# --- the real images -------------------------------------------------------------------------

def debian_blas_image(client, blas: str) -> tuple[str | None, str]:
    """(tag, "") of the image to test for ``blas``, or (None, why not).

    The newest local image built by matrun from the current recipe of variant ``cpu-<blas>``
    (label ``org.matrun.recipe-hash``), else a hand build tagged ``DEV_IMAGE``.
    """
    from matrun.runner.environments import contexts as build

    variant = f"cpu-{blas}"
    why = []
    try:
        recipe = build.recipe_hash("torch", variant)
    except Exception as exc:  # the variant is not (yet) in images/torch/framework.toml
        why.append(f"variant {variant} is not buildable here ({type(exc).__name__}: {exc})")
    else:
        images = client.images.list(filters={"label": [f"{build.LABEL}.recipe-hash={recipe}"]})
        images = sorted(images, key=lambda im: im.attrs.get("Created", ""), reverse=True)
        if images and images[0].tags:
            return images[0].tags[0], ""
        why.append(f"no image of torch:{variant} built from the current recipe (run `matrun build`)")
    dev = DEV_IMAGE.format(blas=blas)
    try:
        client.images.get(dev)
        return dev, ""
    except Exception:
        why.append(f"no {dev}")
    return None, "; ".join(why)


def check_debian_blas_image(client, tag: str, blas: str) -> dict:
    """Probe ``tag`` as `matrun build` does and assert that ``blas`` is the BLAS really loaded,
    through Debian's alternative; returns the probe's fields."""
    from matrun.runner.environments import probes as build

    found = build.probe_image(client, tag, "torch", f"cpu-{blas}")
    fields = found.raw
    loaded = fields["blas_loaded"]
    assert loaded and loaded["provider"] == blas, loaded
    assert loaded["alternative"]["name"] == f"libblas.so.3-{TRIPLET}", loaded
    assert loaded["alternative"]["mode"] == "manual", loaded
    # The alternative's target, then the file it names (reference: libblas.so.3 -> libblas.so.3.11.0).
    target = f"/usr/lib/{TRIPLET}/{DEBIAN_LAYOUT[blas][0]}/libblas.so.3"
    assert loaded["alternative"]["chain"][:3] == [f"/usr/lib/{TRIPLET}/libblas.so.3",
                                                 f"/etc/alternatives/libblas.so.3-{TRIPLET}", target], loaded
    assert loaded["path"].startswith(target), loaded
    assert loaded["package"]["name"] == DEBIAN_LAYOUT[blas][2], loaded
    assert loaded["lapack"]["provider"] == ("openblas" if blas == "openblas" else "reference"), loaded
    # OpenBLAS answers openblas_get_config; Debian's BLIS libblas.so.3 exports the BLAS and
    # CBLAS symbols only, and the reference BLAS has nothing to ask: path + package tell.
    assert loaded["source"] == ("symbols" if blas == "openblas" else "path"), loaded
    assert loaded["others"] == [], loaded
    assert fields["framework_version"].startswith("1.13"), fields["framework_version"]
    assert "BLAS_INFO=generic" in fields["build"]
    assert fields["mismatches"] == [], fields["mismatches"]
    return fields


@pytest.mark.slow
@pytest.mark.parametrize("blas", DEBIAN_BLAS)
def test_debian_image_loads_the_blas_asked(docker_client, blas: str):
    """Skipped when the image is absent, except under MATRUN_REQUIRE_ENGINE=1 (CI), where it is
    built through matrun's own build path (conftest ``built_image``: probe and promises too)."""
    tag, why = debian_blas_image(docker_client, blas)
    if tag is None:
        if os.environ.get("MATRUN_REQUIRE_ENGINE") != "1":
            pytest.skip(f"no torch image for BLAS={blas}: {why}")
        from conftest import built_image

        tag = built_image(docker_client, "torch", f"cpu-{blas}").tag
    check_debian_blas_image(docker_client, tag, blas)
