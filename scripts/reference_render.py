"""Markdown for one documented name: the part of scripts/reference.py that reads griffe's objects.

A name becomes an anchor of its full path, a heading, its signature in a ``python`` block
(annotations and defaults as written in the source), the bases of a class, and its Google-style
docstring: the text as Markdown (Sphinx roles as code, ``::`` literal blocks fenced), then
Parameters, Returns, Raises, ... as lists. A class lists its attributes (those its docstring's
Attributes section describes, and its public attribute members) in one list, each with its
anchor, then gives each public method, and each member whose docstring has sections of its own,
an entry one heading level down, in source order. griffe's warnings about a docstring (a
parameter the signature lacks, a section it cannot parse) are errors: :class:`Problems`.
"""

from __future__ import annotations

import logging
import re
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import griffe

#: A signature longer than this is written one parameter a line.
WIDTH = 88
#: Sphinx roles (``:class:`~a.B```) left in docstrings: rendered as code, ``~`` keeping the tail.
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")
TITLES = {
    "parameters": "Parameters",
    "other parameters": "Other parameters",
    "type parameters": "Type parameters",
    "attributes": "Attributes",
    "returns": "Returns",
    "yields": "Yields",
    "receives": "Receives",
    "raises": "Raises",
    "warns": "Warns",
    "functions": "Functions",
    "classes": "Classes",
    "modules": "Modules",
    "type aliases": "Type aliases",
}


