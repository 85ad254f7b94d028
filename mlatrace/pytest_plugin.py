"""pytest plugin (entry point pytest11): trace code under test and fail on findings."""
