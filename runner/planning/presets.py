"""``preset``: training settings that are data, filled into the cells that ask for them.

``"framework-default"``: each framework's own example hyper-parameters.  STUDIES.md A1/A2
compare frameworks "each with its own defaults": the optimizer, learning rate, batch size and
epochs of the framework's official example for the dataset — ``[presets.<dataset family>]``
of ``images/<framework>/framework.toml``.  ``"study-a"``: the default training parameters
study A's Tables II and III list per framework (seeds/000_55992cd604dc8adf.txt), which count
iterations where the framework's example did — ``[presets-study-a.<family>]``.  Each table
cites its source (``matrun.frameworks`` reads them).

A preset fills only the keys the matrix does not set itself, so ``lr = 0.1`` beside the
preset changes that and keeps the rest; an inference cell takes none of its training knobs
(``validation``).  ``epochs`` and ``iterations`` are one setting, the
run's length: when the matrix sets either, the preset's length (both keys) is not applied,
so ``epochs = 2`` beside an iteration-counted preset runs 2 epochs.  What is approximated:
docs/PRESETS.md.
"""

from __future__ import annotations

from typing import Any

from matrun.errors import InputError
from matrun.frameworks import DEFAULT_PRESET, NAMED_PRESETS, frameworks
from matrun.runner.harness.spec import TRAINING_KNOBS
from matrun.runner.planning.params import PARAMS, ParamError, show

#: dataset -> the family whose example serves it (MNIST-like covers mnist and fashion-mnist).
FAMILY = {"mnist": "mnist", "fashion-mnist": "mnist", "cifar10": "cifar10"}
#: The keys that make a run's length: a preset's are applied together or not at all.
LENGTH = ("epochs", "iterations")
#: What each preset is, for messages.
ABOUT = {DEFAULT_PRESET: "each framework's official example",
         "study-a": "the defaults study A's Tables II and III list"}


def _table(preset: str, family: str) -> str:
    return f"[presets.{family}]" if preset == DEFAULT_PRESET else f"[presets-{preset}.{family}]"


def preset_tables() -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """preset -> (framework, dataset family) -> its parameters, from every framework.toml.
    A parameter that is not a cell parameter, or a value its check refuses, is an InputError
    naming the file, the table and the key."""
    out: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in (DEFAULT_PRESET, *NAMED_PRESETS)}
    for fw in frameworks().values():
        tables = {DEFAULT_PRESET: fw.presets, **fw.named_presets}
        for preset, families in tables.items():
            for family, values in families.items():
                where = f"images/{fw.name}/framework.toml {_table(preset, family)}"
                if family not in FAMILY.values():
                    raise InputError(f"{where}: unknown dataset family {family!r} (known: "
                                     f"{', '.join(sorted(set(FAMILY.values())))})")
                unknown = sorted(set(values) - set(PARAMS))
                if unknown:
                    raise InputError(f"{where}: unknown parameter(s) {', '.join(unknown)}")
                checked = {}
                for key, value in values.items():
                    try:
                        checked[key] = PARAMS[key].check(value)
                    except ParamError as exc:
                        raise InputError(f"{where}: {key} {exc}") from None
                out[preset][(fw.name, family)] = checked
    return out


def preset_values() -> dict[tuple[str, str], dict[str, Any]]:
    """``preset = "framework-default"``: (framework, family) -> the example's parameters."""
    return preset_tables()[DEFAULT_PRESET]


PRESET_TABLES = preset_tables()
#: ``preset = "framework-default"``: (framework, family) -> the example's parameters.
PRESET_VALUES = PRESET_TABLES[DEFAULT_PRESET]


def apply_preset(values: dict[str, Any], *, explicit: set[str]) -> dict[str, Any]:
    """Fill the preset's keys that the matrix did not set (its length only when the matrix
    sets neither ``epochs`` nor ``iterations``); no-op without a preset."""
    preset_name = values["preset"]
    if preset_name == "none":
        return values
    tables = PRESET_TABLES.get(preset_name, {})
    family = FAMILY.get(values["dataset"])
    preset = tables.get((values["framework"], family)) if family else None
    if preset is None:
        framework = values["framework"]
        about = ABOUT.get(preset_name, "")
        if framework in frameworks() and not any(fw == framework for fw, _ in tables):
            have = sorted({fw for fw, _ in tables})
            raise ParamError(f'preset {show(preset_name)} ({about}) has no settings for {framework}; '
                             f'frameworks that have them: {", ".join(have) or "none"}')
        # (for a framework matrun does not know: every family a preset may serve)
        has = ([d for d, f in FAMILY.items() if (framework, f) in tables]
               if framework in frameworks() else list(FAMILY))
        what = "example" if preset_name == DEFAULT_PRESET else "settings"
        raise ParamError(f'preset {show(preset_name)} has no {framework} {what} for '
                         f'dataset {values["dataset"]!r} (it has: {", ".join(has) or "none"})')
    out = dict(values)
    own_length = bool(explicit & set(LENGTH))
    inference = values["mode"] == "inference"  # keeps the training knobs' defaults (spec.knob_problem)
    out.update({k: v for k, v in preset.items() if k not in explicit and not (own_length and k in LENGTH)
                and not (inference and k in TRAINING_KNOBS)})
    return out
