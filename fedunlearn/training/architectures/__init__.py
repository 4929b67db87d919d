"""The built-in networks' bodies, one module per family, registered in
:mod:`fedunlearn.model_registry`; each builder is ``build(input_shape, num_classes)`` returning
``(body, feature_dim)``, which :class:`fedunlearn.training.models.BodyHeadNet` tops with its linear
head."""
