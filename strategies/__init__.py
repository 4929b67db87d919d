"""Flower (Message API) strategies: retaining FedAvg now; FedEraser reconstruction builds on it."""

from strategies.retaining_fedavg import RetainingFedAvg, is_retained_round

__all__ = ["RetainingFedAvg", "is_retained_round"]
