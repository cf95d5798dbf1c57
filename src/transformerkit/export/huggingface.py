"""A run as a Hugging Face folder (``export --format huggingface``): a GPT run as a
``GPT2LMHeadModel`` folder (below), a translation run as a ``MarianMTModel`` folder
(:mod:`transformerkit.export.huggingface_marian` makes its files; :func:`export_translation`).

The folder holds ``config.json`` and ``model.safetensors`` (the tensors of
:func:`~transformerkit.models.pretrained_gpt2.gpt2_tensors`, named as ``GPT2LMHeadModel``
names them; a tied head is stored once, as ``transformers`` does), which
``GPT2LMHeadModel.from_pretrained`` loads and which gives the run's logits; the options that
have no GPT-2 equivalent are refused by name
(:func:`~transformerkit.models.pretrained_gpt2.check_gpt2_exportable`). Ids are the run's:
the vocabulary keeps ``<pad>`` at 0 (``pad_token_id``) and an imported GPT-2's ids stay
GPT-2's + 2, so the exported tokenizer and model agree with each other and with the run.

When the run's tokenizer is a byte-level BPE (``data.tokenizer: bpe``, or an imported
GPT-2's), its ``tokenizer.json`` is written with a ``tokenizer_config.json`` naming the
special tokens, which ``AutoTokenizer`` loads as a ``GPT2TokenizerFast`` encoding as the run
does (except that ``transformers`` reads the spelling of a special token inside a text as
that token, which the run's tokenizer reads as text). Other tokenizers are not written (a
line in the log says so).

Either folder is written beside ``out`` and renamed onto it at the end
(:func:`write_folder`).
"""

import json
import logging
import os
import shutil
import tempfile

from transformerkit.data.gpt2_tokenizer import is_gpt2_layout
from transformerkit.data.tokenizers import METADATA_KEY
from transformerkit.export.huggingface_marian import marian_files
from transformerkit.files import TEMPORARY_PREFIX
from transformerkit.models.pretrained_gpt2 import check_gpt2_exportable, gpt2_config, gpt2_tensors

log = logging.getLogger("transformerkit")

EXPORT_FOLDER = "huggingface"  # the default: RUN/huggingface


def tokenizer_files(tokenizer, max_length):
    """``{file name: text}`` of a byte-level BPE tokenizer for ``transformers``, or None
    for another kind."""
    if not is_gpt2_layout(tokenizer):
        return None
    payload = json.loads(tokenizer.backend_tokenizer.to_str())
    payload.pop(METADATA_KEY, None)
    names = {key: tokenizer.id_to_token(getattr(tokenizer, f"{key}_id"))
             for key in ("pad", "bos", "eos", "unk")}
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
              "model_max_length": int(max_length), "clean_up_tokenization_spaces": False,
              **{f"{key}_token": name for key, name in names.items()}}
    return {"tokenizer.json": json.dumps(payload, ensure_ascii=False),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}


def write_folder(out_dir, files, force=False):
    """Write ``files`` (``{name: str or bytes}``) as the folder ``out_dir``: into a temporary
    folder beside it, renamed onto it at the end (``force`` replaces an existing one), so
    ``out_dir`` is never half written. Returns ``out_dir``."""
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent)
    try:
        for name, content in files.items():
            mode, encoding = ("wb", None) if isinstance(content, bytes) else ("w", "utf-8")
            with open(os.path.join(tmp, name), mode, encoding=encoding) as f:
                f.write(content)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def export_model(model, tokenizer, out_dir, force=False):
    """Write ``model`` (a ``GPT``) and ``tokenizer`` as a ``GPT2LMHeadModel`` folder
    ``out_dir``; ``force`` replaces an existing one. Returns ``out_dir``."""
    from safetensors.numpy import save

    check_gpt2_exportable(model)
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{os.fspath(out_dir)} exists; pass --force to replace it")
    if tokenizer.vocab_size != model.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's "
                         f"vocabulary has {model.vocab_size}")
    files = {"config.json": json.dumps(gpt2_config(model, tokenizer), indent=2),
             "model.safetensors": save(gpt2_tensors(model), metadata={"format": "pt"})}
    tokenizer_texts = tokenizer_files(tokenizer, model.max_length)
    if tokenizer_texts is None:
        log.info("the run's %s tokenizer has no Hugging Face GPT-2 equivalent (a "
                 "byte-level BPE); only the model is exported", type(tokenizer).__name__)
    return write_folder(out_dir, {**files, **(tokenizer_texts or {})}, force=force)


def export_translation(model, source_tokenizer, target_tokenizer, out_dir, force=False):
    """Write ``model`` (a ``Transformer``) and its tokenizers as a ``MarianMTModel`` folder
    ``out_dir`` (:func:`~transformerkit.export.huggingface_marian.marian_files`); ``force``
    replaces an existing one. Returns ``out_dir``."""
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{os.fspath(out_dir)} exists; pass --force to replace it")
    return write_folder(out_dir, marian_files(model, source_tokenizer, target_tokenizer),
                        force=force)


def export_run(run, out_dir=None, force=False):
    """Export a loaded GPT or translation run (``transformerkit.api.Run``) to ``out_dir``
    (default ``RUN/huggingface``); returns ``out_dir``."""
    if run.kind not in ("gpt", "transformer"):
        raise ValueError(f"--format huggingface exports GPT runs (as GPT2LMHeadModel) and "
                         f"translation runs (as MarianMTModel); {run.run_dir} holds a "
                         f"{run.kind}")
    if out_dir is None:
        if run.run_dir is None:
            raise ValueError("this Run has no run directory; give out_dir")
        out_dir = os.path.join(os.fspath(run.run_dir), EXPORT_FOLDER)
    if run.kind == "transformer":
        return export_translation(run.model, run.source_tokenizer, run.target_tokenizer,
                                  out_dir, force=force)
    return export_model(run.model, run.source_tokenizer, out_dir, force=force)


__all__ = ["export_model", "export_run", "export_translation", "tokenizer_files", "write_folder"]
