"""Flower (Message API) strategies: retention around any Flower aggregation, FedEraser's
reconstruction on top of it."""

from strategies.retaining import Retaining, RetainingFedAvg

__all__ = ["Retaining", "RetainingFedAvg"]
