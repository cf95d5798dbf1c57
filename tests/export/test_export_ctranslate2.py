"""CTranslate2 export (``transformerkit.export``): the exported model equals the Keras model.

Reference: our own model on the same weights. Log-probabilities of given outputs come from
:func:`transformerkit.decoding.scoring.sequence_log_probs` (ours) and CTranslate2's
``score_batch``; greedy outputs from our decoders and CTranslate2's ``translate_batch`` /
``generate_batch``. Models: a tiny run trained in-process (``tests/support/tiny_run.py``) and
random-weight models for every option the export maps (norm position, activation, each
positional table, each tying mode, LayerNorm epsilon, head width, GPT without biases).

CTranslate2 runs its own float32 kernels, so log-probabilities agree within two paths'
rounding bound of a sum of token log-probabilities (``tests/support/tolerances.py``), and outputs
are the same except at a near-tie of the Keras model's logits (the helpers of
``tests/support/near_ties.py``); two CTranslate2 runs through the same kernels are exact.
"""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tolerances as tol
from near_ties import (
    assert_same_ids_or_near_tie,
    assert_same_texts_or_near_tie,
    next_logits_after,
    score_atol,
    score_bound,
)
from tiny_run import GERMAN, tiny_config, tiny_gpt_config

ctranslate2 = pytest.importorskip("ctranslate2")

import transformerkit  # noqa: E402
from transformerkit import cli  # noqa: E402
from transformerkit.api import Run  # noqa: E402
from transformerkit.config import resolve  # noqa: E402
from transformerkit.data.padding import pad_batch  # noqa: E402
from transformerkit.data.tokenizers import CharTokenizer  # noqa: E402
from transformerkit.decoding import greedy_translate  # noqa: E402
from transformerkit.decoding.sampling import generate_ids  # noqa: E402
from transformerkit.decoding.scoring import sequence_log_probs  # noqa: E402
from transformerkit.export.ctranslate2 import (  # noqa: E402
    KerasConverter,
    default_export_dir,
    export_model,
    export_run,
)
from transformerkit.export.ctranslate2_folders import METADATA_FILE, read_metadata  # noqa: E402
from transformerkit.export.runtime import CTranslate2Engine, ensure_export  # noqa: E402
from transformerkit.files import atomic_write_text, file_sha256  # noqa: E402
from transformerkit.models import GPT, Encoder, Transformer  # noqa: E402

TOKENIZER = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz ."])
SOURCES = ["hello world", "abc", "the quick brown fox", "a", "jumps over the lazy dog."]
TARGETS = ["hallo welt", "x", "der schnelle braune fuchs", "ein hund.", "z z z"]


def sentences(count, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(GERMAN[i] for i in rng.integers(0, 10, rng.integers(1, 7)))
            for _ in range(count)]


def randomized(model, *inputs, scale=0.3):
    """``model`` built and every weight moved by N(0, scale): LayerNorm offsets and biases
    non-zero, so that a weight copied to the wrong place shows."""
    model(*inputs)
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(keras.ops.convert_to_numpy(w) + rng.normal(0, scale, w.shape).astype("float32"))
    return model


def ct2_log_probs(session, sources, targets):
    tokens = [list(t) for t in targets]
    if sources is None:
        return np.array([sum(r.log_probs) for r in session.score_batch(tokens)])
    return np.array([sum(r.log_probs) for r in session.score_batch([list(s) for s in sources],
                                                                    tokens)])


def check_transformer_equal(model, tmp_path, tokenizer=TOKENIZER):
    """Ours vs CTranslate2: log-probabilities within two paths' bound of their sums, greedy
    outputs the same except at a near-tie."""
    out = export_model(model, tokenizer, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(out), intra_threads=1)
    source_ids = pad_batch([tokenizer.encode(s, add_eos=True) for s in SOURCES])
    targets = [tokenizer.encode(t) for t in TARGETS]
    ours = sequence_log_probs(model, source_ids, targets)
    atol = score_bound(model, source_ids, [[t] for t in targets])
    tol.assert_within(ct2_log_probs(translator, SOURCES, TARGETS), ours,
                      [atol(len(t) + 1) for t in targets], "log-probabilities")
    # no cap relative to the source: CTranslate2 decodes up to max_decoding_length too
    greedy = greedy_translate(model, source_ids, max_new_tokens=20, max_len_a=None,
                              max_len_b=None)
    found = translator.translate_batch([list(s) for s in SOURCES], beam_size=1,
                                       max_decoding_length=20,
                                       suppress_sequences=[["<pad>"], ["<s>"]])
    theirs = [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in found]
    assert_same_ids_or_near_tie([[i for i in g if i != tokenizer.eos_id] for g in greedy],
                                theirs, next_logits_after(model, source_ids), "greedy")


