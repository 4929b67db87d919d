"""Phases count who answered: the one account of the clients missing for the rest of a run.

A client goes missing in three ways: its SuperNode is offline when an unlearning request starts
(or never connected to an ``unlearn-only`` request's discovery), it is dropped from the run for
refused replies (:class:`server.federation.reply_screening.ReplyScreen`: in training or in any
later phase), or one of its replies is refused in a phase after training (it is still a member and
may answer again, but what it sent was not used). :class:`MissingClients` keeps that account from
the end of training (or the reopening of a trained run) to the end of the run's process, and is
consulted:

* before each unlearning method that needs every remaining client (``MethodSpec.offline`` false):
  a remaining client offline or dropped refuses that method for the request
  (:meth:`MissingClients.refuses_method`), as a client offline at the request does;
* before each later phase that needs every client's answer (the certified head, scrubbing and
  each scrubbing method, the membership audit): any missing client refuses the phase, naming the
  clients and their nodes (:meth:`MissingClients.allows`), instead of sums that silently leave
  them out.

It counts the refusals and drops since it began: the request's log record takes them
(:meth:`MissingClients.account`), and ``summary.json`` adds them to training's
(:meth:`MissingClients.write_summary`).
"""

from __future__ import annotations

from collections.abc import Collection

from fedunlearn.store.durable_io import json_loads
from server.federation.availability import describe_offline
from server.federation.members import FederationMembers
from server.progress import Log

OFFLINE = "offline"
DROPPED = "dropped from the run (max-refusals refused replies in a row)"
REFUSED = "sent replies that were refused after training"

#: ``summary.json``'s record of the refusals and drops after training, by request
LATER = "after_training"


class MissingClients:
    """Who is missing now, and why (``offline`` at the request, dropped, refused since training).

    Parameters
    ----------
    members : FederationMembers
        The run's members; ``members.dropped`` and ``members.unconnected`` are read live.
    screen : ReplyScreen, optional
        The run's reply screen, whose refusals from now on are counted.
    """

    def __init__(self, members: FederationMembers, screen=None) -> None:
        self.members, self.screen = members, screen
        #: remaining clients offline at the request (partition -> node, None: never connected)
        self.offline: dict[int, int | None] = {}
        #: the later phases refused for missing clients (phase -> why)
        self.refused_phases: dict[str, str] = {}
        #: the unlearning methods refused for the request (method -> why)
        self.refused_methods: dict[str, str] = {}
        #: where ``summary.json`` records this account (:meth:`write_summary`)
        self.key = "no request"
        self._refusals_before = screen.refused if screen is not None else 0
        self._refused_before = dict(screen.refused_clients) if screen is not None else {}
        self._dropped_before = dict(members.dropped)

    # ------------------------------------------------------------------ counts
    def refused_replies(self) -> int:
        """Replies refused since this account began."""
        return self.screen.refused - self._refusals_before if self.screen is not None else 0

    def refused_clients(self) -> dict[int, int]:
        """Refused replies since this account began, by client."""
        now = self.screen.refused_clients if self.screen is not None else {}
        since = {p: n - self._refused_before.get(p, 0) for p, n in now.items()}
        return {p: n for p, n in sorted(since.items()) if n > 0}

    def dropped_since(self) -> dict[int, str]:
        """Clients dropped since this account began, with why."""
        dropped = self.members.dropped
        return {p: dropped[p] for p in sorted(dropped) if p not in self._dropped_before}

    # ------------------------------------------------------------------ who is missing
    def causes(self, excluded: Collection[int] = (), *, refused: bool = True) -> dict[str, dict]:
        """``{cause: {partition: node or None}}`` of the clients missing now, less ``excluded``;
        a client is named once, under its first cause (offline, dropped, refused)."""
        node = self.members.node_of_partition.get
        named: set[int] = set(excluded)
        found = {
            OFFLINE: {**{p: None for p in self.members.unconnected}, **self.offline},
            DROPPED: {p: node(p) for p in self.members.dropped},
            REFUSED: {p: node(p) for p in self.refused_clients()} if refused else {},
        }
        causes = {}
        for cause, clients in found.items():
            fresh = {p: n for p, n in sorted(clients.items()) if p not in named}
            named |= set(fresh)
            if fresh:
                causes[cause] = fresh
        return causes

    def missing(self, excluded: Collection[int] = (), *, refused: bool = True) -> list[int]:
        """The clients missing now (partition ids), less ``excluded``."""
        causes = self.causes(excluded, refused=refused)
        return sorted(p for clients in causes.values() for p in clients)

    @staticmethod
    def describe(causes: dict[str, dict]) -> str:
        """``client(s) 2, 3 (node(s) 102, 103) dropped from the run (...)``; one part a cause."""
        return "; ".join(
            f"{describe_offline(clients)} {cause}" for cause, clients in causes.items()
        )

    # ------------------------------------------------------------------ refusals
    def refuses_method(self, spec, excluded: Collection[int]) -> str | None:
        """Why ``spec`` is refused for the request now (None: it runs): it messages the remaining
        clients, has no rule for one that cannot be asked (``MethodSpec.offline`` false), and a
        remaining client is offline or dropped (one whose reply was refused is still asked)."""
        if not spec.messages or spec.offline:
            return None
        causes = self.causes(excluded, refused=False)
        if not causes:
            return None
        return f"{self.describe(causes)}; it needs every remaining client: {spec.offline_note}"

    def allows(self, phase: str, log: Log) -> bool:
        """Whether ``phase``, which needs every client's answer, may run: else it is refused,
        named with the missing clients on the console and in :attr:`refused_phases`."""
        causes = self.causes()
        if not causes:
            return True
        why = (
            f"{self.describe(causes)}; it needs every client's answer, and would silently leave "
            "them out"
        )
        self.refused_phases[phase] = why
        log(f"{phase} refused for this run: {why}")
        return False

    # ------------------------------------------------------------------ the record
    def account(self) -> dict:
        """This account as a log record's fields (JSON keys are strings)."""
        return {
            "refused_replies": self.refused_replies(),
            "refused_clients": {str(p): n for p, n in self.refused_clients().items()},
            "dropped_clients": {str(p): why for p, why in self.dropped_since().items()},
            "missing_clients": self.missing(),
            "refused_methods": dict(self.refused_methods),
            "refused_phases": dict(self.refused_phases),
        }

    def write_summary(self, run) -> None:
        """Add this account to ``summary.json`` under :data:`LATER` (by :attr:`key`; written again
        when a phase is served again), and count its refusals and drops in the summary's
        ``refused_replies`` and ``dropped_clients`` beside training's (kept in
        ``training_account``). Nothing to say and nothing said before: left as it is."""
        path = run.path / "summary.json"
        account = self.account()
        said = any(account[k] for k in account if k != "missing_clients")
        if not path.is_file():
            return
        summary = json_loads(path.read_text())
        if not said and self.key not in summary.get(LATER, {}):
            return
        base = summary.setdefault(
            "training_account",
            {
                "refused_replies": summary.get("refused_replies", 0),
                "dropped_clients": summary.get("dropped_clients", {}),
            },
        )
        later = {**summary.get(LATER, {}), self.key: account}
        summary[LATER] = later
        summary["refused_replies"] = base["refused_replies"] + sum(
            a["refused_replies"] for a in later.values()
        )
        summary["dropped_clients"] = dict(base["dropped_clients"])
        for entry in later.values():
            summary["dropped_clients"].update(entry["dropped_clients"])
        run.write_json("summary.json", summary)
