"""Tests of distcomm.lifecycle: init/finalize, the getters, backend and method choice at init,
timeouts, devices, exported variables, and the dist_init / DistContext / dist_mode doors."""

from __future__ import annotations

import datetime
import os

import pytest

import distcomm
from distcomm.errors import (
    AlreadyInitializedError,
    BackendNotFoundError,
    EnvironmentDetectionError,
    InvalidArgumentError,
    NotInitializedError,
)
from distcomm.lifecycle import DEFAULT_TIMEOUT, resolve_timeout
from distcomm.registry import FIRST_PARTY_BACKENDS, Registry, get_registry


@pytest.fixture
def only_core_backends(core_registry: Registry) -> None:
    """Use a registry of core plugins only, as if no backend distribution were installed."""
    assert set(get_registry().backends) == {"fakelink"}


# -- init / finalize ---------------------------------------------------------------------------
def test_init_on_a_plain_machine_runs_fakelink_world_of_one() -> None:
    assert not distcomm.is_initialized()
    assert distcomm.get_backend() is None
    comm = distcomm.init()
    assert distcomm.is_initialized()
    assert distcomm.get_backend() == "fakelink"
    assert comm.backend == "fakelink"
    assert (comm.rank, comm.world_size) == (0, 1)
    assert distcomm.get_communicator() is comm
    assert not distcomm.is_distributed()
    assert distcomm.is_main_process() and distcomm.is_local_main_process()


def test_init_twice_returns_the_running_communicator() -> None:
    first = distcomm.init()
    assert distcomm.init() is first
    assert distcomm.init(backend="fakelink") is first


def test_init_with_another_backend_while_running_names_both() -> None:
    distcomm.init()
    with pytest.raises(AlreadyInitializedError) as info:
        distcomm.init(backend="gloo")
    message = str(info.value)
    assert "'gloo'" in message and "'fakelink'" in message
    assert "HINT" in message and "finalize()" in message
    assert distcomm.get_backend() == "fakelink"


def test_finalize_then_init_again_gives_a_new_communicator() -> None:
    first = distcomm.init()
    distcomm.finalize()
    assert not distcomm.is_initialized()
    assert distcomm.get_backend() is None
    with pytest.raises(NotInitializedError):
        distcomm.get_communicator()
    second = distcomm.init()
    assert second is not first
    assert distcomm.get_communicator() is second


def test_finalize_when_not_initialised_is_a_no_op() -> None:
    before = dict(os.environ)
    distcomm.finalize()
    distcomm.finalize()
    assert not distcomm.is_initialized()
    assert dict(os.environ) == before


def test_get_communicator_before_init_says_what_to_call() -> None:
    with pytest.raises(NotInitializedError, match=r"distcomm\.init\(\)"):
        distcomm.get_communicator()


def test_backend_name_is_case_insensitive() -> None:
    comm = distcomm.init(backend="FakeLink")
    assert comm.backend == "fakelink"
    assert distcomm.get_backend() == "fakelink"


def test_rank_and_world_size_arguments_for_a_world_of_one() -> None:
    comm = distcomm.init(rank=0, world_size=1)
    assert (comm.rank, comm.world_size) == (0, 1)


def test_rank_without_world_size_on_one_node_is_refused() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init(rank=1)
    assert "world_size" in str(info.value) and "HINT" in str(info.value)
    assert not distcomm.is_initialized()


# -- exported variables ------------------------------------------------------------------------
def test_export_env_sets_absent_variables_and_finalize_removes_exactly_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    distcomm.init()
    assert os.environ["RANK"] == "0"
    assert os.environ["WORLD_SIZE"] == "1"
    assert os.environ["LOCAL_RANK"] == "0"
    assert os.environ["LOCAL_WORLD_SIZE"] == "1"
    assert os.environ["MASTER_ADDR"] == "10.1.2.3"  # present: never overwritten
    assert "MASTER_PORT" not in os.environ  # a world of 1 has no port to export
    distcomm.finalize()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        assert name not in os.environ
    assert os.environ["MASTER_ADDR"] == "10.1.2.3"


def test_export_env_sets_master_addr_when_absent() -> None:
    distcomm.init()
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    distcomm.finalize()
    assert "MASTER_ADDR" not in os.environ


def test_export_env_false_exports_nothing() -> None:
    before = dict(os.environ)
    distcomm.init(export_env=False)
    assert dict(os.environ) == before
    distcomm.finalize()
    assert dict(os.environ) == before


