"""The encoder as a text classifier from the config and the CLI (``model.type: encoder``):
its loss and scores against independent references (float64 NumPy, scikit-learn), its
batches, gradient accumulation counting rows, then ``train`` from a TSV (columns by name),
``evaluate`` (accuracy and confusion), ``classify``, ``embed`` and a start from a
pretrained Hugging Face folder.

Tolerances (``tests/support/tolerances.py``): the loss against float64 within the cross-entropy's
rounding bound; accumulated and large-batch SGD updates within
``tolerances.sgd_weights_atol``; probabilities and embeddings of two float32 paths (another
batch shape) within the model's chain bound; scores rounded to 4 decimals by
``classification_scores`` within half their last digit. The power check drops the
micro-batches' row weights (a plain mean of their gradients).
"""

import json

import keras
import numpy as np
import pytest
import tolerances as tol

from transformerkit.api import load
from transformerkit.cli import main
from transformerkit.config import ConfigError, load_config, resolve
from transformerkit.data.pipeline import ClassificationBatches, encode_texts
from transformerkit.data.tokenizers import CharTokenizer
from transformerkit.evaluation import classification_scores
from transformerkit.models import Encoder
from transformerkit.special_tokens import BOS_ID, EOS_ID
from transformerkit.training.accumulation import UpdateBatches
from transformerkit.training.losses import ClassificationCrossEntropy, classification_cross_entropy
from transformerkit.training.optimizers import with_accumulation
from transformerkit.training.step import TrainStep, attach_train_step
from transformerkit.training.trainer import train

CUES = {"pos": ["good", "great", "nice"], "neg": ["bad", "awful", "poor"],
        "mid": ["okay", "average", "fair"]}
FILLER = "the a dog cat house tree runs sits blue red small big on under near".split()
ROUNDED = 0.5e-4  # classification_scores rounds its scores to 4 decimals


def gradient_roundings(model, rows, length, classes):
    """A classifier's gradient: the forward pass, mean pooling over ``length``, the loss, the
    backward pass (its products as long as the forward's), each weight's sum over the
    batch's ``rows * length`` tokens, two micro-batches summed and their row weights."""
    tokens = rows * length
    return (2 * (tol.model_roundings(model, target_len=length) + length)
            + tol.cross_entropy_roundings(classes, rows) + tokens + 2 + 2)


def embedding_atol(model, length, hidden, paths=2):
    """Two float32 forward passes of an encoder over ``length`` positions (other batch
    shapes), then the pooling's sum over them."""
    return tol.chain_atol(tol.model_roundings(model, target_len=length) + length, hidden, paths)


def write_tsv(path, n, seed, label_first=False):
    """A TSV with a header; the label is the class of the one cue word in the text."""
    rng = np.random.default_rng(seed)
    rows = ["label\ttext" if label_first else "text\tlabel"]
    for _ in range(n):
        label = sorted(CUES)[rng.integers(3)]
        words = [FILLER[i] for i in rng.integers(0, len(FILLER), rng.integers(2, 6))]
        words.insert(int(rng.integers(len(words) + 1)), CUES[label][rng.integers(3)])
        text = " ".join(words)
        rows.append(f"{label}\t{text}" if label_first else f"{text}\t{label}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def classifier_config(folder, **train):
    return resolve({
        "model": {"type": "encoder", "num_layers": 1, "d_model": 16, "num_heads": 2,
                  "d_ff": 32, "dropout": 0.0, "max_length": 48},
        "data": {"dataset": "tsv", "train_tsv": write_tsv(folder / "train.tsv", 96, 1, True),
                 "val_tsv": write_tsv(folder / "val.tsv", 30, 2, True), "header": True,
                 "source_column": "text", "target_column": "label", "tokenizer": "char",
                 "batch_size": 16},
        "train": {"epochs": 3, "learning_rate": 0.01, "label_smoothing": 0.0, "verbose": 0,
                  "samples": 2, **train}})


# -- the math --------------------------------------------------------------------------------

@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_classification_loss_equals_float64_reference(smoothing):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4)) * 3
    labels = np.array([0, 3, 1, 0, 2])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # float64
    target = np.full((5, 4), smoothing / 4)
    target[np.arange(5), labels] += 1 - smoothing
    expected = -(target * log_p).sum(-1).mean()
    # the logits rounded to float32 (1), the loss's roundings on terms of |log p|'s size
    atol = tol.chain_atol(1 + tol.cross_entropy_roundings(4, 5),
                          max(np.abs(log_p).max(), np.abs(logits).max()))
    got = classification_cross_entropy(labels, logits.astype("float32"), smoothing)
    tol.assert_within(float(keras.ops.convert_to_numpy(got)), expected, atol)
    # class 0 is a class, not padding: every row counts
    loss = ClassificationCrossEntropy(smoothing)(labels, logits.astype("float32"))
    tol.assert_within(float(keras.ops.convert_to_numpy(loss)), expected, atol)


