"""A backend may call its own helpers and state whatever it likes: the kit keeps its own under
``_kit_`` names, so a plugin that defines ``_rank``, ``_call``, ``_start``, ``_history`` or a Work
with ``_complete`` and ``_done`` passes the whole conformance kit. What would replace the kit's
(a public method such as ``describe``, a ``_kit_`` name) is refused when the class is made, naming
it and what a backend defines."""

from __future__ import annotations

from typing import Any

import pytest

import distcomm
from distcomm.backend import BaseCommunicator, BaseWork
from distcomm.fakelink import communicator as fakelink
from distcomm.testing import run_threads
from distcomm.testing.conformance import CHECKS, run_all

#: Common names a backend author reaches for; each was, before the kit moved its own under
#: ``_kit_``, a name of the kit that this class would have replaced.
HELPERS = ("_call", "_start", "_finish", "_stage", "_count", "_objects", "_begin", "_check_rank")
STATE = ("_rank", "_world_size", "_launch", "_global_ranks", "_pending", "_history", "_debug")


def _helper(name: str) -> Any:
    def helper(self: Any, *args: Any, **kwargs: Any) -> str:
        return f"the plugin's own {name}"

    return helper


class ClashingWork(fakelink._FabricWork):
    """A Work of the plugin with its own ``_complete``, ``_done``, ``_owned``, ``_label``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._done = "the plugin's own"
        self._owned = self._finishers = self._comm = None

    def _complete(self) -> str:
        return "the plugin's own _complete"

    def _label(self) -> str:
        return "the plugin's own _label"


class ClashingCommunicator(fakelink.FakeLinkCommunicator):
    """fakelink, with helpers and state under the names of the kit's old helpers and state."""

    locals().update({name: _helper(name) for name in HELPERS})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in STATE:
            setattr(self, name, f"the plugin's own {name}")


def test_a_plugin_using_the_kits_old_names_passes_the_conformance_kit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Thread-ranks make fakelink communicators and Works by these names: the world, its groups
    # (fakelink's _split) and every blocking collective's Work are then the clashing classes.
    monkeypatch.setattr(fakelink, "FakeLinkCommunicator", ClashingCommunicator)
    monkeypatch.setattr(fakelink, "_FabricWork", ClashingWork)
    monkeypatch.setattr("distcomm.testing.threads.FakeLinkCommunicator", ClashingCommunicator)

    def body() -> tuple[str, list[str]]:
        comm = distcomm.get_communicator()
        return type(comm).__name__, run_all()

    results = run_threads(body, 4, timeout=240)
    assert {kind for kind, _ in results} == {"ClashingCommunicator"}
    assert all(list(ran) == list(CHECKS) for _, ran in results), results[0][1]


@pytest.mark.parametrize(
    ("base", "name", "value"),
    [
        (BaseCommunicator, "describe", lambda self: "mine"),
        (BaseCommunicator, "all_reduce", lambda self, tensor: None),
        (BaseCommunicator, "_kit_call", lambda self: None),
        (BaseWork, "wait", lambda self, timeout=None: True),
        (BaseWork, "_kit_done", True),
    ],
)
def test_a_name_the_kit_owns_is_refused_when_the_class_is_made(
    base: type, name: str, value: Any
) -> None:
    with pytest.raises(TypeError) as refused:
        type("Mine", (base,), {name: value, "__module__": "my_backend"})
    text = str(refused.value)
    assert f"my_backend.Mine defines {name!r}, a name of distcomm's {base.__name__}" in text
    assert "HINT: give it another name" in text and "docs/plugins.md" in text
    assert (
        ("_block, _test, _waiting_for, source" in text)
        if base is BaseWork
        else ("_peer_stacks" in text)
    )


def test_what_a_backend_defines_is_accepted() -> None:
    work = type("MyWork", (BaseWork,), {"_test": lambda self: True, "_helper": None})
    assert work.__name__ == "MyWork"
    for name in ("_peer_stacks", "_all_reduce", "engine_errors", "_rank", "_call"):
        made = type("Mine", (BaseCommunicator,), {name: None, "__module__": "my_backend"})
        assert name in vars(made)
