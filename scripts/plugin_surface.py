"""Count the plugin surface: the names of distcomm's engine contract a backend defines, and the
names of distcomm it calls.

    python scripts/plugin_surface.py examples/distcomm-zmq/distcomm_zmq \
        backends/distcomm-linklink/distcomm_linklink

For each package: the contract's names its classes define (engine methods and attributes, the
requests' ``test``/``block``/``source``/``waiting_for``), the names it imports from distcomm
(type-only imports left out) and the attributes of the communicator it reads (``comm.X``,
``self.comm.X``). Then the whole contract (distcomm.backend.engine) and the union of what the
packages use of distcomm. Issue 43 asks for at most 40.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from distcomm.backend.engine import ATTRIBUTES, OPTIONAL, REQUIRED

#: What a request (the engine's side of an EngineWork) may define.
REQUEST = ("test", "block", "source", "waiting_for")
CONTRACT = frozenset((*REQUIRED, *OPTIONAL, *ATTRIBUTES, *REQUEST))


def _type_only(tree: ast.Module) -> set[int]:
    """The line numbers of imports under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    lines.add(inner.lineno)
    return lines


def surface(package: Path) -> tuple[set[str], set[str], set[str]]:
    """(contract names defined, distcomm names imported, communicator attributes read)."""
    defined: set[str] = set()
    imported: set[str] = set()
    read: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        typing_only = _type_only(tree)
        for node in ast.walk(tree):
            module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
            if module == "distcomm" or module.startswith("distcomm."):
                if node.lineno not in typing_only:  # a name counts once, wherever it is from
                    imported.update(a.name for a in node.names)  # type: ignore[attr-defined]
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names = {item.name}
                    elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names = {t.id for t in targets if isinstance(t, ast.Name)}
                    else:
                        names = set()
                    defined.update(names & CONTRACT)
            elif isinstance(node, ast.Attribute):
                owner = ast.unparse(node.value)
                if owner in ("comm", "self.comm", "self._comm_of"):
                    read.add(node.attr)
    return defined, imported, read


def main(packages: list[str]) -> None:
    used: set[str] = set()
    for name in packages:
        defined, imported, read = surface(Path(name))
        used |= imported | {f"comm.{a}" for a in read}
        total = len(defined) + len(imported) + len(read)
        print(f"{name}: {total} names")
        print(f"  defines ({len(defined)}): {', '.join(sorted(defined))}")
        print(f"  imports ({len(imported)}): {', '.join(sorted(imported))}")
        print(f"  reads of the communicator ({len(read)}): {', '.join(sorted(read))}")
    print(f"the engine contract: {len(CONTRACT)} names ({len(REQUIRED)} required)")
    print(f"what the packages use of distcomm besides it: {len(used)}")


if __name__ == "__main__":
    main(sys.argv[1:])
