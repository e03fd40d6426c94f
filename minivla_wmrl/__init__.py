"""minivla_wmrl."""
