"""``bench/openvino_step.py``: the inputs it hands both runtimes are the exported step's, in
the order OpenVINO's converted graph takes them (``torch.export``'s flattening order), and
they give the eager step's logits."""

import keras
import numpy as np
from paths import load_bench


def test_saved_inputs_are_the_exported_steps_flat_inputs_and_give_its_logits(tmp_path):
    import torch
    from torch.utils._pytree import tree_flatten

    from transformerkit.decoding import aot_step
    from transformerkit.models import Transformer

    bench = load_bench("openvino_step")
    keras.utils.set_random_seed(2)
    model = Transformer(30, 25, num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
                        max_length=24)
    model.build(None)
    flops = bench.write_inputs(model, str(tmp_path), [1, 3], position=4, source_len=5)
    # the step's products by hand: per row and block, the self-attention's four
    # projections, the cross-attention's query and output ones, two feed-forward ones, the
    # attention over 5 cached and 5 source positions (scores and sums); the output layer
    per_row = 2 * (2 * (4 * 16 * 16 + 2 * 16 * 16 + 2 * 16 * 32 + 2 * (5 + 5) * 16)
                   + 16 * 25)
    assert flops == {1: per_row, 3: 3 * per_row}
    program = aot_step.export_step(model, "small")
    for rows in (1, 3):
        inputs, reference = bench.inputs_of(str(tmp_path), rows, model.num_decoder_layers)
        tokens, index, caches, table, memories, bias = inputs
        assert tokens.shape == (rows,) and int(index) == 4
        assert caches[0][0].shape == (9, rows, 2, 8) and memories[0][2].shape == (rows, 1, 1, 5)
        np.testing.assert_array_equal(table.numpy(), np.tile(np.arange(rows), (9, 1)))
        leaves, _ = tree_flatten(inputs)
        with np.load(tmp_path / f"inputs-{rows}.npz") as saved:
            assert len(saved.files) - 1 == len(leaves) == 2 + 2 * 2 + 1 + 2 * 4 + 1  # 2 blocks
            for i, leaf in enumerate(leaves):  # the file's order is the flattening order
                np.testing.assert_array_equal(saved[f"input_{i}"], leaf.numpy())
        with torch.no_grad():
            # the exported step on those inputs: the eager float32 step's logits
            got, best = program.module()(tokens, index, [tuple(t.clone() for t in pair)
                                                         for pair in caches], table, memories,
                                         bias)
            assert np.abs(reference).max() > 0.1
            np.testing.assert_allclose(got.numpy(), reference, rtol=0, atol=1e-5)
            np.testing.assert_array_equal(best.numpy(), got.argmax(1).numpy())
            # a different position's logits are not these: the index is read
            other, _ = program.module()(tokens, torch.tensor(2),
                                        [tuple(t.clone() for t in pair) for pair in caches],
                                        table, memories, bias)
            assert np.abs(other.numpy() - reference).max() > 1e-3


def test_table_gives_each_row_count_and_precision_with_the_ratio():
    bench = load_bench("openvino_step")
    results = [{"rows": 1, "precision": "float32", "flops": 5e6, "ours_ms": 0.25,
                "openvino_ms": 1.0, "ours_max_diff": 1e-6, "openvino_max_diff": 2e-6}]
    lines = bench.table(results, 1, {"float32": 90.0}).splitlines()
    assert lines[2] == "| 1 | float32 | 0.005 | 0.250 | 1.000 | 4.00 | 20.0 | 1e-06 / 2e-06 |"
    assert "float32 90.0 GFLOP/s" in lines[-1]
