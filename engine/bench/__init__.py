"""Engine benchmarks behind `draftline bench engine|peers|model|routing` (never imported by the server)."""
