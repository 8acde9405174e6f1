"""Structure at random initialisation, and the SeedPrint identity test.

Li, Tong, Wang et al. (2026, "SeedPrint") report that untrained transformers already prefer some
next tokens by orders of magnitude, because representations contract along a seed-dependent
direction, and that this bias survives training and fingerprints the seed. This module gives:

- :func:`init_model`: a random GPT-2 / Llama under one of three init schemes;
- :func:`token_preference`: max / median of the mean next-token probability on random input;
- :func:`contraction_direction`: the top principal direction of final states on random input;
- :func:`seedprint_test`: the identity test between two models;
- :func:`calibrate_threshold`, :func:`error_rate`: a threshold on ``z`` calibrated from a null
  distribution of pairs that do *not* share an initialisation but were trained on the same
  data, and error rates with exact (Clopper-Pearson) intervals.

Why calibrate: the test's normal p-value assumes unrelated models give taus centred on zero.
Models trained on the same task learn the same output statistics, so their taus are positive
without any shared initialisation; the paper's ``p < 0.01`` rule then calls every such pair
"same seed". The null distribution of ``z`` has to come from unrelated models on the same data.

SeedPrint test, as implemented here: both models read the same random sequences; each gives its
last-position logits ``x``, turned row-wise into ``softmax(x / 10)``. The ``k`` vocabulary
dimensions with the lowest mean (under model A) are kept; for each, Kendall's tau between the two
models' values across inputs is computed (scipy). With ``tau_1..tau_k``,
``z = mean(tau) / (std(tau) / sqrt(k))`` and the two-sided normal p-value decide whether the
two models share an initialisation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from scipy import stats
from torch import Tensor, nn

from mechsink.errors import BadInputError
from mechsink.model import act_name, cache_blocks, hf_model_of, wrap_hf
from mechsink.model.zoo import gpt2_tokenizer, random_config, seeded_model

INIT_SCHEMES = ("hf", "torch", "tl-legacy")
# positions unembedded per call when reading token preference at every depth: 256 rows of a
# 262k vocabulary are 268 MB of float32 logits
UNEMBED_ROWS = 256


def init_model(spec: str, seed: int, scheme: str = "hf", n_layers: int | None = None) -> Any:
    """A random ``gpt2-<size>`` / ``llama-<size>`` bridge, initialised by ``scheme``.

    ``hf``: the family's transformers init (normal, std 0.02; GPT-2 scales residual writers);
    ``torch``: PyTorch's layer defaults (uniform +-1/sqrt(fan_in), embeddings N(0, 1));
    ``tl-legacy``: TransformerLens's legacy init, N(0, 0.8 / sqrt(d_model)) for every matrix.
    """
    if scheme not in INIT_SCHEMES:
        raise BadInputError(f"unknown init scheme {scheme!r}: choose one of {INIT_SCHEMES}.")
    config = random_config(spec)
    if n_layers is not None:
        key = "n_layer" if hasattr(config, "n_layer") else "num_hidden_layers"
        setattr(config, key, n_layers)
    model = seeded_model(config, seed)
    if scheme != "hf":
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            _reinit(model, scheme, config.hidden_size)
    return wrap_hf(model.eval(), gpt2_tokenizer(), name=f"random:{spec}/{scheme}")


def _reinit(model: nn.Module, scheme: str, d_model: int) -> None:
    """Overwrite every weight by ``scheme`` (norm gains to one, biases as the scheme says)."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter):
            continue
        bias = getattr(module, "bias", None)
        if weight.dim() == 1:  # LayerNorm / RMSNorm gain
            weight.fill_(1.0)
            if isinstance(bias, nn.Parameter):
                bias.zero_()
            continue
        if scheme == "tl-legacy":
            weight.normal_(0.0, 0.8 / math.sqrt(d_model))
            if isinstance(bias, nn.Parameter):
                bias.zero_()
        elif isinstance(module, nn.Embedding):
            weight.normal_(0.0, 1.0)
        else:  # nn.Linear (out, in) or transformers' Conv1D (in, out)
            fan_in = weight.shape[1] if isinstance(module, nn.Linear) else weight.shape[0]
            bound = 1.0 / math.sqrt(fan_in)
            weight.uniform_(-bound, bound)
            if isinstance(bias, nn.Parameter):
                bias.uniform_(-bound, bound)


