"""creditlab_ibpo plug-in: IBPO, "Reducing Credit Assignment Variance via Counterfactual
Reasoning Paths" (arXiv 2605.16302).

One part, registered through an entry point in the root ``pyproject.toml``:

* ``advantage=ibpo`` — :class:`creditlab_ibpo.advantage.IBPOAdvantage`

No public code exists for the paper; the alignment (:mod:`creditlab_ibpo.align`) and the
weighting are our reading, marked in each module and in ``docs/methods/ibpo.md``.
"""
