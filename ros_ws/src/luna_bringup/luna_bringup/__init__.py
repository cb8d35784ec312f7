"""LUNA-AD bring-up: topology, launchers, the luna command."""
