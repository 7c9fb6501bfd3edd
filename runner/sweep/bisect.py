"""``matrun bisect``: the framework release where a workload became slower.

Given one workload (a matrix cell without ``version``) and two releases of its framework, a
*good* one and a *bad* one, bisect measures both, checks that the bad one is worse (the same
two-sided Mann-Whitney test as ``compare`` and ``history``, at p < 0.05; otherwise there is
nothing to look for and it stops with an error), then halves the releases the package index
offers between them: each release it measures is a real cell with ``version`` set, run by the
sweep (its environment built once and kept, its runs in the warehouse like any run, so a
release measured before costs nothing), and is judged *bad* when it is worse than the good
release and not better than the bad one, *good* in the mirror case, and otherwise by which of
the two its median is nearer (a ratio on the log scale; said so in the output).  A release whose
runs all fail (its environment cannot be built, the adapter cannot drive it) is skipped, as
``git bisect skip`` does, and a neighbour is measured instead.

Releases measured: the two given and ⌈log2(n − 1)⌉ between them at most, for n releases from
good to bad (fewer when a release was measured before).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from matrun.errors import InputError
from matrun.frameworks import release_key
from matrun.runner.environments.releases import nearest
from matrun.runner.planning.sequential import ALPHA, p_value, ratio_interval


@dataclass
class Measured:
    release: str
    values: list[float]
    verdict: str = ""  # "good" / "bad" (given or judged), "untestable"
    how: str = ""  # "given", "decided" (both tests agree), "nearer" (by the medians), or why untestable
    vs_good: dict[str, Any] = field(default_factory=dict)
    vs_bad: dict[str, Any] = field(default_factory=dict)
    order: int = 0  # when it was measured (1 = first)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None


@dataclass
class Bisection:
    framework: str
    workload: str
    metric: str
    unit: str
    larger_is_better: bool
    releases: list[str]
    measured: dict[str, Measured] = field(default_factory=dict)
    last_good: str = ""
    first_bad: str = ""
    skipped_between: list[str] = field(default_factory=list)  # untestable releases between the two

    @property
    def bound(self) -> int:
        """The most releases a bisection of these releases measures: both ends and the halvings."""
        return 2 + math.ceil(math.log2(max(1, len(self.releases) - 1)))

    @property
    def change(self) -> dict[str, Any]:
        """The first bad release against the last good one (the change bisect found)."""
        if not self.first_bad or not self.last_good:
            return {}
        return comparison(self.measured[self.first_bad].values, self.measured[self.last_good].values,
                          self.larger_is_better)


def comparison(x: list[float], ref: list[float], larger_is_better: bool) -> dict[str, Any]:
    """``x`` against ``ref``: the ratio of medians with its Hodges-Lehmann interval, the
    two-sided Mann-Whitney p and whether x is significantly worse or better."""
    m, n = len(x), len(ref)
    u = sum((a > b) + 0.5 * (a == b) for a in x for b in ref)
    p = p_value(u, m, n) if m and n else None
    med_x, med_ref = statistics.median(x), statistics.median(ref)
    ratio = med_x / med_ref if med_ref else None
    interval = ratio_interval(x, ref)
    lower = med_x < med_ref
    worse = lower if larger_is_better else not lower
    significant = p is not None and p < ALPHA and med_x != med_ref
    return {"ratio": ratio, "ratio_low": interval[0] if interval else None,
            "ratio_high": interval[1] if interval else None, "p_value": p,
            "worse": significant and worse, "better": significant and not worse}


def releases_between(offered: list[str], good: str, bad: str) -> list[str]:
    """The offered releases from ``good`` to ``bad`` (either may be the newer), in that order;
    pre-releases only where an end is one.  ``InputError`` naming the option for an end the
    index does not offer, or for good = bad."""
    keys = {release_key(v): v for v in offered}
    for option, value in (("--good", good), ("--bad", bad)):
        if release_key(value) not in keys:
            raise InputError(f"{option} {value}: not a release the package index offers here; nearest: "
                             f"{', '.join(nearest(value, offered))}")
    lo, hi = sorted((release_key(good), release_key(bad)))
    if lo == hi:
        raise InputError(f"--good and --bad are the same release ({good}): nothing to bisect")
    pre_ok = any(release_key(v)[1] != (0, "", 0) or release_key(v)[3] != (1, 0) for v in (good, bad))
    inside = [v for k, v in sorted(keys.items()) if lo <= k <= hi
              and (pre_ok or (k[1] == (0, "", 0) and k[3] == (1, 0)))]
    return inside if release_key(good) < release_key(bad) else list(reversed(inside))


def bisect(releases: list[str], measure: Callable[[str], list[float] | str], *, framework: str, workload: str,
           metric: str, unit: str, larger_is_better: bool, log: Callable[[str], None] = lambda s: None) -> Bisection:
    """Bisect ``releases`` (good first, bad last).  ``measure(release)``: the metric's values of
    the release's ok runs, or a string saying why it could not be measured.  Raises
    ``InputError`` when an end cannot be measured or the bad release is not worse."""
    result = Bisection(framework, workload, metric, unit, larger_is_better, list(releases))

    def take(release: str) -> Measured:
        got = measure(release)
        item = Measured(release, [] if isinstance(got, str) else [float(v) for v in got],
                        order=len(result.measured) + 1)
        if isinstance(got, str) or not item.values:
            item.verdict, item.how = "untestable", got if isinstance(got, str) else "no ok run"
        result.measured[release] = item
        log(f"{release}: " + (f"{item.how}" if item.verdict == "untestable" else
                              f"median {item.median:,.4g} {unit} over {len(item.values)} runs"))
        return item

    good, bad = take(releases[0]), take(releases[-1])
    for end, option in ((good, "--good"), (bad, "--bad")):
        if end.verdict == "untestable":
            raise InputError(f"{option} {end.release}: no ok run to compare ({end.how})")
    good.verdict, good.how = "good", "given"
    bad.verdict, bad.how = "bad", "given"
    bad.vs_good = comparison(bad.values, good.values, larger_is_better)
    if not bad.vs_good["worse"]:
        c = bad.vs_good
        raise InputError(f"--bad {bad.release} is not {'slower' if larger_is_better else 'worse'} than --good "
                         f"{good.release}: {metric} {c['ratio']:.3f}× of good's (p = {c['p_value']:.3g}, "
                         f"{len(bad.values)} against {len(good.values)} runs), not significant at p < {ALPHA}; "
                         "nothing to bisect (more repeats with --repeats, or other releases)")
    lo, hi = 0, len(releases) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidates = sorted(range(lo + 1, hi), key=lambda i: (abs(i - mid), i))
        chosen = None
        for i in candidates:
            item = result.measured.get(releases[i]) or take(releases[i])
            if item.verdict != "untestable":
                chosen = i
                break
        if chosen is None:  # every release between is untestable: the change lies in the range
            result.skipped_between = releases[lo + 1:hi]
            break
        item = result.measured[releases[chosen]]
        _judge(item, good, bad, larger_is_better)
        if item.verdict == "bad":
            hi = chosen
        else:
            lo = chosen
    result.last_good, result.first_bad = releases[lo], releases[hi]
    return result


def _judge(item: Measured, good: Measured, bad: Measured, larger_is_better: bool) -> None:
    item.vs_good = comparison(item.values, good.values, larger_is_better)
    item.vs_bad = comparison(item.values, bad.values, larger_is_better)
    worse_than_good, better_than_bad = item.vs_good["worse"], item.vs_bad["better"]
    if worse_than_good != better_than_bad:
        item.verdict, item.how = ("bad" if worse_than_good else "good"), "decided"
        return
    to_good = abs(math.log(item.median / good.median)) if item.median and good.median else math.inf
    to_bad = abs(math.log(item.median / bad.median)) if item.median and bad.median else math.inf
    item.verdict, item.how = ("good" if to_good <= to_bad else "bad"), "nearer"


def to_json_doc(result: Bisection) -> dict[str, Any]:
    return {"framework": result.framework, "workload": result.workload, "metric": result.metric,
            "unit": result.unit, "releases": result.releases, "last_good": result.last_good,
            "first_bad": result.first_bad, "change": result.change, "skipped_between": result.skipped_between,
            "measured_releases": len(result.measured), "bound": result.bound,
            "measured": [{"release": m.release, "order": m.order, "n": len(m.values), "median": m.median,
                          "verdict": m.verdict, "how": m.how, "vs_good": m.vs_good or None,
                          "vs_bad": m.vs_bad or None, "values": m.values}
                         for m in sorted(result.measured.values(), key=lambda m: result.releases.index(m.release))]}


def sentences(result: Bisection) -> list[str]:
    """What bisect found, in words (the CLI's text output after its table)."""
    lines = []
    if result.skipped_between:
        lines.append(f"the change lies between {result.last_good} (good) and {result.first_bad} (bad); "
                     f"{', '.join(result.skipped_between)} could not be measured")
    elif result.first_bad:
        c = result.change
        interval = (f" [{c['ratio_low']:.3f}, {c['ratio_high']:.3f}]"
                    if c.get("ratio_low") is not None else "")
        p = f", p = {c['p_value']:.3g}" if c.get("p_value") is not None else ""
        lines.append(f"first bad release: {result.first_bad} ({result.last_good} is the last good one): "
                     f"{result.metric} {c['ratio']:.3f}×{interval} of {result.last_good}'s{p}")
    lines.append(f"releases measured: {len(result.measured)} of the {len(result.releases)} from good to bad "
                 f"(at most 2 + ⌈log2({len(result.releases) - 1})⌉ = {result.bound})")
    return lines
