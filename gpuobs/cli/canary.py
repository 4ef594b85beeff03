"""``gpuobs canary``: the canary analyzer's command line (``analyze``, ``serve``).

The main CLI calls :func:`register` with its sub-parsers object, then ``args.func(args)`` and exits
with the returned code, or the exit code of the error it raises (:func:`gpuobs.cli.dispatch`; gpuobs/core/errors.py):

* 0 PROMOTE, 1 ROLLBACK, 3 HOLD: a verdict, printed as a table or, with ``--json``, one JSON object;
* 2 usage or input error: a bad flag, selector, duration or config file, or a query the backend
  rejects (HTTP 400/422: the config's PromQL is wrong): one ``error:`` line on stderr, no verdict;
* 4 could not judge, backend error: Prometheus unreachable, answering 5xx after the retries,
  refusing the credentials or answering garbage. ``analyze`` raises
  :class:`~gpuobs.core.errors.BackendError` (exit code :data:`~gpuobs.core.errors.EXIT_BACKEND`) and
  the main CLI's error mapping (:func:`gpuobs.cli.dispatch`) prints its one ``error:`` line on stderr
  and returns 4 (with ``--json``, ``{"verdict": null, "error": ..., "exit_code": 4}`` is printed on
  stdout first); never a verdict, and never the ROLLBACK code;
* 1 also when the ``--state`` file cannot be written (the verdict is then not printed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gpuobs.canary.analyzer import AnalysisState, Analyzer
from gpuobs.canary.config import (
    CanaryConfig,
    ConfigError,
    load_config,
    parse_duration,
    parse_time,
)
from gpuobs.cli.common import env as _env
from gpuobs.cli.common import fail as _common_fail
from gpuobs.cli.common import fleet_config, named
from gpuobs.core.errors import EXIT_FAILURE as EXIT_RUNTIME  # noqa: E402
from gpuobs.core.errors import EXIT_USAGE as EXIT_BAD_INPUT  # noqa: E402
from gpuobs.core.errors import BackendError, InputError
from gpuobs.core.files import atomic_write
from gpuobs.promapi.prometheus import PromClient, PrometheusError, PrometheusQueryError

ANALYZE_EPILOG = """examples:
  gpuobs canary analyze --prometheus http://127.0.0.1:9090 --canary 'track="canary"' \\
      --baseline 'track="baseline"' --window 5m
  gpuobs canary analyze --canary 'track="canary"' --baseline 'track="baseline"' \\
      --start 2025-06-01T12:00:00Z --state .run/canary-stage2.json --json
  gpuobs canary analyze ... --header 'X-Scope-OrgID: team-a' --bearer-token-file /run/secrets/prom
exit codes: 0 PROMOTE, 1 ROLLBACK, 3 HOLD, 2 bad input or rejected query,
            4 could not judge: backend error (Prometheus unreachable, 5xx, refused credentials;
            an error line, never a verdict)"""

SERVE_EPILOG = """endpoints:
  GET  /api/v1/analysis?canary=SEL&baseline=SEL&run=ID[&step=STEP]  verdict JSON (Argo web metric):
       PROMOTE | ROLLBACK | HOLD | INCONCLUSIVE; decisions are sticky per run (run + step + selectors)
  GET  /api/v1/query?query=gpuobs_canary_ok{namespace=..,name=..,canary=..,baseline=..}  Flagger MetricTemplate
  POST /flagger/rollback                   200 only on ROLLBACK
  POST /flagger/confirm-promotion          200 only on PROMOTE
  POST /flagger/confirm-traffic-increase   200 for the first step, then only with data on every critical metric
  POST /flagger/rollout                    409 on ROLLBACK or INCONCLUSIVE (bounds WaitingPromotion)
  GET  /healthz                          (the only route without the bearer token)
