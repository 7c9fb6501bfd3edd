"""Shared fixtures: the real PyTorch environment and real data locations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """Python of the real PyTorch environment (built from images/torch pins if needed).

    MATRUN_TEST_TORCH_PYTHON points at an existing interpreter instead (development only).
    """
    override = os.environ.get("MATRUN_TEST_TORCH_PYTHON")
    if override:
        return Path(override)
    from matrun.runner.envs import ensure_env

    return ensure_env("torch", "cpu").python


@pytest.fixture(scope="session")
def fashion_mnist_root() -> Path:
    """The data directory that holds fashion-mnist/ (Debian's dataset-fashion-mnist)."""
    if not (FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Debian's dataset-fashion-mnist is not installed (make test installs it)")
    return FASHION_MNIST.parent


@pytest.fixture(scope="session")
def torch_env():
    """The real PyTorch environment the local executor uses (built once, then reused)."""
    from matrun.runner.envs import ensure_env

    return ensure_env("torch", "cpu")


@pytest.fixture(scope="session")
def stage() -> Path:
    """The staged harness, exactly as the host puts it on a cell's PYTHONPATH."""
    from matrun.runner.envs import stage_harness

    return stage_harness()


@pytest.fixture(scope="session")
def tf_env():
    """The real TensorFlow environment the local executor uses (built once, then reused)."""
    from matrun.runner.envs import ensure_env

    return ensure_env("tensorflow", "cpu")


@pytest.fixture(scope="session")
def mxnet_env():
    """The real MXNet environment the local executor uses (built once, then reused)."""
    from matrun.runner.envs import ensure_env

    return ensure_env("mxnet", "cpu")
