"""Every flag of every command explains itself, and says its default once (issue 29: ``stack up --help``
showed ``(default 1) (default: 1)`` and ``(default: the pager) (default: None)``, and ``--run-dir``,
``--json``, ``--gpu`` had no help at all)."""

from __future__ import annotations

import argparse
import re

import pytest

from gpuobs.cli import build_parser

#: A default annotation: ``(default: X)``, ``(default X)``, ``; default X``, ``, default ...``.
ANNOTATION = re.compile(r"[(;,]\s*default\b")


def parsers():
    """(command words, parser) of the whole argparse tree."""
    out, todo = [], [(("gpuobs",), build_parser())]
    while todo:
        path, p = todo.pop()
        out.append((path, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [((*path, name), sp) for name, sp in a.choices.items()]
    return sorted(out, key=lambda x: x[0])


PARSERS = parsers()


@pytest.mark.parametrize("path,parser", PARSERS, ids=[" ".join(p) for p, _ in PARSERS])
def test_every_argument_has_help_and_says_its_default_once(path, parser):
    fmt = parser._get_formatter()
    for a in parser._actions:
        name = "/".join(a.option_strings) or a.dest
        if isinstance(a, argparse._SubParsersAction):
            for choice in a._choices_actions:  # the subcommands' one-line help in the parent's listing
                assert (choice.help or "").strip(), f"{' '.join(path)} {choice.dest}: no help"
            continue
        assert (a.help or "").strip() and a.help is not argparse.SUPPRESS, f"{' '.join(path)} {name}: no help"
        text = " ".join(fmt._expand_help(a).split())
        assert "(default: None)" not in text, f"{' '.join(path)} {name}: {text}"
        assert len(ANNOTATION.findall(text)) <= 1, f"{' '.join(path)} {name} says its default twice: {text}"


@pytest.mark.parametrize("path,parser", PARSERS, ids=[" ".join(p) for p, _ in PARSERS])
def test_formatted_help_has_no_doubled_or_empty_default(path, parser):
    for line in parser.format_help().splitlines():
        assert "(default: None)" not in line, f"{' '.join(path)}: {line}"
        assert len(ANNOTATION.findall(line)) <= 1, f"{' '.join(path)}: {line}"


def test_stack_up_lists_the_ha_flags_in_their_own_group():
    stack = dict(PARSERS)[("gpuobs", "stack")]
    text = stack.format_help()
    head, _, ha = text.partition("HA topology (--topology ha):")
    assert ha, text
    for flag in ("--shards", "--replicas", "--alertmanagers", "--ha-base-port", "--scrape-interval"):
        assert f"  {flag} " in ha and f"  {flag} " not in head, flag
    assert "  --nodes " in head and "  --nodes " not in ha
