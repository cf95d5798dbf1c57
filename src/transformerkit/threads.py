"""CPU threads: how many cores this process may use, and what ``--threads`` /
``RuntimeOptions.threads`` sets.

``threads`` 0 (the default) means the cores this process may run on (its CPU affinity, as
``taskset`` or a container sets it): PyTorch's own default intra-op thread count already
is that, and the CTranslate2 engine gets it as ``intra_threads`` (CTranslate2's own default
is 4 whatever the machine). ``threads`` N > 0 is N for every engine: the CTranslate2
engine's ``intra_threads``, and PyTorch's intra-op threads (``torch.set_num_threads``, a
setting of the whole process) for the keras and compiled engines.
"""

import os


def cores_available():
    """The number of CPU cores this process may run on (its affinity where the system
    tells it, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_threads(threads):
    """``threads`` if positive, else :func:`cores_available`."""
    return int(threads) if threads and int(threads) > 0 else cores_available()


def use_torch_threads(threads):
    """Set PyTorch's intra-op threads to ``threads`` where it is positive and PyTorch is
    the Keras backend (process-wide; 0 leaves PyTorch's default, the cores available).
    Returns the count set, or None."""
    from transformerkit.backend import choose_default_backend

    # the backend Keras has or will take, without importing Keras: the compiled engine's
    # packages answer without it
    if not threads or int(threads) <= 0 or choose_default_backend() != "torch":
        return None
    import torch

    torch.set_num_threads(int(threads))
    return int(threads)
