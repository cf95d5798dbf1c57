"""What ``train`` writes at the end: ``metrics.json`` and ``samples.txt``."""

import json
import os

import numpy as np

from transformerkit.decoding.greedy import greedy_translate
from transformerkit.evaluation import corpus_scores
from transformerkit.files import atomic_write_text


def translate_texts(model, source_tokenizer, target_tokenizer, texts, batch_size=64,
                    max_new_tokens=None):
    """Greedy translations of raw ``texts`` (sorted by length internally, returned in order)."""
    max_new_tokens = max_new_tokens or model.max_length
    encoded = [source_tokenizer.encode(t, add_eos=True)[: model.max_length] for t in texts]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    results = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(encoded[i]) for i in chunk)
        batch = np.zeros((len(chunk), width), dtype="int32")
        for row, i in enumerate(chunk):
            batch[row, :len(encoded[i])] = encoded[i]
        outputs = greedy_translate(model, batch, target_tokenizer.bos_id,
                                   target_tokenizer.eos_id, max_new_tokens)
        for i, ids in zip(chunk, outputs, strict=True):
            results[i] = target_tokenizer.decode(ids)
    return results


def write_final_reports(model, data, config, run_dir, summary):
    """Evaluate on the validation texts, write ``samples.txt`` and ``metrics.json``."""
    train_cfg = config["train"]
    metrics = dict(summary)
    lines = []
    if config["model"]["type"] == "transformer" and data.val_sources:
        limit = train_cfg["eval_max_sentences"] or len(data.val_sources)
        sources, references = data.val_sources[:limit], data.val_targets[:limit]
        hypotheses = translate_texts(model, data.source_tokenizer, data.target_tokenizer,
                                     sources, max_new_tokens=train_cfg["decode_max_length"])
        metrics.update({f"val_{k}": v for k, v in corpus_scores(hypotheses, references).items()})
        metrics["val_sentences_scored"] = len(sources)
        for src, ref, hyp in list(zip(sources, references, hypotheses, strict=True))[: train_cfg["samples"]]:
            lines += [f"SOURCE:    {src}", f"REFERENCE: {ref}", f"MODEL:     {hyp}", ""]
    elif config["model"]["type"] == "gpt":
        from transformerkit.decoding.sampling import generate_text

        prompt = data.val_sources[0][:32] if data.val_sources else "\n"
        for seed in range(train_cfg["samples"]):
            text = generate_text(model, data.source_tokenizer, prompt, max_new_tokens=200,
                                 temperature=0.8, top_k=50, seed=seed)
            lines += [f"--- sample {seed} (prompt {prompt!r}) ---", text, ""]
    atomic_write_text(os.path.join(run_dir, "samples.txt"), "\n".join(lines))
    atomic_write_text(os.path.join(run_dir, "metrics.json"), json.dumps(metrics, indent=2))
    return metrics
