"""Flower (Message API) strategies: retaining FedAvg now; FedEraser reconstruction builds on it."""

from strategies.retaining_fedavg import RetainingFedAvg

__all__ = ["RetainingFedAvg"]
