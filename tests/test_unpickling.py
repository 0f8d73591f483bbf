"""A peer's objects cannot run code here (distcomm/_unpickling.py, docs/security.md).

The hostile pickles below each try to create a marker file; the restricted loader refuses every
one before it runs, and none creates the file. Through the object collectives (thread-ranks of
a fakelink world), every receiving rank raises ObjectRefusedError naming the refused global, the
sender and the operation. The processes' version (gloo under ``distcomm run``, mpi under
``mpirun``) is tests/test_hostile_objects.py.
"""

from __future__ import annotations

import collections
import copyreg
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import distcomm
from distcomm import _object_codec, _unpickling
from distcomm.errors import InvalidArgumentError, ObjectRefusedError, RankFailedError
from distcomm.testing import run_threads


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """The file every attack tries to create; the test fails if it exists afterwards."""
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), f"an attack ran: {path} was created"


@pytest.fixture(autouse=True)
def _restricted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default policy, whatever the environment says; the allow-list as distcomm ships it."""
    for name in ("DISTCOMM_OBJECTS", "DISTCOMM_ALLOW_OBJECTS", "DISTCOMM_MAX_OBJECT_BYTES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_unpickling, "_allowed", {})
    monkeypatch.setattr(_unpickling, "_policy", None)
    monkeypatch.setattr(_unpickling, "_limit", None)


class System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> Any:
        return (os.system, (self.command,))


class Popen:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (subprocess.Popen, (["touch", str(self.path)],))


class Eval:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> Any:
        return (eval, (self.code,))


class Nested:
    """An allowed container whose reduce arguments hide a refused global."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> Any:
        return (collections.OrderedDict, ([("k", System(self.command))],))


class Config:
    """A user's class: refused unless allowed."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other.lr == self.lr


def touch(path: Path) -> str:
    return f"touch {path}"


def crafted(marker: Path) -> dict[str, tuple[bytes, str | None]]:
    """Hand-made streams, by name: (the stream, the global refused; None: a broken stream)."""
    cmd = touch(marker).encode()
    return {
        # protocol 0: builtins.getattr(builtins.__import__('os'), 'system')(cmd)
        "getattr chain": (
            b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR(S'"
            + cmd
            + b"'\ntR.",
            "builtins.getattr",
        ),
        "exec": (
            b"cbuiltins\nexec\n(S'import os; os.system(\"" + cmd + b"\")'\ntR.",
            "builtins.exec",
        ),
        "INST": (b"(S'" + cmd + b"'\nios\nsystem\n.", "os.system"),
        "OBJ": (b"(cos\nsystem\nS'" + cmd + b"'\no.", "os.system"),
        # protocol 4: STACK_GLOBAL from memoized strings (MEMOIZE, then BINGET)
        "STACK_GLOBAL from the memo": (
            b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94h\x00h\x01\x93\x8c"
            + bytes([len(cmd)])
            + cmd
            + b"\x85R.",
            "posix.system",
        ),
        "a memo entry never stored": (b"\x80\x04h\x07.", None),
        "a persistent id": (b"\x80\x04\x8c\x01x\x94Q.", None),
        "an unregistered extension code": (b"\x80\x02\x82\xf1.", None),
        "truncated": (pickle.dumps({"a": list(range(50))}, protocol=5)[:-7], None),
        "empty": (b"", None),
    }


def test_every_hostile_stream_is_refused_and_none_runs(marker: Path) -> None:
    for name, (stream, refused) in crafted(marker).items():
        with pytest.raises(pickle.UnpicklingError) as caught:
            _unpickling.loads(stream, sender=3)
        if refused is None:
            assert not isinstance(caught.value, _unpickling.Refused), (name, caught.value)
        else:
            assert isinstance(caught.value, _unpickling.Refused), (name, caught.value)
            assert caught.value.refused == refused, (name, caught.value.refused)
            assert caught.value.sender == 3, name
        assert not marker.exists(), f"{name} ran"


@pytest.mark.parametrize("hostile", ["system", "popen", "eval", "nested"])
def test_hostile_objects_are_refused_by_name(hostile: str, marker: Path) -> None:
    obj = {
        "system": System(touch(marker)),
        "popen": Popen(marker),
        "eval": Eval(f"__import__('os').system({touch(marker)!r})"),
        "nested": Nested(touch(marker)),
    }[hostile]
    want = {
        "system": f"{os.system.__module__}.system",
        "popen": "subprocess.Popen",
        "eval": "builtins.eval",
        "nested": f"{os.system.__module__}.system",
    }[hostile]
    with pytest.raises(_unpickling.Refused) as caught:
        _object_codec.unpack(memoryview(_object_codec.pack(obj)), sender=1)
    assert caught.value.refused == want and caught.value.sender == 1


def test_an_extension_code_is_looked_up_through_the_allow_list(marker: Path) -> None:
    """copyreg's extension registry names a global by a number: it is checked like any."""
    copyreg.add_extension("posix", "system", 0xF2)
    try:
        stream = b"\x80\x02\x82\xf2\x8c" + bytes([len(touch(marker))]) + touch(marker).encode()
        with pytest.raises(_unpickling.Refused) as caught:
            _unpickling.loads(stream + b"\x85R.")
        assert caught.value.refused == "posix.system"
    finally:
        copyreg.remove_extension("posix", "system", 0xF2)


