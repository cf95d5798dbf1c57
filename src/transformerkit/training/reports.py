"""What ``train`` writes at the end: ``metrics.json`` and ``samples.txt``."""

import os

from transformerkit.decoding.translate import translate_texts
from transformerkit.evaluation import corpus_scores
from transformerkit.files import atomic_write_text
from transformerkit.run_directory import RunDirectory
from transformerkit.training.monitors import append_text, gpt_samples, sample_settings


def write_final_reports(model, data, config, run_dir, summary, write=True):
    """Evaluate on the validation texts, write ``samples.txt`` and ``metrics.json`` into
    ``run_dir`` (unless ``write`` is False); return the metrics (``summary`` and the
    validation scores)."""
    run = RunDirectory(run_dir)
    train_cfg = config["train"]
    metrics = dict(summary)
    lines = []
    if config["model"]["type"] == "transformer" and data.val_sources:
        limit = train_cfg["eval_max_sentences"] or len(data.val_sources)
        sources, references = data.val_sources[:limit], data.val_targets[:limit]
        hypotheses = translate_texts(model, data.source_tokenizer, data.target_tokenizer,
                                     sources, beam_size=train_cfg["eval_beam_size"],
                                     max_new_tokens=train_cfg["decode_max_length"])
        metrics.update({f"val_{k}": v for k, v in corpus_scores(hypotheses, references).items()})
        metrics["val_sentences_scored"] = len(sources)
        metrics["val_beam_size"] = train_cfg["eval_beam_size"]
        shown = list(zip(sources, references, hypotheses, strict=True))[: train_cfg["samples"]]
        for src, ref, hyp in shown:
            lines += [f"SOURCE:    {src}", f"REFERENCE: {ref}", f"MODEL:     {hyp}", ""]
    elif config["model"]["type"] == "gpt":
        settings = sample_settings(config, data)
        lines += gpt_samples(model, data.source_tokenizer, settings.pop("prompts"),
                             range(train_cfg["samples"]), **settings)
    if write:
        if train_cfg["sample_every"] and os.path.exists(run.samples):
            # the samples taken while training (SampleMonitor) stay, the final ones follow
            append_text(run.samples, "--- final samples ---\n" + "\n".join(lines))
        else:
            atomic_write_text(run.samples, "\n".join(lines))
        run.write_metrics(metrics)
    return metrics
