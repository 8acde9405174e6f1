"""The `mechsink` command line: one typer app, one small function per command."""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

import mechsink.model as mechsink_model  # a lazy package: its names import on first use
from mechsink import settings
from mechsink.errors import MechsinkError
from mechsink.jobs import census as census_job
from mechsink.jobs import discover as discover_job
from mechsink.jobs import experiment as experiment_job
from mechsink.jobs import patch as patch_job
from mechsink.jobs import train as train_job
from mechsink.jobs.spec import cli_name, default, help_of


def flowing(doc: str | None) -> str | None:
    """A docstring as help text: each paragraph on one line (paragraphs stay apart). typer keeps
    a docstring's single line breaks in the command list and in later paragraphs, which printed
    fragments such as ``--verify`` on a line of their own; one line per paragraph lets rich wrap
    it to the terminal."""
    if doc is None:
        return None
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


class _App(typer.Typer):
    """The command line's Typer: a command without ``help=`` gets :func:`flowing` of its
    docstring, so no command's help breaks where its source lines do."""

    def command(self, name: str | None = None, **options: typing.Any
                ) -> Callable[[Callable[..., typing.Any]], Callable[..., typing.Any]]:
        def register(f: Callable[..., typing.Any]) -> Callable[..., typing.Any]:
            text = options.get("help")
            return super(_App, self).command(
                name, **{**options, "help": flowing(f.__doc__) if text is None else text})(f)

        return register


