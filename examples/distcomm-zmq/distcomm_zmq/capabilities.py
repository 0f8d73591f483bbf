"""What the zmq backend does natively (imports nothing heavy: the plugin registers it)."""

from __future__ import annotations

from distcomm.backend import Capabilities

__all__ = ["ZMQ_CAPABILITIES"]

#: numpy's types (bfloat16 is bridged by distcomm); no AVG (distcomm divides a SUM); receives
#: name their sender. An operation past its timeout gives up and raises: nothing to cancel.
ZMQ_CAPABILITIES = Capabilities(
    dtypes=frozenset(
        {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}
    ),
    reduce_ops=frozenset({"SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"}),
    any_source=False,
)
