"""What ``mechsink models`` lists: every zoo name with its architecture, size and cache state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mechsink.model.zoo.cache import conversion_problem, converted_dir
from mechsink.model.zoo.entries import NAMED_MODELS
from mechsink.model.zoo.random_init import FAMILIES, random_config
from mechsink.model.zoo.stale import leftovers


def list_models(*, verify: bool = False) -> list[dict[str, Any]]:
    """One row per zoo name: name, description, architecture, parameter count, cached,
    ``problem`` (why a converted folder that is there does not count as cached, else None) and
    ``stale`` (what killed conversions of it left behind: ``{"path", "bytes"}`` each, removed on
    its next load). ``verify=True`` hashes every converted file in full instead of the cheap
    check."""
    rows = []
    for entry in NAMED_MODELS.values():
        folder = converted_dir(entry.name)
        problem = conversion_problem(folder, full=verify) if folder.exists() else None
        cached = folder.exists() and problem is None
        arch, n_params = ("?", None)
        if cached:
            arch, n_params = _describe_config(folder / "config.json")
        rows.append(dict(name=entry.name, description=entry.description, architecture=arch,
                         n_params=n_params, cached=cached, problem=problem,
                         stale=[left.to_dict() for left in leftovers(entry.name)]))
    for family, spec in FAMILIES.items():
        for size in spec.sizes:
            config = random_config(f"{family}-{size}")
            rows.append(dict(name=f"random:{family}-{size}",
                             description=f"random init ({family}, {size}); seed picks weights",
                             architecture=_arch_name(config), n_params=_count_params(config),
                             cached=True, problem=None, stale=[]))
    return rows


def _describe_config(path: Path) -> tuple[str, int]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path.parent))
    return _arch_name(config), _count_params(config)


def _arch_name(config: Any) -> str:
    archs = getattr(config, "architectures", None)
    return archs[0] if archs else f"{config.model_type} (causal LM)"


def _count_params(config: Any) -> int:
    """Parameter count from a config alone (the model is built on the meta device, no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())

