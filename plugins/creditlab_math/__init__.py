"""creditlab_math plug-in."""
