"""``gpuobs report``: write the HTML reports from the command line (``drill``, ``rollout``).

The main CLI calls :func:`register` with its sub-parsers object, then ``args.func(args)`` and exits
with the returned code (:mod:`gpuobs.core.errors`). The written file's path is always the last line on stdout, so
``make drill-*`` / ``make rollout-*`` can print or open it (``... | tail -n 1``). Exit codes:

* 0: the report was written;
* 2: bad input: no saved result for the drill (run ``gpuobs drill <name>`` first), an unreadable or
  malformed result / rollout file, no Prometheus URL, a URL that is not http(s);
* 1: runtime failure: Prometheus unreachable or answering garbage, the output cannot be written.

Errors are one ``gpuobs report: error:`` line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpuobs.cli.common import fail  # noqa: E402
from gpuobs.core.errors import EXIT_FAILURE as EXIT_RUNTIME  # noqa: E402
from gpuobs.core.errors import EXIT_USAGE as EXIT_BAD_INPUT  # noqa: E402


def _fail(msg: str, code: int) -> int:
    return fail(msg, code)


def newest_result(run_dir: Path, drill: str) -> Path | None:
    """The newest ``<run_dir>/drills/<drill>-<epoch>.json`` (by the epoch in its name), or None."""
    best: tuple[int, Path] | None = None
    for path in (run_dir / "drills").glob(f"{drill}-*.json"):
        suffix = path.stem[len(drill) + 1:]
        if suffix.isdigit() and (best is None or int(suffix) > best[0]):
            best = (int(suffix), path)
    return best[1] if best else None


def _load_json(path: Path, what: str) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {what} {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {path} must hold a JSON object, got {type(doc).__name__}")
    return doc


def _prometheus_url(args: argparse.Namespace, run_dir: Path) -> str:
    if args.prometheus:
        return args.prometheus
    from gpuobs.stack import state as stack_state

    try:
        state = stack_state.load(run_dir)
    except stack_state.StateError as exc:
        raise ValueError(f"no Prometheus URL: {exc}; pass --prometheus URL") from None
    if state is None:  # compose mode (`make up`) records the stack in compose.json
        from gpuobs.stack.compose import ComposeError, load_stack_state

        try:
            state = load_stack_state(run_dir)
        except ComposeError as exc:
            raise ValueError(f"no Prometheus URL: {exc}; pass --prometheus URL") from None
    if state is None:
        raise ValueError(f"no Prometheus URL: {run_dir / 'stack.json'} is missing; pass --prometheus URL")
    return state.urls.prometheus


def cmd_report(args: argparse.Namespace) -> int:
    """Run ``gpuobs report drill|rollout``; returns the exit code."""
    from gpuobs.promapi.prometheus import PrometheusError

    try:
        if args.kind == "drill":
            from gpuobs.reports.drill import write_drill_report

            run_dir = Path(args.run_dir)
            path = Path(args.result) if args.result else newest_result(run_dir, args.drill)
            if path is None:
                return _fail(f"no saved result for drill {args.drill!r} in {run_dir / 'drills'}; run "
                             f"`gpuobs drill {args.drill} --run-dir {run_dir}` (or `make drill-{args.drill}`) first",
                             EXIT_BAD_INPUT)
            result = _load_json(path, "drill result")
            url = _prometheus_url(args, run_dir)
            out = Path(args.out) if args.out else run_dir / "reports"
            written = write_drill_report(result, url, out)
        else:
            from gpuobs.reports.rollout import write_rollout_report

            doc = _load_json(Path(args.file), "rollout file")
            if args.prometheus:
                doc["prometheus"] = args.prometheus
            if not doc.get("prometheus"):
                print("gpuobs: warning: no Prometheus URL in the document (or --prometheus): plots omitted",
                      file=sys.stderr)
            out = Path(args.out) if args.out else Path(args.run_dir) / "reports"
            written = write_rollout_report(doc, out, strict=True)
    except ValueError as exc:
        return _fail(str(exc), EXIT_BAD_INPUT)
    except PrometheusError as exc:
        return _fail(str(exc), EXIT_RUNTIME)
    except OSError as exc:
        return _fail(f"cannot write the report: {exc}", EXIT_RUNTIME)
    print(written)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``report drill`` and ``report rollout`` to the main CLI's sub-parsers."""
    from gpuobs.drills.catalogue import DRILLS

    run_dir = os.environ.get("GPUOBS_RUN_DIR", ".run")
    r = subparsers.add_parser("report", help="self-contained HTML reports (PNG plots from Prometheus)",
                              description="Write a self-contained HTML report; its path is the last line printed.")
    rsub = r.add_subparsers(dest="kind", required=True, metavar="KIND")
    d = rsub.add_parser("drill", help="a drill's fault metrics with the alert timeline marked",
                        epilog="example: gpuobs report drill xid --run-dir .run   (after `gpuobs drill xid`)")
    d.add_argument("drill", choices=list(DRILLS), help="drill name; its newest saved result is used")
    d.add_argument("--run-dir", default=run_dir, help="run directory holding drills/ and stack.json (default .run)")
    d.add_argument("--result", help="use this saved result file instead of the newest one")
    d.add_argument("--prometheus", help="Prometheus base URL (default: urls.prometheus of <run-dir>/stack.json)")
    d.add_argument("--out", help="output directory (default <run-dir>/reports)")
    d.set_defaults(func=cmd_report)
    o = rsub.add_parser("rollout", help="a rollout's canary vs baseline with its stages marked",
                        epilog="the file holds the rollout document described in gpuobs/reports/rollout.py")
    o.add_argument("--file", required=True, help="rollout JSON document (the controller's final report input)")
    o.add_argument("--prometheus", help="Prometheus base URL (overrides the document's \"prometheus\")")
    o.add_argument("--run-dir", default=run_dir, help="run directory (default .run); the report goes to its reports/")
    o.add_argument("--out", help="output directory (default <run-dir>/reports)")
    o.set_defaults(func=cmd_report)
