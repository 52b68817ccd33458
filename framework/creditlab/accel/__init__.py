"""Optional speed paths for specific model classes, outside the core: the core runs without them."""
