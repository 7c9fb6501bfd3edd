"""``matrun tune``: the fastest configuration of a matrix's search space at equal accuracy,
without running the whole matrix (docs/TUNE.md).

The space is the matrix's ``[axes]`` and ``[[zip]]`` groups after its profile and ``--set``
values (``matrix.load_space``: read and checked, never expanded, so 10^6 combinations cost
nothing).  Optuna's samplers propose combinations (``tpe``: a multivariate TPE that knows the
accuracy bound as a constraint; ``optuna``: Optuna's default sampler as ``create_study``
makes it; ``random``); each proposal becomes a cell through ``matrix.load_matrix`` with the
combination as ``--set`` values — the same validation, ``[[exclude]]`` rules and frameworks'
refusals as a sweep, and the same cell id, so a cell run before costs nothing.  A refused
combination costs no run and tells the sampler it is infeasible; a cell whose runs fail is
recorded as failed and never measured again by the tuning.

Order of a tuning:

1. each framework's *default cell*: the matrix with every searched parameter at matrun's
   default (its ``[fixed]`` values and ``--set`` kept), one run — the accuracy reference: a
   configuration whose accuracy is more than ``accuracy_within`` points below its framework's
   default is infeasible;
2. the search: a trial per proposal, ``repeats`` runs each, until the search's share of the
   budget is spent, the space is exhausted, or the sampler proposes only known cells;
3. the confirmation (``confirm``): per framework, runs added to the leader, to the contenders
   within 5 % of it and to the default, up to ``CONFIRM_RUNS`` each, the leader re-chosen after
   each round — repeats spent where the leaders are close — then the best against the default
   with the tests ``advise`` uses (Mann-Whitney, Hodges-Lehmann interval, "within 5 %").

Everything a trial decides is written through ``store`` before the next begins (the CLI's store
is the warehouse's ``tuning_trials``), so a tuning resumes after Ctrl-C or kill -9: the trials
recorded are told to a new sampler and the runs spent count against the budget.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.samplers import RandomSampler, TPESampler
from optuna.trial import TrialState, create_trial

from matrun.errors import InputError, MatrixError, MatrunError
from matrun.runner.planning.matrix import (
    CellParams, Space, apply_profile, load_matrix, parse_matrix, read_matrix_doc,
)
from matrun.runner.planning.params import PARAMS, as_text
from matrun.runner.sweep.bisect import comparison
from matrun.warehouse.modes import NOISY_CV, two_modes

SAMPLERS = ("tpe", "optuna", "random")
#: The verdict when no searched configuration beat the default cell itself
DEFAULT_IS_BEST = "the default is the best configuration found"
#: objective -> (larger is better, unit)
OBJECTIVES: dict[str, tuple[bool, str]] = {"throughput": (True, "img/s"), "train_s": (False, "s"),
                                           "j_per_image": (False, "J/img")}
#: Runs each of the leader, its close contenders and the default reach in the confirmation
#: (4 a side is the fewest at which an exact two-sided Mann-Whitney test can reach p < 0.05).
CONFIRM_RUNS = 4
#: A contender is close when its median is within this ratio of the leader's.
CLOSE = 1.05
#: At most this many contenders per framework get confirmation runs: the runners-up ...
MAX_CONTENDERS = 3
#: ... of which this many whatever their distance (a first run may have landed in a slow mode
#: of its process), the rest only when close.
RUNNERS_UP = 2
#: The search stops when this many proposals in a row were cells it had measured (converged).
KNOWN_STREAK = 40
#: ... or when this many proposals in a row were refused at plan time.
REFUSED_STREAK = 2000
_CONSTRAINTS_KEY = "constraints"  # where Optuna's samplers keep a trial's constraint values
_VIOLATION = "matrun_violation"  # the user attribute constraints_func reads


@dataclass(frozen=True)
class Dimension:
    """One searched choice: an axis (one key) or a zip group (its keys move together)."""

    name: str
    keys: tuple[str, ...]
    labels: tuple[str, ...]
    rows: tuple[Mapping[str, Any], ...]
    ordinal: bool = False  # numbers in increasing order: searched by position (IntDistribution), not as names

    def distribution(self) -> Any:
        return IntDistribution(0, len(self.rows) - 1) if self.ordinal else CategoricalDistribution(list(self.labels))

    def row(self, choice: Any) -> Mapping[str, Any]:
        return self.rows[int(choice)] if self.ordinal else self.rows[self.labels.index(choice)]

    def choice(self, params: Mapping[str, Any]) -> Any:
        label = "/".join(as_text(params[k]) for k in self.keys)
        return self.labels.index(label) if self.ordinal else label


@dataclass
class Evidence:
    """A cell's runs as the warehouse has them: the objective of its clean ok runs."""

    values: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    reason: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def accuracy(self) -> float | None:
        return statistics.median(self.accuracies) if self.accuracies else None


class Measure(Protocol):
    def __call__(self, cell: CellParams, combo: Mapping[str, Any], runs: int) -> tuple[int, float]:
        """Bring the cell to ``runs`` ok repeats (fewer when they fail): (runs started, seconds)."""


