"""The judge: per-example forgetting tests over populations of models (Flower-free)."""

from fedunlearn.judge.populations import INDEPENDENT, ORIGINAL, REFERENCE, JudgeData, Outputs

__all__ = ["INDEPENDENT", "ORIGINAL", "REFERENCE", "JudgeData", "Outputs"]