# -- getters and collectives before init -------------------------------------------------------
def test_getters_before_init_answer_from_the_detected_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launch = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    assert distcomm.get_rank() == 3
    assert distcomm.get_world_size() == 4
    assert distcomm.get_local_rank() == 1
    assert distcomm.get_local_world_size() == 2
    assert distcomm.get_node_rank() == 1
    assert distcomm.is_main_process() is False
    assert distcomm.is_local_main_process() is False
    assert not distcomm.is_initialized()
    assert not distcomm.is_distributed()
    assert distcomm.get_backend() is None


def test_getters_before_init_on_a_plain_machine() -> None:
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)
    assert distcomm.get_local_rank() == 0
    assert distcomm.get_local_world_size() == 1
    assert distcomm.get_node_rank() == 0
    assert distcomm.is_main_process() and distcomm.is_local_main_process()
    assert not distcomm.is_initialized()


def test_collectives_before_init_are_identities_in_a_world_of_one() -> None:
    np = pytest.importorskip("numpy")
    values = np.array([1.5, -2.0, 3.0])
    assert distcomm.all_reduce(values) is None
    np.testing.assert_array_equal(values, [1.5, -2.0, 3.0])
    assert distcomm.all_reduce(5) == 5
    assert distcomm.all_reduce(2.5, op="max") == 2.5
    payload = {"a": [1, 2], "b": "text"}
    assert distcomm.broadcast_object(payload) == payload
    assert distcomm.all_gather_object(7) == [7]
    assert not distcomm.is_initialized()


def test_collectives_before_init_refuse_a_larger_launched_world(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    np = pytest.importorskip("numpy")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(NotInitializedError) as info:
        distcomm.all_reduce(np.ones(3))
    assert "distcomm.init()" in str(info.value)
    assert "rank 1 of 2" in str(info.value)
    with pytest.raises(NotInitializedError, match=r"distcomm\.init\(\)"):
        distcomm.broadcast_object({"x": 1})
    with pytest.raises(NotInitializedError):
        distcomm.all_reduce(5)


# -- backend and method resolution -------------------------------------------------------------
def test_unknown_backend_from_environment_lists_available_and_missing(
    monkeypatch: pytest.MonkeyPatch, only_core_backends: None
) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "nope")
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init()
    assert isinstance(info.value, LookupError)
    message = str(info.value)
    assert "'nope'" in message
    available = message.split("available:", 1)[1].split(".", 1)[0]
    assert "fakelink" in available
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        assert name in message and distribution in message
    assert "Not installed" in message
    assert "HINT" in message
    assert not distcomm.is_initialized()


def test_misspelt_backend_gets_a_did_you_mean_and_the_distribution(
    monkeypatch: pytest.MonkeyPatch, only_core_backends: None
) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "ncl")
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init()
    message = str(info.value)
    assert "'ncl'" in message
    assert "did you mean 'nccl'" in message
    assert "distcomm-torch" in message
    assert "HINT" in message


def test_backend_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "nope")
    assert distcomm.init(backend="fakelink").backend == "fakelink"


def test_method_not_matching_the_launch_is_an_environment_error() -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        distcomm.init(method="slurm")
    assert "'slurm'" in str(info.value) and "HINT" in str(info.value)
    assert not distcomm.is_initialized()


def test_unknown_method_from_environment_lists_the_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_INIT_METHOD", "nope")
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init()
    message = str(info.value)
    assert "'nope'" in message and "HINT" in message
    for method in ("env", "slurm", "mpi", "single_node"):
        assert method in message


def test_world_of_two_with_only_core_lists_why_no_backend(
    monkeypatch: pytest.MonkeyPatch, only_core_backends: None
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init()
    message = str(info.value)
    assert "world of 2" in message and "'env'" in message
    assert "fakelink: in-process only" in message
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        assert f"{name}: not installed" in message
        assert distribution in message
    assert "HINT" in message
    assert not distcomm.is_initialized()
    assert "LOCAL_RANK" not in os.environ  # nothing exported by a failed init


# -- timeout -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "seconds"),
    [(5, 5.0), (2.5, 2.5), ("30", 30.0), (datetime.timedelta(minutes=2), 120.0)],
)
def test_resolve_timeout_accepts_seconds_and_timedeltas(given: object, seconds: float) -> None:
    assert resolve_timeout(given) == seconds  # type: ignore[arg-type]


def test_resolve_timeout_default_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_timeout(None) == DEFAULT_TIMEOUT == 1800.0
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "12.5")
    assert resolve_timeout(None) == 12.5
    assert resolve_timeout(3) == 3.0  # an argument wins over the environment


