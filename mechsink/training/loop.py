"""Organism training: small GPT-2- and Llama-style models trained on CPU, saved as organisms.

The loop is deliberately plain (nanoGPT-style): batch, forward, cross-entropy, backward, clip,
AdamW step, with linear warm-up then cosine decay. A run is deterministic for its seed: batches
are functions of (seed, step) and there is no dropout, so ``resume=True`` after a kill continues
exactly where the last checkpoint left off. Checkpoints are written at log-spaced steps as
organism folders ``OUT/step-N`` (load them with ``organism:OUT/step-N``), each beside its
optimizer state; ``OUT/run.json`` records the recipe, the seed, the losses and the checkpoints.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mechsink.errors import BadInputError
from mechsink.inputs.tasks import BigramBackcopy, TextStream
from mechsink.io import (
    LOCK_FILE,
    atomic_write_bytes,
    atomic_write_text,
    check_writable,
    folder_lock,
    full_disk_is_one_line,
    json_text,
)
from mechsink.model.variants import (
    ATTENTION_VARIANTS,
    apply_attention_variant,
    apply_headwise_rmsnorm,
)
from mechsink.model.zoo import load_weights, organism_recipe, save_organism, seeded_model
from mechsink.settings import check_seed

RUN_FORMAT = "mechsink-run/1"
__all__ = ["RECIPES", "Recipe", "get_recipe", "train", "train_step", "checkpoint_steps",
           "lr_at", "task_of", "scale_attention_output_init", "wo_suffix"]


@dataclass(frozen=True)
class Recipe:
    """Everything that defines a training run except its seed and length."""

    name: str
    family: str  # "gpt2" (learned positions, LayerNorm, GELU, biases) or "llama" (RoPE, RMSNorm)
    n_layers: int
    d_model: int
    n_heads: int
    data: str  # "bigram-backcopy" or "text"
    seq_len: int = 64
    batch_size: int = 32
    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.0
    d_mlp: int | None = None  # default 4 * d_model (gpt2) or 8/3 * d_model (llama)
    headwise_rmsnorm: bool = False  # the structural-origin paper's fix (mechsink.model.variants)
    attention: str = "softmax"  # or one of mechsink.model.variants.ATTENTION_VARIANTS (llama only)
    init_attn_out_scale: float = 1.0  # W_O's init times this (scale_attention_output_init)

    def task(self) -> BigramBackcopy | TextStream:
        return BigramBackcopy() if self.data == "bigram-backcopy" else TextStream()

    def config(self) -> Any:
        """The transformers config of this recipe's model (no dropout: runs are deterministic)."""
        from transformers import GPT2Config, LlamaConfig

        task = self.task()
        if self.family == "gpt2":
            return GPT2Config(
                n_layer=self.n_layers, n_embd=self.d_model, n_head=self.n_heads,
                n_inner=self.d_mlp, n_positions=max(self.seq_len, 64),
                vocab_size=task.vocab_size, bos_token_id=task.bos, eos_token_id=task.bos,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            )
        d_mlp = self.d_mlp or int(8 * self.d_model / 3)
        return LlamaConfig(
            num_hidden_layers=self.n_layers, hidden_size=self.d_model,
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_heads,
            intermediate_size=d_mlp, max_position_embeddings=max(self.seq_len, 64),
            vocab_size=task.vocab_size, bos_token_id=task.bos, eos_token_id=task.bos,
            tie_word_embeddings=False,
        )


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        # The sink-forming recipe: layer-0 heads reach sink scores 0.3-0.7 by step 6000.
        Recipe("bb-gpt2-tiny", "gpt2", n_layers=2, d_model=64, n_heads=4, data="bigram-backcopy",
               steps=6000),
        # Slower to sink: largest sink score 0.14-0.31 at step 6000 (seeds 0-2), 0.07 at 400.
        Recipe("bb-llama-tiny", "llama", n_layers=2, d_model=64, n_heads=4,
               data="bigram-backcopy"),
        # Small enough for side-by-side variant comparisons on CPU (the output head dominates).
        Recipe("text-llama-tiny", "llama", n_layers=2, d_model=64, n_heads=4, data="text",
               seq_len=32, batch_size=4, steps=300, lr=1e-3, warmup=10),
        Recipe("text-gpt2-mini", "gpt2", n_layers=4, d_model=128, n_heads=4, data="text",
               seq_len=64, batch_size=16, steps=2000, lr=1e-3, warmup=100),
        Recipe("text-llama-mini", "llama", n_layers=4, d_model=128, n_heads=4, data="text",
               seq_len=64, batch_size=16, steps=2000, lr=1e-3, warmup=100),
    ]
}


