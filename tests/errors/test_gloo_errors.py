"""The catalogue's rows on gloo: one call in the session's warm world of 2 gloo processes runs
them all (docs/errors.md).

Each rank runs :func:`error_rows.gloo_rank`: the catalogue's conformance checks, ``init``
again, the finalized communicator, then the ``init`` mistakes of an ``env`` launch of 2.
"""

from __future__ import annotations

from collections.abc import Callable

import error_rows
import pytest

from distcomm.testing import WarmWorld


@pytest.mark.timeout(150)
def test_rows_on_gloo(warm_world: Callable[..., WarmWorld]) -> None:
    results = warm_world(2).run(error_rows.gloo_rank, timeout=120)
    for rank, rows in enumerate(results):
        error_rows.check_launched_rows(
            rows, backend="gloo", method="env", rank=rank, variables=("RANK", "WORLD_SIZE")
        )
