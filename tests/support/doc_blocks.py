"""The fenced blocks of README.md and docs/*.md that the docs check runs (tests/test_docs_run.py).

A ``bash`` block runs as one script; a ``console`` block's ``$ `` lines run one by one, and the
lines under each are its output; a ``python`` block runs as a program, and a ``text`` block right
after it is its output. Output shown in a doc is compared with the real output on its key lines
(:func:`shown_in`). Other languages (toml, json, text on its own, none) are not commands.

Just above a block (blank lines aside), a doc may say:

- ``*Not run by the docs check: REASON.*``: a visible marker, for a block that cannot run here
  (a GPU, several hosts, an index that serves distcomm); the reason is required;
- ``<!-- docs-check: KEY=VALUE ... -->`` (hidden), how to run it: ``launch='distcomm run -n 2'``
  (a python block under a launcher), ``env='NAME=VALUE ...'``, ``status=N`` (the exit status
  the block shows, e.g. 1 for an example of an error), ``timeout=SECONDS``, ``compare=no`` (the
  output shown is an illustration: times, addresses), ``cwd=copy`` (in a fresh copy of the
  checkout's files, for a block that sets one up: the README's first command),
  ``same-as='PATH[::TEST] ...'`` (the block runs exactly what these tests run, folders, files or
  tests of the suite: their passing in the same session stands for the block, which then does
  not run again; the block shows no output they do not check).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = ("bash", "console", "python")
MARKER = re.compile(r"^\*Not run by the docs check: (.+)\*$")
DIRECTIVE = re.compile(r"^<!-- docs-check: (.*) -->$")
FENCE = re.compile(r"^( *)(`{3,})(\w*)\s*$")  # indented in a list item too


@dataclass
class Block:
    """One fenced block of a doc, and what the doc says about running it."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None = None  # the marker's reason
    options: dict[str, str] = field(default_factory=dict)
    shown: str | None = None  # a python block's output, from the text block right after it

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def docs() -> list[Path]:
    """README.md and docs/*.md (docs/reference/ has its own test: test_docs_examples.py)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the marker and directives above it."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip()
            for line in lines[i + 1 : end]
        ]
        block = Block(path, i + 1, lang, "\n".join(body) + "\n")
        _read_above(block, lines, i)
        if (
            found
            and lang == "text"
            and found[-1].lang == "python"
            and _adjacent(lines, found[-1], i)
        ):
            found[-1].shown = block.text
        found.append(block)
        i = end + 1
    return found


def _read_above(block: Block, lines: list[str], at: int) -> None:
    """The directives (one line each) and the marker (a paragraph, maybe wrapped) right above
    the fence at line ``at``, blank lines aside."""
    j = at - 1
    while True:
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j < 0:
            return
        if directive := DIRECTIVE.match(lines[j].strip()):
            for item in shlex.split(directive[1]):
                key, _, value = item.partition("=")
                block.options[key] = value
            j -= 1
            continue
        start = j
        while start > 0 and lines[start - 1].strip():
            start -= 1
        paragraph = " ".join(line.strip() for line in lines[start : j + 1])
        if marker := MARKER.match(paragraph):
            block.skip = marker[1]
            j = start - 1
            continue
        return


def _adjacent(lines: list[str], previous: Block, at: int) -> bool:
    """Whether only blank lines separate ``previous``'s closing fence from line ``at``."""
    closing = previous.line + previous.text.count("\n")  # 0-based index of its closing fence
    return all(not line.strip() for line in lines[closing + 1 : at])


def same_as(block: Block) -> list[str]:
    """The tests a block names with ``same-as`` (none: an empty list)."""
    return block.options.get("same-as", "").split()


def commands(text: str) -> list[tuple[str, str]]:
    """A console block's ``(command, output shown)`` pairs (``\\`` continues a command)."""
    pairs: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            pairs.append((command, []))
        elif pairs:
            pairs[-1][1].append(line)
        i += 1
    return [(command, "\n".join(out)) for command, out in pairs]


_NUMBER = re.compile(r"\d+(\.\d+)?")


def _key(line: str) -> str:
    """A line as compared: numbers and runs of spaces do not count (times, ports, pids)."""
    return " ".join(_NUMBER.sub("#", line).split())


def shown_in(shown: str, actual: str) -> str | None:
    """None if every key line of the output a doc shows appears in the actual output, in
    order; else the first that does not. Lines of ``...`` and blank lines are left out, and a
    line ending in ``...`` matches any line that starts like it."""
    got = [_key(line) for line in actual.splitlines()]
    at = 0
    for line in shown.splitlines():
        key = _key(line)
        if not key or key in ("...", "…"):
            continue
        prefix = key[:-3].rstrip() if key.endswith("...") else None
        while at < len(got) and not (
            got[at] == key or (prefix is not None and got[at].startswith(prefix))
        ):
            at += 1
        if at == len(got):
            return line
        at += 1
    return None
