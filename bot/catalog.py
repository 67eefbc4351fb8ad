"""The model catalog (models.json): what each model can do, how big its window is, what it costs.

The packaged file ships with membot; ``models_file`` in the settings points at an operator's own file
whose entries override or extend it. Unknown model names (a local Ollama tag, say) get the generic
``local`` entry under their own name, so any OpenAI-compatible server works without editing the file.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from bot.config_files import read_text_file
from bot.domain import Usage
from bot.errors import ConfigError

Provider = Literal["openai", "anthropic"]
Tier = Literal["fast", "balanced", "smart"]


class ModelInfo(BaseModel):
    id: str
    provider: Provider
    display_name: str = ""
    max_input_tokens: int = Field(gt=0)
    max_output_tokens: int = Field(gt=0)
    supports_tools: bool = True
    supports_vision: bool = False
    supports_temperature: bool = True
    input_price: float = Field(default=0.0, ge=0)  # USD per million tokens
    output_price: float = Field(default=0.0, ge=0)
    cached_input_price: float | None = Field(default=None, ge=0)

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_price = self.cached_input_price if self.cached_input_price is not None else self.input_price
        return (
            (usage.input_tokens - cached) * self.input_price
            + cached * cached_price
            + usage.output_tokens * self.output_price
        ) / 1_000_000


class _CatalogFile(BaseModel):
    version: int = 1
    models: list[ModelInfo]
    tiers: dict[str, dict[Tier, str]] = Field(default_factory=dict)


class ModelCatalog:
    """Look-ups over the validated catalog."""

    def __init__(self, models: list[ModelInfo], tiers: dict[str, dict[Tier, str]]) -> None:
        self._models = {m.id: m for m in models}
        self._tiers = tiers
        for provider, mapping in tiers.items():
            for tier, model_id in mapping.items():
                if model_id not in self._models:
                    raise ConfigError(f"models.json: tier {provider}.{tier} names unknown model {model_id!r}")

    @property
    def models(self) -> list[ModelInfo]:
        return list(self._models.values())

    @property
    def tiers(self) -> dict[str, dict[Tier, str]]:
        return self._tiers

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._models

    def get(self, model_id: str, provider: Provider | None = None) -> ModelInfo:
        """The entry for ``model_id``; unknown ids get the generic local entry under their own name."""
        if model_id in self._models:
            return self._models[model_id]
        generic = self._models.get("local") or ModelInfo(
            id="local", provider="openai", max_input_tokens=8192, max_output_tokens=2048
        )
        return generic.model_copy(update={"id": model_id, "provider": provider or generic.provider})

    def for_tier(self, tier: Tier, provider: str, default: str) -> str:
        """The model id of ``tier`` for ``provider``; ``default`` when the catalog has none."""
        return self._tiers.get(provider, {}).get(tier, default)

    def tier_of(self, model_id: str) -> str | None:
        for mapping in self._tiers.values():
            for tier, mid in mapping.items():
                if mid == model_id:
                    return tier
        return None


def _read(text: str, origin: str) -> _CatalogFile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):  # (pydantic says "a valid dictionary or instance of _CatalogFile")
        raise ConfigError(
            f"{origin} is not a valid model catalog: it holds a JSON {type(data).__name__}, not an object; "
            'write it like {"version": 1, "models": [...]} (the packaged bot/models.json shows every field)'
        )
    try:
        return _CatalogFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise ConfigError(f"{origin} is not a valid model catalog: {problems}") from None


def load_catalog(override: Path | None = None) -> ModelCatalog:
    """The packaged catalog, with an operator's file (if any) merged over it by model id."""
    packaged = resources.files("bot").joinpath("models.json").read_text(encoding="utf-8")
    base = _read(packaged, "the packaged models.json")
    models = {m.id: m for m in base.models}
    tiers = {p: dict(t) for p, t in base.tiers.items()}
    if override is not None:
        try:
            text = read_text_file(override, "models_file")  # (a ConfigError when it is not UTF-8)
        except OSError as exc:
            raise ConfigError(f"cannot read models_file {override}: {exc.strerror}") from None
        extra = _read(text, str(override))
        models.update({m.id: m for m in extra.models})
        for provider, mapping in extra.tiers.items():
            tiers.setdefault(provider, {}).update(mapping)
    return ModelCatalog(list(models.values()), tiers)
