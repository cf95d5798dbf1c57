"""``transformerkit import`` of a Hugging Face Marian (OPUS-MT) folder (``importing.py``),
and every command on the imported run, against ``transformers``' ``MarianMTModel`` and
``MarianTokenizer`` loaded from the same folder (``marian_runs.py``: a tiny SentencePiece
vocabulary from Multi30k lines and a random model, written by ``save_pretrained``; one
shared ``vocab.json``, and separate tables as the Tatoeba-Challenge models).

Ids: the run's are Marian's reordered (``MarianIds``); every comparison of ids maps ours
back with ``MarianIds.to_marian``. Decoding: greedy and beam 4 equal ``generate`` token for
token and as text with ``length_penalty=0`` (ours ``alpha 0``: the GNMT penalty and
``transformers``' ``n ** length_penalty`` differ by definition, and 0 is the one value where
both rank by the plain log-probability), ``early_stopping=True`` (ours ``stopping early``),
the same ``max_new_tokens`` (ours without the ``max_len_a``/``max_len_b`` cap) and
``forced_eos_token_id=None`` (ours ``forced_eos`` false: ``</s>`` is not forced at the length
limit). These settings are named on both sides, over the folder's generation config and
the run's ``search:`` section; tests/test_importing_marian_search.py checks the two
searches with nothing named.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tolerances as tol
from backends import BACKENDS, FAST_XLA_COMPILE
from marian_runs import GERMAN, marian_folder, multi30k_lines

import transformerkit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import keras  # noqa: E402

from transformerkit.cli import main  # noqa: E402
from transformerkit.converters.marian_ids import MarianIds  # noqa: E402
from transformerkit.data.padding import pad_batch  # noqa: E402
from transformerkit.decoding import beam_translate, greedy_translate  # noqa: E402
from transformerkit.decoding.texts import encode_sources  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

NEW_TOKENS = 12
# what ours and transformers' generate are told alike (see the module docstring)
OURS = dict(alpha=0.0, stopping="early", max_new_tokens=NEW_TOKENS, max_len_a=None,
            max_len_b=None, forced_eos=False)
FLAGS = ["--alpha", "0", "--stopping", "early", "--max-new-tokens", str(NEW_TOKENS),
         "--max-len-a", "none", "--max-len-b", "none", "--no-forced-eos"]


def texts():
    """A few dozen sources: held-out Multi30k lines and the accented, numbered, unknown."""
    return GERMAN + multi30k_lines("de", start=2000, count=30)


# seeds and </s> biases under which the random models' outputs end at many lengths
VARIANTS = {"shared": dict(seed=1, eos_bias=6.0),
            "separate": dict(separate=True, seed=0, eos_bias=8.5)}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def imported(request, tmp_path_factory):
    """``(root, folder, run directory, hf model, hf tokenizer, MarianIds)``."""
    root = tmp_path_factory.mktemp(request.param)
    folder = marian_folder(root / "marian", **VARIANTS[request.param])
    assert main(["import", str(folder), "--out", str(root / "run")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
    return root, folder, root / "run", hf, tokenizer, MarianIds.from_folder(folder)


def hf_generate(hf, tokenizer, sources, beams):
    """``transformers``' outputs: ``(Marian ids without the start and </s>, texts)``."""
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf.generate(**batch, num_beams=beams, length_penalty=0.0, early_stopping=True,
                          max_new_tokens=NEW_TOKENS, forced_eos_token_id=None,
                          do_sample=False).numpy()
    ids = []
    for row in out:
        row = list(row[1:])  # after the decoder start
        row = row[:row.index(hf.config.eos_token_id)] if hf.config.eos_token_id in row else row
        ids.append([int(i) for i in row if i != hf.config.pad_token_id])
    return ids, tokenizer.batch_decode(out, skip_special_tokens=True)


