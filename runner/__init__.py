"""Host side of matrun: CLI, matrix planning, environments, executors, monitor.

The subpackage ``harness`` runs inside the cell and must import nothing from here.
"""
