"""Lets timm import beside the CPU torch wheel, for `bench/world.py --only timm` alone.

timm imports torchvision, and the torchvision wheels on PyPI are CUDA builds: their compiled
ops need torch's CUDA libraries, so beside the CPU wheel the ops do not load and
`import torchvision` fails registering fake kernels for them ("operator torchvision::nms
does not exist"). The world corpus' timm models use none of those ops (nms, roi_align,
deform_conv2d), only torchvision's Python parts, so registrations for a missing
`torchvision::` op are let pass here. Installed into the world environment, the same
torchvision would make transformers' image models fail to import (transformers sees the
package and imports it), so timm is not in the `world` group: docs/world.md says how to run
it, with timm and torchvision in a folder of their own on PYTHONPATH with this one.
"""

import torch.library

_register_fake = torch.library.register_fake


def _tolerant(op, fn=None, /, **kwargs):
    if isinstance(op, str) and op.startswith("torchvision::"):
        return (lambda f: f) if fn is None else fn
    return _register_fake(op, **kwargs) if fn is None else _register_fake(op, fn, **kwargs)


torch.library.register_fake = _tolerant
