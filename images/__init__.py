"""One folder per framework: ``images/<name>/`` holds its Dockerfiles, the pinned
requirements of each variant and ``framework.toml``, everything the host knows about the
framework (read by ``matrun.frameworks``; format: docs/FRAMEWORKS.md).

Shipped as package data so an installed matrun can build environments without the
repository checked out.  No code: this package imports nothing.
"""
