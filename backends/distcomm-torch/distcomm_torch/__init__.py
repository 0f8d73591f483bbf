"""distcomm's torch.distributed backends: ``gloo`` (CPU tensors) and ``nccl`` (CUDA tensors).

Importing this package imports nothing heavy; torch is imported when a backend is checked for
availability or created.
"""

__version__ = "0.1.0"
