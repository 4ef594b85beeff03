"""The remediation controller's node actions over the simulated fleet's admin API.

:class:`SimActions` implements :class:`~gpuobs.remediate.interfaces.NodeActions` for a native stack
started by ``gpuobs stack up`` (``<run>/stack.json``): node i's admin API is ``urls.nodes[i]`` without
``/metrics`` (the fleet process, :mod:`gpuobs.exporter.simfleet`, serves each node's DCGM page and admin
API on one port), reached with the run directory's bearer token, as
:class:`gpuobs.rollout.adapters.native.StackFleet` does. Every call is one ``GET``/``POST /admin/node``
(:mod:`gpuobs.exporter.server`; the node side is :class:`gpuobs.exporter.sim.node.Node`'s action methods).

Which action fits a fault is the controller's choice, taken from NVIDIA's Xid catalogue
(:mod:`gpuobs.reference.xid`, ``recommended_action``: RESET_GPU -> ``reset-gpu``, RESTART_BM ->
``reboot``, RESTART_APP -> ``restart-engine``); the simulator honours the same catalogue: a reset clears
RESET_GPU faults but fails on Xid 79 (fallen off the bus: reboot) and a row-remap failure (RMA path).
"""

from __future__ import annotations

import requests

from gpuobs.promapi.exporter_admin import AdminClient, AdminError
from gpuobs.remediate.interfaces import ACTIONS, ActionError, HealthResult, NodeView
from gpuobs.stack.state import StackState

#: The cordon mark this adapter sets and removes (the simulator's ``by``).
MARK = "gpuobs"
#: Node actions :meth:`SimActions.act` takes (:data:`~gpuobs.remediate.interfaces.ACTIONS` but ``none``).
NODE_ACTIONS = tuple(a for a in ACTIONS if a != "none")
#: Status keys that become NodeView fields; the rest go to ``detail``.
_VIEW_KEYS = ("cordoned", "cordoned_by", "in_flight", "boot_id")
_ERRORS = (AdminError, requests.RequestException, OSError, KeyError, TypeError, ValueError, AttributeError)