app = _App(
    help="mechsink: measure, trace and intervene on attention sinks (built on TransformerLens).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    """A warning as the command line shows it: one line, its kind, no line of source code."""
    text = " ".join(str(message).split())
    return f"warning: {text} ({category.__name__})\n"


@app.callback()
def _main() -> None:
    """Show warnings in one line each, without the source line Python prints under them."""
    import warnings

    warnings.formatwarning = _one_line_warning  # type: ignore[assignment]


def fail(exc: MechsinkError) -> None:
    """Print a mechsink error as one readable message and exit with status 2 (an ``--out``
    folder the command created and left empty is removed)."""
    from rich.markup import escape

    from mechsink.io import remove_unused_folders

    remove_unused_folders()
    # the message as written: "[patch] layers" is text here, not a rich style tag
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}")
    raise typer.Exit(2)


# --- checks that run before any model loads ---------------------------------------------------


def _check_generation(model: str, prompt_len: int, tokens: int, n_ctx: int | None) -> None:
    """The prompt and ``tokens`` generated after it fit the model's context."""
    if n_ctx is not None and prompt_len + tokens > n_ctx:
        raise MechsinkError(
            f"--tokens {tokens} after the prompt's {prompt_len} tokens makes {prompt_len + tokens}"
            f", more than the model's context ({model}: {n_ctx} tokens): give --tokens "
            f"{max(n_ctx - prompt_len, 0)} or fewer, or a shorter --prompt.")


def _prompt_length(tok: typing.Any, prompt: str, prepend_bos: bool) -> int:
    from mechsink.model.tokens import encode

    bos = prepend_bos and getattr(tok, "bos_token_id", None) is not None
    return len(encode(tok, prompt)) + int(bos)


# the one validation of mechsink.settings, under the names the commands use
check_batch_size = settings.check_batch_size
check_context = settings.check_context
_check_device = settings.check_device


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s advisory lock (one writer per folder); a held lock is a clean error.
    A command that fails under the lock leaves no empty ``--out`` folder it made itself."""
    from mechsink.io import folder_lock, remove_unused_folders

    done = False
    try:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(folder_lock(folder))
            except MechsinkError as exc:
                fail(exc)
            yield
        done = True
    finally:
        if not done:  # the lock file is gone now: an untouched new folder is empty again
            remove_unused_folders()


@contextlib.contextmanager
def _result_set(folder: Path) -> Iterator[Path]:
    """Write a command's result files into a staging folder swapped into ``folder`` whole
    (:func:`mechsink.io.result_set`); a failure, a kill or a full disk leaves the previous
    result untouched, and a mechsink error (a full disk included) is one line."""
    from mechsink.io import result_set

    try:
        with result_set(folder) as staging:
            yield staging
    except MechsinkError as exc:  # raised in the block, or by the swap (a full disk)
        fail(exc)


def _final(staging: Path, folder: Path, paths: Iterable[Path]) -> list[Path]:
    """Where files written under ``staging`` lie once the result set is swapped in."""
    return [folder / Path(p).relative_to(staging) for p in paths]


def _measure_and_write(model: str, device: str | None, folder: Path, what: str,
                       measure: Callable[[typing.Any], dict[str, typing.Any]], name: str,
                       figure: Callable[[dict[str, typing.Any], Path], Path]
                       ) -> tuple[dict[str, typing.Any], list[Path]]:
    """Under ``folder``'s lock: load ``model``, ``measure`` it (its JSON-able result), and
    write ``NAME.json`` and ``NAME.png`` (``figure(data, path)``) as one result set; a mechsink
    error is one line. Returns the data and the files written."""
    from mechsink.io import atomic_write_json
    from mechsink.model.zoo import load_model

    with _locked(folder):
        try:
            with console.status(f"loading {model}"):
                bridge = load_model(model, device=device)
            with console.status(what):
                data = measure(bridge)
        except MechsinkError as exc:
            fail(exc)
        with _result_set(folder) as staging:
            written = [atomic_write_json(staging / f"{name}.json", data),
                       figure(data, staging / f"{name}.png")]
            written = _final(staging, folder, written)
    return data, written


@app.command()
def models(
    verify: bool = typer.Option(False, "--verify", help="hash every converted file in full "
                                "(exit status 1 when one is damaged)"),
) -> None:
    """List the zoo: names, architecture, parameter count and whether the weights are cached
    (a damaged conversion is not: it is rebuilt from its verified source on its next load),
    and the leftovers of killed conversions (removed on that model's next load). --verify
    says what each check compared the files with: their recorded sha256 (detects damage, not a
    deliberate rewrite) or the sha256 pinned in mechsink."""
    from mechsink.model.zoo import PATTERN_HELP, list_models

    table = Table(title="mechsink model zoo")
    for col in ("name", "architecture", "parameters", "cached", "what it is"):
        table.add_column(col)
    rows = list_models(verify=verify)
    for row in rows:
        n = row["n_params"]
        cached = ("yes" if row["cached"] else
                  f"damaged: {row['problem']} (rebuilt on next load)" if row["problem"] else "no")
        table.add_row(row["name"], row["architecture"], f"{n / 1e6:.1f}M" if n else "?",
                      cached, row["description"])
    for pattern, what in PATTERN_HELP:
        table.add_row(pattern, "", "", "", what)
    console.print(table)
    for row in rows:
        for left in row["stale"]:
            console.print(f"stale: {left['path']} ({left['bytes'] / 1e6:.0f} MB), left by a killed "
                          f"{row['name']} conversion; removed on its next load", markup=False)
    damaged = [r["name"] for r in rows if r["problem"]]
    if verify:
        console.print(f"damaged conversions: {', '.join(damaged)}" if damaged
                      else "every converted file matches its recorded sha256", markup=False)
        for r in rows:
            if r.get("proof"):
                console.print(f"{r['name']}: checked against {r['proof']}", markup=False)
        console.print("A recorded sha256 detects damage (a flipped byte, a cut copy); it does "
                      "not defend against someone who can write to the cache, who can rewrite "
                      "a file and its record. A file matching the sha256 pinned in mechsink "
                      "is the file the verified source decodes to.", markup=False)
        if damaged:
            raise typer.Exit(1)


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
    from mechsink.model import architecture_summary, to_tokens
    from mechsink.model.generate import greedy_continue
    from mechsink.model.tokens import context_length
    from mechsink.model.zoo import load_model
    from mechsink.model.zoo.load import context_of

    try:
        settings.check_text(prompt, "--prompt")
        _check_device(device)  # before the model loads
        tok = settings.model_tokenizer(model)  # the prompt's length, without the weights
        n_ctx = context_of(model)
        _check_generation(model, 0 if tok is None else _prompt_length(tok, prompt, prepend_bos),
                          tokens, n_ctx)
        with console.status(f"loading {model}"):
            bridge = load_model(model, device=device, dtype=dtype, seed=seed)
        ids = to_tokens(bridge, prompt, prepend_bos=prepend_bos)
        _check_generation(model, int(ids.shape[1]), tokens, context_length(bridge))
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


def _C(name: str) -> typing.Any:
    """A census option's default, from its spec (:mod:`mechsink.jobs.census`)."""
    return default(census_job.Spec, name)


def _CH(name: str) -> str:
    return help_of(census_job.Spec, name)


@app.command()
def scan(
    model: str = typer.Argument(..., help="zoo name, e.g. smollm2-135m or random:llama-tiny"),
    out: str = typer.Option(..., "--out", help="folder for census.json, figures, index.html"),
    suite: list[str] | None = typer.Option(
        None, "--suite", help="natural, random, repeated (repeat the option; default: all)"),
    variant: list[str] | None = typer.Option(
        None, "--variant", help="bos, nobos, randfirst (repeat the option; default: all)"),
    n: int = typer.Option(_C("n"), "--n", help=_CH("n")),
    seq_len: int = typer.Option(_C("seq_len"), "--seq-len", help=_CH("seq_len")),
    eps: float = typer.Option(_C("eps"), help=_CH("eps")),
    seed: int = typer.Option(_C("seed"), help=_CH("seed")),
    batch_size: int = typer.Option(_C("batch_size"), "--batch-size", help=_CH("batch_size")),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
    dtype: str | None = typer.Option(None, help="float32 (default), float16 or bfloat16"),
    report: bool = typer.Option(True, help="also write figures, attention.html and index.html"),
    validate_sets: bool = typer.Option(_C("validate_sets"), help=_CH("validate_sets")),
) -> None:
    """Sink census: sink scores and rates, massive activations, super neurons, norm ratios,
    value drain, key-bias cosine, dormant heads and variance discrepancy on every input suite;
    writes DIR/census.json (+ figures and an offline index.html) and prints a summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from mechsink.io import check_writable
    from mechsink.measure.census import check_census_args, check_out_dir, summary_rows
    from mechsink.model.zoo import load_model
    from mechsink.progress import mode as progress_mode
    from mechsink.progress import phase

    suites = list(suite or census_job.SUITES)
    variants = list(variant or census_job.VARIANTS)
    spec = census_job.Spec(suites=suites, variants=variants, n=n, seq_len=seq_len, seed=seed,
                           eps=eps, batch_size=batch_size, validate_sets=validate_sets)
    try:  # every check that needs no model, before loading one
        census_job.check(spec, [model], option=cli_name)
        _check_device(device)
        folder = check_out_dir(check_writable(out))
    except MechsinkError as exc:
        fail(exc)
    with _locked(folder):
        try:
            with console.status(f"loading {model}"), phase(f"loading {model}",
                                                           delay=STEP_LINE_AFTER):
                bridge = load_model(model, device=device, dtype=dtype,
                                    seed=seed if model.startswith("random:") else None)
            mechsink_model.check_supported(bridge, "census")
            check_census_args(bridge, suites, variants, n, seq_len, eps, batch_size)
        except MechsinkError as exc:
            fail(exc)
        runs = len(suites) * len(variants)
        in_log = progress_mode() == "log"
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("census", total=runs * n)
            finished: dict[str, int] = {}  # run name -> sequences done
            began = {"at": time.perf_counter()}

            def progress(name: str, done: int, total: int) -> None:
                finished[name] = done
                bar.update(task, description=f"census {name}", completed=sum(finished.values()))
                if in_log and done == total:  # off a terminal: a line per finished step
                    now = time.perf_counter()
                    if now - began["at"] >= STEP_LINE_AFTER:
                        print(f"census {name}: {done}/{total} in {now - began['at']:.1f} s",
                              file=sys.stderr, flush=True)
                    began["at"] = now

            try:  # e.g. fewer natural texts of --seq-len tokens than --n: one line
                data = census_job.run(bridge, spec, model_name=model, progress=progress)
            except MechsinkError as exc:
                fail(exc)
        with _result_set(folder) as staging:
            # strict JSON: a non-finite value is null with a reason beside it (mechsink.io)
            written = census_job.write(data, staging, report=False)
            if report:
                from mechsink.viz import write_report

                with console.status("writing figures and pages"), phase(
                        "writing figures and pages", delay=STEP_LINE_AFTER):
                    written += write_report(data, staging)
            written = _final(staging, folder, written)
    table = Table(title=f"{model}: sink census (n={n}, T={seq_len}, eps={eps})")
    table.add_column("input", no_wrap=True)
    for col in ("sink rate (Gu / i>0)", "massive: token med. | layer med. (channels, layers)",
                "super neurons L:neuron->ch", "norm ratio 0/rest"):
        table.add_column(col)
    for row in summary_rows(data):
        tok_m, lay_m = row["massive"], row["massive_layer_median"]
        both = lay_m if lay_m["count"] else tok_m
        where = (f" (ch {','.join(map(str, both['channels'][:3]))}; "
                 f"L{both['layers'][0]}-{both['layers'][1]})" if both["count"] else "")
        sn = " ".join(f"{a}:{b}->{c}" for a, b, c in row["super_neurons"][:4]) or "none"
        lo, hi = row["norm_ratio_range"] or (float("nan"), float("nan"))
        table.add_row(row["run"], f"{row['sink_rate']:.3f} / {row['sink_rate_no_self']:.3f}",
                      f"{tok_m['count']} | {lay_m['count']}{where}", sn, f"{lo:.3g}..{hi:.3g}")
    console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    if not validate_sets:
        console.print("super-neuron sets were not checked causally: add --validate-sets to "
                      "name the block whose set carries the sink (zeroes each set against a "
                      "same-size random one)", markup=False)
    if report:
        console.print(f"open {folder / 'index.html'} in a browser (works offline)")


@app.command()
def train(
    recipe: str = typer.Argument(..., help=help_of(train_job.Spec, "recipe")),
    out: str = typer.Option(..., "--out", help=help_of(train_job.Spec, "out")),
    steps: int | None = typer.Option(default(train_job.Spec, "steps"),
                                     help=help_of(train_job.Spec, "steps")),
    seed: int = typer.Option(default(train_job.Spec, "seed"),
                             help=help_of(train_job.Spec, "seed")),
    resume: bool = typer.Option(default(train_job.Spec, "resume"), "--resume",
                                help=help_of(train_job.Spec, "resume")),
) -> None:
    """Train an organism; checkpoints load as organism:OUT/step-N."""
    spec = train_job.Spec(recipe=recipe, out=out, steps=steps, seed=seed, resume=resume)
    try:
        train_job.check(spec)  # before the run folder is made or run.json written
        folder = train_job.run(spec)
    except MechsinkError as exc:
        fail(exc)
    console.print(f"checkpoints in {folder}: load them as organism:{folder}/step-N")


def _P(name: str) -> typing.Any:
    """A patch option's default, from its spec (:mod:`mechsink.jobs.patch`)."""
    return default(patch_job.Spec, name)


def _PH(name: str) -> str:
    return help_of(patch_job.Spec, name)


@app.command()
def patch(
    model: str = typer.Argument(..., help="zoo name, e.g. smollm2-135m or random:gpt2-tiny"),
    clean: str = typer.Option(..., help="clean prompt"),
    corrupted: str = typer.Option(..., help="corrupted prompt (same number of tokens)"),
    site: str = typer.Option(_P("site"), help=_PH("site")),
    metric: str = typer.Option(_P("metric"), help=_PH("metric")),
    out: str = typer.Option(..., "--out", help="folder for patch.json and patch.png"),
    layers: str | None = typer.Option(None, help="comma-separated layers (default: all)"),
    positions: str | None = typer.Option(None, help="comma-separated positions to patch "
                                         "(default: all)"),
    key_position: int | None = typer.Option(_P("key_position"), "--key-position",
                                            help=_PH("key_position")),
    direction: str = typer.Option(_P("direction"), help=_PH("direction")),
    normalize: bool = typer.Option(_P("normalize"), help=_PH("normalize")),
    prepend_bos: bool = typer.Option(_P("prepend_bos"), help=_PH("prepend_bos")),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
    dtype: str | None = typer.Option(None, help="float32 (default), float16 or bfloat16"),
    seed: int | None = typer.Option(None, help="seed for random:... models"),
    memory_budget: str | None = typer.Option(_P("memory_budget"), "--memory-budget",
                                             help=_PH("memory_budget")),
) -> None:
    """Activation-patch SITE between two prompts; write the result JSON and a heatmap."""
    from mechsink.io import check_writable
    from mechsink.model import check_seq_len
    from mechsink.model import to_tokens as _to_tokens
    from mechsink.model.zoo import load_model
    from mechsink.model.zoo.devices import resolve_dtype
    from mechsink.patching import activation_patch

    spec = patch_job.Spec(site=site, metric=metric, key_position=key_position,
                          direction=direction, normalize=normalize, prepend_bos=prepend_bos,
                          memory_budget=memory_budget)
    try:  # every check that needs no model, before loading one
        job = patch_job.check_command(spec, model, clean, corrupted, layers=layers,
                                      positions=positions)
        resolve_dtype(dtype)
        _check_device(device)
        folder = check_writable(out)
    except MechsinkError as exc:
        fail(exc)
    with _locked(folder):
        try:
            with console.status(f"loading {model}"):
                bridge = load_model(model, device=device, dtype=dtype, seed=seed)
            mechsink_model.check_supported(bridge, "patch")
            c = _to_tokens(bridge, clean, prepend_bos=prepend_bos)
            x = _to_tokens(bridge, corrupted, prepend_bos=prepend_bos)
            check_seq_len(bridge, max(c.shape[-1], x.shape[-1]))
            # parsed once (check_command); activation_patch checks it against the model and
            # binds it to the runs it records (a bare logit_diff's tokens among them)
            the_metric = patch_job.at_key(job.metric, key_position, c.shape[-1])
            with console.status(f"patching {job.site.label}"):
                result = activation_patch(bridge, c, x, job.site, the_metric,
                                          direction=direction, normalize=normalize,
                                          memory_budget=job.memory_budget)
        except MechsinkError as exc:
            fail(exc)
        result.meta["model"] = model
        from mechsink.viz.patching import heatmap
        from mechsink.viz.style import save

        with _result_set(folder) as staging:  # the JSON and the figure, whole or not at all
            result.to_json(staging / "patch.json")
            save(heatmap(result), staging / "patch.png")  # atomic, house resolution
    console.print(f"{result.site} x {result.metric}: clean {result.clean_value:.4g}, corrupted "
                  f"{result.corrupted_value:.4g}; wrote {folder / 'patch.json'} and "
                  f"{folder / 'patch.png'}")


#: off a terminal (a log), a step of scan that ran this long writes a line when it ends
STEP_LINE_AFTER = 5.0


def _settings_help(name: str) -> str:
    """The settings of experiment ``name`` (from its ``run()`` signature and docstring), as
    ``mechsink experiment NAME --help`` lists them."""
    from mechsink.experiments import get_experiment

    experiment = get_experiment(name)
    head = (f"mechsink experiment {name} [MODEL] --out DIR [SETTINGS]\n\nMODEL: a zoo name "
            f"(default {experiment.default_model}); --seed and --device as for the other "
            "commands." if experiment.needs_model else
            f"mechsink experiment {name} --out DIR [SETTINGS]\n\n{name} takes no model (" + (
                "it loads the ones --models names, one at a time" if "models" in
                experiment.settings() else "it trains its own organisms under --out") + ").")
    return f"{head}\n\n{experiment.options_help()}"


_EXPERIMENT_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True,
                       "help_option_names": []}


@app.command(context_settings=_EXPERIMENT_CONTEXT)
@typing.no_type_check  # typer hands in its base Context class, not the annotated subclass
def experiment(
    ctx: typer.Context,
    name: str | None = typer.Argument(None, help="experiment, e.g. structural_origin or p0_sink"),
    out: str | None = typer.Option(None, "--out", help="folder for result.json, figures, "
                                   "summary.md (required)"),
    seed: int | None = typer.Option(None, help="seed for random:... models"),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
    show_help: bool = typer.Option(False, "--help", "-h", help="show this message; with NAME, "
                                   "the experiment's settings"),
) -> None:
    """Run an experiment of mechsink.experiments by name: `mechsink experiment NAME [MODEL] --out
    DIR --setting VALUE ...`. MODEL (a zoo name) only for experiments that take one; further
    --options are its settings (e.g. --n 8 --seq-len 32), as the script of the same name in
    circuits/ takes them; `mechsink experiment NAME --help` lists them. Every setting is checked
    before any model loads."""
    from mechsink.experiments import EXPERIMENTS, get_experiment

    try:
        if name is None or show_help:
            if name is None and not show_help:
                raise MechsinkError("give the experiment's name: one of "
                                    f"{', '.join(EXPERIMENTS)}.")
            console.print(ctx.get_help() if name is None else _settings_help(name),
                          markup=False, highlight=False)
            return
        chosen = get_experiment(name)
        args = list(ctx.args)
        model: str | None = None
        if args and not args[0].startswith("--"):  # a model, before the settings
            model = args.pop(0)
            if not chosen.needs_model:
                raise MechsinkError(
                    f"{name} takes no model (it trains its own), got {model!r}; experiments "
                    "that take one: " + ", ".join(e.name for e in EXPERIMENTS.values()
                                                  if e.needs_model))
        the_settings = chosen.parse_settings(args)
        if out is None:
            raise MechsinkError(f"{name} needs --out DIR: the folder for its result.")
        model_name = model or chosen.default_model
        experiment_job.check(experiment_job.Spec(name, the_settings), [model_name])
        if chosen.needs_model:
            _check_device(device)
        result = chosen.run_into(out, the_settings, model_name=model_name, device=device,
                                 seed=seed,
                                 loading=lambda n: console.status(f"loading {n}"))
    except MechsinkError as exc:
        fail(exc)
    console.print(result.summary(), markup=False)


#: the command's name before 0.2.0, kept working (not listed): ``mechsink circuit NAME``
app.command("circuit", context_settings=_EXPERIMENT_CONTEXT, hidden=True)(experiment)


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="the sweep's TOML spec (models, jobs, settings)"),
    out: Path = typer.Option(..., "--out", help="folder for shards, merged results, summary"),
    ray: bool = typer.Option(False, "--ray", help="run shards on a local Ray instance"),
    ray_address: str | None = typer.Option(None, "--ray-address",
                                           help="run shards on an existing Ray cluster"),
    workers: int = typer.Option(2, help="Ray workers (one model cached in each)"),
    max_shards: int | None = typer.Option(None, help="stop after running this many shards"),
) -> None:
    """Run a sweep spec: shards written atomically, finished ones skipped on a rerun, merged
    into one result per job plus summary.json (local by default; --ray / --ray-address)."""
    from mechsink.app.sweep import run_sweep

    try:
        summary = run_sweep(spec, out, ray=ray or ray_address is not None,
                            ray_address=ray_address, workers=workers, max_shards=max_shards)
    except MechsinkError as exc:
        fail(exc)
    failed = [s for s in summary["shards"] if s["status"] == "failed"]
    console.print(f"{len(summary['shards'])} shards ({summary['ran']} ran, {summary['skipped']} "
                  f"already done, {len(failed)} failed) in {summary['wall_s']:.1f} s; wrote {out}",
                  markup=False)
    for s in failed:
        console.print(f"failed: {s['id']}: {s['error']}", markup=False)
    if failed:
        raise typer.Exit(1)


