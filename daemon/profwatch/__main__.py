"""``python -m profwatch``: the ``profwatch`` console script (``profwatch.console.main``)."""

from profwatch.console import main

main()
