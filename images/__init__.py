"""Pinned environments, one folder per framework: requirements and (later) Dockerfiles.

Shipped as package data so an installed matrun can build environments without the
repository checked out.
"""
