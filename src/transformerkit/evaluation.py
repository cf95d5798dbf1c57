"""Translation quality with sacrebleu: BLEU and chrF with their signatures."""

import re

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


_WORDS = re.compile(r"\w+|[^\w\s]")


def tutorial_bleu(hypotheses, references):
    """BLEU as most Multi30k tutorials report it: lower-cased, split into word and
    punctuation tokens, no further tokenization (``tokenize="none"`` on pre-split text)."""
    def split(text):
        return " ".join(_WORDS.findall(text.lower()))

    score = sacrebleu.corpus_bleu([split(h) for h in hypotheses],
                                  [[split(r) for r in references]], tokenize="none")
    return round(score.score, 2)
