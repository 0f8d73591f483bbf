"""The catalogue's rows on gloo: one ``spawn`` of 2 processes runs them all (docs/errors.md).

Each rank runs :func:`error_rows.gloo_rank`: the catalogue's conformance checks, ``init``
again, the finalized communicator, then the ``init`` mistakes of an ``env`` launch of 2.
"""

from __future__ import annotations

import error_rows
import pytest

from distcomm.testing import spawn


@pytest.mark.timeout(150)
def test_rows_on_gloo() -> None:
    results = spawn(error_rows.gloo_rank, 2, backend="gloo", timeout=120)
    for rank, rows in enumerate(results):
        error_rows.check_launched_rows(
            rows, backend="gloo", method="env", rank=rank, variables=("RANK", "WORLD_SIZE")
        )
