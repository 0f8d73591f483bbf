"""distcomm-zmq: a distcomm backend over ZeroMQ sockets, built as a third-party plugin would be.

It imports only distcomm's public kit (``distcomm.backend``, ``distcomm.errors``,
``distcomm.protocol``). The entry point (``distcomm_zmq.plugin``) registers backend ``zmq``:
``distcomm.init(backend="zmq")``, ``DISTCOMM_BACKEND=zmq`` or ``distcomm run --backend zmq``.
"""

from distcomm_zmq.plugin import distcomm_register_backends, is_available

__all__ = ["distcomm_register_backends", "is_available"]
