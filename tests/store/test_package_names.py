"""``fedunlearn.store`` re-exports its modules' public names lazily (PEP 562): each one resolves."""

import importlib

import pytest

import fedunlearn.store as store


@pytest.mark.parametrize("name", store.__all__)
def test_every_public_name_resolves_to_its_modules_object(name):
    module = importlib.import_module(f"fedunlearn.store.{store._HOME[name]}")
    assert getattr(store, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        store.nothing  # noqa: B018