TRANSFORMER_OPTIONS = [
    {},  # the paper: post-norm, relu, sinusoidal, untied
    {"norm_position": "pre"},
    {"activation": "gelu"},
    {"positional": "t2t", "min_timescale": 2.0, "max_timescale": 500.0},
    {"positional": "learned"},
    {"tie_embeddings": "decoder"},
    {"tie_embeddings": "all", "norm_position": "pre", "activation": "gelu"},
    {"layer_norm_epsilon": 0.3},
    {"layer_norm_epsilon": 0.3, "norm_position": "pre"},
    {"key_dim": 12, "value_dim": 12, "num_decoder_layers": 1},
]


@pytest.mark.parametrize("options", TRANSFORMER_OPTIONS, ids=str)
def test_transformer_export_equals_the_model(options, tmp_path):
    keras.utils.set_random_seed(1)
    vocab = TOKENIZER.vocab_size
    model = Transformer(vocab, vocab, num_layers=2, d_model=32, num_heads=4, d_ff=48,
                        dropout=0.0, max_length=40, **options)
    randomized(model, (np.array([[5, 6, 2]]), np.array([[1, 7]])))
    check_transformer_equal(model, tmp_path)


def test_tolerances_still_catch_an_export_without_layer_norm_offsets(tmp_path, monkeypatch):
    """Planted bug: the export writes every LayerNorm offset (beta) as zeros; the randomised
    offsets move the log-probabilities far beyond their bound."""
    from transformerkit.export import ctranslate2 as export

    def zero_offsets(spec, layer):
        spec.gamma = export._array(layer.gamma)
        spec.beta = np.zeros_like(spec.gamma)

    monkeypatch.setattr(export, "_norm", zero_offsets)
    tol.assert_caught(test_transformer_export_equals_the_model, {}, tmp_path)


GPT_OPTIONS = [
    {},  # GPT-2: pre-norm, gelu, learned positions, untied, no embedding scale
    {"activation": "gelu_tanh", "tie_embeddings": "all"},  # GPT-2's own GELU (GELUTanh)
    {"norm_position": "post", "activation": "relu", "positional": "sinusoidal",
     "tie_embeddings": "all", "scale_embeddings": True, "use_bias": False,
     "layer_norm_epsilon": 0.2},
]


@pytest.mark.parametrize("options", GPT_OPTIONS, ids=str)
def test_gpt_export_equals_the_model(options, tmp_path):
    keras.utils.set_random_seed(2)
    model = GPT(TOKENIZER.vocab_size, num_layers=2, d_model=32, num_heads=4, d_ff=48,
                max_length=32, **options)
    randomized(model, np.array([[5, 6, 7]]))
    out = export_model(model, TOKENIZER, TOKENIZER, tmp_path / "ct2")
    generator = ctranslate2.Generator(str(out), intra_threads=1)
    texts = SOURCES + TARGETS
    ids = [TOKENIZER.encode(t) for t in texts]
    logits = keras.ops.convert_to_numpy(model(pad_batch(ids)))
    logp = keras.ops.convert_to_numpy(keras.ops.log_softmax(logits, axis=-1))
    ours = [sum(logp[row, k, seq[k + 1]] for k in range(len(seq) - 1))
            for row, seq in enumerate(ids)]
    # two paths' bound of a sum of len - 1 token log-probabilities over len positions
    real = pad_batch(ids) != 0
    magnitude = max(np.abs(logits[real]).max(), np.abs(logp[real]).max())
    tol.assert_within(ct2_log_probs(generator, None, texts), ours,
                      [score_atol(model, 0, len(seq), magnitude) for seq in ids])
    for prompt in ids[:4]:
        new = generate_ids(model, prompt, 12, temperature=0)
        found = generator.generate_batch([[TOKENIZER.id_to_token(i) for i in prompt]],
                                         max_length=12, include_prompt_in_result=False,
                                         sampling_topk=1, end_token=[],
                                         suppress_sequences=[["<pad>"], ["<s>"]])
        assert_same_ids_or_near_tie([found[0].sequences_ids[0]], [new],
                                    next_logits_after(model, prompts=[prompt]))


