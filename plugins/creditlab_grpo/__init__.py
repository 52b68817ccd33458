"""creditlab_grpo plug-in."""
