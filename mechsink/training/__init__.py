"""Training lab: small organisms trained on CPU, deterministically and resumably.

- :mod:`mechsink.training.loop`: recipes and the training loop (checkpoints at 0, 1, 2, 4, ...).
- structure at random initialisation and the SeedPrint test moved to
  :mod:`mechsink.measure.seedprint` (``mechsink.training.seedprint`` still imports it).
"""

from mechsink.training.loop import (
    HWRMS_SUFFIX,
    RECIPES,
    Recipe,
    checkpoint_steps,
    get_recipe,
    lr_at,
    task_of,
    train,
    train_step,
)

__all__ = ["HWRMS_SUFFIX", "RECIPES", "Recipe", "checkpoint_steps", "get_recipe", "lr_at",
           "task_of", "train", "train_step"]