def ours_ids(run, sources, beams):
    """The run's model's outputs on ``sources`` in its ids, as ``translate`` searches."""
    source = pad_batch(encode_sources(sources, run.source_tokenizer, run.model.max_length))
    options = {k: OURS[k] for k in ("max_new_tokens",)}
    if beams == 1:
        return [list(row) for row in greedy_translate(run.model, source, **options)]
    return [list(found[0].ids) for found in
            beam_translate(run.model, source, beam_size=beams, alpha=0.0, stopping="early",
                           **options)]


def test_the_run_directory(imported):
    root, folder, run_dir, hf, _, ids = imported
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["config.yaml", "model.keras", "source_tokenizer.json",
                     "target_tokenizer.json"]
    assert not any(p.name.startswith(".tmp") for p in root.iterdir())
    run = transformerkit.load(run_dir)
    model, data = run.config.model, run.config.data
    assert run.kind == "transformer"
    assert (model["activation"], model["positional"], model["norm_position"]) == (
        "swish", "sinusoidal_split", "post")
    assert model["final_logits_bias"] and model["scale_embeddings"]
    shared = hf.config.share_encoder_decoder_embeddings
    assert model["tie_embeddings"] == ("all" if shared else "decoder")
    assert (data.dataset, data.tokenizer, data.shared_vocab) == ("tsv", "marian", shared)
    assert (data.source_lang, data.target_lang) == ("de", "en")  # tokenizer_config.json's
    assert run.model.source_vocab_size == run.source_tokenizer.vocab_size == \
        len(ids.source_rows)
    assert run.model.target_vocab_size == run.target_tokenizer.vocab_size == \
        len(ids.target_rows)
    for tokenizer in (run.source_tokenizer, run.target_tokenizer):
        assert tokenizer.model_ids and (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id,
                                        tokenizer.unk_id) == (0, 1, 2, 3)


def test_tokenization_equals_marian_tokenizer(imported):
    _, _, run_dir, _, tokenizer, ids = imported
    run = transformerkit.load(run_dir)
    english = ["An older man crosses 2 streets.", "Déjà vu: 10 cafés, naïve façade.",
               "A dog ☃ runs 🐕.", "一只狗", ""]
    for side, sample, hf_ids in (
            ("source", [*GERMAN, ""], lambda t: tokenizer(t)["input_ids"]),
            ("target", english, lambda t: tokenizer(text_target=t)["input_ids"])):
        ours = getattr(run, f"{side}_tokenizer")
        for text in sample:
            encoded = ours.encode(text, add_eos=True)
            assert ids.to_marian(encoded, side).tolist() == hf_ids(text), (side, text)
            if side == "target":  # MarianTokenizer.decode reads target ids
                assert ours.decode(encoded) == tokenizer.decode(
                    hf_ids(text), skip_special_tokens=True), text
    assert run.source_tokenizer.encode("") == [] and tokenizer("")["input_ids"] == [0]
    unknown = run.source_tokenizer.encode("Ein Hund ☃ 一只狗")
    assert run.source_tokenizer.unk_id in unknown  # unknown characters are <unk>, as theirs


@pytest.mark.parametrize("beams", [1, 4])
def test_translate_equals_generate(imported, beams):
    _, _, run_dir, hf, tokenizer, ids = imported
    run = transformerkit.load(run_dir)
    sources = texts()
    expected_ids, expected_texts = hf_generate(hf, tokenizer, sources, beams)
    got = ours_ids(run, sources, beams)
    assert [ids.to_marian(row).tolist() for row in got] == expected_ids
    assert len({len(row) for row in expected_ids}) > 2  # ends at EOS and at the limit
    assert run.translate(sources, beam_size=beams, **OURS) == expected_texts
    assert len(set(expected_texts)) > 5


def test_translate_command(imported, capsys):
    _, _, run_dir, hf, tokenizer, _ = imported
    sources = texts()[:6]
    for beams in (1, 4):
        capsys.readouterr()
        assert main(["translate", str(run_dir), *sources, "--beam", str(beams), *FLAGS]) == 0
        assert capsys.readouterr().out.splitlines() == hf_generate(hf, tokenizer, sources,
                                                                   beams)[1]


