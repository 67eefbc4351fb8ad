"""``membot doctor`` as an operator runs it: a subprocess against the fake LLM, Telegram and Discord."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fakes.discord_server import FakeDiscord
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.telegram_server import FakeTelegramServer


async def doctor(tmp_path: Path, *args: str, offline: bool = False, **env: str) -> tuple[int, str]:
    """``membot [args] doctor [--offline]`` with a clean environment plus ``env`` (the terminal channel
    on unless ``env`` says otherwise: membot run needs a channel)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    clean.update(HOME=str(tmp_path), MEMBOT_WORKSPACE=str(tmp_path / "ws"), COLUMNS="80")
    clean.update({"MEMBOT_TERMINAL__ENABLED": "true", **env})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        "doctor",
        *(["--offline"] if offline else []),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean,
        cwd=tmp_path,
    )
    async with asyncio.timeout(60):
        out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


def line(out: str, name: str) -> str:
    """The check's line plus its wrapped continuation lines (details and fix hint)."""
    lines = out.splitlines()
    for i, text in enumerate(lines):
        if text[2:].lstrip().startswith(("pass", "warn", "fail", "skip")) and f" {name} " in text:
            block = [text]
            for more in lines[i + 1 :]:
                if more[:1].strip():
                    break
                block.append(more)
            return " ".join(" ".join(block).split())
    raise AssertionError(f"no {name!r} line in:\n{out}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_everything_passes_against_the_fake_services(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg, FakeDiscord() as discord_api:
        code, out = await doctor(
            tmp_path,
            MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url,
            MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456",
            MEMBOT_TELEGRAM__TOKEN=tg.token,
            MEMBOT_TELEGRAM__BASE_URL=tg.base_url,
            MEMBOT_DISCORD__TOKEN=discord_api.token,
            MEMBOT_DISCORD__API_BASE=discord_api.api_base,
        )
        assert not llm.requests  # no chat completion: doctor spends no tokens
        assert any(c.method == "getMe" for c in tg.calls)
        assert any(r.path == "/users/@me" for r in discord_api.requests)
    assert code == 0, out
    for name in ("config", "workspace", "models.json", "llm settings", "llm openai", "telegram", "discord"):
        assert line(out, name).startswith("✓ pass"), out
    assert "@membot_test_bot" in line(out, "telegram")
    assert "All checks passed" in out
    assert tg.token not in out and discord_api.token not in out
    assert max(len(text.rstrip()) for text in out.splitlines()) <= 80


async def test_anthropic_endpoint_is_checked_with_its_own_api(tmp_path: Path) -> None:
    # Anthropic lists dated snapshots; the alias in the catalog names the newest one.
    async with FakeLLMServer(models=("claude-sonnet-4-5-20250929",)) as llm:
        code, out = await doctor(
            tmp_path,
            MEMBOT_LLM__MODEL="claude-sonnet-4-5",
            MEMBOT_LLM__ANTHROPIC__BASE_URL=llm.anthropic_base_url,
            MEMBOT_LLM__ANTHROPIC__API_KEY="sk-ant-test-123456",
        )
    assert code == 0, out
    assert line(out, "llm anthropic").startswith("✓ pass")
    assert line(out, "telegram").startswith("- skip") and line(out, "discord").startswith("- skip")


async def test_rejected_tokens_and_an_unreachable_llm_fail_with_hints(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, FakeDiscord() as discord_api:
        code, out = await doctor(
            tmp_path,
            MEMBOT_LLM__OPENAI__BASE_URL=f"http://127.0.0.1:{closed_port()}/v1",
            MEMBOT_TELEGRAM__TOKEN="999:wrong-token-abcdef",
            MEMBOT_TELEGRAM__BASE_URL=tg.base_url,
            MEMBOT_DISCORD__TOKEN="wrong-discord-token",
            MEMBOT_DISCORD__API_BASE=discord_api.api_base,
        )
    assert code == 1
    llm_line = line(out, "llm openai")
    assert llm_line.startswith("✗ fail") and "cannot connect" in llm_line
    assert "MEMBOT_LLM__OPENAI__BASE_URL" in llm_line
    tg_line = line(out, "telegram")
    assert tg_line.startswith("✗ fail") and "HTTP 401" in tg_line and "@BotFather" in tg_line
    dc_line = line(out, "discord")
    assert dc_line.startswith("✗ fail") and "MEMBOT_DISCORD__TOKEN" in dc_line
    assert "wrong-token-abcdef" not in out and "wrong-discord-token" not in out
    assert "3 check(s) failed" in out and "Traceback" not in out


async def test_a_broken_config_is_one_clear_failure(tmp_path: Path) -> None:
    code, out = await doctor(tmp_path, offline=True, MEMBOT_DISPATCHER__QUEUE_LIMIT="many")
    assert code == 1
    config = line(out, "config")
    assert config.startswith("✗ fail") and "dispatcher.queue_limit" in config
    assert "MEMBOT_DISPATCHER__QUEUE_LIMIT" in config and "Traceback" not in out


async def test_a_blank_discord_token_is_a_failed_config_line(tmp_path: Path) -> None:
    """A blank token passed as set: doctor went on to ask Discord with it. Now the config line fails
    and names the variable."""
    code, out = await doctor(
        tmp_path, offline=True, MEMBOT_LLM__OPENAI__API_KEY="sk-x", MEMBOT_DISCORD__TOKEN=" "
    )
    assert code == 1
    config = line(out, "config")
    assert config.startswith("✗ fail") and "MEMBOT_DISCORD__TOKEN" in config and "is blank" in config


async def test_offline_reports_catalog_workspace_and_llm_settings_problems(tmp_path: Path) -> None:
    (tmp_path / "models.json").write_text('{"models": [{"id": "x"}]}')
    (tmp_path / "not-a-folder").write_text("")
    code, out = await doctor(
        tmp_path,
        "--workspace",
        str(tmp_path / "not-a-folder"),
        offline=True,
        MEMBOT_MODELS_FILE=str(tmp_path / "models.json"),
    )
    assert code == 1
    assert line(out, "workspace").startswith("✗ fail") and "not a folder" in line(out, "workspace")
    assert line(out, "models.json").startswith("✗ fail") and "models.json" in line(out, "models.json")

    code, out = await doctor(tmp_path, offline=True)  # and no LLM configured at all
    assert code == 1
    llm = line(out, "llm settings")
    assert llm.startswith("✗ fail") and "MEMBOT_LLM__OPENAI__API_KEY" in llm
    assert line(out, "online").startswith("- skip")


async def test_a_model_the_server_does_not_list_fails_with_the_ones_it_does(tmp_path: Path) -> None:
    async with FakeLLMServer(models=("llama3.1:latest", "qwen2.5:7b")) as llm:
        code, out = await doctor(
            tmp_path, MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url, MEMBOT_LLM__MODEL="llama3.2"
        )
        assert code == 1
        llm_line = line(out, "llm openai")
        assert llm_line.startswith("✗ fail") and "does not list llama3.2" in llm_line
        assert "MEMBOT_LLM__MODEL" in llm_line and "llama3.1:latest, qwen2.5:7b" in llm_line

        code, out = await doctor(
            tmp_path, MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url, MEMBOT_LLM__MODEL="llama3.1"
        )
        assert code == 0, out  # Ollama's "llama3.1:latest" is what "llama3.1" means
        assert line(out, "llm openai").startswith("✓ pass")


async def test_a_model_list_that_never_ends_is_cut_with_a_fail_line(tmp_path: Path) -> None:
    async with FakeLLMServer(models=("llama3.1",)) as llm:
        llm.models_flood = 64 * 2**20  # then it hangs: ONLINE_TIMEOUT is per read, so a flood never ends
        code, out = await doctor(
            tmp_path, MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url, MEMBOT_LLM__MODEL="llama3.1"
        )
    assert code == 1
    llm_line = line(out, "llm openai")
    assert llm_line.startswith("✗ fail") and "sent over 16 MiB" in llm_line, out
    assert "MEMBOT_LLM__OPENAI__BASE_URL" in llm_line


async def test_a_model_list_that_drips_is_cut_at_the_online_timeout(tmp_path: Path) -> None:
    """A byte every 0.05 s kept each read within the client's timeout (10 s a read): doctor waited as
    long as the server kept sending."""
    async with FakeLLMServer(models=("llama3.1",)) as llm:
        llm.models_drip = 0.05  # the list, then spaces, for a minute
        async with asyncio.timeout(30):
            code, out = await doctor(
                tmp_path, MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url, MEMBOT_LLM__MODEL="llama3.1"
            )
    assert code == 1
    llm_line = line(out, "llm openai")
    assert llm_line.startswith("✗ fail") and "no answer within 10 s" in llm_line, out


async def test_no_channel_is_a_warning_since_membot_run_would_not_start(tmp_path: Path) -> None:
    code, out = await doctor(
        tmp_path, offline=True, MEMBOT_TERMINAL__ENABLED="false", MEMBOT_LLM__OPENAI__API_KEY="sk-x"
    )
    assert "none configured: membot run would not start" in line(out, "channels")
    assert code == 0 and "All checks passed, 1 with a warning" in out  # membot chat needs no channel


async def test_a_base_url_doctor_cannot_ask_is_a_fail_line_not_a_traceback(tmp_path: Path) -> None:
    code, out = await doctor(
        tmp_path, MEMBOT_LLM__OPENAI__API_KEY="sk-x", MEMBOT_LLM__OPENAI__BASE_URL="http://127.0.0.1:99999/v1"
    )
    assert code == 1 and "Traceback" not in out and "cannot be asked" in out


async def test_a_password_in_a_base_url_is_never_shown(tmp_path: Path) -> None:
    """A proxy's user:password in a base URL: ``membot config`` and the log mask it, and the check
    lines that name the URL (a failure's first words, which operators paste into bug reports) did not."""
    port = closed_port()
    code, out = await doctor(
        tmp_path,
        MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456",
        MEMBOT_LLM__OPENAI__BASE_URL=f"http://llm-user:llm-pass-4321@127.0.0.1:{port}/v1",
        MEMBOT_TELEGRAM__TOKEN="123456789:AAFakeTokenForTestsOnly_abcdefghijklmno",
        MEMBOT_TELEGRAM__BASE_URL=f"http://tg-user:tg-pass-4321@127.0.0.1:{port}/bot",
        MEMBOT_DISCORD__TOKEN="fake.discord.token",
        MEMBOT_DISCORD__API_BASE=f"http://dc-user:dc-pass-4321@127.0.0.1:{port}/api/v10",
    )
    assert code == 1
    for name, shown in (
        ("llm openai", f"http://127.0.0.1:{port}/v1/models"),
        ("telegram", f"http://127.0.0.1:{port}/bot<token>/getMe"),
        ("discord", f"http://127.0.0.1:{port}/api/v10/users/@me"),
    ):
        text = "".join(line(out, name).split())  # a long URL may wrap anywhere
        assert text.startswith("✗fail") and f"{shown}:cannotconnect" in text, out
    assert "-pass-4321" not in out and "AAFakeToken" not in out


async def doctor_as_a_user(ws: Path, top: str, *, owned: bool, mode: int | None) -> tuple[int, str]:
    """``membot doctor --offline`` on ``ws`` as an unprivileged user: ``nobody`` (setpriv) when the tests
    run as root, who may write anywhere; else this user. ``owned``: ``ws`` is that user's (else root's,
    which only works as root); ``mode``: its permission bits while the doctor runs (None: ``ws`` is
    set up already, owner and mode)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to become another user")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        if owned and mode is not None:
            os.chown(ws, 65534, 65534)
    elif not owned:
        pytest.skip("only root can give a folder to another user")
    if mode is not None:
        os.chmod(ws, mode)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    clean.update(
        HOME=top,
        COLUMNS="80",
        MEMBOT_WORKSPACE=str(ws),
        MEMBOT_TERMINAL__ENABLED="true",
        MEMBOT_LLM__OPENAI__API_KEY="sk-x",
    )
    process = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        "-m",
        "bot",
        "doctor",
        "--offline",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean,
        cwd=top,
    )
    try:
        async with asyncio.timeout(60):
            raw, _ = await process.communicate()
    finally:
        if mode is not None:
            os.chmod(ws, 0o700)
    return process.returncode or 0, raw.decode()


async def test_a_workspace_this_user_cannot_enter_is_a_fail_line_with_the_fix() -> None:
    """The usual slip of a restore or a move: the workspace belongs to another user (root, after a
    ``tar -x`` without the chown). Doctor looked inside it and ended on "error: …/sessions: Permission
    denied", without its checks and without a fix."""
    with tempfile.TemporaryDirectory() as top:  # under /tmp: a path the other user can reach
        ws = Path(top) / "ws"
        os.chmod(top, 0o755)
        os.makedirs(ws / "sessions")
        code, out = await doctor_as_a_user(ws, top, owned=False, mode=0o700)
    assert code == 1, out
    workspace = line(out, "workspace")
    assert workspace.startswith("✗ fail") and f"not writable by this user: {ws}" in workspace, out
    assert f"fix: chown -R {pwd.getpwuid(65534).pw_name} {ws}" in workspace and "chmod" not in workspace, out
    assert line(out, "kept answers").startswith("- skip")
    assert line(out, "llm settings").startswith("✓ pass")  # the other checks still ran


@pytest.mark.parametrize("mode", [0o500, 0o000], ids=["r-x", "---"])
async def test_a_read_only_workspace_of_ones_own_gets_a_chmod_not_a_chown(mode: int) -> None:
    """A workspace of this user without its write bit (a ``chmod -R a-w``, a copy from read-only media)
    got "fix: chown -R <user>", which changes nothing: the user owns it already."""
    with tempfile.TemporaryDirectory() as top:
        ws = Path(top) / "ws"
        os.chmod(top, 0o755)
        os.makedirs(ws / "sessions")
        code, out = await doctor_as_a_user(ws, top, owned=True, mode=mode)
    assert code == 1, out
    workspace = line(out, "workspace")
    assert workspace.startswith("✗ fail") and f"not writable by this user: {ws}" in workspace, out
    assert f"fix: chmod -R u+rwX {ws}" in workspace and "chown" not in workspace, out
    assert line(out, "llm settings").startswith("✓ pass")


async def test_a_workspace_on_a_read_only_mount_is_not_told_to_chmod() -> None:
    """Its owner and mode are right; only a remount helps (a chmod there fails with EROFS)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only file system needs root")
    with tempfile.TemporaryDirectory() as top:
        ws = Path(top) / "ws"
        os.chmod(top, 0o755)
        ws.mkdir()
        options = "ro,mode=0700,uid=65534,gid=65534"
        mounted = await asyncio.to_thread(
            subprocess.run, ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(ws)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount here: {mounted.stderr.decode().strip()}")
        try:
            code, out = await doctor_as_a_user(ws, top, owned=True, mode=None)
        finally:
            await asyncio.to_thread(subprocess.run, ["umount", str(ws)], check=True)
    workspace = line(out, "workspace")
    assert code == 1 and workspace.startswith("✗ fail"), out
    assert f"remount its file system read-write (findmnt -T {ws} shows ro)" in workspace, out
    assert "chmod -R" not in workspace and "chown" not in workspace


async def test_a_base_url_without_its_scheme_is_named_as_membot_run_names_it(tmp_path: Path) -> None:
    """``localhost:11434`` (Ollama's address without http://): ``membot run`` refuses it at start (78,
    "is not an http(s) URL"), but doctor passed the settings and said only "cannot connect
    (UnsupportedProtocol) ... check that the server is running", which it was."""
    code, out = await doctor(tmp_path, offline=True, MEMBOT_LLM__OPENAI__BASE_URL="localhost:11434")
    assert code == 1
    llm = line(out, "llm settings")
    assert llm.startswith("✗ fail") and "is not an http(s) URL" in llm, out
    assert "http://localhost:11434/v1" in llm


async def test_a_fallback_model_without_a_key_is_a_warning_offline(tmp_path: Path) -> None:
    """An Anthropic fallback with only an OpenAI key passed every offline check; it fails only when the
    primary is down, the one time it is needed."""
    code, out = await doctor(
        tmp_path,
        offline=True,
        MEMBOT_LLM__OPENAI__API_KEY="sk-x",
        MEMBOT_LLM__FALLBACK_MODELS='["gpt-4o-mini", "claude-haiku-4-5"]',
    )
    llm = line(out, "llm settings")
    assert code == 0 and llm.startswith("! warn"), out
    assert "fallback claude-haiku-4-5 cannot be asked" in llm and "gpt-4o-mini" not in llm
    assert "set MEMBOT_LLM__ANTHROPIC__API_KEY, or take it out of MEMBOT_LLM__FALLBACK_MODELS" in llm
