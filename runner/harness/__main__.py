"""``python -m matrun.runner.harness --spec DIR/spec.json --out DIR``: run one cell.

Exit codes: 0 the run finished (a diverged run included: the host decides the status);
2 the spec is bad, unknown or asks for what this harness cannot do (message on stderr,
nothing written); 1 any other failure (traceback and an ``Error:`` line on stderr; the
events written so far stay in ``events.jsonl``); 143 killed by SIGTERM (the buffered
steps are written first).  With ``--launch PLAN`` this process is the launcher of a
multi-worker cell (``launch.py``): its exit code is the failing worker's, else 0.  With
``--lease-fd FD`` (both executors pass stdin) the cell stops itself once FD reaches
end-of-file, i.e. once the sweep that started it is gone (``lease.py``; exit 137 where its
own SIGKILL does not reach it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from . import lease
from .cell import run_cell
from .errors import SpecError
from .launch import LaunchError, run


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(
        prog="python -m matrun.runner.harness",
        description="Run one matrun cell inside a framework environment and write events.jsonl.")
    parser.add_argument("--spec", required=True, type=Path, help="the cell's spec.json (docs/BUNDLE.md)")
    parser.add_argument("--out", required=True, type=Path, help="directory to write events.jsonl into")
    parser.add_argument("--onednn-probe", action="store_true",
                        help="this is the short verbose run of another run's oneDNN check (no check of its own)")
    parser.add_argument("--launch", type=Path, metavar="PLAN",
                        help="start the processes of a multi-worker cell as the host's plan "
                             "(workers.json) says, and wait for them (launch.py)")
    parser.add_argument("--lease-fd", type=int, metavar="FD",
                        help="a file descriptor the host holds the other end of: at its end-of-file (the "
                             "host died) the cell stops itself (lease.py)")
    args = parser.parse_args(argv)
    # A TERM (the host's timeout) unwinds normally, so the buffered steps reach the file.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.launch is not None:
        try:
            return run(args.launch, args.spec, lease_fd=args.lease_fd)
        except LaunchError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # e.g. a worker that could not be started
            traceback.print_exc()
            print(f"Error: the launcher failed: {exc}", file=sys.stderr)
            return 1
    if args.lease_fd is not None:
        lease.watch(args.lease_fd)
    try:
        summary = run_cell(spec_path=args.spec, out_dir=args.out, started=started,
                           onednn_probe=args.onednn_probe)
    except SpecError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # recorded by the host as a failed run, never a crash of the host
        traceback.print_exc()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    accuracy = summary["accuracy"]
    if summary.get("rank"):  # a worker of a multi-worker cell: rank 0 evaluates and reports
        print(f"done: worker {summary['rank']}, train {summary['train_seconds']:.2f} s, "
              f"own throughput {summary['throughput'] or 0:.1f} images/s")
    elif summary["train_seconds"] is None:  # inference
        print(f"done: inference {summary['inference_seconds'] or 0:.2f} s, "
              f"throughput {summary['throughput'] or 0:.1f} images/s")
    else:
        print(f"done: train {summary['train_seconds']:.2f} s, throughput {summary['throughput'] or 0:.1f} images/s, "
              f"accuracy {'diverged' if accuracy is None else f'{accuracy:.4f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
