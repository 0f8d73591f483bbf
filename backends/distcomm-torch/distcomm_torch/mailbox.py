"""distcomm's own small messages between the ranks of a torch group, through torch's store.

The mismatch check votes with small messages (the engine's ``control_isend`` and
``control_irecv``, :mod:`distcomm.backend.engine`) that must never meet a collective and must
complete by polling alone. Gloo's point-to-point messages do neither well: their Work only
completes in a blocking ``wait()``, and a ``wait`` that times out leaves the pair broken. So on
gloo and nccl these messages go through the rendezvous store instead: a send sets a key of its
own (the n-th message from one rank to another), a receive polls for it, takes it and deletes
it. A message costs two or three store round trips (about 0.1 ms each on one node); votes are
rare (a barrier, finalize, a new kind of call).
"""

from __future__ import annotations

from distcomm.backend import BaseCommunicator, EngineWork
from distcomm.protocol import Work
from distcomm_torch.progress import StoreProgress

__all__ = ["StoreMailbox"]


class StoreMailbox:
    """The messages of one communicator's members (``prefix`` names it; ``rank``: this member),
    through ``progress``'s store; none once its server is known to be gone."""

    def __init__(self, progress: StoreProgress, prefix: str, rank: int) -> None:
        self._progress, self._store = progress, progress.store
        self._prefix, self._rank = prefix, rank
        self._sent: dict[int, int] = {}
        self._taken: dict[int, int] = {}

    def send(self, comm: BaseCommunicator, payload: bytearray, dst: int) -> Work:
        """Leave ``payload`` for member ``dst`` of ``comm`` (at the Work's first test: the
        store keeps it, and a failure comes out of the Work as the engine's)."""
        n = self._sent[dst] = self._sent.get(dst, 0) + 1
        key, op = self._key(self._rank, dst, n), f"distcomm's message to rank {dst}"
        return EngineWork(comm, _Leaving(self._progress, key, payload), payload, op=op)

    def recv(self, comm: BaseCommunicator, payload: bytearray, src: int) -> Work:
        """The next message from member ``src`` of ``comm``, into ``payload``, once it is in
        the store."""
        n = self._taken[src] = self._taken.get(src, 0) + 1
        key, op = self._key(src, self._rank, n), f"distcomm's message from rank {src}"
        return EngineWork(comm, _Taking(self._progress, key, payload), payload, op=op)

    def _key(self, src: int, dst: int, n: int) -> str:
        return f"{self._prefix}/{src}-{dst}/{n}"


class _Message:
    """A message of ``payload`` under ``key`` in ``progress``'s store: the request of an
    :class:`~distcomm.backend.EngineWork` (its ``test``; the kit polls it)."""

    def __init__(self, progress: StoreProgress, key: str, payload: bytearray) -> None:
        self._progress, self._store = progress, progress.store
        self._key, self._payload = key, payload


class _Leaving(_Message):
    """A send through the store: complete once the key is set."""

    def test(self) -> bool:
        _check_server(self._progress)
        self._store.set(self._key, bytes(self._payload))
        return True


class _Taking(_Message):
    """A receive from the store: complete once the key is there (then taken and deleted)."""

    def test(self) -> bool:
        _check_server(self._progress)
        if not self._store.check([self._key]):
            return False
        data = bytes(self._store.get(self._key))
        self._payload[: len(data)] = data
        self._store.delete_key(self._key)
        return True


def _check_server(progress: StoreProgress) -> None:
    """Refuse to touch a store whose server is known to be gone."""
    if progress.server_gone:
        raise ConnectionError(
            "connection closed: rank 0, whose process serves torch's store, has left the job"
        )
