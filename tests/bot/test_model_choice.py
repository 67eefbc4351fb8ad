"""Which models the settings pick: provider, primary entry, the shared window, the summary model."""

from __future__ import annotations

from bot import model_choice
from bot.catalog import load_catalog
from bot.config import LLMSettings, ProviderSettings

CATALOG = load_catalog()


def test_the_provider_is_the_setting_else_the_catalogs() -> None:
    assert model_choice.provider(LLMSettings(model="claude-haiku-4-5"), CATALOG) == "anthropic"
    assert model_choice.provider(LLMSettings(model="llama3", provider="anthropic"), CATALOG) == "anthropic"
    # An id the catalog does not know is served under the provider set for it.
    assert (
        model_choice.primary(LLMSettings(model="llama3", provider="anthropic"), CATALOG).provider
        == "anthropic"
    )


def test_the_window_is_the_smallest_of_the_model_and_its_fallbacks() -> None:
    llm = LLMSettings(model="gpt-4.1", fallback_models=["gpt-4o-mini"])
    assert model_choice.window(llm, CATALOG) == CATALOG.get("gpt-4o-mini").max_input_tokens
    assert (
        model_choice.window(LLMSettings(model="gpt-4.1"), CATALOG) == CATALOG.get("gpt-4.1").max_input_tokens
    )


def test_compaction_summarizes_with_the_balanced_tier_except_on_a_server_of_ones_own() -> None:
    assert model_choice.summary_model(LLMSettings(model="gpt-4.1"), CATALOG) == "gpt-4.1-mini"
    assert model_choice.summary_model(LLMSettings(model="claude-haiku-4-5"), CATALOG) == "claude-sonnet-4-5"
    own = LLMSettings(model="llama3", openai=ProviderSettings(base_url="http://127.0.0.1:11434/v1"))
    assert model_choice.summary_model(own, CATALOG) == "llama3"
