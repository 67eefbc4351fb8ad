"""``membot memory`` as an operator uses it: import, search, stats, show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def membot(*args: str, workspace: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    env.update({"MEMBOT_WORKSPACE": str(workspace), "HOME": str(workspace.parent), "COLUMNS": "100"})
    return subprocess.run(
        [sys.executable, "-m", "bot", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_import_then_search_stats_and_show(tmp_path: Path) -> None:
    export = tmp_path / "conv.json"
    export.write_text(
        json.dumps(
            {
                "sessions": [
                    {
                        "id": "s1",
                        "date": "2024-01-01 10:00",
                        "turns": [
                            {"role": "user", "content": "I love green tea from Kyoto"},
                            {"role": "assistant", "content": "Noted, green tea it is."},
                        ],
                    },
                    {
                        "id": "s2",
                        "date": "2024-02-01 09:00",
                        "turns": [
                            {"role": "user", "content": "My dog is called Biscuit"},
                            {"role": "assistant", "content": "Hi Biscuit!"},
                        ],
                    },
                ]
            }
        )
    )
    ws = tmp_path / "ws"
    imported = membot("memory", "import", str(export), workspace=ws)
    assert imported.returncode == 0, imported.stderr
    assert "imported 2 sessions, 4 turns" in imported.stdout

    found = membot("memory", "search", "which tea do I like", "-k", "3", workspace=ws)
    assert found.returncode == 0 and "green tea from Kyoto" in found.stdout

    stats = membot("memory", "stats", workspace=ws)
    assert stats.returncode == 0 and "episodic items" in stats.stdout

    shown = membot("memory", "show", "--query", "what is my dog called", workspace=ws)
    assert shown.returncode == 0
    assert "# Memory" in shown.stdout and "Biscuit" in shown.stdout
    assert oct((ws / "memory").stat().st_mode & 0o777) == "0o700"


def test_import_of_a_missing_or_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = membot("memory", "import", str(tmp_path / "nope.json"), workspace=tmp_path / "ws")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"sessions": 5}')
    result = membot("memory", "import", str(bad), workspace=tmp_path / "ws")
    assert result.returncode != 0 and "Traceback" not in result.stderr
