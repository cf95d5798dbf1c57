"""``bench/multi30k_bleu.py``: the note says where the validation loss was lowest."""

from paths import load_bench


def test_the_lowest_validation_loss_is_set_against_the_last():
    bench = load_bench("multi30k_bleu")
    history = [{"val_loss": 3.0}, {"val_loss": 2.5}, {"loss": 1.0}, {"val_loss": 2.7}]
    assert bench.val_loss_line(history) == (
        "Validation loss: lowest 2.500 after epoch 2, 2.700 after the last (4). ")
    assert bench.val_loss_line([{"loss": 1.0}]) == ""