def random_tokens(model: Any, n: int, seq_len: int, seed: int) -> Int[Tensor, "n seq"]:
    """Uniform random ordinary tokens (special tokens excluded), reproducible from ``seed``."""
    vocab = int(model.cfg.d_vocab)
    special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
    allowed = torch.tensor([t for t in range(vocab) if t not in special])
    gen = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(len(allowed), (n, seq_len), generator=gen)]


@torch.no_grad()
def last_logits(
    model: Any, tokens: Int[Tensor, "n seq"], batch: int = 32
) -> Float[Tensor, "n vocab"]:
    """Next-token logits at the last position of each sequence."""
    return torch.cat([model(tokens[i: i + batch])[:, -1] for i in range(0, len(tokens), batch)])


@dataclass(frozen=True)
class TokenPreference:
    """Mean next-token distribution on random input: its max, median and their ratio."""

    max_prob: float
    median_prob: float
    ratio: float
    top_token: int

    def to_dict(self) -> dict:
        return asdict(self)


def token_preference(logits: Float[Tensor, "n vocab"]) -> TokenPreference:
    """Max / median of the mean next-token probability (a pure function of the logits)."""
    mean = logits.double().softmax(-1).mean(0)
    max_prob, top = mean.max(0)
    median = mean.median()
    return TokenPreference(max_prob.item(), median.item(), (max_prob / median).item(), int(top))


@torch.no_grad()
def final_states(model: Any, tokens: Int[Tensor, "n seq"]) -> Float[Tensor, "points d_model"]:
    """The last block's residual output at every position of every sequence."""
    name = act_name("resid_post", model.cfg.n_layers - 1)
    _, cache = model.run_with_cache(tokens, names_filter=[name])
    return cache[name].flatten(0, 1)


def contraction_direction(states: Float[Tensor, "points d_model"]) -> Float[Tensor, " d_model"]:
    """Top principal direction of the (uncentred) states: where representations contract to.

    Uncentred on purpose: a shared offset along one direction is the contraction itself. The
    sign is fixed so the states' mean projects positively.
    """
    _, _, vh = torch.linalg.svd(states.double(), full_matrices=False)
    direction = vh[0]
    if (states.double() @ direction).mean() < 0:
        direction = -direction
    return direction.float()


def explained_fraction(states: Float[Tensor, "points d_model"],
                       direction: Float[Tensor, " d_model"]) -> float:
    """Share of the states' squared norm that lies along ``direction``."""
    s = states.double()
    return ((s @ direction.double()).pow(2).sum() / s.pow(2).sum()).item()


@dataclass(frozen=True)
class SeedPrintResult:
    """Outcome of the SeedPrint test between two models."""

    z: float
    p_value: float
    mean_tau: float
    k: int
    n_inputs: int

    def same_seed(self, alpha: float = 0.01) -> bool:
        """True when the test rejects 'unrelated initialisations' at level ``alpha``."""
        return self.p_value < alpha and self.z > 0

    def to_dict(self) -> dict:
        return asdict(self)


