"""LUNA-AD closed-loop bridge."""
