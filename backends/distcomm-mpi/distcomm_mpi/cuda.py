"""Whether the MPI library reads and writes CUDA memory itself (CUDA-aware MPI).

Asked of the library at ``init`` through the extension functions Open MPI (2.0 and later) and
MPICH (4.0 and later) export, looked up with ``ctypes`` in the MPI library mpi4py loaded: mpi4py
has no binding for them. A library with neither is taken as not CUDA-aware; ``init(backend="mpi",
cuda_aware=True)`` overrides the answer either way.
"""

from __future__ import annotations

import ctypes

from mpi4py import MPI

__all__ = ["query_cuda_support"]

#: ``MPIX_GPU_SUPPORT_CUDA`` of MPICH's ``MPIX_GPU_query_support(type, &flag)``.
_MPIX_GPU_SUPPORT_CUDA = 0


def query_cuda_support(library: str | None = None) -> tuple[bool, str]:
    """(whether the MPI library is CUDA-aware, the call that said so).

    ``library`` is the shared object to look in (default: mpi4py's extension module, whose
    symbol lookup reaches the libmpi it links).
    """
    try:
        lib = ctypes.CDLL(library or MPI.__file__)
    except OSError as exc:
        return False, f"the MPI library could not be opened to ask ({exc})"
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype, query.argtypes = ctypes.c_int, []
        answer = bool(query())
        return answer, f"MPIX_Query_cuda_support() returned {int(answer)}"
    gpu_query = getattr(lib, "MPIX_GPU_query_support", None)
    if gpu_query is not None:
        flag = ctypes.c_int(0)
        gpu_query.restype = ctypes.c_int
        gpu_query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        if gpu_query(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == 0:
            return bool(flag.value), f"MPIX_GPU_query_support(CUDA) returned {flag.value}"
    return False, "the MPI library exports no CUDA support query (MPIX_Query_cuda_support)"
