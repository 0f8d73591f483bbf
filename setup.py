"""The planned path's common case compiled (docs/architecture.md, `_planned_path`): the rest
of the build is pyproject.toml's. Optional: where no C compiler is found the install goes on, and
the Python runs every call."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "distcomm.backend._pipeline._planned_path",
            sources=["distcomm/backend/_pipeline/_planned_path.c"],
            optional=True,
        )
    ]
)