def test_evaluate_is_sacrebleu_of_transformers_translations(imported, tmp_path, capsys):
    import sacrebleu

    _, _, run_dir, hf, tokenizer, _ = imported
    sources = texts()
    references = multi30k_lines("en", start=2000, count=30)
    references = [*(["A reference sentence."] * (len(sources) - len(references))), *references]
    (tmp_path / "test.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "test.en").write_text("\n".join(references) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--source", str(tmp_path / "test.de"),
                 "--reference", str(tmp_path / "test.en"), "--beam", "4", *FLAGS,
                 "--output", str(tmp_path / "out.en")]) == 0
    out = capsys.readouterr().out
    hypotheses = hf_generate(hf, tokenizer, sources, 4)[1]
    assert (tmp_path / "out.en").read_text(encoding="utf-8").splitlines() == hypotheses
    bleu = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score
    assert f"BLEU = {bleu:.2f}" in out
    stored = json.loads((run_dir / "metrics.json").read_text())["evaluate"]["test"]
    assert stored["bleu"] == round(bleu, 2) and stored["sentences"] == len(sources)


def test_summary_and_attention(imported, tmp_path, capsys):
    _, _, run_dir, hf, _, _ = imported
    capsys.readouterr()
    assert main(["summary", str(run_dir)]) == 0
    total = int(capsys.readouterr().out.split("total")[1].split()[0].replace(",", ""))
    config = hf.config
    tables = 2 * config.max_position_embeddings * config.d_model  # fixed sinusoids here
    extra_rows = 1 if config.share_encoder_decoder_embeddings else 2  # <s>, per matrix
    assert total == sum(p.numel() for p in hf.parameters()) - tables + \
        extra_rows * config.d_model
    assert main(["attention", str(run_dir), GERMAN[0], "--out", str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a.png").stat().st_size > 0
    run = transformerkit.load(run_dir)
    maps = run.attention(GERMAN[1])
    source = run.source_tokenizer
    pieces = [source.id_to_token(i) for i in source.encode(GERMAN[1], add_eos=True)]
    assert "<unk>" in pieces and pieces[-1] == "</s>"  # "1987": digits no piece has
    # each label: a piece decoded alone (no leading "\u2581"; "?" where that is empty)
    assert maps["source_tokens"] == [p if p in ("<unk>", "</s>") else
                                     p.removeprefix("\u2581") or "?" for p in pieces]
    assert maps["target_input_tokens"][0] == "<s>"  # the decoder start (Marian's pad row)
    assert maps["encoder"].shape[:2] == (config.encoder_layers, config.encoder_attention_heads)


def test_serve_translates_as_transformers(imported):
    from fastapi.testclient import TestClient

    from transformerkit.serving.app import create_app
    from transformerkit.serving.server import load_runs

    _, _, run_dir, hf, tokenizer, _ = imported
    sources = texts()[:8]
    with TestClient(create_app(load_runs([run_dir]))) as client:
        for beams in (1, 4):
            answer = client.post("/translate", json={"texts": sources, "beam_size": beams,
                                                     **OURS})
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"model": "run", "translations":
                                     hf_generate(hf, tokenizer, sources, beams)[1]}


def test_ctranslate2_export_equals_ctranslate2s_own_converter(imported, tmp_path):
    """``export --format ctranslate2`` of the run against CTranslate2's
    ``TransformersConverter`` on the original folder: the same output tokens (an empty
    output allowed, ``min_decoding_length=0``, as ``transformers`` and ours allow it); and
    ``translate --engine ctranslate2`` gives ``transformers``' texts. CTranslate2's converter
    writes one vocabulary (the source table) for both sides of a Marian model, so it is
    compared on the shared folder only; the separate one against ``transformers``."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    _, folder, run_dir, hf, tokenizer, _ = imported
    assert main(["export", str(run_dir), "--format", "ctranslate2", "--out",
                 str(tmp_path / "ours")]) == 0
    sources = texts()
    if hf.config.share_encoder_decoder_embeddings:
        theirs = ctranslate2.converters.TransformersConverter(str(folder)).convert(
            str(tmp_path / "theirs"))
        pieces = [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sources]
        for beams in (1, 4):
            options = dict(max_decoding_length=NEW_TOKENS, min_decoding_length=0,
                           beam_size=beams, length_penalty=0.0)
            expected = ctranslate2.Translator(theirs).translate_batch(pieces, **options)
            ours = ctranslate2.Translator(str(tmp_path / "ours")).translate_batch(
                [p[:-1] for p in pieces], **options)  # our export appends </s> itself
            assert [r.hypotheses[0] for r in ours] == [r.hypotheses[0] for r in expected]
            assert len({len(r.hypotheses[0]) for r in expected}) > 2
    run = transformerkit.load(run_dir)
    for beams in (1, 4):
        assert run.translate(sources, beam_size=beams, engine="ctranslate2", **OURS) == \
            hf_generate(hf, tokenizer, sources, beams)[1]


# -- every backend: the run's logits and greedy outputs ------------------------------------

_PROBE = """
import json, sys
import numpy as np
import keras
import transformerkit
run_dir, batch, out = sys.argv[1:]
run = transformerkit.load(run_dir)
batch = np.load(batch)
logits = keras.ops.convert_to_numpy(run.model((batch["source"], batch["target"])))
request = json.loads(open(out + ".in", encoding="utf-8").read())
translations = run.translate(request["texts"], beam_size=1, **request["options"])
np.save(out + ".npy", logits)
open(out + ".json", "w", encoding="utf-8").write(json.dumps(translations))
"""


def _logit_batch(tokenizer, ids, sources, targets):
    """Padded Marian batches (``transformers``) and the same in the run's ids."""
    source = tokenizer(sources, padding=True, return_tensors="np")["input_ids"]
    target = tokenizer(text_target=targets, padding=True, return_tensors="np")["input_ids"]
    start = np.full((len(targets), 1), tokenizer.pad_token_id)
    target = np.concatenate([start, target[:, :-1]], axis=1)  # teacher forcing's input
    ours_target = ids.to_ours(target, "target")
    ours_target[:, 0] = 1  # <s>: the copy of Marian's decoder-start row
    return (source, target), (ids.to_ours(source, "source").astype("int32"),
                              ours_target.astype("int32"))


def assert_logits_equal(run, logits, hf, tokenizer, ids, theirs):
    source, target = theirs
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        expected = hf(input_ids=torch.as_tensor(source),
                      attention_mask=torch.as_tensor(source != pad).long(),
                      decoder_input_ids=torch.as_tensor(target),
                      decoder_attention_mask=torch.as_tensor(
                          np.concatenate([np.ones((len(target), 1)), target[:, 1:] != pad],
                                         axis=1)).long()).logits.numpy()
    real = (target != pad)
    real[:, 0] = True  # the decoder start is the pad id: a real position
    columns = ids.to_ours(np.arange(expected.shape[-1]), "target")
    others = np.arange(expected.shape[-1]) != pad  # the pad's -100: a bound of its own
    roundings = tol.model_roundings(run.model, source.shape[1], target.shape[1])
    got, want = logits[..., columns][..., others][real], expected[..., others][real]
    tol.assert_within(got, want, tol.chain_atol(roundings, want, paths=2), "logits")


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_and_greedy_on_every_backend(imported, tmp_path, backend):
    _, _, run_dir, hf, tokenizer, ids = imported
    sources, targets = GERMAN[:4], ["A man.", "Two children play in the sand in 1987!",
                                    "A dog ☃.", "Größe"]
    theirs, ours = _logit_batch(tokenizer, ids, sources, targets)
    run = transformerkit.load(run_dir)
    if backend == keras.backend.backend():
        logits = keras.ops.convert_to_numpy(run.model(ours))
        translations = run.translate(texts(), beam_size=1, **OURS)
    else:
        np.savez(tmp_path / "batch.npz", source=ours[0], target=ours[1])
        (tmp_path / "out.in").write_text(json.dumps({"texts": texts(), "options": OURS}),
                                         encoding="utf-8")
        env = dict(os.environ, KERAS_BACKEND=backend, XLA_FLAGS=FAST_XLA_COMPILE)
        env.pop("TRANSFORMERKIT_TESTS_DEFAULT_BACKEND", None)
        subprocess.run([sys.executable, "-c", _PROBE, str(run_dir), str(tmp_path / "batch.npz"),
                        str(tmp_path / "out")], check=True, env=env, timeout=300)
        logits = np.load(tmp_path / "out.npy")
        translations = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert_logits_equal(run, logits, hf, tokenizer, ids, theirs)
    assert translations == hf_generate(hf, tokenizer, texts(), 1)[1]


# -- hub names and errors ------------------------------------------------------------------

def test_a_hub_name_resolves_from_the_offline_cache(imported, tmp_path):
    from hf_checkpoints import fill_hub_cache

    _, folder, _, hf, tokenizer, _ = imported
    repo = "Helsinki-NLP/opus-mt-de-en"
    fill_hub_cache(tmp_path / "hub", repo, folder)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "transformerkit", "import", repo, "--out",
                           str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"imported {repo} (marian) into {tmp_path / 'run'}" in done.stdout
    run = transformerkit.load(tmp_path / "run")
    sources = texts()[:6]
    assert run.translate(sources, beam_size=4, **OURS) == hf_generate(hf, tokenizer, sources,
                                                                       4)[1]


def _copy(folder, to, leave_out=()):
    to.mkdir()
    for path in folder.iterdir():
        if path.name not in leave_out:
            (to / path.name).write_bytes(path.read_bytes())
    return to


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_errors_are_one_line_naming_the_file_or_key(imported, tmp_path, capsys):
    _, folder, _, hf, _, _ = imported
    vocab = hf.config.vocab_size
    cases = []
    for name in ("source.spm", "vocab.json"):
        broken = _copy(folder, tmp_path / f"no-{name}", leave_out=(name,))
        cases.append((broken, f"{broken} is not a Marian tokenizer folder: no {name}"))
    if not hf.config.share_encoder_decoder_embeddings:
        broken = _copy(folder, tmp_path / "no-target-vocab", leave_out=("target_vocab.json",))
        cases.append((broken, f"{broken / 'tokenizer_config.json'} says separate_vocabs, but "
                              f"{broken} has no target_vocab.json"))
    broken = _copy(folder, tmp_path / "vocab-size")
    _edit_config(broken, vocab_size=vocab + 1, decoder_vocab_size=vocab + 1)
    cases.append((broken, f"{broken}: the source vocabulary has {vocab} pieces but "
                          f"config.json's vocab_size is {vocab + 1}"))
    broken = _copy(folder, tmp_path / "pad")
    _edit_config(broken, pad_token_id=5, decoder_start_token_id=5)
    cases.append((broken, f"{broken}: config.json's pad_token_id is 5, but the source "
                          f"vocabulary has '<pad>' at id {vocab - 1}"))
    broken = _copy(folder, tmp_path / "pre-ln")
    _edit_config(broken, normalize_before=True)
    cases.append((broken, f"{broken}/config.json: normalize_before=True cannot be mapped onto "
                          "Transformer: transformers' MarianMTModel and CTranslate2 ignore it "
                          "and compute post-LN blocks, so a pre-LN checkpoint is reproduced "
                          "by neither"))
    capsys.readouterr()
    for source, message in cases:
        assert main(["import", str(source), "--out", str(tmp_path / "out")]) == 2, message
        assert capsys.readouterr().err == f"transformerkit import: error: {message}\n"
        assert not (tmp_path / "out").exists()
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_training_with_the_marian_tokenizer_alone_is_one_clear_error(imported):
    from transformerkit.training.tokenizer_setup import reused_tokenizer_files

    run = transformerkit.load(imported[2])
    with pytest.raises(ValueError, match="marian is the vocabulary of an imported model"):
        reused_tokenizer_files(run.config.data.tokenizer)
