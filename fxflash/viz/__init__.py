"""Graph rendering for the notebook (see the visualisation issue)."""
