"""The model package's dependencies run one way, and ``check_supported`` refuses a model an
entry point cannot run exactly, in one line, before any work (issue #25 item 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from tests.architectures import builder

MODEL = Path(__file__).resolve().parents[1] / "mechsink" / "model"


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """The mechsink modules ``path`` imports at module level and inside functions."""
    top: set[str] = set()
    inner: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mechsink"):
            (top if node in tree.body else inner).add(node.module or "")
    return top, inner


def test_probes_forward_and_kv_import_each_other_one_way_at_module_level():
    names = ("probes", "forward", "kv", "shortcuts")
    found = {n: _imports(MODEL / f"{n}.py") for n in names}
    for name, (_, inner) in found.items():
        assert not {f"mechsink.model.{n}" for n in names} & inner, name
    assert "mechsink.model.forward" not in found["probes"][0]
    assert "mechsink.model.kv" not in found["probes"][0]
    assert "mechsink.model.probes" not in found["shortcuts"][0]
    assert "mechsink.model.probes" in found["forward"][0]
    assert "mechsink.model.probes" in found["kv"][0]


# --- check_supported on tiny models of the architecture suite -------------------------------

#: architectures that cannot be supported (not bugs): what each refusal must say
REFUSED = {
    "RwkvForCausalLM": ("census", "no softmax attention"),  # a recurrent model
    "OlmoHybridForCausalLM": ("patch", "only layers [1] of 2 have softmax attention"),
    "DeepseekV4ForCausalLM": ("interventions", "does not hook the attention pattern"),
    "JetMoeForCausalLM": ("path", "no per-head outputs"),  # a mixture of attention experts
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> its tiny model loaded through ``hf:<folder>`` (built on first use)."""
    import mechsink

    root, loaded = tmp_path_factory.mktemp("support"), {}

    def get(arch: str):
        if arch not in loaded:
            folder = builder.save(arch, root).folder
            assert folder is not None, arch
            loaded[arch] = (mechsink.load_model(f"hf:{folder}", device="cpu"), folder)
        return loaded[arch]

    return get


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow)  # 9 s to build
                                  if a.startswith("Deepseek") else a for a in sorted(REFUSED)])
def test_an_architecture_that_cannot_be_supported_is_refused_in_one_line(tiny, arch):
    from mechsink.errors import BadInputError
    from mechsink.model import check_supported

    model, _ = tiny(arch)
    entry, missing = REFUSED[arch]
    with pytest.raises(BadInputError) as err:
        check_supported(model, entry)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{arch} is not supported by mechsink's {entry}")
    assert missing in line and ("would work" in line or "mechsink applies to" in line)


def test_a_refusal_is_per_entry_point(tiny):
    """JetMoE's attention experts have no per-head outputs: path patching, discovery and the
    census (no W_O) are refused; activation patching of its residual sites runs."""
    from mechsink.model.support import refusal

    model, _ = tiny("JetMoeForCausalLM")
    assert refusal(model, "patch") is None and refusal(model, "interventions") is None
    assert "W_O" in refusal(model, "census")
    assert "hook_z" in refusal(model, "discover")


def test_every_entry_point_refuses_before_any_forward(tiny):
    """The check is the first line: after the (cached) probes no forward runs at all."""
    from mechsink.discover.graph_run import GraphRun
    from mechsink.errors import BadInputError
    from mechsink.interventions.readout import measure
    from mechsink.measure.census import census
    from mechsink.model import capabilities, run_from_layer
    from mechsink.patching import activation_patch, attribution_patch, path_patch

    model, _ = tiny("RwkvForCausalLM")
    capabilities(model)
    forwards = []
    handles = [b.register_forward_pre_hook(lambda *a: forwards.append(1))
               for b in model.blocks]  # every forward, from any layer, runs one of them
    tokens = torch.tensor(builder.PROBE)
    calls = {
        "census": lambda: census(model, ["natural"], ["bos"], n=2, seq_len=8),
        "patch": lambda: activation_patch(model, tokens, tokens, "resid_pre", lambda x: x.sum()),
        "attribution": lambda: attribution_patch(model, tokens, tokens, "resid_pre",
                                                 lambda x: x.sum()),
        "path": lambda: path_patch(model, tokens, tokens, ["L0H0"], ["resid_post"],
                                   lambda x: x.sum()),
        "discover": lambda: GraphRun(model, tokens, lambda x: x.sum(), corrupted=tokens),
        "interventions": lambda: measure(model, tokens),
        "run_from_layer": lambda: run_from_layer(model, torch.zeros(1, 4, model.cfg.d_model), 1),
    }
    try:
        for entry, call in calls.items():
            with pytest.raises(BadInputError, match=f"^RwkvForCausalLM is not supported by "
                                                    f"mechsink's {entry}: "):
                call()
        assert forwards == []
        model.run_with_cache(tokens)  # the counter does count forwards
        assert forwards
    finally:
        for handle in handles:
            handle.remove()


def test_a_supported_architecture_passes_every_entry_point(tiny):
    from mechsink.model import check_supported
    from mechsink.model.support import NEEDS

    model, _ = tiny("LlamaForCausalLM")
    for entry in NEEDS:
        check_supported(model, entry)  # no error


COMMANDS = {
    "scan": ["--n", "2", "--seq-len", "8"],
    "patch": ["--clean", "a b c", "--corrupted", "a c b", "--metric", "resid_norm:0:1"],
    "discover": ["--metric", "resid_norm:1:1", "--n", "2", "--seq-len", "8"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_command_line_prints_the_refusal_in_one_line_and_writes_nothing(tiny, tmp_path,
                                                                            command):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    _, folder = tiny("RwkvForCausalLM")
    out = tmp_path / command
    result = CliRunner().invoke(app, [command, f"hf:{folder}", "--out", str(out),
                                      *COMMANDS[command], "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: RwkvForCausalLM is not supported")
    assert "Traceback" not in result.output and not out.exists()


def test_edits_are_refused_where_their_hooks_never_fire(tiny):
    """JetMoE's bridge declares attn.hook_rot_k but never fires it: an edit there (or patching
    it) would silently change nothing (the suite's rotated-key edit was 0.016 off transformers'
    edit: the size of the edit itself), nor its hook_k. ablate and activation_patch refuse
    them in one line;
    an edit of the residual, which fires, runs."""
    from mechsink.errors import BadInputError
    from mechsink.interventions import ablate, applied, scale_tokens
    from mechsink.patching import activation_patch

    model, _ = tiny("JetMoeForCausalLM")
    tokens = torch.tensor(builder.PROBE)
    for hook, call in (
            ("blocks.1.attn.hook_rot_k",
             lambda: ablate(model, "blocks.1.attn.hook_rot_k", mode="scale", scale=10.0)),
            ("blocks.0.attn.hook_k",
             lambda: activation_patch(model, tokens[:1], tokens[1:], "k_all_pos",
                                      lambda x: x[:, -1, 0].mean()))):
        with pytest.raises(BadInputError) as err:
            call()
        line = str(err.value)
        assert "\n" not in line and line.startswith("JetMoeForCausalLM is not supported by ")
        assert hook in line and "would work" in line
    with torch.no_grad():
        clean = model(tokens)
        with applied(model, [scale_tokens(model, 1, [2], 4.0)]):
            edited = model(tokens)
    assert (edited - clean).abs().max() > 1e-3
