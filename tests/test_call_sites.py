"""distcomm._call_sites: the user's line is the innermost frame outside distcomm, its plugins'
packages (``distcomm_*``) and torch's package: with torch's group over distcomm, a call reaches
distcomm through torch and the plugin's process group (the same through real launchers:
tests/test_torch_under.py checks the line a mismatch names)."""

from __future__ import annotations

import os
import sys

import torch

from distcomm import _call_sites


def test_distcomm_its_plugins_and_torch_stand_between_the_user_and_distcomm() -> None:
    torch_file = os.path.join(os.path.dirname(torch.__file__), "distributed", "c10d_logger.py")
    plugin_file = os.path.join("/somewhere", "distcomm_torch", "process_group.py")
    for path in (_call_sites.__file__, torch_file, plugin_file):
        assert _call_sites._between(os.path.abspath(path)), path
    for path in (__file__, "/home/me/train.py", "/somewhere/distcomm-torch/tests/test_x.py"):
        assert not _call_sites._between(os.path.abspath(path)), path


def test_a_call_through_a_torch_frame_names_the_user_s_line() -> None:
    """A function compiled as if it were torch's file calls on: the site is this test's line."""
    torch_file = os.path.join(os.path.dirname(torch.__file__), "fake_module.py")
    namespace: dict[str, object] = {"site": _call_sites.call_site}
    exec(compile("def through_torch():\n    return site()\n", torch_file, "exec"), namespace)
    line = sys._getframe().f_lineno
    site = namespace["through_torch"]()  # type: ignore[operator]
    assert site == f"{__file__}:{line + 1}", site
