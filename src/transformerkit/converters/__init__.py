"""Converters of Hugging Face checkpoints to this package's models and back, one module per
architecture (keras-hub's shape).

Each architecture module reads a checkpoint folder in the same steps, and writes one back
where an export exists, each direction beside the other:

- ``load_config``: ``config.json``, checked for what the model reproduces (a
  :class:`~transformerkit.converters.hf_io.CheckpointError` naming the key otherwise);
- ``convert_backbone_config``: that config -> the model's constructor options;
- ``convert_weights``: the tensors, by name, into a built model (the table of what maps to
  what is in the module's docstring);
- ``convert_tokenizer``: the folder's tokenizer in the model's ids;
- ``export_config``, ``export_weights``, ``export_files``: the way back.

Modules: :mod:`~transformerkit.converters.bert` (BERT/DistilBERT -> ``Encoder``),
:mod:`~transformerkit.converters.gpt2` (GPT-2 <-> ``GPT``),
:mod:`~transformerkit.converters.marian` (Marian/OPUS-MT <-> ``Transformer``, with
:mod:`~transformerkit.converters.marian_ids`, the vocabulary ids, and
:mod:`~transformerkit.converters.marian_checks`, what is refused),
:mod:`~transformerkit.converters.generation` (a checkpoint's ``generation_config.json`` as
the run's search options), :mod:`~transformerkit.converters.hf_io` (the files: reading
``config.json`` and weights, writing a folder atomically).

Layering: the converters sit between ``layers`` and ``models``. They work on the model they
are given and import no model class; the models' ``from_pretrained`` classmethods build a
model from ``convert_backbone_config`` and fill it with ``convert_weights``, and
``importing`` (``transformerkit import``) and ``export.huggingface`` (``transformerkit
export --format huggingface``) call them.
"""
