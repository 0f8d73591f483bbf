"""What each rank of ``distcomm run`` runs: the command after the launcher's options, turned into
the argv of a rank (``python script.py args`` or ``python -m module args``, with distcomm's own
interpreter), or refused, before anything starts, with the command the user most likely meant.

- ``-m module`` (also ``-mmodule``) runs a module.
- A Python interpreter first (``python train.py``, ``/path/to/python3 -m pytest``): distcomm
  run starts Python itself, so distcomm's own interpreter (the same path, or a name of it in the
  same folder: a virtual environment's ``python``, ``python3``) is dropped and what follows runs;
  another interpreter is refused (its packages are not distcomm's), saying how to start distcomm
  with it.
- A file runs as a Python script, unless it is a program (an executable binary, or a script
  whose ``#!`` line names no Python): refused, since Python cannot run it.
- A name that is no file: refused; the HINT says ``-m`` when it is a command installed by a
  Python package (``distcomm``, ``pytest``) or an importable module.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence

from distcomm.errors import InvalidArgumentError

__all__ = ["rank_argv"]

#: python, python3, python3.13, python3.13t, pythonw
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?[a-z]?")
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*["']__main__["']""")


def rank_argv(command: Sequence[str], options: Sequence[str]) -> list[str]:
    """The argv of each rank for ``distcomm run [options] [--] command``.

    Args:
        command: what follows the launcher's options (``--`` taken off), not empty.
        options: the launcher's options as given (``-n 2 --backend gloo``), for the HINTs.

    Raises:
        InvalidArgumentError: the command cannot be run as a rank (see the module docstring).
    """
    command = _module_form(command)
    if command[0] == "-m":
        return [sys.executable, *command]
    interpreter = _python_named(command[0])
    if interpreter is not None:
        return _without_interpreter(interpreter, command, options)
    if os.path.isfile(command[0]):
        _check_python_script(command[0], options)
        return [sys.executable, *command]
    raise InvalidArgumentError(_not_found(command, options))


def _module_form(command: Sequence[str]) -> list[str]:
    """``-mpkg.mod args`` and ``-m pkg.mod args`` as ``["-m", "pkg.mod", *args]``."""
    if not command[0].startswith("-m"):
        return list(command)
    module = command[0][2:] or (command[1] if len(command) > 1 else "")
    if not module:
        raise InvalidArgumentError(
            "-m needs a module name. HINT: e.g. distcomm run -n 2 -m pkg.train"
        )
    return ["-m", module, *command[1 if command[0] != "-m" else 2 :]]


def _run_line(options: Sequence[str], command: Sequence[str]) -> str:
    return shlex.join(["distcomm", "run", *options, *command])


def _python_named(name: str) -> str | None:
    """The path of the Python interpreter that ``name`` is (a path, or a name on PATH), if any."""
    if not _PYTHON.fullmatch(os.path.basename(name)):
        return None
    path = name if os.sep in name else shutil.which(name)
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None
    return path


def _is_distcomms_python(path: str) -> bool:
    """Whether ``path`` is the interpreter running distcomm, with the same packages: the same
    file in the same folder (a virtual environment's python3 and python; not the base Python
    that a virtual environment's link ends at)."""
    here = os.path.dirname(os.path.abspath(sys.executable))
    try:
        same = os.path.samefile(path, sys.executable)
    except OSError:
        return False
    return same and os.path.dirname(os.path.abspath(path)) == here


def _without_interpreter(interpreter: str, command: list[str], options: Sequence[str]) -> list[str]:
    rest = command[1:]
    if not _is_distcomms_python(interpreter):
        raise InvalidArgumentError(
            f"{command[0]!r} is a Python interpreter ({interpreter}), not distcomm's "
            f"({sys.executable}); distcomm run starts each rank with its own Python, as "
            f"`python script.py`. HINT: to use distcomm's Python, drop it: "
            f"`{_run_line(options, rest or ['script.py'])}`; to use that Python, start distcomm "
            f"with it (distcomm installed there): "
            f"`{shlex.join([command[0], '-m', 'distcomm', 'run', *options, *rest])}`."
        )
    if not rest:
        raise InvalidArgumentError(
            f"nothing to run after the interpreter {command[0]!r}. HINT: distcomm run starts "
            f"Python itself: `{_run_line(options, ['script.py'])}`."
        )
    if rest[0].startswith("-") and not rest[0].startswith("-m"):
        return [sys.executable, *rest]  # the interpreter's own options (-u, -X dev, -c CODE)
    return rank_argv(rest, options)