class Problems(Exception):
    """What keeps the reference from being written: one message a problem."""

    def __init__(self, messages: Sequence[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = list(messages)


class _Collect(logging.Handler):
    """Keeps what griffe logs at warning level or above, as messages."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def load(root: Path, package: str = "distcomm") -> griffe.Module:
    """``package`` read statically from the folder ``root``, its aliases resolved."""
    loader = griffe.GriffeLoader(search_paths=[str(root)])
    module = loader.load(package)
    loader.resolve_aliases(implicit=False, external=None)
    assert isinstance(module, griffe.Module)
    return module


def sections(obj: griffe.Object) -> list[griffe.DocstringSection]:
    """The Google-style sections of ``obj``'s docstring; a warning of griffe's raises Problems.

    Sphinx roles become code first (``A :class:`Mesh```, read as a named return value, is
    ``A `Mesh```); Returns and Receives are one item each (their lines are one description).
    """
    if obj.docstring is None:
        return []
    docstring = griffe.Docstring(
        _roles(obj.docstring.value),
        lineno=obj.docstring.lineno,
        endlineno=obj.docstring.endlineno,
        parent=obj,
    )
    collect = _Collect()
    logger = logging.getLogger("griffe")
    logger.addHandler(collect)
    try:
        parsed = griffe.parse_google(
            docstring,
            warn_unknown_params=True,
            warn_missing_types=True,
            returns_multiple_items=False,
            receives_multiple_items=False,
        )
    finally:
        logger.removeHandler(collect)
    if collect.messages:
        raise Problems([f"{obj.path}: docstring: {message}" for message in collect.messages])
    return parsed


# Signatures -----------------------------------------------------------------------------------


def _parameter(parameter: griffe.Parameter) -> str:
    """One parameter as written in a ``def``: stars, annotation, default."""
    stars = {"variadic positional": "*", "variadic keyword": "**"}.get(parameter.kind.value, "")
    text = stars + parameter.name
    if parameter.annotation is not None:
        text += f": {parameter.annotation}"
    if parameter.default is not None and not stars:
        equals = " = " if parameter.annotation is not None else "="
        text += f"{equals}{parameter.default}"
    return text


def _parameters(parameters: Sequence[griffe.Parameter]) -> list[str]:
    """The parameters, with the ``/`` and ``*`` markers where their kinds change."""
    kinds = griffe.ParameterKind
    out: list[str] = []
    starred = False
    for index, parameter in enumerate(parameters):
        starred = starred or parameter.kind is kinds.var_positional
        if parameter.kind is kinds.keyword_only and not starred:
            out.append("*")
            starred = True
        out.append(_parameter(parameter))
        after = parameters[index + 1].kind if index + 1 < len(parameters) else None
        if parameter.kind is kinds.positional_only and after is not kinds.positional_only:
            out.append("/")
    return out


def _callable(head: str, parameters: Sequence[griffe.Parameter], returns: str) -> str:
    """``head(parameters)returns`` on one line, or one parameter a line when too long."""
    items = _parameters(parameters)
    line = f"{head}({', '.join(items)}){returns}"
    if len(line) <= WIDTH or not items:
        return line
    return f"{head}(\n" + "".join(f"    {item},\n" for item in items) + f"){returns}"


def _bound(obj: griffe.Object, parameters: Sequence[griffe.Parameter]) -> list[griffe.Parameter]:
    """The parameters a caller passes: a method's (or a class's) ``self`` or ``cls`` left out."""
    params = list(parameters)
    method = obj.is_class or (obj.parent is not None and obj.parent.is_class)
    if method and "staticmethod" not in obj.labels and params[:1]:
        return params[1:] if params[0].name in ("self", "cls") else params
    return params


def _init(obj: griffe.Class) -> griffe.Function | None:
    """A class's ``__init__``, its own or inherited from a base griffe can resolve."""
    try:
        init = obj.all_members.get("__init__")
        init = init.final_target if isinstance(init, griffe.Alias) else init
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        init = obj.members.get("__init__")
    return init if isinstance(init, griffe.Function) else None


def declaration(obj: griffe.Object) -> str:
    """An attribute as ``name: annotation = value`` (an instance attribute without its value)."""
    text = obj.name
    annotation = getattr(obj, "annotation", None)
    if annotation is not None:
        text += f": {annotation}"
    instance_only = "instance-attribute" in obj.labels and "class-attribute" not in obj.labels
    value = getattr(obj, "value", None)
    if value is not None and not instance_only and "property" not in obj.labels:
        text += f" = {value}"
    return text


def signature(obj: griffe.Object) -> str:
    """The python block of ``obj``: ``class C(init's parameters)``, ``f(...) -> R``, or an
    attribute's declaration; ``@classmethod``, ``@staticmethod`` and ``@property`` above."""
    labels = [f"@{label}\n" for label in ("classmethod", "staticmethod", "property")]
    decorators = "".join(d for d in labels if d[1:-1] in obj.labels)
    if isinstance(obj, griffe.Class):
        init = _init(obj)
        if init is None:
            return f"class {obj.name}"
        return _callable(f"class {obj.name}", _bound(obj, init.parameters), "")
    if isinstance(obj, griffe.Function):
        returns = f" -> {obj.returns}" if obj.returns is not None else ""
        return decorators + _callable(obj.name, _bound(obj, obj.parameters), returns)
    return decorators + declaration(obj)


# Docstrings -----------------------------------------------------------------------------------


def _roles(text: str) -> str:
    """Sphinx roles as code: ``:class:`~a.B``` as ```B```, ``:func:`a.f``` as ```a.f```."""
    return ROLE.sub(lambda m: f"`{m[2].rpartition('.')[2] if m[1] else m[2]}`", text)


def plain(text: str) -> str:
    """Docstring text as Markdown: Sphinx roles as code, ``::`` literal blocks fenced."""
    lines, out, i = _roles(text).split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.rstrip().endswith("::") or i >= len(lines) or lines[i].strip():
            continue
        indent = len(line) - len(line.lstrip())
        end = i
        while end < len(lines) and (
            not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
        ):
            end += 1
        code = textwrap.dedent("\n".join(lines[i:end])).strip("\n")
        if code:
            out[-1] = line.rstrip()[:-1] if line.strip() != "::" else ""
            out += ["", "```python", *code.split("\n"), "```", ""]
            i = end
    return "\n".join(out).strip("\n")


def _indented(text: str) -> str:
    """A description as the rest of a list item: its next lines indented by four spaces."""
    first, _, rest = plain(text).partition("\n")
    return first + "".join(f"\n    {line}" if line else "\n" for line in rest.split("\n") if rest)


def _item(element: griffe.DocstringElement, kind: str, head: str = "") -> str:
    """One element of a section (a parameter, a return value, an exception) as a list item."""
    name = str(getattr(element, "name", "") or "")
    details = [f"`{element.annotation}`"] if element.annotation is not None else []
    if kind in ("raises", "warns"):
        name, details = str(element.annotation or ""), []
    default = getattr(element, "value", None)
    if kind.endswith("parameters") and default is not None and not name.startswith("*"):
        details.append(f"default `{default}`")
    head = head or (f"`{name}`" if name else "")
    if details:
        head = f"{head} ({', '.join(details)})" if head else ", ".join(details)
    description = _indented(element.description or "")
    return f"- {head}: {description}" if head and description else f"- {head or description}"


def _section(section: griffe.DocstringSection) -> str:
    """One docstring section as Markdown."""
    kind = section.kind.value
    if kind == "text":
        return plain(section.value)
    if kind == "admonition":
        title = section.title or section.value.annotation or "Note"
        text = f"**{title}:** {plain(section.value.description or '')}"
        return "\n".join(f"> {line}".rstrip() for line in text.split("\n"))
    if kind == "examples":
        parts = [
            plain(text) if part.value == "text" else f"```pycon\n{text}\n```"
            for part, text in section.value
        ]
        return "**Examples:**\n\n" + "\n\n".join(parts)
    if kind == "deprecated":
        return f"**Deprecated** ({section.value.version}): {plain(section.value.description)}"
    title = TITLES.get(kind, kind.capitalize())
    return f"**{title}:**\n\n" + "\n".join(_item(element, kind) for element in section.value)


def _parsed(obj: griffe.Object) -> list[griffe.DocstringSection]:
    """``obj``'s sections; for a class, those of its ``__init__``'s docstring after its own."""
    parts = sections(obj)
    if isinstance(obj, griffe.Class):
        init = _init(obj)
        if init is not None and init.docstring is not None:
            parts += sections(init)
    return parts


def markdown(parts: Sequence[griffe.DocstringSection]) -> str:
    """Docstring sections as Markdown, a blank line between them."""
    return "\n\n".join(text for text in map(_section, parts) if text.strip())


# Entries --------------------------------------------------------------------------------------


@dataclass
class Rendered:
    """Markdown being written, the anchors it holds, and the problems met on the way."""

    lines: list[str] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, *chunks: str) -> None:
        """Append the chunks that are not empty, each followed by a blank line."""
        for chunk in chunks:
            if chunk:
                self.lines += [chunk, ""]

    def parsed(self, obj: griffe.Object) -> list[griffe.DocstringSection]:
        """``obj``'s docstring sections; its problems noted here (and no sections) if any."""
        try:
            return _parsed(obj)
        except Problems as exc:
            self.problems += exc.messages
            return []


