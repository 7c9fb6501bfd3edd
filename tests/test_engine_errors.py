"""An engine that is slow or fails a request mid-command: an ``Error:`` line and exit 1 from
every command (runner/cli/common.py ``_print_errors``), never a traceback; and a build whose
last housekeeping, removing the build stage's image, outlasts the SDK's read timeout
(a CUDA image's ~6 GB stage took longer than 10 s here) still succeeds and says so."""

from __future__ import annotations

import docker
import pytest
import requests
import typer
from typer.testing import CliRunner

from matrun.runner.cli.common import _print_errors
from matrun.runner.environments.builds import BuildEvent, remove_build_stages


def cli(raising: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @_print_errors
    def run() -> None:
        raise raising

    return app


@pytest.mark.parametrize(("exc", "kind"), [
    (requests.exceptions.ReadTimeout("UnixHTTPConnectionPool(host='localhost', port=None): Read timed out. "
                                     "(read timeout=10)"), "ReadTimeout"),
    (requests.exceptions.ConnectionError("('Connection aborted.', ConnectionResetError(104, 'reset'))"),
     "ConnectionError"),
    (docker.errors.APIError("500 Server Error: Internal Server Error (\"conflict: unable to delete\")"), "APIError"),
])
def test_an_engine_failure_is_an_error_line_and_exit_1(exc, kind):
    result = CliRunner().invoke(cli(exc), [])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: the Docker engine failed a request ({kind}): ")
    assert "Traceback" not in result.output and "\n" == result.output[-1] and result.output.count("\n") == 1


def test_anything_else_is_not_dressed_up_as_an_engine_failure():
    result = CliRunner().invoke(cli(ZeroDivisionError("a bug")), [])
    assert isinstance(result.exception, ZeroDivisionError)


class Images:
    def __init__(self, exc: BaseException | None) -> None:
        self.exc, self.calls = exc, []

    def prune(self, filters):
        self.calls.append(filters)
        if self.exc is not None:
            raise self.exc


class Client:
    def __init__(self, exc: BaseException | None = None) -> None:
        self.images = Images(exc)


def test_a_build_stage_removal_that_outlasts_the_read_timeout_is_left_to_the_engine():
    client, said = Client(requests.exceptions.ReadTimeout("Read timed out. (read timeout=10)")), []
    remove_build_stages(client, said.append, ("torch", "cuda-pypi"))
    assert client.images.calls == [{"dangling": True, "label": "org.matrun.stage=build"}]
    assert said == [BuildEvent("torch", "cuda-pypi", "cleanup", "the engine is still removing the build stage's "
                                                                "image (over 10 s): it finishes on its own")]


def test_a_build_stage_removal_that_fails_otherwise_is_not_hidden():
    with pytest.raises(docker.errors.APIError):
        remove_build_stages(Client(docker.errors.APIError("boom")), [].append)
    said: list = []
    remove_build_stages(Client(), said.append)
    assert said == []
