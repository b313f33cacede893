"""The capture shell: drives the pure lifecycle with its collaborators (config writes, analysis steps)."""
