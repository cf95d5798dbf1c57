"""The decoder step compiled ahead of time (``use_cache="compiled"``, ``--engine compiled``)
equals the eager step it is captured from: logits within two float32 paths' bound, ids the
same or apart at a near-tie; packages are cached on disk, a corrupt one is rebuilt, and
where AOTInductor is missing the eager step runs with a warning.

Each package compiles in 10-30 s on 2 cores, so these are slow tests on small models.
"""

import os
import warnings

import bfloat16_bounds as bounds
import keras
import numpy as np
import pytest
import tolerances as tol
from near_ties import assert_same_ids_or_near_tie, next_logits_after

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(keras.backend.backend() != "torch",
                                 reason="the compiled step is PyTorch's (AOTInductor)")]

SMALL = dict(num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=12, dropout=0.0)
SOURCE = np.array([[5, 6, 7, 2], [8, 9, 2, 0], [11, 2, 0, 0]], "int32")


@pytest.fixture(scope="module")
def package_directory(tmp_path_factory):
    """The packages of this module's tests, in a folder of their own
    (``$TRANSFORMERKIT_CACHE``)."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("cache")
        patch.setenv("TRANSFORMERKIT_CACHE", str(root))
        yield root / "compiled"


@pytest.fixture(autouse=True)
def fresh_process(package_directory, monkeypatch):
    """As in a new process: no package loaded yet (they come from the module's folder)."""
    from transformerkit import fastpath
    from transformerkit.decoding import aot_search, aot_step

    monkeypatch.setattr(fastpath, "ENABLED", True)
    aot_step._RUNNERS.clear()
    aot_search._LOADED.clear()
    yield
    aot_step._RUNNERS.clear()
    aot_search._LOADED.clear()


@pytest.fixture(scope="module")
def transformer():
    """A Marian-shaped Transformer (tied tables, swish, split sinusoids, a logits bias)."""
    from transformerkit.models import Transformer

    keras.utils.set_random_seed(5)
    model = Transformer(30, 30, tie_embeddings="all", activation="swish",
                        positional="sinusoidal_split", scale_embeddings=False,
                        final_logits_bias=True, **SMALL)
    model.build(None)
    model.logits_bias.bias.assign(np.random.default_rng(1).normal(size=30) * 3)
    return model


def test_compiled_steps_equal_the_eager_steps(transformer, monkeypatch):
    """Teacher-forced on the same ids, every step's logits within two paths' bound of the
    eager step's (the compiled kernels sum in other orders): one row a sentence (greedy)
    and several (a beam search's ``copies`` rows, which share their sentence's memory), in
    the small-rows package and the other; the memories stay one per sentence."""
    import torch

    from transformerkit.decoding.aot_step import CompiledSteps
    from transformerkit.decoding.steps import EagerSteps, make_steps

    compiled, eager = make_steps(transformer, "compiled"), make_steps(transformer, True)
    assert isinstance(compiled, CompiledSteps) and type(eager) is EagerSteps
    roundings = tol.model_roundings(transformer, SOURCE.shape[1], 9)
    # (sentences, beams a sentence): 3 rows and 4 (the small-rows package), 9 and 12
    for source, copies in ((SOURCE, 1), (SOURCE[:2], 2), (np.tile(SOURCE, (3, 1)), 1),
                           (SOURCE, 4)):
        rows = len(source) * copies
        buffer = np.random.default_rng(rows).integers(3, 30, (rows, 9)).astype("int32")
        with torch.no_grad():
            state_c, static_c = compiled.start(source, 9, copies)
            state_e, static_e = eager.start(source, 9, copies)
            assert static_c[1][0][0].shape[0] == len(source)  # one memory a sentence
            for index in range(8):
                a, state_c = compiled.step(buffer, index, state_c, static_c)
                b, state_e = eager.step(buffer, index, state_e, static_e)
                b = b.numpy()
                tol.assert_within(a.numpy(), b, tol.chain_atol(roundings, b, paths=2),
                                  f"{rows} rows, {copies} a sentence, step {index}")
    assert compiled.runner() is not None  # compiled, not the eager fallback

    # a beam search's first step (one row a sentence, copied to its beams): the package's
    eager_calls = []
    decode_step = type(transformer).decode_step
    monkeypatch.setattr(type(transformer), "decode_step",
                        lambda self, *a, **k: eager_calls.append(1) or decode_step(self, *a, **k))
    for source, copies in ((SOURCE, 4), (np.tile(SOURCE, (3, 1)), 2)):
        buffer = np.full((len(source) * copies, 9), 1, "int32")
        with torch.no_grad():
            state_c, static_c = compiled.start(source, 9, copies)
            state_e, static_e = eager.start(source, 9, copies)
            a, state_c = compiled.first_step_of_copies(buffer, state_c, static_c)
            b, state_e = eager.first_step_of_copies(buffer, state_e, static_e)
        b = b.numpy()
        tol.assert_within(a.numpy(), b, tol.chain_atol(roundings, b, paths=2),
                          f"the first step, {copies} a sentence")
        for pair_c, pair_e in zip(state_c.caches, state_e, strict=True):
            for t_c, t_e in zip(pair_c, pair_e, strict=True):
                t_e = t_e[0].numpy()
                tol.assert_within(t_c[0].numpy(), t_e, tol.chain_atol(roundings, t_e, paths=2),
                                  "position 0 of the caches")
        assert len(eager_calls) == 1  # the eager step's only
        eager_calls.clear()


def test_compiled_bfloat16_steps_stay_within_the_bfloat16_bound(transformer):
    """``precision="bfloat16"``: the compiled step's logits (bfloat16 products as Inductor
    packs them, or float32 ones on rounded weights where oneDNN has no bfloat16 units) stay
    within the bfloat16 decoding bound of the eager float32 step's, as the eager bfloat16
    step's do; the package is its own (the precision is part of its key), and building it
    leaves the keys as they were (the compiler once added entries to the options it was
    given, renaming every later package of the process)."""
    import torch

    from transformerkit.decoding import aot_step
    from transformerkit.decoding.steps import make_steps

    keys = {p: aot_step.package_key(transformer, "small", p) for p in aot_step.PRECISIONS}
    assert keys["float32"] != keys["bfloat16"]
    source = SOURCE[:2]
    compiled = make_steps(transformer, "compiled", "bfloat16")
    float32 = make_steps(transformer, True, "float32")
    eager16 = make_steps(transformer, True, "bfloat16")
    buffer = np.random.default_rng(1).integers(3, 30, (len(source), 9)).astype("int32")
    logits = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bfloat16 emulated on this CPU
        for name, steps in (("compiled", compiled), ("float32", float32), ("eager", eager16)):
            with torch.no_grad():
                state, static = steps.start(source, 9)
                logits[name] = np.stack([steps.step(buffer, i, state, static)[0].numpy()
                                         for i in range(8)], 1)
    assert compiled.runner() is not None  # compiled, not the eager fallback
    expected = logits["float32"]
    atol = bounds.decoding_atol(transformer, expected,
                                tol.model_roundings(transformer, SOURCE.shape[1], 9))
    for name in ("compiled", "eager"):
        tol.assert_within(logits[name], expected, atol, f"{name} bfloat16")
    assert np.abs(logits["compiled"] - expected).max() > 0  # bfloat16 did change the products
    assert {p: aot_step.package_key(transformer, "small", p) for p in keys} == keys


def test_compiled_int8_steps_equal_the_eager_step_of_the_same_int8_weights(transformer,
                                                                          monkeypatch):
    """``precision="int8"``: the compiled step (int8 weights by each input row quantized to
    8 bits, ``kernels/lowprec.py``) against the eager ``decode_step`` of the same weights in
    the same form (``step_weights("int8", packed=False)`` in the form
    ``rows_quantized_weights`` gives), in both row buckets: within two bfloat16 paths' bound
    (the integer sums are exact and the two differ by float32 sums and scalings, unless an
    input lands on another level, which moves a sum by one step of ``2 |x|max / 255`` times
    a weight); the package is its own, and int8 changed the products (the bfloat16 step's
    logits are not its)."""
    import torch

    from transformerkit.decoding import aot_step
    from transformerkit.decoding.steps import make_steps
    from transformerkit.kernels import lowprec
    from transformerkit.models.base import TransformerBase

    keys = {p: aot_step.package_key(transformer, "small", p) for p in aot_step.PRECISIONS}
    assert len(set(keys.values())) == 3
    roundings = tol.model_roundings(transformer, SOURCE.shape[1], 9)
    packed_weights = TransformerBase.step_weights

    def unpacked_weights(self, precision, packed=True):
        return lowprec.rows_quantized_weights(packed_weights(self, precision, False))

    def teacher_forced(steps, source):
        buffer = np.random.default_rng(len(source)).integers(3, 30, (len(source), 9))
        with torch.no_grad():
            state, static = steps.start(source, 9)
            return np.stack([steps.step(buffer.astype("int32"), i, state, static)[0].numpy()
                             for i in range(8)], 1)

    for source in (SOURCE, np.tile(SOURCE, (3, 1))):  # 3 rows (small), 9 (large)
        compiled = make_steps(transformer, "compiled", "int8")
        got = teacher_forced(compiled, source)
        assert compiled.runner() is not None  # compiled, not the eager fallback
        bfloat16 = teacher_forced(make_steps(transformer, True, "bfloat16"), source)
        with monkeypatch.context() as patch:  # the eager step of the unpacked int8 weights
            patch.setattr(TransformerBase, "step_weights", unpacked_weights)
            expected = teacher_forced(make_steps(transformer, True, "int8"), source)
        atol = 2 * bounds.decoding_atol(transformer, expected, roundings)
        tol.assert_within(got, expected, atol, f"int8, {len(source)} rows")
        assert np.abs(got - bfloat16).max() > np.abs(got - expected).max()


def test_compiled_searches_equal_the_eager_ones_and_packages_are_cached(transformer,
                                                                      package_directory,
                                                                      capfd):
    """Greedy (3 rows: the small-rows package) and beam 3 (9 rows: the other) with the
    compiled step give the eager step's ids (or differ at a near-tie); the packages (one per
    row bucket, and the encoder's) are loaded from disk in a new process, not built again; a
    corrupt package is rebuilt. The beam search's work has a package of its own, cached the
    same way."""
    from transformerkit.decoding import aot_search, aot_step, beam_translate, greedy_translate

    def searches(use_cache):
        return (greedy_translate(transformer, SOURCE, max_new_tokens=10, use_cache=use_cache),
                [h[0].ids for h in beam_translate(transformer, SOURCE, beam_size=3,
                                                  max_new_tokens=10, use_cache=use_cache)])

    eager = searches(True)
    compiled = searches("compiled")
    next_logits = next_logits_after(transformer, SOURCE)
    for a, b, what in zip(eager, compiled, ("greedy", "beam 3"), strict=True):
        assert_same_ids_or_near_tie(a, b, next_logits, what)
    packages = [package_directory / f"step-{aot_step.package_key(transformer, bucket)}.pt2"
                for bucket in aot_step.BUCKETS]
    packages.append(package_directory /
                    f"encoder-{aot_step.package_key(transformer, aot_step.ENCODER)}.pt2")
    packages += list(package_directory.glob("search-*.pt2"))  # the beam's search work
    assert all(p.is_file() for p in packages) and len(packages) == 4, packages
    capfd.readouterr()
    written = {p: p.stat().st_mtime_ns for p in packages}

    def new_process():  # the packages come from disk
        aot_step._RUNNERS.clear()
        aot_search._LOADED.clear()

    new_process()
    assert searches("compiled") == compiled
    assert "compiling" not in capfd.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in packages} == written

    new_process()
    packages[0].write_bytes(b"not a package")
    packages[-1].write_bytes(b"not a package either")
    assert searches("compiled") == compiled
    err = capfd.readouterr().err
    assert "rebuilding the compiled step" in err and "rebuilding the compiled search" in err
    assert packages[0].stat().st_size > 1000 and packages[-1].stat().st_size > 1000


