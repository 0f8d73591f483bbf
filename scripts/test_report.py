"""What scripts/test.sh prints after its stage table: where the run's time and processes went.

    python scripts/test_report.py PROCESSES_LOG JUNIT_XML [JUNIT_XML ...]

- **The slowest test files**: the wall time of each test file (setup, call and teardown of all its
  tests, from pytest's JUnit XML), its number of tests, and the Python processes its tests
  started.
- **The processes**: every start of the test venv's Python is one line of PROCESSES_LOG,
  written by a ``.pth`` hook that scripts/test.sh puts into the venv for the run (see
  :func:`hook_line`); the line names the test that was running (``PYTEST_CURRENT_TEST``, which
  child processes inherit) and the command. Interpreters of other venvs (the wheel job's, a docs
  block's fresh venv) and programs that are not Python (mpirun's hydra, srun, bash) are not
  counted: the count is a floor.
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

#: How many test files the table shows.
SLOWEST = 25


HOOK = """
import atexit, json, os, sys
if not getattr(sys, "_distcomm_test_process", False):
    sys._distcomm_test_process = True

    def _distcomm_log(event, log={log!r}):
        try:
            with open(log, "a") as file:
                file.write(json.dumps(event) + "\\n")
        except OSError:
            pass

    _argv = open("/proc/self/cmdline", "rb").read().decode(errors="replace").split("\\0")
    _distcomm_log(["start", os.getpid(), os.environ.get("PYTEST_CURRENT_TEST", ""), _argv[:6]])

    def _distcomm_end():
        times = os.times()
        _distcomm_log(["end", os.getpid(), times.user + times.system, "torch" in sys.modules])

    atexit.register(_distcomm_end)
"""


def hook(log: str, path: str) -> tuple[str, str]:
    """The hook's code, to write to ``path``, and the line of the ``.pth`` file that runs it at
    each start of the venv's Python while ``path`` exists (a hook left behind by a killed run
    does nothing). The code logs the start (the test running then: ``PYTEST_CURRENT_TEST``,
    which child processes inherit; the command) and, at a normal exit, the CPU seconds the
    process used and whether it imported torch."""
    line = f"import os; os.path.exists({path!r}) and exec(open({path!r}).read(), {{}})"
    return HOOK.format(log=log), line


class Process:
    """One process the run started: its test, command, CPU seconds (None: it did not exit
    normally) and whether it imported torch."""

    def __init__(self, test: str, argv: list[str]) -> None:
        self.test, self.argv = test, argv
        self.cpu: float | None = None
        self.torch = False


def processes(log: Path) -> list[Process]:
    """Each process started, once, with what its exit said."""
    seen: dict[int, Process] = {}
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
                if event[0] == "start":
                    seen.setdefault(event[1], Process(event[2], event[3]))
                elif event[0] == "end" and event[1] in seen:
                    seen[event[1]].cpu, seen[event[1]].torch = event[2], event[3]
            except (ValueError, IndexError, TypeError):
                continue  # a line cut by a process killed while writing
    return list(seen.values())


def test_file(node_id: str) -> str:
    """``tests/x/test_y.py`` of a pytest node id or of PYTEST_CURRENT_TEST's value."""
    return node_id.split("::", 1)[0]


def file_times(xml_files: list[Path]) -> dict[str, tuple[float, int]]:
    """(seconds, number of tests) per test file, from pytest's JUnit XML reports."""
    times: dict[str, float] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    for path in xml_files:
        if not path.exists():
            continue
        for case in ET.parse(path).iter("testcase"):
            module = case.get("classname", "")
            name = _module_path(module)
            times[name] += float(case.get("time") or 0)
            counts[name] += 1
    return {name: (times[name], counts[name]) for name in times}


def _module_path(classname: str) -> str:
    """``tests/x/test_y.py`` from JUnit's ``tests.x.test_y`` (or ``...test_y.TestClass``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if Path(candidate).exists():
            return candidate
    return classname


def report(log: Path, xml_files: list[Path]) -> str:
    started = processes(log)
    count: dict[str, int] = collections.Counter()
    cpu: dict[str, float] = collections.Counter()
    for process in started:
        name = test_file(process.test)
        count[name] += 1
        cpu[name] += process.cpu or 0.0
    times = file_times(xml_files)
    rows = sorted(times.items(), key=lambda item: item[1][0], reverse=True)[:SLOWEST]
    total = sum(seconds for seconds, _ in times.values())
    lines = [
        f"scripts/test.sh: the {SLOWEST} slowest test files (wall time of their tests; the "
        "Python processes they started, and those processes' CPU seconds)"
    ]
    lines.append(f"  {'s':>6}  {'tests':>5}  {'procs':>5}  {'cpu s':>6}  file")
    for name, (seconds, tests) in rows:
        lines.append(
            f"  {seconds:6.1f}  {tests:5d}  {count.get(name, 0):5d}  "
            f"{cpu.get(name, 0.0):6.0f}  {name}"
        )
    in_tests = sum(count[n] for n in times)
    lines.append(
        f"  {total:6.1f}  {sum(c for _, c in times.values()):5d}  {in_tests:5d}  "
        f"{sum(cpu[n] for n in times):6.0f}  all {len(times)} files"
    )
    ended = [p for p in started if p.cpu is not None]
    used = sum(p.cpu or 0.0 for p in ended)
    lines.append(
        f"scripts/test.sh: {len(started)} Python processes of the test venv started "
        f"({len(started) - in_tests} outside a test: the pytest and mpirun stages themselves, the "
        f"wheel job's build); {len(ended)} exited normally, using {used:.0f} "
        f"CPU seconds, {sum(p.torch for p in ended)} of them with torch imported. Counted by a "
        ".pth hook in the venv; not counted: other venvs' interpreters (the wheel job's, docs "
        "blocks' fresh venvs) and programs that are not Python (mpirun's hydra, srun, bash)."
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "--hook":  # --hook LOG CODE_PATH: write the code there, print the .pth line
        code, line = hook(argv[1], argv[2])
        Path(argv[2]).write_text(code)
        print(line)
        return 0
    print(report(Path(argv[0]), [Path(p) for p in argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
