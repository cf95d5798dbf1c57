"""Callbacks that watch a model learn: sample outputs every N epochs/steps, validation BLEU.

- :class:`SampleMonitor` prints a few translations (``Transformer``) or generations (``GPT``)
  every ``every`` epochs or steps, like the Keras mini-GPT tutorial's ``TextGenerator``.
- :class:`ValidationBLEU` translates validation sentences at epoch ends and adds
  ``val_bleu`` and ``val_chrf`` (sacrebleu) to the epoch logs, so ``history.csv``,
  TensorBoard and checkpoint monitors see them.

Both decode with the fast cached decoders of :mod:`transformerkit.decoding`. ``trainer``
adds them from the ``train:`` keys ``sample_every`` / ``sample_unit`` and ``bleu_every`` /
``bleu_max_sentences``.
"""

import logging
import os

import keras

from transformerkit.decoding.options import GenerationOptions, SearchOptions
from transformerkit.decoding.sampling import generate_text
from transformerkit.decoding.translate import translate_texts
from transformerkit.evaluation import corpus_scores
from transformerkit.files import atomic_write_text
from transformerkit.models.base import float32_compute
from transformerkit.run_directory import RunDirectory

log = logging.getLogger("transformerkit")
UNITS = ("epoch", "step")


class SampleMonitor(keras.callbacks.Callback):
    """Print sample outputs every ``every`` epochs (``unit="epoch"``) or optimizer steps.

    Args:
        source_tokenizer, target_tokenizer: the run's tokenizers (the same for a GPT).
        sources: source texts to translate (Transformer), or None.
        references: optional reference translations, printed next to the outputs.
        prompt: text to continue (GPT), or a list of texts, or None.
        every: int >= 1. unit: "epoch" or "step".
        options: how the samples are decoded: a
            :class:`~transformerkit.decoding.options.GenerationOptions` for a GPT (its seed
            is fixed, so successive samples show the model changing, not the dice), a
            :class:`~transformerkit.decoding.options.SearchOptions` for translations; None:
            the declared defaults (greedy translations).
        print_fn: where lines go (default ``print``).
        out: a file the samples are also appended to (``RUN/samples.txt``), or None.
    """

    def __init__(self, source_tokenizer, target_tokenizer=None, sources=None, references=None,
                 prompt=None, every=1, unit="epoch", options=None, print_fn=print, out=None):
        super().__init__()
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        if int(every) < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        if (sources is None) == (prompt is None):
            raise ValueError("give either sources (translation) or prompt (generation)")
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer or source_tokenizer
        self.sources, self.references = list(sources or []), list(references or [])
        self.prompts = [prompt] if isinstance(prompt, str) else prompt
        self.every, self.unit = int(every), unit
        self.options = options or (GenerationOptions() if prompt is not None
                                   else SearchOptions(beam_size=1))
        self.print_fn, self.out = print_fn, out
        self.printed = 0  # how many times samples were shown (for tests and curiosity)

    def on_epoch_end(self, epoch, logs=None):
        if self.unit == "epoch" and (epoch + 1) % self.every == 0:
            self.show(f"epoch {epoch + 1}")

    def on_train_batch_end(self, batch, logs=None):
        if self.unit == "step":
            step = int(self.model.optimizer.iterations.numpy())
            if step % self.every == 0:
                self.show(f"step {step}")

    def show(self, when):
        """Decode the samples now and print them under the heading ``when``."""
        with float32_compute(self.model):  # as transformerkit.load decodes it
            lines = self._sample_lines(when)
        self.print_fn("\n".join(lines))
        if self.out is not None:
            append_text(self.out, "\n".join(lines) + "\n\n")
        self.printed += 1

    def _sample_lines(self, when):
        lines = [f"--- samples after {when} ---"]
        if self.prompts is not None:
            lines += gpt_samples(self.model, self.source_tokenizer, self.prompts,
                                 [self.options.seed], self.options)
        else:
            outputs = translate_texts(self.model, self.source_tokenizer, self.target_tokenizer,
                                      self.sources, self.options)
            for i, (source, output) in enumerate(zip(self.sources, outputs, strict=True)):
                lines.append(f"SOURCE:    {source}")
                if i < len(self.references):
                    lines.append(f"REFERENCE: {self.references[i]}")
                lines.append(f"MODEL:     {output}")
        return lines


def gpt_samples(model, tokenizer, prompts, seeds, options):
    """Lines of text: for each prompt and seed a heading and the continuation sampled with
    ``options`` (a :class:`GenerationOptions`, its seed replaced by each of ``seeds``)."""
    lines = []
    for prompt in prompts:
        for seed in seeds:
            text = generate_text(model, tokenizer, prompt,
                                 max_new_tokens=options.max_new_tokens,
                                 temperature=options.temperature, top_k=options.top_k,
                                 top_p=options.top_p, seed=seed)
            lines += [f"[prompt {prompt!r}, seed {seed}]", text]
    return lines