HWRMS_SUFFIX = "+hwrms"
WO_OPTION = re.compile(r"wo(\d+(?:\.\d+)?)")  # +wo0, +wo4, +wo0.5: W_O's init scale


def wo_suffix(scale: float) -> str:
    """The recipe-name option that scales W_O's init by ``scale`` (``+wo4``; ``""`` for 1)."""
    return "" if scale == 1 else f"+wo{scale:g}"


def scale_attention_output_init(model: torch.nn.Module, scale: float) -> int:
    """Multiply every attention output projection (W_O and its bias: GPT-2's ``attn.c_proj``,
    Llama's ``self_attn.o_proj``) by ``scale``; returns how many were scaled.

    Why W_O: at initialisation attention is near uniform over the prefix, so position 0 writes
    its own value while a later position writes an average of values that contracts towards the
    sequence's mean. That write is what makes position 0 stand apart in the intra-sequence
    contraction (Li, Tong, Wang et al. 2026, "SeedPrint"); scaling W_O scales it and nothing else
    in the step-0 forward: 0 removes it (no intra-sequence aggregation reaches the residual
    stream), above 1 amplifies it. Training then starts from there with the same seed and data.
    """
    if not scale >= 0:
        raise BadInputError(f"the W_O init scale must be 0 or more, got {scale}.")
    found = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(("attn.c_proj", "self_attn.o_proj")):
                for p in module.parameters(recurse=False):
                    p.mul_(scale)
                found += 1
    if found == 0:
        raise BadInputError(f"{type(model).__name__} has no attention output projection "
                            "(attn.c_proj / self_attn.o_proj) to scale: use a gpt2 or llama "
                            "recipe.")
    return found


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``, or a clear error. ``NAME+hwrms`` adds head-wise RMSNorm;
    ``NAME+VARIANT`` (a llama recipe) swaps the softmax over keys for one of
    mechsink.model.variants.ATTENTION_VARIANTS, e.g. ``bb-llama-tiny+softpick``;
    ``NAME+woS`` initialises W_O at S times its scale (:func:`scale_attention_output_init`)."""
    base, *options = name.split("+")
    if base not in RECIPES:
        raise BadInputError(
            f"unknown recipe {name!r}: choose one of {', '.join(RECIPES)} "
            f"(append {HWRMS_SUFFIX} for head-wise RMSNorm, or +VARIANT with VARIANT one of "
            f"{', '.join(ATTENTION_VARIANTS)} on a llama recipe)."
        )
    recipe = RECIPES[base]
    if not options:
        return recipe
    changes: dict[str, Any] = {"name": name}
    for option in options:
        if "+" + option == HWRMS_SUFFIX:
            changes["headwise_rmsnorm"] = True
        elif WO_OPTION.fullmatch(option) and "init_attn_out_scale" not in changes:
            changes["init_attn_out_scale"] = float(option[2:])
        elif option in ATTENTION_VARIANTS and "attention" not in changes:
            if recipe.family != "llama":
                raise BadInputError(f"attention variant {option!r} needs a llama recipe, not "
                                    f"{base!r} ({recipe.family}).")
            changes["attention"] = option
        else:
            raise BadInputError(f"unknown recipe option +{option} in {name!r}: use +hwrms, "
                                f"+wo<scale> (W_O's init scale, once) or one of "
                                f"+{', +'.join(ATTENTION_VARIANTS)} (one variant).")
    if changes.get("headwise_rmsnorm") and "attention" in changes:
        raise BadInputError(f"{name!r}: head-wise RMSNorm and an attention variant do not "
                            "combine yet; choose one.")
    return dataclasses.replace(recipe, **changes)


def checkpoint_steps(total: int) -> list[int]:
    """Log-spaced checkpoint steps: 0 (the initialisation), 1, 2, 4, ..., and the last step."""
    steps = {0, total}
    k = 1
    while k < total:
        steps.add(k)
        k *= 2
    return sorted(steps)


def lr_at(recipe: Recipe, step: int, total: int) -> float:
    """Linear warm-up to ``recipe.lr``, then cosine decay to a tenth of it."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, total - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(
    recipe: Recipe | str,
    out: str | Path,
    *,
    steps: int | None = None,
    seed: int = 0,
    data_seed: int | None = None,
    resume: bool = False,
    progress: bool = True,
) -> Path:
    """Train ``recipe`` from ``seed`` for ``steps`` steps into folder ``out``; returns ``out``.

    ``seed`` fixes the initialisation; ``data_seed`` (default: ``seed``) the batches, so twins
    can share an initialisation and see different data, or the reverse. ``out`` must be new,
    or (with ``resume=True``) hold a run of the same recipe, seeds and length, which then
    continues from its last checkpoint.
    """
    data_seed = seed if data_seed is None else data_seed
    check_seed(seed, "seed (--seed)")  # before anything is written: numpy's seeds are 32-bit
    check_seed(data_seed, "data_seed")
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    total = recipe.steps if steps is None else steps
    if total <= 0:
        raise BadInputError(f"steps must be positive, got {total}.")
    if str(out).strip() == "":
        raise BadInputError("out is empty: give the run folder.")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInputError(f"{out} is a file: give a folder for the run.")
    if resume and not (out / "run.json").is_file() and not _killed_first_checkpoint(out):
        raise BadInputError(f"nothing to resume in {out}: it holds no run.json. Leave out "
                            "resume (--resume) to start a new run there.")
    check_writable(out, option="the run folder")
    with folder_lock(out), full_disk_is_one_line(
            out, kept="the checkpoints already written stand: free space, then resume (--resume)"):
        _train_locked(recipe, out, total, seed, data_seed, resume, steps is None, progress)
    return out


