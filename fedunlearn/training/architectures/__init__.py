"""Network architectures beyond the small CNNs of :mod:`fedunlearn.training.models`, one module each."""
