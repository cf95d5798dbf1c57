"""Corpora: plain-text and TSV parallel files, Multi30k (local or downloaded), TED (TFDS).

Where data lives (:func:`resolve_data_dir`): an explicit ``data_dir`` argument, else the
``TRANSFORMERKIT_DATA`` environment variable, else ``~/.cache/transformerkit`` (or
``$XDG_CACHE_HOME/transformerkit``). Multi30k files are ``<data_dir>/multi30k/{split}.{lang}``;
missing ones are downloaded there (``download=True``) from the ``multi30k/dataset`` GitHub
repository at a pinned commit, gunzipped, checked against their sha256 and written atomically.

Empty pairs: :func:`read_parallel` drops pairs where either side is empty after stripping,
and reports how many with a ``logging`` WARNING on the ``transformerkit.data.corpora``
logger (the return value stays two aligned lists). :func:`read_tsv` reads through
:mod:`transformerkit.data.sources`, which counts and reports every kind of bad line.
"""

import gzip
import logging
import os
import pathlib
import urllib.error
import urllib.request

from transformerkit.data import sources
from transformerkit.extras import require
from transformerkit.files import atomic_path, file_sha256, xdg_cache_home

LANGS = ("en", "de", "fr", "cs")
MULTI30K_SPLITS = ("train", "val", "test2016")
MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_URL = ("https://raw.githubusercontent.com/multi30k/dataset/"
                f"{MULTI30K_COMMIT}/data/task1/raw/{{name}}.{{lang}}.gz")
_REMOTE_NAMES = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
# sha256 of the gunzipped files, as listed in shared/data/multi30k/README.md.
MULTI30K_SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "train.cs": "2be68b38c8d586ff4f54eb13cc6e1baaaa053695b3f070d3038303a47f2268da",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "val.cs": "d53827e469b0a1ca8d57e9e26b2b64c4bc4b33f5479c7b03ae87ae5c882c3e33",
    "test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test2016.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    "test2016.cs": "45adb85f688de8407fddcbe1b36dca15d12aab868149b337e2576f2d6d2ff8d8",
}
# Texts a config may name by their place in the data directory (``data.text``), fetched there
# when missing: tiny Shakespeare, char-rnn's file (nanoGPT's shakespeare recipes download the
# same path), at a pinned commit, as listed in shared/data/tinyshakespeare/README.md.
TINY_SHAKESPEARE = "tinyshakespeare/input.txt"
KNOWN_TEXTS = {  # path in the data directory -> (URL, sha256)
    TINY_SHAKESPEARE: ("https://raw.githubusercontent.com/karpathy/char-rnn/"
                       "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt",
                       "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
}
TED_SPLITS = ("train", "validation", "test")
DOWNLOAD_TIMEOUT_S = 60

logger = logging.getLogger(__name__)
_urlopen = urllib.request.urlopen  # module attribute so tests can serve local files


class ChecksumError(ValueError):
    """A downloaded file does not have the expected sha256."""


def resolve_data_dir(data_dir=None):
    """The data directory: ``data_dir``, else ``$TRANSFORMERKIT_DATA``, else the cache dir."""
    if data_dir is not None:
        return pathlib.Path(data_dir).expanduser()
    if os.environ.get("TRANSFORMERKIT_DATA"):
        return pathlib.Path(os.environ["TRANSFORMERKIT_DATA"]).expanduser()
    return pathlib.Path(xdg_cache_home()) / "transformerkit"


def _decode_utf8(data, path):
    """Bytes -> str; invalid UTF-8 raises ValueError naming the path, line and byte."""
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark is not text
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}: invalid UTF-8 on line {line} "
                         f"(byte {data[e.start:e.start + 1]!r} at offset {e.start})") from e


def _read_bytes(path):
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    return path.read_bytes()


