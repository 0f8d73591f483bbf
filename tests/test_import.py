"""``import distcomm`` is cheap and side-effect free, and its public names exist."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import distcomm

HEAVY = ("torch", "numpy", "mpi4py", "pluggy", "importlib.metadata", "email", "zipfile")
PROBE = f"""
import json, os, sys
before = dict(os.environ)
import distcomm
report = {{
    "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules),
    "distcomm_modules": sorted(m for m in sys.modules if m.startswith("distcomm")),
    "environ_changed": sorted(set(before.items()) ^ set(os.environ.items())),
}}
report["initialised"] = distcomm.is_initialized()  # loads the getters, not the plugins
loader = sys.modules.get("distcomm._plugins.loader")
report["registry_created"] = getattr(loader, "_registry", None) is not None
print(json.dumps(report))
"""


def test_import_is_light_and_side_effect_free() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {
        "heavy": [],
        "distcomm_modules": ["distcomm", "distcomm._version"],  # the rest loads on first use
        "registry_created": False,
        "initialised": False,
        "environ_changed": [],
    }


def test_the_lazy_names_are_the_typed_ones() -> None:
    """``_EXPORTS`` (what loads at run time) names exactly ``__all__`` (less ``__version__``)
    and the imports type checkers and the API reference see (under TYPE_CHECKING)."""
    tree = ast.parse(Path(distcomm.__file__).read_text())
    typed = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == distcomm._EXPORTS
    assert set(distcomm.__all__) == {*distcomm._EXPORTS, "__version__"}


def test_submodules_are_attributes_as_if_imported() -> None:
    code = "import distcomm; print(distcomm.errors.DistcommError.__name__, "
    code += "distcomm.testing.run_threads.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["DistcommError", "run_threads"], done.stderr
    try:
        distcomm.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "module 'distcomm' has no attribute 'no_such_name'" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_every_name_in_all_exists() -> None:
    missing = [name for name in distcomm.__all__ if not hasattr(distcomm, name)]
    assert missing == []
    assert len(distcomm.__all__) == len(set(distcomm.__all__))


#: The backend-author kit: in distcomm.backend only, never in the user's namespace.
BACKEND_ONLY = (
    "BaseCommunicator",
    "BaseWork",
    "BackendSpec",
    "Capabilities",
    "EnvironmentSpec",
    "hookimpl",
    "hookspec",
)


def test_backend_author_names_live_in_distcomm_backend_only() -> None:
    import distcomm.backend

    assert [name for name in BACKEND_ONLY if name in distcomm.__all__] == []
    assert [name for name in BACKEND_ONLY if name in distcomm._EXPORTS] == []
    assert [name for name in BACKEND_ONLY if name not in distcomm.backend.__all__] == []
    assert [name for name in BACKEND_ONLY if hasattr(distcomm, name)] == []
    assert [name for name in BACKEND_ONLY if name in dir(distcomm)] == []


def test_a_backend_name_asked_of_distcomm_says_where_it_lives() -> None:
    try:
        from distcomm import BaseCommunicator  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("BaseCommunicator must be imported from distcomm.backend")
    for name in BACKEND_ONLY:
        try:
            getattr(distcomm, name)
        except AttributeError as exc:
            assert f"moved to distcomm.backend (from distcomm.backend import {name})" in str(exc), (
                str(exc)
            )
        else:
            raise AssertionError(f"distcomm.{name} must not exist")


def test_version_is_a_string() -> None:
    assert isinstance(distcomm.__version__, str) and distcomm.__version__.count(".") >= 1
