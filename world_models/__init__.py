"""world_models."""
