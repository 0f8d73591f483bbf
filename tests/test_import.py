"""``import distcomm`` is cheap and side-effect free, and its public names exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import distcomm

PROBE = """
import json, os, sys
before = dict(os.environ)
import distcomm
print(json.dumps({
    "heavy": sorted(m for m in ("torch", "numpy", "mpi4py") if m in sys.modules),
    "registry_created": distcomm._plugins.loader._registry is not None,
    "initialised": distcomm.is_initialized(),
    "environ_changed": sorted(set(before.items()) ^ set(os.environ.items())),
}))
"""


def test_import_is_light_and_side_effect_free() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {
        "heavy": [],
        "registry_created": False,
        "initialised": False,
        "environ_changed": [],
    }


def test_every_name_in_all_exists() -> None:
    missing = [name for name in distcomm.__all__ if not hasattr(distcomm, name)]
    assert missing == []
    assert len(distcomm.__all__) == len(set(distcomm.__all__))


def test_version_is_a_string() -> None:
    assert isinstance(distcomm.__version__, str) and distcomm.__version__.count(".") >= 1
