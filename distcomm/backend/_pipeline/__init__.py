"""The steps :class:`~distcomm.backend.BaseCommunicator` runs around the engine's primitives.

Private to the kit: argument checks, staging, the object collectives, failure reports, and one
pipeline per kind of operation (reductions, data movement, gathers and scatters, point to point,
objects and groups). Backends override primitives, never these.
"""
