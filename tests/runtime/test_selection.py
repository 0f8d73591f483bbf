"""Tests of distcomm._runtime.selection: which backend a launch gets, and the trace of why."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from distcomm._plugins.loader import PluginRegistry
from distcomm._plugins.names import FIRST_PARTY_BACKENDS
from distcomm._runtime.selection import select_backend
from distcomm.backend.hooks import hookimpl
from distcomm.backend.registry import PluginRecord
from distcomm.backend.specs import KIT_API, BackendSpec
from distcomm.environment import LaunchInfo
from distcomm.errors import BackendNotFoundError, BackendUnavailableError


def env_launch(world_size: int = 2, rank: int = 0) -> LaunchInfo:
    """A torchrun-style launch of ``world_size`` ranks on one node."""
    return LaunchInfo(
        method="env",
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
        sources={"method": "test"},
    )


def single_node_launch() -> LaunchInfo:
    return LaunchInfo(
        method="single_node",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
    )


def unusable_factory(launch: LaunchInfo, **options: Any) -> Any:
    raise AssertionError("selection must never call a factory")


def spec(
    name: str,
    priority: int,
    available: bool | Callable[[LaunchInfo], tuple[bool, str]] = True,
    reason: str | None = None,
) -> BackendSpec:
    """A backend spec whose is_available answers ``available`` (or calls it)."""
    if callable(available):
        is_available = available
    else:
        answer = (available, reason or ("ready" if available else "switched off"))

        def is_available(launch: LaunchInfo) -> tuple[bool, str]:
            return answer

    return BackendSpec(
        name=name,
        factory=unusable_factory,
        is_available=is_available,
        priority=priority,
        kit_api=KIT_API,
    )


class BackendsPlugin:
    """A plugin object registering the given specs through the public hook."""

    def __init__(self, *specs: BackendSpec) -> None:
        self.specs = specs

    @hookimpl
    def distcomm_register_backends(self, registry: PluginRegistry) -> None:
        for s in self.specs:
            registry.add_backend(s)


def make_registry(*specs: BackendSpec) -> PluginRegistry:
    """Core plugins only (no installed entry points), plus ``specs`` from one plugin."""
    registry = PluginRegistry.load(entry_points=[], environ={})
    if specs:
        record = registry.register(BackendsPlugin(*specs), "test-plugin", "distcomm-test-plugin")
        assert record.error is None, record.error
    return registry


def lines_for(trace: list[str], name: str) -> list[str]:
    return [line for line in trace if line.startswith(f"{name}:")]


# -- automatic choice --------------------------------------------------------------------------
def test_world_of_one_with_no_launcher_runs_fakelink() -> None:
    selection = select_backend(make_registry(spec("fast", 50)), single_node_launch(), environ={})
    assert selection.error is None
    assert selection.backend == "fakelink"
    assert selection.spec is not None and selection.spec.name == "fakelink"
    assert any("fakelink: selected" in line and "world of 1" in line for line in selection.trace)
    assert any(line.startswith("fast: available, not chosen") for line in selection.trace)


def test_available_plugin_backend_is_chosen_for_a_launched_world() -> None:
    selection = select_backend(make_registry(spec("fast", 50)), env_launch(2), environ={})
    assert selection.error is None
    assert selection.backend == "fast"
    assert selection.spec is not None and selection.spec.priority == 50
    chosen = [c for c in selection.candidates if c.selected]
    assert [c.name for c in chosen] == ["fast"]
    assert chosen[0].distribution == "distcomm-test-plugin"
    (fast_line,) = lines_for(selection.trace, "fast")
    assert "selected" in fast_line and "priority 50" in fast_line
    (fakelink_line,) = lines_for(selection.trace, "fakelink")
    assert "not available" in fakelink_line and "world_size=2" in fakelink_line


def test_trace_has_a_reason_for_every_first_party_backend_not_installed() -> None:
    selection = select_backend(make_registry(spec("fast", 50)), env_launch(2), environ={})
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        (line,) = lines_for(selection.trace, name)
        assert "not installed" in line and distribution in line
        (candidate,) = [c for c in selection.candidates if c.name == name]
        assert not candidate.available and not candidate.selected
        assert candidate.distribution == distribution
        assert "not installed" in candidate.reason


def test_highest_priority_available_backend_wins() -> None:
    registry = make_registry(
        spec("low", 10),
        spec("high", 60),
        spec("higher-but-off", 90, available=False, reason="no card"),
    )
    selection = select_backend(registry, env_launch(2), environ={})
    assert selection.backend == "high"
    (low_line,) = lines_for(selection.trace, "low")
    assert low_line.startswith("low: available, not chosen") and "priority 10" in low_line
    (off_line,) = lines_for(selection.trace, "higher-but-off")
    assert off_line == "higher-but-off: not available: no card"


def test_priority_zero_is_never_chosen_automatically() -> None:
    registry = make_registry(spec("manual", 0))
    selection = select_backend(registry, env_launch(2), environ={})
    assert selection.backend is None and selection.spec is None
    assert isinstance(selection.error, BackendNotFoundError)
    assert "world of 2" in str(selection.error) and "HINT" in str(selection.error)
    (candidate,) = [c for c in selection.candidates if c.name == "manual"]
    assert candidate.available and not candidate.selected
    assert selection.trace[-1].startswith("no backend selected:")
    # but it runs when asked for
    asked = select_backend(registry, env_launch(2), "manual", environ={})
    assert asked.error is None and asked.backend == "manual"


def test_is_available_that_raises_is_reported_unavailable_with_the_exception() -> None:
    def broken(launch: LaunchInfo) -> tuple[bool, str]:
        raise RuntimeError("driver exploded")

    registry = make_registry(spec("broken", 70, available=broken), spec("fine", 20))
    selection = select_backend(registry, env_launch(2), environ={})
    assert selection.backend == "fine"
    (candidate,) = [c for c in selection.candidates if c.name == "broken"]
    assert not candidate.available
    assert "RuntimeError" in candidate.reason and "driver exploded" in candidate.reason
    (line,) = lines_for(selection.trace, "broken")
    assert "not available" in line and "driver exploded" in line


# -- requested backends ------------------------------------------------------------------------
def test_requested_but_unavailable_is_a_backend_unavailable_error() -> None:
    registry = make_registry(spec("picky", 50, available=False, reason="needs InfiniBand"))
    selection = select_backend(registry, env_launch(2), "picky", environ={})
    assert selection.backend is None
    error = selection.error
    assert isinstance(error, BackendUnavailableError)
    assert error.backend == "picky"
    assert error.reason == "needs InfiniBand"
    assert "'picky'" in str(error) and "needs InfiniBand" in str(error)
    assert selection.trace[0] == "backend 'picky' requested by the backend argument"


def test_requested_fakelink_for_a_launched_world_is_unavailable() -> None:
    selection = select_backend(make_registry(), env_launch(2), "fakelink", environ={})
    assert isinstance(selection.error, BackendUnavailableError)
    assert "world_size=2" in str(selection.error)


def test_requested_through_the_environment_and_case_insensitive() -> None:
    registry = make_registry(spec("fast", 50), spec("other", 80))
    selection = select_backend(registry, env_launch(2), environ={"DISTCOMM_BACKEND": " Fast "})
    assert selection.backend == "fast"
    assert selection.trace[0] == "backend 'Fast' requested by DISTCOMM_BACKEND"
    argument = select_backend(
        registry, env_launch(2), "FAST", environ={"DISTCOMM_BACKEND": "other"}
    )
    assert argument.backend == "fast"


def test_requested_unknown_backend_is_not_found_with_a_suggestion() -> None:
    selection = select_backend(make_registry(spec("fast", 50)), env_launch(2), "fsat", environ={})
    assert isinstance(selection.error, BackendNotFoundError)
    message = str(selection.error)
    assert "'fsat'" in message and "did you mean 'fast'" in message and "HINT" in message
    assert "available: fakelink, fast." in message


# -- adopting a torch default process group ----------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def torch_process_group() -> Iterator[None]:
    """A real gloo default process group of world 1, destroyed afterwards."""
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("torch_process_group")
def test_an_existing_torch_process_group_is_adopted() -> None:
    gloo = spec("gloo", 100)
    selection = select_backend(make_registry(gloo), single_node_launch(), environ={})
    assert selection.error is None
    assert selection.backend == "gloo"
    assert selection.spec is gloo
    assert any(
        "torch default process group exists" in line and "'gloo'" in line
        for line in selection.trace
    )


@pytest.mark.usefixtures("torch_process_group")
def test_adopting_a_torch_group_without_its_backend_says_what_to_install() -> None:
    selection = select_backend(make_registry(), single_node_launch(), environ={})
    assert selection.backend is None
    assert isinstance(selection.error, BackendNotFoundError)
    message = str(selection.error)
    assert "'gloo'" in message and "distcomm-torch" in message and "HINT" in message


def test_without_a_torch_process_group_nothing_is_adopted() -> None:
    selection = select_backend(make_registry(spec("gloo", 100)), single_node_launch(), environ={})
    assert selection.backend == "fakelink"
    assert not any("torch default process group" in line for line in selection.trace)


def test_a_blocked_or_broken_backend_distribution_gets_its_fix_not_an_install_hint() -> None:
    """Installing distcomm-torch again would not help when DISTCOMM_DISABLE_PLUGINS blocks it or
    when it is installed but fails to import: the hint says what would."""
    blocked = make_registry()
    blocked.plugins.append(PluginRecord("torch", "distcomm-torch", "0.1.0", blocked=True))
    broken = make_registry()
    broken.plugins.append(
        PluginRecord("torch", "distcomm-torch", "0.1.0", error="ImportError: libc10.so")
    )
    fixes = {
        "blocked": (blocked, "HINT: take 'torch' out of DISTCOMM_DISABLE_PLUGINS (or unset it)"),
        "broken": (broken, "HINT: fix what importing it raised, or reinstall it (pip install"),
    }
    for what, (registry, fix) in fixes.items():
        asked = select_backend(registry, env_launch(), requested="gloo")
        message = str(asked.error)
        assert isinstance(asked.error, BackendNotFoundError), what
        assert fix in message, (what, message)
        assert what != "blocked" or "pip install" not in message, message
        assert what != "broken" or "failed to load: ImportError: libc10.so" in message, message
        misspelt = str(select_backend(registry, env_launch(), requested="glo").error)
        assert "did you mean 'gloo'?" in misspelt and fix.removeprefix("HINT: ") in misspelt, (
            what,
            misspelt,
        )
        assert "which is not installed" not in misspelt, misspelt
        not_installed = misspelt.split("Not installed: ")[1].split(".")[0]
        assert "distcomm-torch" not in not_installed, (what, misspelt)
        assert "distcomm-mpi" in not_installed, misspelt