def _killed_first_checkpoint(out: Path) -> bool:
    """``out`` holds no run.json and only what a run killed while writing its first checkpoint
    leaves (``step-N/``, ``step-N.optimizer.pt``, temporary names, the lock): a fresh start."""
    if not out.is_dir() or (out / "run.json").exists():
        return False
    names = [p for p in out.iterdir() if p.name != LOCK_FILE and not _is_leftover(p)]
    return bool(names) and all(re.fullmatch(r"step-\d+(\.optimizer\.pt)?", p.name)
                               for p in names)


def _train_locked(recipe: Recipe, out: Path, total: int, seed: int, data_seed: int,
                  resume: bool, default_steps: bool, progress: bool) -> None:
    """The training loop proper, run while this process holds ``out``'s folder lock."""
    run = _open_run(out, recipe, seed, data_seed, total, resume, default_steps)
    task = recipe.task()
    model = seeded_model(recipe.config(), seed, attn_implementation="sdpa")
    if recipe.headwise_rmsnorm:
        apply_headwise_rmsnorm(model)
    if recipe.attention != "softmax":
        apply_attention_variant(model, recipe.attention)
    if recipe.init_attn_out_scale != 1:
        scale_attention_output_init(model, recipe.init_attn_out_scale)
    optimizer = torch.optim.AdamW(param_groups(model, recipe.weight_decay), lr=recipe.lr,
                                  betas=(0.9, 0.95))
    start = _restore(run, out, model, optimizer)
    tokenizer = task.tokenizer()
    schedule = set(checkpoint_steps(total))
    if start == 0 and 0 in schedule and not run["checkpoints"]:
        _checkpoint(out, run, 0, model, optimizer, tokenizer)
    model.train()
    bar = _progress(progress)
    clock = time.perf_counter()
    with bar:
        job = bar.add_task(recipe.name, total=total, completed=start, loss=float("nan"))
        for step in range(start, total):
            tokens = task.batch(data_seed, step, recipe.batch_size, recipe.seq_len)
            loss = train_step(model, optimizer, tokens, lr_at(recipe, step, total))
            run["losses"].append(loss)
            bar.update(job, advance=1, loss=loss)
            if step + 1 in schedule:
                run["seconds"] += time.perf_counter() - clock
                _checkpoint(out, run, step + 1, model, optimizer, tokenizer)
                clock = time.perf_counter()


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: weight decay on the matrices of matrix multiplications only.

    The rule: a parameter decays when it has two or more dimensions and is not an embedding
    table's; biases, norm gains (all 1-D) and token/position embeddings (``nn.Embedding``
    weights, also when tied to the output head) do not. This is the split of nanoGPT's
    ``configure_optimizers`` (Karpathy, 2022), except that nanoGPT also decays its embeddings.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, keep = [], []
    for p in model.parameters():  # each tied parameter once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and id(p) not in embeddings else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": keep, "weight_decay": 0.0}]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               tokens: torch.Tensor, lr: float) -> float:
    """One step of next-token prediction; returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    logits = model(tokens).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


# --- run folder ----------------------------------------------------------------------------


def _open_run(
    out: Path, recipe: Recipe, seed: int, data_seed: int, total: int, resume: bool,
    default_steps: bool = False,
) -> dict:
    """Check the output folder and return the run record (new, or the one being resumed).

    Temporary files a kill left behind (``.run.json.*.part``, ``.step-N.*.part/``, ...) are
    removed first: this process holds the folder's lock, so no other writer owns them.
    """
    _remove_leftovers(out)
    record = out / "run.json"
    wanted = {"recipe": dataclasses.asdict(recipe), "seed": seed, "data_seed": data_seed,
              "steps": total}
    if record.is_file():
        run = json.loads(record.read_text())
        run["recipe"].setdefault("attention", "softmax")  # runs from before the variants
        run["recipe"].setdefault("init_attn_out_scale", 1.0)  # ... and before the W_O scale
        held = {k: run.get(k) for k in wanted}
        if resume and default_steps and held != wanted and held | {"steps": total} == wanted:
            raise BadInputError(
                f"the run in {out} is {run['steps']} steps long and no steps were given "
                f"(the recipe's default is {total}): pass --steps {run['steps']} (steps=) to "
                "resume it."
            )
        if held != wanted:
            raise BadInputError(
                f"{out} holds a different run (recipe {run['recipe']['name']}, seed {run['seed']}, "
                f"{run['steps']} steps): choose a new folder."
            )
        if not resume and run["checkpoints"]:
            raise BadInputError(f"{out} already holds this run: pass resume=True (--resume).")
        return run  # (a run with no checkpoint yet, killed during its first: resumed from 0)
    if _killed_first_checkpoint(out):  # killed during its first checkpoint: start afresh
        for path in out.iterdir():
            if path.name.startswith("step-"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    if any(p.name != LOCK_FILE for p in out.iterdir()):
        raise BadInputError(f"{out} is not empty and holds no mechsink run: choose a new folder.")
    run = {"format": RUN_FORMAT, **wanted, "losses": [], "checkpoints": [], "seconds": 0.0}
    # written before the first checkpoint, so a kill during it leaves a run to resume
    atomic_write_text(out / "run.json", _run_json(run))
    return run


def _run_json(run: dict) -> str:
    """run.json's text: strict JSON (a non-finite loss is null with a reason beside it)."""
    return json_text(run, indent=1)


