"""fedunlearn: the Flower-free core of the federated-unlearning platform.

Data, models, training loops, the retained-update store, the math of the unlearning papers and their
metrics. Nothing in this package imports ``flwr``; the Flower layer lives in ``strategies``,
``clients`` and ``server``. :class:`~fedunlearn.api.Experiment` and :class:`~fedunlearn.api.Run`
(the Python API, docs/python-api.md) are imported when first asked for: ``import fedunlearn``
stays light.
"""

from fedunlearn.lazy import lazy_getattr

__version__ = "0.1.0"
__all__ = ["Experiment", "Run"]

__getattr__ = lazy_getattr(__name__, {"api": ("Experiment", "Run")})
