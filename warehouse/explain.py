"""``matrun explain CELL``: where a cell's training step goes, what bounds it, how the same
workload does in the other frameworks and in the same framework's other cells (another
layout, precision, convolution algorithm, …) and, for a multi-worker cell, what the model
predicted — in sentences (docs/MODEL.md).

The numbers are the ``iteration_model`` and ``iteration_scaling`` views'; this module finds
the cell, picks the comparisons and words them.  A comparison with another framework names
that framework; one with a cell of the same framework names every cell parameter whose
value differs (``runs.params``, identity parameters only), with both values.  A fused phase
(``forward+backward+update``) is compared only with the sum of the same phases elsewhere,
never split.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from matrun.errors import InputError
from matrun.frameworks import display_name
from matrun.runner.harness.spec import PARAMS  # the cell parameters, declared once (stdlib only)
from matrun.warehouse.compare import check_warehouse, fetch, reader

# A cell id is hex (runner/planning/identity.py); a warehouse may hold bundles written with
# other ids, so any of these characters is looked up (a prefix: starts_with, never a pattern).
_CELL = re.compile(r"^[0-9A-Za-z._-]{4,64}\Z")
#: The columns that make two cells "the same workload" across frameworks.
WORKLOAD = ("model", "dataset", "device", "threads", "batch_size", "workers", "nodes", "precision")
#: The columns a cell of the same framework shares to be compared: the workload less the
#: precision, which within one framework is a setting like the layout (two frameworks at two
#: precisions are never compared: that would mix two causes).
WITHIN = tuple(k for k in WORKLOAD if k != "precision")
_WORDS = {"input": "input", "h2d": "host-to-device copy", "forward": "forward pass",
          "backward": "backward pass", "exchange": "gradient exchange", "update": "optimizer update"}


def check_cell(cell: str) -> str:
    """``cell`` as given (a cell id or a prefix of at least 4 of its characters), or
    ``InputError``."""
    if not isinstance(cell, str) or not _CELL.match(cell):
        shown = cell if len(cell) <= 40 else cell[:37] + "..."
        raise InputError(f"CELL {shown!r}: expected a cell id or its first 4 or more characters "
                         "(`matrun status` lists them)")
    return cell


def explain(cell: str, *, warehouse: Path | str) -> dict[str, Any]:
    """The explanation of ``cell``: ``cell`` (its descriptors), ``phases`` (its rows of
    ``iteration_model``), ``others`` (the same workload's cells in other frameworks and the
    same framework's other cells of the workload, precision free: their step and phases,
    ``same_framework``, ``differs`` — each identity parameter whose value differs from this
    cell's, ``{key: {"value": theirs, "here": this cell's}}`` — ``another_environment``, and
    ``label``: for another framework with several such cells, the parameters that tell them
    apart), ``scaling`` (its ``iteration_scaling`` rows, as the cell or as the reference) and
    ``sentences``."""
    cell = check_cell(cell)
    path = check_warehouse(warehouse)
    with reader(path) as con:
        ids = [r["cell_id"] for r in fetch(con, "SELECT DISTINCT cell_id FROM iteration_model "
                                                "WHERE starts_with(cell_id, $p) ORDER BY cell_id", {"p": cell})]
        if not ids:
            ran = fetch(con, "SELECT count(*) AS n FROM runs WHERE starts_with(cell_id, $p)", {"p": cell})[0]["n"]
            why = ("its runs sampled no phases (phase_sampling = 0, inference, or a matrun before phases)"
                   if ran else "no run of it is in the warehouse")
            raise InputError(f"CELL {cell}: no cell with sampled phases matches: {why}")
        if len(ids) > 1:
            raise InputError(f"CELL {cell}: matches {len(ids)} cells ({', '.join(i[:16] for i in ids[:5])}"
                             f"{' …' if len(ids) > 5 else ''}); give more of its id")
        cell_id = ids[0]
        phases = fetch(con, "SELECT * FROM iteration_model WHERE cell_id = $c ORDER BY ordinal", {"c": cell_id})
        head = phases[0]
        same = " AND ".join(f"o.{k} IS NOT DISTINCT FROM $w_{k}" for k in WITHIN)
        others = fetch(con, f"SELECT o.* FROM iteration_model AS o WHERE o.cell_id <> $c AND {same} "
                            "AND (o.framework IS NOT DISTINCT FROM $fw "
                            "OR o.precision IS NOT DISTINCT FROM $w_precision) "
                            "ORDER BY o.framework, o.cell_id, o.ordinal",
                       {"c": cell_id, "fw": head["framework"], **{f"w_{k}": head[k] for k in WORKLOAD}})
        # each cell's parameters and environment, from the runs iteration_model reads
        settings = {r["cell_id"]: r for r in fetch(
            con, "SELECT cell_id, arg_max(params, run_id) AS params, arg_max(env_id, run_id) AS env_id FROM runs "
                 "WHERE status = 'ok' AND run_id IN (SELECT run_id FROM step_phases) "
                 "AND cell_id IN (SELECT unnest($ids::VARCHAR[])) GROUP BY cell_id",
            {"ids": [cell_id, *{r["cell_id"] for r in others}]})}
        scaling = fetch(con, "SELECT * FROM iteration_scaling WHERE cell_id = $c OR ref_cell_id = $c "
                             "ORDER BY workers, cell_id", {"c": cell_id})
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in others:
        grouped.setdefault(row["cell_id"], []).append(row)
    result = {"cell": {k: head[k] for k in ("cell_id", "framework", "variant", *WORKLOAD, "runs", "sampled_steps",
                                            "phase_every", "step_s_median", "sampled_step_s_median",
                                            "gap_s", "gap_share", "bottleneck", "fused", "gradient_bytes")},
              "phases": [{k: r[k] for k in ("phase", "seconds_median", "share", "samples")} for r in phases],
              "others": _others(grouped, head["framework"], cell_id, settings),
              "scaling": scaling}
    result["sentences"] = sentences(result)
    return result


def _others(grouped: dict[str, list[dict[str, Any]]], framework: str, cell_id: str,
            settings: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparisons' cells, each with what sets it apart from this cell (``differs``) and,
    for another framework with several cells here, from that framework's other cells
    (``label``)."""
    def params(cid: str) -> dict[str, Any]:
        raw = (settings.get(cid) or {}).get("params")
        return _identity(json.loads(raw) if isinstance(raw, str) else raw or {})

    mine = params(cell_id)
    env = (settings.get(cell_id) or {}).get("env_id")
    out = []
    for rows in grouped.values():
        head = rows[0]
        theirs = params(head["cell_id"])
        out.append({"cell_id": head["cell_id"], "framework": head["framework"], "variant": head["variant"],
                    "step_s_median": head["step_s_median"], "sampled_step_s_median": head["sampled_step_s_median"],
                    "phases": {r["phase"]: r["seconds_median"] for r in rows},
                    "same_framework": head["framework"] == framework,
                    "differs": {k: {"value": theirs.get(k), "here": mine.get(k)} for k in _keys(mine, theirs)
                                if theirs.get(k) != mine.get(k)},
                    "another_environment": (settings.get(head["cell_id"]) or {}).get("env_id") != env,
                    "label": {}})
    for fw in {o["framework"] for o in out if not o["same_framework"]}:
        group = [o for o in out if o["framework"] == fw]
        if len(group) < 2:
            continue
        every = [params(o["cell_id"]) for o in group]
        apart = [k for k in _keys(*every) if len({json.dumps(p.get(k), sort_keys=True) for p in every}) > 1]
        for o, p in zip(group, every):
            o["label"] = {k: p.get(k) for k in apart}
    return out


