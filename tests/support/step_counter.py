""":class:`StepCounter`: how much decoding a GPT generation does, counted from outside.

Used by the streaming tests to prove that a closed stream (or a client that went away)
makes the model stop: the count stops growing.
"""

import time

from transformerkit.decoding import sampling, streaming
from transformerkit.decoding.compiled import is_eager_loop


class StepCounter:
    """Counts the decoding steps of every generation: on PyTorch's eager loop each call of
    a step adapter's ``step`` (``make_steps`` is wrapped); on JAX and TensorFlow, whose
    steps run inside one compiled call, the calls instead (``generate_once``, a chunk of a
    stream or a window of a generation).

    Args:
        monkeypatch: pytest's, which undoes the wrapping after the test.
        delay: seconds each counted step or call sleeps first (a slower model).
    """

    def __init__(self, monkeypatch, delay=0.0):
        self.count = 0
        self.delay = delay
        if is_eager_loop():
            make_steps = sampling.make_steps

            def counting_make_steps(model, use_cache, precision="float32"):
                adapter = make_steps(model, use_cache, precision)
                adapter.step = self._counted(adapter.step)
                return adapter

            monkeypatch.setattr(sampling, "make_steps", counting_make_steps)
        else:
            counted = self._counted(sampling.generate_once)
            monkeypatch.setattr(sampling, "generate_once", counted)
            monkeypatch.setattr(streaming, "generate_once", counted)

    def _counted(self, function):
        def counted(*args, **kwargs):
            self.count += 1
            if self.delay:
                time.sleep(self.delay)  # a slower model, not a synchronisation
            return function(*args, **kwargs)

        return counted
