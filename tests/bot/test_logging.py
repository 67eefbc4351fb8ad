"""Logging: JSON lines off a terminal, bound turn context, secrets redacted wherever they appear."""

from __future__ import annotations

import base64
import io
import json
import logging
from pathlib import Path

import httpx
import structlog

from bot.logging import SecretRedactor, configure_logging

TELEGRAM_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1"


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_json_lines_with_context_and_redaction() -> None:
    buf = io.StringIO()
    configure_logging(fmt="auto", secrets=["configured-secret-value"], stream=buf)
    log = structlog.get_logger("test")
    structlog.contextvars.bind_contextvars(session_id="telegram:1", channel="telegram", turn_id="t1")
    try:
        log.info(
            "calling",
            url=f"https://api.telegram.org/bot{TELEGRAM_TOKEN}/getMe",
            key="configured-secret-value",
        )
        try:
            raise RuntimeError("auth failed for sk-ant-api03-abcdefghijklmnopqrstuvwxyz")
        except RuntimeError:
            log.exception("failed")
        logging.getLogger("somelib").warning("Bearer abcdefghijklmnopqrstuv rejected")
    finally:
        structlog.contextvars.clear_contextvars()
        configure_logging(level="DEBUG", fmt="json")
    out = buf.getvalue()
    assert TELEGRAM_TOKEN not in out and "configured-secret-value" not in out
    assert "abcdefghijklmnopqrstuvwxyz" not in out and "abcdefghijklmnopqrstuv" not in out
    records = lines(buf)
    assert records[0]["session_id"] == "telegram:1" and records[0]["turn_id"] == "t1"
    assert "exception" in records[1]


def test_redactor_handles_nested_values() -> None:
    r = SecretRedactor(["hunter2-long"])
    event = r(
        None, "info", {"event": "x", "data": {"list": ["hunter2-long", 3]}, "err": ValueError("hunter2-long")}
    )
    assert event["data"] == {"list": ["***", 3]}
    assert event["err"] == "ValueError: ***"


def test_values_of_any_type_and_dict_keys_are_masked() -> None:
    """An httpx.URL, a Path or bytes in a log line is printed by the renderer as it is: masked too."""
    r = SecretRedactor(["hunter2-long"])
    url = httpx.URL(f"https://api.telegram.org/bot{TELEGRAM_TOKEN}/getUpdates")
    event = r(
        None,
        "info",
        {
            "event": "x",
            "url": url,
            "path": Path("/ws/hunter2-long"),
            "raw": b"key hunter2-long",
            "data": {"hunter2-long": 1},
            "when": Path("/ws/fine"),
            "n": 3,
        },
    )
    assert event["url"] == "https://api.telegram.org/bot***/getUpdates"
    assert event["path"] == "/ws/***" and event["raw"] == "b'key ***'" and event["data"] == {"***": 1}
    assert event["when"] == Path("/ws/fine") and event["n"] == 3  # nothing to mask: kept as it is


def test_echoed_keys_and_url_credentials_are_masked_but_setting_names_stay() -> None:
    r = SecretRedactor()
    assert r.redact("Incorrect API key provided: zz-9f8e7d6c5b4a.") == "Incorrect API key provided: ***"
    assert r.redact("Received API Key = abcd1234efgh, hash x") == "Received API Key = ***, hash x"
    assert r.redact("GET /v1/models?key=AIzaSyA-1234567890abcdefghijklmnopq&alt=json") == (
        "GET /v1/models?key=***&alt=json"
    )
    assert (
        r.redact("cannot reach http://bob:hunter2@10.0.0.1/v1 now")
        == "cannot reach http://***@10.0.0.1/v1 now"
    )
    assert r.redact("MEMBOT_LLM__OPENAI__API_KEY=local-key-1234") == "MEMBOT_LLM__OPENAI__API_KEY=***"
    # Discord tokens start with the bot's id in base64: "M" for ids starting 1-3, "N" for 4-7, "O" for 8-9.
    for user_id in ("123456789012345678", "456789012345678901", "876543210987654321"):
        token = f"{base64.b64encode(user_id.encode()).decode().rstrip('=')}.GhIjKl.{'x1Y2z3' * 6}"
        assert r.redact(f"login failed with {token} today") == "login failed with *** today", token
    for plain in (
        "the API key was rejected: check MEMBOT_LLM__OPENAI__API_KEY",
        "write to bob@example.com or see http://example.com/a@b",
    ):
        assert r.redact(plain) == plain


def test_a_log_file_is_private_and_gets_the_tracebacks(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "chat.log"
    configure_logging(level="INFO", secrets=["s3cret-value"], file=path)
    try:
        try:
            raise ValueError("bad s3cret-value")
        except ValueError:
            structlog.get_logger("t").exception("boom")
    finally:
        configure_logging(level="DEBUG", fmt="json")
    [record] = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["event"] == "boom" and "Traceback" in record["exception"]
    assert "s3cret-value" not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
