"""``gpuobs incident``: the on-call's commands against the pager's incident console.

``list``, ``show ID``, ``ack ID``, ``silence ID --duration 2h --comment ...``, ``unsilence ID SILENCE``
(expire) go through the pager's JSON API (so the action lands on the incident's timeline);
``silences`` lists Alertmanager's silences (API v2) directly; ``postmortem ID`` writes a draft
(:mod:`gpuobs.pager.postmortem`). URLs: ``--pager-url`` /
``--alertmanager-url``, else ``$GPUOBS_PAGER_URL`` / ``$GPUOBS_ALERTMANAGER_URL``, else the stack in
``--run-dir``, else the default ports (9097, 9093).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
from pathlib import Path
from typing import Any

from gpuobs.cli.common import duration, env, fail, http_url, int_range, run_dir_default
from gpuobs.core.errors import EXIT_FAILURE
from gpuobs.core.reach import unreachable


def _urls(args: argparse.Namespace) -> tuple[str, str]:
    """The pager's and Alertmanager's base URLs: the flags, their GPUOBS_* variables, the stack in
    --run-dir, the default ports. Raises InputError (one line, exit 2) naming a bad flag or variable."""
    pager, am = args.pager_url or env("PAGER_URL"), args.alertmanager_url or env("ALERTMANAGER_URL")
    if pager:
        http_url("--pager-url", pager, "PAGER_URL")
    if am:
        http_url("--alertmanager-url", am, "ALERTMANAGER_URL")
    if not (pager and am):
        try:
            from gpuobs.stack.supervisor import load_state

            state = load_state(Path(args.run_dir))
        except Exception:  # noqa: BLE001 (no or damaged state: fall back to the default ports)
            state = None
        if state is not None:
            pager, am = pager or state.urls.pager, am or state.urls.alertmanager
    return (pager or "http://127.0.0.1:9097").rstrip("/"), (am or "http://127.0.0.1:9093").rstrip("/")


def _call(method: str, url: str, body: dict | None = None) -> tuple[int, Any]:
    """``(status, JSON)``; raises OSError-like requests errors to the caller as (0, message)."""
    import requests

    try:
        resp = requests.request(method, url, json=body, timeout=15)
    except (requests.ConnectionError, requests.Timeout) as exc:
        return 0, {"error": unreachable("Alertmanager" if "/api/v2/" in url else "pager", url, exc)}
    except requests.RequestException as exc:
        return 0, {"error": f"{method} {url}: {exc}"}
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, {"error": f"{method} {url}: HTTP {resp.status_code}, not JSON"}


def _err(status: int, doc: Any) -> int:
    msg = doc.get("error", doc) if isinstance(doc, dict) else doc
    if status in (400, 404):
        return fail(msg)
    return fail(f"{msg}" + (f" (HTTP {status})" if status else ""), EXIT_FAILURE)


def _utc(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if ts else "-"


def _line(i: dict) -> str:
    return (f"#{i['id']:<5} {i['state']:<12} {i['channel']:<6} {i['severity'] or '-':<8} "
            f"{','.join(i['alertnames']):<22} node={','.join(i['nodes']) or '-'} gpu={','.join(i['gpus']) or '-'}"
            f" xid={','.join(i['xids']) or '-'}  {' / '.join((i['descriptions'] or [''])[0].splitlines())}")


def cmd_list(args: argparse.Namespace) -> int:
    pager, _ = _urls(args)
    q = "&".join(f"{k}={v}" for k, v in (("state", args.state), ("channel", args.channel)) if v)
    status, doc = _call("GET", f"{pager}/api/incidents" + (f"?{q}" if q else ""))
    if status != 200:
        return _err(status, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{doc['open']} open ({doc['counts']['page']['open']} pages, {doc['counts']['ticket']['open']} tickets)")
    for i in doc["incidents"]:
        print(_line(i))
        if impact_line(i):
            print(f"       impact: {impact_line(i)}")
    return 0


def impact_line(inc: dict) -> str:
    """The incident's impact line (:mod:`gpuobs.pager.impact`), its error, or '' before any measurement."""
    imp = inc.get("impact") or {}
    if "line" in imp:
        return imp["line"] + (f" (last measurement failed: {imp['error']})" if imp.get("error") else "")
    return f"not measured: {imp['error']}" if imp.get("error") else ""


