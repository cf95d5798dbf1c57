"""The PyTorch kernel layer under ``layers/``: which kernel runs each product, weights
packed once for it, bfloat16 and int8 inference, the cast-once mixed-precision step.

``layers/`` holds the model's math (the paper's equations, the same on every backend);
this package holds the choices that make it fast on eager PyTorch, each behind the one
switch of :mod:`transformerkit.fastpath` and tested equal to the plain path:

- :mod:`.products`: ``linear`` and ``inference_linear`` (addmm, oneDNN's packed kernel,
  the kernel choice by CPU vendor, oneDNN under autograd for large training products);
- :mod:`.lowprec`: bfloat16 and int8 inference products;
- :mod:`.cast_once`: the mixed-precision training step's weight casts;
- :mod:`.softmax`: short rows padded onto the vectorised softmax kernel.
"""
