"""Executors: where a cell's harness runs (TODO docstring)."""
