"""Griffe extension: the docstrings' Sphinx roles (``:func:`open_dataset```, ``:class:`~colabfast.H5Dataset```)
become mkdocs-autorefs cross-references as mkdocstrings renders them, so every one is a link.

mkdocstrings reads Google-style docstrings and leaves reStructuredText roles as literal text. Each role's target is
resolved as Sphinx resolves it (the object's own scope, then its module's names, imports included, then
``colabfast.<name>`` through the package's lazy public names), and becomes
``<autoref identifier="<its path>" optional><code>name</code></autoref>``: mkdocs-autorefs links it to the page
that renders the object, or, for an object the reference does not render, leaves the code text (``optional``:
``mkdocs_autorefs/_internal/references.py``). A target outside colabfast (``torch.utils.data.DataLoader``) is code
text. ``literal_roles.py`` fails the build for any role left in a page.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const):`(~?)\.?([\w.]+)(?:\(\))?`")


def _exports() -> dict[str, str]:
    """``colabfast.<name>`` -> the module defining it (the package's lazy ``_EXPORTS``, ``_MODULES``)."""
    import colabfast

    found = {name: f"{module}.{name}" for name, module in colabfast._EXPORTS.items()}
    found.update(colabfast._MODULES)
    return found


class RolesToAutorefs(griffe.Extension):
    """Rewrite every docstring of the package once it is loaded (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "colabfast":
            return
        self.pkg, self.exports = pkg, _exports()
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(lambda m: self._link(obj, m), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]

    def _link(self, scope: griffe.Object, match: re.Match) -> str:
        short, target = match.group(1), match.group(2)
        shown = target.rsplit(".", 1)[-1] if short else target
        path = self._resolve(scope, target)
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    def _resolve(self, scope: griffe.Object, target: str) -> Optional[str]:
        first, _, rest = target.partition(".")
        if first == "colabfast":
            head, _, tail = rest.partition(".")
            if head in self.exports:
                return self._find(self.exports[head] + (f".{tail}" if tail else ""))
            return self._find(target)
        here: Optional[griffe.Object] = scope
        while here is not None:  # the object itself, its class, its module, the packages above
            if first in here.members:
                return self._find(f"{here.path}.{target}")
            here = here.parent
        return self._find(self.exports[first] + (f".{rest}" if rest else "")) if first in self.exports else None

    def _find(self, path: str) -> Optional[str]:
        """The path of the object at ``path`` (aliases followed), or None for one outside colabfast."""
        parts = path.split(".")
        if parts[0] != "colabfast":
            return None
        obj: Any = self.pkg
        for name in parts[1:]:
            try:
                obj = obj.members[name]
                if obj.is_alias:
                    obj = obj.final_target
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                return None
        return obj.path if obj.path.startswith("colabfast") else None
