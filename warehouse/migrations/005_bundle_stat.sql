-- The bundle's stat fingerprint at ingest (size, mtime, inode and ctime of its four
-- files): an ingest recognises an unchanged bundle by it without reading the bundle again.
ALTER TABLE runs ADD COLUMN bundle_stat VARCHAR;
