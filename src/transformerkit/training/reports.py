"""What ``train`` writes at the end: ``metrics.json`` and ``samples.txt``."""

from transformerkit.decoding.sampling import generate_text
from transformerkit.decoding.translate import translate_texts
from transformerkit.evaluation import corpus_scores
from transformerkit.files import atomic_write_text
from transformerkit.run_directory import RunDirectory


def write_final_reports(model, data, config, run_dir, summary):
    """Evaluate on the validation texts, write ``samples.txt`` and ``metrics.json`` into
    ``run_dir``; return the metrics (``summary`` and the validation scores)."""
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
        prompt = data.val_sources[0][:32] if data.val_sources else "\n"
        for seed in range(train_cfg["samples"]):
            text = generate_text(model, data.source_tokenizer, prompt, max_new_tokens=200,
                                 temperature=0.8, top_k=50, seed=seed)
            lines += [f"--- sample {seed} (prompt {prompt!r}) ---", text, ""]
    atomic_write_text(run.samples, "\n".join(lines))
    run.write_metrics(metrics)
    return metrics
