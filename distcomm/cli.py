"""The ``distcomm`` command (also ``python -m distcomm``).

``distcomm info [--explain] [--json]`` shows the detected launch, the backend distcomm would choose
and why, every backend with its availability, and every plugin with its load error, without
initialising anything.

``distcomm run -n N [--backend B] [--grace SECONDS] [--] script.py args`` (or ``-m module args``)
starts N ranks on this node; the process management lives in :mod:`distcomm._processes.supervisor`.

``distcomm bench [--ops ...] [--sizes ...] [--compare raw] [--json F] [--plot F.png]`` is one rank
of a benchmark: start it under a launcher (``distcomm run -n 2 -m distcomm bench``, ``mpirun -n 2
distcomm bench``, srun, torchrun); it lives in :mod:`distcomm._bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distcomm._plugins.loader import PluginRegistry
    from distcomm._runtime.selection import Candidate

__all__ = ["collect_info", "main"]


def collect_info() -> dict[str, Any]:
    """What ``distcomm info --json`` prints (see docs/cli.md for the shape).

    Raises:
        DistcommError: the plugins could not be loaded (e.g. a bad DISTCOMM_LOG_LEVEL).
    """
    from distcomm import __version__
    from distcomm._plugins.loader import get_registry
    from distcomm._runtime.detection import detect_environment
    from distcomm._runtime.selection import select_backend
    from distcomm.errors import DistcommError

    registry = get_registry()
    info: dict[str, Any] = {
        "version": __version__,
        "launch": None,
        "selected": {"backend": None, "method": None},
    }
    trace: list[str] = []
    try:
        launch = detect_environment()
    except DistcommError as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        trace.append(f"launch detection failed: {exc}")
        candidates = []
    else:
        info["launch"] = launch.as_dict()
        info["selected"]["method"] = launch.method
        trace.append(f"method {launch.method}: {launch.sources.get('method', 'chosen')}")
        selection = select_backend(registry, launch)
        trace += selection.trace
        info["selected"]["backend"] = selection.backend
        if selection.error is not None:
            info["error"] = f"{type(selection.error).__name__}: {selection.error}"
        candidates = selection.candidates
    info["objects"] = _objects_row()
    info["backends"] = _backend_rows(candidates)
    info["environments"] = _environment_rows(registry)
    info["plugins"] = _plugin_rows(registry)
    info["trace"] = trace + registry.notes
    return info


def _objects_row() -> dict[str, Any]:
    """How this process would unpickle a peer's objects (docs/security.md)."""
    from distcomm import _unpickling
    from distcomm.errors import InvalidArgumentError

    try:
        return {
            "policy": _unpickling.policy(),
            "allowed": _unpickling.allowed_names(),
            "max_bytes": _unpickling.max_bytes(),
        }
    except InvalidArgumentError as exc:  # a malformed DISTCOMM_OBJECTS, ...: init would fail
        return {"error": str(exc)}


def _backend_rows(candidates: list[Candidate]) -> list[dict[str, Any]]:
    """The backends of ``distcomm info --json``: the selected one first, then by priority."""
    return [
        {
            "name": c.name,
            "distribution": c.distribution,
            "available": c.available,
            "reason": c.reason,
            "selected": c.selected,
            "priority": c.priority,
            "description": c.description,
        }
        for c in sorted(candidates, key=lambda c: (not c.selected, -c.priority, c.name))
    ]


def _environment_rows(registry: PluginRegistry) -> list[dict[str, Any]]:
    """The launch environments of ``distcomm info --json``, by priority, with their owners."""
    owners = {name: p.distribution for p in registry.plugins for name in p.environments}
    return [
        {"name": name, "distribution": owners.get(name, "?"), "priority": spec.priority}
        for name, spec in sorted(registry.environments.items(), key=lambda kv: -kv[1].priority)
    ]


def _plugin_rows(registry: PluginRegistry) -> list[dict[str, Any]]:
    """The plugins of ``distcomm info --json``, as the registry lists them, with their errors."""
    return [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "error": p.error,
            "blocked": p.blocked,
        }
        for p in registry.plugins
    ]


