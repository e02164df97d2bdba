"""mkdocs hook: a Sphinx role left as text in a built page (``:func:`x```: one ``crossrefs.py`` did not convert)
is a warning, so ``mkdocs build --strict`` fails on it."""

from __future__ import annotations

import logging
import re

LITERAL = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const):(?:`|<code>)")
log = logging.getLogger("mkdocs.plugins.colabfast")


def on_post_page(output: str, page, config) -> str:
    found = LITERAL.findall(output)
    if found:
        where = output[LITERAL.search(output).start():][:80]  # type: ignore[union-attr]
        log.warning(f"{page.file.src_uri}: {len(found)} Sphinx roles left as text, e.g. {where!r}")
    return output
