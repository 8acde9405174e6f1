"""Checks of prompts given as text, shared by the jobs that take them (patch, discover)."""

from __future__ import annotations

from typing import Any

from mechsink.errors import MechsinkError


def check_same_lengths(tok: Any, texts: dict[str, Any], *, early: bool = False) -> None:
    """Every prompt given (``--clean``, ``--corrupted``) tokenises to the same number of
    tokens: they run as one batch and are compared position by position. ``early`` (before
    the model loads): a prompt the tokenizer refuses is left to the check after loading, so
    the model's own refusal (an unsupported architecture) comes first."""
    from mechsink.model.tokens import encode

    try:
        lengths = [(flag if len(given) == 1 else f"{flag} {i}", len(encode(tok, t)))
                   for flag, given in texts.items() if given for i, t in enumerate(given, 1)]
    except MechsinkError:
        if early:
            return
        raise
    if len({n for _, n in lengths}) > 1:
        shown = ", ".join(f"{label}: {n}" for label, n in lengths)
        raise MechsinkError(f"the prompts tokenise to different lengths ({shown} tokens): give "
                            f"{' and '.join(f for f, g in texts.items() if g)} prompts of the same "
                            "number of tokens (they run as one batch, compared position by "
                            "position).")
