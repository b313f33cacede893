"""The capture shell: drives the pure lifecycle with its collaborators (config writes, analysis steps); the arm path
into it is ``profwatch.arming``, the reference captures ``profwatch.changes``."""
