"""The bfloat16 benchmarks' peers and arithmetic: Marian under ``torch.autocast`` really
computes its products in bfloat16 (and keeps float32 weights), the nanoGPT copy patched for
autocast changes exactly its CPU context line, and the ratios and seed spreads the reports
print come from the rows they are given."""

import pytest
from paths import load_bench


@pytest.mark.parametrize("autocast", [True, False])
def test_marian_peer_multiplies_in_bfloat16_under_autocast_only_and_keeps_float32_weights(
        autocast):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    train_step = load_bench("train_step")
    seen = []
    model, step = train_step.marian_model(autocast=autocast)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    source = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    decoder_input = torch.tensor([[1, 10, 11], [1, 12, 0]])
    labels = torch.tensor([[10, 11, 2], [12, 2, 0]])
    loss = step((source, decoder_input, labels))
    assert set(seen) == {torch.bfloat16 if autocast else torch.float32}
    assert 0 < loss < 20 and all(p.dtype == torch.float32 for p in model.parameters())


def test_bfloat16_summary_sets_our_bfloat16_step_against_float32_and_marian_autocast():
    train_step = load_bench("train_step")
    tps = "target_tokens_per_s"
    rows = [{"system": "transformerkit (torch)", "model": "small", tps: 1000.0},
            {"system": "transformerkit (torch, mixed_bfloat16)", "model": "small",
             "precision": "mixed_bfloat16", tps: 2500.0},
            {"system": "HF transformers MarianMTModel", "model": "small", tps: 800.0},
            {"system": train_step.MARIAN_AUTOCAST, "model": "small",
             "precision": "autocast bfloat16", tps: 2000.0}]
    line = train_step.bfloat16_summary(rows)
    assert "2.50x our float32 step" in line and "1.25x Marian under torch.autocast" in line
    assert train_step.bfloat16_summary(rows[:3]) == ""


def test_nanogpt_autocast_copy_changes_only_the_cpu_context_line(tmp_path):
    gpt = load_bench("gpt_vs_nanogpt")
    checkout, work = tmp_path / "nanogpt", tmp_path / "work"
    checkout.mkdir()
    work.mkdir()
    lines = ["import torch", "device_type = 'cpu'",
             "ctx = nullcontext() if device_type == 'cpu' else "
             "torch.amp.autocast(device_type=device_type, dtype=ptdtype)", "print(ctx)"]
    (checkout / "train.py").write_text("\n".join(lines))
    patched = open(gpt.autocast_train_script(str(checkout), str(work))).read().splitlines()
    assert patched[2] == "ctx = torch.amp.autocast(device_type=device_type, dtype=ptdtype)"
    assert patched[:2] + patched[3:] == lines[:2] + lines[3:]
    (checkout / "train.py").write_text("ctx = nullcontext()\n")
    with pytest.raises(SystemExit, match="no line starting"):
        gpt.autocast_train_script(str(checkout), str(work))


def test_time_to_loss_verdict_compares_each_system_with_both_nanogpts_of_its_run():
    gpt = load_bench("gpt_vs_nanogpt")

    def result(system, run, seconds_by_loss):
        return {"system": system, "run": run,
                "evals": [{"val_loss": loss, "seconds": s} for loss, s in seconds_by_loss]}

    results = [result("nanoGPT", 1, [(2.5, 10.0), (1.9, 80.0)]),
               result(gpt.NANOGPT_AUTOCAST, 1, [(2.5, 8.0), (1.9, 64.0)]),
               result("transformerkit (torch, mixed_bfloat16)", 1, [(2.4, 5.0), (1.85, 32.0)]),
               result("transformerkit (torch)", 1, [(2.4, 9.0), (2.0, 70.0)])]
    verdict = gpt.time_to_loss_verdict(results, 1.9)
    assert "mixed_bfloat16): time to nanoGPT's validation loss 1.9000 over nanoGPT's " \
           "(float32), run by run: 0.40x; over nanoGPT under autocast: 0.50x." in verdict
    assert "transformerkit (torch): time to nanoGPT's validation loss 1.9000 over nanoGPT's " \
           "(float32), run by run: not reached; over nanoGPT under autocast: not reached." \
           in verdict
    assert gpt.time_to_loss_verdict(results[:1] + results[2:], 1.9) is None


def test_precision_quality_summary_is_the_mean_and_seed_spread_per_precision():
    quality = load_bench("precision_quality")
    rows = [{"precision_requested": p, "final_val_loss": loss,
             "bleu": {"greedy": greedy, "beam 4": beam}}
            for p, loss, greedy, beam in [("float32", 3.0, 20.0, 21.0),
                                          ("float32", 3.2, 22.0, 22.0),
                                          ("mixed_bfloat16", 3.1, 21.5, 22.5)]]
    summary = quality.summarize(rows, ["float32", "mixed_bfloat16"], ["greedy", "beam 4"])
    assert summary["float32"]["seeds"] == 2
    assert summary["float32"]["final_val_loss"] == {"mean": 3.1, "seed_spread": 0.2}
    assert summary["float32"]["bleu greedy"] == {"mean": 21.0, "seed_spread": 2.0}
    assert summary["mixed_bfloat16"]["bleu beam 4"] == {"mean": 22.5, "seed_spread": 0.0}