def _D(name: str) -> typing.Any:
    """A discover option's default, from its spec (:mod:`mechsink.jobs.discover`)."""
    return default(discover_job.Spec, name)


def _DH(name: str) -> str:
    return help_of(discover_job.Spec, name)


def _method_flags(after: str) -> Callable[[Callable[..., typing.Any]], Callable[..., typing.Any]]:
    """A command whose ``**method_options`` become one option per command-line option of the
    discovery methods (:func:`mechsink.discover.methods.declared_options`: name, type,
    default, help; a bool as ``--x/--no-x``), placed after parameter ``after``: typer reads
    the ``__signature__`` this sets, so a method's new option is a flag without editing here."""
    from mechsink.discover.methods import declared_options

    def flags(f: Callable[..., typing.Any]) -> Callable[..., typing.Any]:
        sig = inspect.signature(f, eval_str=True)
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        at = [p.name for p in params].index(after) + 1
        made = [inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default=typer.Option(o.default, help=o.help),
                                  annotation=o.type if o.default is not None
                                  else o.type | None)
                for o in declared_options(command_line=True).values()]
        f.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*params[:at], *made, *params[at:]])
        return f
    return flags


@app.command()
@_method_flags(after="seq_len")
def discover(
    model: str = typer.Argument(..., help="zoo name, e.g. smollm2-135m or random:gpt2-tiny"),
    metric: str = typer.Option(..., help=_DH("metric")),
    out: str = typer.Option(..., "--out", help="folder for discover.json, circuit.json/.png, "
                            "faithfulness.png, summary.md"),
    method: str = typer.Option(_D("method"), help=_DH("method")),
    clean: list[str] | None = typer.Option(_D("clean"), help=_DH("clean")),
    corrupted: list[str] | None = typer.Option(_D("corrupted"), help=_DH("corrupted")),
    ablation: str = typer.Option(_D("ablation"), help=_DH("ablation")),
    positions: str | None = typer.Option(_D("positions"), help=_DH("positions")),
    n: int = typer.Option(_D("n"), help=_DH("n")),
    seq_len: int = typer.Option(_D("seq_len"), help=_DH("seq_len")),
    max_exact: int = typer.Option(_D("max_exact"), help=_DH("max_exact")),
    select: str = typer.Option(_D("select"), help=_DH("select")),
    edges: int | None = typer.Option(_D("edges"), help=_DH("edges")),
    target: float = typer.Option(_D("target"), help=_DH("target")),
    curves: str = typer.Option(_D("curves"), help=_DH("curves")),
    prepend_bos: bool = typer.Option(_D("prepend_bos"), help=_DH("prepend_bos")),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
    dtype: str | None = typer.Option(None, help="float32 (default), float16 or bfloat16"),
    seed: int | None = typer.Option(None, help="seed for random:... models"),
    discovery_seed: int = typer.Option(_D("discovery_seed"), help=_DH("discovery_seed")),
    neurons: list[str] | None = typer.Option(_D("neurons"), help=_DH("neurons")),
    export: str = typer.Option(_D("export"), help=_DH("export")),
    memory_budget: str | None = typer.Option(_D("memory_budget"), "--memory-budget",
                                             help=_DH("memory_budget")),
    **method_options: typing.Any,
) -> None:
    """Edge-level circuit discovery: score every edge (EAP, EAP-IG, exact edge patching or
    another registered method), pick a circuit and draw its faithfulness curves. A method's
    options (--steps, --ig, ...) are the ones its file declares; a method uses those it
    takes."""
    from mechsink.io import check_writable
    from mechsink.model import load_model
    from mechsink.model.zoo.devices import resolve_dtype

    spec = discover_job.Spec(
        metric=metric, method=method, clean=clean, corrupted=corrupted, ablation=ablation,
        positions=positions, n=n, seq_len=seq_len, max_exact=max_exact, select=select,
        edges=edges, target=target, curves=curves, prepend_bos=prepend_bos,
        discovery_seed=discovery_seed, neurons=neurons, export=export,
        memory_budget=memory_budget, method_options=method_options)
    try:  # every check that needs no model, before loading one
        discover_job.check(spec, [model], option=cli_name)
        _check_device(device)
        resolve_dtype(dtype)
        tok = settings.model_tokenizer(model) if clean else None  # no weights needed
        folder = check_writable(out)
    except MechsinkError as exc:
        fail(exc)
    with _locked(folder):
        try:
            with console.status(f"loading {model}"):
                bridge = load_model(model, device=device, dtype=dtype, seed=seed)
            with console.status(f"scoring edges ({method})"):
                found = discover_job.run(bridge, spec, model_name=model,
                                         check_lengths=tok is None)
            with _result_set(folder) as staging:  # JSON and figures whole, or not at all
                discover_job.write(found, staging, spec)
        except MechsinkError as exc:
            fail(exc)
    console.print(found.summary(), markup=False)


