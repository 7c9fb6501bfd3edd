"""The SQL macros that carry framework facts into the views, rendered from ``matrun.frameworks``.

The views need four facts about each framework, all of them data in
``images/<name>/framework.toml``: its default ``layout`` and GPU ``conv_algo`` (``[defaults]``),
the BLAS built into it (``builtin_blas``) and its examples' hyper-parameters (``[presets]``).
``framework_macros`` writes them as ``CREATE OR REPLACE MACRO`` statements; ``warehouse/db.py``
creates them before the macros of ``views/_macros.sql`` (which call them) and hashes them into
the views digest, so a warehouse's macros follow the framework data.  A framework matrun does
not know gets NULL from each.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from matrun.frameworks import Framework, frameworks
from matrun.runner.harness.models import TRANSFORMERS

#: What a rendered macro's comment names as its source (``db.MACRO_COMMENT_PREFIX`` + this).
SOURCE = "images/*/framework.toml"
#: The fields of a preset the views compare (default_hyperparams in views/_macros.sql).
PRESET_FIELDS = (("optimizer", "VARCHAR"), ("lr", "DOUBLE"), ("batch_size", "INTEGER"))


def framework_macros(registry: Mapping[str, Framework] | None = None) -> list[tuple[str, str]]:
    """``(name, CREATE OR REPLACE MACRO …)`` for each framework macro, from ``registry``
    (default: every framework of this matrun), in a stable order."""
    fws = sorted((registry if registry is not None else frameworks()).values(), key=lambda f: f.name)
    layout = _by_framework((f.name, f.defaults.get("layout")) for f in fws)
    gpu_algo = _by_framework((f.name, f.defaults.get("conv_algo")) for f in fws)
    blas = _by_framework((f.name, f.builtin_blas) for f in fws)
    presets = [(f.name, family, values) for f in fws for family, values in sorted(f.presets.items())]
    return [
        ("framework_default_layout",
         "CREATE OR REPLACE MACRO framework_default_layout(framework) AS\n    " + layout),
        ("framework_default_conv_algo",
         "CREATE OR REPLACE MACRO framework_default_conv_algo(framework, device) AS\n"
         f"    CASE WHEN device = 'gpu' THEN {gpu_algo} ELSE 'heuristic' END"),
        ("framework_builtin_blas",
         "CREATE OR REPLACE MACRO framework_builtin_blas(framework) AS\n    " + blas),
        ("framework_preset_hyperparams",
         "CREATE OR REPLACE MACRO framework_preset_hyperparams(framework, family) AS\n    "
         + _presets(presets)),
        # not a framework fact but the zoo's: whether a model is a transformer (it has no
        # image layout), from runner/harness/models.py
        ("transformer_model",
         "CREATE OR REPLACE MACRO transformer_model(model) AS\n    coalesce(model IN ("
         + ", ".join(_literal(name) for name in sorted(TRANSFORMERS)) + "), false)"),
    ]


def _by_framework(pairs: Iterable[tuple[str, str | None]]) -> str:
    whens = [f"WHEN {_literal(name)} THEN {_literal(value)}" for name, value in pairs if value is not None]
    return f"CASE framework {' '.join(whens)} END" if whens else "CAST(NULL AS VARCHAR)"


def _presets(presets: list[tuple[str, str, Mapping[str, Any]]]) -> str:
    struct = f"STRUCT({', '.join(f'{k} {t}' for k, t in PRESET_FIELDS)})"
    if not presets:
        return f"CAST(NULL AS {struct})"
    whens = []
    for name, family, values in presets:
        fields = ", ".join(f"{k} := {_literal(values.get(k))}::{t}" for k, t in PRESET_FIELDS)
        whens.append(f"WHEN framework = {_literal(name)} AND family = {_literal(family)} "
                     f"THEN struct_pack({fields})")
    return "CASE\n        " + "\n        ".join(whens) + "\n    END"


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"
