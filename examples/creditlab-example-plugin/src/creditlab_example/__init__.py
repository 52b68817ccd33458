"""creditlab-example-plugin: a third-party creditlab plug-in (RLOO advantages + a method preset).

Kept import-light on purpose: creditlab imports this package to locate ``creditlab_example.conf``
(the shipped config folder) when it builds Hydra's search path; the estimator itself lives in
:mod:`creditlab_example.advantage` and is imported only when ``advantage=rloo`` is selected.
"""
