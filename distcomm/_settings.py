"""Every ``DISTCOMM_*`` variable a user sets: declared once here, read and validated here.

A :class:`Setting` holds a variable's name, what unset means, the rule its text must follow and
the line the docs show. :func:`read` gives a variable's value from the environment (its unset
value when it is empty); :func:`convert` validates the same value given as a keyword
(``init(debug=...)``), so that a keyword and its variable follow one rule and fail alike; and
:func:`check_all` is how ``init()`` fails on a malformed variable before any communication. The
README's table of variables is :func:`markdown_table` (a test keeps them the same).

The run protocol of ``distcomm run`` and ``distcomm.testing.spawn`` (``DISTCOMM_RUN_ID``, read
by launch detection with the other launchers' job ids, and the variables the launcher writes for
its ranks) stays with the launcher; ``DISTCOMM_RUN_REPORTS``, ``DISTCOMM_RUN_PID`` and
``DISTCOMM_RUN_STDERR`` are read here.
"""

from __future__ import annotations

import datetime
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from distcomm._measures import parse_bytes
from distcomm.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_TIMEOUT",
    "SETTINGS",
    "Setting",
    "check_all",
    "convert",
    "is_object_name",
    "is_set",
    "markdown_table",
    "read",
]

#: Seconds an operation may block when neither ``init(timeout=...)`` nor the variable says.
DEFAULT_TIMEOUT = 1800.0
#: The mismatch check policies (``DISTCOMM_DEBUG``, ``init(debug=...)``).
CHECK_POLICIES = ("sample", "check", "off")
#: How a rank unpickles a peer's objects (``DISTCOMM_OBJECTS``, ``init(objects=...)``).
OBJECT_POLICIES = ("restricted", "pickle")
#: The most bytes an object message may announce unless ``DISTCOMM_MAX_OBJECT_BYTES`` says.
DEFAULT_MAX_OBJECT_BYTES = 8 * 2**30
#: The timeout policies (``DISTCOMM_ON_TIMEOUT``).
ON_TIMEOUT_CHOICES = ("raise", "abort")
#: The levels ``DISTCOMM_LOG_LEVEL`` takes.
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_TORCH_GROUP: dict[str, str | bool] = {
    "auto": "auto",
    "distcomm": "distcomm",
    **dict.fromkeys(_TRUE, True),
    **dict.fromkeys(_FALSE, False),
}


@dataclass(frozen=True)
class Setting:
    """One ``DISTCOMM_*`` variable.

    Attributes:
        name: the variable.
        doc: its line in the README's table (markdown).
        parse: the value of a non-empty text (or of a keyword's value); raises ValueError
            saying what is wrong after ``NAME='text'``: "is not ...; valid: ... HINT: ...".
        unset: the value when the variable is unset or blank.
    """

    name: str
    doc: str
    parse: Callable[[Any], Any]
    unset: Any = None


def _text(value: Any) -> str:
    return str(value).strip()


def _descriptor(value: Any) -> int:
    """A process id or a file descriptor number: a non-negative integer."""
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(
            "must be a non-negative integer (distcomm run sets it for its ranks). HINT: unset "
            "it; distcomm run sets it itself."
        )
    return int(text)


def _names(value: Any) -> tuple[str, ...]:
    """Comma-separated names, in order, without blanks or repeats."""
    return tuple(dict.fromkeys(p.strip() for p in str(value).split(",") if p.strip()))


def _seconds(value: Any) -> float:
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
    else:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(
            "must be a positive number of seconds or a timedelta. HINT: e.g. init(timeout=600) "
            "or DISTCOMM_TIMEOUT=600."
        )
    return seconds


