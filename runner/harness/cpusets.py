"""CPU lists as Linux and Docker spell them (``"0-1,3"``): parsed and written in one place.

The host checks a matrix's ``cpuset`` with ``parse_cpuset`` (``runner/harness/spec.py``),
pins processes and containers to its CPUs, and the harness splits it between the workers
of a multi-worker cell and compares it with the affinity in force, all with these two
functions.  Standard library only.
"""

from __future__ import annotations

import re
from typing import Iterable

CPUSET = re.compile(r"^\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?){0,1023}\Z")


def parse_cpuset(text: str) -> set[int]:
    """CPU ids of a cpuset string such as ``"0-3,6"`` (``""``: the empty set).

    Raises ``ValueError`` with the words that follow the key path in a user's message when
    ``text`` is not such a list or one of its ranges runs backwards.
    """
    if text and not CPUSET.match(text):
        raise ValueError(f'expected a CPU list such as "0-3,6" (or "" for no pinning), got "{text}"')
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f'CPU range "{part}" runs backwards')
        cpus.update(range(first, last + 1))
    return cpus


def format_cpuset(cpus: Iterable[int]) -> str:
    """The shortest cpuset string for ``cpus`` (``[0, 1, 3]`` -> ``"0-1,3"``)."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)