class Store(Protocol):
    def trials(self) -> list[dict[str, Any]]: ...
    def add(self, trial: dict[str, Any]) -> None: ...
    def save(self, status: str, summary: dict[str, Any] | None) -> None: ...


@dataclass(frozen=True)
class Settings:
    objective: str = "throughput"
    accuracy_within: float | None = None
    sampler: str = "tpe"
    seed: int = 0
    budget_runs: int | None = None
    budget_s: float | None = None
    repeats: int = 1  # runs per new trial
    confirm: bool = True


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def dimensions(space: Space) -> list[Dimension]:
    """The space's axes and zip groups as choices (labels as ``--where`` spells values).  An
    axis of numbers only (batch_size, threads = [1, 2, 4], lr) is ordinal: its values sorted and
    searched by position, so the sampler's model carries what it learnt at one value to its
    neighbours (for powers of two, a log scale); any other axis, and a zip group, is a set of
    names."""
    dims = []
    for key, values in space.axes.items():
        if len(values) > 1 and all(_number(v) for v in values):
            ordered = sorted(values)
            dims.append(Dimension(key, (key,), tuple(as_text(v) for v in ordered), tuple({key: v} for v in ordered),
                                  ordinal=True))
            continue
        dims.append(Dimension(key, (key,), tuple(as_text(v) for v in values), tuple({key: v} for v in values)))
    for group in space.zips:
        keys = tuple(group)
        n = min(len(v) for v in group.values())
        rows = tuple({k: group[k][i] for k in keys} for i in range(n))
        dims.append(Dimension("+".join(keys), keys, tuple("/".join(as_text(r[k]) for k in keys) for r in rows),
                              rows))
    for d in dims:
        if len(set(d.labels)) != len(d.labels):
            raise InputError(f"[axes] {d.name}: two values read the same ({', '.join(d.labels)}); a search needs "
                             "distinct values")
    return dims


def tuning_id(space: Space, settings: Settings) -> str:
    """The tuning's identity: its space (matrix path, profile, --set values, axes, zips, fixed
    values), objective, accuracy bound, sampler and seed — not its budget, so a larger budget
    continues a tuning."""
    doc = {"matrix": str(space.path), "profile": space.profile, "overrides": dict(space.overrides),
           "axes": {k: list(v) for k, v in space.axes.items()}, "zips": [{k: list(v) for k, v in g.items()}
                                                                      for g in space.zips],
           "fixed": dict(space.fixed), "objective": settings.objective, "accuracy_within": settings.accuracy_within,
           "sampler": settings.sampler, "seed": settings.seed, "repeats": settings.repeats}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    # "<file> with k = v, …: [fixed] why" -> "why"
    head, sep, rest = text.partition("] ")
    return rest if sep and head.count("[") == 1 else text


def cell_for(space: Space, combo: Mapping[str, Any]) -> CellParams | str:
    """The cell the combination plans (the matrix with its values as ``--set`` values), or why
    it cannot: a framework's refusal, an ``[[exclude]]`` rule."""
    try:
        m = load_matrix(space.path, space.profile, {**space.overrides, **combo})
    except MatrixError as exc:
        text = _first_line(exc)
        return "excluded by [[exclude]]" if "every combination is excluded" in text else text
    for cell in m.cells:
        if all(cell.values.get(k) is None or as_text(cell.values[k]) == as_text(v) for k, v in combo.items()):
            return cell
    return "excluded by [[exclude]]"


def default_combo(space: Space, dims: Sequence[Dimension], framework: str) -> dict[str, Any]:
    """The searched parameters' values in ``framework``'s default cell: the matrix without its
    axes, zips, includes and excludes (its ``[fixed]``, profile and ``--set`` values kept), the
    framework set — each searched parameter then at matrun's default for that framework
    (preset, layout, conv_algo resolved as for any cell)."""
    doc = read_matrix_doc(space.path)
    if space.profile is not None:
        doc = apply_profile(doc, doc["profiles"][space.profile], space.profile)
    doc = {k: v for k, v in doc.items() if k not in ("axes", "zip", "include", "exclude", "profiles")}
    doc["fixed"] = {**(doc.get("fixed") or {}), **space.overrides, "framework": framework}
    m = parse_matrix(doc, path=space.path)
    values = m.cells[0].values
    combo: dict[str, Any] = {}
    for d in dims:
        for k in d.keys:
            combo[k] = values[k] if values[k] is not None else PARAMS[k].default
    return combo


def frameworks_of(space: Space) -> list[str]:
    if "framework" in space.axes:
        return [str(v) for v in space.axes["framework"]]
    for g in space.zips:
        if "framework" in g:
            return list(dict.fromkeys(str(v) for v in g["framework"]))
    return [str(space.fixed.get("framework", PARAMS["framework"].default))]


