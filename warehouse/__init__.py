"""The result warehouse (a DuckLake: a catalog and Parquet files, read with DuckDB): schema
migrations, SQL views, bundles and their ingest, and the read-only readings built on it (docs/WAREHOUSE.md is the contract other code relies on).

Modules:

- ``catalog``: where a warehouse's DuckLake catalog and Parquet data live, the extensions
  loaded by path, and the ``attach.sql`` any DuckDB client runs to read it;
- ``db``: open a warehouse: the writers' lock, creation and upgrade, migrations
  (``migrations/NNN_name.sql``), views (``views/<name>.sql``, macros in ``views/_macros.sql``);
- ``framework_sql``: the framework facts the views need, rendered from
  ``matrun.frameworks`` as SQL macros (created by ``db`` before ``views/_macros.sql``);
- ``bundles/``: the result bundle, both sides: ``layout`` (file names, schema version,
  statuses, run directories), ``write`` (the host's writers), ``read`` (find and validate);
- ``rows``: a bundle's rows, one Arrow table per warehouse table, checked against the columns;
- ``ingest``: load bundles into the warehouse, a transaction per batch;
- ``maintenance``: compaction of the lake's files after ingests;
- ``query``: one read-only SQL statement typed by a user;
- ``images``: the ``images`` table ``matrun build`` records;
- ``compare``: ``matrun compare``: two selections of runs matched cell by cell (data, CSV,
  JSON; its HTML page is ``matrun.reports.compare``);
- ``advise``: ``matrun advise``: the best configuration against the defaults, in sentences;
- ``findings``: a study's declaration (``[study]``, ``[[findings]]``, ``[paper]``) parsed and
  registered (the ``findings`` view judges it).

May import ``matrun.errors``, ``matrun.frameworks`` and the harness's parameter spec
(``matrun.runner.harness``); never ``matrun.reports`` or the CLI (they import the warehouse).
"""
