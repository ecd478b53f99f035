"""Developer tools shared by the benchmarks and the tests (not part of the package)."""