def test_scores_equal_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    labels = ["a", "b", "c"]
    rng = np.random.default_rng(3)
    gold = [labels[i] for i in rng.integers(0, 3, 50)]
    predicted = [labels[i] for i in rng.integers(0, 3, 50)]
    predicted[:3] = ["c", "c", "c"]
    scores = classification_scores(predicted, gold, labels)
    np.testing.assert_array_equal(scores["confusion"],
                                  metrics.confusion_matrix(gold, predicted, labels=labels))
    # not a rounding bound: the scores are rounded to 4 decimals (ROUNDED), sklearn's are not
    assert scores["accuracy"] == pytest.approx(metrics.accuracy_score(gold, predicted),
                                               abs=ROUNDED)
    precision, recall, f1, support = metrics.precision_recall_fscore_support(
        gold, predicted, labels=labels, zero_division=0)
    for i, name in enumerate(labels):
        assert scores["per_class"][name]["precision"] == pytest.approx(precision[i],
                                                                       abs=ROUNDED)
        assert scores["per_class"][name]["recall"] == pytest.approx(recall[i], abs=ROUNDED)
        assert scores["per_class"][name]["f1"] == pytest.approx(f1[i], abs=ROUNDED)
        assert scores["per_class"][name]["support"] == support[i]
    with pytest.raises(ValueError, match="not among the classes"):
        classification_scores(["z"], ["a"], labels)


# -- batches -----------------------------------------------------------------------------------

def test_texts_are_cut_keeping_bos_and_eos_and_batched_once_per_epoch():
    tokenizer = CharTokenizer.train(["abcdefgh"])
    # 20 texts, distinct in their first 9 characters, 2 to 16 characters long
    texts = ["abcdefgh"[i % 8] + "abcdefgh"[i // 8] + "h" * (i % 15) for i in range(20)]
    encoded = encode_texts(texts, tokenizer, 12, labels=np.arange(20) % 4)
    assert encoded.truncated == sum(len(t) + 2 > 12 for t in texts) > 0
    for ids, text in zip(encoded.ids, texts, strict=True):
        assert ids[0] == BOS_ID and ids[-1] == EOS_ID and len(ids) == min(len(text) + 2, 12)
        assert tokenizer.decode(ids[1:-1]) == text[:10]
    index = {tuple(ids): i for i, ids in enumerate(encoded.ids)}
    batches = ClassificationBatches(encoded, tokens_per_batch=40, seed=5)
    orders = []
    for epoch in range(2):
        batches.set_epoch(epoch)
        seen = []
        for i in range(len(batches)):
            ids, labels = batches[i]
            assert ids.shape[0] * ids.shape[1] <= 40 and labels.shape == (ids.shape[0],)
            for row, label in zip(ids, labels, strict=True):
                text = index[tuple(row[:np.count_nonzero(row)])]
                assert label == text % 4  # each text with its own label
                seen.append(text)
        assert sorted(seen) == list(range(20))  # every text once per epoch
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled per epoch


class _Listed:
    """Fixed micro-batches as an epoch dataset (what UpdateBatches wraps)."""

    def __init__(self, batches):
        self.batches, self.epoch = batches, 0

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]

    def set_epoch(self, epoch):
        self.epoch = epoch

    def on_epoch_begin(self):
        pass

    def on_epoch_end(self):
        pass


def _one_update(batches, accumulate):
    keras.utils.set_random_seed(0)
    model = Encoder(vocab_size=12, num_layers=1, d_model=8, num_heads=2, d_ff=16, dropout=0.0,
                    max_length=10, pooling="mean", num_classes=3)
    model.compile(optimizer=with_accumulation(keras.optimizers.SGD(0.5), accumulate),
                  loss=ClassificationCrossEntropy())
    attach_train_step(model)
    model.fit(UpdateBatches(_Listed(batches), accumulate), epochs=1, shuffle=False, verbose=0)
    return model, [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]


def test_accumulation_counts_rows_so_it_equals_the_large_batch():
    """Micro-batches of 3 and 5 texts (a plain mean of their gradients would weight each
    text of the first by 1/6, not 1/8) make the update of the one batch of 8."""
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 12, (8, 6)).astype("int32")
    ids[:, 4:] *= rng.integers(0, 2, (8, 1)).astype("int32")  # some rows padded
    labels = rng.integers(0, 3, 8).astype("int32")
    model, large = _one_update([(ids, labels)], 1)
    _, accumulated = _one_update([(ids[:3], labels[:3]), (ids[3:], labels[3:])], 2)
    roundings = gradient_roundings(model, *ids.shape, classes=3)
    for a, b in zip(accumulated, large, strict=True):
        tol.assert_within(a, b, tol.sgd_weights_atol(roundings, 0.5, 1, b))