@app.command()
def export(
    folder: str = typer.Argument(..., help="a folder written by mechsink discover --out"),
    to: str = typer.Option(..., "--to", help="the edge list to write: a .tsv or .json file "
                           "(auto-circuit's node names and ACDC's edge keys, with scores)"),
    edges: int | None = typer.Option(None, help="export the top N edges by the saved scores "
                                     "instead of the saved circuit"),
) -> None:
    """Export a saved discovery's circuit as an edge list, without loading the model: the
    graph and every edge's score are read back from the folder."""
    from mechsink.discover import Discovery, save_edge_list, top_n
    from mechsink.io import check_writable

    try:
        target = Path(to)
        if target.suffix not in (".tsv", ".json"):
            raise MechsinkError(f"--to {to!r}: the name must end in .tsv or .json.")
        if not (Path(folder) / "discover.json").is_file():
            raise MechsinkError(f"{folder} holds no discover.json: give a folder written by "
                                "mechsink discover --out.")
        check_writable(target.parent if str(target.parent) else ".", option="--to")
        found = Discovery.load(folder)
        circuit = found.circuit if edges is None else top_n(found.scores, edges)
        written = save_edge_list(circuit, target)
    except MechsinkError as exc:
        fail(exc)
    console.print(f"{len(circuit.edges)} edges ({circuit.how}) of {found.scores.graph.n_edges}; "
                  f"wrote {written}")


