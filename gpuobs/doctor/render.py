"""``gpuobs doctor``'s output: a text report for people, one JSON object for machines."""

from __future__ import annotations

import json

from gpuobs.doctor.verdict import Report

_MARK = {"live": "live", "degraded": "DEGRADED", "blind": "BLIND", "skipped": "skipped"}


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def text(report: Report, fixes: bool = True) -> str:
    """The human report: header, one block per family (status, why, fix), findings, CSV lines, summary."""
    r = report
    out = [f"gpuobs doctor: {r.prometheus}  (identity label: {r.identity_label})",
           f"  DCGM targets {{{r.selectors['dcgm']}}}: {r.targets['dcgm']['matched']} matched, "
           f"{r.targets['dcgm']['up']} up;  vLLM targets {{{r.selectors['vllm']}}}: {r.targets['vllm']['matched']} "
           f"matched, {r.targets['vllm']['up']} up", ""]
    width = max(len(f.name) for f in r.families)
    out.append(f"{'FAMILY':<{width}}  {'PAGES':<5}  STATUS    ALERTS")
    for f in r.families:
        out.append(f"{f.name:<{width}}  {'yes' if f.paging else 'no':<5}  {_MARK[f.status]:<8}  {', '.join(f.alerts)}")
    for f in r.families:
        if f.status in ("live", "skipped") and not f.why:
            continue
        out += ["", f"== {f.name}: {_MARK[f.status]}" + (" (pages)" if f.paging else "")]
        out += [f"  why: {w}" for w in f.why]
        if f.note and f.status != "live":
            out.append(f"  note: {f.note}")
        if fixes:
            for fix in f.fixes:
                out.append(f"  fix: {fix.title}" + (f"  [{fix.source}]" if fix.source else ""))
                if fix.text:
                    out.append(_indent(fix.text, "       "))
    if r.findings:
        out += ["", "== identity, selectors and labels"]
        for fd in r.findings:
            out.append(f"  {fd.severity}: {fd.message}")
            if fixes:
                for fix in fd.fixes:
                    out.append(f"    fix: {fix.title}" + (f"  [{fix.source}]" if fix.source else ""))
                    if fix.text:
                        out.append(_indent(fix.text, "         "))
    lines = r.csv_lines()
    if lines and fixes:
        out += ["", "== counters CSV lines to add (all families; deploy/dcgm-exporter/recommended.csv has them all)"]
        out += [f"  {line}" for line in lines]
    counts = {s: sum(f.status == s for f in r.families) for s in ("live", "degraded", "blind", "skipped")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    blind = r.blind_paging
    out += ["", f"summary: {summary}; " + (f"paging families blind: {', '.join(blind)}" if blind
                                           else "no paging family is blind") + f" (exit {r.exit_code})"]
    return "\n".join(out) + "\n"


def as_json(report: Report) -> str:
    """The report as one JSON object (see :meth:`Report.to_dict`)."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"
