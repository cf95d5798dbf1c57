"""An imported Marian (OPUS-MT) run searches by default as its checkpoint's generation
config says (``converters/generation.py``, the run's ``search:`` section):
``transformerkit.load(RUN).translate(texts)`` and ``transformerkit translate RUN TEXT ...``
with no search option give ``transformers``' ``model.generate(**inputs)`` with no generation
argument, token for token.

The folders (``marian_runs.py``: tiny SentencePiece vocabularies, a random ``MarianMTModel``
saved by ``save_pretrained``) get an OPUS-MT ``generation_config.json``: ``num_beams``,
``max_length`` 16 (15 new tokens), ``forced_eos_token_id`` 0, ``renormalize_logits`` with
``bad_words_ids [[pad]]``, no ``length_penalty`` (transformers' 1.0) and no
``early_stopping`` (transformers' heuristic rule); two variants also set
``no_repeat_ngram_size``. The ``</s>`` bias makes some outputs end
early and others run to the limit, where the forced ``</s>`` decides; the beam folder's
``<pad>`` keeps some probability (logit bias 8), which only a search that rules it out before
the softmax leaves out exactly. Each variant also shows that the setting it exercises
matters: without it, some translation differs.
"""

import json

import pytest
from marian_runs import GERMAN, marian_folder, multi30k_lines

import transformerkit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformerkit.cli import main  # noqa: E402
from transformerkit.converters.marian_ids import MarianIds  # noqa: E402
from transformerkit.data.padding import pad_batch  # noqa: E402
from transformerkit.decoding import beam_translate, greedy_translate  # noqa: E402
from transformerkit.decoding.texts import encode_sources  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

MAX_LENGTH = 16  # transformers counts the decoder start: 15 new tokens, </s> included
# generation settings of each folder, over the OPUS-MT ones of opus_mt_generation()
VARIANTS = {"beam": dict(num_beams=4), "greedy": dict(num_beams=1),
            "never-penalised": dict(num_beams=3, early_stopping="never", length_penalty=0.5),
            "no-repeat-beam": dict(num_beams=3, no_repeat_ngram_size=2),
            "no-repeat-greedy": dict(num_beams=1, no_repeat_ngram_size=3)}
# what the run's search section says for each, and a change of it that changes translations
EXPECTED = {"beam": (dict(beam_size=4, alpha=1.0, penalty="power", stopping="heuristic",
                          forced_eos=True, renormalize=True), [dict(forced_eos=False),
                                                               dict(renormalize=False),
                                                               dict(stopping="early"),
                                                               dict(penalty="gnmt")]),
            "greedy": (dict(beam_size=1, forced_eos=True), [dict(forced_eos=False)]),
            "never-penalised": (dict(beam_size=3, alpha=0.5, stopping="exact"),
                                [dict(forced_eos=False), dict(alpha=0.0)]),
            "no-repeat-beam": (dict(beam_size=3, no_repeat_ngram_size=2),
                               [dict(no_repeat_ngram_size=0)]),
            "no-repeat-greedy": (dict(beam_size=1, no_repeat_ngram_size=3),
                                 [dict(no_repeat_ngram_size=0)])}


def opus_mt_generation(pad, **changes):
    """An OPUS-MT model's ``generation_config.json`` (pad = decoder start = the last id)."""
    return {"bad_words_ids": [[pad]], "bos_token_id": 0, "decoder_start_token_id": pad,
            "eos_token_id": 0, "forced_eos_token_id": 0, "max_length": MAX_LENGTH,
            "num_beams": 4, "pad_token_id": pad, "renormalize_logits": True, **changes}


