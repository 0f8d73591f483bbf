"""Write the API reference, docs/reference/*.md, as plain Markdown from the docstrings.

The pages are committed, so that they read as they are on GitHub as well as in the site that
``mkdocs build`` makes of docs/ (scripts/docs.sh). Each page is in ``PAGES`` below, the one list
of them: its file, the public modules it documents (every name of each one's ``__all__`` must
be on the page) and the link to its guide. A page is hand-written Markdown with generated
blocks in it; this script rewrites only the blocks, from the docstrings::

    <!-- reference: distcomm.errors -->
    ... (generated: the module's docstring, then every name of its __all__, in that order)
    <!-- end reference -->

    <!-- reference: distcomm.init distcomm.finalize -->
    ... (generated: these names of distcomm.__all__, in this order)
    <!-- end reference -->

A block's headings are one level below the page's last heading above it. Each name gets an
anchor of its full path (``reference/errors.md#distcomm.errors.OperationError``), a heading, its
signature (annotations as written in the source) and its Google-style docstring; a class also
lists its attributes, then gives its public methods (the ``__init__`` merged into the class),
in source order (scripts/reference_render.py writes a name). A new public module gets a
``Page`` in ``PAGES`` and a line in mkdocs.yml's nav: a page of ``PAGES`` that does not exist
yet is created with a title, an intro naming its guide, and one block per module.

The source is read statically by griffe (nothing imported, so ``distcomm``'s lazy names, read
from its ``TYPE_CHECKING`` imports, are there too) and the output is the same bytes on every
machine. What mkdocs' strict build used to reject is an error here: a docstring that documents a
parameter its signature lacks, a section griffe cannot parse, a module without ``__all__``, a
name of ``__all__`` missing from its page, a private name rendered.

Usage: ``python scripts/reference.py`` writes the pages; ``--check`` writes nothing and exits 1
naming each page that is out of date (tests/test_reference.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import griffe
from reference_render import Problems, Rendered, exported, exports, load, markdown, resolve

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
HINT = "HINT: run python scripts/reference.py"
PREFIX = "scripts/reference.py:"


@dataclass(frozen=True)
class Page:
    """One page of docs/reference/.

    Attributes:
        file: its file name in docs/reference/.
        modules: the public modules whose ``__all__`` it documents, the main one first.
        guide: the link (relative to the page) to the guide that explains the module(s), which
            the page must show; None for a page that is its own guide.
    """

    file: str
    modules: tuple[str, ...]
    guide: str | None = None


#: Every page of docs/reference/, in the order of mkdocs.yml's nav (which must list each one).
PAGES: tuple[Page, ...] = (
    Page("distcomm.md", ("distcomm",)),
    Page("errors.md", ("distcomm.errors",), "../errors.md"),
    Page("protocol.md", ("distcomm.protocol",), "../plugins.md#the-communicator"),
    Page("helpers.md", ("distcomm.helpers",), "../helpers.md"),
    Page("workspace.md", ("distcomm.workspace",), "../helpers.md#the-workspace-distcommworkspace"),
    Page("testing.md", ("distcomm.testing", "distcomm.testing.faults"), "../testing.md"),
    Page("environment.md", ("distcomm.environment",), "../launch.md"),
    Page(
        "backend.md",
        (
            "distcomm.backend",
            "distcomm.backend.monitor",
            "distcomm.backend.stacks",
            "distcomm.backend.claims",
        ),
        "../plugins.md#the-engine-contract",
    ),
    Page("compat-linklink.md", ("distcomm.compat.linklink",), "../compat.md#linklink"),
    Page("compat-ding.md", ("distcomm.compat.ding",), "../compat.md#ding"),
    Page("compat-axolotl.md", ("distcomm.compat.axolotl",), "../compat.md#axolotl"),
    Page("compat-speechbrain.md", ("distcomm.compat.speechbrain",), "../compat.md#speechbrain"),
    Page("compat-flame.md", ("distcomm.compat.flame",), "../compat.md#flame"),
    Page("compat-modelopt.md", ("distcomm.compat.modelopt",), "../compat.md#modelopt"),
    Page("compat-torch_distributed.md", ("distcomm.compat.torch_distributed",), "../from-torch.md"),
)

BLOCK = re.compile(
    r"^<!-- reference: (?P<paths>[^>]*?) -->\n.*?^<!-- end reference -->\n", re.M | re.S
)
END = "<!-- end reference -->"


# Pages ----------------------------------------------------------------------------------------


def heading_level(prose: str) -> int:
    """The level of the last Markdown heading of ``prose`` outside fenced blocks (1 if none)."""
    level, fence = 1, ""
    for line in prose.split("\n"):
        stripped = line.lstrip()
        if fence:
            fence = "" if stripped.startswith(fence) else fence
        elif opening := re.match(r"`{3,}|~{3,}", stripped):
            fence = opening[0]
        elif heading := re.match(r"(#{1,6}) ", line):
            level = len(heading[1])
    return level


def render_block(
    out: Rendered, package: griffe.Module, page: Page, paths: list[str], level: int
) -> None:
    """A generated block: each path a whole module of the page's, or a name of one's ``__all__``."""
    for path in paths:
        whole = path in page.modules
        owner, _, name = path.rpartition(".")
        if not whole and owner not in page.modules:
            out.problems.append(
                f"renders {path}: neither a module of this page nor a name of one"
                f" ({', '.join(page.modules)}; PAGES in scripts/reference.py)"
            )
            continue
        try:
            module = resolve(package, path if whole else owner)
            names = exports(module)
            if whole:
                out.add(markdown(out.parsed(module)))
            elif name not in names:
                raise Problems([f"renders {path}, but {owner}.__all__ does not name {name!r}"])
            for each in names if whole else [name]:
                exported(out, module, each, level)
        except Problems as exc:
            out.problems += exc.messages
        except KeyError as exc:
            out.problems.append(f"cannot load {path if whole else owner}: {exc.args[0]}")


def render_page(package: griffe.Module, page: Page, text: str) -> tuple[str, Rendered]:
    """``text`` with its generated blocks written anew, and everything the blocks rendered."""
    pieces: list[str] = []
    prose, last, rendered = "", 0, Rendered()
    for match in BLOCK.finditer(text):
        pieces.append(text[last : match.start()])
        prose += text[last : match.start()]
        block = Rendered()
        render_block(block, package, page, match["paths"].split(), heading_level(prose) + 1)
        opening = match[0][: match[0].index("-->\n") + 4]
        pieces += [opening, "\n", *(f"{line}\n" for line in block.lines), END, "\n"]
        rendered.anchors += block.anchors
        rendered.problems += block.problems
        last = match.end()
    pieces.append(text[last:])
    prose += text[last:]
    rendered.problems += check_page(package, page, prose, rendered.anchors)
    rendered.problems = list(dict.fromkeys(rendered.problems))  # a module that cannot load
    return "".join(pieces), rendered


def check_page(package: griffe.Module, page: Page, prose: str, anchors: list[str]) -> list[str]:
    """What is wrong with a page: a leftover mkdocstrings directive or a marker without its
    pair, no link to its guide, a module that cannot load, a name of its modules' ``__all__``
    not rendered, a name rendered twice, a private name."""
    problems = [
        f"{m[0]!r} is not a generated block: write"
        " <!-- reference: PATHS --> and <!-- end reference --> around the generated text"
        for m in re.finditer(r"^(?:::: *\S+|<!-- (?:end )?reference\b.*)", prose, re.M)
    ]
    if page.guide is not None and f"]({page.guide})" not in prose:
        problems.append(f"does not link to its guide ({page.guide}; PAGES in scripts/reference.py)")
    problems += [f"renders {a} twice" for a in sorted({a for a in anchors if anchors.count(a) > 1})]
    problems += [f"renders the private name {a}" for a in anchors if _private(a)]
    for path in page.modules:
        try:
            names = exports(resolve(package, path))
        except Problems as exc:
            problems += exc.messages
            continue
        except KeyError as exc:
            problems.append(f"cannot load {path}: {exc.args[0]}")
            continue
        problems += [
            f"{path}.__all__ names {name!r}, not on the page: add it to a"
            " <!-- reference: ... --> block"
            for name in names
            if f"{path}.{name}" not in anchors
        ]
    return problems


def _private(anchor: str) -> bool:
    """Whether a part of the dotted path has a leading underscore (dunders are not private)."""
    return any(
        part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
        for part in anchor.split(".")
    )


def skeleton(page: Page) -> str:
    """A new page of ``PAGES``: its title, an intro naming its guide, one block a module."""
    main = page.modules[0]
    guide = page.guide or "../index.md"
    label = guide.rpartition("/")[2].partition("#")[0]
    lines = [f"# `{main}`", ""]
    lines += [
        f"Generated from the docstrings of the names in `{main}.__all__`; the guide is"
        f" [{label}]({guide}).",
        "",
    ]
    for index, module in enumerate(page.modules):
        lines += [f"## `{module}`", ""] if index else []
        lines += [f"<!-- reference: {module} -->", END, ""]
    return "\n".join(lines)


def expected(reference: Path = REFERENCE, root: Path = ROOT) -> dict[Path, str]:
    """Every page of ``PAGES`` as it must read; Problems (all of them) if one cannot be written."""
    package = load(root)
    pages: dict[Path, str] = {}
    problems = [
        f"{_shown(path)}: not in PAGES of scripts/reference.py (add it there, and to mkdocs.yml)"
        for path in sorted(reference.glob("*.md"))
        if path.name not in {page.file for page in PAGES}
    ]
    for page in PAGES:
        path = reference / page.file
        text = path.read_text(encoding="utf-8") if path.exists() else skeleton(page)
        pages[path], rendered = render_page(package, page, text)
        problems += [f"{_shown(path)}: {problem}" for problem in rendered.problems]
    if problems:
        raise Problems(problems)
    return pages


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _first_difference(old: str, new: str) -> int:
    """The first line (1-based) at which two texts differ."""
    pairs = zip(old.split("\n"), new.split("\n"), strict=False)
    shorter = min(old.count("\n"), new.count("\n")) + 1
    return next((i for i, (a, b) in enumerate(pairs, 1) if a != b), shorter)


def main(argv: Sequence[str] | None = None, reference: Path = REFERENCE) -> int:
    """Write the pages that changed (or, with ``--check``, name them); the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    check = parser.parse_args(argv).check
    try:
        pages = expected(reference)
    except Problems as exc:
        for message in exc.messages:
            print(f"{PREFIX} error: {message}", file=sys.stderr)
        return 1
    stale = {p: t for p, t in pages.items() if not p.exists() or p.read_text("utf-8") != t}
    for path, text in stale.items():
        if check:
            old = path.read_text("utf-8") if path.exists() else ""
            where = f"line {_first_difference(old, text)}" if old else "missing"
            print(f"{PREFIX} {_shown(path)} is out of date ({where})", file=sys.stderr)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{PREFIX} wrote {_shown(path)}")
    if check and stale:
        print(HINT, file=sys.stderr)
        return 1
    print(f"{PREFIX} the {len(pages)} pages of docs/reference/ are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