def test_the_encoder_pass_runs_as_its_package(transformer, monkeypatch):
    """The compiled engine's start: the encoder pass and every block's cross-attention
    memory come from the encoder's package (the eager encoder does not run), within two
    paths' bound of the eager memories, for padded and unpadded sources, one sentence and
    several, and a source of nothing but padding (its output zeroed by ``keep``, as the
    eager one's); out-of-range ids are the eager check's clear error."""
    import torch

    from transformerkit.decoding.steps import make_steps

    compiled, eager = make_steps(transformer, "compiled"), make_steps(transformer, True)
    with torch.no_grad():
        compiled.start(SOURCE, 9, 1)  # loads or builds the packages (a build traces the code)
    calls = []
    encode = type(transformer).inference_encode
    monkeypatch.setattr(type(transformer), "inference_encode",
                        lambda self, *a, **k: calls.append(1) or encode(self, *a, **k))
    sources = (SOURCE, SOURCE[:1, :3], np.tile(SOURCE, (5, 1)),
               np.array([[5, 6, 2, 0], [0, 0, 0, 0]], "int32"))
    for source in sources:
        with torch.no_grad():
            _, (_, memories_c, _) = compiled.start(source, 9, 2)
            assert not calls, "the eager encoder ran"
            _, (_, memories_e, _) = eager.start(source, 9, 2)
        calls.clear()
        bound = tol.model_roundings(transformer, source.shape[1], 1)
        for memory_c, memory_e in zip(memories_c, memories_e, strict=True):
            keys_c, values_c, bias_c, keep_c = (t.numpy() for t in memory_c)
            keys_e, values_e, bias_e, keep_e = memory_e
            for a, b in ((keys_c, keys_e.numpy()), (values_c, values_e.numpy())):
                tol.assert_within(a, b, tol.chain_atol(bound, b, paths=2), str(source))
            np.testing.assert_array_equal(bias_c, bias_e.numpy())
            has_keys = (source != 0).any(axis=1).astype("float32").reshape(-1, 1, 1, 1)
            np.testing.assert_array_equal(keep_c, has_keys)
            assert keep_e is None or np.array_equal(keep_e.numpy(), has_keys)
    with pytest.raises(ValueError, match="source_ids contains id 99, outside the vocabulary"):
        compiled.start(np.array([[5, 99, 2]], "int32"), 9, 1)