@app.command()
def streaming(
    model: str = typer.Argument(..., help="zoo name, e.g. smollm2-135m"),
    out: str = typer.Option(..., "--out", help="folder for streaming.json and streaming.png"),
    window: list[int] | None = typer.Option(
        None, "--window", help="recent tokens kept, W (repeat; default: 16, 64, 128)"),
    sinks: list[int] | None = typer.Option(
        None, "--sinks", help="first tokens kept, s (repeat; default: 0, 1, 4)"),
    n_tokens: int = typer.Option(1024, "--n-tokens", help="tokens of the Wikipedia extract"),
    circuit: bool = typer.Option(True, help="also with the super-neuron sets zeroed at "
                                 "position 0 of every window"),
    bos: bool | None = typer.Option(None, "--bos/--no-bos", help="start the text with the BOS "
                                    "token (default: where the model has one)"),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
) -> None:
    """Streaming perplexity (Xiao et al. 2024): the Wikipedia extract read through a window of
    the W recent tokens plus the first s, positions re-assigned within the window; writes
    DIR/streaming.json and DIR/streaming.png."""
    from mechsink.interventions.streaming import (
        DEFAULT_SINKS,
        DEFAULT_WINDOWS,
        check_streaming_args,
        streaming_perplexity,
    )
    from mechsink.io import check_writable

    windows, kept = tuple(window or DEFAULT_WINDOWS), tuple(sinks or DEFAULT_SINKS)
    try:
        check_streaming_args(windows, kept, n_tokens)
        check_context(model, n_tokens, "--n-tokens")
        _check_device(device)
        folder = check_writable(out)
    except MechsinkError as exc:
        fail(exc)
    from mechsink.viz.streaming import streaming_figure

    data, written = _measure_and_write(
        model, device, folder, "streaming perplexity",
        lambda bridge: streaming_perplexity(bridge, windows=windows, sinks=kept,
                                            n_tokens=n_tokens, circuit=circuit,
                                            model_name=model, bos=bos).to_dict(),
        "streaming", streaming_figure)
    table = Table(title=f"{model}: streaming perplexity ({data['scored']} tokens scored; "
                        f"whole text {data['dense_perplexity']:.3g})")
    table.add_column("kept s")
    for w in windows:
        table.add_column(f"W={w}")
    edited = data["circuit_removed"] or {}
    for s in kept:
        row = [data["perplexity"][str(s)][str(w)] for w in windows]
        cells = [f"{v:.3g}" for v in row]
        if "table" in edited:
            cells = [f"{c} / {edited['table'][str(s)][str(w)]:.3g}"
                     for c, w in zip(cells, windows, strict=True)]
        table.add_row(str(s), *cells)
    console.print(table)
    if "table" in edited:
        console.print(f"clean / circuit removed ({edited['description']})", markup=False)
    elif edited:
        console.print(f"circuit: not applicable ({edited['not_applicable']})", markup=False)
    console.print(f"wrote {', '.join(str(p) for p in written)}")


