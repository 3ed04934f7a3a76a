"""Other projects' own test suites, fetched from PyPI at test time and run against memorm's adapters.

See README.md in this folder: what is fetched (names, versions, hashes), how it is adapted, and
what is left out and why.
"""
