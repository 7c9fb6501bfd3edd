"""The in-cell harness: runs one cell inside a framework environment and writes its events.

The host launches it as ``python -m matrun.runner.harness --spec DIR/spec.json --out DIR``
and reads the files it writes (docs/HARNESS.md, docs/BUNDLE.md).  It is also the single
source of the facts both sides need about a cell: its parameters, the datasets and the
networks; the host builds its own registries from these modules.

- ``__main__``: the command line (exit codes, SIGTERM, ``--launch``).
- ``cell``: ``load_spec`` (spec.json read and checked) and ``run_cell`` (the order of events).
- ``spec``: every cell parameter declared once (check, default, help, identity, choices),
  the unused-key rule and the rules between keys.
- ``errors``: ``HarnessError``, ``SpecError``, ``DataError``.
- ``datasets``: dataset names and shapes, the IDX reader, synthetic data.
- ``models``: the networks as framework-neutral layer lists (shapes, parameters, FLOPs).
- ``cpusets``: cpuset strings (``"0-1,3"``) parsed and written.
- ``distributed``: multi-worker cells: who a process is, how batch, CPUs and threads split.
- ``launch``: the in-cell launcher of a multi-worker cell's processes.
- ``lease``: the watchdog that stops the cell once the sweep that started it is gone.
- ``probe``: what is really in force (libraries, affinity, BLAS); the oneDNN check.
- ``events``: the ``events.jsonl`` writer and the summary.
- ``layers``: layer-by-layer timing (``layer_profile``).
- ``adapters/``: one module per framework, named by the framework value.

Imports: the standard library, its own modules and, inside an adapter, the framework
(threadpoolctl when present).  Nothing else of matrun: the host stages this folder alone
onto the cell's ``PYTHONPATH`` (``runner/environments/home.py``).  This file imports
nothing, so that importing one module of the harness imports only what that module needs.
"""