def _is_leftover(path: Path) -> bool:
    """A temporary name of mechsink.io's atomic writes (``.NAME.XXXX.part`` / ``.old``)."""
    return path.name.startswith(".") and path.name.endswith((".part", ".old"))


def _remove_leftovers(out: Path) -> None:
    for path in out.iterdir():
        if _is_leftover(path):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _restore(run: dict, out: Path, model: torch.nn.Module, optimizer) -> int:
    """Load the last checkpoint's weights and optimizer state; return the step to continue at."""
    if not run["checkpoints"]:
        run["losses"] = []
        return 0
    step = run["checkpoints"][-1]
    load_weights(model, out / f"step-{step}")
    optimizer.load_state_dict(torch.load(out / f"step-{step}.optimizer.pt", weights_only=True))
    run["losses"] = run["losses"][:step]
    return step


def _checkpoint(out: Path, run: dict, step: int, model, optimizer, tokenizer) -> None:
    """Write ``step-N`` (organism), its optimizer state, then update run.json (all atomic).

    A ``step-N`` folder that run.json does not list is left over from a killed run: replaced.
    """
    folder = out / f"step-{step}"
    if folder.exists():
        shutil.rmtree(folder)
    meta = {"recipe": run["recipe"]["name"], "seed": run["seed"],
            "data_seed": run["data_seed"], "step": step,
            "loss": run["losses"][-1] if run["losses"] else None}
    save_organism(model, folder, tokenizer=tokenizer, metadata=meta)
    buf = io.BytesIO()
    torch.save(optimizer.state_dict(), buf)
    atomic_write_bytes(out / f"step-{step}.optimizer.pt", buf.getvalue())
    run["checkpoints"].append(step)
    atomic_write_text(out / "run.json", _run_json(run))


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), disable=not enabled,
    )


def task_of(model_name: str) -> BigramBackcopy | None:
    """The synthetic task of an ``organism:...`` model, from the recipe its ``mechsink.json``
    names (None for text organisms, unknown recipes and other models). It lives with the
    recipes: the zoo reads the marker, the trainer knows what a recipe trains on."""
    name = organism_recipe(model_name) or ""
    recipe = RECIPES.get(name.split("+")[0])
    return BigramBackcopy() if recipe is not None and recipe.data == "bigram-backcopy" else None