def test_tolerances_still_catch_a_plain_mean_of_micro_batches(monkeypatch):
    """Each micro-batch's loss unweighted (Keras' accumulation alone): a row of the batch
    of 3 weighs 1/6 in the update instead of 1/8."""

    def unweighted(self, model, x=None, y=None, y_pred=None, sample_weight=None,
                   training=True):
        return keras.Model.compute_loss(model, x, y, y_pred, None, training=training)

    monkeypatch.setattr(TrainStep, "compute_loss", unweighted)
    tol.assert_caught(test_accumulation_counts_rows_so_it_equals_the_large_batch)


# -- train, evaluate, classify, embed ---------------------------------------------------------

@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("classifier")
    config = classifier_config(folder)
    metrics = train(config, folder / "run")
    return folder, folder / "run", metrics


def test_train_writes_a_classifier_run(classifier_run):
    folder, run_dir, metrics = classifier_run
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels == ["mid", "neg", "pos"]
    assert metrics["classes"] == 3 and metrics["train_texts"] == 96
    assert metrics["val_texts_scored"] == 30
    counts = np.array(metrics["val_confusion"]["counts"])
    assert counts.shape == (3, 3) and counts.sum() == 30
    # the inference path (decoding/classify.py) agrees with Keras' own validation accuracy
    history = (run_dir / "history.csv").read_text().splitlines()
    keras_accuracy = float(dict(zip(history[0].split(","), history[-1].split(","),
                                    strict=True))["val_accuracy"])
    # not a rounding bound: val_accuracy is rounded to 4 decimals; the same argmax counts
    # (Keras': a float32 division)
    assert metrics["val_accuracy"] == pytest.approx(keras_accuracy, abs=ROUNDED + tol.U32)
    assert metrics["val_accuracy"] == pytest.approx(np.trace(counts) / 30, abs=ROUNDED)
    assert "PREDICTED:" in (run_dir / "samples.txt").read_text()


def test_evaluate_prints_accuracy_and_confusion(classifier_run, capsys):
    folder, run_dir, metrics = classifier_run
    assert main(["evaluate", str(run_dir), "--split", "val"]) == 0
    out = capsys.readouterr().out
    assert f"accuracy = {metrics['val_accuracy']:.4f}" in out
    assert "gold \\ predicted" in out
    stored = json.loads((run_dir / "metrics.json").read_text())["evaluate"]["val"]
    assert stored["confusion"] == metrics["val_confusion"]["counts"]
    # --source/--reference: texts and labels, line by line
    texts, labels = folder / "texts.txt", folder / "labels.txt"
    texts.write_text("a good dog\nthe bad cat\n")
    labels.write_text("pos\nneg\n")
    assert main(["evaluate", str(run_dir), "--source", str(texts),
                 "--reference", str(labels)]) == 0
    assert "2 texts, 3 classes" in capsys.readouterr().out
    labels.write_text("pos\nunknown\n")
    assert main(["evaluate", str(run_dir), "--source", str(texts),
                 "--reference", str(labels)]) == 2
    assert "not among the run's classes" in capsys.readouterr().err


