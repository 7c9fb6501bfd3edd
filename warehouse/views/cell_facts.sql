-- Every cell's statistics and what the study views read beside them: the rows of view
-- cell_facts_live (which says what each column is), as the last ingest computed them into
-- `cell_cache` (migration 006, warehouse/materialise.py; docs/WAREHOUSE.md "Views at scale"),
-- plus the fingerprint of the cell's runs they were computed from.
-- Reading them takes milliseconds where computing them took seconds.  When the cache was not
-- filled from the runs the warehouse holds now by these views and macros (runs added or
-- removed by another client, a warehouse no matrun writer opened since it was upgraded),
-- reading this view fails and says what to run, rather than give numbers of other runs.
SELECT c.*
FROM cell_cache AS c
WHERE caches_current()
