"""Drop-in modules with the exact APIs of other projects' distributed helpers, on any backend.

Each ``distcomm.compat.<name>`` keeps the names, signatures and defaults of the original, so code
written against it runs by changing one import; the originals' known defects are not copied
(each module's docstring says where it differs). Import the one you need, e.g.
``from distcomm.compat import ding``; this package imports none of them.

- :mod:`distcomm.compat.linklink`: SenseTime's ``linklink`` API (``install()`` makes an
  unmodified ``import linklink`` get it).
- :mod:`distcomm.compat.ding`: DI-engine's ``ding.utils.linklink_dist_helper``.
- :mod:`distcomm.compat.axolotl`: axolotl's ``axolotl.utils.distributed``.
- :mod:`distcomm.compat.speechbrain`: speechbrain's ``speechbrain.utils.distributed``.
- :mod:`distcomm.compat.flame`: flame's ``flame.pytorch.distributed_training``.
- :mod:`distcomm.compat.modelopt`: TensorRT Model Optimizer's
  ``modelopt.torch.export.distribute``.
- :mod:`distcomm.compat.torch_distributed`: ``torch.distributed`` itself (docs/from-torch.md).
"""
