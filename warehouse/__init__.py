"""The DuckDB result warehouse: schema migrations, SQL views, bundle ingest, read-only query.

Modules: ``db`` (open a warehouse: lock, migrations, views), ``bundles`` (find and validate
result bundles), ``ingest`` (load bundles in one transaction), ``query`` (read-only SQL).
The contract other code relies on is docs/WAREHOUSE.md.
"""
