"""LUNA-AD offline pipeline."""