# -- options CTranslate2 cannot express ---------------------------------------------------------
def test_unexpressible_options_are_refused(tmp_path):
    vocab = TOKENIZER.vocab_size
    model = Transformer(vocab, vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        key_dim=8, value_dim=4)
    with pytest.raises(ValueError, match="value_dim=4"):
        export_model(model, TOKENIZER, TOKENIZER, tmp_path / "a")
    encoder = Encoder(vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32)
    with pytest.raises(ValueError, match="not Encoder"):
        export_model(encoder, TOKENIZER, TOKENIZER, tmp_path / "b")
    good = Transformer(vocab, vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32)
    with pytest.raises(ValueError, match="not built"):
        export_model(good, TOKENIZER, TOKENIZER, tmp_path / "c")
    good.build(None)
    with pytest.raises(ValueError, match="quantization must be one of"):
        export_model(good, TOKENIZER, TOKENIZER, tmp_path / "c", quantization="int4")
    other = CharTokenizer.train(["abc"])
    with pytest.raises(ValueError, match="has 7 ids"):
        export_model(good, other, other, tmp_path / "d")
    assert not any(p.name != "tmp" for p in tmp_path.iterdir() if p.name in "abcd")


def test_tokens_spelled_twice_are_refused():
    class Twice(CharTokenizer):
        def id_to_token(self, i):
            return "a" if i == 5 else super().id_to_token(i)

    tokenizer = Twice(list("abcd"))
    vocab = tokenizer.vocab_size
    model = Transformer(vocab, vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32)
    model.build(None)
    with pytest.raises(ValueError, match="both spelled 'a'"):
        KerasConverter(model, tokenizer)._load()


def test_the_export_is_atomic(tmp_path, monkeypatch):
    vocab = TOKENIZER.vocab_size
    model = Transformer(vocab, vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32)
    model.build(None)
    out = tmp_path / "ct2"
    export_model(model, TOKENIZER, TOKENIZER, out)
    with pytest.raises(FileExistsError, match="force"):
        export_model(model, TOKENIZER, TOKENIZER, out)
    before = sorted(os.listdir(out))

    def broken(self, output_dir):
        open(os.path.join(output_dir, "model.bin"), "wb").write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ctranslate2.specs.TransformerSpec, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        export_model(model, TOKENIZER, TOKENIZER, out, force=True)
    assert sorted(os.listdir(tmp_path)) == ["ct2"]  # no temporary folder left
    assert sorted(os.listdir(out)) == before  # the previous export is untouched
    assert (out / "model.bin").stat().st_size > 100


# -- a trained run: API, first-use export, int8, CLI ---------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from transformerkit.training.trainer import train

    folder = tmp_path_factory.mktemp("ct2_run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSFORMERKIT_MALLOC", "system")
        train(tiny_config(folder, epochs=6), folder / "run")
    return folder / "run"


def test_trained_run_greedy_and_log_probs_match(trained):
    """Greedy outputs the same except at a near-tie; log-probabilities within two paths'
    bound."""
    run = transformerkit.load(trained)
    texts = sentences(100)
    ours = run.translate(texts, beam_size=1, max_new_tokens=30)
    theirs = run.translate(texts, beam_size=1, max_new_tokens=30, engine="ctranslate2")
    assert_same_texts_or_near_tie(run, texts, ours, theirs)
    assert os.path.isfile(os.path.join(default_export_dir(trained), "model.bin"))
    tok = run.target_tokenizer
    source_ids = pad_batch([run.source_tokenizer.encode(t, add_eos=True) for t in texts])
    outputs = [tok.encode(t) for t in ours]
    expected = sequence_log_probs(run.model, source_ids, outputs)
    translator = ctranslate2.Translator(default_export_dir(trained), intra_threads=1)
    found = translator.score_batch([list(t) for t in texts],
                                   [[tok.id_to_token(i) for i in o] for o in outputs])
    atol = score_bound(run.model, source_ids, [[o] for o in outputs])
    tol.assert_within([sum(r.log_probs) for r in found], expected,
                      [atol(len(o) + 1) for o in outputs])


@pytest.mark.parametrize("cap", [dict(max_len_a=0.5, max_len_b=2), dict(max_len_a=0.0,
                                                                         max_len_b=3)])
