"""The compiled engine answering from a weights file's packages without Keras
(:mod:`transformerkit.decoding.aot_files`): ``transformerkit.load(RUN, engine="compiled")``
and ``transformerkit translate RUN TEXT --engine compiled`` in a fresh process give the
compiled engine's translations without importing Keras once the packages are built; a batch
that needs a package not built loads the model then; a changed file, a missing record or a
corrupt package never decodes with the wrong weights.

The first tests check the record and the decision without compiling anything; the rest
compile a tiny run's packages (tens of seconds), so they are slow tests.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the compiled engine is PyTorch's (AOTInductor)")

TEXTS = ["ein zwei drei", "vier fuenf", "sechs sieben acht neun"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """This module's ``$TRANSFORMERKIT_CACHE`` (its packages and records)."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("cache")
        patch.setenv("TRANSFORMERKIT_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache):
    """A tiny trained translation run."""
    from tiny_run import tiny_config

    from transformerkit.training.trainer import train

    folder = tmp_path_factory.mktemp("run")
    train(tiny_config(folder, epochs=1), folder / "run")
    return folder / "run"


def _record_of(run_dir):
    from transformerkit.decoding.aot_files import read_record
    from transformerkit.files import file_sha256

    return read_record(file_sha256(os.path.join(run_dir, "model.keras")))


def test_loading_for_the_compiled_engine_records_the_file_and_needs_its_packages(trained,
                                                                                 tmp_path):
    """``load(engine="compiled")`` records what names the file's packages (the weights'
    digest, the model's class, options and size); a stand-in needs that record and the
    packages of a one-sentence translation at its precision on disk (the model is loaded
    otherwise), and a record names one file's bytes only."""
    import transformerkit
    from transformerkit.decoding import aot_files, aot_step
    from transformerkit.files import file_sha256

    run = transformerkit.load(trained, engine="compiled")
    found = _record_of(trained)
    assert found["weights"] == aot_step.weights_digest(run.model)
    assert found["options"]["target_vocab_size"] == run.model.target_vocab_size
    assert found["parameters"] == run.model.count_params()
    digest, directory = file_sha256(trained / "model.keras"), str(tmp_path)
    assert aot_files.packaged_model(digest, "float32", directory) is None  # no record here
    aot_files.record(digest, run.model, directory)
    assert aot_files.read_record(digest, directory) == found
    packaged = aot_files.PackagedModel(found, directory)
    paths = [packaged.package_path(bucket, "float32") for bucket in (aot_step.ENCODER, "small")]
    assert paths[0] == aot_step.package_path(directory, aot_step.ENCODER, "float32",
                                             aot_step.weights_digest(run.model),
                                             aot_step.model_description(run.model))
    assert aot_files.packaged_model(digest, "float32", directory) is None  # none built
    open(paths[0], "w").close()  # empty stand-ins: only whether they are there counts here
    assert aot_files.packaged_model(digest, "float32", directory) is None
    open(paths[1], "w").close()
    stand_in = aot_files.packaged_model(digest, "float32", directory)
    assert stand_in is not None and stand_in.max_length == run.model.max_length
    assert stand_in.num_decoder_layers == run.model.num_decoder_layers
    assert aot_files.packaged_model(digest, "bfloat16", directory) is None
    assert aot_files.packaged_model("0" * 64, "float32", directory) is None


def test_a_record_of_another_format_or_unreadable_is_not_read(tmp_path):
    from transformerkit.decoding import aot_files

    path = aot_files.record_path(str(tmp_path), "ab")
    os.makedirs(os.path.dirname(path))
    for text in ("{not json", json.dumps({"format": 0, "weights": "x", "class": "Transformer",
                                          "options": {}}), "[1, 2]"):
        with open(path, "w") as f:
            f.write(text)
        assert aot_files.read_record("ab", str(tmp_path)) is None


@pytest.fixture(scope="module")
def built(trained):
    """The run's translations with the compiled engine in this process (which builds the
    encoder's, the small-rows step's and the beam search's packages, and records the
    file): greedy of each text, beam 4 of the first with its two best and their scores."""
    import transformerkit

    run = transformerkit.load(trained, engine="compiled")
    greedy = run.translate(TEXTS, beam_size=1)
    beams = run.translate(TEXTS[0], beam_size=4, n_best=2)
    assert greedy == transformerkit.load(trained).translate(TEXTS, beam_size=1)
    return {"greedy": greedy, "beams": [list(pair) for pair in beams]}


FRESH = """
import json, sys
import transformerkit
run = transformerkit.load(sys.argv[1], engine="compiled")
unloaded = run._model is None
out = {"greedy": run.translate(json.loads(sys.argv[2]), beam_size=1),
       "beams": [list(p) for p in run.translate(json.loads(sys.argv[2])[0], beam_size=4,
                                                n_best=2)],
       "unloaded": unloaded, "keras": "keras" in sys.modules,
       "max_length": run.max_length, "parameters": run.count_params()}
print(json.dumps(out))
"""


def _fresh(*args, importtime=False):
    """``python`` in a new process with this process' environment; its stdout and stderr."""
    command = [sys.executable] + (["-X", "importtime"] if importtime else []) + list(args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


@pytest.mark.slow
def test_a_fresh_process_translates_from_the_packages_without_keras(trained, built):
    """In a new process, ``load(engine="compiled")`` of the run stands the packages in for
    the model: the same greedy and beam translations and scores as the compiled engine
    gave with the model loaded, the model's size from the record, and Keras never
    imported."""
    out, _ = _fresh("-c", FRESH, str(trained), json.dumps(TEXTS))
    got = json.loads(out)
    assert got["unloaded"] and not got["keras"]
    assert got["greedy"] == built["greedy"]
    assert [text for text, _ in got["beams"]] == [text for text, _ in built["beams"]]
    assert [score for _, score in got["beams"]] == pytest.approx(
        [score for _, score in built["beams"]], abs=1e-5)
    import transformerkit

    run = transformerkit.load(trained)
    assert (got["max_length"], got["parameters"]) == (run.max_length, run.count_params())


@pytest.mark.slow
def test_the_translate_command_imports_no_keras_from_the_packages(trained, built):
    """``transformerkit translate RUN TEXT --engine compiled --beam 1`` as a user types it,
    in a new process: the compiled engine's translation, and no Keras module among those
    the process imported (``python -X importtime``)."""
    out, err = _fresh("-m", "transformerkit", "translate", str(trained), TEXTS[1],
                      "--engine", "compiled", "--beam", "1", importtime=True)
    assert out.splitlines() == [built["greedy"][1]]
    imported = [line.rsplit("|", 1)[-1].strip() for line in err.splitlines()
                if line.startswith("import time:")]
    assert "torch" in imported and not [m for m in imported if m.split(".")[0] == "keras"]


@pytest.mark.slow
def test_a_batch_needing_a_package_not_built_loads_the_model_once(trained, built, cache):
    """Beam 4 over three sentences takes the many-rows package, which no earlier
    translation built: the run loads its model then (once: it decodes with it from then
    on), builds the package, and translates as the compiled engine with the model does."""
    import transformerkit

    run = transformerkit.load(trained, engine="compiled")
    assert run._model is None
    got = run.translate(TEXTS, beam_size=4)
    assert run._model is not None
    model = run.model
    assert run.translate(TEXTS, beam_size=4) == got and run.model is model
    assert got == transformerkit.load(trained).translate(TEXTS, beam_size=4, engine="compiled")


@pytest.mark.slow
def test_a_corrupt_package_is_rebuilt_and_another_file_loads_its_model(trained, built, cache,
                                                                       tmp_path, capfd):
    """A package file that fails to load is built again from the loaded model (and the
    translation is the compiled engine's); a weights file of other bytes (another
    checkpoint) has no record, so its own model is loaded at once."""
    import shutil

    import transformerkit
    from transformerkit.decoding import aot_step

    model = transformerkit.load(trained).model
    encoder = cache / "compiled" / f"encoder-{aot_step.package_key(model, aot_step.ENCODER)}.pt2"
    encoder.write_bytes(b"not a package")
    run = transformerkit.load(trained, engine="compiled")
    assert run._model is None  # the file is there: its failure shows when it is loaded
    capfd.readouterr()
    assert run.translate(TEXTS, beam_size=1) == built["greedy"]
    assert "rebuilding the compiled step" in capfd.readouterr().err
    assert encoder.stat().st_size > 1000
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    changed = transformerkit.load(other).model
    weights = changed.get_weights()
    changed.set_weights(weights[:-1] + [weights[-1] + 1.0])
    changed.save(other / "model.keras")
    assert transformerkit.load(other, engine="compiled")._model is not None


@pytest.mark.slow
def test_a_run_translates_with_the_compiled_engine_as_users_call_it(trained, built, capsys):
    """``Run.translate(engine="compiled")`` of a run loaded for the keras engine,
    ``transformerkit translate RUN TEXT --engine compiled`` and the HTTP server with that
    engine over a run loaded either way: the keras engine's translations (a trained run's
    margins are far above float32's differences); a precision the engine cannot run is a
    clear error, from the packages' stand-in too."""
    import transformerkit
    from transformerkit import cli

    run = transformerkit.load(trained)
    expected = run.translate(TEXTS, beam_size=1)
    assert run.translate(TEXTS, beam_size=1, engine="compiled") == expected
    capsys.readouterr()
    assert cli.main(["translate", str(trained), TEXTS[0], "--beam", "1",
                     "--engine", "compiled"]) == 0
    assert capsys.readouterr().out.splitlines() == [expected[0]]
    stand_in = transformerkit.load(trained, engine="compiled")
    assert stand_in._model is None
    for served in (run, stand_in):
        with pytest.raises(ValueError, match="precision must be one of"):
            served.translate(TEXTS[0], engine="compiled", precision="int4")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from transformerkit.serving.app import create_app

    for served in (run, stand_in):
        with TestClient(create_app({"numbers": served}, engine="compiled")) as client:
            answer = client.post("/translate", json={"texts": TEXTS, "beam_size": 1}).json()
            assert answer["translations"] == expected
            described = client.get("/models").json()["models"][0]
            assert described["engine"] == "compiled"
            assert described["parameters"] == run.count_params()
    assert stand_in._model is None  # served from its packages throughout


# -- a GPT's generation from its packages -----------------------------------------------------

PROMPT = "ein zwei"


def test_a_gpt_stand_in_needs_its_small_rows_package_only(tmp_path):
    """A GPT's record makes a stand-in with the model's shapes once its small-rows step
    package is on disk (a GPT has no encoder package)."""
    from transformerkit.decoding import aot_files, aot_step
    from transformerkit.models import GPT

    model = GPT(30, num_layers=3, d_model=16, num_heads=2, d_ff=32, max_length=12)
    digest, directory = "c" * 64, str(tmp_path)
    aot_files.record(digest, model, directory)
    assert aot_files.packaged_model(digest, "float32", directory) is None
    stand_in = aot_files.PackagedModel(aot_files.read_record(digest, directory), directory)
    open(stand_in.package_path("small", "float32"), "w").close()
    stand_in = aot_files.packaged_model(digest, "float32", directory)
    assert not stand_in.seq2seq
    assert (stand_in.vocab_size, stand_in.num_layers, stand_in.max_length,
            stand_in.key_dim) == (30, 3, 12, model.key_dim)
    assert stand_in.package_path("small", "float32") == aot_step.package_path(
        directory, "small", "float32", aot_step.weights_digest(model),
        aot_step.model_description(model))


@pytest.fixture(scope="module")
def gpt_trained(tmp_path_factory, cache):
    """A tiny trained character GPT run."""
    from tiny_run import tiny_gpt_config

    from transformerkit.training.trainer import train

    folder = tmp_path_factory.mktemp("gpt")
    train(tiny_gpt_config(folder, steps=30), folder / "run")
    return folder / "run"


@pytest.fixture(scope="module")
def gpt_built(gpt_trained):
    """The GPT run's greedy generation with the compiled engine, the model loaded (which
    builds its small-rows package and records the file)."""
    import transformerkit

    run = transformerkit.load(gpt_trained, engine="compiled")
    assert run._model is not None
    return run.generate(PROMPT, max_new_tokens=10, temperature=0)


def _continuation_ids(run, text):
    return run.source_tokenizer.encode(text[len(PROMPT):])


def _assert_same_generation_or_near_tie(run, expected, got):
    """``got`` (a generation of :data:`PROMPT`) is ``expected``, or apart from a step on
    at a near-tie (the stand-in fills its caches through a package, the loaded model
    through its eager pass: float32 sums in other orders)."""
    from near_ties import assert_same_ids_or_near_tie, next_logits_after

    prompt = run.source_tokenizer.encode(PROMPT)
    assert_same_ids_or_near_tie([_continuation_ids(run, expected)],
                                [_continuation_ids(run, got)],
                                next_logits_after(run.model, prompts=[prompt]))


FRESH_GPT = """
import json, sys
import transformerkit
run = transformerkit.load(sys.argv[1], engine="compiled")
unloaded = run._model is None
greedy = run.generate(sys.argv[2], max_new_tokens=10, temperature=0)
pieces = list(run.generate_stream(sys.argv[2], max_new_tokens=10, temperature=0))
sampled = [run.generate(sys.argv[2], max_new_tokens=10, seed=7) for _ in range(2)]
print(json.dumps({"greedy": greedy, "streamed": sys.argv[2] + "".join(pieces),
                  "sampled": sampled, "unloaded": unloaded, "still": run._model is None,
                  "keras": "keras" in sys.modules}))
"""


@pytest.mark.slow
def test_a_fresh_process_generates_from_the_gpt_package_without_keras(gpt_trained, gpt_built):
    """In a new process, ``load(engine="compiled")`` of a GPT run stands its packages in for
    the model: the prompt fills the caches through the step package, greedy generation
    is the loaded model's (or apart at a near-tie), streaming gives the same text, a seed
    the same sample, and Keras is never imported."""
    import transformerkit

    out, _ = _fresh("-c", FRESH_GPT, str(gpt_trained), PROMPT)
    got = json.loads(out)
    assert got["unloaded"] and got["still"] and not got["keras"]
    assert got["streamed"] == got["greedy"]
    assert got["sampled"][0] == got["sampled"][1] and got["sampled"][0].startswith(PROMPT)
    _assert_same_generation_or_near_tie(transformerkit.load(gpt_trained), gpt_built,
                                        got["greedy"])


@pytest.mark.slow
def test_the_generate_command_imports_no_keras_from_the_package(gpt_trained, gpt_built):
    """``transformerkit generate RUN --prompt TEXT --engine compiled --threads N`` as a user
    types it, in a new process: the compiled engine's text, no Keras module imported (the
    threads set without asking Keras for its backend; N, the threads the packages were
    built with)."""
    import torch

    import transformerkit

    out, err = _fresh("-m", "transformerkit", "generate", str(gpt_trained), "--prompt", PROMPT,
                      "--max-new-tokens", "10", "--temperature", "0", "--engine", "compiled",
                      "--threads", str(torch.get_num_threads()), importtime=True)
    imported = [line.rsplit("|", 1)[-1].strip() for line in err.splitlines()
                if line.startswith("import time:")]
    assert "torch" in imported and not [m for m in imported if m.split(".")[0] == "keras"]
    _assert_same_generation_or_near_tie(transformerkit.load(gpt_trained), gpt_built,
                                        out.rstrip("\n"))


@pytest.mark.slow
def test_a_long_prompt_goes_through_the_prompt_package(gpt_trained, gpt_built, cache,
                                                       monkeypatch):
    """A stand-in fills a prompt prefix of ``PROMPT_PACKAGE_FROM`` positions or more with
    one call of the prompt package: where it is not on disk, the model is loaded once and
    the package built; a later stand-in then finds it and keeps the model unloaded, with
    the same generation (the same packages); each is the loaded model's (its eager pass
    over the prompt) or apart at a near-tie. A shorter prefix goes through the step
    package."""
    import transformerkit
    from transformerkit.decoding import aot_files, aot_step

    filled = []
    fill_prompt = aot_files.PackagedSteps._fill_prompt

    def counted(self, fill, buffer, prefill, max_len):
        filled.append(prefill)
        return fill_prompt(self, fill, buffer, prefill, max_len)

    monkeypatch.setattr(aot_files.PackagedSteps, "_fill_prompt", counted)
    run = transformerkit.load(gpt_trained, engine="compiled")
    assert run.generate(PROMPT, max_new_tokens=10, temperature=0) and not filled
    assert run._model is None and not list((cache / "compiled").glob(f"{aot_step.PREFILL}-*"))

    prefix = len(run.source_tokenizer.encode(PROMPT)) - 1
    monkeypatch.setattr(aot_files, "PROMPT_PACKAGE_FROM", prefix)
    built = run.generate(PROMPT, max_new_tokens=10, temperature=0)
    assert filled == [prefix] and run._model is not None
    assert list((cache / "compiled").glob(f"{aot_step.PREFILL}-*.pt2"))
    loaded = transformerkit.load(gpt_trained)
    _assert_same_generation_or_near_tie(loaded, gpt_built, built)
    again = transformerkit.load(gpt_trained, engine="compiled")
    assert again.generate(PROMPT, max_new_tokens=10, temperature=0) == built
    assert filled == [prefix, prefix] and again._model is None


@pytest.mark.slow
def test_the_server_generates_from_the_gpt_package(gpt_trained, gpt_built):
    """``transformerkit serve --engine compiled`` over a GPT run loaded from its package
    (recorded by ``gpt_built``, whichever test ran before in this process):
    ``POST /generate`` answers as ``Run.generate`` does, streamed (server-sent events) the
    same text, and the model is never loaded."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    import transformerkit
    from transformerkit.serving.app import create_app

    stand_in = transformerkit.load(gpt_trained, engine="compiled")
    expected = stand_in.generate(PROMPT, max_new_tokens=10, temperature=0)
    body = {"prompt": PROMPT, "max_new_tokens": 10, "temperature": 0}
    with TestClient(create_app({"words": stand_in}, engine="compiled")) as client:
        assert client.post("/generate", json=body).json()["text"] == expected
        with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            data = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                    if line.startswith("data: ")]
        assert client.get("/models").json()["models"][0]["parameters"] == \
            transformerkit.load(gpt_trained).count_params()
    assert data[-1]["text"] == expected
    assert PROMPT + "".join(piece["text"] for piece in data[:-1]) == expected
    assert stand_in._model is None