@pytest.mark.parametrize("settings", [
    dict(beam_size=3),
    dict(beam_size=2, n_best=2, alpha=1.0, penalty="power", stopping="heuristic",
         forced_eos=True, renormalize=True, no_repeat_ngram_size=4),
    dict(beam_size=3, score_chunk=4),
    dict(beam_size=2, n_best=2, alpha=1.0, penalty="power", stopping="heuristic",
         forced_eos=True, renormalize=True, score_chunk=4),
    dict(beam_size=2, forced_eos=True, score_chunk=4)],
    ids=["defaults", "transformers-rules", "defaults-unwritten", "rules-unwritten",
         "forced-unwritten"])
def test_a_beam_search_runs_its_step_work_compiled_as_the_eager_work(transformer,
                                                                    package_directory,
                                                                    monkeypatch, settings):
    """A compiled-engine beam search runs its search's work of every step (the candidates,
    the finished hypotheses, the next beams, whose search is over) through its package:
    at each step of a real search, from the same state and logits, the package gives the
    eager function's result: the same ids, rows and flags, scores within float32 rounding
    (of the beams and finished slots whose score is finite: which of several tied -inf
    candidates fills a slot, the selection leaves open).
    The hypotheses equal the eager engine's. With ``min_new_tokens`` (a rule the package
    cannot hold) the work runs eagerly, without a warning. ``score_chunk``: chunks narrow
    enough for the 30-word vocabulary to take the captured graph's selection that never
    writes the scores (``beam.SCORE_CHUNK``; leftover columns at 4)."""
    from transformerkit.decoding import aot_search, beam, beam_translate
    from transformerkit.decoding.aot_step import CompiledSteps

    settings = dict(settings)
    unwritten = "score_chunk" in settings
    monkeypatch.setattr(beam, "SCORE_CHUNK", settings.pop("score_chunk", beam.SCORE_CHUNK))
    captured = []
    grouped_top_k = beam.grouped_top_k
    monkeypatch.setattr(beam, "grouped_top_k",
                        lambda *a, **k: captured.append(1) or grouped_top_k(*a, **k))

    calls = []
    original = CompiledSteps.search_work

    def checked(self, work, search_settings):
        compiled = original(self, work, search_settings)
        assert compiled is not work, "the compiled search work is unavailable"

        def both(logits, s, index):
            new, rows, done = compiled(logits, s, index)
            want_new, want_rows, want_done = work(logits.clone(), s, index)
            calls.append(index)
            assert new["index"] == want_new["index"] == index + 1
            # a beam or a finished slot at -inf holds nothing (which of the tied -inf
            # candidates fills it is left open, as top_k leaves ties): compared where finite
            live, kept = (np.isfinite(want_new[name].numpy().reshape(-1))
                          for name in ("alive_logp", "finished_score"))
            for name in ("alive_logp", "finished_score"):
                np.testing.assert_array_equal(np.isfinite(new[name].numpy().reshape(-1)),
                                              live if name == "alive_logp" else kept)
            for name in aot_search.CHANGED:
                got, want = new[name].numpy(), want_new[name].numpy()
                rows_of = live if name.startswith("alive") else kept
                got, want = got.reshape(len(rows_of), -1), want.reshape(len(rows_of), -1)
                got, want = got[rows_of], want[rows_of]
                if got.dtype.kind == "f":
                    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)
                else:
                    np.testing.assert_array_equal(got, want, err_msg=name)
            np.testing.assert_array_equal(rows.numpy()[live], want_rows.numpy()[live])
            np.testing.assert_array_equal(done.numpy(), want_done.numpy())
            return new, rows, done

        return both

    eager = beam_translate(transformer, SOURCE, max_new_tokens=10, **settings)
    with monkeypatch.context() as patch:
        patch.setattr(CompiledSteps, "search_work", checked)
        compiled = beam_translate(transformer, SOURCE, max_new_tokens=10,
                                  use_cache="compiled", **settings)
    assert len(calls) >= 3 and calls[0] == 0
    assert [[h.ids for h in n] for n in compiled] == [[h.ids for h in n] for n in eager]
    for got, want in zip(compiled, eager, strict=True):
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want],
                                   rtol=1e-5)
    assert len(list(package_directory.glob("search-*.pt2"))) >= 1
    assert bool(captured) == unwritten  # the package's selection: captured once, when built

    used = []
    with monkeypatch.context() as patch:
        patch.setattr(aot_search, "compiled_search_work", lambda *a: used.append(a))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ruled = beam_translate(transformer, SOURCE, max_new_tokens=10, min_new_tokens=2,
                                   use_cache="compiled", **settings)
    assert used == [] and all(len(h[0].ids) >= 2 for h in ruled)
    if settings.get("no_repeat_ngram_size"):  # buffers too narrow for the package: eager
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            short = beam_translate(transformer, SOURCE, max_new_tokens=3,
                                   use_cache="compiled", **settings)
        assert [[h.ids for h in n] for n in short] == [
            [h.ids for h in n] for n in beam_translate(transformer, SOURCE, max_new_tokens=3,
                                                       **settings)]


