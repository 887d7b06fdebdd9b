"""Stage 4: region → Triton source, kernel cache, launch; stage 5: the graph rewrite."""
