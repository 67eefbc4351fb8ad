"""The load, overhead and start-up benches still run end to end (tiny sizes; no figure is judged).

Each runs as operators run it, a subprocess from the checkout, against its real parts: the dispatcher,
the real LLM client and the instant model server in its own process, and for start-up a real
``membot run`` against the Telegram fake.
"""

from __future__ import annotations

import re

from tests.bench.runner import run_bench


def test_concurrency_answers_every_message_in_both_modes() -> None:
    result = run_bench("concurrency.py", "--chats", "3", "--messages", "2")
    assert result.returncode == 0, result.stderr
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(
            r"^(\w+, memory \w+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)", result.stdout, re.M
        )
    }
    # Closed loop: one turn per message. Burst: at least one turn per chat, at most one per message.
    assert rows["closed, memory on"] == rows["closed, memory off"] == "6"
    assert 3 <= int(rows["burst, memory on"]) <= 6 and 3 <= int(rows["burst, memory off"]) <= 6


def test_overhead_measures_every_client_column() -> None:
    result = run_bench("overhead.py", "--turns", "2", "--sizes", "10,20", "--memory", "off")
    assert result.returncode == 0, result.stderr
    for column in ("in-process", "openai", "anthropic"):
        assert re.search(rf"^\s+20  {column}\s+[\d.]+", result.stdout, re.M), result.stdout
    assert "ratio 20/10 (median): in-process" in result.stdout


def test_startup_measures_help_ready_and_memory() -> None:
    result = run_bench("startup.py", "--runs", "1")
    assert result.returncode == 0, result.stderr
    for label in ("membot --help", "ready", "1st reply", "idle RSS"):
        assert label in result.stdout, result.stdout
