"""OpenAI chat-completions wire format (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp, LM Studio).

Pure translation, no I/O, in the spirit of httpx's ``Auth.auth_flow``: ``build_request`` turns a
ChatRequest into an ``httpx.Request``, ``parse_response`` turns a decoded JSON body into a ChatResponse,
and ``StreamDecoder`` folds SSE chunks into stream events. The client (client.py) does the sending.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from bot.domain import Message, Role, ToolCall, Usage
from bot.errors import LLMBadResponse, LLMError, LLMUnavailable
from bot.llm.counts import token_count, usage_object
from bot.llm.failures import stream_error
from bot.llm.sse import SSEvent, StreamFold
from bot.llm.turns import normalized
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent, Wire
from bot.llm.wire_ids import OPENAI_IDS

DEFAULT_BASE_URL = "https://api.openai.com/v1"


def is_official(base_url: str | None) -> bool:
    return base_url is None or "api.openai.com" in base_url


def build_request(request: ChatRequest, wire: Wire) -> httpx.Request:
    """The POST to ``<base_url>/chat/completions``; no ``Authorization`` without a key (Ollama)."""
    body: dict[str, Any] = {"model": wire.model.id, "messages": messages(request)}
    # OpenAI's reasoning models (no temperature in the catalog) reject max_tokens wherever they are
    # served, and OpenAI itself deprecated it; compatible servers (Ollama, vLLM, llama.cpp, LM Studio)
    # know only max_tokens.
    wants_new_name = is_official(wire.base_url) or not wire.model.supports_temperature
    body["max_completion_tokens" if wants_new_name else "max_tokens"] = wire.max_tokens
    if wire.temperature is not None and wire.model.supports_temperature:
        body["temperature"] = wire.temperature
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in request.tools
        ]
    if wire.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    headers = {"content-type": "application/json", "accept": "application/json"}
    if wire.api_key:
        headers["authorization"] = f"Bearer {wire.api_key}"
    url = (wire.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
    timeout = {"timeout": wire.timeout.as_dict()}
    return httpx.Request("POST", url, json=body, headers=headers, extensions=timeout)


def messages(request: ChatRequest) -> list[dict[str, Any]]:
    """The ``messages`` array: one system message, then alternating turns (bot/llm/turns.py)."""
    system, history = normalized(request, OPENAI_IDS)
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in history:
        item = _message(message)
        if item is not None:
            out.append(item)
    return out


def _message(message: Message) -> dict[str, Any] | None:
    if message.role is Role.TOOL:
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role is Role.ASSISTANT:
        if not message.tool_calls:
            # An empty assistant turn says nothing; the API rejects null content without tool calls.
            return {"role": "assistant", "content": message.content} if message.content else None
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                }
                for c in message.tool_calls
            ],
        }
    if message.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
        parts += [
            {"type": "image_url", "image_url": {"url": f"data:{image.media_type};base64,{image.data_b64}"}}
            for image in message.images
        ]
        return {"role": message.role.value, "content": parts}
    return {"role": message.role.value, "content": message.content}


def _arguments(text: str) -> str:
    """A call's arguments as sent back in the history: as the model wrote them when they are a JSON
    object, else ``{}``. Local servers (vLLM, llama.cpp, SGLang, Ollama) parse them for the chat template
    and refuse the whole request otherwise, so one broken call made every later request of the chat
    fail; the call's result already tells the model what was wrong with them. Nested too deeply to
    decode (``RecursionError``), they would fail every later request here too."""
    try:
        value = json.loads(text or "{}")
    except (json.JSONDecodeError, RecursionError):
        return "{}"
    return text if isinstance(value, dict) else "{}"


def parse_usage(data: Any, model: str, where: str) -> Usage:
    """The call's usage; a count that is no count is 0 and logged, never a failed answer (counts.py)."""
    usage = usage_object(data, "usage", model=model, where=where)
    details = usage_object(
        usage.get("prompt_tokens_details"), "prompt_tokens_details", model=model, where=where
    )
    return Usage(
        input_tokens=token_count(usage, "prompt_tokens", model=model, where=where),
        output_tokens=token_count(usage, "completion_tokens", model=model, where=where),
        cached_tokens=token_count(details, "cached_tokens", model=model, where=where),
        calls=1,
    )


