"""Which models the settings pick, and the window they must share: decisions, kept out of the wiring.

``llm.model`` is answered by ``llm.provider`` when set, else by the provider the catalog (models.json)
gives it. Compaction summarizes with that provider's "balanced" model, except on a server of one's own.
A turn may fill only the smallest window of ``llm.model`` and ``llm.fallback_models``, since failover
sends the same request to each. The composition root (bot/app.py) asks these questions and hands the
answers to the parts it builds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.catalog import ModelCatalog, ModelInfo, Provider

if TYPE_CHECKING:
    from bot.config import LLMSettings


def provider(llm: LLMSettings, catalog: ModelCatalog) -> Provider:
    return llm.provider or catalog.get(llm.model).provider


def provider_of(llm: LLMSettings, catalog: ModelCatalog, model: str) -> Provider:
    """The provider that answers ``model``, the primary or a fallback: ``llm.provider`` for the primary
    when set, else the catalog's; a model the catalog does not know speaks ``llm.provider``, else OpenAI."""
    if model == llm.model and llm.provider:
        return llm.provider
    if model in catalog:
        return catalog.get(model).provider
    return llm.provider or "openai"


def primary(llm: LLMSettings, catalog: ModelCatalog) -> ModelInfo:
    """The catalog's entry for ``llm.model`` (an id it does not know: the generic one, under the provider)."""
    return catalog.get(llm.model, provider(llm, catalog))


def window(llm: LLMSettings, catalog: ModelCatalog) -> int:
    """The model's window; a failover model must fit the same requests: the smallest of them all."""
    fallbacks = (catalog.get(m).max_input_tokens for m in llm.fallback_models)
    return min([primary(llm, catalog).max_input_tokens, *fallbacks])


def summary_model(llm: LLMSettings, catalog: ModelCatalog) -> str:
    """The model compaction summarizes with."""
    chosen = provider(llm, catalog)
    # A server of one's own (base_url set) has the primary model, not the catalog's tier models.
    own_server = (llm.anthropic if chosen == "anthropic" else llm.openai).base_url
    return llm.model if own_server else catalog.for_tier("balanced", chosen, default=llm.model)
