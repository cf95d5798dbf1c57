"""``bench/pretrained.py`` at its tiny size, in this process: the setup builds a Marian
folder with a SentencePiece vocabulary and an ``</s>`` bias that ends greedy outputs at
varied lengths; transformerkit, ``transformers`` and CTranslate2 float32 decode the same
batches to the same ids, to EOS and at the forced length (so the bench compares equal
work); both fine-tuning steps train
the same model on the same batches (equal first losses, up to dropout); and the report
names every system and goal."""

import types

import numpy as np
import pytest
from paths import load_bench

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    module = load_bench("pretrained")
    module.common.RESULTS = str(tmp_path_factory.mktemp("results"))
    args = types.SimpleNamespace(size="tiny", max_new_tokens=40, sentences=48, batch=16,
                                 repeats=1, threads=1, train_tokens=256, train_batches=2,
                                 to_eos=True)
    return module, args, module.build(args)


def test_eos_bias_ends_greedy_outputs_at_varied_lengths(bench):
    module, args, folder = bench
    setup = module._setup(folder)
    assert setup["size"] == module.SIZES["tiny"]
    gaps = np.array([[3.0, 1.0, 0.5], [2.0, 2.5, 0.2]])
    assert module._greedy_lengths(gaps, 0.6).tolist() == [2, 2]
    assert module._greedy_lengths(gaps, 2.2).tolist() == [1, 0]
    assert module._greedy_lengths(gaps, 0.1).tolist() == [3, 3]  # the cap
    assert abs(setup["probe_mean_greedy_length"] - setup["probe_mean_source_length"]) < 3


def test_systems_decode_the_same_batches_to_the_same_ids(bench):
    module, args, folder = bench
    runs = {}
    for system in ("transformerkit", "hf", "ct2-float32"):
        spec = dict(system=system, folder=folder, sentences=args.sentences, batch=args.batch,
                    max_new_tokens=args.max_new_tokens, threads=1)
        for r in module.decode_worker(spec):
            runs[(system, r["search"])] = [r]
    for search in module.SEARCHES:
        ours = runs[("transformerkit", search)][0]["outputs"]
        assert len(ours) == args.sentences
        lengths = {len(o) for o in ours}  # ended by EOS (greedy: at different lengths)
        assert min(lengths) < args.max_new_tokens, (search, lengths)
        assert len(lengths) > 1 or search != "greedy", lengths
        assert ours == runs[("hf", search)][0]["outputs"], search
        assert ours == runs[("ct2-float32", search)][0]["outputs"], search
    forced = {}
    for system in ("transformerkit", "ct2-float32"):  # the default: exactly the cap
        spec = dict(system=system, folder=folder, sentences=16, batch=args.batch,
                    max_new_tokens=12, threads=1, forced=True)
        forced[system] = [r["outputs"] for r in module.decode_worker(spec)]
    assert forced["transformerkit"] == forced["ct2-float32"]
    assert {len(o) for outputs in forced["transformerkit"] for o in outputs} == {12}
    payload = module.summarize(args, folder, runs)
    rows = {(r["system"], r["search"]): r for r in payload["decoding"]}
    assert rows[("transformerkit", "beam4")]["identical_to_hf"] == 1.0
    assert rows[("hf", "greedy")]["identical_to_ct2-float32"] == 1.0
    assert "outputs" not in rows[("hf", "greedy")]
    goals = [g["goal"] for g in payload["goals"]]
    assert len(goals) == 4 and "decoding beam4 >= 1.5x transformers generate" in goals
    report = module.table(payload)
    assert "| greedy | CTranslate2 float32 |" in report and "identical outputs" in report


def test_both_fine_tuning_steps_train_the_same_model(bench):
    module, args, folder = bench
    batches, ids = module.train_batches(folder, args.train_tokens, args.train_batches)
    assert len(batches) == 2
    for source, decoder_input, labels in batches:
        assert ((source == 2).sum(1) == 1).all()  # each source ends with one </s>
        assert (decoder_input[:, 0] == 1).all()  # <s>: Marian's decoder start
        assert (labels[:, :-1] == decoder_input[:, 1:])[decoder_input[:, 1:] != 0].all()
        assert 0 < np.count_nonzero(labels) <= args.train_tokens
    losses = {}
    for system in module.TRAINERS:
        spec = dict(system=system, folder=folder, train_tokens=args.train_tokens,
                    train_batches=args.train_batches)
        (row,) = module.train_worker(spec)
        assert row["target_tokens"] == sum(np.count_nonzero(b[2]) for b in batches)
        losses[system] = row["first_losses"]
    ours, theirs = losses["transformerkit-train"], losses["hf-train"]
    assert np.isfinite(ours).all() and np.isfinite(theirs).all()
    # the same weights and batch: the first losses differ by dropout and ours' one extra
    # (never predicted) <s> row in the label smoothing only
    assert abs(ours[0] - theirs[0]) < 0.05 * theirs[0], losses