def test_length_cap_is_ours_with_greedy_search(trained, cap):
    """The CTranslate2 engine cuts each output at its own ``max_len_a * len + max_len_b``
    cap, as our greedy search stops there (the caps bind: the tiny model runs on); the
    outputs are the same except at a near-tie."""
    run = transformerkit.load(trained)
    texts = sentences(40)
    ours = run.translate(texts, beam_size=1, **cap)
    theirs = run.translate(texts, beam_size=1, engine="ctranslate2", **cap)
    uncapped = run.translate(texts, beam_size=1, max_len_a=None, max_len_b=None)
    assert ours != uncapped  # the caps cut something
    assert_same_texts_or_near_tie(run, texts, ours, theirs)
    with pytest.raises(ValueError, match="one stopping rule, 'early'"):
        run.translate(texts[:2], engine="ctranslate2", stopping="exact")


def test_min_new_tokens_is_ours_with_greedy_search(trained):
    """``min_new_tokens`` (a declared search option): no output is shorter than it on either
    engine (CTranslate2's ``min_decoding_length``), where without it some are; the outputs
    are the same except at a near-tie."""
    run = transformerkit.load(trained)
    texts = sentences(40)
    tok = run.target_tokenizer
    search = dict(beam_size=1, max_new_tokens=40, max_len_a=None, max_len_b=None)
    plain = run.translate(texts, **search)
    least = min(len(tok.encode(t)) for t in plain) + 3
    ours = run.translate(texts, **search, min_new_tokens=least)
    theirs = run.translate(texts, **search, min_new_tokens=least, engine="ctranslate2")
    # the end token comes after least tokens at the earliest (transformers' rule)
    assert all(len(tok.encode(t)) >= least for t in ours), (least, ours)
    assert ours != plain
    assert_same_texts_or_near_tie(run, texts, ours, theirs)


def test_no_repeat_ngram_size_is_ours_with_greedy_search(trained):
    """``no_repeat_ngram_size`` (a declared search option) maps onto CTranslate2's: neither
    engine repeats a token trigram, where without it some output does; the outputs are the
    same except at a near-tie."""
    run = transformerkit.load(trained)
    texts = sentences(40)
    tok = run.target_tokenizer
    search = dict(beam_size=1, max_new_tokens=40, max_len_a=None, max_len_b=None)

    def repeats(text):
        ids = tok.encode(text)
        grams = [tuple(ids[j:j + 3]) for j in range(len(ids) - 2)]
        return len(grams) != len(set(grams))

    plain = run.translate(texts, **search)
    assert any(map(repeats, plain))
    ours = run.translate(texts, **search, no_repeat_ngram_size=3)
    theirs = run.translate(texts, **search, no_repeat_ngram_size=3, engine="ctranslate2")
    assert not any(map(repeats, ours)) and not any(map(repeats, theirs))
    assert_same_texts_or_near_tie(run, texts, ours, theirs)


