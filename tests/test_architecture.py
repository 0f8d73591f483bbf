"""The layers of the source tree hold (docs/architecture.md draws them).

Read from the source with ``ast``, nothing imported:

- backend and plugin packages import only the public kit (``distcomm``, ``distcomm.backend``,
  ``distcomm.errors``, ``distcomm.protocol``, ``distcomm.testing``); examples may also use the
  public faces (``distcomm.helpers``, ``distcomm.workspace``, ``distcomm.compat``);
- every module of ``distcomm`` is public by name or private (a leading underscore);
- each module imports only from its own layer or the layers below (function-level imports
  included; ``if TYPE_CHECKING:`` imports excluded, they never run);
- no import cycle among the module-level imports.

The size of modules and functions is guidance (docs/architecture.md), not a test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distcomm"

KIT = ("distcomm", "distcomm.backend", "distcomm.errors", "distcomm.protocol", "distcomm.testing")
FACES = ("distcomm.helpers", "distcomm.workspace", "distcomm.compat")
#: The packages whose modules are public by name; everything else has an underscore.
PUBLIC = (
    "distcomm",
    "distcomm.__main__",
    "distcomm.errors",
    "distcomm.protocol",
    "distcomm.meshes",
    "distcomm.backend",
    "distcomm.environment",
    "distcomm.fakelink",
    "distcomm.helpers",
    "distcomm.workspace",
    "distcomm.cli",
    "distcomm.testing",
    "distcomm.compat",
)
#: Layers, lowest first: a module may import its own layer and those below.
LAYERS = (
    (
        "distcomm.errors",
        "distcomm.protocol",
        "distcomm.meshes",
        "distcomm.environment.info",
        "distcomm._logs",
        "distcomm._settings",
        "distcomm._operations",
        "distcomm._object_codec",
        "distcomm._unpickling",
        "distcomm._device_clock",
        "distcomm._divergence",
        "distcomm._call_sites",
        "distcomm._measures",
        "distcomm._files",
        "distcomm._version",
        "distcomm._torch_names",
        "distcomm._traces",
    ),
    ("distcomm.environment",),
    ("distcomm.backend",),
    ("distcomm.fakelink", "distcomm._plugins"),
    ("distcomm._runtime",),
    ("distcomm._processes",),
    (
        "distcomm",
        "distcomm.__main__",
        "distcomm.helpers",
        "distcomm.workspace",
        "distcomm._workspace_codec",
        "distcomm._peer_failures",
        "distcomm._bench",
        "distcomm.cli",
        "distcomm.testing",
        "distcomm.compat",
    ),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def core_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str) -> int:
    """The layer of a distcomm module: that of its longest matching prefix."""
    best, layer = "", -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if under(name, prefix) and len(prefix) > len(best):
                best, layer = prefix, index
    assert layer >= 0, f"{name} is in no layer: add it to LAYERS and docs/architecture.md"
    return layer


def imports(
    path: Path, *, top_level_only: bool = False, typing_too: bool = False
) -> Iterator[tuple[str, int]]:
    """The distcomm modules ``path`` imports, with line numbers; ``if TYPE_CHECKING:`` blocks
    skipped unless ``typing_too`` (they never run, but a module that names an upper layer's
    types in its signatures depends on it all the same).

    ``from distcomm.x import y`` counts as ``distcomm.x.y`` when that is a module, else as
    ``distcomm.x``.
    """
    tree = ast.parse(path.read_text(), str(path))
    modules = core_modules()

    def visit(node: ast.AST, nested: bool) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                typed = child.body + child.orelse if typing_too else child.orelse
                yield from (x for n in typed for x in visit_one(n, nested))
                continue
            yield from visit_one(child, nested)

    def visit_one(child: ast.AST, nested: bool) -> Iterator[tuple[str, int]]:
        if isinstance(child, ast.Import):
            if not (nested and top_level_only):
                for alias in child.names:
                    yield alias.name, child.lineno
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            if not (nested and top_level_only):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    yield (full if full in modules else child.module), child.lineno
        else:
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from visit(child, inner)

    for name, line in visit(tree, False):
        if under(name, "distcomm"):
            yield name, line


def test_backends_and_plugins_import_only_the_public_kit() -> None:
    packages = [p for p in ROOT.glob("backends/*/distcomm_*") if p.is_dir()]
    packages += [p.parent for p in ROOT.glob("examples/*/*/__init__.py")]
    assert len(packages) >= 4, packages  # torch, mpi, linklink and the example plugin at least
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for package in packages
        for path in package.rglob("*.py")
        for name, line in imports(path)
        if not any(under(name, allowed) for allowed in KIT)
    ]
    assert bad == [], "backends and plugins import only the public kit:\n" + "\n".join(bad)


def test_examples_import_only_the_kit_and_the_public_faces() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in ROOT.glob("examples/**/*.py")
        if "build" not in path.parts
        for name, line in imports(path)
        if not any(under(name, allowed) for allowed in KIT + FACES)
    ]
    assert bad == [], "\n".join(bad)


def test_every_module_is_public_by_name_or_private() -> None:
    unplaced = [
        name
        for name in core_modules()
        if not any(part.startswith("_") and part not in ("__main__",) for part in name.split("."))
        and not any(under(name, public) for public in PUBLIC)
    ]
    assert unplaced == [], "give these a leading underscore or list them as public"


@pytest.mark.parametrize("name", sorted(core_modules()))
def test_imports_follow_the_layers(name: str) -> None:
    mine = layer_of(name)
    upward = [
        f"line {line}: {target} (layer {layer_of(target)} > {mine})"
        for target, line in imports(core_modules()[name], typing_too=True)
        if layer_of(target) > mine
    ]
    assert upward == [], f"{name} (layer {mine}) imports upward:\n" + "\n".join(upward)


def test_no_import_cycle_at_run_time() -> None:
    modules = core_modules()
    graph = {
        name: {
            target
            for target, _ in imports(path, top_level_only=True)
            if target in modules and not under(name, target)  # a package's own __init__
        }
        for name, path in modules.items()
    }
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            walk(start, [start])
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checks_see_imports() -> None:
    """The import reader finds what it must (else every check above passes vacuously)."""
    found = dict(imports(PACKAGE / "backend" / "communicator.py"))
    assert "distcomm.backend._pipeline.reductions" in found
    assert layer_of("distcomm._runtime.lifecycle") > layer_of("distcomm.backend.work")
    typed_only = PACKAGE / "backend" / "work.py"  # imports BaseCommunicator for types only
    assert "distcomm.backend.communicator" not in dict(imports(typed_only))


def test_engines_never_subclass_the_communicator_nor_its_work() -> None:
    """The kit makes one communicator class around every engine (kit API 2): its public methods
    are pipelines, the same on every backend, so no backend (first-party, fakelink, the example
    plugins), test or other module subclasses BaseCommunicator; and an engine's Works are the
    kit's (an EngineWork around its request), so only distcomm/backend/work.py subclasses
    BaseWork."""
    import inspect

    from distcomm.backend import BaseCommunicator

    public = {
        name
        for name in dir(BaseCommunicator)
        if not name.startswith("_")
        and inspect.isfunction(inspect.getattr_static(BaseCommunicator, name))
    }
    assert {"all_reduce", "broadcast", "adopt", "finalize"} <= public
    sources = [*ROOT.glob("backends/*/distcomm_*/**/*.py"), *ROOT.glob("examples/*/*/*.py")]
    sources += [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    sources += [*(ROOT / "benchmarks").glob("*.py")]
    kit_works = PACKAGE / "backend" / "work.py"
    subclassed = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}({ast.unparse(base)})"
        for path in sources
        if "build" not in path.relative_to(ROOT).parts
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if ast.unparse(base).rpartition(".")[2] == "BaseCommunicator"
        or (ast.unparse(base).rpartition(".")[2] == "BaseWork" and path != kit_works)
    ]
    assert subclassed == [], (
        "an engine is wrapped, never subclassed: write the engine's methods "
        "(distcomm.backend.engine) and return EngineWork(comm, request):\n" + "\n".join(subclassed)
    )


def test_first_party_engines_define_the_contract_under_its_own_names() -> None:
    """An engine's method under its kit API 1 name (``_all_gather_v``, with no
    ``all_gather_v``) is never called: the kit binds the contract's names (mpi lost its
    Allgatherv, Reduce_scatter and Alltoallv that way in the port). Every first-party engine
    and the examples' define none."""
    from distcomm.backend.engine import OPTIONAL, REQUIRED

    sources = [*ROOT.glob("backends/*/distcomm_*/**/*.py"), *ROOT.glob("examples/*/*/*.py")]
    sources.append(PACKAGE / "fakelink" / "communicator.py")
    contract = {*REQUIRED, *OPTIONAL}
    stale = []
    for path in sources:
        if "build" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Engine"):
                names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                stale += [
                    f"{path.relative_to(ROOT)}: {node.name}.{n}"
                    for n in sorted(names)
                    if n.startswith("_") and n[1:] in contract and n[1:] not in names
                ]
    assert stale == [], "methods under a kit API 1 name, never called:\n" + "\n".join(stale)


