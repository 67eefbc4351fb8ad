"""The memory package exports exactly its public surface."""

import bot.memory


def test_all_matches_public_names() -> None:
    for name in bot.memory.__all__:  # the read path's names load at their first use (see the package doc)
        getattr(bot.memory, name)
    public = {n for n in vars(bot.memory) if not n.startswith("_") and n[0].isupper()}
    # Besides its types: the embedder factory, the prompt's assembly and the operator's functions.
    assert set(bot.memory.__all__) == public | {"build_embedder", "operator", "system_prompt"}