def test_first_use_exports_and_stale_exports_are_replaced(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("ctranslate2*"))
    run = transformerkit.load(run_dir)
    model_dir = default_export_dir(run_dir)
    os.makedirs(model_dir)  # a half-written folder under the final name: never used
    open(os.path.join(model_dir, "config.json"), "w").write("{}")
    assert ensure_export(run) == model_dir
    assert os.path.isfile(os.path.join(model_dir, "model.bin"))
    stamp = os.stat(os.path.join(model_dir, "model.bin")).st_mtime_ns
    ensure_export(run)  # current: kept
    assert os.stat(os.path.join(model_dir, "model.bin")).st_mtime_ns == stamp
    # the export records the file its weights came from (a later load answers from it
    # without loading the model): on an export made before it did, the record is added
    assert run.weights_file() == str(run_dir / "model.keras")
    record = {"model_file": "model.keras", "model_file_sha256": file_sha256(run.weights_file()),
              "parameters": run.model.count_params()}
    assert read_metadata(model_dir).items() >= record.items()
    atomic_write_text(os.path.join(model_dir, METADATA_FILE), json.dumps(
        {k: v for k, v in read_metadata(model_dir).items() if k not in record}))
    ensure_export(run)
    assert read_metadata(model_dir).items() >= record.items()
    assert os.stat(os.path.join(model_dir, "model.bin")).st_mtime_ns == stamp
    atomic_write_text(os.path.join(model_dir, METADATA_FILE), json.dumps(  # a record of old
        {k: v for k, v in read_metadata(model_dir).items() if k != "parameters"}))
    assert transformerkit.load(run_dir, engine="ctranslate2").checked_export() is None
    ensure_export(run)  # completed, not exported again
    assert read_metadata(model_dir).items() >= record.items()
    assert os.stat(os.path.join(model_dir, "model.bin")).st_mtime_ns == stamp
    weight = run.model.weights[0]
    weight.assign(keras.ops.convert_to_numpy(weight) + 1.0)  # other weights: re-exported
    assert run.weights_file() is None  # no longer the file's: an export records no file
    ensure_export(run)
    assert "model_file_sha256" not in read_metadata(model_dir)
    fresh = transformerkit.load(run_dir, engine="ctranslate2")  # the file's weights again
    assert ensure_export(fresh) == model_dir
    assert read_metadata(model_dir).items() >= record.items()
    ensure_export(run)  # back to the changed weights for the checks below
    engine = CTranslate2Engine(run, threads=1)
    assert engine.threads == 1
    assert CTranslate2Engine(run).threads == len(os.sched_getaffinity(0))  # not CT2's 4
    text = sentences(1, seed=3)[0]  # the re-exported weights: the same except at a near-tie
    assert_same_texts_or_near_tie(run, [text], [engine.translate(text, beam_size=1)],
                                  [run.translate(text, beam_size=1)])


def test_a_deferred_load_reads_the_model_file_once_and_a_damaged_record_is_redone(
        trained, tmp_path, monkeypatch):
    """load(engine="ctranslate2") checks the export by the .keras file's digest; translating
    then does not read the file again. A damaged transformerkit.json is not an error: the
    model is loaded and exported again."""
    import transformerkit.files as files

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("ctranslate2*"))
    text = sentences(1, seed=5)[0]
    expected = transformerkit.load(run_dir).translate(text, beam_size=1, engine="ctranslate2")
    model_dir = default_export_dir(run_dir)
    hashed = []
    monkeypatch.setattr(files, "file_sha256",
                        lambda path: hashed.append(path) or file_sha256(path))
    deferred = transformerkit.load(run_dir, engine="ctranslate2")
    assert deferred.checked_export() == model_dir
    assert deferred.translate(text, beam_size=1) == expected
    assert hashed == [str(run_dir / "model.keras")]
    assert deferred._model is None  # answered without loading the model

    for damage in ("{not json", "[1, 2]", b"\xff\xfe"):
        path = os.path.join(model_dir, METADATA_FILE)
        with open(path, "wb") as f:
            f.write(damage if isinstance(damage, bytes) else damage.encode())
        assert read_metadata(model_dir) is None
        again = transformerkit.load(run_dir, engine="ctranslate2")
        assert again.checked_export() is None and again._model is not None
        assert again.translate(text, beam_size=1) == expected
        assert read_metadata(model_dir)["model_file"] == "model.keras"


# oneDNN's caps that keep its 8-bit dot products (VNNI) on an AVX-512 VNNI CPU ("CPU
# dispatcher control"; AVX512_CORE and AVX2 drop them); None: no cap
ONEDNN_CAPS_WITH_VNNI = (None, "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX10_1_512",
                         "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
                         "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16")


def ctranslate2_int8_sums_exactly():
    """``(exact, why)``: whether CTranslate2's int8 GEMM sums its products exactly in int32
    on this hardware. It shifts the int8 input to uint8 and calls a u8s8 GEMM: Intel MKL's
    on Intel CPUs (``CT2_USE_MKL`` overrides), which sums exactly; else oneDNN's, which
    without VNNI adds pairs of products in 16 bits and saturates (oneDNN's "Int8 computation
    aspects"): there a tiny model's greedy outputs left float32's in most sentences. A
    question about the hardware and oneDNN's cap, not the decisions: read from
    ``/proc/cpuinfo`` itself (CTranslate2 reads the CPU, not transformerkit's overrides)."""
    from cpu_families import host_has, host_vendor

    from transformerkit import precisions

    default = "1" if host_vendor() == "GenuineIntel" else "0"
    if os.environ.get("CT2_USE_MKL", default).strip().lower() in ("1", "true", "on"):
        return True, "MKL's u8s8 GEMM"
    if not host_has("vnni"):
        return False, "oneDNN's u8s8 GEMM on a CPU without VNNI saturates"
    if precisions.onednn_cap() not in ONEDNN_CAPS_WITH_VNNI:
        return False, (f"oneDNN's u8s8 GEMM under ONEDNN_MAX_CPU_ISA={precisions.onednn_cap()} "
                       "(no VNNI) saturates")
    return True, "oneDNN's u8s8 GEMM with VNNI"


