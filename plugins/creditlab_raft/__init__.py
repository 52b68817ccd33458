"""creditlab_raft plug-in: the filtered (rejection-sampling) baseline."""