def test_classify_and_probabilities(classifier_run, capsys, monkeypatch):
    _, run_dir, _ = classifier_run
    run = load(run_dir)
    texts = ["a good dog", "the bad cat on a tree", "okay house"]
    probabilities = run.classify(texts, probabilities=True)
    for row in probabilities:
        assert set(row) == {"mid", "neg", "pos"}
        # a float32 softmax: each probability within its roundings, relative
        assert sum(row.values()) == pytest.approx(1.0, abs=tol.gamma(tol.SOFTMAX_EXTRA + 3))
    assert run.classify(texts) == [max(row, key=row.get) for row in probabilities]
    assert run.classify(texts[0]) == run.classify(texts)[0]
    # the same as the model's own softmax of one padded batch
    ids = [[BOS_ID, *run.source_tokenizer.encode(t), EOS_ID] for t in texts]
    batch = np.zeros((3, max(map(len, ids))), "int32")
    for i, row in enumerate(ids):
        batch[i, :len(row)] = row
    softmax = keras.ops.convert_to_numpy(run.model(batch, return_logits=False))
    # two float32 paths (classify batches by length: other shapes), then the softmax
    atol = tol.chain_atol(tol.model_roundings(run.model, target_len=batch.shape[1])
                          + batch.shape[1] + tol.SOFTMAX_EXTRA, 1.0, paths=2)
    for i, row in enumerate(probabilities):
        tol.assert_within([row[x] for x in run.labels], softmax[i], atol)
    assert main(["classify", str(run_dir), *texts]) == 0
    assert capsys.readouterr().out.split() == run.classify(texts)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("a good dog\n\nokay house\n"))
    assert main(["classify", str(run_dir), "--probabilities"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[1] == "" and len(lines[0].split("\t")) == 6
    with pytest.raises(TypeError, match="needs a transformer run"):
        run.translate("a good dog")


def test_embed_equals_the_pooled_hidden_states(classifier_run, tmp_path, monkeypatch, capsys):
    _, run_dir, _ = classifier_run
    run = load(run_dir)
    texts = ["a good dog", "the bad cat on a tree under the house"]
    ids = [[BOS_ID, *run.source_tokenizer.encode(t), EOS_ID] for t in texts]
    for i, row in enumerate(ids):
        hidden = keras.ops.convert_to_numpy(
            run.model.encode(np.array([row], "int32"))).astype("float64")[0]
        atol = embedding_atol(run.model, len(row), hidden)
        tol.assert_within(run.embed(texts[i]), hidden.mean(0), atol)
        tol.assert_within(run.embed(texts[i], pooling="cls"), hidden[0], atol)
    normalized = run.embed(texts, normalize=True)
    # float32 x / |x|: the sum of d_model squares, the sqrt and the division
    tol.assert_within(np.linalg.norm(normalized, axis=1), np.ones(2),
                      tol.gamma(run.model.d_model + 2 * tol.ELEMENTWISE_ULPS + 3))
    out = tmp_path / "vectors.npy"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("\n".join(texts) + "\n"))
    assert main(["embed", str(run_dir), "--out", str(out)]) == 0
    # exact: the same texts, batches and kernels, saved as float32
    np.testing.assert_array_equal(np.load(out), run.embed(texts))
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("\n".join(texts) + "\n"))
    assert main(["embed", str(run_dir)]) == 0
    printed = np.array([line.split() for line in capsys.readouterr().out.splitlines()], float)
    # not a rounding bound: printed with 6 significant digits (relative 5e-6)
    np.testing.assert_allclose(printed, run.embed(texts), rtol=5e-6, atol=0)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("a dog\n\n"))
    assert main(["embed", str(run_dir)]) == 2
    assert "stdin line 2 is empty" in capsys.readouterr().err


