"""docs/plugins.md agrees with the kit it documents.

The guide's hooks table (first column ``hook``) names exactly the hookspecs of
:mod:`distcomm.backend.hooks` (the functions carrying pluggy's ``distcomm_spec`` marker), and
the field table (first column ``field``) under the heading of each of ``BackendSpec``,
``EnvironmentSpec`` and ``Capabilities`` names exactly that dataclass's fields. Tables are read
from the markdown outside code blocks; a row's name is the first word in backticks of its first
cell (``distcomm_register_backends`` in ``| `distcomm_register_backends(registry)` | ...``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from distcomm.backend import BackendSpec, Capabilities, EnvironmentSpec, hooks

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
SPECS = (BackendSpec, EnvironmentSpec, Capabilities)


@dataclasses.dataclass
class Table:
    """A markdown table: the heading above it, its column names, each row's name."""

    heading: str
    header: list[str]
    names: list[str] = dataclasses.field(default_factory=list)


def tables(markdown: str) -> list[Table]:
    """Every table of ``markdown`` outside fenced code blocks."""
    found: list[Table] = []
    heading, current, fenced = "", None, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced, current = not fenced, None
            continue
        if fenced:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if current is None:
            current = Table(heading, cells)
            found.append(current)
        elif not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
            name = re.search(r"`(\w+)", cells[0])
            current.names.append(name[1] if name else cells[0])
    return found


def hookspecs() -> set[str]:
    """The hooks distcomm defines: the functions of its hooks module with the spec marker."""
    return {name for name, obj in vars(hooks).items() if hasattr(obj, "distcomm_spec")}


def differences(documented: list[str], defined: set[str]) -> dict[str, list[str]]:
    """What the page lacks and what it names that does not exist (empty lists: they agree)."""
    return {
        "missing from the page": sorted(defined - set(documented)),
        "on the page but not in the code": sorted(set(documented) - defined),
    }


def hook_differences(markdown: str) -> dict[str, list[str]]:
    """The hooks table of ``markdown`` against the hookspecs."""
    found = [t for t in tables(markdown) if t.header[:1] == ["hook"]]
    assert len(found) == 1, f"expected one table whose first column is 'hook', found {found}"
    return differences(found[0].names, hookspecs())


def field_differences(markdown: str, spec: type) -> dict[str, list[str]]:
    """The field table under ``spec``'s heading in ``markdown`` against its dataclass fields."""
    name = spec.__name__
    found = [
        t
        for t in tables(markdown)
        if t.header[:1] == ["field"] and re.search(rf"\b{name}\b", t.heading)
    ]
    assert len(found) == 1, f"expected one 'field' table under a heading naming {name}: {found}"
    return differences(found[0].names, {f.name for f in dataclasses.fields(spec)})


NO_DIFFERENCE = {"missing from the page": [], "on the page but not in the code": []}


def test_the_hooks_table_names_every_hookspec() -> None:
    assert hookspecs() >= {"distcomm_register_backends", "distcomm_register_environments"}
    assert hook_differences(GUIDE.read_text()) == NO_DIFFERENCE


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.__name__)
def test_the_field_tables_name_every_field(spec: type) -> None:
    assert field_differences(GUIDE.read_text(), spec) == NO_DIFFERENCE


def test_a_missing_or_stale_row_is_found() -> None:
    """The checks above fail when a row goes missing or names nothing that exists."""
    lines = GUIDE.read_text().splitlines()
    doctored = "\n".join(
        "| `bogus` | - | - | - |" if line.startswith("| `any_source` |") else line
        for line in lines
        if not line.startswith(("| `distcomm_register_environments", "| `detect` |"))
    )
    assert hook_differences(doctored)["missing from the page"] == ["distcomm_register_environments"]
    assert field_differences(doctored, EnvironmentSpec)["missing from the page"] == ["detect"]
    assert field_differences(doctored, Capabilities) == {
        "missing from the page": ["any_source"],
        "on the page but not in the code": ["bogus"],
    }


def test_tables_in_code_blocks_are_not_read() -> None:
    markdown = "## `BackendSpec`\n\n```text\n| field |\n|---|\n| `fake` |\n```\n\n| field |\n"
    markdown += "|---|\n| `name` (a `str`) |\n| `detect \\| x` |\n"
    [table] = tables(markdown)
    assert (table.heading, table.header, table.names) == (
        "`BackendSpec`",
        ["field"],
        ["name", "detect"],
    )
