"""creditlab_arith plug-in."""
