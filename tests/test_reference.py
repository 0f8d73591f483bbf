"""The API reference in docs/reference/ is what scripts/reference.py writes from the docstrings.

The pages are committed Markdown (readable on GitHub); this test fails when one is out of date
with the source, naming the page and the command that writes it again, and checks that the
generator refuses what mkdocs' strict build refused: a docstring that documents a parameter the
signature lacks, a section griffe cannot parse, a name of ``__all__`` that its page leaves out,
a private name. The site build itself is scripts/docs.sh's (tests/test_release.py).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("griffe", reason="scripts/reference.py reads the source with griffe (3.11+)")


@pytest.fixture(scope="module")
def scripts() -> Iterator[tuple[ModuleType, ModuleType]]:
    """scripts/reference.py and scripts/reference_render.py, imported."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "scripts"))
        yield importlib.import_module("reference"), importlib.import_module("reference_render")


def test_the_committed_reference_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (
        "docs/reference/ is out of date with the docstrings (or cannot be written):\n"
        f"{done.stderr}{done.stdout}"
    )


def test_a_stale_or_missing_page_is_named_with_the_command_that_writes_it(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference, _ = scripts
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        shutil.copy(page, tmp_path)
    errors = tmp_path / "errors.md"
    errors.write_text(errors.read_text().replace("## `DistcommError`", "## `DistcommErr`"))
    (tmp_path / "compat-ding.md").unlink()
    assert reference.main(["--check"], reference=tmp_path) == 1
    stderr = capsys.readouterr().err
    assert "errors.md is out of date (line " in stderr, stderr
    assert "compat-ding.md is out of date (missing)" in stderr, stderr
    assert stderr.rstrip().endswith("HINT: run python scripts/reference.py"), stderr
    assert reference.main([], reference=tmp_path) == 0  # writes them
    assert reference.main(["--check"], reference=tmp_path) == 0
    assert errors.read_text() == (ROOT / "docs" / "reference" / "errors.md").read_text()


def _package(root: Path, source: str) -> None:
    """A package ``pkg`` under ``root`` whose ``__init__.py`` is ``source``."""
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text(textwrap.dedent(source))


def _problems(scripts: tuple[ModuleType, ModuleType], root: Path, text: str) -> list[str]:
    """What the generator finds wrong when it writes the page ``text`` documenting ``pkg``."""
    reference, render = scripts
    page = reference.Page("pkg.md", ("pkg",))
    _, rendered = reference.render_page(render.load(root, "pkg"), page, text)
    return rendered.problems


WHOLE = "# `pkg`\n\n<!-- reference: pkg -->\n<!-- end reference -->\n"


def test_a_docstring_that_documents_a_parameter_the_signature_lacks_is_an_error(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _package(
        tmp_path,
        '''
        __all__ = ["f"]

        def f(a: int) -> None:
            """Do it.

            Args:
                a: the first.
                b: a parameter that f does not have.
            """
        ''',
    )
    problems = _problems(scripts, tmp_path, WHOLE)
    assert problems and all(p.startswith("pkg.f: docstring: ") for p in problems), problems
    assert any("'b' does not appear in the function signature" in p for p in problems), problems


def test_a_section_griffe_cannot_parse_is_an_error(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _package(
        tmp_path,
        '''
        __all__ = ["f"]

        def f(a: int) -> None:
            """Do it.

            Args:
                a
            """
        ''',
    )
    problems = _problems(scripts, tmp_path, WHOLE)
    assert problems and all(p.startswith("pkg.f: docstring: ") for p in problems), problems


def test_a_name_of_all_left_out_and_a_private_name_are_errors(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _package(
        tmp_path,
        '''
        __all__ = ["f", "g", "_h"]

        def f() -> None:
            """F."""

        def g() -> None:
            """G."""

        def _h() -> None:
            """H."""
        ''',
    )
    text = "# `pkg`\n\n<!-- reference: pkg.f pkg._h -->\n<!-- end reference -->\n"
    problems = _problems(scripts, tmp_path, text)
    assert "renders the private name pkg._h" in problems, problems
    assert any("pkg.__all__ names 'g', not on the page" in p for p in problems), problems


def test_a_page_shows_signatures_as_written_and_google_sections_as_lists(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _package(
        tmp_path,
        '''
        """The package."""

        __all__ = ["C", "f"]

        def f(a: int, /, b: "str | None" = None, *rest: int, c: bool = False) -> list[int]:
            """Summary.

            Body::

                f(1)

            Args:
                a: first.
                b: second.
                *rest: more.
                c: a flag.

            Returns:
                The list.

            Raises:
                ValueError: when a is negative.
            """

        class C:
            """A class.

            Attributes:
                x: an attribute.
            """

            x: int = 1

            def method(self, y: int) -> int:
                """Add."""
        ''',
    )
    reference, render = scripts
    page = reference.Page("pkg.md", ("pkg",))
    text, rendered = reference.render_page(render.load(tmp_path, "pkg"), page, WHOLE)
    assert rendered.problems == []
    assert rendered.anchors == ["pkg.C", "pkg.C.x", "pkg.C.method", "pkg.f"]
    expected = """\
        ```python
        f(a: int, /, b: str | None = None, *rest: int, c: bool = False) -> list[int]
        ```

        Summary.

        Body:

        ```python
        f(1)
        ```

        **Parameters:**

        - `a` (`int`): first.
        - `b` (`str | None`, default `None`): second.
        - `*rest` (`int`): more.
        - `c` (`bool`, default `False`): a flag.

        **Returns:**

        - `list[int]`: The list.

        **Raises:**

        - `ValueError`: when a is negative.
        """
    assert textwrap.dedent(expected) in text, text
    assert '- <a id="pkg.C.x"></a>`x: int = 1`: an attribute.' in text, text
    assert "### `C.method`\n\n```python\nmethod(y: int) -> int\n```" in text, text


def test_examples_stay_code_and_notes_stay_notes(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _package(
        tmp_path,
        '''
        from collections.abc import Iterator

        __all__ = ["count"]

        def count(n: int) -> Iterator[int]:
            """Count up to n, from :func:`~pkg.start`.

            Note:
                Lazily.

            Examples:
                Two numbers.

                >>> list(count(2))
                [0, 1]

            Yields:
                The numbers.
            """
            yield from range(n)
        ''',
    )
    reference, render = scripts
    page = reference.Page("pkg.md", ("pkg",))
    text, rendered = reference.render_page(render.load(tmp_path, "pkg"), page, WHOLE)
    assert rendered.problems == []
    expected = """\
        Count up to n, from `start`.

        > **Note:** Lazily.

        **Examples:**

        Two numbers.

        ```pycon
        >>> list(count(2))
        [0, 1]
        ```

        **Yields:**

        - `int`: The numbers.
        """
    assert textwrap.dedent(expected) in text, text


def test_a_class_shows_the_init_it_inherits_and_its_bases(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _package(
        tmp_path,
        '''
        __all__ = ["Base", "Child"]

        class Base(Exception):
            """The base."""

            def __init__(self, message: str, *, code: int = 0) -> None:
                super().__init__(message)

        class Child(Base, LookupError):
            """The child."""
        ''',
    )
    reference, render = scripts
    page = reference.Page("pkg.md", ("pkg",))
    text, rendered = reference.render_page(render.load(tmp_path, "pkg"), page, WHOLE)
    assert rendered.problems == []
    child = "```python\nclass Child(message: str, *, code: int = 0)\n```\n\n"
    assert child + "Bases: `Base`, `LookupError`.\n\nThe child." in text, text
