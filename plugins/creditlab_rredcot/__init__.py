"""RREDCoT: segment-level reward redistribution for reasoning models (arXiv 2606.06475).

Two parts, registered through entry points in the root ``pyproject.toml``:

* ``segmenter=keyword_entropy`` — :class:`creditlab_rredcot.segmenter.KeywordEntropySegmenter`
* ``advantage=rredcot`` — :class:`creditlab_rredcot.advantage.RREDCoTAdvantage`

No public code exists for the paper; what is ours is marked in each module and in
``docs/methods/rredcot.md``.
"""
