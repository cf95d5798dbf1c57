"""What ``train`` writes at the end: ``metrics.json`` and ``samples.txt``."""

import logging
import os

from transformerkit.decoding.classify import class_probabilities
from transformerkit.decoding.translate import translate_texts
from transformerkit.evaluation import classification_scores, corpus_scores, format_confusion
from transformerkit.files import atomic_write_text
from transformerkit.models.base import float32_compute
from transformerkit.run_directory import RunDirectory
from transformerkit.training.monitors import (
    append_text,
    evaluation_options,
    gpt_samples,
    sample_settings,
)

log = logging.getLogger("transformerkit")


def write_final_reports(model, data, config, run_dir, summary, write=True):
    """Evaluate on the validation texts, write ``samples.txt`` and ``metrics.json`` into
    ``run_dir`` (unless ``write`` is False); return the metrics (``summary`` and the
    validation scores)."""
    run = RunDirectory(run_dir)
    train_cfg = config.train
    metrics = dict(summary)
    lines = []
    with float32_compute(model):  # decoded as transformerkit.load decodes it
        if config.model.type == "transformer" and data.val_sources:
            limit = train_cfg.eval_max_sentences or len(data.val_sources)
            sources, references = data.val_sources[:limit], data.val_targets[:limit]
            hypotheses = translate_texts(model, data.source_tokenizer, data.target_tokenizer,
                                         sources, evaluation_options(config))
            scores = corpus_scores(hypotheses, references)
            metrics.update({f"val_{k}": v for k, v in scores.items()})
            metrics["val_sentences_scored"] = len(sources)
            metrics["val_beam_size"] = train_cfg.eval_beam_size
            shown = list(zip(sources, references, hypotheses, strict=True))[: train_cfg.samples]
            for src, ref, hyp in shown:
                lines += [f"SOURCE:    {src}", f"REFERENCE: {ref}", f"MODEL:     {hyp}", ""]
        elif config.model.type == "encoder" and data.val_sources:
            scores, shown = _classifier_report(model, data, train_cfg.samples)
            metrics.update(scores)
            lines += shown
        elif config.model.type == "gpt":
            prompts, options = sample_settings(config, data)
            lines += gpt_samples(model, data.source_tokenizer, prompts,
                                 range(train_cfg.samples), options)
    if write:
        if train_cfg.sample_every and os.path.exists(run.samples):
            # the samples taken while training (SampleMonitor) stay, the final ones follow
            append_text(run.samples, "--- final samples ---\n" + "\n".join(lines))
        else:
            atomic_write_text(run.samples, "\n".join(lines))
        run.write_metrics(metrics)
    return metrics


def _classifier_report(model, data, samples):
    """An encoder classifier on the validation texts: ``val_accuracy``, ``val_confusion``
    and per-class scores for ``metrics.json``, the first ``samples`` texts with their gold
    and predicted class for ``samples.txt``."""
    probabilities = class_probabilities(model, data.source_tokenizer, data.val_sources)
    predicted = [data.labels[i] for i in probabilities.argmax(axis=-1)]
    scores = classification_scores(predicted, data.val_targets, data.labels)
    log.info("validation accuracy %.4f on %d texts\n%s", scores["accuracy"],
             scores["examples"], format_confusion(scores))
    metrics = {"val_accuracy": scores["accuracy"], "val_texts_scored": scores["examples"],
               "val_confusion": {"labels": scores["labels"], "counts": scores["confusion"]},
               "val_per_class": scores["per_class"]}
    lines = []
    for i in range(min(samples, len(predicted))):
        lines += [f"TEXT:      {data.val_sources[i]}", f"LABEL:     {data.val_targets[i]}",
                  f"PREDICTED: {predicted[i]} ({probabilities[i].max():.3f})", ""]
    return metrics, lines