def _choice(choices: tuple[str, ...], what: str, hint: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise ValueError(f"is not {what}; valid: {', '.join(choices)}. HINT: {hint}")
        return str(text)

    return parse


def _on_off(hint: str) -> Callable[[Any], bool]:
    def parse(value: Any) -> bool:
        text = str(value).strip().lower()
        if text not in _TRUE + _FALSE:
            raise ValueError(f"must be 1 or 0. HINT: {hint}")
        return text in _TRUE

    return parse


def _profile(value: Any) -> bool:
    if str(value).strip() not in ("0", "1"):
        raise ValueError(
            "is not valid; valid: 1 (print a communication summary at finalize on rank 0) or "
            "0. HINT: export DISTCOMM_PROFILE=1, or unset it."
        )
    return str(value).strip() == "1"


def _trace(value: Any) -> int:
    if not str(value).strip().isdigit():
        raise ValueError(
            "is not a number of operations; valid: a positive int (the last N collectives of "
            "each rank are kept), or 0. HINT: DISTCOMM_TRACE=2000."
        )
    return int(value)


def _object_names(value: Any) -> frozenset[str]:
    """Comma-separated ``module:Name`` entries (``DISTCOMM_ALLOW_OBJECTS``)."""
    names = _names(value)
    bad = [n for n in names if not is_object_name(n)]
    if bad:
        raise ValueError(
            f"has {', '.join(map(repr, bad))}, which is not module:Name; valid: comma-separated "
            "entries such as my_project.config:MyConfig. HINT: name each class or function by "
            "its module and its name, joined by a colon."
        )
    return frozenset(names)


def is_object_name(text: str) -> bool:
    """Whether ``text`` is ``module:Name`` (dotted identifiers on both sides)."""
    module, colon, name = text.partition(":")
    parts = [*module.split("."), *name.split(".")]
    return bool(colon) and all(p.isidentifier() for p in parts)


def _byte_count(value: Any) -> int:
    size = parse_bytes(str(value))
    if size is None:
        raise ValueError(
            "is not a number of bytes; valid: a positive int, with K, M, G or T for binary "
            "units (8G is 8 GiB). HINT: DISTCOMM_MAX_OBJECT_BYTES=16G allows larger objects."
        )
    return size


def _signal(value: Any) -> signal.Signals:
    name = str(value).strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        found = signal.Signals[name]
    except KeyError:
        found = None
    if found is None or found in _UNCATCHABLE:
        raise ValueError(
            f"names no signal a process can catch; valid: a name such as SIGUSR2 or SIGUSR1 "
            f"(not {', '.join(s.name for s in _UNCATCHABLE)}). HINT: the default SIGUSR2 is "
            "free; SIGUSR1 is Lightning's requeue signal."
        )
    return found


#: Signals no handler can catch.
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def _torch_group(value: Any) -> str | bool:
    text = str(value).strip().lower()
    if text not in _TORCH_GROUP:
        raise ValueError(
            "is not a choice; valid: auto, 1, 0 (also true, false, yes, no, on, off), "
            "distcomm. HINT: 0 keeps distcomm from making torch's default process group beside "
            "a non-torch backend; distcomm runs it over distcomm's communicator."
        )
    return _TORCH_GROUP[text]


def _level(value: Any) -> str:
    if str(value).strip().upper() not in LOG_LEVELS:
        raise ValueError(
            f"is not a logging level; valid: {', '.join(LOG_LEVELS)}. HINT: e.g. "
            "DISTCOMM_LOG_LEVEL=DEBUG."
        )
    return str(value).strip().upper()


_DECLARED = (
    Setting("DISTCOMM_BACKEND", "backend to use when `init()` is given none", _text),
    Setting("DISTCOMM_INIT_METHOD", "launch method to use instead of detection", _text),
    Setting(
        "DISTCOMM_TIMEOUT",
        f"seconds an operation may block (default {DEFAULT_TIMEOUT:g})",
        _seconds,
    ),
    Setting(
        "DISTCOMM_ON_TIMEOUT",
        "`raise` (default) a `DistTimeoutError`, or `abort`: print it and end the job",
        _choice(
            ON_TIMEOUT_CHOICES,
            "a policy",
            "raise (a DistTimeoutError the program can catch) or abort (print the diagnostic "
            "and end the job).",
        ),
        "raise",
    ),
    Setting(
        "DISTCOMM_ABORT_ON_EXCEPTION",
        "`0` keeps a rank dying of an exception from ending an MPI job",
        _on_off(
            "0 keeps a rank that raises from ending the MPI job (the others then wait until "
            "their timeout)."
        ),
        True,
    ),
    Setting(
        "DISTCOMM_DEBUG",
        "the mismatch check: `sample` (default: the first 64 collectives, then every 1024th), "
        "`check` (every one) or `off` ([docs/debugging.md](docs/debugging.md))",
        _choice(
            CHECK_POLICIES,
            "a check policy",
            "'check' checks every collective, 'off' none, 'sample' (the default) the first 64 "
            "and every 1024th after.",
        ),
        "sample",
    ),
    Setting(
        "DISTCOMM_NODE_MEMORY",
        "whether CPU tensors and large objects of a one-node group move through node memory on "
        "engines without shared memory of their own (gloo, zmq): `auto` (default), `off` (the "
        "engine carries everything) or `require` (a group that cannot use it raises; for tests) "
        "([docs/backends.md](docs/backends.md#node-memory))",
        _choice(
            ("auto", "off", "require"),
            "a node-memory policy",
            "'auto' (the default) uses node memory where a group's ranks proved they share this "
            "node; 'off' keeps the engine; 'require' raises where a group cannot use it.",
        ),
        "auto",
    ),
    Setting(
        "DISTCOMM_OBJECTS",
        "how a rank unpickles a peer's objects: `restricted` (default: only the allow-list) or "
        "`pickle` (anything: every rank trusted; [docs/security.md](docs/security.md))",
        _choice(
            OBJECT_POLICIES,
            "a policy",
            "'restricted' (the default) builds only allowed types; 'pickle' builds anything a "
            "peer sends: set it only where every rank is trusted (docs/security.md).",
        ),
        "restricted",
    ),
    Setting(
        "DISTCOMM_ALLOW_OBJECTS",
        "comma-separated `module:Name` classes and functions a peer's objects may use, beside "
        "the default allow-list ([docs/security.md](docs/security.md))",
        _object_names,
        frozenset(),
    ),
    Setting(
        "DISTCOMM_MAX_OBJECT_BYTES",
        "the most bytes an object message may announce (default "
        f"{DEFAULT_MAX_OBJECT_BYTES // 2**30}G; `K`, `M`, `G`, `T` units)",
        _byte_count,
        DEFAULT_MAX_OBJECT_BYTES,
    ),
    Setting(
        "DISTCOMM_DISABLE_PLUGINS", "comma-separated entry-point names not to load", _names, ()
    ),
    Setting(
        "DISTCOMM_PLUGINS",
        "comma-separated modules to load as plugins (no entry point needed)",
        _names,
        (),
    ),
    Setting("DISTCOMM_LOG_LEVEL", "level of the `distcomm` logger (e.g. `DEBUG`)", _level),
    Setting(
        "DISTCOMM_TRACE",
        "`N`: keep each rank's last N collectives in a file kept current (what a rank killed by "
        "SIGKILL leaves), written at exit, on a timeout, on SIGUSR2 and SIGTERM, even inside the "
        "engine (`DISTCOMM_TRACE_DIR`, `DISTCOMM_TRACE_SIGNAL`); `distcomm trace` reads them "
        "([docs/debugging.md](docs/debugging.md#what-each-rank-was-doing-the-flight-recorder))",
        _trace,
        0,
    ),
    Setting(
        "DISTCOMM_TRACE_DIR",
        "the folder of the flight recorder's files (default `distcomm-trace/<job>`: the "
        "launcher's job id, else `<method>-<master port>`, or `<method>-local` without a port)",
        _text,
    ),
    Setting(
        "DISTCOMM_TRACE_SIGNAL",
        "the signal that makes the flight recorder write (default `SIGUSR2`)",
        _signal,
        signal.SIGUSR2,
    ),
    Setting(
        "DISTCOMM_PROFILE",
        "`1`: print a communication summary (calls, time, bandwidth, who waited) at "
        "`finalize()` on rank 0 ([docs/debugging.md](docs/debugging.md))",
        _profile,
        False,
    ),
    Setting(
        "DISTCOMM_TORCH_GROUP",
        "`auto` (default), `1` or `0`: make torch's default process group beside mpi and "
        "other non-torch backends, so DDP, FSDP and Accelerate work under mpirun too; "
        "`distcomm`: make it over distcomm on any backend, so their traffic goes through "
        "distcomm ([docs/interop.md](docs/interop.md))",
        _torch_group,
        "auto",
    ),
    Setting(
        "DISTCOMM_DETACH",
        "`1`: a rank keeps running when its launcher (`distcomm run`, torchrun, srun, mpirun) "
        "dies; by default it ends within a moment ([docs/launch.md](docs/launch.md))",
        _on_off(
            "1 lets a rank outlive its launcher (a service you stop yourself); 0, the default, "
            "ends it when the launcher dies."
        ),
        False,
    ),
    Setting(
        "DISTCOMM_RUN_REPORTS",
        "set by `distcomm run` for its ranks: the folder of their failure reports",
        _text,
    ),
    Setting(
        "DISTCOMM_RUN_PID",
        "set by `distcomm run` for its ranks: its pid (a rank ends when it does)",
        _descriptor,
    ),
    Setting(
        "DISTCOMM_RUN_STDERR",
        "set by `distcomm run` for its ranks: the number of their copy of its stderr",
        _descriptor,
    ),
)
#: Every variable, by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of variable ``name`` in ``environ`` (default ``os.environ``); its unset value
    when it is unset or blank.

    Raises:
        InvalidArgumentError: the text breaks the variable's rule (naming the variable, the
            value, the valid values and a HINT).
    """
    setting = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return setting.unset
    return convert(name, raw, name)


def convert(name: str, value: Any, source: str) -> Any:
    """``value`` by the rule of variable ``name``, given as ``source`` (a keyword, or the
    variable itself), for the message.

    Raises:
        InvalidArgumentError: the value breaks the rule.
    """
    try:
        return SETTINGS[name].parse(value)
    except ValueError as exc:
        raise InvalidArgumentError(f"{source}={value!r} {exc}") from None


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether variable ``name`` is set to something other than blanks."""
    return bool((os.environ if environ is None else environ).get(name, "").strip())


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Read every variable, so that a malformed one fails now (``init()``, before any
    communication) rather than when it is first used.

    Raises:
        InvalidArgumentError: the first malformed variable.
    """
    for name in SETTINGS:
        read(name, environ)


def markdown_table() -> str:
    """The README's table of variables (``| variable | meaning |``), one row per variable a
    user sets (the launcher's own are left out)."""
    rows = [f"| `{s.name}` | {s.doc} |" for s in _DECLARED if not s.doc.startswith("set by")]
    return "\n".join(["| variable | meaning |", "|---|---|", *rows])