def test_changed_weights_get_a_package_of_their_own(transformer, package_directory):
    """A package is named by what it depends on: the same weights in a second model object
    (another Keras name) share it; other weights (an ``assign``) build another, which
    decodes by them."""
    from transformerkit.decoding import aot_step, greedy_translate

    first = aot_step.package_key(transformer)
    config = {k: v for k, v in transformer.get_config().items() if k != "name"}
    twin = type(transformer).from_config(config)  # named by Keras: "transformer_1"
    twin.build(None)
    twin.set_weights(transformer.get_weights())
    assert twin.name != transformer.name and aot_step.package_key(twin) == first
    with pytest.MonkeyPatch.context() as patch:  # code vectorized for another ISA than now
        other = "default" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else "avx2"
        patch.setenv("ATEN_CPU_CAPABILITY", other)
        assert aot_step.package_key(transformer) != first
    old = transformer.logits_bias.bias.numpy()
    try:
        transformer.logits_bias.bias.assign(old[::-1].copy())
        assert aot_step.package_key(transformer) != first
        eager = greedy_translate(transformer, SOURCE, max_new_tokens=6)
        compiled = greedy_translate(transformer, SOURCE, max_new_tokens=6, use_cache="compiled")
        assert_same_ids_or_near_tie(eager, compiled, next_logits_after(transformer, SOURCE))
    finally:
        transformer.logits_bias.bias.assign(old)
    assert aot_step.package_key(transformer) == first


