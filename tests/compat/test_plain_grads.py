"""Discovery's plain-gradient path (:mod:`mechsink.discover.plain_grads`: each head's input
gradient put together in closed form from a plain forward/backward) on a HookedTransformer:
its premises must hold there (they are checked on the model's own tensors), and EAP, EAP-IG
on inputs and EAP-IG on activations must give graph mode's scores (every head reading its own
fork of the residual through TransformerLens's ``use_split_qkv_input``) to 1e-5.

Runs under TransformerLens 3.9 and 2.18 (``make compat``); skipped where there is no
HookedTransformer (TransformerLens 4)."""

from __future__ import annotations

import pytest

from . import _compat

TL = _compat.transformer_lens_version()


def _cases(model):
    from mechsink.patching import LogitDiff, MassiveValue, SinkScore

    clean, corrupted = _compat._tokens(model)
    last = clean.shape[1] - 1
    return clean, [
        (LogitDiff(int(clean[0, 1]), int(corrupted[0, 1]), position=last),
         {"corrupted": corrupted}),
        (SinkScore(1, 0), {"corrupted": corrupted}),
        (MassiveValue(1, 0, 3), {"ablation": "position_mean", "positions": [0]}),
    ]


@pytest.mark.parametrize("family", _compat.FAMILIES)
def test_plain_gradients_equal_graph_mode_on_a_hooked_transformer(family, monkeypatch):
    if not _compat.has_hooked_transformer():
        pytest.skip(f"TransformerLens {TL} has no HookedTransformer (removed in 4.0); "
                    "`make compat` runs this under TransformerLens 3.9 and 2.18.")
    from mechsink.discover import GraphRun, eap, eap_ig, plain_grads

    model = _compat.hooked_transformer(family)
    clean, cases = _cases(model)
    for metric, how in cases:
        run = GraphRun(model, clean, metric, prepend_bos=False, **how)
        # the premises hold on the HookedTransformer, so the fast path is what is compared
        assert plain_grads.receiver_grads(run, [0.0]) is not None, metric.name
        group = [i for i, s in enumerate(run.graph.senders) if s.kind == "head"
                 and s.layer == 0]
        assert plain_grads.receiver_grads(run, [0.5], group=group) is not None, metric.name

        def scores(run=run):
            return [eap(run, qk_fix=True, verify=0).values,
                    eap_ig(run, steps=3, ig="inputs", qk_fix=False, verify=0).values,
                    eap_ig(run, steps=3, ig="activations", qk_fix=False, verify=0).values]

        fast = scores()
        with monkeypatch.context() as m:
            m.setattr(plain_grads, "ENABLED", False)
            slow = scores()
        for what, a, b in zip(("eap", "eap-ig inputs", "eap-ig activations"), fast, slow,
                              strict=True):
            scale = max(1.0, float(b.abs().max()))
            assert float(b.abs().max()) > 0, (metric.name, what)
            assert float((a - b).abs().max()) <= 1e-5 * scale, (metric.name, what)
