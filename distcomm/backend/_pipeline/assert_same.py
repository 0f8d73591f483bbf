"""``assert_same``: do the ranks hold the same value? One vote, and a drill-down on a "no".

Each rank digests its value with blake2b: tensors and arrays by dtype, shape and bytes (bit for
bit: ``-0.0`` differs from ``0.0``, equal NaNs agree), mappings key by key (a state_dict, a
config), lists and tuples item by item, sets whatever their order, a module by its state_dict,
anything else by its pickle. The ranks vote with the mismatch check's 16-byte all-reduce of the
digest; only when they disagree do they gather the digest of every key, so that every rank
raises :class:`~distcomm.errors.NotSameError` naming the ranks that differ and the keys.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

from distcomm.backend._pipeline import mismatch_check
from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline.observing import observed
from distcomm.backend._pipeline.steps import Steps
from distcomm.errors import NotSameError

__all__ = ["Sameness", "digests"]

_SHOWN = 10


class Sameness(Steps):
    """assert_same (module docstring)."""

    @observed
    def assert_same(self, x: Any, what: str = "") -> None:
        """Raise on every rank unless every rank passed the same ``x`` (bit for bit).

        ``x`` may be a tensor, an array, a state_dict or any mapping, list or tuple of them, a
        module (its state_dict), or any picklable object. Costs one 16-byte all-reduce when
        the ranks agree; the per-key digests are gathered only when they do not.

        Args:
            x: this rank's value.
            what: a name for messages, e.g. ``"model weights after step 100"``.

        Raises:
            NotSameError: the ranks differ; ``ranks`` lists those that differ from the
                majority, ``keys`` the keys (or item paths) whose values differ.
        """
        self._check_usable()
        leaves = digests(x)
        channel = self._objects("assert_same")
        if channel is None:
            return
        whole = hashlib.blake2b(digest_size=8)
        for path in sorted(leaves):
            whole.update(f"{path}\0".encode() + leaves[path])
        if mismatch_check.agree(channel, int.from_bytes(whole.digest(), "little") >> 2):
            return
        table = objects.all_gather_object(channel, leaves)
        raise _not_same(self, table, what)


def digests(x: Any) -> dict[str, bytes]:
    """The digest of each leaf of ``x``, by path (``""`` for ``x`` itself when it is a leaf)."""
    out: dict[str, bytes] = {}
    _walk(x, "", out)
    return out


def _walk(x: Any, path: str, out: dict[str, bytes]) -> None:
    if isinstance(x, Mapping):
        if not x:
            out[path] = _leaf(type(x).__name__)
        for key, value in x.items():
            _walk(value, f"{path}[{key!r}]", out)
    elif isinstance(x, (list, tuple)):
        out[path + "#len"] = _leaf(f"{type(x).__name__} {len(x)}".encode())
        for index, value in enumerate(x):
            _walk(value, f"{path}[{index}]", out)
    elif callable(getattr(x, "state_dict", None)) and _is_module(x):
        _walk(x.state_dict(), path, out)
    else:
        out[path] = _leaf(x)


def _leaf(x: Any) -> bytes:
    h = hashlib.blake2b(digest_size=8)
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous().reshape(-1)
        h.update(f"tensor {x.dtype} {tuple(x.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
    elif numpy is not None and isinstance(x, numpy.ndarray) and x.dtype != object:
        h.update(f"array {x.dtype.str} {x.shape}|".encode())
        h.update(numpy.ascontiguousarray(x).reshape(-1).view(numpy.uint8))
    elif isinstance(x, (set, frozenset)):
        h.update(type(x).__name__.encode())
        for item in sorted(_leaf(item) for item in x):
            h.update(item)
    elif isinstance(x, bytes):
        h.update(b"bytes|" + x)
    else:
        h.update(pickle.dumps(x, protocol=4))
    return h.digest()


def _is_module(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.nn.Module)


def _not_same(comm: Steps, table: list[dict[str, bytes]], what: str) -> NotSameError:
    """The error every rank raises: which ranks differ from the majority, and where."""
    wholes = [tuple(sorted(leaves.items())) for leaves in table]
    majority, _ = Counter(wholes).most_common(1)[0]
    reference = wholes.index(majority)
    ranks = [r for r, w in enumerate(wholes) if w != majority]
    paths = sorted(set().union(*table))
    keys = [p for p in paths if len({leaves.get(p) for leaves in table}) > 1]
    keys = list(dict.fromkeys(p.removesuffix("#len") for p in keys))
    label = f" ({what})" if what else ""
    lines = []
    for path in keys[:_SHOWN]:
        odd = [
            r for r, leaves in enumerate(table) if leaves.get(path) != table[reference].get(path)
        ]
        lines.append(f"  {path or '(the value)'}: differs on ranks {odd} from rank {reference}")
    if len(keys) > _SHOWN:
        lines.append(f"  ... and {len(keys) - _SHOWN} more (NotSameError.keys lists them all)")
    agreeing = [r for r, w in enumerate(wholes) if w == majority]
    message = (
        f"assert_same{label} failed at operation #{comm.seq} on {comm.describe()}: ranks "
        f"{ranks} differ from ranks {agreeing}:\n" + "\n".join(lines) + "\nHINT: look for what "
        "makes those ranks diverge (a different seed, data, or an update only some ranks made)."
    )
    return NotSameError(
        message, ranks=ranks, keys=keys, op="assert_same", seq=comm.seq, group=comm.describe()
    )
