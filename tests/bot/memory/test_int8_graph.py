"""The bundled model keeps its int8 weights at run time, and means what it meant with them widened."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from bot.memory.embeddings import OnnxEmbedder
from bot.memory.int8_graph import int8_weights
from bot.memory.minilm import int8_file

SENTENCES = [
    "my automobile needs new tires",
    "we adopted a puppy named Biscuit last spring",
    "What is my job?",
    "I work as a nurse at the children's hospital, mostly night shifts",
]


def _session(model: bytes) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def test_every_weight_matmul_is_rewritten_and_the_vectors_keep_their_meaning() -> None:
    original = int8_file(None)[0]
    rewritten, count = int8_weights(original)
    assert count == 38  # 6 layers x (query, key, value, output, two feed-forward), 2 embedding tables
    assert len(rewritten) < len(original)  # the Cast and Mul nodes are gone, the int8 weights stay

    quantized = OnnxEmbedder()
    quantized.load()
    widened = OnnxEmbedder()
    widened.load()
    widened._session = _session(original)  # the model as onnxruntime runs it without the rewrite
    ours, theirs = quantized.encode(SENTENCES), widened.encode(SENTENCES)
    agreement = (ours * theirs).sum(axis=1)
    assert agreement.min() > 0.97, agreement
    # Nearest neighbours are the same in both spaces.
    assert (np.argsort(-(ours @ ours.T), axis=1) == np.argsort(-(theirs @ theirs.T), axis=1))[:, :2].all()


def test_what_the_rewrite_does_not_know_passes_through() -> None:
    original = int8_file(None)[0]
    rewritten, _ = int8_weights(original)
    again, count = int8_weights(rewritten)  # nothing left to rewrite: the same bytes come back
    assert count == 0 and again == rewritten
    # Attributes, shapes and names the partial schema does not declare survive: the model still runs.
    session = _session(rewritten)
    ids = np.array([[101, 3160, 1019, 102]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    (hidden,) = session.run(["last_hidden_state"], feeds)
    assert hidden.shape == (1, 4, 384)


def test_a_file_that_is_no_model_is_refused_by_the_parser() -> None:
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):
        int8_weights(b"\xff\xff\xff not a protobuf")
