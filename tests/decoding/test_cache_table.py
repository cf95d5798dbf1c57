"""The compiled engine's caches read through a table of rows (``decode_step``'s
``cache_rows``, :class:`~transformerkit.decoding.aot_step.TabledCaches`): a beam search
reorders the table instead of the caches, and decodes as the eager search that reorders
the caches themselves.

Exact comparisons: the keys and values gathered through the table are the same values in
the same layout as the reordered caches' prefix, so the same kernels run on them.
"""

import keras
import numpy as np
import pytest
from nan_caches import fill_new_caches_with_nan

from transformerkit import fastpath
from transformerkit.decoding.eager_steps import EagerSteps
from transformerkit.layers import attention
from transformerkit.models import GPT, Transformer

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the one-position step is the PyTorch-eager shortcut")

SMALL = dict(num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=12, dropout=0.0)


@pytest.mark.parametrize("kind", ["transformer", "gpt"])
@pytest.mark.parametrize("sums", [False, True], ids=["products", "sums"])
def test_a_step_through_the_table_equals_the_step_on_the_reordered_caches(kind, sums,
                                                                          monkeypatch):
    """Caches whose rows are scattered over more rows than there are (a row's positions in
    different cache rows, the unused rows NaN) and the table naming where: the step equals
    the step on the same caches gathered into order, and writes its new position into the
    rows the table names at that position, no other."""
    import torch

    monkeypatch.setattr(fastpath, "ENABLED", True)
    monkeypatch.setattr(attention, "_one_query_products_as_sums", lambda: sums)
    keras.utils.set_random_seed(2)
    model = (Transformer(30, 30, **SMALL) if kind == "transformer" else GPT(30, **SMALL))
    steps = EagerSteps(model)
    rows, slots, filled, max_len = 4, 7, 5, 9
    rng = np.random.default_rng(0)
    buffer = rng.integers(3, 30, (rows, max_len)).astype("int32")
    with torch.no_grad():
        if kind == "transformer":
            source = np.array([[5, 6, 7, 2], [8, 9, 2, 0]], "int32")
            state, static = steps.start(source, max_len, copies=2)
        else:
            state, static = steps.start(buffer, 0, max_len)
        for index in range(filled):
            _, state = steps.step(buffer, index, state, static)
        table = torch.as_tensor(np.stack(
            [rng.permutation(slots)[:rows] for _ in range(max_len)])).long()
        scattered = []
        for pair in state:
            scattered.append(tuple(torch.full((max_len, slots) + t.shape[2:], float("nan"))
                                   for t in pair))
            for t, s in zip(pair, scattered[-1], strict=True):
                for p in range(filled):
                    s[p, table[p]] = t[p]
        weights, memories, copies = static
        tokens = torch.as_tensor(buffer[:, filled]).long()
        expected = model.decode_step(tokens, filled, state, weights, memories, copies)
        got = model.decode_step(tokens, filled, scattered, weights, memories, copies, table)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for pair, s_pair in zip(state, scattered, strict=True):
        for t, s in zip(pair, s_pair, strict=True):
            torch.testing.assert_close(s[filled, table[filled]], t[filled], rtol=0, atol=0)
            others = np.setdiff1d(np.arange(slots), table[filled].numpy())
            assert torch.isnan(s[filled, others]).all()  # written where the table says only


@pytest.fixture
def eager_compiled_steps(monkeypatch):
    """``use_cache="compiled"`` whose packages are not there (the eager step runs through
    the table, as it does where a row bucket has no package), and the row counts of each
    of its ``reorder``s."""
    from transformerkit.decoding.aot_step import CompiledSteps

    monkeypatch.setattr(fastpath, "ENABLED", True)
    monkeypatch.setattr(CompiledSteps, "runner", lambda self: None)
    reorders = []
    reorder = CompiledSteps.reorder

    def counted(self, state, rows, filled):
        new = reorder(self, state, rows, filled)
        reorders.append((state.rows.shape[1], new.rows.shape[1]))
        assert new.caches is state.caches  # the caches are not copied
        return new

    monkeypatch.setattr(CompiledSteps, "reorder", counted)
    return reorders


@pytest.mark.parametrize("nan", [False, True], ids=["empty", "nan"])
def test_a_search_reordering_the_table_equals_the_search_reordering_the_caches(
        eager_compiled_steps, monkeypatch, nan):
    """Beam search (its beams reordered, finished sentences dropped at different steps:
    their length caps differ) and greedy search: the same hypotheses, scores and
    log-probabilities through the table as through reordered caches; with NaN caches,
    nothing unwritten is read either way."""
    import torch

    from transformerkit.decoding import beam_translate, greedy_translate

    keras.utils.set_random_seed(3)
    model = Transformer(30, 30, tie_embeddings="all", **SMALL)
    source = np.array([[5, 6, 7, 8, 2], [8, 9, 2, 0, 0], [11, 2, 0, 0, 0]], "int32")

    def decode(use_cache):
        hyps = beam_translate(model, source, beam_size=3, n_best=3, max_len_a=2,
                              max_len_b=0, use_cache=use_cache)
        return (greedy_translate(model, source, max_len_a=2, max_len_b=0,
                                 use_cache=use_cache),
                [[(h.ids, h.score, h.log_prob) for h in found] for found in hyps])

    if nan:
        fill_new_caches_with_nan(monkeypatch)
    with torch.no_grad():
        expected = decode(True)
        got = decode("compiled")
    assert got == expected
    assert any(after < before for before, after in eager_compiled_steps)  # rows dropped
    assert any(before == after for before, after in eager_compiled_steps)  # beams reordered


def test_a_gpt_generates_through_the_table_as_through_reordered_caches(eager_compiled_steps,
                                                                        monkeypatch):
    """A GPT's prompts of different lengths (a shared prefix in one pass, then one
    position a step), greedy and sampled, through the table: the same ids."""
    import torch

    from transformerkit.decoding import generate_ids

    keras.utils.set_random_seed(4)
    model = GPT(30, **SMALL)
    tabled = []
    decode_step = GPT.decode_step

    def counted(self, *args):
        tabled.append(len(args) == 7 and args[6] is not None)
        return decode_step(self, *args)

    monkeypatch.setattr(GPT, "decode_step", counted)
    prompts = [[5, 6], [7, 8, 9], [4]]
    fill_new_caches_with_nan(monkeypatch)

    def decode(use_cache):
        return (generate_ids(model, prompts, max_new_tokens=5, temperature=0,
                             use_cache=use_cache),
                generate_ids(model, prompts, max_new_tokens=5, top_k=5, seed=1,
                             use_cache=use_cache))

    with torch.no_grad():
        got = decode("compiled")
        assert any(tabled) and tabled.count(True) == len(tabled)
        assert got == decode(True)