every analysis route needs 'Authorization: Bearer <token>' (--token-file; Argo: web provider
headers; Flagger, which cannot set headers: metadata.token); a start/window longer than 2 horizons
is refused (400)
configuration for Argo Rollouts and Flagger: docs/canary.md"""



def add_client_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``analyze`` and ``serve``: backend URL, auth, timeouts, config."""
    p.add_argument("--prometheus", default=_env("PROMETHEUS_URL", "http://127.0.0.1:9090"), metavar="URL",
                   help="Prometheus-API base URL: Prometheus, Thanos Query, Mimir (.../prometheus), VictoriaMetrics "
                        "(env GPUOBS_PROMETHEUS_URL; default http://127.0.0.1:9090)")
    p.add_argument("--bearer-token-file", default=_env("PROMETHEUS_TOKEN_FILE"), metavar="FILE",
                   help="send 'Authorization: Bearer <file content>' (env GPUOBS_PROMETHEUS_TOKEN_FILE)")
    p.add_argument("--basic-auth-user", default=_env("PROMETHEUS_USER"), metavar="USER",
                   help="basic auth user (env GPUOBS_PROMETHEUS_USER); password from --basic-auth-password-file")
    p.add_argument("--basic-auth-password-file", default=_env("PROMETHEUS_PASSWORD_FILE"), metavar="FILE",
                   help="basic auth password file (env GPUOBS_PROMETHEUS_PASSWORD_FILE)")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra request header, repeatable (e.g. 'X-Scope-OrgID: tenant-1' for Mimir)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per-request timeout, s (default 10)")
    p.add_argument("--retries", type=int, default=3, metavar="N",
                   help="retries on connection errors and 5xx, exponential backoff (default 3)")
    p.add_argument("--config", default=_env("CANARY_CONFIG"), metavar="FILE",
                   help="metrics YAML (env GPUOBS_CANARY_CONFIG; default: the packaged metrics.yaml)")
    p.add_argument("--fleet", default=_env("FLEET_CONFIG"), metavar="FILE",
                   help="take the config's $vllm and $dcgm target selectors from this fleet config, the one the rules "
                        "were rendered from (format of prometheus/fleet.yaml; a selector it leaves out is its "
                        "default, as for the rules; env GPUOBS_FLEET_CONFIG; default: the config's own selectors)")
    p.add_argument("--metric", action="append", metavar="NAME", help="analyse only these metrics (repeatable)")
    p.add_argument("--horizon", metavar="DURATION", help="override the config's horizon (stage length), e.g. 10m")
    p.add_argument("--interval", metavar="DURATION", help="override the config's look interval, e.g. 30s")
    p.add_argument("--warmup", metavar="DURATION",
                   help="override the config's warm-up: data of the first DURATION after the start is excluded "
                        "(e.g. 60s for JIT/CUDA-graph capture and cache warm-up; 0 to use everything)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``canary`` (with ``analyze`` and ``serve``) to ``subparsers``.

    Each leaf sets ``func``: ``func(args: argparse.Namespace) -> int`` (exit codes in the module doc).
    """
    canary = subparsers.add_parser(
        "canary", help="statistical canary analysis over the Prometheus HTTP API",
        description="Compare a canary with its baseline (TTFT, ITL, errors, E2E, KV cache, energy per token, "
                    "SM active) with sequential tests that keep the false-rollback rate at alpha however often "
                    "the canary is checked. Method: docs/canary.md.")
    sub = canary.add_subparsers(dest="canary_command", metavar="{analyze,serve}", required=True)
    a = sub.add_parser("analyze", help="one verdict: PROMOTE / HOLD / ROLLBACK with a per-metric table",
                       epilog=ANALYZE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--canary", required=True, metavar="SELECTOR", help='canary label matchers, e.g. track="canary"')
    a.add_argument("--baseline", required=True, metavar="SELECTOR", help='baseline label matchers, e.g. track="baseline"')
    when = a.add_mutually_exclusive_group()
    when.add_argument("--window", metavar="DURATION", help="analyse the last DURATION (default 5m)")
    when.add_argument("--start", metavar="TIME", help="analyse since TIME (unix seconds or RFC 3339): the canary's start")
    a.add_argument("--end", metavar="TIME", help="end of the window (unix seconds or RFC 3339; default now)")
    a.add_argument("--state", metavar="FILE",
                   help="JSON file of earlier looks of this stage (read if present, updated after the look)")
    a.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    add_client_flags(a)
    a.set_defaults(func=run_analyze)

    s = sub.add_parser("serve", help="HTTP verdict endpoint for Argo Rollouts (web metric) and Flagger (webhooks)",
                       epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--host", default=_env("CANARY_HOST", "127.0.0.1"), help="bind address (env GPUOBS_CANARY_HOST; "
                   "default 127.0.0.1)")
    s.add_argument("--port", type=int, default=_env("CANARY_PORT", "9098"),
                   help="port (env GPUOBS_CANARY_PORT; default 9098)")
    s.add_argument("--canary", metavar="SELECTOR", help="default canary matchers when a request names none")
    s.add_argument("--baseline", metavar="SELECTOR", help="default baseline matchers when a request names none")
    s.add_argument("--state-dir", default=_env("CANARY_STATE_DIR"), metavar="DIR",
                   help="keep analysis runs in DIR/canary-runs.sqlite so they survive a restart (env "
                        "GPUOBS_CANARY_STATE_DIR; default: memory only, unsafe for controllers)")
    s.add_argument("--look-deadline", default=_env("CANARY_LOOK_DEADLINE", "15s"), metavar="DURATION",
                   help="answer 504 when a look takes longer (keep it below the controller's timeout; "
                        "env GPUOBS_CANARY_LOOK_DEADLINE; default 15s)")
    s.add_argument("--token-file", metavar="FILE", default=str(Path(_env("RUN_DIR", ".run") or ".run") / "canary-token"),
                   help="bearer token the analysis routes require (created, mode 0600, if missing; "
                        "default $GPUOBS_RUN_DIR/canary-token)")
    s.add_argument("--no-auth", action="store_true", help="serve verdicts without a token (not recommended)")
    add_client_flags(s)
    s.set_defaults(func=run_serve)


def build_client(args: argparse.Namespace) -> PromClient:
    """A :class:`PromClient` from the shared flags. Raises ConfigError on bad values."""
    token = auth = None
    if args.bearer_token_file:
        token = _read_secret(args.bearer_token_file, "--bearer-token-file")
    if args.basic_auth_user:
        if not args.basic_auth_password_file:
            raise ConfigError("--basic-auth-password-file", None, "a password file with --basic-auth-user")
        auth = (args.basic_auth_user, _read_secret(args.basic_auth_password_file, "--basic-auth-password-file"))
    headers = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip() or any(c in name for c in " \t\r\n") or "\n" in value:
            raise ConfigError("--header", h, "'Name: value', e.g. 'X-Scope-OrgID: tenant-1'")
        headers[name.strip()] = value.strip()
    if args.timeout <= 0 or args.retries < 0:
        raise ConfigError("--timeout/--retries", (args.timeout, args.retries), "timeout > 0 and retries >= 0")
    try:
        return PromClient(args.prometheus, timeout=args.timeout, retries=args.retries, bearer_token=token,
                          basic_auth=auth, headers=headers)
    except ValueError as exc:
        raise ConfigError(named("--prometheus", args.prometheus, "PROMETHEUS_URL"), args.prometheus, str(exc)) from None


def build_config(args: argparse.Namespace) -> CanaryConfig:
    """The metrics config with ``--fleet``, ``--metric``, ``--horizon`` and ``--interval`` applied."""
    selectors = None
    if getattr(args, "fleet", None):
        fleet = fleet_config(args.fleet)  # FleetConfigError: an input error naming --fleet, exit 2
        selectors = {"vllm": fleet.vllm_selector, "dcgm": fleet.dcgm_selector}
    cfg = load_config(args.config, selectors)
    if args.metric:
        cfg = cfg.select(args.metric)
    warmup = None
    if getattr(args, "warmup", None) is not None:
        warmup = parse_duration(args.warmup, "--warmup", allow_zero=True)
    return cfg.with_timing(parse_duration(args.horizon, "--horizon") if args.horizon else None,
                           parse_duration(args.interval, "--interval") if args.interval else None, warmup)


def _read_secret(path: str, field: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(field, path, f"a readable file ({exc.strerror})") from None


def _fail(msg: str, code: int, as_json: bool) -> int:
    _common_fail(msg, code)
    if as_json:
        _print_error_doc(msg, code)
    return code


def _print_error_doc(msg: str, code: int) -> None:
    """The ``--json`` answer of a look that reached no verdict, on stdout."""
    print(json.dumps({"verdict": None, "error": msg, "exit_code": code}))


def run_analyze(args: argparse.Namespace) -> int:
    """Handler of ``canary analyze``: prints the verdict; returns 0/1/3, 2 on bad input, 1 when the state
    file cannot be written. Raises :class:`~gpuobs.core.errors.BackendError` when the backend fails (no
    verdict; the CLI's mapping exits 4), after printing its ``--json`` document."""
    try:
        client, cfg = build_client(args), build_config(args)
        end = parse_time(args.end, "--end") if args.end else time.time()
        start = parse_time(args.start, "--start") if args.start else end - parse_duration(args.window or "5m", "--window")
        if start >= end:
            raise ConfigError("--start/--end", (args.start, args.end), "a start before the end")
        analyzer = Analyzer(client, cfg, args.canary, args.baseline)
        state = None
        if args.state:
            path = Path(args.state)
            try:
                state = AnalysisState.from_dict(json.loads(path.read_text())) if path.exists() else AnalysisState()
            except (OSError, ValueError) as exc:
                raise ConfigError("--state", args.state, f"a JSON state file written by this command ({exc})") from None
        verdict = analyzer.analyze(start, end, state)
    except InputError as exc:  # ConfigError, FleetConfigError
        return _fail(str(exc), EXIT_BAD_INPUT, args.json)
    except PrometheusQueryError as exc:
        return _fail(f"the backend rejected a query (check the metrics config): {exc}", EXIT_BAD_INPUT, args.json)
    except PrometheusError as exc:
        err = BackendError(f"could not judge: backend error: {exc}")
        if args.json:
            _print_error_doc(str(err), err.exit_code)
        raise err from exc
    except ValueError as exc:  # a look earlier than the state's last one
        return _fail(str(exc), EXIT_BAD_INPUT, args.json)
    if state is not None:
        try:
            atomic_write(Path(args.state), json.dumps(state.to_dict()))  # never half-written
        except OSError as exc:
            return _fail(f"cannot write --state {args.state}: {exc.strerror}", EXIT_RUNTIME, args.json)
    print(json.dumps(verdict.to_dict()) if args.json else verdict.table())
    return verdict.exit_code


def run_serve(args: argparse.Namespace) -> int:
    """Handler of ``canary serve``: runs the HTTP endpoint until interrupted; 2 on bad input."""
    import sqlite3

    from gpuobs.canary.serve import serve

    try:
        client, cfg = build_client(args), build_config(args)
        deadline = parse_duration(args.look_deadline, named("--look-deadline", args.look_deadline, "CANARY_LOOK_DEADLINE"))
    except InputError as exc:  # ConfigError, FleetConfigError
        return _fail(str(exc), EXIT_BAD_INPUT, False)
    from gpuobs.core import tokens

    try:
        token = None if args.no_auth else tokens.load_or_create(Path(args.token_file))
    except tokens.TokenError as exc:
        return _fail(f"--token-file: {exc}", EXIT_BAD_INPUT, False)
    try:
        serve(args.host, args.port, client, cfg, args.canary, args.baseline, args.state_dir, deadline, token=token)
    except sqlite3.Error as exc:
        return _fail(f"--state-dir {args.state_dir}: cannot open the run database: {exc}", EXIT_RUNTIME, False)
    except OSError as exc:
        return _fail(f"cannot listen on {args.host}:{args.port} or create --state-dir: {exc}", EXIT_RUNTIME, False)
    return 0
