"""Every DISTCOMM_* variable is declared once (distcomm._settings), read only there, validated
before any communication, and documented from the declaration."""

from __future__ import annotations

import ast
import datetime
import re
import signal
from pathlib import Path

import pytest

import distcomm
from distcomm import _settings
from distcomm.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parent.parent
#: Variables of the launcher's run protocol, and of this test suite: documented, not settings.
NOT_SETTINGS = {"DISTCOMM_RUN_ID", "DISTCOMM_SLURM_PORT", "DISTCOMM_SLURM_DIR"}
#: A malformed value of each variable that has a rule, and words of the valid choices its
#: error must name.
MALFORMED = {
    "DISTCOMM_TIMEOUT": ("soon", "positive number of seconds"),
    "DISTCOMM_ON_TIMEOUT": ("explode", "valid: raise, abort"),
    "DISTCOMM_ABORT_ON_EXCEPTION": ("maybe", "must be 1 or 0"),
    "DISTCOMM_DEBUG": ("loud", "valid: sample, check, off"),
    "DISTCOMM_LOG_LEVEL": ("chatty", "valid: CRITICAL, ERROR, WARNING, INFO, DEBUG"),
    "DISTCOMM_TRACE": ("lots", "a positive int"),
    "DISTCOMM_TRACE_SIGNAL": ("SIGNOPE", "a name such as SIGUSR2"),
    "DISTCOMM_PROFILE": ("yes please", "valid: 1"),
    "DISTCOMM_TORCH_GROUP": ("sometimes", "valid: auto, 1, 0"),
}


def test_the_readmes_table_is_the_declarations() -> None:
    readme = (ROOT / "README.md").read_text()
    table = _settings.markdown_table()
    assert table in readme, (
        "README.md's table of environment variables differs from distcomm._settings; paste "
        f"the output of `python -c 'from distcomm import _settings; "
        f"print(_settings.markdown_table())'`:\n{table}"
    )


def test_every_variable_the_docs_name_is_declared() -> None:
    named = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(re.findall(r"DISTCOMM_[A-Z_]*[A-Z]", page.read_text()))
    unknown = named - set(_settings.SETTINGS) - NOT_SETTINGS
    assert not unknown, f"documented but not declared in distcomm._settings: {sorted(unknown)}"


def test_only_the_settings_module_reads_the_variables() -> None:
    """No ``environ.get("DISTCOMM_...")``, ``environ["DISTCOMM_..."]`` or ``os.getenv`` of one
    outside distcomm/_settings.py."""
    readers = []
    for path in sorted((ROOT / "distcomm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("get", "getenv", "pop") and node.args:
                    key = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                key = node.slice
            if isinstance(key, ast.Constant) and str(key.value).startswith("DISTCOMM_"):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {key.value}")
    assert not readers, readers


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_variable_names_itself_its_value_and_the_valid_ones(name: str) -> None:
    value, valid = MALFORMED[name]
    with pytest.raises(InvalidArgumentError) as caught:
        _settings.check_all({name: value})
    said = str(caught.value)
    assert said.startswith(f"{name}={value!r} "), said
    assert valid in said and "HINT:" in said, said


def test_unset_or_blank_gives_the_declared_default() -> None:
    for environ in ({}, dict.fromkeys(_settings.SETTINGS, "  ")):
        assert _settings.read("DISTCOMM_TIMEOUT", environ) is None
        assert _settings.read("DISTCOMM_DEBUG", environ) == "sample"
        assert _settings.read("DISTCOMM_ON_TIMEOUT", environ) == "raise"
        assert _settings.read("DISTCOMM_ABORT_ON_EXCEPTION", environ) is True
        assert _settings.read("DISTCOMM_TRACE_SIGNAL", environ) is signal.SIGUSR2
        assert _settings.read("DISTCOMM_PLUGINS", environ) == ()
        assert not _settings.is_set("DISTCOMM_TIMEOUT", environ)


def test_values_are_converted_and_a_keyword_follows_its_variables_rule() -> None:
    environ = {
        "DISTCOMM_TIMEOUT": " 2.5 ",
        "DISTCOMM_DEBUG": "CHECK",
        "DISTCOMM_TRACE_SIGNAL": "usr1",
        "DISTCOMM_PLUGINS": "a, b,,a",
        "DISTCOMM_TORCH_GROUP": "off",
    }
    assert _settings.read("DISTCOMM_TIMEOUT", environ) == 2.5
    assert _settings.read("DISTCOMM_DEBUG", environ) == "check"
    assert _settings.read("DISTCOMM_TRACE_SIGNAL", environ) is signal.SIGUSR1
    assert _settings.read("DISTCOMM_PLUGINS", environ) == ("a", "b")
    assert _settings.read("DISTCOMM_TORCH_GROUP", environ) is False
    seconds = datetime.timedelta(minutes=1)
    assert _settings.convert("DISTCOMM_TIMEOUT", seconds, "timeout") == 60.0
    with pytest.raises(InvalidArgumentError, match=r"^debug='loud' is not a check policy"):
        _settings.convert("DISTCOMM_DEBUG", "loud", "debug")


def test_init_fails_on_any_malformed_variable_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Even one read only by a later feature (the flight recorder's signal, without
    DISTCOMM_TRACE) fails init() at once, and nothing is left initialised."""
    monkeypatch.setenv("DISTCOMM_TRACE_SIGNAL", "SIGNOPE")
    with pytest.raises(InvalidArgumentError, match="DISTCOMM_TRACE_SIGNAL='SIGNOPE' names no"):
        distcomm.init(backend="fakelink")
    assert not distcomm.is_initialized()
