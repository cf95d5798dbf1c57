"""Bad input fuzzing (hypothesis): the tokenizers, the config loader and the text inputs of
translate and generate either work or raise one clear error, for random unicode, control
characters, lone surrogates, very long lines, empty input and invalid UTF-8 bytes.

Each property test records how many cases it ran; the terminal summary prints the total
("fuzz: N cases in M property tests", see ``conftest.pytest_terminal_summary``).

Decisions: invalid UTF-8 on the CLI (stdin lines, TEXT arguments, ``--prompt``) is decoded
with U+FFFD and a warning naming the line or argument; in the Python API a ``str`` with
lone surrogates is a ``ValueError`` (it is not Unicode text); an empty or whitespace-only
text is a ``ValueError`` (the CLI passes empty stdin lines through as empty lines).
"""

import os
import random
import re
import subprocess
import sys
import warnings

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_run import tiny_config

from transformerkit.config import ConfigError, load_config, resolve
from transformerkit.data.tokenizers import CharTokenizer, SubwordTokenizer

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Any code point: controls (Cc), format (Cf), unassigned, private use, lone surrogates (Cs).
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF)
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=80),
    st.text(st.characters(codec="utf-8", categories=("Cc", "Cf", "Zs", "Zl", "Zp")),
            max_size=20),
    st.text(ANY_CHAR, min_size=1, max_size=8).map(lambda s: s * 800),  # very long lines
)
VALID_TEXT = TEXT.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))


def run_cases(record_property, test, strategy):
    """Run ``test`` on the values of ``strategy`` (hypothesis); record the number of cases."""
    count = 0

    @FUZZ
    @given(strategy)
    def counted(value):
        nonlocal count
        count += 1
        test(value)

    counted()
    record_property("fuzz_cases", count)


def has_surrogate(text):
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


# -- tokenizers -------------------------------------------------------------------------------

CORPUS = ["Ein Hund läuft durch den Schnee.", "Zwei Männer spielen Fußball.",
          "A dog runs through the snow.", "Two men play football.", "日本語のテキスト 123"] * 4


@pytest.fixture(scope="module")
def tokenizers():
    subword = {kind: SubwordTokenizer.train(CORPUS, kind=kind, vocab_size=120, min_frequency=1)
               for kind in ("bpe", "wordpiece", "unigram")}
    return {**subword, "char": CharTokenizer.train(CORPUS)}


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram", "char"])
def test_tokenizers_encode_and_decode_any_text(tokenizers, kind, record_property):
    tok = tokenizers[kind]

    def check(text):
        try:
            ids = tok.encode(text, add_bos=True, add_eos=True)
        except (ValueError, TypeError) as err:  # only lone surrogates may be refused
            assert has_surrogate(text) and str(err), (text, err)
            return
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        assert isinstance(tok.decode(ids), str)
        if kind == "char" and not has_surrogate(text):  # unknown chars show as <unk>
            assert len(tok.encode(text)) == len(text)

    run_cases(record_property, check, TEXT)


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_tokenizers_decode_any_id_list(tokenizers, kind, record_property):
    tok = tokenizers[kind]

    def check(ids):
        assert isinstance(tok.decode(ids), str)

    run_cases(record_property, check, st.lists(st.integers(0, tok.vocab_size - 1), max_size=60))


# -- the config loader ------------------------------------------------------------------------

YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True)
    | st.text(ANY_CHAR.filter(lambda c: not 0xD800 <= ord(c) <= 0xDFFF), max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)
SECTIONS = st.sampled_from(["model", "data", "train", "modle", ""])
KEYS = st.sampled_from(["num_layers", "d_model", "epochs", "time_budget", "tokenizer",
                        "precision", "distribution", "devices", "label_smoothing", "typo"])


def test_config_resolve_any_mapping(record_property):
    def check(raw):
        try:
            config = resolve(raw)
        except ConfigError as err:
            assert str(err)
            return
        assert set(config.to_dict()) == {"model", "data", "train"}

    raw = st.dictionaries(SECTIONS | st.integers(), st.dictionaries(KEYS | st.integers(),
                                                                   YAML_VALUES, max_size=4)
                          | YAML_VALUES, max_size=3)
    run_cases(record_property, check, raw)


def test_config_files_of_any_bytes_or_text(tmp_path_factory, record_property):
    folder = tmp_path_factory.mktemp("configs")

    def check(content):
        path = folder / "config.yaml"
        path.write_bytes(content if isinstance(content, bytes)
                         else content.encode("utf-8", "surrogatepass"))
        try:
            load_config(str(path))
        except ConfigError as err:
            assert str(path) in str(err) or re.search(r"\b(model|data|train)\.\w", str(err)), err

    documents = st.one_of(
        st.binary(max_size=200),  # mostly invalid UTF-8
        st.text(ANY_CHAR, max_size=200),
        YAML_VALUES.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),
        st.builds(lambda s, k, v: yaml.safe_dump({s: {k: v}}, allow_unicode=True),
                  SECTIONS, KEYS, YAML_VALUES),
        st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),  # deep nesting
    )
    run_cases(record_property, check, documents)


