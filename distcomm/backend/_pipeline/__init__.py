"""The steps :class:`~distcomm.backend.BaseCommunicator` runs around its engine's methods.

Private to the kit: argument checks, staging, the object collectives, failure reports, and one
pipeline per kind of operation (reductions, data movement, gathers and scatters, point to point,
objects and groups), and the kit's versions of the engine's optional methods (defaults).
"""
