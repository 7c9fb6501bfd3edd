"""The ``matrun`` command line: thin Typer commands over the library's keyword-only functions.

Modules:

- ``common``: the Typer ``app``, ``command`` / ``group`` (the one way to register a command,
  which also turns a ``MatrunError`` into ``Error: …`` and exit code 2 or 1), the shared
  options, the consoles, the default warehouse, ``matrun --version``;
- ``runs``: ``plan``, ``sweep``, ``status``, ``cancel``;
- ``progress``: what ``sweep`` shows while it runs (a live line on a terminal, plain lines
  elsewhere);
- ``results``: ``ingest``, ``query``, ``report``;
- ``tables``: how ``query`` fits a result to a terminal (hidden middle columns, ``vertical``);
- ``shell``: ``shell`` (the DuckDB client on the warehouse, read-only);
- ``environments``: ``envs``, ``build``, ``images`` and the ``engine`` group;
- ``analysis``: ``compare``, ``advise``;
- ``bisect``: ``bisect`` (the release where a workload became slower);
- ``tune``: ``tune`` (the best configuration of a matrix's space, searched with Optuna);
- ``data``: the ``data`` group (``import``, ``list``);
- ``slurm``: the ``slurm`` group (a local test cluster);
- ``main``: the entry point: imports every command module, ``main()``.

May import anything of matrun (the CLI is the top layer); nothing imports it but its own
modules.  The report modules (Polars, Plotly) are imported inside the commands that need
them, so that ``matrun --help`` and the other commands start without them.
"""