def label_of(combo: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    return " ".join(f"{k}={as_text(v)}" for k, v in combo.items() if keys is None or k in keys)


def make_sampler(kind: str, seed: int, constraints: bool, budget: int | None) -> optuna.samplers.BaseSampler:
    """``tpe``: multivariate TPE (the parameters' interactions modelled jointly) with the
    accuracy bound and refusals as a constraint and a startup of random trials scaled to the
    budget; ``optuna``: ``TPESampler()`` as Optuna's ``create_study`` picks it, seeded;
    ``random``: uniform over the choices."""
    if kind == "random":
        return RandomSampler(seed=seed)
    if kind == "optuna":
        return TPESampler(seed=seed)
    startup = 10 if budget is None else max(4, min(10, budget // 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # multivariate and constraints_func are marked experimental
        return TPESampler(seed=seed, multivariate=True, n_startup_trials=startup, warn_independent_sampling=False,
                          constraints_func=(lambda t: (float(t.user_attrs.get(_VIOLATION, 0.0)),)) if constraints
                          else None)


@dataclass
class Trial:
    trial: int
    kind: str
    framework: str | None
    params: dict[str, Any]
    label: str
    cell_id: str | None
    state: str  # ok, infeasible, failed, refused
    value: float | None = None
    accuracy: float | None = None
    runs: int = 0
    seconds: float = 0.0
    reason: str = ""

    def row(self) -> dict[str, Any]:
        return {"trial": self.trial, "kind": self.kind, "framework": self.framework, "params": self.params,
                "label": self.label, "cell_id": self.cell_id, "state": self.state, "value": self.value,
                "accuracy": self.accuracy, "runs": self.runs, "seconds": self.seconds, "reason": self.reason}


@dataclass
class Part:
    """One framework's search: its choices, its values fixed, its Optuna study."""

    framework: str
    searched: list[Dimension]
    fixed: dict[str, Any]
    distributions: dict[str, Any]
    study: optuna.Study
    size: int
    tried: set[str] = field(default_factory=set)
    known_streak: int = 0
    refused_streak: int = 0
    ended: str = ""  # why this framework's search ended ("" while it goes on)

    def labels(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The study's parameters of a combination: a label, or an ordinal axis' position."""
        return {d.name: d.choice(params) for d in self.searched}

    def key(self, params: Mapping[str, Any]) -> str:
        return json.dumps(self.labels(params), sort_keys=True)


class Tuner:
    """One tuning of ``space`` (see the module's docstring).  ``measure`` runs a cell;
    ``evidence(cell_ids)`` reads their runs; ``store`` keeps the trials."""

    def __init__(self, space: Space, settings: Settings, *, measure: Measure,
                 evidence: Callable[[Sequence[str]], dict[str, Evidence]], store: Store,
                 cell_id: Callable[[CellParams], str], log: Callable[[str], None] = lambda s: None) -> None:
        if settings.objective not in OBJECTIVES:
            raise InputError(f"--objective: expected one of {', '.join(OBJECTIVES)}, got {settings.objective!r}")
        if settings.sampler not in SAMPLERS:
            raise InputError(f"--sampler: expected one of {', '.join(SAMPLERS)}, got {settings.sampler!r}")
        self.space, self.settings = space, settings
        self.measure, self.evidence, self.store, self.log = measure, evidence, store, log
        self._id = cell_id
        self.larger, self.unit = OBJECTIVES[settings.objective]
        self.dims = dimensions(space)
        self.searched = [d for d in self.dims if len(d.labels) > 1]
        if not self.searched:
            raise InputError(f"{space.path.name}: the space has one combination: nothing to tune (give [axes] "
                             "with two values or more)")
        self.trials: list[Trial] = []
        self.defaults: dict[str, Trial] = {}  # framework -> its default cell's trial
        self.cells: dict[str, CellParams] = {}
        self.combos: dict[str, dict[str, Any]] = {}
        self.by_cell: dict[str, Trial] = {}  # cell id -> its (first) search or default trial
        self.stop_reason = ""
        self.parts: dict[str, Part] = {}
        self._check_inputs()

    # -- inputs ---------------------------------------------------------------------------
    def _check_inputs(self) -> None:
        s, space = self.settings, self.space
        if s.budget_runs is None and s.budget_s is None:
            raise InputError("--budget is missing: give runs (--budget 50) or a duration (--budget 30m)")
        if s.budget_runs is not None and s.budget_runs < 1:
            raise InputError(f"--budget: expected at least 1 run, got {s.budget_runs}")
        if s.budget_s is not None and s.budget_s <= 0:
            raise InputError(f"--budget: expected a positive duration, got {s.budget_s:g} s")
        modes = {str(v) for v in space.axes.get("mode", ())} | {str(v) for g in space.zips for v in g.get("mode", ())}
        if not modes:
            modes = {str(space.fixed.get("mode", PARAMS["mode"].default))}
        if s.accuracy_within is not None:
            if not (math.isfinite(s.accuracy_within) and 0 <= s.accuracy_within <= 100):
                raise InputError(f"--accuracy-within: expected points from 0 to 100, got {s.accuracy_within:g}")
            if "inference" in modes:
                raise InputError("--accuracy-within: inference cells measure no accuracy (mode = \"inference\" in the "
                                 "space); drop the bound or tune training cells")
        if s.objective == "train_s" and modes == {"inference"}:
            raise InputError("--objective train_s: inference cells do not train; use --objective throughput")

    # -- budget ---------------------------------------------------------------------------
    @property
    def runs_used(self) -> int:
        return sum(t.runs for t in self.trials)

    @property
    def seconds_used(self) -> float:
        return sum(t.seconds for t in self.trials)

    def _left(self, runs: int) -> bool:
        """Whether ``runs`` more fit in the budget."""
        s = self.settings
        if s.budget_runs is not None and self.runs_used + runs > s.budget_runs:
            return False
        return s.budget_s is None or self.seconds_used < s.budget_s

    def _search_left(self, runs: int) -> bool:
        """Whether ``runs`` more fit in the search's share (the confirmation's reserve kept)."""
        s = self.settings
        if not s.confirm:
            return self._left(runs)
        n = len(self.defaults)
        reserve_runs = n * 2 * (CONFIRM_RUNS - 1)  # the default's and the leader's runs beyond their first
        if s.budget_runs is not None and self.runs_used + runs > s.budget_runs - min(reserve_runs, s.budget_runs // 3):
            return False
        return s.budget_s is None or self.seconds_used < s.budget_s * 2 / 3

    # -- trials ---------------------------------------------------------------------------
    def _record(self, t: Trial) -> Trial:
        self.trials.append(t)
        self.store.add(t.row())
        return t

    def _evaluate(self, cell: CellParams, combo: dict[str, Any], runs: int) -> tuple[Evidence, int, float]:
        pc_id = self._id(cell)
        have = self.evidence([pc_id]).get(pc_id, Evidence())
        spent, seconds = 0, 0.0
        if have.ok < runs and have.failed == 0:
            spent, seconds = self.measure(cell, combo, runs)
            have = self.evidence([pc_id]).get(pc_id, Evidence())
        return have, spent, seconds

    def _judge(self, t: Trial, ev: Evidence) -> None:
        if ev.ok == 0:
            t.state, t.reason = "failed", ev.reason or "no ok run"
            return
        if ev.median is None:
            t.state, t.reason = "failed", f"no ok run measured {self.settings.objective}"
            return
        t.value, t.accuracy = ev.median, ev.accuracy
        t.state = "ok"
        bound = self._accuracy_floor(t.framework)
        if bound is not None:
            if t.accuracy is None:
                t.state, t.reason = "infeasible", "no accuracy measured"
            elif t.accuracy < bound:
                t.state = "infeasible"
                t.reason = (f"accuracy {t.accuracy * 100:.2f} % is more than {self.settings.accuracy_within:g} points "
                            f"below the default's {self.defaults[t.framework].accuracy * 100:.2f} %")

    def _accuracy_floor(self, framework: str | None) -> float | None:
        if self.settings.accuracy_within is None or framework not in self.defaults:
            return None
        acc = self.defaults[framework].accuracy
        return None if acc is None else acc - self.settings.accuracy_within / 100

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        earlier = self.store.trials()
        if earlier:
            self.log(f"resuming: {len(earlier)} trials recorded, {sum(int(t['runs']) for t in earlier)} runs spent")
        self.store.save("running", None)
        try:
            self._defaults(earlier)
            self.parts = self._parts(earlier)
            self._search(self.parts)
            if self.settings.confirm:
                self._confirm()
        except BaseException:
            self.store.save("stopped", self.summary())
            raise
        summary = self.summary()
        self.store.save("done", summary)
        return summary

    def _replayed(self, earlier: list[dict[str, Any]], kind: str) -> list[Trial]:
        out = []
        for row in earlier:
            if row["kind"] != kind:
                continue
            t = Trial(int(row["trial"]), row["kind"], row["framework"], dict(row["params"]), row["label"],
                      row["cell_id"], row["state"], row["value"], row["accuracy"], int(row["runs"]),
                      float(row["seconds"]), row["reason"])
            self.trials.append(t)
            out.append(t)
        return out

    def _defaults(self, earlier: list[dict[str, Any]]) -> None:
        for t in self._replayed(earlier, "default"):
            self.defaults[t.framework] = t
            if t.cell_id:
                self.by_cell.setdefault(t.cell_id, t)
        for fw in frameworks_of(self.space):
            combo = default_combo(self.space, self.dims, fw)
            cell = cell_for(self.space, combo)
            if isinstance(cell, str):
                if self.settings.accuracy_within is not None:
                    raise InputError(f"--accuracy-within: {fw}'s default cell ({label_of(combo)}) cannot run in this "
                                     f"space: {cell}; the bound has no reference")
                self.log(f"{fw}: its default cell ({label_of(combo)}) cannot run here ({cell}): no default to compare")
                continue
            cid = self._id(cell)
            self.cells[cid], self.combos[cid] = cell, combo
            if fw in self.defaults:
                continue
            if not self._left(self.settings.repeats):
                raise InputError(f"--budget: no room for {fw}'s default cell; give more runs or time")
            ev, spent, secs = self._evaluate(cell, combo, self.settings.repeats)
            t = Trial(len(self.trials), "default", fw, _json_combo(combo), label_of(combo), cid, "ok", runs=spent,
                      seconds=secs)
            if ev.ok and ev.median is None:
                t.state, t.reason = "failed", f"no ok run measured {self.settings.objective}"
                self._record(t)  # its runs count against the budget of a later tuning of this space
                raise InputError(f"--objective {self.settings.objective}: the runs of {fw}'s default cell measured no "
                                 f"{self.settings.objective} ({self._unmeasured_hint()})")
            self._judge(t, ev)
            if t.state == "failed" and self.settings.accuracy_within is not None:
                self._record(t)
                raise MatrunError(f"{fw}'s default cell {cid} failed ({t.reason}): --accuracy-within has no "
                                  "reference accuracy")
            if self.settings.accuracy_within is not None and t.accuracy is None:
                self._record(t)
                raise InputError(f"--accuracy-within: {fw}'s default cell measured no accuracy (a cell without a "
                                 "test pass); drop the bound")
            self.defaults[fw] = self._record(t)
            self.by_cell.setdefault(cid, t)
            self.log(f"{fw} default ({t.label}): {self._fmt(t)}")

    def _unmeasured_hint(self) -> str:
        if self.settings.objective == "j_per_image":
            return "energy needs a readable RAPL counter or an NVIDIA GPU on the host; `matrun doctor` says which"
        return "see the runs' summaries"

    def _told(self, t: Trial) -> float:
        if t.state == "ok" and t.value is not None:
            return float(t.value)
        return 0.0 if self.larger else 1e300  # the worst: infeasible, failed or refused

    def _constraint(self, t: Trial) -> float:
        if t.state == "ok":
            return 0.0
        if t.state == "infeasible" and t.accuracy is not None:
            floor = self._accuracy_floor(t.framework)
            return max(1e-6, (floor - t.accuracy) * 100) if floor is not None else 1.0
        return 1000.0  # refused or failed: far from feasible

    def _parts(self, earlier: list[dict[str, Any]]) -> dict[str, Part]:
        """One Optuna study per framework (its searched choices: the space's but the framework,
        a zip group cut to that framework's rows), the recorded search trials told to it."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        parts: dict[str, Part] = {}
        for fw in frameworks_of(self.space):
            dims = []
            for d in self.dims:
                if d.keys == ("framework",):
                    continue
                if "framework" in d.keys:  # a zip group with the framework: that framework's rows
                    rows = [(label, row) for label, row in zip(d.labels, d.rows) if str(row["framework"]) == fw]
                    d = Dimension(d.name, d.keys, tuple(lb for lb, _ in rows), tuple(r for _, r in rows))
                dims.append(d)
            searched = [d for d in dims if len(d.labels) > 1]
            fixed = {k: v for d in dims if len(d.labels) == 1 for k, v in d.rows[0].items()}
            if "framework" in self.space.axes:
                fixed["framework"] = next(v for v in self.space.axes["framework"] if str(v) == fw)
            sampler = make_sampler(self.settings.sampler, self.settings.seed, self.settings.sampler == "tpe",
                                   None if self.settings.budget_runs is None
                                   else self.settings.budget_runs // len(frameworks_of(self.space)))
            study = optuna.create_study(direction="maximize" if self.larger else "minimize", sampler=sampler)
            parts[fw] = Part(fw, searched, fixed, {d.name: d.distribution() for d in searched},
                             study, math.prod(len(d.labels) for d in searched))
        for t in self._replayed(earlier, "search"):
            if t.cell_id:
                self.by_cell.setdefault(t.cell_id, t)
            part = parts.get(t.framework or "")
            if part is not None:
                part.tried.add(part.key(t.params))
                if part.searched:
                    self._tell_known(part, t)
        for c in self._replayed(earlier, "confirm"):  # the confirmation's latest word on its cell
            t = self.by_cell.get(c.cell_id or "")
            if t is not None:
                t.value, t.accuracy = c.value, c.accuracy
                if t.kind == "search":
                    t.state, t.reason = c.state, c.reason
        return parts

    def _tell_known(self, part: Part, t: Trial, study: optuna.Study | None = None) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (study or part.study).add_trial(create_trial(
                params=part.labels(t.params), distributions=part.distributions, value=self._told(t),
                state=TrialState.COMPLETE, user_attrs={_VIOLATION: self._constraint(t)},
                system_attrs={_CONSTRAINTS_KEY: (self._constraint(t),)}))

    def _search(self, parts: dict[str, Part]) -> None:
        """The frameworks take turns, the one with the fewest search runs first, until the
        budget's share is spent or every framework's search has ended."""
        while True:
            live = [p for p in parts.values() if not p.ended]
            if not live:
                self.stop_reason = "; ".join(f"{p.framework}: {p.ended}" for p in parts.values())
                return
            if not self._search_left(self.settings.repeats):
                self.stop_reason = "the search's share of the budget is spent"
                return
            spent = {fw: sum(t.runs for t in self.trials if t.kind == "search" and t.framework == fw) for fw in parts}
            part = min(live, key=lambda p: (spent[p.framework], list(parts).index(p.framework)))
            self._step(part)

    def _step(self, part: Part) -> None:
        """One proposal of ``part``'s study: refused, known (free) or measured."""
        if len(part.tried) >= part.size:
            part.ended = f"every one of its {part.size:,} combinations was tried"
            return
        if part.searched:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ot = part.study.ask(part.distributions)
            labels = {name: ot.params[name] for name in part.distributions}
        else:
            ot, labels = None, {}
        combo = dict(part.fixed)
        for d in part.searched:
            combo.update(d.row(labels[d.name]))
        key = json.dumps(labels, sort_keys=True)
        cell = cell_for(self.space, combo)
        fw = part.framework
        if isinstance(cell, str):
            t = Trial(len(self.trials), "search", fw, _json_combo(combo), label_of(combo, self._keys()), None,
                      "refused", reason=cell)
            self._tell(part, ot, t)
            if key not in part.tried:
                part.tried.add(key)
                self._record(t)
            part.refused_streak += 1
            if part.refused_streak >= REFUSED_STREAK:
                part.ended = f"{REFUSED_STREAK:,} proposals in a row were refused at plan time"
            return
        part.refused_streak = 0
        cid = self._id(cell)
        if (cid in self.by_cell and self.by_cell[cid].kind == "search") or key in part.tried:
            self._tell(part, ot, self.by_cell.get(cid) or self._copy(cid, combo))
            part.tried.add(key)
            part.known_streak += 1
            if part.known_streak >= KNOWN_STREAK:
                part.ended = f"the sampler proposed only measured cells {KNOWN_STREAK} times in a row"
            return
        part.known_streak = 0
        part.tried.add(key)
        self.cells[cid], self.combos[cid] = cell, combo
        ev, spent, secs = self._evaluate(cell, combo, self.settings.repeats)
        t = Trial(len(self.trials), "search", fw, _json_combo(combo), label_of(combo, self._keys()), cid, "ok",
                  runs=spent, seconds=secs)
        self._judge(t, ev)
        self._record(t)
        self.by_cell[cid] = t
        self._tell(part, ot, t)
        best = self._best_value(fw)
        self.log(f"trial {t.trial} ({self.runs_used} runs): {t.label}: {self._fmt(t)}"
                 + (f"; {fw}'s best so far {self._fmt_value(best)}" if best else ""))

    def _copy(self, cid: str, combo: dict[str, Any]) -> Trial:
        """A known cell proposed again under a new trial (its default cell, say)."""
        base = self.by_cell.get(cid)
        return base or Trial(-1, "search", None, _json_combo(combo), "", cid, "refused", reason="unknown")

    def _keys(self) -> list[str]:
        return [k for d in self.searched for k in d.keys]

    def _tell(self, part: Part, ot: optuna.Trial | None, t: Trial) -> None:
        if ot is None:
            return
        ot.set_user_attr(_VIOLATION, self._constraint(t))  # read by the tpe sampler's constraints_func
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            part.study.tell(ot, self._told(t))

    # -- confirmation ---------------------------------------------------------------------
    def _feasible(self, framework: str) -> list[Trial]:
        """The framework's searched cells that ran and meet the accuracy bound."""
        return [t for t in self.by_cell.values() if t.framework == framework and t.state == "ok"
                and t.kind == "search" and t.cell_id]

    def _candidates(self, framework: str) -> list[Trial]:
        """What the answer is chosen from: the feasible searched cells and the framework's
        default cell itself (no change at all can be the best configuration)."""
        out = self._feasible(framework)
        d = self.defaults.get(framework)
        if d is not None and d.cell_id and d.state == "ok" and d.value is not None \
                and all(t.cell_id != d.cell_id for t in out):
            out.append(d)
        return out

    def _rank(self, trials: list[Trial]) -> list[Trial]:
        """Best first, by each cell's favourable median (``_favourable``).  On a host where a
        run can land in a slow mode of its process (a slowdown, never a speed-up), one slow run
        of two must not sink a configuration that its other run shows fast; from three runs on
        it is the median's middle value or near it."""
        def key(t: Trial) -> tuple[float, int]:
            v = self._favourable(t)
            return (-(v or 0.0) if self.larger else (v if v is not None else math.inf), t.trial)
        return sorted(trials, key=key)

    def _confirm(self) -> None:
        """First each framework's default and leader to ``CONFIRM_RUNS`` runs (the frameworks in
        turn, the leader chosen again after every run), then the leaders' runners-up and close
        contenders."""
        stuck: set[str] = set()  # cells a run more did not add an ok run to (it failed, or no run was made)
        for contenders in (False, True):
            while True:
                need: list[Trial] = []
                for fw in self.defaults:
                    ranked = self._rank(self._candidates(fw))
                    if not ranked:
                        continue
                    leader = ranked[0]
                    others = [t for t in ranked[1:] if t.cell_id != self.defaults[fw].cell_id]  # it has its runs
                    group = ([t for i, t in enumerate(others[:MAX_CONTENDERS], 1)
                              if i < RUNNERS_UP + 1 or self._close(leader, t)] if contenders
                             else list({t.cell_id: t for t in (self.defaults[fw], leader)}.values()))
                    need += [t for t in group if t.cell_id and t.state in ("ok", "infeasible")
                             and t.cell_id not in stuck
                             and self._runs(t.cell_id) < CONFIRM_RUNS and not self._failed(t.cell_id)]
                if not need:
                    break
                if not self._left(1):
                    self.stop_reason += "; the budget ran out during the confirmation"
                    return
                chosen = min(need, key=lambda x: self._runs(x.cell_id or ""))
                before = self._runs(chosen.cell_id or "")
                self._more(chosen)
                if self._runs(chosen.cell_id or "") <= before:
                    stuck.add(chosen.cell_id or "")

    def _favourable(self, t: Trial) -> float | None:
        """The cell's *favourable median* over its ok runs: the middle value, and of two middle
        values the better (of two runs the faster); its trial's value without runs."""
        vals = sorted(self.evidence([t.cell_id]).get(t.cell_id, Evidence()).values) if t.cell_id else []
        if not vals:
            return t.value
        return vals[len(vals) // 2] if self.larger else vals[(len(vals) - 1) // 2]

    def _failed(self, cell_id: str) -> bool:
        return self.evidence([cell_id]).get(cell_id, Evidence()).failed > 0

    def _close(self, leader: Trial, t: Trial) -> bool:
        if leader.value is None or t.value is None or not leader.value or not t.value:
            return False
        ratio = leader.value / t.value if self.larger else t.value / leader.value
        return ratio <= CLOSE

    def _runs(self, cell_id: str) -> int:
        return self.evidence([cell_id]).get(cell_id, Evidence()).ok

    def _more(self, t: Trial) -> None:
        assert t.cell_id
        if t.cell_id not in self.cells:  # a trial recorded before a resume: planned again from its parameters
            again = cell_for(self.space, t.params)
            if isinstance(again, str) or self._id(again) != t.cell_id:
                return  # the matrix changed under it: no run more (the confirmation moves on)
            self.cells[t.cell_id], self.combos[t.cell_id] = again, dict(t.params)
        cell, combo = self.cells[t.cell_id], self.combos[t.cell_id]
        want = self._runs(t.cell_id) + 1
        ev, spent, secs = self._evaluate(cell, combo, want)
        c = Trial(len(self.trials), "confirm", t.framework, t.params, t.label, t.cell_id, "ok", runs=spent,
                  seconds=secs)
        self._judge(c, ev)
        self._record(c)
        t.value, t.accuracy = c.value, c.accuracy
        if t.kind == "search" and c.state != t.state:
            t.state, t.reason = c.state, c.reason
        if t.kind == "default":
            t.state = c.state if c.state != "infeasible" else "ok"
        self.log(f"confirm {t.framework} {t.label}: {ev.ok} runs, {self._fmt(c)}")

    # -- the answer -----------------------------------------------------------------------
    def _best_value(self, framework: str) -> float | None:
        feasible = [t for t in self._candidates(framework) if t.value]
        return self._rank(feasible)[0].value if feasible else None

    def _fmt_value(self, v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:,.0f} {self.unit}" if abs(v) >= 1000 else f"{v:.4g} {self.unit}"

    def _fmt(self, t: Trial) -> str:
        if t.state in ("failed", "refused"):
            return f"{t.state} ({t.reason})"
        acc = f", accuracy {t.accuracy * 100:.2f} %" if t.accuracy is not None else ""
        return (f"{self._fmt_value(t.value)}{acc}" + (f" — infeasible: {t.reason}" if t.state == "infeasible" else ""))

    def summary(self) -> dict[str, Any]:
        """The answer per framework, the importances, the trace and the counts (docs/TUNE.md)."""
        answer = []
        for fw in frameworks_of(self.space):
            d = self.defaults.get(fw)
            ranked = self._rank(self._candidates(fw))
            best = ranked[0] if ranked else None
            item: dict[str, Any] = {"framework": fw, "default": self._cell_doc(d), "best": self._cell_doc(best),
                                    "changes": [], "comparison": {}, "verdict": "no feasible configuration"}
            item["noise"] = self._noise(item)
            if best and d and best.cell_id == d.cell_id:
                item["verdict"] = DEFAULT_IS_BEST
            elif best and d:
                item["changes"] = [f"{k}={as_text(v)}" for k, v in best.params.items()
                                   if as_text(d.params.get(k)) != as_text(v)]
                bv, dvv = item["best"]["values"], item["default"]["values"]  # the cell documents' runs
                if bv and dvv:
                    c = comparison(bv, dvv, self.larger)
                    item["comparison"] = {k: c[k] for k in ("ratio", "ratio_low", "ratio_high", "p_value")}
                    item["verdict"] = _verdict(c, len(bv), len(dvv), self.larger)
            elif best:
                item["verdict"] = "no default to compare"
            answer.append(item)
        return {"objective": self.settings.objective, "unit": self.unit, "larger_is_better": self.larger,
                "accuracy_within": self.settings.accuracy_within, "sampler": self.settings.sampler,
                "seed": self.settings.seed, "space_size": self.space.size,
                "searched": [d.name for d in self.searched], "runs": self.runs_used,
                "seconds": round(self.seconds_used, 3),
                "trials": {s: sum(1 for t in self.trials if t.kind == "search" and t.state == s)
                           for s in ("ok", "infeasible", "failed", "refused")},
                "stopped_because": self.stop_reason, "answer": answer, "importance": self.importance(),
                "trace": self.trace()}

    def _noise(self, item: Mapping[str, Any]) -> list[str]:
        """Notes on the answer's sides (its cell documents) whose runs spread widely (a
        coefficient of variation over ``NOISY_CV``, as advise notes it), or fall into two modes
        (warehouse/modes.py: a process's slow mode on a noisy host); the best once, when it is
        the default."""
        notes = []
        d, b = item["default"], item["best"]
        for side, doc in (("default", d), ("best", b if b and (d is None or b["cell_id"] != d["cell_id"]) else None)):
            vals = doc["values"] if doc else []
            if len(vals) < 2 or not statistics.fmean(vals):
                continue
            cv = statistics.stdev(vals) / abs(statistics.fmean(vals))
            modes = two_modes(vals)
            if modes is not None and modes.bimodal:
                notes.append(f"the {side}'s {len(vals)} runs fall into two modes ({self._fmt_value(modes.low_median)} "
                             f"and {self._fmt_value(modes.high_median)}; CV {cv:.1%})")
            elif cv > NOISY_CV:
                notes.append(f"the {side}'s runs are noisy (CV {cv:.1%} over {len(vals)} runs)")
        return notes

    def _cell_doc(self, t: Trial | None) -> dict[str, Any] | None:
        if t is None:
            return None
        ev = self.evidence([t.cell_id]).get(t.cell_id, Evidence()) if t.cell_id else Evidence()
        return {"cell_id": t.cell_id, "label": t.label, "params": t.params, "runs": ev.ok, "median": ev.median,
                "accuracy": ev.accuracy, "values": ev.values}

    def trace(self) -> list[dict[str, Any]]:
        """After each trial that ran something or found a feasible value: the runs spent so
        far and its framework's best feasible value so far (its default cell's first)."""
        out: list[dict[str, Any]] = []
        best: dict[str, float] = {}
        runs = 0
        for t in sorted(self.trials, key=lambda t: t.trial):
            runs += t.runs
            fw = t.framework or ""
            if t.kind in ("search", "default") and t.state == "ok" and t.value is not None:
                if fw not in best or (t.value > best[fw] if self.larger else t.value < best[fw]):
                    best[fw] = t.value
            if t.runs or (t.kind in ("search", "default") and t.state == "ok"):
                out.append({"trial": t.trial, "runs": runs, "framework": fw, "best": best.get(fw)})
        return out

    def importance(self) -> dict[str, dict[str, float]]:
        """Per framework, each searched parameter's importance over its feasible trials:
        Optuna's PED-ANOVA (how differently the parameter's values are spread in the best 10 %
        of the trials and in all of them; normalised to sum to 1; NumPy only, where fANOVA needs
        scikit-learn); a framework with fewer than 4 feasible trials has none."""
        out: dict[str, dict[str, float]] = {}
        for fw, part in self.parts.items():
            ok = [t for t in self._feasible(fw) if t.value is not None]
            if len(ok) < 4 or not part.searched:
                continue
            study = optuna.create_study(direction="maximize" if self.larger else "minimize")
            for t in ok:
                self._tell_known(part, t, study)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    imp = optuna.importance.get_param_importances(
                        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
            except (RuntimeError, ValueError) as exc:  # all values alike
                self.log(f"{fw}: importance not computed: {exc}")
                continue
            out[fw] = {k: round(float(v), 4) for k, v in imp.items()}
        return out


def _json_combo(combo: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(combo), default=str))


def _verdict(c: Mapping[str, Any], n_best: int, n_default: int, larger: bool) -> str:
    """advise's words: a significant gain, the defaults as good to 5 %, or not significant."""
    if c.get("better"):
        return "better than the default (p < 0.05)"
    if c.get("worse"):
        return "worse than the default (p < 0.05)"
    low, high = c.get("ratio_low"), c.get("ratio_high")
    if low is not None and high is not None and 1 / 1.05 <= low and high <= 1.05:
        return "within 5 % of the default"
    if min(n_best, n_default) < CONFIRM_RUNS:
        return f"not significant ({n_best} against {n_default} runs: {CONFIRM_RUNS} a side can decide)"
    return "not significant"
