"""Issue 41 moved three modules that the docs once gave users' own code; their old paths still
resolve every name, to the very object at the new path, with a DeprecationWarning naming it."""

import importlib

import pytest

MOVED = [
    ("creditlab.significance", "creditlab.analysis.significance", "paired_test"),
    ("creditlab.compose", "creditlab.run.compose", "compose"),
    ("creditlab.launch", "creditlab.run.launch", "run"),
]


@pytest.mark.parametrize(("old", "new", "name"), MOVED)
def test_an_old_path_resolves_to_the_new_object_and_says_where_it_went(old, new, name):
    moved = importlib.import_module(new)
    assert hasattr(moved, name), f"{new} has no {name}: pick a name it defines"
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(moved, name)


def test_an_unknown_name_at_an_old_path_is_still_an_attribute_error():
    with pytest.raises(AttributeError):
        importlib.import_module("creditlab.significance").no_such_name  # noqa: B018
