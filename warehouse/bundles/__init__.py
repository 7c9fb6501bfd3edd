"""Result bundles, both sides: the directory a run leaves on disk (docs/BUNDLE.md).

Modules:

- ``layout``: the bundle's file names (``SPEC``, ``EVENTS``, ``MONITOR``, ``STDOUT``,
  ``STDERR``, ``RESULT``), ``SCHEMA_VERSION``, the run ``STATUSES``, ``RunKey`` and the
  ``<repeat>-<attempt>`` run-directory names;
- ``write``: the host's writers (executors, sweep, Slurm tasks): atomic JSON, JSON-lines with
  their header, ``next_attempt``, ``tail_text``;
- ``read``: finding, parsing and validating bundles for ``warehouse.ingest``; the JSON-lines
  files are read in blocks, hashed as they are read, their step records and monitor samples
  many lines at a time into Arrow record batches;
- ``quarantine``: setting a bundle an ingest skipped aside, into the ``.quarantine`` folder
  beside it, which no ingest or sweep reads (``matrun ingest --quarantine``).

Standard library, ``matrun.errors`` and (``read``) PyArrow only, never DuckDB: the runner
writes bundles through this package without loading the warehouse.  The harness writes ``events.jsonl`` without it
(it is standard library + framework only) and names ``layout`` where it spells the file name.
"""
