"""The membot command line, run as a real subprocess (what an operator types)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli.root import exit_code
from bot.errors import ChannelError, ConfigError, InUseError, LLMError, MembotError, StorageError
from bot.pairing import PAIRING_FILE, PairingStore
from bot.workspace_lock import WorkspaceLock
from tests.bot.cli.membot_process import run_membot as membot

CONFIG_ERROR = 78  # EX_CONFIG: a wrong setting, which deploy/membot.service does not restart


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(tmp_path / "ws"), "COLUMNS": "80"}


def test_help_lists_the_commands(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("--help", env=home, cwd=tmp_path)
    assert result.returncode == 0
    for command in ("run", "chat", "config", "models"):
        assert command in result.stdout
    # Each command's first sentence is shown whole, wrapped to the terminal, not cut with "...".
    listed = " ".join(result.stdout.split("Commands:")[1].split())
    assert (
        "run Start every configured channel (Telegram, Discord, terminal) and serve until stopped." in listed
    )
    assert "..." not in listed


def test_chat_without_a_model_says_what_to_set(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("chat", env=home, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR
    assert "Traceback" not in result.stderr
    for setting in (
        "MEMBOT_LLM__OPENAI__API_KEY=<your key: sk-...>",  # (not "=***", as if a secret were masked)
        "MEMBOT_LLM__ANTHROPIC__API_KEY=<your key: sk-ant-...>",
        "http://localhost:11434/v1",
    ):
        assert setting in result.stderr
    assert "***" not in result.stderr


@pytest.mark.parametrize(
    "command", [["memory", "stats"], ["pairing", "list"], ["chat"], ["sessions", "list"]]
)
def test_a_workspace_that_is_a_file_is_one_clear_line(
    home: dict[str, str], tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "ws").write_text("not a folder")
    result = membot(*command, env={**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x"}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr + result.stdout
    assert f"the workspace {tmp_path / 'ws'} is a file" in result.stderr


@pytest.mark.parametrize("command", [["memory", "stats"], ["pairing", "list"], ["sessions", "list"]])
def test_a_workspace_under_a_file_is_one_clear_line_with_the_fix(
    home: dict[str, str], tmp_path: Path, command: list[str]
) -> None:
    """A workspace in a folder that is a file said "error: …/ws/memory: Not a directory" (or "No sessions
    in …"), neither what was wrong nor how to fix it."""
    (tmp_path / "data").write_text("not a folder")
    workspace = tmp_path / "data" / "ws"
    result = membot(*command, env={**home, "MEMBOT_WORKSPACE": str(workspace)}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr + result.stdout
    assert (
        f"the workspace {workspace} cannot be made: {tmp_path / 'data'} is a file: point --workspace or "
        "MEMBOT_WORKSPACE at a folder"
    ) in result.stderr


def test_run_without_channels_says_what_to_set(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("run", env={**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x"}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR
    assert "MEMBOT_TELEGRAM__TOKEN" in result.stderr and "Traceback" not in result.stderr


def test_run_exits_78_only_when_a_restart_cannot_help(home: dict[str, str], tmp_path: Path) -> None:
    """Config errors and a taken admin port both exited 2, so the systemd unit could not keep from
    restarting a config error five times without also giving up on a port the old process still held.
    Now a wrong setting is 78 (EX_CONFIG), which the unit does not restart, and a port another process
    holds is 75 (EX_TEMPFAIL), which it does."""
    env = {**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x", "MEMBOT_TERMINAL__ENABLED": "true"}
    wrong = membot("run", env={**env, "MEMBOT_ADMIN__PORT": "port nine"}, cwd=tmp_path)
    assert wrong.returncode == CONFIG_ERROR and "admin.port" in wrong.stderr, wrong.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = membot(
            "run", env={**env, "MEMBOT_ADMIN__ENABLED": "true", "MEMBOT_ADMIN__PORT": str(port)}, cwd=tmp_path
        )
    assert taken.returncode == 75, taken.stderr
    assert f"127.0.0.1:{port}" in taken.stderr and "Traceback" not in taken.stderr
    unit = (Path(__file__).parents[3] / "deploy" / "membot.service").read_text()
    assert "\nRestart=on-failure\n" in unit and "\nRestartPreventExitStatus=78\n" in unit
    assert "\nTasksMax=512\n" in unit  # a fork bomb from the shell tool stops there


def json_lines(stderr: str) -> list[dict[str, object]]:
    """Every line of ``stderr`` as JSON (a line that is not JSON fails the test: a collector drops it)."""
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("cause", ["no channel", "bad setting", "workspace held", "port taken"])
def test_a_start_that_fails_says_why_in_a_json_log_line(
    home: dict[str, str], tmp_path: Path, cause: str
) -> None:
    """With JSON logs (the systemd unit and Docker set log_format json; auto is JSON off a terminal)
    the error that stopped the start was a plain "error: ..." line among JSON ones."""
    env = {
        **home,
        "MEMBOT_LOG_FORMAT": "json",
        "MEMBOT_LLM__OPENAI__API_KEY": "sk-live-key-that-must-not-show-1234",
        "MEMBOT_TERMINAL__ENABLED": "true",
    }
    with contextlib.ExitStack() as held:
        if cause == "no channel":
            env["MEMBOT_TERMINAL__ENABLED"] = "false"
            code, said = 78, "MEMBOT_TELEGRAM__TOKEN"
        elif cause == "bad setting":  # the settings did not load: the format is auto's, JSON off a tty
            env["MEMBOT_ADMIN__PORT"] = "port nine"
            del env["MEMBOT_LOG_FORMAT"]
            code, said = 78, "admin.port"
        elif cause == "workspace held":
            held.enter_context(WorkspaceLock.hold(tmp_path / "ws", command="another membot"))
            code, said = 75, "in use by another membot"
        else:
            holder = held.enter_context(socket.socket())
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            env.update(MEMBOT_ADMIN__ENABLED="true", MEMBOT_ADMIN__PORT=str(holder.getsockname()[1]))
            code, said = 75, "MEMBOT_ADMIN__PORT"
        result = membot("run", env=env, cwd=tmp_path)
    assert result.returncode == code, result.stderr
    last = json_lines(result.stderr)[-1]
    assert last["event"] == "membot_start_failed" and last["level"] == "error", last
    assert said in str(last["error"]) and last["hint"] and last["exit_code"] == code, last
    assert "sk-live-key" not in result.stderr


def test_a_start_that_fails_is_a_plain_line_with_console_logs(home: dict[str, str], tmp_path: Path) -> None:
    env = {**home, "MEMBOT_LOG_FORMAT": "console", "MEMBOT_LLM__OPENAI__API_KEY": "sk-x"}
    result = membot("run", env=env, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR
    assert result.stderr.startswith("error: no channel is configured"), result.stderr


def test_config_masks_secrets_and_names_sources(home: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "membot.toml").write_text('[llm]\nmodel = "claude-haiku-4-5"\n')
    env = {
        **home,
        "MEMBOT_LLM__ANTHROPIC__API_KEY": "sk-ant-supersecret-123456",
        "MEMBOT_LLM__OPENAI__BASE_URL": "http://bob:proxypass99@proxy.local/v1",
    }
    result = membot("--config", str(tmp_path / "membot.toml"), "config", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "supersecret" not in result.stdout and "proxypass99" not in result.stdout
    assert "********" in result.stdout and "claude-haiku-4-5" in result.stdout
    assert "membot.toml" in result.stdout and "env" in result.stdout


def test_invalid_config_is_one_clear_line(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("config", env={**home, "MEMBOT_DISPATCHER__QUEUE_LIMIT": "many"}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR
    assert "dispatcher.queue_limit" in result.stderr and "Traceback" not in result.stderr


def test_models_lists_the_catalog(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("models", env=home, cwd=tmp_path)
    assert result.returncode == 0
    assert "claude-sonnet-4-5" in result.stdout and "gpt-4.1-mini *" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_misspelled_key_gets_a_did_you_mean(home: dict[str, str], tmp_path: Path) -> None:
    toml = tmp_path / "membot.toml"
    toml.write_text('[llm]\nmodle = "gpt-4.1"\n[telegram]\nalowed_users = ["1"]\n')
    result = membot("--config", str(toml), "config", env=home, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr
    err = one_line(result.stderr)
    assert "llm.modle: unknown setting; did you mean `llm.model`?" in err
    assert "telegram.alowed_users: unknown setting; did you mean `telegram.allowed_users`?" in err
    assert str(toml) in err

    result = membot("config", env={**home, "MEMBOT_LLM__MODLE": "gpt-4.1"}, cwd=tmp_path)
    assert "did you mean `llm.model`?" in one_line(result.stderr) and "MEMBOT_LLM__MODLE" in result.stderr


def test_a_toml_syntax_error_names_the_file_and_line(home: dict[str, str], tmp_path: Path) -> None:
    toml = tmp_path / "membot.toml"
    toml.write_text('[llm]\nmodel = "gpt-4.1"\ntimeout = = 5\n')
    result = membot("--config", str(toml), "config", env=home, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr
    err = one_line(result.stderr)
    assert f"{toml} is not valid TOML" in err and "line 3" in err


def test_a_malformed_json_list_names_its_variable(home: dict[str, str], tmp_path: Path) -> None:
    env = {**home, "MEMBOT_LLM__FALLBACK_MODELS": '["gpt-4.1-mini",'}
    result = membot("config", env=env, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr
    err = one_line(result.stderr)
    assert "MEMBOT_LLM__FALLBACK_MODELS is not valid JSON" in err and "lists are JSON" in err


def config_rows(table: str) -> dict[str, str]:
    """``membot config``'s table as setting -> value."""
    return {
        row.split("│")[1].strip(): row.split("│")[2].strip()
        for row in table.splitlines()
        if row.count("│") >= 3
    }


def test_numeric_user_ids_are_accepted_from_toml_and_env(home: dict[str, str], tmp_path: Path) -> None:
    toml = tmp_path / "membot.toml"
    toml.write_text("[telegram]\nallowed_users = [12345, 67890]\nallowed_groups = [-100123]\n")
    env = {**home, "MEMBOT_DISCORD__ALLOWED_USERS": "[111, 222]", "MEMBOT_DISCORD__ALLOWED_GUILDS": "333"}
    result = membot("--config", str(toml), "config", env={**env, "COLUMNS": "200"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = config_rows(result.stdout)
    assert rows["telegram.allowed_users"] == "['12345', '67890']"
    assert rows["telegram.allowed_groups"] == "['-100123']"
    assert rows["discord.allowed_users"] == "['111', '222']" and rows["discord.allowed_guilds"] == "['333']"


@pytest.mark.parametrize(
    "value",
    [
        "'[\"12345678\"]'",  # deploy/membot.env.example's line, as `docker run --env-file` passes it
        '"12345678"',
        "@alice",  # a username: the platforms send ids
    ],
)
def test_an_id_that_is_not_a_number_is_refused_not_kept(
    home: dict[str, str], tmp_path: Path, value: str
) -> None:
    """Such an id matched no one: the allowlist looked set, and everyone, its owner too, was denied."""
    result = membot("config", env={**home, "MEMBOT_TELEGRAM__ALLOWED_USERS": value}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr
    err = one_line(result.stderr)
    assert "telegram.allowed_users" in err and "ids are whole numbers" in err, err
    assert "(set MEMBOT_TELEGRAM__ALLOWED_USERS)" in err
    assert ("quotes" in err) == value.startswith(("'", '"'))


def test_a_bad_list_item_names_the_list_to_fix(home: dict[str, str], tmp_path: Path) -> None:
    """A wrong item named MEMBOT_TELEGRAM__ALLOWED_USERS__1 and `telegram.allowed_users.1`, which no
    one can set: the list is one variable, one key."""
    toml = tmp_path / "membot.toml"
    toml.write_text('[telegram]\nallowed_users = ["1", ["2"]]\n')
    result = membot("--config", str(toml), "config", env=home, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr
    err = one_line(result.stderr)
    assert (
        f"telegram.allowed_users, item 2: Input should be a valid string "
        f"(set MEMBOT_TELEGRAM__ALLOWED_USERS or `telegram.allowed_users` in {toml})"
    ) in err, err

    result = membot("config", env={**home, "MEMBOT_LLM__FALLBACK_MODELS": '["a", 1]'}, cwd=tmp_path)
    err = one_line(result.stderr)
    assert (
        "llm.fallback_models, item 2: Input should be a valid string (set MEMBOT_LLM__FALLBACK_MODELS)" in err
    )
    assert "__1" not in err


def test_an_anthropic_key_with_the_default_openai_model_says_to_pick_a_claude_model(
    home: dict[str, str], tmp_path: Path
) -> None:
    env = {**home, "MEMBOT_LLM__ANTHROPIC__API_KEY": "sk-ant-test-123456"}
    result = membot("chat", env=env, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR and "Traceback" not in result.stderr
    err = one_line(result.stderr)
    assert "an Anthropic API key is set" in err and "gpt-4.1-mini" in err
    assert "set MEMBOT_LLM__MODEL to a Claude model" in err


def test_a_strangers_name_cannot_send_escape_sequences_to_the_operators_terminal(tmp_path: Path) -> None:
    """The name comes from a stranger's profile: `membot pairing list` shows its control characters
    (here: clear the screen, hide what follows, a bidi override), never obeys them."""
    ws = tmp_path / "ws"
    ws.mkdir()
    evil = "Mallory\x1b[2J\x1b[H\x1b[8m(hidden)\u202etxt.exe ad\u200bmin \U0001f469\u200d\U0001f4bb"
    assert PairingStore(ws / PAIRING_FILE).request_sync("telegram", "666", evil) is not None
    result = membot(
        "pairing",
        "list",
        env={"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(ws), "COLUMNS": "160"},
        cwd=tmp_path,
    )

    assert result.returncode == 0, result.stderr
    assert "Mallory" in result.stdout and "\x1b" not in result.stdout and "\u202e" not in result.stdout
    # An invisible character must not let a name pass for another ("ad\u200bmin" for "admin"); the
    # zero-width joiner of an emoji stays.
    assert "\u200b" not in result.stdout and "ad\ufffdmin" in result.stdout
    assert "\U0001f469\u200d\U0001f4bb" in result.stdout


def test_a_dotenv_line_that_is_not_key_value_is_named_once_with_its_file(
    home: dict[str, str], tmp_path: Path
) -> None:
    """python-dotenv's "could not parse statement starting at line 2" named no file and no fix, and came
    once per read (`membot config` reads the .env twice: plain, then as a JSON log line)."""
    (tmp_path / ".env").write_text("MEMBOT_LLM__MODEL=gpt-4.1-mini\nthis line is not a setting\n")
    result = membot("config", env=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "line 2" in line]
    assert said == [
        f"ignored line 2 of {(tmp_path / '.env').resolve()}: it is not KEY=value "
        + '(quote a value with spaces: KEY="a b")'
    ], result.stderr
    assert "python-dotenv" not in result.stderr


def test_a_misspelled_variable_in_the_dotenv_names_the_variable_it_meant(
    home: dict[str, str], tmp_path: Path
) -> None:
    """In the environment, MEMBOT_TELEGRAM_TOKEN gets "did you mean MEMBOT_TELEGRAM__TOKEN?"; in the
    .env it got "telegram_token: unknown setting; did you mean `telegram`?", naming a table."""
    (tmp_path / ".env").write_text("MEMBOT_TELEGRAM_TOKEN=123:abc\n")
    result = membot("config", env=home, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR
    assert (
        "MEMBOT_TELEGRAM_TOKEN: no such setting; did you mean MEMBOT_TELEGRAM__TOKEN? "
        "(rename it or remove it from .env)"
    ) in result.stderr
    assert "123:abc" not in result.stderr


def test_a_file_the_disk_refuses_exits_74_not_a_usage_error(tmp_path: Path) -> None:
    """A StorageError exited 2, click's status for a mistyped command line, so a script could not tell
    "you typed it wrong" from "the disk refused". Now it is 74 (EX_IOERR); a wrong code stays 2."""
    ws = tmp_path / "ws"
    ws.mkdir()
    code = PairingStore(ws / PAIRING_FILE).request_sync("telegram", "42", "Ada")
    assert code is not None
    env = {"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(ws), "COLUMNS": "160"}
    refused = membot("pairing", "approve", code, env=env, cwd=tmp_path, max_file_bytes=16)
    assert refused.returncode == 74, refused.stderr
    assert f"cannot write {ws / PAIRING_FILE}" in refused.stderr and "Traceback" not in refused.stderr
    mistyped = membot("pairing", "approve", "NOPE", env=env, cwd=tmp_path)
    assert mistyped.returncode == 2, mistyped.stderr


def _kinds(base: type[MembotError]) -> list[type[MembotError]]:
    return [base, *(k for sub in base.__subclasses__() for k in _kinds(sub))]


@pytest.mark.parametrize("kind", _kinds(MembotError)[1:], ids=lambda k: k.__name__)
def test_no_error_of_ours_exits_with_clicks_status_for_a_mistyped_command(kind: type[MembotError]) -> None:
    """A ChannelError or LLMError that ended a command exited 2, as if the command line were wrong;
    they are 69 (EX_UNAVAILABLE): a service the command needs failed. Every kind has its own status."""
    exc = kind.__new__(kind)  # (the status goes by type alone; ChannelRefused's fields are not needed)
    expected = {ConfigError: 78, StorageError: 74, InUseError: 75, ChannelError: 69, LLMError: 69}
    assert exit_code(exc) == next(code for base, code in expected.items() if isinstance(exc, base))


@pytest.mark.parametrize("token", [" ", "notatoken", "123456789:AAH secret"])
def test_a_telegram_token_of_the_wrong_shape_is_a_named_setting_not_a_channel_failure(
    home: dict[str, str], tmp_path: Path, token: str
) -> None:
    """A blank token (`MEMBOT_TELEGRAM__TOKEN=" "`) started the channel: PTB's InvalidToken came
    with a traceback and exit 1, which the systemd unit restarts over and over; a mistyped one was found
    only by Telegram. Now either is a wrong setting: 78, one line naming it, the value never shown."""
    env = {**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x", "MEMBOT_LOG_FORMAT": "console"}
    result = membot("run", env={**env, "MEMBOT_TELEGRAM__TOKEN": token}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "telegram.token" in result.stderr and "MEMBOT_TELEGRAM__TOKEN" in result.stderr
    assert "@BotFather" in result.stderr
    assert not token.strip() or token not in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MEMBOT_LLM__OPENAI__API_KEY", "  "),
        ("MEMBOT_LLM__ANTHROPIC__API_KEY", "  "),
        ("MEMBOT_DISCORD__TOKEN", " "),
        ("MEMBOT_MEMORY__EMBEDDINGS_API_KEY", " "),
    ],
)
def test_a_blank_key_in_the_env_file_is_a_named_setting_not_a_401_on_every_call(
    home: dict[str, str], tmp_path: Path, variable: str, value: str
) -> None:
    """A blank key (spaces) counted as a key: the bot started, every call failed with 401 and the chats
    were told the operator must check the settings. Now it is a wrong setting: 78, naming the variable
    and the file."""
    keys = {"MEMBOT_LLM__OPENAI__API_KEY": "sk-x", variable: value}
    (tmp_path / ".env").write_text("".join(f'{k}="{v}"\n' for k, v in keys.items()))  # (quoted: kept)
    result = membot("run", env={**home, "MEMBOT_LOG_FORMAT": "console"}, cwd=tmp_path)
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert variable in result.stderr and "is blank" in result.stderr and ".env" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_empty_line_in_the_env_file_leaves_its_setting_unset(home: dict[str, str], tmp_path: Path) -> None:
    """`KEY=` placeholder lines (and compose's `${KEY}` of a variable the host does not set) mean "not
    used here": an empty Anthropic key beside an OpenAI one, or an empty Discord token, are unset, as
    if the lines were not there; they neither stop the start nor count as a key."""
    lines = {
        "MEMBOT_LLM__OPENAI__API_KEY": "sk-x",
        "MEMBOT_LLM__ANTHROPIC__API_KEY": "",
        "MEMBOT_DISCORD__TOKEN": "",
        "MEMBOT_TELEGRAM__TOKEN": "",
    }
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    result = membot("config", env=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = config_rows(result.stdout)
    assert shown["llm.openai.api_key"] == "********"
    for setting in ("llm.anthropic.api_key", "discord.token", "telegram.token"):
        assert shown[setting] == "(not set)", setting


def test_a_wrong_log_level_flag_names_the_flag_not_the_variable(home: dict[str, str], tmp_path: Path) -> None:
    """`membot --log-level bogus` said "(set MEMBOT_LOG_LEVEL)", a variable nobody had set. Now the
    command line is refused naming the flag (2, a wrong command line), and any case of a level works."""
    result = membot("--log-level", "bogus", "config", env=home, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--log-level" in result.stderr and "bogus" in result.stderr
    assert "MEMBOT_LOG_LEVEL" not in result.stderr + result.stdout
    shown = membot("--log-level", "Warning", "config", env=home, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert any(row.split()[1:4] == ["log_level", "│", "WARNING"] for row in shown.stdout.splitlines())


def test_chat_on_a_read_only_workspace_says_what_run_says(home: dict[str, str], tmp_path: Path) -> None:
    """`membot run` on a read-only workspace exits 78, "cannot use workspace …: Read-only file system
    (set --workspace …)"; `membot chat` exited 1 with "membot chat stopped: …/logs: Read-only file
    system", no fix, and a status that tells a script nothing the README lists."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only file system needs root")
    ws = tmp_path / "ws"
    ws.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ws)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here: {mounted.stderr.decode().strip()}")
    try:
        env = {**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x", "MEMBOT_LOG_FORMAT": "console"}
        chat = membot("chat", env=env, cwd=tmp_path)
        run = membot("run", env={**env, "MEMBOT_TERMINAL__ENABLED": "true"}, cwd=tmp_path)
    finally:
        subprocess.run(["umount", str(ws)], check=True)
    assert run.returncode == chat.returncode == CONFIG_ERROR, chat.stderr
    for result in (chat, run):
        assert f"cannot use workspace {ws}: Read-only file system (set --workspace" in result.stderr
        assert "Traceback" not in result.stderr + result.stdout


def test_a_workspace_file_the_bots_user_may_not_write_is_named(home: dict[str, str], tmp_path: Path) -> None:
    """A restored workspace whose membot.lock is read-only, for a bot that is not root: it said
    "cannot use workspace …: Permission denied" and nothing of which of its files. (Run as root
    without the capability that lets root write any file, as a bot that is not root runs.)"""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running without root's file permissions needs root and setpriv")
    lock = tmp_path / "ws" / "membot.lock"
    lock.parent.mkdir(mode=0o700)
    lock.touch(mode=0o444)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    env.update(home, MEMBOT_LLM__OPENAI__API_KEY="sk-x", MEMBOT_LOG_FORMAT="console")
    without_root = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    result = subprocess.run(
        [*without_root, sys.executable, "-m", "bot", "chat"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert f"Permission denied on {lock} (let the user membot runs as write it, or set --workspace" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr + result.stdout


def test_pairing_on_a_read_only_workspace_exits_74_naming_the_file(tmp_path: Path) -> None:
    """The pairing lock file's open was the one write not turned into a StorageError: a read-only
    workspace exited 1 ("error: …/pairing.json.lock: Read-only file system"), not the 74 the README
    gives a file the disk refuses."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only file system needs root")
    ws = tmp_path / "ws"
    ws.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ws)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here: {mounted.stderr.decode().strip()}")
    try:  # a pending code, then the file system remounted read-only
        code = PairingStore(ws / PAIRING_FILE).request_sync("telegram", "42", "Ada")
        assert code is not None
        subprocess.run(["mount", "-o", "remount,ro", str(ws)], check=True)
        env = {"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(ws), "COLUMNS": "160"}
        approve = membot("pairing", "approve", code, env=env, cwd=tmp_path)
        revoke = membot("pairing", "revoke", "telegram", "42", env=env, cwd=tmp_path)
    finally:
        subprocess.run(["umount", str(ws)], check=True)
    for result in (approve, revoke):
        assert result.returncode == 74, result.stderr
        assert f"cannot write {ws / PAIRING_FILE}.lock: Read-only file system" in result.stderr
        assert "Traceback" not in result.stderr


def test_import_on_a_read_only_workspace_says_what_run_says(home: dict[str, str], tmp_path: Path) -> None:
    """The workspace lock's open was a bare OSError: `memory import` (and `sessions delete`) exited 1
    with "error: …/membot.lock: Read-only file system", where `membot run` says 78 and the fix."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only file system needs root")
    export = tmp_path / "conv.json"
    turns = [{"role": "user", "content": "I keep bees"}]
    export.write_text(json.dumps({"sessions": [{"id": "s1", "date": "2024-05-30 10:00", "turns": turns}]}))
    ws = tmp_path / "ws"
    ws.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ws)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here: {mounted.stderr.decode().strip()}")
    try:
        result = membot("memory", "import", str(export), env=home, cwd=tmp_path)
    finally:
        subprocess.run(["umount", str(ws)], check=True)
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert f"cannot use workspace {ws}: Read-only file system (set --workspace" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