def text_of(content: Any) -> str:
    """The answer's text. Some servers send a list of parts (Mistral's Magistral: thinking, then
    text): only the text parts are the answer, the reasoning is not for the user."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "") if isinstance(part, dict) else str(part)
            for part in content
            if not isinstance(part, dict) or part.get("type") in (None, "text")
        )
    return "" if content is None else str(content)


def parse_response(body: Any, model: str, where: str = "OpenAI") -> ChatResponse:
    """A ChatResponse from a decoded ``chat.completion`` body; anything else is LLMBadResponse, but for
    an answer with no choice at all (:func:`no_choice`)."""
    try:
        if body["choices"] == []:
            raise no_choice(body.get("error"), model, where)
        choice = body["choices"][0]
        message = choice["message"]
        calls = tuple(
            ToolCall(
                id=str(c.get("id") or ""),  # some local servers send none: the client names it
                name=str(c["function"]["name"]),
                arguments=_as_text(c["function"].get("arguments")),
            )
            for c in message.get("tool_calls") or ()
        )
        if choice.get("finish_reason") == "error":  # the model failed in the middle of it
            raise failed_answer(choice.get("error") or body.get("error"), model, where)
        # A refusal arrives instead of content; showing it beats an empty reply.
        refusal = text_of(message.get("refusal"))
        return ChatResponse(
            content=text_of(message.get("content")) or refusal,
            tool_calls=calls,
            usage=parse_usage(body.get("usage"), model, where),
            model=str(body.get("model") or model),
            stop_reason=str(choice.get("finish_reason") or ""),
            refusal=bool(refusal.strip()),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise LLMBadResponse(
            f"{where} sent an answer without the expected fields ({exc!r})", model=model
        ) from None


def no_choice(error: Any, model: str, where: str) -> LLMError:
    """The error of an HTTP 200 answer whose ``choices`` is empty: OpenRouter sends one now and then
    when the provider it routed to produced nothing, and the same request sent again is usually
    answered (routed elsewhere). So it is LLMUnavailable, retried, never an answer "that could not be
    used" that the chat was told of at once; an ``error`` sent with it is classified as such."""
    if error:
        return failed_answer(error, model, where)
    return LLMUnavailable(
        f"{where} answered the request for {model} with no choice (an empty 'choices'): the provider "
        "behind it produced nothing",
        model=model,
    )


def failed_answer(error: Any, model: str, where: str) -> LLMError:
    """The error of an answer that failed after HTTP 200 (OpenRouter, LiteLLM: an ``error`` object, in
    a chunk or a choice, with ``finish_reason: "error"``): classified by its ``code`` like the same
    error sent as a response (failures.py). With no error object it says only that the answer did not
    come whole, which another try may cure: LLMUnavailable, never an answer taken for all of itself."""
    if not error:
        return LLMUnavailable(
            f"{where} ended the answer of {model} with finish_reason 'error' and no error: the answer "
            "did not come whole",
            model=model,
        )
    error = error if isinstance(error, dict) else {"message": str(error)}
    return stream_error(
        str(error.get("type") or ""),
        str(error.get("message") or error),
        code=str(error.get("code") or ""),
        model=model,
        provider="openai",
        where=where,
    )


class StreamDecoder(StreamFold):
    """Folds ``chat.completion.chunk`` SSE events into text deltas and, at the end, one ChatResponse.

    Tool calls arrive in fragments keyed by ``index``: the first carries id and name, later ones
    append to the arguments. ``done`` turns true at ``data: [DONE]``; a stream that ends without it
    still counts as ``complete`` once a ``finish_reason`` arrived (some local servers omit [DONE]).
    """

    def __init__(self, model: str, where: str = "OpenAI") -> None:
        super().__init__(model, where)
        self._last = 0  # the slot of the tool call fragments without an index belong to
        self._refusal = False  # a refusal was streamed (delta.refusal)

    @property
    def complete(self) -> bool:
        return self.done or bool(self._stop)

    def feed(self, event: SSEvent) -> list[StreamEvent]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = self._object(event.data, "chunk")
        if chunk.get("error"):
            raise failed_answer(chunk["error"], self._model, self._where)
        if chunk.get("usage"):
            self._usage = parse_usage(chunk["usage"], self._model, self._where)
        self._served_by = str(chunk.get("model") or self._served_by)
        out: list[StreamEvent] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.extend(self._said(text_of(delta["content"])))
            if delta.get("refusal"):  # in place of content, as in a whole answer (parse_response)
                refusal = text_of(delta["refusal"])
                self._refusal = self._refusal or bool(refusal.strip())
                out.extend(self._said(refusal))
            for fragment in delta.get("tool_calls") or ():
                out.extend(self._fragment(fragment))
            if choice.get("finish_reason") == "error":
                raise failed_answer(choice.get("error"), self._model, self._where)
            if choice.get("finish_reason"):
                self._stop = str(choice["finish_reason"])
        return out

    def finish(self) -> ChatResponse:
        response = super().finish()
        response.refusal = self._refusal
        return response

    def _fragment(self, fragment: dict[str, Any]) -> list[StreamEvent]:
        raw = fragment.get("index")
        index = raw if isinstance(raw, int) else self._last
        slot = self._call(index)
        if fragment.get("id"):
            if slot.id and slot.id != str(fragment["id"]):
                # A new call in a slot already taken: servers that send parallel calls all at index 0
                # (or none) mean a new call by a new id; merged, all but one were lost.
                index = max(self._calls) + 1
                slot = self._call(index)
            slot.id = str(fragment["id"])
        self._last = index
        function = fragment.get("function") or {}
        if function.get("arguments"):
            self._argued(slot, _as_text(function["arguments"]))
        if function.get("name") and not slot.name:
            slot.name = str(function["name"])
            return [StreamEvent("tool_call", text=slot.name)]
        return []


def _as_text(arguments: Any) -> str:
    """A call's arguments as JSON text: the API sends a string; some compatible servers send the object
    itself, whose Python text (``{'a': 1}``) would not parse."""
    if isinstance(arguments, dict | list):
        return json.dumps(arguments, ensure_ascii=False)
    return str(arguments or "")
