"""core/: paths, files, settings, the BLAS choice, media fetches and the layer order."""
