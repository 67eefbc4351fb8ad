"""An instant OpenAI- and Anthropic-compatible model server for the benchmarks, run in its own process.

The benches time membot the way users feel it: through the real LLM client, request building, JSON
and HTTP. The model itself must cost nothing, so this server reads the whole request body and answers
at once with a short fixed reply (non-streaming), and it runs in a separate process so it shares
neither the bot's event loop nor its CPU accounting. It keeps nothing per request (unlike the test
fake in tests/fakes/, which records and validates every request), so a 2 MB request costs only its
transfer. Reported input tokens are about a quarter of the body's bytes, like the providers' rule of
thumb, so usage accounting and token calibration do their normal work.

    with InstantLLM() as llm:                # starts ``python bench/instant_llm.py`` on a free port
        base = llm.openai_base_url           # http://127.0.0.1:<port>/v1
        anthropic_base = llm.anthropic_base_url
        answered, last_bytes = llm.stats()   # requests answered so far, size of the last one

Run alone (``python bench/instant_llm.py``) it prints its port and serves until stopped.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import TracebackType

REPLY = "ok, noted."
MODELS = ("gpt-4.1-mini", "claude-haiku-4-5")  # membot's default model and bench/harness.py's Anthropic one


class InstantLLM:
    """The server in a child process; a context manager that starts it and stops it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> InstantLLM:
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line.strip().isdigit():
            self._process.kill()
            raise RuntimeError(f"the instant model server did not start (said {line!r})")
        self.port = int(line)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> tuple[int, int]:
        """(chat requests answered so far, bytes of the last request body): a plain GET."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=10) as answer:
            answered, last_bytes = answer.read().split()
            return int(answered), int(last_bytes)


# ---- the server (child process) ---------------------------------------------------------------------


async def _serve() -> None:
    from aiohttp import web

    answered = 0
    last_bytes = 0

    def usage(body: bytes) -> tuple[int, int]:
        nonlocal answered, last_bytes
        answered += 1
        last_bytes = len(body)
        return max(1, len(body) // 4), 3

    async def openai(request: web.Request) -> web.Response:
        body = await request.read()
        prompt, completion = usage(body)
        payload = {
            "id": f"chatcmpl-{answered}",
            "object": "chat.completion",
            "created": 0,
            "model": "bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
        return web.Response(body=json.dumps(payload).encode(), content_type="application/json")

    async def anthropic(request: web.Request) -> web.Response:
        body = await request.read()
        prompt, completion = usage(body)
        payload = {
            "id": f"msg_{answered}",
            "type": "message",
            "role": "assistant",
            "model": "bench",
            "content": [{"type": "text", "text": REPLY}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }
        return web.Response(body=json.dumps(payload).encode(), content_type="application/json")

    async def stats(request: web.Request) -> web.Response:
        return web.Response(text=f"{answered} {last_bytes}")

    async def models(request: web.Request) -> web.Response:
        """The model list ``membot run`` asks for once it is ready (bot/serve.py): every model the benches
        configure, in both providers' shape, so the check passes instead of logging a 404."""
        listed = [{"id": name, "object": "model", "type": "model"} for name in MODELS]
        return web.Response(
            body=json.dumps({"object": "list", "data": listed}).encode(), content_type="application/json"
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", openai)
    app.router.add_post("/v1/messages", anthropic)
    app.router.add_get("/stats", stats)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    print(runner.addresses[0][1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(_serve())