def test_the_zmq_example_and_linklink_stay_within_40_names_of_distcomm() -> None:
    """The plugin surface (scripts/plugin_surface.py: the contract's names a backend defines,
    the distcomm names it imports and the communicator attributes it reads) of the zmq example
    and of linklink stays at most 40, all of them the kit's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("surface", ROOT / "scripts" / "plugin_surface.py")
    assert spec is not None and spec.loader is not None
    surface = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(surface)
    import distcomm.backend as kit

    public = set(kit.__all__) | {"claims", "stacks", "monitor", "aborts"}
    public |= set(__import__("distcomm").__all__) | set(
        __import__("distcomm.errors").errors.__all__
    )
    for package in (
        "examples/distcomm-zmq/distcomm_zmq",
        "backends/distcomm-linklink/distcomm_linklink",
    ):
        defined, imported, read = surface.surface(ROOT / package)
        assert len(defined) + len(imported) + len(read) <= 40, (package, defined, imported, read)
        assert imported <= public, f"{package} imports beyond the kit: {imported - public}"


def foreign_private_writes(path: Path) -> Iterator[str]:
    """``line: target`` of each assignment in ``path`` to a private attribute (a leading
    underscore, not a dunder) of an object other than ``self`` or ``cls``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not isinstance(each, ast.Attribute):
                    continue
                owner = each.value
                private = each.attr.startswith("_") and not each.attr.startswith("__")
                if private and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    yield f"{node.lineno}: {ast.unparse(each)}"


def test_state_is_written_by_the_object_that_owns_it() -> None:
    """No module of distcomm or of a backend or plugin assigns another object's private
    attribute (``comm._x = ...``): the object that holds the state changes it, by a method of
    its own (docs/architecture.md). The reader finds such a write where there is one."""
    sources = [*PACKAGE.rglob("*.py")]
    sources += [p for p in ROOT.glob("backends/*/distcomm_*/**/*.py")]
    sources += [p for p in ROOT.glob("examples/*/*/**/*.py") if "build" not in p.parts]
    assert len(sources) > 150, len(sources)  # the reader reads the tree
    bad = [
        f"{path.relative_to(ROOT)}:{write}"
        for path in sources
        for write in foreign_private_writes(path)
    ]
    assert bad == [], "writes to another object's private state:\n" + "\n".join(bad)
    probe = ROOT / "tests" / "test_architecture.py"
    assert list(foreign_private_writes(probe)) == [], "this test's own source has none"


def test_the_write_reader_sees_a_foreign_write(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text("def f(comm, self):\n    comm._event = None\n    self._ok = 1\n")
    assert list(foreign_private_writes(source)) == ["2: comm._event"]
