"""The interactive circuit view: one offline HTML file drawn from the circuit JSON."""

from __future__ import annotations

import json
import re

from mechsink.viz.circuit_html import circuit_page


def _circuit() -> dict:
    return {"n_edges": 3, "how": "top 3", "graph": {"n_heads": 4, "n_layers": 2, "n_kv_heads": 2,
                                                   "senders": ["embed", "MLP0", "MLP1"]},
            "edges": [{"sender": "embed", "receiver": "L1H2.k", "score": -0.5},
                      {"sender": "L0H1", "receiver": "MLP1", "score": 2.0},
                      {"sender": "MLP1", "receiver": "metric", "score": None}]}


def test_the_page_holds_every_edge_ranked_by_absolute_score(tmp_path):
    path = circuit_page(_circuit(), tmp_path / "circuit.html")
    text = path.read_text()
    data = json.loads(re.search(r"const D = (\{.*?\});\n", text).group(1))
    ranks = {(e["s"], e["r"]): e["rank"] for e in data["edges"]}
    assert ranks == {("L0H1", "MLP1"): 0, ("embed", "L1H2.k"): 1, ("MLP1", "metric"): 2}
    assert {"embed", "metric", "L0H1", "L1H2", "MLP1"} <= set(data["nodes"])
    # offline: nothing is fetched (the SVG namespace is an identifier, not a request)
    assert not re.search(r"(src|href)=[\"']https?:", text)
    assert 'type="range"' in text and "3 edges (top 3)" in text


def test_draw_discovery_writes_the_interactive_view(tmp_path):
    from mechsink.viz.discover import draw_discovery

    (tmp_path / "discover.json").write_text(json.dumps({"circuit": _circuit(), "curves": []}))
    written = draw_discovery(tmp_path)
    assert tmp_path / "circuit.html" in written and (tmp_path / "circuit.png").stat().st_size
