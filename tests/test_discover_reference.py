"""EAP-IG with the reference implementation's conventions (Hanna et al. 2024's ``eap``
package, as MIB uses it) against its formulas written by hand with finite differences on the
model's own hook points: on inputs, the gradient at corrupted + k/steps (clean - corrupted) for
k = 0..steps-1; on activations, every edge's gradient averaged over every group's runs, each
group moved to k/steps clean + (1 - k/steps) corrupted for k = 1..steps."""

from __future__ import annotations

import pytest
from test_discover_ig import CLEAN, CORR, _caches, _delta, _into_receiver, _logit_diff, _move_group

from mechsink.discover import GraphRun, eap_ig
from mechsink.discover.methods.eap_ig import reference_alphas, sender_groups
from mechsink.errors import BadInputError
from mechsink.patching import LogitDiff


def _fd(model, moved, r, d, eps: float = 1e-2) -> float:
    up = _logit_diff(model, moved + [_into_receiver(model, r, eps * d)])
    down = _logit_diff(model, moved + [_into_receiver(model, r, -eps * d)])
    return (up - down) / (2 * eps)


def test_reference_points():
    assert reference_alphas("inputs", 4) == [1.0, 0.75, 0.5, 0.25]
    assert reference_alphas("activations", 4) == [0.75, 0.5, 0.25, 0.0]


@pytest.mark.parametrize("ig", ["inputs", "activations"])
def test_reference_convention_equals_the_reference_formulas(gpt2_tiny, ig):
    model, steps = gpt2_tiny, 2
    run = GraphRun(model, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    scores = eap_ig(run, steps=steps, ig=ig, qk_fix=False, verify=0,
                    convention="reference").values
    mine = eap_ig(run, steps=steps, ig=ig, qk_fix=False, verify=0).values
    c, x = _caches(model)
    g = run.graph
    groups = ([[g.senders[0]]] if ig == "inputs" else
              [[g.senders[i] for i in grp] for grp in sender_groups(run)])
    alphas = reference_alphas(ig, steps)
    checked: set[str] = set()
    differs = False
    for e in range(g.n_edges):
        s, r = g.senders[int(g.src[e])], g.receivers[int(g.dst[e])]
        key = f"{s.kind}{s.layer}->{r.kind}"
        if key in checked or (s.kind == "head" and s.index != 1) or (
                ig == "inputs" and s.kind != "embed" and len(checked) >= 6):
            continue
        checked.add(key)
        d = _delta(s, c, x)
        fd = sum(_fd(model, _move_group(group, alpha, c, x), r, d)
                 for group in groups for alpha in alphas) / (len(groups) * steps)
        assert float(scores[e]) == pytest.approx(fd, abs=2e-4 + 0.02 * abs(fd)), g.edge_names[e]
        differs |= abs(float(mine[e]) - fd) > 1e-3 + 0.05 * abs(fd)
    assert len(checked) >= 6 and differs  # and mechsink's own convention is another number


def test_reference_convention_is_refused_where_it_has_no_meaning(gpt2_tiny):
    run = GraphRun(gpt2_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    with pytest.raises(BadInputError, match="convention"):
        eap_ig(run, ig="coefficients", convention="reference", qk_fix=False, verify=0)
    with pytest.raises(BadInputError, match="convention"):
        eap_ig(run, convention="hanna", qk_fix=False, verify=0)


def test_discover_command_takes_the_reference_convention(tmp_path):
    import json

    from typer.testing import CliRunner

    from mechsink.app.cli import app

    out = tmp_path / "run"
    base = ["discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method",
            "eap-ig", "--ig", "inputs", "--n", "2", "--seq-len", "6", "--verify", "0",
            "--no-qk-fix", "--out", str(out)]
    result = CliRunner().invoke(app, [*base, "--convention", "reference"])
    assert result.exit_code == 0, result.output
    settings = json.loads((out / "discover.json").read_text())["scores"]["settings"]
    assert settings["convention"] == "reference" and settings["ig"] == "inputs"
    bad = CliRunner().invoke(app, [*base, "--convention", "hanna"])
    assert bad.exit_code != 0 and "--convention must be" in bad.output