def cmd_show(args: argparse.Namespace) -> int:
    pager, _ = _urls(args)
    status, doc = _call("GET", f"{pager}/api/incidents/{args.id}")
    if status != 200:
        return _err(status, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(_line(doc))
    print(f"  opened {_utc(doc['opened_at'])}  acknowledged {_utc(doc['acknowledged_at'])}"
          f"{' by ' + doc['acknowledged_by'] if doc['acknowledged_by'] else ''}  resolved {_utc(doc['resolved_at'])}")
    if doc["runbook_url"]:
        print(f"  runbook {doc['runbook_url']}")
    if impact_line(doc):
        print(f"  impact {impact_line(doc)}")
    for s in doc["silences"]:
        print(f"  silence {s['id']} until {s['endsAt']} by {s['createdBy']}: {s['comment']}"
              f"{' (expired)' if s['expired_at'] else ''}")
    for ev in doc["timeline"]:
        rest = {k: v for k, v in ev.items() if k not in ("at", "kind")}
        print(f"  {_utc(ev['at'])} {ev['kind']:<16} {json.dumps(rest, sort_keys=True) if rest else ''}")
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    pager, _ = _urls(args)
    status, doc = _call("POST", f"{pager}/api/incidents/{args.id}/ack", {"by": args.author, "note": args.note or ""})
    if status != 200:
        return _err(status, doc)
    print(f"incident #{args.id}: {doc['state']}" + ("" if doc["changed"] else f" ({doc['message']})"))
    return 0


def cmd_silence(args: argparse.Namespace) -> int:
    pager, _ = _urls(args)
    status, doc = _call("POST", f"{pager}/api/incidents/{args.id}/silence",
                        {"duration": f"{args.duration:g}s", "comment": args.comment, "author": args.author})
    if status != 201:
        return _err(status, doc)
    matchers = ",".join(f"{m['name']}={m['value']}" for m in doc["matchers"])
    print(f"incident #{args.id}: silence {doc['silence']} until {doc['endsAt']} ({matchers})")
    return 0


def cmd_unsilence(args: argparse.Namespace) -> int:
    pager, _ = _urls(args)
    status, doc = _call("POST", f"{pager}/api/incidents/{args.id}/silences/{args.silence}/expire", {"by": args.author})
    if status != 200:
        return _err(status, doc)
    print(f"incident #{args.id}: silence {args.silence} expired")
    return 0


def cmd_silences(args: argparse.Namespace) -> int:
    from gpuobs.promapi.silences import AlertmanagerClient

    _, am = _urls(args)
    sils = AlertmanagerClient(am).list()  # SilenceApiError -> exit 1 via gpuobs.cli.run
    if not args.all:
        sils = [s for s in sils if s.get("status", {}).get("state") != "expired"]
    if args.json:
        print(json.dumps(sils, indent=2))
        return 0
    for s in sorted(sils, key=lambda s: s.get("endsAt", "")):
        m = ",".join(f"{x['name']}{'=~' if x.get('isRegex') else '='}{x['value']}" for x in s.get("matchers", []))
        print(f"{s.get('id')} {s.get('status', {}).get('state', '?'):<8} until {s.get('endsAt')} "
              f"by {s.get('createdBy')}: {s.get('comment')}  [{m}]")
    if not sils:
        print("no silences" if args.all else "no active or pending silences")
    return 0


def cmd_postmortem(args: argparse.Namespace) -> int:
    import time

    from gpuobs.pager import postmortem

    pager, _ = _urls(args)
    status, doc = _call("GET", f"{pager}/api/incidents/{args.id}")
    if status != 200:
        return _err(status, doc)
    prom = args.prometheus or str(env("PROMETHEUS_URL") or "")
    if not prom:
        try:
            from gpuobs.stack.supervisor import load_state

            state = load_state(Path(args.run_dir))
            prom = state.urls.prometheus if state else None
        except Exception:  # noqa: BLE001 (no stack: the default port)
            prom = None
    prom = prom or "http://127.0.0.1:9090"
    out = Path(args.out) if args.out else Path(args.run_dir) / "postmortems"
    md, html_path, note = postmortem.write(doc, out, prom, time.time())  # PostmortemError -> exit 1
    print(f"wrote {md}\nwrote {html_path}")
    if note:
        print(f"note: {note}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``incident`` group to ``sub``."""
    g = sub.add_parser("incident", help="incidents in the pager's console: list, show, ack, silence")
    gs = g.add_subparsers(dest="incident_cmd", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--pager-url", default=None, metavar="URL",
                        help="pager (env GPUOBS_PAGER_URL; default: the stack in --run-dir, else http://127.0.0.1:9097)")
    common.add_argument("--alertmanager-url", default=None, metavar="URL",
                        help="Alertmanager (env GPUOBS_ALERTMANAGER_URL; default: the stack, else :9093)")
    common.add_argument("--run-dir", default=run_dir_default(),
                        help="run directory of the stack whose pager and Alertmanager to use (env GPUOBS_RUN_DIR; "
                             "default %(default)s)")
    who = argparse.ArgumentParser(add_help=False)
    who.add_argument("--author", default=getpass.getuser() if _has_user() else "cli",
                     help="who acts, recorded on the timeline and the silence (default: your user name)")
    ID = int_range(1, 10**12)
    p = gs.add_parser("list", parents=[common], help="incidents, open first")
    p.add_argument("--state", choices=("open", "acknowledged", "resolved"), help="only incidents in this state")
    p.add_argument("--channel", choices=("page", "ticket"), help="only incidents of this channel")
    p.add_argument("--json", action="store_true", help="print the pager's JSON instead of a table")
    p.set_defaults(func=cmd_list)
    p = gs.add_parser("show", parents=[common], help="one incident with its timeline and silences")
    p.add_argument("id", type=ID, help="incident id (from `incident list`)")
    p.add_argument("--json", action="store_true", help="print the pager's JSON instead of the timeline")
    p.set_defaults(func=cmd_show)
    p = gs.add_parser("ack", parents=[common, who], help="acknowledge an open incident")
    p.add_argument("id", type=ID, help="incident id (from `incident list`)")
    p.add_argument("--note", default=None, help="what you are doing about it (on the incident's timeline)")
    p.set_defaults(func=cmd_ack)
    p = gs.add_parser("silence", parents=[common, who],
                      help="silence the incident's alerts in Alertmanager (matchers: its common labels)")
    p.add_argument("id", type=ID, help="incident id (from `incident list`)")
    p.add_argument("--duration", type=duration, default=7200.0, help="how long (default 2h; at most 7d)")
    p.add_argument("--comment", required=True, help="why, for the next on-call")
    p.set_defaults(func=cmd_silence)
    p = gs.add_parser("unsilence", parents=[common, who], help="expire one of the incident's silences")
    p.add_argument("id", type=ID, help="incident id (from `incident list`)")
    p.add_argument("silence", help="silence id (from `incident show`)")
    p.set_defaults(func=cmd_unsilence)
    p = gs.add_parser("postmortem", parents=[common],
                      help="write a blameless postmortem draft (Markdown + HTML) from the incident's timeline and "
                           "Prometheus data, following runbooks/postmortem-template.md")
    p.add_argument("id", type=ID, help="incident id (from `incident list`)")
    p.add_argument("--prometheus", default=None, metavar="URL",
                   help="Prometheus (env GPUOBS_PROMETHEUS_URL; default: the stack, else http://127.0.0.1:9090)")
    p.add_argument("--out", default=None, help="output directory (default <run-dir>/postmortems)")
    p.set_defaults(func=cmd_postmortem)
    p = gs.add_parser("silences", parents=[common], help="Alertmanager's silences (active and pending)")
    p.add_argument("--all", action="store_true", help="include expired ones")
    p.add_argument("--json", action="store_true", help="print Alertmanager's JSON instead of a table")
    p.set_defaults(func=cmd_silences)


def _has_user() -> bool:
    try:
        getpass.getuser()
        return True
    except Exception:  # noqa: BLE001 (no USER and no passwd entry)
        return False