def assert_agrees_mostly(run, trained, texts, folder, compute_type):
    """The int8 export in ``folder``, run at ``compute_type``, agrees mostly with the float32
    export: most greedy outputs are the same and each token's log-probability moves by
    little. The tiny model is unsure (about -1.6 nats a token), so near ties may flip. Not a
    float32 rounding bound: int8 weights carry an error of 1/254 of their row's largest,
    whose first-order chain bound (gamma with u = 1/254) exceeds one within a single layer,
    so these thresholds are the claim itself, "agrees mostly"; they hold with a margin of
    several times on the weights' rounding and on the int8 input's (127 levels a row)."""
    full = run.translate(texts, beam_size=1, max_new_tokens=30, engine="ctranslate2")
    engine = CTranslate2Engine(run, model_dir=folder, compute_type=compute_type)
    quantized = run.translate(texts, beam_size=1, max_new_tokens=30, engine=engine)
    assert np.mean([a == b for a, b in zip(full, quantized, strict=True)]) >= 0.7
    tok = run.target_tokenizer
    outputs = [[tok.id_to_token(i) for i in tok.encode(t)] for t in full]
    per_token = [np.concatenate([r.log_probs for r in ctranslate2.Translator(
        path, intra_threads=1, compute_type=kind).score_batch([list(t) for t in texts],
                                                              outputs)])
        for path, kind in ((default_export_dir(trained), "default"), (folder, compute_type))]
    change = np.abs(per_token[0] - per_token[1])
    assert change.max() < 0.2 and change.mean() < 0.03


def test_int8_export_agrees_mostly_with_float32(trained):
    """The export's 8-bit weights, on any host: the int8 folder is smaller, and run with
    float32 products (``compute_type="float32"`` dequantizes the weights when loading) it
    agrees mostly with float32: only the weights' rounding differs, and float32 rounding,
    whatever the kernels, is far below it."""
    run = transformerkit.load(trained)
    int8 = export_run(run, quantization="int8", force=True)
    assert int8 == default_export_dir(trained, "int8")
    assert os.path.getsize(os.path.join(int8, "model.bin")) < \
        os.path.getsize(os.path.join(ensure_export(run), "model.bin"))
    assert_agrees_mostly(run, trained, sentences(100, seed=1), int8, "float32")


def test_int8_products_agree_mostly_with_float32(trained):
    """CTranslate2's int8 products on the int8 export: agree mostly with float32 where its
    GEMM sums exactly (:func:`ctranslate2_int8_sums_exactly`, from the hardware); skipped,
    saying why, where it saturates."""
    exact, why = ctranslate2_int8_sums_exactly()
    if not exact:
        pytest.skip(f"CTranslate2's int8 products are not exact here: {why}")
    run = transformerkit.load(trained)
    int8 = ensure_export(run, quantization="int8")
    assert_agrees_mostly(run, trained, sentences(100, seed=1), int8, "default")


def test_beam_nbest_and_sampling_options_map(trained):
    run = transformerkit.load(trained)
    text = sentences(1, seed=5)[0]
    best = run.translate([text], beam_size=3, n_best=3, engine="ctranslate2")[0]
    assert len(best) == 3 and all(isinstance(s, float) for _, s in best)
    assert [s for _, s in best] == sorted((s for _, s in best), reverse=True)
    greedy = run.translate(text, beam_size=1, engine="ctranslate2")
    # exact: the same CTranslate2 kernels on the same batch; top-k 1 keeps the arg-max only
    assert run.translate(text, temperature=1.0, top_k=1, engine="ctranslate2") == greedy
    a, b = (run.translate([text] * 4, temperature=1.5, seed=7, engine="ctranslate2")
            for _ in range(2))
    assert a == b
    short = run.translate(text, beam_size=1, max_new_tokens=2, engine="ctranslate2")
    assert len(run.target_tokenizer.encode(short)) <= 2
    with pytest.raises(ValueError, match="engine must be"):
        run.translate(text, engine="onnx")
    # the Keras engine's checks of the input, before CTranslate2 sees it
    for texts, options, error, message in [
            (None, {}, TypeError, "texts must be a str or a list of str"),
            ([text, 3], {}, TypeError, "text 1 is int, not str"),
            (text, dict(beam_size=0), ValueError, "beam_size must be at least 1"),
            (text, dict(alpha="x"), TypeError, "alpha .length penalty. must be a number"),
            (text, dict(temperature=1.0, top_k=0), ValueError, "top_k must be at least 1"),
            (text, dict(temperature=1.0, seed="x"), TypeError, "seed must be an int")]:
        with pytest.raises(error, match=message):
            run.translate(texts, engine="ctranslate2", **options)


