"""``gpuobs pager``: the Alertmanager webhook receiver."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli.common import PORT, duration, env, fail, fleet_config, run_dir_default
from gpuobs.stack import alert_timing


def cmd_pager(args: argparse.Namespace) -> int:
    import sqlite3

    from gpuobs.core import activity, tokens
    from gpuobs.pager.server import serve

    if args.runbooks_dir and not Path(args.runbooks_dir).is_dir():
        return fail(f"--runbooks-dir {args.runbooks_dir} is not a directory")
    if not args.token_file and not args.no_auth:
        return fail("--token-file FILE is required (webhooks need Authorization: Bearer <token>); "
                    "--no-auth accepts unauthenticated webhooks")
    try:
        token = None if args.no_auth else tokens.load_or_create(Path(args.token_file))
    except tokens.TokenError as exc:
        return fail(f"--token-file: {exc}")
    if args.runbook_base and not args.runbook_base.startswith(("http://", "https://")):
        return fail(f"--runbook-base {args.runbook_base!r}: expected an http:// or https:// URL")
    if args.remediate_url and not args.remediate_url.startswith(("http://", "https://")):
        return fail(f"--remediate-url {args.remediate_url!r}: expected an http:// or https:// URL")
    if args.alertmanager_url and not args.alertmanager_url.startswith(("http://", "https://")):
        return fail(f"--alertmanager-url {args.alertmanager_url!r}: expected an http:// or https:// URL")
    if args.prometheus_url and not args.prometheus_url.startswith(("http://", "https://")):
        return fail(f"--prometheus-url {args.prometheus_url!r}: expected an http:// or https:// URL")
    fleet = fleet_config(args.fleet)  # FleetConfigError is an InputError: one line, exit 2
    identity_label = fleet.identity_label if args.fleet else None
    impact_config = None
    if args.prometheus_url:
        from gpuobs.pager.impact import load_config

        impact_config = load_config(fleet, args.slo_config)  # SloConfigError: an input error, one line
    escalation = None
    if args.escalation_config:
        from gpuobs.pager.escalation import EscalationConfigError, load
        try:
            escalation = load(Path(args.escalation_config))
        except EscalationConfigError as exc:
            return fail(f"--escalation-config: {exc}")
    try:
        serve(args.host, args.port, Path(args.db), Path(args.runbooks_dir) if args.runbooks_dir else None,
              token=token, runbook_base=args.runbook_base, dedupe_window_s=args.dedupe_window,
              alertmanager_url=args.alertmanager_url, escalation=escalation,
              activity_file=Path(args.activity_file) if args.activity_file
              else Path(args.db).parent / activity.FILE_NAME, identity_label=identity_label,
              reconcile_after_s=args.reconcile_after, remediate_url=args.remediate_url,
              prometheus_url=args.prometheus_url, impact_config=impact_config)
    except sqlite3.Error as exc:
        return fail(f"--db {args.db}: not a usable SQLite database ({exc})")
    except OSError as exc:
        return fail(f"pager cannot start on {args.host}:{args.port} with --db {args.db}: {exc}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``pager`` group to ``sub``."""
    g = sub.add_parser("pager", help="Alertmanager webhook receiver storing pages in SQLite",
                       description="The pager: Alertmanager's webhooks (POST /hook/page, /hook/ticket with the "
                                   "bearer token) stored in SQLite, the incident console at /, runbooks under "
                                   "/runbooks/ (docs/incidents.md).")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    g.add_argument("--port", type=PORT, default=9097, help="port to listen on (default %(default)s)")
    g.add_argument("--db", default=str(Path(run_dir_default()) / "pager.sqlite"),
                   help="SQLite database of notifications and incidents (default %(default)s)")
    g.add_argument("--runbooks-dir", default=None, help="serve runbooks/*.md from here under /runbooks/")
    g.add_argument("--token-file", default=None, metavar="FILE",
                   help="bearer token the webhooks require (created, mode 0600, if missing)")
    g.add_argument("--no-auth", action="store_true", help="accept webhooks without a token (not recommended)")
    g.add_argument("--runbook-base", default=None, metavar="URL",
                   help="link runbook_url annotations only under URL/runbooks/ (default: this pager)")
    g.add_argument("--dedupe-window", type=duration, default=3600.0, metavar="DURATION",
                   help="a repeat of a stored notification within this window is answered 200 and not stored "
                        "(default 1h; keep it below Alertmanager's repeat_interval)")
    g.add_argument("--alertmanager-url", default=None, metavar="URL",
                   help="Alertmanager whose API v2 the console's silences use (default: none, silences disabled)")
    g.add_argument("--remediate-url", default=None, metavar="URL",
                   help="remediation controller whose steps join the incidents' timelines and whose state the "
                        "console shows (default: none)")
    g.add_argument("--prometheus-url", default=None, metavar="URL",
                   help="Prometheus-API backend the pager measures each incident's impact from (requests failed, "
                        "goodput and GPU-hours lost; docs/incidents.md; default: none, no impact)")
    g.add_argument("--slo-config", default=None, metavar="FILE",
                   help="SLO definitions whose TTFT threshold the impact counts requests against (default: the "
                        "shipped prometheus/slo.yaml)")
    g.add_argument("--reconcile-after", type=duration, default=alert_timing.DEFAULT.resolve_timeout_s,
                   metavar="DURATION",
                   help="with --alertmanager-url: resolve an open or acknowledged incident once Alertmanager has "
                        "held none of its alerts for DURATION (default: the alert validity Prometheus gives a "
                        "send on the stack, 4 x its resend delay = %(default)gs)")
    g.add_argument("--fleet", default=env("FLEET_CONFIG"), metavar="FILE",
                   help="fleet config the rules were rendered from (format of prometheus/fleet.yaml; env "
                        "GPUOBS_FLEET_CONFIG): its identity label names an incident's nodes (default: the shipped one)")
    g.add_argument("--escalation-config", default=None, metavar="FILE",
                   help="YAML escalation policy: an unacknowledged page escalates after N minutes to a secondary "
                        "receiver (docs/incidents.md; default: none)")
    g.add_argument("--activity-file", default=None, metavar="FILE",
                   help="drills and rollouts recorded by `gpuobs drill` / `gpuobs rollout` (JSON lines) to link "
                        "incidents to (default: activity.jsonl beside --db, i.e. in the run directory)")
    g.set_defaults(func=cmd_pager)