def append_text(path, text):
    """``path``'s content followed by ``text``, written atomically (a crash leaves the old
    file or the new one, never a torn line)."""
    old = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
    atomic_write_text(path, old + text)


def evaluation_options(config):
    """The :class:`SearchOptions` of the validation translations and samples during and
    after training: the run's ``search:`` section (what ``translate`` will search with: its
    length penalty, ``no_repeat_ngram_size``, ...) with ``train.eval_beam_size`` beams, one
    hypothesis, no sampling, and ``train.decode_max_length`` tokens when that is set."""
    train = config.train
    options = config.search.replace(beam_size=train.eval_beam_size, n_best=1, temperature=None,
                                    top_k=None, top_p=None, seed=None)
    if train.decode_max_length is not None:
        options = options.replace(max_new_tokens=train.decode_max_length)
    return options


def sample_settings(config, data):
    """``(prompts, GenerationOptions)``: the GPT samples of the ``train:`` section
    (``train.sample_*``); the prompt defaults to the validation text's start, the length to
    ``train.decode_max_length``, else ``generate``'s default."""
    train = config.train
    prompts = train.sample_prompts or [data.val_sources[0][:32] if data.val_sources
                                          else "\n"]
    length = train.sample_max_tokens or train.decode_max_length
    options = GenerationOptions(temperature=train.sample_temperature, top_k=train.sample_top_k,
                                top_p=train.sample_top_p)
    return prompts, options if length is None else options.replace(max_new_tokens=length)


class ValidationBLEU(keras.callbacks.Callback):
    """Corpus BLEU and chrF (sacrebleu) of the model's translations of validation
    ``sources`` against ``references``, every ``every`` epochs, as ``val_bleu`` /
    ``val_chrf`` in the epoch logs (callbacks after this one, e.g. ``CSVLogger``, see them).

    Args:
        sources, references: validation texts (the first ``max_sentences`` are used).
        source_tokenizer, target_tokenizer: the run's tokenizers.
        every: int >= 1, epochs between evaluations.
        max_sentences: int or None (all).
        options: the :class:`~transformerkit.decoding.options.SearchOptions` of the
            translations (``transformerkit train``: :func:`evaluation_options`); None: the
            declared defaults.
        print_fn: where the result line goes (default: the ``transformerkit`` logger).
    """

    def __init__(self, sources, references, source_tokenizer, target_tokenizer, every=1,
                 max_sentences=200, options=None, print_fn=None):
        super().__init__()
        if int(every) < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references")
        limit = max_sentences or len(sources)
        self.sources, self.references = list(sources[:limit]), list(references[:limit])
        if not self.sources:
            raise ValueError("ValidationBLEU needs at least one validation sentence")
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.every, self.options = int(every), options or SearchOptions()
        self.print_fn = print_fn or log.info
        self.history = []  # (epoch, scores dict)

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        with float32_compute(self.model):  # as transformerkit.load decodes it
            hypotheses = translate_texts(self.model, self.source_tokenizer,
                                         self.target_tokenizer, self.sources, self.options)
        scores = corpus_scores(hypotheses, self.references)
        self.history.append((epoch + 1, scores))
        if logs is not None:
            logs["val_bleu"], logs["val_chrf"] = scores["bleu"], scores["chrf"]
        self.print_fn(f"epoch {epoch + 1}: val_bleu {scores['bleu']} val_chrf {scores['chrf']} "
                      f"({len(self.sources)} sentences, beam {self.options.beam_size})")


def build_monitors(config, data, run_dir=None):
    """The monitors the ``train:`` section asks for (``sample_every``, ``bleu_every``);
    samples are also appended to ``run_dir``'s ``samples.txt`` when it is given."""
    train = config.train
    monitors = []
    if train.sample_every:
        common = dict(every=train.sample_every, unit=train.sample_unit,
                      print_fn=log.info,
                      out=RunDirectory(run_dir).samples if run_dir is not None else None)
        if config.model.type == "gpt":
            prompts, options = sample_settings(config, data)
            monitors.append(SampleMonitor(data.source_tokenizer, prompt=prompts,
                                          options=options.replace(seed=train.seed), **common))
        elif config.model.type == "transformer" and data.val_sources:
            count = max(1, min(train.samples, 3))
            monitors.append(SampleMonitor(
                data.source_tokenizer, data.target_tokenizer, sources=data.val_sources[:count],
                references=data.val_targets[:count],
                options=evaluation_options(config).replace(beam_size=1), **common))
    if train.bleu_every and config.model.type == "transformer" and data.val_sources:
        monitors.append(ValidationBLEU(data.val_sources, data.val_targets,
                                       data.source_tokenizer, data.target_tokenizer,
                                       every=train.bleu_every,
                                       max_sentences=train.bleu_max_sentences,
                                       options=evaluation_options(config)))
    return monitors
