"""Scrubbing a cohort (Golatkar et al.) and class pruning (Wang et al.): the phase, its methods and readouts."""
