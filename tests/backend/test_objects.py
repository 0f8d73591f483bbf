"""Tests of the object transport (distcomm.backend._pipeline.object_transport): the pickle-5
payload format and exact reduction of Python numbers."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from distcomm.backend._pipeline.object_transport import INBAND_BYTES, pack, unpack
from distcomm.backend._pipeline.reductions import reduce_numbers
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp

np = pytest.importorskip("numpy")


def round_trip(obj: Any) -> tuple[Any, bytearray]:
    payload = pack(obj)
    assert isinstance(payload, bytearray)
    return unpack(memoryview(payload)), payload


# -- pack / unpack -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "obj",
    [
        None,
        0,
        -(2**70),
        3.5,
        "text ✓",
        b"",
        b"\x00bytes\xff",
        [],
        {},
        {"a": [1, (2, 3.0)], "b": {"c": {None, True}}, 7: b"x"},
        [[[]], ((),), {"deep": [{"er": [1]}]}],
    ],
)
def test_plain_objects_round_trip(obj: Any) -> None:
    result, _ = round_trip(obj)
    assert result == obj
    assert type(result) is type(obj)


def test_bytearray_round_trips_as_a_bytearray() -> None:
    result, _ = round_trip(bytearray(b"abc\x00def"))
    assert isinstance(result, bytearray) and result == bytearray(b"abc\x00def")


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "uint8", "bool", "complex128"])
def test_numpy_arrays_come_back_equal_and_out_of_band(dtype: str) -> None:
    array = (np.arange(2048) % 3).astype(dtype).reshape(8, 16, 16)  # at least INBAND_BYTES
    result, payload = round_trip(array)
    assert result.dtype == array.dtype and result.shape == array.shape
    np.testing.assert_array_equal(result, array)
    # out of band: the array is a view of the received payload, not a copy
    assert not result.flags.owndata
    assert np.shares_memory(result, np.frombuffer(payload, dtype=np.uint8))


def test_small_buffers_travel_in_band_as_copies() -> None:
    """Below INBAND_BYTES a buffer costs less copied into the stream than sent beside it."""
    array = np.arange(INBAND_BYTES // 8 - 1, dtype=np.int64)
    result, payload = round_trip(array)
    np.testing.assert_array_equal(result, array)
    assert not np.shares_memory(result, np.frombuffer(payload, dtype=np.uint8))
    assert len(payload) < 2 * INBAND_BYTES  # one segment: the stream


def test_out_of_band_buffers_are_64_byte_aligned_within_the_payload() -> None:
    payload = pack(
        [np.ones(INBAND_BYTES + 3, dtype=np.int8), np.ones(INBAND_BYTES, dtype=np.float64)]
    )
    result = unpack(memoryview(payload))
    base = np.frombuffer(payload, dtype=np.uint8).ctypes.data
    for array in result:
        assert (array.ctypes.data - base) % 64 == 0


def test_a_second_unpack_does_not_alias_the_first_payload() -> None:
    array = np.arange(10)
    payload = pack(array)
    first = unpack(memoryview(payload))
    second = unpack(memoryview(bytearray(payload)))
    second[0] = 99
    assert first[0] == 0


def test_fortran_ordered_array_round_trips() -> None:
    array = np.arange(12.0).reshape(3, 4).T
    assert array.flags.f_contiguous and not array.flags.c_contiguous
    result, _ = round_trip(array)
    np.testing.assert_array_equal(result, array)


@pytest.mark.parametrize(
    "make",
    [lambda a: a[:, ::2], lambda a: a[::-1], lambda a: a[1:, 1:3].T],
    ids=["strided", "reversed", "sliced-transposed"],
)
def test_non_contiguous_arrays_round_trip(make: Any) -> None:
    array = make(np.arange(30.0).reshape(5, 6))
    assert not array.flags.c_contiguous
    result, _ = round_trip(array)
    np.testing.assert_array_equal(result, array)
    assert result.shape == array.shape


def test_nested_containers_with_arrays() -> None:
    obj = {
        "weights": [np.arange(400.0), np.zeros((20, 20), dtype=np.int32)],  # out of band
        "meta": ("step", 3, {"lr": 0.1}),
        "raw": b"\x01\x02",
    }
    result, payload = round_trip(obj)
    assert result["meta"] == obj["meta"] and result["raw"] == obj["raw"]
    for got, want in zip(result["weights"], obj["weights"], strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
        assert np.shares_memory(got, np.frombuffer(payload, dtype=np.uint8))


def test_a_64_mib_array_round_trips_without_a_copy() -> None:
    array = np.arange(64 * 2**20 // 8, dtype=np.int64)
    payload = pack(array)
    assert array.nbytes <= len(payload) < array.nbytes + 4096
    result = unpack(memoryview(payload))
    assert np.shares_memory(result, np.frombuffer(payload, dtype=np.uint8))
    assert np.array_equal(result, array)


def test_payload_is_a_protocol_5_pickle_stream_plus_buffers() -> None:
    payload = pack(np.arange(300, dtype=np.int64))
    count = int.from_bytes(payload[:8], "little", signed=True)
    assert count == 2  # the pickle stream, then one out-of-band buffer
    lengths = [int.from_bytes(payload[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
    assert lengths[1] == 300 * 8
    stream = bytes(payload[64 : 64 + lengths[0]])
    assert stream[:2] == b"\x80\x05"
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(stream)  # needs its buffers


# -- reduce_numbers ----------------------------------------------------------------------------
BIG = 2**62 + 1


@pytest.mark.parametrize(
    ("op", "values", "expected"),
    [
        (ReduceOp.SUM, [BIG, BIG, 1], 2**63 + 3),
        (ReduceOp.PRODUCT, [BIG, 3], 3 * BIG),
        (ReduceOp.MIN, [BIG, BIG + 1, BIG + 2], BIG),
        (ReduceOp.MAX, [BIG, BIG + 2, BIG + 1], BIG + 2),
        (ReduceOp.BAND, [BIG, 2**62 + 3], 2**62 + 1),
        (ReduceOp.BOR, [BIG, 2], 2**62 + 3),
        (ReduceOp.BXOR, [BIG, BIG, 6], 6),
        (ReduceOp.AVG, [1, 2, 4], 7 / 3),
        (ReduceOp.SUM, [-5, 3], -2),
    ],
)
def test_reduce_ints_exactly(op: ReduceOp, values: list[int], expected: float) -> None:
    result = reduce_numbers(values, op)
    assert result == expected
    if op is not ReduceOp.AVG:
        assert type(result) is int


@pytest.mark.parametrize(
    ("op", "values", "expected"),
    [
        (ReduceOp.SUM, [0.5, 0.25, 2.0], 2.75),
        (ReduceOp.PRODUCT, [0.5, -4.0], -2.0),
        (ReduceOp.MIN, [0.5, -1.5, 3.0], -1.5),
        (ReduceOp.MAX, [0.5, -1.5, 3.0], 3.0),
        (ReduceOp.AVG, [1.0, 2.0], 1.5),
        (ReduceOp.SUM, [1, 0.5], 1.5),
    ],
)
def test_reduce_floats(op: ReduceOp, values: list[float], expected: float) -> None:
    assert reduce_numbers(values, op) == expected


@pytest.mark.parametrize(
    ("op", "values", "expected"),
    [
        (ReduceOp.SUM, [True, False], True),
        (ReduceOp.SUM, [False, False], False),
        (ReduceOp.MAX, [False, True, False], True),
        (ReduceOp.BOR, [False, False, True], True),
        (ReduceOp.PRODUCT, [True, False], False),
        (ReduceOp.PRODUCT, [True, True], True),
        (ReduceOp.MIN, [True, False], False),
        (ReduceOp.BAND, [True, True, True], True),
        (ReduceOp.BAND, [True, False, True], False),
        (ReduceOp.BXOR, [True, True, True], True),
        (ReduceOp.BXOR, [True, True], False),
    ],
)
def test_reduce_bools_follows_the_logical_rules(
    op: ReduceOp, values: list[bool], expected: bool
) -> None:
    result = reduce_numbers(values, op)
    assert result is expected


def test_sum_of_bools_is_not_a_count() -> None:
    assert reduce_numbers([True, True, True], ReduceOp.SUM) is True


def test_avg_of_bools_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="HINT"):
        reduce_numbers([True, False], ReduceOp.AVG)


@pytest.mark.parametrize("op", [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR])
def test_bitwise_ops_on_floats_are_refused(op: ReduceOp) -> None:
    values = [1.5, 2]
    with pytest.raises(InvalidArgumentError) as info:
        reduce_numbers(values, op)
    message = str(info.value)
    assert op.name in message and repr(values) in message and "HINT" in message


# -- the first exchange ------------------------------------------------------------------------
def test_the_slot_shrinks_in_large_worlds() -> None:
    from distcomm.backend._pipeline.object_transport import HEAD, SLOT, slot_bytes

    assert [slot_bytes(n) for n in (1, 2, 32, 33, 64, 1024, 4096)] == [
        SLOT,
        SLOT,
        SLOT,
        1984,
        1024,
        HEAD,
        HEAD,
    ]


def test_objects_in_a_world_whose_slots_are_small() -> None:
    """33 thread-ranks (slots of 1984 bytes): objects that fit, that do not, and a mix."""
    import distcomm
    from distcomm.testing import run_threads

    def body() -> bool:
        rank = distcomm.get_rank()
        ok = distcomm.all_gather_object(rank) == list(range(33))
        mixed = distcomm.all_gather_object("x" * (100 * rank))
        ok = ok and mixed == ["x" * (100 * r) for r in range(33)]
        got = distcomm.gather_object({"r": rank, "pad": b"y" * (90 * rank)}, dst=32)
        if rank == 32:
            ok = ok and got == [{"r": r, "pad": b"y" * (90 * r)} for r in range(33)]
        return ok and distcomm.broadcast_object("z" * 5000 if rank == 3 else None, 3) == "z" * 5000

    assert run_threads(body, 33, timeout=60) == [True] * 33
