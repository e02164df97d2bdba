"""mkdocs hook: the CLI page's `<!-- colabfast-help -->` marker becomes `colabfast --help` and every
subcommand's help, from the parser itself, so the page cannot drift from the command."""

from __future__ import annotations

import argparse
import os

MARKER = "<!-- colabfast-help -->"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _sections(parser: argparse.ArgumentParser, words: list[str], level: int) -> list[str]:
    out = [f"{'#' * level} `{' '.join(words)}`\n", "```text", parser.format_help().rstrip(), "```\n"]
    for name, sub in _subparsers(parser).items():
        out += _sections(sub, [*words, name], min(level + 1, 4))
    return out


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: fixed, for a stable page
    from colabfast.cli import build_parser

    return markdown.replace(MARKER, "\n".join(_sections(build_parser(), ["colabfast"], 2)))
