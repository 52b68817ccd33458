"""Config groups shipped with the plug-in (``advantage/``, ``method/``), found through the
``creditlab.conf`` entry point. Holds no code."""