def seedprint_test(logits_a: Float[Tensor, "n vocab"], logits_b: Float[Tensor, "n vocab"],
                   k: int = 64, temperature: float = 10.0) -> SeedPrintResult:
    """The SeedPrint identity test on two models' logits over the same inputs (module doc)."""
    if logits_a.shape != logits_b.shape:
        raise BadInputError(f"logits differ in shape: {tuple(logits_a.shape)} vs "
                            f"{tuple(logits_b.shape)}; run both models on the same inputs.")
    n, vocab = logits_a.shape
    if not 2 <= k <= vocab or n < 3:
        raise BadInputError(f"need 2 <= k <= vocab ({vocab}) and >= 3 inputs; got k={k}, n={n}.")
    pa = (logits_a.double() / temperature).softmax(-1)
    pb = (logits_b.double() / temperature).softmax(-1)
    dims = pa.mean(0).argsort()[:k]
    taus = torch.tensor([stats.kendalltau(pa[:, d].numpy(), pb[:, d].numpy()).statistic
                         for d in dims.tolist()], dtype=torch.float64).nan_to_num(0.0)
    spread = taus.std(unbiased=True).item()
    z = taus.mean().item() / (spread / math.sqrt(k)) if spread > 0 else math.copysign(
        math.inf, taus.mean().item() or 1.0)
    p = 2 * stats.norm.sf(abs(z))
    return SeedPrintResult(z=z, p_value=float(p), mean_tau=taus.mean().item(), k=k, n_inputs=n)


@dataclass(frozen=True)
class Calibration:
    """A threshold on SeedPrint's ``z`` from a null sample (pairs of independent inits)."""

    threshold: float
    alpha: float
    null_mean: float
    null_sd: float
    null_max: float
    n_null: int

    def same_seed(self, result: SeedPrintResult) -> bool:
        """True when ``result.z`` exceeds the calibrated threshold."""
        return result.z > self.threshold

    def to_dict(self) -> dict:
        return asdict(self)


def calibrate_threshold(null_z: list[float], alpha: float = 0.01) -> Calibration:
    """The threshold a null pair exceeds with probability ``alpha``, from a normal fitted to
    the null ``z`` values (few pairs: an empirical quantile at 0.01 would need hundreds), and
    never below the largest null value seen."""
    if len(null_z) < 3 or not 0 < alpha < 0.5:
        raise BadInputError(f"need >= 3 null pairs and 0 < alpha < 0.5; got {len(null_z)} "
                            f"pairs, alpha={alpha}.")
    values = torch.tensor(null_z, dtype=torch.float64)
    mean, sd = values.mean().item(), values.std(unbiased=True).item()
    threshold = max(mean + float(stats.norm.isf(alpha)) * sd, values.max().item())
    return Calibration(threshold=threshold, alpha=alpha, null_mean=mean, null_sd=sd,
                       null_max=values.max().item(), n_null=len(null_z))


def error_rate(errors: int, n: int, confidence: float = 0.95) -> dict[str, float | int]:
    """``errors / n`` with its exact (Clopper-Pearson) two-sided interval."""
    if n <= 0 or not 0 <= errors <= n:
        raise BadInputError(f"need 0 <= errors <= n and n > 0; got {errors} of {n}.")
    tail = (1 - confidence) / 2
    low = 0.0 if errors == 0 else float(stats.beta.ppf(tail, errors, n - errors + 1))
    high = 1.0 if errors == n else float(stats.beta.ppf(1 - tail, errors + 1, n - errors))
    return {"rate": errors / n, "low": low, "high": high, "errors": errors, "n": n,
            "confidence": confidence}


# --- the contraction at initialisation, per layer ----------------------------------------------


