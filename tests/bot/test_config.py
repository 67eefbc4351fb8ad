"""Settings: sources and their priority, friendly errors, provenance and masking."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import load_settings
from bot.config_describe import describe_settings
from bot.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("MEMBOT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_defaults_without_any_source() -> None:
    s = load_settings(env_file=None)
    assert s.llm.model == "gpt-4.1-mini"
    assert s.workspace == Path("~/.membot/workspace").expanduser()
    assert s.dispatcher.queue_limit == 20 and s.compaction.threshold == 0.8


def test_priority_flags_over_env_over_dotenv_over_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "membot.toml"
    toml.write_text(
        'timezone = "Europe/Berlin"\n[llm]\nmodel = "from-toml"\nmax_retries = 7\n[dispatcher]\nqueue_limit = 5\n'
    )
    dotenv = tmp_path / ".env"
    dotenv.write_text("MEMBOT_LLM__MODEL=from-dotenv\nMEMBOT_DISPATCHER__QUEUE_LIMIT=6\n")
    monkeypatch.setenv("MEMBOT_LLM__MODEL", "from-env")
    s = load_settings(toml, env_file=dotenv, overrides={"timezone": "UTC"})
    assert s.llm.model == "from-env"
    assert s.dispatcher.queue_limit == 6
    assert s.llm.max_retries == 7
    assert s.timezone == "UTC"
    rows = {name: (value, origin) for name, value, origin in describe_settings(s, toml)}
    assert rows["llm.model"] == ("from-env", "env")
    assert rows["dispatcher.queue_limit"] == ("6", ".env")
    assert rows["llm.max_retries"] == ("7", str(toml))
    assert rows["llm.timeout"][1] == "default"


def test_values_the_command_line_set_are_shown_as_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMBOT_WORKSPACE", str(tmp_path / "from-env"))  # --workspace wins over it
    flags = {"workspace": tmp_path / "from-flag", "log_level": "DEBUG"}
    s = load_settings(env_file=None, overrides=flags)
    rows = {name: (value, origin) for name, value, origin in describe_settings(s, None, flags)}
    assert rows["workspace"] == (str(tmp_path / "from-flag"), "flag")
    assert rows["log_level"] == ("DEBUG", "flag") and rows["timezone"][1] == "default"


def test_secrets_are_masked_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBOT_LLM__OPENAI__API_KEY", "sk-very-secret-value-123")
    s = load_settings(env_file=None)
    assert "sk-very-secret" not in repr(s) and "sk-very-secret" not in str(s.model_dump())
    rows = {name: value for name, value, _ in describe_settings(s)}
    assert rows["llm.openai.api_key"] == "********"


def test_invalid_values_name_the_field_and_how_to_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBOT_DISPATCHER__QUEUE_LIMIT", "lots")
    with pytest.raises(ConfigError) as info:
        load_settings(env_file=None)
    assert "dispatcher.queue_limit" in str(info.value)
    assert "MEMBOT_DISPATCHER__QUEUE_LIMIT" in str(info.value)


def test_admin_users_are_ids_and_never_everyone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBOT_TELEGRAM__ADMIN_USERS", "42, 43")
    assert load_settings(env_file=None).telegram.admin_users == ["42", "43"]
    monkeypatch.setenv("MEMBOT_DISCORD__ADMIN_USERS", '["*"]')
    with pytest.raises(ConfigError, match="everyone an admin") as info:
        load_settings(env_file=None)
    assert "discord.admin_users" in str(info.value)


def test_unknown_keys_and_bad_zones_are_rejected(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("[llm]\nmodle = 'typo'\n")
    with pytest.raises(ConfigError, match=r"llm\.modle"):
        load_settings(toml, env_file=None)
    with pytest.raises(ConfigError, match="unknown time zone"):
        load_settings(env_file=None, overrides={"timezone": "Mars/Olympus"})


def test_a_misspelled_variable_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBOT_TELEGRAM_TOKEN", "123:abc")  # one underscore: the bot started tokenless
    monkeypatch.setenv("MEMBOT_TELEGRAM__GROUPS__-100123", "{}")  # a key of a table: any name is fine
    monkeypatch.setenv("MEMBOT_CONFIG", "")  # the command line's, not a setting
    with pytest.raises(ConfigError) as info:
        load_settings(env_file=None)
    assert str(info.value).splitlines()[1:] == [
        "  - MEMBOT_TELEGRAM_TOKEN: no such setting; did you mean MEMBOT_TELEGRAM__TOKEN? (rename or unset it)"
    ]
    monkeypatch.delenv("MEMBOT_TELEGRAM_TOKEN")
    monkeypatch.setenv("MEMBOT_TELEGRAM__TOKEN", "123:abc")
    assert load_settings(env_file=None).telegram.token is not None


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("llm", "max_retries", -1),  # was accepted, and then the model was never called
        ("llm", "timeout", 0),
        ("llm", "max_output_tokens", 0),
        ("dispatcher", "turn_timeout", 0),  # every answer "took longer than 0 s"
        ("tools", "max_llm_calls", 0),
        ("memory", "inject_max_bytes", -1),
        ("admin", "port", 70000),
    ],
)
def test_values_no_bot_could_run_with_are_refused(section: str, key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: Input should be"):
        load_settings(env_file=None, overrides={section: {key: value}})


def test_a_dotenv_shared_with_other_programs_is_read_for_its_membot_keys_only(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("OPENAI_API_KEY=sk-other\nDATABASE_URL=postgres://db\nMEMBOT_TIMEZONE=Europe/Berlin\n")
    assert load_settings(env_file=dotenv).timezone == "Europe/Berlin"

    dotenv.write_text(
        "DATABASE_URL=postgres://db\nMEMBOT_TIMEZONEE=Europe/Berlin\nMEMBOT_LLM__TIMEOUT=soon\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(env_file=dotenv)
    said = "MEMBOT_TIMEZONEE: no such setting; did you mean MEMBOT_TIMEZONE?"
    assert f"{said} (rename it or remove it from {dotenv})" in str(info.value)
    assert f"(set MEMBOT_LLM__TIMEOUT in {dotenv})" in str(info.value)
    assert "database_url" not in str(info.value)


def test_malformed_toml_and_missing_file_are_clear(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("[llm\nmodel=")
    with pytest.raises(ConfigError, match=r"c\.toml is not valid TOML: .* \(at line 1, column 5\)"):
        load_settings(toml, env_file=None)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml", env_file=None)


@pytest.mark.parametrize(
    ("toml_text", "variable", "key", "kind"),
    [
        ('llm = "x"\n', "MEMBOT_LLM__MODEL=gpt-4.1", "llm", "a string"),
        ("telegram = 5\n", "MEMBOT_TELEGRAM__PAIRING=false", "telegram", "a number"),
        ("discord = [1]\n", "MEMBOT_DISCORD__PAIRING=false", "discord", "a list"),
        ("memory = true\n", "MEMBOT_MEMORY__SCOPE=chat", "memory", "true or false"),
        ('[llm]\nopenai = "sk-1"\n', "MEMBOT_LLM__OPENAI__BASE_URL=http://x", "llm.openai", "a string"),
        (
            '[telegram.groups]\n"-100" = 1\n',
            "MEMBOT_TELEGRAM__GROUPS__-100={}",
            "telegram.groups.-100",
            "a number",
        ),
        (
            '[discord]\nmention_overrides = "x"\n',
            "MEMBOT_DISCORD__PAIRING=false",
            "discord.mention_overrides",
            "a string",
        ),
    ],
)
def test_a_value_where_a_table_belongs_is_refused_even_beside_a_variable_of_that_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml_text: str, variable: str, key: str, kind: str
) -> None:
    """pydantic-settings merges the sources before validating: a variable of the table replaced the
    file's string with its own table, and the bad line passed without a word."""
    toml = tmp_path / "membot.toml"
    toml.write_text(toml_text)
    name, value = variable.split("=", 1)
    for with_variable in (False, True):
        if with_variable:
            monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError) as info:
            load_settings(toml, env_file=None)
        assert str(info.value).splitlines()[1:] == [
            f"  - `{key}` in {toml} is {kind} where a table belongs: write [{key}] and put its settings "
            "on the lines below it, or remove the line"
        ]
    assert "sk-1" not in str(info.value)


