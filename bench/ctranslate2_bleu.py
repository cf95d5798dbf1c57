"""BLEU of a run's CTranslate2 exports, float32 and int8, next to the Keras model itself.

The run (a trained Multi30k de->en model) is exported twice through
``transformerkit.export`` (float32 weights as trained, and ``--quantization int8``), and
all three translate Multi30k test2016 with greedy search and beam 4 (alpha 0.6), through
``transformerkit.load(RUN).translate(..., engine=...)``. Int8 must lose at most 0.5 BLEU.

    python bench/ctranslate2_bleu.py --run runs/multi30k_de_en
    # -> bench/results/ctranslate2_bleu.FAMILY.{json,md}
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/multi30k_de_en")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import torch

    import transformerkit
    from transformerkit.data.corpora import load_multi30k
    from transformerkit.evaluation import corpus_scores
    from transformerkit.export.ctranslate2 import default_export_dir, export_run
    from transformerkit.export.runtime import CTranslate2Engine, ensure_export

    torch.set_num_threads(args.threads)
    run = transformerkit.load(args.run)
    sources, references = load_multi30k("test2016", "de", "en", data_dir=common.data_dir())
    int8_dir = export_run(run, default_export_dir(args.run, "int8"), quantization="int8",
                          force=True)
    engines = {"keras": "keras",
               "ctranslate2 float32": CTranslate2Engine(run, threads=args.threads,
                                                        model_dir=ensure_export(run)),
               "ctranslate2 int8": CTranslate2Engine(run, threads=args.threads,
                                                     model_dir=int8_dir)}
    results = []
    for beam in (1, 4):
        for name, engine in engines.items():
            started = time.perf_counter()
            hypotheses = run.translate(sources, beam_size=beam, alpha=0.6,
                                       max_new_tokens=args.max_new_tokens,
                                       batch_size=args.batch, engine=engine)
            seconds = time.perf_counter() - started
            bleu = corpus_scores(hypotheses, references)["bleu"]
            results.append(dict(engine=name, beam_size=beam, bleu=bleu,
                                seconds=round(seconds, 1), sentences=len(sources)))
            print(results[-1], flush=True)
    rows = ["| engine | search | BLEU (test2016) | vs CTranslate2 float32 |", "|---|---|---|---|"]
    for r in results:
        base = next(x["bleu"] for x in results
                    if x["engine"] == "ctranslate2 float32" and x["beam_size"] == r["beam_size"])
        search = "greedy" if r["beam_size"] == 1 else f"beam {r['beam_size']}"
        rows.append(f"| {r['engine']} | {search} | {r['bleu']:.2f} | {r['bleu'] - base:+.2f} |")
    payload = {"machine": dict(common.machine(), threads=args.threads), "run": args.run,
               "results": results}
    common.write_results("ctranslate2_bleu", payload, "\n".join(rows))


if __name__ == "__main__":
    main()