def sources():
    return GERMAN + multi30k_lines("de", start=2000, count=30)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def imported(request, tmp_path_factory):
    """``(variant, folder, run directory, hf model, hf tokenizer)``."""
    root = tmp_path_factory.mktemp(request.param)
    folder = marian_folder(root / "marian", seed=1, eos_bias=6.0, pad_bias=8.0)
    pad = json.loads((folder / "config.json").read_text())["pad_token_id"]
    (folder / "generation_config.json").write_text(
        json.dumps(opus_mt_generation(pad, **VARIANTS[request.param])))
    assert main(["import", str(folder), "--out", str(root / "run")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
    return request.param, folder, root / "run", hf, tokenizer


def hf_generate(hf, tokenizer, texts):
    """``generate`` with nothing but the inputs: ``(Marian ids after the decoder start, up
    to and with </s>, texts)``."""
    with torch.no_grad():
        out = hf.generate(**tokenizer(texts, padding=True, return_tensors="pt")).numpy()
    eos, pad = hf.config.eos_token_id, hf.config.pad_token_id
    ids = []
    for row in out[:, 1:].tolist():
        row = row[:row.index(eos) + 1] if eos in row else row
        ids.append([i for i in row if i != pad])
    return ids, tokenizer.batch_decode(out, skip_special_tokens=True)


def test_the_run_records_the_generation_settings(imported):
    variant, _, run_dir, _, _ = imported
    run = transformerkit.load(run_dir)
    expected, _ = EXPECTED[variant]
    search = run.search
    assert {key: getattr(search, key) for key in expected} == expected
    assert (search.max_new_tokens, search.max_len_a, search.max_len_b) == (MAX_LENGTH - 1,
                                                                           None, None)
    assert "search:" in (run_dir / "config.yaml").read_text()


def test_translate_with_no_options_is_generate_with_none(imported):
    variant, folder, run_dir, hf, tokenizer = imported
    run = transformerkit.load(run_dir)
    texts = sources()
    expected_ids, expected_texts = hf_generate(hf, tokenizer, texts)
    lengths = [len(row) for row in expected_ids]
    assert MAX_LENGTH - 1 in lengths and min(lengths) < 5  # at the limit, and early
    assert all(row[-1] == hf.config.eos_token_id for row in expected_ids)  # forced there
    assert run.translate(texts) == expected_texts
    # token for token: the run's search options on the id arrays
    ids = MarianIds.from_folder(folder)
    source = pad_batch(encode_sources(texts, run.source_tokenizer, run.model.max_length))
    if run.search.beam_size > 1:
        found = [hyps[0].ids for hyps in beam_translate(run.model, source, run.search)]
    else:
        found = greedy_translate(run.model, source, run.search)
    eos = hf.config.eos_token_id
    assert [ids.to_marian(row).tolist() + [eos] for row in found] == expected_ids
    # each setting the variant exercises decides some translation
    for change in EXPECTED[variant][1]:
        assert run.translate(texts, **change) != expected_texts, change


def test_translate_command_with_no_flags(imported, capsys):
    _, _, run_dir, hf, tokenizer = imported
    texts = sources()[:12]
    capsys.readouterr()
    assert main(["translate", str(run_dir), *texts]) == 0
    assert capsys.readouterr().out.splitlines() == hf_generate(hf, tokenizer, texts)[1]
    # a flag replaces one setting of the run's, the others stay
    assert main(["translate", str(run_dir), *texts, "--no-forced-eos"]) == 0
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        unforced = hf.generate(**batch, forced_eos_token_id=None)
    assert capsys.readouterr().out.splitlines() == tokenizer.batch_decode(
        unforced, skip_special_tokens=True)


def test_the_server_searches_as_the_run_says(imported):
    from fastapi.testclient import TestClient

    from transformerkit.serving.app import create_app
    from transformerkit.serving.server import load_runs

    _, _, run_dir, hf, tokenizer = imported
    texts = sources()[:12]
    with TestClient(create_app(load_runs([run_dir]))) as client:
        answer = client.post("/translate", json={"texts": texts})
    assert answer.status_code == 200, answer.text
    assert answer.json()["translations"] == hf_generate(hf, tokenizer, texts)[1]


def test_what_the_search_cannot_do_is_named_in_one_line(tmp_path, caplog):
    from transformerkit.importing import import_checkpoint

    folder = marian_folder(tmp_path / "marian", seed=1, eos_bias=6.0)
    pad = json.loads((folder / "config.json").read_text())["pad_token_id"]
    (folder / "generation_config.json").write_text(json.dumps(opus_mt_generation(
        pad, no_repeat_ngram_size=3, repetition_penalty=1.2, min_length=0, use_cache=True)))
    with caplog.at_level("WARNING", logger="transformerkit"):
        import_checkpoint(folder, tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records if r.name == "transformerkit"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "generation_config.json" in lines[0]
    assert "repetition_penalty=1.2" in lines[0] and "no_repeat" not in lines[0]  # mapped
    assert "min_length" not in lines[0] and "use_cache" not in lines[0]  # change nothing
    assert transformerkit.load(tmp_path / "run").search.beam_size == 4  # mapped all the same


def test_without_generation_config_the_keys_of_config_json_count(tmp_path):
    """Older OPUS-MT folders hold the generation keys in ``config.json``; ``transformers``
    reads them from there, and so does the import."""
    from transformerkit.importing import import_checkpoint

    folder = marian_folder(tmp_path / "marian", seed=1, eos_bias=6.0)
    (folder / "generation_config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    config.update(num_beams=6, max_length=30, early_stopping=True, length_penalty=0.8)
    (folder / "config.json").write_text(json.dumps(config))
    import_checkpoint(folder, tmp_path / "run")
    search = transformerkit.load(tmp_path / "run").search
    assert (search.beam_size, search.max_new_tokens, search.stopping, search.alpha,
            search.penalty) == (6, 29, "early", 0.8, "power")
    hf = transformers.MarianMTModel.from_pretrained(str(folder))
    assert (hf.generation_config.num_beams, hf.generation_config.max_length) == (6, 30)



def test_the_ctranslate2_engine_cuts_greedy_outputs_and_refuses_beam_search(imported):
    """CTranslate2 never forces the end token and has one stopping rule: a greedy output is
    cut one token before its cap (the same translation), a beam search with the run's
    settings is refused, naming what to pass."""
    pytest.importorskip("ctranslate2")
    _, _, run_dir, hf, tokenizer = imported
    run = transformerkit.load(run_dir)
    texts = sources()
    if run.search.beam_size == 1:
        assert run.translate(texts, engine="ctranslate2") == \
            hf_generate(hf, tokenizer, texts)[1]
        return
    with pytest.raises(ValueError, match=r"pass stopping='early', forced_eos=False "
                                         r"\(--stopping early --no-forced-eos\)"):
        run.translate(texts, engine="ctranslate2")


def test_a_mapped_key_that_is_no_number_is_one_clear_error(tmp_path, capsys):
    folder = marian_folder(tmp_path / "marian", seed=1, eos_bias=6.0)
    pad = json.loads((folder / "config.json").read_text())["pad_token_id"]
    (folder / "generation_config.json").write_text(json.dumps(opus_mt_generation(
        pad, num_beams="4")))
    capsys.readouterr()
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (f"transformerkit import: error: {folder}/"
                                       "generation_config.json: num_beams='4' must be an "
                                       "integer\n")