def test_resume_reads_the_labels_back(tmp_path):
    config = classifier_config(tmp_path, epochs=1, checkpoint_every=2)
    train(config, tmp_path / "run")
    config = config.replace(train={"epochs": 2})
    metrics = train(config, tmp_path / "run", resume=True)
    assert metrics["classes"] == 3
    assert load(tmp_path / "run").labels == ["mid", "neg", "pos"]


def test_bad_classifier_configs_are_clear_errors(tmp_path):
    config = classifier_config(tmp_path)
    one_label = tmp_path / "one.tsv"
    one_label.write_text("text\tlabel\na dog\tpos\nthe cat\tpos\n")
    bad = config.replace(data={"train_tsv": str(one_label), "val_tsv": None})
    with pytest.raises(ValueError, match="at least 2"):
        train(bad, tmp_path / "one")
    unseen = tmp_path / "unseen.tsv"
    unseen.write_text("label\ttext\nzzz\ta dog\n")
    bad = config.replace(data={"val_tsv": str(unseen)})
    with pytest.raises(ValueError, match=r"label\(s\) \['zzz'\]"):
        train(bad, tmp_path / "unseen")
    bad = config.replace(model={"num_classes": 5})
    with pytest.raises(ValueError, match="num_classes=5"):
        train(bad, tmp_path / "classes")
    with pytest.raises(ConfigError, match="bleu_every"):
        load_config(None, ["model.type=encoder", "train.bleu_every=1"])
    with pytest.raises(ConfigError, match="val_accuracy is an encoder"):
        load_config(None, ["train.early_stopping_metric=val_accuracy"])
    multi30k = config.replace(data={"dataset": "multi30k"})
    with pytest.raises(ValueError, match="encoder classifier reads"):
        train(multi30k, tmp_path / "m30k")


def test_early_stopping_on_validation_accuracy(tmp_path):
    config = classifier_config(tmp_path, epochs=6, patience=1,
                               early_stopping_metric="val_accuracy", learning_rate=1e-6)
    metrics = train(config, tmp_path / "run")
    assert metrics["stopped_by"] == "early_stopping"
    assert metrics["early_stopping_metric"] == "val_accuracy"


def test_fine_tune_from_a_pretrained_folder(tmp_path):
    """``model.pretrained``: the folder's architecture, weights and tokenizer (a tiny random
    BERT saved by transformers, with a WordPiece tokenizer), a new head for the data's
    classes; the run loads and classifies."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    import torch

    folder = tmp_path / "bert"
    words = sorted({w for words in CUES.values() for w in words} | set(FILLER))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    wordpiece = tokenizers.Tokenizer(tokenizers.models.WordPiece(
        {w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = tokenizers.processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=wordpiece, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(folder))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24)
    transformers.BertModel(config).eval().save_pretrained(str(folder))

    run_config = classifier_config(tmp_path, epochs=1, learning_rate=1e-12)
    run_config = run_config.replace(model={"pretrained": str(folder), "pooling": "cls"})
    metrics = train(run_config, tmp_path / "run")
    run = load(tmp_path / "run")
    assert metrics["classes"] == 3 and run.model.num_layers == 2 and run.model.d_model == 16
    assert run.model.max_length == 24  # the folder's, not the config's 48
    # the folder's tokenizer: [CLS] pieces [SEP] with its ids
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = [run.source_tokenizer.bos_id, *run.source_tokenizer.encode("a good dog"),
           run.source_tokenizer.eos_id]
    assert ids == hf_tokenizer("a good dog")["input_ids"]
    # a learning rate of 1e-12: the encoder is still the folder's (its hidden states); the
    # training moved its weights by about 1e-12 per step, far below two float32 forward passes
    start = Encoder.from_pretrained(folder)
    batch = np.array([ids], "int32")
    hidden = keras.ops.convert_to_numpy(start(batch))
    tol.assert_within(keras.ops.convert_to_numpy(run.model.encode(batch)), hidden,
                      embedding_atol(start, batch.shape[1], hidden))
    assert set(run.classify(["a good dog", "bad cat"])) <= {"mid", "neg", "pos"}

