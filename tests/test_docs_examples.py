"""The API reference's examples print what the page shows: each self-contained example of
docs/reference/distcomm.md (a ``python`` block that runs thread-ranks and prints), run as a
program, against the ``text`` block that follows it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "distcomm.md"
#: A python block and the text block right after it (neither may hold a fence).
PAIR = re.compile(r"```python\n((?:(?!```).)*)```\s*\n```text\n((?:(?!```).)*)```", re.S)


def examples() -> list[tuple[str, str]]:
    found = [(code, shown) for code, shown in PAIR.findall(PAGE.read_text())]
    return [(c, s) for c, s in found if "run_threads" in c and "import distcomm" in c]


def test_the_page_has_runnable_examples() -> None:
    assert len(examples()) >= 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("code", "shown"), examples(), ids=[f"example-{i}" for i in range(len(examples()))]
)
def test_an_example_prints_what_the_page_shows(code: str, shown: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
        check=False,
    )
    assert done.stdout.strip() == shown.strip(), done.stderr[-2000:] or done.stdout
