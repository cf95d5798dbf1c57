"""GPT-2's byte-level BPE vocabulary as a :class:`~transformerkit.data.tokenizers.SubwordTokenizer`.

A Hugging Face GPT-2 folder holds its tokenizer as ``tokenizer.json`` (the ``tokenizers``
library's file) or as ``vocab.json`` + ``merges.txt`` (the original files); both are read
with the ``tokenizers`` library: a BPE model over the 256 byte symbols, the ``ByteLevel``
pre-tokenizer (GPT-2's regular expression, no prefix space) and decoder, no normalizer. Any
text is encoded without ``<unk>`` and decodes back exactly.

GPT-2 has one special token, ``<|endoftext|>`` (id 50256 in GPT-2's own vocabulary), which
is its BOS, EOS and UNK, and no padding token. Every model here masks id 0 as padding and
decoding never picks id 0 or id 1 (the start token), while GPT-2's ids 0 and 1 are the
ordinary tokens ``!`` and ``"``. So the vocabulary is shifted by :data:`ID_OFFSET`: our id
= GPT-2's id + 2, with ``<pad>`` at 0 and ``<s>`` at 1 in front (two reserved ids that no
text encodes to); BOS = EOS = UNK = ``<|endoftext|>`` (50258 for GPT-2 itself). The model
import (``converters/gpt2.py``) shifts the embedding rows the same way. As every
tokenizer here, the spelling ``<|endoftext|>`` inside a text is plain text, never the
special id (``transformers`` would turn it into the special id).

A folder whose vocabulary already starts with ``<pad>`` 0 and ``<s>`` 1 (what ``transformerkit
export --format huggingface`` writes) is read as it is, its ids unshifted
(:func:`vocabulary_offset` 0), its special tokens named by ``tokenizer_config.json``: an
exported run imports back to the same ids.
"""

import json
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from transformerkit.data.tokenizers import (
    SubwordTokenizer,
    _hf_special_token_names,
    _special_ids_from_vocab,
)
from transformerkit.special_tokens import BOS, PAD

ID_OFFSET = 2  # our id = GPT-2's id + ID_OFFSET: <pad> 0 and <s> 1 come first
RESERVED = (PAD, BOS)
END_OF_TEXT = "<|endoftext|>"


def load_gpt2_tokenizer(folder):
    """The byte-level BPE tokenizer of a GPT-2 folder, ids shifted by :data:`ID_OFFSET`
    (unshifted where the vocabulary already starts with ``<pad>`` and ``<s>``).

    Reads ``tokenizer.json``, else ``vocab.json`` + ``merges.txt``. Raises
    ``FileNotFoundError`` when the folder has neither and ``ValueError`` for a file that is
    not a byte-level BPE vocabulary or lacks ``<|endoftext|>``.
    """
    folder = pathlib.Path(folder)
    tokenizer, path = _read(folder)
    if _reserves_ids(tokenizer):
        _check_byte_level(json.loads(tokenizer.to_str()), path)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        names = _hf_special_token_names(folder)
        return SubwordTokenizer(tokenizer, kind="hf",
                                special_ids=_special_ids_from_vocab(tokenizer, path, names))
    return shift_vocabulary(tokenizer, path)


def vocabulary_offset(folder):
    """What to add to the ids of the GPT-2 folder's vocabulary: :data:`ID_OFFSET`, or 0
    where it already starts with ``<pad>`` and ``<s>`` (or ``FileNotFoundError``)."""
    tokenizer, _ = _read(pathlib.Path(folder))
    return 0 if _reserves_ids(tokenizer) else ID_OFFSET


def _reserves_ids(tokenizer):
    return [tokenizer.id_to_token(i) for i in range(len(RESERVED))] == list(RESERVED)


def _read(folder):
    """``(tokenizers.Tokenizer, path)`` of a folder's GPT-2 tokenizer files."""
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust library raises a bare Exception
            raise ValueError(f"{path} is corrupt: {err}") from err
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        path = folder / "vocab.json"
        try:
            bpe = models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
        except Exception as err:
            raise ValueError(f"{folder}: vocab.json / merges.txt are corrupt: {err}") from err
        tokenizer = Tokenizer(bpe)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        raise FileNotFoundError(f"{folder} has no GPT-2 tokenizer: expected tokenizer.json or "
                                "vocab.json + merges.txt")
    return tokenizer, path


def shift_vocabulary(tokenizer, where="the tokenizer"):
    """A GPT-2 ``tokenizers.Tokenizer`` as a :class:`SubwordTokenizer` whose ids are the
    original ones + :data:`ID_OFFSET`, with ``<pad>`` and ``<s>`` first (see the module
    docstring)."""
    payload = json.loads(tokenizer.to_str())
    _check_byte_level(payload, where)
    model = payload["model"]
    vocab = model["vocab"]
    added = payload.get("added_tokens") or []
    if END_OF_TEXT not in vocab and END_OF_TEXT not in {entry["content"] for entry in added}:
        raise ValueError(f"{where} has no {END_OF_TEXT} token, GPT-2's end of text")
    clash = [t for t in RESERVED if t in vocab or t in {entry["content"] for entry in added}]
    if clash:
        raise ValueError(f"{where} already holds {', '.join(clash)}: not GPT-2's vocabulary "
                         "layout (ids would be ambiguous)")
    model["vocab"] = {**{t: i for i, t in enumerate(RESERVED)},
                      **{t: int(i) + ID_OFFSET for t, i in vocab.items()}}
    added = [dict(entry, id=int(entry["id"]) + ID_OFFSET) for entry in added]
    if END_OF_TEXT not in {entry["content"] for entry in added}:
        added.append(_special(END_OF_TEXT, model["vocab"][END_OF_TEXT]))
    payload["added_tokens"] = [_special(t, i) for i, t in enumerate(RESERVED)] + added
    shifted = Tokenizer.from_str(json.dumps(payload))
    shifted.no_padding()  # our batching pads; a stored padding setting would change encodings
    shifted.no_truncation()
    eos = shifted.token_to_id(END_OF_TEXT)
    return SubwordTokenizer(shifted, kind="hf",
                            special_ids={"pad": 0, "bos": eos, "eos": eos, "unk": eos})


def _check_byte_level(payload, where):
    model = payload.get("model") or {}
    if model.get("type") != "BPE" or not _is_byte_level(payload.get("pre_tokenizer")):
        raise ValueError(f"{where} is not a byte-level BPE tokenizer (GPT-2's): its model is "
                         f"{model.get('type')!r}")


def _special(content, i):
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def _is_byte_level(pre_tokenizer):
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(p) for p in pre_tokenizer.get("pretokenizers") or [])


def is_gpt2_layout(tokenizer):
    """Whether ``tokenizer`` (a :class:`SubwordTokenizer`) is a byte-level BPE whose ids
    follow this module's layout or ours (``<pad>`` 0, ``<s>`` 1): what a Hugging Face GPT-2
    folder can carry as ``tokenizer.json``."""
    if not isinstance(tokenizer, SubwordTokenizer):
        return False
    payload = json.loads(tokenizer.backend_tokenizer.to_str())
    return ((payload.get("model") or {}).get("type") == "BPE"
            and _is_byte_level(payload.get("pre_tokenizer"))
            and [tokenizer.id_to_token(i) for i in range(len(RESERVED))] == list(RESERVED))