def test_config_overrides_of_any_text(record_property):
    def check(item):
        try:
            load_config(None, [item])
        except ConfigError as err:
            assert str(err)

    prefixed = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(
        ["train.epochs", "model.d_model", "train.precision", "data.vocab_size", "x.y", "train"]),
        st.text(ANY_CHAR.filter(lambda c: not 0xD800 <= ord(c) <= 0xDFFF), max_size=20))
    run_cases(record_property, check, prefixed | st.text(max_size=30))


# -- translate and generate -------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny translation run and a tiny character GPT run (trained in this process)."""
    import transformerkit
    from transformerkit.training.trainer import train

    folder = tmp_path_factory.mktemp("fuzz_runs")
    train(tiny_config(folder, epochs=1), folder / "translation")
    text = folder / "text.txt"
    text.write_text("one two three four five six seven eight nine ten\n" * 40)
    gpt = resolve({
        "model": {"type": "gpt", "num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32,
                  "max_length": 24, "dropout": 0.0},
        "data": {"dataset": "text", "text": str(text), "tokenizer": "char", "block_size": 16,
                 "batch_size": 4, "steps_per_epoch": 3},
        "train": {"epochs": 1, "learning_rate": 0.003, "verbose": 0, "samples": 0}})
    train(gpt, folder / "gpt")
    return {"dirs": {"translation": folder / "translation", "gpt": folder / "gpt"},
            "translation": transformerkit.load(folder / "translation"),
            "gpt": transformerkit.load(folder / "gpt")}


def test_translate_any_text(runs, record_property):
    run = runs["translation"]

    def check(text):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # over-long texts are cut with a warning
            try:
                out = run.translate(text, beam_size=1, max_new_tokens=3)
            except ValueError as err:
                assert ("empty" in str(err) and not text.strip()) or \
                    ("surrogate" in str(err) and has_surrogate(text)), err
                return
        assert isinstance(out, str)

    run_cases(record_property, check, TEXT)


def test_generate_any_prompt(runs, record_property):
    run = runs["gpt"]

    def check(prompt):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # over-long prompts keep their end, with a warning
            try:
                out = run.generate(prompt, max_new_tokens=2, seed=0)
            except ValueError as err:
                assert ("empty" in str(err) and not prompt) or \
                    ("surrogate" in str(err) and has_surrogate(prompt)), err
                return
        assert out.startswith(prompt)

    run_cases(record_property, check, TEXT)


def _random_stdin(count, seed=0):
    """``count`` byte lines: invalid UTF-8, controls, NUL, BOM, encoded surrogates, empty,
    whitespace, very long lines and ordinary text."""
    rng = random.Random(seed)
    pieces = [b"\xff", b"\xfe\xfe", b"\xc3", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\x00", b"\x1b[31m",
              b"\t", b"\r", b"\x0b\x0c", "\u2028".encode(), "ä".encode(), "日本".encode(),
              b"eins zwei", b" ", "\U0001F600".encode()]
    lines = []
    for i in range(count):
        if i % 10 == 0:
            lines.append(b"")
        elif i % 10 == 1:
            lines.append(b"zwei drei " * 500)
        else:
            lines.append(b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))))
    return lines


def test_cli_translate_stdin_of_random_bytes(runs, record_property):
    lines = _random_stdin(40)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [sys.executable, "-m", "transformerkit.cli", "translate", str(runs["dirs"]["translation"]),
         "--beam", "1", "--max-new-tokens", "3", "--batch-size", "8"],
        input=b"\n".join(lines) + b"\n", capture_output=True, timeout=600, env=env)
    stderr = result.stderr.decode("utf-8", "replace")
    record_property("fuzz_cases", len(lines))
    assert result.returncode in (0, 2), stderr[-3000:]
    assert "Traceback" not in stderr
    if result.returncode == 2:  # a clear one-line error (only a line of whitespace may cause it)
        assert "error: text" in stderr and "empty" in stderr, stderr[-2000:]
        return
    assert len(result.stdout.decode("utf-8").split("\n")) - 1 == len(lines)
    invalid = [i + 1 for i, line in enumerate(lines) if _invalid_utf8(line)]
    for number in invalid:
        assert f"stdin line {number} is not valid UTF-8" in stderr


def _invalid_utf8(raw):
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_cli_arguments_with_invalid_utf8(runs, record_property):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    translate = subprocess.run(
        [sys.executable, "-m", "transformerkit.cli", "translate",
         str(runs["dirs"]["translation"]), b"ein \xff zwei", "drei", "--beam", "1",
         "--max-new-tokens", "3"], capture_output=True, timeout=600, env=env)
    assert translate.returncode == 0, translate.stderr[-2000:]
    assert b"argument 1 is not valid UTF-8" in translate.stderr
    assert len(translate.stdout.decode("utf-8").splitlines()) == 2
    generate = subprocess.run(
        [sys.executable, "-m", "transformerkit.cli", "generate", str(runs["dirs"]["gpt"]),
         "--prompt", b"one \xfe\xff two", "--max-new-tokens", "3", "--seed", "0"],
        capture_output=True, timeout=600, env=env)
    assert generate.returncode == 0, generate.stderr[-2000:]
    assert b"--prompt is not valid UTF-8" in generate.stderr
    assert generate.stdout.decode("utf-8").startswith("one \ufffd\ufffd two")
    record_property("fuzz_cases", 3)