def read_lines(path):
    """Lines of a UTF-8 text file, each stripped. Only ``\\n`` ends a line (so a stray
    U+2028 inside a sentence cannot shift a parallel corpus); a final newline adds no line."""
    text = _decode_utf8(_read_bytes(path), path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def load_text(path):
    """A whole UTF-8 text file as one string (for language-model corpora), unchanged."""
    return _decode_utf8(_read_bytes(path), path)


def _drop_empty_pairs(sources, targets, what):
    """Keep the pairs where both sides are non-empty; log how many were dropped."""
    kept = [(s, t) for s, t in zip(sources, targets, strict=True) if s and t]
    dropped = len(sources) - len(kept)
    if dropped:
        logger.warning("%s: dropped %d of %d pairs with an empty side", what, dropped,
                       len(sources))
    return [s for s, _ in kept], [t for _, t in kept]


def read_parallel(source_path, target_path):
    """Aligned lines of two files -> ``(sources, targets)``, both stripped.

    Raises ValueError naming both files when their line counts differ. Pairs with an empty
    side are dropped and counted in a logging WARNING.
    """
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(f"parallel files have different line counts: {source_path} has "
                         f"{len(sources)} lines, {target_path} has {len(targets)}")
    return _drop_empty_pairs(sources, targets, f"{source_path} / {target_path}")


def read_tsv(path, source_column=0, target_column=1, header=False):
    """Tab-separated pairs -> ``(sources, targets)`` lists; fields are stripped, no quoting.

    Columns are 0-based indices, or names from the first line with ``header=True``; swap
    them to reverse the direction. Blank lines are skipped; lines with too few columns,
    invalid UTF-8 or an empty side are skipped and counted in a logging WARNING on the
    ``transformerkit.data.sources`` logger; a file without any usable pair raises
    ValueError. (Large files: stream them with :func:`transformerkit.data.sources.iter_pairs`.)
    """
    spec = sources.CorpusSpec("tsv", (path,), source_column=source_column,
                              target_column=target_column, header=header)
    return sources.read_pairs([spec])


def check_languages(source_lang, target_lang, allowed):
    for lang in (source_lang, target_lang):
        if lang not in allowed:
            raise ValueError(f"unknown language {lang!r}; expected one of {allowed}")
    if source_lang == target_lang:
        raise ValueError(f"source and target language are both {source_lang!r}")


def load_multi30k(split, source_lang, target_lang, data_dir=None, download=True):
    """Multi30k task 1 (Flickr30k captions) -> ``(sources, targets)``.

    Args:
        split: "train" (29,000 pairs), "val" (1,014) or "test2016" (1,000).
        source_lang, target_lang: two different languages of ``LANGS``.
        data_dir: folder holding ``multi30k/``; see :func:`resolve_data_dir`.
        download: fetch missing files into ``<data_dir>/multi30k/`` (needs internet).
    """
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"unknown Multi30k split {split!r}; expected one of {MULTI30K_SPLITS}")
    check_languages(source_lang, target_lang, LANGS)
    folder = resolve_data_dir(data_dir) / "multi30k"
    paths = [multi30k_file(split, lang, folder, download) for lang in (source_lang, target_lang)]
    return read_parallel(*paths)


def multi30k_file(split, lang, folder, download=True):
    """Path of ``folder/{split}.{lang}``, downloading it first when missing and allowed."""
    path = pathlib.Path(folder) / f"{split}.{lang}"
    if path.is_file():
        return path
    if not download:
        raise FileNotFoundError(f"Multi30k file not found: {path} (set TRANSFORMERKIT_DATA or "
                                "data_dir to a folder holding multi30k/, or pass download=True)")
    url = MULTI30K_URL.format(name=_REMOTE_NAMES[split], lang=lang)
    download_verified(url, path, MULTI30K_SHA256[path.name], gunzip=True)
    return path


def known_text(name, data_dir=None, download=True):
    """The path of a :data:`KNOWN_TEXTS` file (``"tinyshakespeare/input.txt"``) in the data
    directory, downloaded there first (checked against its sha256) when missing and
    allowed."""
    path = resolve_data_dir(data_dir) / name
    if path.is_file():
        return path
    if not download:
        raise FileNotFoundError(f"{name} not found in the data directory: {path}")
    url, sha256 = KNOWN_TEXTS[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    return download_verified(url, path, sha256)


def download_verified(url, path, sha256, gunzip=False):
    """Download ``url`` (optionally gunzip it), check its sha256, write ``path`` atomically.

    Raises ChecksumError (a ValueError) naming the URL and both digests on a mismatch, and
    OSError with the URL when the download itself fails. Nothing is written on failure.
    """
    logger.info("downloading %s -> %s", url, path)
    try:
        with _urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise OSError(f"could not download {url}: {e}; without internet, put the file at "
                      f"{path} or point TRANSFORMERKIT_DATA at a folder that has it") from e
    if gunzip:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ChecksumError(f"{url} is not a valid gzip file: {e}") from e
    path = pathlib.Path(path)
    with atomic_path(path) as tmp:  # checked before the rename: a mismatch leaves nothing
        pathlib.Path(tmp).write_bytes(data)
        digest = file_sha256(tmp)
        if digest != sha256:
            raise ChecksumError(f"checksum mismatch for {url}: expected sha256 {sha256}, "
                                f"got {digest}; the file was not saved")
    return path


def load_ted_hrlr(split, pair="pt_to_en", data_dir=None):
    """TED talks ``ted_hrlr_translate/{pair}`` from TensorFlow Datasets -> (sources, targets).

    Needs the optional extra: ``pip install 'keras-transformerkit[tfds]'``. ``split`` is "train",
    "validation" or "test"; ``pair`` e.g. "pt_to_en", "ru_to_en". ``data_dir`` is passed
    to ``tfds.load`` (its own download/cache folder).
    """
    if split not in TED_SPLITS:
        raise ValueError(f"unknown TED split {split!r}; expected one of {TED_SPLITS}")
    if "_to_" not in pair:
        raise ValueError(f"pair must look like 'pt_to_en', got {pair!r}")
    tfds = require("tensorflow_datasets", "load_ted_hrlr (TED talks from TensorFlow Datasets)")
    dataset = tfds.load(f"ted_hrlr_translate/{pair}", split=split, data_dir=data_dir,
                        as_supervised=True)  # (source, target) byte strings
    sources, targets = [], []
    for source, target in tfds.as_numpy(dataset):
        sources.append(source.decode("utf-8").strip())
        targets.append(target.decode("utf-8").strip())
    return _drop_empty_pairs(sources, targets, f"ted_hrlr_translate/{pair} {split}")
