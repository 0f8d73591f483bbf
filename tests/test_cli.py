"""Tests of the ``distcomm`` command: ``distcomm info [--explain] [--json]``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

import pytest

import distcomm
from distcomm._plugins.names import FIRST_PARTY_BACKENDS
from distcomm.cli import main
from distcomm.environment import LaunchInfo

LAUNCH_FIELDS = {field.name for field in dataclasses.fields(LaunchInfo)}


def info_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["info", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_info_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, info = info_json(capsys)
    assert code == 0
    keys = {"version", "launch", "selected", "backends", "environments", "plugins", "trace"}
    assert keys <= set(info)
    assert info["version"] == distcomm.__version__
    assert set(info["launch"]) == LAUNCH_FIELDS
    assert isinstance(info["launch"]["sources"], dict)
    assert {"rank", "world_size", "method"} <= set(info["launch"]["sources"])
    assert set(info["selected"]) == {"backend", "method"}
    for entry in info["backends"]:
        assert {"name", "distribution", "available", "reason", "selected"} <= set(entry)
        assert isinstance(entry["available"], bool) and isinstance(entry["selected"], bool)
    for entry in info["environments"]:
        assert {"name", "distribution"} <= set(entry)
    for entry in info["plugins"]:
        assert {"name", "distribution", "version", "error"} <= set(entry)
    assert info["trace"] and all(isinstance(line, str) for line in info["trace"])


def test_info_json_on_a_plain_machine(capsys: pytest.CaptureFixture[str]) -> None:
    _, info = info_json(capsys)
    launch = info["launch"]
    assert launch["method"] == "single_node"
    assert (launch["rank"], launch["world_size"]) == (0, 1)
    assert info["selected"] == {"backend": "fakelink", "method": "single_node"}
    backends = {entry["name"]: entry for entry in info["backends"]}
    assert [name for name, entry in backends.items() if entry["selected"]] == ["fakelink"]
    assert backends["fakelink"]["available"] and backends["fakelink"]["distribution"] == "distcomm"
    assert set(FIRST_PARTY_BACKENDS) <= set(backends)
    for name, entry in backends.items():
        if not entry["selected"]:
            assert entry["reason"].strip(), f"{name} has no reason"
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        assert backends[name]["distribution"] == distribution
    environments = {entry["name"]: entry["distribution"] for entry in info["environments"]}
    for method in ("env", "slurm", "mpi", "single_node"):
        assert environments[method] == "distcomm"
    core = [p for p in info["plugins"] if p["distribution"] == "distcomm"]
    assert core and all(p["error"] is None and p["version"] == distcomm.__version__ for p in core)
    assert any("fakelink: selected" in line for line in info["trace"])
    assert not distcomm.is_initialized()  # info initialises nothing


def test_info_follows_the_launch_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    _, info = info_json(capsys)
    assert info["selected"]["method"] == "env"
    assert (info["launch"]["rank"], info["launch"]["world_size"]) == (1, 3)
    assert info["launch"]["sources"]["rank"] == "RANK"
    backends = {entry["name"]: entry for entry in info["backends"]}
    assert not backends["fakelink"]["available"]
    assert "world_size=3" in backends["fakelink"]["reason"]


def test_explain_prints_why_and_a_line_per_backend(capsys: pytest.CaptureFixture[str]) -> None:
    _, info = info_json(capsys)
    assert main(["info", "--explain"]) == 0
    text = capsys.readouterr().out
    assert "why:" in text
    assert "selected:  backend fakelink, method single_node" in text
    lines = text.splitlines()
    for entry in info["backends"]:
        starts = (["*", entry["name"]], [entry["name"], entry["distribution"]])
        assert any(line.split()[:2] in starts for line in lines), entry["name"]
    why = lines[lines.index("why:") + 1 :]
    for name in FIRST_PARTY_BACKENDS:
        assert any(line.strip().startswith(f"{name}: ") for line in why), name
    assert "where each launch value came from:" in text


def test_without_explain_there_is_no_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "why:" not in text
    assert "backends:" in text and "fakelink" in text


def test_malformed_world_size_exits_1_and_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert main(["info"]) == 1
    text = capsys.readouterr().out
    assert "error:" in text and "WORLD_SIZE='abc'" in text and "HINT" in text
    code, info = info_json(capsys)
    assert code == 1
    assert info["launch"] is None
    assert info["selected"] == {"backend": None, "method": None}
    assert "WORLD_SIZE" in info["error"] and "'abc'" in info["error"]


def test_info_requires_no_other_argument() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


def test_python_dash_m_distcomm_info_explain() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "distcomm", "info", "--explain"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "fakelink" in result.stdout and "why:" in result.stdout


def test_info_shows_how_a_peers_objects_are_unpickled(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy, what the program allowed and the size limit (docs/security.md)."""
    _, info = info_json(capsys)
    assert info["objects"] == {"policy": "restricted", "allowed": [], "max_bytes": 8 * 2**30}
    assert main(["info"]) == 0
    assert "objects:   restricted (the allow-list), up to 8 GiB a message\n" in (
        capsys.readouterr().out
    )
    monkeypatch.setenv("DISTCOMM_ALLOW_OBJECTS", "pkg.config:Config,pkg:f")
    monkeypatch.setenv("DISTCOMM_MAX_OBJECT_BYTES", "512M")
    main(["info"])
    shown = "objects:   restricted (the allow-list and pkg.config:Config, pkg:f), up to 512 MiB"
    assert shown in capsys.readouterr().out
    monkeypatch.setenv("DISTCOMM_OBJECTS", "pickle")
    main(["info"])
    assert "objects:   pickle (any object a peer sends is built" in capsys.readouterr().out
    monkeypatch.setenv("DISTCOMM_OBJECTS", "yes")
    assert main(["info"]) == 0  # info reports what init would refuse, and does not crash
    said = capsys.readouterr().out
    assert "objects:   error: DISTCOMM_OBJECTS='yes' is not a policy" in said, said