@pytest.mark.parametrize("bad", ["abc", 0, -1, float("inf"), float("nan"), datetime.timedelta(0)])
def test_resolve_timeout_rejects_bad_values(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve_timeout(bad)  # type: ignore[arg-type]
    assert f"timeout={bad!r}" in str(info.value)
    assert "HINT" in str(info.value)


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "inf"])
def test_bad_timeout_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", bad)
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init()
    assert f"DISTCOMM_TIMEOUT={bad!r}" in str(info.value)
    assert "HINT" in str(info.value)


def test_init_timeout_reaches_the_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = distcomm.init(timeout=7)
    assert comm.timeout == 7  # type: ignore[attr-defined]
    distcomm.finalize()
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "12.5")
    assert distcomm.init().timeout == 12.5  # type: ignore[attr-defined]


def test_init_with_a_different_timeout_while_running_is_refused() -> None:
    distcomm.init(timeout=7)
    assert distcomm.init(timeout=datetime.timedelta(seconds=7)) is distcomm.get_communicator()
    with pytest.raises(AlreadyInitializedError, match=r"timeout=8\.0"):
        distcomm.init(timeout=8)


# -- device ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "CUDA:0"])
def test_valid_devices_are_accepted(device: str) -> None:
    assert distcomm.init(device=device).backend == "fakelink"


def test_a_torch_device_is_accepted() -> None:
    torch = pytest.importorskip("torch")
    assert distcomm.init(device=torch.device("cpu")).backend == "fakelink"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:", "cpu:x", 3, ""])
def test_invalid_devices_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init(device=bad)
    message = str(info.value)
    assert f"device={bad!r}" in message
    assert "'cuda:N'" in message and "HINT" in message
    assert not distcomm.is_initialized()


# -- dist_init, DistContext, dist_mode ---------------------------------------------------------
def test_dist_init_returns_rank_and_world_size() -> None:
    assert distcomm.dist_init() == (0, 1)
    assert distcomm.is_initialized()
    distcomm.dist_finalize()
    assert not distcomm.is_initialized()


def test_dist_init_rejects_a_negative_device_id() -> None:
    with pytest.raises(InvalidArgumentError, match=r"device_id=-1"):
        distcomm.dist_init(device_id=-1)
    assert not distcomm.is_initialized()


def test_dist_context_initialises_and_finalizes() -> None:
    with distcomm.DistContext() as ctx:
        assert distcomm.is_initialized()
        assert (ctx.rank, ctx.world_size) == (0, 1)
    assert not distcomm.is_initialized()


def test_dist_context_finalizes_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), distcomm.DistContext():
        assert distcomm.is_initialized()
        raise RuntimeError("boom")
    assert not distcomm.is_initialized()
    assert "RANK" not in os.environ


def test_dist_context_leaves_a_world_it_did_not_initialise() -> None:
    comm = distcomm.init()
    with distcomm.DistContext():
        assert distcomm.get_communicator() is comm
    assert distcomm.is_initialized()
    assert distcomm.get_communicator() is comm


def test_dist_mode_returns_the_value_and_finalizes() -> None:
    @distcomm.dist_mode
    def work(x: int) -> tuple[int, bool]:
        return x * 2, distcomm.is_initialized()

    assert work(21) == (42, True)
    assert not distcomm.is_initialized()
    assert work.__name__ == "work"


def test_dist_mode_finalizes_when_the_function_raises() -> None:
    @distcomm.dist_mode
    def fail() -> None:
        assert distcomm.is_initialized()
        raise KeyError("oops")

    with pytest.raises(KeyError, match="oops"):
        fail()
    assert not distcomm.is_initialized()


# -- review follow-ups -------------------------------------------------------------------------
def test_init_method_variable_applies_before_init_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("DISTCOMM_INIT_METHOD", "single_node")
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)
    assert distcomm.all_reduce(5) == 5, "a world of 1 by the chosen method: an identity"
    distcomm.init()
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)


def test_single_node_honours_master_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29511")
    launch = distcomm.detect_environment()
    assert (launch.master_addr, launch.master_port) == ("10.1.2.3", 29511)
    assert (launch.sources["master_addr"], launch.sources["master_port"]) == (
        "MASTER_ADDR",
        "MASTER_PORT",
    )


def test_fakelink_rejects_unknown_options() -> None:
    with pytest.raises(InvalidArgumentError, match=r"takes no options, got \['bogus'\]"):
        distcomm.init(bogus=1)
    assert not distcomm.is_initialized()


@pytest.mark.usefixtures("only_core_backends")
def test_missing_first_party_backend_says_what_to_install() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init(backend="gloo")
    message = str(info.value)
    assert "backend 'gloo' is provided by distcomm-torch" in message
    assert "HINT: pip install ./backends/distcomm-torch" in message
    assert "available: fakelink" in message
