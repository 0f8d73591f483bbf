"""The distributions a user installs (scripts/release.sh builds them): one version for all,
each backend requiring the matching distcomm, and distcomm's extras naming the backends at
that version (``pip install 'distcomm[torch,mpi,bench]'``, ``'distcomm[all]'``). Read from the
sources that setuptools reads; the wheel job (scripts/wheels.sh) installs the built wheels."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {
    "distcomm-torch": "distcomm_torch",
    "distcomm-mpi": "distcomm_mpi",
    "distcomm-linklink": "distcomm_linklink",
}


def version_in(path: Path) -> str:
    found = re.search(r'^__version__ = "([^"]+)"', path.read_text(), re.M)
    assert found, f"no __version__ in {path}"
    return found[1]


def project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


VERSION = version_in(ROOT / "distcomm" / "_version.py")


def test_every_distribution_has_distcomms_version() -> None:
    for dist, package in BACKENDS.items():
        folder = ROOT / "backends" / dist
        assert version_in(folder / package / "__init__.py") == VERSION, dist


def test_each_backend_requires_the_matching_distcomm() -> None:
    for dist in BACKENDS:
        needs = project(ROOT / "backends" / dist)["dependencies"]
        assert f"distcomm=={VERSION}" in needs, f"{dist} requires {needs}"


def test_distcomms_extras_name_the_backends_at_its_version() -> None:
    extras = project(ROOT)["optional-dependencies"]
    assert extras["torch"] == [f"distcomm-torch=={VERSION}"]
    assert extras["mpi"] == [f"distcomm-mpi[mpich]=={VERSION}"]
    assert extras["linklink"] == [f"distcomm-linklink=={VERSION}"]
    assert extras["all"] == ["distcomm[torch,mpi,bench]"]
    assert {"numpy>=1.22", "tqdm>=4.60", "matplotlib>=3.5"} <= set(extras["bench"])


def test_the_mpi_backend_brings_an_mpi_on_request() -> None:
    mpi = project(ROOT / "backends" / "distcomm-mpi")
    assert "mpi4py>=4" in mpi["dependencies"] and mpi["optional-dependencies"] == {
        "mpich": ["mpich"]
    }


def test_the_changelog_starts_at_this_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    first = re.search(r"^## \[?([0-9][^\] ]*)", changelog, re.M)
    assert first and first[1] == VERSION, "CHANGELOG.md's newest section is not this version"
