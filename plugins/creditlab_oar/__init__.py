"""creditlab_oar plug-in: OAR-P and OAR-G, Outcome-Grounded Advantage Reshaping
(arXiv 2601.07408)."""