def test_a_package_is_named_by_the_threads_its_kernels_run_on(transformer):
    """Inductor writes PyTorch's intra-op thread count at build time into a package's C++
    (its GEMM templates' ``num_threads``, its loops' OpenMP regions): a process on another
    count gets step, encoder and search packages of its own, not one made for 1 thread run
    on 2 (or for 2 on 1)."""
    import torch

    from transformerkit.decoding import aot_search, aot_step

    def keys():
        return (aot_step.package_key(transformer), aot_step.package_key(transformer, "large"),
                aot_step.package_key(transformer, aot_step.ENCODER),
                aot_search.package_key(work, {"beam": 4}))

    def work(logits, s, index):  # a search's work of a step, as aot_search takes one
        return logits

    before = torch.get_num_threads()
    first = keys()
    try:
        torch.set_num_threads(before + 1)
        other = keys()
    finally:
        torch.set_num_threads(before)
    assert all(a != b for a, b in zip(first, other, strict=True)) and keys() == first


def test_a_package_runs_from_its_library_extracted_once(tmp_path):
    """A CPU package's library is extracted once beside it (named by its CRC-32) and runs
    from there, giving what PyTorch's own package loader gives; a library damaged on disk is
    removed and the package loads all the same (extracted again at the next load); a
    package holding more than its library, sources and metadata, or whose library cannot be
    written, loads through PyTorch's loader, with nothing extracted."""
    import zipfile

    import torch

    from transformerkit import internals
    from transformerkit.decoding import aot_packages

    if internals.get("aoti_runner_cpu") is None:
        pytest.skip("this PyTorch has no AOTInductor CPU runner")

    class Product(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", torch.randn(4, 8, generator=torch.manual_seed(0)))

        def forward(self, rows):
            return (torch.relu(rows @ self.weight.T),)

    path = str(tmp_path / "product.pt2")
    with torch.no_grad():
        program = torch.export.export(Product().eval(), (torch.randn(3, 8),))
    aot_packages.compile_program(program, path)
    rows = torch.randn(3, 8, generator=torch.manual_seed(1))
    with zipfile.ZipFile(path) as archive:
        crc = next(e.CRC for e in archive.infolist() if e.filename.endswith(".so"))
    library = tmp_path / f"product-{crc:08x}.so"
    assert aot_packages._extracted_library(path) == str(library)
    # damaged before any load (a dlopen'ed library is never written: extraction replaces)
    library.write_bytes(b"\0" * library.stat().st_size)
    loader = internals.get("aoti_package_loader")(path, "model", False, 1, -1)
    expected = loader.boxed_run([rows])[0]
    assert torch.equal(aot_packages.load(path)([rows])[0], expected)  # the package's loader
    assert not library.exists()

    got = aot_packages.load(path)([rows])[0]  # extracted again, and run from there
    assert sorted(p.name for p in tmp_path.glob("*.so")) == [library.name]
    assert torch.equal(got, expected)  # the same library: the same kernels, bit for bit
    written = library.stat().st_mtime_ns
    assert torch.equal(aot_packages.load(path)([rows])[0], expected)
    assert library.stat().st_mtime_ns == written  # not extracted again

    library.unlink()  # where it cannot be written (a full disk): the package's loader
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(aot_packages.tempfile, "mkstemp",
                      lambda **_: (_ for _ in ()).throw(OSError(28, "No space left on device")))
        assert torch.equal(aot_packages.load(path)([rows])[0], expected)
    assert not library.exists()

    other = tmp_path / "other.pt2"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(other, "w") as copy:
        for entry in source.infolist():
            copy.writestr(entry, source.read(entry))
        copy.writestr("product/data/constants/weights.bin", b"weights kept apart")
    assert torch.equal(aot_packages.load(str(other))([rows])[0], expected)
    assert not list(tmp_path.glob("other-*.so"))


def test_a_package_compiles_with_the_library_s_two_lines_and_nothing_of_inductor_s(
        tmp_path, capfd, monkeypatch):
    """A build whose products are autotuned (the large-rows bucket's options) prints its
    "compiling" and "compiled" lines and nothing else on stderr: Inductor's report of each
    autotuning (a JSON line of its choices' statistics and a table of their times, on by
    default) is turned off in the options the compiler gets, which stay the caller's. A
    fresh Inductor cache: a cached tuning prints no table."""
    import torch

    from transformerkit import internals
    from transformerkit.decoding import aot_packages

    if internals.get("aoti_compile_and_package") is None:
        pytest.skip("this PyTorch has no AOTInductor")
    linear = torch.nn.Linear(64, 128).eval()
    options = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "ATEN,CPP"}
    given = dict(options)

    def build(path):
        with torch.no_grad():
            program = torch.export.export(linear, (torch.randn(8, 64),))
        aot_packages.compile_program(program, path, options)

    path = str(tmp_path / f"step-{'e' * 32}.pt2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    capfd.readouterr()
    run = aot_packages.load_or_build(path, build, "the test package", "a product",
                                     "running eagerly")
    rows = torch.randn(8, 64, generator=torch.manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(run([rows])[0], linear(rows), rtol=1e-5, atol=1e-5)
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == "transformerkit: compiling a product ..."
    assert lines[1].startswith("transformerkit: compiled a product in ") and len(lines) == 2
    assert options == given
    assert aot_packages.quiet_configs(options) == {**options,
                                                   "max_autotune_report_choices_stats": False,
                                                   "autotune_num_choices_displayed": 0}


def test_a_gpt_prompt_package_fills_the_caches_as_the_eager_pass(package_directory):
    """The prompt package (``decode_prefill`` captured, its rows and length dynamic) writes
    into the caches' first positions what the eager pass writes there, within two float32
    paths' bound, for one row and for several, a short prompt and one of ``max_length - 1``
    positions; the positions after the prompt are left as they were."""
    import torch

    from transformerkit.decoding import aot_step
    from transformerkit.decoding.compiled import to_numpy
    from transformerkit.models import GPT

    keras.utils.set_random_seed(4)
    model = GPT(30, **SMALL)
    model.build(None)
    fill = aot_step.Packages(model, str(package_directory), "float32").get(aot_step.PREFILL)
    assert fill is not None
    generator = torch.Generator().manual_seed(0)
    for rows, length in ((1, 4), (3, SMALL["max_length"] - 1)):
        tokens = torch.randint(3, 30, (rows, length), generator=generator)
        shape = (SMALL["max_length"], rows, model.num_heads, model.key_dim)
        eager = [(torch.full(shape, 7.0), torch.full(shape, 7.0)) for _ in range(2)]
        got = [(torch.full(shape, 7.0), torch.full(shape, 7.0)) for _ in range(2)]
        with torch.inference_mode():
            model.decode_prefill(tokens, eager, model.step_weights("float32"))
            fill(tokens, [tuple(t[:length] for t in pair) for pair in got])
        for layer, (pair, want_pair) in enumerate(zip(got, eager, strict=True)):
            for t, want, name in zip(pair, want_pair, ("keys", "values"), strict=True):
                want = to_numpy(want[:length])
                tol.assert_within(to_numpy(t[:length]), want, tol.chain_atol(
                    tol.model_roundings(model, target_len=length), want, paths=2),
                    f"{name} of block {layer}, {rows} rows, {length} positions")
                assert bool((t[length:] == 7.0).all()), f"{name} after the prompt were written"


def test_a_compiled_gpt_generates_as_the_eager_one():
    """``generate_ids`` with the compiled step (a prompt prefix through the eager pass,
    then the package): the eager step's tokens, or apart at a near-tie; streamed piece by
    piece (``stream_ids``) the same tokens."""
    from transformerkit.decoding import aot_step, generate_ids
    from transformerkit.decoding.streaming import stream_ids
    from transformerkit.models import GPT

    keras.utils.set_random_seed(3)
    model = GPT(30, **SMALL)
    prompts = [[5, 6], [7, 8, 9]]
    eager = generate_ids(model, prompts, max_new_tokens=8, temperature=0)
    compiled = generate_ids(model, prompts, max_new_tokens=8, temperature=0,
                            use_cache="compiled")
    assert all(run is not None for _, run in aot_step._RUNNERS[model].values())
    streamed = [i for ids in stream_ids(model, prompts[1], 8, temperature=0,
                                        use_cache="compiled") for i in ids]
    assert streamed == compiled[1]
    assert_same_ids_or_near_tie(eager, compiled, next_logits_after(model, prompts=prompts))


def test_the_steps_own_greedy_choice_equals_the_loops_choice(transformer, monkeypatch):
    """Greedy search takes the compiled step's own choice (``step_choosing``: the arg-max
    inside the package, given the token rules' bias row), which gives the ids the loop's
    eager choice gives on the same logits: a translation whose first tokens may not be EOS
    (the rules' other row), its logits returned; a GPT's prompts of different lengths (rows
    inside their prompt copy it); 6 rows, whose package leaves the choice to the loop. With
    an n-gram ban the loop chooses itself."""
    from transformerkit.decoding import aot_step, generate_ids, greedy_translate
    from transformerkit.models import GPT

    keras.utils.set_random_seed(3)
    gpt = GPT(30, **SMALL)
    calls = []
    folded = aot_step.CompiledSteps.step_choosing

    def counted(self, *args):
        calls.append(len(args[0]))
        return folded(self, *args)

    def searches(**extra):
        return (greedy_translate(transformer, SOURCE, max_new_tokens=8, min_new_tokens=3,
                                 use_cache="compiled", return_logits=True, **extra),
                generate_ids(gpt, [[5, 6], [7, 8, 9, 4]], max_new_tokens=6, temperature=0,
                             use_cache="compiled", **extra),
                # 6 rows: the many-rows package, which leaves the choice to the loop
                greedy_translate(transformer, np.tile(SOURCE, (2, 1)), max_new_tokens=4,
                                 use_cache="compiled", **extra))

    monkeypatch.setattr(aot_step.CompiledSteps, "step_choosing", counted)
    (ids, logits), generated, many = searches()
    assert len(calls) >= 8 + 6 - 1 + 1 and 6 in calls  # every step of the searches
    monkeypatch.setattr(aot_step.CompiledSteps, "step_choosing", None)  # the loop's choice
    (eager_ids, eager_logits), eager_generated, eager_many = searches()
    assert ids == eager_ids and generated == eager_generated and many == eager_many
    np.testing.assert_array_equal(logits, eager_logits)
    assert max(map(len, ids)) >= 3 and np.abs(logits).max() > 0.1

    monkeypatch.setattr(aot_step.CompiledSteps, "step_choosing", counted)
    calls.clear()
    (banned_ids, _), banned_generated, banned_many = searches(no_repeat_ngram_size=2)
    assert not calls
    monkeypatch.setattr(aot_step.CompiledSteps, "step_choosing", None)
    (again_ids, _), again_generated, again_many = searches(no_repeat_ngram_size=2)
    assert (banned_ids, banned_generated, banned_many) == (again_ids, again_generated,
                                                           again_many)


def test_without_aotinductor_the_eager_step_runs_with_one_warning(transformer, monkeypatch,
                                                                 tmp_path):
    """Packages already built load without the compiler (a deployment may lack it); where
    none is built and AOTInductor is missing, one warning and the eager step."""
    from transformerkit import internals
    from transformerkit.decoding import aot_step, greedy_translate

    expected = greedy_translate(transformer, SOURCE, max_new_tokens=6)
    first = greedy_translate(transformer, SOURCE, max_new_tokens=6, use_cache="compiled")
    monkeypatch.setitem(internals._found, "aoti_compile_and_package", None)
    aot_step._RUNNERS.clear()  # as in a new process
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the packages just built: on disk, loaded
        assert greedy_translate(transformer, SOURCE, max_new_tokens=6,
                                use_cache="compiled") == first
    monkeypatch.setenv("TRANSFORMERKIT_CACHE", str(tmp_path))  # an empty cache
    aot_step._RUNNERS.clear()
    with pytest.warns(RuntimeWarning, match="the compiled step is unavailable .*AOTInductor"):
        got = greedy_translate(transformer, SOURCE, max_new_tokens=6, use_cache="compiled")
    assert got == expected
