"""Automatic capture arming (I/O shell around ``profwatch.core.arming``): the episode desk that turns the detectors'
reports into arms through the capture shell, and the checks the shell applies before an arm."""
