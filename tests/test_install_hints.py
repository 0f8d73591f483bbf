"""Every install hint distcomm prints fits how distcomm was installed: from a checkout, the path
to install (relative to the working directory when inside it); from wheels or an index (no
source tree around the package: :func:`distcomm._plugins.names.checkout` patched to say so,
as the wheel job of scripts/wheels.sh shows for real), distcomm's extra. Tested at each place a
hint is printed: ``distcomm info``'s unavailable reasons, a missing backend in ``init()``,
``init(torch_group=True)`` without the torch backend, ``bench --plot`` without matplotlib, and
the linklink backend's one hint (not installed, its library missing, on the compat module).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import distcomm
from distcomm._plugins import names
from distcomm.errors import BackendNotFoundError, BackendUnavailableError, DistcommError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["checkout", "wheels"])
def installed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How distcomm is installed: from this checkout (run from its root), or from wheels."""
    monkeypatch.chdir(ROOT)
    if request.param == "wheels":
        monkeypatch.setattr(names, "checkout", lambda: None)
    return str(request.param)


def expected(installed: str, distribution: str) -> str:
    if installed == "checkout":
        return f"pip install ./backends/{distribution}"
    return f"pip install 'distcomm[{names.EXTRAS[distribution]}]'"


def test_this_checkout_is_found_and_its_paths_follow_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert names.checkout() == ROOT
    monkeypatch.chdir(ROOT)
    assert names.install_hint("distcomm-mpi") == "pip install ./backends/distcomm-mpi"
    assert names.extra_hint("bench") == "pip install '.[bench]'"
    monkeypatch.chdir(tmp_path)  # outside the checkout: the whole path
    assert names.install_hint("distcomm-mpi") == f"pip install {ROOT}/backends/distcomm-mpi"
    assert names.extra_hint("bench") == f"pip install '{ROOT}[bench]'"


def test_from_wheels_every_first_party_distribution_is_an_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(names, "checkout", lambda: None)
    assert names.install_hint("distcomm-torch") == "pip install 'distcomm[torch]'"
    assert names.install_hint("distcomm-mpi") == "pip install 'distcomm[mpi]'"
    assert names.install_hint("distcomm-linklink") == "pip install 'distcomm[linklink]'"
    assert names.extra_hint("bench") == "pip install 'distcomm[bench]'"
    assert set(names.EXTRAS) == set(names.FIRST_PARTY_BACKENDS.values())


@pytest.mark.usefixtures("core_registry")
def test_info_says_what_to_install(installed: str) -> None:
    from distcomm.cli import collect_info

    reasons = {b["name"]: b["reason"] for b in collect_info()["backends"]}
    for name in ("gloo", "nccl", "mpi", "linklink"):
        dist = names.FIRST_PARTY_BACKENDS[name]
        assert reasons[name] == f"not installed ({expected(installed, dist)})", reasons[name]
    if installed == "wheels":
        assert str(ROOT) not in str(reasons) and "./backends" not in str(reasons)


@pytest.mark.usefixtures("core_registry")
def test_a_missing_backend_in_init_says_what_to_install(installed: str) -> None:
    with pytest.raises(BackendNotFoundError) as caught:
        distcomm.init(backend="mpi")
    assert f"HINT: {expected(installed, 'distcomm-mpi')}" in str(caught.value), caught.value


def test_a_torch_group_without_the_torch_backend_says_what_to_install(installed: str) -> None:
    from distcomm._runtime import torch_group
    from distcomm.backend.registry import Registry
    from distcomm.environment.info import LaunchInfo

    class World:  # a 2-rank world of another backend; nothing is asked of it
        backend, rank, world_size = "standin", 0, 2

    launch = LaunchInfo("env", 0, 2, 0, 2, 0, 1)
    with pytest.raises(BackendUnavailableError) as caught:
        torch_group.make(True, World(), launch, Registry(), 60, None)  # type: ignore[arg-type]
    assert expected(installed, "distcomm-torch") in str(caught.value), caught.value


def test_bench_plot_without_matplotlib_says_what_to_install(
    installed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distcomm._bench.plot import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(DistcommError) as caught:
        require_matplotlib()
    hint = "pip install '.[bench]'" if installed == "checkout" else "pip install 'distcomm[bench]'"
    assert f"HINT: {hint}, or drop --plot" in str(caught.value), caught.value


@pytest.fixture
def linklink_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's registry with distcomm-linklink's plugin (installed here) and no linklink
    library importable."""
    import importlib.metadata

    from distcomm._plugins.loader import PluginRegistry, set_registry

    pytest.importorskip("distcomm_linklink", reason="pip install ./backends/distcomm-linklink")
    for name in ("linklink", "spring", "spring.linklink"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    found = importlib.metadata.entry_points(group="distcomm", name="linklink")
    previous = set_registry(PluginRegistry.load(entry_points=list(found), environ={}))
    try:
        yield
    finally:
        set_registry(previous)


def linklink_hint(installed: str) -> str:
    """The one linklink hint, whole, as it is written (not rebuilt from names.backend_hint)."""
    install = expected(installed, "distcomm-linklink")
    return (
        f"HINT: the linklink backend needs distcomm-linklink ({install})"
        " and SenseTime's linklink library, which is not on PyPI (your cluster's build: `import "
        "linklink` or `import spring.linklink` must work); without them, run linklink code "
        "unchanged on gloo, nccl or mpi with distcomm.compat.linklink (docs/compat.md)"
    )


@pytest.mark.usefixtures("core_registry")
def test_the_linklink_hint_when_distcomm_linklink_is_not_installed(installed: str) -> None:
    """Asked for by name or misspelt: the same hint, library included (installing
    distcomm-linklink alone would not make the backend run)."""
    hint = linklink_hint(installed)
    assert names.backend_hint("linklink") == hint.removeprefix("HINT: ")
    with pytest.raises(BackendNotFoundError) as caught:
        distcomm.init(backend="linklink")
    assert hint in str(caught.value), caught.value
    with pytest.raises(BackendNotFoundError) as caught:
        distcomm.init(backend="linklnk")
    assert "did you mean 'linklink'?" in str(caught.value)
    assert hint.removeprefix("HINT: ") in str(caught.value), caught.value


@pytest.mark.usefixtures("linklink_registry")
def test_the_linklink_hint_when_the_linklink_library_is_missing(installed: str) -> None:
    """distcomm-linklink installed, no linklink to run on: init and info give the same hint."""
    from distcomm.cli import collect_info

    hint = linklink_hint(installed)
    with pytest.raises(BackendUnavailableError) as caught:
        distcomm.init(backend="linklink")
    message = str(caught.value)
    assert "neither `linklink` nor `spring.linklink` can be imported. " + hint in message
    assert message.count("HINT") == 1, message
    reasons = {b["name"]: b["reason"] for b in collect_info()["backends"]}
    assert hint in reasons["linklink"], reasons["linklink"]


@pytest.mark.usefixtures("linklink_registry")
def test_the_linklink_hint_on_the_compat_module(
    installed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``distcomm.compat.linklink.install()`` put in place of linklink: the backend cannot run on
    distcomm itself, and says so with the same hint."""
    from distcomm.compat import linklink

    monkeypatch.setitem(sys.modules, "linklink", linklink)
    with pytest.raises(BackendUnavailableError) as caught:
        distcomm.init(backend="linklink")
    message = str(caught.value)
    assert "`linklink` is distcomm.compat.linklink (install() was called)" in message
    assert linklink_hint(installed) in message and message.count("HINT") == 1, message
