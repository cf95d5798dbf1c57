"""``bench/decode_floor.py``: its count of a search's products equals the arithmetic of the
model's shapes written out by hand, its recorder sees the calls the engine makes to its
packages, and its goal row does the arithmetic it states."""

import keras
import pytest
from paths import load_bench

LAYERS, D, HEADS, FF, SOURCE_VOCAB, VOCAB = 2, 16, 2, 32, 40, 30


def tiny_transformer():
    from transformerkit.models import Transformer

    keras.utils.set_random_seed(5)
    return Transformer(SOURCE_VOCAB, VOCAB, num_layers=LAYERS, d_model=D, num_heads=HEADS,
                       d_ff=FF, dropout=0.0, max_length=24)


def hand_step_flops(rows, index, source_len):
    """One decoder step of ``rows`` rows at ``index`` over ``source_len`` source positions:
    per block the self-attention's 4 projections, the cross-attention's query and output
    projections, the feed-forward's 2 products; the output layer; each attention's scores
    and weighted sum over its ``index + 1`` and ``source_len`` positions."""
    blocks = LAYERS * (6 * D * D + 2 * D * FF)
    attention = LAYERS * 2 * (index + 1 + source_len) * D
    return 2 * rows * (blocks + D * VOCAB + attention)


def hand_encoder_flops(sentences, source_len):
    """The encoder pass: per block 4 projections and 2 feed-forward products a position,
    the scores and weighted sum over ``source_len`` positions; each decoder block's
    cross-attention keys and values of every position."""
    positions = sentences * source_len
    encoder = LAYERS * (positions * (4 * D * D + 2 * D * FF) + 2 * sentences * source_len ** 2 * D)
    return 2 * (encoder + LAYERS * positions * 2 * D * D)


@pytest.mark.parametrize("rows, index, sentences, source_len",
                         [(1, 0, 1, 3), (8, 5, 2, 7), (6, 11, 6, 1)])
def test_a_steps_products_are_counted_as_the_models_shapes_say(rows, index, sentences,
                                                               source_len):
    bench = load_bench("decode_floor")
    model = tiny_transformer()
    shape = (rows, index, sentences, source_len)
    assert bench.products_flops(model, "step", shape) == hand_step_flops(rows, index, source_len)


def test_the_encoder_pass_and_a_whole_search_are_counted():
    bench = load_bench("decode_floor")
    model = tiny_transformer()
    assert bench.products_flops(model, "encoder", (3, 9)) == hand_encoder_flops(3, 9)
    calls = [("encoder", (3, 9), 0.1), ("step", (3, 0, 3, 9), 0.01),
             ("step", (12, 1, 3, 9), 0.02), ("step", (12, 1, 3, 9), 0.02)]
    assert bench.search_flops(model, calls) == {
        "encoder": hand_encoder_flops(3, 9),
        "step": hand_step_flops(3, 0, 9) + 2 * hand_step_flops(12, 1, 9)}


def test_the_recorder_sees_the_calls_of_the_packages_the_engine_loads(tmp_path, monkeypatch):
    import torch

    from transformerkit.decoding import aot_packages, aot_step

    bench = load_bench("decode_floor")
    model = tiny_transformer()
    flat_inputs = []

    def fake_run(flat):  # a loaded package's flat call: the logits and the choice
        flat_inputs.append(flat)
        return [torch.zeros(flat[0].shape[0], VOCAB), torch.zeros(flat[0].shape[0])]

    monkeypatch.setattr(aot_packages, "load_or_build", lambda *args, **kwargs: fake_run)
    before = aot_step.package_call
    calls = []
    with bench.recording(calls):
        step = aot_step.Packages(model, str(tmp_path)).get("small")
    assert aot_step.package_call is before  # restored
    caches = [tuple(torch.zeros(6, 4, HEADS, D // HEADS) for _ in range(2))
              for _ in range(LAYERS)]
    memories = [(torch.zeros(4, HEADS, 7, D // HEADS), torch.zeros(4, HEADS, 7, D // HEADS),
                 torch.zeros(4, 1, 1, 7), torch.ones(4, 1, 1, 1)) for _ in range(LAYERS)]
    table = torch.arange(4).expand(6, 4).contiguous()  # each row its own cache row
    step(torch.zeros(4, dtype=torch.long), torch.tensor(5), caches, table, memories,
         torch.zeros(1, VOCAB))
    assert len(flat_inputs) == 1  # the package ran, through the recorder
    (kind, shape, seconds), = calls
    assert (kind, shape) == ("step", (4, 5, 4, 7)) and seconds >= 0
    # a package loaded outside the recorder is not recorded
    aot_step.Packages(model, str(tmp_path)).get("small")(
        torch.zeros(4, dtype=torch.long), torch.tensor(5), caches, table, memories,
        torch.zeros(1, VOCAB))
    assert len(calls) == 1


def test_the_goal_row_is_the_peers_time_over_the_goal_against_the_peak():
    bench = load_bench("decode_floor")
    calls = [["step", [1, 0, 1, 3], 0.5]]
    best = {("tk-compiled", "greedy"): {"seconds": 1.0, "calls": calls},
            ("ct2-float32", "greedy"): {"seconds": 1.3, "calls": []}}
    flops = {"greedy": {"encoder": 20e9, "step": 60e9}}  # 80 GFLOP
    row, = bench.summarize(best, flops, peak=100.0, goal=1.3)
    assert row["floor_seconds"] == 0.8
    assert row["systems"]["tk-compiled"] == dict(seconds=1.0, gflops=80.0, share_of_peak=0.8,
                                                 package_seconds=0.5, package_gflops=160.0)
    assert row["goal"] == dict(speedup=1.3, seconds=1.0, gflops=80.0, share_of_peak=0.8)
    lines = bench.table([row], 100.0, 1).splitlines()
    assert "| greedy | **goal: 1.3x ct2-float32** | **1.000** | **80.0** | **80%** |" in lines
    assert "| greedy | the products alone at the peak | 0.800 | 100.0 | 100% |" in lines
    assert lines[-1].startswith("float32, 1 thread. Products, GFLOP: greedy 80.0 (encoder 20.0)")
    # a slower peer moves the goal: 2.6 s / 1.3 = 2 s, 40 GFLOP/s
    best[("ct2-float32", "greedy")]["seconds"] = 2.6
    row, = bench.summarize(best, flops, peak=100.0, goal=1.3)
    assert row["goal"]["share_of_peak"] == 0.4
