"""The `mechsink` command line: one typer app, one small function per command."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from mechsink.errors import MechsinkError

app = typer.Typer(
    help="mechsink: measure, trace and intervene on attention sinks (built on TransformerLens).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()


def fail(exc: MechsinkError) -> None:
    """Print a mechsink error as one readable message and exit with status 2."""
    Console(stderr=True).print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


@app.command()
def models() -> None:
    """List the zoo: names, architecture, parameter count and whether the weights are cached."""
    from mechsink.zoo import PATTERN_HELP, list_models

    table = Table(title="mechsink model zoo")
    for col in ("name", "architecture", "parameters", "cached", "what it is"):
        table.add_column(col)
    for row in list_models():
        n = row["n_params"]
        table.add_row(row["name"], row["architecture"], f"{n / 1e6:.1f}M" if n else "?",
                      "yes" if row["cached"] else "no", row["description"])
    for pattern, what in PATTERN_HELP:
        table.add_row(pattern, "", "", "", what)
    console.print(table)


@app.command()
def info(
    model: str = typer.Argument(..., help="zoo name, e.g. smollm2-135m or random:gpt2-tiny"),
    prompt: str = typer.Option("The capital of France is", help="prompt to continue greedily"),
    tokens: int = typer.Option(16, min=0, help="number of tokens to generate"),
    prepend_bos: bool = typer.Option(True, help="put the tokenizer's BOS token at position 0"),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
    dtype: str | None = typer.Option(None, help="float32 (default), float16 or bfloat16"),
    seed: int | None = typer.Option(None, help="seed for random:... models"),
) -> None:
    """Load a model, print its architecture summary and a greedy continuation of a prompt."""
    from mechsink.bridge import architecture_summary, to_tokens
    from mechsink.generate import greedy_continue
    from mechsink.zoo import load_model

    try:
        with console.status(f"loading {model}"):
            bridge = load_model(model, device=device, dtype=dtype, seed=seed)
        ids = to_tokens(bridge, prompt, prepend_bos=prepend_bos)
    except MechsinkError as exc:
        fail(exc)
    table = Table(title=f"{model}: architecture", show_header=False)
    for key, value in architecture_summary(bridge).items():
        table.add_row(key, str(value))
    console.print(table)
    out = greedy_continue(bridge, ids, tokens)
    tok = bridge.tokenizer
    console.print(f"[bold]prompt[/] ({'with' if prepend_bos else 'without'} BOS): {prompt!r}")
    console.print(f"[bold]greedy continuation[/]: {tok.decode(out[0, ids.shape[1]:])!r}")


def main() -> None:  # pragma: no cover - console-script convenience
    app()