def _print_text(info: dict[str, Any], explain: bool) -> None:
    from distcomm._measures import human_bytes

    out = sys.stdout
    out.write(f"distcomm {info['version']}\n")
    launch = info["launch"]
    if launch:
        out.write(
            f"launch:    {launch['method']}: rank {launch['rank']} of {launch['world_size']} "
            f"(local {launch['local_rank']} of {launch['local_world_size']}, node "
            f"{launch['node_rank']} of {launch['num_nodes']}), master "
            f"{launch['master_addr'] or '-'}:{launch['master_port'] or '-'}, "
            f"job {launch['job_id'] or '-'}"
            + (f", restart {launch['restart_count']}" if launch.get("restart_count") else "")
            + "\n"
        )
    selected = info["selected"]
    out.write(
        f"selected:  backend {selected['backend'] or '(none)'}, "
        f"method {selected['method'] or '(none)'}\n"
    )
    if "error" in info:
        out.write(f"error:     {info['error']}\n")
    objects = info["objects"]
    if "error" in objects:
        out.write(f"objects:   error: {objects['error']}\n")
    elif objects["policy"] == "pickle":
        policy = "pickle (any object a peer sends is built: every rank trusted)"
    else:
        extra = ", ".join(objects["allowed"])
        policy = "restricted (the allow-list" + (f" and {extra}" if extra else "") + ")"
    if "error" not in objects:
        out.write(f"objects:   {policy}, up to {human_bytes(objects['max_bytes'])} a message\n")
    out.write("backends:\n")
    width = max((len(b["name"]) for b in info["backends"]), default=8)
    dists = max((len(b["distribution"]) for b in info["backends"]), default=8)
    for b in info["backends"]:
        mark = "*" if b["selected"] else " "
        state = "available" if b["available"] else "unavailable"
        name, dist = f"{b['name']:<{width}}", f"{b['distribution']:<{dists}}"
        out.write(f"  {mark} {name}  {dist}  {state}: {b['reason']}\n")
    envs = ", ".join(f"{e['name']} ({e['distribution']})" for e in info["environments"])
    out.write(f"environments: {envs}\n")
    out.write("plugins:\n")
    for p in info["plugins"]:
        status = (
            "blocked by DISTCOMM_DISABLE_PLUGINS"
            if p["blocked"]
            else (f"ERROR {p['error']}" if p["error"] else "ok")
        )
        out.write(f"    {p['name']:<30} {p['distribution']} {p['version'] or ''}: {status}\n")
    if explain:
        out.write("why:\n")
        for line in info["trace"]:
            out.write(f"    {line}\n")
        if launch:
            out.write("where each launch value came from:\n")
            for field, source in launch["sources"].items():
                out.write(f"    {field:<17} {source}\n")


#: ``distcomm run`` options that take a value (``--opt=value`` and ``-n4`` carry their own).
_RUN_VALUE_OPTIONS = ("-n", "--nprocs", "--backend", "--grace", "--log-dir", "--max-restarts")
_RUN_USAGE = """distcomm run -n N [--backend B] [--grace S] [--log-dir DIR] [--max-restarts N]
                    [--] script.py [args]
       distcomm run -n N [options] -m module [args]"""


def _build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog="distcomm", description="distcomm: one communication layer, many engines."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_info_parser(commands)
    run_parser = _add_run_parser(commands)
    _add_bench_parser(commands)
    _add_trace_parser(commands)
    return parser, run_parser


def _add_info_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``distcomm info [--explain] [--json]``."""
    info_parser = commands.add_parser("info", help="show the detected launch, backends and plugins")
    info_parser.add_argument(
        "--explain", action="store_true", help="also say why each backend was (not) chosen"
    )
    info_parser.add_argument("--json", action="store_true", help="print JSON (see docs/cli.md)")


def _add_run_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """``distcomm run``'s options (its command is split off first: :func:`_split_run_argv`)."""
    run_parser = commands.add_parser(
        "run",
        help="run a script as N ranks on this node",
        usage=_RUN_USAGE,
        description="Start N ranks of a script (or module) on this node, with RANK, WORLD_SIZE, "
        "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Output lines are "
        "prefixed [rank N]; the first rank to fail stops the others. Multi-node jobs: use srun, "
        "mpirun or torchrun.",
        epilog="The command: script.py and its arguments, or -m module and its arguments, as "
        "python takes them; everything after it goes to the ranks. See docs/cli.md.",
        allow_abbrev=False,
    )
    run_parser.add_argument(
        "-n", "--nprocs", type=int, required=True, metavar="N", help="the number of ranks"
    )
    run_parser.add_argument("--backend", metavar="B", help="set DISTCOMM_BACKEND=B in the ranks")
    run_parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when stopping ranks (default: 5)",
    )
    run_parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="when a rank fails, stop every rank and start the job again, up to N times "
        "(TORCHELASTIC_RESTART_COUNT, distcomm.restart_count() say which restart; default: 0)",
    )
    run_parser.add_argument(
        "--log-dir",
        metavar="DIR",
        help="also keep each rank's whole output in DIR/rank-N.log (made if missing)",
    )
    return run_parser


