"""The suite's Ray-free federation: the real ClientApp answering in this process, one persistent
Flower ``Context`` per node, as a grid the real ServerApp serves.

:class:`ClientAppGrid` is what Flower's simulation engine does for the server's messages, minus
Ray: node ``100 + k`` holds partition ``k`` of ``num_nodes``, keeps its ``context.state`` from one
message to the next, and replies what the ClientApp (with its Flower mods) returns, or an error
reply when the ClientApp raises (as a SuperNode reports a failed ClientApp). Subclasses override
:meth:`ClientAppGrid.answer` to lose, delay or change a node's reply.

:func:`serve_in_process` runs the whole ServerApp (or a test's own) on it: the tests that need a
federation but not Ray use it (the ``simulate`` fixture); a test of Ray itself uses
``simulate_ray`` and carries ``@pytest.mark.ray``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fake_grid import AnsweringGrid
from flwr.app import Context, RecordDict

# the local engine's nodes are the tests' (``simulations.local_engine``: the same Contexts)
from simulations.local_engine import (  # noqa: F401  (names the tests import from here)
    CLIENT_APP_RAISED_AN_EXCEPTION,
    FIRST_NODE,
    answer,
    flower_task_identity,
    node_context,
)

#: The federation size of the tests that do not say (``test_malicious_clients``' K).
K = 4


class ClientAppGrid(AnsweringGrid):
    """Nodes ``FIRST_NODE .. FIRST_NODE + num_nodes - 1`` (partitions ``0 .. num_nodes - 1``)
    answering with the real ClientApp (``create_client_app(run_config, mods)``)."""

    def __init__(
        self, run_config: Mapping[str, Any], num_nodes: int = K, mods: list | None = None
    ) -> None:
        from clients.client_app import create_client_app

        self.run_config, self.num_nodes = dict(run_config), num_nodes
        self.app = create_client_app(self.run_config, mods=mods)
        self.contexts = {
            FIRST_NODE + k: node_context(k, num_nodes, self.run_config) for k in range(num_nodes)
        }

    def get_node_ids(self):
        return list(self.contexts)

    def answer(self, message):
        return answer(self.app, self.contexts, message)


def serve_in_process(
    overrides: Mapping[str, Any], num_supernodes: int, server_app=None, client_mods=None
) -> None:
    """Run the ServerApp (or ``server_app``, a test's own) against ``num_supernodes`` nodes of
    :class:`ClientAppGrid` (the ClientApp with Flower mods ``client_mods``), all in this process:
    the Ray-free twin of ``tests.conftest.simulate_in_process``."""
    from server.server_app import create_server_app

    app = server_app or create_server_app(overrides)
    grid = ClientAppGrid(overrides, num_supernodes, mods=client_mods)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    with flower_task_identity():
        app(grid, context)


#: A small run of the main job: 3 clients, 2 rounds of 1 local epoch, client 0 forgotten by
#: FedEraser and FedRetrain (the engine tests compare its models across engines).
SMALL_RUN = {
    "num-clients": 3,
    "rounds": 2,
    "local-epochs": 1,
    "node-wait-seconds": 60,
    "unlearn-clients": "0",
    "unlearn-methods": "federaser,fedretrain",
}


def run_models(run_dir) -> dict[str, dict]:
    """Every model file of a run directory: its name -> its tensors."""
    from safetensors.torch import load_file

    return {p.name: load_file(p) for p in sorted(run_dir.glob("model_*.safetensors"))}
