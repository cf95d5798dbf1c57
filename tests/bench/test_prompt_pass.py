"""``bench/prompt_pass.py``: each way it times writes the prompt into every cache position it
is given (checked against the eager pass, a check that fails where a way writes less), and
its table shows what it measured."""

import keras
from paths import load_bench

SIZE = dict(num_layers=2, d_model=16, num_heads=2, d_ff=32, dropout=0.0, max_length=24)


class EagerPackages:
    """A stand-in's packages (``Packages``' interface) that run the model's eager code."""

    bucket = staticmethod(lambda rows: "small")

    def __init__(self, model, prefill=None):
        weights = model.step_weights("float32")

        def step(tokens, index, caches, cache_rows, memories, bias):
            return model.decode_step(tokens, index, caches, weights, memories, 1,
                                     cache_rows), None

        self.calls = {"small": step, "prefill": prefill or (
            lambda tokens, caches: model.decode_prefill(tokens, caches, weights))}

    def get(self, bucket):
        return self.calls[bucket]


def stand_in(model, packages, tmp_path):
    """The engine's stand-in for ``model`` (its record written to ``tmp_path``), over
    ``packages``."""
    from transformerkit.decoding import aot_files

    aot_files.record("test", model, str(tmp_path))
    steps = aot_files.PackagedSteps(aot_files.PackagedModel(
        aot_files.read_record("test", str(tmp_path)), str(tmp_path), load=lambda: model))
    steps._run = packages
    return steps


def test_each_way_fills_the_caches_as_the_eager_pass_and_a_wrong_one_is_caught(tmp_path):
    import torch

    from transformerkit.decoding.eager_steps import EagerSteps
    from transformerkit.models import GPT

    bench = load_bench("prompt_pass")
    keras.utils.set_random_seed(3)
    model = GPT(30, **SIZE)
    weights = model.step_weights("float32")
    eager = EagerSteps(model)
    ways = bench.fill_ways(eager, stand_in(model, EagerPackages(model), tmp_path))
    assert list(ways) == list(bench.WAYS)
    results = bench.time_ways(ways, [1, 7], repeats=2, vocab=30)
    assert [row["length"] for row in results] == [1, 7]
    for row in results:
        assert set(row["ms"]) == set(bench.WAYS) and min(row["ms"].values()) > 0
        assert row["max_difference"]["eager"] == 0.0
        # one pass against one position at a time: two float32 paths of 16-wide sums
        assert row["max_difference"]["step package"] < 1e-5

    def first_position_only(tokens, caches):  # a package that writes one position
        for pair in caches:
            for t in pair:
                t.zero_()
        model.decode_prefill(tokens[:, :1], [tuple(t[:1] for t in pair) for pair in caches],
                             weights)

    wrong = bench.fill_ways(eager, stand_in(model, EagerPackages(model, first_position_only),
                                            tmp_path))
    row, = bench.time_ways(wrong, [7], repeats=1, vocab=30)
    assert row["max_difference"]["prompt package"] > 1e-2
    with torch.inference_mode():
        tokens = torch.tensor([[3, 4, 5]])
        caches = ways["step package"](tokens)
        assert caches[0][0].shape == (4, 1, 2, 8)  # the prompt and one position more


def test_table_shows_each_length_and_the_packages_loads():
    bench = load_bench("prompt_pass")
    results = [{"length": 64, "ms": {"eager": 120.04, "prompt package": 116.0,
                                     "step package": 960.0},
                "max_difference": {"eager": 0.0, "prompt package": 2e-6,
                                   "step package": 3e-6}}]
    lines = bench.table(results, {"prompt package": 0.31, "step package": 0.2},
                        {"prompt package": 57.7, "step package": 80.0}, 5).splitlines()
    assert lines[2] == "| 64 | 120.0 | 116.0 | 960.0 | 426.0 | 2.0e-06 / 3.0e-06 |"
    assert "| prompt package | 0.31 | 57.7 |" in lines
    assert lines[-1] == "One row, float32, best of 5 interleaved rounds."