def _check_python_script(path: str, options: Sequence[str]) -> None:
    """Refuse a file that Python cannot run: a binary program, or a script of another language."""
    try:
        with open(path, "rb") as file:
            head = file.read(256)
    except OSError:
        return  # Python says why it cannot read it, as for any script
    first_line = head.split(b"\n", 1)[0]
    if head.startswith(b"\x7fELF"):
        kind = "an executable program"
    elif first_line.startswith(b"#!") and b"python" not in first_line:
        kind = f"a script for {first_line[2:].decode(errors='replace').strip()!r}"
    else:
        return
    raise InvalidArgumentError(
        f"{path!r} is {kind}, not a Python script; distcomm run starts each rank as "
        f"`python script.py` (or `python -m module`). HINT: give the Python script it runs, "
        f"`{_run_line(options, ['train.py'])}`; to start other programs as ranks, use mpirun "
        "or srun."
    )


def _not_found(command: list[str], options: Sequence[str]) -> str:
    name = command[0]
    where = f"script {name!r} not found (in {os.getcwd()!r})"
    module = _runnable_module(name)
    on_path = shutil.which(name)
    if module is not None and on_path:
        return (
            f"{where}; {name!r} is the command {on_path}, not a Python script. HINT: to run the "
            f"command `{shlex.join(command)}`, use "
            f"`{_run_line(options, ['-m', module, *command[1:]])}`."
        )
    if module is not None:
        return (
            f"{where}; {name!r} is an importable module. HINT: to run it, use "
            f"`{_run_line(options, ['-m', module, *command[1:]])}`."
        )
    if on_path:
        return (
            f"{where}; {name!r} is the program {on_path}, not a Python script; distcomm run "
            "starts each rank as `python script.py` or `python -m module`. HINT: give the "
            "Python script or module it runs; to start other programs as ranks, use mpirun or srun."
        )
    return f"{where}. HINT: check the path, or use -m module for a module."


def _runnable_module(name: str) -> str | None:
    """The module that ``python -m`` runs for ``name``: a Python package's command (its entry
    point's module, or that module's package, where it has a ``__main__``), or ``name`` itself
    when it is an importable module. Nothing is imported (no side effect, nothing heavy)."""
    dotted = all(part.isidentifier() for part in name.split("."))
    if dotted and _module_file(name, runnable=False) is not None:
        return name
    for entry in importlib.metadata.entry_points(group="console_scripts", name=name):
        top = entry.module.split(".")[0]
        for module in dict.fromkeys([entry.module, top]):
            if _module_file(module, runnable=True) is not None:
                return module
    return None


def _module_file(module: str, runnable: bool) -> str | None:
    """The file ``python -m module`` would run (searched on the rank's path: the working folder
    first), or None; with ``runnable``, only one with a ``__main__`` (module or package)."""
    top, *rest = module.split(".")
    try:  # a rank's path: its working folder first, then what this interpreter finds
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        spec = spec or importlib.util.find_spec(top)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    base = spec.origin
    for part in rest:
        folder = os.path.dirname(base)
        candidates = [os.path.join(folder, part, "__init__.py"), os.path.join(folder, f"{part}.py")]
        base = next((path for path in candidates if os.path.isfile(path)), "")
        if not base:
            return None
    if os.path.basename(base) == "__init__.py":
        main = os.path.join(os.path.dirname(base), "__main__.py")
        return main if os.path.isfile(main) else None
    if not runnable:
        return base
    try:
        with open(base, encoding="utf-8", errors="replace") as file:
            return base if _MAIN_GUARD.search(file.read()) else None
    except OSError:
        return None
