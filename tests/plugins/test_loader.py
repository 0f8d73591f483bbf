"""Tests of distcomm._plugins.loader: plugin discovery (fake distributions on sys.path, and the
really installed example plugin), and check_backend."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import distcomm
from distcomm._plugins.loader import PluginRegistry, check_backend
from distcomm._runtime.selection import select_backend
from distcomm.backend import KIT_API, LaunchInfo
from distcomm.errors import BackendNotFoundError, PluginConflictError

BACKEND_PLUGIN = """
from distcomm.backend import KIT_API, BackendSpec, hookimpl
from distcomm.fakelink import create, is_available

@hookimpl
def distcomm_register_backends(registry):
    registry.add_backend(
        BackendSpec({name!r}, create, is_available, priority={priority}, kit_api=KIT_API)
    )
"""


def make_distribution(
    root: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str]
) -> None:
    """Write a fake installed distribution (a .dist-info folder and its modules) under ``root``."""
    info = root / f"{dist.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    lines = ["[distcomm]", *(f"{name} = {target}" for name, target in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory on sys.path holding only the fake distributions of one test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in list(sys.modules):
        if name.startswith("fake_"):
            del sys.modules[name]


def load(site: Path, environ: dict[str, str] | None = None) -> PluginRegistry:
    eps = [
        ep
        for ep in importlib.metadata.entry_points(group="distcomm")
        if ep.dist and Path(str(ep.dist.locate_file(""))).resolve() == site.resolve()
    ]
    return PluginRegistry.load(entry_points=eps, environ=environ or {})


def test_core_plugins_register_through_the_hooks() -> None:
    registry = PluginRegistry.load(entry_points=[], environ={})
    assert "fakelink" in registry.backends
    assert set(registry.environments) >= {"env", "slurm", "mpi", "single_node"}
    assert {p.distribution for p in registry.plugins} == {"distcomm"}
    assert registry.distribution_of("fakelink") == "distcomm"


def test_fake_distribution_backend_is_found_with_its_distribution(site: Path) -> None:
    make_distribution(
        site,
        "fake-good",
        {"fake_good": BACKEND_PLUGIN.format(name="good", priority=5)},
        {"good": "fake_good"},
    )
    registry = load(site)
    assert "good" in registry.backends
    assert registry.distribution_of("good") == "fake-good"
    record = next(p for p in registry.plugins if p.name == "good")
    assert (record.version, record.error, record.backends) == ("1.2.3", None, ["good"])


def test_plugin_that_fails_to_import_is_reported_not_fatal(site: Path) -> None:
    make_distribution(
        site,
        "fake-broken",
        {"fake_broken": "raise ImportError('needs libfoo')\n"},
        {"broken": "fake_broken"},
    )
    make_distribution(
        site,
        "fake-good",
        {"fake_good": BACKEND_PLUGIN.format(name="good", priority=5)},
        {"good": "fake_good"},
    )
    registry = load(site)
    broken = next(p for p in registry.plugins if p.name == "broken")
    assert broken.distribution == "fake-broken"
    assert "needs libfoo" in (broken.error or "")
    assert "good" in registry.backends


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        ("kit_api=1", "was written for distcomm's kit API 1"),
        ("kit_api=0", "was written for distcomm's kit API 0"),
        ("", "declares no kit API version"),
    ],
)
def test_a_backend_of_another_kit_api_is_refused_naming_both_versions(
    site: Path, declared: str, said: str
) -> None:
    plugin = BACKEND_PLUGIN.format(name="old", priority=5).replace("kit_api=KIT_API", declared)
    make_distribution(site, "fake-old", {"fake_old": plugin}, {"old": "fake_old"})
    registry = load(site)
    record = next(p for p in registry.plugins if p.name == "old")
    assert "old" not in registry.backends, "a backend of another kit API was registered"
    error = record.error or ""
    assert said in error and f"runs backends of kit API {KIT_API} only" in error, error
    assert "HINT: install a release of the plugin written for kit API" in error, error
    asked = select_backend(registry, LaunchInfo("single_node", 0, 1, 0, 1, 0, 1), "old", {})
    said_then = str(asked.error)
    assert "unknown backend 'old'" in said_then and "failed to load" in said_then, said_then
    assert "'old' (fake-old)" in said_then and said in said_then, said_then


def test_hook_that_raises_is_rolled_back(site: Path) -> None:
    source = """
    from distcomm.backend import KIT_API, BackendSpec, hookimpl
    from distcomm.fakelink import create, is_available

    @hookimpl
    def distcomm_register_backends(registry):
        registry.add_backend(BackendSpec("half", create, is_available, kit_api=KIT_API))
        raise RuntimeError("second backend failed")
    """
    make_distribution(site, "fake-half", {"fake_half": source}, {"half": "fake_half"})
    registry = load(site)
    assert "half" not in registry.backends
    assert "second backend failed" in (registry.plugins[-1].error or "")


def test_unknown_hook_fails_check_pending(site: Path) -> None:
    source = """
    from distcomm.backend import hookimpl

    @hookimpl
    def distcomm_register_everything(registry):
        pass
    """
    make_distribution(site, "fake-typo", {"fake_typo": source}, {"typo": "fake_typo"})
    registry = load(site)
    record = registry.plugins[-1]
    assert record.name == "typo"
    assert "distcomm_register_everything" in (record.error or "")


def test_two_distributions_registering_one_name_conflict(site: Path) -> None:
    plugin = BACKEND_PLUGIN.format(name="twin", priority=5)
    make_distribution(site, "fake-one", {"fake_one": plugin}, {"one": "fake_one"})
    make_distribution(site, "fake-two", {"fake_two": plugin}, {"two": "fake_two"})
    registry = load(site)
    errors = [p.error for p in registry.plugins if p.error]
    assert len(errors) == 1
    assert "fake-one" in errors[0] and "fake-two" in errors[0]
    assert ("backend", "twin") in registry.conflicts
    from distcomm._runtime.selection import select_backend

    launch = distcomm.detect_environment(environ={})
    selection = select_backend(registry, launch, "twin", environ={})
    assert isinstance(selection.error, distcomm.BackendUnavailableError)
    assert "fake-one" in str(selection.error) and "fake-two" in str(selection.error)


def test_plugin_may_not_take_a_core_name(site: Path) -> None:
    make_distribution(
        site,
        "fake-thief",
        {"fake_thief": BACKEND_PLUGIN.format(name="fakelink", priority=5)},
        {"thief": "fake_thief"},
    )
    registry = load(site)
    assert registry.distribution_of("fakelink") == "distcomm"
    assert ("backend", "fakelink") not in registry.conflicts
    error = registry.plugins[-1].error or ""
    assert error.startswith(PluginConflictError.__name__)
    assert "'fakelink' is registered by both distcomm and fake-thief" in error


def test_disable_plugins_blocks_by_entry_point_name(site: Path) -> None:
    make_distribution(
        site,
        "fake-good",
        {"fake_good": BACKEND_PLUGIN.format(name="good", priority=5)},
        {"good": "fake_good"},
    )
    registry = load(site, {"DISTCOMM_DISABLE_PLUGINS": "good, fakelink"})
    assert "good" not in registry.backends
    assert next(p for p in registry.plugins if p.name == "good").blocked
    assert "fakelink" in registry.backends, "core cannot be blocked"
    assert any("fakelink" in note for note in registry.notes)
    assert "fake_good" not in sys.modules, "a blocked plugin is never imported"


def test_distcomm_plugins_registers_modules_without_entry_points(site: Path) -> None:
    (site / "fake_loose.py").write_text(
        textwrap.dedent(BACKEND_PLUGIN.format(name="loose", priority=0))
    )
    registry = PluginRegistry.load(
        entry_points=[], environ={"DISTCOMM_PLUGINS": "fake_loose,fake_missing"}
    )
    assert "loose" in registry.backends
    missing = next(p for p in registry.plugins if p.name == "fake_missing")
    assert "ModuleNotFoundError" in (missing.error or "")


def test_plugin_environment_takes_its_place_in_the_order(site: Path) -> None:
    source = """
    import distcomm
    from distcomm.backend import EnvironmentSpec, hookimpl

    def detect(environ):
        if "FAKE_RANK" not in environ:
            return None
        rank = int(environ["FAKE_RANK"])
        return distcomm.LaunchInfo("fake", rank, 2, 0, 1, rank, 2)

    @hookimpl
    def distcomm_register_environments(registry):
        registry.add_environment(EnvironmentSpec("fake", detect, priority=150))
    """
    make_distribution(site, "fake-env", {"fake_env": source}, {"env": "fake_env"})
    registry = load(site)
    specs = sorted(registry.environments.values(), key=lambda s: -s.priority)
    assert [s.name for s in specs] == ["env", "slurm", "mpi", "fake", "single_node"]
    assert specs[3].detect({"FAKE_RANK": "1"}).rank == 1


def test_loading_is_lazy_and_import_is_side_effect_free() -> None:
    code = "import distcomm, distcomm._plugins.loader as r; print(r._registry is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


# -- the really installed example plugin (examples/plugin, installed by the test command) -----


def example_plugin_installed() -> bool:
    try:
        importlib.metadata.distribution("distcomm-example-plugin")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


#: Skipped where the example is not installed; under CI=true, which installs it, a failure
#: (conftest.py).
needs_example = pytest.mark.skipif(
    not example_plugin_installed(),
    reason="examples/plugin is not installed (pip install ./examples/plugin); CI installs it",
)


@needs_example
def test_installed_plugin_is_discovered() -> None:
    registry = PluginRegistry.load(environ={})
    record = next(p for p in registry.plugins if p.distribution == "distcomm-example-plugin")
    assert (record.name, record.error, record.version) == ("example", None, "0.1.0")
    assert registry.distribution_of("loopback") == "distcomm-example-plugin"
    assert "jsm" in registry.environments


@needs_example
def test_installed_plugin_shows_in_info_and_runs() -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "DISTCOMM_"))
    }
    env.update(JSM_NAMESPACE_RANK="0", JSM_NAMESPACE_SIZE="1", DISTCOMM_BACKEND="loopback")
    out = subprocess.run(
        [sys.executable, "-m", "distcomm", "info", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(out.stdout)
    assert info["selected"] == {"backend": "loopback", "method": "jsm"}
    assert {"name": "jsm", "distribution": "distcomm-example-plugin"}.items() <= next(
        e for e in info["environments"] if e["name"] == "jsm"
    ).items()
    code = (
        "import distcomm, numpy as np; c = distcomm.init(); a = np.arange(3.0); "
        "c.send(a, 0, tag=4); "
        "b = np.zeros(3); print(c.backend, c.recv(b, 0, tag=4), b.tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["loopback", "0", "[0.0,", "1.0,", "2.0]"]


@needs_example
def test_installed_plugin_can_be_blocked() -> None:
    registry = PluginRegistry.load(environ={"DISTCOMM_DISABLE_PLUGINS": "example"})
    assert "loopback" not in registry.backends and "jsm" not in registry.environments


@needs_example
def test_installed_plugin_backend_passes_the_conformance_suite() -> None:
    from distcomm.testing.conformance import CHECKS, run_all

    comm = distcomm.init(backend="loopback")
    assert comm.backend == "loopback"
    assert run_all() == list(CHECKS)


# -- check_backend: a name for `distcomm run --backend` and `spawn(backend=)` ----------------
def test_check_backend_knows_registered_and_first_party_names() -> None:
    assert check_backend(" FakeLink ") == "fakelink"
    assert check_backend("linklink") == "linklink"  # first-party: init() says what to install
    with pytest.raises(BackendNotFoundError, match="did you mean 'gloo'"):
        check_backend("glo")