@app.command("weight-quant")
def weight_quant(
    model: str = typer.Argument(..., help="zoo name, e.g. smollm2-135m"),
    out: str = typer.Option(..., "--out", help="folder for weight_quantization.json and "
                            "weight_quantization.png"),
    n: int = typer.Option(16, help="natural-text prompts the loss is read on"),
    seq_len: int = typer.Option(128, help="tokens per prompt"),
    device: str | None = typer.Option(None, help="cpu, cuda, ... (default: cuda if present)"),
) -> None:
    """Weight-only int4 (round to nearest, groups of 128 and per channel) and the super weight
    (Yu et al. 2024): the next-token loss with the super weights quantized, kept in full
    precision, zeroed or kept alone, with intervals over prompts."""
    from mechsink.interventions.weight_quantization import weight_quantization
    from mechsink.io import check_writable

    try:
        if n < 1 or seq_len < 2:
            raise MechsinkError("--n must be positive and --seq-len at least 2.")
        check_context(model, seq_len, "--seq-len")
        _check_device(device)
        folder = check_writable(out)
    except MechsinkError as exc:
        fail(exc)
    from mechsink.viz.weight_quantization import weight_quantization_figure

    data, written = _measure_and_write(
        model, device, folder, "weight-only int4 losses",
        lambda bridge: weight_quantization(bridge, n=n, seq_len=seq_len,
                                           model_name=model).to_dict(),
        "weight_quantization", lambda d, path: weight_quantization_figure({model: d}, path))
    table = Table(title=f"{model}: next-token loss under weight-only int4")
    table.add_column("setting")
    table.add_column("loss")
    for key, row in data["settings"].items():
        table.add_row(key, f"{row['loss']:.4g}")
    console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in written)}")


if __name__ == "__main__":  # python -m mechsink.app.cli
    app()
