"""``preset = "framework-default"``: each framework's own example hyper-parameters.

STUDIES.md A1/A2 compare frameworks "each with its own defaults": the optimizer, learning
rate, batch size and epochs of the framework's official example for the dataset.  A preset
fills only the keys the matrix does not set itself, so ``epochs = 2`` beside the preset
shortens the run and keeps the rest.  Sources and what is approximated: docs/PRESETS.md.
"""

from __future__ import annotations

from typing import Any

from matrun.runner.planning.params import ParamError

# (framework, dataset family) → values.  MNIST-like covers mnist and fashion-mnist.
PRESET_VALUES: dict[tuple[str, str], dict[str, Any]] = {
    # pytorch/examples mnist/main.py: Adadelta lr 1.0, batch 64, 14 epochs (StepLR γ 0.7 not modelled)
    ("torch", "mnist"): {"optimizer": "adadelta", "lr": 1.0, "batch_size": 64, "epochs": 14,
                         "eval_batch_size": 1000},
    # pytorch/tutorials cifar10_tutorial.py: SGD lr 0.001 momentum 0.9, batch 4, 2 epochs
    ("torch", "cifar10"): {"optimizer": "sgd", "lr": 0.001, "momentum": 0.9, "batch_size": 4, "epochs": 2},
    # keras.io examples/vision/mnist_convnet.py: Adam (lr 0.001), batch 128, 15 epochs
    ("tensorflow", "mnist"): {"optimizer": "adam", "lr": 0.001, "batch_size": 128, "epochs": 15},
    # keras examples cifar10_cnn.py: RMSprop lr 1e-4 (decay 1e-6 not modelled), batch 32, 100 epochs
    ("tensorflow", "cifar10"): {"optimizer": "rmsprop", "lr": 0.0001, "batch_size": 32, "epochs": 100},
    # apache/mxnet example/gluon/mnist/mnist.py: SGD lr 0.1 momentum 0.9, batch 100, 10 epochs
    ("mxnet", "mnist"): {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "batch_size": 100, "epochs": 10},
    # apache/mxnet example/image-classification/train_cifar10.py: SGD lr 0.05 momentum 0.9 wd 1e-4,
    # batch 128, 300 epochs (steps at 200 and 250 not modelled)
    ("mxnet", "cifar10"): {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0001,
                           "batch_size": 128, "epochs": 300},
}
FAMILY = {"mnist": "mnist", "fashion-mnist": "mnist", "cifar10": "cifar10"}


def apply_preset(values: dict[str, Any], *, explicit: set[str]) -> dict[str, Any]:
    """Fill the preset's keys that the matrix did not set; no-op without a preset."""
    if values["preset"] == "none":
        return values
    family = FAMILY.get(values["dataset"])
    preset = PRESET_VALUES.get((values["framework"], family)) if family else None
    if preset is None:
        raise ParamError(f'preset "framework-default" has no {values["framework"]} example for '
                         f'dataset {values["dataset"]!r} (it has: mnist, fashion-mnist, cifar10)')
    out = dict(values)
    out.update({k: v for k, v in preset.items() if k not in explicit})
    return out
