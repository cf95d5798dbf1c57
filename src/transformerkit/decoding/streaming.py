"""Generation as a stream: a GPT's new text piece by piece while it decodes.

:func:`stream_ids` yields the new ids of a continuation as they are made, and
:func:`text_pieces` turns them into text: it decodes the whole continuation each time and
hands out what is new since the last piece, so a token that is only part of a character
(byte-level BPE) or that changes how its neighbour is spelt comes out right; joined, the
pieces are the continuation ``Run.generate`` returns. There is a piece per list of ids,
empty where they add no text yet (an end token, part of a character). Closing either generator
(``generator.close()``, or a consumer that stops iterating and drops it) stops the decoding
within one step.

How the ids come, per backend:

- **PyTorch** (the eager loop): one list of one id per decoding step. The search of
  :func:`~.sampling.generate_ids` runs unchanged on a thread of its own, with
  :func:`~.greedy.token_search`'s ``on_token`` hook handing each step's id to this
  generator (as ``ctranslate2.Generator.generate_tokens`` runs its search); closing the
  generator makes the hook raise at the next step, and waits for the thread to end.
- **JAX / TensorFlow** (compiled loops): the whole loop is one compiled call, so the ids
  come in chunks of at most ``chunk_tokens``: each chunk is a call that continues the text
  so far, within the same windows (:func:`~.sampling.window_context`) and with the same
  seed per window as the unstreamed generation. The random draw of a step depends only on
  the seed and the step's position in its window (:class:`~.compiled.UniformNoise`), so
  greedy and seeded sampling give the same ids as one call, up to float rounding: a chunk
  reads the text so far in one pass where one call had cached it step by step, so a
  near-tie of two ids' scores may fall the other way.
"""

import queue
import threading

from transformerkit.decoding.compiled import is_eager_loop
from transformerkit.decoding.options import GenerationOptions
from transformerkit.decoding.sampling import (
    crop_prompt,
    generate_ids,
    generate_once,
    window_context,
    window_seed,
)
from transformerkit.decoding.texts import check_sampling, text_pieces

CHUNK_TOKENS = 8  # new tokens per compiled call when streaming on JAX / TensorFlow


_GENERATION = GenerationOptions()  # the declared defaults, for the signature below


def stream_ids(model, prompt_ids, max_new_tokens=_GENERATION.max_new_tokens,
               temperature=_GENERATION.temperature, top_k=None, top_p=None, seed=None,
               eos_id=None, min_new_tokens=_GENERATION.min_new_tokens, use_cache=True,
               chunk_tokens=CHUNK_TOKENS, precision="float32",
               no_repeat_ngram_size=_GENERATION.no_repeat_ngram_size):
    """The new ids of one prompt's continuation, as a generator of lists of ids that,
    joined, equal ``generate_ids(model, prompt_ids, ...)`` with the same arguments (see the
    module docstring for what a list holds on each backend).

    The arguments are :func:`~.sampling.generate_ids`' for one prompt (checked here, before
    the generator starts; a prompt longer than ``max_length - 1`` keeps its end, with a
    warning), and ``chunk_tokens``: the most new tokens per compiled call.
    """
    GenerationOptions(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                      no_repeat_ngram_size=no_repeat_ngram_size)  # checks each value
    prompt = crop_prompt(model, prompt_ids, stacklevel=2)
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   eos_id=eos_id, min_new_tokens=min_new_tokens, use_cache=use_cache,
                   precision=precision, no_repeat_ngram_size=no_repeat_ngram_size)
    if is_eager_loop():
        return _stepped_ids(model, prompt, max_new_tokens, options)
    if int(chunk_tokens) < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    if temperature and seed is None:  # one seed for every chunk, drawn as generate_ids does
        options["seed"] = int(check_sampling(temperature, top_k, top_p, None)[2])
    return _chunked_ids(model, prompt, max_new_tokens, options, int(chunk_tokens))


class _Closed(Exception):
    """Raised by the step hook once the stream's consumer has closed it."""


def _stepped_ids(model, prompt, max_new_tokens, options):
    """The eager loop's ids, one step at a time, from a search on its own thread."""
    made = queue.SimpleQueue()  # ("ids", [id]), then ("done", None) or ("error", exception)
    closed = threading.Event()

    def on_token(ids):  # (1,) the step's id
        if closed.is_set():
            raise _Closed
        made.put(("ids", [int(ids[0])]))

    def search():
        try:
            generate_ids(model, prompt, max_new_tokens, on_token=on_token, **options)
            made.put(("done", None))
        except _Closed:
            made.put(("done", None))
        except BaseException as error:  # handed to the consumer, raised there
            made.put(("error", error))

    thread = threading.Thread(target=search, name="transformerkit-stream", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = made.get()
            if kind == "error":
                raise value
            if kind == "done":
                return
            yield value
    finally:
        closed.set()
        thread.join()


def _chunked_ids(model, prompt, max_new_tokens, options, chunk_tokens):
    """The compiled loops' ids, in calls of at most ``chunk_tokens`` new tokens that follow
    :func:`~.sampling.generate_ids`' windows and seeds."""
    total = model.max_length - len(prompt) if max_new_tokens is None else int(max_new_tokens)
    eos, least = options.pop("eos_id"), options.pop("min_new_tokens")
    new, window = [], 0
    while len(new) < total:
        context = window_context(model, prompt, new, window)
        budget = min(total - len(new), model.max_length - len(context))
        made = []  # in this window
        while len(made) < budget:
            chunk = generate_once(model, [context + made], min(chunk_tokens, budget - len(made)),
                                   **dict(options, seed=window_seed(options["seed"], window)),
                                   eos_id=eos,
                                   min_new_tokens=max(0, least - len(new) - len(made)))[0]
            made.extend(chunk)
            if chunk:
                yield chunk
            if not chunk or (eos is not None and chunk[-1] == int(eos)):
                return
        new.extend(made)
        window += 1


__all__ = ["CHUNK_TOKENS", "stream_ids", "text_pieces"]
