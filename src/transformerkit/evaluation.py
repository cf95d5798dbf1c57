"""Translation quality with sacrebleu (BLEU and chrF with their signatures) and a
classifier's accuracy and confusion counts."""

import numpy as np
import sacrebleu


def corpus_scores(hypotheses, references):
    """sacrebleu corpus BLEU and chrF of detokenized ``hypotheses`` against ``references``.

    Returns ``{"bleu": float, "bleu_signature": str, "chrf": float, "chrf_signature": str}``.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no sentences to score")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {"bleu": round(bleu_score.score, 2), "bleu_signature": str(bleu.get_signature()),
            "chrf": round(chrf_score.score, 2), "chrf_signature": str(chrf.get_signature())}


def classification_scores(predicted, gold, labels):
    """Accuracy and confusion counts of predicted against gold class names.

    Args:
        predicted, gold: equal-length lists of class names. labels: every class name, in
            class-id order (the rows and columns of the confusion matrix).

    Returns ``{"accuracy": float, "examples": n, "labels": labels, "confusion":
    [[count]]}``: ``confusion[i][j]`` counts texts of gold class ``labels[i]`` predicted as
    ``labels[j]`` (rows gold, columns predicted, as scikit-learn's ``confusion_matrix``),
    plus ``"per_class": {name: {"precision", "recall", "f1", "support"}}``.
    """
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predictions but {len(gold)} gold labels")
    if not gold:
        raise ValueError("no examples to score")
    index = {name: i for i, name in enumerate(labels)}
    unknown = sorted((set(gold) | set(predicted)) - set(index))
    if unknown:
        raise ValueError(f"label(s) {unknown[:5]} are not among the classes {list(labels)[:20]}")
    n = len(labels)
    pairs = np.array([index[g] * n + index[p] for g, p in zip(gold, predicted, strict=True)])
    confusion = np.bincount(pairs, minlength=n * n).reshape(n, n)  # (gold, predicted)
    correct = np.diag(confusion)
    support, chosen = confusion.sum(axis=1), confusion.sum(axis=0)
    per_class = {}
    for i, name in enumerate(labels):
        precision = correct[i] / chosen[i] if chosen[i] else 0.0
        recall = correct[i] / support[i] if support[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[name] = {"precision": round(float(precision), 4),
                           "recall": round(float(recall), 4), "f1": round(float(f1), 4),
                           "support": int(support[i])}
    return {"accuracy": round(float(correct.sum() / len(gold)), 4), "examples": len(gold),
            "labels": list(labels), "confusion": confusion.tolist(), "per_class": per_class}


def format_confusion(scores):
    """The confusion counts of :func:`classification_scores` as an aligned text table
    (rows: gold class, columns: predicted)."""
    labels = scores["labels"]
    width = max(len(x) for x in [*labels, "gold \\ predicted"])
    cells = max(len(str(c)) for row in scores["confusion"] for c in row)
    cells = max(cells, *(len(x) for x in labels))
    lines = ["gold \\ predicted".ljust(width) + "  " + "  ".join(x.rjust(cells) for x in labels)]
    for name, row in zip(labels, scores["confusion"], strict=True):
        lines.append(name.ljust(width) + "  " + "  ".join(str(c).rjust(cells) for c in row))
    return "\n".join(lines)