def test_a_tensor_storage_is_read_by_torchs_restricted_loader(marker: Path) -> None:
    """A tensor's storage travels as torch.save bytes: a hostile one is refused by torch's
    weights_only loader, never read with plain pickle."""
    import io

    import torch.storage

    hostile = io.BytesIO()
    torch.save(System(touch(marker)), hostile)

    class Storage:  # what a tensor's storage pickles as, with another torch.save's bytes
        def __reduce__(self) -> Any:
            return (torch.storage._load_from_bytes, (hostile.getvalue(),))

    assert b"_load_from_bytes" in pickle.dumps(torch.ones(2), protocol=5), "torch changed"
    forged = pickle.dumps(Storage(), protocol=5)
    with pytest.raises(_unpickling.Refused) as caught:
        _unpickling.loads(forged, sender=0)
    assert caught.value.refused == f"{os.system.__module__}.system", caught.value


class _NoRestricted:
    """Stands in for the restricted unpickler where a test expects plain pickle only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the restricted unpickler was used")


def test_a_ranks_own_stream_without_a_global_is_read_with_plain_pickle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """loads_own (a rank's own object, read back from its own memory) skips the allow-list's
    cost only for a stream that names no global, which the allow-list accepts too: so a rank
    accepts or refuses its own object exactly as its peers do."""
    plain = {"step": 7, "name": "layer.0", "data": b"x" * 1000, "lr": [0.1, None, (1, 2)]}
    stream = pickle.dumps(plain, protocol=5)
    monkeypatch.setattr(_unpickling, "_Restricted", _NoRestricted)
    assert _unpickling.loads_own(stream) == plain  # the fast path: no restricted unpickler
    assert _unpickling.loads_own(memoryview(bytearray(stream))) == plain  # a view of a slot
    for named in (np.arange(3), Config(1.0)):  # a global in the stream: the allow-list's way
        with pytest.raises(AssertionError, match="restricted unpickler was used"):
            _unpickling.loads_own(pickle.dumps(named, protocol=5))


def test_a_ranks_own_object_named_by_an_extension_code_takes_the_allow_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registered extension code names a global without STACK_GLOBAL: with one registered,
    loads_own leaves plain pickle and refuses what a peer would refuse."""
    copyreg.add_extension(Config.__module__, "Config", 0xF3)
    try:
        stream = pickle.dumps(Config(1.0), protocol=5)
        assert pickle.STACK_GLOBAL not in stream, "the pickler named it another way"
        with pytest.raises(_unpickling.Refused) as caught:
            _unpickling.loads_own(stream, sender=2)
        assert caught.value.refused == f"{Config.__module__}.Config"
        assert caught.value.sender == 2
    finally:
        copyreg.remove_extension(Config.__module__, "Config", 0xF3)


def test_a_size_beyond_the_limit_is_refused_before_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(_unpickling.Refused) as caught:
        _unpickling.check_size(2**60, sender=1)
    assert caught.value.size == 2**60 and caught.value.sender == 1
    assert "DISTCOMM_MAX_OBJECT_BYTES" in str(caught.value)
    monkeypatch.setenv("DISTCOMM_MAX_OBJECT_BYTES", "1K")
    _unpickling.check_size(1024)
    with pytest.raises(_unpickling.Refused):
        _unpickling.check_size(1025)
    # a payload whose table announces 2**60 segments is broken, not a reason to allocate
    table = bytearray(128)
    _object_codec.SIZE.pack_into(table, 0, 2**60)
    with pytest.raises(pickle.UnpicklingError, match="announces 1152921504606846976 segments"):
        _object_codec.unpack(memoryview(table))


def test_the_limit_takes_units_and_rejects_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, value in [("8G", 8 * 2**30), ("512 MiB", 512 * 2**20), ("100", 100), ("2t", 2**41)]:
        monkeypatch.setenv("DISTCOMM_MAX_OBJECT_BYTES", text)
        assert _unpickling.max_bytes() == value, text
    monkeypatch.setenv("DISTCOMM_MAX_OBJECT_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match=r"DISTCOMM_MAX_OBJECT_BYTES='lots'.*HINT"):
        _unpickling.max_bytes()


def test_a_users_class_passes_once_allowed_by_class_by_name_or_by_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = pickle.dumps(Config(0.5), protocol=5)
    with pytest.raises(_unpickling.Refused, match=r"test_unpickling\.Config"):
        _unpickling.loads(stream)
    monkeypatch.setenv("DISTCOMM_ALLOW_OBJECTS", f"{__name__}:Config")
    assert _unpickling.loads(stream) == Config(0.5)
    monkeypatch.delenv("DISTCOMM_ALLOW_OBJECTS")
    distcomm.allow_objects(f"{__name__}:Config")
    assert _unpickling.loads(stream) == Config(0.5)
    monkeypatch.setattr(_unpickling, "_allowed", {})
    distcomm.allow_objects(Config)
    assert _unpickling.loads(stream) == Config(0.5)
    assert f"{__name__}:Config" in _unpickling.allowed_names()


@pytest.mark.parametrize("bad", ["Config", "a b:C", ":x", 42, lambda: 0])
def test_allow_objects_names_a_bad_argument(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"allow_objects: .* HINT: pass the class"):
        distcomm.allow_objects(bad)


def test_a_bad_allow_variable_fails_init_with_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_ALLOW_OBJECTS", "good.module:Name,notaname")
    with pytest.raises(InvalidArgumentError, match=r"'notaname', which is not module:Name"):
        distcomm.init()


def test_the_opt_out_restores_plain_pickle_and_is_the_only_other_way(
    monkeypatch: pytest.MonkeyPatch, marker: Path
) -> None:
    stream = pickle.dumps(Config(2.0), protocol=5)
    for policy in ("restricted", " Restricted "):
        monkeypatch.setenv("DISTCOMM_OBJECTS", policy)
        with pytest.raises(_unpickling.Refused):
            _unpickling.loads(stream)
    monkeypatch.setenv("DISTCOMM_OBJECTS", "pickle")
    assert _unpickling.loads(stream) == Config(2.0)
    monkeypatch.setenv("DISTCOMM_OBJECTS", "trusting")
    with pytest.raises(
        InvalidArgumentError, match=r"DISTCOMM_OBJECTS='trusting' .*restricted, pickle"
    ):
        _unpickling.loads(stream)


def test_init_objects_keyword_sets_the_policy_until_finalize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = pickle.dumps(Config(1.0), protocol=5)
    distcomm.init(objects="pickle")
    try:
        assert _unpickling.loads(stream) == Config(1.0)
    finally:
        distcomm.finalize()
    with pytest.raises(_unpickling.Refused):
        _unpickling.loads(stream)
    with pytest.raises(InvalidArgumentError, match=r"objects='yes' is not a policy"):
        distcomm.init(objects="yes")


# -- through the collectives: every receiving rank raises, naming what, who and where --------
def _gather_with_a_hostile_rank(command: str) -> Any:
    mine = System(command) if distcomm.get_rank() == 1 else "fine"
    try:
        distcomm.all_gather_object(mine)
    except ObjectRefusedError as exc:
        return [exc.refused, exc.sender, exc.op, exc.seq, str(exc)]
    return "returned"


def test_all_gather_object_refuses_on_every_rank_naming_sender_and_operation(
    marker: Path,
) -> None:
    results = run_threads(_gather_with_a_hostile_rank, 3, touch(marker), timeout=60)
    system = f"{os.system.__module__}.system"
    for rank, (refused, sender, op, seq, text) in enumerate(results):
        assert (refused, sender, op) == (system, 1, "all_gather_object"), (rank, text)
        assert seq and f"(operation #{seq})" in text, text
        assert f"refused rank 1's object: it names {system}" in text and "HINT" in text, text


def _broadcast_from(src: int, command: str) -> Any:
    obj = System(command) if distcomm.get_rank() == src else None
    try:
        distcomm.broadcast_object(obj, src=src)
        result: Any = "returned"
    except ObjectRefusedError as exc:
        result = [exc.sender, exc.op]
    distcomm.barrier()  # the communicator is still usable
    return result


def test_broadcast_object_refuses_on_the_receivers_and_the_sender_carries_on(
    marker: Path,
) -> None:
    results = run_threads(_broadcast_from, 3, 0, touch(marker), timeout=60)
    assert results[0] == "returned", results  # rank 0 unpickles nothing it sent
    assert results[1:] == [[0, "broadcast_object"]] * 2, results


def _own_refused(op: str) -> Any:
    """Each rank's own object names a class off the allow-list: the rank that reads its own
    copy back (gather's dst, scatter's src) refuses it as its peers would."""
    rank = distcomm.get_rank()
    try:
        if op == "gather_object":
            got = distcomm.gather_object(Config(float(rank)), dst=0)
        else:
            objs = [Config(0.0), "fine"] if rank == 0 else None
            got = distcomm.scatter_object(objs, src=0)
    except ObjectRefusedError as exc:
        return [exc.refused, exc.sender, exc.op]
    return got


@pytest.mark.parametrize("op", ["gather_object", "scatter_object"])
def test_a_rank_refuses_its_own_object_as_its_peers_do(op: str) -> None:
    results = run_threads(_own_refused, 2, op, timeout=60)
    config = f"{Config.__module__}.Config"
    assert results[0] == [config, 0, op], results  # rank 0 refuses its own object
    assert results[1] == (None if op == "gather_object" else "fine"), results


def _big_broadcast() -> Any:
    obj = np.zeros(300_000) if distcomm.get_rank() == 0 else None
    try:
        distcomm.broadcast_object(obj, src=0)
    except ObjectRefusedError as exc:
        return [exc.size is not None and exc.size > 2**20, exc.sender, str(exc)]
    return "returned"


def test_an_object_over_the_limit_is_refused_by_every_rank_nobody_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTCOMM_MAX_OBJECT_BYTES", "1M")
    results = run_threads(_big_broadcast, 2, timeout=60)
    for over, sender, text in results:
        assert over and sender == 0, text
        assert "more than DISTCOMM_MAX_OBJECT_BYTES (1048576)" in text and "HINT" in text, text


def _recv_big() -> Any:
    if distcomm.get_rank() == 0:
        try:
            distcomm.send_object(np.zeros(300_000), 1)
        except ObjectRefusedError as exc:
            return ["sender", exc.op, exc.sender]
        return "sent"
    try:
        distcomm.recv_object(0)
    except ObjectRefusedError as exc:
        return ["receiver", exc.op, exc.sender]
    return "received"


def test_a_message_over_the_limit_fails_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_MAX_OBJECT_BYTES", "1M")
    results = run_threads(_recv_big, 2, timeout=60)
    assert results == [["sender", "send_object", 0], ["receiver", "recv_object", 0]], results


def test_a_refusal_uncaught_fails_the_run_with_the_error() -> None:
    with pytest.raises(RankFailedError, match="ObjectRefusedError"):
        run_threads(lambda: distcomm.all_gather_object(Config(1.0)), 2, timeout=60)


# -- what is allowed round-trips exactly ------------------------------------------------------
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.complex_numbers(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
_ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.int64, np.uint8, np.bool_, np.complex64]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
)
_VALUES = st.recursive(
    _SCALARS | _ARRAYS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.frozensets(st.integers(), max_size=4)
    ),
    max_leaves=20,
)


