"""The model catalog: shipped entries, overrides, unknown names, costs, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.catalog import load_catalog
from bot.domain import Usage
from bot.errors import ConfigError


def test_shipped_catalog_has_both_providers_and_valid_tiers() -> None:
    catalog = load_catalog()
    providers = {m.provider for m in catalog.models}
    assert providers == {"openai", "anthropic"}
    assert "local" in catalog
    for provider in ("openai", "anthropic"):
        for tier in ("fast", "balanced", "smart"):
            assert catalog.for_tier(tier, provider, "none") in catalog  # type: ignore[arg-type]


def test_unknown_model_is_a_local_openai_compatible_one() -> None:
    info = load_catalog().get("llama3.1:8b")
    assert info.id == "llama3.1:8b" and info.provider == "openai" and info.input_price == 0


def test_cost_uses_cached_price() -> None:
    info = load_catalog().get("gpt-4.1-mini")
    assert info.cost(Usage(input_tokens=1_000_000, output_tokens=1_000_000)) == pytest.approx(2.0)
    assert info.cost(Usage(input_tokens=1_000_000, cached_tokens=1_000_000)) == pytest.approx(0.1)


def test_operator_file_overrides_and_extends(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    entry = {"id": "tiny", "provider": "openai", "max_input_tokens": 2000, "max_output_tokens": 500}
    path.write_text(json.dumps({"models": [entry], "tiers": {"openai": {"fast": "tiny"}}}))
    catalog = load_catalog(path)
    assert catalog.get("tiny").max_input_tokens == 2000
    assert catalog.for_tier("fast", "openai", "x") == "tiny"
    assert "gpt-4.1" in catalog


@pytest.mark.parametrize(
    "content,message",
    [
        ("{nope", "not valid JSON"),
        (
            json.dumps(
                {
                    "models": [
                        {"id": "x", "provider": "openai", "max_input_tokens": -1, "max_output_tokens": 1}
                    ]
                }
            ),
            "max_input_tokens",
        ),
        (json.dumps({"models": [], "tiers": {"openai": {"fast": "ghost"}}}), "unknown model 'ghost'"),
        # (pydantic's words named a private class: "a valid dictionary or instance of _CatalogFile")
        ("[1, 2]", 'it holds a JSON list, not an object; write it like {"version": 1'),
    ],
)
def test_bad_files_fail_with_the_reason(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "models.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_catalog(path)
