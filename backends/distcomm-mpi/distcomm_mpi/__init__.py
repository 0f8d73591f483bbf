"""distcomm's ``mpi`` backend over mpi4py. Importing this package imports no mpi4py."""

__version__ = "0.1.0"
