"""Small shared utilities: registries, device binding, Ray start-up, seeding, logging."""
