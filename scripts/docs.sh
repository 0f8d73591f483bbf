#!/usr/bin/env bash
# Build the documentation (docs/*.md and the API reference that mkdocstrings generates from the
# docstrings of each public module's __all__, docs/reference/) with `mkdocs build --strict`, and
# fail on anything that would let the docs drift from the code:
#   - any mkdocs or mkdocstrings warning (strict mode): a docstring that documents a parameter
#     the signature lacks (griffe), a broken #anchor, a page missing from the nav, ...;
#   - a relative link that mkdocs cannot resolve: one inside docs/ is broken, one that leaves
#     docs/ (../README.md) must name a file or directory of the repository;
#   - a module documented in docs/reference/ (whole, `::: distcomm.errors`, or name by name,
#     `::: distcomm.init`) without __all__, a name of its __all__ that the page does not
#     render, a name rendered on its own that its module's __all__ does not name, or a private
#     name (_x) that the page renders.
# The site goes to a temporary directory, removed at the end: nothing is left behind.
# Run by the test suite (tests/test_release.py); installs the docs extra into ./.venv when it is
# missing (scripts/venv.sh installs it with the test extra).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -c 'import griffe, mkdocs, mkdocstrings, mkdocstrings_handlers.python' \
    2>/dev/null; then
    PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q \
        --disable-pip-version-check -c constraints.txt -e '.[docs]'
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-docs-XXXXXX")
trap 'rm -rf "$scratch"' EXIT

status=0
.venv/bin/python -m mkdocs build --strict --clean --config-file mkdocs.yml \
    --site-dir "$scratch/site" 2>&1 | tee "$scratch/mkdocs.log" || status=$?

# The checks mkdocs cannot make; they read its log and whatever pages it wrote, so they run even
# when the build failed, to report everything at once.
checks=0
.venv/bin/python - "$scratch/site" "$scratch/mkdocs.log" <<'EOF' || checks=$?
import posixpath
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import griffe

site, log = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
docs = Path("docs")
errors = []

# Links mkdocs logged (at "info", see mkdocs.yml) as not found among the documentation files.
link = re.compile(
    r"Doc file '(?P<doc>[^']+)' contains (?:a link '(?P<url>[^']+)', but the target"
    r"|an unrecognized relative link '(?P<other>[^']+)', it was left as is)"
)
for match in link.finditer(log):
    doc, url = match["doc"], match["url"] or match["other"]
    target = posixpath.normpath(posixpath.join(posixpath.dirname(doc), unquote(urlsplit(url).path)))
    if not target.startswith("../"):
        errors.append(f"docs/{doc}: broken link {url!r}: docs/{target} is not a page of the site")
    elif not (docs / target).exists():
        missing = posixpath.normpath("docs/" + target)
        errors.append(f"docs/{doc}: broken link {url!r}: the repository has no {missing}")

# Every name of a documented module's __all__ has its heading on the page; no private name does.
# A module is documented by a page that renders it whole (::: distcomm) or any of its names on
# their own (::: distcomm.init, ::: distcomm.Communicator.split): the nearest module above.
loader = griffe.GriffeLoader(search_paths=["."])
packages = {}
for page in sorted((docs / "reference").glob("*.md")):
    html_file = site / "reference" / page.stem / "index.html"
    if not html_file.exists():
        errors.append(f"{page}: not built (see the mkdocs errors above)")
        continue
    ids = set(re.findall(r'\bid="([^"]+)"', html_file.read_text()))
    for private in sorted(i for i in ids if re.search(r"\._(?!_)|\.__\w*[^_\W]_?$", i)):
        errors.append(f"{page}: renders the private name {private}")
    modules = {}  # the modules the page documents: path -> griffe module
    for directive in re.finditer(r"^::: *([\w.]+)", page.read_text(), re.MULTILINE):
        path = owner = directive[1]
        try:
            top = path.partition(".")[0]
            if top not in packages:
                packages[top] = loader.load(top)
            module = packages[top] if path == top else packages[top][path.partition(".")[2]]
            while not module.is_module:  # a name on its own: up to the module it belongs to
                owner = owner.rpartition(".")[0]
                module = packages[top] if owner == top else packages[top][owner.partition(".")[2]]
        except Exception as exc:  # ImportError, KeyError, ...: griffe's message says which
            errors.append(f"{page}: cannot load {path}: {type(exc).__name__}: {exc}")
            continue
        name = path[len(owner) + 1 :].partition(".")[0]
        if name and module.exports is not None and name not in map(str, module.exports):
            errors.append(f"{page}: renders {path}, but {owner}.__all__ does not name {name!r}")
        modules[owner] = module
    for path, module in modules.items():
        if module.exports is None:
            errors.append(f"{page}: {path} has no __all__ ({module.relative_filepath})")
            continue
        for name in map(str, module.exports):
            if f"{path}.{name}" in ids:
                continue
            member = module.members.get(name)
            why = ""
            if member is not None and member.is_module:
                why = (
                    f" (griffe sees the submodule {path}.{name}, not the object of that name"
                    " imported over it: rename the submodule)"
                )
            errors.append(f"{page}: {path}.__all__ names {name!r}, not rendered{why}")

for error in errors:
    print(f"scripts/docs.sh: {error}", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF

[ "$status" -eq 0 ] || exit "$status"
[ "$checks" -eq 0 ] || exit "$checks"
echo "scripts/docs.sh: the documentation builds (mkdocs build --strict) and matches every __all__"
