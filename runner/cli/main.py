"""The ``matrun`` entry point: the app with the commands of every command module registered.

Importing a command module registers its commands on ``common.app`` (``common.command``);
the order of the imports below is the order ``matrun --help`` lists them in (the commands,
then the groups ``data``, ``engine``, ``slurm`` and ``warehouse``).
"""

from __future__ import annotations

# isort: off
from matrun.runner.cli import runs  # noqa: F401  plan, sweep, status, cancel
from matrun.runner.cli import doctor  # noqa: F401  doctor
from matrun.runner.cli import studies  # noqa: F401  studies
from matrun.runner.cli import results  # noqa: F401  ingest, query, report
from matrun.runner.cli import shell  # noqa: F401  shell
from matrun.runner.cli import export  # noqa: F401  export
from matrun.runner.cli import data  # noqa: F401  the data group
from matrun.runner.cli import environments  # noqa: F401  envs, build, images; the engine group
from matrun.runner.cli import analysis  # noqa: F401  compare, advise
from matrun.runner.cli import bisect  # noqa: F401  bisect
from matrun.runner.cli import tune  # noqa: F401  tune
from matrun.runner.cli import slurm  # noqa: F401  the slurm group
from matrun.runner.cli import warehouse  # noqa: F401  the warehouse group
# isort: on
from matrun.runner.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    """Run the ``matrun`` command line (the ``matrun`` script of pyproject.toml)."""
    app()


if __name__ == "__main__":
    main()