@torch.no_grad()
def residual_stack(model: Any, tokens: Int[Tensor, "n seq"], batch: int = 16
                   ) -> Float[Tensor, "depth n seq d_model"]:
    """The residual stream at every depth: entry ``k`` is the input of block ``k`` (entry 0 the
    embeddings) and the last entry the last block's output (``n_layers + 1`` entries)."""
    n_layers = int(model.cfg.n_layers)
    names = [act_name("resid_pre", k) for k in range(n_layers)]
    names.append(act_name("resid_post", n_layers - 1))
    parts = []
    for i in range(0, len(tokens), batch):  # the blocks only: nothing here reads the logits
        cache = cache_blocks(model, tokens[i: i + batch], names)
        parts.append(torch.stack([cache[name].float().cpu() for name in names]))
        del cache
    return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class Contraction:
    """Mean pairwise cosines of one layer's representations on random input.

    ``across``: tokens of different sequences (every position; the global, inter-sequence
    concentration); ``within``: distinct positions of one sequence (the local, intra-sequence
    one); ``first_to_later``: position 0 with the positions after it, same sequence;
    ``later_to_later``: distinct positions after 0, same sequence. ``discrepancy`` =
    ``later_to_later - first_to_later``: how far position 0 stands out of the contraction the
    later positions share (positive: position 0 is the outlier).
    """

    across: float
    within: float
    first_to_later: float
    later_to_later: float

    @property
    def discrepancy(self) -> float:
        return self.later_to_later - self.first_to_later

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "discrepancy": self.discrepancy}


def contraction_stats(states: Float[Tensor, "n seq d_model"]) -> Contraction:
    """:class:`Contraction` of one layer, from sums of unit vectors (``sum_{i != j} u_i . u_j
    = |sum u|^2 - N``), so every pair counts without forming the Gram matrix."""
    n, seq, _ = states.shape
    if n < 2 or seq < 3:
        raise BadInputError(f"need >= 2 sequences of >= 3 tokens to compare pairs; got {n} of "
                            f"{seq}.")
    u = torch.nn.functional.normalize(states.double(), dim=-1)
    per_seq = u.sum(1)  # [n, d]
    pairs_within = (per_seq.pow(2).sum(-1) - seq).sum()  # ordered pairs, same sequence
    pairs_all = per_seq.sum(0).pow(2).sum() - n * seq
    later = u[:, 1:].sum(1)
    first_later = (u[:, 0] * later).sum(-1).mean() / (seq - 1)
    later_later = ((later.pow(2).sum(-1) - (seq - 1)) / ((seq - 1) * (seq - 2))).mean()
    return Contraction(
        across=((pairs_all - pairs_within) / (n * seq * (n - 1) * seq)).item(),
        within=(pairs_within / (n * seq * (seq - 1))).item(),
        first_to_later=first_later.item(), later_to_later=later_later.item())


@torch.no_grad()
def depth_preference(model: Any, stack: Float[Tensor, "depth n seq d_model"]
                     ) -> list[TokenPreference]:
    """Token preference read out after every block (entry ``k-1``: after ``k`` blocks), through
    the model's own final norm and unembedding: the first ``k`` blocks of a random model are a
    random model of depth ``k`` (GPT-2's init scales its residual writers by the full depth)."""
    from mechsink.model import unembed

    device = next(iter(model.parameters())).device
    last = stack[1:, :, -1]  # [depth, n, d_model]: every depth's last position, one unembedding
    per_call = max(1, UNEMBED_ROWS // max(1, last.shape[1]))  # depths per call
    prefs = []
    for k in range(0, last.shape[0], per_call):  # one call's logits held at a time
        logits = unembed(model, last[k:k + per_call].to(device)).float().cpu()
        prefs += [token_preference(row) for row in logits]
    return prefs


class scaled_weights:
    """Within the block, every weight matrix (parameters of two or more dimensions: embeddings,
    projections) of ``model`` is multiplied by ``scale``; norm gains and biases are left alone.
    That is the model at ``scale`` times its init's standard deviation. Scales that are powers
    of two restore the weights bit for bit; others to float rounding."""

    def __init__(self, model: Any, scale: float) -> None:
        if not scale > 0:
            raise BadInputError(f"init scale must be positive, got {scale}.")
        module = hf_model_of(model) if hasattr(model, "original_model") else model
        self.params = [p for p in module.parameters() if p.dim() >= 2]
        self.scale = float(scale)

    def __enter__(self) -> None:
        with torch.no_grad():
            for p in self.params:
                p.mul_(self.scale)

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for p in self.params:
                p.div_(self.scale)
