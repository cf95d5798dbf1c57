"""``export --format huggingface``: a run as a Hugging Face folder, through the converters.

A GPT run becomes a ``GPT2LMHeadModel`` folder (:func:`export_model`, the files of
:func:`transformerkit.converters.gpt2.export_files`), a translation run a ``MarianMTModel``
folder (:func:`export_translation`, :func:`transformerkit.converters.marian.export_files`):
``config.json``, ``model.safetensors`` and the tokenizer's files, which ``transformers``
loads and which give the run's logits (and a GPT run's ``generation_config.json``, its
``generation:`` options as ``generate``'s); the options that have no equivalent are refused by
name before anything is written. Ids are the run's (GPT-2: ``<pad>`` stays at 0 and an
imported GPT-2's ids stay GPT-2's + 2), or Marian's own layout (see
:mod:`transformerkit.converters.marian_ids`), so the exported tokenizer and model agree with
each other and with the run.

Either folder is written beside ``out`` and renamed onto it at the end
(:func:`~transformerkit.converters.hf_io.write_folder`).
"""

import os

from transformerkit.converters import gpt2, marian
from transformerkit.converters.hf_io import write_folder

EXPORT_FOLDER = "huggingface"  # the default: RUN/huggingface


def _refuse_existing(out_dir, force):
    if os.path.exists(out_dir) and not force:
        raise FileExistsError(f"{os.fspath(out_dir)} exists; pass --force to replace it")


def export_model(model, tokenizer, out_dir, force=False, generation=None):
    """Write ``model`` (a ``GPT``) and ``tokenizer`` as a ``GPT2LMHeadModel`` folder
    ``out_dir``, with a ``generation_config.json`` of the ``generation`` options where given
    (a run's: ``generate`` then continues a prompt as the run does); ``force`` replaces an
    existing one. Returns ``out_dir``."""
    gpt2.check_exportable(model)
    _refuse_existing(out_dir, force)
    return write_folder(out_dir, gpt2.export_files(model, tokenizer, generation), force=force)


def export_translation(model, source_tokenizer, target_tokenizer, out_dir, force=False):
    """Write ``model`` (a ``Transformer``) and its tokenizers as a ``MarianMTModel`` folder
    ``out_dir``; ``force`` replaces an existing one. Returns ``out_dir``."""
    _refuse_existing(out_dir, force)
    return write_folder(out_dir, marian.export_files(model, source_tokenizer,
                                                     target_tokenizer), force=force)


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
    return export_model(run.model, run.source_tokenizer, out_dir, force=force,
                        generation=run.generation)


__all__ = ["EXPORT_FOLDER", "export_model", "export_run", "export_translation"]