def test_ids_written_with_spaces_are_kept_as_the_platform_sends_them(tmp_path: Path) -> None:
    """``[" 42 "]`` admitted user 42 (the channels' allowlists strip) but made no admin: /status compared
    ``" 42 "`` with the sender's ``"42"``, so the operator never saw the day's cost."""
    toml = tmp_path / "membot.toml"
    toml.write_text('[telegram]\nallowed_users = [" 42 ", 7, ""]\n[discord]\nadmin_users = ["  99"]\n')
    s = load_settings(toml, env_file=None)
    assert s.telegram.allowed_users == ["42", "7"]
    assert s.discord.admin_users == ["99"]


@pytest.mark.parametrize("secret", ["Zq", "hunter2", "short-secret-15"])
def test_a_webhook_secret_short_enough_to_guess_is_refused(
    monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    """The webhook's secret header is all that tells Telegram's posts from anyone's who reaches the
    endpoint: one who guesses it can post updates "from" an allowed user and use the bot as them. A
    short one was taken; it is a named wrong setting now, its value never repeated."""
    monkeypatch.setenv("MEMBOT_TELEGRAM__MODE", "webhook")
    monkeypatch.setenv("MEMBOT_TELEGRAM__WEBHOOK_SECRET", secret)
    with pytest.raises(ConfigError) as info:
        load_settings(env_file=None)
    assert "telegram.webhook_secret" in str(info.value) and "MEMBOT_TELEGRAM__WEBHOOK_SECRET" in str(
        info.value
    )
    assert secret not in str(info.value)
    monkeypatch.setenv("MEMBOT_TELEGRAM__WEBHOOK_SECRET", "x" * 16)
    assert load_settings(env_file=None).telegram.webhook_secret is not None


def test_a_short_webhook_secret_does_not_stop_a_bot_that_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling opens no webhook: a short secret left in the settings (from a test of webhook mode)
    is unused, and refusing it stopped a working bot from starting, every command with it."""
    monkeypatch.setenv("MEMBOT_TELEGRAM__WEBHOOK_SECRET", "hunter2")
    assert load_settings(env_file=None).telegram.mode == "polling"
