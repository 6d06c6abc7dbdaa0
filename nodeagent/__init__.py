"""nodeagent: a per-node daemon for elastic, fault-tolerant distributed PyTorch training.

The packages, top layer first (docs/architecture.md; tests/unit/test_layers.py checks that
every import points down): cli/ (the command lines), api/ (the HTTP API service), runtime/
(the wiring) and views/ (what the verbs compute, below every face), job/ and pool/
(the protocols), supervisor/, telemetry/, gpu/, coord/, checkpoint/,
accounting/ (the parts), model/,
channel/, config/ (the formats and settings), and state.py, errors.py at the root. worker/
is what training scripts import, beside the agent, and integrations/ what scripts of a
framework's Trainer import; client.py is the API's Python client (httpx alone). __main__.py:
`python -m nodeagent`.
"""

__version__ = "0.1.0"
