"""Tiny Marian (OPUS-MT) folders as ``transformers`` writes them, for the tests of
``transformerkit import`` on Marian checkpoints and of the commands on the imported run.

:func:`marian_folder` trains two SentencePiece models with `sentencepiece` on 400 Multi30k
lines (German for ``source.spm``, English for ``target.spm``), builds the piece -> id
table(s) in Marian's layout (``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last), lets
``transformers.MarianTokenizer`` save them (``vocab.json``; with ``separate=True`` also
``target_vocab.json`` and ``separate_vocabs``, the Tatoeba-Challenge layout) and saves a
random ``MarianMTModel`` of that vocabulary with ``save_pretrained`` (2+2 layers, d_model 32).

Its ``final_logits_bias`` is random with ``</s>`` raised, so outputs end at different
lengths, and the pad's is -100: its probability is zero in float32 on both sides, so
``transformers``' search (which may pick the pad) and ours (which never does) are the same
search (see tests/models/test_marian_import.py's docstring).
"""

import io
import json
import pathlib
import tempfile

import pytest
from paths import SHARED_DATA

SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             max_position_embeddings=160, init_std=0.3, activation_function="swish",
             scale_embedding=True)
# Held out from the SentencePiece training lines: accents, digits, characters no training
# line has (a snowman, an emoji, CJK), a language code, punctuation.
GERMAN = ["Ein älterer Mann überquert 2 Straßen.", "Zwei Kinder spielen 1987 im Sand!",
          "Ein Hund ☃ rennt über die Wiese 🐕.", "一只狗在草地上奔跑。",
          ">>fra<< Ein Mädchen liest.", "Größe: 3,5 m (ca. 12 Fuß).", "Déjà vu: 10 Cafés."]


def multi30k_lines(lang, start=0, count=400):
    """Lines of the shared Multi30k training data (the test is skipped without it)."""
    path = SHARED_DATA / "multi30k" / f"train.{lang}"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path} (set TRANSFORMERKIT_DATA)")
    return path.read_text(encoding="utf-8").splitlines()[start:start + count]


def _spm(lines, vocab_size):
    """A SentencePiece model trained by `sentencepiece` with its default ids -> its bytes."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                             vocab_size=vocab_size, minloglevel=2)
    return model.getvalue()


def _pieces(proto):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))]


def _table(pieces):
    """Marian's layout: ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last."""
    tokens = ["</s>", "<unk>", *dict.fromkeys(pieces), "<pad>"]
    return {token: i for i, token in enumerate(tokens)}


def marian_folder(folder, separate=False, seed=0, eos_bias=3.0, pad_bias=-100.0, **config):
    """Write a Marian folder (see the module docstring) into ``folder``; returns it.

    ``separate``: one table per side (``vocab.json`` for the source, ``target_vocab.json``
    for the target) and separate embeddings (``share_encoder_decoder_embeddings`` false), as
    the Tatoeba-Challenge models; the two tables have the same size, so that ``<pad>`` (the
    one ``pad_token_id``) is the last id of both. ``eos_bias``: added to ``</s>``'s logit
    bias. ``pad_bias``: ``<pad>``'s logit bias (the default makes its probability zero in
    float32; a larger one gives it mass, which only a search that rules it out before the
    softmax, ``renormalize_logits``, leaves out exactly). ``config``: MarianConfig keys to
    change.
    """
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    source, target = _spm(multi30k_lines("de"), 200), _spm(multi30k_lines("en"), 180)
    if separate:
        size = min(len(_pieces(source)), len(_pieces(target)))
        tables = [_table(_pieces(source)[:size]), _table(_pieces(target)[:size])]
    else:
        tables = [_table(_pieces(source) + _pieces(target))]
    with tempfile.TemporaryDirectory() as raw:
        raw = pathlib.Path(raw)
        (raw / "source.spm").write_bytes(source)
        (raw / "target.spm").write_bytes(target)
        for name, table in zip(["vocab.json", "target_vocab.json"], tables, strict=False):
            (raw / name).write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
        tokenizer = transformers.MarianTokenizer(
            str(raw / "source.spm"), str(raw / "target.spm"), str(raw / "vocab.json"),
            target_vocab_file=str(raw / "target_vocab.json") if separate else None,
            separate_vocabs=separate, source_lang="de", target_lang="en")
        tokenizer.save_pretrained(str(folder))
    vocab = len(tables[0])
    options = {**SIZES, "vocab_size": vocab, "decoder_vocab_size": vocab,
               "pad_token_id": vocab - 1, "decoder_start_token_id": vocab - 1,
               "eos_token_id": 0, "share_encoder_decoder_embeddings": not separate, **config}
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**options)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, options["eos_token_id"]] += eos_bias
        model.final_logits_bias[0, options["pad_token_id"]] = pad_bias
    model.save_pretrained(str(folder))
    return folder
