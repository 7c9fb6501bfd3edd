"""``preset = "framework-default"``: each framework's own example hyper-parameters.

STUDIES.md A1/A2 compare frameworks "each with its own defaults": the optimizer, learning
rate, batch size and epochs of the framework's official example for the dataset.  The values
are data: ``[presets.<dataset family>]`` of ``images/<framework>/framework.toml``, each with
its source (``matrun.frameworks``).  A preset fills only the keys the matrix does not set
itself, so ``epochs = 2`` beside the preset shortens the run and keeps the rest.  What is
approximated: docs/PRESETS.md.
"""

from __future__ import annotations

from typing import Any

from matrun.errors import InputError
from matrun.frameworks import frameworks
from matrun.runner.planning.params import PARAMS, ParamError

#: dataset -> the family whose example serves it (MNIST-like covers mnist and fashion-mnist).
FAMILY = {"mnist": "mnist", "fashion-mnist": "mnist", "cifar10": "cifar10"}


def preset_values() -> dict[tuple[str, str], dict[str, Any]]:
    """(framework, dataset family) -> the example's parameters, from every framework.toml;
    a parameter that is not a cell parameter is an InputError naming the file and the key."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for fw in frameworks().values():
        for family, values in fw.presets.items():
            unknown = sorted(set(values) - set(PARAMS))
            if unknown:
                raise InputError(f"images/{fw.name}/framework.toml [presets.{family}]: "
                                 f"unknown parameter(s) {', '.join(unknown)}")
            out[(fw.name, family)] = dict(values)
    return out


PRESET_VALUES = preset_values()


def apply_preset(values: dict[str, Any], *, explicit: set[str]) -> dict[str, Any]:
    """Fill the preset's keys that the matrix did not set; no-op without a preset."""
    if values["preset"] == "none":
        return values
    family = FAMILY.get(values["dataset"])
    preset = PRESET_VALUES.get((values["framework"], family)) if family else None
    if preset is None:
        framework = values["framework"]
        # (for a framework matrun does not know: every family a preset may serve)
        has = ([d for d, f in FAMILY.items() if (framework, f) in PRESET_VALUES]
               if framework in frameworks() else list(FAMILY))
        raise ParamError(f'preset "framework-default" has no {framework} example for '
                         f'dataset {values["dataset"]!r} (it has: {", ".join(has) or "none"})')
    out = dict(values)
    out.update({k: v for k, v in preset.items() if k not in explicit})
    return out