def _identity(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that make a cell what it is: the non-identity ones (``timeout``,
    ``phase_sampling``, …) left out, and a null one as if absent."""
    return {k: v for k, v in params.items() if v is not None and (k not in PARAMS or PARAMS[k].identity)}


def _keys(*params: dict[str, Any]) -> list[str]:
    """The keys of ``params``, in the order the host lists parameters (layout, precision and
    conv_algo together), unknown ones after, by name."""
    keys = set().union(*params)
    order = list(PARAMS)
    return sorted(keys, key=lambda k: (order.index(k), "") if k in PARAMS else (len(order), k))


def sentences(result: dict[str, Any]) -> list[str]:
    """The explanation in plain sentences (docs/MODEL.md "matrun explain")."""
    cell, phases = result["cell"], result["phases"]
    name = display_name(cell["framework"])
    step = cell["step_s_median"] or cell["sampled_step_s_median"]
    threads = cell["threads"]
    where = (f"{cell['model']} on {cell['dataset']} in {name} ({cell['device']}, "
             f"{'threads unset' if threads == 'unset' else f'{threads} thread' + ('s' if threads != '1' else '')}, "
             f"batch {cell['batch_size']}, {cell['workers']} worker{'s' if cell['workers'] != 1 else ''}"
             f"{', ' + str(cell['nodes']) + ' nodes' if cell['nodes'] and cell['nodes'] > 1 else ''})")
    parts = ", ".join(f"{_phase_words(p['phase'])} {_ms(p['seconds_median'])} ({_pct(p['share'])})" for p in phases)
    out = [f"{where}: a training step takes {_ms(step)} (median of the unsampled timed steps); "
           f"{cell['sampled_steps']} sampled step{'s' if cell['sampled_steps'] != 1 else ''} "
           f"(one timed step in {cell['phase_every']}) split it into {parts}"
           + (f", and {_ms(cell['gap_s'])} ({_pct(cell['gap_share'])}) is in no phase." if cell["gap_s"] is not None
              else ".")]
    top = max(phases, key=lambda p: p["seconds_median"] or 0)
    if "+" in top["phase"]:
        out.append(f"{name} runs its {_phase_words(top['phase'])} as one call ({_pct(top['share'])} of the step): "
                   "matrun does not split a fused time, so within it the bottleneck is not known from "
                   "this cell; the other frameworks' phases below show how the parts compare.")
    else:
        out.append(f"The {_WORDS.get(top['phase'], top['phase'])} bounds this step: {_pct(top['share'])} of it.")
    mine = {p["phase"]: p["seconds_median"] for p in phases}
    # the other frameworks first, then this framework's other cells; each by its step
    for other in sorted(result["others"], key=lambda o: (bool(o.get("same_framework")),
                                                         o["step_s_median"] or o["sampled_step_s_median"] or 0)):
        out.append(_comparison(name, step, mine, other))
    for row in result["scaling"]:
        out.append(_scaling_sentence(row, cell["cell_id"]))
    return out


def _comparison(name: str, step: float, mine: dict[str, float], other: dict[str, Any]) -> str:
    """One sentence: the other cell's step against this one's, and the phase (or fused
    phases, against the sum of the same phases here) that differs most.  Another framework is
    named as such; a cell of this cell's framework by every parameter that differs, with its
    value there and here."""
    theirs = other["step_s_median"] or other["sampled_step_s_median"]
    who = display_name(other["framework"])
    change = theirs / step - 1 if step else None
    cid = other["cell_id"][:16]
    if other.get("same_framework"):
        differs = other.get("differs") or {}
        what = _and([f"{k}={_value(d['value'])} instead of {_value(d['here'])}" for k, d in differs.items()])
        env = other.get("another_environment")
        who = (f"{who} with {what} (cell {cid}, its other parameters the same"
               f"{', in another environment' if env else ''})" if differs
               else f"{who} with the same parameters{' in another environment' if env else ''} (cell {cid})")
        text = f"{who}: its step is {_rel(change)} ({_ms(theirs)})" if change is not None else f"{who} ran too"
        return text + _phases_against(mine, theirs, other, ";")
    label = _and([f"{k}={_value(v)}" for k, v in (other.get("label") or {}).items()])
    workload = "on the same workload" + (f" with {label}" if label else "")
    text = (f"{who}'s step {workload} is {_rel(change)} ({_ms(theirs)}, cell {cid})"
            if change is not None else f"{who} ran the same workload{label and ' with ' + label} (cell {cid})")
    return text + _phases_against(mine, theirs, other, ":")


def _phases_against(mine: dict[str, float], theirs: float | None, other: dict[str, Any], joint: str) -> str:
    """The end of a comparison: the phase that differs most, any heavy phase without a
    counterpart here, and the full stop."""
    best, unmatched = None, []
    for phase, seconds in other["phases"].items():
        want = set(phase.split("+"))
        covering = [p for p in mine if set(p.split("+")) <= want]
        if not covering or set().union(*(set(p.split("+")) for p in covering)) != want or not seconds:
            unmatched.append((phase, seconds))
            continue
        here = sum(mine[p] for p in covering)
        if here and (best is None or abs(seconds - here) > abs(best[1] - best[2])):
            best = (phase, seconds, here)
    # a phase this cell has no counterpart of (an exchange through a parameter server, a fusion
    # that cuts across this cell's phases) that weighs in the other step
    heavy = [(p, sec) for p, sec in unmatched if theirs and sec and sec / theirs >= 0.2]
    extra = "".join(f"; its {_phase_words(p)} ({_ms(sec)}, {_pct(sec / theirs)} of its step) has no "
                    "counterpart here" for p, sec in heavy)
    if best is None:
        return (extra or "; no phase of the two can be set against each other (they fuse different "
                         "phases)") + "."
    phase, seconds, here = best
    return (f"{joint} its {_phase_words(phase)} takes {_ms(seconds)} against {_ms(here)} here "
            f"({_rel(seconds / here - 1)}){extra}.")


def _value(value: Any) -> str:
    """A parameter's value as a sentence shows it: JSON's spelling of true, false and null,
    a shape as 3x32x32."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, list):
        return "x".join(map(str, value))
    return str(value)


def _and(parts: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``; "" for none."""
    if len(parts) < 2:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _scaling_sentence(row: dict[str, Any], cell_id: str) -> str:
    name = display_name(row["framework"])
    role = "This cell" if row["cell_id"] == cell_id else f"Its {row['workers']}-worker cell {row['cell_id'][:16]}"
    if row["predicted_speedup"] is None:
        return (f"{role} ({name}, {row['workers']} workers) measured a speedup of {_x(row['speedup'])}; "
                "no prediction: its all-reduce was not calibrated.")
    overlap = (f", {_ms(row['exposed_s'])} of it not hidden behind the backward pass" if row["overlaps_backward"]
               else ", not overlapped with the backward pass")
    return (f"{role} ({name}, {row['workers']} workers, {row['scaling']} scaling): the model predicts a speedup "
            f"of {_x(row['predicted_speedup'])} against a linear {row['linear_speedup']}× — compute "
            f"{_ms(row['compute_s'])} from the 1-worker phases plus a {row['pattern'] or 'gradient exchange'} of "
            f"{row['gradient_bytes']:,} bytes over {row['transport'] or 'its transport'} "
            f"({_ms(row['latency_s'])} latency, {_rate(row['bandwidth_bytes_per_s'])}: {_ms(row['exchange_s'])}"
            f"{overlap}); measured {_x(row['speedup'])}, a prediction error of {_signed_pct(row['prediction_error'])}."
            + _contention(row))


def _contention(row: dict[str, Any]) -> str:
    """What the forward phases say of the model's first assumption (independent compute)."""
    slowdown = row.get("forward_slowdown")
    if slowdown is None:
        return ""
    if slowdown > 1.1:
        return (f" Each worker's forward pass took {slowdown:.1f}× as long as the 1-worker cell's: the workers "
                "contended for the host's cores, caches or memory bandwidth, which the model assumes they do not.")
    return f" Each worker's forward pass took {slowdown:.2f}× the 1-worker cell's: no sign of contention."


def _phase_words(phase: str) -> str:
    parts = phase.split("+")
    words = [_WORDS.get(p, p) for p in parts]
    return words[0] if len(words) == 1 else "fused " + " + ".join(parts)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.3g} ms" if abs(seconds) < 1 else f"{seconds:.3g} s"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f} %"


def _signed_pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f} %"


def _rel(change: float | None) -> str:
    if change is None:
        return "-"
    if abs(change) < 0.005:
        return "the same length"
    return f"{abs(change) * 100:.0f} % {'shorter' if change < 0 else 'longer'}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def _rate(bps: float | None) -> str:
    if bps is None:
        return "bandwidth unknown"
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.0f} MB/s"


def to_json(result: dict[str, Any]) -> str:
    """The explanation as JSON (numbers as numbers, the sentences as a list)."""
    return json.dumps(result, indent=2, default=str, allow_nan=False) + "\n"
