"""Logging: JSON lines off a terminal, bound turn context, secrets redacted wherever they appear."""

from __future__ import annotations

import io
import json
import logging

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