def test_gpt_run_generates_with_ctranslate2(tmp_path):
    keras.utils.set_random_seed(4)
    model = randomized(GPT(TOKENIZER.vocab_size, num_layers=1, d_model=16, num_heads=2,
                           d_ff=32, max_length=24), np.array([[5, 6]]))
    TOKENIZER.save(tmp_path / "tokenizer.json")
    run = Run(model, resolve({"model": {"type": "gpt"}}), TOKENIZER, TOKENIZER, str(tmp_path))
    options = dict(max_new_tokens=10, temperature=0, stop_at_eos=False)
    theirs = run.generate("hello", engine="ctranslate2", **options)
    ours = run.generate("hello", **options)
    prompt = TOKENIZER.encode("hello")  # the continuations: the same except at a near-tie
    assert theirs.startswith("hello") and ours.startswith("hello")
    assert_same_ids_or_near_tie([TOKENIZER.encode(theirs)[len(prompt):]],
                                [TOKENIZER.encode(ours)[len(prompt):]],
                                next_logits_after(model, prompts=[prompt]))
    with pytest.raises(ValueError, match="max_length=24"):
        run.generate("hello", max_new_tokens=30, engine="ctranslate2")
    # ours counts the prompt's n-grams (as transformers does), CTranslate2's generator not
    with pytest.raises(ValueError, match="counts the n-grams of the new tokens only"):
        run.generate("hello", no_repeat_ngram_size=2, engine="ctranslate2", **options)


