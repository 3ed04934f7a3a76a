"""Other projects' own test suites, run against memorm's adapters."""
