"""Ray compile actors (imported as aoti_farm.workers)."""