def _members(obj: griffe.Class) -> Iterator[tuple[str, griffe.Object]]:
    """A class's own public members, in source order (``__init__`` is merged into the class)."""
    for name, member in obj.members.items():
        if name != "__init__" and member.is_public:
            target = member.final_target if isinstance(member, griffe.Alias) else member
            assert isinstance(target, griffe.Object)
            yield name, target


def _listed(out: Rendered, member: griffe.Object) -> str | None:
    """An attribute member's description for the class's list, or None for one that needs an
    entry of its own (a method, a class, an attribute whose docstring has sections)."""
    if not isinstance(member, griffe.Attribute):
        return None
    parts = out.parsed(member)
    if any(part.kind.value != "text" for part in parts):
        return None
    return markdown(parts)


def attributes(
    out: Rendered, obj: griffe.Class, anchor: str, described: list[griffe.DocstringAttribute]
) -> list[tuple[str, griffe.Object]]:
    """The class's list of attributes (anchored when members); the members left for entries."""
    described_by_name = {element.name: element for element in described}
    items, rest = [], []
    for name, member in _members(obj):
        text = _listed(out, member)
        if text is None:
            rest.append((name, member))
            continue
        element = described_by_name.pop(name, None)
        text = text or (element.description if element is not None else "")
        kind = " (property)" if "property" in member.labels else ""
        head = f'<a id="{anchor}.{name}"></a>`{declaration(member)}`{kind}'
        items.append(f"- {head}: {_indented(text)}" if text else f"- {head}")
        out.anchors.append(f"{anchor}.{name}")
    items += [_item(element, "attributes") for element in described_by_name.values()]
    out.add("**Attributes:**\n\n" + "\n".join(items) if items else "")
    return rest


def entry(out: Rendered, obj: griffe.Object, anchor: str, title: str, level: int) -> None:
    """One name: its anchor, heading, signature, bases, docstring, then a class's members."""
    out.anchors.append(anchor)
    out.add(f'<a id="{anchor}"></a>', f"{'#' * min(level, 6)} `{title}`")
    out.add(f"```python\n{signature(obj)}\n```")
    bases = obj.bases if isinstance(obj, griffe.Class) else []
    out.add("Bases: " + ", ".join(f"`{base}`" for base in bases) + "." if bases else "")
    parts = out.parsed(obj)
    if not isinstance(obj, griffe.Class):
        out.add(markdown(parts))
        return
    out.add(markdown([part for part in parts if part.kind.value != "attributes"]))
    described = [e for part in parts if part.kind.value == "attributes" for e in part.value]
    for name, member in attributes(out, obj, anchor, described):
        entry(out, member, f"{anchor}.{name}", f"{title}.{name}", level + 1)


def resolve(package: griffe.Module, path: str) -> griffe.Object | griffe.Alias:
    """The object at ``path`` (``distcomm.x.y``); a KeyError says what griffe does not find."""
    if path == package.path:
        return package
    try:
        return package[path[len(package.path) + 1 :]]
    except KeyError:
        raise KeyError(f"griffe finds no {path}") from None


def exports(module: griffe.Object | griffe.Alias) -> list[str]:
    """The names of a module's ``__all__``; Problems if it has none."""
    if not isinstance(module, griffe.Module):
        raise Problems([f"{module.path} is not a module"])
    if module.exports is None:
        raise Problems([f"{module.path} has no __all__ ({module.relative_filepath})"])
    return [str(name) for name in module.exports]


def exported(out: Rendered, module: griffe.Module, name: str, level: int) -> None:
    """Name ``name`` of ``module.__all__``, as an entry at heading ``level``."""
    member = module.members.get(name)
    if member is None:
        raise Problems([f"{module.path}.__all__ names {name!r}, which griffe does not find"])
    if member.is_module:
        raise Problems(
            [
                f"{module.path}.__all__ names {name!r}: griffe sees the submodule {member.path},"
                " not the object of that name imported over it (rename the submodule)"
            ]
        )
    try:
        target = member.final_target if isinstance(member, griffe.Alias) else member
    except (griffe.AliasResolutionError, griffe.CyclicAliasError) as exc:
        raise Problems([f"{module.path}.{name}: griffe cannot resolve it ({exc})"]) from None
    assert isinstance(target, griffe.Object)
    entry(out, target, f"{module.path}.{name}", name, level)
