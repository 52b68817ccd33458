"""Reset-based credit assignment: RRPO, SRPO and oracle reset selectors (arXiv 2605.25507)."""