class SimActions:
    """Node actions on the simulated fleet of the native stack ``stack`` (a loaded stack.json).

    ``token``: the admin bearer token (default: read from ``stack.token_file``); ``timeout_s``: each
    HTTP call's timeout, seconds; ``reboot_s``: how long a reboot keeps a node down, simulated seconds
    (0..3600; None: the simulator's default, 30). Pools: a node's role, ``"serving"`` for ``stack.serving_hosts`` and
    ``"training"`` for the rest. Every method raises :class:`ActionError` only (an unknown node, an
    unreachable node, an API refusal, an answer of the wrong shape), with a one-line message that
    names the node; never AdminError, OSError or a requests exception.
    """

    def __init__(self, stack: StackState, token: str | None = None, timeout_s: float = 5.0,
                 reboot_s: float | None = None):
        self.reboot_s = reboot_s
        try:
            token = token or stack.token()
        except OSError as exc:
            raise ActionError(f"admin token: {exc}") from None
        serving = set(stack.serving_hosts)
        self.hosts: list[str] = list(stack.hostnames)
        self.pools: dict[str, str] = {h: "serving" if h in serving else "training" for h in self.hosts}
        self._admin = {h: AdminClient(u.removesuffix("/metrics"), token, timeout_s)
                       for h, u in zip(stack.hostnames, stack.urls.nodes)}

    def _client(self, node: str) -> AdminClient:
        try:
            return self._admin[node]
        except KeyError:
            raise ActionError(f"unknown node {node!r}; nodes: {', '.join(self.hosts)}") from None

    def _call(self, node: str, what: str, action: str | None = None, **params) -> dict:
        """GET /admin/node (``action`` None) or POST it; ActionError ``"<node>: <what> failed: ..."``."""
        client = self._client(node)
        try:
            doc = client.node_status() if action is None else client.node_action(action, **params)
            if not isinstance(doc, dict):
                raise TypeError(f"answer is not a JSON object: {str(doc)[:80]}")
            return doc
        except _ERRORS as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            status = getattr(exc, "status", None)
            raise ActionError(f"{node}: {what} failed: {msg}" + (f" (HTTP {status})" if status else "")) from None

    # ---- views --------------------------------------------------------------------------------------
    def nodes(self) -> list[NodeView]:
        """Every node of the stack, in stack order, each as :meth:`view` returns it (one GET per node).
        One unreachable node raises ActionError: the caps need every node's cordon state."""
        return [self.view(h) for h in self.hosts]

    def view(self, node: str) -> NodeView:
        """``node`` now (GET /admin/node): ``pool`` (its role), ``cordoned``, ``cordoned_by``
        (``"human"`` whenever an operator's cordon is on, even with the controller's too; ``"gpuobs"``
        when only the controller's; ``""``), ``in_flight`` (serving: requests running or waiting;
        training: 1 while the rank runs or checkpoints, 0 once stopped; 0 while the node is down),
        ``boot_id`` (new after each reboot). ``detail`` holds the rest of the node's status: ``draining``,
        ``rebooting``, ``reboot_remaining_s`` (simulated s), ``down``, ``engine_generation`` (engine
        process replacements), ``cordons`` (every mark), ``cordon_reason``, ``checkpointing``,
        ``training_stopped``, ``role``, ``hostname``."""
        doc = self._call(node, "status query")
        try:
            return NodeView(node=node, pool=self.pools[node], cordoned=bool(doc["cordoned"]),
                            cordoned_by=str(doc["cordoned_by"]), in_flight=float(doc["in_flight"]),
                            boot_id=str(doc["boot_id"]),
                            detail={k: v for k, v in doc.items() if k not in _VIEW_KEYS})
        except (KeyError, TypeError, ValueError) as exc:
            raise ActionError(f"{node}: status query failed: answer lacks or mistypes {exc}") from None

    # ---- cordon / drain -----------------------------------------------------------------------------
    def cordon(self, node: str, reason: str) -> None:
        """Put the controller's cordon mark on ``node`` (``by="gpuobs"``; ``reason``, cut to 200
        characters, is recorded as the node's ``cordon_reason``). Serving: new requests stop; training:
        the job keeps running until :meth:`drain`. Idempotent."""
        self._call(node, "cordon", "cordon", by=MARK, reason=str(reason)[:200])

    def uncordon(self, node: str) -> None:
        """Remove the controller's mark (``by="gpuobs"``); a human's cordon stays (check
        :meth:`view`'s ``cordoned_by``). Once no mark is left the node is back in service. Idempotent."""
        self._call(node, "uncordon", "uncordon", by=MARK)

    def drain(self, node: str) -> None:
        """Start moving work off ``node``: serving, no new requests and the in-flight ones finish (about
        one service time constant, ~5 simulated s); training, a checkpoint (~5 simulated s, never while
        the collective is hung) then the rank stops. Progress: :meth:`view`'s ``in_flight`` reaching 0.
        Idempotent."""
        self._call(node, "drain", "drain")

    # ---- actions ------------------------------------------------------------------------------------
    def act(self, node: str, action: str, gpu: int | None) -> str:
        """Take ``action`` on ``node`` and return the node's one-line detail.

        * ``reset-gpu`` (``gpu`` required; the catalogue's RESET_GPU): clears the GPU's Xid, ecc-dbe and
          NVLink faults and its DCGM Xid state, restarts a serving engine. ActionError when the node
          reports ``ok: false`` (row-remap failure: RMA; Xid 79: reboot; thermal or power brake:
          mechanical), with its detail.
        * ``reboot`` (RESTART_BM, e.g. Xid 79): the node is down for ``reboot_s`` (default 30) simulated
          s, then back with a new ``boot_id`` and its engine restarted; persistent hardware faults stay. Returns at once; watch :meth:`view`.
        * ``restart-engine`` (RESTART_APP; fragmentation, KV pressure): serving nodes only.

        ActionError for any other action, a missing ``gpu``, a node that refuses (training node,
        rebooting or down: HTTP 409) or cannot be reached.
        """
        if action not in NODE_ACTIONS:
            raise ActionError(f"{node}: unknown action {action!r}; allowed: {', '.join(NODE_ACTIONS)}")
        if action == "reset-gpu":
            if gpu is None or isinstance(gpu, bool) or not isinstance(gpu, int):
                raise ActionError(f"{node}: reset-gpu needs a GPU index, got {gpu!r}")
            doc = self._call(node, f"reset-gpu {gpu}", "reset-gpu", gpu=gpu)
            detail = " ".join(str(doc.get("detail", "")).split())
            if doc.get("ok") is not True:
                raise ActionError(f"{node}: {detail or f'reset of GPU {gpu} failed'}")
            return detail or f"GPU {gpu} reset"
        params = {"downtime_s": self.reboot_s} if action == "reboot" and self.reboot_s is not None else {}
        doc = self._call(node, action, action, **params)
        return " ".join(str(doc.get("detail", "")).split()) or f"{action} done"

    def health_check(self, node: str, gpu: int | None) -> HealthResult:
        """Run the simulator's ``dcgmi diag -r 2`` on ``node`` (``gpu``: that GPU only; None: all).
        ``failures``: one string per problem, e.g. ``"GPU 3: row remap failure (Xid 64)"``. ActionError
        (no verdict) while the node is rebooting or down, or cannot be reached."""
        params = {} if gpu is None else {"gpu": gpu}
        doc = self._call(node, "health check", "diag", **params)
        failures = doc.get("failures")
        if not isinstance(doc.get("passed"), bool) or not isinstance(failures, list):
            raise ActionError(f"{node}: health check failed: answer lacks passed/failures")
        return HealthResult(passed=doc["passed"], failures=tuple(str(f) for f in failures))