def test_cli_export_and_translate_with_ctranslate2(trained, capsys, monkeypatch):
    monkeypatch.setenv("TRANSFORMERKIT_MALLOC", "system")
    out = trained.parent / "cli_export"
    assert cli.main(["export", str(trained), "--format", "ctranslate2", "--quantization",
                     "float32", "--out", str(out)]) == 0
    assert os.path.isfile(out / "model.bin") and os.path.isfile(out / "source_tokenizer.json")
    assert cli.main(["export", str(trained), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    texts = sentences(3, seed=9)
    results = {}
    for engine in ("keras", "ctranslate2"):
        capsys.readouterr()
        assert cli.main(["translate", str(trained), "--beam", "1", "--engine", engine,
                         "--threads", "1", *texts]) == 0
        results[engine] = capsys.readouterr().out
    assert results["keras"].count("\n") == 3 == results["ctranslate2"].count("\n")
    assert_same_texts_or_near_tie(transformerkit.load(trained), texts,  # near-ties allowed
                                  results["keras"].splitlines(),
                                  results["ctranslate2"].splitlines())


# -- a current export answers without Keras ------------------------------------------------------
CLI_PROCESS = """
import json, sys
from transformerkit.cli import main
code = main(sys.argv[1:])
print(json.dumps([code, sorted(m for m in ("keras", "torch", "jax", "tensorflow")
                               if m in sys.modules)]))
"""


def cli_process(*argv, code=0):
    """``transformerkit ARGV`` in a new process (PyTorch the backend, whose weights tell when
    they were written), which exits with ``code``: ``(its output lines, the frameworks it
    imported, its stderr)``."""
    child = subprocess.run([sys.executable, "-c", CLI_PROCESS, *argv], capture_output=True,
                           text=True, check=True, env=dict(
                               os.environ, KERAS_BACKEND="torch", TRANSFORMERKIT_MALLOC="system"))
    *lines, last = child.stdout.splitlines()
    exited, imported = json.loads(last)
    assert exited == code, child.stderr
    return lines, imported, child.stderr


def test_a_current_export_translates_without_keras_or_the_model_file(trained, tmp_path):
    """``translate --engine ctranslate2`` with a current export imports neither Keras nor
    PyTorch, with or without the ``.keras`` file; a changed ``.keras`` file is loaded and
    exported again."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("ctranslate2*"))
    texts = sentences(4, seed=5)
    argv = ["translate", str(run_dir), "--beam", "1", "--engine", "ctranslate2",
            "--threads", "1", *texts]
    first, imported, _ = cli_process(*argv)  # the first use exports: the model is loaded
    assert "keras" in imported and len(first) == len(texts)
    assert read_metadata(default_export_dir(run_dir))["model_file_sha256"] == \
        file_sha256(run_dir / "model.keras")
    assert cli_process(*argv)[:2] == (first, [])
    os.rename(run_dir / "model.keras", tmp_path / "kept.keras")  # the export kept alone
    assert cli_process(*argv)[:2] == (first, [])
    # another checkpoint is not what the export stands for: loaded, here a clear error
    *_, error = cli_process(*argv, "--checkpoint", "epoch-0099.keras", code=2)
    assert "epoch-0099.keras" in error and "Traceback" not in error
    model = transformerkit.load(run_dir.parent / "run", checkpoint=str(tmp_path / "kept.keras"),
                                engine="keras").model
    weight = model.weights[0]
    weight.assign(keras.ops.convert_to_numpy(weight) * 1.5)
    model.save(run_dir / "model.keras")  # other weights under the same name: exported again
    changed, imported, _ = cli_process(*argv)
    assert "keras" in imported
    assert read_metadata(default_export_dir(run_dir))["model_file_sha256"] == \
        file_sha256(run_dir / "model.keras")
    run = transformerkit.load(run_dir)
    assert_same_texts_or_near_tie(run, texts, run.translate(texts, beam_size=1), changed)


SERVE_PROCESS = """
import json, sys, time
from fastapi.testclient import TestClient
from transformerkit.decoding.options import RuntimeOptions
from transformerkit.serving.server import build_app
app = build_app([sys.argv[1]], RuntimeOptions(engine="ctranslate2", threads=1))
with TestClient(app) as client:
    deadline = time.monotonic() + 120
    while client.get("/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    answer = client.post("/translate", json={"texts": sys.argv[2:], "beam_size": 1}).json()
    models = client.get("/models").json()["models"]
print(json.dumps([answer, models, sorted(m for m in ("keras", "torch", "jax", "tensorflow")
                                       if m in sys.modules)]))
"""


def test_a_server_answers_from_a_current_export_without_keras(trained, tmp_path):
    """``serve --engine ctranslate2`` with a current export loads, warms up, translates and
    describes its model (``GET /models``: parameters, max_length) without importing Keras
    or PyTorch, and says what the keras engine's server says."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("ctranslate2*"))
    texts = sentences(3, seed=6)
    run = transformerkit.load(run_dir)
    ensure_export(run)  # the export, recording the file (as a first use makes it)

    def serve(*argv):
        child = subprocess.run([sys.executable, "-c", SERVE_PROCESS, *argv],
                               capture_output=True, text=True, check=True,
                               env=dict(os.environ, KERAS_BACKEND="torch"))
        return json.loads(child.stdout.splitlines()[-1])

    answer, models, imported = serve(str(run_dir), *texts)
    assert imported == []
    assert answer["translations"] == run.translate(texts, beam_size=1, engine="ctranslate2")
    assert models[0]["parameters"] == run.model.count_params() > 0
    assert models[0]["max_length"] == run.model.max_length
    assert models[0]["engine"] == "ctranslate2"


def test_a_gpt_run_generates_from_a_current_export_without_keras(tmp_path):
    """``generate --engine ctranslate2`` of a trained GPT run: the first use exports (the
    model loaded), the next imports neither Keras nor PyTorch and continues the prompt
    the same way."""
    from transformerkit.training.trainer import train

    run_dir = tmp_path / "gpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSFORMERKIT_MALLOC", "system")
        train(tiny_gpt_config(tmp_path, steps=5), run_dir)
    argv = ["generate", str(run_dir), "--prompt", "ein zwei", "--max-new-tokens", "12",
            "--temperature", "0", "--engine", "ctranslate2", "--threads", "1"]
    first, imported, _ = cli_process(*argv)
    assert "keras" in imported and first and first[0].startswith("ein zwei")
    assert cli_process(*argv)[:2] == (first, [])
