"""Point-to-point tags on a backend whose engine does not match messages by them
(``Capabilities.p2p_tags`` False, as NCCL): a non-zero tag is refused, never silently ignored.

fakelink stands in for such an engine: its capabilities are replaced (``p2p_tags=False``),
everything else is real. NCCL itself needs GPUs, and its refusal runs through the same pipeline.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend.specs import Capabilities
from distcomm.errors import InvalidArgumentError
from distcomm.fakelink import communicator as fakelink
from distcomm.testing import run_threads
from distcomm.testing.conformance import run_check
from distcomm.testing.conformance.kit import World, summary


@pytest.fixture
def untagged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """fakelink, told to match no tags (as NCCL): its capabilities say so (those every fakelink
    communicator made meanwhile gets: ``run_threads``' worlds read them when made)."""
    caps = dataclasses.replace(fakelink.CAPABILITIES, p2p_tags=False)
    monkeypatch.setattr(fakelink, "CAPABILITIES", caps)
    yield


def refused_then_tag_zero() -> list[str]:
    """Rank 0 tries a tagged send, rank 1 a tagged receive, each in both forms; then rank 0
    sends [7] with tag 0 and rank 1 receives it (the refused send never left)."""
    said = []
    calls: list[tuple[Callable[..., Any], int]] = (
        [(distcomm.isend, 3), (distcomm.send, 4)]
        if distcomm.get_rank() == 0
        else [(distcomm.irecv, 5), (distcomm.recv, 6)]
    )
    peer = 1 - distcomm.get_rank()
    for fn, tag in calls:
        with pytest.raises(InvalidArgumentError) as caught:
            fn(np.zeros(1, dtype=np.int64), peer, tag=tag)
        said.append(str(caught.value))
    box = np.zeros(1, dtype=np.int64)
    if distcomm.get_rank() == 0:
        distcomm.send(np.array([7]), 1)
    else:
        assert distcomm.recv(box, 0) == 0
    said.append(str(box.tolist()))
    return said


def test_a_nonzero_tag_is_refused_naming_the_tag_the_backend_and_the_fix(untagged: None) -> None:
    sender, receiver = run_threads(refused_then_tag_zero, 2, timeout=30)
    for op, tag, message in [
        ("isend", 3, sender[0]),
        ("isend", 4, sender[1]),  # send is isend, waited for
        ("irecv", 5, receiver[0]),
        ("irecv", 6, receiver[1]),
    ]:
        assert message.startswith(
            f"{op}: tag={tag}, but backend 'fakelink' does not match messages by tag"
        ), message
        assert "HINT: use tag=0 and post the receives in the order of the sends" in message
        assert "(gloo, mpi)" in message
    assert receiver[2] == "[7]", "tag 0 still works, and the refused message was never sent"


@pytest.mark.parametrize(
    "name",
    [
        "send_recv_ring",
        "isend_irecv",
        "tags_received_out_of_order",
        "same_tag_messages_keep_their_order",
        "recv_any_source",
        "wait_with_timeout",
    ],
)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_point_to_point_checks_pass_without_tags(
    untagged: None, name: str, world_size: int
) -> None:
    """The conformance kit branches on p2p_tags: tag 0 everywhere, and the refusal checked."""
    run_threads(run_check, world_size, name, timeout=60)


def test_the_kit_summary_shows_the_flag() -> None:
    world = World("untagged", 2, 0, Capabilities(p2p_tags=False), threads=True)
    text = "\n".join(summary(world, {}))
    assert re.search(r"^p2p_tags +no$", text, re.M), text