def _same(got: Any, want: Any) -> bool:
    if type(got) is not type(want):
        return False
    if isinstance(want, np.ndarray):  # bit for bit (NaN too)
        return (
            got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        )
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(want, (float, complex)) and want != want:  # NaN
        return got != got
    return bool(got == want)


@settings(max_examples=150, deadline=None)
@given(_VALUES)
def test_allowed_payloads_round_trip_exactly(value: Any) -> None:
    assert _same(_object_codec.unpack(memoryview(_object_codec.pack(value))), value)


def test_allowed_torch_objects_round_trip() -> None:
    value = {
        "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "p": torch.nn.Parameter(torch.ones(2)),
        "meta": [torch.int8, torch.device("cpu"), torch.Size([3, 4])],
        "scalars": [np.float16(1.5), np.int32(-3), np.dtype(">i4")],
        "od": collections.OrderedDict(a=1),
        "misc": [range(3, 9, 2), slice(None, 4), bytearray(b"x" * 2000)],
    }
    got = _object_codec.unpack(memoryview(_object_codec.pack(value)))
    assert torch.equal(got["t"], value["t"]) and got["t"].dtype == torch.bfloat16
    assert type(got["p"]) is torch.nn.Parameter and torch.equal(got["p"], value["p"])
    assert got["meta"] == value["meta"] and got["od"] == value["od"]
    assert got["scalars"] == value["scalars"] and got["misc"] == value["misc"]