def _add_bench_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``distcomm bench``, whose options :mod:`distcomm._bench.options` adds."""
    bench_parser = commands.add_parser(
        "bench",
        help="time the collectives (one rank: start it under a launcher)",
        description="Time distcomm's collectives at many sizes on the selected backend, and with "
        "--compare raw the engine's own calls on the same buffers. Each process is one rank: "
        "distcomm run -n 2 -m distcomm bench, mpirun -n 2 distcomm bench, srun -n 2 distcomm "
        "bench, torchrun --nproc-per-node 2 -m distcomm bench. See docs/bench.md.",
    )
    from distcomm._bench.options import add_arguments

    add_arguments(bench_parser)


def _add_trace_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``distcomm trace [DIR]``."""
    trace_parser = commands.add_parser(
        "trace",
        help="read the flight recorder's dumps of every rank (DISTCOMM_TRACE)",
        description="Read DIR/rank-N.json, written by the flight recorder of each rank "
        "(DISTCOMM_TRACE=N), and say where the ranks diverge, which stopped early, which left "
        "only their black box and which arrive last. A DIR of jobs' folders (./distcomm-trace, "
        "the default) means its newest job. See docs/debugging.md.",
    )
    trace_parser.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        help="the folder of one job's dumps, or of several jobs' folders (the newest is read); "
        "default: DISTCOMM_TRACE_DIR, else ./distcomm-trace",
    )


def _split_run_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``run``'s arguments into its own options and the command (from the script on)."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--" or not arg.startswith("-") or arg.startswith("-m"):
            break
        index += 2 if arg in _RUN_VALUE_OPTIONS else 1
    return list(argv[:index]), list(argv[index:])


def _run(run_parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    from distcomm._plugins.loader import check_backend
    from distcomm._processes.commands import rank_argv
    from distcomm._processes.supervisor import run
    from distcomm.errors import DistcommError

    options, command = _split_run_argv(argv)
    args = run_parser.parse_args(options)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.nprocs < 1:
        run_parser.error(f"-n {args.nprocs} must be at least 1. HINT: e.g. -n 2 for two ranks.")
    if args.max_restarts < 0:
        run_parser.error(
            f"--max-restarts {args.max_restarts} must be at least 0. HINT: e.g. --max-restarts 3."
        )
    if not args.grace >= 0:
        run_parser.error(f"--grace {args.grace} must be >= 0 seconds. HINT: the default is 5.")
    if not command:
        run_parser.error(
            "nothing to run; valid: a script (distcomm run -n 2 train.py) or a module (-m pkg.mod)."
            " HINT: put the script after the options."
        )
    backend = None
    try:
        argv = rank_argv(command, options)
        if args.backend is not None:
            backend = check_backend(args.backend)
    except DistcommError as exc:
        run_parser.error(str(exc))
    try:
        return run(
            argv,
            args.nprocs,
            backend=backend,
            grace=args.grace,
            log_dir=args.log_dir,
            max_restarts=args.max_restarts,
        )
    except DistcommError as exc:  # --log-dir cannot be made or written
        run_parser.error(str(exc))


def _trace(given: str | None) -> int:
    from distcomm import _settings
    from distcomm._traces import TRACES, analyse, job_folder, load

    folder = given or _settings.read("DISTCOMM_TRACE_DIR") or TRACES
    try:
        job, jobs = job_folder(folder)
        dumps, skipped = load(job)
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(
            f"distcomm trace: error: cannot read the dumps in {folder!r}: {exc}. HINT: the ranks "
            "write them when the job runs with DISTCOMM_TRACE=N; give the folder of rank-N.json "
            "files (DISTCOMM_TRACE_DIR, default ./distcomm-trace/<job>), or the folder of such "
            "folders (the newest job is read).\n"
        )
        return 2
    if jobs:
        sys.stdout.write(f"{job}: the newest of {jobs} job{'s' if jobs > 1 else ''} in {folder}\n")
    for line in skipped:
        sys.stderr.write(f"distcomm trace: left out {line}\n")
    for line in analyse(dumps):
        sys.stdout.write(line + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``distcomm`` command; returns the exit status.

    Usage errors exit through argparse (``SystemExit(2)``); ``run`` returns the job's status.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["run"]:
        from distcomm._processes.signals import caught_signals

        with caught_signals():  # from the first step: a Ctrl-C while starting stops the job
            return _run(_build_parser()[1], args_list[1:])
    parser, _ = _build_parser()
    args = parser.parse_args(args_list)
    from distcomm.errors import DistcommError

    if args.command == "trace":
        return _trace(args.dir)
    if args.command == "bench":
        from distcomm._bench.runner import run as bench

        try:
            return bench(args)
        except DistcommError as exc:
            sys.stderr.write(f"distcomm bench: error: {exc}\n")
            return 1

    try:
        info = collect_info()
    except DistcommError as exc:
        sys.stderr.write(f"distcomm: error: {exc}\n")
        return 2
    try:
        if args.json:
            json.dump(info, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_text(info, args.explain)
        sys.stdout.flush()
    except BrokenPipeError:  # `distcomm info | head`: the reader left; that is fine
        sys.stdout = None  # no flush at exit into the closed pipe
    return 1 if "error" in info else 0
