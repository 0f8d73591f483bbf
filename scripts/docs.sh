#!/usr/bin/env bash
# Check the documentation and build it (docs/*.md, and the API reference in docs/reference/:
# plain Markdown that scripts/reference.py writes from the docstrings of each public module's
# __all__, committed) with `mkdocs build --strict`, and fail on anything that would let the docs
# drift from the code:
#   - a reference page that is out of date, or that the generator cannot write: a docstring
#     that documents a parameter the signature lacks or has a section griffe cannot parse, a
#     module without __all__, a name of __all__ missing from its page, a private name rendered
#     (`python scripts/reference.py --check`; its HINT says to run it without --check);
#   - any mkdocs warning (strict mode): a broken #anchor, a page missing from the nav, ...;
#   - a relative link that mkdocs cannot resolve: one inside docs/ is broken, one that leaves
#     docs/ (../README.md) must name a file or directory of the repository;
#   - in the built site, a reference page (PAGES in scripts/reference.py) without the anchor
#     of a name of its modules' __all__ (#distcomm.errors.OperationError), or with a private
#     name's (_x).
# The site goes to a temporary directory, removed at the end: nothing is left behind.
# Run by the test suite (tests/test_release.py); installs the docs extra into ./.venv when it is
# missing (scripts/venv.sh installs it with the test extra).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -c 'import griffe, mkdocs' 2>/dev/null; then
    PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q \
        --disable-pip-version-check -c constraints.txt -e '.[docs]'
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-docs-XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# The reference first: the site is built from the committed pages, stale or not.
reference=0
.venv/bin/python scripts/reference.py --check || reference=$?

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

# Every name of the __all__ of a reference page's modules has its anchor on the built page; no
# private name has one. The pages and their modules: PAGES in scripts/reference.py.
sys.path.insert(0, "scripts")
from reference import PAGES, ROOT
from reference_render import exports, load, resolve

package = load(ROOT)
for page in PAGES:
    html_file = site / "reference" / Path(page.file).stem / "index.html"
    if not html_file.exists():
        errors.append(f"docs/reference/{page.file}: not built (see the errors above)")
        continue
    ids = set(re.findall(r'\bid="([^"]+)"', html_file.read_text()))
    for private in sorted(i for i in ids if re.search(r"\._(?!_)|\.__\w*[^_\W]_?$", i)):
        errors.append(f"docs/reference/{page.file}: renders the private name {private}")
    for path in page.modules:
        try:
            names = exports(resolve(package, path))
        except Exception as exc:  # KeyError, Problems: the message says which
            errors.append(f"docs/reference/{page.file}: cannot load {path}: {exc}")
            continue
        errors += [
            f"docs/reference/{page.file}: {path}.__all__ names {name!r}, not rendered"
            for name in names
            if f"{path}.{name}" not in ids
        ]

for error in errors:
    print(f"scripts/docs.sh: {error}", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF

[ "$reference" -eq 0 ] || exit "$reference"
[ "$status" -eq 0 ] || exit "$status"
[ "$checks" -eq 0 ] || exit "$checks"
echo "scripts/docs.sh: the documentation builds (mkdocs build --strict) and matches every __all__"
